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
