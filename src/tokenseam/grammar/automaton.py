"""The lazily determinised pushdown automaton and its per-state token masks over the vocabulary trie.

A DFA state is a set of (NFA state, call stack) configurations; rows are built on demand, and each mask is
one numba walk over the byte-sorted vocabulary that skips the subtree of every rejected prefix.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict

import numba
import numpy as np

from .budget import compile_budget, current
from .errors import GrammarError
from .localbuild import (
    BOT,
    M_STACKS,
    M_STATES,
    NEED_PYTHON,
    NO_ROOM,
    UNBOUNDED,
    UNKNOWN,
    LocalBuilder,
    build,
    cont,
    split,
    walk_esc,
)
from .nfa import ByteNFA

DEAD = -1
MAX_DFA_STATES = 2_000_000
MAX_CLOSURE = 100_000
MASK_CACHE_BYTES = 128 * 1024 * 1024
STEP_MEMO_ENTRIES = 1 << 15  # the commit memo starts over when it holds this many entries (a few MB)
NO_ESC: tuple = ()
NO_PENDING: tuple[list, list] = ([], [])  # a swept row with nothing left to build (never appended to)
# Configuration sets are sorted tuples of (NFA state, stack) int pairs, not frozensets: tuples of ints leave the
# cyclic GC's tracking, so the millions of them a long request builds do not make every full collection slow.


SKIP_DEPTHS = 4
# State flag: any string-safe text of up to budget[state] code points stays alive from here (a free string
# body, "any key but these", a maxLength string with room left). See localbuild.walk_esc and Automaton._safe_budget.
SAFE_SINK = 4


@numba.njit(cache=True)
def _safe_from(data, offs):
    """Per token: where its tail of whole JSON-string-safe characters starts (printable ASCII other than
    quote and backslash, or valid multi-byte UTF-8); the token's length when it ends otherwise."""
    n = offs.shape[0] - 1
    out = np.empty(n, np.int64)
    for i in range(n):
        start = offs[i]
        j = offs[i + 1]
        while j > start:
            b = data[j - 1]
            if b < 0x80:
                if b < 0x20 or b > 0x7E or b == 0x22 or b == 0x5C:
                    break
                j -= 1
                continue
            # A multi-byte character ends here: find its lead byte and check the whole sequence.
            k = j - 1
            while k > start and k > j - 4 and 0x80 <= data[k] <= 0xBF:
                k -= 1
            lead = data[k]
            m = j - k
            if lead >= 0xF0:
                need = 4
            elif lead >= 0xE0:
                need = 3
            else:
                need = 2
            if lead < 0xC2 or lead > 0xF4 or m != need:
                break
            second = data[k + 1]
            if lead == 0xE0 and second < 0xA0:
                break
            if lead == 0xED and second > 0x9F:
                break
            if lead == 0xF0 and second < 0x90:
                break
            if lead == 0xF4 and second > 0x8F:
                break
            j = k
        out[i] = j - start
    return out


@numba.njit(cache=True)
def _indent_runs(data, offs):
    """Per token: the length of its leading run of spaces/tabs, and of its longest such run after a newline."""
    n = offs.shape[0] - 1
    lead = np.zeros(n, np.int64)
    inner = np.zeros(n, np.int64)
    for i in range(n):
        run = 0
        after_nl = False
        first = True
        for j in range(offs[i], offs[i + 1]):
            b = data[j]
            if b == 0x20 or b == 0x09:
                run += 1
            else:
                if first:
                    lead[i] = run
                elif after_nl and run > inner[i]:
                    inner[i] = run
                first = False
                after_nl = b == 0x0A
                run = 0
        if first:
            lead[i] = run
        elif after_nl and run > inner[i]:
            inner[i] = run
    return lead, inner


@numba.njit(cache=True)
def _lcp(data, offs):
    """Common-prefix length of each byte string with the one before it (sorted strings, concatenated)."""
    n = offs.shape[0] - 1
    out = np.zeros(n, np.int64)
    for k in range(1, n):
        a = offs[k - 1]
        b = offs[k]
        m = min(offs[k] - a, offs[k + 1] - b)
        j = 0
        while j < m and data[a + j] == data[b + j]:
            j += 1
        out[k] = j
    return out


@numba.njit(cache=True)
def _code_points(data, offs):
    """Code points per (valid UTF-8) byte string: the bytes that are not continuation bytes."""
    n = offs.shape[0] - 1
    out = np.zeros(n, np.int64)
    for i in range(n):
        c = 0
        for j in range(offs[i], offs[i + 1]):
            if data[j] < 0x80 or data[j] >= 0xC0:
                c += 1
        out[i] = c
    return out


@numba.njit(cache=True)
def _gather(data, starts, lens, total):
    """The byte strings data[starts[k] : starts[k] + lens[k]], concatenated (at least one byte)."""
    out = np.zeros(max(total, 1), np.uint8)
    k = 0
    for j in range(starts.shape[0]):
        for b in range(starts[j], starts[j] + lens[j]):
            out[k] = data[b]
            k += 1
    return out


@numba.njit(cache=True)
def _skip_table(lcp, depths):
    n = lcp.shape[0]
    skip = np.empty((depths, n), np.int64)
    for k in range(depths):
        last = n
        for i in range(n - 1, -1, -1):
            skip[k, i] = last
            if lcp[i] <= k:
                last = i
    return skip


