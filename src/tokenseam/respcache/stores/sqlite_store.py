"""`SQLiteStore`: the default store, one SQLite file in WAL mode shared by threads and processes.

A file that is not a database or fails its checks is moved aside and replaced by an empty one, at start or
after repeated corruption errors while running (details in the class docstring).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import CacheStoreError
from .base import DEFAULT_MAX_VALUE_BYTES, StoreState, check_value, encode_value, log

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


class SQLiteStore(StoreState):
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

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_entries: int | None = None,
        max_bytes: int | None = None,
        default_ttl: float | None = None,
        busy_timeout_ms: int = 10_000,
        touch_seconds: float = 60.0,
        *,
        max_value_bytes: int | None = DEFAULT_MAX_VALUE_BYTES,
        check_on_open: bool = True,
        recover_after_errors: int = 3,
        moved_check_seconds: float = 5.0,
        lock_timeout: float = 120.0,
    ) -> None:
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
                        raise CacheStoreError(
                            f"another process has held {lock_path} for over "
                            f"{self.lock_timeout:.0f}s; is it stuck?"
                        ) from None
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
                raise CacheStoreError(
                    f"{self.path} is a SQLite database but not a tokenseam response cache (its "
                    f"`entries` table has columns {', '.join(sorted(cols))}); use another path"
                )
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
                raise CacheStoreError(
                    f"the SQLite cache {self.path} is corrupt ({problem}) and cannot be moved aside: {e}"
                ) from e
        with self._state_lock:
            self.recoveries += 1
            self.moved_aside = base
        log.warning(
            "SQLite cache %s is corrupt (%s): moved aside to %s, continuing with an empty cache",
            self.path,
            problem,
            base,
        )
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
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False
        )
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
        log.warning(
            "SQLite cache %s: %s (corruption error %d; the file is replaced after %d)",
            self.path,
            e,
            n,
            self.recover_after_errors,
        )
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
                if (
                    attempt == 0
                    and isinstance(e, sqlite3.DatabaseError)
                    and _is_corruption(e)
                    and self._corruption_seen(generation, e)
                ):
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
        row = self._run(
            lambda c: c.execute(
                "SELECT CAST(value AS BLOB), CAST(expires_at AS REAL), CAST(accessed_at AS REAL) FROM entries "
                "WHERE key = ?",
                (key,),
            ).fetchone()
        )
        if row is None:
            return None
        raw, expires, accessed = row
        if expires is not None and expires <= now:
            self._run(
                lambda c: c.execute("DELETE FROM entries WHERE key = ? AND expires_at <= ?", (key, now))
            )
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
                conn.execute(
                    "INSERT OR REPLACE INTO entries (key, value, size, expires_at, accessed_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (key, raw, len(raw), now + ttl if ttl is not None else None, now),
                )
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
                conn.execute(
                    "DELETE FROM entries WHERE key IN (SELECT key FROM entries ORDER BY accessed_at ASC "
                    "LIMIT ?)",
                    (n - self.max_entries,),
                )
        if self.max_bytes is not None:
            (total,) = conn.execute("SELECT COALESCE(SUM(CAST(size AS INTEGER)), 0) FROM entries").fetchone()
            while total > self.max_bytes:
                row = conn.execute(
                    "SELECT key, CAST(size AS INTEGER) FROM entries ORDER BY accessed_at ASC LIMIT 1"
                ).fetchone()
                if row is None:
                    break
                conn.execute("DELETE FROM entries WHERE key = ?", (row[0],))
                total -= row[1] or 0

    def delete(self, key: str) -> None:
        self._run(lambda c: c.execute("DELETE FROM entries WHERE key = ?", (key,)))

    def count(self) -> int:
        now = time.time()
        return self._run(
            lambda c: c.execute(
                "SELECT COUNT(*) FROM entries WHERE expires_at IS NULL OR expires_at > ?", (now,)
            ).fetchone()[0]
        )

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
