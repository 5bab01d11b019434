"""Response-cache stores behind one small interface: SQLite (default), Redis, in-memory LRU.

Values are JSON objects only (never pickle); every failure surfaces as `CacheStoreError`; TTL and size limits are per store.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .errors import CacheStoreError

log = logging.getLogger(__name__)


@runtime_checkable
class CacheStore(Protocol):
    """A key -> JSON-object store. `blocking` says whether calls may block (the cache runs them in a thread)."""

    blocking: bool
    description: str

    def get(self, key: str) -> dict[str, Any] | None: ...
    def put(self, key: str, value: dict[str, Any], ttl_seconds: float | None = None) -> None: ...
    def delete(self, key: str) -> None: ...
    def count(self) -> int: ...
    def clear(self) -> None: ...
    def ping(self) -> None: ...
    def close(self) -> None: ...


def encode_value(value: dict[str, Any]) -> str:
    if not isinstance(value, dict):
        raise CacheStoreError(f"cache values must be JSON objects, got {type(value).__name__}")
    try:
        # ASCII escapes: a lone surrogate (legal in JSON text, illegal in UTF-8) must not break a store.
        return json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise CacheStoreError(f"cache value is not JSON-serialisable: {e}") from e


def decode_value(raw: str | bytes) -> dict[str, Any] | None:
    """The stored object, or None when the stored bytes are not a JSON object (a corrupt entry)."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


