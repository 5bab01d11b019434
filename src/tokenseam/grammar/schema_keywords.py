"""JSON Schema keywords as the compiler sorts them (annotations, supported, unsupported), the JSON types, and
JSON value equality and typing as the specification defines them."""

from __future__ import annotations

import json

ANNOTATIONS = {
    "$schema",
    "$id",
    "id",
    "$comment",
    "$anchor",
    "$vocabulary",
    "title",
    "description",
    "default",
    "examples",
    "example",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentMediaType",
    "contentEncoding",
    "contentSchema",
    "$defs",
    "definitions",
    "nullable",
    "discriminator",
    "xml",
    "externalDocs",
    "markdownDescription",
    "errorMessage",
    "$dynamicAnchor",
    "$recursiveAnchor",
}
SUPPORTED = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "pattern",
    "format",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minProperties",
    "maxProperties",
    "patternProperties",
    "uniqueItems",
}
UNSUPPORTED = {
    "not",
    "if",
    "then",
    "else",
    "contains",
    "minContains",
    "maxContains",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$dynamicRef",
    "$recursiveRef",
}
TYPES = ("null", "boolean", "object", "array", "number", "string")


# JSON text as json.dumps writes it, with encoders made once: json.dumps makes a new encoder for every call
# with options other than its defaults (about 2 us each, and big schemas write thousands of keys and values).
SORTED = json.JSONEncoder(sort_keys=True)  # json.dumps(v, sort_keys=True)
COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
SPACED = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
json_string = json.encoder.encode_basestring  # json.dumps(s, ensure_ascii=False) of a str s


def pointer_escape(key: str) -> str:
    """`key` as one JSON Pointer reference token (RFC 6901: ~ and / escaped)."""
    return str(key).replace("~", "~0").replace("/", "~1")


def json_type(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def json_key(v):
    """A hashable key that two JSON values share exactly when `json_equal` says they are equal."""
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, int | float):
        if isinstance(v, float) and v.is_integer():
            return ("n", int(v))
        return ("n", v)
    if isinstance(v, list):
        return ("l", tuple(json_key(x) for x in v))
    if isinstance(v, dict):
        return ("d", frozenset((k, json_key(x)) for k, x in v.items()))
    return (type(v).__name__, v)


def json_equal(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def spelled(vals: list) -> list:
    """Enum/const values, each integral number below 1e15 as both the int and the float it may be written as
    (`2` parses to an int, `2.0` to a float), so each spelling is checked for what it parses to."""
    out = []
    for v in vals:
        if isinstance(v, int | float) and not isinstance(v, bool) and float(v).is_integer() and abs(v) < 1e15:
            out.append(int(v))
            out.append(float(v))
        else:
            out.append(v)
    return out
