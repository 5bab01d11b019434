"""The normalized request form and its fingerprint: the pitfall suite, the defaults table, hostile bodies."""

from __future__ import annotations

import copy
import json

import pytest

from tokenseam.bench.cache_pitfalls import MUST_HIT, MUST_MISS, base_chat, base_completion, run_pitfalls
from tokenseam.respcache import (
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_LLAMA,
    CacheRequestError,
    fingerprint_request,
    is_deterministic,
    normalize_request,
    tenant_from_api_key,
)


@pytest.mark.parametrize("variant", MUST_HIT, ids=lambda v: v.name)
def test_must_hit(variant):
    base = base_chat() if variant.route == ROUTE_CHAT else base_completion()
    assert fingerprint_request(
        variant.route, variant.mutate(base), tenant=variant.tenant
    ) == fingerprint_request(variant.route, base, tenant="tenant-a")


def test_pitfall_rates():
    r = run_pitfalls()
    assert r.hits_failed == [] and r.misses_failed == []
    assert r.hit_rate == 1.0 and r.wrong_hit_rate == 0.0
    assert len(r.misses_ok) == len(MUST_MISS)


def test_the_normalized_request_is_what_gets_generated():
    body = base_chat()
    body.update(stream=True, user="u", _x=1, top_p=1.0, stop=["b", "a", "b"])
    c = normalize_request(ROUTE_CHAT, body)
    assert "stream" not in c and "user" not in c and "_x" not in c
    assert c["stop"] == ["a", "b"]
    assert [t["function"]["name"] for t in c["tools"]] == ["add", "lookup"]
    assert c["temperature"] == 0 and isinstance(c["temperature"], int)
    # FILL defaults are written into the request that is generated.
    assert c["top_p"] == 1 and c["n"] == 1 and c["presence_penalty"] == 0
    assert normalize_request(ROUTE_CHAT, c) == c  # idempotent
    json.dumps(c)  # plain JSON


def test_defaults_omitted_equals_explicit():
    a = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    b = dict(
        a,
        temperature=1.0,
        top_p=1,
        n=1,
        presence_penalty=0,
        frequency_penalty=0.0,
        logprobs=False,
        top_k=-1,
        min_p=0,
        response_format={"type": "text"},
        logit_bias={},
        stop=[],
        seed=None,
        max_tokens=None,
        token_healing=False,
        return_token_ids=False,
        tool_choice="none",
    )
    assert fingerprint_request(ROUTE_CHAT, a) == fingerprint_request(ROUTE_CHAT, b)
    assert not is_deterministic(ROUTE_CHAT, normalize_request(ROUTE_CHAT, a))
    assert is_deterministic(ROUTE_CHAT, normalize_request(ROUTE_CHAT, dict(a, seed=3)))
    assert is_deterministic(ROUTE_CHAT, normalize_request(ROUTE_CHAT, dict(a, temperature=0.0)))


def test_underscore_fields_removed_at_every_depth_but_schema_property_names_kept():
    schema = {
        "type": "object",
        "_comment": "x",
        "properties": {"_id": {"type": "string", "_note": 1}},
        "required": ["_id"],
    }
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "q", "_meta": {"a": 1}}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "_x": 2}},
        "_top": True,
    }
    c = normalize_request(ROUTE_CHAT, body)
    s = c["response_format"]["json_schema"]["schema"]
    assert "_comment" not in s and "_id" in s["properties"] and "_note" not in s["properties"]["_id"]
    assert "_meta" not in c["messages"][0] and "_x" not in c["response_format"]["json_schema"]
    assert "_top" not in c


def test_schema_property_order_is_meaning():
    def with_props(props):
        return {
            "model": "m",
            "messages": [{"role": "user", "content": "q"}],
            "temperature": 0,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": {"type": "object", "properties": props}},
            },
        }

    ab = with_props({"a": {"type": "integer"}, "b": {"type": "string"}})
    ba = with_props({"b": {"type": "string"}, "a": {"type": "integer"}})
    assert fingerprint_request(ROUTE_CHAT, ab) != fingerprint_request(ROUTE_CHAT, ba)
    # ...but key order inside each property schema is not.
    ab2 = with_props({"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 3}})
    ab3 = with_props({"a": {"type": "integer"}, "b": {"maxLength": 3.0, "type": "string"}})
    assert fingerprint_request(ROUTE_CHAT, ab2) == fingerprint_request(ROUTE_CHAT, ab3)


def test_chat_text_rules_and_raw_prompt_rules():
    c = normalize_request(
        ROUTE_CHAT,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "cafe\u0301 line\r\nnext  \n"},
                        {"type": "image_url", "image_url": {"url": "http://x/a.png "}},
                    ],
                }
            ]
        },
    )
    assert c["messages"][0]["content"][0]["text"] == "caf\u00e9 line\nnext"
    assert c["messages"][0]["content"][1]["image_url"]["url"] == "http://x/a.png "
    p = normalize_request(ROUTE_COMPLETIONS, {"prompt": "cafe\u0301 http:\r\n "})
    assert p["prompt"] == "caf\u00e9 http:\r\n "
    p2 = normalize_request(ROUTE_COMPLETIONS, {"prompt": [1, 2.0, "x"]})
    assert p2["prompt"] == [1, 2, "x"]


