"""Thirty-odd JSON Schemas of the shapes real requests use, each bounded so an output ends well within the
test's token budget: nested objects, arrays, enums, const, $ref/$defs, patterns, formats, number ranges,
anyOf/oneOf, nullable fields, additionalProperties."""

from __future__ import annotations

S = {"type": "string", "maxLength": 12}
N = {"type": "integer", "minimum": 0, "maximum": 999}

SCHEMAS: list[dict] = [
    {"type": "object", "properties": {"name": S, "age": N}, "required": ["name", "age"]},
    {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    },
    {"type": "array", "items": N, "minItems": 1, "maxItems": 4},
    {"type": "array", "items": S, "maxItems": 3},
    {"type": "string", "enum": ["red", "green", "blue"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", None, 3]}}, "required": ["color"]},
    {"const": {"version": 2}},
    {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "email", "maxLength": 30},
    {"type": "number", "minimum": -5.5, "maximum": 5.5},
    {"type": "integer", "exclusiveMinimum": 10, "maximum": 20},
    {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100},
    {"anyOf": [{"type": "integer", "maximum": 99, "minimum": 0}, {"type": "string", "maxLength": 5}]},
    {"oneOf": [{"type": "boolean"}, {"type": "null"}]},
    {"type": ["string", "null"], "maxLength": 8},
    {
        "type": "object",
        "properties": {"point": {"$ref": "#/$defs/point"}, "label": S},
        "required": ["point"],
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": N, "y": N},
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
    },
    {
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/leaf"}, "maxItems": 2}},
        "required": ["children"],
        "$defs": {
            "leaf": {
                "type": "object",
                "properties": {"id": N},
                "required": ["id"],
                "additionalProperties": False,
            }
        },
    },
    {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": S,
                    "address": {
                        "type": "object",
                        "properties": {"city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"],
                        "additionalProperties": False,
                    },
                },
                "required": ["name", "address"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
        "required": ["tags"],
    },
    {
        "type": "object",
        "additionalProperties": {"type": "integer", "maximum": 9, "minimum": 0},
        "maxProperties": 2,
    },
    {
        "type": "object",
        "properties": {"a": N, "b": N, "c": N},
        "minProperties": 2,
        "additionalProperties": False,
    },
    {
        "type": "array",
        "prefixItems": [{"type": "string", "maxLength": 4}, N, {"type": "boolean"}],
        "items": False,
    },
    {
        "type": "object",
        "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["score"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"when": {"type": "string", "format": "date-time"}},
        "required": ["when"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"ip": {"type": "string", "format": "ipv4"}},
        "required": ["ip"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"kind": {"const": "circle"}, "r": N},
        "required": ["kind", "r"],
        "additionalProperties": False,
    },
    {
        "anyOf": [
            {
                "type": "object",
                "properties": {"kind": {"const": "square"}, "side": N},
                "required": ["kind", "side"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"kind": {"const": "circle"}, "r": N},
                "required": ["kind", "r"],
                "additionalProperties": False,
            },
        ]
    },
    {
        "type": "object",
        "properties": {
            "matrix": {
                "type": "array",
                "items": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0, "maximum": 9},
                    "maxItems": 2,
                },
                "maxItems": 2,
            }
        },
        "required": ["matrix"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"note": {"type": "string", "minLength": 2, "maxLength": 10}},
        "required": ["note"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"id": {"type": "string", "pattern": "^[a-f0-9]{8}$"}, "active": {"type": "boolean"}},
        "required": ["id", "active"],
        "additionalProperties": False,
    },
    {"type": "boolean"},
    {"type": "null"},
]


def _closed(node):
    """additionalProperties: false wherever a schema lists properties and says nothing about others: an open
    object lets a small model nest invented keys until the token budget runs out (valid JSON, never ending)."""
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for v in node.values():
            _closed(v)
    elif isinstance(node, list):
        for v in node:
            _closed(v)
    return node


SCHEMAS = [_closed(s) for s in SCHEMAS]
