"""Entries are verified on read: sealed values (format + SHA-256), entry shape, route. Hostile and malformed
stored values are counted as corrupt, deleted and answered as a miss on every store; nothing bad is served."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time

import pytest

from tokenseam.respcache import (
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_LLAMA,
    CacheStoreError,
    MemoryStore,
    RedisStore,
    ResponseCache,
    SQLiteStore,
    entry_from_response,
    entry_from_stream_events,
)
from tokenseam.respcache.entry import entry_problem, validate_entry
from tokenseam.respcache.errors import CacheValueError
from tokenseam.respcache.stores.base import (
    _SEAL_HEAD,
    _SEAL_MID,
    STORE_FORMAT,
    check_value,
    encode_value,
)


def seal(payload: str) -> str:
    """A correctly sealed stored text around any payload (what a forger with a hash function could write)."""
    return _SEAL_HEAD + hashlib.sha256(payload.encode("ascii")).hexdigest() + _SEAL_MID + payload + "}"


def body(text="hi", **kw):
    return {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0, **kw}


class Gen:
    def __init__(self):
        self.calls = 0

    async def generate(self, req):
        self.calls += 1
        return {
            "id": "chatcmpl-x",
            "object": "chat.completion",
            "created": 1,
            "model": req["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"answer {self.calls}"},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        }

    async def stream(self, req):
        self.calls += 1
        head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": req["model"]}
        yield dict(
            head,
            choices=[
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": f"live {self.calls}"},
                    "finish_reason": None,
                    "token_ids": [5],
                }
            ],
        )
        yield dict(head, choices=[{"index": 0, "delta": {}, "finish_reason": "stop", "token_ids": [6]}])


def chat_entry():
    return entry_from_response(
        ROUTE_CHAT,
        {
            "id": "x",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "stored answer"},
                    "logprobs": None,
                    "finish_reason": "stop",
                    "token_ids": [1, 2],
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        },
    )


# ---------------------------------------------------------------- the seal


def test_seal_roundtrip_and_every_kind_of_damage():
    value = {"a": [1, "é", "\ud800"], "b": None}
    raw = encode_value(value)
    assert raw.isascii() and json.loads(raw)["format"] == STORE_FORMAT
    assert (
        json.loads(raw)["sha256"]
        == hashlib.sha256(json.dumps(value, separators=(",", ":")).encode()).hexdigest()
    )
    assert check_value(raw) == (value, None)
    assert check_value(raw.encode()) == (value, None)
    edited = raw.replace('"b":null', '"b":true')
    assert check_value(edited) == (None, "checksum")  # an edited answer
    assert check_value(raw[:-5]) == (None, "unsealed")  # truncated: the closing brace is gone
    assert check_value(raw[:-2] + "}")[1] in ("checksum", "unsealed")  # truncated inside the payload
    assert check_value(json.dumps(value)) == (None, "unsealed")  # a value written before sealing existed
    assert check_value(raw.replace(STORE_FORMAT, "tokenseam-store/9")) == (None, "unsealed")
    upper = (
        raw[: len(_SEAL_HEAD)]
        + raw[len(_SEAL_HEAD) : len(_SEAL_HEAD) + 64].upper()
        + raw[len(_SEAL_HEAD) + 64 :]
    )
    assert check_value(upper) == (None, "checksum")
    assert check_value(b"\xff" + raw.encode()[1:]) == (None, "undecodable")
    assert check_value(raw.replace('"a"', '"\u00e4"')) == (None, "undecodable")  # not ASCII: not ours
    assert check_value(seal("[1,2]")) == (None, "not_object")
    assert check_value(seal('"text"')) == (None, "not_object")
    assert check_value(seal("{not json")) == (None, "undecodable")
    assert check_value(seal("[" * 200_000 + "]" * 200_000)) == (None, "undecodable")  # too deep to parse
    assert check_value(None) == (None, "undecodable") and check_value(12) == (None, "undecodable")
    assert check_value(raw, max_bytes=len(raw) - 1) == (None, "too_large")


def test_values_that_cannot_be_stored_raise_value_error():
    with pytest.raises(CacheValueError, match="over the store's limit"):
        encode_value({"x": "y" * 1000}, max_bytes=500)
    deep: dict = {}
    cur = deep
    for _ in range(100_000):
        cur["d"] = {}
        cur = cur["d"]
    with pytest.raises(CacheValueError):
        encode_value(deep)
    with pytest.raises(CacheValueError):
        encode_value([1])  # type: ignore[arg-type]
    assert issubclass(CacheValueError, CacheStoreError)


# ---------------------------------------------------------------- entry shape


def _llama_entry():
    return entry_from_response(
        ROUTE_LLAMA,
        {"content": "Hello there", "tokens": [1, 2], "stop": True, "stop_type": "eos", "model": "m"},
    )


def _completions_stream_entry():
    head = {"id": "c", "object": "text_completion", "created": 1, "model": "m"}
    return entry_from_stream_events(
        ROUTE_COMPLETIONS,
        [
            dict(
                head,
                choices=[
                    {"index": 0, "text": "ab", "logprobs": None, "finish_reason": None, "token_ids": [1]}
                ],
            ),
            dict(
                head,
                choices=[
                    {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop", "token_ids": []}
                ],
            ),
            dict(head, choices=[], usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}),
        ],
    )


def _tool_entry():
    return entry_from_response(
        ROUTE_CHAT,
        {
            "id": "x",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                        ],
                    },
                    "finish_reason": "tool_calls",
                },
                {"index": 1, "message": {"role": "assistant", "content": "b"}, "finish_reason": "stop"},
            ],
        },
    )


def test_real_entries_of_every_route_pass():
    for e in (chat_entry(), _llama_entry(), _completions_stream_entry(), _tool_entry()):
        assert entry_problem(e) is None and validate_entry(e, e["route"])
    assert "not the request's" in entry_problem(chat_entry(), ROUTE_COMPLETIONS)


def _set(path, value):
    def mutate(e):
        cur = e
        for k in path[:-1]:
            cur = cur[k]
        if value is KeyError:
            del cur[path[-1]]
        else:
            cur[path[-1]] = value

    return mutate


CHAT_DAMAGE = [
    (_set(["response", "choices"], "notalist"), "choices"),
    (_set(["response", "choices"], []), "choices"),
    (_set(["response", "choices", 0], "x"), "not an object"),
    (_set(["response", "choices", 0, "message"], "hi"), "message"),
    (_set(["response", "choices", 0, "message", "content"], 42), "content"),
    (_set(["response", "choices", 0, "message", "role"], ["assistant"]), "role"),
    (_set(["response", "choices", 0, "message", "tool_calls"], "call"), "tool_calls"),
    (_set(["response", "choices", 0, "finish_reason"], None), "finish_reason"),
    (_set(["response", "choices", 0, "index"], "0"), "index"),
    (_set(["response", "choices", 0, "index"], True), "index"),
    (_set(["response", "choices", 0, "token_ids"], [1, "2"]), "token_ids"),
    (_set(["response", "choices", 0, "token_ids"], [1, 2.0]), "token_ids"),
    (_set(["response", "choices", 0, "token_ids"], [True]), "token_ids"),
    (_set(["response", "choices", 0, "logprobs"], [1]), "logprobs"),
    (_set(["response", "usage", "total_tokens"], "3"), "usage"),
    (_set(["response", "usage", "prompt_tokens"], -1), "usage"),
    (_set(["response", "usage"], [1, 2]), "usage"),
    (_set(["usage"], "lots"), "usage"),
    (_set(["response"], "text"), "response"),
    (_set(["response"], KeyError), "response"),
    (_set(["events"], []), "events"),
    (_set(["events"], {"0": {}}), "events"),
    (_set(["events", 0], "event"), "events"),
    (_set(["events", 0, "delta"], "x"), "delta"),
    (_set(["events", 0, "delta", "content"], 7), "content"),
    (_set(["events", 0, "index"], 3), "no choice"),
    (_set(["events", -1, "finish_reason"], None), "finish"),
    (_set(["events", -1, "finish_reason"], 1), "finish_reason"),
    (_set(["events", -1, "all_token_ids"], "12"), "all_token_ids"),
    (_set(["format"], "tokenseam-respcache/0"), "format"),
    (_set(["route"], "/v1/embeddings"), "route"),
    (_set(["source"], "forged"), "source"),
    (_set(["created"], "yesterday"), "created"),
    (_set(["model"], {"name": "m"}), "model"),
    (_set(["system_fingerprint"], 5), "system_fingerprint"),
]


@pytest.mark.parametrize("mutate,word", CHAT_DAMAGE)
def test_damaged_chat_entries_are_rejected(mutate, word):
    e = chat_entry()
    mutate(e)
    problem = entry_problem(e)
    assert problem is not None and word in problem


def test_damaged_llama_and_completions_entries_are_rejected():
    for path, value in (
        (["response", "content"], None),
        (["response", "tokens"], ["a"]),
        (["response", "stop"], False),
        (["events", -1, "stop"], False),
        (["events", 0, "stop"], "no"),
        (["events", 0, "content"], 3),
        (["events", -1, "all_tokens"], [1.5]),
    ):
        e = _llama_entry()
        _set(path, value)(e)
        assert entry_problem(e) is not None, path
    for path, value in ((["response", "choices", 0, "text"], None), (["events", 0, "text"], ["ab"])):
        e = _completions_stream_entry()
        _set(path, value)(e)
        assert entry_problem(e) is not None, path
    e = _tool_entry()
    e["response"]["choices"][1]["index"] = 0
    assert "repeated" in entry_problem(e)
    for hostile in (None, [], "x", 1, {"format": "tokenseam-respcache/1"}):
        assert entry_problem(hostile) is not None


# ---------------------------------------------------------------- planted values, every store, through the cache


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request, tmp_path):
    if request.param == "memory":
        s = MemoryStore()
    elif request.param == "sqlite":
        s = SQLiteStore(tmp_path / "i.sqlite")
    else:
        s = RedisStore(request.getfixturevalue("redis_url"), prefix=f"integ{time.monotonic_ns()}:")
    yield s
    s.clear()
    s.close()


def _shape_bad(text):
    e = chat_entry()
    e["response"]["choices"] = "notalist"
    return encode_value(e)


def _edited(text):
    # The answer changed after it was sealed, as a hand edit of the row would.
    return encode_value(chat_entry()).replace("stored answer", "edited answer")


def _old_format(text):
    return json.dumps(chat_entry(), separators=(",", ":"))


def _other_route(text):
    e = _completions_stream_entry()
    return encode_value(e)


PLANTED = {
    "shape": (_shape_bad, "shape"),
    "checksum": (_edited, "checksum"),
    "unsealed": (_old_format, "unsealed"),
    "truncated": (lambda t: encode_value(chat_entry())[:-40], "unsealed"),
    "non_object": (lambda t: seal("[1,2,3]"), "not_object"),
    "not_json": (lambda t: seal('{"a":'), "undecodable"),
    "route": (_other_route, "shape"),
    "binary": (lambda t: b"\x00\xff\xfe garbage", "undecodable"),
}


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_planted_value_is_a_counted_miss_then_replaced(store, registry, kind):
    make, reason = PLANTED[kind]
    cache = ResponseCache(store, registry=registry)
    plan = cache.plan(ROUTE_CHAT, body("planted"))
    store.put_raw(plan.fingerprint, make(plan.fingerprint))
    gen = Gen()

    async def go():
        first = await cache.respond(plan, gen.generate)
        second = await cache.respond(cache.plan(ROUTE_CHAT, body("planted")), gen.generate)
        return first, second

    first, second = asyncio.run(go())
    assert first.status == "miss" and gen.calls == 1
    assert first.body["choices"][0]["message"]["content"] == "answer 1"  # generated, not the planted row
    assert second.status == "hit" and second.body["choices"][0]["message"]["content"] == "answer 1"
    assert registry.get_sample_value("tokenseam_respcache_corrupt_entries_total", {"reason": reason}) == 1
    assert cache.stats["corrupt"] == 1
    h = cache.health()
    assert h["corrupt_entries"] == 1 and h["ok"] is True and h["entries"] == 1


def test_planted_stream_hit_is_never_replayed(store, registry):
    cache = ResponseCache(store, registry=registry)
    plan = cache.plan(ROUTE_CHAT, body("s", stream=True))
    e = chat_entry()
    e["events"][0]["delta"]["content"] = {"evil": True}
    store.put_raw(plan.fingerprint, encode_value(e))
    gen = Gen()

    async def go():
        res = await cache.respond_stream(plan, gen.stream)
        return res, b"".join([c async for c in res.events])

    res, data = asyncio.run(go())
    assert res.status == "miss" and gen.calls == 1 and b"live 1" in data and b"evil" not in data
    assert registry.get_sample_value("tokenseam_respcache_corrupt_entries_total", {"reason": "shape"}) == 1


def test_huge_planted_value_is_too_large(tmp_path, registry):
    for s in (
        MemoryStore(max_value_bytes=10_000),
        SQLiteStore(tmp_path / "h.sqlite", max_value_bytes=10_000),
    ):
        cache = ResponseCache(s, registry=registry)
        plan = cache.plan(ROUTE_CHAT, body("huge"))
        e = chat_entry()
        e["response"]["choices"][0]["message"]["content"] = "z" * 50_000
        s.put_raw(plan.fingerprint, seal(json.dumps(e, separators=(",", ":"))))
        r = asyncio.run(cache.respond(plan, Gen().generate))
        assert r.status == "miss" and s.corrupt == 1 and s.count() == 1  # replaced by the generated answer
    assert (
        registry.get_sample_value("tokenseam_respcache_corrupt_entries_total", {"reason": "too_large"}) == 2
    )


def test_unstorable_answer_is_not_stored_and_the_store_stays_up(registry):
    store = MemoryStore(max_value_bytes=2_000)
    cache = ResponseCache(store, registry=registry)

    async def big(req):
        return {
            "id": "x",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "w" * 5_000},
                    "finish_reason": "stop",
                }
            ],
        }

    async def go():
        a = await cache.respond(cache.plan(ROUTE_CHAT, body("big")), big)
        b = await cache.respond(cache.plan(ROUTE_CHAT, body("big")), big)
        c = await cache.respond(cache.plan(ROUTE_CHAT, body("small")), Gen().generate)
        d = await cache.respond(cache.plan(ROUTE_CHAT, body("small")), Gen().generate)
        return a, b, c, d

    a, b, c, d = asyncio.run(go())
    assert (a.status, b.status, c.status, d.status) == ("miss", "miss", "miss", "hit")
    assert registry.get_sample_value("tokenseam_respcache_not_stored_total", {"reason": "unstorable"}) == 2
    assert cache.stats["store_errors"] == 0 and cache.health()["ok"] is True


def test_malformed_upstream_answer_is_served_but_not_stored(registry):
    cache = ResponseCache(MemoryStore(), registry=registry)
    calls = []

    async def odd(req):
        calls.append(1)
        return {
            "id": "x",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                    "token_ids": ["not", "ints"],
                }
            ],
        }

    async def go():
        return [await cache.respond(cache.plan(ROUTE_CHAT, body("odd")), odd) for _ in range(2)]

    a, b = asyncio.run(go())
    assert (a.status, b.status) == ("miss", "miss") and len(calls) == 2
    assert a.body["choices"][0]["message"]["content"] == "ok"
    assert registry.get_sample_value("tokenseam_respcache_not_stored_total", {"reason": "malformed"}) == 2
    assert cache.stats["corrupt"] == 0  # never written, so never found corrupt


def test_corrupt_counter_is_exported_before_anything_goes_wrong(registry):
    ResponseCache(MemoryStore(), registry=registry)
    for reason in ("shape", "checksum", "unsealed", "undecodable", "not_object", "too_large"):
        assert registry.get_sample_value("tokenseam_respcache_corrupt_entries_total", {"reason": reason}) == 0
    assert registry.get_sample_value("tokenseam_respcache_store_recoveries_total") == 0
    assert registry.get_sample_value("tokenseam_respcache_store_degraded") == 0


def test_store_raising_an_unexpected_exception_passes_requests_through(registry):
    class Broken(MemoryStore):
        def get(self, key):
            raise KeyError("bug in a custom store")

    cache = ResponseCache(Broken(), registry=registry, store_retry_seconds=60)
    r = asyncio.run(cache.respond(cache.plan(ROUTE_CHAT, body("b")), Gen().generate))
    assert r.status == "bypass"
    h = cache.health()
    assert h["ok"] is False and h["degraded"] is True and "KeyError" in h["error"] and h["store_errors"] == 1
    assert registry.get_sample_value("tokenseam_respcache_store_degraded") == 1


def test_listener_does_not_keep_a_cache_alive():
    import gc
    import weakref

    from prometheus_client import CollectorRegistry

    store = MemoryStore()
    cache = ResponseCache(store, registry=CollectorRegistry())
    ref = weakref.ref(cache)
    del cache
    gc.collect()
    assert ref() is None
    store.put_raw("k", "garbage")
    assert store.get("k") is None and store.corrupt == 1  # a dead listener is skipped, not an error


def test_health_fields(registry):
    keys = {
        "store",
        "ok",
        "degraded",
        "error",
        "entries",
        "corrupt_entries",
        "store_errors",
        "store_recoveries",
        "moved_aside",
    }
    none = ResponseCache(None, registry=registry).health()
    assert set(none) == keys and none["ok"] is True and none["entries"] is None
    store = MemoryStore()
    cache = ResponseCache(store, registry=registry)
    store.put("a", {"v": 1})
    store.put_raw("b", "junk")
    store.get("b")  # found by the store itself: still counted by the cache listening to it
    h = cache.health()
    assert set(h) == keys and h == {
        "store": store.description,
        "ok": True,
        "degraded": False,
        "error": None,
        "entries": 1,
        "corrupt_entries": 1,
        "store_errors": 0,
        "store_recoveries": 0,
        "moved_aside": None,
    }
    assert registry.get_sample_value("tokenseam_respcache_corrupt_entries_total", {"reason": "unsealed"}) == 1
