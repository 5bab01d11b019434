"""The gateway app: tokenseam's response cache in front of any OpenAI-compatible server (vLLM, SGLang,
llama-server, hosted).

It forwards the canonical request (streams relayed event by event with httpx), maps upstream failures to 502/504.
Bodies are read by `tokenseam.httpkit` (strict JSON, rejected before anything is forwarded), requests pass its
`Guard` (Host allow-list, CORS, client API keys), and every credential (upstream URL userinfo and secret query
values, the upstream key) is redacted from health, error bodies and logs.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..httpkit import (
    CatchErrors,
    Guard,
    HTTPError,
    read_json_body,
    redact_text,
    redact_url,
    redacting_logs,
    sse_response,
    url_secrets,
)
from ..respcache import (
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    CacheRequestError,
    CacheStream,
    IncompleteStreamError,
    MemoryStore,
    ResponseCache,
    ResponseCacheError,
    tenant_from_api_key,
)
from ..respcache.entry import SSEParser
from ..wire import error_body

log = logging.getLogger("tokenseam.gateway")

DEFAULT_MAX_BODY = 8 * 1024 * 1024
REDACTED_LOGGERS = (
    "httpx",
    "httpcore",
    "tokenseam.gateway",
    "tokenseam.respcache.policy",
    "tokenseam.respcache.stores",
)


class UpstreamError(ResponseCacheError):
    """The upstream answered with an error status (passed through) or could not be reached (502/504)."""

    def __init__(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        super().__init__(f"upstream error {status}")
        self.status = status
        self.body = body
        self.content_type = content_type
        self.code = "upstream_error"

    @classmethod
    def gateway(cls, status: int, message: str, code: str) -> UpstreamError:
        e = cls(status, json.dumps(error_body(message, "upstream_error", code)).encode())
        e.code = code
        return e

    def response(self) -> Response:
        return Response(
            self.body, status_code=self.status, media_type=self.content_type or "application/json"
        )


def upstream_base_and_query(upstream_url: str) -> tuple[str, str]:
    """(base without a trailing `/v1`, query string) of an upstream URL; the query is sent with every request
    (hosted endpoints put `api-version` or a key there)."""
    try:
        parts = urlsplit(upstream_url.strip())
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise ResponseCacheError(
            f"upstream URL {redact_url(upstream_url)!r} must start with http:// or https:// and name a host"
        )
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return urlunsplit((parts.scheme, parts.netloc, path, "", "")), parts.query


def _without_userinfo(base: str) -> tuple[str, str | None]:
    """(the URL without user:password@, a Basic Authorization value for them or None). Sent as an explicit
    header, the URL's credentials give way to an upstream key; left in the URL, httpx would turn them into Basic
    auth that silently replaces the key's Bearer header."""
    parts = urlsplit(base)
    if parts.username is None and parts.password is None:
        return base, None
    token = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}".encode()
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])), "Basic " + base64.b64encode(
        token
    ).decode()


