"""Regex front end: language equality with Python `re` on samples, and clear errors for non-regular syntax."""

from __future__ import annotations

import functools
import json
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


@pytest.mark.parametrize(
    "pattern",
    [
        r"[a-f0-9]{8}-[a-f0-9]{4}",
        r"(yes|no|maybe)!{1,3}",
        r"-?\d+(\.\d+)?",
        r"[A-Z][a-z]{2,20} [A-Z][a-z]{2,20}",
    ],
)
def test_generated_strings_match(compiler, smollm2_vocab, pattern):
    g = compiler.compile_regex(pattern)
    rng = np.random.default_rng(1)
    for mode in ("random", "long", "eos_last"):
        for _ in range(5):
            out, done = sample(g, smollm2_vocab, rng, 200, mode)
            if not done:
                # Unbounded patterns may run to the token limit when EOS is avoided or rarely drawn (`\d`
                # is Unicode digits: many tokens, so 'long' mode's random picks seldom land on EOS).
                assert mode in ("eos_last", "long")
                continue
            assert re.fullmatch(pattern, out.decode("utf-8")), out


@pytest.mark.parametrize(
    "pattern,needle",
    [
        (r"(?=a)b", "lookaround"),
        (r"(a)\1", "backreference"),
        (r"a\bb", "boundary"),
        (r"(?i)abc", "flags"),
        (r"a{5,2}", "max < min"),
        (r"a{1000000}", "too large"),
        (r"(ab", "missing ')'"),
        (r"ab)", "unbalanced"),
        (r"[abc", "unterminated"),
        (r"*a", "nothing to repeat"),
        (r"a$b", "anchors"),
        (r"\p{L}", "unsupported"),
        (r"a++", "possessive"),
        (r"[z-a]", "bad character range"),
    ],
)
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


# Characters on which the readings differ: Unicode letters and digits, the spaces only one of ECMA-262 and
# Python counts (\x1c, \x85, \ufeff), line separators, and plain ASCII.
PROBE = [
    "a",
    "Z",
    "_",
    "7",
    "é",
    "ß",
    "日",
    "٣",
    "５",
    " ",
    "\t",
    "\n",
    "\r",
    "\x1c",
    "\x85",
    "\xa0",
    "\u2028",
    "\u3000",
    "\ufeff",
    "@",
    "-",
    ".",
    "😀",
]
# Each pattern, and the same class as ECMA-262 (no flags) reads it, written for Python's re.
ECMA_SPACE = "\t-\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
SHORTHANDS = {
    r"\w": "[A-Za-z0-9_]",
    r"\W": "[^A-Za-z0-9_]",
    r"\d": "[0-9]",
    r"\D": "[^0-9]",
    r"\s": f"[{ECMA_SPACE}]",
    r"\S": f"[^{ECMA_SPACE}]",
    r".": "[^\n\r\u2028\u2029]",
    r"[^\s@]": f"[^@{ECMA_SPACE}]",
    r"[^\d]": "[^0-9]",
    r"[^\w.]": "[^A-Za-z0-9_.]",
    r"[\w-]": "[A-Za-z0-9_-]",
    r"[\D5]": "[^0-46-9]",
    r"[^\W_]": "[A-Za-z0-9]",
    r"[\s\S]": r"[\s\S]",
}


@pytest.mark.parametrize("pattern", list(SHORTHANDS))
def test_shorthands_are_pythons_in_compile_regex(compiler, pattern):
    r"""compile_regex follows Python `re` exactly: Unicode \d \w \s, and `.` stopping only at a newline."""
    g = compiler.compile_regex(pattern)
    for ch in PROBE:
        assert accepts_text(g, ch) == (re.fullmatch(pattern, ch) is not None), (pattern, ch)


@pytest.mark.parametrize("pattern", list(SHORTHANDS))
def test_schema_patterns_hold_for_ecma_and_python(compiler, pattern):
    """A JSON Schema `pattern` accepts a character only when both ECMA-262 and Python `re` accept it, and accepts
    every character both agree on: no wrong accepts for either kind of validator, and no needless refusals."""
    g = compiler.compile_json_schema({"type": "string", "pattern": "^" + pattern + "$"})
    for ch in PROBE:
        both = re.fullmatch(SHORTHANDS[pattern], ch) is not None and re.fullmatch(pattern, ch) is not None
        assert accepts_text(g, json.dumps(ch, ensure_ascii=False)) == both, (pattern, ch)


def test_common_email_pattern_takes_non_ascii_addresses(compiler):
    g = compiler.compile_json_schema({"type": "string", "pattern": r"^[^\s@]+@[^\s@]+\.[^\s@]+$"})
    assert accepts_text(g, json.dumps("josé@exämple.com", ensure_ascii=False))
    assert not accepts_text(g, json.dumps("jo sé@exämple.com", ensure_ascii=False))
    assert not accepts_text(g, json.dumps("a@b\u00a0.com", ensure_ascii=False))


