"""The code point automata the JSON Schema front end builds (complements, counts), against their definitions."""

import random

import pytest

from tokenseam.grammar import cpauto
from tokenseam.grammar.ir import Chars, Repeat, Seq

accepts = cpauto.accepts


def literal_set(words: list[str]) -> cpauto.CPNFA:
    """A deterministic trie automaton accepting exactly `words` (the reference `not_words` is checked against)."""
    dfa = cpauto.CPNFA()
    dfa.add()
    children: list[dict[int, int]] = [{}]
    for w in words:
        s = 0
        for ch in w:
            c = ord(ch)
            if c not in children[s]:
                t = dfa.add()
                children.append({})
                children[s][c] = t
                dfa.edges[s].append((c, c, t))
            s = children[s][c]
        dfa.finals.add(s)
    for s in range(dfa.size):
        dfa.edges[s].sort()
    return dfa


ALPHABET = 'ab\u00e9"\\\U0001f600\x00'


@pytest.mark.parametrize("seed", range(4))
def test_not_words_is_the_complement_of_the_word_set(seed):
    rnd = random.Random(seed)
    for _ in range(100):
        words = ["".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(0, 4))) for _ in range(rnd.randint(0, 5))]
        fast = cpauto.not_words(words)
        slow = cpauto.complement(literal_set(words))
        probes = words + ["".join(rnd.choice(ALPHABET + "c") for _ in range(rnd.randint(0, 5))) for _ in range(40)]
        for w in probes:
            assert accepts(fast, w) == accepts(slow, w) == (w not in words), (words, w)
        assert not cpauto.is_empty(fast)


def test_not_words_never_accepts_a_surrogate():
    a = cpauto.not_words(["x"])
    for s in range(a.size):
        for lo, hi, _ in a.edges[s]:
            assert hi < 0xD800 or lo > 0xDFFF


def test_is_empty_after_product():
    digits = cpauto.determinize(cpauto.from_ir(Repeat(Chars(((0x30, 0x39),)), 1, None)))
    letters = cpauto.determinize(cpauto.from_ir(Seq((Chars(((0x61, 0x7A),)),))))
    assert cpauto.is_empty(cpauto.product(digits, letters))
    assert not cpauto.is_empty(cpauto.product(digits, cpauto.not_words(["1", "2"])))


PATTERNS = ["a+b*", "(ab|ba)*c?", "[a-c]{2,4}", "\\w+\\.x", "[^a]b", "é+|ab", "(a|b)*abb", "[ab]*a[ab]{2}",
            "x?y?z?", "[^ @]+@[^ @.]+"]


@pytest.mark.parametrize("seed", range(3))
def test_determinize_and_product_match_python_re(seed):
    import re

    from tokenseam.grammar.regex import parse_regex

    rnd = random.Random(seed)
    alphabet = "abcxyz.@é \\"
    dfas = {p: cpauto.determinize(cpauto.from_ir(parse_regex(p))) for p in PATTERNS}
    for _ in range(40):
        p, q = rnd.choice(PATTERNS), rnd.choice(PATTERNS)
        both = cpauto.product(dfas[p], dfas[q])
        for _ in range(30):
            w = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 6)))
            mp = re.fullmatch(p, w) is not None
            mq = re.fullmatch(q, w) is not None
            assert accepts(dfas[p], w) == mp, (p, w)
            assert accepts(both, w) == (mp and mq), (p, q, w)


@pytest.mark.parametrize("pattern,word", [("^abc$", "abc"), ("^(ab)c$", "abc"), ("^$", ""), ("^a+$", None),
                                          ("^a|b$", None), ("abc", None), ("^a[bc]$", None)])
def test_single_word(pattern, word):
    from tokenseam.grammar.regex import parse_regex

    d = cpauto.determinize(cpauto.from_ir(parse_regex(pattern, search=True)))
    assert cpauto.single_word(d) == word
