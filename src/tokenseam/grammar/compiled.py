"""CompiledGrammar: what a compile hands out (the automaton, its mask cache and where it came from), shared by
requests.

Its own module so that the matcher needs nothing from the compiler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .masks import MaskCache

if TYPE_CHECKING:
    from ..vocab import Vocabulary
    from .automaton import Automaton


@dataclass
class CompiledGrammar:
    """A grammar compiled for one vocabulary; share it between requests, one GrammarMatcher each."""

    kind: str
    source: str
    automaton: Automaton
    vocab: Vocabulary
    warnings: list[str] = field(default_factory=list)
    masks: MaskCache = field(init=False, repr=False)  # the masks of the automaton's positions

    def __post_init__(self) -> None:
        self.masks = MaskCache(self.automaton)

    @property
    def vocab_size(self) -> int:
        return self.automaton.table.vocab_size
