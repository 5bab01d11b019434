"""`tokenseam bench vllm`: the tokenseam backend against vLLM's own backends, in one run on one vLLM build.

One server per backend (`--structured-outputs-config {"backend": NAME}`, no logits processor), all started
before timing; each round then runs every backend back to back, in a rotating order, so the machine's noise
falls on all of them alike. Measured:
- decode tokens/s under a JSON schema whose every output is longer than --tokens (so each request runs
  exactly --tokens tokens on every backend), at each --concurrency, and unconstrained (ignore_eos) as anchor;
- time to first token for a schema the server has never seen (compile included), and unconstrained;
- with --maskbench DIR: MaskBench pushed through the backend adapter, against the standalone matcher.
Ratios are per round (tokenseam / other), then medians and spreads over rounds. Writes JSON and a PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..vllm.cli import serve_command
from .common import ServerProcess, free_port, machine, write_json

BACKENDS = ("tokenseam", "xgrammar", "guidance")
PROMPTS = [
    "List the rows of the inventory table as JSON.",
    "Return the sensor readings as JSON rows.",
    "Output the user records as JSON.",
    "Give the product catalogue as JSON.",
    "Dump the order lines as JSON rows.",
    "Write the test results as JSON.",
    "Export the contacts as JSON.",
    "Print the flight schedule as JSON rows.",
]


class VLLMServer(ServerProcess):
    """vLLM as `tokenseam vllm serve` starts it, on a free loopback port (a context manager).

    `extra`: vLLM flags (they replace tokenseam's defaults where they overlap, e.g. another
    `--structured-outputs-config`); `healing`: load the healing logits processor."""

    name = "vLLM"
    startup_seconds = 600.0  # eager startup takes 40-115 s on 2 quiet cores; a busy machine takes longer

    def __init__(
        self, venv: Path, model: str | None = None, extra: list[str] | None = None, healing: bool = True
    ) -> None:
        port = free_port()
        args = argparse.Namespace(
            venv=Path(venv), model=model, host="127.0.0.1", port=port, no_healing=not healing
        )
        self.cmd, env = serve_command(args, list(extra or []))
        super().__init__(self.cmd, port, env=env)


def long_schema(rows: int = 60) -> dict:
    """Every document of this schema is far longer than the token budget: each request runs it all."""
    row = {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 9999},
            "name": {"type": "string", "maxLength": 12},
            "ok": {"type": "boolean"},
        },
        "required": ["id", "name", "ok"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"rows": {"type": "array", "items": row, "minItems": rows, "maxItems": rows}},
        "required": ["rows"],
        "additionalProperties": False,
    }


def fresh_schema() -> dict:
    """A schema no server has compiled before (a new enum value), for time to first token with a compile."""
    s = long_schema()
    s["properties"]["tag"] = {"enum": [uuid.uuid4().hex[:12], "other"]}
    s["required"].append("tag")
    return s


def _post(client, url: str, body: dict) -> dict:
    r = client.post(url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def decode_rate(client, url: str, concurrency: int, tokens: int, constrained: bool) -> dict:
    """`concurrency` parallel requests of exactly `tokens` tokens each: generated tokens per second."""
    schema = long_schema()

    def one(i: int) -> int:
        body = {"model": "bench", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": tokens, "temperature": 0}
        if constrained:
            body["structured_outputs"] = {"json": schema}
        else:
            body["ignore_eos"] = True
        out = _post(client, url, body)
        return int(out["usage"]["completion_tokens"])

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        counts = list(pool.map(one, range(concurrency)))
    wall = time.perf_counter() - t0
    return {
        "tokens": sum(counts),
        "wall_s": wall,
        "tok_s": sum(counts) / wall,
        "short": sum(c < tokens for c in counts),
    }


def first_token_ms(client, url: str, schema: dict | None) -> float:
    body = {"model": "bench", "prompt": PROMPTS[0], "max_tokens": 1, "temperature": 0}
    if schema is not None:
        body["structured_outputs"] = {"json": schema}
    t0 = time.perf_counter()
    _post(client, url, body)
    return (time.perf_counter() - t0) * 1000


def _spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--venv", type=Path, required=True, help="an environment built by `tokenseam vllm setup`"
    )
    parser.add_argument("--model", default=None, help="a model converted by setup (default: the first)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default: all three)")
    parser.add_argument("--concurrency", default="1,8", help="comma-separated request counts in flight")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per request (default 128)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--maskbench", type=Path, default=None, help="a MaskBench directory to replay")
    parser.add_argument("--maskbench-limit", type=int, default=300, help="files of it to use (default 300)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/vllm.json"), help="the JSON report")


def _check_args(args) -> list[str]:
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or any(b not in BACKENDS for b in backends) or "tokenseam" not in backends:
        raise ValueError(f"--backends must name tokenseam and any of {', '.join(BACKENDS)}")
    try:
        args.levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        raise ValueError("--concurrency must be comma-separated positive integers") from None
    if not args.levels or min(args.levels) < 1 or max(args.levels) > 64:
        raise ValueError("--concurrency values must be between 1 and 64")
    if not 8 <= args.tokens <= 1024 or args.rounds < 1 or args.maskbench_limit < 1:
        raise ValueError("--tokens must be 8..1024, --rounds and --maskbench-limit positive")
    if args.maskbench is not None and not args.maskbench.is_dir():
        raise ValueError(f"--maskbench {args.maskbench} is not a directory")
    return backends


def run_maskbench(args) -> dict:
    from ..vllm.setup import NUMBA_CACHE, read_state, venv_python

    state = read_state(args.venv)
    model = args.model or state["default_model"]
    env = dict(os.environ, NUMBA_CACHE_DIR=str(args.venv / NUMBA_CACHE), HF_HUB_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    cmd = [
        str(venv_python(args.venv)),
        "-m",
        "tokenseam.bench.vllm_maskbench",
        state["models"][model]["path"],
        str(args.maskbench),
        str(args.maskbench_limit),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"MaskBench through the adapter failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> int:
    import httpx

    try:
        backends = _check_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report: dict = {"machine": machine(), "tokens": args.tokens, "levels": args.levels, "backends": backends}
    if args.maskbench is not None:
        print(f"MaskBench through the adapter ({args.maskbench_limit} files) ...", file=sys.stderr)
        report["maskbench"] = run_maskbench(args)
    servers = {}
    try:
        for b in backends:
            print(f"starting vLLM with backend {b} ...", file=sys.stderr)
            servers[b] = VLLMServer(
                args.venv,
                model=args.model,
                healing=False,
                extra=[
                    "--structured-outputs-config",
                    json.dumps({"backend": b}),
                    "--served-model-name",
                    "bench",
                ],
            ).__enter__()
        client = httpx.Client()
        for s in servers.values():  # warm: the backend itself, the first mask, the sampler
            decode_rate(client, s.url, 1, 16, True)
            decode_rate(client, s.url, 1, 16, False)
        rates: dict = {b: {str(c): {"json": [], "free": []} for c in args.levels} for b in backends}
        ttft: dict = {b: {"new_schema": [], "free": []} for b in backends}
        for r in range(args.rounds):
            order = backends[r % len(backends) :] + backends[: r % len(backends)]
            for b in order:
                url = servers[b].url
                for c in args.levels:
                    rates[b][str(c)]["json"].append(decode_rate(client, url, c, args.tokens, True))
                    rates[b][str(c)]["free"].append(decode_rate(client, url, c, args.tokens, False))
                for _ in range(3):
                    ttft[b]["new_schema"].append(first_token_ms(client, url, fresh_schema()))
                    ttft[b]["free"].append(first_token_ms(client, url, None))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        for s in servers.values():
            s.__exit__()
    summary: dict = {}
    for b in backends:
        summary[b] = {
            "tok_s": {
                c: {k: _spread([x["tok_s"] for x in v[k]]) for k in ("json", "free")}
                for c, v in rates[b].items()
            },
            "ttft_ms": {k: _spread(v) for k, v in ttft[b].items()},
            "short_outputs": sum(x["short"] for v in rates[b].values() for x in v["json"]),
        }
    ratios: dict = {}
    for b in backends:
        if b == "tokenseam":
            continue
        ratios[f"tokenseam/{b}"] = {
            c: _spread(
                [
                    t["tok_s"] / o["tok_s"]
                    for t, o in zip(rates["tokenseam"][c]["json"], rates[b][c]["json"], strict=True)
                ]
            )
            for c in rates[b]
        }
        # The same ratio with each server's constrained rate over its own unconstrained rate of that round,
        # which cancels what differs between the servers themselves (placement, memory, a noisy neighbour).
        ratios[f"tokenseam/{b}, each over its own unconstrained"] = {
            c: _spread(
                [
                    (t["tok_s"] / tf["tok_s"]) / (o["tok_s"] / of["tok_s"])
                    for t, tf, o, of in zip(
                        rates["tokenseam"][c]["json"],
                        rates["tokenseam"][c]["free"],
                        rates[b][c]["json"],
                        rates[b][c]["free"],
                        strict=True,
                    )
                ]
            )
            for c in rates[b]
        }
    for b in backends:
        ratios[f"{b} json/free"] = {
            c: _spread([j["tok_s"] / f["tok_s"] for j, f in zip(v["json"], v["free"], strict=True)])
            for c, v in rates[b].items()
        }
    report.update({"summary": summary, "ratios": ratios, "raw": {"rates": rates, "ttft": ttft}})
    path = write_json(args.out, report)
    print_report(report)
    try:
        plot(report, path.with_suffix(".png"))
    except ImportError:
        print("(no PNG: matplotlib is not installed; pip install 'tokenseam[plot]')", file=sys.stderr)
    print(f"report: {path}")
    return 0


def print_report(report: dict) -> None:
    s = report["summary"]
    print(f"decode tokens/s under a JSON schema, {report['tokens']} tokens per request (median of rounds):")
    print(
        "backend      "
        + "".join(f"  conc {c:<3} json   free" for c in report["levels"])
        + "   TTFT new schema ms"
    )
    for b, v in s.items():
        cells = "".join(
            f"  {v['tok_s'][str(c)]['json']['median']:8.1f} {v['tok_s'][str(c)]['free']['median']:6.1f}"
            for c in report["levels"]
        )
        print(f"{b:<12}{cells}   {v['ttft_ms']['new_schema']['median']:8.0f}")
    for name, by_c in report["ratios"].items():
        cells = ", ".join(
            f"conc {c}: {x['median']:.3f} ({x['min']:.3f}-{x['max']:.3f})" for c, x in by_c.items()
        )
        print(f"{name}: {cells}")
    mb = report.get("maskbench")
    if mb:
        print(
            f"MaskBench through the adapter: {mb['files']} files, {len(mb['differ'])} differ from standalone"
        )
        for k in ("tokenseam", "tokenseam-in-vllm"):
            print(f"  {k}: {mb[k]}")


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = report["summary"]
    levels = [str(c) for c in report["levels"]]
    fig, axes = plt.subplots(1, len(levels), figsize=(4 * len(levels), 4))
    axes = list(axes) if len(levels) > 1 else [axes]
    for ax, c in zip(axes, levels, strict=True):
        names = list(s)
        for i, b in enumerate(names):
            for k, (kind, style) in enumerate((("json", {}), ("free", {"hatch": "//", "alpha": 0.45}))):
                x = s[b]["tok_s"][c][kind]
                ax.bar(i * 3 + k, x["median"], color=f"C{i}", **style)
                ax.errorbar(
                    i * 3 + k,
                    x["median"],
                    yerr=[[x["median"] - x["min"]], [x["max"] - x["median"]]],
                    color="k",
                    capsize=3,
                )
        ax.set_xticks([i * 3 + 0.5 for i in range(len(names))], names)
        ax.set_title(f"{c} in flight")
        ax.set_ylabel("generated tokens/s")
    fig.suptitle(
        f"vLLM on CPU, {report['tokens']} tokens per request: median and range of rounds", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
