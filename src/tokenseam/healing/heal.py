"""Token healing's rollback: find the trailing prompt tokens that a longer token could extend and cut them.

The cut follows llguidance: the longest byte suffix (within the look-back window) that some token strictly
extends decides it; the fewest whole tokens covering that suffix are removed. Only the byte trie is queried.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

from ..vocab import Vocabulary
from ..wire import check_token_healing
from .errors import HealingError

DEFAULT_MAX_ROLLBACK = 4  # what `token_healing: true` (and `heal_prompt`'s default) rolls back at most


def resolve_token_healing(value: object, default: bool = True) -> int:
    """The request option `token_healing` (true, false, a number of tokens, or None for the endpoint default
    `default`) as a `max_rollback` for `heal_prompt`: 0 means off. Raises `HealingError` for any other value
    (the limits are the server's: `wire.TOKEN_HEALING_MAX`)."""
    try:
        value = check_token_healing(value, default)
    except ValueError as e:
        raise HealingError(str(e)) from None
    if value is True:
        return DEFAULT_MAX_ROLLBACK
    return int(value)


@dataclass(frozen=True)
class HealResult:
    """The prompt split at the healing point: prefill `kept_ids`, then generate starting with `removed_bytes`."""

    kept_ids: list[int]
    removed_ids: list[int]
    removed_bytes: bytes

    @property
    def healed(self) -> bool:
        return bool(self.removed_ids)


def heal_prompt(
    prompt_ids: Sequence[int], vocab: Vocabulary, max_rollback: int = DEFAULT_MAX_ROLLBACK
) -> HealResult:
    """Roll back the trailing tokens of `prompt_ids` that a longer token could extend.

    Looks back at most `max_rollback` tokens and `vocab.max_token_bytes` bytes, never across a special token.
    `max_rollback=0` disables healing. Cost: one binary search of the trie per byte of the window.
    """
    if isinstance(max_rollback, bool) or not isinstance(max_rollback, int) or max_rollback < 0:
        raise HealingError(f"max_rollback must be a non-negative integer, got {max_rollback!r}")
    ids = list(prompt_ids)
    n = len(ids)
    tb, special, size = vocab.token_bytes, vocab.is_special, vocab.size
    # The window: up to max_rollback trailing tokens, stopping at a special token (BOS, template markers).
    start = n
    while start > 0 and n - start < max_rollback:
        t = ids[start - 1]
        try:
            if isinstance(t, bool):
                raise TypeError
            t = operator.index(t)  # numpy integers are fine, floats and strings are not
        except TypeError:
            t = None
        if t is None or not 0 <= t < size:
            raise HealingError(
                f"prompt token id {ids[start - 1]!r} at position {start - 1} is not in the "
                f"vocabulary (size {size})"
            )
        ids[start - 1] = t
        if special[t]:
            break
        start -= 1
    if start == n:
        return HealResult(ids, [], b"")
    window = b"".join(tb[t] for t in ids[start:])
    lim = min(len(window), vocab.max_token_bytes)
    trie = vocab.trie
    sb = trie.sorted_bytes
    for off in range(len(window) - lim, len(window)):
        suffix = window[off:]
        lo, hi = trie.prefix_range(suffix)
        # Tokens with equal bytes sort first in the range, so the last one is longer iff any is.
        if hi > lo and len(sb[hi - 1]) > len(suffix):
            need = len(suffix)
            cut = n
            covered = 0
            while covered < need:
                cut -= 1
                covered += len(tb[ids[cut]])
            removed = ids[cut:]
            return HealResult(ids[:cut], removed, b"".join(tb[t] for t in removed))
    return HealResult(ids, [], b"")
