"""`ResponseCache`: the policy around "generate" — lookup, single-flight coalescing, storing, metrics.

Servers call `plan()` then one of `respond()` (non-streamed) or `respond_stream()` (SSE); the store never causes a 500.

Decisions worth knowing:
- `mode`: `off` (never consulted), `deterministic` (default: temperature 0 or an explicit seed), `always`.
- Bypass per request: header `x-tokenseam-cache: bypass`, or `cache-control: no-cache` / `no-store`.
- Response header `x-tokenseam-cache`: `hit` (from the store, or from a coalesced in-flight leader), `miss`
  (generated here, stored when cacheable), `bypass` (the cache was not consulted: policy, header, store down).
- Single flight: identical concurrent requests wait for one leader. If the leader's generation raises, every
  waiter gets the same exception (same request, same answer — the server maps it to the same status). If the
  leader is aborted (its client went away, the stream was cut), waiters start over and one of them becomes
  the new leader. Across processes, a store with locks (Redis) extends this: a process's leader first takes
  the entry's lock (SET NX with a `lock_seconds` expiry it keeps pushing out while it generates); a process
  that finds the lock held polls the store for the entry instead of generating, and takes the lock itself if
  it disappears without an entry (the holder failed or died). Redis down: every process passes through.
- A store failure logs a warning, counts `store_errors`, opens a short circuit (`store_retry_seconds`) during
  which requests pass straight through, then the store is tried again.
- Every stored value is checked on read: the store verifies its seal (format and SHA-256), then `entry_problem`
  checks every field replay relies on, and that the entry is for the request's route. A value that fails is
  counted (`corrupt_entries{reason}`), deleted and treated as a miss: the request is generated, never served
  from it. Entries are checked the same way before they are stored, so the cache never rejects its own writes.

Why this file is a little over 700 lines: lookup, single flight, the streamed and non-streamed paths and the
circuit around the store are one state machine over the same `CachePlan` and in-flight table; split, each
part would reach into the others' state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import Counter as _Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..metrics import metrics_for
from ..wire import ROUTE_LLAMA, error_body, sse
from .entry import (
    IncompleteStreamError,
    SSEParser,
    entry_from_response,
    entry_from_stream_events,
    entry_problem,
    replay_as_sse,
    response_from_entry,
    uncacheable_reason,
)
from .errors import CacheValueError, ResponseCacheError
from .request_form import fingerprint_normalized, is_deterministic, normalize_request
from .stores import CORRUPT_REASONS, CacheStore

log = logging.getLogger(__name__)

CACHE_HEADER = "x-tokenseam-cache"
MODES = ("off", "deterministic", "always")

Generate = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
GenerateStream = Callable[[dict[str, Any]], AsyncIterator[Any]]  # chunk dicts or SSE bytes


def _as_chunks(item: Any, parser: SSEParser) -> list[Any]:
    """A generator item as chunk objects: dicts pass through; SSE bytes/str are parsed (`[DONE]` dropped,
    the cache writes its own)."""
    if isinstance(item, dict):
        return [item]
    if isinstance(item, str):
        item = item.encode("utf-8")
    if isinstance(item, bytes | bytearray):
        return [c for c in parser.feed(bytes(item)) if c != "[DONE]"]
    raise ResponseCacheError(
        f"generate_stream yielded a {type(item).__name__}; expected a chunk dict or SSE bytes"
    )


class LeaderAbortedError(ResponseCacheError):
    """The request a waiter was coalesced onto was aborted; the waiter retries (never reaches a client).

    A `generate` that gives up because its own client went away should raise this (or let
    `asyncio.CancelledError` through) rather than an HTTP error, so waiters retry instead of inheriting it."""


def stated_limit(route: str, request: Mapping[str, Any]) -> bool:
    """Whether a (normalized) request names its own output limit."""
    if route == ROUTE_LLAMA:
        n = request.get("n_predict")
        return isinstance(n, int) and not isinstance(n, bool) and n >= 1
    return any(
        isinstance(request.get(k), int) and not isinstance(request.get(k), bool)
        for k in ("max_tokens", "max_completion_tokens")
    )


@dataclass
class CachePlan:
    """What the cache decided for one request, before any generation."""

    route: str
    normalized: dict[str, Any]
    stream: bool
    include_usage: bool
    fingerprint: str | None  # None: the cache is bypassed for this request
    bypass_reason: str | None = None

    def generation_request(self) -> dict[str, Any]:
        """The body to generate or forward: the normalized request plus the transport fields for streaming.

        A forwarded stream always asks for usage so the stored entry has it; the cache drops the usage chunk
        for a client that did not ask for it."""
        body = dict(self.normalized)
        if self.stream:
            body["stream"] = True
            if self.route != ROUTE_LLAMA:
                body["stream_options"] = {"include_usage": True}
        return body


@dataclass
class CacheResult:
    """A non-streamed answer and the cache status to send as `x-tokenseam-cache`."""

    status: str
    body: dict[str, Any]

    @property
    def headers(self) -> dict[str, str]:
        return {CACHE_HEADER: self.status}


@dataclass
class CacheStream:
    """A streamed answer: SSE byte strings to send as they come, and the cache status header."""

    status: str
    events: AsyncIterator[bytes]
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.headers.setdefault(CACHE_HEADER, self.status)


class _Metrics:
    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        buckets = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
        self.requests = Counter(
            "tokenseam_respcache_requests",
            "Cacheable-route requests by cache result",
            ["route", "result"],
            registry=registry,
        )
        self.coalesced = Counter(
            "tokenseam_respcache_coalesced",
            "Requests answered by an in-flight identical request",
            ["route"],
            registry=registry,
        )
        self.store_errors = Counter(
            "tokenseam_respcache_store_errors",
            "Cache store failures (requests passed through)",
            ["op"],
            registry=registry,
        )
        self.not_stored = Counter(
            "tokenseam_respcache_not_stored", "Answers not stored, by reason", ["reason"], registry=registry
        )
        self.corrupt = Counter(
            "tokenseam_respcache_corrupt_entries",
            "Stored values rejected on read (deleted, answered as a miss), by reason",
            ["reason"],
            registry=registry,
        )
        for reason in (*CORRUPT_REASONS, "shape"):
            self.corrupt.labels(reason)  # exported as 0 from the start, so an alert can use rate()
        self.store_recoveries = Counter(
            "tokenseam_respcache_store_recoveries",
            "Corrupt store files moved aside and replaced by an empty cache",
            registry=registry,
        )
        self.store_degraded = Gauge(
            "tokenseam_respcache_store_degraded",
            "1 while the last store operation failed (requests pass through), else 0",
            registry=registry,
        )
        self.lookup = Histogram(
            "tokenseam_respcache_lookup_seconds", "Store lookup time", buckets=buckets, registry=registry
        )
        self.hit = Histogram(
            "tokenseam_respcache_hit_seconds",
            "Hit time: lookup plus building the response",
            ["route"],
            buckets=buckets,
            registry=registry,
        )


def _metrics_for(registry: Any) -> _Metrics:
    return metrics_for(registry, _Metrics)


def _header(headers: Mapping[str, str] | None, name: str) -> str:
    if not headers:
        return ""
    value = headers.get(name)
    if value is None:
        for k, v in headers.items():
            if k.lower() == name:
                return str(v).lower()
        return ""
    return str(value).lower()


class _Flight:
    def __init__(self) -> None:
        self.lock_token: str | None = None  # the store lock this process's leader holds (shared stores)
        self.keeper: asyncio.Task[None] | None = None
        self.future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        # Retrieve the exception so an un-awaited failure does not log "never retrieved".
        self.future.add_done_callback(lambda f: f.cancelled() or f.exception())

    def resolve(self, entry: dict[str, Any]) -> None:
        if not self.future.done():
            self.future.set_result(entry)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


class ResponseCache:
    """Exact-match response cache with single-flight coalescing over a `CacheStore` (None = no store)."""

    def __init__(
        self,
        store: CacheStore | None,
        *,
        mode: str = "deterministic",
        ttl_seconds: float | None = None,
        namespace: str = "",
        cache_empty: bool = False,
        cache_truncated: bool | None = None,
        registry: Any = None,
        store_retry_seconds: float = 5.0,
        replay_event_delay: float = 0.0,
        wait_timeout: float = 600.0,
        lock_seconds: float = 10.0,
        poll_seconds: float = 0.05,
    ) -> None:
        if mode not in MODES:
            raise ResponseCacheError(f"cache mode {mode!r} is not one of {', '.join(MODES)}")
        self.store = store
        self.mode = mode
        self.ttl_seconds = ttl_seconds
        self.namespace = namespace
        self.cache_empty = cache_empty
        self.cache_truncated = cache_truncated
        self.store_retry_seconds = store_retry_seconds
        self.replay_event_delay = replay_event_delay
        self.wait_timeout = wait_timeout
        self.lock_seconds = lock_seconds
        self.poll_seconds = poll_seconds
        self.metrics = _metrics_for(registry)
        self.health_count_seconds = 30.0
        self.stats: _Counter[str] = _Counter()
        # Store threads (corrupt values, recoveries) and the event loop both update `stats`.
        self._stats_lock = threading.Lock()
        self._inflight: dict[str, _Flight] = {}
        self._background: set[asyncio.Task[None]] = set()  # lock releases in flight
        self._store_down_until = 0.0
        self._store_failing = False
        self._last_store_error: str | None = None
        self._entries: tuple[float, int] | None = None
        add_listener = getattr(store, "add_listener", None)
        if callable(add_listener):
            add_listener(self._on_store_event)
            # Recoveries made while the store opened (a corrupt file at start) happened before we listened.
            done = self._store_status().get("recoveries", 0)
            if isinstance(done, int) and done > 0:
                self.metrics.store_recoveries.inc(done)
                self.stats["store_recoveries"] += done

    # ------------------------------------------------------------ planning

    def plan(
        self, route: str, body: Mapping[str, Any], headers: Mapping[str, str] | None = None, tenant: str = ""
    ) -> CachePlan:
        """Normalize (raises `CacheRequestError` for a malformed body) and decide lookup or bypass."""
        normalized = normalize_request(route, body)
        stream = body.get("stream") is True
        so = body.get("stream_options")
        include_usage = stream and isinstance(so, Mapping) and so.get("include_usage") is True
        reason = None
        if self.mode == "off":
            reason = "off"
        elif _header(headers, CACHE_HEADER) == "bypass" or any(
            d.strip() in ("no-cache", "no-store") for d in _header(headers, "cache-control").split(",")
        ):
            reason = "header"
        elif self.mode == "deterministic" and not is_deterministic(route, normalized):
            reason = "nondeterministic"
        fp = (
            None
            if reason
            else fingerprint_normalized(route, normalized, tenant=tenant, namespace=self.namespace)
        )
        return CachePlan(route, normalized, stream, include_usage, fp, reason)

    # ------------------------------------------------------------ store access (never raises)

    def store_available(self) -> bool:
        return self.store is not None and time.monotonic() >= self._store_down_until

    def _store_failed(self, op: str, exc: BaseException) -> None:
        self.metrics.store_errors.labels(op).inc()
        self.metrics.store_degraded.set(1)
        with self._stats_lock:
            self.stats["store_errors"] += 1
        self._store_failing = True
        # Our stores' errors say what failed; anything else (a custom store's bug) gets its type named.
        self._last_store_error = (
            str(exc) if isinstance(exc, ResponseCacheError) else f"{type(exc).__name__}: {exc}"
        )
        if time.monotonic() >= self._store_down_until:
            log.warning(
                "response cache store %s failed on %s (%s); passing requests through for %.1fs",
                getattr(self.store, "description", "?"),
                op,
                self._last_store_error,
                self.store_retry_seconds,
            )
        self._store_down_until = time.monotonic() + self.store_retry_seconds

    def _store_ok(self) -> None:
        if self._store_failing:
            self._store_failing = False
            self.metrics.store_degraded.set(0)
            log.info("response cache store %s works again", getattr(self.store, "description", "?"))

    def _note_corrupt(self, reason: str) -> None:
        self.metrics.corrupt.labels(reason).inc()
        with self._stats_lock:
            self.stats["corrupt"] += 1

    def _on_store_event(self, event: str, detail: str) -> None:
        """Called by the store, from its thread: a corrupt value removed, or a corrupt file replaced."""
        if event == "corrupt":
            self._note_corrupt(detail if detail in CORRUPT_REASONS else "undecodable")
        elif event == "recovered":
            self._entries = None  # the count was of the old file
            self.metrics.store_recoveries.inc()
            with self._stats_lock:
                self.stats["store_recoveries"] += 1

    def _store_status(self) -> dict[str, Any]:
        status = getattr(self.store, "status", None)
        if not callable(status):
            return {}
        try:
            got = status()
        except Exception as e:  # health must answer even when a custom store's status() is broken
            log.warning("response cache store status failed: %s: %s", type(e).__name__, e)
            return {}
        return got if isinstance(got, dict) else {}

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if getattr(self.store, "blocking", True):
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    async def _get(self, fp: str, route: str) -> tuple[bool, dict[str, Any] | None]:
        """(store ok, entry or None). A value that is not an entry for `route` is deleted and reads as None."""
        if not self.store_available():
            return False, None
        t0 = time.perf_counter()
        try:
            value = await self._call(self.store.get, fp)
        except Exception as e:  # the store never causes a 500: any failure passes the request through
            self._store_failed("get", e)
            return False, None
        self._store_ok()
        self.metrics.lookup.observe(time.perf_counter() - t0)
        if value is not None:
            problem = entry_problem(value, route)
            if problem is not None:
                self._note_corrupt("shape")
                log.warning(
                    "response cache entry %s is not a valid entry (%s): removed, answered as a miss",
                    fp[:16],
                    problem,
                )
                with contextlib.suppress(Exception):
                    await self._call(self.store.delete, fp)
                return True, None
        return True, value

    async def _put(self, fp: str, entry: dict[str, Any]) -> None:
        if not self.store_available():
            return
        try:
            await self._call(self.store.put, fp, entry, self.ttl_seconds)
        except CacheValueError as e:  # this value cannot be stored; the store is fine
            self.metrics.not_stored.labels("unstorable").inc()
            self.stats["not_stored_unstorable"] += 1
            log.warning("response cache entry %s not stored: %s", fp[:16], e)
            return
        except Exception as e:
            self._store_failed("put", e)
            return
        self._store_ok()
        self.stats["stored"] += 1

    # ------------------------------------------------------------ lookup or lead

    async def _acquire(self, plan: CachePlan) -> tuple[str, Any]:
        """("hit", entry) | ("coalesced", entry) | ("lead", flight) | ("down", None)."""
        fp = plan.fingerprint
        assert fp is not None
        while True:
            flight = self._inflight.get(fp)
            if flight is None:
                ok, entry = await self._get(fp, plan.route)
                if not ok:
                    return "down", None
                if entry is not None:
                    return "hit", entry
                flight = self._inflight.get(fp)
                if flight is None:
                    flight = _Flight()
                    self._inflight[fp] = flight
                    # A leader that finished between our read and our registration has stored its entry.
                    ok, entry = await self._get(fp, plan.route)
                    if ok and entry is not None:
                        self._inflight.pop(fp, None)
                        flight.resolve(entry)
                        return "hit", entry
                    if callable(getattr(self.store, "try_lock", None)):
                        try:
                            entry = await self._lead_across_processes(plan, flight)
                        except BaseException as e:
                            self._abandon(
                                plan, flight, LeaderAbortedError(f"waiting for another process: {e}")
                            )
                            raise
                        if entry is not None:
                            self._inflight.pop(fp, None)
                            flight.resolve(entry)
                            return "coalesced", entry
                    return "lead", flight
            try:
                entry = await asyncio.wait_for(asyncio.shield(flight.future), self.wait_timeout)
            except LeaderAbortedError:
                continue
            except TimeoutError:
                log.warning(
                    "waited %.0fs for an identical in-flight request; generating without it",
                    self.wait_timeout,
                )
                return "down", None
            return "coalesced", entry

    async def _lead_across_processes(self, plan: CachePlan, flight: _Flight) -> dict[str, Any] | None:
        """Take the store's lock for this entry (None: lead) or wait for the process that holds it (its entry).
        A store failure leaves this process leading without a lock: the store never blocks a request."""
        fp = plan.fingerprint
        token = uuid.uuid4().hex
        deadline = time.monotonic() + self.wait_timeout
        waited = False
        while True:
            if not self.store_available():
                return None
            try:
                got = await self._call(self.store.try_lock, fp, token, self.lock_seconds)
            except Exception as e:
                self._store_failed("lock", e)
                return None
            if got:
                flight.lock_token = token
                flight.keeper = asyncio.get_running_loop().create_task(self._keep_lock(fp, token))
                if waited:
                    # The holder went away without storing; one last look in case it stored as it left.
                    ok, entry = await self._get(fp, plan.route)
                    if ok and entry is not None:
                        self._release_lock(fp, flight)
                        return entry
                return None
            waited = True
            self.stats["cross_process_waits"] += 1
            # Another process generates it: poll for its entry until the lock goes (then try to take it).
            while True:
                if time.monotonic() > deadline:
                    log.warning(
                        "waited %.0fs for another process's identical request; generating without it",
                        self.wait_timeout,
                    )
                    return None
                await asyncio.sleep(self.poll_seconds)
                ok, entry = await self._get(fp, plan.route)
                if not ok:
                    return None
                if entry is not None:
                    return entry
                try:
                    held = await self._call(self.store.locked, fp)
                except Exception as e:
                    self._store_failed("lock", e)
                    return None
                if not held:
                    break

    async def _keep_lock(self, fp: str, token: str) -> None:
        # Push the lock's expiry out while this process generates; a dead process's lock expires on its own.
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await asyncio.sleep(self.lock_seconds / 3)
                try:
                    if not await self._call(self.store.extend_lock, fp, token, self.lock_seconds):
                        return
                except Exception:
                    return

    def _release_lock(self, fp: str | None, flight: _Flight) -> None:
        token, flight.lock_token = flight.lock_token, None
        if flight.keeper is not None:
            flight.keeper.cancel()
            flight.keeper = None
        if token is None or fp is None:
            return

        async def release() -> None:
            with contextlib.suppress(Exception):
                await self._call(self.store.unlock, fp, token)

        task = asyncio.get_running_loop().create_task(release())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _truncated_ok(self, plan: CachePlan) -> bool:
        """Whether an answer cut by its output limit may be stored. `cache_truncated` None (the default): when
        the request states its limit (`max_tokens`, `max_completion_tokens`, `n_predict` >= 1), which is part
        of the key, so a deterministic answer that ran to it is the exact answer to that request. Without one,
        the limit was the upstream's context or its own default, which the key does not hold."""
        if self.cache_truncated is not None:
            return self.cache_truncated
        return stated_limit(plan.route, plan.normalized)

    async def _finish(self, plan: CachePlan, flight: _Flight, entry: dict[str, Any]) -> None:
        fp = plan.fingerprint
        try:
            try:
                reason = uncacheable_reason(
                    entry, cache_empty=self.cache_empty, cache_truncated=self._truncated_ok(plan)
                )
            except (AttributeError, TypeError, ValueError):
                reason = "malformed"  # e.g. `choices` that are not objects: nothing to check it by
            if reason is None:
                # The check a read applies: an entry it would reject is never written (nor counted corrupt later).
                problem = entry_problem(entry, plan.route)
                if problem is not None:
                    log.warning("answer for %s not stored: %s", plan.route, problem)
                    reason = "malformed"
            if reason is None:
                await self._put(fp, entry)
            else:
                self.metrics.not_stored.labels(reason).inc()
                self.stats[f"not_stored_{reason}"] += 1
        finally:
            # Unregister only after the put so a newcomer either finds the flight or the stored entry.
            if self._inflight.get(fp) is flight:
                del self._inflight[fp]
            self._release_lock(fp, flight)
            flight.resolve(entry)

    def _abandon(self, plan: CachePlan, flight: _Flight, exc: BaseException) -> None:
        if self._inflight.get(plan.fingerprint) is flight:
            del self._inflight[plan.fingerprint]
        self._release_lock(plan.fingerprint, flight)
        flight.fail(exc)

    def _count(self, plan: CachePlan, result: str) -> None:
        self.metrics.requests.labels(plan.route, result).inc()
        self.stats[result] += 1

    # ------------------------------------------------------------ non-streamed

    async def respond(self, plan: CachePlan, generate: Generate) -> CacheResult:
        """Answer a non-streamed request: from the cache, from a coalesced leader, or `await generate(body)`."""
        if plan.fingerprint is None:
            self._count(plan, "bypass")
            return CacheResult("bypass", await generate(plan.generation_request()))
        t0 = time.perf_counter()
        kind, got = await self._acquire(plan)
        if kind in ("hit", "coalesced"):
            body = response_from_entry(got)
            self.metrics.hit.labels(plan.route).observe(time.perf_counter() - t0)
            if kind == "coalesced":
                self.metrics.coalesced.labels(plan.route).inc()
                self.stats["coalesced"] += 1
            self._count(plan, "hit")
            return CacheResult("hit", body)
        if kind == "down":
            self._count(plan, "bypass")
            return CacheResult("bypass", await generate(plan.generation_request()))
        flight: _Flight = got
        try:
            body = await generate(plan.generation_request())
        except (asyncio.CancelledError, GeneratorExit):
            self._abandon(plan, flight, LeaderAbortedError("the leading request was cancelled"))
            raise
        except LeaderAbortedError as e:
            self._abandon(plan, flight, LeaderAbortedError(str(e)))
            raise
        except BaseException as e:
            self._abandon(plan, flight, e)
            raise
        try:
            entry = entry_from_response(plan.route, body)
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            log.warning("response for %s could not be turned into a cache entry: %s", plan.route, e)
            self._abandon(plan, flight, LeaderAbortedError("the leading response was not cacheable"))
            self._count(plan, "miss")
            return CacheResult("miss", body)
        await self._finish(plan, flight, entry)
        self._count(plan, "miss")
        return CacheResult("miss", body)

    # ------------------------------------------------------------ streamed

    def _encode(self, plan: CachePlan, chunk: Any) -> bytes | None:
        if plan.route != ROUTE_LLAMA and isinstance(chunk, dict) and not plan.include_usage:
            if chunk.get("choices") == [] and chunk.get("usage") is not None:
                return None  # the client did not ask for the usage chunk we requested upstream
            if "usage" in chunk:
                chunk = {k: v for k, v in chunk.items() if k != "usage"}
        return sse(chunk)

    async def _relay(
        self,
        plan: CachePlan,
        first: list[Any],
        agen: AsyncIterator[Any],
        flight: _Flight | None,
        parser: SSEParser,
    ) -> AsyncIterator[bytes]:
        chunks: list[Any] = []
        try:
            for chunk in first:
                chunks.append(chunk)
                data = self._encode(plan, chunk)
                if data:
                    yield data
            async for item in agen:
                for chunk in _as_chunks(item, parser):
                    if isinstance(chunk, dict) and "error" in chunk and not chunk.get("choices"):
                        # The generator reported an error mid-stream: pass it on, store nothing.
                        yield sse(chunk)
                        if flight is not None:
                            self.metrics.not_stored.labels("error").inc()
                            self.stats["not_stored_error"] += 1
                            self._abandon(
                                plan, flight, LeaderAbortedError("the leading stream reported an error")
                            )
                            flight = None
                        return
                    chunks.append(chunk)
                    data = self._encode(plan, chunk)
                    if data:
                        yield data
            if flight is not None:
                try:
                    entry = entry_from_stream_events(plan.route, chunks)
                except IncompleteStreamError as e:
                    self.metrics.not_stored.labels("aborted").inc()
                    self.stats["not_stored_aborted"] += 1
                    self._abandon(plan, flight, LeaderAbortedError(str(e)))
                    flight = None
                    yield sse(error_body(f"stream ended early: {e}", "upstream_error", "incomplete_stream"))
                    return
                await self._finish(plan, flight, entry)
                flight = None
            if plan.route != ROUTE_LLAMA:
                yield sse("[DONE]")
        except (asyncio.CancelledError, GeneratorExit):
            if flight is not None:
                self._abandon(plan, flight, LeaderAbortedError("the leading stream's client went away"))
                flight = None
            raise
        except Exception as e:
            if flight is not None:
                # The leader's client has part of a stream; its waiters have nothing yet and start over (a
                # replica that died mid-stream is not the answer to their request).
                self._abandon(plan, flight, LeaderAbortedError(f"the leading stream failed mid-way: {e}"))
                flight = None
            log.warning("stream for %s failed mid-way: %s", plan.route, e)
            yield sse(
                error_body(
                    f"generation failed mid-stream: {e}",
                    "upstream_error",
                    getattr(e, "code", None) or "stream_error",
                )
            )
        finally:
            if flight is not None:
                self._abandon(plan, flight, LeaderAbortedError("the leading stream stopped"))
            aclose = getattr(agen, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    async def _open(
        self, plan: CachePlan, generate_stream: GenerateStream, flight: _Flight | None
    ) -> tuple[list[Any], AsyncIterator[Any], SSEParser]:
        agen = generate_stream(plan.generation_request())
        parser = SSEParser()
        try:
            first: list[Any] = []
            while not first:  # SSE bytes may carry no complete event yet (a comment, half an event)
                first = _as_chunks(await agen.__anext__(), parser)
        except StopAsyncIteration:
            if flight is not None:
                self._abandon(plan, flight, LeaderAbortedError("the leading stream produced no events"))
            raise IncompleteStreamError("the stream ended before its first event") from None
        except (asyncio.CancelledError, GeneratorExit):
            if flight is not None:
                self._abandon(plan, flight, LeaderAbortedError("the leading request was cancelled"))
            raise
        except BaseException as e:
            if flight is not None:
                self._abandon(plan, flight, e)
            raise
        return first, agen, parser

    async def respond_stream(self, plan: CachePlan, generate_stream: GenerateStream) -> CacheStream:
        """Answer a `stream: true` request. Errors before the first event raise here (so the caller can send a
        proper status; a stream with no event at all raises `IncompleteStreamError`); after that they become
        an SSE error event. `generate_stream(body)` yields chunk dicts or SSE bytes."""
        if plan.fingerprint is None:
            self._count(plan, "bypass")
            first, agen, parser = await self._open(plan, generate_stream, None)
            return CacheStream("bypass", self._relay(plan, first, agen, None, parser))
        t0 = time.perf_counter()
        kind, got = await self._acquire(plan)
        if kind in ("hit", "coalesced"):
            if kind == "coalesced":
                self.metrics.coalesced.labels(plan.route).inc()
                self.stats["coalesced"] += 1
            self._count(plan, "hit")
            self.metrics.hit.labels(plan.route).observe(time.perf_counter() - t0)
            return CacheStream(
                "hit",
                replay_as_sse(got, include_usage=plan.include_usage, event_delay=self.replay_event_delay),
            )
        if kind == "down":
            self._count(plan, "bypass")
            first, agen, parser = await self._open(plan, generate_stream, None)
            return CacheStream("bypass", self._relay(plan, first, agen, None, parser))
        first, agen, parser = await self._open(plan, generate_stream, got)
        self._count(plan, "miss")
        return CacheStream("miss", self._relay(plan, first, agen, got, parser))

    async def serve(
        self,
        route: str,
        body: Mapping[str, Any],
        *,
        generate: Generate,
        generate_stream: GenerateStream,
        headers: Mapping[str, str] | None = None,
        tenant: str = "",
    ) -> CacheResult | CacheStream:
        """plan + respond/respond_stream in one call, chosen by the request's `stream` flag."""
        plan = self.plan(route, body, headers, tenant)
        if plan.stream:
            return await self.respond_stream(plan, generate_stream)
        return await self.respond(plan, generate)

    def _entry_count(self) -> int | None:
        """The store's entry count, re-read at most every `health_count_seconds` (counting may scan)."""
        now = time.monotonic()
        if self._entries is None or now - self._entries[0] >= self.health_count_seconds:
            try:
                n = int(self.store.count())
            except Exception:
                self._entries = None  # not cached: ask again on the next health check
                return None
            self._entries = (now, n)
        return self._entries[1]

    def health(self) -> dict[str, Any]:
        """Store status for a health endpoint (does not raise). Runs the store's ping (and, at most every
        `health_count_seconds`, its count) in the calling thread.

        `ok`: the store answers and nothing is wrong. `degraded`: requests pass through (the last store call
        failed, or the retry circuit is open), or the store reports corruption it has not repaired yet.
        `error`: why, if not ok. Counters since start: `corrupt_entries` (values rejected on read),
        `store_errors` (failed store calls), `store_recoveries` (corrupt files replaced)."""
        counts = {"corrupt_entries": self.stats["corrupt"], "store_errors": self.stats["store_errors"]}
        if self.store is None:
            return {
                "store": None,
                "ok": True,
                "degraded": False,
                "error": None,
                "entries": None,
                **counts,
                "store_recoveries": 0,
                "moved_aside": None,
            }
        error = None
        try:
            self.store.ping()
        except Exception as e:
            error = str(e) if isinstance(e, ResponseCacheError) else f"{type(e).__name__}: {e}"
        status = self._store_status()
        circuit_open = time.monotonic() < self._store_down_until
        degraded = error is not None or self._store_failing or circuit_open or bool(status.get("degraded"))
        if degraded and error is None:
            error = self._last_store_error or status.get("last_error") or "the store reported a problem"
        return {
            "store": getattr(self.store, "description", "?"),
            "ok": not degraded,
            "degraded": degraded,
            "error": error,
            "entries": self._entry_count(),
            **counts,
            "store_recoveries": int(status.get("recoveries") or 0),
            "moved_aside": status.get("moved_aside"),
        }
