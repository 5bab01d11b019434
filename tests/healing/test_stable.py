"""The stable-prefix invariant `tokenize(b + anything)[:len(t)] == t` and join_stable's reuse of stable ids."""

from __future__ import annotations

import pytest

from tokenseam.healing import HealingError, join_stable, stable_prefix
from tokenseam.healing.cases import BOUNDARY_CASES, RAG_CHUNKS, STABLE_PROMPTS
from tokenseam.healing.lint import CONTINUATIONS

MODELS = ["smollm2", "gemma3"]
PROMPTS = sorted(
    {c.prefix for c in BOUNDARY_CASES}
    | set(STABLE_PROMPTS)
    | {
        "Context:\n",
        "Answer: ",
        "```python\n",
        "以下是一段中文句子。",
        "System: you are terse.\n\nUser:",
        "Use the documents below.\n\nContext:\n",
    }
)
EXTRA = [c.continuation for c in BOUNDARY_CASES] + [
    "s://x",
    "://",
    "zzz",
    "ß",
    "\u00a0x",
    "\n\n\n",
    "!!!",
    "0.5",
]


@pytest.mark.parametrize("model", MODELS)
def test_stable_prefix_invariant(model, vocabs, tokenizers):
    vocab, tok = vocabs[model], tokenizers[model]
    conts = [c for _, c in CONTINUATIONS] + EXTRA + list(RAG_CHUNKS[:10])
    failures = []
    for p in PROMPTS:
        sp = stable_prefix(tok, vocab, p)
        assert sp.ids + sp.tail_ids == tok.encode(p)
        for c in conts:
            if tok.encode(p + c)[: len(sp.ids)] != sp.ids:
                failures.append((p, c))
    assert failures == []


@pytest.mark.parametrize("model", MODELS)
def test_join_stable_equals_full_tokenization(model, vocabs, tokenizers):
    vocab, tok = vocabs[model], tokenizers[model]
    conts = [c for _, c in CONTINUATIONS] + EXTRA
    mismatches = []
    for p in PROMPTS:
        sp = stable_prefix(tok, vocab, p)
        for c in conts:
            ids = join_stable(tok, sp, c)
            assert ids[: len(sp.ids)] == sp.ids
            if ids != tok.encode(p + c):
                mismatches.append((p, c))
    assert mismatches == []


@pytest.mark.parametrize("model", MODELS)
def test_context_header_is_reused_for_50_chunks(model, vocabs, tokenizers):
    vocab, tok = vocabs[model], tokenizers[model]
    header = "Use only the documents below to answer.\n\nContext:\n"
    sp = stable_prefix(tok, vocab, header)
    assert len(sp.ids) >= len(tok.encode(header)) - 1
    chunks = RAG_CHUNKS
    keys = set()
    for chunk in chunks:
        ids = join_stable(tok, header, chunk, vocab)
        assert ids == tok.encode(header + chunk)
        keys.add(tuple(ids[: len(sp.ids)]))
        assert stable_prefix(tok, vocab, header).ids == sp.ids
    assert keys == {tuple(sp.ids)}  # one cache key for every appended chunk
    # Without healing the raw prompt tokens are not a prefix of every joined text: that is the cache miss.
    raw = tok.encode(header)
    assert sum(tok.encode(header + c)[: len(raw)] != raw for c in chunks) > 0


@pytest.mark.parametrize("model", MODELS)
def test_utf8_tail_starts_on_a_character(model, vocabs, tokenizers):
    vocab, tok = vocabs[model], tokenizers[model]
    for p in ["中华人民共和", "東京", "使用Py", "ñandú"]:
        sp = stable_prefix(tok, vocab, p)
        assert not sp.tail_bytes or not 0x80 <= sp.tail_bytes[0] < 0xC0
        vocab.decode_bytes(sp.ids).decode("utf-8")  # the stable part is whole characters


def test_accepts_ids_and_needs_vocab_for_text(vocabs, tokenizers):
    vocab, tok = vocabs["smollm2"], tokenizers["smollm2"]
    ids = tok.encode("about ")
    assert stable_prefix(tok, vocab, ids) == stable_prefix(tok, vocab, "about ")
    with pytest.raises(HealingError, match="vocabulary"):
        join_stable(tok, "about ", "the")


@pytest.mark.parametrize("model", MODELS)
def test_rag_heads_join_exactly(model, vocabs, tokenizers):
    from tokenseam.healing.cases import RAG_FIXED_PROMPTS

    vocab, tok = vocabs[model], tokenizers[model]
    for head in RAG_FIXED_PROMPTS:
        sp = stable_prefix(tok, vocab, head)
        for chunk in RAG_CHUNKS:
            ids = join_stable(tok, sp, chunk)
            assert ids[: len(sp.ids)] == sp.ids
            assert ids == tok.encode(head + chunk), (head, chunk)


def test_special_tokens_in_the_prefix(vocabs, tokenizers):
    vocab, tok = vocabs["smollm2"], tokenizers["smollm2"]
    head = "<|im_start|>user\nContext:\n"
    sp = stable_prefix(tok, vocab, head, parse_special=True)
    assert sp.ids[0] == tok.encode("<|im_start|>", parse_special=True)[0]
    for chunk in ["The", "'single'", "\nblank", "中文"]:
        ids = join_stable(tok, sp, chunk)
        assert ids == tok.encode(head, parse_special=True)[: len(sp.ids)] + ids[len(sp.ids) :]
        assert tok.encode(head + chunk, parse_special=True) == ids


class _CountingTokenizer:
    def __init__(self, tok):
        self.tok, self.calls = tok, 0

    def encode(self, *a, **k):
        self.calls += 1
        return self.tok.encode(*a, **k)


@pytest.mark.parametrize("model", MODELS)
def test_join_falls_back_when_the_context_does_not_reproduce(model, vocabs, tokenizers):
    import dataclasses

    vocab, tok = vocabs[model], tokenizers[model]
    for head in ["Context:\n", "Read this: 'quoted", "以下是资料："]:
        sp = stable_prefix(tok, vocab, head)
        # A context that tokenizes differently alone (as when it starts inside a pre-tokenizer chunk).
        bad = dataclasses.replace(sp, context_bytes=b"zq" + sp.context_bytes)
        for chunk in ["the", "'single'", " more"]:
            counting = _CountingTokenizer(tok)
            ids = join_stable(counting, bad, chunk)
            assert counting.calls == 2  # the context check failed; the special-free run was tokenized once
            assert ids == tok.encode(head + chunk), (head, chunk)
