"""The pool's choice: consistent hashing with bounded load, least-loaded, round-robin, ejection and return."""

from __future__ import annotations

import asyncio
import os
import statistics

import pytest

from tokenseam.gateway.pool import NoReplica, Pool, Replica
from tokenseam.gateway.routing import route_key
from tokenseam.respcache import ResponseCacheError


def pool(n=3, **kw):
    return Pool(
        [Replica(f"http://10.0.0.{i}:8000", max_in_flight=kw.pop("cap", 128)) for i in range(n)], **kw
    )


def keys(n):
    return [os.urandom(16) for _ in range(n)]


def test_a_key_always_lands_on_the_same_replica_while_the_pool_is_idle():
    p = pool()
    for k in keys(200):
        first = p.pick(k)
        assert first is not None and first[1] == "prefix"
        assert all(p.pick(k)[0] is first[0] for _ in range(5))


def test_keys_spread_over_the_replicas():
    p = pool()
    homes = [p.pick(k)[0].name for k in keys(3000)]
    counts = [homes.count(r.name) for r in p.replicas]
    assert min(counts) > 3000 / 3 * 0.7, counts  # 64 virtual nodes each: no replica starves


def test_removing_a_replica_moves_only_its_keys():
    p = pool(4)
    ks = keys(1000)
    before = {k: p.pick(k)[0] for k in ks}
    gone = p.replicas[1]
    p.failed(gone, "test", refused=True)
    after = {k: p.pick(k)[0] for k in ks}
    moved = [k for k in ks if before[k] is not after[k]]
    assert all(before[k] is gone for k in moved) and all(after[k] is not gone for k in ks)
    p.recovered(gone)
    assert {k: p.pick(k)[0] for k in ks} == before


def test_a_hot_key_spills_within_the_load_bound():
    p = pool(3, load_factor=1.25)
    hot = b"the one system prompt"
    taken = []
    for _ in range(60):
        r, reason = asyncio.run(p.acquire(hot, set()))
        taken.append((r, reason))
    loads = [r.in_flight for r in p.replicas]
    assert sum(loads) == 60 and max(loads) <= 1.25 * statistics.mean(loads) + 1, loads
    home = taken[0][0]
    assert {reason for r, reason in taken if r is home} == {"prefix"}
    assert {reason for r, reason in taken if r is not home} == {"spill"}


def test_least_loaded_and_round_robin():
    p = pool(3, routing="least-loaded")
    for _ in range(9):
        asyncio.run(p.acquire(b"k", set()))
    assert [r.in_flight for r in p.replicas] == [3, 3, 3]
    rr = pool(3, routing="round-robin")
    names = [rr.pick(b"k")[0].name for _ in range(6)]
    assert names[:3] == names[3:] and len(set(names[:3])) == 3


def test_failures_eject_after_the_threshold_and_a_probe_returns_the_replica():
    p = pool(2, fail_threshold=2)
    a = p.replicas[0]
    p.failed(a, "timeout")
    assert a.healthy
    p.failed(a, "timeout")
    assert not a.healthy and a.last_error == "timeout"
    assert all(p.pick(k)[0] is not a for k in keys(50))
    p.recovered(a)
    assert a.healthy and a.failures == 0


def test_a_success_resets_the_count():
    p = pool(2, fail_threshold=2)
    a = p.replicas[0]
    p.failed(a, "x")
    p.succeeded(a, 0.01, {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}})
    p.failed(a, "x")
    assert a.healthy
    assert a.status()["cached_token_ratio"] == 0.4


@pytest.mark.parametrize(
    "usage",
    [
        None,
        "x",
        {"prompt_tokens": -1},
        {"prompt_tokens": True},
        {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}},
    ],
)
def test_hostile_usage_is_not_counted_wrong(usage):
    p = pool(1)
    p.count_usage(p.replicas[0], usage)
    r = p.replicas[0]
    assert r.cached_tokens <= r.prompt_tokens


def test_with_every_replica_down_the_ejected_ones_are_still_tried_then_503():
    p = pool(2)
    for r in p.replicas:
        p.failed(r, "refused", refused=True)
    tried = set()
    r1, reason = asyncio.run(p.acquire(b"k", tried))
    assert reason == "panic"
    tried.add(r1)
    r2, _ = asyncio.run(p.acquire(b"k", tried))
    tried.add(r2)
    with pytest.raises(NoReplica) as e:
        asyncio.run(p.acquire(b"k", tried))
    assert e.value.retry_after >= 1 and "refused" in str(e.value)


