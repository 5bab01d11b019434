"""ResponseCache policy: hit/miss/bypass, cross-mode serving, single flight, leader failure, store down."""

from __future__ import annotations

import asyncio

import pytest

from tokenseam.respcache import (
    ROUTE_CHAT,
    CacheStoreError,
    MemoryStore,
    ResponseCache,
    SQLiteStore,
)
from tokenseam.respcache.entry import SSEParser


def body(text="hi", **kw):
    return {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0, **kw}


class FakeGen:
    """Deterministic generator: answer = reversed user text; counts calls; optional gate/failure."""

    def __init__(self, finish="stop", fail=None, gate=None, content=None):
        self.calls = 0
        self.finish = finish
        self.fail = fail
        self.gate = gate
        self.content = content
        self.seen = []

    def _text(self, req):
        return self.content if self.content is not None else req["messages"][-1]["content"][::-1]

    async def _enter(self, req):
        """Count the call, then wait for the gate and fail if told to (both entry points do this first)."""
        self.calls += 1
        self.seen.append(req)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise self.fail

    async def generate(self, req):
        await self._enter(req)
        return {
            "id": f"chatcmpl-{self.calls}",
            "object": "chat.completion",
            "created": 1,
            "model": req["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": self._text(req)},
                    "logprobs": None,
                    "finish_reason": self.finish,
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        }

    async def stream(self, req):
        await self._enter(req)
        head = {
            "id": f"chatcmpl-s{self.calls}",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": req["model"],
        }
        yield dict(
            head, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
        )
        text = self._text(req)
        for i, ch in enumerate(text):
            yield dict(
                head,
                choices=[{"index": 0, "delta": {"content": ch}, "finish_reason": None, "token_ids": [i]}],
            )
            await asyncio.sleep(0)
        yield dict(
            head,
            choices=[
                {
                    "index": 0,
                    "delta": {},
                    "finish_reason": self.finish,
                    "token_ids": [],
                    "all_token_ids": list(range(len(text))),
                }
            ],
        )
        if req.get("stream_options", {}).get("include_usage"):
            yield dict(
                head,
                choices=[],
                usage={"prompt_tokens": 1, "completion_tokens": len(text), "total_tokens": 1 + len(text)},
            )


async def drain(stream):
    data = b"".join([b async for b in stream.events])
    return SSEParser().feed(data)


def content_of(chunks):
    return "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in chunks
        if isinstance(c, dict) and c.get("choices")
    )


@pytest.fixture(params=["memory", "sqlite"])
def cache(request, tmp_path, registry):
    store = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "p.sqlite")
    return ResponseCache(store, registry=registry)


def test_miss_then_hit_non_streamed(cache, registry):
    gen = FakeGen()

    async def go():
        r1 = await cache.respond(cache.plan(ROUTE_CHAT, body("abc")), gen.generate)
        r2 = await cache.respond(
            cache.plan(ROUTE_CHAT, dict(body("abc  "), stream=False, user="x")), gen.generate
        )
        return r1, r2

    r1, r2 = asyncio.run(go())
    assert (r1.status, r2.status) == ("miss", "hit") and gen.calls == 1
    assert r2.headers == {"x-tokenseam-cache": "hit"}
    assert r2.body["choices"] == r1.body["choices"] and r2.body["id"] != r1.body["id"]
    # The generator received the normalized request (defaults filled, transport fields gone).
    assert gen.seen[0]["top_p"] == 1 and "stream" not in gen.seen[0]
    assert (
        registry.get_sample_value(
            "tokenseam_respcache_requests_total", {"route": ROUTE_CHAT, "result": "hit"}
        )
        == 1
    )
    assert registry.get_sample_value("tokenseam_respcache_hit_seconds_count", {"route": ROUTE_CHAT}) == 1


