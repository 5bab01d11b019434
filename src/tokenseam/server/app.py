"""The HTTP API: OpenAI-compatible routes, llama-server-compatible routes, health and metrics.

Route functions are small: parse -> prepare an engine request -> stream or collect events -> format.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import generate_latest
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..engine import ChoiceEvent, Engine, GenerationRequest, RequestDone
from ..engine.chat_template import ChatTemplate
from ..healing import heal_prompt, request_constraint
from ..httpkit import CatchErrors, Guard, HTTPError, read_json_body, redact_text
from . import formatting as fmt
from .errors import APIError, from_exception
from .metrics import EngineCollector, ServerMetrics
from .pool import WorkPool
from .protocol import ParsedRequest, _bool, bad, parse_llama_completion, parse_openai

log = logging.getLogger("tokenseam.server")

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_TOKENIZE_CHARS = 1 << 20
MAX_DETOKENIZE_IDS = 1 << 18
GRAMMAR_NICE = 10
_GRAMMAR_FIELDS = ("response_format", "tools", "guided_json", "guided_regex", "guided_grammar", "guided_choice",
                   "grammar", "json_schema", "json_schema_options")


@dataclass
class Prepared:
    """An engine request plus what the response needs to report about how it was built."""

    gen: GenerationRequest
    prompt_tokens: int
    healed: dict | None = None  # {"removed_ids": [...], "removed_bytes": [...], "removed_text": ...}
    tool_call: dict | None = None  # set when the output is constrained to a tool call
    grammar_warnings: list[str] = field(default_factory=list)  # what a lenient schema compile ignored
    extra: dict = field(default_factory=dict)

    def report(self) -> dict:
        """The extension fields a response carries once (the first chunk when streaming)."""
        out: dict = {}
        if self.healed:
            out["token_healing"] = self.healed
        if self.grammar_warnings:
            out["grammar_warnings"] = self.grammar_warnings
        return out


class EventRelay:
    """Hands engine events (engine thread) to request queues (event loop): one loop wake-up carries all the
    events that arrive before the loop runs, instead of one per request per step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[asyncio.AbstractEventLoop, list] = {}

    def send(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, events: list) -> None:
        with self._lock:
            batch = self._pending.setdefault(loop, [])
            batch.append((queue, events))
            if len(batch) > 1:
                return  # a wake-up is already on its way
        try:
            loop.call_soon_threadsafe(self._flush, loop)
        except RuntimeError:  # the event loop is gone (shutdown); the engine must not die for it
            with self._lock:
                self._pending.pop(loop, None)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            batch = self._pending.pop(loop, [])
        for queue, events in batch:
            queue.put_nowait(events)