def test_character_classes_are_read_once_per_dialect(compiler, monkeypatch):
    # A class's ranges depend on its text and the dialect alone: a class read before gives the same ranges
    # wherever its text comes again, Python's \w is not ECMA's, and an error names its own position.
    from tokenseam.grammar import regex
    from tokenseam.grammar.budget import compile_budget

    monkeypatch.setattr(regex, "CLASSES", {})
    regex._parsed.cache_clear()  # (a pattern parsed earlier in the process would not read its classes again)

    def ranges(pattern, dialect):
        with compile_budget(10, None, None):
            return regex.parse_regex(pattern, dialect=dialect)

    cold = {d: ranges(r"x[\w.\]-]y", d) for d in ("ecma", "python", "json-schema")}
    assert len(regex.CLASSES) == 3
    assert regex.CLASSES[("ecma", r"[\w.\]-]")] != regex.CLASSES[("python", r"[\w.\]-]")]
    for d, node in cold.items():
        assert repr(ranges(r"x[\w.\]-]y", d)) == repr(node)
    assert len(regex.CLASSES) == 3
    # The same class inside other text, negated, and right after the opening bracket.
    for p, yes, no in [
        (r"(?:[\w.\]-])+z", ["a.]-z", "é_z"], ["z", "a z"]),
        (r"[^\w.\]-]", [" ", "\n"], ["a", "]"]),
        (r"[]a]b", ["]b", "ab"], ["b"]),
        (r"[]a]b[]a]", ["]ba", "ab]"], ["b", "]b"]),
    ]:
        g = compiler.compile_regex(p)
        for w in yes + no:
            assert (re.fullmatch(p, w) is not None) == (w in yes), (p, w)
            assert accepts_text(g, w) == (w in yes), (p, w)
    for _ in range(2):  # a refused class is not kept
        with pytest.raises(GrammarError, match="end before start.* at position 9"):
            ranges(r"ab[\w[z-a]]", "python")
    monkeypatch.setattr(regex, "CLASSES_MAX", 2)
    for k in range(5):
        ranges(f"[a-{chr(98 + k)}]", "ecma")
    assert len(regex.CLASSES) <= 2


def test_a_parsed_pattern_is_kept_and_an_error_still_names_its_place(monkeypatch):
    # Parsed patterns are kept for the process: the same text, search mode and dialect give the same node
    # (the IR is immutable); a refused pattern is not kept, and each error names the place it was met.
    from tokenseam.grammar import regex
    from tokenseam.grammar.budget import compile_budget

    regex._parsed.cache_clear()
    with compile_budget(10, None, None):
        a = regex.parse_regex("^[a-f0-9]{8}$", search=True, dialect="json-schema")
        assert regex.parse_regex("^[a-f0-9]{8}$", search=True, dialect="json-schema", where="elsewhere") is a
        assert regex.parse_regex("^[a-f0-9]{8}$", search=True, dialect="ecma") is not a
        assert regex.parse_regex("^[a-f0-9]{8}$", dialect="json-schema") is not a
        for where in ("pattern at #/properties/a", "pattern at #/properties/b"):
            with pytest.raises(GrammarError, match=f"^{where}: missing .* at position 4"):
                regex.parse_regex("ab(c", search=True, where=where, dialect="json-schema")
        long = "x" * (regex.PARSED_MAX_LENGTH + 1)
        assert regex.parse_regex(long) is not regex.parse_regex(long)
        monkeypatch.setattr(regex, "_parsed", functools.lru_cache(maxsize=4)(regex._parsed.__wrapped__))
        for k in range(10):
            regex.parse_regex(f"a{{{k}}}")
        assert regex._parsed.cache_info().currsize == 4


def test_a_repeated_string_constraint_is_one_node(compiler):
    # The same pattern, format or length bounds in several properties are lowered once (one IR node, its
    # automata built once): the language is unchanged, warnings still name every place.
    from tokenseam.grammar.budget import compile_budget
    from tokenseam.grammar.json_schema import _Compiler, schema_to_grammar

    hexid = {"type": "string", "pattern": "^[a-f0-9]{4}$"}
    bounded = {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}
    dated = {"type": "string", "format": "date"}
    props = {
        "a": hexid,
        "b": dict(hexid),
        "c": bounded,
        "d": dict(bounded),
        "e": {"type": "string", "format": "made-up"},
        "f": {"type": "string", "format": "made-up"},
        "g": dated,
    }
    schema = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
    with compile_budget(10, None, None):
        c = _Compiler(schema, False, False, False, 40)
        for one in (hexid, bounded, dated):
            assert c.compile(one, "#/x") is c.compile(dict(one), "#/y")
        assert c.compile(hexid, "#/x") is not c.compile(bounded, "#/x")
        assert c.compile({**hexid, "minLength": 4}, "#/x") is not c.compile(hexid, "#/x")
    g = schema_to_grammar(schema)
    assert [w for w in g.warnings if "made-up" in w] == [
        f"format 'made-up' at /properties/{k} is not enforced (annotation only)" for k in "ef"
    ]
    cg = compiler.compile_json_schema(schema)
    good = {"a": "00ff", "b": "abcd", "c": "xy", "d": "z", "e": "", "f": "q", "g": "2024-02-29"}
    assert accepts_text(cg, json.dumps(good))
    for k, bad in (("b", "00fg"), ("d", "wxyz"), ("b", "00f"), ("c", ""), ("g", "2023-02-29")):
        assert not accepts_text(cg, json.dumps({**good, k: bad})), (k, bad)
