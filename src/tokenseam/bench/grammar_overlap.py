"""`tokenseam bench grammar-overlap`: time to the first token of a constrained request when its grammar
compiles while the prompt is read (`--grammar-overlap on`) against compiling it first (`off`).

One server on the bundled model. Each request has a prompt the prefix cache has never seen (a unique first
line) and a large schema the grammar cache has never seen (a unique property name), so every request pays a
whole prefill and a whole compile. The two modes alternate request by request (the order flips every round),
on the same server: the mode is switched between requests. Also measured, for the bound the overlap aims at:
the same prompts without a grammar (the prefill alone) and the schemas' compile time alone.

The compile runs at a lower CPU priority than decoding: it overlaps the prompt only where a core is free
(`--threads` below the core count).
"""

from __future__ import annotations

import argparse
import sys
import time

from .common import machine, median, percentile, write_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..argtypes import int_in_range

    p.add_argument("--model", default="smollm2", help="model alias or .gguf path (smollm2)")
    p.add_argument(
        "--threads",
        type=int_in_range("--threads", 0, 4096),
        default=1,
        help="llama.cpp threads (default 1: on a 2-core machine one core stays free for the compile; 0: all)",
    )
    p.add_argument(
        "--prompt-words",
        type=int_in_range("--prompt-words", 1, 2000),
        default=10,
        help="words of filler in each prompt (about 9 tokens each with SmolLM2; default 10)",
    )
    p.add_argument(
        "--properties",
        type=int_in_range("--properties", 1, 2000),
        default=120,
        help="top-level properties of each schema, each an object of five typed fields (default 120)",
    )
    p.add_argument(
        "--rounds", type=int_in_range("--rounds", 1, 10_000), default=12, help="requests per mode (12)"
    )
    p.add_argument(
        "--out", default="bench-results/grammar-overlap.json", help="where to write the JSON results"
    )


def big_schema(k: int, properties: int) -> dict:
    """A schema of `properties` nested objects; `k` makes it one the grammar cache has not seen."""
    item = {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0},
            "name": {"type": "string", "maxLength": 40},
            "kind": {"enum": ["alpha", "beta", "gamma", "delta"]},
            "score": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        },
        "required": ["id", "name"],
    }
    props = {f"field_{k}_{j}": item for j in range(properties)}
    return {"type": "object", "properties": props, "required": [f"field_{k}_0"]}


def prompt(k: int, words: int) -> str:
    filler = " ".join(f"item{i} value{i * 7}" for i in range(words))
    return f"Request {k}. Describe the configuration below as JSON. {filler}"


def _ttft(client, url: str, body: dict) -> float:
    """Seconds from sending a streamed request to its first event."""
    t0 = time.perf_counter()
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:300]!r}")
        first = None
        for line in r.iter_lines():  # to the end of the stream
            if first is None and line.startswith("data: {"):
                first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError("the stream ended without an event")
    return first


def _dist(xs: list[float]) -> dict:
    ms = [x * 1000 for x in xs]
    return {"median_ms": median(ms), "p25_ms": percentile(ms, 25), "p75_ms": percentile(ms, 75), "n": len(ms)}


def run(args: argparse.Namespace) -> int:
    import httpx

    from ..httpkit import BackgroundServer
    from ..server.runtime import build_server, settle_serving_process

    app, state = build_server(args.model, threads=args.threads, n_ctx=4096, parallel=2)
    settle_serving_process()  # as `tokenseam serve` runs: compiles and the engine share the interpreter
    bg = BackgroundServer(app).start()
    k = 0
    ttft: dict[str, list[float]] = {"overlap": [], "compile_first": [], "no_grammar": []}
    compile_s: list[float] = []
    try:
        with httpx.Client(timeout=600) as client:
            for rnd in range(args.rounds):
                order = ("overlap", "compile_first") if rnd % 2 == 0 else ("compile_first", "overlap")
                for mode in (*order, "no_grammar"):
                    k += 1
                    body = {
                        "prompt": prompt(k, args.prompt_words),
                        "max_tokens": 1,
                        "temperature": 0,
                        "stream": True,
                    }
                    if mode != "no_grammar":
                        body["guided_json"] = big_schema(k, args.properties)
                    state.grammar_overlap = mode == "overlap"
                    ttft[mode].append(_ttft(client, bg.url, body))
                # the compile alone, in this thread, on a schema no request has seen
                k += 1
                t0 = time.perf_counter()
                state.compile_request_grammar(
                    {"guided_json": big_schema(k, args.properties)}, "/v1/completions"
                )
                compile_s.append(time.perf_counter() - t0)
                print(f"[round {rnd + 1}/{args.rounds}]", file=sys.stderr, flush=True)
    finally:
        bg.stop()
        state.engine.shutdown()
    pairs = [a / b for a, b in zip(ttft["overlap"], ttft["compile_first"], strict=True)]
    bound = max(median(ttft["no_grammar"]), median(compile_s))
    summary = {
        **{f"ttft_{m}": _dist(v) for m, v in ttft.items()},
        "compile_alone": _dist(compile_s),
        "paired_ratio_overlap_vs_compile_first": median(pairs),
        # what a perfect overlap reaches: the longer of the prefill (no grammar) and the compile
        "bound_ms": bound * 1000,
    }
    out = {
        "machine": machine(),
        "model": args.model,
        "threads": args.threads,
        "prompt_words": args.prompt_words,
        "properties": args.properties,
        "rounds": args.rounds,
        "summary": summary,
        "ttft_s": ttft,
        "compile_s": compile_s,
    }
    path = write_json(args.out, out)
    s = summary
    print(
        f"time to first token, median of {args.rounds} (threads {args.threads}): grammar compiled while the "
        f"prompt is read {s['ttft_overlap']['median_ms']:.0f} ms, compiled first "
        f"{s['ttft_compile_first']['median_ms']:.0f} ms (paired ratio "
        f"{s['paired_ratio_overlap_vs_compile_first']:.2f}); no grammar {s['ttft_no_grammar']['median_ms']:.0f} "
        f"ms, compile alone {s['compile_alone']['median_ms']:.0f} ms\nwrote {path}"
    )
    return 0
