"""A grammar that starts after </think> (the server's automatic mode for thinking models)."""

from __future__ import annotations

import numpy as np

from tokenseam.constraint import bitmask_to_bool
from tokenseam.grammar import GrammarCompiler, GrammarMatcher


def test_thinking_is_free_then_grammar_applies_even_inside_one_token(smollm2_vocab, tokenizers):
    vocab, tok = smollm2_vocab, tokenizers["smollm2"]
    compiled = GrammarCompiler(vocab).compile_json_schema(
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "required": ["a"],
            "additionalProperties": False,
        },
        compact=True,
    )
    m = GrammarMatcher(compiled, reasoning_end="</think>")
    ids = tok.encode('Let me think... {not json} </think>{"a":1}')
    mask = np.zeros(vocab.mask_words, dtype=np.int32)
    for t in ids:
        mask[:] = 0
        m.fill_next_token_bitmask(mask)
        assert bitmask_to_bool(mask, vocab.size)[t], vocab.token_bytes[t]
        assert m.accept_token(t)
    assert m.is_accepting()


def test_bytes_after_the_tag_in_the_same_token_reach_the_grammar(smollm2_vocab):
    tb = smollm2_vocab.token_bytes
    letters = GrammarMatcher(GrammarCompiler(smollm2_vocab).compile_regex("[a-z]+"), reasoning_end="th")
    assert letters.accept_token(tb.index(b"x")) and letters.accept_token(
        tb.index(b"the")
    )  # "e" goes to the grammar
    assert letters.is_accepting()
    letters.rollback(1)
    assert not letters.is_accepting()
    digits = GrammarMatcher(GrammarCompiler(smollm2_vocab).compile_regex("[0-9]+"), reasoning_end="th")
    assert not digits.accept_token(tb.index(b"the"))  # "e" after the tag is not a digit


def test_end_of_generation_not_allowed_while_thinking(smollm2_vocab):
    compiled = GrammarCompiler(smollm2_vocab).compile_regex("[a-z]+")
    m = GrammarMatcher(compiled, reasoning_end="</think>")
    mask = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
    m.fill_next_token_bitmask(mask)
    allowed = bitmask_to_bool(mask, smollm2_vocab.size)
    assert not any(allowed[i] for i in smollm2_vocab.eos_token_ids)
    assert allowed[smollm2_vocab.token_bytes.index(b"hello")]
