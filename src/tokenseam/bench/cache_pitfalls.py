"""The fingerprint pitfall suite: a base request and variants that must hit or must miss its cache entry.

Benchmark and test data, not runtime code: shared by `tokenseam bench cache` and the response-cache tests
(tests/respcache/test_request_form.py, test_policy.py), so the test and the reported rate are one list.
"""

from __future__ import annotations

import copy
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..respcache import fingerprint_request
from ..wire import ROUTE_CHAT, ROUTE_COMPLETIONS

BASE_TENANT = "tenant-a"


def base_chat() -> dict[str, Any]:
    return {
        "model": "smollm2",
        "messages": [
            {"role": "system", "content": "You are a terse assistant. Café."},
            {"role": "user", "content": "Name three prime numbers.\nBe brief."},
        ],
        "temperature": 0,
        "max_tokens": 32,
        "stop": ["\n\n", "END"],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "look a word up",
                    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "add",
                    "description": "add two ints",
                    "parameters": {
                        "type": "object",
                        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    },
                },
            },
        ],
    }


def base_completion() -> dict[str, Any]:
    return {"model": "smollm2", "prompt": "The capital of France is", "temperature": 0, "max_tokens": 8}


@dataclass(frozen=True)
class Variant:
    name: str
    route: str
    mutate: Callable[[dict[str, Any]], dict[str, Any]]
    tenant: str = BASE_TENANT


