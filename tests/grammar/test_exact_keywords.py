"""Keywords made exact after the first rounds of issue 21: each one checked against `jsonschema` over generated
instances, valid and invalid, through the real compiled automaton; what stays inexact is a GrammarError."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from tokenseam.grammar import GrammarError
from tokenseam.grammar.json_schema import _Compiler

from .conftest import accepts_text

KEYS = ["a", "b", "foo", "bar"]
WORDS = ["", "a", "x", "ab", "foo", "bar", "é", "a1"]


def _value(rng: random.Random, depth: int = 0):
    k = rng.randrange(8 if depth < 3 else 5)
    if k == 0:
        return None
    if k == 1:
        return rng.random() < 0.5
    if k == 2:
        return rng.choice([0, 1, 2, 3, -1, 6, 100, 1.5, 2.5, -0.5, 0.25, 1e-05, 3.5])
    if k in (3, 4):
        return rng.choice(WORDS)
    if k in (5, 6):
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {key: _value(rng, depth + 1) for key in rng.sample(KEYS, rng.randrange(4))}


def _guided(s, rng: random.Random, root, depth: int = 0):
    """A value shaped after schema `s` (its declared properties, items, enum values, types), loosely: about
    half of what it makes is valid."""
    if depth > 4 or not isinstance(s, dict) or rng.random() < 0.1:
        return _value(rng, 3)
    if "$ref" in s:
        target = root
        for part in s["$ref"].lstrip("#").split("/")[1:]:
            target = target[part]
        return _guided(target, rng, root, depth + 1)
    for key in ("allOf", "anyOf", "oneOf"):
        if key in s and rng.random() < 0.8:
            return _guided(rng.choice(s[key]), rng, root, depth + 1)
    if "enum" in s or "const" in s:
        return rng.choice(s["enum"] if "enum" in s else [s["const"]])
    t = s.get("type")
    t = rng.choice(t) if isinstance(t, list) else t
    if t is None:
        t = "object" if "properties" in s or "required" in s else "array" if "items" in s else None
    if t == "object":
        props = dict(s.get("properties", {}))
        for r in s.get("required", []):
            props.setdefault(r, {})
        names = [k for k in props if rng.random() < 0.7]
        out = {k: _guided(props[k], rng, root, depth + 1) for k in names}
        if rng.random() < 0.3:
            out[rng.choice(KEYS)] = _value(rng, 3)
        return out
    if t == "array":
        items = s.get("items", {})
        return [_guided(items, rng, root, depth + 1) for _ in range(rng.randrange(4))]
    if t == "string":
        return rng.choice(WORDS + ["fa", "b1", "1", "none", "1B", "gpt"])
    if t in ("number", "integer"):
        return rng.choice([0, 1, 2, 7, -3, 1.5, 20, 21, 4.5])
    return _value(rng, 3)


def instances(schema, n: int = 300, seed: int = 1) -> list:
    """Random JSON values of every type, values shaped after the schema, the schema's own enum/const values,
    and values built from them."""
    rng = random.Random(seed)
    out = [_value(rng) for _ in range(n)] + [_guided(schema, rng, schema) for _ in range(n)]
    found: list = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k in ("enum", "const"):
                    found.extend(v if k == "enum" else [v])
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(schema)
    out += found
    out += [[v] for v in found] + [[v, v] for v in found] + [found[:3], found[::-1][:3]]
    return out


def spellings(v) -> list[str]:
    texts = [json.dumps(v), json.dumps(v, separators=(",", ":"))]
    if isinstance(v, float) and v.is_integer():
        texts.append(str(int(v)))  # the int spelling parses to another Python type
    return texts


def agree(compiler, schema, values, cls=jsonschema.Draft202012Validator, order="any") -> int:
    """Assert the compiled grammar accepts exactly the spellings of `values` the validator accepts; return
    how many of the values are valid (a test wants some of each)."""
    g = compiler.compile_json_schema(schema, property_order=order)
    validator = cls(schema)
    valid = 0
    for v in values:
        for text in spellings(v):
            want = validator.is_valid(json.loads(text))
            assert accepts_text(g, text) == want, (schema, text, want)
        valid += validator.is_valid(v)
    return valid


# -- enum/const beside keywords the validator decides -------------------------------------------------------
DECIDED = [
    {
        "allOf": [
            {"enum": [{"foo": 1}, {"foo": 1, "bar": True}]},
            {"not": {"additionalProperties": {"type": "boolean"}}},
        ]
    },
    {
        "allOf": [
            {"enum": [[[[1], [2]], [[3]]], [[["x"]]]]},
            {"not": {"items": {"items": {"items": {"type": "number"}}}}},
        ]
    },
    {
        "enum": [{"bar": 2, "foo": "baz"}, {"bar": 2}, {"foo": "qux"}, 3],
        "not": {
            "oneOf": [
                {"properties": {"bar": {"type": "integer"}}, "required": ["bar"]},
                {"properties": {"foo": {"type": "string"}}, "required": ["foo"]},
            ]
        },
    },
    {"allOf": [{"enum": [3, 1, 1.5, "a"]}, {"not": {"oneOf": [{"type": "integer"}, {"minimum": 2}]}}]},
    {
        "enum": [{"a": "bar"}, {"a": 3}, {"aaa": 30}, {"b": 1}],
        "not": {"patternProperties": {"a*": {"type": "integer"}, "aaa*": {"maximum": 20}}},
    },
    {"allOf": [{"enum": [True, 1, 1.0, 2.5, None]}, {"not": {"type": "integer"}}]},
    {"enum": [[1, 2], [1, 1], ["a", "a"], []], "uniqueItems": True},
    {"enum": [[1, 2], [3], ["a"], []], "contains": {"type": "integer"}},
    {
        "enum": ["a", "ab", "x", 3],
        "if": {"minLength": 2},
        "then": {"pattern": "b"},
        "else": {"type": "string"},
    },
    # a oneOf whose branches are enums: each keeps the values the others lack
    {"oneOf": [{"enum": [[1], [3, 4], [5]]}, {"enum": [[1], [1, 2]]}, {"enum": [[5], [6]]}]},
]


@pytest.mark.parametrize("schema", DECIDED, ids=lambda s: json.dumps(s)[:70])
def test_an_enum_beside_what_the_validator_decides_agrees_with_jsonschema(compiler, schema):
    assert agree(compiler, schema, instances(schema)) > 0


def test_an_enum_value_is_checked_in_both_regex_readings(compiler):
    # Python's \w takes é, ECMA-262's does not: a value one reading rejects is not written.
    g = compiler.compile_json_schema({"enum": ["é", "a"], "pattern": "^\\w$"})
    assert accepts_text(g, '"a"') and not accepts_text(g, '"é"')
    schema = {"enum": [{"é": 1}, {"a": 1}], "not": {"patternProperties": {"^\\w$": {"type": "string"}}}}
    g = compiler.compile_json_schema(schema)
    # the key é is matched in Python's reading only: `not` holds for a Python validator, fails for an ECMA one
    assert accepts_text(g, '{"a": 1}') and not accepts_text(g, '{"é": 1}')


def test_an_enum_under_two_merged_patterns_is_checked_against_both(compiler):
    g = compiler.compile_json_schema(
        {"allOf": [{"pattern": "a"}, {"pattern": "b"}], "enum": ["ab", "a", "b"]}
    )
    assert accepts_text(g, '"ab"') and not accepts_text(g, '"a"') and not accepts_text(g, '"b"')


def test_integral_enum_values_are_spelled_as_what_the_draft_accepts(compiler):
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "enum": [3.0, 4], "type": "integer"}
    g = compiler.compile_json_schema(draft4)
    # in draft 4 an integer has no fraction: 3.0 and 4.0 are not integers, 3 and 4 are
    assert [accepts_text(g, t) for t in ("3", "3.0", "4", "4.0")] == [True, False, True, False]
    assert agree(compiler, draft4, [3, 3.0, 4, 4.0, 5], cls=jsonschema.Draft4Validator) > 0
    g = compiler.compile_json_schema({"enum": [3.0, 4], "type": "integer"})
    assert all(accepts_text(g, t) for t in ("3", "3.0", "4", "4.0"))


def test_without_schema_dependencies_holds_in_both_readings(compiler):
    # Without $schema, `dependencies` asserts for a draft-07 reader and nothing for a 2020-12 one: a value must
    # pass both, so it applies, and no value fails it for both.
    vals = [{"a": 1}, {"a": 1, "b": 2}, {"b": 3}]
    g = compiler.compile_json_schema({"enum": vals, "dependencies": {"a": ["b"]}}, property_order="any")
    assert not accepts_text(g, '{"a": 1}') and accepts_text(g, '{"a": 1, "b": 2}')
    for schema in (
        {"enum": vals, "not": {"dependencies": {"a": ["b"]}}},
        {"not": {"dependencies": {"a": ["b"]}}},
    ):
        with pytest.raises(GrammarError, match="accepts no"):
            compiler.compile_json_schema(schema)
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "enum": vals,
        "not": {"dependencies": {"a": ["b"]}},
    }
    g = compiler.compile_json_schema(draft7, property_order="any")
    assert accepts_text(g, '{"a": 1}') and not accepts_text(g, '{"a": 1, "b": 2}')
    assert agree(compiler, draft7, vals, cls=jsonschema.Draft7Validator) == 1


def test_the_validator_reads_the_compilers_own_keywords():
    root = {"enum": ["x"]}
    v = _Compiler(root, False, False, False, 40).validator()
    schema = {
        "properties": {
            "s": {"_not_strings": ["x"]},
            "p": {"_not_pattern": ["^.+$"]},
            "n": {"type": ["__none__"]},
        }
    }
    vals = [{"s": "y"}, {"s": "x"}, {"p": ""}, {"p": "a\r"}, {"p": "a"}, {"n": 1}, {}]
    assert v.accepted(vals, schema) == [{"s": "y"}, {"p": ""}, {}]


@pytest.mark.parametrize(
    "schema",
    [
        {"enum": [0.07, 0.5], "not": {"multipleOf": 0.01}},  # 0.07 / 0.01 is 7.000000000000001 in floats
    ],
    ids=lambda s: json.dumps(s)[:60],
)
def test_an_enum_beside_what_validators_read_apart_stays_refused(compiler, schema):
    with pytest.raises(GrammarError, match="not"):
        compiler.compile_json_schema(schema)


@pytest.mark.parametrize(
    "schema,written,refused",
    [
        (  # beside the enum: only the values that are dates (a number is no string: format does not apply)
            {"enum": ["soon", "2026-12-02", "2026-02-30", 5], "format": "date"},
            ['"2026-12-02"', "5"],
            ['"soon"', '"2026-02-30"'],
        ),
        ({"enum": ["a@b.co", "x"], "not": {"format": "email"}}, ['"x"'], ['"a@b.co"']),
        (  # in another allOf part, through a $ref
            {
                "properties": {"d": {"enum": ["x", "2020-01-01T10:00:00Z"]}},
                "allOf": [{"properties": {"d": {"$ref": "#/$defs/t"}}}],
                "$defs": {"t": {"format": "date-time"}},
                "required": ["d"],
            },
            ['{"d":"2020-01-01T10:00:00Z"}'],
            ['{"d":"x"}'],
        ),
        ({"enum": ["x", 1], "format": "no-such-format"}, ['"x"', "1"], []),  # an annotation
    ],
    ids=lambda s: json.dumps(s)[:50] if isinstance(s, dict) else "",
)
def test_an_enum_beside_a_format_keeps_only_the_values_the_format_accepts(compiler, schema, written, refused):
    g = compiler.compile_json_schema(schema)
    assert all(accepts_text(g, t) for t in written)
    assert not any(accepts_text(g, t) for t in refused)


def test_an_enum_beside_a_format_the_compiler_cannot_express_is_refused(compiler):
    with pytest.raises(GrammarError, match="format 'regex' is not supported"):
        compiler.compile_json_schema({"enum": ["a+", "("], "format": "regex"})
    g = compiler.compile_json_schema({"enum": [1, 2], "format": "regex"})  # no string: nothing to check
    assert accepts_text(g, "1") and accepts_text(g, "2")


def test_a_huge_enum_beside_not_stays_within_the_limits(compiler):
    vals = [{"k": i, "s": "v" * (i % 7)} for i in range(2000)]
    g = compiler.compile_json_schema({"enum": vals, "not": {"properties": {"k": {"multipleOf": 2}}}})
    assert accepts_text(g, json.dumps({"k": 1, "s": "v"})) and not accepts_text(g, json.dumps(vals[0]))
    with pytest.raises(GrammarError, match="more than 2000 values"):
        compiler.compile_json_schema({"enum": [*vals, 1], "not": {"const": 1}})
    deep: object = 1
    for _ in range(40):
        deep = [deep]
    g = compiler.compile_json_schema({"enum": [deep, [1]], "not": {"items": {"type": "integer"}}})
    assert accepts_text(g, json.dumps(deep)) and not accepts_text(g, "[1]")


# -- negation within objects whose keys are known --------------------------------------------------------
PARTITION = {
    "type": "object",
    "properties": {"size": {"type": "string", "pattern": "^[0-9]+B$"}},
    "required": ["size"],
}
CLOSED = [
    # two object branches that both accept {"root": ...}: the one with more keys takes them, the other refuses
    {
        "oneOf": [
            {
                "type": "object",
                "properties": {"root": PARTITION, "type": {"enum": ["none"]}},
                "required": ["root"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"root": PARTITION, "boot": PARTITION, "type": {"enum": ["msdos", "gpt"]}},
                "required": ["root"],
                "additionalProperties": False,
            },
        ]
    },
    # one optional property each and nothing else: {} matches every branch
    {
        "oneOf": [
            {"type": "object", "additionalProperties": False, "properties": {"a": {"type": "string"}}},
            {"type": "object", "additionalProperties": False, "properties": {"b": {}}},
            {"type": "object", "additionalProperties": False, "properties": {"foo": {"pattern": "^f"}}},
        ]
    },
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "foo": {}},
        "additionalProperties": False,
        "not": {"patternProperties": {"o": {"type": "string"}}, "additionalProperties": {"maximum": 2}},
    },
    {"not": {"oneOf": [{"type": "string"}, {"maxLength": 2}, {"type": "array", "maxItems": 1}]}},
    {
        "oneOf": [
            {"type": "object", "properties": {"root": {"type": "integer"}}, "additionalProperties": False},
            {"type": "object", "properties": {"root": {}, "boot": {}}, "additionalProperties": False},
        ]
    },
    {"oneOf": [{"type": "object", "required": ["a"]}, {"oneOf": [{"required": ["b"]}, {"type": "string"}]}]},
]


@pytest.mark.parametrize("schema", CLOSED, ids=lambda s: json.dumps(s)[:70])
def test_negations_within_known_keys_agree_with_jsonschema(compiler, schema):
    assert agree(compiler, schema, instances(schema, 500)) > 0


def test_a_key_one_pattern_reading_matches_takes_both_schemas_under_negation(compiler):
    # é is a \w for Python's re, not for ECMA-262: {"é": v} fails the pattern's schema for one validator and
    # additionalProperties for the other, so it fails `not` for both only if it fails both schemas.
    schema = {
        "type": "object",
        "properties": {"é": {}},
        "additionalProperties": False,
        "not": {
            "patternProperties": {"^\\w$": {"type": "string"}},
            "additionalProperties": {"type": "boolean"},
        },
    }
    g = compiler.compile_json_schema(schema)
    assert accepts_text(g, '{"é": null}')  # fails both
    assert not accepts_text(g, '{"é": true}')  # valid under ECMA-262's reading, so `not` fails there
    assert not accepts_text(g, '{"é": "x"}')  # a string: valid under Python's reading
    assert not accepts_text(g, "{}")


def test_an_open_branch_overlapping_a_closed_one_stays_refused(compiler):
    # "not the closed branch" for the open one is an object with some key outside a set: no exact form here
    schema = {
        "oneOf": [
            {"type": "object", "properties": {"a": {}, "bar": {}}, "additionalProperties": False},
            {"type": "object", "patternProperties": {"^b": {"type": "integer"}}},
        ]
    }
    with pytest.raises(GrammarError, match="oneOf whose branches 0 and 1 may overlap"):
        compiler.compile_json_schema(schema)


def test_a_key_the_other_branch_forbids_makes_branches_disjoint(compiler):
    schema = {
        "oneOf": [
            {"type": "object", "required": ["size"], "properties": {"size": {"type": "integer"}}},
            {"type": "object", "patternProperties": {"^[a-z]{2,3}$": {}}, "additionalProperties": False},
        ]
    }
    assert agree(compiler, schema, instances(schema) + [{"size": 1}, {"ab": 1}, {"size": 1, "ab": 2}]) > 0


# -- contains, and not items ------------------------------------------------------------------------------
STR = {"type": "string"}
CONTAINS = [
    {"type": "array", "contains": STR},
    {"type": "array", "contains": STR, "minItems": 3, "maxItems": 4},
    {"type": "array", "contains": {"const": "a"}, "items": {"type": ["string", "null"]}, "minItems": 2},
    {"type": "array", "prefixItems": [{"type": "number"}, STR], "contains": {"type": "number"}},
    {"type": "array", "prefixItems": [True, True], "items": False, "contains": STR},
    {"contains": {"type": "array", "contains": {"const": "x"}}},
    {"contains": STR, "minContains": 0, "maxItems": 2},
    {"not": {"items": STR}},
    {"not": {"items": {"not": {"const": "a"}}}},  # some item is "a"
    {"not": {"prefixItems": [STR, {"type": "null"}], "items": False}},
    {"type": "array", "items": {"type": ["string", "boolean"]}, "not": {"items": {"type": "boolean"}}},
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "not": {"items": [STR], "additionalItems": {"type": "boolean"}},
    },
    # branches that share the empty array: each takes "and some item is not of the other's kind"
    {"oneOf": [{"type": "array", "items": STR}, {"type": "array", "items": {"type": "array", "items": STR}}]},
    {"allOf": [{"contains": STR}, {"contains": STR, "maxItems": 3}]},
]


@pytest.mark.parametrize("schema", CONTAINS, ids=lambda s: json.dumps(s)[:70])
def test_contains_and_not_items_agree_with_jsonschema(compiler, schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    assert agree(compiler, schema, instances(schema, 400), cls=cls) > 0


def test_contains_is_no_keyword_in_draft_4(compiler):
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "array", "contains": STR}
    assert agree(compiler, schema, [[], [1], ["a"]], cls=jsonschema.Draft4Validator) == 3


DRAFT_6_KEYWORDS_IN_DRAFT_4 = [
    ({"type": "string", "const": "b"}, ["b", "c"]),
    ({"type": "string", "anyOf": [{"enum": ["a"]}, {"const": "b"}]}, ["a", "b", "c"]),
    (
        {"type": "object", "properties": {"t": {"const": "x"}}, "required": ["t"]},
        [{"t": "x"}, {"t": "y"}, {}],
    ),
    ({"type": "array", "items": {"const": 1}}, [[1], [2], []]),
    ({"type": "object", "propertyNames": {"maxLength": 1}}, [{"a": 1}, {"ab": 1}]),
    ({"type": "string", "enum": ["a", "b"], "const": "a"}, ["a", "b"]),
    (
        {
            "oneOf": [
                {"type": "object", "properties": {"k": {"enum": [1]}, "v": {"const": 1}}, "required": ["k"]},
                {"type": "object", "properties": {"k": {"enum": [2]}}, "required": ["k"]},
            ]
        },
        [{"k": 1}, {"k": 2}, {"k": 1, "v": 3}, {"k": 3}],
    ),
]


@pytest.mark.parametrize("schema,values", DRAFT_6_KEYWORDS_IN_DRAFT_4, ids=lambda x: json.dumps(x)[:60])
def test_const_and_property_names_are_no_keywords_in_draft_4(compiler, schema, values):
    """Draft 6 added `const`, `contains` and `propertyNames`: a draft-4 schema's validator ignores them."""
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", **schema}
    assert agree(compiler, schema, values, cls=jsonschema.Draft4Validator) > 0


