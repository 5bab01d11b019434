"""`tokenseam bench cache`: pitfall-suite rates, hit latency per store, fingerprint cost, and a gateway load test.

Everything runs on loopback (a redis-server and the fake upstream are started here); loops are bounded; prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TARGETS = {"sqlite_hit_p99_ms": 1.0, "redis_hit_p99_ms": 2.0, "fingerprint_4k_p50_us": 200.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--requests", type=int, default=10_000, help="load test: total requests (default 10000)"
    )
    parser.add_argument("--clients", type=int, default=64, help="load test: concurrent clients (default 64)")
    parser.add_argument("--distinct", type=int, default=1_000, help="load test: distinct requests in the mix")
    parser.add_argument(
        "--stream-share", type=float, default=0.5, help="load test: share of streamed requests"
    )
    parser.add_argument(
        "--load-store",
        default="sqlite",
        choices=["sqlite", "memory", "redis"],
        help="store behind the gateway in the load test",
    )
    parser.add_argument("--upstream-latency", type=float, default=0.02, help="fake upstream think time (s)")
    parser.add_argument(
        "--token-delay", type=float, default=0.0005, help="fake upstream delay per stream event (s)"
    )
    parser.add_argument("--hit-iterations", type=int, default=3_000, help="hit-latency samples per store")
    parser.add_argument("--fp-iterations", type=int, default=500, help="fingerprint samples")
    parser.add_argument("--redis-url", default=None, help="use this Redis instead of starting redis-server")
    parser.add_argument("--skip-load", action="store_true", help="skip the gateway load test")
    parser.add_argument("--out", default="bench-cache.json", help="JSON results path")
    parser.add_argument("--seed", type=int, default=1234)


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Redis:
    """A throwaway redis-server on a free loopback port with a temp dir."""

    def __init__(self) -> None:
        exe = (
            "/usr/bin/redis-server"
            if os.path.exists("/usr/bin/redis-server")
            else shutil.which("redis-server")
        )
        if not exe:
            raise RuntimeError("redis-server not found")
        self.dir = tempfile.mkdtemp(prefix="ts-bench-redis-")
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                self.dir,
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        r = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        r.close()
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


# ------------------------------------------------------------------------------------------ sections


def bench_pitfalls() -> dict[str, Any]:
    from .cache_pitfalls import run_pitfalls

    r = run_pitfalls()
    return {
        "must_hit": len(r.hits_ok) + len(r.hits_failed),
        "must_hit_rate": r.hit_rate,
        "must_miss": len(r.misses_ok) + len(r.misses_failed),
        "must_miss_hit_rate": r.wrong_hit_rate,
        "failed_hits": r.hits_failed,
        "wrong_hits": r.misses_failed,
    }


def _sample_entry(tokens: int = 200) -> tuple[dict[str, Any], dict[str, Any]]:
    from ..respcache import ROUTE_CHAT, entry_from_stream_events
    from ..testing.fake_upstream import WORDS

    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "temperature": 0,
        "return_token_ids": True,
    }
    head = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [
        dict(
            head, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
        )
    ]
    ids = []
    for i in range(tokens):
        ids.append(100 + i % len(WORDS))
        chunks.append(
            dict(
                head,
                choices=[
                    {
                        "index": 0,
                        "delta": {"content": " " + WORDS[i % len(WORDS)]},
                        "finish_reason": None,
                        "token_ids": [ids[-1]],
                    }
                ],
            )
        )
    chunks.append(
        dict(
            head,
            choices=[
                {"index": 0, "delta": {}, "finish_reason": "stop", "token_ids": [], "all_token_ids": ids}
            ],
        )
    )
    chunks.append(
        dict(
            head,
            choices=[],
            usage={"prompt_tokens": 10, "completion_tokens": tokens, "total_tokens": 10 + tokens},
        )
    )
    return body, entry_from_stream_events(ROUTE_CHAT, chunks)


def bench_hit_latency(stores: dict[str, Any], iterations: int) -> dict[str, Any]:
    """Per store: sync `get + validate + response_from_entry`, and the async `ResponseCache.respond` hit path."""
    from prometheus_client import CollectorRegistry

    from ..respcache import ROUTE_CHAT, ResponseCache, response_from_entry
    from ..respcache.entry import validate_entry

    body, entry = _sample_entry()
    out: dict[str, Any] = {"entry_bytes": len(json.dumps(entry)), "entry_tokens": 200}
    for name, store in stores.items():
        cache = ResponseCache(store, registry=CollectorRegistry())
        plan = cache.plan(ROUTE_CHAT, body)
        store.put(plan.fingerprint, entry)
        for _ in range(50):  # warm connections and caches
            response_from_entry(store.get(plan.fingerprint))
        sync = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            got = store.get(plan.fingerprint)
            assert got is not None and validate_entry(got)
            response_from_entry(got)
            sync.append(time.perf_counter() - t0)

        async def gen(req: dict[str, Any]) -> dict[str, Any]:
            raise RuntimeError("a hit must not generate")

        async def run_async(cache: ResponseCache = cache, plan: Any = plan) -> list[float]:
            xs = []
            for _ in range(iterations):
                t0 = time.perf_counter()
                r = await cache.respond(plan, gen)
                xs.append(time.perf_counter() - t0)
                assert r.status == "hit"
            return xs

        asy = asyncio.run(run_async())
        out[name] = {
            "sync_p50_ms": _pct(sync, 50) * 1e3,
            "sync_p90_ms": _pct(sync, 90) * 1e3,
            "sync_p99_ms": _pct(sync, 99) * 1e3,
            "async_p50_ms": _pct(asy, 50) * 1e3,
            "async_p99_ms": _pct(asy, 99) * 1e3,
        }
        store.delete(plan.fingerprint)
    return out


def _long_chat(target_tokens: int = 4096) -> tuple[dict[str, Any], int | None]:
    para = (
        "The river bends twice before the old mill, where the stones are grey and the water runs quick. "
        "Naïve travellers stop at the café by the bridge; locals walk on toward the north field.\r\n"
    )
    count = None
    try:
        from ..models import resolve_model
        from ..vocab import Tokenizer

        tok = Tokenizer.from_gguf(resolve_model("smollm2"))
        per = len(tok.encode(para))
        reps = max(1, target_tokens // per)
        text = para * reps
        count = len(tok.encode(text))
    except Exception:  # the tokenizer is only used to size the request; fall back to ~4 chars per token
        reps = max(1, target_tokens * 4 // len(para))
        text = para * reps
    half = len(text) // 2
    body = {
        "model": "smollm2",
        "temperature": 0,
        "max_tokens": 256,
        "messages": [{"role": "system", "content": text[:half]}, {"role": "user", "content": text[half:]}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": f"t{i}",
                    "parameters": {"type": "object", "properties": {"a": {"type": "string"}}},
                },
            }
            for i in range(3)
        ],
    }
    return body, count


IDS_PROMPT = 8000  # token ids in the fingerprinted /v1/completions prompt


def bench_fingerprint(iterations: int) -> dict[str, Any]:
    from ..respcache import ROUTE_CHAT, ROUTE_COMPLETIONS, fingerprint_request

    body, tokens = _long_chat()
    for _ in range(20):
        fingerprint_request(ROUTE_CHAT, body, tenant="t")
    xs = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fingerprint_request(ROUTE_CHAT, body, tenant="t")
        xs.append(time.perf_counter() - t0)
    ascii_body = json.loads(json.dumps(body).replace("\\u00ef", "i").replace("\\u00e9", "e"))
    ys = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fingerprint_request(ROUTE_CHAT, ascii_body, tenant="t")
        ys.append(time.perf_counter() - t0)
    # A prompt of token ids, as a client that tokenizes itself sends it (ids spread over a 262k vocabulary)
    ids = {"prompt": [(k * 7919) % 262144 for k in range(IDS_PROMPT)], "max_tokens": 1, "temperature": 0}
    zs = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fingerprint_request(ROUTE_COMPLETIONS, ids, tenant="t")
        zs.append(time.perf_counter() - t0)
    return {
        "prompt_tokens": tokens,
        "chars": sum(len(m["content"]) for m in body["messages"]),
        "p50_us": _pct(xs, 50) * 1e6,
        "p99_us": _pct(xs, 99) * 1e6,
        "ascii_p50_us": _pct(ys, 50) * 1e6,
        "ascii_p99_us": _pct(ys, 99) * 1e6,
        "ids_prompt": IDS_PROMPT,
        "ids_p50_us": _pct(zs, 50) * 1e6,
        "ids_p99_us": _pct(zs, 99) * 1e6,
    }


class _RawClient:
    """A minimal HTTP/1.1 keep-alive client for loopback load (httpx's pool costs more CPU than the gateway
    being measured once 64 connections are open). Handles content-length and chunked bodies."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        await self.writer.drain()
        reader = self.reader
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("server closed the connection")
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        if "content-length" in headers:
            data = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await reader.readline()
                    break
                parts.append(await reader.readexactly(size))
                await reader.readline()
            data = b"".join(parts)
        else:
            data = await reader.read()
            self.close()
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, headers, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def bench_load(args: argparse.Namespace, redis_url: str | None) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry

    from ..gateway import create_gateway_app
    from ..httpkit import BackgroundServer
    from ..respcache import ROUTE_CHAT, ROUTE_COMPLETIONS, ResponseCache, normalize_request, open_store
    from ..respcache.entry import SSEParser
    from ..testing.fake_upstream import FakeUpstream, fake_answer

    rng = random.Random(args.seed)
    pool: list[tuple[str, dict[str, Any]]] = []
    for i in range(args.distinct):
        if i % 4 == 3:
            pool.append(
                (
                    ROUTE_COMPLETIONS,
                    {
                        "model": "fake-model",
                        "prompt": f"Prompt number {i}:",
                        "temperature": 0,
                        "max_tokens": 16,
                    },
                )
            )
        else:
            pool.append(
                (
                    ROUTE_CHAT,
                    {
                        "model": "fake-model",
                        "temperature": 0,
                        "max_tokens": 16,
                        "messages": [
                            {"role": "system", "content": "Be brief."},
                            {"role": "user", "content": f"Question {i}: name a river."},
                        ],
                    },
                )
            )
    # Zipf-like repeats: a few hot requests, a long tail; every pool entry appears at least once.
    weights = [1.0 / (1 + k) ** 0.8 for k in range(len(pool))]
    order = list(range(len(pool))) + rng.choices(
        range(len(pool)), weights, k=max(0, args.requests - len(pool))
    )
    rng.shuffle(order)
    order = order[: args.requests]
    jobs = [(pool[k], rng.random() < args.stream_share, k) for k in order]
    distinct_used = len(set(order))
    expected = {k: ["".join(fake_answer(normalize_request(r, b), 0)[0])] for k, (r, b) in enumerate(pool)}

    tmp = tempfile.mkdtemp(prefix="ts-bench-cache-")
    spec = {"sqlite": f"sqlite:{tmp}/load.sqlite", "memory": "memory", "redis": redis_url or ""}[
        args.load_store
    ]
    store = open_store(spec, max_entries=None if args.load_store != "memory" else 10 * len(pool))
    if args.load_store == "redis":
        store.clear()
    fake = FakeUpstream()
    fake.state.latency = args.upstream_latency
    fake.state.token_delay = args.token_delay
    reg = CollectorRegistry()
    cache = ResponseCache(store, registry=reg)
    errors: list[str] = []
    wrong: list[str] = []
    lat: list[float] = []
    statuses: dict[str, int] = {}
    with fake, BackgroundServer(create_gateway_app(fake.url, cache=cache, registry=reg)) as gw:

        async def run() -> float:
            queue: asyncio.Queue = asyncio.Queue()
            for j in jobs:
                queue.put_nowait(j)

            async def worker() -> None:
                h = _RawClient(gw.host, gw.port)
                while True:
                    try:
                        (route, body), stream, k = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        h.close()
                        return
                    t0 = time.perf_counter()
                    try:
                        status, headers, content = await asyncio.wait_for(
                            h.post(route, json.dumps(dict(body, stream=stream)).encode()), 60
                        )
                        if status != 200:
                            errors.append(f"{status}: {content[:120]!r}")
                            continue
                        if stream:
                            evs = SSEParser().feed(content)
                            if not evs or evs[-1] != "[DONE]":
                                errors.append("stream without [DONE]")
                                continue
                            key = "delta" if route == ROUTE_CHAT else None
                            text = "".join(
                                (e["choices"][0][key].get("content") or "")
                                if key
                                else e["choices"][0]["text"]
                                for e in evs[:-1]
                                if e.get("choices")
                            )
                        else:
                            ch = json.loads(content)["choices"][0]
                            text = ch["message"]["content"] if route == ROUTE_CHAT else ch["text"]
                        lat.append(time.perf_counter() - t0)
                        st = headers.get("x-tokenseam-cache", "?")
                        statuses[st] = statuses.get(st, 0) + 1
                        if text != expected[k][0]:
                            wrong.append(f"request {k}: got {text[:40]!r}")
                    except Exception as e:  # every failure is counted, none may escape the benchmark
                        errors.append(f"{type(e).__name__}: {e}")
                        h.close()

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(args.clients)))
            return time.perf_counter() - t0

        wall = asyncio.run(run())
        upstream_calls = fake.state.calls
        stored = store.count()
    store.clear()
    store.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return {
        "requests": len(jobs),
        "clients": args.clients,
        "distinct_requests": distinct_used,
        "stream_share": args.stream_share,
        "store": args.load_store,
        "wall_s": wall,
        "throughput_rps": len(jobs) / wall,
        "p50_ms": _pct(lat, 50) * 1e3,
        "p99_ms": _pct(lat, 99) * 1e3,
        "errors": len(errors),
        "error_samples": errors[:5],
        "wrong_hits": len(wrong),
        "wrong_samples": wrong[:5],
        "upstream_calls": upstream_calls,
        "stored_entries": stored,
        "lost_writes": max(0, distinct_used - stored),
        "coalesced": cache.stats.get("coalesced", 0),
        "cache_status": statuses,
    }


