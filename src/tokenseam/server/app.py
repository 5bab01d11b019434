"""The HTTP routes: OpenAI-compatible, llama-server-compatible, tokenize/detokenize, health and metrics.

A Starlette app over one `ServerState`. Generation routes are small: parse -> prepare an engine request (in a
pool thread) -> stream or collect the engine's events -> render them with the route's `Formatter`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

from prometheus_client import generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..engine.sequence import RequestState
from ..httpkit import CatchErrors, Guard, HTTPError, read_json_body, redact_text, sse_response
from ..wire import sse
from .errors import APIError, known_error
from .formatting import FORMATTERS, Formatter
from .prepare import parse_request, prepare, wants_grammar
from .protocol import IGNORED_HEADER, bad, bool_field, ignored_fields
from .relay import request_events
from .state import ServerState

log = logging.getLogger("tokenseam.server")

MAX_TOKENIZE_CHARS = 1 << 20
MAX_DETOKENIZE_IDS = 1 << 18


def create_app(
    state: ServerState,
    *,
    api_keys: list[str] | None = None,
    allowed_hosts: list[str] | None = None,
    cors_origins: list[str] | None = None,
) -> Starlette:
    """The app. `api_keys`: bearer keys every route but /health requires (None: no auth); `allowed_hosts`: Host
    header allow-list against DNS rebinding (None: no check); `cors_origins`: origins allowed cross-origin
    (None: no CORS headers at all)."""
    from ..respcache import IncompleteStreamError, LeaderAbortedError

    secrets = [k for k in api_keys or [] if k]

    async def api_error(request: Request, e: HTTPError) -> Response:
        state.metrics.requests.labels(_route_label(request), str(e.status)).inc()
        return e.response()

    async def client_left(request: Request, e: Exception) -> Response:
        # nobody reads this answer: the client (or the request this one waited on) went away
        state.metrics.requests.labels(_route_label(request), "499").inc()
        return APIError(499, "the client closed the request", code="client_closed").response()

    async def not_found(request: Request, e: Exception) -> Response:
        return APIError(404, f"no route {request.method} {request.url.path}", code="not_found").response()

    async def not_allowed(request: Request, e: Exception) -> Response:
        return APIError(405, f"method {request.method} not allowed on {request.url.path}").response()

    async def health(request: Request) -> Response:
        body, status = await asyncio.to_thread(state.health)  # the cache store's ping may block
        return JSONResponse(body, status_code=status)

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": state.model_id,
                        "object": "model",
                        "created": state.started,
                        "owned_by": "tokenseam",
                    }
                ],
            }
        )

    async def model(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in state.model_names:
            raise APIError(404, f"model {name!r} does not exist", code="model_not_found", param="model")
        return JSONResponse(
            {"id": state.model_id, "object": "model", "created": state.started, "owned_by": "tokenseam"}
        )

    async def metrics(request: Request) -> Response:
        m = state.metrics
        m.queue_depth.set(state.engine.queue_depth)
        m.running.set(state.engine.running_count)
        m.sync_prefix_cache(state.engine.prefix_cache)
        return Response(generate_latest(m.registry), media_type="text/plain; version=0.0.4")

    async def tokenize(request: Request) -> Response:
        body = await read_json_body(request, state.max_body_bytes)
        content = body.get("content")
        if not isinstance(content, str):
            raise bad("content must be a string", "content")
        if len(content) > MAX_TOKENIZE_CHARS:
            raise APIError(
                413,
                f"content is {len(content)} characters; /tokenize takes at most {MAX_TOKENIZE_CHARS}",
                param="content",
                code="request_too_large",
            )
        flags = {name: bool_field(body, name) for name in ("add_special", "parse_special", "with_pieces")}

        def work() -> dict:
            ids = state.tokenizer.encode(
                content, add_special=flags["add_special"], parse_special=flags["parse_special"]
            )
            if flags["with_pieces"]:
                return {"tokens": [{"id": t, "piece": _piece(state, t)} for t in ids]}
            return {"tokens": ids}

        # a long text must not stall the loop that streams tokens
        return JSONResponse(await state.prepare_pool.run(work))

    async def detokenize(request: Request) -> Response:
        body = await read_json_body(request, state.max_body_bytes)
        toks = body.get("tokens")
        if not isinstance(toks, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in toks
        ):
            raise bad("tokens must be a list of integers", "tokens")
        if len(toks) > MAX_DETOKENIZE_IDS:
            raise APIError(
                413,
                f"{len(toks)} tokens; /detokenize takes at most {MAX_DETOKENIZE_IDS}",
                param="tokens",
                code="request_too_large",
            )
        if any(not 0 <= t < state.vocab.size for t in toks):
            raise bad(f"token ids must be in 0..{state.vocab.size - 1}", "tokens")
        text = await state.prepare_pool.run(
            lambda: state.vocab.decode_bytes(toks).decode("utf-8", errors="replace")
        )
        return JSONResponse({"content": text})

    def generation(kind: type[Formatter]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await _generate(request, state, kind)

        return endpoint

    routes = [
        _route("/health", health, "GET"),
        _route("/v1/models", models, "GET"),
        _route("/v1/models/{name}", model, "GET"),
        _route("/metrics", metrics, "GET"),
        _route("/tokenize", tokenize, "POST"),
        _route("/detokenize", detokenize, "POST"),
        *(_route(route, generation(kind), "POST") for route, kind in FORMATTERS.items()),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={
            HTTPError: api_error,
            LeaderAbortedError: client_left,
            IncompleteStreamError: client_left,  # a stream that ended before its first event: its client left
            404: not_found,
            405: not_allowed,
        },
        middleware=[
            # Outermost the Guard (its 401s and 400s get CORS headers); inside it CatchErrors, which turns any
            # exception into a JSON 500 without re-raising, so the keep-alive connection survives and the log line
            # is redacted.
            Middleware(
                Guard,
                allowed_hosts=allowed_hosts,
                cors_origins=cors_origins,
                api_keys=secrets or None,
                expose_headers=("x-request-id", IGNORED_HEADER, "x-tokenseam-cache"),
            ),
            Middleware(
                CatchErrors, logger=log, redact=lambda text: redact_text(text, secrets), what="server"
            ),
        ],
    )
    app.state.ts = state
    return app


def _route(path: str, endpoint: Callable[[Request], Awaitable[Response]], method: str) -> Route:
    route = Route(path, endpoint, methods=[method])
    route.methods.discard("HEAD")  # Starlette adds HEAD to GET routes; this server answers it with a 405
    return route


def _route_label(request: Request) -> str:
    """The route's template (`/v1/models/{name}`), not the path: a label per client-chosen path would let
    requests grow the metrics registry without bound."""
    route = request.scope.get("route")
    return getattr(route, "path", None) or "unmatched"


def _piece(state: ServerState, t: int) -> str | list[int]:
    b = state.vocab.token_bytes[t]
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


# ---------------------------------------------------------------------------------------------- generation
async def _generate(request: Request, state: ServerState, kind: type[Formatter]) -> Response:
    t0 = time.perf_counter()
    route = kind.route
    body = await read_json_body(request, state.max_body_bytes)
    # One validation step before the cache: a malformed request gets the same 4xx with the cache on or off.
    parsed = parse_request(route, body)
    ignored = ignored_fields(body)
    extra = {IGNORED_HEADER: ", ".join(ignored)[:1024]} if ignored else {}
    from ..respcache import CacheRequestError, normalize_request, tenant_from_api_key

    cache = state.response_cache
    if cache is None:
        try:  # the cache's request form checks what it keys on; without a cache it still decides 400 or not
            normalize_request(route, body)
        except CacheRequestError as e:
            raise APIError(400, str(e), param=e.param) from e
        if parsed.stream:
            stream = _stream_body(request, state, kind, body, t0)
            # Take the first chunk now: a bad request fails here, before a 200 status line is sent.
            first = await anext(stream, b"")  # b"": the client left before anything was generated
            return sse_response(_prepend(first, stream), extra)
        return JSONResponse(await _collect_body(request, state, kind, body, t0), headers=extra)

    try:
        plan = cache.plan(
            route, body, request.headers, tenant=tenant_from_api_key(request.headers.get("authorization"))
        )
    except CacheRequestError as e:
        raise APIError(400, str(e), param=e.param) from e

    # Generation always runs on the canonical request, so a hit returns what a miss would have computed.
    if plan.stream:
        r = await cache.respond_stream(plan, lambda req: _stream_body(request, state, kind, req, t0, body))
        return sse_response(r.events, {**r.headers, **extra})
    r = await cache.respond(plan, lambda req: _collect_body(request, state, kind, req, t0, body))
    return JSONResponse(r.body, headers={**r.headers, **extra})


async def _prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk


async def _start(
    state: ServerState, kind: type[Formatter], body: dict, sent: dict | None = None
) -> tuple[RequestState, asyncio.Queue, Formatter]:
    """Parse, prepare and submit one request; returns (handle, queue, formatter). Raises APIError.

    Tokenizing, rendering the chat template and compiling a grammar run in a worker thread, so a long prompt or
    a large schema does not hold up the event loop that streams every other request's tokens."""
    parsed = parse_request(kind.route, body)
    pool = state.grammar_pool if wants_grammar(body) else state.prepare_pool
    try:
        prep = await pool.run(prepare, state, parsed, body, sent)
    except APIError:
        raise
    except Exception as e:
        if (err := known_error(e)) is None:
            raise
        raise err from e
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    relay = state.relay

    def emit(events: list) -> None:
        relay.send(loop, queue, events)

    try:
        handle = state.engine.submit(prep.gen, emit)
    except Exception as e:
        if (err := known_error(e)) is None:
            raise
        raise err from e
    return handle, queue, kind(state, parsed, prep, kind.id_prefix + uuid.uuid4().hex[:24])


