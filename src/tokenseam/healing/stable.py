"""Stable prefixes: the tokens of a text that no appended text can re-tokenize, and joining new text onto them.

The stable prefix is the healing rollback point; reusing its ids verbatim keeps prefix-cache keys fixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..vocab import Vocabulary

if TYPE_CHECKING:
    from ..vocab import Tokenizer
from .errors import HealingError
from .heal import DEFAULT_MAX_ROLLBACK, heal_prompt

# Stable tokens re-tokenized together with the tail: a pre-tokenizer chunk can start before the stable point
# (GPT-2's regex joins "：" and "'" into one chunk) without changing those tokens, yet it changes what follows.
_CONTEXT_TOKENS = 4


@dataclass(frozen=True)
class StablePrefix:
    """`ids` never change whatever is appended; `tail_ids` (bytes `tail_bytes`) may merge with appended text."""

    ids: list[int]
    tail_ids: list[int]
    tail_bytes: bytes
    # For join_stable: the last few stable tokens after the last special token (count and bytes), and the
    # start and bytes of that whole special-free run.
    context_len: int = 0
    context_bytes: bytes = b""
    segment_start: int = 0
    segment_bytes: bytes = b""

    @property
    def all_ids(self) -> list[int]:
        return self.ids + self.tail_ids


def stable_prefix(
    tokenizer: Tokenizer,
    vocab: Vocabulary,
    text_or_ids: str | bytes | Sequence[int],
    max_rollback: int = DEFAULT_MAX_ROLLBACK,
    parse_special: bool = False,
) -> StablePrefix:
    """Split a text (tokenized without BOS) or a token-id list at its stable point."""
    if isinstance(text_or_ids, str | bytes):
        ids = tokenizer.encode(text_or_ids, add_special=False, parse_special=parse_special)
    else:
        ids = list(text_or_ids)
    h = heal_prompt(ids, vocab, max_rollback)
    kept, tail = h.kept_ids, h.removed_ids
    # The tail is re-tokenized on its own, so it must start on a UTF-8 character boundary: byte-level
    # vocabularies split CJK characters across tokens.
    tb = vocab.token_bytes
    while (
        tail and kept and not vocab.is_special[kept[-1]] and tb[tail[0]][:1] and 0x80 <= tb[tail[0]][0] < 0xC0
    ):
        tail = [kept[-1], *tail]
        kept = kept[:-1]
    seg = len(kept)
    while seg > 0 and not vocab.is_special[kept[seg - 1]]:
        seg -= 1
    ctx = max(seg, len(kept) - _CONTEXT_TOKENS)
    return StablePrefix(
        kept,
        tail,
        b"".join(tb[t] for t in tail),
        len(kept) - ctx,
        b"".join(tb[t] for t in kept[ctx:]),
        seg,
        b"".join(tb[t] for t in kept[seg:]),
    )


def join_stable(
    tokenizer: Tokenizer,
    prefix: str | bytes | StablePrefix,
    appended: str | bytes,
    vocab: Vocabulary | None = None,
    max_rollback: int = DEFAULT_MAX_ROLLBACK,
) -> list[int]:
    """Ids of `prefix + appended` that reuse the prefix's stable ids verbatim and re-tokenize only the tail.

    Pass a precomputed `StablePrefix` to skip tokenizing the fixed prefix on every call; a text prefix needs
    `vocab`. Appended text is ordinary text: special-token markup in it is not parsed.
    """
    if not isinstance(prefix, StablePrefix):
        if vocab is None:
            raise HealingError("join_stable needs the vocabulary when the prefix is given as text")
        prefix = stable_prefix(tokenizer, vocab, prefix, max_rollback)
    data = appended.encode("utf-8") if isinstance(appended, str) else bytes(appended)
    ids = prefix.ids
    ctx = ids[len(ids) - prefix.context_len :]
    joined = tokenizer.encode(
        prefix.context_bytes + prefix.tail_bytes + data, add_special=False, parse_special=False
    )
    if joined[: len(ctx)] == ctx:
        return ids + joined[len(ctx) :]
    # The context did not start on a pre-tokenizer boundary: tokenize the whole special-free run once. A special
    # token is a hard boundary, so nothing before it can change.
    seg = ids[prefix.segment_start :]
    full = tokenizer.encode(
        prefix.segment_bytes + prefix.tail_bytes + data, add_special=False, parse_special=False
    )
    if full[: len(seg)] == seg:
        return ids + full[len(seg) :]
    return (
        ids[: prefix.segment_start] + full
    )  # the stable tokens themselves re-tokenized: keep the text right
