"""JSON Schema front end: generated documents validate (adversarial sampling), valid documents are accepted
in json.dumps layouts, unsupported or malformed schemas raise GrammarError naming keyword and location."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from tokenseam.grammar import GrammarError, GrammarMatcher
from tokenseam.grammar.compiler import check_grammar

from .conftest import accepts_text, sample

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["value"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}
SCHEMAS = [
    PERSON,
    TREE,
    {"type": "integer", "minimum": -37, "maximum": 1234},
    {"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 100, "multipleOf": 7},
    {"type": "number", "minimum": -2.5, "maximum": 10},
    {"type": "number"},
    {"type": "string", "pattern": "^[A-Z]{2}-\\d{3,5}$"},
    {"type": "string", "pattern": "ab+", "maxLength": 30, "minLength": 3},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "ipv4"},
    {"type": "string", "format": "ipv6"},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "time"},
    {"type": "string", "format": "duration"},
    {"type": "string", "format": "hostname"},
    {"type": "string", "format": "uri"},
    {"enum": ["red", "green", 3, None, {"a": [1, 2]}]},
    {"const": {"x": "y"}},
    {"type": ["string", "null"], "maxLength": 4},
    {
        "anyOf": [
            {"type": "integer"},
            {
                "type": "object",
                "properties": {"k": {"type": "boolean"}},
                "required": ["k"],
                "additionalProperties": False,
            },
        ]
    },
    {
        "oneOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
        ]
    },
    {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {
                "properties": {"a": True, "b": {"type": "string"}},
                "required": ["b"],
                "additionalProperties": False,
            },
        ]
    },
    {
        "type": "array",
        "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "items": False,
        "minItems": 1,
    },
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "array",
        "items": [{"type": "boolean"}],
        "additionalItems": {"type": "null"},
        "maxItems": 3,
    },
    {
        "type": "object",
        "patternProperties": {"^x-": {"type": "integer"}},
        "additionalProperties": False,
        "maxProperties": 3,
    },
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
        "minProperties": 2,
        "maxProperties": 2,
        "additionalProperties": False,
    },
    {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
    {"type": "object", "additionalProperties": {"type": "string"}, "propertyNames": True},
    True,
    {"type": "array", "items": {"type": "string", "maxLength": 2}, "minItems": 14, "maxItems": 16},
    {"type": "string", "maxLength": 300},
]


def _check_generation(compiler, vocab, schema, seed: int):
    g = compiler.compile_json_schema(schema)
    rng = np.random.default_rng(seed)
    produced = 0
    for mode in ("random", "long", "eos_last", "close"):
        out, done = sample(g, vocab, rng, 400, mode)
        if not done:
            continue
        doc = json.loads(out.decode("utf-8"))
        jsonschema.validate(
            doc,
            schema if schema is not True else {},
            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
        )
        produced += 1
    return produced


@pytest.mark.parametrize("k", range(len(SCHEMAS)))
def test_generated_documents_validate(compiler, smollm2_vocab, k):
    produced = _check_generation(compiler, smollm2_vocab, SCHEMAS[k], k)
    assert produced >= 1


@pytest.mark.parametrize("k", [0, 1, 6, 17, 25])
def test_generated_documents_validate_gemma(gemma_compiler, gemma3_vocab, k):
    assert _check_generation(gemma_compiler, gemma3_vocab, SCHEMAS[k], 100 + k) >= 1


VALID_DOCS = [
    (PERSON, {"name": "Ann", "age": 31, "tags": ["a", "c"]}),
    (TREE, {"value": 1, "children": [{"value": 2, "children": []}, {"value": 3}]}),
    ({"type": "object"}, {"a": [1, {"b": None}], "c": 'd"\n\u00e9'}),
    ({"type": "array", "items": {"type": "number"}}, [1, -2.5, 3e10, 0.0001]),
    ({"type": "string", "minLength": 2, "maxLength": 3}, "é\n"),
]


@pytest.mark.parametrize("schema,doc", VALID_DOCS)
def test_json_dumps_layouts_accepted(compiler, schema, doc):
    g = compiler.compile_json_schema(schema)
    for text in (
        json.dumps(doc),
        json.dumps(doc, ensure_ascii=False),
        json.dumps(doc, indent=2),
        json.dumps(doc, separators=(",", ":")),
    ):
        assert accepts_text(g, text), text


def test_invalid_documents_refused(compiler):
    g = compiler.compile_json_schema(PERSON)
    for doc in (
        {"age": 3},
        {"name": "", "age": 3},
        {"name": "x", "age": 151},
        {"name": "x", "age": 1, "z": 1},
        {"name": "x", "age": 1.5},
        {"name": "x", "age": 1, "tags": ["d"]},
    ):
        assert not accepts_text(g, json.dumps(doc)), doc


def test_whitespace_runs_are_bounded(compiler):
    g = compiler.compile_json_schema({"type": "object"})
    assert accepts_text(g, "{\n" + " " * 40 + "}")
    assert not accepts_text(g, "{" + " " * 200 + "}")
    compact = compiler.compile_json_schema(
        {"type": "object", "properties": {"a": {"type": "integer"}}}, compact=True
    )
    assert accepts_text(compact, '{"a":1}')
    assert not accepts_text(compact, '{"a": 1}')


@pytest.mark.parametrize("limit", [40, 4])
def test_indentation_limit_holds_across_tokens(compiler, smollm2_vocab, limit):
    """Runs after a newline are capped at max_ws whether the run is one token, spans several, or ends inside a
    token; masks, accept_token, accept_bytes and rollback agree."""
    opts = {} if limit == 40 else {"max_ws": limit}
    g = compiler.compile_json_schema({"type": "object"}, **opts)
    pad = b" \t"
    assert accepts_text(g, "{\n" + " \t" * (limit // 2) + "}")
    assert not accepts_text(g, "{\n" + " " * (limit + 1) + "}")
    assert accepts_text(g, '{"a":\n' + " " * limit + "1,\n" + " " * limit + '"b": 2\n}')
    assert not accepts_text(g, '{"a":\n' + " " * limit + "1,\n" + " " * (limit + 1) + '"b": 2\n}')
    tb = smollm2_vocab.token_bytes
    # Tokens made of spaces, and tokens of a newline plus spaces, in the vocabulary.
    spaces = {len(b): t for t, b in enumerate(tb) if b and not b.strip(b" ")}
    nl_spaces = {
        len(b) - 1: t
        for t, b in enumerate(tb)
        if b[:1] == b"\n" and len(b) > 1 and not b[1:].strip(pad) and b" " in b
    }
    out = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)

    def allowed(m, t):
        m.fill_next_token_bitmask(out)
        return bool((out.view(np.uint32)[t >> 5] >> (t & 31)) & 1)

    m = GrammarMatcher(g)
    assert m.accept_bytes(b"{")
    for n, t in nl_spaces.items():
        assert allowed(m, t) == (n <= limit), n
    first = max(n for n in nl_spaces if n <= limit // 2)
    assert m.accept_token(nl_spaces[first])
    room = limit - first
    for n, t in spaces.items():
        assert allowed(m, t) == (n <= room), (first, n)
        ok = m.accept_token(t)
        assert ok == (n <= room)
        if ok:
            m.rollback(1)
    assert room >= 2 and room in spaces
    assert m.accept_token(spaces[1])
    assert allowed(m, spaces[room - 1]) and not allowed(m, spaces[room])
    m.rollback(1)
    assert allowed(m, spaces[room])
    assert m.accept_bytes(b"}") and m.is_accepting()


def test_indentation_limits_keep_filter_memory_bounded(compiler, smollm2_vocab):
    from tokenseam.grammar.compiler import token_table

    for limit in (1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 1000):
        g = compiler.compile_json_schema({"type": "array"}, max_ws=limit)
        assert accepts_text(g, "[\n" + " " * limit + "1]")
        assert not accepts_text(g, "[\n" + " " * (limit + 1) + "1]")
    assert len(token_table(smollm2_vocab)._indent_filters) <= 8
    with pytest.raises(GrammarError, match="max_ws"):
        compiler.compile_json_schema({"type": "array"}, max_ws=1001)


def test_raw_newline_never_inside_strings(compiler):
    g = compiler.compile_json_schema({"type": "object"})
    assert not accepts_text(g, '{"a\n' + " " * 50 + 'b": 1}')
    assert not accepts_text(g, '{"a": "x\ny"}')


def test_strict_mode_forbids_extra_properties(compiler):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert accepts_text(compiler.compile_json_schema(schema), '{"a": 1, "b": 2}')
    strict = compiler.compile_json_schema(schema, strict=True)
    assert accepts_text(strict, '{"a": 1}')
    assert not accepts_text(strict, '{"a": 1, "b": 2}')


def test_extra_key_cannot_alias_declared_key(compiler):
    schema = {"type": "object", "properties": {"name": {"type": "integer"}}}
    g = compiler.compile_json_schema(schema)
    assert not accepts_text(g, '{"name": "x"}')
    assert not accepts_text(g, '{"n\\u0061me": "x"}')
    assert accepts_text(g, '{"other": "x"}')


@pytest.mark.parametrize(
    "schema,keyword,where",
    [
        ({"type": "object", "properties": {"a": {"not": {"multipleOf": 3}}}}, "'not'", "/properties/a"),
        ({"type": "array", "uniqueItems": True}, "'uniqueItems'", "#"),
        ({"if": {"const": 1.5}, "then": {"minLength": 2}}, "'if'", "#"),
        (
            {
                "$defs": {"x": {"type": "array", "contains": {"type": "integer"}, "maxContains": 2}},
                "$ref": "#/$defs/x",
            },
            "'maxContains'",
            "#/$defs/x",
        ),
        ({"type": "object", "propertyNames": {"format": "email"}}, "'propertyNames'", "/propertyNames"),
        ({"oneOf": [{"type": "number"}, {"enum": [1, 2]}]}, "oneOf", "#"),
    ],
)
def test_unsupported_keywords_raise_with_location(compiler, schema, keyword, where):
    with pytest.raises(GrammarError) as ei:
        compiler.compile_json_schema(schema)
    assert keyword in str(ei.value) and where in str(ei.value)


def test_lenient_ignores_with_warning(compiler):
    g = compiler.compile_json_schema(
        {"type": "array", "uniqueItems": True, "items": {"type": "integer"}}, lenient=True
    )
    assert any("uniqueItems" in w for w in g.warnings)
    assert accepts_text(g, "[1, 2]")


@pytest.mark.parametrize(
    "schema",
    [
        [],
        5,
        "not json",
        {"type": 5},
        {"type": "strin"},
        {"$ref": "#/nope"},
        {"$ref": "http://x/y.json"},
        {"properties": []},
        {"required": "a", "type": "object"},
        {"minLength": -1, "type": "string"},
        {"type": "string", "pattern": "(unclosed"},
        {"type": "string", "pattern": "(?=x)"},
        {"enum": "x"},
        {"anyOf": []},
        {"type": "integer", "minimum": "3"},
        {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
        {"type": "array", "minItems": 5, "maxItems": 2},
        False,
        {"type": "integer", "minimum": 5, "maximum": 4},
    ],
)
def test_malformed_schemas_raise(compiler, schema):
    with pytest.raises(GrammarError):
        compiler.compile_json_schema(schema)


def test_deeply_nested_schema_is_bounded(compiler):
    schema: dict = {"type": "integer"}
    for _ in range(500):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    with pytest.raises(GrammarError):
        compiler.compile_json_schema(schema)


def test_huge_repeat_counts_are_bounded(compiler):
    g = compiler.compile_json_schema({"type": "array", "items": {"type": "integer"}, "maxItems": 1000000})
    assert accepts_text(g, json.dumps(list(range(50))))
    g = compiler.compile_json_schema({"type": "string", "minLength": 1000000})
    assert not accepts_text(g, json.dumps("x" * 10))


def test_schema_is_not_mutated(compiler):
    schema = {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}},
            {"properties": {"b": {"type": "string"}}, "additionalProperties": False},
        ]
    }
    before = json.dumps(schema)
    compiler.compile_json_schema(schema)
    assert json.dumps(schema) == before


def test_unsatisfiable_schema_is_an_error(compiler):
    with pytest.raises(GrammarError, match="accepts no"):
        compiler.compile_json_schema(
            {"allOf": [{"type": "object", "required": ["a"]}], "additionalProperties": False}
        )


@pytest.mark.parametrize(
    "schema,where,why",
    [
        (  # a oneOf whose branches each contradict the required list beside them (a MaskBench schema's shape)
            {
                "type": "object",
                "required": ["shape", "dims"],
                "properties": {
                    "shape": {"type": "string"},
                    "dims": {
                        "type": "object",
                        "required": ["r", "w"],
                        "properties": {"r": {"type": "number"}, "w": {"type": "number"}},
                        "oneOf": [{"not": {"required": ["r"]}}, {"not": {"required": ["w"]}}],
                    },
                },
            },
            "/properties/dims",
            "oneOf, properties, required, type",
        ),
        (
            {
                "type": "object",
                "required": ["a"],
                "properties": {
                    "a": {
                        "type": "object",
                        "required": ["b~/"],
                        "properties": {"b~/": {"allOf": [{"type": "string"}, {"type": "null"}]}},
                    }
                },
            },
            "/properties/a/properties/b~0~1",
            "allOf",
        ),
        (
            {"type": "array", "minItems": 2, "items": {"type": "integer", "minimum": 5, "maximum": 3}},
            "/items",
            "maximum",
        ),
        (
            {"type": "array", "prefixItems": [{"type": "null"}, False], "minItems": 2},
            "/prefixItems/1",
            "the schema false",
        ),
        (
            {
                "type": "object",
                "required": ["a"],
                "properties": {"a": {"$ref": "#/$defs/x"}},
                "$defs": {"x": {"minLength": 3, "maxLength": 2, "type": "string"}},
            },
            "/properties/a",
            "maxLength, minLength, type",
        ),
    ],
)
def test_an_empty_schema_names_the_part_that_accepts_nothing(compiler, schema, where, why):
    with pytest.raises(GrammarError, match="accepts no value") as exc:
        compiler.compile_json_schema(schema)
    msg = str(exc.value)
    assert f"every instance must hold {where}," in msg and why in msg, msg
    with pytest.raises(GrammarError, match=f"hold {where},"):  # the check without a vocabulary says the same
        check_grammar("json_schema", schema)


def test_an_empty_schema_without_a_required_part_to_blame_says_so(compiler):
    with pytest.raises(GrammarError, match=r"accepts no value \(its keywords contradict each other\)$"):
        compiler.compile_json_schema({"allOf": [{"type": "string"}, {"type": "integer"}]})


def test_naming_the_empty_part_of_a_deep_schema_stays_within_the_budget(compiler):
    """Every level of a 55-deep chain of required properties is compiled on its own to find the empty leaf:
    that work runs in the failing compile's budget."""
    schema: dict = {"type": "integer", "minimum": 2, "maximum": 1}
    for _ in range(55):
        schema = {"type": "object", "required": ["k"], "properties": {"k": schema}}
    with pytest.raises(GrammarError, match="accepts no value") as exc:
        compiler.compile_json_schema(schema)
    assert "/properties/k" * 55 + "," in str(exc.value)