def test_stream_entry_serves_non_stream_and_back(cache):
    gen = FakeGen()

    async def go():
        s = await cache.respond_stream(cache.plan(ROUTE_CHAT, body("hello", stream=True)), gen.stream)
        live = await drain(s)
        r = await cache.respond(cache.plan(ROUTE_CHAT, body("hello")), gen.generate)
        s2 = await cache.respond_stream(
            cache.plan(ROUTE_CHAT, body("hello", stream=True, stream_options={"include_usage": True})),
            gen.stream,
        )
        replay = await drain(s2)
        return s, live, r, s2, replay

    s, live, r, s2, replay = asyncio.run(go())
    assert (s.status, r.status, s2.status) == ("miss", "hit", "hit") and gen.calls == 1
    # The leader's client did not ask for usage: the usage chunk requested upstream is not relayed.
    assert live[-1] == "[DONE]" and all(c.get("choices") for c in live[:-1])
    assert gen.seen[0]["stream"] is True and gen.seen[0]["stream_options"] == {"include_usage": True}
    assert content_of(live) == "olleh" == r.body["choices"][0]["message"]["content"]
    assert r.body["choices"][0]["token_ids"] == [0, 1, 2, 3, 4]
    # Replay: same per-event shapes as the live stream, plus the usage chunk this client asked for.
    assert [c["choices"] for c in replay[:-2]] == [c["choices"] for c in live[:-1]]
    assert replay[-2]["choices"] == [] and replay[-2]["usage"]["completion_tokens"] == 5


def test_non_stream_entry_replays_as_several_events(cache):
    gen = FakeGen(content="one two three four")

    async def go():
        await cache.respond(cache.plan(ROUTE_CHAT, body("q")), gen.generate)
        return await drain(
            await cache.respond_stream(cache.plan(ROUTE_CHAT, body("q", stream=True)), gen.stream)
        )

    chunks = asyncio.run(go())
    assert gen.calls == 1 and len(chunks) >= 5 and content_of(chunks) == "one two three four"


def test_single_flight_coalesces_concurrent_identical_requests(cache, registry):
    gate = asyncio.Event

    async def go():
        g = FakeGen(gate=gate())

        async def one(i):
            if i % 2:
                st = await cache.respond_stream(cache.plan(ROUTE_CHAT, body("same", stream=True)), g.stream)
                return st.status, content_of(await drain(st))
            r = await cache.respond(cache.plan(ROUTE_CHAT, body("same")), g.generate)
            return r.status, r.body["choices"][0]["message"]["content"]

        tasks = [asyncio.create_task(one(i)) for i in range(20)]
        await asyncio.sleep(0.05)
        g.gate.set()
        return g, await asyncio.gather(*tasks)

    g, results = asyncio.run(go())
    assert g.calls == 1
    assert sorted(s for s, _ in results) == ["hit"] * 19 + ["miss"]
    assert {c for _, c in results} == {"emas"}
    assert cache.stats["coalesced"] == 19
    assert registry.get_sample_value("tokenseam_respcache_coalesced_total", {"route": ROUTE_CHAT}) == 19


def test_leader_error_reaches_every_waiter_and_nothing_is_stored(cache):
    class Boom(Exception):
        pass

    async def go():
        g = FakeGen(gate=asyncio.Event(), fail=Boom("upstream said 400"))
        tasks = [
            asyncio.create_task(cache.respond(cache.plan(ROUTE_CHAT, body("e")), g.generate))
            for _ in range(5)
        ]
        await asyncio.sleep(0.05)
        g.gate.set()
        res = await asyncio.gather(*tasks, return_exceptions=True)
        ok = FakeGen()
        after = await cache.respond(cache.plan(ROUTE_CHAT, body("e")), ok.generate)
        return g, res, after

    g, res, after = asyncio.run(go())
    assert g.calls == 1 and all(isinstance(r, Boom) for r in res)
    assert after.status == "miss"


def test_aborted_leader_hands_over_to_a_waiter(cache):
    async def go():
        g = FakeGen(gate=asyncio.Event())
        leader = asyncio.create_task(cache.respond(cache.plan(ROUTE_CHAT, body("a")), g.generate))
        await asyncio.sleep(0.02)
        waiters = [
            asyncio.create_task(cache.respond(cache.plan(ROUTE_CHAT, body("a")), g.generate))
            for _ in range(4)
        ]
        await asyncio.sleep(0.02)
        leader.cancel()
        await asyncio.sleep(0.02)
        g.gate.set()
        res = await asyncio.gather(*waiters)
        return g, leader, res

    g, leader, res = asyncio.run(go())
    assert leader.cancelled()
    assert g.calls == 2  # the cancelled leader, then one waiter that took over
    assert sorted(r.status for r in res) == ["hit", "hit", "hit", "miss"]
    assert {r.body["choices"][0]["message"]["content"] for r in res} == {"a"}


