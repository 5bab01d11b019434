"""`tokenseam bench prefix-cache`: prefix KV reuse on a RAG workload, TTFT cold vs cached, interleaved prefixes.

Runs tokenseam's real server on each model; llama-server (`--llama-server PATH`) is the optional anchor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx

from ..argtypes import int_in_range
from .common import LlamaServer, machine, median, stream_ttft, write_json

QUESTIONS = [
    "What is the main topic?",
    "Who is mentioned first?",
    "Which number appears last?",
    "Summarise it in one sentence.",
    "What happens at the end?",
    "Is a city named?",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default="smollm2,gemma3", help="comma-separated model aliases or .gguf paths")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--long-prefix-tokens",
        default="1450,8000",
        help="comma-separated prefix lengths for the cold/cached TTFT figures",
    )
    p.add_argument(
        "--rounds",
        type=int_in_range("--rounds", 2, 100),
        default=4,
        help="rounds over the 8 interleaved prefixes (the first one fills the caches and is not scored)",
    )
    p.add_argument(
        "--interleaved-tokens",
        type=int_in_range("--interleaved-tokens", 1, 64),
        default=4,
        help="tokens each interleaved request generates, on every server (4)",
    )
    p.add_argument("--llama-server", default=None, help="path to a llama-server binary (anchor)")
    p.add_argument("--out", default="bench-results/prefix-cache.json")


def document(n_words: int, seed: int) -> str:
    import random

    rng = random.Random(seed)
    words = (
        "river city engine report market garden winter signal harbor letter planet forest music bridge "
        "doctor number station island paper window"
    ).split()
    out = []
    for i in range(n_words):
        out.append(rng.choice(words))
        if i % 12 == 11:
            out.append(f"{rng.randrange(1000)}.\n" if i % 36 == 35 else f"{rng.randrange(100)},")
    return " ".join(out)


async def _ttft(client: httpx.AsyncClient, url: str, body: dict) -> tuple[float, dict]:
    """Seconds to the first SSE event, and the final usage."""
    first, usage, status, _ = await stream_ttft(
        client, url, {**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    if status != 200:
        raise RuntimeError(f"{url} answered {status}")
    return first or float("nan"), usage


def _lengths(args: argparse.Namespace) -> list[int]:
    try:
        out = [int(x) for x in str(args.long_prefix_tokens).split(",") if x.strip()]
    except ValueError:
        raise SystemExit(
            f"--long-prefix-tokens: give comma-separated token counts, got {args.long_prefix_tokens!r}"
        ) from None
    if not out or any(not 16 <= n <= 60000 for n in out):
        raise SystemExit("--long-prefix-tokens: each length must be from 16 to 60000")
    return out


def _ctx(args: argparse.Namespace) -> int:
    """Per-slot context for the longest prefix + question + answer, in 256-token steps."""
    return max(2048, -(-(max(_lengths(args)) + 256) // 256) * 256)


def _doc_ids(tok, n_tokens: int, seed: int) -> list[int]:
    return tok.encode("Document:\n" + document(int(n_tokens * 0.8) + 64, seed=seed))[:n_tokens]


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    _lengths(args)
    console = Console()
    res: dict = {
        "machine": machine(),
        "config": {"rounds": args.rounds, "interleaved_tokens": args.interleaved_tokens},
        "models": {},
    }
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        console.print(f"[bold]{model}[/bold]")
        res["models"][model] = _bench_model(model, args)
    _report(console, res)
    out = write_json(args.out, res)
    console.print(f"wrote {out}")
    return 0


def _bench_model(model: str, args: argparse.Namespace) -> dict:
    from ..healing.cases import RAG_CHUNKS, RAG_FIXED_PROMPTS
    from ..healing.stable import join_stable, stable_prefix
    from ..httpkit import BackgroundServer
    from ..server.runtime import build_server

    if True:
        app, state = build_server(
            model,
            n_ctx=_ctx(args),
            parallel=8,
            threads=args.threads,
            prefix_cache_tokens=max(16384, 2 * _ctx(args)),
        )
        bg = BackgroundServer(app).start()
        url = bg.url + "/v1/completions"
        tok, vocab = state.tokenizer, state.vocab
        m: dict = {}

        async def rag(stable: bool) -> dict:
            """Each head followed by 50 chunks; the share of the head's stable tokens served from the cache."""
            shares = []
            async with httpx.AsyncClient(timeout=600) as c:
                for head in RAG_FIXED_PROMPTS:
                    state.engine.clear_cache()
                    sp = stable_prefix(tok, vocab, head)
                    head_len = len(sp.ids)
                    for i, chunk in enumerate(RAG_CHUNKS):
                        if stable:
                            prompt = join_stable(tok, sp, chunk)  # the head's stable ids, verbatim
                        else:
                            prompt = tok.encode(head + chunk)
                        r = await c.post(
                            url,
                            json={
                                "prompt": prompt,
                                "max_tokens": 1,
                                "temperature": 0,
                                "token_healing": False,
                            },
                        )
                        r.raise_for_status()
                        if i:
                            cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
                            shares.append(min(cached, head_len) / max(head_len, 1))
            return {
                "mean_share": sum(shares) / len(shares),
                "min_share": min(shares),
                "requests": len(shares),
            }

        async def long_prefix(n_tokens: int) -> dict:
            """Caches cleared, one cold request, then 5 cached ones (the same document, other questions)."""
            ids = _doc_ids(tok, n_tokens, seed=1)
            body = {"max_tokens": 1, "temperature": 0, "token_healing": False}
            assert state.engine.clear_cache()
            async with httpx.AsyncClient(timeout=1800) as c:
                times = [await _ttft(c, url, {**body, "prompt": ids + q}) for q in _questions(tok)]
            warm = [t for t, _ in times[1:]]
            return {
                "prefix_tokens": n_tokens,
                "ttft_cold_s": times[0][0],
                "ttft_cached_s": median(warm),
                "ttft_cached_all_s": warm,
                "ratio": median(warm) / times[0][0],
                "cached_tokens": [
                    u.get("prompt_tokens_details", {}).get("cached_tokens") for _, u in times[1:]
                ],
            }

        async def interleaved() -> dict:
            heads = _heads(tok)
            assert state.engine.clear_cache()
            total = served = 0
            ttfts: list[float] = []
            async with httpx.AsyncClient(timeout=600) as c:
                for rnd in range(args.rounds):
                    reqs = []
                    for h, q in zip(heads, _interleaved_questions(tok, rnd), strict=True):
                        body = {
                            "prompt": h + q,
                            "max_tokens": args.interleaved_tokens,
                            "temperature": 0,
                            "token_healing": False,
                        }
                        reqs.append(_ttft(c, url, body))
                    outs = await asyncio.gather(*reqs)  # 8 concurrent requests, one per prefix
                    if rnd == 0:
                        continue
                    for k, (t, u) in enumerate(outs):
                        ttfts.append(t)
                        total += len(heads[k])
                        served += min(u["prompt_tokens_details"]["cached_tokens"], len(heads[k]))
            return {
                "prefixes": 8,
                "prefix_tokens_each": [len(h) for h in heads],
                "share": served / max(total, 1),
                "ttft_median_s": median(ttfts),
            }

        try:
            m["rag_plain"] = asyncio.run(rag(stable=False))
            m["rag_stable_keys"] = asyncio.run(rag(stable=True))
            m["long_prefix"] = {str(n): asyncio.run(long_prefix(n)) for n in _lengths(args)}
            m["interleaved_8"] = asyncio.run(interleaved())
        finally:
            bg.stop()
            state.engine.shutdown()
            state.backend.close()
        if args.llama_server:
            from ..vocab import Tokenizer

            m["llama_server"] = _llama_server(
                args, state.backend.path, Tokenizer.from_gguf(state.backend.path)
            )
    return m


