"""Is a prompt/continuation seam tokenized canonically, with and without healing? Forces the continuation's tokens.

Simulates generation that picks, at each step, the canonical next token of the joined text, if allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..vocab import Vocabulary

if TYPE_CHECKING:
    from ..vocab import Tokenizer
from .constraint import HealingConstraint
from .heal import DEFAULT_MAX_ROLLBACK, heal_prompt


@dataclass(frozen=True)
class SeamResult:
    prefix: str
    continuation: str
    canonical_without: bool  # tokens(prefix) is a prefix of tokens(prefix + continuation)
    canonical_with: bool  # tokens(kept) + forced output == tokens(prefix + continuation)
    removed_ids: list[int]
    removed_bytes: bytes
    healed_steps: int  # output tokens generated under the healing constraint
    reason: str = ""  # why healing was not canonical


def _allowed(mask: np.ndarray, token_id: int) -> bool:
    return bool((int(mask.view(np.uint32)[token_id >> 5]) >> (token_id & 31)) & 1)


def check_seam(
    tokenizer: Tokenizer,
    vocab: Vocabulary,
    prefix: str,
    continuation: str,
    max_rollback: int = DEFAULT_MAX_ROLLBACK,
) -> SeamResult:
    """Is the joined text reachable token-for-token from the prompt alone (without) and after healing (with)?"""
    canon = tokenizer.encode(prefix + continuation)
    raw = tokenizer.encode(prefix)
    without = canon[: len(raw)] == raw
    h = heal_prompt(raw, vocab, max_rollback)
    kept = h.kept_ids
    base = dict(
        prefix=prefix,
        continuation=continuation,
        canonical_without=without,
        removed_ids=h.removed_ids,
        removed_bytes=h.removed_bytes,
    )
    if canon[: len(kept)] != kept:
        return SeamResult(canonical_with=False, healed_steps=0, reason="kept tokens re-tokenize", **base)
    c = HealingConstraint(vocab, h.removed_bytes)
    steps = 0
    mask = np.zeros(vocab.mask_words, dtype=np.int32)
    for t in canon[len(kept) :]:
        if not c.is_active():
            break
        mask[:] = 0
        c.fill_mask(mask)
        if not _allowed(mask, t) or not c.accept(t):
            return SeamResult(
                canonical_with=False,
                healed_steps=steps,
                reason=f"canonical token {t} {vocab.token_bytes[t]!r} masked out",
                **base,
            )
        steps += 1
    if c.is_active():
        return SeamResult(canonical_with=False, healed_steps=steps, reason="continuation too short", **base)
    return SeamResult(canonical_with=True, healed_steps=steps, **base)
