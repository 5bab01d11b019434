"""The per-request constraint hook: how grammars and token healing restrict what the sampler may pick.

The contract between the engine (which calls it) and the grammar and healing packages (which implement it), so
it sits below all three. The engine never looks inside a constraint; it asks for a packed int32 allowed-token bitmask and reports
the token it sampled. Bit i of word i // 32 set (little-endian within the word) = token i allowed.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Constraint(Protocol):
    """One request's constraint. Called only from the engine thread, once per generated token."""

    def fill_mask(self, out: np.ndarray) -> None:
        """Write the allowed set into `out` (int32, shape ceil(V/32), zeroed by the caller)."""

    def accept(self, token_id: int) -> bool:
        """Advance past the sampled token; False means the token violated the constraint."""

    def is_finished(self) -> bool:
        """True when the constraint allows nothing more (generation must stop)."""

    def is_active(self) -> bool:
        """False once the constraint restricts nothing any more (token healing after the removed bytes are
        regenerated): asked after each accept, and the engine then drops it for the rest of the choice. A
        constraint that restricts every token to the end (a grammar) returns True."""


def allocate_token_bitmask(vocab_size: int, batch: int | None = None) -> np.ndarray:
    """A zeroed packed bitmask for one sequence (or `batch` sequences)."""
    words = (vocab_size + 31) // 32
    shape = (words,) if batch is None else (batch, words)
    return np.zeros(shape, dtype=np.int32)


def bitmask_from_ids(
    ids: np.ndarray | list[int], vocab_size: int, out: np.ndarray | None = None
) -> np.ndarray:
    """Set the bits of `ids` in `out` (allocated if None). Vectorised: no Python loop over ids."""
    if out is None:
        out = allocate_token_bitmask(vocab_size)
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size:
        words = out.view(np.uint32)
        np.bitwise_or.at(words, ids >> 5, (np.uint32(1) << (ids & 31).astype(np.uint32)))
    return out


def bitmask_to_bool(mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """Unpack a packed int32 bitmask into a bool array of length vocab_size."""
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")
    return bits[:vocab_size].astype(bool)
