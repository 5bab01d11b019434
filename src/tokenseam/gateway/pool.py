"""The gateway's upstream replicas: health, ejection and return, in-flight slots, and the routing choice.

A `Replica` is one OpenAI-compatible server. A `Pool` holds them and answers one question per attempt: which
replica takes this request? Three policies:

- `prefix` (default): consistent hashing with bounded load. The request's routing key (its stable prefix, see
  `routing.py`) picks a point on a ring of 64 virtual nodes per replica; the first replica clockwise that is
  not full takes it. Requests sharing a prefix land where its KV is; a hot prefix spills to the next replica
  on the ring (always the same one, so the spilled requests find their KV there too) instead of piling up.
  A replica is full when taking the request would lift its share of the recent assignments above
  `load_factor` times the mean share (the assignments decay with a half-life of `share_half_life` requests;
  no bound below `SHARE_FLOOR` of them),
  or its requests in flight above twice that factor times the mean in flight (a slow replica whose requests
  pile up). The bound is on the share, not on the momentary in-flight count: at low concurrency in-flight
  counts are noise, and a bound on them moves keys back and forth between replicas, each move a cold
  prefill, while the work each replica gets is what must stay even.
- `least-loaded`: the replica with the fewest requests in flight.
- `round-robin`: each replica in turn.

A replica is ejected after `fail_threshold` consecutive failures (failed health probes, unreachable
connections, 502/503/504 answers) or at once when its port refuses connections, and returns on its first
successful probe; what kind of server it is (and whether it heals) is detected again then. Each replica has a cap on requests in flight; when every healthy replica is at its cap, a
request waits up to `queue_timeout` seconds for a slot. `NoReplica` (503 with Retry-After) is raised only
when no replica can serve.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import math
import time
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from ..httpkit import redact_url
from ..metrics import metrics_for
from ..respcache import ResponseCacheError

log = logging.getLogger("tokenseam.gateway")

ROUTING = ("prefix", "least-loaded", "round-robin")
VIRTUAL_NODES = 64
SHARE_HALF_LIFE = 256  # assignments
# A replica's share is not bounded below this many (decayed) requests: a handful of requests says nothing about
# balance, and spilling on them would scatter every key of a fresh gateway over the replicas.
SHARE_FLOOR = 8
WARM_KEYS = 32768  # routing keys whose replicas the pool remembers
# What an upstream's /v1/models says in `owned_by`, mapped to the request dialects the gateway knows.
KINDS = ("vllm", "sglang", "llama-server", "tokenseam", "openai")
OWNED_BY = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llama-server", "tokenseam": "tokenseam"}


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


@dataclass(eq=False)
class Replica:
    """One upstream server and what the gateway knows of it now."""

    url: str  # as configured (may hold credentials: never shown)
    name: str = ""  # shown in headers, metrics and /health (default: host:port)
    max_in_flight: int = 128
    kind: str | None = None  # None: detected from /v1/models
    health_path: str = "/health"
    target: str = field(init=False)
    query: str = field(init=False)
    basic: str | None = field(init=False)
    shown: str = field(init=False)  # the redacted URL
    configured_kind: str | None = field(init=False)
    scheme: str = field(init=False)
    host: str = field(init=False)
    port: int = field(init=False)
    base_path: str = field(init=False)
    in_flight: int = 0
    healthy: bool = True
    failures: int = 0  # consecutive
    last_error: str = ""
    detected: bool = False  # kind and capabilities read from the upstream
    healing: bool | None = None  # the vLLM healing processor answers (None: not probed)
    prompt_tokens: int = 0  # reported in usage, for the cached-token ratio in /health
    cached_tokens: int = 0

    def __post_init__(self) -> None:
        base, self.query = upstream_base_and_query(self.url)
        self.target, self.basic = _without_userinfo(base)
        self.shown = redact_url(base + ("?" + self.query if self.query else ""))
        parts = urlsplit(self.target)
        self.scheme, self.host, self.base_path = parts.scheme, parts.hostname or "", parts.path
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        if not self.name:
            self.name = urlsplit(self.target).netloc
        self.configured_kind = self.kind
        if self.kind is not None and self.kind not in KINDS:
            raise ResponseCacheError(
                f"upstream {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}"
            )
        if not 1 <= self.max_in_flight <= 100_000:
            raise ResponseCacheError(f"upstream {self.name}: max_in_flight must be between 1 and 100000")

    def url_for(self, route: str) -> str:
        return self.target + route + ("?" + self.query if self.query else "")

    def path_for(self, route: str) -> str:
        return self.base_path + route + ("?" + self.query if self.query else "")

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.shown,
            "healthy": self.healthy,
            "kind": self.kind,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "consecutive_failures": self.failures,
            "last_error": self.last_error,
            "healing": self.healing,
            "cached_token_ratio": round(self.cached_tokens / self.prompt_tokens, 4)
            if self.prompt_tokens
            else None,
        }


class NoReplica(Exception):
    """No replica can take the request: 503 with Retry-After."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = max(1, math.ceil(retry_after))


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class _Metrics:
    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        labels = ["replica"]
        self.requests = Counter(
            "tokenseam_gateway_upstream_requests",
            "Attempts sent to each replica, by outcome (ok, error: 5xx/unreachable/timeout, busy: 429, "
            "client_error: other 4xx)",
            [*labels, "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            "tokenseam_gateway_upstream_latency_seconds",
            "Time from sending a request to a replica to its full answer (streams: to the last event)",
            labels,
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.in_flight = Gauge(
            "tokenseam_gateway_upstream_in_flight",
            "Requests in flight at each replica",
            labels,
            registry=registry,
        )
        self.healthy = Gauge(
            "tokenseam_gateway_upstream_healthy",
            "1 while a replica is in rotation",
            labels,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "tokenseam_gateway_upstream_prompt_tokens",
            "Prompt tokens each replica reported in usage",
            labels,
            registry=registry,
        )
        self.cached_tokens = Counter(
            "tokenseam_gateway_upstream_cached_tokens",
            "Prompt tokens each replica reported served from its prefix cache (usage.prompt_tokens_details)",
            labels,
            registry=registry,
        )
        self.routes = Counter(
            "tokenseam_gateway_routes",
            "Routing decisions: prefix (the key's home replica), spill (home at its bound), least-loaded, "
            "round-robin, retry (another replica after a failure), panic (no healthy replica left: an ejected one)",
            ["reason"],
            registry=registry,
        )


class Pool:
    """The replicas behind one gateway and the routing policy (see the module docstring)."""

    def __init__(
        self,
        replicas: Sequence[Replica],
        *,
        routing: str = "prefix",
        load_factor: float = 1.25,
        fail_threshold: int = 2,
        health_interval: float = 5.0,
        queue_timeout: float = 10.0,
        share_half_life: float = SHARE_HALF_LIFE,
        registry: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not replicas:
            raise ResponseCacheError("the gateway needs at least one upstream")
        names = [r.name for r in replicas]
        if len(set(names)) != len(names):
            raise ResponseCacheError(f"upstream names must differ (got {', '.join(names)})")
        if routing not in ROUTING:
            raise ResponseCacheError(f"routing {routing!r} is not one of {', '.join(ROUTING)}")
        if not 1.0 <= load_factor <= 10.0:
            raise ResponseCacheError("load_factor must be between 1.0 and 10.0")
        self.replicas = list(replicas)
        self.routing = routing
        self.load_factor = load_factor
        self.fail_threshold = max(1, fail_threshold)
        self.health_interval = health_interval
        self.queue_timeout = queue_timeout
        self._clock = clock
        self._ring = sorted(
            (_point(f"{r.name}#{v}"), i) for i, r in enumerate(self.replicas) for v in range(VIRTUAL_NODES)
        )
        self._points = [p for p, _ in self._ring]
        if not share_half_life > 0:
            raise ResponseCacheError("share_half_life must be positive")
        self._decay = 0.5 ** (1.0 / share_half_life)
        self._share = {r: 0.0 for r in self.replicas}  # recent assignments, decayed
        self._index = {r: i for i, r in enumerate(self.replicas)}
        # Which replicas served each recent key (a bit per replica), so a spill goes where the KV is already.
        self._warm: OrderedDict[int, int] = OrderedDict()
        self._turn = 0
        self._freed: asyncio.Event | None = None
        self.metrics = metrics_for(registry, _Metrics) if registry is not None else None
        self._children: dict[tuple[str, ...], Any] = {}
        for r in self.replicas:
            self._gauge(r)

    # -- the choice ------------------------------------------------------------------------------------------

    def _eligible(self, tried: set[Replica]) -> tuple[list[Replica], bool]:
        """(replicas this attempt may use, panic). With no healthy replica left untried, the ejected ones are
        tried too: a request fails only when every replica has failed it."""
        left = [r for r in self.replicas if r not in tried]
        healthy = [r for r in left if r.healthy]
        return (healthy, False) if healthy else (left, True)

    def pick(self, key: bytes | None, tried: set[Replica] = frozenset()) -> tuple[Replica, str] | None:  # type: ignore[assignment]
        """(replica, reason) for one attempt, or None when every eligible replica is at its in-flight cap."""
        eligible, panic = self._eligible(tried)
        open_ = [r for r in eligible if r.in_flight < r.max_in_flight]
        if not open_:
            return None
        retry = "panic" if panic else "retry" if tried else None
        if self.routing == "prefix" and key is not None:
            n = len(eligible)
            share_bound = max(
                SHARE_FLOOR, math.ceil(self.load_factor * (sum(self._share[r] for r in eligible) + 1) / n)
            )
            flight_bound = math.ceil(2 * self.load_factor * (sum(r.in_flight for r in eligible) + 1) / n)
            point = _point_bytes(key)
            start = bisect_left(self._points, point) % len(self._ring)
            warm = self._warm.get(point, 0)
            home, order, fits = None, [], []
            for k in range(len(self._ring)):
                r = self.replicas[self._ring[(start + k) % len(self._ring)][1]]
                if r not in eligible:
                    continue
                if home is None:
                    home = r
                if r in open_ and r not in order:
                    order.append(r)
                    if self._share[r] + 1 <= share_bound and r.in_flight < flight_bound:
                        if r is home or warm >> self._index[r] & 1:
                            return r, retry or ("prefix" if r is home else "spill")
                        fits.append(r)
                    if len(order) == len(open_):
                        break
            if fits:  # no replica that served this key recently has room: the next one on the ring
                return fits[0], retry or "spill"
            # Every open replica is at a bound (while the shares are small, or with caps): the one with the
            # smallest share, ties in the key's ring order.
            r = min(order, key=lambda r: (self._share[r], order.index(r)))
            return r, retry or ("prefix" if r is home else "spill")
        if self.routing == "round-robin":
            for _ in range(len(self.replicas)):
                r = self.replicas[self._turn % len(self.replicas)]
                self._turn += 1
                if r in open_:
                    return r, retry or "round-robin"
        least = min(open_, key=lambda r: (r.in_flight, self._tiebreak(r)))
        self._turn += 1
        return least, retry or "least-loaded"

    def _tiebreak(self, r: Replica) -> int:
        # Rotate ties so an idle pool does not send everything to the first replica.
        return (self.replicas.index(r) - self._turn) % len(self.replicas)

    def _served(self, key: bytes, replica: Replica) -> None:
        point = _point_bytes(key)
        self._warm[point] = self._warm.pop(point, 0) | 1 << self._index[replica]
        if len(self._warm) > WARM_KEYS:
            self._warm.popitem(last=False)

    async def acquire(self, key: bytes | None, tried: set[Replica]) -> tuple[Replica, str]:
        """Take a slot on a replica (wait for one up to `queue_timeout`); release it with `release`."""
        deadline = self._clock() + self.queue_timeout
        while True:
            if not self._eligible(tried)[0]:
                raise NoReplica(
                    "every upstream replica failed this request ("
                    + "; ".join(f"{r.name}: {r.last_error or 'failed'}" for r in self.replicas)
                    + ")",
                    self.health_interval,
                )
            choice = self.pick(key, tried)
            if choice is not None:
                replica, reason = choice
                replica.in_flight += 1
                for r in self._share:
                    self._share[r] *= self._decay
                self._share[replica] += 1
                if key is not None and self.routing == "prefix":
                    self._served(key, replica)
                self._gauge(replica)
                if self.metrics:
                    self._m("routes", reason).inc()
                return replica, reason
            left = deadline - self._clock()
            if left <= 0:
                raise NoReplica(
                    f"every healthy upstream replica is at its in-flight limit (waited {self.queue_timeout:g} s)",
                    1,
                )
            if self._freed is None:
                self._freed = asyncio.Event()
            self._freed.clear()
            try:
                await asyncio.wait_for(self._freed.wait(), min(left, 0.5))
            except TimeoutError:
                pass

    def release(self, replica: Replica) -> None:
        replica.in_flight = max(0, replica.in_flight - 1)
        self._gauge(replica)
        if self._freed is not None:
            self._freed.set()

    # -- what happened ---------------------------------------------------------------------------------------

    def succeeded(self, replica: Replica, seconds: float, usage: Any = None) -> None:
        replica.failures = 0
        if self.metrics:
            self._m("requests", replica.name, "ok").inc()
            self._m("latency", replica.name).observe(seconds)
        self.count_usage(replica, usage)

    def count_usage(self, replica: Replica, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        prompt = usage.get("prompt_tokens")
        if not isinstance(prompt, int) or isinstance(prompt, bool) or prompt < 0:
            return
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if not isinstance(cached, int) or isinstance(cached, bool) or not 0 <= cached <= prompt:
            cached = 0
        replica.prompt_tokens += prompt
        replica.cached_tokens += cached
        if self.metrics:
            self._m("prompt_tokens", replica.name).inc(prompt)
            self._m("cached_tokens", replica.name).inc(cached)

    def busy(self, replica: Replica) -> None:
        # A 429: the replica is up but will not take more now. Tried elsewhere, never a reason to eject.
        if self.metrics:
            self._m("requests", replica.name, "busy").inc()

    def client_error(self, replica: Replica) -> None:
        # A 4xx is the request's fault, not the replica's: it proves the replica is up.
        replica.failures = 0
        if self.metrics:
            self._m("requests", replica.name, "client_error").inc()

    def failed(self, replica: Replica, why: str, *, refused: bool = False) -> None:
        """Count a failure; eject after `fail_threshold` in a row, or at once when the port refused."""
        replica.failures += 1
        replica.last_error = why
        if self.metrics:
            self._m("requests", replica.name, "error").inc()
        if replica.healthy and (refused or replica.failures >= self.fail_threshold):
            replica.healthy = False
            log.warning("upstream %s is out of rotation: %s", replica.name, why)
            self._gauge(replica)

    def recovered(self, replica: Replica) -> None:
        replica.failures = 0
        if not replica.healthy:
            replica.healthy = True
            # What comes back on that address may be another build (a vLLM restarted without the healing
            # processor, another server): it is asked again before its next request.
            replica.detected, replica.kind, replica.healing = False, replica.configured_kind, None
            log.warning("upstream %s is back in rotation", replica.name)
            self._gauge(replica)
            if self._freed is not None:
                self._freed.set()

    def _m(self, metric: str, *labels: str) -> Any:
        """The labelled child of a metric, looked up once (prometheus_client's labels() costs per call)."""
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = getattr(self.metrics, metric).labels(*labels)
        return child

    def _gauge(self, r: Replica) -> None:
        if self.metrics:
            self._m("in_flight", r.name).set(r.in_flight)
            self._m("healthy", r.name).set(1 if r.healthy else 0)

    def status(self) -> list[dict[str, Any]]:
        return [r.status() for r in self.replicas]


def _point_bytes(key: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
