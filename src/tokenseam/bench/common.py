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


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_json(path: str | Path, data: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))
    return path


class ServerProcess:
    """An HTTP server binary started on a free loopback port, as a context manager that waits for /health."""

    name = "server"

    def __init__(self, argv: list[str], port: int) -> None:
        import subprocess
        import tempfile

        self.url = f"http://127.0.0.1:{port}"
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self._log)

    def __enter__(self):
        import httpx

        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"{self.name} did not become healthy within 120 s")

    def log_tail(self, n: int = 3000) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-n:]

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is not None and not self._log.closed:  # it died under us: say why
            import sys

            print(
                f"{self.name} exited with code {self.proc.returncode}; its log ends:\n{self.log_tail()}",
                file=sys.stderr,
            )
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except Exception:
            self.proc.kill()
        self._log.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer(ServerProcess):
    """llama-server (the anchor binary, never a dependency)."""

    name = "llama-server"

    def __init__(
        self, binary: str, model: str | Path, parallel: int, threads: int, ctx_per_slot: int
    ) -> None:
        port = free_port()
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
            ],
            port,
        )
