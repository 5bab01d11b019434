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


@pytest.mark.parametrize("python_builder", [False, True])
def test_a_grammar_whose_parses_double_with_every_byte_stops_the_automaton_not_the_request(
    compiler, python_builder, monkeypatch
):
    """Two recursive rules that read the same text: each "a" doubles the call stacks left open. The automaton
    stops at MAX_STATE_CONFIGS of them with a clear error (not a mask that takes seconds, then minutes, with
    memory to match); a matcher then moves to the GSS parser and the request goes on (test_gss.py)."""
    import numpy as np

    from tokenseam.grammar import GrammarMatcher, automaton
    from tokenseam.grammar.localbuild import MAX_STATE_CONFIGS

    g = compiler.compile_gbnf('root ::= x\nx ::= "a" x | "a" y | "a"\ny ::= "a" x | "a" y | "a"')
    limit = MAX_STATE_CONFIGS
    if python_builder:  # the reference builder raises the same error (at a lower limit: Python is slow)
        monkeypatch.setattr(automaton, "MAX_STATE_CONFIGS", 256)
        limit = 256
    auto = automaton.Automaton(g.current[0].prepared, g.current[0].table, python_builder=python_builder)
    with pytest.raises(GrammarError, match=f"parses open \\(limit {limit}\\)"):
        st = auto.start
        for _ in range(40):  # 2**15 > the limit: it stops near the 15th byte
            st = auto.step_bytes(st, b"a")
    if python_builder:
        return
    before = g.gss_fallbacks
    m = GrammarMatcher(g)
    mask = np.zeros(compiler.vocab.mask_words, dtype=np.int32)
    for _ in range(40):
        m.fill_next_token_bitmask(mask)
        assert m.accept_bytes(b"a")
    assert g.gss_fallbacks == before + 1
    m.fill_next_token_bitmask(mask)
    assert m.is_accepting()
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")
    tb = compiler.vocab.token_bytes
    assert bits[tb.index(b"a")] and bits[tb.index(b"aa")] and not bits[tb.index(b"b")]
    # an unambiguous grammar for the same text is unaffected
    m = GrammarMatcher(compiler.compile_gbnf('root ::= "a"+'))
    for _ in range(40):
        m.fill_next_token_bitmask(mask)
        assert m.accept_bytes(b"a")


def test_schemas_that_are_no_json_are_refused_by_name(compiler):
    # A schema object that holds itself (only a Python caller can make one) or a value JSON has no form for.
    loop: dict = {"type": "object", "properties": {}}
    loop["properties"]["self"] = loop
    with pytest.raises(GrammarError, match="nested too deeply"):
        compiler.compile_json_schema(loop)
    with pytest.raises(GrammarError, match="not JSON-serialisable"):
        compiler.compile_json_schema({"type": "string", "enum": [object()]})
    with pytest.raises(GrammarError, match="not JSON-serialisable"):
        compiler.compile_json_schema({"type": "object", "properties": {1j: {}}})


def test_one_schema_written_twice_is_one_cache_entry(compiler):
    # The cache key is the schema's JSON text, whatever its characters.
    one = compiler.compile_json_schema({"type": "object", "properties": {"é日本\U0001f600": {"const": "ü"}}})
    two = compiler.compile_json_schema({"properties": {"é日本\U0001f600": {"const": "ü"}}, "type": "object"})
    assert (
        compiler.compile_json_schema({"type": "object", "properties": {"é日本\U0001f600": {"const": "ü"}}})
        is one
    )
    assert two is not one  # another key order is another text (compiled once more, to the same language)
