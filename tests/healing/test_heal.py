"""heal_prompt: the rollback point, its limits (look-back, special tokens) and agreement with a vocabulary scan."""

from __future__ import annotations

import pytest

from tokenseam.healing import HealingError, heal_prompt

MODELS = ["smollm2", "gemma3"]


def _naive_heal(ids, vocab, max_rollback=4):
    """Reference: the same rule with a scan of every token instead of the trie."""
    tb, sp = vocab.token_bytes, vocab.is_special
    start = len(ids)
    while start > 0 and len(ids) - start < max_rollback and not sp[ids[start - 1]]:
        start -= 1
    window = b"".join(tb[t] for t in ids[start:])
    lim = min(len(window), vocab.max_token_bytes)
    toks = [b for b, s in zip(tb, sp, strict=True) if b and not s]
    for off in range(len(window) - lim, len(window)):
        suf = window[off:]
        if any(len(b) > len(suf) and b.startswith(suf) for b in toks):
            cut, covered = len(ids), 0
            while covered < len(suf):
                cut -= 1
                covered += len(tb[ids[cut]])
            return ids[cut:]
    return []


@pytest.mark.parametrize("model", MODELS)
def test_http_colon_rolls_back_the_colon(model, vocabs, tokenizers):
    vocab, tok = vocabs[model], tokenizers[model]
    ids = tok.encode("http:")
    r = heal_prompt(ids, vocab)
    assert r.removed_bytes == b":"
    assert r.kept_ids + r.removed_ids == ids
    assert r.healed
    # The canonical tokenization of the joined text starts with the kept ids.
    assert tok.encode("http://")[: len(r.kept_ids)] == r.kept_ids


@pytest.mark.parametrize("model", MODELS)
def test_agrees_with_a_vocabulary_scan(model, vocabs, tokenizers):
    vocab, tok = vocabs[model], tokenizers[model]
    prompts = ["Thr", "def calculate_", "中华人民共和", "The year was 1984", "Context:\n"]
    if model == "smollm2":
        prompts += ["about ", "\\frac{", "import num", "東京"]
    for p in prompts:
        ids = tok.encode(p)
        assert heal_prompt(ids, vocab).removed_ids == _naive_heal(ids, vocab), p


@pytest.mark.parametrize("model", MODELS)
def test_never_crosses_a_special_token(model, vocabs, tokenizers):
    vocab, tok = vocabs[model], tokenizers[model]
    special = sorted(vocab.eos_token_ids)[0]
    ids = tok.encode("Thr")
    assert heal_prompt([special], vocab).removed_ids == []
    r = heal_prompt([*ids[:-1], special, ids[-1]], vocab)
    assert special not in r.removed_ids and r.kept_ids[-1] == special
    assert heal_prompt([*ids, special], vocab).removed_ids == []


def test_look_back_is_capped(vocabs, tokenizers):
    vocab, tok = vocabs["smollm2"], tokenizers["smollm2"]
    ids = tok.encode("Thr")  # [Th, r]: "Thr" extends to "Three", so both tokens go by default
    assert len(heal_prompt(ids, vocab).removed_ids) == 2
    assert len(heal_prompt(ids, vocab, max_rollback=1).removed_ids) == 1
    assert heal_prompt(ids, vocab, max_rollback=0).removed_ids == []
    assert heal_prompt([], vocab).removed_ids == []


def test_removed_bytes_never_exceed_window(vocabs, tokenizers):
    for model in MODELS:
        vocab, tok = vocabs[model], tokenizers[model]
        ids = tok.encode("a" * 300)
        r = heal_prompt(ids, vocab)
        assert len(r.removed_ids) <= 4
        assert len(r.removed_bytes) <= 2 * vocab.max_token_bytes


@pytest.mark.parametrize("bad", [-1, 1.5, "4", None, True])
def test_bad_max_rollback(bad, vocabs):
    with pytest.raises(HealingError, match="max_rollback"):
        heal_prompt([1, 2], vocabs["smollm2"], max_rollback=bad)


@pytest.mark.parametrize("bad", [-1, 10**9, "x"])
def test_bad_token_id(bad, vocabs):
    with pytest.raises(HealingError, match="not in the vocabulary"):
        heal_prompt([5, bad], vocabs["smollm2"])


def test_numpy_ids_are_accepted(vocabs, tokenizers):
    import numpy as np

    vocab, tok = vocabs["smollm2"], tokenizers["smollm2"]
    ids = tok.encode("http:")
    r = heal_prompt(np.asarray(ids, dtype=np.int32), vocab)
    assert r.removed_ids == [ids[-1]] and all(type(t) is int for t in r.removed_ids)


@pytest.mark.parametrize(
    "value,default,want",
    [
        (None, True, 4),
        (None, False, 0),
        (True, False, 4),
        (False, True, 0),
        (0, True, 0),
        (2, True, 2),
        (16, True, 16),
    ],
)
def test_resolve_token_healing(value, default, want):
    from tokenseam.healing import resolve_token_healing

    assert resolve_token_healing(value, default) == want


@pytest.mark.parametrize("bad", [-1, 17, 10**18, 1.5, "true", [4], {"n": 4}])
def test_resolve_token_healing_rejects(bad):
    from tokenseam.healing import resolve_token_healing

    with pytest.raises(HealingError, match="token_healing must be"):
        resolve_token_healing(bad)
