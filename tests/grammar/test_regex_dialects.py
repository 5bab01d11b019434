"""Regex readings: a JSON Schema validator may read a pattern as ECMA-262 does or as Python's `re` does.

A value `pattern` must hold in both readings; a patternProperties key counts as matched when either reading
matches it (and a key only one reading matches must satisfy additionalProperties too). Differential tests
against `jsonschema` (Python's reading) over keys and strings made of the characters the readings disagree on.
"""

from __future__ import annotations

import itertools
import json
import random

import jsonschema
import pytest

from tokenseam.grammar import cpauto
from tokenseam.grammar.regex import parse_regex

from .conftest import accepts_text

# Characters on which ECMA-262 and Python disagree: line terminators for `.` and `$`, Unicode digits, word
# characters and spaces for \d \w \s; and plain ASCII for the cases both readings agree on.
TRICKY = ["\r", "\n", "\u2028", "\u2029", "\u0663", "\xe9", "\xa0", "\x0b", "\x1c"]
PLAIN = ["a", "x", "y", "1", "_", " ", "-"]
PATTERNS = [r"^.+$", r"^\d+$", r"^\w+$", r"^\s*$", r"^a$", r"^x.y$", r"[a-z]$", r"^[\w-]+$", r"^\S+\Z"]


def _strings(rng: random.Random, n: int) -> list[str]:
    out = ["", "a", "a\n", "\n", "x\ry", "x\u2028y", "\u0663", "\xe9", "a\n\n"]
    for _ in range(n):
        k = rng.randint(1, 4)
        out.append("".join(rng.choice(TRICKY + PLAIN) for _ in range(k)))
    return out


def _plain(text: str) -> bool:
    return all(c in PLAIN for c in text)


def test_the_fuzzed_wrong_accept_is_gone(compiler):
    g = compiler.compile_json_schema({"type": "object", "patternProperties": {"^.+$": {"type": "integer"}}})
    assert not accepts_text(g, '{"a\\rb": "x"}')
    assert not accepts_text(g, '{"\\u2029": "x"}')
    assert accepts_text(g, '{"a\\rb": 1}') and accepts_text(g, '{"ab": 1}') and accepts_text(g, '{"": "x"}')


def test_python_reads_dollar_before_a_final_newline():
    for pattern, text in (("^a$", "a\n"), ("^.+$", "a\r"), (r"\d", "\u0663")):
        for dialect, want in (("python", True), ("ecma", False), ("json-schema", False)):
            d = cpauto.determinize(cpauto.from_ir(parse_regex(pattern, search=True, dialect=dialect)))
            assert cpauto.accepts(d, text) == want, (pattern, text, dialect)
    d = cpauto.determinize(cpauto.from_ir(parse_regex(r"^a\Z", search=True, dialect="python")))
    assert not cpauto.accepts(d, "a\n")


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("addl", [True, False, {"type": "string"}])
def test_pattern_property_keys_against_jsonschema(compiler, pattern, addl):
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "patternProperties": {pattern: {"type": "integer"}},
        "additionalProperties": addl,
    }
    g = compiler.compile_json_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(pattern)
    for key, value in itertools.product(_strings(rng, 60), [1, "s"]):
        doc = {key: value}
        text = json.dumps(doc)
        ok = validator.is_valid(doc)
        got = accepts_text(g, text)
        assert ok or not got, f"wrong accept {text} under {pattern!r}, additionalProperties {addl}"
        if _plain(key):  # both readings agree: exact
            assert got == ok, f"wrong reject {text} under {pattern!r}, additionalProperties {addl}"


@pytest.mark.parametrize("pattern", PATTERNS)
def test_value_patterns_against_jsonschema(compiler, pattern):
    schema = {"type": "string", "pattern": pattern}
    g = compiler.compile_json_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for s in _strings(random.Random(pattern), 120):
        ok = validator.is_valid(s)
        got = accepts_text(g, json.dumps(s))
        assert ok or not got, f"wrong accept {s!r} under {pattern!r}"
        if _plain(s):
            assert got == ok, f"wrong reject {s!r} under {pattern!r}"


def test_declared_names_a_pattern_matches_in_either_reading(compiler):
    # "a\n" is declared; Python's `^a$` matches it, ECMA's does not: Python validators apply the pattern's
    # schema to it, so the grammar does too.
    schema = {
        "type": "object",
        "properties": {"a\n": {"type": "number"}},
        "patternProperties": {"^a$": {"type": "integer"}},
    }
    g = compiler.compile_json_schema(schema)
    assert accepts_text(g, '{"a\\n": 1}')
    assert not accepts_text(g, '{"a\\n": 1.5}')
    assert not jsonschema.Draft202012Validator(schema).is_valid({"a\n": 1.5})


ONLY_DOLLAR = [r"^a$", r"[a-z]$", r"^[0-9a-zA-Z_-]{1,12}$", r"^(ab|c)$|^x", r"abc", r"^a\Z", r"^[^\n]+$"]
DIALECT_CLASSES = [r"^.+$", r"^\d+$", r"^\w$", r"^x.y$", r"^[\w-]+$", r"a\s"]


