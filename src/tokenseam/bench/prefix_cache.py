"""`tokenseam bench prefix-cache`: prefix KV reuse on a RAG workload, TTFT cold vs cached, interleaved prefixes.

The RAG shares come from tokenseam's server in this process (its cache is cleared between heads); the timed
workloads run against `tokenseam serve` processes, as deployed, beside the optional anchor llama-server
(`--llama-server PATH`), each in its own process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx

from ..argtypes import int_in_range
from .common import LlamaServer, TokenseamServe, machine, median, ratio_interval, stream_ttft, write_json

QUESTIONS = [
    "What is the main topic?",
    "Who is mentioned first?",
    "Which number appears last?",
    "Summarise it in one sentence.",
    "What happens at the end?",
    "Is a city named?",
    "How long is it?",
    "Which word is repeated most?",
    "What comes after the second number?",
    "Name one place in it.",
    "What is the tone of the text?",
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
        default=6,
        help="rounds over the 8 interleaved prefixes (the first one fills the caches and is not scored)",
    )
    p.add_argument(
        "--cached-requests",
        type=int_in_range("--cached-requests", 2, 500),
        default=20,
        help="cached requests per prefix length and server, each with a question of its own (20): the "
        "cached-TTFT medians and their intervals come from these",
    )
    p.add_argument(
        "--interleaved-tokens",
        type=int_in_range("--interleaved-tokens", 1, 64),
        default=4,
        help="tokens each interleaved request generates, on every server (4)",
    )
    p.add_argument(
        "--prompt-form",
        choices=("ids", "text"),
        default="ids",
        help="send the cached-TTFT prompts as token ids (both servers skip tokenizing: the prompt pass alone) "
        "or as text, as clients do (each server tokenizes the whole prompt, tokenseam through its memo)",
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
        "config": {
            "rounds": args.rounds,
            "cached_requests": args.cached_requests,
            "interleaved_tokens": args.interleaved_tokens,
            "prompt_form": args.prompt_form,
        },
        "models": {},
    }
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        console.print(f"[bold]{model}[/bold]")
        res["models"][model] = _bench_model(model, args)
    _report(console, res)
    out = write_json(args.out, res)
    console.print(f"wrote {out}")
    return 0


# Seconds every server is left alone after a timed request, so work it does once an answer went out (tokenseam
# decodes the answer's last token once idle; llama-server saves a slot's state to its prompt cache) is not
# timed in the next server's request.
SETTLE_SECONDS = 0.2


class _Target:
    """One server under the cached-TTFT workloads: `send(client, prompt ids, max tokens)` -> (seconds to the
    first event, cached tokens)."""

    def __init__(self, name: str, send) -> None:
        self.name, self.send = name, send


def _tokenseam_target(name: str, url: str) -> _Target:
    async def send(c: httpx.AsyncClient, prompt: list[int] | str, n: int) -> tuple[float, int]:
        body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "token_healing": False}
        t, usage = await _ttft(c, url + "/v1/completions", body)
        return t, usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)

    return _Target(name, send)


def _llama_target(name: str, base: str) -> _Target:
    async def send(c: httpx.AsyncClient, prompt: list[int] | str, n: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        first, cached = None, 0
        # a new connection each time: llama-server may close a kept-alive one after a long streamed answer
        async with c.stream(
            "POST",
            base + "/completion",
            json={"prompt": prompt, "n_predict": n, "stream": True, "cache_prompt": True},
            headers={"Connection": "close"},
        ) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{name} answered {r.status_code}")
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    first = first or time.perf_counter() - t0
                    cached = llama_reused(json.loads(line[6:]), cached)
        return first or float("nan"), cached

    return _Target(name, send)


def llama_reused(event: dict, before: int) -> int:
    """The prompt tokens llama-server served from its cache, from one event of a streamed /completion:
    `timings.cache_n` (on the last event). Not `tokens_cached`, which counts every token the slot holds
    after the request, its whole prompt and answer, reused or not."""
    timings = event.get("timings")
    if isinstance(timings, dict) and isinstance(timings.get("cache_n"), int):
        return timings["cache_n"]
    return before


def _form(tok, prompt: list[int], form: str) -> list[int] | str:
    """What a server is sent: the ids, or their text (which it tokenizes itself)."""
    return prompt if form == "ids" else tok.decode(prompt).decode("utf-8")


async def _timed(c: httpx.AsyncClient, target: _Target, prompt: list[int] | str, n: int) -> tuple[float, int]:
    out = await target.send(c, prompt, n)
    await asyncio.sleep(SETTLE_SECONDS)
    return out


def _turns(targets: list[_Target], k: int) -> list[_Target]:
    """The servers in the order of round k: each goes first in turn, so drift in the machine's speed spreads
    over all of them."""
    return targets[k % len(targets) :] + targets[: k % len(targets)]


async def _long_prefix(
    tok, targets: list[_Target], n_tokens: int, form: str = "ids", cached: int = 10
) -> dict[str, dict]:
    """Per server: one cold request (a document no server has seen), then `cached` ones with the same document
    and other questions, the servers taking turns request by request. `form`: see _form."""
    ids = _doc_ids(tok, n_tokens, seed=n_tokens)  # each length its own document: no length warms another
    qs = _questions(tok, cached)
    cold: dict[str, float] = {}
    warm: dict[str, list[tuple[float, int]]] = {t.name: [] for t in targets}
    async with httpx.AsyncClient(timeout=1800) as c:
        for t in targets:
            cold[t.name] = (await _timed(c, t, _form(tok, ids + qs[0], form), 1))[0]
        for k, q in enumerate(qs[1:]):
            for t in _turns(targets, k):
                warm[t.name].append(await _timed(c, t, _form(tok, ids + q, form), 1))
    out = {}
    for t in targets:
        times = [x for x, _ in warm[t.name]]
        out[t.name] = {
            "prefix_tokens": n_tokens,
            "ttft_cold_s": cold[t.name],
            "ttft_cached_s": median(times),
            "ttft_cached_all_s": times,
            "ratio": median(times) / cold[t.name],
            "cached_tokens": [cached for _, cached in warm[t.name]],
        }
    return out


async def _interleaved(args, tok, targets: list[_Target]) -> dict[str, dict]:
    """Per server and round: 8 concurrent requests, one per prefix (about 315 tokens each) with a new
    question; round 0 fills the caches and is not scored. The servers take turns round by round."""
    heads = _heads(tok)
    got: dict[str, list[list[tuple[float, int, int]]]] = {t.name: [] for t in targets}
    async with httpx.AsyncClient(timeout=1800) as c:
        for rnd in range(args.rounds):
            for t in _turns(targets, rnd):
                qs = _interleaved_questions(tok, rnd)
                outs = await asyncio.gather(
                    *[
                        t.send(c, _form(tok, h + q, args.prompt_form), args.interleaved_tokens)
                        for h, q in zip(heads, qs, strict=True)
                    ]
                )
                await asyncio.sleep(SETTLE_SECONDS)
                if rnd:
                    got[t.name].append(
                        [(x, cached, len(h)) for (x, cached), h in zip(outs, heads, strict=True)]
                    )
    return {
        name: {
            "prefixes": len(heads),
            "prefix_tokens_each": [len(h) for h in heads],
            "share": sum(min(cached, n) for r in rounds for _, cached, n in r)
            / max(sum(n for r in rounds for _, _, n in r), 1),
            "ttft_median_s": median([x for r in rounds for x, _, _ in r]),
            "ttft_rounds_s": [[x for x, _, _ in r] for r in rounds],
        }
        for name, rounds in got.items()
    }


def _bench_model(model: str, args: argparse.Namespace) -> dict:
    from contextlib import ExitStack

    from ..models import resolve_model
    from ..vocab.tokenizer import Tokenizer

    m = _rag_shares(model, args)
    path = resolve_model(model)
    tok = Tokenizer.from_gguf(path)
    serve = ["--ctx-size", str(_ctx(args)), "--threads", str(args.threads)]
    serve += ["--prefix-cache-tokens", str(max(16384, 2 * _ctx(args)))]
    try:
        with ExitStack() as stack:
            # Every server runs at once, each in its own process (only the one answering uses the cores), so the
            # cached-TTFT requests can take turns between them. The one-slot server is llama-server -np 1's
            # like, and flash attention "auto" may differ there.
            servers = {
                name: stack.enter_context(TokenseamServe(path, [*serve, "--parallel", str(par)]))
                for name, par in _SLOTS.items()
            }
            targets = [_tokenseam_target(name, ts.url) for name, ts in servers.items()]
            if args.llama_server:
                for np_ in (1, 8):
                    ls = stack.enter_context(
                        LlamaServer(args.llama_server, path, np_, args.threads, _ctx(args))
                    )
                    targets.append(_llama_target(f"np{np_}", ls.url))
            long = {
                str(n): asyncio.run(_long_prefix(tok, targets, n, args.prompt_form, args.cached_requests))
                for n in _lengths(args)
            }
            inter = asyncio.run(_interleaved(args, tok, targets))
            m["flash_attn"] = {name: ts.flash_attention() for name, ts in servers.items()}
    finally:
        tok.close()
    m["long_prefix"] = {n: per["tokenseam"] for n, per in long.items()}
    m["interleaved_8"] = inter["tokenseam"]
    m["one_slot"] = {
        "long_prefix": {n: per["tokenseam-p1"] for n, per in long.items()},
        "interleaved_8": inter["tokenseam-p1"],
    }
    if args.llama_server:
        m["llama_server"] = {
            t.name: {
                "long_prefix": {n: per[t.name] for n, per in long.items()},
                "interleaved_share": inter[t.name]["share"],
                "interleaved_ttft_median_s": inter[t.name]["ttft_median_s"],
                "vs_tokenseam": _versus(long, inter, t.name),
            }
            for t in targets[2:]
        }
    return m


def _versus(long: dict[str, dict[str, dict]], inter: dict[str, dict], anchor: str) -> dict:
    """Each tokenseam server's cached TTFT over the anchor's, per cell: the ratio of medians and its 90 %
    bootstrap interval, the samples paired as they ran (request k of each server in one turn; one round of
    the interleaved workload)."""

    def cell(mine: list[list[float]], theirs: list[list[float]]) -> dict:
        lo, hi = ratio_interval(mine, theirs)
        ratio = median([x for b in mine for x in b]) / median([x for b in theirs for x in b])
        return {"ratio": ratio, "interval_90": [lo, hi]}

    out: dict = {}
    for label, name in _NAMES.items():
        out[label] = {
            "long_prefix": {
                n: cell(
                    [[x] for x in per[name]["ttft_cached_all_s"]],
                    [[x] for x in per[anchor]["ttft_cached_all_s"]],
                )
                for n, per in long.items()
            },
            "interleaved_8": cell(inter[name]["ttft_rounds_s"], inter[anchor]["ttft_rounds_s"]),
        }
    return out


def _rag_shares(model: str, args: argparse.Namespace) -> dict:
    """The RAG workload on an 8-slot server in this process, whose cache is emptied before each head: per head,
    50 chunks after it, and the share of the head's tokens served from the cache, with the head tokenized as
    plain text and as stable ids. Nothing here is timed."""
    from ..healing.cases import RAG_CHUNKS, RAG_FIXED_PROMPTS
    from ..healing.stable import join_stable, stable_prefix
    from ..httpkit import BackgroundServer
    from ..server.runtime import build_server

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

    async def rag(stable: bool) -> dict:
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
                        json={"prompt": prompt, "max_tokens": 1, "temperature": 0, "token_healing": False},
                    )
                    r.raise_for_status()
                    if i:
                        cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
                        shares.append(min(cached, head_len) / max(head_len, 1))
        return {"mean_share": sum(shares) / len(shares), "min_share": min(shares), "requests": len(shares)}

    try:
        return {"rag_plain": asyncio.run(rag(stable=False)), "rag_stable_keys": asyncio.run(rag(stable=True))}
    finally:
        bg.stop()
        state.engine.shutdown()
        state.backend.close()


def _questions(tok, cached: int = 10) -> list[list[int]]:
    """The long-prefix workload's suffixes, the cold request's and then `cached` others, each its own text:
    QUESTIONS in turn, numbered once they come round again."""
    out = [f"\nQuestion: {q}\nAnswer:" for q in QUESTIONS[: cached + 1]]
    for k in range(len(out), cached + 1):
        q = QUESTIONS[1 + (k - 1) % (len(QUESTIONS) - 1)]
        out.append(f"\nQuestion {(k - 1) // (len(QUESTIONS) - 1)}: {q}\nAnswer:")
    return [tok.encode(q) for q in out]


def _interleaved_questions(tok, rnd: int) -> list[list[int]]:
    return [tok.encode(f"Question {rnd}: {QUESTIONS[(rnd + k) % len(QUESTIONS)]}") for k in range(8)]


def _heads(tok) -> list[list[int]]:
    return [
        tok.encode(f"System {k}: you are assistant number {k}.\n" + document(220, seed=10 + k) + "\n")
        for k in range(8)
    ]


_NAMES = {"8 slots": "tokenseam", "1 slot": "tokenseam-p1"}
_SLOTS = {"tokenseam": 8, "tokenseam-p1": 1}  # tokenseam's two servers under the timed workloads


def _ratios(cells: dict[str, dict]) -> str:
    """tokenseam's cached TTFT over an anchor's, per tokenseam server: the ratio and its 90 % interval."""
    return ", ".join(
        f"{label} {c['ratio']:.2f}x ({c['interval_90'][0]:.2f}-{c['interval_90'][1]:.2f})"
        for label, c in cells.items()
    )


def _report(console, res: dict) -> None:
    from rich.table import Table

    table = Table(
        title="prefix KV cache (shares are of the fixed prefix's tokens; TTFT medians; tokenseam / llama-server "
        "with a 90 % bootstrap interval)"
    )
    for col in ("model", "server", "RAG share, plain / stable keys", "TTFT cold → cached", "8 interleaved"):
        table.add_column(col)
    for model, m in res["models"].items():
        mine = {"8 slots": m, "1 slot": m["one_slot"]}
        for label, t in mine.items():
            il = t["interleaved_8"]
            table.add_row(
                model,
                f"tokenseam, {label} (flash attention {'on' if m['flash_attn'][_NAMES[label]] else 'off'})",
                f"{m['rag_plain']['mean_share']:.1%} (min {m['rag_plain']['min_share']:.0%}) / "
                f"{m['rag_stable_keys']['mean_share']:.1%}"
                if t is m
                else "–",
                "; ".join(
                    f"{n}: {lp['ttft_cold_s'] * 1000:.0f} → {lp['ttft_cached_s'] * 1000:.0f} ms"
                    for n, lp in t["long_prefix"].items()
                ),
                f"{il['share']:.1%}, TTFT {il['ttft_median_s'] * 1000:.0f} ms",
            )
        for name, ls in m.get("llama_server", {}).items():
            vs = ls["vs_tokenseam"]
            ttft = "; ".join(
                f"{n}: {lp['ttft_cold_s'] * 1000:.0f} → {lp['ttft_cached_s'] * 1000:.0f} ms "
                f"(tokenseam {_ratios({label: vs[label]['long_prefix'][n] for label in mine})})"
                for n, lp in ls["long_prefix"].items()
            )
            table.add_row(
                model,
                f"llama-server -{name}",
                "–",
                ttft,
                f"{ls['interleaved_share']:.1%}, TTFT {ls['interleaved_ttft_median_s'] * 1000:.0f} ms "
                f"(tokenseam {_ratios({label: vs[label]['interleaved_8'] for label in mine})})",
            )
    console.print(table)
