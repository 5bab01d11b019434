"""`tokenseam bench chaos`: replay the fault set against a real server and gateway and count what went wrong.

Phases: malformed bodies (server and gateway), hostile grammars beside plain traffic (p99 ratio, peak memory),
clients that leave, a Redis kill and a replica kill, ID-exact streams and cache hits, secrets in every body and
log line. Everything runs on loopback; every loop is bounded; prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .common import free_port, machine, median, percentile, write_json
from .faults import hostile_grammars, malformed_cases

SECRETS = {
    "upstream_password": "chaos-upw-7c1e",
    "upstream_key": "chaos-upkey-52ab",
    "client_key": "chaos-cli-9d03",
    "redis_password": "chaos-redis-e4f2",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2")
    p.add_argument("--plain", type=int, default=40, help="plain requests per latency phase")
    p.add_argument("--memory-cap-mb", type=int, default=3000, help="the server's --max-memory-mb for the run")
    p.add_argument("--out", default="results/chaos.json")
    p.add_argument("--skip-redis", action="store_true", help="run without redis-server (SQLite store)")
    p.add_argument("--attackers", type=int, default=1, help="clients sending hostile grammars without pause")
    p.add_argument("--only", default=None, choices=["hostile"], help="run one phase only")


# ------------------------------------------------------------------------------------------------ processes
class Proc:
    """A child process with its stderr kept in a file (read back for the secret scan and for tracebacks)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.name, self.argv, self.env = name, argv, env
        self.logfile = tempfile.NamedTemporaryFile(prefix=f"ts-chaos-{name}-", suffix=".log", delete=False)
        self.logs: list[str] = []
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.argv, stdout=self.logfile, stderr=subprocess.STDOUT, env={**os.environ, **(self.env or {})}
        )

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log_text(self) -> str:
        self.logfile.flush()
        return Path(self.logfile.name).read_text(errors="replace")

    def peak_rss_mb(self) -> float:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return float("nan")


def _wait_health(url: str, timeout: float = 180, headers: dict | None = None) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2, headers=headers).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not become healthy in {timeout} s")


def _redis(port: int, workdir: str) -> Proc | None:
    exe = "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else shutil.which("redis-server")
    if not exe:
        return None
    p = Proc(
        "redis",
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            workdir,
            "--save",
            "",
            "--appendonly",
            "no",
            "--requirepass",
            SECRETS["redis_password"],
        ],
    )
    time.sleep(0.3)
    return p