def _redact_tree(value: Any, hide: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return hide(value)
    if isinstance(value, dict):
        return {k: _redact_tree(v, hide) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_tree(v, hide) for v in value]
    return value


def create_gateway_app(
    upstream_url: str,
    *,
    cache: ResponseCache | None = None,
    api_key: str | None = None,
    timeout: float = 120.0,
    connect_timeout: float = 5.0,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    registry: Any = None,
    max_connections: int = 256,
    client_api_keys: Iterable[str] | None = None,
    allowed_hosts: Iterable[str] | None = None,
    cors_origins: Iterable[str] | None = None,
) -> Starlette:
    """A Starlette app serving `/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`, `/metrics`.

    `cache=None` builds a memory-backed `ResponseCache`; `api_key` replaces the client's Authorization
    upstream. `client_api_keys` makes every route but `/health` require `Authorization: Bearer <one of them>`;
    without them the client's header is forwarded when there is no `api_key` (with them it never is: it holds
    a gateway key, not an upstream one). `allowed_hosts` / `cors_origins` configure the `Guard` (None: no Host
    check, no CORS). Entries are scoped by the hash of the client's key and by the (redacted) upstream URL."""
    from prometheus_client import REGISTRY, generate_latest

    base, query = upstream_base_and_query(upstream_url)
    target, basic = _without_userinfo(base)
    client_keys = [k for k in client_api_keys or () if k]
    secrets = [api_key, *url_secrets(upstream_url), *client_keys, basic and basic.split(" ", 1)[1]]

    def hide(text: str) -> str:
        return redact_text(text, secrets)

    def scrub(body: bytes) -> bytes:
        # An upstream error body may quote the key it was sent (a hosted API's "invalid key sk-..."): the
        # gateway's key must not reach its clients that way.
        for s in secrets:
            if s:
                body = body.replace(s.encode(), b"***")
        return body

    shown = redact_url(base + ("?" + query if query else ""))
    registry = registry if registry is not None else REGISTRY
    # The namespace is hashed into fingerprints; the redacted URL keeps entries valid across credential rotation.
    if cache is None:
        cache = ResponseCache(MemoryStore(), namespace=shown, registry=registry)
    if not cache.namespace:
        cache.namespace = shown

    def upstream(route: str) -> str:
        return target + route + ("?" + query if query else "")

    holder: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette):
        holder["client"] = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )
        # httpx logs every request's full URL (password and query) at INFO; the store loggers can quote a
        # store URL. Redact what those loggers emit while this gateway runs.
        try:
            with redacting_logs(hide, *REDACTED_LOGGERS):
                yield
        finally:
            await holder["client"].aclose()

    def upstream_headers(request: Request) -> dict[str, str]:
        h = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if api_key:
            h["authorization"] = f"Bearer {api_key}"
        elif basic:
            h["authorization"] = basic
        elif not client_keys and request.headers.get("authorization"):
            h["authorization"] = request.headers["authorization"]
        return h

    def map_transport(e: httpx.HTTPError) -> UpstreamError:
        # httpx messages can quote the URL (userinfo included): only the redacted form leaves the gateway.
        if isinstance(e, httpx.TimeoutException):
            return UpstreamError.gateway(
                504,
                f"the upstream {shown} did not answer within the timeout ({type(e).__name__})",
                "upstream_timeout",
            )
        return UpstreamError.gateway(
            502,
            f"cannot reach the upstream {shown}: {type(e).__name__}: {hide(str(e))}",
            "upstream_unreachable",
        )

    async def generation(request: Request) -> Response:
        route = request.url.path
        try:
            body = await read_json_body(request, max_body_bytes)
        except HTTPError as e:
            return e.response()
        try:
            plan = cache.plan(
                route, body, request.headers, tenant=tenant_from_api_key(request.headers.get("authorization"))
            )
        except CacheRequestError as e:
            return HTTPError(400, str(e), "invalid_request", param=e.param).response()
        url = upstream(route)
        headers = upstream_headers(request)
        client = holder["client"]

        async def generate(req: dict[str, Any]) -> dict[str, Any]:
            try:
                r = await client.post(url, json=req, headers=headers)
            except httpx.HTTPError as e:
                raise map_transport(e) from e
            if r.status_code != 200:
                raise UpstreamError(
                    r.status_code, scrub(r.content), r.headers.get("content-type", "application/json")
                )
            try:
                data = r.json()
            except ValueError:
                raise UpstreamError.gateway(
                    502, f"the upstream {shown} returned a body that is not JSON", "upstream_bad_response"
                ) from None
            if not isinstance(data, dict):
                raise UpstreamError.gateway(
                    502, "the upstream returned JSON that is not an object", "upstream_bad_response"
                )
            return data

        async def generate_stream(req: dict[str, Any]):
            try:
                async with client.stream("POST", url, json=req, headers=headers) as r:
                    if r.status_code != 200:
                        raise UpstreamError(
                            r.status_code,
                            scrub(await r.aread()),
                            r.headers.get("content-type", "application/json"),
                        )
                    parser = SSEParser()
                    async for data in r.aiter_bytes():
                        for ev in parser.feed(data):
                            if ev == "[DONE]":
                                return
                            if not isinstance(ev, dict):
                                raise UpstreamError.gateway(
                                    502,
                                    "the upstream sent a stream event that is not an object",
                                    "upstream_bad_response",
                                )
                            yield ev
            except httpx.HTTPError as e:
                raise map_transport(e) from e
            except ResponseCacheError as e:
                if isinstance(e, UpstreamError):
                    raise
                raise UpstreamError.gateway(
                    502, f"the upstream stream is malformed: {hide(str(e))}", "upstream_bad_response"
                ) from e

        try:
            if plan.stream:
                result = await cache.respond_stream(plan, generate_stream)
            else:
                result = await cache.respond(plan, generate)
        except UpstreamError as e:
            return e.response()
        except IncompleteStreamError as e:
            return HTTPError(
                502,
                f"the upstream {shown} answered a stream request without any stream event ({hide(str(e))})",
                "upstream_bad_response",
                type_="upstream_error",
            ).response()
        if isinstance(result, CacheStream):
            return sse_response(result.events, result.headers)
        return JSONResponse(result.body, headers=result.headers)

    async def models(request: Request) -> Response:
        try:
            r = await holder["client"].get(upstream("/v1/models"), headers=upstream_headers(request))
        except httpx.HTTPError as e:
            return map_transport(e).response()
        return Response(
            scrub(r.content),
            status_code=r.status_code,
            media_type=r.headers.get("content-type", "application/json"),
        )

    async def health(request: Request) -> Response:
        # Unauthenticated: everything shown goes through the redaction (store errors can quote a Redis URL).
        # The store's ping may block: off the event loop. A store that is down or was found corrupt leaves the
        # gateway serving (requests go upstream), so it is "degraded", not an error.
        state = _redact_tree(await asyncio.to_thread(cache.health), hide)
        degraded = not state.get("ok", True) or bool(state.get("degraded"))
        body = {
            "status": "degraded" if degraded else "ok",
            "upstream": shown,
            "cache_mode": cache.mode,
            "cache": state,
            "time": time.time(),
        }
        if degraded:
            body["problems"] = ["the response cache store is unavailable (requests go to the upstream)"]
        return JSONResponse(body)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    async def not_found(request: Request, exc: Exception) -> Response:
        return HTTPError(404, f"no route {request.method} {request.url.path}", "not_found").response()

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return HTTPError(
            405, f"method {request.method} not allowed on {request.url.path}", "method_not_allowed"
        ).response()

    app = Starlette(
        routes=[
            Route(ROUTE_CHAT, generation, methods=["POST"]),
            Route(ROUTE_COMPLETIONS, generation, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        lifespan=lifespan,
        exception_handlers={404: not_found, 405: not_allowed},
        middleware=[
            # Guard outside, so its 401s and the 500s below carry CORS headers for allowed origins; no `Exception`
            # handler, since Starlette re-raises after it and the keep-alive connection is dropped (see CatchErrors).
            Middleware(
                Guard,
                allowed_hosts=allowed_hosts,
                cors_origins=cors_origins,
                api_keys=client_keys,
                public_paths=("/health",),
                expose_headers=("x-tokenseam-cache", "x-request-id"),
            ),
            Middleware(CatchErrors, logger=log, redact=hide, what="gateway"),
        ],
    )
    app.state.cache = cache
    app.state.upstream = shown
    app.state.redact = hide
    app.state.client_auth = bool(client_keys)
    return app
