"""OpenAI-style errors raised by either app and turned into responses (the object itself is `wire.error_body`)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from ..wire import error_body


class HTTPError(Exception):
    """An error for the client; `response()` is the JSON error object with `status` and `headers`.

    `type_` defaults from the status (OpenAI uses `invalid_request_error` for every 4xx, `server_error` for 5xx)."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        type_: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = dict(headers or {})
        self.type = type_ or ("server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.code, self.param)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)
