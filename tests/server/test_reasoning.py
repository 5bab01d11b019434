"""A grammar that starts after </think>: thinking text is free, the answer follows the grammar."""

from __future__ import annotations

import numpy as np

from tokenseam.engine.constraint import bitmask_to_bool
from tokenseam.grammar import GrammarCompiler
from tokenseam.server.reasoning import ThinkThenGrammar


def test_thinking_is_free_then_grammar_applies(smollm2_vocab, tokenizers):
    vocab, tok = smollm2_vocab, tokenizers["smollm2"]
    compiled = GrammarCompiler(vocab).compile_json_schema(
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False},
        compact=True)
    c = ThinkThenGrammar(vocab, _matcher(compiled))
    text = 'Let me think... {not json} </think>{"a":1}'
    ids = tok.encode(text)
    mask = np.zeros(vocab.mask_words, dtype=np.int32)
    for t in ids:
        mask[:] = 0
        c.fill_mask(mask)
        assert bitmask_to_bool(mask, vocab.size)[t], vocab.token_bytes[t]
        assert c.accept(t)
    assert not c.thinking and c.matcher.is_accepting()


def test_end_of_generation_not_allowed_while_thinking(smollm2_vocab):
    compiled = GrammarCompiler(smollm2_vocab).compile_regex("[a-z]+")
    c = ThinkThenGrammar(smollm2_vocab, _matcher(compiled))
    mask = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
    c.fill_mask(mask)
    allowed = bitmask_to_bool(mask, smollm2_vocab.size)
    assert not any(allowed[i] for i in smollm2_vocab.eos_token_ids)
    assert allowed[smollm2_vocab.token_bytes.index(b"hello")]


def test_grammar_rejects_after_think(smollm2_vocab, tokenizers):
    compiled = GrammarCompiler(smollm2_vocab).compile_regex("[0-9]+")
    c = ThinkThenGrammar(smollm2_vocab, _matcher(compiled))
    for t in tokenizers["smollm2"].encode("ok </think>"):
        assert c.accept(t)
    mask = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
    c.fill_mask(mask)
    allowed = bitmask_to_bool(mask, smollm2_vocab.size)
    assert allowed[smollm2_vocab.token_bytes.index(b"7")] and not allowed[smollm2_vocab.token_bytes.index(b"x")]


def _matcher(compiled):
    from tokenseam.grammar import GrammarMatcher

    return GrammarMatcher(compiled)
