"""The engine's exception types; the HTTP layer maps each to a status code."""


class EngineError(Exception):
    """Base class: a request the engine cannot run (the message says why)."""


class InvalidRequestError(EngineError):
    """A sampling parameter or prompt is invalid (HTTP 400). `param` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextLengthError(InvalidRequestError):
    """Prompt plus max_tokens does not fit the context window (HTTP 400, code context_length_exceeded)."""


class QueueFullError(EngineError):
    """More requests are waiting than the queue bound allows (HTTP 503 with Retry-After)."""


class BackendError(EngineError):
    """llama.cpp failed (decode error, out of KV cells); the request is aborted (HTTP 500/503)."""