COUNTED = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
    "additionalProperties": False,
    "minProperties": 2,
    "maxProperties": 2,
}


@pytest.mark.parametrize("seed", range(3))
def test_property_counts_leave_no_dead_end(compiler, smollm2_vocab, seed):
    """Members that can no longer reach minProperties (or fit maxProperties) are never started."""
    assert _check_generation(compiler, smollm2_vocab, COUNTED, seed) >= 1
    g = compiler.compile_json_schema(COUNTED)
    m = GrammarMatcher(g)
    assert not m.accept_bytes(b'{"c"')  # one member at most: below minProperties, and nothing may follow
    assert accepts_text(g, '{"a": 1, "c": 3}')
    assert not accepts_text(g, '{"a": 1, "b": 2, "c": 3}')
    assert not g.automaton.nfa.may_dead_end


def test_separator_is_lowered_once_per_member(compiler, smollm2_vocab):
    """After a member's comma the automaton holds one whitespace run and the next keys' opening quotes, not a
    separator per member that may come next; counts, order, extras and the end of the object still hold."""
    n = 30
    schema = {
        "type": "object",
        "properties": {f"p{i}": {"type": "integer"} for i in range(n)},
        "additionalProperties": {"type": "boolean"},
        "minProperties": 2,
        "maxProperties": 4,
    }
    g = compiler.compile_json_schema(schema)
    m = GrammarMatcher(g)
    assert m.accept_bytes(b'{"p0": 1, ')
    auto = g.automaton
    k = auto.pairs[m._state][0]
    assert len(auto._configs(k)) <= n + 4
    assert accepts_text(g, '{"p3": 1, "p7": 2}')
    assert accepts_text(g, '{"p3": 1,  "p7": 2, "x": true, "y": false}')
    assert accepts_text(g, '{"p29": 1, "zz": true}')
    assert not accepts_text(g, '{"p3": 1}')  # minProperties
    assert not accepts_text(g, '{"p3": 1, "p7": 2, "x": true, "y": false, "z": true}')  # maxProperties
    assert not accepts_text(g, '{"p7": 1, "p3": 2}')  # schema order
    assert not accepts_text(g, '{"p3": 1, , "p7": 2}')
    assert not accepts_text(g, '{"p3": 1, "p7": 2, }')
    assert not g.automaton.nfa.may_dead_end


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "properties": {"a": {}, "b": {}},
            "additionalProperties": False,
            "minProperties": 3,
        },
        {"type": "object", "required": ["a", "b", "c"], "maxProperties": 2},
    ],
)
def test_impossible_property_counts_are_an_error(compiler, schema):
    with pytest.raises(GrammarError, match="accepts no"):
        compiler.compile_json_schema(schema)


