"""Small code point automata for the operations a grammar IR cannot express directly.

Intersection (pattern plus length or format), complement (keys not among the declared ones), counting.
"""

from __future__ import annotations

import collections
import functools
import itertools

import numpy as np

from . import cpkernels
from .budget import current
from .errors import GrammarError
from .ir import (
    ANY_RANGES,
    MAX_CP,
    SAFE_RANGES,
    Alt,
    Auto,
    Chars,
    Escaped,
    Node,
    Repeat,
    Seq,
    cut_surrogates,
)
from .ir import complement as range_complement

MAX_DFA_STATES = 4000
# Automata this small (few states and few edges) are determinized in Python: the arrays to and from numba
# would cost more than they save. A few states with many edges (`\w` in Python's reading: 700 ranges a row)
# go to numba.
KERNEL_MIN_STATES = 48
KERNEL_MIN_EDGES = 128
MAX_NFA_STATES = 200_000
# Automata report their size to the compile budget (budget.py): about two units per state (its two rows),
# and the functions below add the edges they append, about two units each (a tuple and its ints).


class CPNFA:
    """States with code point range edges and epsilon edges; `finals` accept."""

    def __init__(self) -> None:
        self.edges: list[list[tuple[int, int, int]]] = []
        self.eps: list[list[int]] = []
        self.start = 0
        self.finals: set[int] = set()
        self.universal_states: set[int] | None = None  # `universal`, kept once the automaton is embedded
        self.safe_budgets: dict[int, int] | None = None  # `safe_budgets`, likewise
        self.live_start: bool | None = None  # whether the start state can reach a final one, once trimmed
        # Each state's edges as one normalised range set per target (nfa._by_target), once it is known: the
        # byte NFA lowers them that way, and an automaton embedded twice is grouped once.
        self.by_target: list[dict[int, tuple]] | None = None
        self.counted_states: int | None = None  # nfa._auto_states for a length-bounded embed, once estimated

    def add(self) -> int:
        n = len(self.edges)
        if n >= MAX_NFA_STATES:
            raise GrammarError("pattern automaton too large")
        current().spend(2)  # per state (not in blocks as in nfa.py): most of these automata are small
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1

    @property
    def size(self) -> int:
        return len(self.edges)


def from_ir(node: Node) -> CPNFA:
    nfa = CPNFA()
    s = nfa.add()
    e = _build(nfa, node, s, current())
    nfa.start = s
    nfa.finals = {e}
    return nfa


def _build(nfa: CPNFA, node: Node, s: int, budget) -> int:
    if isinstance(node, Chars):
        e = nfa.add()
        budget.spend(2 * len(node.ranges))  # a class of many ranges, repeated, is many edges on few states
        for a, b in node.ranges:
            nfa.edges[s].append((a, b, e))
        return e
    if isinstance(node, Seq):
        for it in node.items:
            s = _build(nfa, it, s, budget)
        return s
    if isinstance(node, Alt):
        e = nfa.add()
        for it in node.items:
            b = nfa.add()
            nfa.eps[s].append(b)
            nfa.eps[_build(nfa, it, b, budget)].append(e)
        return e
    if isinstance(node, Repeat):
        for _ in range(node.min):
            s = _build(nfa, node.item, s, budget)
        if node.max is None:
            loop = nfa.add()
            nfa.eps[s].append(loop)
            b = _build(nfa, node.item, loop, budget)
            nfa.eps[b].append(loop)
            return loop
        e = nfa.add()
        nfa.eps[s].append(e)
        for _ in range(node.max - node.min):
            s = _build(nfa, node.item, s, budget)
            nfa.eps[s].append(e)
        return e
    if isinstance(node, Escaped):
        return _build(nfa, node.item, s, budget)
    if isinstance(node, Auto) and not node.escape:
        a = node.auto
        budget.spend(2 * sum(map(len, a.edges)))
        m = [nfa.add() for _ in range(a.size)]
        e = nfa.add()
        nfa.eps[s].append(m[a.start])
        for q in range(a.size):
            for lo, hi, t in a.edges[q]:
                nfa.edges[m[q]].append((lo, hi, m[t]))
            for t in a.eps[q]:
                nfa.eps[m[q]].append(m[t])
            if q in a.finals:
                nfa.eps[m[q]].append(e)
        return e
    raise GrammarError(f"cannot intersect a grammar containing {type(node).__name__}")


