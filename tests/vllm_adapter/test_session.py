"""The vLLM backend's per-request grammar state, without vLLM: end tokens, validate, exact rollback, healing."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tokenseam.constraint import bitmask_to_bool
from tokenseam.grammar import GrammarCompiler
from tokenseam.vllm.session import GrammarSession

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def compiler(smollm2_vocab):
    return GrammarCompiler(smollm2_vocab)


def ids_of(vocab, text: str) -> list[int]:
    """A greedy byte tokenization of `text` (longest token first): any tokenization is fine for a grammar."""
    trie, out, data, i = vocab.trie, [], text.encode(), 0
    while i < len(data):
        n, t = max(trie.prefixes_of(data[i:]))
        out.append(t)
        i += n
    return out


def allowed(session, vocab) -> np.ndarray:
    row = np.zeros(vocab.mask_words, dtype=np.int32)
    session.fill(row)
    return bitmask_to_bool(row, vocab.size)


def test_end_tokens_are_the_requests_stop_ids(compiler, smollm2_vocab):
    vocab = smollm2_vocab
    g = compiler.compile_json_schema(SCHEMA)
    end = 2  # <|im_end|>: the stop token vLLM uses for SmolLM2; 0 (<|endoftext|>) is not one there
    s = GrammarSession(g, [end])
    doc = ids_of(vocab, '{"name": "ab", "n": 7')
    assert s.accept(doc)
    m = allowed(s, vocab)
    assert not m[end] and not m[0]  # not accepting yet
    assert s.accept(ids_of(vocab, "}"))
    m = allowed(s, vocab)
    assert m[end] and not m[0]  # only the request's stop id ends it
    assert not s.accept([0])
    assert s.accept([end]) and s.terminated
    assert s.accept([5, 6])  # tokens after the end are ignored, as vLLM's other backends do
    assert s.num_accepted == len(doc) + 2


def test_validate_does_not_move(compiler, smollm2_vocab):
    g = compiler.compile_regex(r"ab(c|d)e")
    s = GrammarSession(g, [2])
    toks = ids_of(smollm2_vocab, "abce")
    ab = ids_of(smollm2_vocab, "ab")
    before = allowed(s, smollm2_vocab)
    assert s.validate(toks + [2, 7]) == toks + [2]  # stops after the end token
    assert s.validate(ab + ids_of(smollm2_vocab, "x") + ab) == ab  # the longest accepted prefix
    assert (allowed(s, smollm2_vocab) == before).all() and s.num_accepted == 0
    assert not s.terminated


def test_rollback_is_exact(compiler, smollm2_vocab):
    """A random walk with rollbacks: after every rollback the mask equals the one recorded at that length."""
    vocab = smollm2_vocab
    g = compiler.compile_json_schema({"type": "array", "items": SCHEMA, "maxItems": 3})
    rng = random.Random(7)
    for healing in (b"", b' ["'):
        s = GrammarSession(g, [2], healing=healing)
        masks = [allowed(s, vocab)]
        for _ in range(120):
            if s.terminated or (s.num_accepted and rng.random() < 0.25):
                k = rng.randint(1, s.num_accepted)
                s.rollback(k)
                del masks[len(masks) - k :]
                assert (allowed(s, vocab) == masks[-1]).all()
                continue
            choices = np.flatnonzero(masks[-1])
            assert choices.size, "the grammar can always go on or end"
            t = int(rng.choice(list(choices)))
            assert s.accept([t])
            masks.append(allowed(s, vocab))
        s.reset()
        assert s.num_accepted == 0 and (allowed(s, vocab) == masks[0]).all()
    with pytest.raises(ValueError):
        s.rollback(1)
    with pytest.raises(ValueError):
        s.rollback(-1)


def test_rollback_undoes_the_end(compiler, smollm2_vocab):
    s = GrammarSession(compiler.compile_choice(["yes", "no"]), [2])
    assert s.accept(ids_of(smollm2_vocab, "no") + [2]) and s.terminated
    s.rollback(1)
    assert not s.terminated and allowed(s, smollm2_vocab)[2]


def test_healing_leads_the_grammar(compiler, smollm2_vocab):
    """Output = the removed bytes, then a string of the grammar: the two compose in one mask."""
    vocab = smollm2_vocab
    s = GrammarSession(compiler.compile_regex(r"//[a-z]+\.com"), [2], healing=b":")
    m = allowed(s, vocab)
    ok = [i for i in np.flatnonzero(m)]
    assert ok and all(vocab.token_bytes[i].startswith(b":") for i in ok)
    assert not m[2]  # cannot end before the removed bytes are back
    # "://" is one token of SmolLM2: it completes the removed ":" and starts the grammar with "//"
    t = next(i for i in ok if vocab.token_bytes[i] == b"://")
    assert s.accept([t])
    assert s.accept(ids_of(vocab, "example.com")) and allowed(s, vocab)[2]
    assert not GrammarSession(compiler.compile_regex(r"//x"), [2], healing=b":").accept(ids_of(vocab, ":x"))


def test_bad_end_ids(compiler, smollm2_vocab):
    g = compiler.compile_regex("a")
    with pytest.raises(ValueError):
        GrammarSession(g, [])
    with pytest.raises(ValueError):
        GrammarSession(g, [smollm2_vocab.size + 5])