class MemoryStore:
    """In-process LRU with TTL; limits on entry count and total JSON bytes. Not shared across processes."""

    blocking = False

    def __init__(self, max_entries: int | None = 10_000, max_bytes: int | None = None,
                 default_ttl: float | None = None) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.default_ttl = default_ttl
        self.description = f"memory (max_entries={max_entries})"
        self._data: OrderedDict[str, tuple[str, float | None]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.corrupt = 0

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            item = self._data.get(key)
            if item is None:
                return None
            raw, expires = item
            if expires is not None and expires <= time.time():
                self._remove(key)
                return None
            self._data.move_to_end(key)
        value = decode_value(raw)
        if value is None:
            self.corrupt += 1
            self.delete(key)
        return value

    def put(self, key: str, value: dict[str, Any], ttl_seconds: float | None = None) -> None:
        raw = encode_value(value)
        ttl = ttl_seconds if ttl_seconds is not None else self.default_ttl
        with self._lock:
            self._remove(key)
            self._data[key] = (raw, time.time() + ttl if ttl is not None else None)
            self._bytes += len(raw)
            while self._data and ((self.max_entries is not None and len(self._data) > self.max_entries)
                                  or (self.max_bytes is not None and self._bytes > self.max_bytes)):
                self._remove(next(iter(self._data)))

    def put_raw(self, key: str, raw: str) -> None:
        """Store raw text as if it were an encoded value (tests use it to plant corrupt entries)."""
        with self._lock:
            self._remove(key)
            self._data[key] = (raw, None)
            self._bytes += len(raw)

    def _remove(self, key: str) -> None:
        item = self._data.pop(key, None)
        if item is not None:
            self._bytes -= len(item[0])

    def delete(self, key: str) -> None:
        with self._lock:
            self._remove(key)

    def count(self) -> int:
        with self._lock:
            now = time.time()
            return sum(1 for _, exp in self._data.values() if exp is None or exp > now)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._bytes = 0

    def ping(self) -> None:
        return None

    def close(self) -> None:
        return None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    size INTEGER NOT NULL,
    expires_at REAL,
    accessed_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_accessed ON entries (accessed_at);
"""


class SQLiteStore:
    """One SQLite file in WAL mode: safe with several threads and processes (busy timeout, immediate writes).

    Eviction is least-recently-used by `accessed_at`, which a read refreshes at most every `touch_seconds`
    (so hits do not turn into writes). Expired rows are invisible at once and deleted lazily.
    """

    blocking = True

    def __init__(self, path: str | os.PathLike[str], max_entries: int | None = None, max_bytes: int | None = None,
                 default_ttl: float | None = None, busy_timeout_ms: int = 10_000, touch_seconds: float = 60.0) -> None:
        self.path = Path(path)
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.default_ttl = default_ttl
        self.busy_timeout_ms = busy_timeout_ms
        self.touch_seconds = touch_seconds
        self.description = f"sqlite:{self.path}"
        self.corrupt = 0
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CacheStoreError(f"cannot create the directory for the SQLite cache {self.path}: {e}") from e
        conn = self._conn()
        self._run(lambda: conn.executescript(_SCHEMA))

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.path, timeout=self.busy_timeout_ms / 1000, isolation_level=None,
                                       check_same_thread=False)
                conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    log.warning("SQLite cache %s could not switch to WAL (mode %s)", self.path, mode)
                conn.execute("PRAGMA synchronous=NORMAL")
            except sqlite3.Error as e:
                raise CacheStoreError(f"cannot open the SQLite cache {self.path}: {e}") from e
            self._local.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    def _run(self, fn: Any) -> Any:
        try:
            return fn()
        except (sqlite3.DatabaseError, UnicodeError) as e:
            raise CacheStoreError(f"SQLite cache {self.path} failed: {e}") from e

    def get(self, key: str) -> dict[str, Any] | None:
        conn = self._conn()
        now = time.time()
        row = self._run(lambda: conn.execute(
            "SELECT value, expires_at, accessed_at FROM entries WHERE key = ?", (key,)).fetchone())
        if row is None:
            return None
        raw, expires, accessed = row
        if expires is not None and expires <= now:
            self._run(lambda: conn.execute("DELETE FROM entries WHERE key = ? AND expires_at <= ?", (key, now)))
            return None
        value = decode_value(raw)
        if value is None:
            self.corrupt += 1
            log.warning("corrupt entry %s in %s removed", key[:16], self.path)
            self.delete(key)
            return None
        if now - accessed > self.touch_seconds:
            self._run(lambda: conn.execute("UPDATE entries SET accessed_at = ? WHERE key = ?", (now, key)))
        return value

    def put(self, key: str, value: dict[str, Any], ttl_seconds: float | None = None) -> None:
        self.put_raw(key, encode_value(value), ttl_seconds)

    def put_raw(self, key: str, raw: str | bytes, ttl_seconds: float | None = None) -> None:
        conn = self._conn()
        ttl = ttl_seconds if ttl_seconds is not None else self.default_ttl
        now = time.time()

        def write() -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("INSERT OR REPLACE INTO entries (key, value, size, expires_at, accessed_at) "
                             "VALUES (?, ?, ?, ?, ?)", (key, raw, len(raw), now + ttl if ttl is not None else None, now))
                self._evict(conn, now)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        self._run(write)

    def _evict(self, conn: sqlite3.Connection, now: float) -> None:
        if self.max_entries is None and self.max_bytes is None:
            return
        conn.execute("DELETE FROM entries WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,))
        if self.max_entries is not None:
            (n,) = conn.execute("SELECT COUNT(*) FROM entries").fetchone()
            if n > self.max_entries:
                conn.execute("DELETE FROM entries WHERE key IN (SELECT key FROM entries ORDER BY accessed_at ASC "
                             "LIMIT ?)", (n - self.max_entries,))
        if self.max_bytes is not None:
            (total,) = conn.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()
            while total > self.max_bytes:
                row = conn.execute("SELECT key, size FROM entries ORDER BY accessed_at ASC LIMIT 1").fetchone()
                if row is None:
                    break
                conn.execute("DELETE FROM entries WHERE key = ?", (row[0],))
                total -= row[1]

    def delete(self, key: str) -> None:
        conn = self._conn()
        self._run(lambda: conn.execute("DELETE FROM entries WHERE key = ?", (key,)))

    def count(self) -> int:
        conn = self._conn()
        now = time.time()
        return self._run(lambda: conn.execute(
            "SELECT COUNT(*) FROM entries WHERE expires_at IS NULL OR expires_at > ?", (now,)).fetchone()[0])

    def clear(self) -> None:
        conn = self._conn()
        self._run(lambda: conn.execute("DELETE FROM entries"))

    def ping(self) -> None:
        conn = self._conn()
        self._run(lambda: conn.execute("SELECT 1").fetchone())

    def close(self) -> None:
        with self._conns_lock:
            for conn in self._conns:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            self._conns.clear()
        self._local = threading.local()


class RedisStore:
    """Redis store shared across replicas: one string key per entry (SET with EX for TTL) and a sorted-set
    index by write time that enforces `max_entries` (oldest first). For a byte budget, configure Redis
    itself (`maxmemory` + `maxmemory-policy allkeys-lru`)."""

    blocking = True

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", prefix: str = "tokenseam:rc:",
                 max_entries: int | None = None, default_ttl: float | None = None,
                 socket_timeout: float = 1.0, connect_timeout: float = 0.5) -> None:
        import redis

        self.url = url
        self.prefix = prefix
        self.max_entries = max_entries
        self.default_ttl = default_ttl
        self.description = f"redis:{url}"
        self.corrupt = 0
        self._redis_mod = redis
        try:
            self._r = redis.Redis.from_url(url, socket_timeout=socket_timeout,
                                           socket_connect_timeout=connect_timeout, decode_responses=False)
        except (ValueError, redis.RedisError) as e:
            raise CacheStoreError(f"bad Redis URL {url!r}: {e}") from e
        self._index = prefix + "index"

    def _key(self, key: str) -> str:
        return self.prefix + "e:" + key

    def _run(self, fn: Any) -> Any:
        try:
            return fn()
        except self._redis_mod.RedisError as e:
            raise CacheStoreError(f"Redis cache {self.url} failed: {e}") from e

    def get(self, key: str) -> dict[str, Any] | None:
        raw = self._run(lambda: self._r.get(self._key(key)))
        if raw is None:
            return None
        value = decode_value(raw)
        if value is None:
            self.corrupt += 1
            log.warning("corrupt entry %s in %s removed", key[:16], self.url)
            self.delete(key)
        return value

    def put(self, key: str, value: dict[str, Any], ttl_seconds: float | None = None) -> None:
        self.put_raw(key, encode_value(value), ttl_seconds)

    def put_raw(self, key: str, raw: str, ttl_seconds: float | None = None) -> None:
        ttl = ttl_seconds if ttl_seconds is not None else self.default_ttl
        now = time.time()

        def write() -> None:
            pipe = self._r.pipeline(transaction=True)
            if ttl is not None:
                pipe.set(self._key(key), raw.encode("utf-8"), px=max(1, int(ttl * 1000)))
            else:
                pipe.set(self._key(key), raw.encode("utf-8"))
            if self.max_entries is not None:
                pipe.zadd(self._index, {key: now})
            pipe.execute()
            if self.max_entries is not None:
                n = self._r.zcard(self._index)
                if n > self.max_entries:
                    for member, _ in self._r.zpopmin(self._index, n - self.max_entries):
                        self._r.delete(self._key(member.decode()))

        self._run(write)

    def delete(self, key: str) -> None:
        self._run(lambda: (self._r.delete(self._key(key)), self._r.zrem(self._index, key)))

    def count(self) -> int:
        def scan() -> int:
            return sum(1 for _ in self._r.scan_iter(match=self.prefix + "e:*", count=1000))
        return self._run(scan)

    def clear(self) -> None:
        def wipe() -> None:
            keys = list(self._r.scan_iter(match=self.prefix + "*", count=1000))
            for i in range(0, len(keys), 500):
                self._r.delete(*keys[i:i + 500])
        self._run(wipe)

    def ping(self) -> None:
        self._run(self._r.ping)

    def close(self) -> None:
        try:
            self._r.close()
        except self._redis_mod.RedisError:
            pass


def default_sqlite_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tokenseam" / "respcache.sqlite"


def open_store(spec: str, *, max_entries: int | None = None, max_bytes: int | None = None,
               default_ttl: float | None = None) -> CacheStore:
    """A store from a spec: `sqlite:PATH`, `sqlite` (default path), `redis://HOST:PORT/DB`, `memory`."""
    spec = spec.strip()
    if spec in ("sqlite", "sqlite:"):
        return SQLiteStore(default_sqlite_path(), max_entries, max_bytes, default_ttl)
    if spec.startswith("sqlite:"):
        return SQLiteStore(spec[len("sqlite:"):], max_entries, max_bytes, default_ttl)
    if spec.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(spec, max_entries=max_entries, default_ttl=default_ttl)
    if spec == "memory":
        return MemoryStore(max_entries if max_entries is not None else 10_000, max_bytes, default_ttl)
    raise CacheStoreError(f"unknown cache store {spec!r}: use sqlite:PATH, redis://HOST:PORT/DB or memory")
