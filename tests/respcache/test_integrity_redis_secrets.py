"""A Redis password never reaches a store description, an error message, a log line or /health: unreachable
servers, failed AUTH against a real redis-server started with --requirepass, unparsable URLs."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from tokenseam.respcache import ROUTE_CHAT, CacheStoreError, RedisStore, ResponseCache, open_store
from tokenseam.respcache.stores.redis_store import redact_url

from .conftest import free_port, running_redis

SECRET = "s3cr3t-Pa55"


@pytest.fixture(scope="module")
def auth_redis(tmp_path_factory):
    """A redis-server on loopback that requires the password SECRET; yields its port."""
    with running_redis(tmp_path_factory.mktemp("redis-auth"), password=SECRET) as port:
        yield port


@pytest.mark.parametrize(
    "url,expected",
    [
        (f"redis://:{SECRET}@h:6379/0", "redis://***@h:6379/0"),
        (f"redis://user:{SECRET}@h:6379/2", "redis://***@h:6379/2"),
        (f"rediss://default:{SECRET}@h.example:6380/0", "rediss://***@h.example:6380/0"),
        (
            f"redis://h:6379/0?password={SECRET}&socket_timeout=2",
            "redis://h:6379/0?password=***&socket_timeout=2",
        ),
        (
            f"redis://h:6379/0?socket_timeout=2&username=u&password={SECRET}",
            "redis://h:6379/0?socket_timeout=2&username=***&password=***",
        ),
        (f"unix://:{SECRET}@/run/redis.sock?db=1", "unix://***@/run/redis.sock?db=1"),
        ("redis://:pa/ss@word@h:1/0", "redis://***@h:1/0"),  # unescaped / and @ in the password
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_redact_url(url, expected):
    assert redact_url(url) == expected


def _assert_clean(*texts):
    for t in texts:
        assert SECRET not in t and SECRET.lower() not in t.lower(), t


def test_unreachable_server_errors_and_logs_carry_no_password(caplog, registry):
    port = free_port()
    for url in (
        f"redis://:{SECRET}@127.0.0.1:{port}/0",
        f"redis://someone:{SECRET}@127.0.0.1:{port}/0",
        f"redis://127.0.0.1:{port}/0?password={SECRET}",
    ):
        s = RedisStore(url, connect_timeout=0.2, socket_timeout=0.2)
        _assert_clean(s.description, s.url, repr(s._r))
        assert "127.0.0.1" in s.description
        with pytest.raises(CacheStoreError) as got:
            s.get("k")
        _assert_clean(str(got.value), repr(got.value))
        # No chained client exception for a traceback to print unscrubbed.
        assert got.value.__cause__ is None and got.value.__suppress_context__
        cache = ResponseCache(s, registry=registry, store_retry_seconds=60)
        with caplog.at_level(logging.DEBUG):
            r = asyncio.run(
                cache.respond(
                    cache.plan(
                        ROUTE_CHAT, {"messages": [{"role": "user", "content": "x"}], "temperature": 0}
                    ),
                    _gen,
                )
            )
        assert r.status == "bypass"
        h = cache.health()
        assert h["ok"] is False
        _assert_clean(str(h), str(s.status()), caplog.text)
        assert "Connection" in h["error"] or "connect" in h["error"].lower()


async def _gen(req):
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "stop"}],
    }


def test_failed_auth_against_a_real_server_names_no_password(auth_redis, caplog):
    wrong = "wrong-" + SECRET
    for url in (
        f"redis://:{wrong}@127.0.0.1:{auth_redis}/0",
        f"redis://nobody:{wrong}@127.0.0.1:{auth_redis}/0",
        f"redis://127.0.0.1:{auth_redis}/0?password={wrong}",
        f"redis://127.0.0.1:{auth_redis}/0",
    ):
        s = RedisStore(url)
        with caplog.at_level(logging.DEBUG), pytest.raises(CacheStoreError) as got:
            s.ping()
        msg = str(got.value)
        _assert_clean(msg, s.description, str(s.status()), caplog.text)
        assert "wrong-" not in msg and f"127.0.0.1:{auth_redis}" in msg
        assert "Authentication" in msg or "NOAUTH" in msg or "auth" in msg.lower()
        s.close()


def test_right_password_works_and_is_still_hidden(auth_redis):
    for url in (
        f"redis://:{SECRET}@127.0.0.1:{auth_redis}/0",
        f"redis://default:{SECRET}@127.0.0.1:{auth_redis}/0",
        f"redis://127.0.0.1:{auth_redis}/0?password={SECRET}",
    ):
        s = RedisStore(url, prefix=f"auth{time.monotonic_ns()}:")
        s.put("k", {"v": 1})
        assert s.get("k") == {"v": 1}
        _assert_clean(s.description, str(s.status()))
        s.clear()
        s.close()


def test_unparsable_urls_and_unknown_specs_hide_the_password():
    port = free_port()
    for url in (
        f"redis://:{SECRET}@127.0.0.1:notaport/0",
        f"redis://:pa/{SECRET}@127.0.0.1:{port}/0",
        f"redis://:{SECRET[:4]}/{SECRET[4:]}@127.0.0.1:{port}/0",
    ):
        with pytest.raises(CacheStoreError) as got:
            RedisStore(url, connect_timeout=0.2, socket_timeout=0.2).ping()
        text = str(got.value)
        _assert_clean(text)
        assert SECRET[:4] not in text and SECRET[4:] not in text
        assert got.value.__cause__ is None
    with pytest.raises(CacheStoreError, match="unknown cache store") as got:
        open_store(f"redis:/user:{SECRET}@host")
    _assert_clean(str(got.value))
