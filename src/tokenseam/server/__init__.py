"""HTTP layer: OpenAI-compatible and llama-server-compatible routes over the engine, plus metrics.

`build_server(...)` loads a model and returns (app, state); `tokenseam serve` runs it with uvicorn.
"""

from .app import create_app
from .runtime import build_server
from .state import ServerState

__all__ = ["ServerState", "build_server", "create_app"]
