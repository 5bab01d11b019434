"""The gateway app: tokenseam's response cache in front of one or several OpenAI-compatible servers (vLLM,
SGLang, llama-server, tokenseam, hosted).

It forwards the canonical request to a replica the `Pool` picks (streams relayed event by event with httpx),
retries a failed attempt on another replica while nothing has reached the client, and maps what is left to
502/503/504 (with Retry-After when no replica can serve).
Bodies are read by `tokenseam.httpkit` (strict JSON, rejected before anything is forwarded), requests pass its
`Guard` (Host allow-list, CORS, client API keys), and every credential (upstream URL userinfo and secret query
values, the upstream key) is redacted from health, error bodies and logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

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
from ..wire import TOKEN_HEALING_ERROR, VLLM_HEALING_KEY, error_body
from .dialects import FieldError, translate
from .healing import HEADER as HEALING_HEADER
from .healing import HealingNotApplied, HealPlan, TextCutter, heal_with_ids, rollback_of, text_prompt
from .http1 import Http1Client
from .pool import OWNED_BY, NoReplica, Pool, Replica
from .relay import IdRelay, LostIds
from .routing import DEFAULT_PREFIX_BYTES, key_digest, route_key

log = logging.getLogger("tokenseam.gateway")

DEFAULT_MAX_BODY = 8 * 1024 * 1024
ROUTE_HEADER = "x-tokenseam-route"
FIELDS_HEADER = "x-tokenseam-translated"  # what the gateway rewrote for the upstream's dialect
# Answers that say "this replica cannot serve now", not "this request is wrong": tried on another replica.
RETRY_STATUSES = (429, 502, 503, 504)
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
        self.retry_after: int | None = None

    @classmethod
    def gateway(cls, status: int, message: str, code: str, retry_after: int | None = None) -> UpstreamError:
        e = cls(status, json.dumps(error_body(message, "upstream_error", code)).encode())
        e.code = code
        e.retry_after = retry_after
        return e

    def response(self, headers: dict[str, str] | None = None) -> Response:
        h = dict(headers or {})
        if self.retry_after is not None:
            h["retry-after"] = str(self.retry_after)
        return Response(
            self.body, status_code=self.status, media_type=self.content_type or "application/json", headers=h
        )


def _redact_tree(value: Any, hide: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return hide(value)
    if isinstance(value, dict):
        return {k: _redact_tree(v, hide) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_tree(v, hide) for v in value]
    return value


class _Attempts:
    """The replicas one request went to, for the response header."""

    __slots__ = ("replica", "reason", "count", "key", "notes", "healing")

    def __init__(self, key: bytes | None) -> None:
        self.key = key
        self.replica: Replica | None = None
        self.reason = ""
        self.count = 0
        self.notes: list[str] = []
        self.healing: str | None = None

    def headers(self, cache_status: str) -> dict[str, str]:
        h = {ROUTE_HEADER: self.header(cache_status)}
        if self.notes:
            h[FIELDS_HEADER] = "; ".join(self.notes)
        if self.healing:
            h[HEALING_HEADER] = self.healing
        return h

    def header(self, cache_status: str) -> str:
        if self.replica is None:
            return f"replica=-; reason={'cache' if cache_status == 'hit' else 'none'}; key={key_digest(self.key)}"
        return f"replica={self.replica.name}; reason={self.reason}; key={key_digest(self.key)}; attempts={self.count}"


def _replicas(upstreams: str | Sequence[str | Replica], max_in_flight: int) -> list[Replica]:
    items = [upstreams] if isinstance(upstreams, str) else list(upstreams)
    return [u if isinstance(u, Replica) else Replica(u, max_in_flight=max_in_flight) for u in items]


def _is_refused(e: httpx.HTTPError) -> bool:
    return isinstance(e, httpx.ConnectError) and "refused" in str(e).lower()


def create_gateway_app(
    upstreams: str | Sequence[str | Replica],
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
    routing: str = "prefix",
    load_factor: float = 1.25,
    max_in_flight: int = 128,
    health_interval: float = 5.0,
    fail_threshold: int = 2,
    queue_timeout: float = 10.0,
    prefix_bytes: int = DEFAULT_PREFIX_BYTES,
    tokenizers: dict[str, Any] | None = None,
) -> Starlette:
    """A Starlette app serving `/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`, `/metrics`.

    `upstreams` is one URL or several (URLs or `Replica`s); `routing`, `load_factor`, `max_in_flight` (per
    replica), `health_interval`, `fail_threshold` and `queue_timeout` configure the `Pool`. `tokenizers` maps
    a served model name to its byte `Vocabulary`, for token healing through vLLM replicas (`healing.py`). `cache=None` builds
    a memory-backed `ResponseCache`; `api_key` replaces the client's Authorization upstream.
    `client_api_keys` makes every route but `/health` require `Authorization: Bearer <one of them>`; without
    them the client's header is forwarded when there is no `api_key` (with them it never is: it holds a
    gateway key, not an upstream one). `allowed_hosts` / `cors_origins` configure the `Guard` (None: no Host
    check, no CORS). Entries are scoped by the hash of the client's key and by the cache's namespace (default:
    the redacted upstream URL, or the sorted URLs of a pool)."""
    from prometheus_client import REGISTRY, generate_latest

    registry = registry if registry is not None else REGISTRY
    replicas = _replicas(upstreams, max_in_flight)
    pool = Pool(
        replicas,
        routing=routing,
        load_factor=load_factor,
        fail_threshold=fail_threshold,
        health_interval=health_interval,
        queue_timeout=queue_timeout,
        registry=registry,
    )
    client_keys = [k for k in client_api_keys or () if k]
    secrets = [api_key, *client_keys]
    for r in replicas:
        secrets += [*url_secrets(r.url), r.basic and r.basic.split(" ", 1)[1]]

    def hide(text: str) -> str:
        return redact_text(text, secrets)

    def scrub(body: bytes) -> bytes:
        # An upstream error body may quote the key it was sent (a hosted API's "invalid key sk-..."): the
        # gateway's key must not reach its clients that way.
        for s in secrets:
            if s:
                body = body.replace(s.encode(), b"***")
        return body

    shown = replicas[0].shown if len(replicas) == 1 else "pool:" + ",".join(sorted(r.shown for r in replicas))
    # The namespace is hashed into fingerprints; the redacted URL keeps entries valid across credential rotation.
    if cache is None:
        cache = ResponseCache(MemoryStore(), namespace=shown, registry=registry)
    if not cache.namespace:
        cache.namespace = shown

    holder: dict[str, Any] = {}

    async def probe(replica: Replica) -> None:
        client: httpx.AsyncClient = holder["client"]
        try:
            r = await client.get(
                replica.url_for(replica.health_path),
                headers=auth_headers(replica, None),
                timeout=min(max(health_interval, 1.0), 5.0),
            )
        except httpx.HTTPError as e:
            pool.failed(replica, f"health check: {type(e).__name__}: {hide(str(e))}", refused=_is_refused(e))
            return
        if r.status_code >= 500:
            pool.failed(replica, f"health check answered {r.status_code}")
            return
        pool.recovered(replica)
        if not replica.detected:
            await detect(replica)

    detecting: dict[str, asyncio.Lock] = {r.name: asyncio.Lock() for r in replicas}

    async def detect(replica: Replica) -> None:
        # What the server is decides which request fields it honours (field translation, id relay).
        async with detecting[replica.name]:
            if not replica.detected:
                await _detect(replica)

    async def _detect(replica: Replica) -> None:
        client: httpx.AsyncClient = holder["client"]
        try:
            r = await client.get(
                replica.url_for("/v1/models"), headers=auth_headers(replica, None), timeout=5.0
            )
            data = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return
        owners = (
            {m.get("owned_by") for m in (data or {}).get("data") or [] if isinstance(m, dict)}
            if isinstance(data, dict)
            else set()
        )
        if replica.kind is None:
            kinds = {OWNED_BY.get(o) for o in owners if isinstance(o, str)} - {None}
            replica.kind = kinds.pop() if len(kinds) == 1 else "openai"
        if replica.kind == "vllm" and isinstance(data, dict):
            models = [m.get("id") for m in data.get("data") or [] if isinstance(m, dict)]
            replica.healing = await _has_healing(replica, models[0] if models else None)
        replica.detected = True

    async def _has_healing(replica: Replica, model: Any) -> bool:
        # A one-token request with healing arguments: vLLM without the processor refuses them with a 400.
        if not isinstance(model, str):
            return False
        try:
            r = await holder["client"].post(
                replica.url_for("/v1/completions"),
                json={"model": model, "prompt": "a", "max_tokens": 1, "vllm_xargs": {VLLM_HEALING_KEY: "20"}},
                headers=auth_headers(replica, None),
                timeout=60.0,
            )
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    async def tokenize(replica: Replica, request: Request, model: Any, text: str) -> list[int]:
        r = await holder["client"].post(
            replica.url_for("/tokenize"),
            json={"model": model, "prompt": text} if isinstance(model, str) else {"prompt": text},
            headers=upstream_headers(replica, request),
        )
        r.raise_for_status()
        ids = r.json().get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError("/tokenize answered without a list of token ids")
        return ids

    def vocab_for(model: Any) -> Any:
        if not tokenizers:
            return None
        if isinstance(model, str) and model in tokenizers:
            return tokenizers[model]
        return (
            next(iter(tokenizers.values())) if len(tokenizers) == 1 and not isinstance(model, str) else None
        )

    async def health_loop() -> None:
        while True:
            await asyncio.gather(*(probe(r) for r in replicas), return_exceptions=True)
            await asyncio.sleep(health_interval)

    @asynccontextmanager
    async def lifespan(app: Starlette):
        holder["client"] = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )
        holder["http1"] = Http1Client(connect_timeout=connect_timeout, read_timeout=timeout)
        task = asyncio.create_task(health_loop()) if health_interval > 0 else None
        # httpx logs every request's full URL (password and query) at INFO; the store loggers can quote a
        # store URL. Redact what those loggers emit while this gateway runs.
        try:
            with redacting_logs(hide, *REDACTED_LOGGERS):
                yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await holder["client"].aclose()
            await holder["http1"].aclose()

    def auth_headers(replica: Replica, request: Request | None) -> dict[str, str]:
        h: dict[str, str] = {}
        if api_key:
            h["authorization"] = f"Bearer {api_key}"
        elif replica.basic:
            h["authorization"] = replica.basic
        elif request is not None and not client_keys and request.headers.get("authorization"):
            h["authorization"] = request.headers["authorization"]
        return h

    def upstream_headers(replica: Replica, request: Request) -> dict[str, str]:
        return {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            **auth_headers(replica, request),
        }

    def map_transport(replica: Replica, e: httpx.HTTPError) -> UpstreamError:
        # httpx messages can quote the URL (userinfo included): only the redacted form leaves the gateway.
        if isinstance(e, httpx.TimeoutException) and not isinstance(e, httpx.ConnectTimeout):
            return UpstreamError.gateway(
                504,
                f"the upstream {replica.shown} did not answer within the timeout ({type(e).__name__})",
                "upstream_timeout",
            )
        return UpstreamError.gateway(
            502,
            f"cannot reach the upstream {replica.shown}: {type(e).__name__}: {hide(str(e))}",
            "upstream_unreachable",
        )

    def note_retryable(replica: Replica, status: int) -> None:
        if status == 429:
            pool.busy(replica)
        else:
            pool.failed(replica, f"answered {status}")

    def no_replica(e: NoReplica, last: UpstreamError | None) -> UpstreamError:
        if last is not None:
            # Every replica was tried: the last failure, with the time to try again.
            last.retry_after = e.retry_after
            return last
        return UpstreamError.gateway(503, hide(str(e)), "no_upstream_available", e.retry_after)

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
        try:
            rollback = rollback_of(route, body)
        except ValueError:
            return HTTPError(400, TOKEN_HEALING_ERROR, "invalid_request", param="token_healing").response()
        attempts = _Attempts(route_key(route, body, prefix_bytes=prefix_bytes)[0])
        client: httpx.AsyncClient = holder["client"]

        async def take(tried: set[Replica], last: UpstreamError | None) -> Replica:
            try:
                replica, reason = await pool.acquire(attempts.key, tried)
            except NoReplica as e:
                raise no_replica(e, last) from None
            attempts.replica, attempts.reason = replica, reason
            attempts.count += 1
            return replica

        async def body_for(replica: Replica, req: dict[str, Any]) -> HealPlan:
            # Fields in the replica's dialect; what it would drop silently is refused before anything is sent.
            # Whatever goes wrong here, the slot `take` acquired is given back.
            try:
                if not replica.detected:
                    await detect(replica)
                try:
                    out, attempts.notes = translate(replica.kind, route, req)
                except FieldError as e:
                    raise UpstreamError(
                        400,
                        json.dumps(
                            error_body(str(e), "invalid_request_error", "unsupported_field", e.param)
                        ).encode(),
                    ) from None
                plan = await heal_for(replica, out)
            except BaseException:
                pool.release(replica)
                raise
            attempts.healing = plan.header
            return plan

        async def heal_for(replica: Replica, body: dict[str, Any]) -> HealPlan:
            if replica.kind == "tokenseam":
                return HealPlan(body)  # it heals, and reports it, itself
            base = {k: v for k, v in body.items() if k != "token_healing"}
            prompt = text_prompt(route, body)
            if prompt is None or not rollback:
                return HealPlan(base)
            if VLLM_HEALING_KEY in (body.get("vllm_xargs") or {}):
                return HealPlan(base, header="off; reason=the request carries its own healing arguments")
            if body.get("echo"):
                return HealPlan(base, header="off; reason=echo returns the prompt as sent")
            if replica.kind != "vllm" or not replica.healing:
                return HealPlan(
                    base, header=f"off; reason=the upstream {replica.name} has no tokenseam healing processor"
                )
            model = body.get("model")
            vocab = vocab_for(model)
            if vocab is None:
                return HealPlan(base, header=f"off; reason=no --tokenizer for model {model!r}")
            try:
                ids = await tokenize(replica, request, model, prompt)
                return heal_with_ids(base, ids, vocab, rollback)
            except (httpx.HTTPError, ValueError) as e:
                # HealingError (a ValueError) too: ids the configured vocabulary does not know.
                return HealPlan(base, header=f"off; reason=/tokenize or rollback failed ({type(e).__name__})")

        async def post(replica: Replica, body: dict[str, Any]) -> Any:
            headers = upstream_headers(replica, request)
            if replica.scheme == "http":
                data = json.dumps(body, separators=(",", ":")).encode()
                return await holder["http1"].request(
                    "POST", replica.host, replica.port, replica.path_for(route), headers, data
                )
            return await client.post(replica.url_for(route), json=body, headers=headers)

        async def generate(req: dict[str, Any]) -> dict[str, Any]:
            tried: set[Replica] = set()
            last: UpstreamError | None = None
            while True:
                replica = await take(tried, last)
                heal = await body_for(replica, req)
                t0 = time.perf_counter()
                try:
                    r = await post(replica, heal.body)
                except httpx.HTTPError as e:
                    pool.failed(replica, f"{type(e).__name__}: {hide(str(e))}", refused=_is_refused(e))
                    last = map_transport(replica, e)
                    if last.status == 504:
                        raise last from e
                    tried.add(replica)
                    continue
                finally:
                    pool.release(replica)
                if r.status_code in RETRY_STATUSES:
                    note_retryable(replica, r.status_code)
                    last = UpstreamError(r.status_code, scrub(r.content), r.headers.get("content-type", ""))
                    tried.add(replica)
                    continue
                if r.status_code != 200:
                    if r.status_code < 500:
                        pool.client_error(replica)
                    else:
                        pool.failed(replica, f"answered {r.status_code}")
                    raise UpstreamError(
                        r.status_code, scrub(r.content), r.headers.get("content-type", "application/json")
                    )
                try:
                    data = r.json()
                except ValueError:
                    pool.failed(replica, "answered a body that is not JSON")
                    raise UpstreamError.gateway(
                        502,
                        f"the upstream {replica.shown} returned a body that is not JSON",
                        "upstream_bad_response",
                    ) from None
                if not isinstance(data, dict):
                    pool.failed(replica, "answered JSON that is not an object")
                    raise UpstreamError.gateway(
                        502, "the upstream returned JSON that is not an object", "upstream_bad_response"
                    )
                try:
                    data = IdRelay(req.get("return_token_ids") is True).response(data)
                    if heal.removed:
                        cutter = TextCutter(heal.removed)
                        for ch in data.get("choices") or ():
                            if isinstance(ch, dict) and isinstance(ch.get("text"), str):
                                ch["text"] = cutter.cut(ch.get("index", 0), ch["text"])
                        data["token_healing"] = heal.report
                except HealingNotApplied as e:
                    pool.failed(replica, "answered without healing")
                    raise UpstreamError.gateway(
                        502, f"the upstream {replica.shown}: {e}", "upstream_healing_not_applied"
                    ) from None
                except LostIds as e:
                    raise UpstreamError.gateway(
                        502, f"the upstream {replica.shown}: {e}", "upstream_lost_ids"
                    ) from None
                pool.succeeded(replica, time.perf_counter() - t0, data.get("usage"))
                return data

        async def generate_stream(req: dict[str, Any]):
            tried: set[Replica] = set()
            last: UpstreamError | None = None
            while True:
                replica = await take(tried, last)
                heal = await body_for(replica, req)
                t0 = time.perf_counter()
                relayed = False
                usage = None
                ids = IdRelay(req.get("return_token_ids") is True)
                cutter = TextCutter(heal.removed) if heal.removed else None
                try:
                    async with client.stream(
                        "POST",
                        replica.url_for(route),
                        json=heal.body,
                        headers=upstream_headers(replica, request),
                    ) as r:
                        if r.status_code != 200:
                            err = UpstreamError(
                                r.status_code,
                                scrub(await r.aread()),
                                r.headers.get("content-type", "application/json"),
                            )
                            if r.status_code in RETRY_STATUSES:
                                note_retryable(replica, r.status_code)
                                last = err
                                tried.add(replica)
                                continue
                            if r.status_code < 500:
                                pool.client_error(replica)
                            else:
                                pool.failed(replica, f"answered {r.status_code}")
                            raise err
                        parser = SSEParser()
                        async for data in r.aiter_bytes():
                            for ev in parser.feed(data):
                                if ev == "[DONE]":
                                    pool.succeeded(replica, time.perf_counter() - t0, usage)
                                    return
                                if not isinstance(ev, dict):
                                    pool.failed(replica, "sent a stream event that is not an object")
                                    raise UpstreamError.gateway(
                                        502,
                                        "the upstream sent a stream event that is not an object",
                                        "upstream_bad_response",
                                    )
                                if ev.get("usage") is not None:
                                    usage = ev["usage"]
                                try:
                                    ev = ids.event(ev)
                                    if cutter is not None:
                                        for ch in ev.get("choices") or ():
                                            if isinstance(ch, dict) and isinstance(ch.get("text"), str):
                                                ch["text"] = cutter.cut(ch.get("index", 0), ch["text"])
                                        if not relayed:
                                            ev["token_healing"] = heal.report
                                except LostIds as e:
                                    raise UpstreamError.gateway(
                                        502, f"the upstream {replica.shown}: {e}", "upstream_lost_ids"
                                    ) from None
                                except HealingNotApplied as e:
                                    raise UpstreamError.gateway(
                                        502,
                                        f"the upstream {replica.shown}: {e}",
                                        "upstream_healing_not_applied",
                                    ) from None
                                relayed = True
                                yield ev
                        pool.succeeded(replica, time.perf_counter() - t0, usage)
                        return
                except httpx.HTTPError as e:
                    pool.failed(replica, f"{type(e).__name__}: {hide(str(e))}", refused=_is_refused(e))
                    last = map_transport(replica, e)
                    if relayed or last.status == 504:
                        raise last from e
                    tried.add(replica)
                    continue
                except ResponseCacheError as e:
                    if isinstance(e, UpstreamError):
                        raise
                    pool.failed(replica, "sent a malformed stream")
                    raise UpstreamError.gateway(
                        502, f"the upstream stream is malformed: {hide(str(e))}", "upstream_bad_response"
                    ) from e
                finally:
                    pool.release(replica)

        try:
            if plan.stream:
                result = await cache.respond_stream(plan, generate_stream)
            else:
                result = await cache.respond(plan, generate)
        except UpstreamError as e:
            return e.response(attempts.headers("none"))
        except IncompleteStreamError as e:
            return HTTPError(
                502,
                f"the upstream {attempts.replica.shown if attempts.replica else shown} answered a stream request "
                f"without any stream event ({hide(str(e))})",
                "upstream_bad_response",
                type_="upstream_error",
            ).response()
        headers = {**result.headers, **attempts.headers(result.status)}
        if isinstance(result, CacheStream):
            return sse_response(result.events, headers)
        return JSONResponse(result.body, headers=headers)

    async def models(request: Request) -> Response:
        tried: set[Replica] = set()
        last: UpstreamError | None = None
        while True:
            try:
                replica, _ = await pool.acquire(None, tried)
            except NoReplica as e:
                return no_replica(e, last).response()
            try:
                r = await holder["client"].get(
                    replica.url_for("/v1/models"), headers=auth_headers(replica, request)
                )
            except httpx.HTTPError as e:
                pool.failed(replica, f"{type(e).__name__}: {hide(str(e))}", refused=_is_refused(e))
                last = map_transport(replica, e)
                tried.add(replica)
                continue
            finally:
                pool.release(replica)
            return Response(
                scrub(r.content),
                status_code=r.status_code,
                media_type=r.headers.get("content-type", "application/json"),
            )

    async def health(request: Request) -> Response:
        # Unauthenticated: everything shown goes through the redaction (store errors can quote a Redis URL).
        # The store's ping may block: off the event loop. A store that is down or was found corrupt leaves the
        # gateway serving (requests go upstream), so it is "degraded", not an error. With no replica in
        # rotation the gateway cannot serve: 503, so a load balancer in front of several gateways looks elsewhere.
        state = _redact_tree(await asyncio.to_thread(cache.health), hide)
        problems = []
        if not state.get("ok", True) or bool(state.get("degraded")):
            problems.append("the response cache store is unavailable (requests go to the upstream)")
        down = [r.name for r in replicas if not r.healthy]
        if down:
            problems.append(f"upstream replicas out of rotation: {', '.join(down)}")
        serving = len(down) < len(replicas)
        body = {
            "status": ("degraded" if problems else "ok") if serving else "unavailable",
            "upstream": shown,
            "routing": routing,
            "replicas": _redact_tree(pool.status(), hide),
            "cache_mode": cache.mode,
            "cache": state,
            "time": time.time(),
        }
        if problems:
            body["problems"] = problems
        return JSONResponse(body, status_code=200 if serving else 503)

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
                expose_headers=(
                    "x-tokenseam-cache",
                    "x-request-id",
                    ROUTE_HEADER,
                    FIELDS_HEADER,
                    "retry-after",
                ),
            ),
            Middleware(CatchErrors, logger=log, redact=hide, what="gateway"),
        ],
    )
    app.state.cache = cache
    app.state.upstream = shown
    app.state.pool = pool
    app.state.redact = hide
    app.state.client_auth = bool(client_keys)
    return app
