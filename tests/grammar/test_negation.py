"""`not` and overlapping `oneOf` through exact negation (schema_negation), checked against `jsonschema` on a pool
of values of every type; what has no exact negation stays a clear error."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tokenseam.grammar import GrammarError

from .conftest import accepts_text

POOL = [
    None,
    True,
    False,
    0,
    6,
    -3,
    2.5,
    "",
    "a",
    "ab",
    "abc",
    "foo",
    "bar",
    [],
    [1],
    [1, 2, 3],
    {},
    {"a": False},
    {"a": 1},
    {"bar": 1},
    {"bar": "x"},
    {"foo": 12},
    {"foo": "x", "bar": "y"},
    {"foo": 1, "bar": 2, "baz": 3},
]

NEGATIONS = [
    {"not": {"maxLength": 2}},
    {"not": {"minLength": 2}},
    {"not": {"minProperties": 1}},
    {"not": {"maxItems": 1}},
    {"not": {"maximum": 2}},
    {"not": {"exclusiveMinimum": 0}},
    {"not": {"properties": {"bar": False, "foo": True}}},
    {"not": {"properties": {"bar": {"type": "string"}, "foo": {"type": "boolean"}}}},
    {"not": {"type": "object", "required": ["bar"], "properties": {"bar": {"enum": ["bar"]}}}},
    {"not": {"enum": ["foo", None, True]}},
    {"not": {"const": False}},
    {"not": {"anyOf": [{"type": "string"}, {"type": "array", "maxItems": 1}]}},
    {"not": {"allOf": [{"type": "string"}, {"maxLength": 1}]}},
    {"not": {"not": {"type": "boolean"}}},
    {"type": "string", "not": {"maxLength": 1}},
    {"allOf": [{"type": "object"}, {"not": {"minProperties": 2}}]},
    {
        "oneOf": [
            {"properties": {"bar": {"type": "number"}}, "required": ["bar"]},
            {"properties": {"foo": {"type": "string"}}, "required": ["foo"]},
        ]
    },
    {"oneOf": [{"type": "string"}, {"maxLength": 2}]},
    {"oneOf": [{"type": "boolean"}, {"enum": [True, "x"]}]},
    {"not": {"pattern": "^a"}},
    {"type": "string", "not": {"pattern": "b$"}, "enum": ["ab", "ba", "a"]},
    {"oneOf": [{"pattern": "a"}, {"pattern": "b"}, {"pattern": "f"}]},
    {"oneOf": [{"type": "number"}, {"minimum": 2}]},
    {"type": "number", "not": {"type": "integer"}},  # non-integral numbers
    {"not": {"properties": {"a": {"type": "integer"}}}},
]


@pytest.mark.parametrize("schema", NEGATIONS, ids=lambda s: json.dumps(s)[:60])
def test_exact_negations_agree_with_jsonschema(compiler, schema):
    # Any property order: the pool's objects list their keys in an order no schema declares.
    g = compiler.compile_json_schema(schema, property_order="any")
    validator = jsonschema.Draft202012Validator(schema)
    for v in POOL:
        assert accepts_text(g, json.dumps(v)) == validator.is_valid(v), (schema, v)


@pytest.mark.parametrize(
    "schema",
    [
        {"not": {"enum": [6, "foo"]}},  # 6, 6.0 and 60e-1 are one value
        {"not": {"enum": [{"a": False}]}},
        {"not": {"additionalProperties": {"type": "boolean"}}},
        {"oneOf": [{"type": "number"}, {"enum": [1, 2]}]},
    ],
    ids=lambda s: json.dumps(s)[:60],
)
def test_what_has_no_exact_negation_is_refused(compiler, schema):
    with pytest.raises(GrammarError, match="not|oneOf"):
        compiler.compile_json_schema(schema)


def test_a_negation_nothing_satisfies_is_an_empty_schema(compiler):
    with pytest.raises(GrammarError, match="accepts no value"):
        compiler.compile_json_schema({"not": {"minLength": 0}})


CONDITIONALS = [
    {
        "type": "object",
        "properties": {"foo": {"enum": ["x", 12]}, "bar": {}},
        "if": {"properties": {"foo": {"const": "x"}}, "required": ["foo"]},
        "then": {"required": ["bar"]},
        "else": {"properties": {"bar": False}},
    },
    {"if": {"type": "string"}, "then": {"maxLength": 2}, "else": {"type": ["integer", "boolean"]}},
    {"if": {"maxLength": 2}, "then": {"type": "string"}},
    {"else": {"type": "string"}},  # else without if: no assertion
    {"dependentRequired": {"foo": ["bar"]}},
    {"dependentSchemas": {"bar": {"properties": {"foo": {"type": "string"}}}}},
    {"dependencies": {"foo": ["bar", "baz"], "a": {"maxProperties": 1}}},
    {"type": "object", "properties": {"foo": {}, "bar": {}}, "dependentRequired": {"bar": ["foo"]}},
]


@pytest.mark.parametrize("schema", CONDITIONALS, ids=lambda s: json.dumps(s)[:60])
def test_conditionals_and_dependencies_agree_with_jsonschema(compiler, schema):
    g = compiler.compile_json_schema(schema, property_order="any")
    # `dependencies` is draft-07's keyword (2020-12 validators ignore it); the rest read alike in both.
    validator = (jsonschema.Draft7Validator if "dependencies" in schema else jsonschema.Draft202012Validator)(
        schema
    )
    for v in POOL:
        assert accepts_text(g, json.dumps(v)) == validator.is_valid(v), (schema, v)


@pytest.mark.parametrize(
    "schema,match",
    [
        ({"if": {"const": 1}, "then": {"type": "string"}}, "keyword 'if' whose condition"),
        ({"dependentRequired": {"a": [1]}}, "must be an object of arrays of strings"),
        ({"dependentRequired": ["a"]}, "must be an object"),
        ({"dependencies": {"a": 3}}, "must be an object or boolean"),
    ],
)
def test_bad_or_inexact_conditionals_are_errors(compiler, schema, match):
    with pytest.raises(GrammarError, match=match):
        compiler.compile_json_schema(schema)


def test_a_oneof_beside_other_keywords_negates_only_the_branches(compiler):
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"close": {}, "kind": {"type": "string"}, "rel": {}},
        "oneOf": [
            {"properties": {"kind": {"enum": ["relative"]}, "rel": {"type": "string"}}},
            {
                "properties": {
                    "close": {"type": "boolean"},
                    "kind": {"enum": ["friend"]},
                    "rel": {"type": "boolean"},
                }
            },
        ],
    }
    g = compiler.compile_json_schema(schema, property_order="any")
    validator = jsonschema.Draft202012Validator(schema)
    pool = POOL + [
        {"close": True, "kind": "friend", "rel": True},
        {"kind": "relative", "rel": "x"},
        {"close": 1, "kind": "relative"},
        {"kind": "friend", "rel": "x"},
        {"kind": "other"},
    ]
    for v in pool:
        assert accepts_text(g, json.dumps(v)) == validator.is_valid(v), v


@pytest.mark.parametrize(
    "schema,instance,validator",
    [
        # up to draft-07 a $ref stands alone: its siblings are ignored
        (
            {
                "$schema": "http://json-schema.org/draft-04/schema#",
                "properties": {"s": {"type": "string", "$ref": "#/definitions/o"}},
                "definitions": {"o": {"type": "object"}},
            },
            {"s": {}},
            jsonschema.Draft4Validator,
        ),
        # if/then/else arrived in draft-07: a draft-06 validator reads them as unknown keywords
        (
            {"$schema": "http://json-schema.org/draft-06/schema#", "if": {"type": "string"}, "then": False},
            "x",
            jsonschema.Draft6Validator,
        ),
        # 2019-09 replaced `dependencies`: a 2020-12 validator ignores it
        (
            {"$schema": "https://json-schema.org/draft/2020-12/schema", "dependencies": {"a": ["b"]}},
            {"a": 1},
            jsonschema.Draft202012Validator,
        ),
    ],
)
def test_the_declared_draft_decides_how_keywords_are_read(compiler, schema, instance, validator):
    assert validator(schema).is_valid(instance)
    assert accepts_text(compiler.compile_json_schema(schema), json.dumps(instance))
    undeclared = {k: v for k, v in schema.items() if k != "$schema"}
    if "$ref" not in json.dumps(undeclared):  # without $schema: the latest draft's reading
        assert not accepts_text(compiler.compile_json_schema(undeclared), json.dumps(instance))


def test_integral_numbers_in_an_enum_take_both_spellings(compiler):
    g = compiler.compile_json_schema({"enum": [2.0, 3, 1.5]})
    for text, ok in (("2", True), ("2.0", True), ("3", True), ("3.0", True), ("1.5", True), ("4", False)):
        assert accepts_text(g, text) == ok, text


@pytest.mark.parametrize(
    "schema",
    [
        {"allOf": [{"not": {"type": "string"}}, {"not": {"type": "null"}}]},
        {
            "allOf": [
                {"if": {"type": "string"}, "then": {"maxLength": 2}},
                {"if": {"type": "array"}, "then": {"maxItems": 1}, "else": {"not": {"type": "boolean"}}},
            ]
        },
        {"allOf": [{"dependentRequired": {"foo": ["bar"]}}, {"dependentRequired": {"bar": ["baz"]}}]},
    ],
    ids=lambda s: json.dumps(s)[:60],
)
def test_negations_and_conditions_meet_in_allof(compiler, schema):
    g = compiler.compile_json_schema(schema, property_order="any")
    validator = jsonschema.Draft202012Validator(schema)
    for v in POOL:
        assert accepts_text(g, json.dumps(v)) == validator.is_valid(v), (schema, v)


def test_not_pattern_refuses_a_match_in_either_reading(compiler):
    g = compiler.compile_json_schema({"type": "string", "not": {"pattern": "^.+$"}})
    assert not accepts_text(g, '"a"')  # both readings match
    assert not accepts_text(g, '"a\\r"')  # Python's . matches a carriage return, ECMA-262's does not
    assert accepts_text(g, '""')


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "propertyNames": {"maxLength": 3}},
        {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}, "properties": {"foo": {}, "Bad": {}}},
        {
            "type": "object",
            "propertyNames": {"enum": ["foo", "bar"]},
            "additionalProperties": {"type": "string"},
        },
        {"type": "object", "propertyNames": False},
        {"type": "object", "propertyNames": {"type": "integer"}},
        {"propertyNames": {"minLength": 3, "maxLength": 3}, "patternProperties": {"^b": {"type": "integer"}}},
    ],
    ids=lambda s: json.dumps(s)[:60],
)
def test_property_names_agree_with_jsonschema(compiler, schema):
    g = compiler.compile_json_schema(schema, property_order="any")
    validator = jsonschema.Draft202012Validator(schema)
    for v in [*POOL, {"Bad": 1}, {"foo": "x", "Bad": 2}, {"abcd": 1}, {"b": 1}]:
        assert accepts_text(g, json.dumps(v)) == validator.is_valid(v), (schema, v)


def test_property_names_beyond_string_keywords_are_refused(compiler):
    with pytest.raises(GrammarError, match="propertyNames"):
        compiler.compile_json_schema({"type": "object", "propertyNames": {"format": "email"}})
    req = {"type": "object", "required": ["Bad"], "propertyNames": {"pattern": "^[a-z]+$"}}
    with pytest.raises(GrammarError, match="accepts no value"):
        compiler.compile_json_schema(req)
