"""One vLLM request's grammar state, as vLLM's backend interface needs it (no vLLM needed).

- The end tokens are the request's stop token ids (vLLM's `all_stop_token_ids`), allowed exactly where the
  grammar accepts; once one is accepted the session is terminated (vLLM then stops masking).
- Every accepted token can be rolled back exactly (speculative decoding: `validate` tries drafted tokens
  without moving, `rollback` undoes accepted ones).
- With `healing` (the prompt bytes token healing removed), the output must first regenerate those bytes and
  the grammar applies to what follows them: the grammar and healing on one request compose.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..grammar import CompiledGrammar, GrammarMatcher
from ..healing import HealedGrammarConstraint


class GrammarSession:
    def __init__(self, compiled: CompiledGrammar, end_ids: Iterable[int], healing: bytes = b"") -> None:
        ends = {int(t) for t in end_ids}
        if not ends:
            raise ValueError("a grammar session needs at least one end token id")
        self.compiled = compiled
        self.end_ids = frozenset(ends)
        self.healing = bytes(healing)
        self._matcher = GrammarMatcher(compiled, end_ids=ends)
        self._constraint: GrammarMatcher | HealedGrammarConstraint = self._matcher
        if self.healing:
            self._constraint = HealedGrammarConstraint(compiled.vocab, self.healing, self._matcher)
        self._accepted: list[int] = []
        self.terminated = False

    @property
    def num_accepted(self) -> int:
        return len(self._accepted)

    def accept(self, tokens: Iterable[int]) -> bool:
        """Advance over `tokens`; False at the first token the grammar refuses (that one and later ones are
        not taken). Tokens after an end token are ignored, as vLLM's other backends do."""
        for t in tokens:
            if self.terminated:
                return True
            t = int(t)
            if not self._constraint.accept(t):
                return False
            self._accepted.append(t)
            if t in self.end_ids:
                self.terminated = True
        return True

    def validate(self, tokens: Iterable[int]) -> list[int]:
        """The longest prefix of `tokens` the grammar accepts from here (up to and including an end token),
        without moving."""
        if self.terminated:
            return []
        taken: list[int] = []
        for t in tokens:
            t = int(t)
            if not self.accept([t]):
                break
            taken.append(t)
            if self.terminated:
                break
        self.rollback(len(taken))
        return taken

    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens exactly."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(self._accepted):
            raise ValueError(f"cannot roll back {n!r} tokens (only {len(self._accepted)} accepted)")
        if n == 0:
            return
        self._constraint.rollback(n)
        del self._accepted[-n:]
        self.terminated = bool(self._accepted) and self._accepted[-1] in self.end_ids

    def fill(self, row: np.ndarray) -> None:
        """Write the allowed-token bitmask (packed int32, bit i of word i//32, 1 = allowed) into `row`."""
        if self._constraint is self._matcher:
            self._matcher.fill_next_token_bitmask(row)
            return
        row[:] = 0
        self._constraint.fill_mask(row)

    def reset(self) -> None:
        self.rollback(len(self._accepted))
