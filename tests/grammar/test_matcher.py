"""GrammarMatcher API: engine Constraint protocol, EOS exactly when accepting, no special tokens, rollback,
accept_bytes for token healing, termination, choice lists, LRU cache of compiled grammars."""

from __future__ import annotations

import numpy as np
import pytest

from tokenseam.constraint import Constraint, allocate_token_bitmask, bitmask_to_bool
from tokenseam.grammar import GrammarCompiler, GrammarError, GrammarMatcher


def _allowed(m: GrammarMatcher, vocab) -> np.ndarray:
    out = allocate_token_bitmask(vocab.size)
    m.fill_mask(out)
    return bitmask_to_bool(out, vocab.size)


def test_matcher_is_an_engine_constraint(compiler):
    m = GrammarMatcher(compiler.compile_choice(["yes", "no"]))
    assert isinstance(m, Constraint)


def test_eos_only_when_accepting_and_no_specials(compiler, smollm2_vocab):
    v = smollm2_vocab
    m = GrammarMatcher(compiler.compile_regex(r"ab(c)?"))
    eos = sorted(v.eos_token_ids)
    allowed = _allowed(m, v)
    assert not allowed[eos].any()
    assert not (allowed & v.is_special).any()
    assert m.accept_bytes(b"ab")
    allowed = _allowed(m, v)
    assert allowed[eos].all() and m.is_accepting() and not m.is_terminated()
    assert allowed[v.trie.tokens_equal(b"c")[0]]
    assert not (allowed & v.is_special & ~np.isin(np.arange(v.size), eos)).any()
    assert m.accept_token(eos[0])
    assert m.is_terminated() and m.is_finished()
    assert not _allowed(m, v).any()
    assert not m.accept_token(v.trie.tokens_equal(b"c")[0])
    m.rollback(1)
    assert not m.is_terminated()
    assert m.accept_token(v.trie.tokens_equal(b"c")[0])
    assert m.is_terminated()  # accepting and nothing can follow
    assert _allowed(m, v)[eos].all()


def test_special_and_out_of_range_tokens_refused(compiler, smollm2_vocab):
    v = smollm2_vocab
    m = GrammarMatcher(compiler.compile_regex(r".*"))
    special = [i for i in range(v.size) if v.is_special[i] and i not in v.eos_token_ids]
    assert special and not m.accept_token(special[0])
    assert not m.accept_token(-1) and not m.accept_token(v.size + 5)


def test_rejected_token_leaves_state_unchanged(compiler, smollm2_vocab):
    v = smollm2_vocab
    m = GrammarMatcher(compiler.compile_choice(["hello", "help"]))
    assert m.accept_token(v.trie.tokens_equal(b"hel")[0])
    before = _allowed(m, v)
    assert not m.accept_token(v.trie.tokens_equal(b"x")[0])
    assert (before == _allowed(m, v)).all()
    assert m.num_accepted_tokens == 1


def test_accept_bytes_then_tokens(compiler, smollm2_vocab):
    m = GrammarMatcher(compiler.compile_choice(["The quick fox", "The lazy dog"]))
    assert m.accept_bytes(b"The qu")
    allowed = _allowed(m, smollm2_vocab)
    assert allowed[smollm2_vocab.trie.tokens_equal(b"ick")[0]]
    assert (
        not allowed[smollm2_vocab.trie.tokens_equal(b"azy")[0]]
        if smollm2_vocab.trie.tokens_equal(b"azy")
        else True
    )
    assert not m.accept_bytes(b"zzz")
    assert m.find_jump_forward_string() == "ick fox"
    m.reset()
    assert m.find_jump_forward_string() == "The "


def test_batch_row_and_caller_buffer(compiler, smollm2_vocab):
    m = GrammarMatcher(compiler.compile_regex("[0-9]"))
    out = allocate_token_bitmask(smollm2_vocab.size, batch=3)
    m.fill_next_token_bitmask(out, 1)
    assert not out[0].any() and out[1].any() and not out[2].any()
    ids = np.flatnonzero(bitmask_to_bool(out[1], smollm2_vocab.size))
    assert {smollm2_vocab.token_bytes[i] for i in ids} == {str(d).encode() for d in range(10)}


def test_rollback_bounds(compiler):
    m = GrammarMatcher(compiler.compile_regex("a+"))
    with pytest.raises(ValueError):
        m.rollback(1)
    with pytest.raises(ValueError):
        m.rollback(-1)


def test_choice_errors(compiler):
    for bad in ([], "abc", [1], None, ["a", None]):
        with pytest.raises(GrammarError):
            compiler.compile_choice(bad)  # type: ignore[arg-type]


def test_choice_with_unicode_and_prefixes(compiler):
    from .conftest import accepts_text

    g = compiler.compile_choice(["a", "ab", "日本"])
    assert accepts_text(g, "a") and accepts_text(g, "ab") and accepts_text(g, "日本")
    assert not accepts_text(g, "abc") and not accepts_text(g, "日")


def test_lru_cache_is_bounded(smollm2_vocab):
    c = GrammarCompiler(smollm2_vocab, cache_size=2)
    a = c.compile_regex("a")
    assert c.compile_regex("a") is a
    c.compile_regex("b")
    c.compile_regex("c")
    assert c.compile_regex("a") is not a


def test_same_grammar_on_gemma(gemma_compiler, gemma3_vocab):
    m = GrammarMatcher(
        gemma_compiler.compile_json_schema(
            {
                "type": "object",
                "properties": {"x": {"type": "integer"}},
                "required": ["x"],
                "additionalProperties": False,
            }
        )
    )
    assert m.accept_bytes(b'{"x": 12}')
    allowed = _allowed(m, gemma3_vocab)
    assert allowed[sorted(gemma3_vocab.eos_token_ids)].all()
    assert not (
        allowed
        & gemma3_vocab.is_special
        & ~np.isin(np.arange(gemma3_vocab.size), sorted(gemma3_vocab.eos_token_ids))
    ).any()


def test_reasoning_phase_is_free_until_end_tag(compiler, smollm2_vocab):
    v = smollm2_vocab
    m = GrammarMatcher(compiler.compile_choice(["yes", "no"]), reasoning_end="</think>")
    allowed = _allowed(m, v)
    assert not allowed[sorted(v.eos_token_ids)].any() and allowed[v.trie.tokens_equal(b"maybe")[0]]
    assert not m.is_accepting()
    for piece in (b"hm", b"</", b"think", b">"):
        tid = v.trie.tokens_equal(piece)[0]
        assert m.accept_token(tid)
    allowed = _allowed(m, v)
    assert allowed[v.trie.tokens_equal(b"yes")[0]] and not allowed[v.trie.tokens_equal(b"maybe")[0]]
    m.rollback(1)
    assert _allowed(m, v)[v.trie.tokens_equal(b"maybe")[0]]
    assert m.accept_token(v.trie.tokens_equal(b">")[0])
    assert m.accept_token(v.trie.tokens_equal(b"yes")[0]) and m.is_accepting()
    m2 = GrammarMatcher(compiler.compile_choice(["yes", "no"]), reasoning_end="</think>")
    assert m2.accept_bytes(b"some thoughts</think>ye")
    assert m2.accept_bytes(b"s") and m2.is_accepting()
