"""The grammar IR's value semantics: equal nodes built apart are equal and hash alike, and `alt` keeps one of
each."""

from __future__ import annotations

from tokenseam.grammar import cpauto
from tokenseam.grammar.ir import Alt, Auto, Escaped, Repeat, Seq, alt, chars, lit, seq


def _build():
    key = seq(lit('"kind"'), Repeat(chars((0x20, 0x20)), 0, 2), lit(":"))
    return [
        key,
        alt(lit("true"), lit("false")),
        Repeat(key, 1, None),
        Escaped(Alt((lit("ab"), chars((0x61, 0x7A))))),
        Seq((key, Alt((lit("x"), lit("y"))))),
    ]


def test_equal_nodes_built_apart_hash_alike_and_keep_their_hash():
    for a, b in zip(_build(), _build(), strict=True):
        assert a is not b
        assert a == b
        assert hash(a) == hash(b)
        assert a._hash == hash(a)  # computed once, then read
    assert len({*_build(), *_build()}) == len(_build())
    assert hash(lit("ab")) != hash(alt(lit("ab"), lit("ba")))


def test_alt_keeps_one_of_equal_alternatives_and_automata_by_identity():
    assert alt(lit("null"), lit("null")) == lit("null")
    assert alt(lit("a"), lit("bc"), lit("bc"), lit("a")).items == (lit("a"), lit("bc"))
    words = cpauto.not_words(["a"])
    # An embedded automaton is never compared by value: two objects stay two alternatives.
    assert len(alt(Auto(words), Auto(words)).items) == 2
    one = Auto(words)
    assert alt(one, one) is one


def test_a_literal_is_its_characters_met_before_or_not():
    fresh = "\U0001f9ea\u2e80"  # characters no other test spells
    assert lit(fresh + "x") == Seq((chars((0x1F9EA, 0x1F9EA)), chars((0x2E80, 0x2E80)), chars((0x78, 0x78))))
    assert lit(fresh).items[0] is lit(fresh + "y").items[0]  # one shared node per character
    assert lit("") == Seq(())


def test_alt_of_one_node_is_the_node_unhashed():
    # A schema of one type is an alt of one part: nothing to compare it with, so its subtree is not hashed.
    x = seq(lit("ab"), Repeat(lit("c"), 0, None))
    assert alt(x) is x
    assert alt(Alt((x,))) is x
    assert x._hash is None


def test_seq_and_alt_made_without_their_init_are_the_same_nodes():
    import dataclasses

    import pytest

    made = seq(lit("ab"), Repeat(lit("c"), 0, 1))
    written = Seq((chars((0x61, 0x61)), chars((0x62, 0x62)), Repeat(lit("c"), 0, 1)))
    assert (
        type(made) is Seq and made == written and hash(made) == hash(written) and repr(made) == repr(written)
    )
    either = alt(lit("x"), lit("yz"))
    assert (
        type(either) is Alt
        and either == Alt((lit("x"), lit("yz")))
        and hash(either) == hash(Alt(either.items))
    )
    for node in (made, either, lit("pq")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            node.items = ()


def test_no_sequence_holds_the_empty_language():
    """`seq` drops to NOTHING when a part is empty, also one inside a sequence it flattens: so no Seq ever holds
    an empty Alt, and `seq` need not look inside the sequences it flattens."""
    import random

    from tokenseam.grammar.ir import EMPTY, NOTHING

    rng = random.Random(7)
    leaves = [lit("a"), lit("bc"), NOTHING, alt(), EMPTY, chars((0x30, 0x39))]
    nodes = list(leaves)
    for _ in range(3000):
        parts = rng.sample(nodes, rng.randint(1, 3))
        op = rng.random()
        node = seq(*parts) if op < 0.5 else alt(*parts) if op < 0.85 else Repeat(parts[0], 0, 2)
        nodes.append(node)
        if op < 0.5:
            empty = any(type(p) is Alt and not p.items for p in parts)
            assert (node is NOTHING) == empty, parts
    for node in nodes:
        if type(node) is Seq:
            assert not any(type(x) is Alt and not x.items for x in node.items), node