# ------------------------------------------------------------------------------------------------ clients
class Recorder:
    """Every response body and header block seen, for the secret scan."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.lock = threading.Lock()

    def add(self, *parts: str) -> None:
        with self.lock:
            self.texts.extend(parts)


def _post(
    url: str,
    route: str,
    body: bytes,
    ctype: str = "application/json",
    headers: dict | None = None,
    timeout: float = 120,
    rec: Recorder | None = None,
) -> tuple[int, bytes, float]:
    from urllib.parse import urlsplit

    u = urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    h = {"Content-Type": ctype} if ctype else {}
    h.update(headers or {})
    t0 = time.perf_counter()
    try:
        c.request("POST", route, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        status = r.status
        if rec is not None:
            rec.add(data.decode(errors="replace"), str(r.getheaders()))
    except TimeoutError:
        status, data = -2, b""  # a hang: nothing within the timeout
    except OSError:
        status, data = -1, b""
    finally:
        c.close()
    return status, data, time.perf_counter() - t0


def _malformed(url: str, routes: tuple[str, ...], headers: dict, rec: Recorder) -> dict[str, Any]:
    cases = malformed_cases(routes)
    counts = {"requests": 0, "2xx": 0, "4xx": 0, "5xx": 0, "resets": 0, "hangs": 0}
    fives: list[str] = []
    slow: list[tuple[float, str]] = []
    for case in cases:
        # a generous timeout: a few cases are valid long generations (n_predict -1 runs to the context's end)
        status, _, dt = _post(url, case.route, case.body, case.content_type, headers, timeout=180, rec=rec)
        if dt > 5:
            slow.append((round(dt, 1), f"{case.route} {case.what}: {status}"))
        counts["requests"] += 1
        if status == -2:
            counts["hangs"] += 1
        elif status < 0:
            counts["resets"] += 1
        elif status >= 500:
            counts["5xx"] += 1
            fives.append(f"{case.route} {case.what}: {status}")
        else:
            counts["2xx" if status < 300 else "4xx"] += 1
    counts["examples_5xx"] = fives[:10]
    counts["slowest"] = sorted(slow, reverse=True)[:5]
    return counts


def _plain_body(i: int) -> bytes:
    return json.dumps(
        {
            "prompt": f"Request {i}: the weather today is",
            "max_tokens": 16,
            "temperature": 0.8,
            "token_healing": False,
        }
    ).encode()


def _latencies(url: str, n: int, headers: dict, concurrency: int = 2) -> tuple[list[float], int]:
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()
    it = iter(range(n))

    def worker() -> None:
        while True:
            with lock:
                i = next(it, None)
            if i is None:
                return
            status, _, dt = _post(url, "/v1/completions", _plain_body(i), headers=headers)
            with lock:
                if status == 200:
                    lat.append(dt)
                else:
                    errors[0] += 1

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat, errors[0]


def _hostile_beside_plain(
    url: str, n: int, headers: dict, rec: Recorder, attackers: int = 1
) -> dict[str, Any]:
    alone, err_alone = _latencies(url, n, headers)
    stop = threading.Event()
    hostile = {"sent": 0, "4xx": 0, "5xx": 0, "hangs": 0}

    def attacker() -> None:
        grammars = hostile_grammars()
        k = 0
        while not stop.is_set():
            _, fields = grammars[k % len(grammars)]
            k += 1
            body = json.dumps({"prompt": "x", "max_tokens": 2, **fields}).encode()
            status, _, _ = _post(url, "/v1/completions", body, headers=headers, timeout=60, rec=rec)
            hostile["sent"] += 1
            key = (
                "hangs"
                if status == -2
                else "503"
                if status == 503
                else "5xx"
                if status >= 500 or status < 0
                else "4xx"
                if status >= 400
                else "2xx"
            )
            hostile[key] = hostile.get(key, 0) + 1

    threads = [threading.Thread(target=attacker) for _ in range(attackers)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # let the compiles get going
    beside, err_beside = _latencies(url, n, headers)
    stop.set()
    for t in threads:
        t.join(90)
    p99a, p99b = percentile(alone, 99), percentile(beside, 99)
    return {
        "plain_alone": {"p50_s": median(alone), "p99_s": p99a, "errors": err_alone},
        "plain_beside_hostile": {"p50_s": median(beside), "p99_s": p99b, "errors": err_beside},
        "p99_ratio": p99b / p99a if p99a else float("nan"),
        "attackers": attackers,
        "hostile": hostile,
    }


def _metric(url: str, name: str, headers: dict) -> float:
    import httpx

    text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.split("{", 1)[0].split(" ", 1)[0] in (name, name + "_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _disconnects(url: str, headers: dict) -> dict[str, Any]:
    """Clients that leave: non-streamed after 0.3 s, streamed after the first event; tokens decoded after."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    body = json.dumps(
        {
            "prompt": "Write a very long story about a dragon.",
            "max_tokens": 400,
            "temperature": 0.8,
            "ignore_eos": True,
        }
    ).encode()
    before = _metric(url, "tokenseam_engine_generated_tokens", headers)
    socks = []
    for k in range(8):
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        b = body if k % 2 == 0 else json.dumps({**json.loads(body), "stream": True}).encode()
        c.request("POST", "/v1/completions", body=b, headers={"Content-Type": "application/json", **headers})
        socks.append(c)
    time.sleep(0.3)
    for c in socks:
        c.sock.close()  # the client goes away without reading
    t_left = time.monotonic()
    time.sleep(3.0)
    after = _metric(url, "tokenseam_engine_generated_tokens", headers)
    # 8 requests x 400 tokens would be 3,200 tokens if nobody noticed the clients left
    return {
        "clients": 8,
        "tokens_decoded_in_total": after - before,
        "tokens_if_unnoticed": 8 * 400,
        "measured_for_s": round(time.monotonic() - t_left, 1),
    }