def test_llama_completion_route():
    base = {"prompt": "Hello", "n_predict": 8, "temperature": 0, "cache_prompt": True, "id_slot": 2}
    c = normalize_request(ROUTE_LLAMA, base)
    assert "cache_prompt" not in c and "id_slot" not in c
    assert c["top_k"] == 40 and c["top_p"] == 0.95 and c["min_p"] == 0.05
    same = {
        "prompt": "Hello",
        "n_predict": 8.0,
        "temperature": 0.0,
        "top_k": 40,
        "seed": -1,
        "return_tokens": False,
        "stream": True,
    }
    assert fingerprint_request(ROUTE_LLAMA, base) == fingerprint_request(ROUTE_LLAMA, same)
    for change in (
        {"grammar": 'root ::= "a"'},
        {"json_schema": {"type": "object"}},
        {"return_tokens": True},
        {"top_k": 1},
        {"seed": 5},
        {"n_predict": 9},
    ):
        assert fingerprint_request(ROUTE_LLAMA, dict(base, **change)) != fingerprint_request(
            ROUTE_LLAMA, base
        )
    assert not is_deterministic(ROUTE_LLAMA, normalize_request(ROUTE_LLAMA, {"prompt": "x"}))
    assert is_deterministic(ROUTE_LLAMA, normalize_request(ROUTE_LLAMA, {"prompt": "x", "seed": 1}))


def test_routes_are_separate_namespaces_and_namespace_param():
    body = {"prompt": "x", "temperature": 0}
    assert fingerprint_request(ROUTE_COMPLETIONS, body) != fingerprint_request(ROUTE_LLAMA, body)
    assert fingerprint_request(ROUTE_COMPLETIONS, body, namespace="a") != fingerprint_request(
        ROUTE_COMPLETIONS, body, namespace="b"
    )


def test_tenant_from_api_key_hashes():
    t = tenant_from_api_key("Bearer sk-secret")
    assert t == tenant_from_api_key("sk-secret") and "secret" not in t and len(t) == 32
    assert tenant_from_api_key(None) == "" and tenant_from_api_key("a") != tenant_from_api_key("b")


@pytest.mark.parametrize(
    "route,body,param",
    [
        (ROUTE_CHAT, [], None),
        (ROUTE_CHAT, "text", None),
        (ROUTE_CHAT, {"model": "m"}, "messages"),
        (ROUTE_CHAT, {"messages": []}, "messages"),
        (ROUTE_CHAT, {"messages": "hi"}, "messages"),
        (ROUTE_CHAT, {"messages": [1]}, "messages[0]"),
        (ROUTE_CHAT, {"messages": [{"content": "x"}]}, "messages[0].role"),
        (ROUTE_CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (ROUTE_CHAT, {"messages": [{"role": "user", "content": [3]}]}, "messages[0].content[0]"),
        (ROUTE_CHAT, {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
        (
            ROUTE_CHAT,
            {"messages": [{"role": "user", "content": "x"}], "temperature": float("nan")},
            "temperature",
        ),
        (ROUTE_CHAT, {"messages": [{"role": "user", "content": "x"}], "top_p": float("inf")}, "top_p"),
        (ROUTE_CHAT, {"messages": [{"role": "user", "content": "x"}], "n": 1.5}, "n"),
        (ROUTE_CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": True}, "max_tokens"),
        (ROUTE_CHAT, {"messages": [{"role": "user", "content": "x"}], "stop": [1]}, "stop"),
        (ROUTE_CHAT, {"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}, "tools"),
        (ROUTE_CHAT, {"messages": [{"role": "user", "content": "x"}], "tools": ["a"]}, "tools[0]"),
        (
            ROUTE_CHAT,
            {"messages": [{"role": "user", "content": "x"}], "response_format": "json"},
            "response_format",
        ),
        (
            ROUTE_CHAT,
            {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}},
            "logit_bias",
        ),
        (ROUTE_CHAT, {"messages": [{"role": "user", "content": "x"}], "model": 3}, "model"),
        (ROUTE_COMPLETIONS, {"prompt": 5}, "prompt"),
        (ROUTE_COMPLETIONS, {"prompt": [None]}, "prompt"),
        (ROUTE_COMPLETIONS, {"model": "m"}, "prompt"),
        ("/v1/embeddings", {"input": "x"}, None),
    ],
)
def test_malformed_bodies_raise_clear_errors(route, body, param):
    with pytest.raises(CacheRequestError) as ei:
        normalize_request(route, body)
    assert str(ei.value)
    if param is not None:
        assert ei.value.param == param and param.split("[")[0].split(".")[0] in str(ei.value)


def test_hostile_strings_and_deep_nesting_do_not_crash():
    body = {"messages": [{"role": "user", "content": "\ud800 lone surrogate \x00 nul"}], "temperature": 0}
    fp = fingerprint_request(ROUTE_CHAT, body)
    assert len(fp) == 64
    deep: dict = {}
    cur = deep
    for _ in range(200):
        cur["a"] = {}
        cur = cur["a"]
    assert len(fingerprint_request(ROUTE_CHAT, dict(body, extra=deep))) == 64
    huge_int = dict(body, seed=2**70)
    assert fingerprint_request(ROUTE_CHAT, huge_int) != fingerprint_request(
        ROUTE_CHAT, dict(body, seed=2**70 + 1)
    )


def test_input_body_not_mutated():
    body = base_chat()
    before = copy.deepcopy(body)
    normalize_request(ROUTE_CHAT, body)
    assert body == before


def test_token_healing_default_follows_the_route():
    from tokenseam.respcache import fingerprint_request

    base = {"model": "m", "prompt": "Visit http:", "temperature": 0}
    for route in ("/v1/completions", "/completion"):
        on = fingerprint_request(route, base)
        assert fingerprint_request(route, {**base, "token_healing": True}) == on
        assert fingerprint_request(route, {**base, "token_healing": False}) != on
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert fingerprint_request(
        "/v1/chat/completions", {**chat, "token_healing": False}
    ) == fingerprint_request("/v1/chat/completions", chat)