@pytest.mark.parametrize(
    "uri,cls",
    [
        ("http://json-schema.org/draft-07/schema#", jsonschema.Draft7Validator),
        ("https://json-schema.org/draft/2019-09/schema", jsonschema.Draft201909Validator),
    ],
)
def test_prefix_items_is_no_keyword_before_2020_12(compiler, uri, cls):
    schema = {
        "$schema": uri,
        "type": "array",
        "prefixItems": [{"type": "integer"}],
        "items": {"type": "string"},
    }
    assert agree(compiler, schema, [[], [1], ["a"], [1, "a"], ["a", "b"]], cls=cls) > 0


@pytest.mark.parametrize(
    "schema,where",
    [
        ({"type": "integer", "divisibleBy": 3}, "'divisibleBy' at #"),
        ({"properties": {"a": {"disallow": "string"}}}, "'disallow' at #/properties/a"),
        ({"items": {"extends": {"type": "string"}}}, "'extends' at #/items"),
    ],
)
def test_draft_3_assertions_are_refused_not_ignored(compiler, schema, where):
    """Draft 3's validators assert divisibleBy / disallow / extends: ignoring them would accept 4 for
    `divisibleBy: 3`."""
    schema = {"$schema": "http://json-schema.org/draft-03/schema#", **schema}
    with pytest.raises(GrammarError, match=where):
        compiler.compile_json_schema(schema)


