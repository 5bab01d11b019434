"""`tokenseam bench flash-attn`: llama.cpp's flash attention on and off, for the work a server does.

Whether flash attention pays depends on the work, not only on the model: on a CPU it decodes many streams of
short contexts faster, and for a model without sliding-window layers it reads a short prompt after a long
cached prefix more slowly. `tokenseam serve --flash-attn auto` picks by the model alone; this benchmark times
both settings on this machine, in two contexts made as the engine makes them (a KV stream per sequence), the
settings taking turns round by round so that the machine's drift moves both.

What each case times (ids are arbitrary tokens: the arithmetic does not depend on them):
- a decode step: one new token for each of N sequences that hold a context of C tokens (the median of
  `--steps` steps, each timed alone);
- a prompt read: P new tokens after C tokens already in the sequence, with the other slots empty or holding
  C tokens each (one timed decode).
"""

from __future__ import annotations

import argparse
import time

from .common import machine, median, model_arg, write_json

SLOTS = 8
CTX = 2048  # tokens per sequence: the longest case (1,450 + 15, or 1,000 + the steps) fits
# (name, kind, sequences, context, new tokens, other slots full)
CASES = (
    ("decode step, 8 streams at 300 tokens", "step", 8, 300, 1, False),
    ("decode step, 1 stream at 300 tokens", "step", 1, 300, 1, False),
    ("decode step, 8 streams at 1,000 tokens", "step", 8, 1000, 1, False),
    ("decode step, 1 stream at 1,000 tokens", "step", 1, 1000, 1, False),
    ("15 tokens after 1,450 cached", "prompt", 1, 1450, 15, False),
    ("15 tokens after 1,450 cached, 7 other slots full", "prompt", 1, 1450, 15, True),
    ("prompt of 300 tokens", "prompt", 1, 0, 300, False),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="model alias or .gguf path (default smollm2)")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp threads for both contexts (default 2)")
    p.add_argument("--rounds", type=int, default=4, help="rounds, each setting once per round (default 4)")
    p.add_argument("--steps", type=int, default=16, help="decode steps timed per case and round (default 16)")
    p.add_argument(
        "--out",
        default="bench-results/flash-attn.json",
        help="the JSON report (default bench-results/flash-attn.json)",
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..engine.backend import BackendConfig, LlamaCppBackend

    for flag, v, hi in (
        ("--threads", args.threads, 256),
        ("--rounds", args.rounds, 50),
        ("--steps", args.steps, 1000),
    ):
        if not 1 <= v <= hi:
            print(f"error: {flag} must be between 1 and {hi}")
            return 2
    path = model_arg(args.model)
    if path is None:
        return 2
    console = Console()
    console.print(f"loading {path.name} twice (flash attention on, off), {args.threads} threads")
    cfg = {"n_seq": SLOTS, "n_threads": args.threads, "n_ctx": CTX, "prefix_cache_tokens": 0}
    backends = {fa: LlamaCppBackend(path, BackendConfig(flash_attn=fa, **cfg)) for fa in ("on", "off")}
    times: dict[str, dict[str, list[float]]] = {c[0]: {"on": [], "off": []} for c in CASES}
    try:
        for r in range(args.rounds):
            order = ("on", "off") if r % 2 == 0 else ("off", "on")
            console.print(f"round {r + 1}/{args.rounds}: flash attention {order[0]}, then {order[1]}")
            for fa in order:
                for name, ms in _round(backends[fa], args.steps).items():
                    times[name][fa].append(ms)
    finally:
        for b in backends.values():
            b.close()
    rows = []
    for name, kind, n_seq, ctx, new, full in CASES:
        on, off = times[name]["on"], times[name]["off"]
        rows.append(
            {
                "case": name,
                "kind": kind,
                "sequences": n_seq,
                "context": ctx,
                "new_tokens": new,
                "other_slots_full": full,
                "on_ms": on,
                "off_ms": off,
                "on_median_ms": median(on),
                "off_median_ms": median(off),
                # per round (the two settings ran back to back), then the median
                "ratio_on_off": median([a / b for a, b in zip(on, off, strict=True)]),
            }
        )
    table = Table(
        title=f"flash attention on / off ({path.name}, {args.threads} threads, medians of {args.rounds} rounds)"
    )
    for col in ("case", "on ms", "off ms", "on / off"):
        table.add_column(col)
    for row in rows:
        table.add_row(
            row["case"],
            f"{row['on_median_ms']:.1f}",
            f"{row['off_median_ms']:.1f}",
            f"{row['ratio_on_off']:.2f}",
        )
    console.print(table)
    res = {
        "machine": machine(),
        "model": str(path),
        "threads": args.threads,
        "rounds": args.rounds,
        "steps": args.steps,
        "cases": rows,
    }
    out = write_json(args.out, res)
    console.print(f"wrote {out}")
    return 0


def _round(be, steps: int) -> dict[str, float]:
    """Every case once on one backend, in milliseconds. The contexts grow from case to case, so each is filled
    by extending sequence 0 and copying it to the others (a copy is far cheaper than reading them again)."""
    out = {}
    for s in range(SLOTS):
        be.seq_rm(s)
    held = 0  # tokens sequence 0 holds (the others hold a copy when a case needs them)

    def extend(to: int) -> None:
        nonlocal held
        be.seq_rm(0, to, -1)
        held = min(held, to)
        while held < to:
            n = min(be.config.n_batch, to - held)
            be.decode([(0, [_token(held + k) for k in range(n)], held, False)])
            held += n

    for name, kind, n_seq, ctx, new, full in CASES:
        extend(ctx)
        others = list(range(1, n_seq if kind == "step" else (SLOTS if full else 1)))
        for s in range(1, SLOTS):
            if s not in others:
                be.seq_rm(s)
        if others:
            be.seq_cp(0, others)
        if kind == "step":
            ts = []
            for k in range(steps):
                t = time.perf_counter()
                be.decode([(s, [_token(ctx + k)], ctx + k, True) for s in range(n_seq)])
                ts.append((time.perf_counter() - t) * 1e3)
            out[name] = median(ts)
            for s in range(n_seq):
                be.seq_rm(s, ctx, -1)
            continue
        t = time.perf_counter()
        for i in range(0, new, be.config.n_batch):
            n = min(be.config.n_batch, new - i)
            be.decode([(0, [_token(ctx + i + k) for k in range(n)], ctx + i, i + n == new)])
        out[name] = (time.perf_counter() - t) * 1e3
        be.seq_rm(0, ctx, -1)
    return out


def _token(i: int) -> int:
    """An ordinary token id for position i (clear of the special ids at the start of a vocabulary)."""
    return 1000 + i % 5000
