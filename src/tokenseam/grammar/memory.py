"""The memory compiled grammars hold, and the byte budget a GrammarCompiler keeps them within.

What a compiled grammar holds (estimated by `grammar_bytes`, in bytes):
- its NFA (fixed at compile time, shared by its generations, below);
- its automaton (automaton.Automaton), which grows while requests run: every state a mask walk or a commit
  reaches is built then, with its transition rows, configurations, stacks and memo entries;
- its mask cache (masks.MaskCache), which grows too: memoised masks (one bit per vocabulary token each), the
  per-local-state walks they are made from, suffix tables of tokens that run past a called rule.
The token table is the vocabulary's, shared by every grammar on it, and is not counted.

The estimate is exact for numpy arrays (their allocated size) and a per-entry constant for Python containers
(measured with tracemalloc; tests/grammar/test_memory.py keeps it within a factor of the measured size). It
reads a few dozen lengths and sizes, never the entries themselves, so it is cheap enough to take after every
step that grew something (`CompiledGrammar.settle`).

The budget (`GrammarMemory`): the grammars a compiler made that are still alive, cached or used by a request,
hold at most `budget` bytes. Past it, after a step of some request grew a grammar (or a compile added one):
1. cached grammars no live matcher uses are evicted, least recently used first (whole grammars; they are
   freed unless the caller still holds them);
2. grammars in use stop memoising masks (their masks are dropped, and each later mask is computed exactly as
   before, from the walks, without being kept: `unmemoised`);
3. grammars in use, largest first, start over: a fresh automaton and mask cache from the same NFA (a new
   generation, `CompiledGrammar.renew`). Each request on the grammar moves its position over at its next
   step (the same position, so the same masks), and the old generation is freed once they have.
A compile only does 1 (it runs in its own thread; 2 and 3 change grammars in use, which only the thread
stepping them does, at the next step of any request).
A step always completes: nothing is refused or stopped mid-request because a cap was reached (a request
whose grammar leaves more parses open than the automaton keeps moves to the GSS parser, gss.py; what that
parser holds is the request's own, bounded by gss.CANON_ENTRIES positions, and not counted here). The budget
can therefore be exceeded by what one step builds (one mask walk over the vocabulary, or one token's commit)
until the end of that step, by a compile until the next step, and by an old generation until its requests'
next steps.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .automaton import Automaton
    from .compiled import CompiledGrammar
    from .nfa import ByteNFA

DEFAULT_BUDGET_MB = 256
MB = 1 << 20

# Python's share per entry, in bytes (tuples, boxed ints, list and dict slots), measured with tracemalloc on
# JSON-schema, regex and GBNF grammars (tests/grammar/test_memory.py).
STATE_BYTES = 150  # per automaton state: state_configs/state_esc slots, state_index key and entry
CONFIG_BYTES = 85  # per (NFA state, stack) pair in a configuration tuple (states and closures)
PAIR_BYTES = 100  # per position: its tuple and pair_index entry
STACK_BYTES = 90  # per stack: its frame tuple, index entry and depth
MEMO_BYTES = 120  # per entry of the successor, escape, closure, clamp, row and stack memos
STEP_BYTES = 100  # per commit memo entry
NFA_STATE_BYTES = 110  # per NFA state: offsets lists, rows made into tuples, the per-state dicts


def nfa_bytes(nfa: ByteNFA) -> int:
    """What an NFA holds once prepared (it is only read afterwards)."""
    n = nfa.size
    arrays = nfa.edges.off.nbytes + nfa.edges.data.nbytes + nfa.eps.off.nbytes + nfa.eps.data.nbytes
    dicts = (
        len(nfa.call)
        + len(nfa.end_rule)
        + len(nfa.cpush)
        + len(nfa.cinc)
        + len(nfa.cexit)
        + len(nfa.cguard)
        + len(nfa.universal)
        + len(nfa.counted_body)
        + len(nfa.counted_budget)
        + len(nfa.rule_start)
        + 2 * len(nfa.cset)
    )
    return arrays + NFA_STATE_BYTES * n + MEMO_BYTES * dicts


def automaton_bytes(a: Automaton) -> int:
    """What an automaton holds now: its arrays, its builder's, and its Python tables and memos."""
    f = a._fast
    arrays = sum(
        x.nbytes
        for x in (
            a.trans,
            a.flags,
            a.budget,
            a.accepting,
            f.cfg,
            f.escp,
            f.soff,
            f.ht,
            f.stk,
            f.sht,
            f.qinfo,
            f.nfa_e,
            f.loc,
            f.loc_pool,
            f.mark,
        )
    )
    if a.clamped_trans is not None:
        arrays += a.clamped_trans.nbytes
    memos = (
        len(a._succ_memo)
        + len(a._escape_memo)
        + len(a._escape_py_memo)
        + len(a._local_memo)
        + len(a._clamp_memo)
        + len(a._pending)
        + len(a.closure_memo)
    )
    st = a._stacks
    return (
        arrays
        + STATE_BYTES * len(a.state_configs)
        + CONFIG_BYTES * a.config_entries
        + PAIR_BYTES * len(a.pairs)
        + STACK_BYTES * len(st.frames)
        + MEMO_BYTES * (memos + len(st._rebase_memo) + len(st._mat_memo))
        + STEP_BYTES * len(a._step_memo)
    )


