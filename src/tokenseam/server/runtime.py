"""Load a model and build the app: shared by `tokenseam serve`, the tests and the benchmarks."""

from __future__ import annotations

from pathlib import Path

from ..engine import BackendConfig, Engine, LlamaCppBackend
from ..models import ALIASES, DEFAULT_MODEL, resolve_model
from .app import create_app
from .state import ServerState


def build_server(model: str | None = None, n_ctx: int = 4096, parallel: int = 8, threads: int = 0,
                 max_queue: int = 64, n_batch: int = 512, prefix_cache_tokens: int = 16384, prefix_block: int = 16,
                 cache_mode: str = "off", cache_store: str = "sqlite", cache_ttl: float | None = None,
                 api_keys: list[str] | None = None, allowed_hosts: list[str] | None = None,
                 cors_origins: list[str] | None = None, max_memory_mb: int | None = None,
                 grammar_seconds: float | None = None):
    """Load a model and build the app. The response cache is off unless `cache_mode` says otherwise
    (`tokenseam serve` turns it on: deterministic requests, SQLite store). `api_keys`, `allowed_hosts` and
    `cors_origins` configure the HTTP guard (see `create_app`); `max_memory_mb` caps the process's resident
    memory that grammar compiles may grow it to; `grammar_seconds` each compile's time budget."""
    path = resolve_model(model)
    backend = LlamaCppBackend(path, BackendConfig(n_ctx=n_ctx, n_seq=parallel, n_threads=threads, n_batch=n_batch,
                                                  prefix_cache_tokens=prefix_cache_tokens, prefix_block=prefix_block))
    engine = Engine(backend, max_queue=max_queue)
    name = model or DEFAULT_MODEL
    alias = name if name in ALIASES else None
    model_id = alias or Path(path).stem
    state = ServerState(engine, model_id, aliases=tuple(a for a in (alias, Path(path).stem) if a),
                        max_memory_mb=max_memory_mb, grammar_seconds=grammar_seconds)
    state.warm_up()
    if cache_mode != "off":
        from ..respcache import ResponseCache, open_store

        state.response_cache = ResponseCache(open_store(cache_store), mode=cache_mode, ttl_seconds=cache_ttl,
                                             namespace=f"{model_id}:{backend.vocab.fingerprint}",
                                             registry=state.metrics.registry)
    return create_app(state, api_keys=api_keys, allowed_hosts=allowed_hosts, cors_origins=cors_origins), state


class BackgroundServer:
    """Run an ASGI app with uvicorn in a daemon thread on a free loopback port (benchmarks, tests, eval)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 60) -> None:
        import socket
        import threading
        import time

        import httpx
        import uvicorn

        if port == 0:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        self.url = f"http://{host}:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + startup_timeout
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server at {self.url} did not become healthy within {startup_timeout}s")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
