"""Hostile inputs: huge or deeply nested grammars are a GrammarError (or compile), never a crash or hang."""

from __future__ import annotations

import pytest

from tokenseam.grammar import GrammarError
from tokenseam.grammar.request import constraint_from_request


@pytest.mark.parametrize(
    "make",
    [
        lambda c: c.compile_regex("(" * 5000 + "a" + ")" * 5000),
        lambda c: c.compile_regex("a|" * 200_000 + "b"),
        lambda c: c.compile_regex("[" + "a-z" * 100_000 + "]{3}"),
        lambda c: c.compile_gbnf("root ::= " + "(" * 5000 + '"a"' + ")" * 5000),
        lambda c: c.compile_gbnf(
            "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1} r{i + 1}\n" for i in range(60)) + 'r60 ::= "x"'
        ),
        lambda c: c.compile_choice([f"option number {i}" for i in range(200_000)]),
        lambda c: c.compile_choice([f"opt {i}" for i in range(20_000)]),
        lambda c: c.compile_json_schema({"enum": list(range(5000))}),
        lambda c: c.compile_json_schema({"type": "string", "pattern": "(a|b)*a(a|b){40}", "maxLength": 50}),
        lambda c: c.compile_json_schema({"anyOf": [{"anyOf": [{"type": "string"}] * 50}] * 50}),
        lambda c: c.compile_json_schema(
            {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(3000)}}
        ),
    ],
)
def test_huge_inputs_error_or_compile(compiler, make):
    try:
        make(compiler)
    except GrammarError as exc:
        assert str(exc)


def test_hostile_request_bodies(compiler):
    for body in (
        {"guided_json": "[" * 100_000},
        {"guided_json": {"$ref": "#/" + "a/" * 1000}},
        {"response_format": {"type": "json_schema", "json_schema": {"schema": "x" * 10}}},
        {"guided_choice": [""] * 3},
        {"tools": "x", "tool_choice": "required"},
    ):
        try:
            constraint_from_request(compiler, body, "/v1/chat/completions")
        except GrammarError as exc:
            assert str(exc)