class ServerState:
    def __init__(self, engine: Engine, model_id: str, aliases: tuple[str, ...] = (),
                 max_body_bytes: int = MAX_BODY_BYTES, response_cache=None, prepare_workers: int = 4,
                 prepare_queue: int = 256, grammar_workers: int = 2, grammar_queue: int = 16,
                 stall_seconds: float = 30.0, max_memory_mb: int | None = None,
                 grammar_seconds: float | None = None, reasoning_end: str = "</think>") -> None:
        self.engine = engine
        self.reasoning_end = reasoning_end  # the tag that ends a thinking model's reasoning (a grammar follows)
        self.max_memory_bytes = max_memory_mb * 1024 * 1024 if max_memory_mb else None
        self.grammar_seconds = grammar_seconds  # each compile's time budget (None: the grammar default)
        # Requests are prepared off the event loop in two pools: grammar compiles (seconds at worst, bounded by
        # the compiler's budget) cannot take the threads that tokenize plain prompts.
        self.prepare_pool = WorkPool("prepare", prepare_workers, prepare_queue)
        # Compiles run at a lower CPU priority: beside them, decoding keeps the cores (measured with `tokenseam
        # bench chaos`: a plain request's p99 beside a hostile compile 4.1x at the same priority, 1.3x at nice 10).
        self.grammar_pool = WorkPool("grammar", grammar_workers, grammar_queue, nice=GRAMMAR_NICE)
        self.stall_seconds = stall_seconds
        self.backend = engine.backend
        self.vocab = engine.vocab
        self.tokenizer = engine.backend.tokenizer
        self.model_id = model_id
        self.model_names = {model_id, *aliases, engine.backend.model_name, engine.backend.path.name}
        self.max_body_bytes = max_body_bytes
        self.metrics = ServerMetrics()
        self.relay = EventRelay()
        self.metrics.registry.register(EngineCollector(engine))
        self.chat = ChatTemplate(engine.backend.chat_template, self.vocab, self.tokenizer)
        self.started = int(time.time())
        # Extra per-request constraint source (an embedding application's own rules; tests use it to force
        # exact outputs): (parsed request, body as the client sent it) -> constraint factory or None.
        self.constraint_hook: Callable[[ParsedRequest, dict], Callable | None] | None = None
        self.response_cache = response_cache  # tokenseam.respcache.ResponseCache or None
        from ..healing import prepare_vocabulary

        prepare_vocabulary(self.vocab)  # healing's lookup tables, built once here rather than by a request
        self._grammar_compiler = None
        self._grammar_lock = threading.Lock()

    def health(self) -> tuple[dict, int]:
        """The /health body and status: 503 when the engine is stuck (a load balancer should stop sending),
        200 "degraded" when a preparation pool is full or a job in it runs past the compile budget."""
        problems = []
        stalled = self.engine.stalled_seconds()
        if stalled > self.stall_seconds:
            problems.append(f"the engine has made no progress for {stalled:.0f} s")
        pools = {p.name: p.health() for p in (self.prepare_pool, self.grammar_pool)}
        for name, h in pools.items():
            if h["running"] + h["waiting"] >= h["workers"] + h["max_waiting"]:
                problems.append(f"the {name} pool is full")
            if h["oldest_job_seconds"] > self.stall_seconds:
                problems.append(f"a {name} job has run for {h['oldest_job_seconds']:.0f} s")
        cache = self.response_cache.health() if self.response_cache is not None else None
        if cache is not None and (not cache.get("ok", True) or cache.get("degraded")):
            problems.append("the response cache store is unavailable (requests are generated)")
        engine_stuck = stalled > self.stall_seconds
        body = {"status": "error" if engine_stuck else "degraded" if problems else "ok", "model": self.model_id,
                "queue_depth": self.engine.queue_depth, "running": self.engine.running_count,
                "engine_stalled_seconds": round(stalled, 3), "pools": pools}
        if cache is not None:
            body["cache"] = cache
        if problems:
            body["problems"] = problems
        return body, 503 if engine_stuck else 200

    def shutdown(self) -> None:
        """Stop the engine and the preparation pools (jobs already running finish in their threads)."""
        for pool in (self.prepare_pool, self.grammar_pool):
            pool.shutdown()
        self.engine.shutdown()

    def busy_threads(self) -> int:
        return self.prepare_pool.in_flight + self.grammar_pool.in_flight

    def warm_up(self) -> None:
        """Load what the first request would otherwise wait for: the grammar engine's numba code and vocabulary
        tables (about a second), so no request pays for it."""
        try:
            from ..grammar import GrammarMatcher
        except ImportError:
            return
        compiled = self.compile_request_grammar({"guided_regex": "[a-z]{1,4}"}, "/v1/completions")
        GrammarMatcher(compiled).fill_next_token_bitmask(np.zeros(self.vocab.mask_words, dtype=np.int32))
        self._grammar_compiler.warm_up()  # the rest of the numba code JSON schemas need

    def compile_request_grammar(self, body: dict, route: str):
        """The request's grammar (response_format, guided_*, grammar, json_schema, tools) or None."""
        try:
            from ..grammar import GrammarCompiler
            from ..grammar.request import constraint_from_request
        except ImportError:
            asked = [k for k in _GRAMMAR_FIELDS if body.get(k) not in (None, "", [], {})]
            if asked:
                raise APIError(400, f"{asked[0]} is not supported by this build (no grammar engine)", param=asked[0],
                               code="unsupported_parameter") from None
            return None
        with self._grammar_lock:  # requests are prepared in worker threads
            if self._grammar_compiler is None:
                # compiles stop at 95 % of the cap: memory is read every 10 ms of compile work, and the rest
                # of the process (decoding, responses) needs room too
                rss = int(self.max_memory_bytes * 0.95) if self.max_memory_bytes else None
                self._grammar_compiler = GrammarCompiler(self.vocab, time_budget=self.grammar_seconds,
                                                         rss_limit=rss)
        try:
            return constraint_from_request(self._grammar_compiler, body, route)
        except Exception as e:
            if (err := _mapped(e)) is None:
                raise
            raise err from e


