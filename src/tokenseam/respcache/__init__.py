"""Exact-match response cache: request fingerprints, stores, single-flight policy, SSE replay (the gateway app
that puts it in front of any OpenAI-compatible server is `tokenseam.gateway`).

Every cache read and write goes through `fingerprint_request`; every generated request through `normalize_request`.
"""

from ..wire import DEFAULTS, ROUTE_CHAT, ROUTE_COMPLETIONS, ROUTE_LLAMA, ROUTES
from .entry import (
    IncompleteStreamError,
    entry_from_response,
    entry_from_stream_events,
    replay_as_sse,
    replay_chunks,
    response_from_entry,
    uncacheable_reason,
)
from .errors import CacheRequestError, CacheStoreError, ResponseCacheError
from .policy import CACHE_HEADER, CachePlan, CacheResult, CacheStream, LeaderAbortedError, ResponseCache
from .request_form import (
    fingerprint_normalized,
    fingerprint_request,
    fingerprint_text,
    is_deterministic,
    normalize_request,
    tenant_from_api_key,
)
from .stores import CacheStore, MemoryStore, RedisStore, SQLiteStore, open_store

__all__ = [
    "CACHE_HEADER",
    "DEFAULTS",
    "ROUTES",
    "ROUTE_CHAT",
    "ROUTE_COMPLETIONS",
    "ROUTE_LLAMA",
    "CachePlan",
    "CacheRequestError",
    "IncompleteStreamError",
    "LeaderAbortedError",
    "CacheResult",
    "CacheStore",
    "CacheStoreError",
    "CacheStream",
    "MemoryStore",
    "RedisStore",
    "ResponseCache",
    "ResponseCacheError",
    "SQLiteStore",
    "entry_from_response",
    "entry_from_stream_events",
    "fingerprint_normalized",
    "fingerprint_request",
    "fingerprint_text",
    "is_deterministic",
    "normalize_request",
    "open_store",
    "replay_as_sse",
    "replay_chunks",
    "response_from_entry",
    "tenant_from_api_key",
    "uncacheable_reason",
]