def _closure(nfa: CPNFA, states) -> frozenset[int]:
    out = set(states)
    stack = list(states)
    while stack:
        s = stack.pop()
        for t in nfa.eps[s]:
            if t not in out:
                out.add(t)
                stack.append(t)
    current().tick(len(out))
    return frozenset(out)


def _flat(rows: list[list], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of tuples (or ints, width 1) as offsets and one array of `width` columns."""
    off = np.zeros(len(rows) + 1, np.int64)
    np.cumsum([len(r) for r in rows], out=off[1:])
    if width == 1:
        return off, np.fromiter(itertools.chain.from_iterable(rows), np.int64, int(off[-1]))
    flat = np.fromiter(
        itertools.chain.from_iterable(itertools.chain.from_iterable(rows)), np.int64, int(off[-1]) * width
    )
    return off, flat.reshape(-1, width)


def determinize(nfa: CPNFA, max_states: int = MAX_DFA_STATES) -> CPNFA:
    """Subset construction over atomic code point intervals; the result has no epsilon edges. Run in numba
    (cpkernels.determinize_kernel, the same automaton state for state); `_determinize` is the reference and
    takes what the kernel leaves."""
    if nfa.size < KERNEL_MIN_STATES and sum(map(len, nfa.edges)) < KERNEL_MIN_EDGES:
        return _determinize(nfa, max_states)
    budget = current()
    e_off, e = _flat(nfa.edges, 3)
    p_off, p = _flat(nfa.eps, 1)
    finals = np.zeros(nfa.size, np.uint8)
    finals[list(nfa.finals)] = 1
    n, dfinal, rows, nrows, steps, sizes = cpkernels.determinize_kernel(
        e_off, e, p_off, p, finals, nfa.start, max_states, cpkernels.WORK_CAP
    )
    budget.tick(steps)
    if n == cpkernels.OVER_WORK:
        return _determinize(nfa, max_states)
    if n == cpkernels.TOO_MANY:
        raise GrammarError(f"pattern needs more than {max_states} automaton states")
    dfa = CPNFA()
    budget.spend(3 * n + sizes // 4 + 2 * nrows)
    dfa.edges = edges = [[] for _ in range(n)]
    dfa.eps = [[] for _ in range(n)]
    # A state's rows are consecutive (each state is swept once): one slice per state, zipped into tuples.
    src, lo, hi, tgt = rows[:nrows].T.tolist()
    cuts = [0, *(np.flatnonzero(np.diff(rows[:nrows, 0])) + 1).tolist(), nrows]
    for a, b in itertools.pairwise(cuts):
        if a < b:
            edges[src[a]] = list(zip(lo[a:b], hi[a:b], tgt[a:b], strict=True))
    dfa.finals = set(np.flatnonzero(dfinal[:n]).tolist())
    dfa.start = 0
    return dfa


def _determinize(nfa: CPNFA, max_states: int = MAX_DFA_STATES) -> CPNFA:
    """determinize in Python: the reference, and the way for small automata and runs past the kernel's work
    cap."""
    dfa = CPNFA()
    closures: dict[tuple, frozenset[int]] = {}
    start = _closure(nfa, [nfa.start])
    index = {start: dfa.add()}
    work = [start]
    budget = current()
    while work:
        cur = work.pop()
        ds = index[cur]
        if cur & nfa.finals:
            dfa.finals.add(ds)
        # One sweep over the edges' end points: each interval between consecutive points moves to the set
        # of edge targets active over it.
        events = []
        for s in cur:
            for a, b, t in nfa.edges[s]:
                events.append((a, 1, t))
                events.append((b + 1, -1, t))
        budget.tick(len(events) + len(cur))
        events.sort()
        active: dict[int, int] = {}
        i = 0
        n = len(events)
        while i < n:
            lo = events[i][0]
            while i < n and events[i][0] == lo:
                _, d, t = events[i]
                c = active.get(t, 0) + d
                if c:
                    active[t] = c
                else:
                    del active[t]
                i += 1
            if not active:
                continue
            hi = events[i][0] - 1
            tkey = tuple(sorted(active))
            nxt = closures.get(tkey)
            if nxt is None:
                nxt = closures[tkey] = _closure(nfa, tkey)
                budget.spend(1 + (len(tkey) + len(nxt)) // 4)  # both are kept until the end
            if nxt not in index:
                if len(index) >= max_states:
                    raise GrammarError(f"pattern needs more than {max_states} automaton states")
                index[nxt] = dfa.add()
                work.append(nxt)
            t = index[nxt]
            row = dfa.edges[ds]
            if row and row[-1][2] == t and row[-1][1] + 1 == lo:
                row[-1] = (row[-1][0], hi, t)
            else:
                row.append((lo, hi, t))
        budget.spend(2 * len(dfa.edges[ds]))
    dfa.start = 0
    return dfa


def complement(dfa: CPNFA) -> CPNFA:
    """Strings (any code points) not accepted by the deterministic `dfa`."""
    out = CPNFA()
    for _ in range(dfa.size):
        out.add()
    sink = out.add()
    budget = current()
    # Each row's gaps into the sink, once per set of ranges: the states of a counted class (`[a-z]{1,255}`)
    # all read the same ranges.
    gaps: dict[tuple, tuple] = {}
    for s in range(dfa.size):
        row = dfa.edges[s]
        budget.spend(4 * len(row) + 2)  # its edges and at most one gap between two of them each
        covered = tuple([(a, b) for a, b, _ in row])
        g = gaps.get(covered)
        if g is None:
            g = gaps[covered] = range_complement(covered)
        out.edges[s] = [*row, *[(a, b, sink) for a, b in g]]
        if s not in dfa.finals:
            out.finals.add(s)
    for a, b in ANY_RANGES:
        out.edges[sink].append((a, b, sink))
    out.finals.add(sink)
    out.start = dfa.start
    return trim(out)


def _sorted_row(row: list) -> tuple[list, bool]:
    """The row sorted by interval, and whether its intervals are disjoint (a deterministic row)."""
    out = sorted(row)
    return out, all(out[k][0] > out[k - 1][1] for k in range(1, len(out)))


def product(a: CPNFA, b: CPNFA, max_states: int = MAX_DFA_STATES) -> CPNFA:
    """Intersection of two deterministic automata."""
    # "Any key but these" with no words is every string: the other automaton is the intersection.
    if type(a) is WordsComplement and not a.ends:
        return b if b.live_start is not None else trim(b)
    if type(b) is WordsComplement and not b.ends:
        return a if a.live_start is not None else trim(a)
    out = CPNFA()
    rows_a: dict[int, tuple[list, bool]] = {}
    rows_b: dict[int, tuple[list, bool]] = {}
    index = {(a.start, b.start): out.add()}
    work = [(a.start, b.start)]
    budget = current()
    while work:
        x, y = work.pop()
        s = index[(x, y)]
        if x in a.finals and y in b.finals:
            out.finals.add(s)
        # Both rows are sorted, disjoint intervals (deterministic automata): intersect them in one merge.
        ea, da = rows_a[x] if x in rows_a else rows_a.setdefault(x, _sorted_row(a.edges[x]))
        eb, db = rows_b[y] if y in rows_b else rows_b.setdefault(y, _sorted_row(b.edges[y]))
        if da and db:
            pairs = []
            i = j = 0
            while i < len(ea) and j < len(eb):
                a1, b1, t1 = ea[i]
                a2, b2, t2 = eb[j]
                lo = a1 if a1 > a2 else a2
                hi = b1 if b1 < b2 else b2
                if lo <= hi:
                    pairs.append((lo, hi, t1, t2))
                if b1 < b2:
                    i += 1
                else:
                    j += 1
        else:
            pairs = [
                (max(a1, a2), min(b1, b2), t1, t2)
                for a1, b1, t1 in ea
                for a2, b2, t2 in eb
                if max(a1, a2) <= min(b1, b2)
            ]
        budget.spend(1 + 2 * len(pairs))
        for lo, hi, t1, t2 in pairs:
            key = (t1, t2)
            if key not in index:
                if len(index) >= max_states:
                    raise GrammarError(f"pattern intersection needs more than {max_states} states")
                index[key] = out.add()
                work.append(key)
            out.edges[s].append((lo, hi, index[key]))
    out.start = 0
    return trim(out)


def count(nfa: CPNFA, lo: int, hi: int | None) -> CPNFA:
    """Strings of `nfa` whose length in code points is within [lo, hi] (epsilon-free result)."""
    cap = hi if hi is not None else lo
    if (cap + 1) * nfa.size > MAX_NFA_STATES:
        raise GrammarError(f"length bound {cap} is too large combined with a pattern")
    out = CPNFA()
    index: dict[tuple[int, int], int] = {}
    closures = [_closure(nfa, [s]) for s in range(nfa.size)]

    def get(s: int, c: int) -> int:
        key = (s, c)
        if key not in index:
            index[key] = out.add()
            work.append(key)
        return index[key]

    work: list[tuple[int, int]] = []
    out.start = get(nfa.start, 0)
    budget = current()
    while work:
        s, c = work.pop()
        me = index[(s, c)]
        budget.spend(1 + 2 * len(closures[s]))
        for q in closures[s]:
            if q in nfa.finals and c >= lo:
                out.finals.add(me)
            for a, b, t in nfa.edges[q]:
                nc = c + 1
                if hi is not None and nc > hi:
                    continue
                if hi is None and nc > lo:
                    nc = lo
                out.edges[me].append((a, b, get(t, nc)))
    res = trim(out)
    if hi is not None:
        res.universal_states = set()  # every string is at most hi long: no state reads any text
    return res


def trim(nfa: CPNFA) -> CPNFA:
    """Drop states that cannot reach a final state (no dead ends for the sampler)."""
    current().tick(2 * nfa.size)
    rev, rev_eps = _reversed(nfa)
    live = set(nfa.finals)
    stack = list(nfa.finals)
    while stack:
        t = stack.pop()
        for s in (*rev[t], *rev_eps[t]):
            if s not in live:
                live.add(s)
                stack.append(s)
    for s in range(nfa.size):
        if s in live:
            nfa.edges[s] = [e for e in nfa.edges[s] if e[2] in live]
            nfa.eps[s] = [t for t in nfa.eps[s] if t in live]
        else:
            nfa.edges[s] = []
            nfa.eps[s] = []
    nfa.live_start = nfa.start in live
    nfa.by_target = None
    return nfa


def compact(nfa: CPNFA) -> CPNFA:
    """`nfa` trimmed and without the states its start does not reach, renumbered in the order a walk from the
    start meets them (trim keeps every state, emptied: a complement of a union leaves many)."""
    if nfa.live_start is None:
        trim(nfa)
    if not nfa.live_start:
        out = CPNFA()
        out.add()
        out.live_start = False
        return out
    current().tick(nfa.size)
    index = {nfa.start: 0}
    order = [nfa.start]
    for q in order:  # (grows while it is read: a breadth-first walk)
        for _, _, t in nfa.edges[q]:
            if t not in index:
                index[t] = len(order)
                order.append(t)
        for t in nfa.eps[q]:
            if t not in index:
                index[t] = len(order)
                order.append(t)
    out = CPNFA()
    current().spend(2 * len(order))
    out.edges = [[(lo, hi, index[t]) for lo, hi, t in nfa.edges[q]] for q in order]
    out.eps = [[index[t] for t in nfa.eps[q]] for q in order]
    out.finals = {index[q] for q in nfa.finals if q in index}
    out.start = 0
    out.live_start = True
    return out


def is_empty(nfa: CPNFA) -> bool:
    if nfa.live_start is None:
        trim(nfa)
    return not nfa.live_start


def _reversed(nfa: CPNFA) -> tuple[list[list[int]], list[list[int]]]:
    """Per state, the states with an edge into it, and those with an epsilon edge into it."""
    rev: list[list[int]] = [[] for _ in range(nfa.size)]
    rev_eps: list[list[int]] = [[] for _ in range(nfa.size)]
    for q in range(nfa.size):
        for _, _, t in nfa.edges[q]:
            rev[t].append(q)
        for t in nfa.eps[q]:
            rev_eps[t].append(q)
    return rev, rev_eps


def dist_to_final(nfa: CPNFA, reversed_edges=None) -> list[int | None]:
    """Per state, the fewest code points on a path to a final state (None: no such path). Epsilon edges cost
    nothing (a 0-1 breadth-first search backwards from the finals). `reversed_edges`: `_reversed(nfa)` if
    the caller has it."""
    current().tick(2 * nfa.size)
    rev, rev_eps = reversed_edges or _reversed(nfa)
    dist: list[int | None] = [None] * nfa.size
    queue = collections.deque()
    for f in nfa.finals:
        dist[f] = 0
        queue.append(f)
    while queue:
        t = queue.popleft()
        d = dist[t]
        for s in rev_eps[t]:
            if dist[s] is None or dist[s] > d:
                dist[s] = d
                queue.appendleft(s)
        for s in rev[t]:
            if dist[s] is None or dist[s] > d + 1:
                dist[s] = d + 1
                queue.append(s)
    return dist


def _eps_closures(nfa: CPNFA) -> list[list[int]]:
    """Each state's epsilon closure (itself included)."""
    eps = nfa.eps
    out: list[list[int]] = []
    for q in range(nfa.size):
        if not eps[q]:
            out.append([q])
            continue
        seen = {q}
        stack = [q]
        while stack:
            for t in eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        out.append(list(seen))
    return out


def _reaching(dropped: list[int], rev: list[list[int]], rev_eps: list[list[int]]) -> set[int]:
    """The states whose epsilon closure holds an edge into one of `dropped`: what a coverage check must look at
    again once those states leave its set."""
    stack = [p for q in dropped for p in rev[q]]
    seen = set(stack)
    while stack:
        for r in rev_eps[stack.pop()]:
            if r not in seen:
                seen.add(r)
                stack.append(r)
    return seen


class _SafeView:
    """What `universal` and `safe_budgets` read of an automaton that has an edge to the highest code point:
    each state's epsilon closure, and per state the string-safe characters its closure reads into each
    target, as (target, bits) pairs. The bits number the automaton's atoms: the stretches of code points
    between the ends of its edges' ranges and of SAFE_RANGES, each wholly inside or outside every range, so
    a set of edges covers every safe character when the OR of their bits is `safe`, the bits of SAFE_RANGES
    (an OR per edge instead of sorting and merging ranges at each check). Also the reversed edges, and each
    state's distance to a final state."""

    def __init__(self, nfa: CPNFA) -> None:
        ranges = {(lo, hi) for row in nfa.edges for lo, hi, _ in row}  # the same ones recur (`\S`, `.`)
        cuts = {0, MAX_CP + 1}
        for lo, hi in itertools.chain(SAFE_RANGES, ranges):
            cuts.update((lo, hi + 1))
        at = {c: i for i, c in enumerate(sorted(cuts))}
        safe = 0
        for lo, hi in SAFE_RANGES:
            safe |= (1 << at[hi + 1]) - (1 << at[lo])
        of_range = {r: ((1 << at[r[1] + 1]) - (1 << at[r[0]])) & safe for r in ranges}
        rows: list[dict[int, int]] = []
        for row in nfa.edges:
            got: dict[int, int] = {}
            for lo, hi, t in row:
                bits = of_range[(lo, hi)]
                if bits:
                    got[t] = got.get(t, 0) | bits
            rows.append(got)
        self.closures = closures = _eps_closures(nfa)
        self.cover: list[list[tuple[int, int]]] = []
        for c in closures:
            if len(c) == 1:
                self.cover.append(list(rows[c[0]].items()))
                continue
            got = {}
            for p in c:
                for t, bits in rows[p].items():
                    got[t] = got.get(t, 0) | bits
            self.cover.append(list(got.items()))
        self.safe = safe
        self.rev, self.rev_eps = _reversed(nfa)
        self.dist = dist_to_final(nfa, (self.rev, self.rev_eps))

    def covers(self, q: int, alive: list[bool]) -> bool:
        """Whether the edges of q's epsilon closure into `alive` states read every safe character."""
        bits = 0
        for t, b in self.cover[q]:
            if alive[t]:
                bits |= b
        return bits == self.safe


def _safe_view(nfa: CPNFA) -> _SafeView | None:
    """The view, or None when no edge reads the highest code point: then no set of edges covers every safe
    character (SAFE_RANGES runs to MAX_CP), as in most pattern automata."""
    if any(hi >= MAX_CP for row in nfa.edges for _, hi, _ in row):
        return _SafeView(nfa)
    return None


def safe_states(nfa: CPNFA) -> tuple[set[int], dict[int, int]]:
    """`universal` and `safe_budgets` of nfa, made from one view and kept on it."""
    if nfa.universal_states is None or nfa.safe_budgets is None:
        view = _safe_view(nfa)
        if nfa.universal_states is None:
            nfa.universal_states = universal(nfa, view)
        nfa.safe_budgets = safe_budgets(nfa, view)
    return nfa.universal_states, nfa.safe_budgets


_UNSET = object()


def universal(nfa: CPNFA, view=_UNSET) -> set[int]:
    """The states after which any string of SAFE_RANGES characters can still be read on the way to a final
    state ("any key but these", `.*`, a free string body): a greatest fixed point. Start from the states that
    can finish and whose edges (from their epsilon closure) cover every safe character, and drop each one
    whose edges into the set miss one; a drop rechecks the states with an edge (after epsilons) into it."""
    n = nfa.size
    budget = current()
    budget.tick(2 * n)
    if view is _UNSET:
        view = _safe_view(nfa)
    if view is None:
        return set()
    everywhere = [True] * n
    ok = [view.covers(q, everywhere) for q in range(n)]
    if not any(ok):
        return set()
    dist = view.dist
    ok = [ok[q] and dist[q] is not None for q in range(n)]
    work = [q for q in range(n) if ok[q]]
    while work:
        q = work.pop()
        budget.tick(len(view.closures[q]))
        if not ok[q] or view.covers(q, ok):
            continue
        ok[q] = False
        work.extend(p for p in _reaching([q], view.rev, view.rev_eps) if ok[p])
    return {q for q in range(n) if ok[q]}


SAFE_BUDGET_CAP = 64  # budgets are counted up to this many code points (longer tokens are walked)


def safe_budgets(nfa: CPNFA, view=_UNSET) -> dict[int, int]:
    """For the states that are not `universal` but stay alive on any string of SAFE_RANGES characters up to
    some length, that length (at most SAFE_BUDGET_CAP): a word-count pattern such as (?:\\S+\\s+){0,9}\\S+ has
    about two per word left. The sets S_k of states alive on every such string of at most k characters shrink
    as k grows: S_0 holds the states that can finish, and a state of S_(k-1) stays in S_k when the edges of
    its epsilon closure into S_(k-1) cover every safe character (one successor per character, alive on every
    shorter string: sound, if not always the largest budget). A state's budget is the last k it is in S_k;
    after a round, only the states with an edge into one just dropped are looked at again."""
    n = nfa.size
    univ = nfa.universal_states if nfa.universal_states is not None else universal(nfa, view)
    if not n or len(univ) == n:
        return {}
    budget = current()
    budget.tick(2 * n)
    if view is _UNSET:
        view = _safe_view(nfa)
    if view is None:
        return {}
    inside = [d is not None for d in view.dist]  # S_0
    out: dict[int, int] = {}
    check = [q for q in range(n) if inside[q]]
    k = 1
    while check and k <= SAFE_BUDGET_CAP:
        budget.tick(len(check))
        dropped = [q for q in check if not view.covers(q, inside)]
        if not dropped:
            break
        for q in dropped:
            inside[q] = False
            if k > 1:
                out[q] = k - 1
        check = sorted(p for p in _reaching(dropped, view.rev, view.rev_eps) if inside[p])
        k += 1
    if k > SAFE_BUDGET_CAP:  # still inside after the cap: at least the cap
        out.update((q, SAFE_BUDGET_CAP) for q in range(n) if inside[q] and q not in univ)
    return out


def single_word(dfa: CPNFA) -> str | None:
    """The one string the deterministic, epsilon-free `dfa` accepts, if it accepts exactly one (a literal
    pattern such as `^client_id$`), else None."""
    s = dfa.start
    out: list[str] = []
    seen = set()
    while True:
        if s in seen or dfa.eps[s]:
            return None
        seen.add(s)
        row = dfa.edges[s]
        if s in dfa.finals:
            return "".join(out) if not row else None
        if len(row) != 1 or row[0][0] != row[0][1]:
            return None
        out.append(chr(row[0][0]))
        s = row[0][2]


def accepts(dfa: CPNFA, text: str) -> bool:
    """Whether the deterministic, epsilon-free `dfa` accepts `text`."""
    s = dfa.start
    for ch in text:
        c = ord(ch)
        for lo, hi, t in dfa.edges[s]:
            if lo <= c <= hi:
                s = t
                break
        else:
            return False
    return s in dfa.finals


@functools.lru_cache(maxsize=4096)
def _complement_plan(
    cs: tuple[int, ...],
) -> tuple[tuple[tuple[int, int, int], ...], tuple[tuple[int, int], ...]]:
    """The row of a `not_words` trie state whose children read the code points `cs` (sorted): (lo, hi, c) in
    order, c the child's code point or -1 for a gap into the sink (sorted, apart, free of surrogates); and
    the gaps."""
    plan: list[tuple[int, int, int]] = []
    gaps: list[tuple[int, int]] = []
    prev = 0
    for c in (*cs, ANY_RANGES[-1][1] + 1):
        for a, b in cut_surrogates(prev, c - 1):
            plan.append((a, b, -1))
            gaps.append((a, b))
        if c <= ANY_RANGES[-1][1]:
            plan.append((c, c, c))
        prev = c + 1
    return tuple(plan), tuple(gaps)


class WordsComplement(CPNFA):
    """`not_words`: every string except the words, as the complement of their trie. The trie is kept as arrays
    (`parent`, `code`, `ends`; state `sink` after leaving it) and the rest is made when first read: the byte NFA
    builder lowers such an automaton from those arrays (nfa._Builder.embed_words), and most are never read
    otherwise. States: the trie's, then the sink; every one but the words' ends accepts, and every one is alive
    after any text."""

    def __init__(self, parent: np.ndarray, code: np.ndarray, word_end: np.ndarray) -> None:
        # (CPNFA's attributes set here, without its __init__: most of them are properties of this class, made
        # when first read, and an object has dozens of these automata.)
        # Per trie state: the state it hangs from (-1 at the root), the code point into it, and 1 where a word
        # ends (the arrays cpkernels.word_rows reads).
        self.parent = parent
        self.code = code
        self.word_end = word_end
        self.sink = len(parent)
        self._ends: set[int] | None = None
        self._children: list[dict[int, int]] | None = None
        self._rows: list | None = None
        self._eps: list | None = None
        self._grouped: list | None = None
        self._finals: set[int] | None = None
        self._universal: set[int] | None = None
        self.safe_budgets = None
        self.start = 0
        self.live_start = True  # every state reaches the sink, which accepts: nothing to trim

    @property
    def ends(self) -> set[int]:
        """The trie states where a word ends."""
        if self._ends is None:
            self._ends = set(np.flatnonzero(self.word_end).tolist())
        return self._ends

    @property
    def children(self) -> list[dict[int, int]]:
        """Per trie state, its children by code point, in the order they were made."""
        if self._children is None:
            children: list[dict[int, int]] = [{} for _ in range(self.sink)]
            for t, (p, c) in enumerate(zip(self.parent.tolist(), self.code.tolist(), strict=True)):
                if p >= 0:
                    children[p][c] = t
            self._children = children
        return self._children

    @property
    def finals(self) -> set[int]:
        if self._finals is None:
            self._finals = set(range(self.sink + 1)) - self.ends
        return self._finals

    @finals.setter
    def finals(self, states: set[int]) -> None:
        self._finals = states

    @property
    def universal_states(self) -> set[int]:
        if self._universal is None:
            self._universal = set(range(self.sink + 1))
        return self._universal

    @universal_states.setter
    def universal_states(self, states: set[int] | None) -> None:
        self._universal = states

    # CPNFA's row attributes, made from the trie on first use (trim and the like may replace them).
    @property
    def edges(self) -> list:
        if self._rows is None:
            self._make_rows()
        return self._rows

    @edges.setter
    def edges(self, rows: list) -> None:
        self._rows = rows

    @property
    def eps(self) -> list:
        if self._eps is None:
            self._eps = [[] for _ in range(self.sink + 1)]
        return self._eps

    @eps.setter
    def eps(self, rows: list) -> None:
        self._eps = rows

    @property
    def by_target(self) -> list | None:
        if self._rows is None:
            self._make_rows()
        return self._grouped

    @by_target.setter
    def by_target(self, grouped: list | None) -> None:
        self._grouped = grouped

    @property
    def size(self) -> int:
        return self.sink + 1 if self._rows is None else len(self._rows)

    def _make_rows(self) -> None:
        sink = self.sink
        rows: list[list] = []
        # The rows grouped by target as they are built, targets in the order their first edge comes (the gaps
        # into the sink are sorted, apart and free of surrogates: already the normal form `nfa._by_target`
        # computes).
        grouped: list[dict[int, tuple]] = []
        for kids in self.children:
            plan, gaps = _complement_plan(tuple(sorted(kids)))
            rows.append([(a, b, sink if c < 0 else kids[c]) for a, b, c in plan])
            by: dict[int, tuple] = {}
            for _, _, c in plan:
                if c >= 0:
                    by[kids[c]] = ((c, c),)
                elif sink not in by:
                    by[sink] = gaps
            grouped.append(by)
        rows.append([(a, b, sink) for a, b in ANY_RANGES])
        grouped.append({sink: ANY_RANGES})
        self._rows, self._grouped = rows, grouped


def not_words(words: list[str]) -> WordsComplement:
    """A deterministic automaton accepting every string except exactly `words` (equal to the complement of the
    trie of `words`, its states numbered as the words are inserted in order); its rows are made when first
    read."""
    budget = current()
    text = "".join(words)
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.int32)
    lens = np.fromiter(map(len, words), np.int32, len(words))
    parent, code, word_end, n = cpkernels.word_trie(codes, lens)
    if n >= MAX_NFA_STATES:
        raise GrammarError("pattern automaton too large")
    # The trie's states and the sink (two budget units each, as CPNFA.add charges), their rows (about four
    # ranges each, two units per range) and the sets of states kept.
    budget.spend(2 * (n + 1) + 8 * n + n)
    return WordsComplement(parent, code, word_end)


