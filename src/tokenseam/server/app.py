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
from typing import NoReturn

from prometheus_client import generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..engine.sequence import RequestState, TailHold
from ..httpkit import CatchErrors, Guard, HTTPError, read_json_body, redact_text, sse_response
from ..wire import ROUTE_COMPLETIONS, sse
from .errors import APIError, known_error
from .formatting import FORMATTERS, Formatter, usage
from .prepare import grammar_after_think, parse_request, prepare, remember_answers, wants_grammar
from .protocol import IGNORED_HEADER, bad, batch_prompts, bool_field, ignored_fields
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
    ignored = ignored_fields(route, body)
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


def _sub_bodies(kind: type[Formatter], body: dict) -> list[dict] | None:
    """The one-prompt bodies of a batched /v1/completions request, or None."""
    if kind.route != ROUTE_COMPLETIONS:
        return None
    prompts = batch_prompts(body.get("prompt"))
    return None if prompts is None else [{**body, "prompt": p} for p in prompts]


async def _start(
    state: ServerState,
    kind: type[Formatter],
    body: dict,
    sent: dict | None = None,
    index_base: int = 0,
    tenant: str = "",
    request: Request | None = None,
) -> tuple[RequestState, asyncio.Queue, Formatter]:
    """Parse, prepare and submit one request; returns (handle, queue, formatter). Raises APIError.
    `request`: the HTTP request, watched while its grammar compiles (a client that leaves then frees its slot
    at once, though the compile runs on to its end).

    Tokenizing, rendering the chat template and compiling a grammar run in a worker thread, so a long prompt or
    a large schema does not hold up the event loop that streams every other request's tokens."""
    parsed = parse_request(kind.route, body)
    grammar = wants_grammar(body)
    # A grammar compiles while the engine reads the prompt (its last token waits for it), unless it must be
    # known first (a reasoning block comes before it: healing depends on that) or the server compiles first
    # (`grammar_overlap` off: no prompt is read for a request whose grammar is refused).
    overlap = grammar and state.grammar_overlap and grammar_after_think(state, parsed, body) is not True
    compiling = (
        state.grammar_pool.submit(state.compile_request_grammar, body, parsed.route) if overlap else None
    )
    pool = state.grammar_pool if grammar and not overlap else state.prepare_pool
    try:
        prep = await pool.run(prepare, state, parsed, body, sent, tenant, compiling)
    except BaseException as e:
        if compiling is not None:
            compiling.cancel()
        _reraise(e)
    if compiling is not None and prep.gen.constraint_pending is None:
        compiling.cancel()  # an embedder's constraint hook took the request: its grammar is not used
        compiling = None
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    relay = state.relay
    # The answer's last token is decoded for the cache once the answer is out, not while it is written: the
    # response releases it (_release_tails) after its last write.
    prep.gen.tail_hold = TailHold()

    def emit(events: list) -> None:
        relay.send(loop, queue, events)

    try:
        handle = state.engine.submit(prep.gen, emit)
    except BaseException as e:
        if compiling is not None:
            compiling.cancel()
        _reraise(e)
    if compiling is not None:
        try:
            compiled = await _compiled(compiling, request)
        except BaseException as e:  # a compile error (400), or the client gone
            state.engine.cancel(handle)
            _reraise(e)
        prep.grammar_warnings = list(compiled.warnings) if compiled is not None else []
    f = kind(state, parsed, prep, kind.id_prefix + uuid.uuid4().hex[:24])
    f.index_base = index_base
    return handle, queue, f


async def _compiled(compiling, request: Request | None):
    """The compile's result. With `request`, the client is checked twice a second meanwhile, as
    `request_events` checks it once the answer flows: one that left ends the wait (LeaderAbortedError, a 499
    nobody reads), and the caller cancels the engine request."""
    fut = asyncio.wrap_future(compiling)
    if request is None:
        return await fut
    while True:
        done, _ = await asyncio.wait({fut}, timeout=0.5)
        if done:
            return fut.result()
        if await request.is_disconnected():
            from ..respcache import LeaderAbortedError

            fut.cancel()
            log.info("the client closed the connection while its grammar compiled; its request is cancelled")
            raise LeaderAbortedError("the client closed the request")


def _reraise(e: BaseException) -> NoReturn:
    """Raise `e` as the client should see it: a part's known error as its 4xx/503 APIError, anything else
    (a bug, a cancellation) as it is."""
    if isinstance(e, Exception) and not isinstance(e, APIError) and (err := known_error(e)) is not None:
        raise err from e
    raise e


def _tenant(request: Request) -> str:
    from ..respcache import tenant_from_api_key

    return tenant_from_api_key(request.headers.get("authorization"))


def _finished(state: ServerState, route: str, f: Formatter, t0: float) -> None:
    """A request answered in full: its answers go to the turn memory, its figures to the metrics."""
    remember_answers(state, f.prep, f.choices)
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
    subs = _sub_bodies(kind, body)
    if subs is None:
        started = await _start(state, kind, body, sent, tenant=_tenant(request), request=request)
        try:
            return await _drain(request, state, kind, t0, *started)
        finally:
            _release_tails(state, [started[0]], later=True)
    # A batch: one sub-request per prompt, run together; prompt i's choices are indices i*n .. i*n+n-1.
    started = await _start_batch(state, kind, body, subs, sent, _tenant(request))
    tasks = [asyncio.create_task(_drain(request, state, kind, t0, *s)) for s in started]
    try:
        parts = await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()  # one failed: the others stop too (their engine requests are cancelled)
        _release_tails(state, [h for h, _, _ in started], later=True)
    merged = dict(parts[0])
    merged["choices"] = [c for p in parts for c in p["choices"]]
    merged["usage"] = _sum_usage([p["usage"] for p in parts])
    if "prefix_cache" in merged:  # one report per prompt of the batch
        merged["prefix_cache"] = [p.get("prefix_cache") for p in parts]
    return merged


