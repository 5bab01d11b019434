"""CompiledGrammar: what a compile hands out (the automaton, its mask cache and where it came from), shared by
requests.

Its own module so that the matcher needs nothing from the compiler.

The automaton and mask cache are a cache of the NFA's determinisation and grow as requests run. Under its
compiler's memory budget (memory.py) a grammar may be started over (`renew`): a new generation, a fresh
automaton and mask cache from the same NFA, while the matchers on the old one move their positions over at
their next step (matcher.GrammarMatcher). `settle` is what a matcher calls after each step.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .budget import compile_budget
from .masks import MaskCache
from .memory import automaton_bytes, nfa_bytes

if TYPE_CHECKING:
    from ..vocab import Vocabulary
    from .automaton import Automaton
    from .memory import GrammarMemory


@dataclass(eq=False)
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
        # (automaton, masks) of the current generation, replaced as one (a matcher reads both at once)
        self.current: tuple[Automaton, MaskCache] = (self.automaton, self.masks)
        self.generation = 0  # how many times it was started over (renew)
        # the budget it counts against (set by its compiler; weak, as the compiler's cache holds this grammar)
        self.memory: weakref.ref[GrammarMemory] | None = None
        self.users: weakref.WeakSet = weakref.WeakSet()  # live matchers: a grammar in use is never evicted
        self.fresh = True  # nothing built since it was compiled or renewed
        self.unmemoised_noted = 0  # masks.unmemoised as last taken in by the budget
        self.gss_fallbacks = (
            0  # matchers moved to the GSS parser (gss.py) because the automaton could not go on
        )
        self._nfa_bytes = nfa_bytes(self.automaton.nfa)
        self._seen: tuple = ()
        self._renew_lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        return self.automaton.table.vocab_size

    def nbytes(self) -> int:
        """The bytes this grammar holds now (estimated as memory.py describes; cheap)."""
        return self._nfa_bytes + automaton_bytes(self.automaton) + self.masks.nbytes

    def settle(self) -> None:
        """After a step on this grammar: when something grew, take its size into the budget (which may evict
        other grammars, stop memoising masks or start this one over). One tuple compare when nothing grew."""
        a, m = self.automaton, self.masks
        seen = (
            len(a.state_configs),
            len(a.pairs),
            len(a.stacks),
            a.config_entries,
            len(a._step_memo),
            len(a._escape_memo),
            m.mask_bytes,
            m.walk_bytes,
            m.unmemoised,
        )
        if seen != self._seen:
            self._seen = seen
            self.fresh = False
            memory = self.memory() if self.memory is not None else None
            if memory is not None:
                memory.note(self)

    def renew(self) -> None:
        """Start over: a fresh automaton and mask cache from the same NFA (the matchers on the old generation
        move over at their next step; the old one is freed once they have)."""
        with self._renew_lock:
            old = self.automaton
            # Unbounded: the start state was built within the compile's budget, and a request must not fail here.
            with compile_budget(math.inf, math.inf):
                auto = type(old)(old.prepared, old.table, old.python_builder)
            masks = MaskCache(auto)
            masks.memoise = self.masks.memoise
            self.current = (auto, masks)
            self.automaton, self.masks = auto, masks
            self.generation += 1
            self.fresh = True
            self.unmemoised_noted = 0
            self._seen = ()
