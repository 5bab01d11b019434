"""Constraint fields translated into each upstream's dialect, or refused (400 naming the field), never dropped."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tokenseam.gateway.dialects import FieldError, gbnf_choice, regex_choice, translate
from tokenseam.grammar import GrammarCompiler, GrammarMatcher
from tokenseam.testing.fake_upstream import FakeUpstream

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    "field,value,so",
    [
        ("guided_json", SCHEMA, {"json": SCHEMA}),
        ("guided_json", json.dumps(SCHEMA), {"json": SCHEMA}),
        ("guided_regex", "[a-z]+", {"regex": "[a-z]+"}),
        ("guided_choice", ["yes", "no"], {"choice": ["yes", "no"]}),
        ("guided_grammar", 'root ::= "x"', {"grammar": 'root ::= "x"'}),
        ("json_schema", SCHEMA, {"json": SCHEMA}),
        ("grammar", 'root ::= "x"', {"grammar": 'root ::= "x"'}),
    ],
)
def test_vllm_gets_structured_outputs(field, value, so):
    out, notes = translate("vllm", CHAT, {**BASE, field: value})
    assert out["structured_outputs"] == so and field not in out
    assert notes == [f"{field} -> structured_outputs.{next(iter(so))}"]


def test_vllm_options_travel_and_the_backend_field_is_removed_and_said():
    out, notes = translate(
        "vllm",
        COMP,
        {
            "prompt": "x",
            "guided_json": SCHEMA,
            "guided_whitespace_pattern": " ?",
            "guided_decoding_backend": "xgrammar",
        },
    )
    assert out == {"prompt": "x", "structured_outputs": {"json": SCHEMA, "whitespace_pattern": " ?"}}
    assert any("guided_decoding_backend removed" in n for n in notes)
    same, notes = translate(
        "vllm", CHAT, {**BASE, "structured_outputs": {"regex": "a+", "disable_any_whitespace": True}}
    )
    assert same["structured_outputs"] == {"regex": "a+", "disable_any_whitespace": True} and notes == []


def test_llama_server_and_sglang_dialects():
    out, _ = translate("llama-server", COMP, {"prompt": "x", "guided_json": SCHEMA})
    assert out["json_schema"] == SCHEMA
    out, _ = translate("llama-server", COMP, {"prompt": "x", "guided_choice": ['say "hi"', "a\\b\n"]})
    assert out["grammar"] == gbnf_choice(['say "hi"', "a\\b\n"])
    out, _ = translate("sglang", CHAT, {**BASE, "guided_json": SCHEMA})
    assert json.loads(out["json_schema"]) == SCHEMA
    out, _ = translate("sglang", CHAT, {**BASE, "guided_choice": ["a.b", "c|d"]})
    assert out["regex"] == regex_choice(["a.b", "c|d"])
    out, _ = translate("sglang", CHAT, {**BASE, "structured_outputs": {"grammar": 'root ::= "x"'}})
    assert out["ebnf"] == 'root ::= "x"'
    out, _ = translate("llama-server", CHAT, {**BASE, "structured_outputs": {"json_object": True}})
    assert out["response_format"] == {"type": "json_object"}


def accepts(compiled, text: str) -> bool:
    m = GrammarMatcher(compiled)
    return m.accept_bytes(text.encode()) and m.is_accepting()


def test_the_choice_translations_accept_exactly_the_choices(smollm2_vocab):
    choices = ['say "hi"', "a\\b", "tab\there", "new\nline", "a.b", "c|d", "(x)", "日本"]
    c = GrammarCompiler(smollm2_vocab)
    g = c.compile_gbnf(gbnf_choice(choices))
    r = c.compile_regex(regex_choice(choices))
    for choice in choices:
        assert accepts(g, choice) and accepts(r, choice), choice
    for wrong in ["say hi", "ab", "a", "axb", "cxd", "x", ""]:
        assert not accepts(g, wrong) and not accepts(r, wrong), wrong
    assert re.fullmatch(regex_choice(choices), "a.b") and not re.fullmatch(regex_choice(choices), "aXb")


def test_a_hosted_upstream_gets_response_format_on_chat_only():
    out, notes = translate("openai", CHAT, {**BASE, "guided_json": SCHEMA})
    assert out["response_format"]["json_schema"]["schema"] == SCHEMA and notes == [
        "guided_json -> response_format"
    ]
    with pytest.raises(FieldError) as e:
        translate("openai", COMP, {"prompt": "x", "guided_json": SCHEMA})
    assert e.value.param == "guided_json" and "only as response_format on chat" in str(e.value)


@pytest.mark.parametrize(
    "kind,body,param,needle",
    [
        ("llama-server", {"guided_regex": "a+"}, "guided_regex", "no regex constraint"),
        ("openai", {"guided_choice": ["a"]}, "guided_choice", "no choice constraint"),
        ("openai", {"guided_grammar": "root ::= x"}, "guided_grammar", "no grammar constraint"),
        (
            "sglang",
            {"guided_json": SCHEMA, "guided_whitespace_pattern": " "},
            "guided_whitespace_pattern",
            "vLLM option",
        ),
        (
            "llama-server",
            {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}},
            "structured_outputs",
            "vLLM option",
        ),
        ("vllm", {"guided_json": SCHEMA, "guided_regex": "a"}, "guided_regex", "one constraint"),
        (
            "vllm",
            {"guided_json": SCHEMA, "structured_outputs": {"regex": "a"}},
            "structured_outputs",
            "one constraint",
        ),
        (
            "vllm",
            {"guided_json": SCHEMA, "response_format": {"type": "json_object"}},
            "guided_json",
            "one constraint",
        ),
        ("vllm", {"structured_outputs": {"json": SCHEMA, "regex": "a"}}, "structured_outputs", "exactly one"),
        ("vllm", {"structured_outputs": {}}, "structured_outputs", "exactly one"),
        ("vllm", {"structured_outputs": "json"}, "structured_outputs", "must be an object"),
        ("vllm", {"guided_json": "{not json"}, "guided_json", "not JSON"),
        ("vllm", {"guided_json": 5}, "guided_json", "is an object"),
        ("vllm", {"guided_regex": ["a"]}, "guided_regex", "must be a string"),
        ("vllm", {"guided_choice": []}, "guided_choice", "non-empty list"),
        ("vllm", {"guided_choice": ["a", 1]}, "guided_choice", "non-empty list"),
        ("vllm", {"guided_whitespace_pattern": " "}, "guided_whitespace_pattern", "without a constraint"),
    ],
)
def test_what_an_upstream_would_drop_is_refused(kind, body, param, needle):
    with pytest.raises(FieldError) as e:
        translate(kind, CHAT, {**BASE, **body})
    assert e.value.param == param and needle in str(e.value)


def test_a_tokenseam_upstream_takes_every_dialect_itself():
    body = {**BASE, "guided_regex": "a+", "guided_decoding_backend": "x"}
    assert translate("tokenseam", CHAT, body) == (body, [])


def test_no_constraint_no_change():
    assert translate("openai", CHAT, BASE) == (BASE, [])
    assert translate("vllm", CHAT, {**BASE, "response_format": {"type": "json_object"}})[0]["response_format"]


# -- through a gateway ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "owned_by,field,expect,note",
    [
        ("vllm", "structured_outputs", {"regex": "[0-9]+"}, "structured_outputs.regex"),
        ("sglang", "regex", "[0-9]+", "regex"),
        ("tokenseam", "guided_regex", "[0-9]+", None),
    ],
)
def test_the_gateway_sends_each_replica_its_dialect(gateway, owned_by, field, expect, note):
    with FakeUpstream(owned_by=owned_by) as up:
        gw = gateway([up.url])
        r = httpx.post(
            gw.url + CHAT,
            json={
                "model": "fake-model",
                "messages": BASE["messages"],
                "temperature": 0,
                "guided_regex": "[0-9]+",
            },
            timeout=30,
        )
        assert r.status_code == 200, r.text
        assert up.state.last_body[field] == expect
        if owned_by == "tokenseam":
            assert "x-tokenseam-translated" not in r.headers
        else:
            assert r.headers["x-tokenseam-translated"] == f"guided_regex -> {note}"
            assert "guided_regex" not in up.state.last_body


def test_the_gateway_refuses_what_llama_server_would_drop(gateway):
    with FakeUpstream(owned_by="llamacpp") as up:
        gw = gateway([up.url])
        for stream in (False, True):
            r = httpx.post(
                gw.url + COMP,
                json={"model": "fake-model", "prompt": "x", "guided_regex": "a+", "stream": stream},
                timeout=30,
            )
            err = r.json()["error"]
            assert (
                r.status_code == 400 and err["param"] == "guided_regex" and err["code"] == "unsupported_field"
            )
            assert "llama-server upstream has no regex" in err["message"]
        assert up.state.calls == 0 and gw.pool.replicas[0].in_flight == 0
