"""`tokenseam bench serve`: decode speed of tokenseam's server vs llama-cpp-python and raw llama.cpp batching.

Same GGUF, same thread count, same run; medians over repeats and ratios against each anchor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from pathlib import Path

import httpx
import numpy as np

from .common import LlamaServer, TokenseamServe, machine, median, model_arg, write_json

# Prompts after which SmolLM2 keeps going (greedy) for 256+ tokens, so llama-cpp-python, which cannot ignore
# EOS without a Python logits processor, decodes as many tokens as the servers (which get ignore_eos).
PROMPTS = [
    "Explain in detail how a steam engine works.",
    "Describe a walk through a busy market in the morning.",
    "Describe the water cycle to a ten-year-old.",
    "Explain in detail how a bicycle works.",
    "Describe a busy train station in the evening.",
    "Explain in detail how a windmill works.",
    "Explain in detail how bread is made.",
    "Explain in detail how a refrigerator works.",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="model alias or .gguf path (default smollm2)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=128, help="tokens generated per request")
    p.add_argument("--streams", type=int, default=8, help="concurrent streams for the batched figures")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--llama-server", default=None, help="path to a llama-server binary to add as an anchor")
    p.add_argument(
        "--flash-attn",
        choices=("auto", "on", "off"),
        default="auto",
        help="llama.cpp's flash attention for every system: auto lets each choose as deployed (tokenseam's "
        "auto: off for a model without sliding-window layers; llama-server's -fa auto: on)",
    )
    p.add_argument("--out", default="bench-results/serve.json")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    if args.tokens < 1 or args.streams < 1 or args.repeats < 1 or args.threads < 1:
        print("error: --tokens, --streams, --repeats and --threads must be positive")
        return 2
    path = model_arg(args.model)
    if path is None:
        return 2
    console = Console()
    res: dict = {
        "machine": machine(),
        "model": str(path),
        "threads": args.threads,
        "tokens": args.tokens,
        "streams": args.streams,
        "flash_attn": args.flash_attn,
        "repeats": args.repeats,
        "rounds": [],
    }
    # Every system runs once per round, rounds interleaved, so a burst of load from elsewhere on a shared
    # machine hits anchor and tokenseam alike; ratios are taken within a round, then the median.
    console.print(
        f"loading llama-cpp-python, the raw batch loop and a `tokenseam serve` process "
        f"({Path(path).name}, {args.threads} threads)"
    )
    lcp = _LlamaCppPython(path, args)
    raw = _RawBatch(path, args)
    with contextlib.ExitStack() as stack:
        ts = stack.enter_context(TokenseamServer(path, args))
        ts.warm_up()
        anchors = {}
        if args.llama_server:
            # llama-server -np 1 and -np N take their turn in every round like the other systems (each idle
            # while the others run), so their figures pair with tokenseam's
            console.print("starting llama-server -np 1 and -np N")
            for label, np_ in (("1", 1), ("n", args.streams)):
                anchors[label] = stack.enter_context(
                    LlamaServer(args.llama_server, path, np_, args.threads, 1024, ["-fa", args.flash_attn])
                )
        for r in range(args.repeats):
            console.print(
                f"[bold]round {r + 1}/{args.repeats}[/bold]: llama-cpp-python, tokenseam 1 stream, "
                f"raw batch 1 and {args.streams}, tokenseam {args.streams} streams, tokenseam JSON schema"
                + (f", llama-server 1 and {args.streams}" if anchors else "")
            )
            rnd = {"llama_cpp_python_1": lcp.once(r), "tokenseam_1": ts.measure([r])}
            rnd["raw_1"] = raw.once(1)
            rnd["raw_n"] = raw.once(args.streams)
            rnd["tokenseam_n"] = ts.measure([r + i for i in range(args.streams)])
            rnd["tokenseam_json_1"] = ts.measure([r], schema=JSON_SCHEMA)
            for label, ls in anchors.items():
                rnd[f"llama_server_{label}"] = _llama_server_once(
                    ls.url, r, 1 if label == "1" else args.streams, args
                )
            res["rounds"].append(rnd)
            console.print("  " + ", ".join(f"{k} {v['tok_s']:.1f}" for k, v in rnd.items()))
    lcp.close()
    raw.close()
    _summarise(res, args)
    _print(console, res, args)
    out = write_json(args.out, res)
    console.print(f"wrote {out}")
    return 0


# minItems keeps the constrained output going to max_tokens (an empty array would end after 3 tokens and
# the rate would measure the time to first token, not decoding under the grammar).
JSON_SCHEMA = {
    "type": "array",
    "minItems": 64,
    "items": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "note": {"type": "string"}},
        "required": ["name", "note"],
    },
}


def _summarise(res: dict, args) -> None:
    rounds = res["rounds"]

    def med(key: str, field: str = "tok_s") -> float:
        return median([r[key][field] for r in rounds])

    def ratio(a: str, b: str) -> float:
        return median([r[a]["tok_s"] / r[b]["tok_s"] for r in rounds])

    res["summary"] = {
        "llama_cpp_python_1": med("llama_cpp_python_1"),
        "raw_1": med("raw_1"),
        "raw_n": med("raw_n"),
        "tokenseam_1": med("tokenseam_1"),
        "tokenseam_n": med("tokenseam_n"),
        "tokenseam_json_1": med("tokenseam_json_1"),
        "ratio_single_vs_llama_cpp_python": ratio("tokenseam_1", "llama_cpp_python_1"),
        "ratio_batched_vs_raw": ratio("tokenseam_n", "raw_n"),
        "ratio_json_vs_unconstrained": ratio("tokenseam_json_1", "tokenseam_1"),
        "engine_overhead_ms_per_token_1": med("tokenseam_1", "engine_overhead_ms_per_step"),
        "engine_overhead_ms_per_step_n": med("tokenseam_n", "engine_overhead_ms_per_step"),
        "outside_decode_ms_per_token_1": med("tokenseam_1", "outside_decode_ms_per_token"),
    }
    if "llama_server_1" in rounds[0]:
        res["llama_server"] = {"tok_s_1": med("llama_server_1"), "tok_s_n": med("llama_server_n")}
        res["summary"]["ratio_single_vs_llama_server"] = ratio("tokenseam_1", "llama_server_1")
        res["summary"]["ratio_batched_vs_llama_server"] = ratio("tokenseam_n", "llama_server_n")


def _print(console, res: dict, args) -> None:
    from rich.table import Table

    s = res["summary"]
    table = Table(
        title=f"decode tokens/s, median of {args.repeats} interleaved rounds "
        f"({Path(res['model']).name}, {args.threads} threads)"
    )
    for col in ("system", "1 stream", f"{args.streams} streams (aggregate)"):
        table.add_column(col)
    table.add_row("llama-cpp-python create_completion", f"{s['llama_cpp_python_1']:.1f}", "-")
    table.add_row("raw llama.cpp batch (low-level API)", f"{s['raw_1']:.1f}", f"{s['raw_n']:.1f}")
    if "llama_server" in res:
        ls = res["llama_server"]
        table.add_row("llama-server", f"{ls['tok_s_1']:.1f}", f"{ls['tok_s_n']:.1f}")
    table.add_row("tokenseam serve (HTTP SSE)", f"{s['tokenseam_1']:.1f}", f"{s['tokenseam_n']:.1f}")
    table.add_row(
        "tokenseam under a JSON Schema",
        f"{s['tokenseam_json_1']:.1f} ({s['ratio_json_vs_unconstrained']:.3f}x unconstrained)",
        "-",
    )
    table.add_row(
        "ratio tokenseam / anchor (median of per-round ratios)",
        f"{s['ratio_single_vs_llama_cpp_python']:.3f} (vs llama-cpp-python)",
        f"{s['ratio_batched_vs_raw']:.3f} (vs raw batch)",
    )
    if "ratio_single_vs_llama_server" in s:
        table.add_row(
            "ratio tokenseam / llama-server (median of per-round ratios)",
            f"{s['ratio_single_vs_llama_server']:.3f}",
            f"{s['ratio_batched_vs_llama_server']:.3f}",
        )
    console.print(table)
    console.print(
        f"time outside llama_decode: engine thread {s['engine_overhead_ms_per_token_1']:.3f} ms per token "
        f"(single stream), {s['engine_overhead_ms_per_step_n']:.3f} ms per batched step of "
        f"{args.streams}; end to end (server process, single stream) "
        f"{s['outside_decode_ms_per_token_1']:.3f} ms per token"
    )


class _LlamaCppPython:
    def __init__(self, path: Path, args) -> None:
        import llama_cpp.llama_cpp as raw
        from llama_cpp import Llama

        from ..engine.backend import model_params

        self.args = args
        # Llama builds its model parameters from llama_model_default_params(): the same ones as the engine's
        # (backend.model_params: no extra buffer types on a build with AMX kernels), so the anchor loads alike.
        default, raw.llama_model_default_params = raw.llama_model_default_params, model_params
        try:
            self.llm = Llama(
                model_path=str(path),
                n_ctx=2048,
                n_threads=args.threads,
                n_threads_batch=args.threads,
                n_batch=512,
                flash_attn=args.flash_attn == "on",  # (its own default: off)
                verbose=False,
            )
        finally:
            raw.llama_model_default_params = default
        self.llm.create_completion(PROMPTS[0], max_tokens=4, temperature=0)  # warm-up

    def once(self, r: int) -> dict:
        t0 = time.perf_counter()
        out = self.llm.create_completion(
            PROMPTS[r % len(PROMPTS)], max_tokens=self.args.tokens, temperature=0
        )
        n = out["usage"]["completion_tokens"]
        if n < self.args.tokens // 2:
            raise RuntimeError(
                f"llama-cpp-python stopped after {n} tokens (EOS); the rate would mean nothing"
            )
        return {"tok_s": n / (time.perf_counter() - t0), "tokens": n}

    def close(self) -> None:
        self.llm.close()


class TokenseamServer(TokenseamServe):
    """The decode-speed workloads against a `tokenseam serve` process (common.TokenseamServe)."""

    def __init__(self, path: Path, args) -> None:
        self.args = args
        super().__init__(
            path,
            [
                "--ctx-size",
                "1024",
                "--parallel",
                str(max(args.streams, 1)),
                "--threads",
                str(args.threads),
                "--flash-attn",
                args.flash_attn,
            ],
        )

    def _body(self, i: int, schema: dict | None) -> dict:
        b = {
            "prompt": PROMPTS[i % len(PROMPTS)],
            "max_tokens": self.args.tokens,
            "temperature": 0,
            "stream": True,
            "return_token_ids": True,
            "ignore_eos": True,
        }
        if schema is not None:
            b["guided_json"] = schema
        return b

    def warm_up(self) -> None:
        asyncio.run(_concurrent(self.url + "/v1/completions", [self._body(0, None)]))
        asyncio.run(
            _concurrent(self.url + "/v1/completions", [self._body(0, JSON_SCHEMA)])
        )  # compile + masks

    def counters(self) -> dict[str, float]:
        """The engine's counters once it is idle (a finished answer's cache upkeep may still be decoding)."""
        import re

        last: dict[str, float] | None = None
        for _ in range(100):
            text = httpx.get(self.url + "/metrics", timeout=10).text
            now = {
                m.group(1): float(m.group(2))
                for m in re.finditer(r"^tokenseam_engine_(\w+)_total (\S+)$", text, re.M)
            }
            if now == last:
                return now
            last = now
            time.sleep(
                0.1
            )  # longer than the engine waits before decoding finished answers' last tokens alone
        return last

    def measure(self, prompts: list[int], schema: dict | None = None) -> dict:
        c0 = self.counters()
        n, dt = asyncio.run(
            _concurrent(self.url + "/v1/completions", [self._body(i, schema) for i in prompts])
        )
        if n != self.args.tokens * len(prompts):
            raise RuntimeError(
                f"tokenseam generated {n} tokens instead of {self.args.tokens * len(prompts)}; "
                "the rate would not be a decode rate"
            )
        c1 = self.counters()
        d = {k: c1[k] - c0.get(k, 0.0) for k in c1}
        return {
            "tok_s": n / dt,
            "tokens": n,
            "seconds": dt,
            "engine_overhead_ms_per_step": d["overhead_seconds"] / max(d["steps"], 1) * 1000,
            # decode steps that served no request (a finished answer's last token, decoded for the cache
            # after the answer went out) may fall inside or outside the timed window: they are not counted
            "outside_decode_ms_per_token": (dt - (d["decode_seconds"] - d.get("upkeep_decode_seconds", 0.0)))
            / max(n, 1)
            * 1000,
        }


class _RawBatch:
    """The ceiling: a bare loop of llama_decode over n sequences with numpy argmax, nothing else."""

    def __init__(self, path: Path, args) -> None:
        import llama_cpp

        from ..engine.backend import model_params
        from ..vocab.tokenizer import ensure_llama_backend

        ensure_llama_backend()
        self.args = args
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params())
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def close(self) -> None:
        import llama_cpp

        llama_cpp.llama_model_free(self.model)

    def once(self, n_seq: int) -> dict:
        import llama_cpp

        from ..engine.backend import LlamaCppBackend

        args, vocab, n_vocab = self.args, self.vocab, self.n_vocab
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = 1024 * n_seq
        cp.n_batch = cp.n_ubatch = 512
        cp.n_seq_max = n_seq
        # the engine's KV layout: a stream per sequence, flash attention as the engine picks it
        cp.kv_unified = False
        fa = LlamaCppBackend.flash_attention_for(args.flash_attn, llama_cpp.llama_model_n_swa(self.model))
        cp.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if fa else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        cp.n_threads = cp.n_threads_batch = args.threads
        ctx = llama_cpp.llama_init_from_model(self.model, cp)
        batch = llama_cpp.llama_batch_init(512, 0, n_seq)
        try:
            toks, pos = [], []
            n = 0
            for s in range(n_seq):
                text = PROMPTS[s % len(PROMPTS)].encode()
                buf = (llama_cpp.llama_token * 256)()
                k = llama_cpp.llama_tokenize(vocab, text, len(text), buf, 256, False, False)
                for j in range(k):
                    batch.token[n], batch.pos[n], batch.n_seq_id[n] = buf[j], j, 1
                    batch.seq_id[n][0], batch.logits[n] = s, int(j == k - 1)
                    n += 1
                pos.append(k)
            batch.n_tokens = n
            llama_cpp.llama_decode(ctx, batch)
            idx = [i for i in range(n) if batch.logits[i]]
            toks = [
                int(
                    np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,)))
                )
                for i in idx
            ]
            t0 = time.perf_counter()
            for _ in range(args.tokens - 1):
                for s in range(n_seq):
                    batch.token[s], batch.pos[s], batch.n_seq_id[s] = toks[s], pos[s], 1
                    batch.seq_id[s][0], batch.logits[s] = s, 1
                    pos[s] += 1
                batch.n_tokens = n_seq
                if llama_cpp.llama_decode(ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed")
                toks = [
                    int(
                        np.argmax(
                            np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, s), shape=(n_vocab,))
                        )
                    )
                    for s in range(n_seq)
                ]
            return {"tok_s": n_seq * (args.tokens - 1) / (time.perf_counter() - t0)}
        finally:
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(ctx)


async def _stream_one(client: httpx.AsyncClient, url: str, body: dict) -> int:
    """Stream one request; the token ids are counted when the stream ends (inside the timed span).

    Parsing every event as it arrives would put the client's own JSON work on the two cores the server decodes
    on; the anchors it is compared with (a decode loop, llama-server answering non-streamed requests) have no
    such client. The events are still received one by one as the server sends them."""
    parts = []
    async with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for chunk in r.aiter_bytes():
            parts.append(chunk)
    n, final = 0, None
    for line in b"".join(parts).split(b"\n"):
        if line.startswith(b"data: {"):
            obj = json.loads(line[6:])
            for c in obj.get("choices", []):
                n += len(c.get("token_ids", []))
                final = c.get("all_token_ids", final)
    if final is not None and len(final) != n:
        raise RuntimeError(f"the stream's events carried {n} token ids but its final list has {len(final)}")
    return n


async def _concurrent(url: str, bodies: list[dict]) -> tuple[int, float]:
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        counts = await asyncio.gather(*[_stream_one(client, url, b) for b in bodies])
        return sum(counts), time.perf_counter() - t0


def _llama_server_once(base: str, r: int, k: int, args) -> dict:
    """One round against a llama-server: k requests at once (non-streamed, EOS ignored), tokens/s in all."""

    async def go():
        async with httpx.AsyncClient(timeout=600) as c:
            t0 = time.perf_counter()
            rs = await asyncio.gather(
                *[
                    c.post(
                        base + "/completion",
                        json={
                            "prompt": PROMPTS[(r + i) % len(PROMPTS)],
                            "n_predict": args.tokens,
                            "temperature": 0,
                            "ignore_eos": True,
                            "cache_prompt": False,
                        },
                    )
                    for i in range(k)
                ]
            )
            for x in rs:
                x.raise_for_status()
            return sum(x.json()["tokens_predicted"] for x in rs), time.perf_counter() - t0

    n, dt = asyncio.run(go())
    return {"tokens": n, "seconds": dt, "tok_s": n / dt}
