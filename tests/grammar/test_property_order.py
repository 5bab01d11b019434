"""property_order "any": declared properties in any order, each at most once, every other keyword still exact."""

from __future__ import annotations

import itertools
import json
import random

import jsonschema
import numpy as np
import pytest

from tokenseam.grammar import GrammarError, GrammarMatcher
from tokenseam.grammar.anyorder import EXIT, SEP, SetSpec, make_spec, step

from .conftest import accepts_text, sample

FOUR = {
    "type": "object",
    "properties": {
        "a": {"type": "integer"},
        "b": {"type": "string", "maxLength": 3},
        "ab": {"type": "boolean"},
        "c": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
    },
    "required": ["a", "c"],
}
VALUES = {"a": [1, "x"], "b": ["xy", "long!"], "ab": [True, 0], "c": [[1, 2], [1, 2, 3]], "zz": [None]}


def _docs(names):
    """Every object over subsets of `names` in every order, with each member's good and bad value."""
    for k in range(len(names) + 1):
        for combo in itertools.permutations(names, k):
            for values in itertools.product(*(VALUES[n] for n in combo)):
                yield dict(zip(combo, values, strict=True)), list(zip(combo, values, strict=True))


def _agree(compiled, schema, pairs) -> None:
    text = "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs) + "}"
    valid = jsonschema.Draft202012Validator(schema).is_valid(dict(pairs))
    assert accepts_text(compiled, text) == valid, text


@pytest.mark.parametrize("strict", [False, True])
def test_any_order_agrees_with_jsonschema_on_every_order(compiler, strict):
    schema = dict(FOUR, additionalProperties=not strict)
    g = compiler.compile_json_schema(schema, property_order="any")
    n = 0
    for _, pairs in _docs(["a", "b", "ab", "c", "zz"]):
        _agree(g, schema, pairs)
        n += 1
    assert n > 1000


def test_counts_patterns_and_additional_properties_stay_exact(compiler):
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "ab": {"type": "integer"}},
        "patternProperties": {"^x": {"type": "string"}},
        "additionalProperties": False,
        "minProperties": 2,
        "maxProperties": 3,
        "required": ["b"],
    }
    g = compiler.compile_json_schema(schema, property_order="any")
    keys = ["a", "b", "ab", "x1", "x2"]
    vals = {"a": [1], "b": [2, "s"], "ab": [3], "x1": ["s", 4], "x2": ["t"]}
    for k in range(5):
        for combo in itertools.permutations(keys, k):
            for values in itertools.product(*(vals[n] for n in combo)):
                _agree(g, schema, list(zip(combo, values, strict=True)))


def test_each_property_at_most_once(compiler):
    g = compiler.compile_json_schema(FOUR, property_order="any")
    assert accepts_text(g, '{"c": [], "a": 1}')
    assert not accepts_text(g, '{"c": [], "a": 1, "a": 2}')
    assert not accepts_text(g, '{"a": 1, "c": [], "c": []}')
    assert not accepts_text(g, '{"a": 1, "ab": true, "c": [], "ab": false}')


def test_schema_order_stays_the_default(compiler):
    g = compiler.compile_json_schema(FOUR)
    assert accepts_text(g, '{"a": 1, "c": []}')
    assert not accepts_text(g, '{"c": [], "a": 1}')
    ordered = compiler.compile_json_schema(FOUR, property_order="schema")
    assert ordered is g  # one cache entry: "schema" is the default spelled out


def test_nested_and_recursive_objects(compiler):
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["name"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    }
    g = compiler.compile_json_schema(schema, property_order="any")
    assert accepts_text(g, '{"kids": [{"kids": [], "name": "b"}, {"name": "c"}], "name": "a"}')
    assert not accepts_text(g, '{"kids": [{"kids": []}], "name": "a"}')
    assert not accepts_text(g, '{"name": "a", "kids": [{"name": "b", "name": "c"}]}')


@pytest.mark.parametrize("mode", ["random", "close", "eos_last", "long"])
def test_sampling_under_the_mask_gives_valid_objects_without_duplicates(compiler, smollm2_vocab, mode):
    schema = dict(FOUR, additionalProperties=False, minProperties=3)
    g = compiler.compile_json_schema(schema, property_order="any", compact=True)
    rng = np.random.default_rng(7)
    orders = set()
    for _ in range(40):
        out, done = sample(g, smollm2_vocab, rng, 200, mode)
        assert done, out
        pairs = json.loads(out, object_pairs_hook=lambda kv: kv)
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), out
        jsonschema.validate(dict(pairs), schema)
        orders.add(tuple(keys))
    assert len(orders) > 3  # the mask really offers other orders


