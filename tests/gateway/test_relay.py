"""ID-exact relay through the gateway: whatever shape the upstream streams ids in, every event carries the ids
since the last and the final one the full list; a cache hit replays the same ids; lost ids are an error."""

from __future__ import annotations

import json

import httpx
import pytest

from tokenseam.gateway.relay import IdRelay, LostIds
from tokenseam.testing.fake_upstream import FakeUpstream, fake_answer

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"


def events(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def test_vllm_shape_gets_its_final_list():
    r = IdRelay(True)
    evs = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": [5, 6], "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": "b"}, "token_ids": [7], "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "token_ids": [2], "finish_reason": "stop"}]},
    ]
    out = [r.event(e)["choices"][0] for e in evs]
    assert [c["token_ids"] for c in out] == [[], [5, 6], [7], [2]]
    assert out[-1]["all_token_ids"] == [5, 6, 7, 2] and "all_token_ids" not in out[1]


def test_llama_shape_is_renamed_and_choices_are_kept_apart():
    r = IdRelay(True)
    a = r.event(
        {"choices": [{"index": 0, "text": "x", "tokens": [1]}, {"index": 1, "text": "y", "tokens": [9]}]}
    )
    assert [c["token_ids"] for c in a["choices"]] == [[1], [9]] and "tokens" not in a["choices"][0]
    b = r.event({"choices": [{"index": 1, "text": "", "tokens": [8], "finish_reason": "length"}]})
    c = r.event({"choices": [{"index": 0, "text": "", "tokens": [], "finish_reason": "stop"}]})
    assert b["choices"][0]["all_token_ids"] == [9, 8] and c["choices"][0]["all_token_ids"] == [1]


def test_a_final_list_that_disagrees_or_ids_that_never_came_are_errors():
    r = IdRelay(True)
    r.event({"choices": [{"index": 0, "token_ids": [1, 2]}]})
    with pytest.raises(LostIds, match="differs"):
        r.event(
            {"choices": [{"index": 0, "token_ids": [], "all_token_ids": [1, 2, 3], "finish_reason": "stop"}]}
        )
    with pytest.raises(LostIds, match="no token ids"):
        IdRelay(True).event({"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}]})
    with pytest.raises(LostIds, match="no token ids"):
        IdRelay(True).response({"choices": [{"index": 0, "text": "x"}]})
    with pytest.raises(LostIds):  # not ids: strings, booleans
        IdRelay(True).response({"choices": [{"index": 0, "token_ids": ["1", True]}]})


def test_without_return_token_ids_nothing_changes():
    ev = {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}]}
    assert IdRelay(False).event(json.loads(json.dumps(ev))) == ev


@pytest.mark.parametrize("shape", ["tokenseam", "vllm", "llama"])
@pytest.mark.parametrize("route", [CHAT, COMP])
def test_through_the_gateway_every_shape_comes_out_id_exact_and_a_hit_replays_it(gateway, shape, route):
    owned = {"tokenseam": "tokenseam", "vllm": "vllm", "llama": "llamacpp"}[shape]
    with FakeUpstream(owned_by=owned) as up:
        up.state.id_shape = shape
        gw = gateway([up.url])
        body = {"model": "fake-model", "temperature": 0, "return_token_ids": True, "n": 2, "max_tokens": 16}
        body |= {"messages": [{"role": "user", "content": "ids"}]} if route == CHAT else {"prompt": "ids"}
        expected = None
        got = []
        for _ in range(2):  # a miss, then a replayed hit
            r = httpx.post(gw.url + route, json={**body, "stream": True}, timeout=30)
            assert r.status_code == 200, r.text
            # What the fake generated for the body it was sent.
            expected = expected or [fake_answer(up.state.last_body, i)[1] for i in range(2)]
            per, final = {0: [], 1: []}, {}
            for ev in events(r.text):
                for ch in ev["choices"]:
                    assert isinstance(ch["token_ids"], list)
                    per[ch["index"]] += ch["token_ids"]
                    if ch.get("finish_reason"):
                        final[ch["index"]] = ch["all_token_ids"]
            assert [per[0], per[1]] == [final[0], final[1]] == expected
            got.append(r.headers["x-tokenseam-cache"])
        assert got == ["miss", "hit"]
        plain = httpx.post(gw.url + route, json={**body, "seed": 1}, timeout=30).json()
        assert [c["token_ids"] for c in plain["choices"]] == [
            fake_answer(up.state.last_body, i)[1] for i in range(2)
        ]


def test_an_upstream_that_drops_the_ids_is_an_error_not_a_silent_answer(gateway):
    with FakeUpstream(owned_by="sglang") as up:
        up.state.id_shape = "none"
        gw = gateway([up.url])
        body = {"model": "fake-model", "prompt": "x", "temperature": 0, "return_token_ids": True}
        r = httpx.post(gw.url + COMP, json=body, timeout=30)
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_lost_ids"
        s = httpx.post(gw.url + COMP, json={**body, "stream": True}, timeout=30)
        assert s.status_code == 200 and events(s.text)[-1]["error"]["code"] == "upstream_lost_ids"
        # nothing was stored: the next request goes upstream again
        s2 = httpx.post(gw.url + COMP, json={**body, "stream": True}, timeout=30)
        assert s2.headers["x-tokenseam-cache"] == "miss"
