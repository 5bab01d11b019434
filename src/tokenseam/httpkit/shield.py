"""`CatchErrors`: any exception from the app becomes a JSON 500 with a request id, and nothing is re-raised.

Starlette's own `Exception` handler runs in `ServerErrorMiddleware`, which re-raises after responding; uvicorn then
closes the connection, so a keep-alive client loses it after every 500, and uvicorn logs the raw traceback
(exception text can quote a credential). Here the traceback is logged once, through `redact`, under the id the
client sees.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import HTTPError

REQUEST_ID_HEADER = "x-request-id"


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

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            rid = uuid.uuid4().hex[:16]
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
