"""Load a model and build the app: shared by `tokenseam serve`, the tests and the benchmarks."""

from __future__ import annotations

from pathlib import Path

from ..engine import BackendConfig, Engine, LlamaCppBackend
from ..models import ALIASES, DEFAULT_MODEL, resolve_model
from .app import ServerState, create_app


def build_server(model: str | None = None, n_ctx: int = 4096, parallel: int = 8, threads: int = 0,
                 max_queue: int = 64, n_batch: int = 512):
    path = resolve_model(model)
    backend = LlamaCppBackend(path, BackendConfig(n_ctx=n_ctx, n_seq=parallel, n_threads=threads, n_batch=n_batch))
    engine = Engine(backend, max_queue=max_queue)
    name = model or DEFAULT_MODEL
    alias = name if name in ALIASES else None
    model_id = alias or Path(path).stem
    state = ServerState(engine, model_id, aliases=tuple(a for a in (alias, Path(path).stem) if a))
    return create_app(state), state