def test_unsatisfiable_optional_property_is_left_out(compiler):
    """An optional property whose schema accepts nothing cannot be started, and no trimming pass is needed."""
    schema = {
        "type": "object",
        "properties": {"x": {"allOf": [{"type": "string"}, {"type": "integer"}]}, "y": {"type": "integer"}},
        "additionalProperties": False,
    }
    g = compiler.compile_json_schema(schema)
    assert not g.automaton.nfa.may_dead_end
    assert not GrammarMatcher(g).accept_bytes(b'{"x"')
    assert accepts_text(g, '{"y": 1}')


LONG_PATTERN = {"type": "string", "pattern": "^a*(bc)+$", "maxLength": 600}


def test_counted_max_length_is_exact(compiler, smollm2_vocab):
    """A pattern with only maxLength on a big automaton is counted at run time: every length is exact, and a
    prefix that leaves no room to finish (the pattern needs 'bc' at the end) is refused as soon as it is."""
    g = compiler.compile_json_schema(LONG_PATTERN)
    assert g.automaton.nfa.loop_slack  # the counted construction, not one copy per length
    for text, ok in [
        ("bc", True),
        ("a" * 598 + "bc", True),
        ("a" * 599 + "bc", False),
        ("a" * 596 + "bcbc", True),
        ("", False),
        ("a" * 10, False),
        ("bcb", False),
    ]:
        assert accepts_text(g, json.dumps(text)) == ok, len(text)
    m = GrammarMatcher(g)
    assert m.accept_bytes(b'"' + b"a" * 598)
    mask = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
    m.fill_next_token_bitmask(mask)
    tid = {bytes(t): i for i, t in enumerate(smollm2_vocab.token_bytes)}

    def allowed(tok: bytes) -> bool:
        return bool((int(mask[tid[tok] >> 5]) >> (tid[tok] & 31)) & 1)

    assert allowed(b"b") and not allowed(b"a")  # 599 a's would leave no room for "bc"
    assert not m.accept_bytes(b"a")
    assert m.accept_bytes(b'bc"') and m.is_accepting()