def test_draft_3_keywords_are_unknown_keywords_in_later_drafts(compiler):
    schema = {"type": "integer", "divisibleBy": 3, "properties": {"extends": {}}}
    assert agree(compiler, schema, [3, 4]) == 2


@pytest.mark.parametrize("uri", [None, "http://json-schema.org/draft-06/schema#"])
@pytest.mark.parametrize(
    "bounds",
    [{"exclusiveMinimum": True}, {"minimum": 0, "exclusiveMinimum": True}, {"exclusiveMaximum": False}],
)
def test_a_boolean_exclusive_bound_is_draft_4_only(compiler, uri, bounds):
    """From draft 6 on a boolean bound is no flag: jsonschema compares with it as 0 or 1 (`minimum: 0,
    exclusiveMinimum: true` rejects 1), so neither reading is exact and the compile says so."""
    schema = {"type": "integer", **bounds} | ({"$schema": uri} if uri else {})
    with pytest.raises(GrammarError, match="draft 4's form"):
        compiler.compile_json_schema(schema)
    g = compiler.compile_json_schema(schema, lenient=True)
    assert any("read as draft 4 reads it" in w for w in g.warnings)
    draft4 = {**schema, "$schema": "http://json-schema.org/draft-04/schema#"}
    assert agree(compiler, draft4, [-1, 0, 1, 2], cls=jsonschema.Draft4Validator) > 0


