"""`tokenseam bench gateway`: the gateway in front of several real tokenseam replicas.

Phases (`--phases`, all by default):
- `routing`: a RAG workload (a few fixed system prompts x retrieved passages x questions, interleaved) through
  a gateway over `--replicas` fresh tokenseam servers, once per policy (prefix, round-robin, least-loaded),
  and once straight to a single replica whose prefix cache is as large as all of theirs together: it sees
  every earlier prompt and so serves from its cache every token any router could (the oracle). Each replica
  runs with the server's default prefix cache. Reported per policy: the prompt tokens served from a prefix
  cache (usage.prompt_tokens_details.cached_tokens) as a share of the oracle's, TTFT p50/p99, and the busiest
  replica's request count over the mean.
- `overhead`: a fake upstream in its own process, called directly and through the gateway in alternating
  requests (cache off): the added latency per non-streamed request (p50/p99) and per relayed stream event.
- `throughput`: 64 concurrent clients through the gateway to the fake upstream against the same clients
  calling it directly (requests per second, ratio).
- `chaos`: `--chaos-clients` clients send `--chaos-requests` requests (deterministic repeats, streams with
  token ids, clients that leave mid-stream) through two gateway processes sharing one redis-server, in front
  of the replicas; one replica is killed and Redis restarted mid-run. Counted: 5xx answers, wrong cache
  hits (an answer that differs from the first answer to the same request), streams whose ids do not join.

Writes JSON (`--out`) and a PNG beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from .common import ServerProcess, free_port, machine, median, percentile, stream_ttft, write_json
from .prefix_cache import document

POLICIES = ("prefix", "round-robin", "least-loaded")
PHASES = ("routing", "overhead", "throughput", "chaos")
QUESTIONS = (
    "Which word comes first?",
    "How many numbers are there?",
    "Summarise the passage.",
    "What is the last number?",
    "Is a river mentioned?",
    "Name one place.",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument(
        "--replica-cache-tokens",
        type=int,
        default=16384,
        help="each replica's prefix cache, the server's default (the oracle replica gets replicas x this: the "
        "pooled cache); smaller values measure the replicas' eviction as much as the routing",
    )
    p.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, from {', '.join(PHASES)}")
    p.add_argument("--systems", type=int, default=2, help="fixed system prompts in the RAG workload")
    p.add_argument("--system-words", type=int, default=150, help="words per system prompt (~1.3 tokens each)")
    p.add_argument("--chunks", type=int, default=12, help="retrieved passages to draw from")
    p.add_argument("--chunk-words", type=int, default=200, help="words per passage")
    p.add_argument("--requests", type=int, default=160, help="RAG requests per policy")
    p.add_argument("--concurrency", type=int, default=4, help="RAG clients in flight")
    p.add_argument("--overhead-requests", type=int, default=400)
    p.add_argument("--chaos-clients", type=int, default=64)
    p.add_argument("--chaos-requests", type=int, default=2000)
    p.add_argument(
        "--policies", default=",".join(POLICIES), help="routing policies the routing phase compares"
    )
    p.add_argument("--load-factor", type=float, default=1.25, help="the gateway's bounded-load factor")
    p.add_argument("--out", default="results/gateway.json")


# ------------------------------------------------------------------------------------------------ processes


class Replica(ServerProcess):
    name = "tokenseam replica"

    def __init__(self, model: str, port: int | None = None, cache_tokens: int | None = None) -> None:
        self.port = port or free_port()
        argv = [sys.executable, "-m", "tokenseam.cli", "serve", "--model", model, "--port", str(self.port)]
        argv += ["--threads", "1", "--parallel", "4", "--cache", "off", "--ctx-size", "2048"]
        if cache_tokens is not None:
            argv += ["--prefix-cache-tokens", str(cache_tokens)]
        super().__init__(argv, self.port)


class Gateway(ServerProcess):
    name = "tokenseam gateway"

    def __init__(
        self,
        upstreams: list[str],
        *,
        store: str = "memory",
        routing: str = "prefix",
        cache: str = "off",
        load_factor: float = 1.25,
    ):
        self.port = free_port()
        argv = [
            sys.executable,
            "-m",
            "tokenseam.cli",
            "gateway",
            "--port",
            str(self.port),
            "--routing",
            routing,
        ]
        for u in upstreams:
            argv += ["--upstream", u]
        argv += ["--cache", cache, "--cache-store", store, "--health-interval", "0.5", "--cache-truncated"]
        argv += ["--load-factor", str(load_factor)]
        super().__init__(argv, self.port)


class FakeProcess(ServerProcess):
    """The fake OpenAI upstream (tokenseam.testing.fake_upstream) in a process of its own."""

    name = "fake upstream"

    def __init__(self) -> None:
        port = free_port()
        code = (
            "import time; from tokenseam.testing.fake_upstream import FakeUpstream\n"
            f"f = FakeUpstream(port={port}).start()\n"
            "while True: time.sleep(3600)\n"
        )
        super().__init__([sys.executable, "-c", code], port)


class RedisProcess:
    """redis-server on loopback with a temp dir, restartable on the same port."""

    def __init__(self) -> None:
        exe = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.path.exists(exe):
            raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
        self.exe, self.port, self.dir = exe, free_port(), tempfile.mkdtemp(prefix="ts-bench-redis-")
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.start()

    def start(self) -> None:
        argv = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", ""]
        self.proc = subprocess.Popen(
            argv + ["--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(0.3)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


# ------------------------------------------------------------------------------------------------ workload


def rag_bodies(args: argparse.Namespace, seed: int = 7) -> list[dict[str, Any]]:
    """Requests as a RAG service sends them: an application's system prompt, the retrieved passage as a second
    system message, then the user's question. The passages of a popular topic are retrieved again and again,
    so (system prompt, passage) pairs repeat, interleaved with every other pair."""
    rng = random.Random(seed)
    systems = [
        f"You are assistant number {i} of the archive. Answer from the passage only.\n"
        + document(args.system_words, seed + i)
        for i in range(args.systems)
    ]
    chunks = [document(args.chunk_words, 1000 + i) for i in range(args.chunks)]
    out = []
    for _ in range(args.requests):
        out.append(
            {
                "model": args.model,
                "messages": [
                    {"role": "system", "content": rng.choice(systems)},
                    {"role": "system", "content": "Passage:\n" + rng.choice(chunks)},
                    {"role": "user", "content": rng.choice(QUESTIONS)},
                ],
                "max_tokens": 4,
                "temperature": 0.7,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        )
    return out


async def _stream_one(client: httpx.AsyncClient, url: str, body: dict) -> dict[str, Any]:
    first, usage, status, headers = await stream_ttft(client, url + "/v1/chat/completions", body)
    route = headers.get("x-tokenseam-route", "")
    fields = dict(p.strip().split("=", 1) for p in route.split(";") if "=" in p)
    prompt = usage.get("prompt_tokens", 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "status": status,
        "ttft": first,
        "prompt": prompt,
        "cached": cached,
        "replica": fields.get("replica", ""),
        "reason": fields.get("reason", ""),
    }


async def _drive(url: str, bodies: list[dict], concurrency: int) -> list[dict[str, Any]]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=concurrency * 2)) as client:

        async def one(b):
            async with sem:
                return await _stream_one(client, url, b)

        return await asyncio.gather(*(one(b) for b in bodies))


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r["status"] == 200 and r["ttft"] is not None]
    loads: dict[str, int] = {}
    for r in ok:
        loads[r["replica"]] = loads.get(r["replica"], 0) + 1
    counts = list(loads.values())
    reasons: dict[str, int] = {}
    for r in ok:
        reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    return {
        "route_reasons": reasons,
        "requests": len(rows),
        "errors": len(rows) - len(ok),
        "prompt_tokens": sum(r["prompt"] for r in ok),
        "cached_tokens": sum(r["cached"] for r in ok),
        "ttft_p50_ms": 1000 * median([r["ttft"] for r in ok]),
        "ttft_p99_ms": 1000 * percentile([r["ttft"] for r in ok], 99),
        "requests_per_replica": loads,
        "max_over_mean_load": (max(counts) / statistics.mean(counts)) if counts else None,
    }


def _metric(url: str, name: str) -> float | None:
    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def phase_routing(args: argparse.Namespace) -> dict[str, Any]:
    bodies = rag_bodies(args)
    out: dict[str, Any] = {}
    # The oracle: one replica with the pooled cache of all of them sees every earlier prompt.
    with Replica(args.model, cache_tokens=args.replicas * args.replica_cache_tokens) as single:
        out["single_replica"] = _summary(asyncio.run(_drive(single.url, bodies, args.concurrency)))
    print(f"  oracle (one replica): {out['single_replica']['cached_tokens']} cached tokens", flush=True)
    for policy in [p.strip() for p in args.policies.split(",")]:
        replicas = [Replica(args.model, cache_tokens=args.replica_cache_tokens) for _ in range(args.replicas)]
        try:
            for r in replicas:
                r.__enter__()
            with Gateway([r.url for r in replicas], routing=policy, load_factor=args.load_factor) as gw:
                s = _summary(asyncio.run(_drive(gw.url, bodies, args.concurrency)))
            s["evictions_per_replica"] = [
                _metric(r.url, "tokenseam_prefix_cache_evictions_total") for r in replicas
            ]
        finally:
            for r in replicas:
                r.__exit__()
        oracle = out["single_replica"]["cached_tokens"]
        s["cached_share_of_oracle"] = s["cached_tokens"] / oracle if oracle else None
        out[policy] = s
        print(
            f"  {policy:13s} cached {s['cached_tokens']:6d} ({s['cached_share_of_oracle']:.3f} of the oracle)  "
            f"TTFT p50 {s['ttft_p50_ms']:.0f} ms p99 {s['ttft_p99_ms']:.0f} ms  max/mean load "
            f"{s['max_over_mean_load']:.2f}  errors {s['errors']}  evictions {s['evictions_per_replica']}  "
            f"routes {s['route_reasons']}",
            flush=True,
        )
    return out


# ------------------------------------------------------------------------------------------------ overhead


async def _timed_calls(pairs: list[tuple[str, bytes]], rounds: int) -> list[list[float]]:
    """Seconds per call for each (url, body), the pairs alternating in order every round (drift on a shared
    machine hits all alike). A lean HTTP/1.1 client, so the figure is the servers', not the client's."""
    from ..gateway.http1 import Http1Client

    client = Http1Client(connect_timeout=5, read_timeout=60)
    h = {"content-type": "application/json"}
    targets = []
    for url, body in pairs:
        host, port = url.split("//")[1].split(":")
        targets.append((host, int(port), body))
    for host, port, body in targets * 20:  # warm every path
        await client.request("POST", host, port, "/v1/chat/completions", h, body)
    out: list[list[float]] = [[] for _ in pairs]
    for i in range(rounds):
        order = list(range(len(pairs)))
        if i % 2:
            order.reverse()
        for k in order:
            host, port, body = targets[k]
            t0 = time.perf_counter()
            r = await client.request("POST", host, port, "/v1/chat/completions", h, body)
            out[k].append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise RuntimeError(f"{r.status_code}: {r.content[:200]!r}")
    await client.aclose()
    return out


def phase_overhead(args: argparse.Namespace) -> dict[str, Any]:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "temperature": 0.5}
    stream_body = {**body, "n": 8, "max_tokens": 12, "stream": True}
    plain, streamed = json.dumps(body).encode(), json.dumps(stream_body).encode()
    with FakeProcess() as fake, Gateway([fake.url]) as gw:
        direct, via = asyncio.run(_timed_calls([(fake.url, plain), (gw.url, plain)], args.overhead_requests))
        sdirect, svia = asyncio.run(
            _timed_calls([(fake.url, streamed), (gw.url, streamed)], max(20, args.overhead_requests // 4))
        )
        n_events = httpx.post(fake.url + "/v1/chat/completions", json=stream_body, timeout=30).text.count(
            "data: {"
        )
    added = [b - a for a, b in zip(direct, via, strict=True)]
    per_event = [(b - a) / n_events for a, b in zip(sdirect, svia, strict=True)]
    out = {
        "requests": len(direct),
        "direct_p50_ms": 1000 * median(direct),
        "gateway_p50_ms": 1000 * median(via),
        "added_p50_ms": 1000 * median(added),
        "added_p99_ms": 1000 * percentile(added, 99),
        "stream_events": n_events,
        "added_per_event_p50_ms": 1000 * median(per_event),
        "added_per_event_p99_ms": 1000 * percentile(per_event, 99),
    }
    print(
        f"  gateway adds {out['added_p50_ms']:.2f} ms p50 / {out['added_p99_ms']:.2f} ms p99 per request "
        f"(direct {out['direct_p50_ms']:.2f} ms), {out['added_per_event_p50_ms']:.3f} ms p50 per relayed event "
        f"({n_events} events)",
        flush=True,
    )
    return out


def phase_throughput(args: argparse.Namespace, clients: int = 64, seconds: float = 10.0) -> dict[str, Any]:
    from ..gateway.http1 import Http1Client

    body = json.dumps(
        {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "temperature": 0.5}
    )

    async def load(url: str) -> float:
        host, port = url.split("//")[1].split(":")
        client = Http1Client(connect_timeout=5, read_timeout=60, max_idle=clients)
        done = 0
        stop = time.perf_counter() + seconds

        async def worker():
            nonlocal done
            while time.perf_counter() < stop:
                r = await client.request(
                    "POST",
                    host,
                    int(port),
                    "/v1/chat/completions",
                    {"content-type": "application/json"},
                    body.encode(),
                )
                done += r.status_code == 200

        await asyncio.gather(*(worker() for _ in range(clients)))
        await client.aclose()
        return done / seconds

    with FakeProcess() as fake, Gateway([fake.url]) as gw:
        direct = asyncio.run(load(fake.url))
        via = asyncio.run(load(gw.url))
    out = {
        "clients": clients,
        "direct_rps": direct,
        "gateway_rps": via,
        "ratio": via / direct if direct else None,
    }
    print(
        f"  {clients} clients: direct {direct:.0f} req/s, through the gateway {via:.0f} req/s ({out['ratio']:.2f})",
        flush=True,
    )
    return out


# ------------------------------------------------------------------------------------------------ chaos


class ChaosCounts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: dict[int, int] = {}
        self.generated: dict[str, set] = {}  # question -> every answer a replica generated for it
        self.hits: list[tuple[str, Any]] = []
        self.id_mismatch = 0
        self.errors: list[str] = []
        self.cut_streams = 0  # a replica died under a live stream: an error event, never a silent end
        self.left_early = 0

    def status(self, code: int, body: str = "") -> None:
        with self.lock:
            self.statuses[code] = self.statuses.get(code, 0) + 1
            if code >= 500 and len(self.errors) < 10:
                self.errors.append(f"{code}: {body[:300]}")

    def answer(self, key: str, value: Any, cache: str) -> None:
        with self.lock:
            if cache == "hit":
                self.hits.append((key, value))
            else:
                self.generated.setdefault(key, set()).add(value)

    def report(self) -> dict[str, Any]:
        # A hit is wrong when no generation of its own request produced it (checked once all have finished:
        # replicas may differ in greedy output under batching, so "the first answer" is not the yardstick).
        wrong = sum(1 for key, value in self.hits if value not in self.generated.get(key, ()))
        return {
            "statuses": self.statuses,
            "errors": self.errors,
            "five_xx": sum(n for s, n in self.statuses.items() if s >= 500),
            "hits": len(self.hits),
            "wrong_cache_hits": wrong,
            "streams_whose_ids_do_not_join": self.id_mismatch,
            "streams_cut_by_the_kill": self.cut_streams,
            "clients_that_left_mid_stream": self.left_early,
        }


def _chaos_request(h: httpx.Client, url: str, i: int, model: str, counts: ChaosCounts) -> None:
    kind = i % 4
    question = f"Name a colour. ({i % 40})"  # 40 distinct bodies, each asked again and again
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 4,
    }
    if kind == 0:  # non-streamed
        r = h.post(url + "/v1/chat/completions", json=body)
        counts.status(r.status_code, r.text)
        if r.status_code == 200:
            counts.answer(
                question, r.json()["choices"][0]["message"]["content"], r.headers["x-tokenseam-cache"]
            )
        return
    body = {**body, "stream": True, "return_token_ids": True}
    with h.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            counts.status(r.status_code, r.read().decode(errors="replace"))
            return
        counts.status(r.status_code)
        text, ids, final, err = "", [], None, False
        for n, line in enumerate(r.iter_lines()):
            if kind == 3 and n >= 1:  # a client that leaves
                with counts.lock:
                    counts.left_early += 1
                return
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                err = True
                continue
            for c in ev.get("choices") or ():
                text += c["delta"].get("content") or ""
                ids += c.get("token_ids") or []
                if c.get("finish_reason"):
                    final = c.get("all_token_ids")
        if err:
            with counts.lock:
                counts.cut_streams += 1
            return
        if final != ids or not ids:
            with counts.lock:
                counts.id_mismatch += 1
        counts.answer(question, text, r.headers["x-tokenseam-cache"])


def run_chaos(
    model: str, replicas: int, clients: int, requests: int, *, kill_at: float = 0.3, redis_at: float = 0.6
) -> dict[str, Any]:
    """The chaos run (also called by the test suite with small numbers); see the module docstring."""
    reps = [Replica(model) for _ in range(replicas)]
    redis = RedisProcess()
    gws: list[Gateway] = []
    try:
        for r in reps:
            r.__enter__()
        gws = [Gateway([r.url for r in reps], store=redis.url, cache="deterministic") for _ in range(2)]
        for g in gws:
            g.__enter__()
        counts = ChaosCounts()
        sent = iter(range(requests))
        lock = threading.Lock()
        events: list[str] = []
        kill_i, redis_i = int(requests * kill_at), int(requests * redis_at)

        def worker(w: int) -> None:
            with httpx.Client(timeout=120) as h:
                while True:
                    with lock:
                        i = next(sent, None)
                    if i is None:
                        return
                    if i == kill_i:
                        events.append(f"killed replica {reps[0].url} at request {i}")
                        reps[0].killed_on_purpose = True
                        reps[0].proc.kill()
                    if i == redis_i:
                        events.append(f"restarted Redis at request {i}")
                        redis.stop()
                        threading.Timer(1.0, redis.start).start()
                    try:
                        _chaos_request(h, gws[i % 2].url, i, model, counts)
                    except httpx.HTTPError as e:
                        counts.status(599)
                        events.append(f"client error: {type(e).__name__}: {e}")

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out = counts.report()
        out["seconds"] = time.perf_counter() - t0
        out["events"] = events[:20]
        # Every slot a client left behind is free again.
        time.sleep(1.0)
        out["in_flight_after"] = sum(
            x["in_flight"] for g in gws for x in httpx.get(g.url + "/health", timeout=5).json()["replicas"]
        )
        return out
    finally:
        for g in gws:
            g.__exit__()
        for r in reps:
            r.__exit__()
        redis.stop()


def phase_chaos(args: argparse.Namespace) -> dict[str, Any]:
    out = run_chaos(args.model, args.replicas, args.chaos_clients, args.chaos_requests)
    print(
        f"  {args.chaos_requests} requests, {args.chaos_clients} clients, {out['seconds']:.0f} s: 5xx {out['five_xx']}, "
        f"wrong hits {out['wrong_cache_hits']}, ids not joining {out['streams_whose_ids_do_not_join']}, "
        f"streams cut by the kill {out['streams_cut_by_the_kill']}, slots left {out['in_flight_after']}",
        flush=True,
    )
    return out


# ------------------------------------------------------------------------------------------------ report


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    routing = report.get("routing")
    if not routing:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    names = [n for n in POLICIES if n in routing]
    a.bar(names, [routing[n]["cached_share_of_oracle"] for n in names], color=["#2a7", "#999", "#c73"])
    a.set_ylim(0, 1.05)
    a.set_title("prefix-cache tokens served, share of the oracle")
    x = range(len(names))
    b.bar([i - 0.2 for i in x], [routing[n]["ttft_p50_ms"] for n in names], width=0.4, label="p50")
    b.bar([i + 0.2 for i in x], [routing[n]["ttft_p99_ms"] for n in names], width=0.4, label="p99")
    b.set_xticks(list(x), names)
    b.set_title("TTFT (ms)")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(args: argparse.Namespace) -> int:
    import signal

    # A SIGTERM (a `timeout`, a CI cancel) unwinds through the `with` blocks, so no server is left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    bad = [p for p in phases if p not in PHASES]
    if bad:
        print(f"error: unknown phase(s) {', '.join(bad)}; choose from {', '.join(PHASES)}", file=sys.stderr)
        return 2
    if args.replicas < 2:
        print("error: --replicas must be at least 2", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"machine": machine(), "args": vars(args) | {"func": None}}
    for p in phases:
        print(f"[gateway bench] {p}", flush=True)
        report[p] = globals()[f"phase_{p}"](args)
        write_json(args.out, report)
    out = write_json(args.out, report)
    try:
        plot(report, out.with_suffix(".png"))
    except ImportError:
        print("(matplotlib is not installed: no plot)", file=sys.stderr)
    print(f"wrote {out}")
    return 0
