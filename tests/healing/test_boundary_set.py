"""The boundary set on both models: healing is canonical on every case; the linter flags them all."""

from __future__ import annotations

import pytest

from tokenseam.healing.cases import BOUNDARY_CASES, RAG_CHUNKS, STABLE_PROMPTS
from tokenseam.healing.seam import check_seam

MODELS = ["smollm2", "gemma3"]


@pytest.mark.parametrize("model", MODELS)
def test_healing_is_canonical_on_the_boundary_set(model, vocabs, tokenizers):
    vocab, tok = vocabs[model], tokenizers[model]
    results = [check_seam(tok, vocab, c.prefix, c.continuation) for c in BOUNDARY_CASES]
    bad = [(r.prefix, r.continuation, r.reason) for r in results if not r.canonical_with]
    assert bad == []
    without = sum(r.canonical_without for r in results)
    print(
        f"\n{model}: canonical with healing {len(results)}/{len(results)}, without {without}/{len(results)}"
    )
    # The set is made of seams that break without healing: most of them must.
    assert len(results) - without >= len(results) // 3
    for r in results:
        if not r.canonical_without:
            assert r.removed_ids, f"{r.prefix!r} is not canonical yet healing removed nothing"


@pytest.mark.parametrize("model", MODELS)
def test_stable_prompts_stay_canonical(model, vocabs, tokenizers):
    vocab, tok = vocabs[model], tokenizers[model]
    for p in STABLE_PROMPTS:
        for chunk in RAG_CHUNKS[:10]:
            r = check_seam(tok, vocab, p, chunk)
            assert r.canonical_with and r.canonical_without, (p, chunk, r.reason)


def test_healed_output_starts_with_removed_bytes(vocabs, tokenizers):
    vocab, tok = vocabs["smollm2"], tokenizers["smollm2"]
    r = check_seam(tok, vocab, "http:", "//")
    assert r.removed_bytes == b":" and r.healed_steps == 1
    canon = tok.encode("http://")
    out = canon[len(tok.encode("http:")) - len(r.removed_ids) :]
    assert vocab.decode_bytes(out).startswith(r.removed_bytes)