def test_client_leaving_a_streamed_miss_hands_over(cache):
    async def go():
        g = FakeGen(content="abcdefgh")
        st = await cache.respond_stream(cache.plan(ROUTE_CHAT, body("z", stream=True)), g.stream)
        it = st.events.__aiter__()
        await it.__anext__()
        waiter = asyncio.create_task(cache.respond(cache.plan(ROUTE_CHAT, body("z")), g.generate))
        await asyncio.sleep(0.01)
        await it.aclose()  # the leader's client disconnected mid-stream
        return g, await waiter

    g, res = asyncio.run(go())
    assert (
        res.status == "miss" and g.calls == 2 and res.body["choices"][0]["message"]["content"] == "abcdefgh"
    )


class DownStore:
    blocking = False
    description = "down"

    def __init__(self):
        self.calls = 0

    def _fail(self, *a, **k):
        self.calls += 1
        raise CacheStoreError("store is down")

    get = put = delete = count = clear = ping = _fail

    def close(self):
        pass


def test_store_down_passes_through(registry):
    store = DownStore()
    cache = ResponseCache(store, registry=registry, store_retry_seconds=60)
    gen = FakeGen()

    async def go():
        a = await cache.respond(cache.plan(ROUTE_CHAT, body("x")), gen.generate)
        b = await cache.respond(cache.plan(ROUTE_CHAT, body("x")), gen.generate)
        s = await cache.respond_stream(cache.plan(ROUTE_CHAT, body("x", stream=True)), gen.stream)
        return a, b, s, await drain(s)

    a, b, s, chunks = asyncio.run(go())
    assert (a.status, b.status, s.status) == ("bypass", "bypass", "bypass") and gen.calls == 3
    assert content_of(chunks) == "x"
    assert store.calls == 1  # the circuit stayed open after the first failure
    assert registry.get_sample_value("tokenseam_respcache_store_errors_total", {"op": "get"}) == 1
    assert cache.health()["ok"] is False


def test_policy_modes_and_bypass_headers(registry, tmp_path):
    store = MemoryStore()
    det = ResponseCache(store, registry=registry)
    assert det.plan(ROUTE_CHAT, body("x")).fingerprint
    assert (
        det.plan(ROUTE_CHAT, {"messages": [{"role": "user", "content": "x"}]}).bypass_reason
        == "nondeterministic"
    )
    assert det.plan(ROUTE_CHAT, {"messages": [{"role": "user", "content": "x"}], "seed": 1}).fingerprint
    for h in (
        {"x-tokenseam-cache": "bypass"},
        {"X-Tokenseam-Cache": "BYPASS"},
        {"cache-control": "no-cache"},
        {"Cache-Control": "max-age=0, no-store"},
    ):
        assert det.plan(ROUTE_CHAT, body("x"), headers=h).bypass_reason == "header"
    assert det.plan(ROUTE_CHAT, body("x"), headers={"cache-control": "max-age=60"}).fingerprint
    from prometheus_client import CollectorRegistry

    off = ResponseCache(store, mode="off", registry=CollectorRegistry())
    assert off.plan(ROUTE_CHAT, body("x")).bypass_reason == "off"
    always = ResponseCache(store, mode="always", registry=CollectorRegistry())
    assert always.plan(ROUTE_CHAT, {"messages": [{"role": "user", "content": "x"}]}).fingerprint
    from tokenseam.respcache import ResponseCacheError

    with pytest.raises(ResponseCacheError, match="sometimes"):
        ResponseCache(store, mode="sometimes", registry=CollectorRegistry())
    # tenants never share entries
    assert (
        det.plan(ROUTE_CHAT, body("x"), tenant="a").fingerprint
        != det.plan(ROUTE_CHAT, body("x"), tenant="b").fingerprint
    )