def _record_metrics(state: ServerState, route: str, f: Formatter, t0: float) -> None:
    m = state.metrics
    d = f.done
    m.requests.labels(route, "200").inc()
    m.latency.labels(route).observe(time.perf_counter() - t0)
    m.prompt_tokens.inc(d.prompt_tokens)
    m.completion_tokens.inc(d.completion_tokens)
    m.prefix_hit_tokens.inc(d.cached_tokens)
    m.prefix_miss_tokens.inc(d.prompt_tokens - d.cached_tokens)


async def _collect_body(
    request: Request,
    state: ServerState,
    kind: type[Formatter],
    body: dict,
    t0: float,
    sent: dict | None = None,
) -> dict:
    handle, queue, f = await _start(state, kind, body, sent)
    first = True
    async for evs in request_events(request, state.engine, handle, queue, watch=True):
        if first:
            state.metrics.ttft.labels(kind.route).observe(time.perf_counter() - t0)
            first = False
        f.absorb(evs)
    if f.done is None:
        from ..respcache import LeaderAbortedError

        raise LeaderAbortedError("the client closed the request")
    if f.done.error:
        raise APIError(503, f"generation failed: {f.done.error}", "server_error", code="generation_failed")
    _record_metrics(state, kind.route, f, t0)
    return f.final_response()


async def _stream_body(
    request: Request,
    state: ServerState,
    kind: type[Formatter],
    body: dict,
    t0: float,
    sent: dict | None = None,
) -> AsyncIterator[bytes]:
    handle, queue, f = await _start(state, kind, body, sent)
    first = True
    for chunk in f.opening_chunks():
        yield chunk
    async for evs in request_events(request, state.engine, handle, queue):
        if first:
            state.metrics.ttft.labels(kind.route).observe(time.perf_counter() - t0)
            first = False
        chunks = f.stream_chunks(evs)
        if chunks:
            yield b"".join(chunks)
    if f.done is not None:
        if f.done.error:
            yield sse(
                APIError(
                    503, f"generation failed: {f.done.error}", "server_error", code="generation_failed"
                ).body()
            )
            return
        _record_metrics(state, kind.route, f, t0)
        for chunk in f.closing_chunks():
            yield chunk
