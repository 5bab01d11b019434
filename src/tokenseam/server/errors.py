"""OpenAI-style error objects and the one place exceptions become HTTP statuses."""

from __future__ import annotations

from ..httpkit import HTTPError


class APIError(HTTPError):
    """An error to return to the client as `{"error": {"message", "type", "param", "code"}}` (httpkit's error
    object, with the argument order the server's call sites use)."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status, message, code, param=param, headers=headers, type_=type_)


def from_exception(e: Exception) -> APIError:
    """Map a part's exception to an APIError (never a bare 500 for bad input)."""
    from ..engine.errors import BackendError, ContextLengthError, InvalidRequestError, QueueFullError
    from ..grammar import GrammarError, GrammarResourceError
    from ..healing import HealingError

    if isinstance(e, APIError):
        return e
    if isinstance(e, HTTPError):
        return APIError(e.status, e.message, e.type, e.param, e.code, e.headers)
    if isinstance(e, ContextLengthError):
        return APIError(400, str(e), param=e.param, code="context_length_exceeded")
    if isinstance(e, InvalidRequestError):
        return APIError(400, str(e), param=e.param)
    if isinstance(e, QueueFullError):
        return APIError(503, str(e), "server_overloaded", code="queue_full", headers={"Retry-After": "1"})
    if isinstance(e, BackendError):
        return APIError(503, f"the model backend failed: {e}", "server_error", code="backend_error")
    if isinstance(e, HealingError):
        return APIError(400, str(e), param="token_healing")
    if isinstance(e, GrammarResourceError):
        return APIError(503, str(e), "server_overloaded", code="memory_cap", headers={"Retry-After": "5"})
    if isinstance(e, GrammarError):
        return APIError(400, str(e), param=getattr(e, "param", None), code="invalid_grammar")
    return APIError(500, f"internal error: {type(e).__name__}: {e}", "server_error")


def known_error(e: Exception) -> APIError | None:
    """A part's error as its 4xx/503, or None for anything unexpected: that one is re-raised as it is, so
    CatchErrors logs its traceback under the request id the client sees."""
    err = from_exception(e)
    return None if err.status == 500 else err