@pytest.mark.parametrize(
    "finish,content,flag", [("length", "abc", "cache_truncated"), ("stop", "", "cache_empty")]
)
def test_truncated_and_empty_answers_are_not_stored_unless_configured(registry, finish, content, flag):
    from prometheus_client import CollectorRegistry

    for configured in (False, True):  # the request names no limit: `auto` would not store a length answer
        cache = ResponseCache(MemoryStore(), registry=CollectorRegistry(), **{flag: configured})
        gen = FakeGen(finish=finish, content=content)

        async def go(cache=cache, gen=gen):
            await cache.respond(cache.plan(ROUTE_CHAT, body("t")), gen.generate)
            return await cache.respond(cache.plan(ROUTE_CHAT, body("t")), gen.generate)

        second = asyncio.run(go())
        assert second.status == ("hit" if configured else "miss")
        assert gen.calls == (1 if configured else 2)


@pytest.mark.parametrize(
    "route,extra,stored",
    [
        (ROUTE_CHAT, {"max_tokens": 5}, True),  # the limit is in the key: the answer is the exact one
        (ROUTE_CHAT, {"max_completion_tokens": 5}, True),
        (ROUTE_CHAT, {}, False),  # cut by the upstream's context or default: not the request's own answer
    ],
)
def test_by_default_a_length_answer_is_stored_when_the_request_names_its_limit(route, extra, stored):
    from prometheus_client import CollectorRegistry

    cache = ResponseCache(MemoryStore(), registry=CollectorRegistry())
    gen = FakeGen(finish="length", content="abc")

    async def go():
        await cache.respond(cache.plan(route, body("t", **extra)), gen.generate)
        return await cache.respond(cache.plan(route, body("t", **extra)), gen.generate)

    assert asyncio.run(go()).status == ("hit" if stored else "miss")


def test_stated_limit():
    from tokenseam.respcache.policy import stated_limit

    assert stated_limit("/completion", {"n_predict": 8}) and not stated_limit(
        "/completion", {"n_predict": -1}
    )
    assert stated_limit("/v1/completions", {"max_tokens": 16}) and not stated_limit(
        ROUTE_CHAT, {"max_tokens": True}
    )


def test_corrupt_stored_entry_is_a_miss(cache, registry):
    plan = cache.plan(ROUTE_CHAT, body("c"))
    cache.store.put(plan.fingerprint, {"format": "something-else"})
    gen = FakeGen()
    r = asyncio.run(cache.respond(plan, gen.generate))
    assert r.status == "miss" and gen.calls == 1 and cache.stats["corrupt"] == 1
    assert cache.store.get(plan.fingerprint)["format"] == "tokenseam-respcache/1"


def test_stream_generator_yielding_sse_bytes(cache):
    async def sse_gen(req):
        yield b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        yield b'[{"index":0,"delta":{"content":"hey"},"finish_reason":null}]}\n\n'
        yield (
            b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
            b'[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
        )

    async def go():
        a = await drain(await cache.respond_stream(cache.plan(ROUTE_CHAT, body("b", stream=True)), sse_gen))
        b = await cache.respond(cache.plan(ROUTE_CHAT, body("b")), FakeGen().generate)
        return a, b

    a, b = asyncio.run(go())
    assert content_of(a) == "hey" and a.count("[DONE]") == 1
    assert b.status == "hit" and b.body["choices"][0]["message"]["content"] == "hey"


def test_mid_stream_failure_sends_error_event_and_stores_nothing(cache):
    async def broken(req):
        yield {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "par"}, "finish_reason": None}],
        }
        raise ConnectionError("upstream closed the connection")

    async def truncated(req):
        yield {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "par"}, "finish_reason": None}],
        }

    async def go():
        out = []
        for g in (broken, truncated):
            st = await cache.respond_stream(cache.plan(ROUTE_CHAT, body("m", stream=True)), g)
            out.append(await drain(st))
        after = await cache.respond(cache.plan(ROUTE_CHAT, body("m")), FakeGen().generate)
        return out, after

    (a, b), after = asyncio.run(go())
    for chunks in (a, b):
        assert "error" in chunks[-1] and "[DONE]" not in chunks
    assert after.status == "miss"


def test_error_before_first_event_raises_from_respond_stream(cache):
    class Upstream(Exception):
        pass

    async def failing(req):
        raise Upstream("503 from upstream")
        yield  # pragma: no cover

    with pytest.raises(Upstream):
        asyncio.run(cache.respond_stream(cache.plan(ROUTE_CHAT, body("f", stream=True)), failing))