def create_app(state: ServerState, *, api_keys: list[str] | None = None, allowed_hosts: list[str] | None = None,
               cors_origins: list[str] | None = None) -> FastAPI:
    """The app. `api_keys`: bearer keys every route but /health requires (None: no auth); `allowed_hosts`: Host
    header allow-list against DNS rebinding (None: no check); `cors_origins`: origins allowed cross-origin
    (None: no CORS headers at all)."""
    from ..respcache import IncompleteStreamError, LeaderAbortedError

    app = FastAPI(title="tokenseam", version="0.1.0", docs_url=None, redoc_url=None)
    app.state.ts = state
    secrets = [k for k in api_keys or [] if k]
    # Outermost the Guard (its 401s and 400s get CORS headers); inside it CatchErrors, which turns any exception
    # into a JSON 500 without re-raising, so the keep-alive connection survives and the log line is redacted.
    app.add_middleware(CatchErrors, logger=log, redact=lambda text: redact_text(text, secrets), what="server")
    app.add_middleware(Guard, allowed_hosts=allowed_hosts, cors_origins=cors_origins, api_keys=secrets or None)

    @app.exception_handler(HTTPError)
    async def _api_error(request: Request, e: HTTPError):
        state.metrics.requests.labels(_route_label(request), str(e.status)).inc()
        return e.response()

    @app.exception_handler(LeaderAbortedError)
    @app.exception_handler(IncompleteStreamError)  # a stream that ended before its first event: its client left
    async def _client_left(request: Request, e: Exception):
        # nobody reads this answer: the client (or the request this one waited on) went away
        state.metrics.requests.labels(_route_label(request), "499").inc()
        return APIError(499, "the client closed the request", code="client_closed").response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError):
        return bad(f"invalid request: {e.errors()}").response()

    @app.exception_handler(404)
    async def _not_found(request: Request, e):
        return APIError(404, f"no route {request.method} {request.url.path}", code="not_found").response()

    @app.exception_handler(405)
    async def _method(request: Request, e):
        return APIError(405, f"method {request.method} not allowed on {request.url.path}").response()

    @app.get("/health")
    async def health():
        body, status = await asyncio.to_thread(state.health)  # the cache store's ping may block
        return JSONResponse(body, status_code=status)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_id, "object": "model", "created": state.started,
                                            "owned_by": "tokenseam"}]}

    @app.get("/v1/models/{name}")
    async def model(name: str):
        if name not in state.model_names:
            raise APIError(404, f"model {name!r} does not exist", code="model_not_found", param="model")
        return {"id": state.model_id, "object": "model", "created": state.started, "owned_by": "tokenseam"}

    @app.get("/metrics")
    async def metrics():
        m = state.metrics
        m.queue_depth.set(state.engine.queue_depth)
        m.running.set(state.engine.running_count)
        m.sync_prefix_cache(state.engine.prefix_cache)
        return Response(generate_latest(m.registry), media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await read_json(request, state)
        content = body.get("content")
        if not isinstance(content, str):
            raise bad("content must be a string", "content")
        if len(content) > MAX_TOKENIZE_CHARS:
            raise APIError(413, f"content is {len(content)} characters; /tokenize takes at most {MAX_TOKENIZE_CHARS}",
                           param="content", code="request_too_large")
        flags = {name: _bool(body, name) for name in ("add_special", "parse_special", "with_pieces")}

        def work() -> dict:
            ids = state.tokenizer.encode(content, add_special=flags["add_special"],
                                         parse_special=flags["parse_special"])
            if flags["with_pieces"]:
                return {"tokens": [{"id": t, "piece": _piece(state, t)} for t in ids]}
            return {"tokens": ids}

        return await state.prepare_pool.run(work)  # a long text must not stall the loop that streams tokens

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await read_json(request, state)
        toks = body.get("tokens")
        if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
            raise bad("tokens must be a list of integers", "tokens")
        if len(toks) > MAX_DETOKENIZE_IDS:
            raise APIError(413, f"{len(toks)} tokens; /detokenize takes at most {MAX_DETOKENIZE_IDS}",
                           param="tokens", code="request_too_large")
        if any(not 0 <= t < state.vocab.size for t in toks):
            raise bad(f"token ids must be in 0..{state.vocab.size - 1}", "tokens")
        text = await state.prepare_pool.run(lambda: state.vocab.decode_bytes(toks).decode("utf-8", errors="replace"))
        return {"content": text}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _generate(request, state, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _generate(request, state, "/v1/chat/completions")

    @app.post("/completion")
    async def llama_completion(request: Request):
        return await _generate(request, state, "/completion")

    return app


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


async def read_json(request: Request, state: ServerState) -> dict:
    """The body as a JSON object: application/json only, size and depth limits, no lone surrogates or NaN
    (httpkit's one reader, shared with the gateway); otherwise a 4xx."""
    return await read_json_body(request, state.max_body_bytes)


# ---------------------------------------------------------------------------------------------- generation
def prepare(state: ServerState, parsed: ParsedRequest, body: dict, sent: dict | None = None) -> Prepared:
    """Tokenize the prompt and build the engine request: grammar constraint, token healing, test hooks."""
    if parsed.model is not None and parsed.model not in state.model_names:
        raise APIError(404, f"the model {parsed.model!r} does not exist; this server serves {state.model_id!r}",
                       code="model_not_found", param="model")
    if parsed.messages is not None:
        ids = state.chat.encode(parsed.messages)
    elif parsed.prompt_ids is not None:
        ids = parsed.prompt_ids
        if any(not 0 <= t < state.vocab.size for t in ids):
            raise bad(f"prompt token ids must be in 0..{state.vocab.size - 1}", "prompt")
    else:
        ids = state.tokenizer.encode(parsed.prompt_text or "", add_special=True, parse_special=False)
    # the hook sees the body as sent: the canonical one has no `_`-prefixed fields
    hooked = state.constraint_hook(parsed, sent or body) if state.constraint_hook is not None else None
    if hooked is not None:  # an embedder's own constraint replaces grammar and healing
        gen = GenerationRequest(prompt_ids=list(ids), params=parsed.params, constraint_factory=hooked)
        return Prepared(gen=gen, prompt_tokens=len(ids))
    tool_call = None
    if body.get("tools") and parsed.route == "/v1/chat/completions":
        choice = body.get("tool_choice", "auto")
        if choice == "auto":
            raise bad("tool_choice 'auto' is not supported: this server does not parse free-form tool calls; "
                      "use tool_choice 'required' or name a function (the call is then generated under a grammar)",
                      "tool_choice", code="unsupported_parameter")
        if choice != "none":
            tool_call = {"tool_choice": choice}
    compiled = state.compile_request_grammar(body, parsed.route)
    think = body.get("grammar_after_think", state.chat.is_thinking and parsed.messages is not None)
    if not isinstance(think, bool):
        raise bad("grammar_after_think must be true or false", "grammar_after_think")
    think = think and compiled is not None
    healed = None
    removed = b""
    rollback = 4 if parsed.token_healing is True else int(parsed.token_healing)
    if rollback and not think:  # the thinking text comes first: nothing to heal into
        hr = heal_prompt(ids, state.vocab, rollback)
        if hr.healed and len(hr.kept_ids) > 0:
            ids, removed = hr.kept_ids, hr.removed_bytes
            healed = {"removed_ids": hr.removed_ids, "removed_bytes": list(removed),
                      "removed_text": removed.decode("utf-8", errors="replace")}
    factory = request_constraint(state.vocab, compiled, removed, reasoning_end=state.reasoning_end if think else None)
    gen = GenerationRequest(prompt_ids=list(ids), params=parsed.params, constraint_factory=factory,
                            text_skip_bytes=len(removed))
    return Prepared(gen=gen, prompt_tokens=len(ids), healed=healed, tool_call=tool_call,
                    grammar_warnings=list(compiled.warnings) if compiled is not None else [])


def _mapped(e: Exception) -> APIError | None:
    """A part's error as its 4xx/503, or None for anything unexpected: that one is re-raised as it is, so
    CatchErrors logs its traceback under the request id the client sees."""
    err = from_exception(e)
    return None if err.status == 500 else err


def _wants_grammar(body: dict) -> bool:
    return any(body.get(k) not in (None, "", [], {}) for k in _GRAMMAR_FIELDS)


def _parse(route: str, body: dict) -> ParsedRequest:
    return parse_llama_completion(body) if route == "/completion" else parse_openai(body, route)


async def _generate(request: Request, state: ServerState, route: str):
    t0 = time.perf_counter()
    body = await read_json(request, state)
    # One validation step before the cache: a malformed request gets the same 4xx with the cache on or off.
    parsed = _parse(route, body)
    from ..respcache import CacheRequestError, canonicalize_request, tenant_from_api_key

    cache = state.response_cache
    if cache is None:
        try:  # the cache's canonicaliser checks what it keys on; without a cache it still decides 400 or not
            canonicalize_request(route, body)
        except CacheRequestError as e:
            raise APIError(400, str(e), param=e.param) from e
        if parsed.stream:
            stream = _stream_body(request, state, route, body, t0)
            # Take the first chunk now: a bad request fails here, before a 200 status line is sent.
            first = await anext(stream, b"")  # b"": the client left before anything was generated
            return StreamingResponse(_prepend(first, stream), media_type="text/event-stream", headers=_SSE_HEADERS)
        return JSONResponse(await _collect_body(request, state, route, body, t0))

    try:
        plan = cache.plan(route, body, request.headers, tenant=tenant_from_api_key(request.headers.get("authorization")))
    except CacheRequestError as e:
        raise APIError(400, str(e), param=e.param) from e

    # Generation always runs on the canonical request, so a hit returns what a miss would have computed.
    if plan.stream:
        r = await cache.respond_stream(plan, lambda req: _stream_body(request, state, route, req, t0, body))
        return StreamingResponse(r.events, media_type="text/event-stream", headers={**_SSE_HEADERS, **r.headers})
    r = await cache.respond(plan, lambda req: _collect_body(request, state, route, req, t0, body))
    return JSONResponse(r.body, headers=r.headers)


_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def _prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk


async def _start(state: ServerState, route: str, body: dict, sent: dict | None = None):
    """Parse, prepare and submit one request; returns (handle, queue, formatter). Raises APIError.

    Tokenizing, rendering the chat template and compiling a grammar run in a worker thread, so a long prompt or
    a large schema does not hold up the event loop that streams every other request's tokens."""
    parsed = _parse(route, body)
    pool = state.grammar_pool if _wants_grammar(body) else state.prepare_pool
    try:
        prep = await pool.run(prepare, state, parsed, body, sent)
    except APIError:
        raise
    except Exception as e:
        if (err := _mapped(e)) is None:
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
        if (err := _mapped(e)) is None:
            raise
        raise err from e
    rid = ("chatcmpl-" if route.endswith("chat/completions") else "cmpl-") + uuid.uuid4().hex[:24]
    return handle, queue, Formatter(state, parsed, prep, rid, route)


async def _collect_body(request: Request, state: ServerState, route: str, body: dict, t0: float,
                        sent: dict | None = None) -> dict:
    handle, queue, f = await _start(state, route, body, sent)
    first = True
    async for evs in _events(request, state, handle, queue, watch=True):
        if first:
            state.metrics.ttft.labels(f.route).observe(time.perf_counter() - t0)
            first = False
        f.absorb(evs)
    if f.done is None:
        from ..respcache import LeaderAbortedError

        raise LeaderAbortedError("the client closed the request")
    if f.done.error:
        raise APIError(503, f"generation failed: {f.done.error}", "server_error", code="generation_failed")
    f.record_metrics(t0)
    return f.final_response()


async def _stream_body(request: Request, state: ServerState, route: str, body: dict, t0: float, sent: dict | None = None
                       ) -> AsyncIterator[bytes]:
    handle, queue, f = await _start(state, route, body, sent)
    first = True
    for chunk in f.opening_chunks():
        yield chunk
    async for evs in _events(request, state, handle, queue):
        if first:
            state.metrics.ttft.labels(f.route).observe(time.perf_counter() - t0)
            first = False
        chunks = f.stream_chunks(evs)
        if chunks:
            yield b"".join(chunks)
    if f.done is not None:
        if f.done.error:
            yield fmt.sse({"error": {"message": f"generation failed: {f.done.error}", "type": "server_error",
                                     "param": None, "code": "generation_failed"}})
            return
        f.record_metrics(t0)
        for chunk in f.closing_chunks():
            yield chunk


_GONE: list = []  # put on a request's queue when its client disconnects (compared by identity)


async def _watch_disconnect(request: Request, queue: asyncio.Queue) -> None:
    """Wait for the client to leave (the body is read, so the next ASGI message is the disconnect) and wake the
    request's event loop at once, not at its next timer."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            queue.put_nowait(_GONE)
            return


async def _events(request: Request, state: ServerState, handle, queue: asyncio.Queue,
                  watch: bool = False) -> AsyncIterator[list]:
    """Engine events for one request, drained in batches; cancels the request if the client goes away.

    `watch`: listen for the disconnect (non-streamed responses, where nothing is written that would fail).
    A streamed response learns it from its writes and from Starlette, which cancels the stream; the timer
    below also covers a request still waiting in the engine's queue."""
    done = False
    watcher = asyncio.create_task(_watch_disconnect(request, queue)) if watch else None
    try:
        while True:
            if queue.empty():
                try:
                    async with asyncio.timeout(0.5):  # a timer, not a task per event as wait_for would be
                        evs = await queue.get()
                except TimeoutError:
                    if watcher is None and await request.is_disconnected():
                        return
                    continue
            else:
                evs = queue.get_nowait()
            if evs is _GONE:
                return
            while not queue.empty():  # everything the engine produced meanwhile goes out in one write
                more = queue.get_nowait()
                if more is _GONE:
                    return
                evs = evs + more
            yield evs
            if any(isinstance(e, RequestDone) for e in evs):
                done = True
                return
    finally:
        if watcher is not None:
            watcher.cancel()
        if not done:
            state.engine.cancel(handle)


class Formatter:
    """Accumulates one request's events and renders them in its route's wire format."""

    def __init__(self, state: ServerState, parsed: ParsedRequest, prep: Prepared, rid: str, route: str) -> None:
        self.state = state
        self.vocab = state.vocab
        self.p = parsed
        self.prep = prep
        self.rid = rid
        self.route = route
        self.created = int(time.time())
        self.choices = [fmt.ChoiceState(i) for i in range(parsed.params.n)]
        self.done: RequestDone | None = None
        self.chat = route == "/v1/chat/completions"
        self._reported = False

    # ------------------------------------------------------------------ accumulate
    def absorb(self, evs: list) -> list[tuple[ChoiceEvent, bytes]]:
        """Record events; return (event, bytes generated before it) for the streaming formatter."""
        out = []
        for e in evs:
            if isinstance(e, RequestDone):
                self.done = e
                continue
            c = self.choices[e.index]
            legacy_lp = self.p.params.logprobs and not self.chat and self.route != "/completion"
            prev = bytes(c.raw) if legacy_lp else b""  # only legacy logprob text offsets need it
            if legacy_lp:
                c.raw += self.vocab.decode_bytes(e.token_ids)
            c.token_ids += e.token_ids
            c.text += e.text
            c.logprobs += e.logprobs
            if e.finish_reason:
                c.finish_reason = e.finish_reason
                c.stop_string = e.stop_string
            out.append((e, prev))
        return out

    def record_metrics(self, t0: float) -> None:
        m = self.state.metrics
        d = self.done
        m.requests.labels(self.route, "200").inc()
        m.latency.labels(self.route).observe(time.perf_counter() - t0)
        m.prompt_tokens.inc(d.prompt_tokens)
        m.completion_tokens.inc(d.completion_tokens)
        m.prefix_hit_tokens.inc(d.cached_tokens)
        m.prefix_miss_tokens.inc(d.prompt_tokens - d.cached_tokens)

    def _tool_calls(self, c: fmt.ChoiceState) -> list[dict] | None:
        """The forced tool call as OpenAI `tool_calls`, or None (no tool mode, or the JSON is incomplete)."""
        if self.prep.tool_call is None or c.finish_reason != "stop":
            return None
        try:
            obj = json.loads(c.text)
        except ValueError:
            return None
        if not isinstance(obj, dict) or "name" not in obj:
            return None
        return [{"id": f"call_{self.rid[-12:]}_{c.index}", "type": "function",
                 "function": {"name": obj["name"], "arguments": json.dumps(obj.get("arguments", {}),
                                                                           ensure_ascii=False)}}]

    def _usage(self) -> dict:
        d = self.done
        return fmt.usage(d.prompt_tokens, sum(len(c.token_ids) for c in self.choices), d.cached_tokens)

    def _finish(self, c: fmt.ChoiceState) -> str | None:
        if c.finish_reason == "abort":
            return None
        return c.finish_reason

    # ------------------------------------------------------------------ non-streaming
    def final_response(self) -> dict:
        if self.route == "/completion":
            return self._llama_final()
        choices = []
        for c in self.choices:
            ch: dict = {"index": c.index, "finish_reason": self._finish(c)}
            if self.chat:
                calls = self._tool_calls(c)
                if calls is not None:
                    ch["message"] = {"role": "assistant", "content": None, "tool_calls": calls}
                    ch["finish_reason"] = "tool_calls"
                else:
                    ch["message"] = {"role": "assistant", "content": c.text}
                ch["logprobs"] = fmt.chat_logprobs(self.vocab, c.logprobs) if self.p.params.logprobs else None
            else:
                ch["text"] = c.text
                ch["logprobs"] = (fmt.completion_logprobs(self.vocab, c.logprobs, 0, b"")
                                  if self.p.params.logprobs else None)
            if self.p.return_token_ids:
                ch["token_ids"] = c.token_ids
            choices.append(ch)
        out = {"id": self.rid, "object": "chat.completion" if self.chat else "text_completion",
               "created": self.created, "model": self.state.model_id, "system_fingerprint": _fingerprint(self.state),
               "choices": choices, "usage": self._usage()}
        out.update(self.prep.report())
        return out

    def _llama_final(self) -> dict:
        c = self.choices[0]
        d = self.done
        stop_type = {"length": "limit", "stop": "word" if c.stop_string else "eos"}.get(c.finish_reason or "", "none")
        out = {"index": 0, "content": c.text, "id_slot": -1, "stop": True, "model": self.state.model_id,
               "tokens_predicted": len(c.token_ids), "tokens_evaluated": d.prompt_tokens,
               "tokens_cached": d.cached_tokens, "stop_type": stop_type, "stopping_word": c.stop_string or "",
               "truncated": False}
        if self.p.return_token_ids:
            out["tokens"] = c.token_ids
        if self.p.params.logprobs:
            out["completion_probabilities"] = fmt.llama_probs(self.vocab, c.logprobs)
        out.update(self.prep.report())
        return out

    # ------------------------------------------------------------------ streaming
    def _chunk(self, choices: list[dict]) -> dict:
        return {"id": self.rid, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.state.model_id,
                "system_fingerprint": _fingerprint(self.state), "choices": choices}

    def opening_chunks(self) -> list[bytes]:
        if not self.chat:
            return []
        out = []
        for c in self.choices:
            out.append(fmt.sse(self._chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}])))
        return out

    def stream_chunks(self, evs: list) -> list[bytes]:
        out = []
        report = self.prep.report() if not self._reported else None
        self._reported = True
        for e, prev in self.absorb(evs):
            c = self.choices[e.index]
            last = e.finish_reason is not None
            if self.route == "/completion":
                obj = {"index": 0, "content": e.text, "tokens": e.token_ids, "stop": False, "id_slot": -1}
                if self.p.params.logprobs:
                    obj["completion_probabilities"] = fmt.llama_probs(self.vocab, e.logprobs)
                if last:
                    obj.update(self._llama_final())
                    obj["content"] = e.text
                    obj["tokens"] = e.token_ids
                    obj["all_tokens"] = c.token_ids
                if report:
                    obj.update(report)
                    report = None
                out.append(fmt.sse(obj))
                continue
            ch: dict = {"index": e.index, "finish_reason": self._finish(c) if last else None}
            if self.chat and self.prep.tool_call is not None:
                # the call is sent whole once its JSON is complete; every event still carries its ids
                calls = self._tool_calls(c) if last else None
                ch["delta"] = {"tool_calls": [{"index": k, **call} for k, call in enumerate(calls)]} if calls else {}
                if calls:
                    ch["finish_reason"] = "tool_calls"
                elif last and c.text:
                    ch["delta"] = {"content": c.text}  # not a complete call (e.g. max_tokens): show the text
                ch["logprobs"] = fmt.chat_logprobs(self.vocab, e.logprobs) if self.p.params.logprobs else None
            elif self.chat:
                ch["delta"] = {"content": e.text} if e.text or not last else {}
                ch["logprobs"] = fmt.chat_logprobs(self.vocab, e.logprobs) if self.p.params.logprobs else None
            else:
                ch["text"] = e.text
                ch["logprobs"] = (fmt.completion_logprobs(self.vocab, e.logprobs, len(c.text) - len(e.text), prev)
                                  if self.p.params.logprobs else None)
            if self.p.return_token_ids:
                ch["token_ids"] = e.token_ids
                if last:
                    ch["all_token_ids"] = c.token_ids
            chunk = self._chunk([ch])
            if report:  # what healing removed from the prompt, grammar warnings: once, on the first chunk
                chunk.update(report)
                report = None
            out.append(fmt.sse(chunk))
        return out

    def closing_chunks(self) -> list[bytes]:
        if self.route == "/completion":
            return []
        out = []
        if self.p.include_usage:
            u = self._chunk([])
            u["usage"] = self._usage()
            out.append(fmt.sse(u))
        out.append(fmt.sse("[DONE]"))
        return out


def _fingerprint(state: ServerState) -> str:
    return "ts-" + state.vocab.fingerprint[:12]
