"""`tokenseam bench prefix-cache`: prefix KV reuse on a RAG workload, TTFT cold vs cached, interleaved prefixes.

Runs tokenseam's real server on each model; llama-server (`--llama-server PATH`) is the optional anchor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx

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
    p.add_argument("--long-prefix-tokens", type=int, default=1450, help="prefix length for the TTFT figure")
    p.add_argument("--rounds", type=int, default=4, help="rounds over the 8 interleaved prefixes")
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


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    res: dict = {"machine": machine(), "models": {}}
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
            model, n_ctx=2048, parallel=8, threads=args.threads, prefix_cache_tokens=16384
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

        async def long_prefix() -> dict:
            doc = document(int(args.long_prefix_tokens * 0.8), seed=1)
            ids = tok.encode("Document:\n" + doc)[: args.long_prefix_tokens]
            cold, warm = [], []
            async with httpx.AsyncClient(timeout=600) as c:
                for k, q in enumerate(QUESTIONS[:3]):
                    state.engine.clear_cache()
                    qa = tok.encode(f"\nQuestion: {q}\nAnswer:")
                    t, u = await _ttft(
                        c,
                        url,
                        {"prompt": ids + qa, "max_tokens": 1, "temperature": 0, "token_healing": False},
                    )
                    cold.append(t)
                    q2 = tok.encode(f"\nQuestion: {QUESTIONS[k + 3]}\nAnswer:")
                    t2, u2 = await _ttft(
                        c,
                        url,
                        {"prompt": ids + q2, "max_tokens": 1, "temperature": 0, "token_healing": False},
                    )
                    warm.append(t2)
            return {
                "prefix_tokens": len(ids),
                "ttft_cold_s": median(cold),
                "ttft_cached_s": median(warm),
                "ratio": median(warm) / median(cold),
                "cached_tokens": u2.get("prompt_tokens_details", {}),
            }

        async def interleaved() -> dict:
            heads = [
                tok.encode(f"System {k}: you are assistant number {k}.\n" + document(220, seed=10 + k) + "\n")
                for k in range(8)
            ]
            state.engine.clear_cache()
            total = served = 0
            async with httpx.AsyncClient(timeout=600) as c:
                for rnd in range(args.rounds):
                    reqs = []
                    for k, h in enumerate(heads):
                        q = tok.encode(f"Question {rnd}: {QUESTIONS[(rnd + k) % len(QUESTIONS)]}")
                        reqs.append(
                            c.post(
                                url,
                                json={
                                    "prompt": h + q,
                                    "max_tokens": 4,
                                    "temperature": 0,
                                    "token_healing": False,
                                },
                            )
                        )
                    outs = await asyncio.gather(*reqs)  # 8 concurrent requests, one per prefix
                    if rnd == 0:
                        continue
                    for k, r in enumerate(outs):
                        r.raise_for_status()
                        cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
                        total += len(heads[k])
                        served += min(cached, len(heads[k]))
            return {
                "prefixes": 8,
                "prefix_tokens_each": [len(h) for h in heads],
                "share": served / max(total, 1),
            }

        try:
            m["rag_plain"] = asyncio.run(rag(stable=False))
            m["rag_stable_keys"] = asyncio.run(rag(stable=True))
            m["long_prefix"] = asyncio.run(long_prefix())
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


def _report(console, res: dict) -> None:
    from rich.table import Table

    table = Table(title="prefix KV cache (tokenseam server; shares are of the fixed prefix's tokens)")
    for col in (
        "model",
        "RAG share, plain",
        "RAG share, stable keys",
        "TTFT cold",
        "TTFT cached",
        "cached/cold",
        "8 interleaved prefixes",
    ):
        table.add_column(col)
    for model, m in res["models"].items():
        lp = m["long_prefix"]
        table.add_row(
            model,
            f"{m['rag_plain']['mean_share']:.1%} (min {m['rag_plain']['min_share']:.0%})",
            f"{m['rag_stable_keys']['mean_share']:.1%} (min {m['rag_stable_keys']['min_share']:.0%})",
            f"{lp['ttft_cold_s'] * 1000:.0f} ms",
            f"{lp['ttft_cached_s'] * 1000:.0f} ms",
            f"{lp['ratio']:.3f}",
            f"{m['interleaved_8']['share']:.1%}",
        )
    console.print(table)
    for model, m in res["models"].items():
        if "llama_server" in m:
            console.print(f"llama-server anchor ({model}): {m['llama_server']}")


def _llama_server(args, path, tok) -> dict:
    """llama-server -np 1 and -np 8 on the same long-prefix TTFT and interleaved workloads (cache_prompt on)."""
    doc_ids = tok.encode("Document:\n" + document(int(args.long_prefix_tokens * 0.8), seed=1))
    doc_ids = doc_ids[: args.long_prefix_tokens]
    heads = [
        tok.encode(f"System {k}: you are assistant number {k}.\n" + document(220, seed=10 + k) + "\n")
        for k in range(8)
    ]

    async def ttft(c: httpx.AsyncClient, base: str, prompt: list[int]) -> tuple[float, int]:
        t0 = time.perf_counter()
        first, cached = None, 0
        async with c.stream(
            "POST",
            base + "/completion",
            json={"prompt": prompt, "n_predict": 1, "stream": True, "cache_prompt": True},
        ) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    first = first or time.perf_counter() - t0
                    cached = json.loads(line[6:]).get("tokens_cached", cached)
        return first or float("nan"), cached

    async def workload(base: str) -> dict:
        async with httpx.AsyncClient(timeout=600) as c:
            cold, _ = await ttft(c, base, doc_ids + tok.encode("\nQuestion: A?\nAnswer:"))
            warm, _ = await ttft(c, base, doc_ids + tok.encode("\nQuestion: B?\nAnswer:"))
            total = served = 0
            for rnd in range(args.rounds):
                outs = await asyncio.gather(
                    *[ttft(c, base, h + tok.encode(f"Question {rnd}: what?")) for h in heads]
                )
                if rnd:
                    for h, (_, cached) in zip(heads, outs, strict=True):
                        total += len(h)
                        served += min(cached, len(h))
        return {
            "ttft_cold_s": cold,
            "ttft_cached_s": warm,
            "ratio": warm / cold,
            "interleaved_share": served / max(total, 1),
        }

    out = {}
    for np_ in (1, 8):
        with LlamaServer(args.llama_server, path, np_, args.threads, 2048) as ls:
            out[f"np{np_}"] = asyncio.run(workload(ls.url))
    return out