class Searcher:
    """Whether an automaton accepts a string, in time linear in the string: the subset construction is run
    lazily, only for the sets and characters the strings met so far reach, and remembered (up to MEMO states
    in all the sets kept, then started over). Built on a search pattern's automaton (`parse_regex(...,
    search=True)`), it answers what `re.search` answers without backtracking, which is exponential in the
    string on patterns such as `(a+)+$`."""

    MEMO = 1 << 20

    def __init__(self, nfa: CPNFA) -> None:
        self.nfa = nfa
        self.start = _closure(nfa, [nfa.start])
        self._reset()

    def _reset(self) -> None:
        self.sets: dict[frozenset[int], frozenset[int]] = {self.start: self.start}
        self.moves: dict[tuple[frozenset[int], int], frozenset[int]] = {}
        self.kept = len(self.start)

    def accepts(self, text: str) -> bool:
        nfa, cur = self.nfa, self.start
        moves = self.moves
        for ch in text:
            c = ord(ch)
            nxt = moves.get((cur, c))
            if nxt is None:
                found = _closure(nfa, {t for s in cur for a, b, t in nfa.edges[s] if a <= c <= b})
                current().tick(len(cur))
                if self.kept > self.MEMO:
                    self._reset()
                    moves = self.moves
                nxt = self.sets.get(found)
                if nxt is None:
                    nxt = self.sets[found] = found
                    self.kept += len(found)
                moves[(cur, c)] = nxt
                self.kept += 1
            if not nxt:
                return False
            cur = nxt
        return not cur.isdisjoint(nfa.finals)
