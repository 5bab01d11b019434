"""`CatchErrors`: any exception from the app becomes a JSON 500 with a request id, and nothing is re-raised.

Starlette's own `Exception` handler runs in `ServerErrorMiddleware`, which re-raises after responding; uvicorn then
closes the connection, so a keep-alive client loses it after every 500, and uvicorn logs the raw traceback
(exception text can quote a credential). Here the traceback is logged once, through `redact`, under the id the
client sees.
"""

from __future__ import annotations

import logging
import re
import traceback
import uuid
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import HTTPError

REQUEST_ID_HEADER = "x-request-id"


_CLIENT_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")


def request_id(scope: Scope) -> str:
    """The client's `x-request-id` when it is a plain token (letters, digits, `._:-`, at most 128), else a new
    one: every response carries it, and a 500's log line names it."""
    for k, v in scope.get("headers") or []:
        if k.lower() == b"x-request-id" and _CLIENT_ID.fullmatch(v):
            return v.decode()
    return uuid.uuid4().hex[:16]


class CatchErrors:
    def __init__(
        self,
        app: ASGIApp,
        *,
        logger: logging.Logger | None = None,
        redact: Callable[[str], str] | None = None,
        what: str = "server",
    ) -> None:
        self.app = app
        self.log = logger or logging.getLogger("tokenseam.httpkit")
        self.redact = redact or (lambda text: text)
        self.what = what

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        rid = request_id(scope)

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            self.log.error(
                "%s internal error %s on %s %s:\n%s",
                self.what,
                rid,
                scope.get("method"),
                scope.get("path"),
                self.redact(traceback.format_exc()),
            )
            if started:
                # Half a response is on the wire: nothing valid can follow, and uvicorn closes the connection
                # when the app returns without finishing it. Re-raising would only log the unredacted traceback.
                return
            error = HTTPError(
                500,
                f"{self.what} internal error (request id {rid}); the {self.what} log has the details",
                "internal_error",
                headers={REQUEST_ID_HEADER: rid},
            )
            await error.response()(scope, receive, send)