@pytest.mark.parametrize("seed", range(4))
def test_counted_max_length_generation_validates(compiler, smollm2_vocab, seed):
    schema = {
        "type": "object",
        "properties": {
            "email": {"type": "string", "format": "email", "maxLength": 1024},
            "code": LONG_PATTERN,
        },
        "required": ["email", "code"],
    }
    assert _check_generation(compiler, smollm2_vocab, schema, seed) >= 1


def test_counted_length_with_a_minimum_is_exact(compiler, smollm2_vocab):
    """With a minLength well below maxLength, the minimum is unrolled and the maximum counted: both exact."""
    schema = {"type": "string", "pattern": "^a*(bc)+$", "minLength": 5, "maxLength": 600}
    g = compiler.compile_json_schema(schema)
    assert g.automaton.nfa.loop_slack  # counted, not one copy per length
    for text, ok in [
        ("bc", False),
        ("abc", False),
        ("aabc", False),
        ("aaabc", True),
        ("bcbc", False),
        ("abcbc", True),
        ("a" * 598 + "bc", True),
        ("a" * 599 + "bc", False),
    ]:
        assert accepts_text(g, json.dumps(text)) == ok, (len(text), text[:8])
        assert jsonschema.Draft202012Validator(schema).is_valid(text) == ok
    email = {"type": "string", "pattern": r"^[^@\s]+@[^@\s]+\.[a-z]+$", "minLength": 6, "maxLength": 254}
    assert (
        _check_generation(
            compiler, smollm2_vocab, {"type": "object", "properties": {"e": email}, "required": ["e"]}, 0
        )
        >= 1
    )


def test_counted_max_length_too_short_is_empty(compiler):
    with pytest.raises(GrammarError, match="accepts no"):
        compiler.compile_json_schema({"type": "string", "pattern": "^a{700}$", "maxLength": 650})


def test_literal_pattern_properties_are_exact(compiler):
    """Anchored literal patterns (as generated schemas write alternate key spellings) join the declared keys:
    their key takes their schema, and an extra key can spell neither."""
    schema = {
        "type": "object",
        "properties": {"clientId": {"type": "integer"}},
        "patternProperties": {"^client_id$": {"type": "integer"}, "^x-": {"type": "string"}},
        "additionalProperties": {"type": "boolean"},
    }
    g = compiler.compile_json_schema(schema)
    docs = [
        {"clientId": 1},
        {"client_id": 2},
        {"client_id": "a"},
        {"client_idx": True},
        {"client_i": True},
        {"x-y": "s"},
        {"x-y": True},
        {"other": True},
        {"other": 1},
        {"clientId": 1, "client_id": 2},
    ]
    for doc in docs:
        valid = jsonschema.Draft202012Validator(schema).is_valid(doc)
        assert accepts_text(g, json.dumps(doc)) == valid, doc


@pytest.mark.parametrize(
    "patterns,overlap",
    [
        (["^ab$", "^a"], True),
        (["^ab$", "^b"], False),
        (["^ab$", "^(ab)$"], True),
        (["^ab$", "^ac$"], False),
    ],
)
def test_literal_pattern_overlaps_detected(compiler, patterns, overlap):
    schema = {"type": "object", "patternProperties": {p: {"type": "integer"} for p in patterns}}
    if overlap:
        with pytest.raises(GrammarError, match="overlapping"):
            compiler.compile_json_schema(schema)
    else:
        compiler.compile_json_schema(schema)


def test_cache_hits_same_object(compiler):
    a = compiler.compile_json_schema(PERSON)
    b = compiler.compile_json_schema(json.loads(json.dumps(PERSON)))
    assert a is b
    assert compiler.compile_json_schema(PERSON, strict=True) is not a


def test_oneof_overlapping_objects_made_exclusive(compiler):
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
    }
    g = compiler.compile_json_schema(schema)
    for doc in ({"a": 1}, {"b": 2}, {"a": 1, "b": 2}, {}, {"a": 1, "c": 3}):
        valid = jsonschema.Draft202012Validator(schema).is_valid(doc)
        assert accepts_text(g, json.dumps(doc)) == valid, doc


def test_recursive_allof_ref_terminates(compiler):
    schema = {
        "definitions": {
            "item": {
                "type": "object",
                "properties": {
                    "children": {
                        "type": "array",
                        "items": {"allOf": [{"$ref": "#/definitions/item"}, {"required": ["x"]}]},
                    },
                    "x": {"type": "integer"},
                },
                "additionalProperties": False,
            }
        },
        "$ref": "#/definitions/item",
    }
    g = compiler.compile_json_schema(schema)
    assert accepts_text(g, '{"children": [{"children": [{"x": 2}], "x": 1}]}')
    assert not accepts_text(g, '{"children": [{"children": []}]}')


def test_vendor_keys_beside_a_ref_leave_it_a_reference(compiler):
    """A `$ref` beside keys no validator reads (vendor extensions such as `x-intellij-html-description`,
    `preferredOrder`) or annotations is the reference itself, one rule for every such use; beside a keyword
    that asserts something it is merged with its target. Beside an anyOf, vendor keys join no branch, and
    allOf branches that differ only in them merge into one rule."""
    from tokenseam.grammar.budget import compile_budget
    from tokenseam.grammar.json_schema import schema_to_grammar

    point = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}
    schema = {
        "definitions": {"point": point},
        "type": "object",
        "properties": {
            "a": {
                "$ref": "#/definitions/point",
                "x-intellij-html-description": "<b>a</b>",
                "description": "a",
            },
            "b": {
                "$ref": "#/definitions/point",
                "x-intellij-html-description": "<b>b</b>",
                "preferredOrder": [],
            },
            "c": {"$ref": "#/definitions/point", "required": ["x"]},
            "d": {"x-vendor": 1, "anyOf": [{"$ref": "#/definitions/point"}, {"type": "string"}]},
            "e": {"allOf": [{"$ref": "#/definitions/point"}, {"x-order": 1, "required": ["y"]}]},
            "f": {"allOf": [{"$ref": "#/definitions/point"}, {"x-order": 2, "required": ["y"]}]},
        },
    }
    with compile_budget(10, None, None):
        g = schema_to_grammar(schema)
    # c's merge, and one for e and f: merged, the vendor keys drop out
    assert sorted(n for n in g.rules if n.startswith("all")) == ["all0", "all1"]
    assert sorted(n for n in g.rules if n.startswith("ref")) == ["ref0"]
    compiled = compiler.compile_json_schema(schema)
    for doc in (
        {"a": {"x": 1}, "b": {"y": 2}, "c": {"x": 3}, "d": "s"},
        {"c": {"y": 1}},
        {"a": {"x": "1"}},
        {"d": {"x": 1}},
        {"d": 1},
        {"b": {"x": 1, "z": 1}},
        {"e": {"x": 1}},
        {"f": {"y": 1}},
    ):
        valid = jsonschema.Draft202012Validator(schema).is_valid(doc)
        assert accepts_text(compiled, json.dumps(doc)) == valid, doc