def test_not_of_a_draft_6_keyword_in_draft_4_accepts_nothing(compiler):
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "not": {"const": "a"}}
    with pytest.raises(GrammarError, match="accepts no value"):
        compiler.compile_json_schema(schema)


@pytest.mark.parametrize(
    "schema,match",
    [
        ({"type": "array", "contains": STR, "maxContains": 2}, "'maxContains'"),
        ({"type": "array", "contains": STR, "minContains": 2}, "'minContains' above 1"),
        ({"allOf": [{"contains": STR}, {"contains": {"type": "null"}}]}, "'contains' twice"),
        ({"type": "array", "contains": STR, "maxItems": 1000}, "more than 64 positions"),
        ({"type": "array", "contains": STR, "minItems": 10**9}, "more than 64 positions"),
        ({"type": "array", "prefixItems": [True] * 100, "contains": STR}, "more than 64 positions"),
    ],
)
def test_contains_beyond_what_is_built_exactly_is_refused(compiler, schema, match):
    with pytest.raises(GrammarError, match=match):
        compiler.compile_json_schema(schema)


def test_contains_deep_in_arrays_compiles_within_bounds(compiler):
    schema: dict = {"const": "x"}
    for _ in range(20):
        schema = {"type": "array", "contains": schema, "maxItems": 3}
    g = compiler.compile_json_schema(schema)
    text = json.dumps("x")
    for _ in range(20):
        text = f"[1, {text}]"
    assert accepts_text(g, text) and not accepts_text(g, text.replace('"x"', '"y"'))


