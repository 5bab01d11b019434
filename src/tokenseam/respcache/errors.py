"""The response cache's exception types: one base, and causes a caller handles differently.

`CacheStoreError` means the store failed (requests pass through); `CacheValueError`, a kind of it, means one value
could not be stored while the store is fine; `CacheRequestError` means the request body is malformed (HTTP 400).
"""

from __future__ import annotations


class ResponseCacheError(Exception):
    """Base of every error raised by `tokenseam.respcache` (the message says what to fix)."""


class CacheStoreError(ResponseCacheError):
    """A cache store (SQLite, Redis, memory) could not be read or written; the request can still be served."""


class CacheValueError(CacheStoreError):
    """One value cannot be stored (not a JSON object, too large, nested too deeply); the store itself works.

    A subclass of `CacheStoreError` so callers that only know that one still pass the request through, but the
    policy does not take it as a sign the store is down."""


class CacheRequestError(ResponseCacheError):
    """A request body cannot be normalized (wrong type, bad field value); `param` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
