"""Helpers shared by the benchmarks: medians, percentiles, JSON output, machine facts."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def ratio_interval(
    mine: list[list[float]], theirs: list[list[float]], level: float = 0.9, reps: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """A `level` bootstrap interval for median(mine) / median(theirs), the samples given in paired blocks: block
    k of each side ran at the same time (the same turn or round), so the machine's drift, which moves both, is
    resampled with them. Blocks are drawn with replacement, `reps` times, with a fixed seed (the same samples
    give the same interval)."""
    import random

    if len(mine) != len(theirs) or not mine:
        raise ValueError("ratio_interval needs the same number (at least one) of blocks on each side")
    rng = random.Random(seed)
    n = len(mine)
    ratios = []
    for _ in range(reps):
        ks = [rng.randrange(n) for _ in range(n)]
        a = statistics.median([x for k in ks for x in mine[k]])
        b = statistics.median([x for k in ks for x in theirs[k]])
        ratios.append(a / b)
    ratios.sort()
    tail = (1 - level) / 2
    return ratios[int(tail * (reps - 1))], ratios[int(round((1 - tail) * (reps - 1)))]


def machine() -> dict:
    out = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        from ..engine.backend import amx_in_build
    except ImportError:  # no llama.cpp installed (the grammar benchmark needs none)
        return out
    # weights in plain CPU buffers (no repacking) on a build with AMX kernels: such runs compare only with their like
    out["llama_cpp_extra_buffers"] = not amx_in_build()
    return out


def model_arg(name: str) -> Path | None:
    """`--model` as a file path, or None after printing why there is none (the caller exits with status 2)."""
    from ..models import ModelNotFoundError, resolve_model

    try:
        return resolve_model(name)
    except ModelNotFoundError as e:
        print(f"error: --model: {e}")
        return None


def write_json(path: str | Path, data: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))
    return path


class ServerProcess:
    """An HTTP server binary started on a free loopback port, as a context manager that waits for /health.

    It runs in its own process group (a server that forks workers, like vLLM, is stopped whole); its stdout
    and stderr go to one log, whose end any failure quotes."""

    name = "server"
    startup_seconds = 120.0

    def __init__(self, argv: list[str], port: int, env: dict[str, str] | None = None) -> None:
        import subprocess
        import tempfile

        self.url = f"http://127.0.0.1:{port}"
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            argv, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def __enter__(self):
        import httpx

        deadline = time.time() + self.startup_seconds
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        tail = self.log_tail()
        self.__exit__()
        raise RuntimeError(f"{self.name} did not become healthy within {self.startup_seconds:.0f} s:\n{tail}")

    def log_tail(self, n: int = 3000) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-n:]

    def __exit__(self, *exc) -> None:
        import signal
        import subprocess

        if self._log.closed:
            return
        if self.proc.poll() is not None and not getattr(
            self, "killed_on_purpose", False
        ):  # died under us: say why
            import sys

            print(
                f"{self.name} exited with code {self.proc.returncode}; its log ends:\n{self.log_tail()}",
                file=sys.stderr,
            )
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        self._log.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TokenseamServe(ServerProcess):
    """`tokenseam serve` in its own process, as it is deployed: the benchmark's client shares no interpreter (and
    no GIL) with it, and two servers under test share nothing but the cores. The response cache is off (rounds
    repeat prompts, and a hit is not a decode); `options` are further `serve` flags."""

    name = "tokenseam serve"

    def __init__(self, model: str | Path, options: list[str]) -> None:
        import sys

        port = free_port()
        super().__init__(
            [
                sys.executable,
                "-m",
                "tokenseam.cli",
                "serve",
                "--model",
                str(model),
                "--port",
                str(port),
                "--cache",
                "off",
                "--log-level",
                "warning",
                *options,
            ],
            port,
        )

    def startup_line(self) -> str:
        """The line the server prints once its model is loaded (what it serves and how)."""
        self._log.seek(0)
        for line in self._log.read().decode(errors="replace").splitlines():
            if line.startswith("tokenseam: serving "):
                return line
        raise RuntimeError(f"{self.name} printed no startup line:\n{self.log_tail()}")

    def flash_attention(self) -> bool:
        """Whether the server runs llama.cpp's flash attention, from its startup line."""
        return "flash attention on" in self.startup_line()

    def chat_template(self) -> str | None:
        """The built-in chat template the server renders (its GGUF has none), or None for the GGUF's own."""
        import re

        found = re.search(r"chat template built-in (\w+)", self.startup_line())
        return found.group(1) if found else None


class LlamaServer(ServerProcess):
    """llama-server (the anchor binary, never a dependency). Where tokenseam's llama.cpp build carries AMX kernels
    and so loads weights without extra buffer types (engine.backend.model_params), the anchor runs with
    `--no-repack`, which does the same: both sides multiply with the same kernels."""

    name = "llama-server"

    def __init__(
        self,
        binary: str,
        model: str | Path,
        parallel: int,
        threads: int,
        ctx_per_slot: int,
        extra_args: list[str] | None = None,
    ) -> None:
        from ..engine.backend import amx_in_build

        port = free_port()
        if amx_in_build():
            extra_args = ["--no-repack", *(extra_args or [])]
        super().__init__(
            [
                binary,
                "-m",
                str(model),
                "-np",
                str(parallel),
                "-t",
                str(threads),
                "-c",
                str(ctx_per_slot * parallel),
                "--port",
                str(port),
                "--host",
                "127.0.0.1",
                *(extra_args or []),
            ],
            port,
        )


async def stream_ttft(client, url: str, body: dict) -> tuple[float | None, dict, int, dict]:
    """Stream one request (an httpx.AsyncClient, the full route URL): (seconds to the first SSE event or None,
    the usage of the last chunk that had one, the status, the response headers)."""
    t0 = time.perf_counter()
    first = None
    usage: dict = {}
    async with client.stream("POST", url, json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                if first is None:
                    first = time.perf_counter() - t0
                obj = json.loads(line[6:])
                if obj.get("usage"):
                    usage = obj["usage"]
    return first, usage, r.status_code, dict(r.headers)