# -- not {type: integer} over numbers ---------------------------------------------------------------------
NUMBER_TEXTS = [
    "0",
    "-0",
    "1",
    "-7",
    "1.0",
    "-0.0",
    "1.5",
    "-2.25",
    "3.75",
    "0.001",
    "1.50",
    "1e-05",
    "2.5e-07",
    "1e2",
    "1.5e+3",
    "15e-1",
    "100e-2",
    "0.5E+0",
    "1E-1",
    "10e-1",
    "1.0e-5",
    "123456789.5",
    "1e400",
    "-1e-400",
]


def _number_agree(compiler, schema, cls, exact_spellings: bool):
    """Every number spelling the grammar accepts is valid; a valid one is accepted when `exact_spellings`, or
    when json.dumps writes it so (bounded numbers are written without exponent: that is not checked)."""
    g = compiler.compile_json_schema(schema)
    validator = cls(schema)
    bounded = "maximum" in json.dumps(schema) or "minimum" in json.dumps(schema)
    for text in NUMBER_TEXTS:
        got, want = accepts_text(g, text), validator.is_valid(json.loads(text))
        written = json.dumps(json.loads(text)) == text and not (bounded and "e" in text)
        if got or exact_spellings or written:
            assert got == want, (schema, text, want)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "number", "not": {"type": "integer"}},
        {"not": {"type": "integer"}},
        {"type": "number", "minimum": 1, "exclusiveMaximum": 3.75, "not": {"type": "integer"}},
        {"oneOf": [{"type": "integer"}, {"type": "number", "maximum": 2}]},
        {"type": "array", "items": {"type": ["number", "string"]}, "not": {"items": {"type": "integer"}}},
    ],
    ids=lambda s: json.dumps(s)[:70],
)
def test_non_integral_numbers_agree_with_jsonschema(compiler, schema):
    # From draft 6 on, an integer is an integral value: json.dumps spellings are exact, others may be left out
    # (never one whose value is an integer).
    if schema.get("type") == "array":
        assert agree(compiler, schema, instances(schema, 400) + [[1.5], [1, 2], [1, "a"], []]) > 0
        return
    _number_agree(compiler, schema, jsonschema.Draft202012Validator, exact_spellings=False)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "number", "not": {"type": "integer"}},
        {"type": "number", "minimum": -1, "maximum": 3.75, "not": {"type": "integer"}},
        {"oneOf": [{"type": "integer"}, {"type": "string"}, {"type": "number"}, {"type": "null"}]},
    ],
    ids=lambda s: json.dumps(s)[:70],
)
def test_draft_4_non_integers_are_the_spellings_with_fraction_or_exponent(compiler, schema):
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", **schema}
    bounded = "minimum" in schema
    g = compiler.compile_json_schema(schema)
    v = jsonschema.Draft4Validator(schema)
    for text in NUMBER_TEXTS:
        value = json.loads(text)
        if value in (float("inf"), float("-inf")) or (
            bounded and ("e" in text.lower() or text.startswith("-0"))
        ):
            continue  # bounded numbers are written without exponent, and zero without a sign
        assert accepts_text(g, text) == v.is_valid(value), (schema, text)


