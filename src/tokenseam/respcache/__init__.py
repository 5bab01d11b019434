"""Exact-match response cache: canonical fingerprints, stores, single-flight policy, SSE replay, gateway.

Every cache read and write goes through `fingerprint_request`; every generated request through `canonicalize_request`.
"""

from .canonical import (
    DEFAULTS,
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_LLAMA,
    ROUTES,
    canonical_text,
    canonicalize_request,
    fingerprint_canonical,
    fingerprint_request,
    is_deterministic,
    tenant_from_api_key,
)
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
from .stores import CacheStore, MemoryStore, RedisStore, SQLiteStore, open_store

__all__ = [
    "CACHE_HEADER", "DEFAULTS", "ROUTES", "ROUTE_CHAT", "ROUTE_COMPLETIONS", "ROUTE_LLAMA",
    "CachePlan", "CacheRequestError", "IncompleteStreamError", "LeaderAbortedError", "CacheResult", "CacheStore", "CacheStoreError", "CacheStream",
    "MemoryStore", "RedisStore", "ResponseCache", "ResponseCacheError", "SQLiteStore",
    "canonical_text", "canonicalize_request", "entry_from_response", "entry_from_stream_events",
    "fingerprint_canonical", "fingerprint_request", "is_deterministic", "open_store", "replay_as_sse",
    "replay_chunks", "response_from_entry", "tenant_from_api_key", "uncacheable_reason",
]
