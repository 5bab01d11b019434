"""`MemoryStore`: an in-process LRU with TTL, for tests, benchmarks and a single process that needs no restart."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from .base import DEFAULT_MAX_VALUE_BYTES, StoreState, check_value, encode_value


class MemoryStore(StoreState):
    """In-process LRU with TTL; limits on entry count and total JSON bytes. Not shared across processes."""

    blocking = False

    def __init__(
        self,
        max_entries: int | None = 10_000,
        max_bytes: int | None = None,
        default_ttl: float | None = None,
        *,
        max_value_bytes: int | None = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
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
            while self._data and (
                (self.max_entries is not None and len(self._data) > self.max_entries)
                or (self.max_bytes is not None and self._bytes > self.max_bytes)
            ):
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
