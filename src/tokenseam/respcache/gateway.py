"""The gateway: tokenseam's response cache in front of any OpenAI-compatible server (vLLM, SGLang, llama-server, hosted).

It forwards the canonical request (streams relayed event by event with httpx), maps upstream failures to 502/504.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import asynccontextmanager
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .canonical import ROUTE_CHAT, ROUTE_COMPLETIONS, tenant_from_api_key
from .entry import IncompleteStreamError, SSEParser
from .errors import CacheRequestError, ResponseCacheError
from .policy import CacheStream, ResponseCache

log = logging.getLogger("tokenseam.gateway")

DEFAULT_MAX_BODY = 8 * 1024 * 1024


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


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
        return Response(self.body, status_code=self.status, media_type=self.content_type or "application/json")


def _bad(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, "invalid_request_error", code, param), status_code=status)


def create_gateway_app(upstream_url: str, *, cache: ResponseCache | None = None, api_key: str | None = None,
                       timeout: float = 120.0, connect_timeout: float = 5.0,
                       max_body_bytes: int = DEFAULT_MAX_BODY, registry: Any = None,
                       max_connections: int = 256) -> Starlette:
    """A Starlette app serving `/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`, `/metrics`.

    `cache=None` builds a memory-backed `ResponseCache`; `api_key` replaces the client's Authorization
    upstream (otherwise the client's header is forwarded). Entries are scoped by the hash of the client's
    key and by the upstream URL."""
    from prometheus_client import REGISTRY, generate_latest

    base = upstream_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    if not base.startswith(("http://", "https://")):
        raise ResponseCacheError(f"upstream URL {upstream_url!r} must start with http:// or https://")
    registry = registry if registry is not None else REGISTRY
    if cache is None:
        from .stores import MemoryStore

        cache = ResponseCache(MemoryStore(), namespace=base, registry=registry)
    if not cache.namespace:
        cache.namespace = base
    holder: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette):
        holder["client"] = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))
        try:
            yield
        finally:
            await holder["client"].aclose()

    def upstream_headers(request: Request) -> dict[str, str]:
        h = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if api_key:
            h["authorization"] = f"Bearer {api_key}"
        elif request.headers.get("authorization"):
            h["authorization"] = request.headers["authorization"]
        return h

    async def read_body(request: Request) -> dict[str, Any] | Response:
        cl = request.headers.get("content-length")
        if cl is not None and cl.isdigit() and int(cl) > max_body_bytes:
            return _bad(413, f"request body is {cl} bytes; the limit is {max_body_bytes}", "request_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                return _bad(413, f"request body exceeds the limit of {max_body_bytes} bytes", "request_too_large")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw.strip():
            return _bad(400, "the request body is empty; send a JSON object", "invalid_json")
        try:
            body = json.loads(raw)
        except RecursionError:
            return _bad(400, "the request body is nested too deeply", "invalid_json")
        except (UnicodeDecodeError, ValueError) as e:
            return _bad(400, f"the request body is not valid JSON: {e}", "invalid_json")
        if not isinstance(body, dict):
            return _bad(400, f"the request body must be a JSON object, not {type(body).__name__}", "invalid_request")
        return body

    def map_transport(e: httpx.HTTPError) -> UpstreamError:
        if isinstance(e, httpx.TimeoutException):
            return UpstreamError.gateway(504, f"the upstream {base} did not answer within the timeout "
                                         f"({type(e).__name__})", "upstream_timeout")
        return UpstreamError.gateway(502, f"cannot reach the upstream {base}: {type(e).__name__}: {e}",
                                     "upstream_unreachable")

    async def generation(request: Request) -> Response:
        route = request.url.path
        body = await read_body(request)
        if isinstance(body, Response):
            return body
        try:
            plan = cache.plan(route, body, request.headers,
                              tenant=tenant_from_api_key(request.headers.get("authorization")))
        except CacheRequestError as e:
            return _bad(400, str(e), "invalid_request", e.param)
        url = base + route
        headers = upstream_headers(request)
        client = holder["client"]

        async def generate(req: dict[str, Any]) -> dict[str, Any]:
            try:
                r = await client.post(url, json=req, headers=headers)
            except httpx.HTTPError as e:
                raise map_transport(e) from e
            if r.status_code != 200:
                raise UpstreamError(r.status_code, r.content, r.headers.get("content-type", "application/json"))
            try:
                data = r.json()
            except ValueError:
                raise UpstreamError.gateway(502, f"the upstream {base} returned a body that is not JSON",
                                            "upstream_bad_response") from None
            if not isinstance(data, dict):
                raise UpstreamError.gateway(502, "the upstream returned JSON that is not an object",
                                            "upstream_bad_response")
            return data

        async def generate_stream(req: dict[str, Any]):
            try:
                async with client.stream("POST", url, json=req, headers=headers) as r:
                    if r.status_code != 200:
                        raise UpstreamError(r.status_code, await r.aread(),
                                            r.headers.get("content-type", "application/json"))
                    parser = SSEParser()
                    async for data in r.aiter_bytes():
                        for ev in parser.feed(data):
                            if ev == "[DONE]":
                                return
                            if not isinstance(ev, dict):
                                raise UpstreamError.gateway(502, "the upstream sent a stream event that is not an "
                                                            "object", "upstream_bad_response")
                            yield ev
            except httpx.HTTPError as e:
                raise map_transport(e) from e
            except ResponseCacheError as e:
                if isinstance(e, UpstreamError):
                    raise
                raise UpstreamError.gateway(502, f"the upstream stream is malformed: {e}",
                                            "upstream_bad_response") from e

        try:
            if plan.stream:
                result = await cache.respond_stream(plan, generate_stream)
            else:
                result = await cache.respond(plan, generate)
        except UpstreamError as e:
            return e.response()
        except IncompleteStreamError as e:
            return JSONResponse(error_body(f"the upstream {base} answered a stream request without any stream "
                                           f"event ({e})", "upstream_error", "upstream_bad_response"), status_code=502)
        if isinstance(result, CacheStream):
            return StreamingResponse(result.events, media_type="text/event-stream",
                                     headers={**result.headers, "cache-control": "no-cache", "x-accel-buffering": "no"})
        return JSONResponse(result.body, headers=result.headers)

    async def models(request: Request) -> Response:
        try:
            r = await holder["client"].get(base + "/v1/models", headers=upstream_headers(request))
        except httpx.HTTPError as e:
            return map_transport(e).response()
        return Response(r.content, status_code=r.status_code,
                        media_type=r.headers.get("content-type", "application/json"))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "upstream": base, "cache_mode": cache.mode, "cache": cache.health(),
                             "time": time.time()})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    async def internal(request: Request, exc: Exception) -> Response:
        log.exception("gateway error on %s", request.url.path)
        return JSONResponse(error_body(f"gateway internal error: {type(exc).__name__}: {exc}", "server_error",
                                       "internal_error"), status_code=500)

    async def not_found(request: Request, exc: Exception) -> Response:
        return JSONResponse(error_body(f"no route {request.method} {request.url.path}", "invalid_request_error",
                                       "not_found"), status_code=404)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return JSONResponse(error_body(f"method {request.method} not allowed on {request.url.path}",
                                       "invalid_request_error", "method_not_allowed"), status_code=405)

    app = Starlette(routes=[
        Route(ROUTE_CHAT, generation, methods=["POST"]),
        Route(ROUTE_COMPLETIONS, generation, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ], lifespan=lifespan, exception_handlers={404: not_found, 405: not_allowed, Exception: internal})
    app.state.cache = cache
    app.state.upstream = base
    return app