def _m(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def wrapped(body: dict[str, Any]) -> dict[str, Any]:
        body = copy.deepcopy(body)
        fn(body)
        return body

    return wrapped


def _set(**kv: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return _m(lambda b: b.update(kv))


def _user(text: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return _m(lambda b: b["messages"][1].update(content=text))


def _system(text: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return _m(lambda b: b["messages"][0].update(content=text))


MUST_HIT: list[Variant] = [
    Variant("key order reversed", ROUTE_CHAT, lambda b: dict(reversed(list(copy.deepcopy(b).items())))),
    Variant(
        "nested key order",
        ROUTE_CHAT,
        _m(lambda b: b.update(messages=[dict(reversed(list(m.items()))) for m in b["messages"]])),
    ),
    Variant("explicit default top_p", ROUTE_CHAT, _set(top_p=1)),
    Variant(
        "explicit defaults n/penalties", ROUTE_CHAT, _set(n=1, presence_penalty=0.0, frequency_penalty=0)
    ),
    Variant("explicit null seed", ROUTE_CHAT, _set(seed=None)),
    Variant("empty json_schema_options", ROUTE_CHAT, _set(json_schema_options={})),
    Variant("explicit default response_format text", ROUTE_CHAT, _set(response_format={"type": "text"})),
    Variant("explicit tool_choice auto with tools", ROUTE_CHAT, _set(tool_choice="auto")),
    Variant("stream true", ROUTE_CHAT, _set(stream=True)),
    Variant("stream false", ROUTE_CHAT, _set(stream=False)),
    Variant("stream_options", ROUTE_CHAT, _set(stream=True, stream_options={"include_usage": True})),
    Variant("tools reordered", ROUTE_CHAT, _m(lambda b: b["tools"].reverse())),
    Variant("stop reordered", ROUTE_CHAT, _set(stop=["END", "\n\n"])),
    Variant("stop duplicated", ROUTE_CHAT, _set(stop=["END", "\n\n", "END"])),
    Variant("trailing whitespace", ROUTE_CHAT, _user("Name three prime numbers.\nBe brief.  \n\t ")),
    Variant("CRLF line endings", ROUTE_CHAT, _system("You are a terse assistant. Café.\r\n")),
    Variant(
        "CRLF inside text",
        ROUTE_CHAT,
        _m(lambda b: b["messages"][1].update(content="Name three prime numbers.\r\nBe brief.")),
    ),
    Variant(
        "NFD text", ROUTE_CHAT, _system(unicodedata.normalize("NFD", "You are a terse assistant. Café."))
    ),
    Variant("_ext top-level", ROUTE_CHAT, _set(_trace={"id": 7})),
    Variant("_ext in message", ROUTE_CHAT, _m(lambda b: b["messages"][1].update(_client_ts=12345))),
    Variant(
        "_ext in tool schema",
        ROUTE_CHAT,
        _m(lambda b: b["tools"][0]["function"]["parameters"].update(_note="internal")),
    ),
    Variant("user field", ROUTE_CHAT, _set(user="alice")),
    Variant("metadata field", ROUTE_CHAT, _set(metadata={"session": "x"})),
    Variant("request id", ROUTE_CHAT, _set(request_id="req-123")),
    Variant("1 vs 1.0 (max_tokens 32.0)", ROUTE_CHAT, _set(max_tokens=32.0)),
    Variant("1 vs 1.0 (temperature 0.0)", ROUTE_CHAT, _set(temperature=0.0)),
    Variant("stop as a single string twice", ROUTE_CHAT, _set(stop=["END", "\n\n", "\n\n"])),
    Variant("completion: explicit default echo", ROUTE_COMPLETIONS, _set(echo=False)),
    Variant("completion: stream", ROUTE_COMPLETIONS, _set(stream=True)),
    Variant(
        "completion: NFD prompt",
        ROUTE_COMPLETIONS,
        _set(prompt=unicodedata.normalize("NFD", "The capital of France is")),
    ),
]

MUST_MISS: list[Variant] = [
    Variant("model", ROUTE_CHAT, _set(model="gemma3")),
    Variant("user message text", ROUTE_CHAT, _user("Name three prime numbers!\nBe brief.")),
    Variant("user message case", ROUTE_CHAT, _user("name three prime numbers.\nBe brief.")),
    Variant("leading whitespace", ROUTE_CHAT, _user(" Name three prime numbers.\nBe brief.")),
    Variant("system prompt", ROUTE_CHAT, _system("You are a verbose assistant. Café.")),
    Variant("no system prompt", ROUTE_CHAT, _m(lambda b: b["messages"].pop(0))),
    Variant("role", ROUTE_CHAT, _m(lambda b: b["messages"][1].update(role="assistant"))),
    Variant("temperature", ROUTE_CHAT, _set(temperature=0.7)),
    Variant("temperature omitted (=1.0)", ROUTE_CHAT, _m(lambda b: b.pop("temperature"))),
    Variant("seed", ROUTE_CHAT, _set(seed=42)),
    Variant("max_tokens", ROUTE_CHAT, _set(max_tokens=33)),
    Variant("n", ROUTE_CHAT, _set(n=2)),
    Variant("top_p", ROUTE_CHAT, _set(top_p=0.9)),
    Variant("stop set", ROUTE_CHAT, _set(stop=["END"])),
    Variant(
        "tool description",
        ROUTE_CHAT,
        _m(lambda b: b["tools"][0]["function"].update(description="look a word up!")),
    ),
    Variant(
        "tool parameter type",
        ROUTE_CHAT,
        _m(lambda b: b["tools"][1]["function"]["parameters"]["properties"]["a"].update(type="number")),
    ),
    Variant(
        "tool property order",
        ROUTE_CHAT,
        _m(
            lambda b: b["tools"][1]["function"]["parameters"].update(
                properties={"b": {"type": "integer"}, "a": {"type": "integer"}}
            )
        ),
    ),
    Variant("tool removed", ROUTE_CHAT, _m(lambda b: b["tools"].pop())),
    Variant("tool_choice", ROUTE_CHAT, _set(tool_choice="required")),
    Variant(
        "tool_choice named", ROUTE_CHAT, _set(tool_choice={"type": "function", "function": {"name": "add"}})
    ),
    Variant("response_format json_object", ROUTE_CHAT, _set(response_format={"type": "json_object"})),
    Variant(
        "response_format json_schema",
        ROUTE_CHAT,
        _set(
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "array"}}}
        ),
    ),
    Variant("logit_bias", ROUTE_CHAT, _set(logit_bias={"50256": -100})),
    Variant("logprobs", ROUTE_CHAT, _set(logprobs=True, top_logprobs=2)),
    Variant("return_token_ids", ROUTE_CHAT, _set(return_token_ids=True)),
    Variant("token_healing", ROUTE_CHAT, _set(token_healing=True)),
    Variant("guided_regex", ROUTE_CHAT, _set(guided_regex="[0-9]+")),
    Variant("json_schema_options", ROUTE_CHAT, _set(json_schema_options={"compact": True})),
    Variant("unknown extension field", ROUTE_CHAT, _set(repetition_penalty=1.1)),
    Variant("true vs 1", ROUTE_CHAT, _set(parallel_tool_calls=1)),
    Variant("tenant", ROUTE_CHAT, lambda b: b, tenant="tenant-b"),
    Variant("no tenant", ROUTE_CHAT, lambda b: b, tenant=""),
    Variant("completion: prompt trailing space", ROUTE_COMPLETIONS, _set(prompt="The capital of France is ")),
    Variant("completion: prompt CRLF", ROUTE_COMPLETIONS, _set(prompt="The capital of\r\nFrance is")),
    Variant("completion: max_tokens", ROUTE_COMPLETIONS, _set(max_tokens=9)),
    Variant("completion: echo", ROUTE_COMPLETIONS, _set(echo=True)),
    Variant(
        "completion: same body on chat route",
        ROUTE_CHAT,
        lambda b: {**b, "messages": [{"role": "user", "content": "The capital of France is"}]},
    ),
]


def _base(route: str) -> dict[str, Any]:
    return base_chat() if route == ROUTE_CHAT else base_completion()


@dataclass
class PitfallResult:
    hits_ok: list[str]
    hits_failed: list[str]
    misses_ok: list[str]
    misses_failed: list[str]

    @property
    def hit_rate(self) -> float:
        return len(self.hits_ok) / max(1, len(self.hits_ok) + len(self.hits_failed))

    @property
    def wrong_hit_rate(self) -> float:
        return len(self.misses_failed) / max(1, len(self.misses_ok) + len(self.misses_failed))


def run_pitfalls() -> PitfallResult:
    """Fingerprint every variant against its base; a must-miss variant of the completion base uses that base."""
    res = PitfallResult([], [], [], [])
    for v in MUST_HIT:
        base = _base(v.route)
        same = fingerprint_request(v.route, v.mutate(base), tenant=v.tenant) == fingerprint_request(
            v.route, base, tenant=BASE_TENANT
        )
        (res.hits_ok if same else res.hits_failed).append(v.name)
    for v in MUST_MISS:
        base_route = ROUTE_COMPLETIONS if v.name.startswith("completion:") else ROUTE_CHAT
        base = _base(base_route)
        same = fingerprint_request(v.route, v.mutate(base), tenant=v.tenant) == fingerprint_request(
            base_route, base, tenant=BASE_TENANT
        )
        (res.misses_failed if same else res.misses_ok).append(v.name)
    return res
