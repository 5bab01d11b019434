"""Response-cache stores behind one small interface: SQLite (default), Redis, in-memory LRU.

Values are JSON objects only (never pickle), stored sealed: a format tag and the SHA-256 of the value's JSON
text, checked on every read. A value that fails the check is counted as corrupt, deleted and read as a miss.
Every failure surfaces as `CacheStoreError`; TTL and size limits are per store. A SQLite file that is not a
database or fails its checks is moved aside and replaced by an empty one, at start or after repeated
corruption errors while running. Descriptions and error messages never carry a Redis password.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import unquote

from .errors import CacheStoreError, CacheValueError

try:
    import fcntl
except ImportError:  # not on POSIX: start-up and recovery are then not serialised between processes
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

STORE_FORMAT = "tokenseam-store/1"
# The stored text is exactly _SEAL_HEAD + 64 hex digits + _SEAL_MID + payload + "}": a JSON object an operator
# can read with any tool, whose checksum is verified on the payload's own bytes (no re-serialising per hit).
_SEAL_HEAD = '{"format":"' + STORE_FORMAT + '","sha256":"'
_SEAL_MID = '","value":'
_PAYLOAD_AT = len(_SEAL_HEAD) + 64 + len(_SEAL_MID)
DEFAULT_MAX_VALUE_BYTES = 64 * 1024 * 1024
# Why a stored value was rejected (the `reason` label of the corrupt-entry counter).
CORRUPT_REASONS = ("undecodable", "unsealed", "checksum", "not_object", "too_large")


@runtime_checkable
class CacheStore(Protocol):
    """A key -> JSON-object store. `blocking` says whether calls may block (the cache runs them in a thread).

    The built-in stores also have `status()` (counters and state for a health endpoint) and
    `add_listener(fn)` (told about corrupt values and recoveries); the cache uses them when present."""

    blocking: bool
    description: str

    def get(self, key: str) -> dict[str, Any] | None: ...
    def put(self, key: str, value: dict[str, Any], ttl_seconds: float | None = None) -> None: ...
    def delete(self, key: str) -> None: ...
    def count(self) -> int: ...
    def clear(self) -> None: ...
    def ping(self) -> None: ...
    def close(self) -> None: ...


# ---------------------------------------------------------------- sealed values

def encode_value(value: dict[str, Any], max_bytes: int | None = None) -> str:
    """The sealed text for `value` (ASCII only). Raises `CacheValueError` for a value that cannot be stored."""
    if not isinstance(value, dict):
        raise CacheValueError(f"cache values must be JSON objects, got {type(value).__name__}")
    try:
        # ASCII escapes: a lone surrogate (legal in JSON text, illegal in UTF-8) must not break a store.
        payload = json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise CacheValueError(f"cache value is not JSON-serialisable: {type(e).__name__}: {e}") from e
    raw = _SEAL_HEAD + hashlib.sha256(payload.encode("ascii")).hexdigest() + _SEAL_MID + payload + "}"
    if max_bytes is not None and len(raw) > max_bytes:
        raise CacheValueError(f"cache value is {len(raw)} bytes, over the store's limit of {max_bytes}")
    return raw


def check_value(raw: Any, max_bytes: int | None = DEFAULT_MAX_VALUE_BYTES) -> tuple[dict[str, Any] | None, str | None]:
    """(value, None) for an intact sealed value, else (None, reason) with a reason from `CORRUPT_REASONS`.

    Values written before sealing existed (plain JSON) are "unsealed": they are treated like any other
    corrupt value, since nothing shows they are what was stored."""
    if max_bytes is not None and isinstance(raw, str | bytes | bytearray | memoryview) and len(raw) > max_bytes:
        return None, "too_large"
    if isinstance(raw, bytes | bytearray | memoryview):
        try:
            raw = bytes(raw).decode("ascii")
        except UnicodeDecodeError:
            return None, "undecodable"
    elif not isinstance(raw, str):
        return None, "undecodable"
    if (len(raw) <= _PAYLOAD_AT or not raw.startswith(_SEAL_HEAD) or not raw.endswith("}")
            or raw[_PAYLOAD_AT - len(_SEAL_MID):_PAYLOAD_AT] != _SEAL_MID):
        return None, "unsealed"
    payload = raw[_PAYLOAD_AT:-1]
    try:
        data = payload.encode("ascii")
    except UnicodeEncodeError:
        return None, "undecodable"
    if hashlib.sha256(data).hexdigest() != raw[len(_SEAL_HEAD):len(_SEAL_HEAD) + 64]:
        return None, "checksum"
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):
        return None, "undecodable"
    if not isinstance(value, dict):
        return None, "not_object"
    return value, None


def decode_value(raw: str | bytes) -> dict[str, Any] | None:
    """The stored object, or None when the stored text is not an intact sealed JSON object (a corrupt entry)."""
    return check_value(raw, None)[0]


# ---------------------------------------------------------------- counters shared by every store

class _StoreState:
    """Counters every built-in store keeps for `status()`, and the listeners told about corrupt values."""

    description: str

    def _init_state(self) -> None:
        self.corrupt = 0  # corrupt values found (and removed) on read
        self.errors = 0  # operations that failed
        self.recoveries = 0  # corrupt databases moved aside and replaced
        self.last_error: str | None = None
        self._failing = False
        self._state_lock = threading.Lock()
        self._listeners: list[Callable[[], Any]] = []

    def add_listener(self, fn: Callable[[str, str], None]) -> None:
        """Call `fn(event, detail)` for `("corrupt", reason)` on every corrupt value removed and
        `("recovered", problem)` every time a corrupt database is replaced; from whichever thread saw it.
        A bound method is held weakly, so a listening cache can still be garbage-collected."""
        ref: Callable[[], Any] = weakref.WeakMethod(fn) if hasattr(fn, "__self__") else (lambda: fn)  # type: ignore[arg-type]
        with self._state_lock:
            self._listeners.append(ref)

    def _emit(self, event: str, detail: str) -> None:
        with self._state_lock:
            refs = list(self._listeners)
        for ref in refs:
            fn = ref()
            if fn is None:
                with self._state_lock, contextlib.suppress(ValueError):
                    self._listeners.remove(ref)
                continue
            try:
                fn(event, detail)
            except Exception:  # a broken listener must not turn a read into a store failure
                log.exception("response cache store listener failed on %s", event)

    def _corrupt_value(self, key: str, reason: str) -> None:
        with self._state_lock:
            self.corrupt += 1
        log.warning("corrupt cache entry %s in %s (%s): removed, read as a miss", key[:16], self.description,
                    reason)
        self._emit("corrupt", reason)

    def _op_ok(self) -> None:
        if self._failing:
            with self._state_lock:
                self._failing = False

    def _op_failed(self, message: str) -> None:
        with self._state_lock:
            self.errors += 1
            self.last_error = message
            self._failing = True

    def _degraded(self) -> bool:
        return self._failing

    def status(self) -> dict[str, Any]:
        """Counters since this store was opened, and whether its last operation failed (`degraded`)."""
        with self._state_lock:
            return {"degraded": self._degraded(), "corrupt_entries": self.corrupt, "errors": self.errors,
                    "recoveries": self.recoveries, "last_error": self.last_error}


# ---------------------------------------------------------------- memory

class MemoryStore(_StoreState):
    """In-process LRU with TTL; limits on entry count and total JSON bytes. Not shared across processes."""

    blocking = False

    def __init__(self, max_entries: int | None = 10_000, max_bytes: int | None = None,
                 default_ttl: float | None = None, *, max_value_bytes: int | None = DEFAULT_MAX_VALUE_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.default_ttl = default_ttl
        self.max_value_bytes = max_value_bytes
        self.description = f"memory (max_entries={max_entries})"
        self._data: OrderedDict[str, tuple[str, float | None]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._init_state()

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
        value, problem = check_value(raw, self.max_value_bytes)
        if problem is not None:
            self._corrupt_value(key, problem)
            self.delete(key)
        return value

    def put(self, key: str, value: dict[str, Any], ttl_seconds: float | None = None) -> None:
        raw = encode_value(value, self.max_value_bytes)
        ttl = ttl_seconds if ttl_seconds is not None else self.default_ttl
        with self._lock:
            self._remove(key)
            self._data[key] = (raw, time.time() + ttl if ttl is not None else None)
            self._bytes += len(raw)
            while self._data and ((self.max_entries is not None and len(self._data) > self.max_entries)
                                  or (self.max_bytes is not None and self._bytes > self.max_bytes)):
                self._remove(next(iter(self._data)))

    def put_raw(self, key: str, raw: Any) -> None:
        """Store raw text as if it were an encoded value (tests use it to plant corrupt entries)."""
        with self._lock:
            self._remove(key)
            self._data[key] = (raw, None)
            self._bytes += len(raw) if hasattr(raw, "__len__") else 0

    def _remove(self, key: str) -> None:
        item = self._data.pop(key, None)
        if item is not None:
            self._bytes -= len(item[0]) if hasattr(item[0], "__len__") else 0

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


# ---------------------------------------------------------------- SQLite

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
_COLUMNS = frozenset({"key", "value", "size", "expires_at", "accessed_at"})
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26


def _is_corruption(e: sqlite3.Error) -> bool:
    """Whether SQLite says the file itself is damaged (as opposed to busy, read-only, out of space...)."""
    code = getattr(e, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    text = str(e).lower()
    return "malformed" in text or "not a database" in text


class SQLiteStore(_StoreState):
    """One SQLite file in WAL mode: safe with several threads and processes (busy timeout, immediate writes).

    Eviction is least-recently-used by `accessed_at`, which a read refreshes at most every `touch_seconds`
    (so hits do not turn into writes). Expired rows are invisible at once and deleted lazily.

    Integrity: at open, a file that is not a database or fails `PRAGMA quick_check` (skipped with
    `check_on_open=False`; it reads the whole file) is moved aside as `NAME.corrupt-<time>` (with its -wal
    and -shm) and an empty cache takes its place. While running, after `recover_after_errors` corruption
    errors from SQLite on the same file, the file is moved aside the same way and the failing operation is
    retried once on the fresh file. A process whose file was replaced by another process notices within
    `moved_check_seconds` and reopens the path. Start-up checks and recoveries hold `NAME.lock` (flock) so
    that two processes never move aside each other's fresh file.
    """

    blocking = True

    def __init__(self, path: str | os.PathLike[str], max_entries: int | None = None, max_bytes: int | None = None,
                 default_ttl: float | None = None, busy_timeout_ms: int = 10_000, touch_seconds: float = 60.0, *,
                 max_value_bytes: int | None = DEFAULT_MAX_VALUE_BYTES, check_on_open: bool = True,
                 recover_after_errors: int = 3, moved_check_seconds: float = 5.0,
                 lock_timeout: float = 120.0) -> None:
        self.path = Path(path)
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.default_ttl = default_ttl
        self.busy_timeout_ms = busy_timeout_ms
        self.touch_seconds = touch_seconds
        self.max_value_bytes = max_value_bytes
        self.check_on_open = check_on_open
        self.recover_after_errors = max(1, recover_after_errors)
        self.moved_check_seconds = moved_check_seconds
        self.lock_timeout = lock_timeout
        self.description = f"sqlite:{self.path}"
        self.moved_aside: str | None = None  # where the last corrupt file went
        self._init_state()
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._recover_lock = threading.Lock()
        # Bumped whenever the file at `path` is replaced: every thread then drops its connection and reopens.
        self._generation = 0
        self._corruption_errors = 0  # corruption errors seen on the file in use
        self._file_id: tuple[int, int] | None = None
        self._next_moved_check = 0.0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CacheStoreError(f"cannot create the directory for the SQLite cache {self.path}: {e}") from e
        with self._file_lock():
            self._check_file()
            try:
                self._use_current_file()
            except sqlite3.Error as e:
                raise CacheStoreError(f"cannot open the SQLite cache {self.path}: {e}") from e

    # ------------------------------------------------------------ opening, checking, replacing the file

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        if fcntl is None:
            yield
            return
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise CacheStoreError(f"cannot create the lock file {lock_path} for the SQLite cache: {e}") from e
        try:
            deadline = time.monotonic() + self.lock_timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    # Another process is checking or replacing the file (quick_check reads all of it).
                    if time.monotonic() > deadline:
                        raise CacheStoreError(f"another process has held {lock_path} for over "
                                              f"{self.lock_timeout:.0f}s; is it stuck?") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _stat_id(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _check_file(self) -> None:
        """Move the existing file aside if it is damaged. Raises `CacheStoreError` when it cannot be read for
        another reason, or is someone else's database (never moved aside)."""
        if not self.path.exists():
            return
        try:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_ms / 1000, isolation_level=None)
        except sqlite3.Error as e:
            raise CacheStoreError(f"cannot open the SQLite cache {self.path}: {e}") from e
        try:
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
            cols = {row[1] for row in conn.execute("PRAGMA table_info(entries)")}
            if cols and not _COLUMNS <= cols:
                raise CacheStoreError(f"{self.path} is a SQLite database but not a tokenseam response cache (its "
                                      f"`entries` table has columns {', '.join(sorted(cols))}); use another path")
            problem = None
            if self.check_on_open:
                rows = [str(r[0]) for r in conn.execute("PRAGMA quick_check(5)").fetchall()]
                if rows != ["ok"]:
                    problem = "quick_check: " + " | ".join(rows).replace("\n", " ")[:500]
        except sqlite3.DatabaseError as e:
            if not _is_corruption(e):
                conn.close()
                raise CacheStoreError(f"cannot read the SQLite cache {self.path}: {e}") from e
            problem = str(e)
        try:
            if problem is not None:
                # Moved while this connection is still open: closed first, SQLite would checkpoint the log into
                # the damaged file and delete it, losing what an inspection needs. Once the file has moved,
                # SQLite leaves the new files at the path alone when the connection closes.
                self._move_aside(problem)
        finally:
            conn.close()

    def _move_aside(self, problem: str) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = f"{self.path}.corrupt-{stamp}"
        n = 1
        while any(os.path.exists(base + s) for s in ("", "-wal", "-shm")):
            n += 1
            base = f"{self.path}.corrupt-{stamp}-{n}"
        # The log first: a fresh database must never start next to the old database's write-ahead log.
        for suffix in ("-wal", "-shm", ""):
            try:
                os.replace(f"{self.path}{suffix}", base + suffix)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise CacheStoreError(f"the SQLite cache {self.path} is corrupt ({problem}) and cannot be moved "
                                      f"aside: {e}") from e
        with self._state_lock:
            self.recoveries += 1
            self.moved_aside = base
        log.warning("SQLite cache %s is corrupt (%s): moved aside to %s, continuing with an empty cache",
                    self.path, problem, base)
        self._emit("recovered", problem)

    def _use_current_file(self) -> None:
        """Make every thread (re)open `path` and note which file that is."""
        with self._conns_lock:
            self._generation += 1
        self._conn(check_replaced=False)  # the file at `path` now is by definition the one to use
        with self._state_lock:
            self._file_id = self._stat_id()
            self._corruption_errors = 0
            self._failing = False

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout_ms / 1000, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                log.warning("SQLite cache %s could not switch to WAL (mode %s)", self.path, mode)
            conn.execute("PRAGMA synchronous=NORMAL")
            # Every new connection: the file may have been replaced (or deleted) since the store opened.
            conn.executescript(_SCHEMA)
        except BaseException:
            conn.close()
            raise
        return conn

    def _file_replaced(self) -> bool:
        """At most every `moved_check_seconds`: whether the file at `path` is no longer the one in use."""
        now = time.monotonic()
        if now < self._next_moved_check:
            return False
        self._next_moved_check = now + self.moved_check_seconds
        current = self._stat_id()
        if current == self._file_id:
            return False
        log.warning("SQLite cache %s was replaced or removed by someone else; reopening it", self.path)
        with self._conns_lock:
            self._generation += 1
        return True

    def _conn(self, check_replaced: bool = True) -> sqlite3.Connection:
        local = self._local
        conn = getattr(local, "conn", None)
        replaced = check_replaced and self._file_replaced()
        if conn is not None and local.generation == self._generation:
            return conn
        if conn is not None:
            with self._conns_lock:
                if conn in self._conns:
                    self._conns.remove(conn)
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        generation = self._generation
        conn = self._connect()
        local.conn, local.generation = conn, generation
        with self._conns_lock:
            self._conns.append(conn)
        if replaced:
            with self._state_lock:
                self._file_id = self._stat_id()
                self._corruption_errors = 0
        return conn

    def _corruption_seen(self, generation: int, e: sqlite3.Error) -> bool:
        """Count a corruption error; True when the file has been replaced (the operation may be retried)."""
        with self._state_lock:
            if generation != self._generation:
                return True  # replaced while this operation ran
            self._corruption_errors += 1
            n = self._corruption_errors
        log.warning("SQLite cache %s: %s (corruption error %d; the file is replaced after %d)", self.path, e, n,
                    self.recover_after_errors)
        if n < self.recover_after_errors:
            return False
        return self._recover(generation, str(e))

    def _recover(self, generation: int, problem: str) -> bool:
        with self._recover_lock:
            if generation != self._generation:
                return True  # another thread did it
            try:
                with self._file_lock():
                    if self._stat_id() == self._file_id:
                        self._move_aside(problem)
                    # else another process has already moved it aside: just open what is there now.
                    self._use_current_file()
            except (CacheStoreError, OSError, sqlite3.Error) as e:
                log.error("could not replace the corrupt SQLite cache %s: %s", self.path, e)
                return False
        return True

    def _run(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        for attempt in (0, 1):
            generation = self._generation
            try:
                out = fn(self._conn())
            except (sqlite3.Error, UnicodeError) as e:
                if (attempt == 0 and isinstance(e, sqlite3.DatabaseError) and _is_corruption(e)
                        and self._corruption_seen(generation, e)):
                    continue
                message = f"SQLite cache {self.path} failed: {e}"
                self._op_failed(message)
                raise CacheStoreError(message) from e
            self._op_ok()
            return out
        raise AssertionError("unreachable")  # pragma: no cover - the second attempt returns or raises

    def _degraded(self) -> bool:
        return self._failing or self._corruption_errors > 0

    def status(self) -> dict[str, Any]:
        out = super().status()
        out["moved_aside"] = self.moved_aside
        return out

    # ------------------------------------------------------------ operations

    def get(self, key: str) -> dict[str, Any] | None:
        now = time.time()
        # CAST: values come back as bytes (undecodable text is a corrupt value, not an error on every read);
        # REAL casts keep a planted non-number from raising TypeError below.
        row = self._run(lambda c: c.execute(
            "SELECT CAST(value AS BLOB), CAST(expires_at AS REAL), CAST(accessed_at AS REAL) FROM entries "
            "WHERE key = ?", (key,)).fetchone())
        if row is None:
            return None
        raw, expires, accessed = row
        if expires is not None and expires <= now:
            self._run(lambda c: c.execute("DELETE FROM entries WHERE key = ? AND expires_at <= ?", (key, now)))
            return None
        value, problem = check_value(raw, self.max_value_bytes)
        if problem is not None:
            self._corrupt_value(key, problem)
            with contextlib.suppress(CacheStoreError):
                self.delete(key)
            return None
        if accessed is None or now - accessed > self.touch_seconds:
            self._run(lambda c: c.execute("UPDATE entries SET accessed_at = ? WHERE key = ?", (now, key)))
        return value

    def put(self, key: str, value: dict[str, Any], ttl_seconds: float | None = None) -> None:
        self.put_raw(key, encode_value(value, self.max_value_bytes), ttl_seconds)

    def put_raw(self, key: str, raw: str | bytes, ttl_seconds: float | None = None) -> None:
        """Write raw text as the stored value (`put` seals it first; tests use this to plant corrupt rows)."""
        ttl = ttl_seconds if ttl_seconds is not None else self.default_ttl
        now = time.time()

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("INSERT OR REPLACE INTO entries (key, value, size, expires_at, accessed_at) "
                             "VALUES (?, ?, ?, ?, ?)", (key, raw, len(raw), now + ttl if ttl is not None else None, now))
                self._evict(conn, now)
                conn.execute("COMMIT")
            except BaseException:
                # A failed ROLLBACK (no transaction left, a corrupt file) must not hide the original error.
                with contextlib.suppress(sqlite3.Error):
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
            (total,) = conn.execute("SELECT COALESCE(SUM(CAST(size AS INTEGER)), 0) FROM entries").fetchone()
            while total > self.max_bytes:
                row = conn.execute("SELECT key, CAST(size AS INTEGER) FROM entries ORDER BY accessed_at ASC "
                                   "LIMIT 1").fetchone()
                if row is None:
                    break
                conn.execute("DELETE FROM entries WHERE key = ?", (row[0],))
                total -= row[1] or 0

    def delete(self, key: str) -> None:
        self._run(lambda c: c.execute("DELETE FROM entries WHERE key = ?", (key,)))

    def count(self) -> int:
        now = time.time()
        return self._run(lambda c: c.execute(
            "SELECT COUNT(*) FROM entries WHERE expires_at IS NULL OR expires_at > ?", (now,)).fetchone()[0])

    def clear(self) -> None:
        self._run(lambda c: c.execute("DELETE FROM entries"))

    def ping(self) -> None:
        self._run(lambda c: c.execute("SELECT 1").fetchone())

    def close(self) -> None:
        with self._conns_lock:
            for conn in self._conns:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            self._conns.clear()
            self._generation += 1  # a thread that still holds a closed connection reopens
        self._local = threading.local()


# ---------------------------------------------------------------- Redis

# Query parameters whose values are credentials (redis-py passes `?password=` through to AUTH).
_SECRET_PARAM = re.compile(r"([?&;][^=&#;]*(?:pass|pwd|secret|token|auth|key|user|cred)[^=&#;]*=)([^&#;]*)", re.I)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*:/*)")


def redact_url(url: str) -> str:
    """`url` without credentials: the user info becomes `***` (`redis://***@host:6379/0`) and so do the values
    of query parameters that look like credentials. Everything up to the last `@` counts as user info, so a
    password with an unescaped `/`, `?` or `#` is hidden too (at worst the host is hidden with it)."""
    m = _SCHEME.match(url)
    prefix, rest = (m.group(1), url[m.end():]) if m else ("", url)
    at = rest.rfind("@")
    if at >= 0:
        rest = "***" + rest[at:]
    return prefix + _SECRET_PARAM.sub(lambda g: g.group(1) + "***", rest)


def _url_secrets(url: str) -> list[str]:
    """Strings from `url` that must not appear in any message: credentials, decoded or not, and the pieces a
    URL parser may split a badly-escaped password into (such a piece can surface in a parse error)."""
    m = _SCHEME.match(url)
    rest = url[m.end():] if m else url
    found: set[str] = set()
    at = rest.rfind("@")
    if at >= 0:
        info = rest[:at]
        found.update({info, unquote(info)})
        found.update(p for p in re.split(r"[:/?#@]", info) if len(p) >= 3)
        user, _, password = info.partition(":")
        found.update({user, unquote(user), password, unquote(password)})
    for g in _SECRET_PARAM.finditer(url):
        found.update({g.group(2), unquote(g.group(2))})
    return sorted((s for s in found if len(s) >= 2), key=len, reverse=True)


class RedisStore(_StoreState):
    """Redis store shared across replicas: one string key per entry (SET with EX for TTL) and a sorted-set
    index by write time that enforces `max_entries` (oldest first). For a byte budget, configure Redis
    itself (`maxmemory` + `maxmemory-policy allkeys-lru`). `url` and `description` hold the URL with its
    credentials redacted; error messages are scrubbed of them."""

    blocking = True

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", prefix: str = "tokenseam:rc:",
                 max_entries: int | None = None, default_ttl: float | None = None,
                 socket_timeout: float = 1.0, connect_timeout: float = 0.5, *,
                 max_value_bytes: int | None = DEFAULT_MAX_VALUE_BYTES) -> None:
        import redis

        self._secrets = _url_secrets(url)
        self.url = redact_url(url)
        self.prefix = prefix
        self.max_entries = max_entries
        self.default_ttl = default_ttl
        self.max_value_bytes = max_value_bytes
        self.description = self.url
        self._init_state()
        self._redis_mod = redis
        try:
            self._r = redis.Redis.from_url(url, socket_timeout=socket_timeout,
                                           socket_connect_timeout=connect_timeout, decode_responses=False)
        except (ValueError, redis.RedisError) as e:
            # `from None`: the original exception's text may quote a piece of the URL (the password with it).
            raise CacheStoreError(f"bad Redis URL {self.url}: {self._scrub(str(e))} (percent-encode : / @ ? # "
                                  "in a password)") from None
        self._index = prefix + "index"

    def _scrub(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "***")
        return text

    def _key(self, key: str) -> str:
        return self.prefix + "e:" + key

    def _run(self, fn: Callable[[], Any]) -> Any:
        try:
            out = fn()
        except self._redis_mod.RedisError as e:
            message = f"Redis cache {self.url} failed: {type(e).__name__}: {self._scrub(str(e))}"
            self._op_failed(message)
            # `from None` so no traceback printed later can show the client's own message unscrubbed.
            raise CacheStoreError(message) from None
        self._op_ok()
        return out

    def get(self, key: str) -> dict[str, Any] | None:
        raw = self._run(lambda: self._r.get(self._key(key)))
        if raw is None:
            return None
        value, problem = check_value(raw, self.max_value_bytes)
        if problem is not None:
            self._corrupt_value(key, problem)
            with contextlib.suppress(CacheStoreError):
                self.delete(key)
        return value

    def put(self, key: str, value: dict[str, Any], ttl_seconds: float | None = None) -> None:
        self.put_raw(key, encode_value(value, self.max_value_bytes), ttl_seconds)

    def put_raw(self, key: str, raw: str | bytes, ttl_seconds: float | None = None) -> None:
        """Write raw text as the stored value (`put` seals it first; tests use this to plant corrupt values)."""
        ttl = ttl_seconds if ttl_seconds is not None else self.default_ttl
        now = time.time()
        data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw

        def write() -> None:
            pipe = self._r.pipeline(transaction=True)
            if ttl is not None:
                pipe.set(self._key(key), data, px=max(1, int(ttl * 1000)))
            else:
                pipe.set(self._key(key), data)
            if self.max_entries is not None:
                pipe.zadd(self._index, {key: now})
            pipe.execute()
            if self.max_entries is not None:
                n = self._r.zcard(self._index)
                if n > self.max_entries:
                    for member, _ in self._r.zpopmin(self._index, n - self.max_entries):
                        self._r.delete(self._key(member.decode("utf-8", "surrogateescape")))

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
    raise CacheStoreError(f"unknown cache store {redact_url(spec)!r}: use sqlite:PATH, redis://HOST:PORT/DB or "
                          "memory")