@pytest.mark.parametrize("pattern", ONLY_DOLLAR + DIALECT_CLASSES)
def test_readings_that_differ_only_in_dollar_skip_the_intersection(pattern):
    # When the readings differ only in `$`, "both" is the ECMA reading and "either" the Python one, with no
    # product or union built; the languages are those the product and the union give.
    from tokenseam.grammar.ir import alt
    from tokenseam.grammar.json_schema import _Compiler

    c = _Compiler({}, False, False, False, 40)
    entry = c._pattern(pattern, "")
    assert entry["dollar_only"] == (pattern in ONLY_DOLLAR)
    assert "ecma" not in entry and "python" not in entry  # (the automata are built when first asked for)
    ecma, python = c.pattern_dfa(pattern, "", "ecma"), c.pattern_dfa(pattern, "", "python")
    assert (c.pattern_dfa(pattern, "", "both") is ecma) == (pattern in ONLY_DOLLAR)
    refs = {
        "both": cpauto.product(ecma, python),
        "either": cpauto.determinize(cpauto.from_ir(alt(*entry["ir"]))),
    }
    for reading, ref in refs.items():
        got = c.pattern_dfa(pattern, "", reading)
        for a, b in ((got, ref), (ref, got)):
            assert cpauto.is_empty(cpauto.product(a, cpauto.complement(b))), (pattern, reading)


@pytest.mark.parametrize("pattern", [r"^[a-z]{1,3}$", r"^\d+$"])
def test_keys_of_one_reading_under_additional_false_are_not_built(pattern):
    # A key only one reading matches must satisfy the pattern's schema and additionalProperties: under `false`
    # nothing does (the allOf of the two is NOTHING itself, not a reference to an empty rule), so the region
    # is dropped before its automaton (either minus both) is built.
    from tokenseam.grammar.budget import compile_budget
    from tokenseam.grammar.ir import NOTHING
    from tokenseam.grammar.json_schema import _Compiler

    schema = {
        "type": "object",
        "patternProperties": {pattern: {"anyOf": [{"type": "integer"}, {"type": "object"}]}},
        "additionalProperties": False,
    }
    c = _Compiler(schema, False, False, False, 40)
    with compile_budget(10, None, None):
        root = c.compile(schema, "")
    assert root != NOTHING
    assert "one" not in c.pattern_dfas[pattern] and "both" in c.pattern_dfas[pattern]
    assert c.compile({"allOf": [{"type": "object"}, False]}, "") == NOTHING


def test_keys_outside_several_patterns_is_the_product_of_their_complements():
    # The additional keys of an object with several patterns are built as one union, complemented once; the
    # language is the one of intersecting "none of the words" with each pattern's complement in turn.
    from tokenseam.grammar.budget import compile_budget
    from tokenseam.grammar.json_schema import _Compiler

    cases = [
        ([r"^x.y$", r"^\d+$", r"^y"], ["a", "yy", "x\ny"]),
        ([r"^/", r"^[^/]"], ["ColorPalette"]),
        ([r"^\w+$", r"^\s*$"], []),
        ([r"^a_[a-z]{2,3}$", r"^b_[a-z]{2,3}(-[0-9]{2})?$", r"^c\Z"], ["a_xy", "b", "c"]),
    ]
    for patterns, words in cases:
        with compile_budget(10, None, None):
            c = _Compiler({}, strict=False, lenient=False, compact=False, max_ws=0)
            got = c.keys_outside(patterns, words, "")
            want = cpauto.not_words(words)
            for p in patterns:
                want = cpauto.product(want, c.pattern_dfa(p, "", "either", complement=True))
            assert cpauto.is_empty(cpauto.product(got, cpauto.complement(want))), patterns
            assert cpauto.is_empty(cpauto.product(want, cpauto.complement(got))), patterns
            # No state the start does not reach or that reaches no final one is kept.
            assert all(d is not None for d in cpauto.dist_to_final(got)), patterns
        for key in _strings(random.Random(str(patterns)), 80) + words + ["x1y", "123", "yz", "/a", "a_xyz"]:
            matched = key in words or any(
                c.key_matches(p, "", key, r) for p in patterns for r in ("ecma", "python")
            )
            assert cpauto.accepts(got, key) == (not matched), (patterns, key)


def test_additional_keys_beside_several_patterns_against_jsonschema(compiler):
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "yy": {"type": "boolean"}},
        "patternProperties": {
            r"^x.y$": {"type": "integer"},
            r"^\d+$": {"type": "integer"},
            r"^y": {"type": "null"},
        },
        "additionalProperties": {"type": "string"},
    }
    g = compiler.compile_json_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for key, value in itertools.product(_strings(random.Random(5), 80) + ["x1y", "12", "yz"], [1, "s", None]):
        doc = {key: value}
        ok = validator.is_valid(doc)
        got = accepts_text(g, json.dumps(doc))
        assert ok or not got, f"wrong accept {doc}"
        if _plain(key):
            assert got == ok, f"wrong reject {doc}"