class TokenTable:
    """The vocabulary's trie flattened for the numba walk (shared by every grammar on that vocabulary)."""

    def __init__(self, vocab) -> None:
        trie = vocab.trie
        self.vocab_size = vocab.size
        self.words = vocab.mask_words
        lens = np.fromiter((len(b) for b in trie.sorted_bytes), dtype=np.int64, count=len(trie.sorted_bytes))
        self.offs = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=self.offs[1:])
        self.data = np.frombuffer(b"".join(trie.sorted_bytes), dtype=np.uint8).copy()
        self.lcp = trie.lcp.astype(np.int64)
        self.skip = _skip_table(self.lcp, SKIP_DEPTHS)
        self.ids = trie.sorted_ids.astype(np.int64)
        self.safe_from = _safe_from(self.data, self.offs)
        # Per token, its code points when it is made only of string-safe characters (see `bulk`).
        self.safe_cps = np.where(self.safe_from == 0, _code_points(self.data, self.offs), -1)
        self.max_safe_cps = int(self.safe_cps.max()) if len(self.ids) else 0
        self._bulk: dict[int, tuple[np.ndarray, SubTable] | None] = {}
        self._bulk_levels = [self.max_safe_cps] + [x for x in (48, 32, 24, 16, 12, 8) if x < self.max_safe_cps]
        self._bulk_lock = threading.Lock()
        self.maxlen = int(lens.max()) if len(lens) else 1
        self.eos = np.asarray(sorted(vocab.eos_token_ids), dtype=np.int64)
        self.is_special = np.asarray(vocab.is_special, dtype=bool)
        self.token_bytes = vocab.token_bytes
        self.base = np.zeros(len(self.ids), dtype=np.int64)
        self._indent_runs: tuple[np.ndarray, np.ndarray] | None = None
        self._indent_filters: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._indent_lock = threading.Lock()  # grammars for one vocabulary compile in several threads

    def bulk(self, budget: int) -> tuple[np.ndarray, SubTable] | None:
        """For a state where any string-safe text of up to `budget` code points stays alive: (packed mask of the
        string-safe tokens that short, which it takes without a walk; the table of all other tokens, to walk).
        None when the walk would not be much smaller than the vocabulary's."""
        # A few budget levels (walking a token that could have been taken is only slower), so few tables.
        level = next((x for x in self._bulk_levels if x <= budget), None)
        if level is None:
            return None
        with self._bulk_lock:
            hit = self._bulk.get(level, 0)
            if hit == 0:
                take = (self.safe_cps >= 0) & (self.safe_cps <= level)
                rest = np.flatnonzero(~take)
                hit = None
                if len(rest) <= len(self.ids) // 8:
                    row = np.zeros(self.words * 32, dtype=bool)
                    row[self.ids[take]] = True
                    hit = (np.packbits(row, bitorder="little").view(np.uint32), SubTable.rows(self, rest))
                self._bulk[level] = hit
            return hit

    def indent_filters(self, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Packed masks of the tokens that keep every run of spaces/tabs after a raw newline within `limit`:
        (outside such a run; inside one with b more characters allowed, b = 0 .. longest leading run, one row
        each). Rows only depend on `limit` up to the longest run inside any token, and few limits are kept, so
        memory stays small whatever limits grammars ask for."""
        with self._indent_lock:
            return self._indent_filters_locked(limit)

    def _indent_filters_locked(self, limit: int) -> tuple[np.ndarray, np.ndarray]:
        if self._indent_runs is None:
            lead_s, inner_s = _indent_runs(self.data, self.offs)
            lead = np.zeros(self.vocab_size, dtype=np.int64)
            inner = np.zeros(self.vocab_size, dtype=np.int64)
            lead[self.ids] = lead_s
            inner[self.ids] = inner_s
            self._indent_runs = (lead, inner)
        lead, inner = self._indent_runs
        cap = min(limit, int(inner.max()))
        f = self._indent_filters.get(cap)
        if f is not None:
            return f
        pad = np.zeros(self.words * 32 - self.vocab_size, dtype=bool)

        def pack(row: np.ndarray) -> np.ndarray:
            return np.packbits(np.concatenate([row, pad]), bitorder="little").view(np.uint32)

        outside = inner <= cap
        f = (pack(outside), np.stack([pack(outside & (lead <= b)) for b in range(int(lead.max()) + 1)]))
        if len(self._indent_filters) >= 8:
            self._indent_filters.pop(next(iter(self._indent_filters)))
        self._indent_filters[cap] = f
        return f


class SubTable:
    """Entries of a token table from some depth on, for walks that resume mid-token (tokens escaping a local
    state), or a subset of whole tokens walked like the vocabulary (`rows`)."""

    ids: np.ndarray
    base: np.ndarray  # where each entry starts inside its token
    offs: np.ndarray
    data: np.ndarray
    lcp: np.ndarray
    skip: np.ndarray
    safe_from: np.ndarray
    empty: tuple[np.ndarray, np.ndarray]  # entries with no bytes left: taken whenever the state is alive

    @classmethod
    def suffixes(cls, tab, idx: np.ndarray, depth: np.ndarray) -> SubTable:
        """The suffixes from `depth` on of the entries at positions `idx` of table `tab`, in that order: a walk
        needs no sorted order to be exact, and `idx` ascending keeps the entries that share a path together."""
        self = cls.__new__(cls)
        (self.ids, self.base, self.offs, self.data, self.lcp, self.skip, self.safe_from, words,
         bits) = _suffix_arrays(tab.ids, tab.base, tab.offs, tab.data, idx, depth)
        # suffix walks take every byte (safe_from = length): mid-token, no safe sink is known for the rest
        self.empty = (words, bits)
        return self

    @classmethod
    def rows(cls, table: TokenTable, idx: np.ndarray) -> SubTable:
        """Whole tokens at sorted positions `idx` (ascending) of `table`, walked like the vocabulary."""
        self = cls.suffixes(table, idx, np.zeros(len(idx), dtype=np.int64))
        self.safe_from = table.safe_from[idx]
        return self


@numba.njit(cache=True)
def _suffix_arrays(ids, base, offs, data, idx, depth):
    """SubTable.suffixes' arrays: ids, base, offs, data, lcp, skip, lengths, and the (word index, bits) of the
    entries with no bytes left, each word once."""
    n = idx.shape[0]
    s_ids = ids[idx]
    s_base = base[idx] + depth
    starts = offs[idx] + depth
    lens = offs[idx + 1] - starts
    s_offs = np.zeros(n + 1, np.int64)
    for k in range(n):
        s_offs[k + 1] = s_offs[k] + lens[k]
    s_data = _gather(data, starts, lens, s_offs[n])
    lcp = _lcp(s_data, s_offs)
    skip = _skip_table(lcp, SKIP_DEPTHS)
    m = 0
    for k in range(n):
        if lens[k] == 0:
            m += 1
    empty = np.empty(m, np.int64)
    m = 0
    for k in range(n):
        if lens[k] == 0:
            empty[m] = s_ids[k]
            m += 1
    empty.sort()
    words = np.empty(m, np.int64)
    bits = np.zeros(m, np.uint32)
    u = 0
    for k in range(m):
        w = empty[k] >> 5
        if u == 0 or words[u - 1] != w:
            words[u] = w
            u += 1
        bits[u - 1] |= np.uint32(1) << np.uint32(empty[k] & 31)
    return s_ids, s_base, s_offs, s_data, lcp, skip, lens, words[:u], bits[:u]


def _on_cycle(succ: list[list[int]]) -> list[bool]:
    """For each node of the graph (node -> successors), whether it lies on a cycle (Tarjan's strongly
    connected components, iterative)."""
    n = len(succ)
    index = [-1] * n
    low = [0] * n
    on = [False] * n
    out = [False] * n
    stack: list[int] = []
    counter = 0
    b = current()
    for root in range(n):
        if index[root] >= 0:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on[root] = True
        work = [(root, iter(succ[root]))]
        while work:
            v, it = work[-1]
            b.tick()
            advanced = False
            for w in it:
                if index[w] < 0:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on[w] = True
                    work.append((w, iter(succ[w])))
                    advanced = True
                    break
                if on[w]:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on[w] = False
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in succ[v]:
                    for w in comp:
                        out[w] = True
    return out


class Automaton:
    """Lazy DFA over (NFA state, stack) configuration sets, with an LRU of packed token masks."""

    def __init__(self, nfa: ByteNFA, table: TokenTable) -> None:
        # The eager part (checks, trimming, the start state) runs inside the compile's budget; states built
        # later, as requests reach them, have their own limits (MAX_DFA_STATES, MAX_CLOSURE).
        with compile_budget() as b:
            stage, b.stage = b.stage, "preparing the automaton"
            try:
                self._init(nfa, table)
            finally:
                b.stage = stage

    def _init(self, nfa: ByteNFA, table: TokenTable) -> None:
        self.nfa = nfa
        self.table = table
        self._prepare()
        self.stacks: list[tuple[int, int, int]] = [(-1, -1, 0), (-3, -3, 0)]
        self.stack_index: dict[tuple[int, int, int], int] = {}
        self.has_counters = bool(nfa.loops)
        maxlen = table.maxlen
        self._loop_reach = [1 + (maxlen - 1) // nfa.loop_step.get(lid, 1) for lid in range(len(nfa.loops))]
        self.canon: dict[int, int] = {}
        self.closure_memo: dict[tuple[int, int], tuple[tuple, bool, tuple]] = {}
        self._closing: set[tuple[int, int]] = set()
        self.state_index: dict[tuple[tuple, bool, tuple], int] = {}
        self.state_configs: list[tuple] = []
        self.state_esc: list[tuple] = []
        self._numba_states = False  # whether the walk has made states (see _sync)
        cap = 256
        self.flags = np.zeros(cap, dtype=np.int8)
        self.budget = np.zeros(cap, dtype=np.int32)
        self.trans = np.full((cap, self.n_classes), UNKNOWN, dtype=np.int32)
        # Mask walks read `ctrans`: the same rows with every successor replaced by its canonical state (counters
        # far from their bounds clamped). A token never moves a counter far enough for the difference to
        # matter, and a clamped counted loop (a long maxLength string body) becomes a state that string-safe
        # characters loop on, so the walk takes such tokens whole instead of building a state per count.
        self.ctrans = np.full((cap, self.n_classes), UNKNOWN, dtype=np.int32) if self.has_counters else None
        self.accepting = np.zeros(cap, dtype=bool)
        self.masks: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self.mask_bytes = 0
        self.depth: list[int] = [0, 0]
        # A position is a pair (local state K, parent stack P): K holds every configuration with its frames
        # above P rebased onto BOT, so K (and its masks) is shared by every place the same shape recurs.
        # With an indentation limit (Grammar.indent_limit), a position also records how long the current run
        # of spaces/tabs after a raw newline is (-1: not in one); masks are filtered by it.
        self.indent_limit = nfa.indent_limit
        self._indent_rows = table.indent_filters(self.indent_limit) if self.indent_limit is not None else None
        self.pairs: list[tuple[int, int, bool, int]] = []
        self.pair_index: dict[tuple[int, int, bool, int], int] = {}
        self._rebase_memo: dict[tuple[int, int], int] = {}
        self._split_memo: dict[tuple[int, int], list[tuple] | None] = {}
        self._split_out = np.empty((64, 2), dtype=np.int64)
        self._escape_memo: dict[tuple[int, int, bool], tuple[int, int, bool]] = {}
        self._cont_out = np.empty(3, dtype=np.int64)
        self._mat_memo: dict[tuple[int, int], int] = {}
        self._cont_memo: dict[tuple[int, int], tuple[tuple, bool, int]] = {}
        # (position, bytes) -> position after them: requests revisit positions (every item of an array, every
        # request of a schema), and a commit is then one lookup instead of a run over the bytes.
        self._step_memo: dict[tuple[int, bytes], int] = {}
        self._local_info: dict[int, tuple[np.ndarray, list[tuple[int, int]]]] = {}
        self._suffix_info: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]] = {}
        self._groups_tab: list[SubTable] = []
        self._special = set().union(nfa.call, nfa.end_rule, nfa.cpush, nfa.cinc, nfa.cexit, nfa.cguard)
        # Successors built inside the walk (localbuild).
        current().spend(nfa.size)  # its arrays: about 60 bytes per NFA state
        self._fast = LocalBuilder(nfa, self.byte_class, self._special, MAX_DFA_STATES, self._loop_reach)
        for sid, (ret, parent, value) in enumerate(self.stacks):
            self._fast.add_stack(sid, ret, parent, value)
        configs, acc, _ = self.closure(nfa.rule_start[0], 0)
        self.start = self._pair(configs, acc)

    @property
    def num_states(self) -> int:
        """Automaton states built so far (they grow as requests reach new parts of the grammar)."""
        return len(self.state_configs)

    # -- preparation -------------------------------------------------------------------------------------
    def _prepare(self) -> None:
        nfa = self.nfa
        self._check_left_recursion()
        if nfa.may_dead_end:
            self._trim()
        # Every edge as (first byte, last byte, target) rows, flat from here on: byte classes come from their
        # bounds, and the walk's state builder (localbuild) reads the same arrays.
        nfa.freeze_rows()
        rows = nfa.edges.data
        pts = np.unique(np.concatenate(([0, 256], rows[:, 0], rows[:, 1] + 1)))
        self.byte_class = (np.searchsorted(pts, np.arange(256), side="right") - 1).astype(np.int32)
        self._cls_of = self.byte_class.tolist()
        self.n_classes = len(pts) - 1
        self.class_start = pts[:-1].tolist()
        self._local_memo: dict[int, tuple[int, ...] | None] = {}
        self._succ_memo: dict[tuple, int] = {}
        self._pending: dict[int, tuple[list, list]] = {}

    def _nullable_rules(self) -> set[int]:
        """The rules that can finish without reading a byte (least fixed point). After a first look at every
        rule, a rule is looked at again only when a rule it calls on its way has been found nullable:
        sweeping every rule until nothing changed cost one sweep per link of a chain of such rules."""
        nfa = self.nfa
        nullable: set[int] = set()
        callers: dict[int, set[int]] = {}
        todo = list(range(len(nfa.rule_start)))
        while todo:
            found = []
            for r in todo:
                if r in nullable:
                    continue
                calls: list[int] = []
                if nfa.rule_end[r] in self._eps_reach(nfa.rule_start[r], nullable, calls):
                    nullable.add(r)
                    found.append(r)
                else:
                    for c in calls:
                        callers.setdefault(c, set()).add(r)
            todo = sorted({y for x in found for y in callers.get(x, ()) if y not in nullable})
        return nullable

    def _eps_reach(self, s: int, nullable: set[int], calls: list | None) -> set[int]:
        nfa = self.nfa
        seen = {s}
        stack = [s]
        while stack:
            q = stack.pop()
            nxt = list(nfa.eps[q])
            for d in (nfa.cpush, nfa.cinc, nfa.cexit, nfa.cguard):
                if q in d:
                    nxt.append(d[q][0])
            if q in nfa.call:
                r, ret = nfa.call[q]
                if calls is not None:
                    calls.append(r)
                if r in nullable:
                    nxt.append(ret)
            for t in nxt:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        current().tick(len(seen))
        return seen

    def _check_left_recursion(self) -> None:
        nfa = self.nfa
        if not nfa.call:
            return
        nullable = self._nullable_rules()
        first: list[list[int]] = []
        for r in range(len(nfa.rule_start)):
            calls: list[int] = []
            self._eps_reach(nfa.rule_start[r], nullable, calls)
            first.append(sorted(set(calls)))
        # A rule is left-recursive when it lies on a cycle of "calls at its start". The first such rule (by
        # index) is named, as a search from every rule in turn named it, but in time linear in the calls.
        for r, cyclic in enumerate(_on_cycle(first)):
            if cyclic:
                raise GrammarError(f"rule {nfa.rule_names[r]!r} is left-recursive (it can call itself "
                                   "without consuming input); rewrite it with repetition")

    def _trim(self) -> None:
        """Remove NFA states that cannot complete their rule, so every allowed token keeps a way to finish."""
        nfa = self.nfa
        n = nfa.size
        current().spend(2 * n)  # the reversed rows, and three passes over the states
        rev: list[list[int]] = [[] for _ in range(n)]
        for q in range(n):
            for _, _, t in nfa.edges[q]:
                rev[t].append(q)
            for t in nfa.eps[q]:
                rev[t].append(q)
        for d in (nfa.cpush, nfa.cinc, nfa.cexit, nfa.cguard):
            for q, (t, _) in d.items():
                rev[t].append(q)
        sites_by_ret: dict[int, list[tuple[int, int]]] = {}
        sites_by_rule: dict[int, list[tuple[int, int]]] = {}
        for q, (r, ret) in nfa.call.items():
            sites_by_ret.setdefault(ret, []).append((q, r))
            sites_by_rule.setdefault(r, []).append((q, ret))
        start_rule = {s: r for r, s in enumerate(nfa.rule_start)}
        rule_ok = [False] * len(nfa.rule_start)
        live = [False] * n
        stack = list(nfa.rule_end)
        for e in stack:
            live[e] = True
        # One backward search; a call edge opens once both its return state is live and its rule can finish.
        while stack:
            t = stack.pop()
            preds = rev[t]
            r0 = start_rule.get(t)
            if r0 is not None and not rule_ok[r0]:
                rule_ok[r0] = True
                preds = preds + [q for q, ret in sites_by_rule.get(r0, ()) if live[ret]]
            for q, r in sites_by_ret.get(t, ()):
                if rule_ok[r]:
                    preds = preds + [q]
            for q in preds:
                if not live[q]:
                    live[q] = True
                    stack.append(q)
        if not rule_ok[0]:
            raise GrammarError("the grammar accepts no string at all")
        for q in range(n):
            if live[q]:
                if nfa.edges[q]:
                    nfa.edges[q] = [e for e in nfa.edges[q] if live[e[2]]]
                if nfa.eps[q]:
                    nfa.eps[q] = [t for t in nfa.eps[q] if live[t]]
                if q in nfa.call and not (rule_ok[nfa.call[q][0]] and live[nfa.call[q][1]]):
                    del nfa.call[q]
            else:
                nfa.edges[q] = []
                nfa.eps[q] = []
                nfa.call.pop(q, None)
        for d in (nfa.cpush, nfa.cinc, nfa.cexit, nfa.cguard):
            for q in [q for q, (t, _) in d.items() if not (live[q] and live[t])]:
                del d[q]
        # A live universal state keeps its paths: they lead to where it finishes, which is live with it.
        nfa.universal = {q for q in nfa.universal if live[q]}
        nfa.may_dead_end = False

    # -- configurations ----------------------------------------------------------------------------------
    def _push(self, ret: int, parent: int, value: int = 0) -> int:
        key = (ret, parent, value)
        sid = self.stack_index.get(key)
        if sid is None:
            sid = len(self.stacks)
            self.stacks.append(key)
            self.stack_index[key] = sid
            self.depth.append(self.depth[parent] + 1)
            self._fast.add_stack(sid, ret, parent, value)
        return sid

    def _local(self, q0: int) -> tuple[int, ...] | None:
        """The epsilon closure of q0 when it touches no stack operation (same for every stack), else None."""
        hit = self._local_memo.get(q0, 0)
        if hit != 0:
            return hit
        nfa = self.nfa
        special = self._special  # NFA states with a stack operation
        eps = nfa.eps
        seen = {q0}
        stack = [q0]
        res: tuple[int, ...] | None = None
        ok = True
        while stack:
            q = stack.pop()
            if q in special:
                ok = False
                break
            for t in eps[q]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
            if len(seen) > 256:
                ok = False
                break
        if ok:
            edges = nfa.edges
            res = tuple(sorted(q for q in seen if edges[q]))  # sorted: closure() pairs them without sorting
        self._local_memo[q0] = res
        return res

    def closure(self, q0: int, st0: int) -> tuple[tuple, bool, tuple]:
        """(configs with byte edges, root end reached, escapes): an escape is an NFA state that needs the
        frame under the local bottom BOT (a rule end or a counter operation there)."""
        key = (q0, st0)
        hit = self.closure_memo.get(key)
        if hit is not None:
            return hit
        local = self._local(q0)
        if local is not None:
            res = (tuple([(q, st0) for q in local]), False, NO_ESC)
            self.closure_memo[key] = res
            return res
        nfa = self.nfa
        out = set()
        esc = set()
        acc = False
        seen = {key}
        stack = [key]
        pops: list[tuple[int, int]] = []
        self._closing.add(key)
        try:
            return self._closure_loop(key, nfa, out, esc, acc, seen, stack, pops)
        finally:
            self._closing.discard(key)

    def _closure_loop(self, key, nfa, out, esc, acc, seen, stack, pops):
        steps = 0
        while stack:
            steps += 1
            if not steps & 4095:
                current().tick(4096)  # a compile's start state can take MAX_CLOSURE steps
            q, st = stack.pop()
            nxt = [(t, st) for t in nfa.eps[q]]
            c = nfa.call.get(q)
            if c is not None:
                nxt.append((nfa.rule_start[c[0]], self._push(c[1], st)))
            if self.has_counters:
                cp = nfa.cpush.get(q)
                if cp is not None:
                    nxt.append((cp[0], self._push(-1 - cp[1], st, 0)))
                if st == BOT:
                    if q in nfa.cinc or q in nfa.cguard or q in nfa.cexit:
                        esc.add(q)
                else:
                    ci = nfa.cinc.get(q)
                    if ci is not None:
                        _, parent, v = self.stacks[st]
                        lo, hi = nfa.loops[ci[1]]
                        v += 1
                        if hi is None:
                            v = min(v, lo)
                        if hi is None or v <= hi:
                            nxt.append((ci[0], self._push(-1 - ci[1], parent, v)))
                    cg = nfa.cguard.get(q)
                    if cg is not None:
                        hi = nfa.loops[cg[1]][1]
                        if hi is None or self.stacks[st][2] < hi:
                            nxt.append((cg[0], st))
                    ce = nfa.cexit.get(q)
                    if ce is not None:
                        _, parent, v = self.stacks[st]
                        if v >= nfa.loops[ce[1]][0]:
                            pops.append((ce[0], parent))
            r = nfa.end_rule.get(q)
            if r is not None:
                if st == 0:
                    if r == 0:
                        acc = True
                elif st == BOT:
                    esc.add(q)
                else:
                    ret, parent, _ = self.stacks[st]
                    pops.append((ret, parent))
            if pops:
                # What follows a pop is the same for every frame that was on top (e.g. each counter value of
                # a whitespace run): take it from the memo instead of exploring it again.
                for k in pops:
                    if k in seen:
                        continue
                    seen.add(k)
                    if k in self._closing:
                        stack.append(k)
                        continue
                    cs, a, e = self.closure(*k)
                    out.update(cs)
                    acc = acc or a
                    if e:
                        esc.update(e)
                pops.clear()
            if nfa.edges[q]:
                out.add((q, st))
            for k in nxt:
                if k not in seen:
                    seen.add(k)
                    stack.append(k)
            if len(seen) > MAX_CLOSURE:
                raise GrammarError("grammar is too ambiguous (configuration explosion)")
        res = (tuple(sorted(out)), acc, tuple(sorted(esc)) if esc else NO_ESC)
        self.closure_memo[key] = res
        return res

    def _state(self, configs: tuple, acc: bool, esc: tuple = NO_ESC) -> int:
        key = (configs, acc, esc)
        sid = self.state_index.get(key)
        if sid is not None:
            return sid
        if self._numba_states:
            sid = self._fast.find(configs, acc, esc, self.accepting)
            if sid >= 0:
                self.state_index[key] = sid
                return sid
        sid = len(self.state_configs)
        if sid >= MAX_DFA_STATES:
            raise GrammarError("grammar automaton exceeded its state budget")
        if sid >= self.trans.shape[0]:
            self._grow(self.trans.shape[0] * 2)
        self.state_index[key] = sid
        self.state_configs.append(configs)
        self.state_esc.append(esc)
        self.accepting[sid] = acc
        room = self._safe_budget(configs)
        self.flags[sid] = (1 if configs or acc else 0) | (2 if esc else 0) | (SAFE_SINK if room > 0 else 0)
        self.budget[sid] = max(room, 0)
        self._fast.add(sid, configs, esc)
        return sid

    def _grow(self, cap: int) -> None:
        """Room for `cap` states in the per-state arrays."""
        n = self.trans.shape[0]
        grown = np.full((cap, self.n_classes), UNKNOWN, dtype=np.int32)
        grown[:n] = self.trans
        self.trans = grown
        if self.ctrans is not None:
            grown = np.full((cap, self.n_classes), UNKNOWN, dtype=np.int32)
            grown[:n] = self.ctrans
            self.ctrans = grown
        for name in ("accepting", "flags", "budget"):
            old = getattr(self, name)
            grown = np.zeros(cap, dtype=old.dtype)
            grown[:n] = old
            setattr(self, name, grown)
        self._fast.grow_states(cap)

    def _sync(self, canonical: bool = True) -> None:
        """Take in the stacks and states the numba builder made (localbuild.build): canonical ones for a walk,
        real ones for a commit. A state's configurations are read from the numba side when first needed
        (`_configs`); until then `_state` finds it there."""
        fast = self._fast
        if fast.meta[M_STATES] <= len(self.state_configs) and fast.meta[M_STACKS] <= len(self.stacks):
            return
        stk = fast.stk
        for sid in range(len(self.stacks), int(fast.meta[M_STACKS])):
            key = ret, parent, value = tuple(stk[sid].tolist())
            self.stacks.append(key)
            self.stack_index[key] = sid
            self.depth.append(self.depth[parent] + 1)
        n0 = len(self.state_configs)
        k = int(fast.meta[M_STATES]) - n0
        if k > 0:
            if self.has_counters and canonical:  # made canonical by the walk's builder (localbuild)
                self.canon.update((sid, sid) for sid in range(n0, n0 + k))
            self.state_configs.extend([None] * k)
            self.state_esc.extend([None] * k)
            self._numba_states = True

    def _configs(self, sid: int) -> tuple:
        """State sid's configurations."""
        c = self.state_configs[sid]
        if c is None:
            c, e = self._fast.state(sid)
            self.state_configs[sid] = c
            self.state_esc[sid] = e
            self.state_index[(c, bool(self.accepting[sid]), e)] = sid
        return c

    def _escapes(self, sid: int) -> tuple:
        """State sid's escapes (NFA states needing the frames under the local bottom)."""
        e = self.state_esc[sid]
        if e is None:
            self._configs(sid)
            e = self.state_esc[sid]
        return e

    def _successor(self, moves: tuple) -> int:
        configs: set = set()
        esc: set = set()
        acc = False
        for t, st in moves:
            cs, a, e = self.closure(t, st)
            configs.update(cs)
            acc = acc or a
            if e:
                esc.update(e)
        if not configs and not acc and not esc:
            return DEAD
        return self._state(tuple(sorted(configs)), acc, tuple(sorted(esc)) if esc else NO_ESC)

    def _sweep(self, sid: int) -> tuple[list, list]:
        """Split the byte range by state sid's configuration edges: runs of bytes that every edge treats alike
        share one successor. Dead runs and successors already known are written to the row now; the others
        wait until a byte needs them, as (first classes, [(first class, last class, moves)]) in class order."""
        edges = self.nfa.edges
        configs = self._configs(sid)
        cls_of = self._cls_of
        row = self.trans[sid]
        row[:] = DEAD
        memo = self._succ_memo
        if len(configs) == 1 and len(edges[configs[0][0]]) == 1:
            # Most states have a single configuration with a single byte range: one run, nothing to sort.
            q, st = configs[0]
            lo, hi, t = edges[q][0]
            c0, c1 = cls_of[lo], cls_of[hi] + 1
            key = ((t, st),)
            nxt = memo.get(key)
            if nxt is not None:
                row[c0:c1] = nxt
                return NO_PENDING
            row[c0:c1] = UNKNOWN
            return [c0], [(c0, c1 - 1, key)]
        by_range: dict[tuple[int, int], list] = {}
        for q, st in configs:
            for lo, hi, t in edges[q]:
                r = (lo, hi)
                m = by_range.get(r)
                if m is None:
                    by_range[r] = [(t, st)]
                else:
                    m.append((t, st))
        starts: list[int] = []
        segs: list[tuple] = []

        def run(c0: int, c1: int, key: tuple) -> None:
            """Classes c0 .. c1 - 1 move by `key`: their successor if known, else a pending run."""
            nxt = memo.get(key)
            if nxt is None:
                row[c0:c1] = UNKNOWN
                starts.append(c0)
                segs.append((c0, c1 - 1, key))
            else:
                row[c0:c1] = nxt

        ranges = sorted(by_range)
        if all(ranges[k][1] < ranges[k + 1][0] for k in range(len(ranges) - 1)):
            # The usual case: edges on the same bytes or on disjoint bytes, so each range is one run.
            for r in ranges:
                moves = by_range[r]
                run(cls_of[r[0]], cls_of[r[1]] + 1, tuple(sorted(set(moves))) if len(moves) > 1 else tuple(moves))
            return starts, segs
        events = []
        for (lo, hi), moves in by_range.items():
            for t, st in moves:
                events.append((lo, 1, t, st))
                events.append((hi + 1, -1, t, st))
        events.sort()
        active: dict[tuple[int, int], int] = {}
        i = 0
        n = len(events)
        while i < n:
            b = events[i][0]
            while i < n and events[i][0] == b:
                _, d, t, st = events[i]
                k = (t, st)
                c = active.get(k, 0) + d
                if c:
                    active[k] = c
                else:
                    del active[k]
                i += 1
            if b > 255 or not active:
                continue
            run(cls_of[b], cls_of[(events[i][0] if i < n else 256) - 1] + 1, tuple(sorted(active)))
        return starts, segs

    def fill(self, sid: int, c: int) -> None:
        """Build the successor of state sid on byte class c (and on the run of classes moving alike)."""
        pending = self._pending.get(sid)
        if pending is None:
            pending = self._pending[sid] = self._sweep(sid)
            if self.ctrans is not None:
                row = self.trans[sid].copy()  # canonical() may grow (reallocate) the tables
                crow = row.copy()
                for v in set(row[row >= 0].tolist()):
                    cv = self.canonical(v)
                    if cv != v:
                        crow[row == v] = cv
                self.ctrans[sid] = crow
        starts, segs = pending
        k = bisect.bisect_right(starts, c) - 1
        if k < 0:
            return
        c0, c1, key = segs[k]
        if c > c1 or self.trans[sid, c] != UNKNOWN:
            return
        nxt = self._succ_memo.get(key)
        if nxt is None:
            nxt = self._succ_memo[key] = self._successor(key)
        self.trans[sid, c0:c1 + 1] = nxt
        if self.ctrans is not None:
            cn = self.canonical(nxt) if nxt >= 0 else nxt
            self.ctrans[sid, c0:c1 + 1] = cn

    @property
    def _walk_trans(self) -> np.ndarray:
        return self.trans if self.ctrans is None else self.ctrans

    def expand(self, sid: int) -> None:
        """Build state sid's whole transition row."""
        for c in range(self.n_classes):
            if self.trans[sid, c] == UNKNOWN:
                self.fill(sid, c)

    def step(self, sid: int, byte: int) -> int:
        c = self._cls_of[byte]
        v = self.trans[sid, c]
        if v == UNKNOWN:
            v = self._build(sid, c)
            if v == UNKNOWN:
                self.fill(sid, c)
                v = self.trans[sid, c]
        return int(v)

    def _build(self, sid: int, c: int) -> int:
        """The real successor of sid on class c built by the walk's builder (localbuild.build, counters not
        clamped); UNKNOWN when it must be built in Python."""
        return int(self._fast_call(build, sid, c, False, canonical=False))

    def _fast_call(self, fn, *head, canonical: bool = True):
        """fn(*head, trans, flags, budget, accepting, builder arrays...), one of localbuild's state builders, with
        Python's new states and stacks indexed first, what it made taken in after (canonical states, unless
        told), and arrays grown until it has room."""
        fast = self._fast
        while True:
            fast.index(self)
            r = fn(*head, self.trans, self.flags, self.budget, self.accepting, *fast.arrays())
            self._sync(canonical)
            if r != NO_ROOM:
                return r
            fast.grow(self)

    def canonical(self, sid: int) -> int:
        """A state with the same token mask: counters far from their bounds are clamped to one value.

        A loop body takes at least m >= 1 bytes (ByteNFA.loop_step), so a token of L <= maxlen bytes moves
        its counter by at most T = 1 + (maxlen - 1) // m: the first pass may need one byte to finish, each
        later one m. Values more than T below the minimum, or at/above the minimum and more than T below
        the maximum, therefore behave alike for one token."""
        if not self.has_counters:
            return sid
        hit = self.canon.get(sid)
        if hit is not None:
            return hit
        memo: dict[int, int] = {0: 0, BOT: BOT}
        configs = tuple(sorted({(q, self._canon_stack(st, memo)) for q, st in self._configs(sid)}))
        c = self._state(configs, bool(self.accepting[sid]), self._escapes(sid))
        self.canon[sid] = c
        return c

    def _canon_stack(self, st: int, memo: dict[int, int]) -> int:
        """Stack st with every counter frame's value clamped as `canonical` describes."""
        hit = memo.get(st)
        if hit is not None:
            return hit
        ret, parent, v0 = self.stacks[st]
        p2 = self._canon_stack(parent, memo)
        v = v0
        if ret < 0:
            lid = -1 - ret
            lo, hi = self.nfa.loops[lid]
            T = self._loop_reach[lid]
            if hi is not None:
                hi -= self.nfa.loop_slack.get(lid, 0)  # guards bounded below hi (a counted Auto)
            if v < lo:
                if lo - v > T:
                    v = lo - T - 1
            elif hi is None or hi - v > T:
                v = lo if hi is None or hi - lo > T else v
        res = self._push(ret, p2, v) if (p2, v) != (parent, v0) else st
        memo[st] = res
        return res

    # -- positions (local state, parent stack) -------------------------------------------------------------
    def _common(self, sts) -> int:
        """The deepest stack that every stack in `sts` has below (or at) its top."""
        cur = set(sts)
        if len(cur) == 1:
            return next(iter(cur))
        stacks, depth = self.stacks, self.depth
        d = min(depth[s] for s in cur)
        # Each stack is walked down to depth d only as far as a frame an earlier walk passed (its frame at
        # depth d is then known): every frame is passed once, where walking each stack to the end cost
        # depth x stacks (10,000 nested calls of a rule chain: 50 million steps).
        below: dict[int, int] = {}
        level = set()
        for s in cur:
            path = []
            while depth[s] > d and s not in below:
                path.append(s)
                s = stacks[s][1]
            s = below.get(s, s)
            for x in path:
                below[x] = s
            level.add(s)
        current().tick(len(below) + len(level))
        while len(level) > 1:
            level = {stacks[s][1] for s in level}
        return next(iter(level))

    def _cut(self, p: int) -> int:
        """Counter frames on top of the common stack go into the local part (their values change with every
        loop pass); a call frame stays below, so a called rule's states are shared by all its callers."""
        stacks = self.stacks
        while p != 0 and stacks[p][0] < 0:
            p = stacks[p][1]
        return p

    def _rebase(self, st: int, p: int) -> int:
        if st == p:
            return BOT
        key = (st, p)
        hit = self._rebase_memo.get(key)
        if hit is None:
            ret, parent, v = self.stacks[st]
            hit = self._rebase_memo[key] = self._push(ret, self._rebase(parent, p), v)
        return hit

    def _materialize(self, lst: int, p: int) -> int:
        if lst == BOT:
            return p
        key = (lst, p)
        hit = self._mat_memo.get(key)
        if hit is None:
            ret, parent, v = self.stacks[lst]
            hit = self._mat_memo[key] = self._push(ret, self._materialize(parent, p), v)
        return hit

    def _pair(self, configs, acc: bool, run: int = -1) -> int:
        """The position for a set of real (NFA state, stack) configurations (and indentation run)."""
        if not configs:
            key = (-1, 0, bool(acc), run)
        else:
            p = self._cut(self._common({st for _, st in configs}))
            local = tuple(sorted({(q, self._rebase(st, p)) for q, st in configs}))
            key = (self._state(local, False, NO_ESC), p, bool(acc), run)
        pid = self.pair_index.get(key)
        if pid is None:
            pid = len(self.pairs)
            self.pairs.append(key)
            self.pair_index[key] = pid
        return pid

    def _cont(self, s: int, p: int) -> tuple[tuple, bool, int]:
        """Where local state s's escapes lead on the real parent stack p: (configs, accepting, position). The
        reference for localbuild.cont (`_escape_to`), which builds the same in numba."""
        key = (s, p)
        hit = self._cont_memo.get(key)
        if hit is None:
            configs: set = set()
            acc = False
            for q in self._escapes(s):
                cs, a, _ = self.closure(q, p)
                configs.update(cs)
                acc = acc or a
            hit = self._cont_memo[key] = (tuple(sorted(configs)), acc, self._pair(configs, acc))
        return hit

    def _run(self, k: int, p: int, data: bytes) -> tuple[set, bool]:
        """Real configurations (and acceptance) after `data` from position (k, p)."""
        res: set = set()
        acc = False
        s = k
        flags = self.flags
        for i, b in enumerate(data):
            if flags[s] & 2:
                k2, p2, _ = self._escape_to(s, p, False)
                if k2 >= 0:
                    c2, a2 = self._run(k2, p2, data[i:])
                    res |= c2
                    acc = acc or a2
            s = self.step(s, b)
            if s < 0:
                return res, acc
            flags = self.flags
        if flags[s] & 2:
            k2, p2, a = self._escape_to(s, p, False)
            if k2 >= 0:
                res |= self._real_configs(k2, p2)
            acc = acc or a
        return res | self._real_configs(s, p), acc

    def _real_configs(self, k: int, p: int) -> set:
        """The real configurations of position (local state k, parent stack p)."""
        return {(q, self._materialize(lst, p)) for q, lst in self._configs(k)}

    def step_bytes(self, pid: int, data: bytes) -> int:
        """The position after `data` from position pid, or DEAD."""
        if pid < 0:
            return DEAD
        if not data:
            return pid
        key = (pid, data)
        nxt = self._step_memo.get(key)
        if nxt is None:
            nxt = self._step_bytes(pid, data)
            if len(self._step_memo) >= STEP_MEMO_ENTRIES:
                self._step_memo.clear()
            self._step_memo[key] = nxt
        return nxt

    def _step_bytes(self, pid: int, data: bytes) -> int:
        k, p, _, run = self.pairs[pid]
        if k < 0:
            return DEAD
        if self.indent_limit is not None:
            run = self._indent_after(run, data)
            if run is None:
                return DEAD
        configs, acc = self._run(k, p, data)
        if not configs and not acc:
            return DEAD
        return self._pair(configs, acc, run)

    def _indent_after(self, run: int, data: bytes) -> int | None:
        """The indentation run after `data` from a run of `run` (-1: none), or None if a run passes the limit."""
        lim = self.indent_limit
        parts = data.split(b"\n")
        first = parts[0]
        lead = len(first) - len(first.lstrip(b" \t"))
        if run >= 0:
            if run + lead > lim:
                return None
            if len(parts) == 1:
                return run + lead if lead == len(first) else -1
        for x in parts[1:]:
            if len(x) - len(x.lstrip(b" \t")) > lim:
                return None
        if len(parts) == 1:
            return -1
        last = parts[-1]
        return len(last) if not last.lstrip(b" \t") else -1

    def is_accepting(self, pid: int) -> bool:
        return self.pairs[pid][2]

    def has_moves(self, pid: int) -> bool:
        """Whether some non-EOS token is allowed at pid."""
        m = self.mask(pid).view(np.uint32)
        eos = self.table.eos
        if self.pairs[pid][2] and eos.size:
            m = m.copy()
            np.bitwise_and.at(m, eos >> 5, ~(np.uint32(1) << (eos & 31).astype(np.uint32)))
        return bool(m.any())

    def forced_bytes(self, pid: int, limit: int) -> bytes:
        """The bytes every continuation from pid starts with (stops where the grammar may end)."""
        out = bytearray()
        while len(out) < limit:
            k, _, acc, _ = self.pairs[pid]
            if acc or k < 0:
                break
            self.expand(k)
            live = np.flatnonzero(self.trans[k] >= 0)
            if len(live) != 1:
                break
            c = int(live[0])
            lo = self.class_start[c]
            hi = self.class_start[c + 1] if c + 1 < len(self.class_start) else 256
            if hi - lo != 1:
                break
            nxt = self.step_bytes(pid, bytes([lo]))
            if nxt < 0:
                break
            out.append(lo)
            pid = nxt
        return bytes(out)

    # -- masks -------------------------------------------------------------------------------------------
    def _walk_table(self, sid: int, tab) -> tuple[np.ndarray, np.ndarray]:
        tb = self.table
        out = np.zeros(tb.words, dtype=np.uint32)
        states = np.empty(tb.maxlen + 1, dtype=np.int32)
        states[0] = sid
        pos = np.array([0, -1, 1 << 30, 0, 0], dtype=np.int64)
        rec = np.empty((256, 3), dtype=np.int64)
        nrec = np.zeros(1, dtype=np.int64)
        fast = self._fast
        while True:
            fast.index(self)
            r = walk_esc(self._walk_trans, self.flags, self.budget, self.byte_class, tab.data, tab.offs, tab.lcp,
                         tab.skip, tab.ids, tab.safe_from, states, pos, out, rec, nrec, self.accepting, *fast.arrays())
            self._sync()
            if r == 0:
                break
            if r == 1:
                byte = tab.data[tab.offs[pos[0]] + pos[1]]
                self.fill(int(states[pos[1]]), self._cls_of[byte])
            elif r == 3:
                fast.grow(self)
            else:
                grown = np.empty((rec.shape[0] * 4, 3), dtype=np.int64)
                grown[: rec.shape[0]] = rec
                rec = grown
        return out, rec[: nrec[0]]

    def _groups_of(self, tab, rec: np.ndarray) -> list[tuple[int, int]]:
        """Escaping tokens grouped by the local state they escape from: [(state, group id)]."""
        if not len(rec):
            return []
        st = rec[:, 2]
        if (st == st[0]).all():  # the usual case: one group, in walk order already
            chunks = [rec]
        else:
            rec = rec[np.argsort(st, kind="stable")]
            chunks = np.split(rec, np.flatnonzero(np.diff(rec[:, 2])) + 1)
        groups = []
        for chunk in chunks:
            idx = chunk[:, 0]
            gid = len(self._groups_tab)
            self._groups_tab.append(SubTable.suffixes(tab, idx, chunk[:, 1]))
            groups.append((int(chunk[0, 2]), gid))
        return groups

    def local_info(self, kc: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """For local state kc: the tokens taken under any parent stack, and the escaping token groups."""
        hit = self._local_info.get(kc)
        if hit is None:
            tab = self.table
            budget = int(self.budget[kc])
            bulk = tab.bulk(budget) if budget > 0 else None
            if bulk is not None:
                tab = bulk[1]
            out, rec = self._walk_table(kc, tab)
            if bulk is not None:
                out |= bulk[0]
            hit = self._local_info[kc] = (out, self._groups_of(tab, rec))
        return hit

    def _safe_budget(self, configs: tuple) -> int:
        """How many code points of any string-safe text a state with these configurations stays alive on (-1:
        not known to): unbounded from a universal NFA state, hi - v from the body of a counted loop over every
        safe character whose counter stands at v (a maxLength string)."""
        nfa = self.nfa
        universal, bodies, stacks = nfa.universal, nfa.counted_body, self.stacks
        best = -1
        for q, st in configs:
            if q in universal:
                return UNBOUNDED
            lid = bodies.get(q)
            if lid is not None and st > BOT:
                ret, _, v = stacks[st]
                if ret == -1 - lid:
                    hi = nfa.loops[lid][1]
                    if hi is None:
                        return UNBOUNDED
                    best = max(best, hi - v)
        return min(best, UNBOUNDED)

    def suffix_info(self, kc: int, gid: int) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
        """Group gid's token suffixes from local state kc: (certain word indices, bits, escaping groups)."""
        key = (kc, gid)
        hit = self._suffix_info.get(key)
        if hit is None:
            tab = self._groups_tab[gid]
            out, rec = self._walk_table(kc, tab)
            idx = np.flatnonzero(out)
            hit = self._suffix_info[key] = (idx, out[idx], self._groups_of(tab, rec))
        return hit

    def _escape_to(self, s: int, p: int, canonical: bool) -> tuple[int, int, bool]:
        """Where local state s's escapes lead on the real parent stack p: (local state or -1 for none, parent
        stack, accepting), the local state canonical if asked (a mask key) or real (a commit's position). Built by
        localbuild.cont, else from `_cont`."""
        canonical = canonical and self.has_counters
        key = (s, p, canonical)
        hit = self._escape_memo.get(key)
        if hit is None:
            out = self._cont_out
            if self._fast_call(cont, s, p, canonical, out, canonical=canonical) != NEED_PYTHON:
                k2, p2, acc2 = out.tolist()
            else:
                k2, p2, acc2, _ = self.pairs[self._cont(s, p)[2]]
                if k2 >= 0 and canonical:
                    k2 = self.canonical(k2)
            hit = self._escape_memo[key] = (k2, p2, bool(acc2))
        return hit

    def _resolve(self, s: int, p: int, gid: int, out: np.ndarray) -> None:
        """OR into `out` the tokens of group gid (escaping at local state s) that the real stack p accepts."""
        k2, p2, acc2 = self._escape_to(s, p, True)
        if k2 < 0:
            if acc2:
                w, b = self._groups_tab[gid].empty
                out[w] |= b
            return
        idx, bits, subs = self.suffix_info(k2, gid)
        out[idx] |= bits
        for s2, g2 in subs:
            self._resolve(s2, p2, g2, out)

    def mask(self, pid: int) -> np.ndarray:
        k, p, acc, run = self.pairs[pid]
        kc = self.canonical(k) if k >= 0 else -1
        if self._indent_rows is None:
            return self._cached_mask((kc, p, acc), None)
        return self._cached_mask((kc, p, acc, run), run)

    def _cached_mask(self, key: tuple, run: int | None) -> np.ndarray:
        """The LRU of masks: keyed (local state, parent, accepting) before the indentation filter, with the
        run appended after it."""
        m = self.masks.get(key)
        if m is not None:
            self.masks.move_to_end(key)
            return m
        if run is None:
            m = self._mask_slow(key)
        else:
            base = self._cached_mask(key[:3], None).view(np.uint32)
            outside, inside = self._indent_rows
            row = outside if run < 0 else inside[min(self.indent_limit - run, len(inside) - 1)]
            m = (base & row).view(np.int32)
        self.masks[key] = m
        self.mask_bytes += m.nbytes
        while self.mask_bytes > MASK_CACHE_BYTES and len(self.masks) > 1:
            _, old = self.masks.popitem(last=False)
            self.mask_bytes -= old.nbytes
        return m

    def _top_frame(self, lst: int) -> int:
        """The frame right above the local bottom in local stack lst (BOT for lst == BOT)."""
        stacks = self.stacks
        while lst != BOT and stacks[lst][1] != BOT:
            lst = stacks[lst][1]
        return lst

    def _split(self, kc: int, p: int) -> list[tuple] | None:
        """Local state kc's configurations grouped by the call frame right above the bottom, as the mask keys
        of their own positions; None when there is nothing to split.

        A set of configurations takes a token when one of them does, so a mask is the union of its groups'
        masks. A group inside a called rule is keyed by the rule's own states, shared by every call site (the
        extra members of each layer of a JSON object), so its walk over the vocabulary is done once."""
        hit = self._split_memo.get((kc, p), 0)
        if hit != 0:
            return hit
        out = self._split_out
        n = self._fast_call(split, kc, p, self.has_counters, out)
        if n != NEED_PYTHON:
            res = [(int(k), int(q), False) for k, q in out[:n].tolist()] if n else None
            self._split_memo[(kc, p)] = res
            return res
        return self._split_py(kc, p)

    def _split_py(self, kc: int, p: int) -> list[tuple] | None:
        """_split in Python, for what the numba one hands back."""
        groups: dict[int, list] = {}
        stacks = self.stacks
        for q, lst in self._configs(kc):
            f = self._top_frame(lst)
            if f != BOT and stacks[f][0] < 0:
                f = BOT  # a counter frame's configurations stay with the rest
            groups.setdefault(f, []).append((q, lst))
        res = None
        if len(groups) > 1:
            res = []
            for g in groups.values():
                real = {(q, self._materialize(lst, p)) for q, lst in g}
                k2, p2, _, _ = self.pairs[self._pair(real, False)]
                res.append((self.canonical(k2), p2, False))
        self._split_memo[(kc, p)] = res
        return res

    def _mask_slow(self, key: tuple[int, int, bool]) -> np.ndarray:
        kc, p, acc = key
        tb = self.table
        parts = self._split(kc, p) if kc >= 0 else None
        if parts is not None:
            out = np.zeros(tb.words, dtype=np.uint32)
            for part in parts:
                out |= self._cached_mask(part, None).view(np.uint32)
        elif kc >= 0:
            certain, groups = self.local_info(kc)
            out = certain.copy()
            for s, gid in groups:
                self._resolve(s, p, gid, out)
        else:
            out = np.zeros(tb.words, dtype=np.uint32)
        if acc and tb.eos.size:
            np.bitwise_or.at(out, tb.eos >> 5, np.uint32(1) << (tb.eos & 31).astype(np.uint32))
        return out.view(np.int32)