def test_non_integral_numbers_under_an_integer_multiple_are_empty(compiler):
    with pytest.raises(GrammarError, match="accepts no"):
        compiler.compile_json_schema({"type": "number", "multipleOf": 2, "not": {"type": "integer"}})
    with pytest.raises(GrammarError, match="non-integer multipleOf.*0.07 is no multiple of 0.01"):
        compiler.compile_json_schema({"type": "number", "multipleOf": 0.01})


@pytest.mark.parametrize(
    "schema,blocker",
    [
        (
            {"type": "object", "properties": {"a": {"not": {"multipleOf": 3}}}},
            "'multipleOf' at /properties/a/not",
        ),
        ({"not": {"properties": {"a": {"format": "email"}}}}, "'format' at /not/properties/a"),
        (
            {"oneOf": [{"type": "number"}, {"enum": [1, 2]}]},
            "branch 1 has no exact negation: 'enum' at /oneOf/1",
        ),
    ],
)
def test_a_refused_negation_names_the_keyword_that_has_none(compiler, schema, blocker):
    with pytest.raises(GrammarError) as info:
        compiler.compile_json_schema(schema)
    assert blocker in str(info.value)


# -- uniqueItems ------------------------------------------------------------------------------------------
UNIQUE = [
    {"type": "array", "uniqueItems": True, "items": {"enum": ["a", "b", "foo", 1, 1.0, 2.5, True, None]}},
    {
        "type": "array",
        "uniqueItems": True,
        "items": {"type": "string", "enum": ["a", "x", "ab", 3]},
        "minItems": 1,
        "maxItems": 2,
    },
    {"type": "array", "uniqueItems": True, "items": {"type": ["boolean", "null"]}},
    {"type": "array", "uniqueItems": True, "items": {"enum": [[1], [1.0], {"a": 1}, {"a": 1.0}, [2]]}},
    {
        "type": "array",
        "uniqueItems": True,
        "items": {"$ref": "#/$defs/e"},
        "$defs": {"e": {"enum": ["a", "b"]}},
    },
    {"type": "array", "uniqueItems": True, "items": {"enum": ["a", "b", "x"], "not": {"const": "x"}}},
    {
        "type": "array",
        "uniqueItems": True,
        "prefixItems": [STR, {"type": "number"}, {"type": "null"}],
        "items": False,
    },
    {"type": "array", "uniqueItems": True, "prefixItems": [STR], "items": {"type": "boolean"}, "maxItems": 2},
    {"type": "array", "uniqueItems": True, "items": STR, "maxItems": 1},
    {"type": ["array", "string"], "uniqueItems": True, "items": {"const": "a"}},
    {"allOf": [{"uniqueItems": True}, {"uniqueItems": False, "items": {"type": "boolean"}}]},
]


@pytest.mark.parametrize("schema", UNIQUE, ids=lambda s: json.dumps(s)[:70])
def test_unique_items_agree_with_jsonschema(compiler, schema):
    for order in ("any", "schema"):
        assert agree(compiler, schema, instances(schema, 400), order=order) > 0


@pytest.mark.parametrize(
    "schema,match",
    [
        ({"type": "array", "uniqueItems": True, "items": STR}, "'uniqueItems'"),
        ({"type": "array", "uniqueItems": True}, "'uniqueItems'"),
        (
            {"type": "array", "uniqueItems": True, "items": {"enum": list(range(2000))}},
            "over 2000 distinct values",
        ),
        (
            {"type": "array", "uniqueItems": True, "items": {"enum": list(range(2001))}},
            "more than 2000 values",
        ),
        (
            {"type": "array", "uniqueItems": True, "items": {"enum": list(range(60))}, "maxItems": 40},
            "over 60",
        ),
        ({"type": "array", "uniqueItems": True, "prefixItems": [STR, STR], "items": False}, "'uniqueItems'"),
        ({"type": "array", "uniqueItems": True, "items": {"const": "a"}, "contains": STR}, "'uniqueItems'"),
    ],
)
def test_unique_items_beyond_what_is_exact_is_refused(compiler, schema, match):
    with pytest.raises(GrammarError, match=match):
        compiler.compile_json_schema(schema)