# ------------------------------------------------------------------------------------------ run


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..respcache import MemoryStore, RedisStore, SQLiteStore

    console = Console()
    # p99 on a shared machine measures the scheduler as much as the code: record how loaded it was.
    results: dict[str, Any] = {"targets": TARGETS, "cpus": os.cpu_count(), "loadavg_start": os.getloadavg()}
    console.print("[bold]pitfall suite[/bold]")
    results["pitfalls"] = bench_pitfalls()

    redis_proc = None
    redis_url = args.redis_url
    if redis_url is None:
        try:
            redis_proc = _Redis()
            redis_url = redis_proc.url
        except RuntimeError as e:
            console.print(f"[yellow]Redis skipped: {e}[/yellow]")
    try:
        tmp = tempfile.mkdtemp(prefix="ts-bench-hit-")
        stores: dict[str, Any] = {"memory": MemoryStore(), "sqlite": SQLiteStore(Path(tmp) / "hit.sqlite")}
        if redis_url:
            stores["redis"] = RedisStore(redis_url, prefix="bench-hit:")
        console.print("[bold]hit latency[/bold]")
        results["hit_latency"] = bench_hit_latency(stores, args.hit_iterations)
        for s in stores.values():
            s.close()
        shutil.rmtree(tmp, ignore_errors=True)
        console.print("[bold]fingerprint[/bold]")
        results["fingerprint"] = bench_fingerprint(args.fp_iterations)
        if not args.skip_load:
            if args.load_store == "redis" and not redis_url:
                console.print("[red]load test needs Redis but none is available[/red]")
                return 2
            console.print(f"[bold]load test[/bold] ({args.requests} requests, {args.clients} clients)")
            results["load"] = bench_load(args, redis_url)
    finally:
        if redis_proc is not None:
            redis_proc.stop()

    results["loadavg_end"] = os.getloadavg()
    checks = _checks(results)
    results["checks"] = checks
    table = Table(title="tokenseam bench cache")
    for col in ("measure", "value", "target", "ok"):
        table.add_column(col)
    p = results["pitfalls"]
    table.add_row(
        "must-hit variants hitting",
        f"{p['must_hit_rate']:.0%} of {p['must_hit']}",
        "100 %",
        _ok(checks["pitfall_hits"]),
    )
    table.add_row(
        "must-miss variants hitting",
        f"{p['must_miss_hit_rate']:.0%} of {p['must_miss']}",
        "0 %",
        _ok(checks["pitfall_misses"]),
    )
    for name, v in results["hit_latency"].items():
        if not isinstance(v, dict):
            continue
        target = {"sqlite": "< 1 ms", "redis": "< 2 ms"}.get(name, "")
        table.add_row(
            f"hit {name}: get+build p50 / p90 / p99",
            f"{v['sync_p50_ms']:.3f} / {v['sync_p90_ms']:.3f} / {v['sync_p99_ms']:.3f} ms",
            target,
            _ok(checks.get(f"{name}_hit")) if name in ("sqlite", "redis") else "",
        )
        table.add_row(
            f"hit {name}: ResponseCache.respond p50 / p99",
            f"{v['async_p50_ms']:.3f} / {v['async_p99_ms']:.3f} ms",
            "",
            "",
        )
    f = results["fingerprint"]
    table.add_row(
        f"fingerprint {f['prompt_tokens'] or '~4k'}-token chat p50 / p99",
        f"{f['p50_us']:.0f} / {f['p99_us']:.0f} µs",
        "< 200 µs",
        _ok(checks["fingerprint"]),
    )
    table.add_row("fingerprint, ASCII-only text p50", f"{f['ascii_p50_us']:.0f} µs", "", "")
    table.add_row(
        f"fingerprint, {f['ids_prompt']:,} prompt ids p50 / p99",
        f"{f['ids_p50_us']:.0f} / {f['ids_p99_us']:.0f} µs",
        "",
        "",
    )
    if "load" in results:
        ld = results["load"]
        table.add_row(
            "load: requests / clients / distinct",
            f"{ld['requests']} / {ld['clients']} / {ld['distinct_requests']}",
            "",
            "",
        )
        table.add_row("load: errors", str(ld["errors"]), "0", _ok(ld["errors"] == 0))
        table.add_row("load: wrong hits", str(ld["wrong_hits"]), "0", _ok(ld["wrong_hits"] == 0))
        table.add_row(
            "load: lost writes (distinct - stored)", str(ld["lost_writes"]), "0", _ok(ld["lost_writes"] == 0)
        )
        table.add_row(
            "load: upstream calls vs distinct",
            f"{ld['upstream_calls']} vs {ld['distinct_requests']}",
            "equal",
            _ok(checks["load_coalescing"]),
        )
        table.add_row("load: coalesced requests", str(ld["coalesced"]), "> 0", "")
        table.add_row("load: throughput", f"{ld['throughput_rps']:.0f} req/s", "", "")
        table.add_row("load: latency p50 / p99", f"{ld['p50_ms']:.1f} / {ld['p99_ms']:.1f} ms", "", "")
    console.print(table)
    console.print(
        f"machine: {os.cpu_count()} CPUs, load average {results['loadavg_start'][0]:.1f} at start, "
        f"{results['loadavg_end'][0]:.1f} at end"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    console.print(f"wrote {out}")
    return 0 if all(v for v in checks.values() if v is not None) else 1


def _ok(v: bool | None) -> str:
    return "" if v is None else ("yes" if v else "[red]NO[/red]")


def _checks(r: dict[str, Any]) -> dict[str, bool | None]:
    hl = r["hit_latency"]
    c: dict[str, bool | None] = {
        "pitfall_hits": r["pitfalls"]["must_hit_rate"] == 1.0,
        "pitfall_misses": r["pitfalls"]["must_miss_hit_rate"] == 0.0,
        "sqlite_hit": hl["sqlite"]["sync_p99_ms"] < TARGETS["sqlite_hit_p99_ms"],
        "redis_hit": hl["redis"]["sync_p99_ms"] < TARGETS["redis_hit_p99_ms"] if "redis" in hl else None,
        "fingerprint": r["fingerprint"]["p50_us"] < TARGETS["fingerprint_4k_p50_us"],
    }
    if "load" in r:
        ld = r["load"]
        c["load_clean"] = ld["errors"] == 0 and ld["wrong_hits"] == 0 and ld["lost_writes"] == 0
        c["load_coalescing"] = ld["upstream_calls"] == ld["distinct_requests"]
    return c


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tokenseam bench cache", description=__doc__)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