def _ids_and_hits(url: str, headers: dict, n: int = 6) -> dict[str, Any]:
    """Streamed, deterministic requests twice each: ids must add up, and the hit must replay the miss."""
    import httpx

    lost, wrong_hits, hits = 0, 0, 0
    for i in range(n):
        # a stop string the model meets soon: answers cut by max_tokens are not cached, so there would be no hit
        body = {
            "model": "smollm2",
            "prompt": f"List {i}: apples, pears, plums,",
            "max_tokens": 40,
            "temperature": 0,
            "stop": [",", "\n"],
            "stream": True,
            "return_token_ids": True,
            "stream_options": {"include_usage": True},
        }
        runs = []
        for _ in range(2):
            ids, final, usage = [], None, None
            with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers, timeout=60) as r:
                cache_state = r.headers.get("x-tokenseam-cache")
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    ev = json.loads(line[6:])
                    if ev.get("usage"):
                        usage = ev["usage"]["completion_tokens"]
                    for ch in ev.get("choices", []):
                        ids += ch.get("token_ids", [])
                        if ch.get("all_token_ids") is not None:
                            final = ch["all_token_ids"]
            if not ids or final != ids or usage != len(ids):
                lost += 1
            runs.append((ids, cache_state))
        if runs[1][1] == "hit":
            hits += 1
            if runs[1][0] != runs[0][0]:
                wrong_hits += 1
    return {"requests": 2 * n, "lost_ids": lost, "hits": hits, "wrong_hits": wrong_hits}


def _outage(url: str, headers: dict, kill, restart, n: int = 6) -> dict[str, Any]:
    """Requests during and after an outage of one part: statuses, hangs, recovery."""
    statuses: list[int] = []
    kill()
    for i in range(n):
        status, _, _ = _post(
            url,
            "/v1/completions",
            json.dumps({"prompt": f"Outage {i}", "max_tokens": 4, "temperature": 0}).encode(),
            headers=headers,
            timeout=60,
        )
        statuses.append(status)
    restart()
    recovered = None
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120:
        status, _, _ = _post(
            url,
            "/v1/completions",
            json.dumps({"prompt": "After", "max_tokens": 2}).encode(),
            headers=headers,
            timeout=60,
        )
        if status == 200:
            recovered = round(time.monotonic() - t0, 2)
            break
        time.sleep(0.5)
    return {
        "during": statuses,
        "hangs": statuses.count(-2),
        "5xx_other_than_502_503": sum(1 for s in statuses if s >= 500 and s not in (502, 503)),
        "recovered_after_s": recovered,
    }