def test_unique_items_over_many_values_stays_small(compiler):
    vals = [f"v{i}" for i in range(60)]
    g = compiler.compile_json_schema({"type": "array", "uniqueItems": True, "items": {"enum": vals}})
    assert accepts_text(g, json.dumps(vals[::-1]))
    assert not accepts_text(g, json.dumps([*vals, "v3"]))
    with pytest.raises(GrammarError, match="accepts no value"):
        compiler.compile_json_schema(
            {"type": "array", "uniqueItems": True, "items": {"enum": vals}, "minItems": 61}
        )


def test_json_key_tells_values_apart_as_json_equal_does():
    from tokenseam.grammar.schema_keywords import json_equal, json_key

    rng = random.Random(3)
    edges = [1, 1.0, True, 0, False, 0.0, [1], [1.0], {"a": 1}, {"a": True}]
    pool = [_value(rng) for _ in range(300)] + edges
    for a in pool:
        for b in pool[:80]:
            assert (json_key(a) == json_key(b)) == json_equal(a, b), (a, b)


# -- not of conditions, and of keywords no draft defines --------------------------------------------------
CONDITIONS = [
    {"not": {"if": {"type": "string"}, "then": {"maxLength": 1}, "else": {"type": "array"}}},
    {"not": {"if": {"required": ["a"]}, "then": {"required": ["b"]}}},
    {"not": {"dependentRequired": {"foo": ["bar"], "a": ["b"]}}},
    {"not": {"dependentSchemas": {"foo": {"properties": {"bar": STR}}}}},
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "not": {"dependencies": {"foo": ["bar"], "a": {"maxProperties": 1}}},
    },
    {
        "$schema": "http://json-schema.org/draft-07/schema#",  # `dependencies` read as one reading only
        "oneOf": [
            {
                "anyOf": [
                    {"required": ["a"], "not": {"required": ["b"]}},
                    {"required": ["b"], "not": {"required": ["a"]}},
                ]
            },
            {"type": "object", "dependencies": {"a": {"not": {"required": ["b"]}, "x-note": "vendor"}}},
        ],
    },
    {"not": {"type": "string", "x-vendor": {"type": "integer"}}},
]


@pytest.mark.parametrize("schema", CONDITIONS, ids=lambda s: json.dumps(s)[:70])
def test_not_of_conditions_agrees_with_jsonschema(compiler, schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    assert agree(compiler, schema, instances(schema, 400), cls=cls) > 0


def test_not_reads_keywords_as_the_declared_draft_does(compiler):
    # draft 4 has no if/then: not {minLength: 2, if, then} is not {minLength: 2}
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "not": {"minLength": 2, "if": {"type": "string"}, "then": {"maxLength": 0}},
    }
    assert agree(compiler, schema, instances(schema, 300), cls=jsonschema.Draft4Validator) > 0


def test_not_if_whose_condition_has_no_exact_negation_is_refused(compiler):
    with pytest.raises(GrammarError, match="'format' at /not/if has none"):
        compiler.compile_json_schema({"not": {"if": {"format": "email"}, "then": {"maxLength": 3}}})


# -- hostile values ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "schema,match",
    [
        ({"enum": [float("nan"), 1], "not": {"const": 1}}, "NaN and Infinity"),
        ({"const": float("inf")}, "NaN and Infinity"),
        ({"type": "number", "multipleOf": 1e-300}, "non-integer multipleOf"),
        ({"type": "number", "multipleOf": 0}, "'multipleOf' at # must be a positive number"),
        ({"type": "number", "multipleOf": -2}, "'multipleOf' at # must be a positive number"),
        ({"type": "array", "contains": STR, "maxItems": 10**12}, "more than 64 positions"),
        (
            {"type": "array", "uniqueItems": True, "items": {"enum": [{"k": i} for i in range(1500)]}},
            "over 1500",
        ),
        ({"$dynamicRef": "#x", "enum": [1], "not": {"const": 2}}, "dynamicRef"),
    ],
    ids=lambda s: json.dumps(s, default=str)[:60],
)
def test_hostile_keyword_values_are_clear_errors(compiler, schema, match):
    with pytest.raises(GrammarError, match=match):
        compiler.compile_json_schema(schema)


Z299 = "0." + "0" * 299  # 1e-300 is 0.(299 zeros)1


