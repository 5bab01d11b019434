"""`RedisStore`: a store shared across replicas, and the redaction of Redis URL credentials.

The `redis` client package is optional (`pip install 'tokenseam[redis]'`): it is imported when a Redis store is
opened. Descriptions and error messages never carry a Redis password.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from ..errors import CacheStoreError
from .base import DEFAULT_MAX_VALUE_BYTES, StoreState, check_value, encode_value

# Query parameters whose values are credentials (redis-py passes `?password=` through to AUTH).
_SECRET_PARAM = re.compile(
    r"([?&;][^=&#;]*(?:pass|pwd|secret|token|auth|key|user|cred)[^=&#;]*=)([^&#;]*)", re.I
)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*:/*)")


def redact_url(url: str) -> str:
    """`url` without credentials: the user info becomes `***` (`redis://***@host:6379/0`) and so do the values
    of query parameters that look like credentials. Everything up to the last `@` counts as user info, so a
    password with an unescaped `/`, `?` or `#` is hidden too (at worst the host is hidden with it)."""
    m = _SCHEME.match(url)
    prefix, rest = (m.group(1), url[m.end() :]) if m else ("", url)
    at = rest.rfind("@")
    if at >= 0:
        rest = "***" + rest[at:]
    return prefix + _SECRET_PARAM.sub(lambda g: g.group(1) + "***", rest)


def _url_secrets(url: str) -> list[str]:
    """Strings from `url` that must not appear in any message: credentials, decoded or not, and the pieces a
    URL parser may split a badly-escaped password into (such a piece can surface in a parse error)."""
    m = _SCHEME.match(url)
    rest = url[m.end() :] if m else url
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


class RedisStore(StoreState):
    """Redis store shared across replicas: one string key per entry (SET with EX for TTL) and a sorted-set
    index by write time that enforces `max_entries` (oldest first). For a byte budget, configure Redis
    itself (`maxmemory` + `maxmemory-policy allkeys-lru`). `url` and `description` hold the URL with its
    credentials redacted; error messages are scrubbed of them."""

    blocking = True

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        prefix: str = "tokenseam:rc:",
        max_entries: int | None = None,
        default_ttl: float | None = None,
        socket_timeout: float = 1.0,
        connect_timeout: float = 0.5,
        *,
        max_value_bytes: int | None = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        try:
            import redis
        except ImportError:
            raise CacheStoreError(
                f"a Redis cache ({redact_url(url)}) needs the redis client package: "
                "pip install 'tokenseam[redis]'"
            ) from None

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
            self._r = redis.Redis.from_url(
                url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=connect_timeout,
                decode_responses=False,
            )
        except (ValueError, redis.RedisError) as e:
            # `from None`: the original exception's text may quote a piece of the URL (the password with it).
            raise CacheStoreError(
                f"bad Redis URL {self.url}: {self._scrub(str(e))} (percent-encode : / @ ? # in a password)"
            ) from None
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

    # -- single flight across processes: one lock key per entry being generated, owned by a random token

    def _lock_key(self, key: str) -> str:
        return self.prefix + "l:" + key

    def try_lock(self, key: str, token: str, ttl_seconds: float) -> bool:
        """Take the generation lock for `key` (SET NX with expiry); False when another process holds it."""
        return bool(
            self._run(
                lambda: self._r.set(self._lock_key(key), token, nx=True, px=max(1, int(ttl_seconds * 1000)))
            )
        )

    def extend_lock(self, key: str, token: str, ttl_seconds: float) -> bool:
        """Push the lock's expiry out while `token` still owns it (a long generation keeps its lock)."""
        return bool(
            self._run(
                lambda: self._extend(
                    keys=[self._lock_key(key)], args=[token, max(1, int(ttl_seconds * 1000))]
                )
            )
        )

    def unlock(self, key: str, token: str) -> None:
        """Release the lock if `token` still owns it (never another process's newer lock)."""
        self._run(lambda: self._release(keys=[self._lock_key(key)], args=[token]))

    def locked(self, key: str) -> bool:
        return bool(self._run(lambda: self._r.exists(self._lock_key(key))))

    @property
    def _release(self) -> Any:
        return self._script(
            "release",
            'if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) end return 0',
        )

    @property
    def _extend(self) -> Any:
        return self._script(
            "extend",
            'if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("pexpire", KEYS[1], ARGV[2]) end return 0',
        )

    def _script(self, name: str, text: str) -> Any:
        scripts = self.__dict__.setdefault("_scripts", {})
        if name not in scripts:
            scripts[name] = self._r.register_script(text)
        return scripts[name]

    def count(self) -> int:
        def scan() -> int:
            return sum(1 for _ in self._r.scan_iter(match=self.prefix + "e:*", count=1000))

        return self._run(scan)

    def clear(self) -> None:
        def wipe() -> None:
            keys = list(self._r.scan_iter(match=self.prefix + "*", count=1000))
            for i in range(0, len(keys), 500):
                self._r.delete(*keys[i : i + 500])

        self._run(wipe)

    def ping(self) -> None:
        self._run(self._r.ping)

    def close(self) -> None:
        try:
            self._r.close()
        except self._redis_mod.RedisError:
            pass
