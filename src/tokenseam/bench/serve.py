"""`tokenseam bench serve`: decode speed of tokenseam's server vs llama-cpp-python and raw llama.cpp batching.

Same GGUF, same thread count, same run; medians over repeats and ratios against each anchor.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import httpx
import numpy as np

from .common import LlamaServer, machine, median, write_json

PROMPTS = [
    "Write a long story about a dragon who learns to paint.",
    "Explain in detail how a steam engine works.",
    "Describe a walk through a busy market in the morning.",
    "Write a letter to a friend about your summer holidays.",
    "List and explain ten tips for learning a new language.",
    "Tell the history of the bicycle in a few paragraphs.",
    "Describe the water cycle to a ten-year-old.",
    "Write a recipe for a vegetable soup with all the steps.",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="model alias or .gguf path (default smollm2)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=128, help="tokens generated per request")
    p.add_argument("--streams", type=int, default=8, help="concurrent streams for the batched figures")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--llama-server", default=None, help="path to a llama-server binary to add as an anchor")
    p.add_argument("--out", default="bench-results/serve.json")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..models import resolve_model

    if args.tokens < 1 or args.streams < 1 or args.repeats < 1 or args.threads < 1:
        print("error: --tokens, --streams, --repeats and --threads must be positive")
        return 2
    path = resolve_model(args.model)
    console = Console()
    res: dict = {"machine": machine(), "model": str(path), "threads": args.threads, "tokens": args.tokens,
                 "streams": args.streams, "repeats": args.repeats}

    console.print("[bold]1/4[/bold] llama-cpp-python Llama.create_completion, single stream")
    res["llama_cpp_python_1"] = _llama_cpp_python(path, args)
    console.print("[bold]2/4[/bold] raw llama.cpp multi-sequence batching (low-level API, greedy)")
    res["raw_batched"] = _raw_batched(path, args)
    console.print("[bold]3/4[/bold] tokenseam server over HTTP (SSE), 1 stream and concurrent streams")
    res.update(_tokenseam(path, args))
    if args.llama_server:
        console.print("[bold]4/4[/bold] llama-server anchor")
        res["llama_server"] = _llama_server(path, args)
    else:
        console.print("[dim]4/4 llama-server anchor skipped (pass --llama-server PATH)[/dim]")

    ours1 = res["tokenseam_1"]["tok_s"]
    oursn = res["tokenseam_n"]["tok_s"]
    res["ratio_single_vs_llama_cpp_python"] = ours1 / res["llama_cpp_python_1"]["tok_s"]
    res["ratio_batched_vs_raw"] = oursn / res["raw_batched"]["tok_s"]
    res["ratio_json_vs_unconstrained"] = res["tokenseam_json_1"]["tok_s"] / ours1
    table = Table(title=f"decode tokens/s, median of {args.repeats} ({Path(path).name}, {args.threads} threads)")
    for col in ("system", "1 stream", f"{args.streams} streams (aggregate)"):
        table.add_column(col)
    table.add_row("llama-cpp-python create_completion", f"{res['llama_cpp_python_1']['tok_s']:.1f}", "-")
    table.add_row("raw llama.cpp batch (low-level API)", f"{res['raw_batched']['tok_s_1']:.1f}",
                  f"{res['raw_batched']['tok_s']:.1f}")
    if "llama_server" in res:
        ls = res["llama_server"]
        table.add_row("llama-server", f"{ls['tok_s_1']:.1f}", f"{ls['tok_s_n']:.1f}")
    table.add_row("tokenseam (HTTP SSE)", f"{ours1:.1f}", f"{oursn:.1f}")
    table.add_row("tokenseam under a JSON Schema", f"{res['tokenseam_json_1']['tok_s']:.1f} "
                  f"({res['ratio_json_vs_unconstrained']:.3f}x unconstrained)", "-")
    table.add_row("ratio tokenseam / anchor", f"{res['ratio_single_vs_llama_cpp_python']:.3f} (vs llama-cpp-python)",
                  f"{res['ratio_batched_vs_raw']:.3f} (vs raw batch)")
    console.print(table)
    console.print(f"time per token outside llama_decode (engine thread): "
                  f"{res['tokenseam_1']['engine_overhead_ms_per_token']:.3f} ms single stream, "
                  f"{res['tokenseam_n']['engine_overhead_ms_per_token']:.3f} ms per step batched; "
                  f"end to end (HTTP + engine, single stream): {res['tokenseam_1']['outside_decode_ms_per_token']:.3f} ms")
    out = write_json(args.out, res)
    console.print(f"wrote {out}")
    return 0


def _llama_cpp_python(path: Path, args) -> dict:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads,
                n_batch=512, verbose=False)
    rates = []
    for r in range(args.repeats):
        prompt = PROMPTS[r % len(PROMPTS)]
        t0 = time.perf_counter()
        out = llm.create_completion(prompt, max_tokens=args.tokens, temperature=0)
        dt = time.perf_counter() - t0
        rates.append(out["usage"]["completion_tokens"] / dt)
    llm.close()
    return {"tok_s": median(rates), "runs": rates}


def _raw_batched(path: Path, args) -> dict:
    """The ceiling: a bare loop of llama_decode over n sequences with numpy argmax, nothing else."""
    import llama_cpp

    from ..vocab.tokenizer import ensure_llama_backend

    ensure_llama_backend()
    mp = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    def once(n_seq: int) -> float:
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = 1024 * n_seq
        cp.n_batch = cp.n_ubatch = 512
        cp.n_seq_max = n_seq
        cp.kv_unified = True
        cp.n_threads = cp.n_threads_batch = args.threads
        ctx = llama_cpp.llama_init_from_model(model, cp)
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
            toks = [int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,))))
                    for i in idx]
            t0 = time.perf_counter()
            for _ in range(args.tokens - 1):
                for s in range(n_seq):
                    batch.token[s], batch.pos[s], batch.n_seq_id[s] = toks[s], pos[s], 1
                    batch.seq_id[s][0], batch.logits[s] = s, 1
                    pos[s] += 1
                batch.n_tokens = n_seq
                if llama_cpp.llama_decode(ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed")
                toks = [int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, s),
                                                            shape=(n_vocab,)))) for s in range(n_seq)]
            return n_seq * (args.tokens - 1) / (time.perf_counter() - t0)
        finally:
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(ctx)

    r1 = [once(1) for _ in range(args.repeats)]
    rn = [once(args.streams) for _ in range(args.repeats)]
    llama_cpp.llama_model_free(model)
    return {"tok_s_1": median(r1), "tok_s": median(rn), "runs_1": r1, "runs": rn}


async def _stream_one(client: httpx.AsyncClient, url: str, body: dict) -> int:
    n = 0
    async with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                import json

                obj = json.loads(line[6:])
                n += sum(len(c.get("token_ids", [])) for c in obj.get("choices", []))
    return n


async def _concurrent(url: str, bodies: list[dict]) -> tuple[int, float]:
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        counts = await asyncio.gather(*[_stream_one(client, url, b) for b in bodies])
        return sum(counts), time.perf_counter() - t0


def _tokenseam(path: Path, args) -> dict:
    from ..server.runtime import BackgroundServer, build_server

    app, state = build_server(str(path), n_ctx=1024, parallel=max(args.streams, 1), threads=args.threads)
    bg = BackgroundServer(app)
    url = bg.url + "/v1/completions"
    eng, be = state.engine, state.backend

    def body(i: int) -> dict:
        return {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": args.tokens, "temperature": 0,
                "stream": True, "return_token_ids": True, "ignore_eos": True}

    try:
        asyncio.run(_concurrent(url, [body(0)]))  # warm-up
        r1, ov1, out1 = [], [], []
        for r in range(args.repeats):
            s0, d0, g0 = eng.stats.overhead_seconds, be.decode_seconds, eng.stats.generated_tokens
            n, dt = asyncio.run(_concurrent(url, [body(r)]))
            g = eng.stats.generated_tokens - g0
            r1.append(n / dt)
            ov1.append((eng.stats.overhead_seconds - s0) / max(g, 1) * 1000)
            out1.append((dt - (be.decode_seconds - d0)) / max(n, 1) * 1000)
        # the same single stream under a JSON Schema (grammar masks every step)
        schema = {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "note": {"type": "string"}}, "required": ["name", "note"]}}
        asyncio.run(_concurrent(url, [{**body(0), "guided_json": schema}]))  # warm-up: compile + first masks
        rj = []
        for r in range(args.repeats):
            n, dt = asyncio.run(_concurrent(url, [{**body(r), "guided_json": schema}]))
            rj.append(n / dt)
        rn, ovn = [], []
        for _ in range(args.repeats):
            s0, st0 = eng.stats.overhead_seconds, eng.stats.steps
            n, dt = asyncio.run(_concurrent(url, [body(i) for i in range(args.streams)]))
            rn.append(n / dt)
            ovn.append((eng.stats.overhead_seconds - s0) / max(eng.stats.steps - st0, 1) * 1000)
    finally:
        bg.stop()
        eng.shutdown()
        be.close()
    return {"tokenseam_1": {"tok_s": median(r1), "runs": r1, "engine_overhead_ms_per_token": median(ov1),
                            "outside_decode_ms_per_token": median(out1)},
            "tokenseam_json_1": {"tok_s": median(rj), "runs": rj},
            "tokenseam_n": {"tok_s": median(rn), "runs": rn, "engine_overhead_ms_per_token": median(ovn)}}


def _llama_server(path: Path, args) -> dict:
    out = {}
    for label, np_ in (("1", 1), ("n", args.streams)):
        with LlamaServer(args.llama_server, path, np_, args.threads, 1024) as ls:
            base = ls.url
            rates = []
            for r in range(args.repeats):
                k = 1 if np_ == 1 else args.streams

                async def go(k=k, r=r, base=base):
                    async with httpx.AsyncClient(timeout=600) as c:
                        t0 = time.perf_counter()
                        rs = await asyncio.gather(*[c.post(base + "/completion", json={
                            "prompt": PROMPTS[(r + i) % len(PROMPTS)], "n_predict": args.tokens, "temperature": 0,
                            "ignore_eos": True, "cache_prompt": False}) for i in range(k)])
                        return sum(x.json()["tokens_predicted"] for x in rs), time.perf_counter() - t0

                n, dt = asyncio.run(go())
                rates.append(n / dt)
            out[f"tok_s_{label}"] = median(rates)
    return out