@pytest.mark.parametrize(
    "schema,accepted,refused",
    [
        (
            {"type": "number", "minimum": 1e-300},
            ["1", Z299 + "1", Z299 + "2", "0.5"],
            ["0", Z299 + "01", "-1"],
        ),
        (
            {"type": "number", "exclusiveMinimum": 1e-300, "maximum": 2e-300},
            [Z299 + "15", Z299 + "2"],
            [Z299 + "1", Z299 + "21", Z299 + "0999", "0"],
        ),
        ({"type": "number", "maximum": -1e-300}, ["-" + Z299 + "1", "-1"], ["-" + Z299 + "01", "0", "1"]),
        (
            {"type": "integer", "minimum": -1e41, "maximum": 1e41},
            ["9" * 41, "-" + "9" * 41, "5" + "0" * 40, "0"],
            ["2" + "0" * 41, "1" + "0" * 42, "-2" + "0" * 41],
        ),
        # (not the bound itself: Python compares the int 10**300 with the double 1e300, which is larger)
        ({"type": "integer", "minimum": 1e300}, ["2" + "0" * 300, "1" + "0" * 301], ["9" * 300, "1"]),
        ({"type": "integer", "maximum": 1e300}, ["9" * 300, "-1"], ["2" + "0" * 300, "1" + "0" * 301]),
        # numbers are written with at most 15 digits (validators compare doubles): not 10**300 itself
        ({"type": "number", "maximum": 1e300}, ["123.5", "-5"], ["2" + "0" * 300]),
    ],
    ids=lambda s: json.dumps(s)[:60] if isinstance(s, dict) else "",
)
def test_bounds_with_many_digits_are_exact(compiler, schema, accepted, refused):
    """Bounds far from 1 (1e-300, 1e41, 1e300) are built one state per digit: no nesting limit is met, and no
    digit past the 40th is dropped from an upper bound."""
    g = compiler.compile_json_schema(schema)
    v = jsonschema.Draft202012Validator(schema)
    for t in accepted:
        assert v.is_valid(json.loads(t)) and accepts_text(g, t), (schema, t[:20], len(t))
    for t in refused:
        assert not v.is_valid(json.loads(t)) and not accepts_text(g, t), (schema, t[:20], len(t))


def test_deep_negations_and_large_values_stay_exact(compiler):
    deep: dict = {"type": "string"}
    for _ in range(70):
        deep = {"not": deep}
    g = compiler.compile_json_schema(deep)  # 70 nots: an even count, a string
    assert accepts_text(g, '"a"') and not accepts_text(g, "1")
    g = compiler.compile_json_schema({"type": "number", "maximum": 1e300, "not": {"type": "integer"}})
    assert accepts_text(g, "1.5") and not accepts_text(g, "1") and not accepts_text(g, "NaN")
    g = compiler.compile_json_schema({"enum": ["NaN", "Infinity"], "not": {"type": "number"}})
    assert accepts_text(g, '"NaN"') and not accepts_text(g, "NaN")


INTEGER_TEXTS = NUMBER_TEXTS + ["4.0", "4.00", "-3.000", "0.0", "7.0", "14.0", "21.00", "4.01", "4.", "4.0.0"]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer"},
        {"type": "integer", "minimum": 1, "maximum": 14},
        {"type": "integer", "exclusiveMinimum": -1, "exclusiveMaximum": 7},
        {"type": "integer", "multipleOf": 7},
        {"type": "number", "multipleOf": 7},
        {"oneOf": [{"type": "integer"}, {"type": "number", "maximum": 2}]},
        {"anyOf": [{"type": "integer", "minimum": 10}, {"type": "string"}]},
    ],
    ids=lambda s: json.dumps(s)[:70],
)
@pytest.mark.parametrize("draft", [4, 2020])
def test_integers_are_written_as_integer_literals(compiler, schema, draft):
    """An `integer` is a JSON integer literal (`-0` included): exact up to draft 4; from draft 6 on, the
    integral values spelled with a fraction or exponent (`4.0`, `1e2`) are valid but refused, never the
    other way round. A `number` with an integral `multipleOf` takes `.0` after its digits in every draft."""
    if draft == 4:  # draft 4 spells an exclusive bound as a flag beside minimum / maximum
        for ex, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if ex in schema:
                schema = {**schema, bound: schema[ex], ex: True}
    uri = {4: "http://json-schema.org/draft-04/schema#", 2020: "https://json-schema.org/draft/2020-12/schema"}
    schema = {"$schema": uri[draft], **schema}
    cls = jsonschema.Draft4Validator if draft == 4 else jsonschema.Draft202012Validator
    g = compiler.compile_json_schema(schema)
    v = cls(schema)
    # (bounded numbers, the `number` branch here, are written without exponent and zero without a sign)
    bounded_number = '"number", "maximum"' in json.dumps(schema)
    integral_float = '"type": "integer"' in json.dumps(schema) and draft > 4
    for text in INTEGER_TEXTS:
        try:
            value = json.loads(text)
        except ValueError:
            assert not accepts_text(g, text), text
            continue
        if value in (float("inf"), float("-inf")):
            continue
        got, want = accepts_text(g, text), v.is_valid(value)
        if got:
            assert want, (schema, text)
        elif want and "e" not in text.lower() and not (bounded_number and text.startswith("-0")):
            # refused though valid: an integral float where an integer is asked for, or more than one zero
            # after the point
            assert (integral_float or text.endswith("00")) and value == int(value), (schema, text)
    if "multipleOf" in json.dumps(schema) and '"number"' in json.dumps(schema):
        assert accepts_text(g, "14.0") and accepts_text(g, "-0.0") and not accepts_text(g, "14.00")
    if "minimum" not in json.dumps(schema):
        assert accepts_text(g, "-0") == v.is_valid(0)
