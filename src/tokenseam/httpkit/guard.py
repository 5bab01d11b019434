"""`Guard`: Host allow-list (DNS rebinding), CORS only as configured, and bearer API keys, as pure ASGI.

Pure ASGI rather than `BaseHTTPMiddleware`, so streamed responses pass through event by event, unbuffered.
Order: Host check, then CORS preflight (browsers never send credentials on one), then the API key.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import HTTPError

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
ALLOW_METHODS = "GET, POST, OPTIONS"
ALWAYS_ALLOWED_HEADERS = ("authorization", "content-type")


def host_only(value: str) -> str:
    """The host part of a Host header, lower case, without port or trailing dot; IPv6 keeps its brackets."""
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        return v[: end + 1] if end != -1 else v
    if v.count(":") == 1:
        v = v.split(":", 1)[0]
    return v[:-1] if v.endswith(".") else v


def normalize_host(host: str) -> str:
    """An allow-list entry as `host_only` would see it: `::1` -> `[::1]`, `Example.com:80` -> `example.com`."""
    h = host.strip().lower()
    if h == "*":
        return h
    if ":" in h and not h.startswith("["):
        try:
            return f"[{ipaddress.IPv6Address(h)}]"
        except ValueError:
            pass
    return host_only(h)


def default_allowed_hosts(bind_host: str) -> list[str] | None:
    """Hosts to accept for a server bound to `bind_host`: the loopback names when it is loopback, else None.

    None (no check) for other binds: a server on 0.0.0.0 or a LAN address is reached under names it cannot
    know; such a server needs API keys, and `--allowed-host` to name itself."""
    h = bind_host.strip().strip("[]").lower()
    if h == "localhost":
        return list(LOOPBACK_HOSTS)
    try:
        loopback = ipaddress.ip_address(h).is_loopback
    except ValueError:
        return None
    return list(dict.fromkeys([*LOOPBACK_HOSTS, normalize_host(h)])) if loopback else None


def _bearer_problem(value: str | None, keys: tuple[bytes, ...]) -> str | None:
    """None when `value` is `Bearer <one of keys>`, else why not (never quoting the header)."""
    if not value or not value.strip():
        return "this server requires an API key: send Authorization: Bearer <key>"
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return "the Authorization header must use the Bearer scheme: Authorization: Bearer <key>"
    token = token.strip()
    if not token:
        return "the Authorization header has no key after Bearer"
    # Header values are latin-1 text over the original bytes; compare bytes with every key, without stopping at a
    # match, so timing says nothing about which key (or how much of one) matched.
    given = token.encode("latin-1", "replace")
    matched = False
    for k in keys:
        matched |= hmac.compare_digest(given, k)
    return None if matched else "invalid API key"


class Guard:
    """ASGI middleware. Empty/None settings disable each part; `*` in `allowed_hosts` or `cors_origins` allows all.

    - `allowed_hosts`: requests whose Host (port removed) is not listed get a 400 (code `invalid_host`).
    - `cors_origins`: no CORS headers at all unless set; preflights from listed origins get a 204, others a 403;
      responses to listed origins carry `Access-Control-Allow-Origin` (and `expose_headers`).
    - `api_keys`: every path outside `public_paths` needs `Authorization: Bearer <key>`, else a 401
      (`WWW-Authenticate: Bearer`, code `invalid_api_key`)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        allowed_hosts: Iterable[str] | None = None,
        cors_origins: Iterable[str] | None = None,
        api_keys: Iterable[str] | None = None,
        public_paths: Iterable[str] = ("/health",),
        expose_headers: Iterable[str] = (),
    ) -> None:
        self.app = app
        hosts = {normalize_host(h) for h in allowed_hosts or () if h and h.strip()}
        self.allowed_hosts = None if not hosts or "*" in hosts else frozenset(hosts)
        origins = {o.strip().rstrip("/").lower() for o in cors_origins or () if o and o.strip()}
        self.cors_any = "*" in origins
        self.cors_origins = frozenset(origins)
        self.api_keys = tuple(k.encode("utf-8") for k in api_keys or () if k)
        self.public_paths = frozenset(public_paths)
        self.expose_headers = ", ".join(expose_headers)

    def _allow_origin(self, origin: str | None) -> str | None:
        """The Access-Control-Allow-Origin value for a request's Origin, or None when CORS does not apply."""
        if not self.cors_origins or origin is None:
            return None
        if self.cors_any:
            return "*"
        return origin if origin.strip().lower() in self.cors_origins else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if self.allowed_hosts is not None and host_only(headers.get("host", "")) not in self.allowed_hosts:
            await self._reject(
                scope,
                receive,
                send,
                HTTPError(
                    400,
                    "the Host header names a host this server does not answer to (a DNS rebinding defence); "
                    "add it to the server's allowed hosts",
                    "invalid_host",
                ),
                None,
            )
            return
        origin = headers.get("origin")
        allow = self._allow_origin(origin)
        if (
            self.cors_origins
            and scope["type"] == "http"
            and scope["method"] == "OPTIONS"
            and origin is not None
            and "access-control-request-method" in headers
        ):
            await self._preflight(scope, receive, send, headers, allow)
            return
        if self.api_keys and scope["path"] not in self.public_paths:
            problem = _bearer_problem(headers.get("authorization"), self.api_keys)
            if problem is not None:
                await self._reject(
                    scope,
                    receive,
                    send,
                    HTTPError(401, problem, "invalid_api_key", headers={"WWW-Authenticate": "Bearer"}),
                    allow,
                )
                return
        if allow is None:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                self._add_cors(MutableHeaders(scope=message), allow)
            await send(message)

        await self.app(scope, receive, send_with_cors)

    def _add_cors(self, h: MutableHeaders, allow: str) -> None:
        h["Access-Control-Allow-Origin"] = allow
        if allow != "*":
            h.add_vary_header("Origin")
        if self.expose_headers:
            h["Access-Control-Expose-Headers"] = self.expose_headers

    async def _preflight(
        self, scope: Scope, receive: Receive, send: Send, headers: Headers, allow: str | None
    ) -> None:
        if allow is None:
            await self._reject(
                scope,
                receive,
                send,
                HTTPError(403, "this origin is not allowed to call this server (CORS)", "origin_not_allowed"),
                None,
            )
            return
        # The origin is the trust decision; the header list is not a boundary for a bearer-key API, so the
        # headers a client asks for (an SDK's own x-* headers) are allowed along with the two it needs.
        asked = [h.strip().lower() for h in headers.get("access-control-request-headers", "").split(",")]
        allowed = list(dict.fromkeys([*ALWAYS_ALLOWED_HEADERS, *(h for h in asked if h)]))
        response = Response(
            status_code=204,
            headers={
                "Access-Control-Allow-Methods": ALLOW_METHODS,
                "Access-Control-Allow-Headers": ", ".join(allowed),
                "Access-Control-Max-Age": "600",
            },
        )
        self._add_cors(response.headers, allow)
        await response(scope, receive, send)

    async def _reject(
        self, scope: Scope, receive: Receive, send: Send, error: HTTPError, allow: str | None
    ) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": error.message[:120]})
            return
        response = error.response()
        if allow is not None:
            self._add_cors(response.headers, allow)
        await response(scope, receive, send)
