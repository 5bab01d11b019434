"""`tokenseam bench grammar-memory`: the memory compiled grammars hold under a stream of distinct schemas.

Each request compiles a schema never seen before and generates a valid document of it under the masks, with
the model's real tokenizer (the document's tokens, each checked against the mask before it is committed);
`--parallel` requests are interleaved step by step, as the engine decodes them. Reported: the grammar bytes
the compiler holds (GrammarCompiler.memory_stats, after every step: its peak and last value) against the
budget, what the same grammars would hold if none were evicted (the sum of each one's size when its request
ended), the evictions, renewals and unmemoised masks it cost, and the process's resident memory. With
`--tracemalloc`, also the bytes really allocated and still held at each request's end (slower: every
allocation is traced), which checks the estimate.

This is a measurement of memory, not of time: it runs anywhere, busy machine included.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
import tracemalloc

import numpy as np

from .common import machine, write_json

MB = 1 << 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..argtypes import int_in_range

    p.add_argument(
        "--model", default="smollm2", help="model alias or .gguf path (its vocabulary and tokenizer)"
    )
    p.add_argument(
        "--schemas",
        type=int_in_range("--schemas", 1, 1_000_000),
        default=1000,
        help="distinct schemas (1000)",
    )
    p.add_argument(
        "--budget-mb",
        type=int_in_range("--budget-mb", 0, 1 << 20),
        default=64,
        help="the compiler's grammar budget, as --grammar-cache-mb (default 64)",
    )
    p.add_argument(
        "--parallel", type=int_in_range("--parallel", 1, 256), default=4, help="requests interleaved (4)"
    )
    p.add_argument("--tracemalloc", action="store_true", help="also trace every allocation (slower)")
    p.add_argument(
        "--out", default="bench-results/grammar-memory.json", help="where to write the JSON results"
    )


def distinct_schema(k: int) -> tuple[dict, object]:
    """Schema number k of a stream where none repeats (its property names carry k), and a document of it."""
    rng = random.Random(k)
    props: dict = {}
    doc: dict = {}
    for j in range(rng.randint(2, 7)):
        name = f"p{k}_{j}"
        kind = rng.choice(["int", "str", "enum", "bool", "array", "object", "number"])
        if kind == "int":
            lo = rng.randint(-50, 50)
            props[name] = {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(1, 5000)}
            doc[name] = lo + rng.randint(0, 1)
        elif kind == "str":
            props[name] = {"type": "string", "maxLength": rng.randint(5, 60)}
            doc[name] = "".join(rng.choice("abcdefghij klmnop") for _ in range(rng.randint(0, 5)))
        elif kind == "enum":
            values = [f"v{k}_{i}" for i in range(rng.randint(2, 6))]
            props[name] = {"enum": values}
            doc[name] = rng.choice(values)
        elif kind == "bool":
            props[name] = {"type": "boolean"}
            doc[name] = rng.random() < 0.5
        elif kind == "number":
            props[name] = {"type": "number"}
            doc[name] = round(rng.uniform(-1000, 1000), 3)
        elif kind == "array":
            props[name] = {"type": "array", "items": {"type": "integer"}, "maxItems": rng.randint(3, 20)}
            doc[name] = [rng.randint(0, 999) for _ in range(rng.randint(0, 3))]
        else:
            inner = {f"q{k}_{i}": {"type": "string"} for i in range(rng.randint(1, 3))}
            props[name] = {"type": "object", "properties": inner, "required": list(inner)}
            doc[name] = {key: f"x{i}" for i, key in enumerate(inner)}
    schema = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
    return schema, doc


def measure(model: str, schemas: int, budget_mb: int, parallel: int, trace: bool) -> dict:
    from ..grammar import GrammarCompiler, GrammarMatcher
    from ..grammar.budget import resident_bytes
    from ..models import resolve_model
    from ..vocab import Tokenizer, Vocabulary

    path = resolve_model(model)
    vocab, tok = Vocabulary.from_gguf(path), Tokenizer.from_gguf(path)
    budget = budget_mb * MB
    compiler = GrammarCompiler(vocab, cache_bytes=budget)
    compiler.warm_up()
    gc.collect()
    rss0 = resident_bytes()
    if trace:
        tracemalloc.start()
        traced0 = tracemalloc.get_traced_memory()[0]
    out = np.zeros(vocab.mask_words, dtype=np.int32)
    peak = steps = 0
    unbounded = traced_peak = rss_peak = 0
    active: list[list] = []  # [matcher, tokens, next index]
    started = 0
    t0 = time.perf_counter()
    while started < schemas or active:
        while started < schemas and len(active) < parallel:
            schema, doc = distinct_schema(started)
            m = GrammarMatcher(compiler.compile_json_schema(schema))
            active.append([m, tok.encode(json.dumps(doc)), 0])
            started += 1
        for req in list(active):
            m, toks, i = req
            m.fill_next_token_bitmask(out)
            if i == len(toks):
                if not m.is_accepting():
                    raise AssertionError(f"request {started}: the document does not end the grammar")
                unbounded += m.compiled.nbytes()
                active.remove(req)
                if trace:
                    gc.collect()
                    traced_peak = max(traced_peak, tracemalloc.get_traced_memory()[0] - traced0)
                rss_peak = max(rss_peak, resident_bytes() - rss0)
                continue
            t = toks[i]
            if not (int(out[t >> 5]) >> (t & 31)) & 1 or not m.accept_token(t):
                raise AssertionError(f"token {t} of a valid document refused")
            req[2] = i + 1
            steps += 1
            peak = max(peak, compiler.memory_stats()["bytes"])
    seconds = time.perf_counter() - t0
    st = compiler.memory_stats()
    res = {
        "model": model,
        "schemas": schemas,
        "parallel": parallel,
        "steps": steps,
        "seconds": round(seconds, 1),
        "budget_bytes": budget,
        "peak_bytes": peak,
        "within_budget": peak <= budget,
        "final": st,
        "unbounded_bytes": unbounded,
        "rss_growth_peak_bytes": rss_peak,
    }
    if trace:
        tracemalloc.stop()
        res["traced_growth_peak_bytes"] = traced_peak
    return res


def run(args: argparse.Namespace) -> int:
    res = measure(args.model, args.schemas, args.budget_mb, args.parallel, args.tracemalloc)
    st = res["final"]
    print(
        f"{res['schemas']} distinct schemas, {res['parallel']} at a time, {res['steps']} steps in "
        f"{res['seconds']} s on {res['model']}\n"
        f"  grammar bytes held: peak {res['peak_bytes'] / MB:.1f} MB, last {st['bytes'] / MB:.1f} MB, budget "
        f"{res['budget_bytes'] / MB:.0f} MB ({'within' if res['within_budget'] else 'OVER'})\n"
        f"  without eviction the same grammars would hold {res['unbounded_bytes'] / MB:.1f} MB\n"
        f"  cached {st['cached_grammars']}, evictions {st['evictions']}, renewals {st['renewals']}, "
        f"unmemoised masks {st['unmemoised_masks']}\n"
        f"  resident memory growth (peak at a request's end): {res['rss_growth_peak_bytes'] / MB:.1f} MB"
        + (
            f"\n  traced allocations held (peak at a request's end): {res['traced_growth_peak_bytes'] / MB:.1f} MB"
            if "traced_growth_peak_bytes" in res
            else ""
        )
    )
    write_json(args.out, {"machine": machine(), **res})
    return 0 if res["within_budget"] else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tokenseam.bench.grammar_memory")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
