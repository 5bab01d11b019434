"""Schemas from requests: no `$ref` (or `$schema`, `$id`, `$dynamicRef`) reaches the network or the file
system, keywords of the wrong type are errors, and regex matching inside the compile is linear-time."""

from __future__ import annotations

import random
import re
import socket
import threading
import time

import pytest

from tokenseam.grammar import GrammarError, cpauto
from tokenseam.grammar.json_schema import _Compiler, schema_to_grammar
from tokenseam.grammar.regex import parse_regex
from tokenseam.grammar.schema_safety import check_keywords

from .conftest import accepts_text


@pytest.fixture
def listener():
    """A TCP listener on 127.0.0.1 that records every connection (and answers it with a JSON schema, so a
    fetch that reached it would succeed)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.1)
    seen: list[bytes] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    seen.append(conn.recv(4096))
                    conn.sendall(
                        b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"type": "integer"}'
                    )
                except OSError:
                    seen.append(b"")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}", seen
    stop.set()
    t.join(2)
    srv.close()


def _remote_cases(url: str) -> list[tuple[dict, str]]:
    """(schema, text the error must contain): every way a reference could leave the document."""
    evil = f"{url}/evil.json"
    enum_a = {"enum": [{"a": 1}]}
    return [
        ({**enum_a, "properties": {"a": {"$ref": evil}}}, evil),  # the issue's request body
        ({"type": "object", "properties": {"a": {"$ref": evil}}}, evil),
        ({**enum_a, "properties": {"a": {"$ref": "file:///etc/passwd"}}}, "file:///etc/passwd"),
        ({**enum_a, "properties": {"a": {"$ref": "file:///nonexistent"}}}, "file:///nonexistent"),
        ({**enum_a, "$id": f"{url}/root.json", "properties": {"a": {"$ref": "evil.json"}}}, "evil.json"),
        ({**enum_a, "properties": {"a": {"$dynamicRef": f"{url}/d.json#x"}}}, f"{url}/d.json#x"),
        ({**enum_a, "properties": {"a": {"$recursiveRef": f"{url}/r.json"}}}, f"{url}/r.json"),
        (
            {**enum_a, "properties": {"a": {"$ref": "https://json-schema.org/draft/2020-12/schema"}}},
            "https://json-schema.org/draft/2020-12/schema",
        ),
        ({"$schema": f"{url}/meta.json", **enum_a, "properties": {"a": {"$ref": evil}}}, evil),
        # Only '#' references, but under an $id the validator resolves '#/c' against that URL, and that
        # resource is not in the document's registry (it sits under an unknown keyword): the registry's
        # retrieval is what refuses it.
        (
            {
                "enum": [{"a": {"b": 1}}],
                "properties": {"a": {"$ref": "#/x-vendor"}},
                "x-vendor": {"properties": {"b": {"$id": f"{url}/z.json", "$ref": "#/c"}}},
            },
            f"{url}/z.json",
        ),
    ]


def test_no_reference_reaches_the_network_or_files(listener):
    url, seen = listener
    for schema, named in _remote_cases(url):
        with pytest.raises(GrammarError) as info:
            schema_to_grammar(schema)
        assert named in str(info.value), (schema, str(info.value))
        assert "nothing is fetched" in str(info.value)
    time.sleep(0.2)  # a connection made by the last case would be recorded by now
    assert seen == []


def test_remote_schema_keyword_is_not_fetched(listener):
    url, seen = listener
    g = schema_to_grammar(
        {
            "$schema": f"{url}/meta.json",
            "enum": [{"a": 1}, {"a": "x"}],
            "properties": {"a": {"type": "integer"}},
        }
    )
    assert g.rules["root"] is not None
    time.sleep(0.2)
    assert seen == []


def test_validator_refuses_retrieval_even_without_the_keyword_check(listener):
    # The keyword check refuses non-local references first; the validator's registry must refuse them too.
    url, seen = listener
    root = {"properties": {"a": {"$ref": f"{url}/evil.json"}}}
    with pytest.raises(GrammarError, match=f"\\$ref to '{url}/evil.json'.* nothing is fetched"):
        _Compiler(root, False, False, False, 40).valid_values([{"a": 1}], root)
    time.sleep(0.2)
    assert seen == []


def test_present_and_missing_files_give_the_same_error():
    def error(path: str) -> str:
        with pytest.raises(GrammarError) as info:
            schema_to_grammar({"enum": [{"a": 1}], "properties": {"a": {"$ref": f"file://{path}"}}})
        return str(info.value).replace(path, "<path>")

    assert error("/etc/passwd") == error("/nonexistent/passwd")


def test_local_references_still_work():
    schema = {
        "$id": "https://example.com/root.json",
        "enum": [{"a": 1}, {"a": "x"}],
        "properties": {"a": {"$ref": "#/$defs/int"}},
        "$defs": {"int": {"type": "integer"}},
    }
    assert schema_to_grammar(schema).rules["root"] is not None


# -- keyword values of the wrong type --------------------------------------------------------------------
WRONG = [
    ({"type": "string", "format": 5}, "'format' at #"),
    ({"type": "string", "minLength": -1}, "'minLength' at #"),
    ({"type": "string", "maxLength": "3"}, "'maxLength' at #"),
    ({"type": "string", "minLength": True}, "'minLength' at #"),
    ({"type": "string", "maxLength": 2.5}, "'maxLength' at #"),
    ({"type": "string", "pattern": 5}, "'pattern' at #"),
    ({"type": "object", "required": "a"}, "'required' at #"),
    ({"type": "object", "required": ["a", 1]}, "'required' at #"),
    ({"enum": "abc"}, "'enum' at #"),
    ({"type": 5}, "'type' at #"),
    ({"type": []}, "'type' at #"),
    ({"type": "strnig"}, "unknown type 'strnig'"),
    ({"type": ["string", "__none__"]}, "unknown type '__none__'"),
    ({"minimum": "0"}, "'minimum' at #"),
    ({"maximum": False}, "'maximum' at #"),
    ({"exclusiveMinimum": "1"}, "'exclusiveMinimum' at #"),
    ({"type": "integer", "multipleOf": 0}, "'multipleOf' at #"),
    ({"type": "array", "uniqueItems": "yes"}, "'uniqueItems' at #"),
    ({"type": "array", "minItems": -2}, "'minItems' at #"),
    ({"type": "object", "maxProperties": 1.5}, "'maxProperties' at #"),
    ({"properties": []}, "'properties' at #"),
    ({"properties": {"a": 3}}, "schema at #/properties/a"),
    ({"patternProperties": {"^a": "x"}}, "schema at #/patternProperties/^a"),
    ({"additionalProperties": 1}, "schema at #/additionalProperties"),
    ({"items": "x"}, "schema at #/items"),
    ({"items": [{}, 2]}, "schema at #/items/1"),
    ({"anyOf": []}, "'anyOf' at #"),
    ({"oneOf": {}}, "'oneOf' at #"),
    ({"allOf": "x"}, "'allOf' at #"),
    ({"$ref": 5}, "'$ref' at #"),
    ({"$defs": {"a": {"type": "string", "format": []}}, "$ref": "#/$defs/a"}, "'format' at #/$defs/a"),
    ({"properties": {"a/b": {"maxLength": -1}}}, "'maxLength' at #/properties/a~1b"),
    ({"$schema": 7}, "'$schema' at #"),
    ({"$id": {}}, "'$id' at #"),
    ({"type": "string", "_not_strings": 5}, "'_not_strings' at # is reserved"),
    ({"dependentRequired": {"a": "b"}}, "'dependentRequired' at #"),
]


@pytest.mark.parametrize("schema,named", WRONG, ids=[repr(s) for s, _ in WRONG])
def test_wrong_typed_keyword_is_an_error(schema, named):
    with pytest.raises(GrammarError) as info:
        schema_to_grammar(schema)
    assert named in str(info.value)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "number", "exclusiveMinimum": True, "minimum": 0},  # draft 4
        {"type": "array", "items": [{"type": "string"}], "additionalItems": False},  # draft 7
        {"type": "object", "dependencies": {"a": ["b"], "c": {"required": ["d"]}}},
        {"type": "string", "title": 5, "description": ["x"], "default": {"format": 5}, "examples": "x"},
        {"enum": [{"format": 5, "$ref": "http://x"}]},  # values, not keywords
        {"type": "object", "properties": {"format": {"type": "integer"}, "$ref": {"type": "string"}}},
        {"type": "string", "x-vendor": {"minLength": -1}},
    ],
)
def test_well_typed_schemas_are_accepted(schema):
    check_keywords(schema)
    schema_to_grammar(schema, lenient=True)  # lenient: `dependencies` is checked but not compiled


# -- linear-time regex matching --------------------------------------------------------------------------
# Python's re takes 2**n steps to find that a run of n a's and a "!" does not match ^(a+)+$: 24 a's take it
# over a second and each one more doubles that, so 32 take it minutes, while the linear matcher needs
# milliseconds. The bound below is that far from both, so a busy machine cannot make it fail.
EVIL = "a" * 32 + "!"
FAST = 30.0


def test_enum_checked_against_a_catastrophic_pattern_quickly():
    t = time.monotonic()
    with pytest.raises(GrammarError, match="accepts no value"):
        schema_to_grammar({"enum": [EVIL], "pattern": "^(a+)+$"})
    g = schema_to_grammar({"enum": [EVIL, "a" * 32], "pattern": "^(a+)+$"})
    assert time.monotonic() - t < FAST
    assert g.rules["root"] is not None


def test_nested_schema_keyword_does_not_escape_the_linear_matcher():
    # A sub-schema declaring a known $schema would get jsonschema's stock validator (and Python's re).
    t = time.monotonic()
    with pytest.raises(GrammarError, match="accepts no value"):
        schema_to_grammar(
            {
                "enum": [{"a": EVIL}],
                "properties": {
                    "a": {"$schema": "http://json-schema.org/draft-07/schema#", "pattern": "^(a+)+$"}
                },
            }
        )
    assert time.monotonic() - t < FAST


def test_property_names_matched_against_a_catastrophic_pattern_quickly(compiler):
    name = EVIL
    t = time.monotonic()
    cg = compiler.compile_json_schema(
        {
            "type": "object",
            "properties": {name: {}, "aaa": {}},
            "patternProperties": {"^(a+)+$": {"type": "integer"}},
            "required": [name, "aaa"],
            "additionalProperties": False,
        }
    )
    assert time.monotonic() - t < FAST
    # "aaa" matches the pattern, so its value must be an integer; the long name does not match.
    assert accepts_text(cg, f'{{"{name}": "x", "aaa": 1}}')
    assert not accepts_text(cg, f'{{"{name}": "x", "aaa": "y"}}')


def test_pattern_properties_in_the_validator_are_matched_linearly():
    t = time.monotonic()
    with pytest.raises(GrammarError, match="accepts no value"):
        schema_to_grammar(
            {
                "enum": [{EVIL: 1}],
                "patternProperties": {"^(a+)+$": {"type": "string"}},
                "additionalProperties": False,
            }
        )
    assert time.monotonic() - t < FAST


PATTERNS = [
    "a+b",
    "^(a|ab)*c$",
    "[a-c]{2,3}",
    "^x?y*$",
    r"\d+\.\d*",
    "(ab|ba)+$",
    "^$",
    "b",
    r"^\w+@\w+$",
    "[^ab]c",
    "a.c",
    "^(a+)+$",
    "(?:ab){2}",
    r"\s",
    "^a{0,2}b{1,}$",
]


def test_searcher_agrees_with_re_search():
    rng = random.Random(7)
    for p in PATTERNS:
        s = cpauto.Searcher(cpauto.from_ir(parse_regex(p, search=True, dialect="python")))
        oracle = re.compile(p)  # `$` included: it also matches before a final newline, as Python reads it
        for _ in range(300):
            text = "".join(rng.choice("abcxy1 .@\n\u00e9") for _ in range(rng.randrange(0, 9)))
            assert s.accepts(text) == bool(oracle.search(text)), (p, text)