def test_pitfall_suite_end_to_end_through_the_cache(registry):
    """Every must-hit variant is served from the base request's entry; no must-miss variant is."""
    from tokenseam.bench.cache_pitfalls import BASE_TENANT, MUST_HIT, MUST_MISS, base_chat, base_completion

    cache = ResponseCache(MemoryStore(), registry=registry)
    gen = FakeGen(content="cached answer")

    async def gen_any(req):
        if "messages" in req:
            return await gen.generate(req)
        gen.calls += 1
        return {
            "id": "c",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "text": "cached answer", "finish_reason": "stop"}],
        }

    async def go():
        for route, base in ((ROUTE_CHAT, base_chat()), ("/v1/completions", base_completion())):
            assert (
                await cache.respond(cache.plan(route, base, tenant=BASE_TENANT), gen_any)
            ).status == "miss"
        out = {}
        for v in MUST_HIT + MUST_MISS:
            base_route = "/v1/completions" if v.name.startswith("completion:") else ROUTE_CHAT
            base = base_completion() if base_route != ROUTE_CHAT else base_chat()
            r = await cache.respond(cache.plan(v.route, v.mutate(base), tenant=v.tenant), gen_any)
            out[v.name] = r.status
            if r.status == "miss":  # keep the store holding only the two base entries
                cache.store.delete(cache.plan(v.route, v.mutate(base), tenant=v.tenant).fingerprint)
        return out

    out = asyncio.run(go())
    assert {v.name: out[v.name] for v in MUST_HIT} == {v.name: "hit" for v in MUST_HIT}
    assert [v.name for v in MUST_MISS if out[v.name] == "hit"] == []


def test_llama_completion_route_through_the_cache(cache):
    """tokenseam's own /completion stream shape: the final event carries content, ids and all_tokens."""
    calls = []

    async def llama_stream(req):
        calls.append(req)
        assert req["stream"] is True and "stream_options" not in req and req["top_k"] == 40
        yield {"index": 0, "content": "Hel", "tokens": [1], "stop": False, "id_slot": -1}
        yield {
            "index": 0,
            "content": "lo",
            "tokens": [2],
            "stop": True,
            "stop_type": "eos",
            "all_tokens": [1, 2],
            "tokens_predicted": 2,
        }

    async def never(req):
        raise AssertionError("must be a hit")

    async def go():
        body = {"prompt": "Say hello", "temperature": 0, "n_predict": 8, "stream": True, "cache_prompt": True}
        live = await drain(await cache.respond_stream(cache.plan("/completion", body), llama_stream))
        hit = await drain(await cache.respond_stream(cache.plan("/completion", body), never))
        full = await cache.respond(cache.plan("/completion", dict(body, stream=False)), never)
        return live, hit, full

    live, hit, full = asyncio.run(go())
    assert live == hit and "[DONE]" not in hit and len(hit) == 2
    assert full.status == "hit" and full.body["content"] == "Hello" and full.body["tokens"] == [1, 2]
    assert len(calls) == 1


def test_generate_raising_leader_aborted_lets_waiters_retry(cache):
    from tokenseam.respcache import LeaderAbortedError

    async def go():
        gate = asyncio.Event()
        calls = []

        async def first_gives_up(req):
            calls.append(1)
            await gate.wait()
            if len(calls) == 1:
                raise LeaderAbortedError("my client went away")
            return await FakeGen().generate(req)

        leader = asyncio.create_task(cache.respond(cache.plan(ROUTE_CHAT, body("w")), first_gives_up))
        await asyncio.sleep(0.02)
        waiters = [
            asyncio.create_task(cache.respond(cache.plan(ROUTE_CHAT, body("w")), first_gives_up))
            for _ in range(3)
        ]
        await asyncio.sleep(0.02)
        gate.set()
        res = await asyncio.gather(leader, *waiters, return_exceptions=True)
        return calls, res

    calls, res = asyncio.run(go())
    assert isinstance(res[0], LeaderAbortedError) and len(calls) == 2
    assert sorted(r.status for r in res[1:]) == ["hit", "hit", "miss"]