def _questions(tok) -> list[list[int]]:
    """The long-prefix workload's suffixes: the first request is the cold one."""
    return [tok.encode(f"\nQuestion: {q}\nAnswer:") for q in QUESTIONS]


def _interleaved_questions(tok, rnd: int) -> list[list[int]]:
    return [tok.encode(f"Question {rnd}: {QUESTIONS[(rnd + k) % len(QUESTIONS)]}") for k in range(8)]


def _heads(tok) -> list[list[int]]:
    return [
        tok.encode(f"System {k}: you are assistant number {k}.\n" + document(220, seed=10 + k) + "\n")
        for k in range(8)
    ]


def _report(console, res: dict) -> None:
    from rich.table import Table

    table = Table(title="prefix KV cache (shares are of the fixed prefix's tokens; TTFT medians)")
    for col in ("model", "server", "RAG share, plain / stable keys", "TTFT cold → cached", "8 interleaved"):
        table.add_column(col)
    for model, m in res["models"].items():
        ttft = "; ".join(
            f"{n}: {lp['ttft_cold_s'] * 1000:.0f} → {lp['ttft_cached_s'] * 1000:.0f} ms"
            for n, lp in m["long_prefix"].items()
        )
        il = m["interleaved_8"]
        table.add_row(
            model,
            "tokenseam",
            f"{m['rag_plain']['mean_share']:.1%} (min {m['rag_plain']['min_share']:.0%}) / "
            f"{m['rag_stable_keys']['mean_share']:.1%}",
            ttft,
            f"{il['share']:.1%}, TTFT {il['ttft_median_s'] * 1000:.0f} ms",
        )
        for name, ls in m.get("llama_server", {}).items():
            ttft = "; ".join(
                f"{n}: {lp['ttft_cold_s'] * 1000:.0f} → {lp['ttft_cached_s'] * 1000:.0f} ms "
                f"(tokenseam {m['long_prefix'][n]['ttft_cached_s'] / lp['ttft_cached_s']:.2f}x)"
                for n, lp in ls["long_prefix"].items()
            )
            table.add_row(
                model,
                f"llama-server -{name}",
                "–",
                ttft,
                f"{ls['interleaved_share']:.1%}, TTFT {ls['interleaved_ttft_median_s'] * 1000:.0f} ms "
                f"(tokenseam {il['ttft_median_s'] / ls['interleaved_ttft_median_s']:.2f}x)",
            )
    console.print(table)


