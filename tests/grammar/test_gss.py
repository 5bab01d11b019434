"""The GSS parser (gss.py): the exact fallback a matcher moves to when the automaton cannot go on.

Its masks are checked against the automaton's along sampled paths over grammars that use every NFA feature
(calls and recursion, counted loops, any-order property sets, indentation limits); then an ambiguous grammar
that stops the automaton is generated to the end, its masks checked against the language itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tokenseam.constraint import bitmask_to_bool
from tokenseam.grammar import GrammarMatcher
from tokenseam.grammar.gss import GSSParser

GBNF = Path(__file__).parent / "gbnf"

SCHEMAS = {
    "counted": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 2, "maxLength": 6},
            "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "minItems": 1, "maxItems": 3},
        },
        "required": ["name", "tags"],
    },
    "any-order": {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "boolean"}, "z": {"type": "null"}},
        "required": ["y"],
        "additionalProperties": False,
    },
    "recursive": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/node",
    },
    "overlapping-anyOf": {
        "anyOf": [
            {"type": "object", "properties": {"a": {"type": "string", "pattern": "^x+$"}}},
            {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "number"}}},
        ]
    },
}


def _cases(compiler):
    out = []
    for name in ("arithmetic", "list", "json", "chess"):
        out.append((name, compiler.compile_gbnf((GBNF / f"{name}.gbnf").read_text())))
    for name, schema in SCHEMAS.items():
        order = "any" if name == "any-order" else "schema"
        out.append((name, compiler.compile_json_schema(schema, property_order=order)))
    out.append(("regex", compiler.compile_regex(r"(ab|a)*c{2,5}[0-9]?")))
    return out


def _parser(compiled) -> GSSParser:
    auto = compiled.automaton
    return GSSParser(auto.nfa, auto.table, compiled.masks._indent_rows)


def test_gss_masks_equal_the_automatons(compiler, smollm2_vocab):
    vocab = smollm2_vocab
    rng = np.random.default_rng(7)
    lens = np.array([len(b) for b in vocab.token_bytes])
    eos = set(vocab.eos_token_ids)
    for name, compiled in _cases(compiler):
        gss = _parser(compiled)
        for walk in range(2):
            m = GrammarMatcher(compiled)
            p = gss.start
            ref = np.zeros(vocab.mask_words, dtype=np.int32)
            text = b""
            for _step in range(10):
                m.fill_next_token_bitmask(ref)
                got = gss.mask(p)
                where = f"{name}, walk {walk}, after {text!r}"
                assert np.array_equal(got, ref), where
                assert p.acc == m.is_accepting(), where
                assert gss.has_moves(p) == (not m.is_terminated() or not m.is_accepting()), where
                allowed = [t for t in np.flatnonzero(bitmask_to_bool(ref, vocab.size)) if t not in eos]
                if not allowed:
                    break
                # long tokens on one walk (deeper into strings and counters), any on the other
                pick = allowed if walk else sorted(allowed, key=lambda t: -lens[t])[:20]
                t = int(rng.choice(pick))
                assert m.accept_token(t), where
                p = gss.step_bytes(p, vocab.token_bytes[t])
                assert p is not None, where
                text += vocab.token_bytes[t]


def test_gss_refuses_what_the_automaton_refuses(compiler):
    compiled = compiler.compile_json_schema(SCHEMAS["counted"])
    gss = _parser(compiled)
    assert gss.step_bytes(gss.start, b'{"name": "a"') is None  # minLength 2
    assert gss.step_bytes(gss.start, b'{"name": "abcdefg') is None  # maxLength 6
    p = gss.step_bytes(gss.start, b'{"name": "ab", "tags": ["a", "bc", "a"]}')
    assert p is not None and p.acc
    assert gss.step_bytes(gss.start, b'{"name": "ab", "tags": ["a", "a", "a", "a"') is None  # maxItems 3
    assert gss.step_bytes(gss.start, b'{"name": "ab",\n' + b" " * 41) is None  # past max_ws
    m = GrammarMatcher(compiled)
    assert m.accept_bytes(b'{"name": "ab", "t') and m.find_jump_forward_string() == 'ags"'
    assert gss.forced_bytes(gss.step_bytes(gss.start, b'{"name": "ab", "t'), 64) == b'ags"'


AMBIGUOUS = 's ::= "a" s | "a" s "b" | ""\nroot ::= s\n'  # a^n b^k, k <= n: 2^n parses after n "a"s


def _allowed_in_language(text: bytes, tok: bytes) -> bool:
    s = text + tok
    n = len(s) - len(s.lstrip(b"a"))
    rest = s[n:]
    return rest == b"b" * len(rest) and len(rest) <= n


def test_an_ambiguous_grammar_is_generated_to_the_end(compiler, smollm2_vocab):
    """The automaton stops after about a dozen "a"s (more parses than it keeps); the matcher moves to the GSS
    parser and every later mask is exactly the language's."""
    vocab = smollm2_vocab
    compiled = compiler.compile_gbnf(AMBIGUOUS)
    moved = compiled.gss_fallbacks  # the compiler's cache hands every test the same grammar
    ab = [
        t for t, b in enumerate(vocab.token_bytes) if b and set(b) <= set(b"ab") and not vocab.is_special[t]
    ]
    a1, b1 = vocab.trie.tokens_equal(b"a")[0], vocab.trie.tokens_equal(b"b")[0]
    eos = sorted(vocab.eos_token_ids)
    m = GrammarMatcher(compiled)
    out = np.zeros(vocab.mask_words, dtype=np.int32)
    text = b""
    for tok in [a1] * 40 + [b1] * 40:
        m.fill_next_token_bitmask(out)
        allowed = bitmask_to_bool(out, vocab.size)
        assert set(np.flatnonzero(allowed)) <= set(ab) | set(eos)
        for t in ab:
            assert allowed[t] == _allowed_in_language(text, vocab.token_bytes[t]), (
                text,
                vocab.token_bytes[t],
            )
        assert allowed[eos].all()  # every prefix is in the language
        assert m.accept_token(tok)
        text += vocab.token_bytes[tok]
    assert compiled.gss_fallbacks == moved + 1
    assert m.is_accepting() and m.is_terminated()
    assert not m.accept_token(b1)  # a 41st "b"
    # Rollback across the move, and a grammar started over under the memory budget, stay exact.
    m.rollback(50)
    assert m.num_accepted_tokens == 30 and m.is_accepting() and not m.is_terminated()
    compiled.renew()
    assert m.accept_bytes(b"b" * 30) and not m.accept_bytes(b"b")
    m.reset()
    assert m.accept_bytes(b"a" * 20 + b"b" * 20) and m.is_accepting()
    assert compiled.gss_fallbacks == moved + 1
    # A new request on the same grammar starts on the automaton and moves over as well.
    m2 = GrammarMatcher(compiled)
    assert m2.accept_bytes(b"a" * 30) and m2.find_jump_forward_string() == ""
    assert compiled.gss_fallbacks == moved + 2


