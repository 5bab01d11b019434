"""An ASGI app served by uvicorn in a background thread (tests, benchmarks, the planner's local server)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


class BackgroundServer:
    """Runs an ASGI app with uvicorn in a daemon thread, on a port bound before it starts (port 0: a free one),
    for tests, benchmarks and the planner's local runs. `start()` (or `with`) returns once it serves."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.app = app
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        # Idle connections stay open 75 s, as `tokenseam gateway` keeps them: with uvicorn's 5 s, a client that
        # sends on a kept connection just as the server closes it gets "connection reset" (a test's client
        # without retries, once, after a 5 s pause between two requests).
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="auto",
            timeout_graceful_shutdown=1,
            backlog=1024,
            timeout_keep_alive=75,
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(10)
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
