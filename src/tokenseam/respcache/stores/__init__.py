"""Response-cache stores behind one small interface (`CacheStore`): SQLite (default), Redis, in-memory LRU.

Values are stored sealed (format tag and SHA-256, checked on every read: `base`). Every failure surfaces as
`CacheStoreError`; TTL and size limits are per store. `open_store` turns a spec string into a store.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import CacheStoreError
from .base import CORRUPT_REASONS, CacheStore
from .memory import MemoryStore
from .redis_store import RedisStore, redact_url
from .sqlite_store import SQLiteStore

__all__ = [
    "CORRUPT_REASONS",
    "CacheStore",
    "MemoryStore",
    "RedisStore",
    "SQLiteStore",
    "default_sqlite_path",
    "open_store",
]


def default_sqlite_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tokenseam" / "respcache.sqlite"


def open_store(
    spec: str,
    *,
    max_entries: int | None = None,
    max_bytes: int | None = None,
    default_ttl: float | None = None,
) -> CacheStore:
    """A store from a spec: `sqlite:PATH`, `sqlite` (default path), `redis://HOST:PORT/DB`, `memory`."""
    spec = spec.strip()
    if spec in ("sqlite", "sqlite:"):
        return SQLiteStore(default_sqlite_path(), max_entries, max_bytes, default_ttl)
    if spec.startswith("sqlite:"):
        return SQLiteStore(spec[len("sqlite:") :], max_entries, max_bytes, default_ttl)
    if spec.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(spec, max_entries=max_entries, default_ttl=default_ttl)
    if spec == "memory":
        return MemoryStore(max_entries if max_entries is not None else 10_000, max_bytes, default_ttl)
    raise CacheStoreError(
        f"unknown cache store {redact_url(spec)!r}: use sqlite:PATH, redis://HOST:PORT/DB or memory"
    )