def _llama_server(args, path, tok) -> dict:
    """llama-server -np 1 and -np 8 on the same long-prefix TTFT and interleaved workloads (cache_prompt on)."""
    heads = _heads(tok)

    async def ttft(c: httpx.AsyncClient, base: str, prompt: list[int], n: int = 1) -> tuple[float, int]:
        t0 = time.perf_counter()
        first, cached = None, 0
        # a new connection each time: llama-server may close a kept-alive one after a long streamed answer
        async with c.stream(
            "POST",
            base + "/completion",
            json={"prompt": prompt, "n_predict": n, "stream": True, "cache_prompt": True},
            headers={"Connection": "close"},
        ) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    first = first or time.perf_counter() - t0
                    cached = json.loads(line[6:]).get("tokens_cached", cached)
        return first or float("nan"), cached

    async def workload(base: str) -> dict:
        out: dict = {"long_prefix": {}}
        async with httpx.AsyncClient(timeout=1800) as c:
            for n in _lengths(args):
                ids = _doc_ids(tok, n, seed=1)
                # llama-server has no cache-clear route: a document it has not seen is the cold request
                times = [(await ttft(c, base, ids + q))[0] for q in _questions(tok)]
                out["long_prefix"][str(n)] = {
                    "ttft_cold_s": times[0],
                    "ttft_cached_s": median(times[1:]),
                    "ttft_cached_all_s": times[1:],
                    "ratio": median(times[1:]) / times[0],
                }
            total = served = 0
            ttfts: list[float] = []
            for rnd in range(args.rounds):
                outs = await asyncio.gather(
                    *[
                        ttft(c, base, h + q, args.interleaved_tokens)
                        for h, q in zip(heads, _interleaved_questions(tok, rnd), strict=True)
                    ]
                )
                if rnd:
                    for h, (t, cached) in zip(heads, outs, strict=True):
                        ttfts.append(t)
                        total += len(h)
                        served += min(cached, len(h))
        out["interleaved_share"] = served / max(total, 1)
        out["interleaved_ttft_median_s"] = median(ttfts)
        return out

    out = {}
    for np_ in (1, 8):
        with LlamaServer(args.llama_server, path, np_, args.threads, _ctx(args)) as ls:
            out[f"np{np_}"] = asyncio.run(workload(ls.url))
    return out
