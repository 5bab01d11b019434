"""Regex front end: language equality with Python `re` on samples, and clear errors for non-regular syntax."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tokenseam.grammar import GrammarError, GrammarMatcher

from .conftest import accepts_text, sample

CASES = [
    (r"[a-z]+@[a-z]+\.(com|org)", ["a@b.com", "xyz@q.org"], ["a@b.net", "@b.com", "A@b.com"]),
    (r"\d{3}-\d{4}", ["555-1234"], ["55-1234", "555-12345", "abc-defg"]),
    (r"(ab|cd)*e?", ["", "ab", "abcde", "e"], ["abc", "ee"]),
    (r"a{2,4}b{0,}c?", ["aa", "aaaab", "aabbbc"], ["a", "aaaaa", "aacc"]),
    (r"[^abc]x", ["dx", "éx", "\nx"], ["ax", "x"]),
    (r"\w+\s\W", ["ab_9 !"], ["ab  !", "ab !a"]),
    (r"héllo|日本語", ["héllo", "日本語"], ["hello", "日本"]),
    (r"^abc$", ["abc"], ["abcc"]),
    (r"x{13,40}", ["x" * 13, "x" * 40], ["x" * 12, "x" * 41]),
    (r"(?:a|b)(?P<n>c)\.", ["ac.", "bc."], ["cc."]),
    (r"[\u0041-\u0043\x61]+", ["ABCa"], ["D"]),
    (r".", ["a", "é"], ["\n", "ab"]),
]


@pytest.mark.parametrize("pattern,good,bad", CASES)
def test_regex_language(compiler, pattern, good, bad):
    g = compiler.compile_regex(pattern)
    for s in good:
        assert re.fullmatch(pattern, s), s
        assert accepts_text(g, s), s
    for s in bad:
        assert not re.fullmatch(pattern, s), s
        assert not accepts_text(g, s), s


@pytest.mark.parametrize("pattern", [r"[a-f0-9]{8}-[a-f0-9]{4}", r"(yes|no|maybe)!{1,3}", r"-?\d+(\.\d+)?",
                                     r"[A-Z][a-z]{2,20} [A-Z][a-z]{2,20}"])
def test_generated_strings_match(compiler, smollm2_vocab, pattern):
    g = compiler.compile_regex(pattern)
    rng = np.random.default_rng(1)
    for mode in ("random", "long", "eos_last"):
        for _ in range(5):
            out, done = sample(g, smollm2_vocab, rng, 200, mode)
            if not done:
                assert mode == "eos_last"  # unbounded patterns may run to the token limit
                continue
            assert re.fullmatch(pattern, out.decode("utf-8")), out


@pytest.mark.parametrize("pattern,needle", [
    (r"(?=a)b", "lookaround"), (r"(a)\1", "backreference"), (r"a\bb", "boundary"), (r"(?i)abc", "flags"),
    (r"a{5,2}", "max < min"), (r"a{1000000}", "too large"), (r"(ab", "missing ')'"), (r"ab)", "unbalanced"),
    (r"[abc", "unterminated"), (r"*a", "nothing to repeat"), (r"a$b", "anchors"), (r"\p{L}", "unsupported"),
    (r"a++", "possessive"), (r"[z-a]", "bad character range"),
])
def test_bad_regex_is_grammar_error(compiler, pattern, needle):
    with pytest.raises(GrammarError) as ei:
        compiler.compile_regex(pattern)
    assert needle in str(ei.value)


def test_huge_but_bounded_repeat_is_an_error_or_lazy(compiler):
    # Nested repeats multiply; the compiler must answer quickly either way.
    try:
        g = compiler.compile_regex(r"(a{1000}){1000}")
    except GrammarError as exc:
        assert "too large" in str(exc)
    else:
        assert accepts_text(g, "a" * 1000 * 1000)


def test_non_string_regex(compiler):
    with pytest.raises(GrammarError):
        compiler.compile_regex(123)  # type: ignore[arg-type]


def test_jump_forward_and_rollback(compiler, smollm2_vocab):
    g = compiler.compile_regex(r"hello, world|hello, there")
    m = GrammarMatcher(g)
    assert m.find_jump_forward_string() == "hello, "
    m.accept_bytes(b"hello, w")
    assert m.find_jump_forward_string() == "orld"
    m.reset()
    tok = smollm2_vocab.trie.tokens_equal(b"hello")[0]
    assert m.accept_token(tok)
    assert not m.is_accepting()
    m.rollback(1)
    assert m.num_accepted_tokens == 0
    with pytest.raises(ValueError):
        m.rollback(1)


def test_shorthand_classes_are_ascii_subsets(compiler):
    # Python's \w also matches letters such as 'é'; we accept only ASCII there (a subset, never a superset),
    # and the negations stay inside ASCII too, so nothing `re` would refuse is ever accepted.
    assert not accepts_text(compiler.compile_regex(r"\w"), "é")
    assert not accepts_text(compiler.compile_regex(r"\W"), "é")
    assert not accepts_text(compiler.compile_regex(r"[^\d]"), "٣")
