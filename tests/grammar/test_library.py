"""Library rules (grammar/library.py): a body lowered once per process and copied into later NFAs gives the
NFA its own lowering would have given, state for state."""

import pytest

from tokenseam.grammar import library
from tokenseam.grammar.budget import compile_budget
from tokenseam.grammar.ir import Grammar, Ref, lit, seq, star
from tokenseam.grammar.json_schema import schema_to_grammar
from tokenseam.grammar.nfa import build_nfa


def nfa_of(g: Grammar) -> tuple:
    """Everything an NFA holds, in a comparable form."""
    with compile_budget(30, None):
        n = build_nfa(g)
        n.freeze_rows()
    return (
        [list(r) for r in n.edges],
        [list(r) for r in n.eps],
        sorted(n.call.items()),
        n.rule_start,
        n.rule_end,
        n.rule_names,
        [sorted(getattr(n, d).items()) for d in ("cpush", "cinc", "cexit", "cguard", "cset", "cset_op")],
        sorted(n.universal),
        sorted(n.counted_body.items()),
        sorted(n.counted_budget.items()),
        n.loops,
        sorted(n.loop_step.items()),
        sorted(n.loop_slack.items()),
        sorted((k, repr(v)) for k, v in n.sets.items()),
        n.may_dead_end,
    )


SCHEMAS = [
    {},
    {"type": "object", "properties": {"a": {"type": "string"}}},
    {"type": "array", "items": {"type": "string", "maxLength": 12}},
    {
        "type": "object",
        "properties": {"k": {"type": "string", "minLength": 2, "maxLength": 40}},
        "required": ["k"],
    },
    # the string rule met before the any-value rule, and the other way round
    {"type": "object", "properties": {"a": {"type": "string"}, "b": {}}, "required": ["a", "b"]},
    {"type": "object", "properties": {"b": {}, "a": {"type": "string"}}, "required": ["b", "a"]},
    {
        "type": "array",
        "items": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 3}},
    },
]


@pytest.mark.parametrize("order", ["schema", "any"])
@pytest.mark.parametrize("compact", [False, True])
def test_copied_rules_give_the_nfa_their_lowering_gives(order, compact):
    """Each schema's NFA with nothing in the library (every body lowered) equals its NFA when the bodies are
    copied from earlier grammars, in every order the schemas can come in."""
    fresh = []
    for s in SCHEMAS:
        library.clear()
        fresh.append(nfa_of(schema_to_grammar(s, property_order=order, compact=compact)))
    for perm in (SCHEMAS, SCHEMAS[::-1]):
        library.clear()
        for s in perm:
            got = nfa_of(schema_to_grammar(s, property_order=order, compact=compact))
            assert got == fresh[SCHEMAS.index(s)], s
    copied = [f for _, f in library._library.values() if isinstance(f, library.Fragment)]
    assert len(copied) >= 3  # the any value and two string bounds at least were copied, not lowered


def test_a_library_body_that_copies_in_a_rule_is_lowered_each_time():
    """A marked body naming a rule that is copied in (not called) depends on that rule: it is never copied."""
    body = library.library_rule(seq(lit("<"), Ref("inner"), lit(">")))
    g = Grammar(
        {"root": seq(Ref("lib"), Ref("lib")), "lib": body, "inner": lit("x")},
        "root",
        shared=frozenset({"lib"}),
    )
    g2 = Grammar({"root": Ref("lib"), "lib": body, "inner": lit("yy")}, "root", shared=frozenset({"lib"}))
    first, second = nfa_of(g), nfa_of(g2)
    assert library.lookup(body) is None  # never recorded
    library.clear()
    assert (nfa_of(g), nfa_of(g2)) == (first, second)


def test_a_recursive_library_body_calls_itself_in_the_copy():
    body = library.library_rule(seq(lit("("), star(Ref("nest")), lit(")")))
    g = Grammar({"root": Ref("nest"), "nest": body}, "root")
    library.clear()
    library.library_rule(body)
    fresh = nfa_of(g)
    assert isinstance(library.lookup(body), library.Fragment)
    assert nfa_of(g) == fresh


def test_the_library_is_bounded():
    library.clear()
    bodies = [library.library_rule(lit(f"w{i}")) for i in range(library.LIBRARY_SIZE + 10)]
    assert len(library._library) == library.LIBRARY_SIZE
    assert library.lookup(bodies[0]) is library.ABSENT
    assert library.lookup(bodies[-1]) is None


@pytest.mark.parametrize("schema", SCHEMAS[:4] + [{"type": "string", "pattern": "^[a-f0-9]{2,8}$"}])
def test_byte_classes_are_the_runs_every_edge_treats_alike(schema):
    """prepare_nfa's byte classes: two bytes share a class exactly when every edge takes both or neither, and
    classes are numbered in byte order from 0 (class_start: each class's first byte)."""
    import numpy as np

    from tokenseam.grammar.prepare import prepare_nfa

    with compile_budget(30, None):
        p = prepare_nfa(build_nfa(schema_to_grammar(schema)))
    rows = p.nfa.edges.data
    takes = np.array([(rows[:, 0] <= b) & (b <= rows[:, 1]) for b in range(256)])
    for b in range(1, 256):
        same = bool((takes[b] == takes[b - 1]).all())
        assert (p.byte_class[b] == p.byte_class[b - 1]) == same
        assert p.byte_class[b] - p.byte_class[b - 1] in (0, 1)
    assert p.byte_class[0] == 0
    assert p.class_start == [b for b in range(256) if b == 0 or p.byte_class[b] != p.byte_class[b - 1]]