def test_many_optional_properties_do_not_blow_up(compiler, smollm2_vocab):
    names = [f"p{i}" for i in range(48)]
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in names}}
    schema["additionalProperties"] = False
    g = compiler.compile_json_schema(schema, property_order="any", compact=True)
    m = GrammarMatcher(g)
    out = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
    m.fill_next_token_bitmask(out)
    order = names[:]
    random.Random(3).shuffle(order)
    doc = "{" + ",".join(f'"{n}":{i}' for i, n in enumerate(order)) + "}"
    assert accepts_text(g, doc)
    assert not accepts_text(g, doc[:-1] + ',"p0":1}')
    # Only the sets of properties the document reached were built: states grow with its bytes, not with 2^48.
    assert g.automaton.num_states <= 4 * len(doc)


def test_an_object_too_large_for_the_set_frame_keeps_schema_order_and_says_so(compiler):
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(70)}}
    g = compiler.compile_json_schema(schema, property_order="any")
    assert any("70 declared properties" in w and "schema order" in w for w in g.warnings)
    assert accepts_text(g, '{"p0": 1, "p1": 2}') and not accepts_text(g, '{"p1": 2, "p0": 1}')
    small = compiler.compile_json_schema({"type": "object", "properties": {"a": {}}}, property_order="any")
    assert not small.warnings
    with pytest.raises(GrammarError, match='property_order "any" supports objects of up to'):
        make_spec([(None, False)] * 70, False, 0, None)  # the lowering's own guard


@pytest.mark.parametrize("bad", ["random", "", None, 1, True])
def test_bad_property_order_is_refused(compiler, bad):
    with pytest.raises(GrammarError, match="property_order"):
        compiler.compile_json_schema(FOUR, property_order=bad)


def test_set_operations():
    spec = SetSpec(nbits=3, required=0b001, lo=2, hi=2, extras=False)
    assert step(spec, 0, EXIT) == -1  # required property 0 missing
    v = step(spec, 0, 1)  # property 1 first
    assert v == 0b010 | (1 << 3)
    assert step(spec, v, 1) == -1  # not twice
    assert step(spec, v, 2) == -1  # it would leave no room for the required property 0
    assert step(spec, v, SEP) == v  # property 0 can still follow
    v = step(spec, v, 0)
    assert step(spec, v, EXIT) == v
    assert step(spec, v, SEP) == -1  # maxProperties reached: no separator


def test_numba_set_operations_match_the_reference():
    from tokenseam.grammar.anyorder import ADD_EXTRA
    from tokenseam.grammar.localbuild import _set_step

    rng = random.Random(5)
    for _ in range(300):
        nbits = rng.randint(1, 6)
        hi = rng.choice([None, rng.randint(0, 8)])
        req = rng.getrandbits(nbits)
        dead = rng.getrandbits(nbits) & ~req if rng.random() < 0.3 else 0
        spec = SetSpec(nbits, req, rng.randint(0, 5), hi, rng.random() < 0.5, dead)
        row = (nbits, spec.required, spec.lo, -1 if hi is None else hi, spec.extras, dead)
        sets = np.array([row], np.int64)
        for _ in range(20):
            value = rng.getrandbits(nbits) | (rng.randint(0, spec.cap) << nbits)
            for code in (*range(nbits), ADD_EXTRA, SEP, EXIT):
                assert _set_step(sets, 0, value, code) == step(spec, value, code), (spec, value, code)


def test_numba_and_python_builders_give_the_same_masks(smollm2_vocab):
    from .test_positions import _compare_builders

    schema = dict(FOUR, patternProperties={"^x": {"type": "integer"}}, maxProperties=4)
    doc = '{"c": [1], "x1": 2, "ab": true, "a": 3}'
    _compare_builders(smollm2_vocab, "schema", schema, doc, property_order="any")


def test_members_the_trim_removes_are_accounted_for(compiler, smollm2_vocab):
    # Every branch of the oneOf contradicts the required properties: no object is valid. The trim removes the
    # members whose values cannot finish; any order must then be as empty as schema order, not a dead end.
    impossible = {
        "type": "object",
        "properties": {"r": {"type": "number"}, "s": {"type": "number"}},
        "required": ["r", "s"],
        "oneOf": [{"required": ["r"]}, {"required": ["s"]}],
    }
    for order in ("schema", "any"):
        with pytest.raises(GrammarError, match="accepts no"):
            compiler.compile_json_schema(impossible, property_order=order)
    # An optional member that cannot finish: minProperties must not count on it.
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"allOf": [{"type": "string"}, {"type": "integer"}]}},
        "additionalProperties": False,
        "minProperties": 1,
    }
    g = compiler.compile_json_schema(schema, property_order="any", compact=True)
    rng = np.random.default_rng(1)
    for mode in ("random", "close", "eos_last"):
        out, done = sample(g, smollm2_vocab, rng, 60, mode)
        assert done and json.loads(out).keys() == {"a"}, out
