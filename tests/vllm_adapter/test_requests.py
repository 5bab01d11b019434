"""What the vLLM backend makes of each request kind, and the checks that turn bad grammars into 400s."""

from __future__ import annotations

import json

import pytest

from tokenseam.grammar import GrammarCompiler, GrammarError, check_grammar
from tokenseam.vllm.requests import PARAM, Checker, compile_plan, plan
from tokenseam.vllm.xargs import (
    HEALING_KEY,
    MAX_HEALING_BYTES,
    PROPERTY_ORDER_ENV,
    PROPERTY_ORDER_KEY,
    healing_bytes,
    property_order,
)


def test_plans():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert plan("JSON", json.dumps(schema)).payload == schema
    assert plan("JSON", schema, strict=True, compact=True).options == {"strict": True, "compact": True}
    assert plan("JSON_OBJECT", "").payload == {"type": "object"}
    assert plan("REGEX", "a+").kind == "regex"
    assert plan("CHOICE", '["x", "y"]').payload == ["x", "y"]
    assert plan("GRAMMAR", 'root ::= "a"').kind == "gbnf"
    assert set(PARAM) == {"JSON", "JSON_OBJECT", "REGEX", "GRAMMAR", "CHOICE", "STRUCTURAL_TAG"}


@pytest.mark.parametrize(
    "kind,spec,needle",
    [
        ("JSON", "{not json", "not valid JSON"),
        ("JSON", "[1, 2]", "object or a boolean"),
        ("JSON", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("CHOICE", "[]", "non-empty list"),
        ("CHOICE", '["a", 3]', "non-empty list"),
        ("CHOICE", "{", "not valid JSON"),
        ("GRAMMAR", "start: 'a' | 'b'", "Lark/EBNF"),
        ("GRAMMAR", "   ", "non-empty"),
        ("REGEX", 7, "must be a string"),
        ("STRUCTURAL_TAG", "{}", "not supported"),
        ("SOMETHING", "", "unknown"),
    ],
)
def test_bad_requests_are_refused(kind, spec, needle):
    with pytest.raises(GrammarError) as e:
        plan(kind, spec)
    assert needle in str(e.value)


def test_options_only_for_json():
    with pytest.raises(GrammarError, match="JSON only"):
        plan("REGEX", "a", strict=True)


@pytest.mark.parametrize(
    "kind,payload,needle",
    [
        ("json_schema", {"type": "string", "pattern": "(?<=a)b"}, "lookaround"),
        ("json_schema", {"type": "strnig"}, "strnig"),
        ("json_schema", {"$ref": "https://example.com/s.json"}, "$ref"),
        (
            "json_schema",
            {"type": "object", "propertyNames": {"format": "email"}},
            "propertyNames",
        ),
        ("regex", "(a", "missing ')'"),
        ("gbnf", 'root ::= x\nx ::= "a" x', ""),
        ("gbnf", "root ::= undefined-rule", "undefined"),
    ],
)
def test_check_refuses_what_a_compile_refuses(smollm2_vocab, kind, payload, needle):
    """check_grammar (no vocabulary) raises exactly where a real compile does."""
    with pytest.raises(GrammarError) as checked:
        check_grammar(kind, payload)
    assert needle in str(checked.value)
    compiler = GrammarCompiler(smollm2_vocab)
    compile_kind = {"json_schema": "JSON", "regex": "REGEX", "gbnf": "GRAMMAR"}[kind]
    with pytest.raises(GrammarError) as compiled:
        compile_plan(compiler, plan(compile_kind, payload if kind != "json_schema" else json.dumps(payload)))
    assert str(compiled.value) == str(checked.value)


def test_check_options_and_kinds():
    with pytest.raises(GrammarError, match="unknown grammar kind"):
        check_grammar("lark", "x")
    with pytest.raises(GrammarError, match="take no options"):
        check_grammar("regex", "a", strict=True)
    assert check_grammar("json_schema", {"type": "object"}, strict=True) == []


def test_checker_remembers_verdicts(monkeypatch):
    import tokenseam.vllm.requests as requests

    calls = []
    real = requests.check_grammar

    def counting(kind, payload, **options):
        calls.append(payload)
        return real(kind, payload, **options)

    monkeypatch.setattr(requests, "check_grammar", counting)
    c = Checker(size=2)
    good, bad = plan("REGEX", "a+"), plan("REGEX", "(a")
    c.check(good)
    c.check(good)
    for _ in range(3):
        with pytest.raises(GrammarError, match="missing"):
            c.check(bad)
    assert calls == ["a+", "(a"]  # each verdict computed once
    for i in range(5):
        c.check(plan("REGEX", f"a{{{i}}}"))
    assert len(c._seen) == 2  # bounded


@pytest.mark.parametrize(
    "args,expected",
    [
        (None, b""),
        ({}, b""),
        ({"other": 1}, b""),
        ({HEALING_KEY: ""}, b""),
        ({HEALING_KEY: "3a2f"}, b":/"),
        ({HEALING_KEY: "e2"}, b"\xe2"),  # a cut UTF-8 sequence is fine: healing works on bytes
    ],
)
def test_healing_args(args, expected):
    assert healing_bytes(args) == expected


@pytest.mark.parametrize(
    "args,needle",
    [
        ({HEALING_KEY: "zz"}, "hex string"),
        ({HEALING_KEY: "abc"}, "hex string"),
        ({HEALING_KEY: 58}, "hex string"),
        ({HEALING_KEY: ["3a"]}, "hex string"),
        ({HEALING_KEY: "00" * (MAX_HEALING_BYTES + 1)}, "longer than"),
        ({"tokenseam_heal": "3a"}, "not a tokenseam argument"),
    ],
)
def test_bad_healing_args(args, needle):
    with pytest.raises(ValueError) as e:
        healing_bytes(args)
    assert needle in str(e.value)


def test_property_order_args(monkeypatch):
    monkeypatch.delenv(PROPERTY_ORDER_ENV, raising=False)
    assert property_order(None) == "schema"
    assert property_order({PROPERTY_ORDER_KEY: "any", HEALING_KEY: "3a"}) == "any"
    monkeypatch.setenv(PROPERTY_ORDER_ENV, "any")
    assert property_order({}) == "any"
    assert property_order({PROPERTY_ORDER_KEY: "schema"}) == "schema"
    assert healing_bytes({PROPERTY_ORDER_KEY: "any"}) == b""  # each reader knows the other's key
    for bad in ("random", 1, ["any"], ""):
        with pytest.raises(ValueError, match=PROPERTY_ORDER_KEY):
            property_order({PROPERTY_ORDER_KEY: bad})
    monkeypatch.setenv(PROPERTY_ORDER_ENV, "sorted")
    with pytest.raises(ValueError, match=PROPERTY_ORDER_ENV):
        property_order({})


def test_property_order_reaches_json_plans_only():
    p = plan("JSON", '{"type": "object"}', property_order="any")
    assert p.options == {"property_order": "any"}
    assert plan("JSON_OBJECT", "", strict=True, property_order="any").options == {
        "strict": True,
        "property_order": "any",
    }
    assert plan("REGEX", "a+", property_order="any").options == {}  # no objects: nothing to order
    assert plan("JSON", "{}").options == {}
