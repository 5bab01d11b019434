"""What every response-cache store shares: the `CacheStore` interface, sealed values, and the counters.

Values are JSON objects only (never pickle), stored sealed: a format tag and the SHA-256 of the value's JSON
text, checked on every read. A value that fails the check is counted as corrupt, deleted and read as a miss.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ..errors import CacheValueError

# One logger for every store: the gateway attaches its credential-redacting filter to it by name.
log = logging.getLogger("tokenseam.respcache.stores")

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


def check_value(
    raw: Any, max_bytes: int | None = DEFAULT_MAX_VALUE_BYTES
) -> tuple[dict[str, Any] | None, str | None]:
    """(value, None) for an intact sealed value, else (None, reason) with a reason from `CORRUPT_REASONS`.

    Values written before sealing existed (plain JSON) are "unsealed": they are treated like any other
    corrupt value, since nothing shows they are what was stored."""
    if (
        max_bytes is not None
        and isinstance(raw, str | bytes | bytearray | memoryview)
        and len(raw) > max_bytes
    ):
        return None, "too_large"
    if isinstance(raw, bytes | bytearray | memoryview):
        try:
            raw = bytes(raw).decode("ascii")
        except UnicodeDecodeError:
            return None, "undecodable"
    elif not isinstance(raw, str):
        return None, "undecodable"
    if (
        len(raw) <= _PAYLOAD_AT
        or not raw.startswith(_SEAL_HEAD)
        or not raw.endswith("}")
        or raw[_PAYLOAD_AT - len(_SEAL_MID) : _PAYLOAD_AT] != _SEAL_MID
    ):
        return None, "unsealed"
    payload = raw[_PAYLOAD_AT:-1]
    try:
        data = payload.encode("ascii")
    except UnicodeEncodeError:
        return None, "undecodable"
    if hashlib.sha256(data).hexdigest() != raw[len(_SEAL_HEAD) : len(_SEAL_HEAD) + 64]:
        return None, "checksum"
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):
        return None, "undecodable"
    if not isinstance(value, dict):
        return None, "not_object"
    return value, None


# ---------------------------------------------------------------- counters shared by every store


class StoreState:
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
        log.warning(
            "corrupt cache entry %s in %s (%s): removed, read as a miss", key[:16], self.description, reason
        )
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
            return {
                "degraded": self._degraded(),
                "corrupt_entries": self.corrupt,
                "errors": self.errors,
                "recoveries": self.recoveries,
                "last_error": self.last_error,
            }
