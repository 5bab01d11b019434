"""Fixtures for the grammar tests: compilers on both vocabularies and a constrained adversarial sampler."""

from __future__ import annotations

import numpy as np
import pytest

from tokenseam.constraint import bitmask_to_bool
from tokenseam.grammar import GrammarCompiler, GrammarMatcher


@pytest.fixture(scope="session")
def compiler(smollm2_vocab):
    return GrammarCompiler(smollm2_vocab)


@pytest.fixture(scope="session")
def gemma_compiler(gemma3_vocab):
    return GrammarCompiler(gemma3_vocab)


def accepts_text(compiled, text: str) -> bool:
    """Feed the UTF-8 bytes of `text`; True if every byte is accepted and the grammar may end there."""
    m = GrammarMatcher(compiled)
    return m.accept_bytes(text.encode("utf-8")) and m.is_accepting()


_TABLES: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def _tables(vocab):
    t = _TABLES.get(vocab.fingerprint)
    if t is None:
        lens = np.array([len(b) for b in vocab.token_bytes])
        closers = np.array([any(c in b for c in b'"]}') for b in vocab.token_bytes])
        eos = np.zeros(vocab.size, dtype=bool)
        eos[list(vocab.eos_token_ids)] = True
        t = _TABLES[vocab.fingerprint] = (lens, closers, eos)
    return t


def sample(compiled, vocab, rng, max_tokens: int = 300, mode: str = "random") -> tuple[bytes, bool]:
    """Generate under the mask with adversarial choices; return (bytes, ended-by-EOS-or-termination).

    mode 'random' picks uniformly among allowed tokens (EOS with probability 0.3 once allowed), 'long'
    prefers the longest allowed token, 'close' favours tokens with a closing quote/bracket (to finish
    unbounded strings), 'eos_last' never picks EOS while anything else is allowed.
    """
    lens, closers, eos_mask = _tables(vocab)
    m = GrammarMatcher(compiled)
    out = np.zeros(vocab.mask_words, dtype=np.int32)
    toks: list[int] = []
    for _ in range(max_tokens):
        m.fill_next_token_bitmask(out)
        allowed_mask = bitmask_to_bool(out, vocab.size)
        allowed = np.flatnonzero(allowed_mask)
        assert len(allowed) > 0, f"dead end after {vocab.decode_bytes(toks)!r}"
        assert not (allowed_mask & vocab.is_special & ~eos_mask).any(), "special token allowed"
        ends = allowed[eos_mask[allowed]]
        body = allowed[~eos_mask[allowed]]
        if mode == "long" and len(body) and rng.random() < 0.7:
            t = int(body[int(np.argmax(lens[body] + rng.random(len(body))))])
        elif mode == "close" and rng.random() < 0.5 and (len(ends) or closers[body].any()):
            cands = np.concatenate([ends, body[closers[body]]])
            t = int(rng.choice(cands))
        elif mode == "eos_last":
            t = int(rng.choice(body)) if len(body) else int(ends[0])
        elif mode == "random" and len(ends) and rng.random() < 0.3:
            t = int(ends[0])
        else:
            t = int(rng.choice(allowed))
        assert m.accept_token(t), "a token from the mask was refused"
        if eos_mask[t]:
            return vocab.decode_bytes(toks), True
        toks.append(t)
        if m.is_terminated():
            return vocab.decode_bytes(toks), True
    return vocab.decode_bytes(toks), False