def test_keywords_beside_anyof_join_each_branch_without_annotations(compiler, monkeypatch):
    """An anyOf beside other keywords becomes one allOf per branch; the document's `definitions` and other
    annotations beside it stay out of those allOfs (they assert nothing, and their text was most of every
    memo key), and the language is the one jsonschema validates."""
    from tokenseam.grammar import json_schema

    defs = {f"d{i}": {"type": "string", "description": "x" * 200} for i in range(200)}
    schema = {
        "definitions": defs,
        "description": "a document",
        "type": "object",
        "required": ["kind"],
        "anyOf": [
            {"$ref": "#/definitions/a"},
            {"properties": {"kind": {"const": "b"}, "n": {"type": "integer"}}},
        ],
    }
    schema["definitions"]["a"] = {"properties": {"kind": {"const": "a"}, "s": {"$ref": "#/definitions/d7"}}}
    keys = []
    encoder = json_schema.SORTED

    class Recording:
        def encode(self, value):
            text = encoder.encode(value)
            keys.append(text)
            return text

    monkeypatch.setattr(json_schema, "SORTED", Recording())
    g = compiler.compile_json_schema(schema)
    assert keys and all(len(k) < 2_000 for k in keys), max(map(len, keys))
    for doc in (
        {"kind": "a", "s": "t"},
        {"kind": "b", "n": 3},
        {"kind": "a", "n": 3},
        {"kind": "b", "s": 1},
        {"kind": "c"},
        {"s": "t"},
        {"kind": "a", "s": 2},
    ):
        valid = jsonschema.Draft7Validator(schema).is_valid(doc)
        assert accepts_text(g, json.dumps(doc)) == valid, doc


@pytest.mark.parametrize(
    "schema,docs",
    [
        ({"not": {"type": "string"}}, [1, "x", None, [1], {"a": "b"}]),
        ({"type": ["string", "integer"], "not": {"type": "integer"}}, [1, "x", 2.5]),
        (
            {"type": "object", "properties": {"a": {}, "b": {}}, "not": {"required": ["a", "b"]}},
            [{"a": 1}, {"a": 1, "b": 2}, {}, {"b": 1}],
        ),
        ({"type": "string", "not": {"enum": ["foo", "bar"]}}, ["foo", "bar", "baz", "fo"]),
        ({"not": {"const": "x"}, "enum": ["x", "y"]}, ["x", "y"]),
        ({"not": {}}, [1]),
        ({"not": False, "type": "integer"}, [1, "a"]),
    ],
)
def test_supported_not_forms_are_exact(compiler, schema, docs):
    try:
        g = compiler.compile_json_schema(schema)
    except GrammarError:
        assert schema == {"not": {}}
        return
    for doc in docs:
        valid = jsonschema.Draft202012Validator(schema).is_valid(doc)
        assert accepts_text(g, json.dumps(doc)) == valid, doc


@pytest.mark.parametrize(
    "bounds",
    [
        {"minimum": 0.01},
        {"minimum": -2.5, "maximum": 10},
        {"exclusiveMinimum": 0, "exclusiveMaximum": 1},
        {"minimum": 1.25, "maximum": 1.5},
        {"exclusiveMinimum": -1.5, "maximum": -0.25},
        {"maximum": 64.0},
        {"minimum": 3, "exclusiveMaximum": 3.001},
        {"exclusiveMinimum": 0.5, "exclusiveMaximum": 0.5000001},
    ],
)
def test_number_bounds_exact(compiler, bounds):
    from decimal import Decimal

    schema = {"type": "number", **bounds}
    g = compiler.compile_json_schema(schema)
    rng = np.random.default_rng(5)
    texts = [
        "0",
        "0.0",
        "-0.5",
        "0.01",
        "0.009",
        "0.0100",
        "1.25",
        "1.5",
        "1.5000",
        "1.2",
        "1.51",
        "-2.5",
        "-2.50001",
        "10",
        "10.0",
        "10.001",
        "3",
        "3.0009",
        "3.001",
        "0.5",
        "0.50000001",
        "-1.5",
        "-0.25",
        "-0.2",
        "64",
        "64.5",
        "63.99",
        "-0.25001",
        "1",
        "0.99",
    ]
    texts += [f"{x:.{rng.integers(0, 5)}f}" for x in rng.uniform(-4, 12, 60)]
    texts += ["0.500000000000000000001", "2.99999999999999999999", "0.0100000000000000000001"]
    for t in texts:
        if t.startswith("-0") and Decimal(t) == 0:
            continue  # "-0" spellings are refused by design (a subset)
        valid = jsonschema.Draft202012Validator(schema).is_valid(json.loads(t))
        accepted = accepts_text(g, t)
        if len(Decimal(t).normalize().as_tuple().digits) > 15:
            assert not accepted or valid, (t, bounds)  # long spellings: never a wrong accept
        else:
            assert accepted == valid, (t, bounds)


def test_formats_standard_unsupported_or_custom_ignored(compiler):
    with pytest.raises(GrammarError, match="format 'regex'"):
        compiler.compile_json_schema({"type": "string", "format": "regex"})
    g = compiler.compile_json_schema({"type": "string", "format": "iri-reference"}, lenient=True)
    assert any("iri-reference" in w for w in g.warnings)
    g = compiler.compile_json_schema({"type": "string", "format": "int32-ish"})
    assert any("not enforced" in w for w in g.warnings) and accepts_text(g, '"anything"')
    g = compiler.compile_json_schema({"type": "string", "format": "json-pointer"})
    assert accepts_text(g, '"/a/b~1c"') and not accepts_text(g, '"a/b"') and not accepts_text(g, '"/~2"')
    g = compiler.compile_json_schema({"type": "string", "format": "uri"})
    assert accepts_text(g, '"https://x.org/a%20b"') and not accepts_text(g, '"https://x/%zz"')