class GrammarMemory:
    """The bytes held by one compiler's live grammars against its budget, and what keeping it cost.

    Every grammar the compiler makes is registered (`add`); its bytes are noted when it grows (`note`, from
    CompiledGrammar.settle) and forgotten when it is freed. `lock` and `cache` are the compiler's (cache and
    accounting change together; nothing here refers back to the compiler, so no cycle keeps it)."""

    def __init__(
        self, budget: int, lock: threading.RLock, cache: OrderedDict[tuple, CompiledGrammar]
    ) -> None:
        if budget < 0:
            raise ValueError("the grammar memory budget must be >= 0 bytes")
        self.budget = budget
        self.lock = lock
        self.cache = cache
        self._live: dict[int, weakref.ref] = {}  # id -> grammar, for every live grammar made here
        self._bytes: dict[int, int] = {}  # id -> bytes last noted
        self._freed: list[int] = []  # ids of grammars freed since the last look (weakref callbacks)
        self.held = 0
        self.evictions = 0
        self.renewals = 0
        self.unmemoised = 0
        self.gss_fallbacks = 0  # requests moved to the GSS parser (matcher.GrammarMatcher._fall_back)

    def add(self, g: CompiledGrammar) -> None:
        """Count a grammar just made, and keep the budget."""
        key = id(g)
        freed = self._freed
        with self.lock:
            self._take_freed()
            # The callback only appends (it may run inside any allocation); `_take_freed` does the rest.
            self._live[key] = weakref.ref(g, lambda _, key=key: freed.append(key))
            self._bytes[key] = 0
            g.memory = weakref.ref(self)  # weak: the cache holds the grammar, which must not hold this
            self._update(g)
            # Only evictions here: a compile runs in its own thread, and the grammars in use are changed only
            # by the thread stepping them (`note`, at their next step).
            while self.held > self.budget and self.evict_unused():
                self._take_freed()

    def evict_unused(self) -> bool:
        """Evict the least recently used cached grammar that no live matcher uses; False if there is none."""
        for key, g in self.cache.items():
            if not g.users:
                del self.cache[key]
                self.evictions += 1
                return True
        return False

    def _take_freed(self) -> None:
        while self._freed:
            key = self._freed.pop()
            ref = self._live.get(key)
            if ref is not None and ref() is None:
                del self._live[key]
                self.held -= self._bytes.pop(key)

    def note(self, g: CompiledGrammar) -> None:
        """Take in g's size and unmemoised masks now, and keep the budget (see the module docstring). Called
        by the thread that steps the requests (a grammar's mask cache is not shared between threads)."""
        with self.lock:
            self._take_freed()
            if id(g) not in self._bytes:
                return
            self._update(g)
            if self.held > self.budget:
                self._keep_budget()
            elif not g.masks.memoise and self.held <= self.budget * 3 // 4:
                g.masks.memoise = True  # room again: masks are kept from here on

    def _update(self, g: CompiledGrammar) -> None:
        key = id(g)
        now = g.nbytes()
        self.held += now - self._bytes[key]
        self._bytes[key] = now
        m = g.masks
        self.unmemoised += m.unmemoised - g.unmemoised_noted
        g.unmemoised_noted = m.unmemoised

    def _live_by_size(self) -> list[CompiledGrammar]:
        live = [g for g in (r() for r in self._live.values()) if g is not None]
        return sorted(live, key=lambda g: self._bytes[id(g)], reverse=True)

    def _keep_budget(self) -> None:
        while self.held > self.budget and self.evict_unused():
            self._take_freed()
        if self.held <= self.budget:
            return
        live = self._live_by_size()
        for g in live:
            if g.masks.memoise:
                g.masks.memoise = False
                g.masks.forget_masks()
                self._update(g)
                if self.held <= self.budget:
                    return
        for g in live:
            if not g.fresh:
                self._update(g)  # its unmemoised masks, before its mask cache goes
                g.renew()
                g.masks.memoise = False  # still over budget: the new generation starts without memo
                self.renewals += 1
                self._update(g)
                if self.held <= self.budget:
                    return

    def stats(self) -> dict[str, int]:
        """bytes held, budget_bytes, live_grammars (cached or in use), evictions, renewals, unmemoised_masks,
        gss_fallbacks."""
        with self.lock:
            self._take_freed()
            for r in list(self._live.values()):
                g = r()
                if g is not None:
                    self._update(g)  # what grew since its last step's note (memo entries alone)
            while self.held > self.budget and self.evict_unused():  # safe from any thread
                self._take_freed()
            return {
                "bytes": self.held,
                "budget_bytes": self.budget,
                "live_grammars": sum(1 for r in self._live.values() if r() is not None),
                "evictions": self.evictions,
                "renewals": self.renewals,
                "unmemoised_masks": self.unmemoised,
                "gss_fallbacks": self.gss_fallbacks,
            }

    def note_gss_fallback(self) -> None:
        with self.lock:
            self.gss_fallbacks += 1