# ------------------------------------------------------------------------------------------------ run
def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    work = tempfile.mkdtemp(prefix="ts-chaos-")
    rec = Recorder()
    exe = [sys.executable, "-m", "tokenseam.cli"]
    results: dict[str, Any] = {"machine": machine(), "loadavg_start": os.getloadavg()}
    redis_port = free_port()
    redis = None if args.skip_redis else _redis(redis_port, work)
    store = (
        f"redis://:{SECRETS['redis_password']}@127.0.0.1:{redis_port}/0"
        if redis is not None
        else f"sqlite:{work}/cache.sqlite"
    )
    sport, gport = free_port(), free_port()
    env = {"TS_CHAOS_UPSTREAM_KEY": SECRETS["upstream_key"], "TS_CHAOS_CLIENT_KEY": SECRETS["client_key"]}
    server = Proc(
        "server",
        exe
        + [
            "serve",
            "--model",
            args.model,
            "--port",
            str(sport),
            "--ctx-size",
            "1024",
            "--parallel",
            "4",
            "--cache-store",
            store,
            "--api-key-env",
            "TS_CHAOS_UPSTREAM_KEY",
            "--max-memory-mb",
            str(args.memory_cap_mb),
            "--shutdown-timeout",
            "5",
            "--log-level",
            "info",
        ],
        env,
    )
    surl, gurl = f"http://127.0.0.1:{sport}", f"http://127.0.0.1:{gport}"
    upstream = f"http://chaos:{SECRETS['upstream_password']}@127.0.0.1:{sport}"
    gateway = Proc(
        "gateway",
        exe
        + [
            "gateway",
            "--upstream",
            upstream,
            "--port",
            str(gport),
            "--cache-store",
            store,
            "--upstream-key-env",
            "TS_CHAOS_UPSTREAM_KEY",
            "--api-key-env",
            "TS_CHAOS_CLIENT_KEY",
            "--timeout",
            "30",
        ],
        env,
    )
    sh = {"Authorization": f"Bearer {SECRETS['upstream_key']}"}
    gh = {"Authorization": f"Bearer {SECRETS['client_key']}"}
    try:
        _wait_health(surl)
        _wait_health(gurl)
        if args.only == "hostile":
            results["hostile"] = _hostile_beside_plain(surl, args.plain, sh, rec, args.attackers)
            results["hostile"]["server_peak_rss_mb"] = server.peak_rss_mb()
            console.print_json(data=results["hostile"])
            return 0
        console.print("[bold]malformed bodies: server[/bold]")
        results["malformed_server"] = _malformed(
            surl, ("/v1/chat/completions", "/v1/completions", "/completion"), sh, rec
        )
        console.print("[bold]malformed bodies: gateway[/bold]")
        results["malformed_gateway"] = _malformed(gurl, ("/v1/chat/completions", "/v1/completions"), gh, rec)
        console.print("[bold]hostile grammars beside plain traffic[/bold]")
        results["hostile"] = _hostile_beside_plain(surl, args.plain, sh, rec, args.attackers)
        results["hostile"]["server_peak_rss_mb"] = server.peak_rss_mb()
        results["hostile"]["memory_cap_mb"] = args.memory_cap_mb
        console.print("[bold]clients that leave[/bold]")
        results["disconnects"] = _disconnects(surl, sh)
        console.print("[bold]ids and hits[/bold]")
        results["ids_server"] = _ids_and_hits(surl, sh)
        results["ids_gateway"] = _ids_and_hits(gurl, gh)
        if redis is not None:
            console.print("[bold]Redis killed[/bold]")
            results["redis_kill"] = _outage(surl, sh, redis.kill, lambda: (redis.start(), time.sleep(0.5)))
        console.print("[bold]replica killed behind the gateway[/bold]")
        results["replica_kill"] = _outage(gurl, gh, server.kill, lambda: (server.start(), _wait_health(surl)))
    finally:
        for p in (gateway, server, redis):
            if p is not None:
                p.stop()
    logs = {p.name: p.log_text() for p in (gateway, server, redis) if p is not None}
    leaks = []
    for name, secret in SECRETS.items():
        where = [f"log:{k}" for k, text in logs.items() if secret in text]
        where += ["response"] * sum(1 for t in rec.texts if secret in t)
        if where:
            leaks.append({"secret": name, "where": sorted(set(where)), "count": len(where)})
    results["secret_leaks"] = leaks
    results["tracebacks_in_logs"] = {k: v.count("Traceback") for k, v in logs.items()}
    write_json(args.out, results)
    shutil.rmtree(work, ignore_errors=True)

    t = Table(title="tokenseam bench chaos")
    t.add_column("check")
    t.add_column("result", justify="right")
    for label in ("malformed_server", "malformed_gateway"):
        m = results[label]
        t.add_row(
            f"{label}: requests / 5xx / resets / hangs",
            f"{m['requests']} / {m['5xx']} / {m['resets']} / {m['hangs']}",
        )
    h = results["hostile"]
    t.add_row(
        "plain p99 alone -> beside hostile grammars",
        f"{h['plain_alone']['p99_s'] * 1000:.0f} -> {h['plain_beside_hostile']['p99_s'] * 1000:.0f} ms "
        f"({h['p99_ratio']:.2f}x)",
    )
    t.add_row(
        "hostile grammars sent / 4xx / 5xx / hangs",
        f"{h['hostile']['sent']} / {h['hostile'].get('4xx', 0)} / {h['hostile'].get('5xx', 0)} / "
        f"{h['hostile'].get('hangs', 0)}",
    )
    t.add_row(
        "server peak RSS (through the hostile phase) / cap",
        f"{h['server_peak_rss_mb']:.0f} / {args.memory_cap_mb} MB",
    )
    d = results["disconnects"]
    t.add_row(
        "tokens decoded for 8 clients that left",
        f"{d['tokens_decoded_in_total']:.0f} of {d['tokens_if_unnoticed']}",
    )
    for label in ("ids_server", "ids_gateway"):
        r = results[label]
        t.add_row(
            f"{label}: requests / lost ids / hits / wrong hits",
            f"{r['requests']} / {r['lost_ids']} / {r['hits']} / {r['wrong_hits']}",
        )
    for label in ("redis_kill", "replica_kill"):
        if label in results:
            r = results[label]
            t.add_row(
                f"{label}: statuses during; recovered after", f"{r['during']}; {r['recovered_after_s']} s"
            )
    t.add_row("secrets in bodies or logs", str(sum(x["count"] for x in leaks)))
    t.add_row("tracebacks in logs", str(results["tracebacks_in_logs"]))
    console.print(t)
    console.print(f"wrote {args.out}")
    return 0