def test_enum_checking_dependency_is_installed_with_the_server():
    """The compiler checks enum/const values with `jsonschema`, so a plain install (the README's serve command)
    must bring it: it was once only a test extra, and such schemas were a 400 there."""
    import importlib.metadata
    import re

    reqs = importlib.metadata.requires("tokenseam") or []
    assert any(re.split(r"[<>=!~;\s]", r)[0] == "jsonschema" and "extra ==" not in r for r in reqs), reqs


def test_an_unsatisfiable_branch_drops_out_of_an_any_of(compiler):
    """allOf of disjoint types is empty; under an enum it used to reach the validator as type '__none__'."""
    import jsonschema

    schema = {
        "anyOf": [
            {"type": "integer"},
            {"allOf": [{"type": "boolean"}, {"type": "integer"}, {"enum": [True]}]},
        ]
    }
    g = compiler.compile_json_schema(schema)
    for text, ok in (("7", True), ("-2", True), ("true", False), ("false", False), ('"x"', False)):
        assert accepts_text(g, text) == ok, text
        assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)) == ok
    # the same empty intersection under a const, and alone (nothing at all is accepted: an error, as always)
    g2 = compiler.compile_json_schema(
        {"anyOf": [{"type": "null"}, {"allOf": [{"type": "string"}, {"type": "integer"}, {"const": 1}]}]}
    )
    assert accepts_text(g2, "null") and not accepts_text(g2, "1")
    with pytest.raises(GrammarError, match="accepts no"):
        compiler.compile_json_schema({"allOf": [{"type": "boolean"}, {"type": "integer"}, {"enum": [True]}]})


@pytest.mark.parametrize(
    "text,ok",
    [
        ("http://x.org/a?b#c", True),
        ("../a/b", True),
        ("a/b:c", True),  # the colon is past the first segment
        ("#frag", True),
        ("", True),  # the empty reference (the document itself)
        ("a b", False),
        ("%zz", False),
    ],
)
def test_uri_reference_format(compiler, text, ok):
    g = compiler.compile_json_schema({"type": "string", "format": "uri-reference"})
    assert accepts_text(g, json.dumps(text)) == ok


def test_allof_of_two_anyof_lists_combines_up_to_its_limit(compiler):
    from tokenseam.grammar.schema_combinators import MAX_COMBOS

    side = int(MAX_COMBOS**0.5)
    a = {"anyOf": [{"const": f"a{i}"} for i in range(side - 1)] + [{"type": "string"}]}  # side x side
    b = {"anyOf": [{"const": f"a{i}"} for i in range(side)]}
    g = compiler.compile_json_schema({"allOf": [a, b]})
    assert accepts_text(g, '"a0"') and not accepts_text(g, '"zz"')
    big = {"anyOf": [{"const": i} for i in range(MAX_COMBOS + 1)]}
    with pytest.raises(GrammarError, match="too large to combine"):
        compiler.compile_json_schema({"allOf": [big, {"anyOf": [{}, {"type": "integer"}]}]})


ENUM_UNION_CASES = [
    # anyOf of bare enums/consts beside a pattern: one enum beside the pattern
    (
        {
            "type": "string",
            "pattern": "^b",
            "anyOf": [{"enum": ["a", "b1"]}, {"const": "b2", "description": "x"}, {"enum": ["b1", "c"]}],
        },
        ["a", "b1", "b2", "c", "b3", 1],
    ),
    # the same values twice with two spellings of one number: 2 and 2.0 are one value
    ({"minimum": 1, "anyOf": [{"enum": [0, 2]}, {"enum": [2.0, "x"]}]}, [0, 2, 2.0, "x", 3]),
    # oneOf is not a union: a value in two branches matches neither
    ({"type": "string", "oneOf": [{"enum": ["x", "y"]}, {"enum": ["y"]}]}, ["x", "y", "z"]),
    # a branch with a keyword beside its enum is not bare
    (
        {"type": "string", "anyOf": [{"enum": ["x"]}, {"enum": ["ab", "abc"], "maxLength": 2}]},
        ["x", "ab", "abc"],
    ),
    # a negation merged beside the enums stays exact
    (
        {"type": "string", "not": {"enum": ["a"]}, "anyOf": [{"enum": ["a", "b"]}, {"enum": ["c"]}]},
        ["a", "b", "c", "d"],
    ),
    (
        {
            "allOf": [
                {"not": {"const": "b"}},
                {"type": "string", "anyOf": [{"enum": ["a", "b"]}, {"const": "c"}]},
            ]
        },
        ["a", "b", "c"],
    ),
]


@pytest.mark.parametrize("schema,values", ENUM_UNION_CASES)
def test_any_of_bare_enums_beside_keywords_keeps_the_language(compiler, schema, values):
    g = compiler.compile_json_schema(schema)
    check = jsonschema.validators.validator_for(schema)(schema)
    for v in values:
        assert accepts_text(g, json.dumps(v)) == check.is_valid(v), v


def test_any_of_bare_enums_beside_keywords_is_checked_once(compiler, monkeypatch):
    """An anyOf of task names narrowed by a pattern per task kind, as in the Azure Pipelines schema (228 kinds,
    240 names): one value check per kind, not one merged schema and validator per name (it took seconds)."""
    from tokenseam.grammar.json_schema import _Compiler

    calls = []
    real = _Compiler.valid_values
    monkeypatch.setattr(
        _Compiler, "valid_values", lambda self, v, s, p="": calls.append(len(v)) or real(self, v, s, p)
    )
    names = [f"Task{i}@1" for i in range(60)]
    schema = {
        "type": "object",
        "properties": {"task": {"anyOf": [{"enum": [n], "description": n} for n in names]}},
        "required": ["task"],
        "anyOf": [{"properties": {"task": {"pattern": f"^{n}$"}}} for n in names[:5]],
    }
    g = compiler.compile_json_schema(schema)
    assert accepts_text(g, '{"task": "Task3@1"}')
    assert not accepts_text(g, '{"task": "Task7@1"}')
    assert len(calls) == 5 and set(calls) == {60}