def test_at_the_in_flight_cap_a_request_waits_then_503():
    p = pool(1, cap=1, queue_timeout=0.2)

    async def scenario():
        r, _ = await p.acquire(None, set())
        with pytest.raises(NoReplica, match="in-flight limit"):
            await p.acquire(None, set())
        # A slot freed while a request waits is taken.
        waiter = asyncio.create_task(p.acquire(None, set()))
        await asyncio.sleep(0.05)
        p.release(r)
        got, _ = await waiter
        assert got is r and r.in_flight == 1

    p.queue_timeout = 0.2
    asyncio.run(scenario())


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({"routing": "random"}, "routing"),
        ({"load_factor": 0.5}, "load_factor"),
        ({"load_factor": float("nan")}, "load_factor"),
    ],
)
def test_bad_pool_settings_are_refused(kw, needle):
    with pytest.raises(ResponseCacheError, match=needle):
        pool(2, **kw)


def test_bad_replicas_are_refused():
    with pytest.raises(ResponseCacheError, match="at least one"):
        Pool([])
    with pytest.raises(ResponseCacheError, match="names must differ"):
        Pool([Replica("http://a:1"), Replica("http://a:1")])
    with pytest.raises(ResponseCacheError, match="kind"):
        Replica("http://a:1", kind="mystery")
    with pytest.raises(ResponseCacheError, match="max_in_flight"):
        Replica("http://a:1", max_in_flight=0)
    with pytest.raises(ResponseCacheError, match="http"):
        Replica("file:///etc/passwd")


def test_credentials_never_reach_the_name_or_status():
    r = Replica("http://user:hunter2@10.0.0.9:8000/v1?api_key=sk-secret")
    text = repr(r.status())
    assert "hunter2" not in text and "sk-secret" not in text and r.name == "10.0.0.9:8000"


# -- the routing key ---------------------------------------------------------------------------------------

SYSTEM = {"role": "system", "content": "You answer questions about the tokenseam manual. " * 20}


def chat(*messages, **kw):
    return {"model": "m", "messages": list(messages), **kw}


def test_every_turn_under_one_system_prompt_has_the_same_key():
    turn1 = chat(SYSTEM, {"role": "user", "content": "What is healing?"})
    turn2 = chat(
        SYSTEM,
        {"role": "user", "content": "What is healing?"},
        {"role": "assistant", "content": "It rolls back..."},
        {"role": "user", "content": "And the prefix cache?"},
    )
    other = chat(SYSTEM, {"role": "user", "content": "Something else entirely"})
    k = route_key("/v1/chat/completions", turn1)
    assert k == route_key("/v1/chat/completions", turn2) == route_key("/v1/chat/completions", other)
    assert k[1] == "head:1"
    changed = chat(
        {"role": "system", "content": "another app"}, {"role": "user", "content": "What is healing?"}
    )
    assert route_key("/v1/chat/completions", changed)[0] != k[0]
    assert route_key("/v1/chat/completions", {**turn1, "model": "other"})[0] != k[0]


def test_few_shot_examples_and_tools_are_part_of_the_head():
    shots = [
        {"role": "user", "name": "example_user", "content": "2+2"},
        {"role": "assistant", "name": "example_assistant", "content": "4"},
    ]
    a = chat(SYSTEM, *shots, {"role": "user", "content": "3+3"})
    b = chat(SYSTEM, *shots, {"role": "user", "content": "5+5"})
    assert route_key("/v1/chat/completions", a) == route_key("/v1/chat/completions", b)
    assert route_key("/v1/chat/completions", a)[1] == "head:3"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    with_tools = route_key("/v1/chat/completions", {**a, "tools": tools})
    assert with_tools[0] != route_key("/v1/chat/completions", a)[0] and with_tools[1] == "head:3+tools"


def test_a_chat_without_a_head_keys_on_its_first_message():
    a = chat({"role": "user", "content": "Hi, I am Ann"})
    b = chat(
        {"role": "user", "content": "Hi, I am Ann"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "bye"},
    )
    assert route_key("/v1/chat/completions", a) == route_key("/v1/chat/completions", b)


