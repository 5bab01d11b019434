"""The engine: llama.cpp backend, continuous-batching scheduler, numpy sampler, constraint hook.

`Engine` runs on its own thread; the server submits to it from the event loop, and `llm_engine.run_sync` waits
for one request (the CLI and the benchmarks).
"""

from .backend import BackendConfig, LlamaCppBackend
from .errors import BackendError, ContextLengthError, EngineError, InvalidRequestError, QueueFullError
from .llm_engine import Engine
from .sampling import SamplingParams, TokenLogprob
from .sequence import ChoiceEvent, GenerationRequest, RequestDone

__all__ = [
    "BackendConfig",
    "BackendError",
    "ChoiceEvent",
    "ContextLengthError",
    "Engine",
    "EngineError",
    "GenerationRequest",
    "InvalidRequestError",
    "LlamaCppBackend",
    "QueueFullError",
    "RequestDone",
    "SamplingParams",
    "TokenLogprob",
]