@pytest.mark.parametrize("draft", [None, "http://json-schema.org/draft-04/schema#"])
def test_enum_values_beside_a_plain_type_are_those_the_validator_keeps(compiler, draft):
    """An enum beside nothing but a `type` of plain names is filtered without the validator: the values
    the grammar accepts are exactly those jsonschema accepts, for every mix of types (draft 4 included)."""
    import itertools
    import json as _json

    import jsonschema

    from tests.grammar.conftest import accepts_text

    values = ["a", "", 1, 1.0, 2.5, -3, True, False, None, [], [1], {}, {"k": "v"}, 10**20, "1"]
    names = ["string", "boolean", "null", "number", "object", "array"]
    for types in itertools.chain(
        ([n] for n in names), (["string", "null"], ["number", "boolean"], ["array", "object", "null"])
    ):
        for t in (types, types[0]) if len(types) == 1 else (types,):
            schema = {"type": t, "enum": values}
            if draft:
                schema["$schema"] = draft
            c = compiler.compile_json_schema(schema)
            validator = jsonschema.validators.validator_for(schema)(schema)
            for v in values:
                text = _json.dumps(v)
                assert accepts_text(c, text) == validator.is_valid(v), (t, v)


def test_literal_tree_is_the_set_of_its_texts():
    # literal_alt writes common prefixes once; its language is exactly the texts (prefixes of one another,
    # the empty text, repeats, multi-byte and escaped characters, long shared runs).
    import random

    from tokenseam.grammar import cpauto
    from tokenseam.grammar.budget import compile_budget
    from tokenseam.grammar.ir import literal_alt

    rnd = random.Random(7)
    alphabet = 'ab"\\\u00e9\U0001f600'
    cases = [["a" * k for k in range(1, 120)], ["x" * 50, "x" * 49 + "y"], [""], ["", "a"], ["a", "a"]]
    for _ in range(200):
        cases.append(
            [
                "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 5)))
                for _ in range(rnd.randint(1, 9))
            ]
        )
    for texts in cases:
        with compile_budget(10, None, None):
            dfa = cpauto.determinize(cpauto.from_ir(literal_alt(texts)))
        probes = set(texts) | {t[:-1] for t in texts} | {t + "a" for t in texts}
        probes |= {"".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 5))) for _ in range(20)}
        for w in probes:
            assert cpauto.accepts(dfa, w) == (w in texts), (texts, w)


def test_literal_tree_shape():
    # Each branching point once, and a text alone below one as its remaining characters (the tree the byte NFA
    # is lowered from: its shape is its state count).
    from tokenseam.grammar.ir import EMPTY, Alt, Seq, lit, literal_alt

    a, b, c, x, y, z = (lit(ch) for ch in "abcxyz")
    assert literal_alt(["ab", "ac", "xyz"]) == Alt((Seq((a, Alt((b, c)))), Seq((x, y, z))))
    assert literal_alt(["a", "ab", "abc", "x"]) == Alt((Seq((a, Alt((EMPTY, Seq((b, Alt((EMPTY, c)))))))), x))
    assert literal_alt(["xyz"]) == Seq((x, y, z))
    assert literal_alt(["xa", "xb"]) == Seq((x, Alt((a, b))))


def _lowered(props: dict) -> tuple[int, list[str]]:
    """The byte NFA of an object requiring `props`: its size, and the string rules it calls."""
    from tokenseam.grammar.json_schema import schema_to_grammar
    from tokenseam.grammar.nfa import build_nfa

    schema = {"type": "object", "properties": props, "required": list(props)}
    nfa = build_nfa(schema_to_grammar(schema))
    return nfa.n, [r for r in nfa.rule_names if r.startswith("%item")]


def test_a_big_pattern_used_twice_is_lowered_once(compiler):
    # A string pattern is a rule: a big one met in two properties is one called copy in the byte NFA; a small
    # one is copied at each use (no call).
    codes = "|".join(f"z{k:03d}-az{k % 7}" for k in range(120))
    big, small = {"type": "string", "pattern": f"^({codes})$"}, {"type": "string", "pattern": "^[a-c]+$"}

    once, _ = _lowered({"a": big})
    twice, called = _lowered({"a": big, "b": big})
    assert len(called) == 1 and twice < once * 1.2
    assert _lowered({"a": small, "b": small})[1] == []
    g = compiler.compile_json_schema(
        {"type": "object", "properties": {"a": big, "b": big}, "required": ["a", "b"]}
    )
    assert accepts_text(g, '{"a": "z005-az5", "b": "z119-az0"}')
    assert not accepts_text(g, '{"a": "z005-az5", "b": "z119-az1"}')
    assert not accepts_text(g, '{"a": "z005-az", "b": "z119-az0"}')


def test_a_length_bounded_word_pattern_used_twice_is_lowered_once(compiler):
    # A pattern of non-ASCII classes under maxLength is small as a code point automaton but several times larger
    # in bytes (each character guarded, with its own multi-byte forms): used in two properties it is one call.
    words = {"type": "string", "pattern": "^(?:\\S+\\s+){0,9}\\S+$", "maxLength": 120}

    once, _ = _lowered({"a": words})
    twice, called = _lowered({"a": words, "b": words})
    assert len(called) == 1 and twice < once * 1.2
    g = compiler.compile_json_schema(
        {"type": "object", "properties": {"a": words, "b": words}, "required": ["a", "b"]}
    )
    ten, eleven = " ".join(["é"] * 10), " ".join(["w"] * 11)
    assert accepts_text(g, json.dumps({"a": ten, "b": "x\ty"}, ensure_ascii=False))
    assert accepts_text(g, json.dumps({"a": "one", "b": "x" * 120}))
    assert not accepts_text(g, json.dumps({"a": "one", "b": eleven}))
    assert not accepts_text(g, json.dumps({"a": "x" * 121, "b": "one"}))
    assert not accepts_text(g, json.dumps({"a": "one ", "b": "one"}))