def _release_tails(state: ServerState, handles: list[RequestState], later: bool = False) -> None:
    """Let the engine decode these requests' last tokens (GenerationRequest.tail_hold): called once their
    answer is written out. `later`: once the current task has run on to its next wait (a body about to be
    written in this step of the task)."""
    for h in handles:
        if h.request.tail_hold is not None:
            if later:
                asyncio.get_running_loop().call_soon(state.engine.release_tail, h.request.tail_hold)
            else:
                state.engine.release_tail(h.request.tail_hold)


async def _start_batch(
    state: ServerState,
    kind: type[Formatter],
    body: dict,
    subs: list[dict],
    sent: dict | None,
    tenant: str = "",
) -> list[tuple[RequestState, asyncio.Queue, Formatter]]:
    """Parse, prepare and submit every prompt of a batch before anything is answered: a bad prompt is a 400
    and none of the others runs."""
    n = parse_request(kind.route, body).params.n
    sent_subs = _sub_bodies(kind, sent) if sent is not None else None
    started: list[tuple[RequestState, asyncio.Queue, Formatter]] = []
    try:
        for i, sub in enumerate(subs):
            started.append(await _start(state, kind, sub, sent_subs[i] if sent_subs else None, i * n, tenant))
    except BaseException:
        for handle, _, _ in started:
            state.engine.cancel(handle)
        raise
    return started


def _sum_usage(usages: list[dict]) -> dict:
    cached = sum((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for u in usages)
    return usage(sum(u["prompt_tokens"] for u in usages), sum(u["completion_tokens"] for u in usages), cached)


async def _drain(
    request: Request,
    state: ServerState,
    kind: type[Formatter],
    t0: float,
    handle: RequestState,
    queue: asyncio.Queue,
    f: Formatter,
) -> dict:
    """Collect one submitted request's events into its non-streamed body."""
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
    _finished(state, kind.route, f, t0)
    return f.final_response()


async def _stream_body(
    request: Request,
    state: ServerState,
    kind: type[Formatter],
    body: dict,
    t0: float,
    sent: dict | None = None,
) -> AsyncIterator[bytes]:
    subs = _sub_bodies(kind, body)
    if subs is not None:
        async for chunk in _stream_batch(request, state, kind, body, subs, t0, sent):
            yield chunk
        return
    handle, queue, f = await _start(state, kind, body, sent, tenant=_tenant(request), request=request)
    try:
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
            _finished(state, kind.route, f, t0)
            for chunk in f.closing_chunks():
                yield chunk
    finally:  # (resumed after the last chunk was written, or closed)
        _release_tails(state, [handle])


async def _stream_batch(
    request: Request,
    state: ServerState,
    kind: type[Formatter],
    body: dict,
    subs: list[dict],
    t0: float,
    sent: dict | None,
) -> AsyncIterator[bytes]:
    """A batch streamed: the sub-requests' chunks as they come (each choice's index says its prompt), then one
    usage chunk for all of them and one [DONE]. Every sub-request is submitted before the first byte, so a
    bad prompt is a 400 and nothing else runs."""
    started = await _start_batch(state, kind, body, subs, sent, _tenant(request))
    try:
        async for chunk in _merged_stream(request, state, kind, started, t0):
            yield chunk
    finally:
        _release_tails(state, [h for h, _, _ in started])


async def _merged_stream(
    request: Request,
    state: ServerState,
    kind: type[Formatter],
    started: list[tuple[RequestState, asyncio.Queue, Formatter]],
    t0: float,
) -> AsyncIterator[bytes]:
    merged: asyncio.Queue = asyncio.Queue()

    async def pump(handle: RequestState, queue: asyncio.Queue, f: Formatter) -> None:
        try:
            async for evs in request_events(request, state.engine, handle, queue):
                chunks = f.stream_chunks(evs)
                if chunks:
                    await merged.put(b"".join(chunks))
        finally:
            await merged.put(None)

    tasks = [asyncio.create_task(pump(*s)) for s in started]
    try:
        left, first = len(tasks), True
        while left:
            chunk = await merged.get()
            if chunk is None:
                left -= 1
                continue
            if first:
                state.metrics.ttft.labels(kind.route).observe(time.perf_counter() - t0)
                first = False
            yield chunk
    finally:
        for t in tasks:
            t.cancel()
    formatters = [f for _, _, f in started]
    failed = next((f.done.error for f in formatters if f.done is not None and f.done.error), None)
    if failed or any(f.done is None for f in formatters):
        if failed:
            yield sse(
                APIError(503, f"generation failed: {failed}", "server_error", code="generation_failed").body()
            )
        return
    for f in formatters:
        _finished(state, kind.route, f, t0)
    if formatters[0].p.include_usage:
        u = formatters[0]._chunk([])
        u["usage"] = _sum_usage([f._usage() for f in formatters])
        yield sse(u)
    yield sse("[DONE]")