@pytest.mark.parametrize("mode", ["token", "bytes"])
def test_the_move_happens_at_any_query(compiler, smollm2_vocab, mode):
    """Whether the automaton stops in a commit or in a mask, the matcher goes on from the same position."""
    vocab = smollm2_vocab
    compiled = compiler.compile_gbnf(AMBIGUOUS)
    moved = compiled.gss_fallbacks
    m = GrammarMatcher(compiled)
    a1 = vocab.trie.tokens_equal(b"a")[0]
    out = np.zeros(vocab.mask_words, dtype=np.int32)
    for _ in range(25):
        if mode == "token":
            assert m.accept_token(a1)
        else:
            assert m.accept_bytes(b"a")
        m.fill_next_token_bitmask(out)
        assert bitmask_to_bool(out, vocab.size)[a1]
    assert compiled.gss_fallbacks == moved + 1


def test_right_recursion_past_the_interpreter_recursion_limit(compiler, smollm2_vocab):
    """`r ::= "a" r | ""` keeps one call frame per "a". The automaton follows returns through frames by
    recursion up to automaton.MAX_NEST; past that the matcher moves to the GSS parser instead of running into
    the interpreter's recursion limit (a RecursionError after about 2,000 "a"s before), and goes on exactly."""
    vocab = smollm2_vocab
    compiled = compiler.compile_gbnf('root ::= r\nr ::= "a" r | ""')
    moved = compiled.gss_fallbacks
    a1, b1 = vocab.trie.tokens_equal(b"a")[0], vocab.trie.tokens_equal(b"b")[0]
    eos = sorted(vocab.eos_token_ids)
    m = GrammarMatcher(compiled)
    out = np.zeros(vocab.mask_words, dtype=np.int32)
    for _ in range(2_300):
        m.fill_next_token_bitmask(out)
        allowed = bitmask_to_bool(out, vocab.size)
        assert allowed[a1] and allowed[eos].all() and not allowed[b1]
        assert m.accept_token(a1)
    assert compiled.gss_fallbacks == moved + 1
    assert m.is_accepting() and not m.accept_bytes(b"b") and m.accept_bytes(b"aa")


@pytest.mark.parametrize("n", [500, 3_000])
def test_a_long_chain_of_nullable_rules_moves_to_the_gss_parser(compiler, smollm2_vocab, n):
    """r_i ::= r_i+1 "a" | "" down to r_n ::= "b" r_0 | "": the first position holds n configurations up to n
    frames deep. A mask split frame by frame stops at MAX_NEST frames (n = 500), and one whose frames lie
    deeper than localbuild.GROUP_WORK steps is not split at all (n = 3,000): either way the GSS parser takes
    over, where splitting each frame cost n * n steps (minutes at n = 10,000) or ran into the recursion limit."""
    from tokenseam.bench.faults import gbnf_chain

    vocab = smollm2_vocab
    compiled = compiler.compile_gbnf(gbnf_chain("nullable", n))
    moved = compiled.gss_fallbacks
    a1, b1 = vocab.trie.tokens_equal(b"a")[0], vocab.trie.tokens_equal(b"b")[0]
    c1 = vocab.trie.tokens_equal(b"c")[0]
    m = GrammarMatcher(compiled)
    out = np.zeros(vocab.mask_words, dtype=np.int32)
    m.fill_next_token_bitmask(out)
    allowed = bitmask_to_bool(out, vocab.size)
    assert allowed[a1] and allowed[b1] and not allowed[c1] and allowed[sorted(vocab.eos_token_ids)].all()
    assert compiled.gss_fallbacks == moved + 1
    assert m.accept_bytes(b"ba") and not m.is_accepting()  # "b" r_0, then n "a"s
    if n == 500:  # (each byte costs the GSS parser about n steps here)
        assert m.accept_bytes(b"a" * (n - 1)) and m.is_accepting()