def test_completion_keys_do_not_move_when_text_is_appended():
    system = "You are a retrieval assistant. Use only the passages below. " * 40  # > 1024 bytes
    a = route_key("/v1/completions", {"model": "m", "prompt": system + "Passage: cats.\nQ: why?"})
    b = route_key("/v1/completions", {"model": "m", "prompt": system + "Passage: dogs.\nQ: how?"})
    assert a == b and a[1].startswith("bytes:") and int(a[1][6:]) <= 1024
    ids = list(range(1000))
    t1 = route_key("/v1/completions", {"model": "m", "prompt": ids + [5, 6]})
    t2 = route_key("/v1/completions", {"model": "m", "prompt": ids + [7]})
    assert t1 == t2 and t1[1] == "tokens:256"
    # A short prompt keys on all but its last word, which appended text could extend.
    s1 = route_key("/v1/completions", {"model": "m", "prompt": "Translate to French: cat"})
    s2 = route_key("/v1/completions", {"model": "m", "prompt": "Translate to French: catastrophe"})
    assert s1 == s2


@pytest.mark.parametrize(
    "body",
    [
        {"messages": "not a list"},
        {"messages": []},
        {"messages": [1, None, "x"]},
        {"prompt": 5},
        {"prompt": [True, False]},
        {"prompt": ["a", "b"]},
        {"prompt": ""},
        {},
    ],
)
def test_odd_bodies_key_on_nothing_or_something_without_raising(body):
    for route in ("/v1/chat/completions", "/v1/completions"):
        key, what = route_key(route, body)
        assert key is None or isinstance(key, bytes)


def test_skewed_keys_balance_by_share_and_each_key_stays_on_few_replicas():
    # Requests come and go one at a time (nothing ever in flight): a bound on in-flight counts never binds,
    # the bound on each replica's share of recent assignments does.
    import random

    rng = random.Random(3)
    p = pool(3, load_factor=1.25)
    ks = [rng.randbytes(16) for _ in range(24)]  # fixed keys: the outcome is the same on every run
    weights = [1 / (i + 1) for i in range(len(ks))]  # Zipf-like popularity
    served: dict[bytes, set] = {}
    counts = dict.fromkeys(p.replicas, 0)
    moves = 0
    for _ in range(3000):
        k = rng.choices(ks, weights)[0]
        r, _reason = asyncio.run(p.acquire(k, set()))
        p.release(r)
        counts[r] += 1
        seen = served.setdefault(k, set())
        moves += bool(seen) and r not in seen
        seen.add(r)
    loads = list(counts.values())
    assert max(loads) <= 1.25 * statistics.mean(loads) + 2, loads
    assert moves <= 2 * len(ks), moves  # a key reaches a new replica rarely: each time is a cold prefill
    assert statistics.mean(len(s) for s in served.values()) < 2


def test_a_spill_prefers_a_replica_that_served_the_key():
    p = pool(3)
    k = b"a system prompt"
    home = p.pick(k)[0]
    # Home is over its share; the two others both fit: without memory, the ring's next replica takes it.
    p._share.update({r: 10.0 for r in p.replicas})
    p._share[home] = 30.0
    first_spill, reason = p.pick(k)
    assert reason == "spill" and first_spill is not home
    other = next(r for r in p.replicas if r not in (home, first_spill))
    p._served(k, other)  # the key was served on the third replica before
    assert p.pick(k) == (other, "spill")


def test_while_shares_are_small_every_request_still_finds_a_replica():
    p = pool(3)
    p._share.update({r: 0.1 for r in p.replicas})  # every replica over a bound of 1
    r, reason = p.pick(b"k")
    assert r in p.replicas and reason in ("prefix", "spill")


def test_share_half_life_must_be_positive():
    with pytest.raises(ResponseCacheError, match="share_half_life"):
        pool(2, share_half_life=0)


def test_a_returning_replica_is_detected_again():
    p = pool(2)
    a = p.replicas[0]
    a.kind, a.detected, a.healing = "vllm", True, True
    p.failed(a, "refused", refused=True)
    p.recovered(a)
    assert (a.detected, a.kind, a.healing) == (False, None, None)
    b = Replica("http://10.0.0.9:8000", kind="sglang")
    q = Pool([b])
    b.detected = True
    q.failed(b, "refused", refused=True)
    q.recovered(b)
    assert b.kind == "sglang" and not b.detected  # a configured kind is kept