def test_a_key_pattern_with_a_long_repeat_stays_counted(compiler):
    """A patternProperties key `^[0-9a-zA-Z_-]{1,255}$` (no declared names) is lowered from the pattern's IR,
    its repeat counted, not as a 256-state key automaton; the keys it accepts are exactly the pattern's."""
    from tokenseam.grammar.json_schema import schema_to_grammar
    from tokenseam.grammar.nfa import build_nfa

    key = "^[0-9a-zA-Z_-]{1,255}$"
    schema = {
        "type": "object",
        "patternProperties": {key: {"type": "integer"}},
        "additionalProperties": False,
    }
    assert build_nfa(schema_to_grammar(schema)).n < 100  # (as a key automaton: 312 states)
    g = compiler.compile_json_schema(schema)
    for k in ["a", "Z_-9", "k" * 255]:
        assert accepts_text(g, f'{{"{k}": 1}}'), k
    for k in ["", "k" * 256, "a.b", "é", "a\\n", "\\u002e"]:  # (the last two: escapes of "\n" and ".")
        assert not accepts_text(g, f'{{"{k}": 1}}'), k
    assert not accepts_text(g, '{"a": "x"}')
    # A pattern whose key automaton would pass MAX_DFA_STATES (2^21 subsets) is counted as a string value's is.
    g = compiler.compile_json_schema(
        {
            "type": "object",
            "patternProperties": {"^(a|b)*a(a|b){20}$": {"type": "integer"}},
            "additionalProperties": False,
        }
    )
    k, bs = "ab" * 15 + "a" + "b" * 20, "b" * 21
    assert accepts_text(g, f'{{"{k}": 1}}') and accepts_text(g, f'{{"{k[1:]}": 1}}')
    assert not accepts_text(g, f'{{"{k[:-1]}ab": 1}}') and not accepts_text(g, f'{{"{bs}": 1}}')
    # Beside a declared name, or under additionalProperties true (keys outside the pattern are free), the key
    # automata do the work, as before.
    loose = {"type": "object", "patternProperties": {key: {"type": "integer"}}}
    g = compiler.compile_json_schema(loose)
    assert accepts_text(g, '{"a": 1, "a.b": "x", "%s": "y"}' % ("k" * 256))
    assert not accepts_text(g, '{"a": "x"}')
    named = {**schema, "properties": {"a.b": {"type": "string"}, "id": {"type": "string"}}}
    g = compiler.compile_json_schema(named)
    assert accepts_text(g, '{"a.b": "x", "b": 2}') and not accepts_text(g, '{"a.b": 1}')
    assert not accepts_text(g, '{"id": "x"}')  # (matched by the pattern too: a string and an integer)


def test_a_long_enum_of_codes_shares_its_prefixes(compiler):
    from tokenseam.grammar.json_schema import schema_to_grammar
    from tokenseam.grammar.nfa import build_nfa

    codes = [f"{a:03d}-{b:03d}" for a in range(1, 9) for b in range(150)]
    schema = {
        "type": "object",
        "properties": {"c": {"enum": [*codes, 7, None, True, 2.5, [1, 2]]}},
        "required": ["c"],
    }
    nfa = build_nfa(schema_to_grammar(schema))
    assert nfa.n < sum(map(len, codes)) // 2  # a state per distinct prefix, not per character of every code
    g = compiler.compile_json_schema(schema)
    for v in [codes[0], codes[-1], "003-077", 7, None, True, 2.5, [1, 2]]:
        assert accepts_text(g, json.dumps({"c": v})), v
    for v in ["003-07", "003-0777", "009-000", "", 8, False, 2.0, [1]]:
        assert not accepts_text(g, json.dumps({"c": v})), v


def test_a_large_array_item_is_lowered_once(compiler):
    # The item of an array is written twice (the first item, then each later one after a comma): a large one
    # becomes a called rule, lowered once; a small one is still copied (no call).
    from tokenseam.grammar.json_schema import schema_to_grammar
    from tokenseam.grammar.nfa import build_nfa

    big = {
        "type": "object",
        "properties": {f"field_{i}": {"type": ["integer", "null"]} for i in range(40)},
        "required": ["field_0"],
    }
    one = build_nfa(schema_to_grammar(big)).n
    many = build_nfa(schema_to_grammar({"type": "array", "items": big, "minItems": 1}))
    assert many.n < 1.3 * one and many.call
    small = build_nfa(schema_to_grammar({"type": "array", "items": {"type": "integer"}}))
    assert not small.call
    g = compiler.compile_json_schema({"type": "array", "items": big, "minItems": 1, "maxItems": 3})
    item = {"field_0": 1, "field_7": None}
    for doc, ok in [
        ([item], True),
        ([item] * 3, True),
        ([], False),
        ([item] * 4, False),
        ([{"field_7": 1}], False),
    ]:
        assert accepts_text(g, json.dumps(doc)) == ok, doc


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "x-intellij-html-description": "<b>kind</b>", "enum": ["a", 1, None, "b"]},
        {"enum": ["a", "B", 3], "ignoreCase": True, "aliases": ["b"]},
        {"enum": [1, 2, 7], "if": {"const": 1}, "then": {"minimum": 5}, "else": {"maximum": 2}, "x-k": 1},
        {"enum": [[1], [1, 1], [2, 2, 2]], "contains": {"const": 1}, "maxContains": 1, "ignoreCase": False},
        {"type": ["integer", "null"], "enum": [1, 1.5, None, "x"], "readonly": True},
    ],
)
def test_enum_beside_keys_no_validator_reads(compiler, monkeypatch, schema):
    """Keys no JSON Schema draft reads (vendor extensions, `ignoreCase`) say nothing about an enum's values:
    with nothing else beside it (or only a plain `type`), no validator is built; the keys a kept keyword reads
    (`then`, `else`, `maxContains`) stay. The values accepted are those jsonschema accepts."""
    from tokenseam.grammar.json_schema import _Compiler

    calls = []
    real = _Compiler.valid_values
    monkeypatch.setattr(
        _Compiler, "valid_values", lambda self, v, s, p="": calls.append(sorted(s)) or real(self, v, s, p)
    )
    g = compiler.compile_json_schema(schema)
    check = jsonschema.Draft202012Validator(schema)
    for v in schema["enum"] + ["b", 2, [1, 2], [1, 1, 1]]:
        assert accepts_text(g, json.dumps(v)) == check.is_valid(v), v
    validated = [k for k in schema if k in ("if", "contains") or k == "type" and "integer" in schema[k]]
    assert bool(calls) == bool(validated)
    assert all(
        not any(k.startswith("x-") or k in ("ignoreCase", "aliases", "readonly") for k in c) for c in calls
    )


def test_integer_ranges_with_short_bounds_are_built_once(compiler):
    """int_range remembers ranges whose bounds fit in 18 digits (the same IR node for the same bounds, a
    bounded memo); longer bounds are built each time, so requests with huge bounds leave nothing behind. Both
    are exact."""
    from tokenseam.grammar.schema_numbers import _small_int_range, int_range

    assert int_range(None, None) is int_range(None, None)
    assert int_range(-5, 10**17) is int_range(-5, 10**17)
    huge = 10**40
    assert int_range(0, huge) is not int_range(0, huge)
    assert _small_int_range.cache_info().maxsize == 64
    for schema, good, bad in (
        (
            {"type": "integer", "minimum": -5, "maximum": 10**17},
            ["-5", "0", str(10**17)],
            ["-6", str(10**17 + 1)],
        ),
        ({"type": "integer", "maximum": huge}, ["-1", str(huge)], [str(huge + 1), "1.5"]),
        ({"type": "integer"}, ["-0", "12", "-7"], ["01", "1e3"]),
    ):
        g = compiler.compile_json_schema(schema)
        assert all(accepts_text(g, t) for t in good) and not any(accepts_text(g, t) for t in bad), schema
