"""The subset construction of code point automata (cpauto.determinize), in numba.

`cpauto.determinize` hands an automaton here as flat arrays and builds the result from what comes back; the
Python loop beside it stays the reference and runs what this leaves (a run past WORK_CAP, so that no call
holds the GIL for long). It makes the same automaton as the Python version, state for state:
states are numbered in the order they are found, taken from the work list last in, first out, and each row
lists its intervals in ascending order, adjacent intervals into the same state merged.

Arrays in: an automaton's edges grouped by source (`off[q]` .. `off[q + 1]` are q's rows of lo, hi, target),
epsilon edges likewise, `finals` as one flag per state. Arrays out: the rows in the order the states were
taken (source, lo, hi, target), the final flags, and the count of states; a negative count is a refusal
(TOO_MANY: the state cap; OVER_WORK: the work cap).
"""

from __future__ import annotations

import numba
import numpy as np

TOO_MANY = -1
OVER_WORK = -2
WORK_CAP = 2_000_000  # events and closure steps per call: a few milliseconds here


@numba.njit(cache=True, inline="always")
def _hash(members, a, b):
    h = np.uint64(1469598103934665603)
    for k in range(a, b):
        h = (h ^ np.uint64(members[k] + 1)) * np.uint64(1099511628211)
    return h


@numba.njit(cache=True)
def _grow(arr, need):
    n = arr.shape[0]
    if need <= n:
        return arr
    while n < need:
        n *= 2
    out = np.empty(n, arr.dtype)
    out[: arr.shape[0]] = arr
    return out


@numba.njit(cache=True, inline="always")
def _close(nact, alist, p_off, p_dst, mark, gen, stack, out):
    """The epsilon closure of alist[:nact] into out (unsorted); returns its size."""
    top = 0
    ns = 0
    for k in range(nact):
        t = alist[k]
        if mark[t] != gen:
            mark[t] = gen
            stack[top] = t
            top += 1
            out[ns] = t
            ns += 1
    while top:
        top -= 1
        s = stack[top]
        for j in range(p_off[s], p_off[s + 1]):
            t = p_dst[j]
            if mark[t] != gen:
                mark[t] = gen
                stack[top] = t
                top += 1
                out[ns] = t
                ns += 1
    return ns


@numba.njit(cache=True)
def determinize_kernel(e_off, e, p_off, p_dst, finals, start, max_states, work_cap):
    """Subset construction over code point intervals (cpauto.determinize). Returns (count of DFA states or a
    refusal, final flags, rows as source, lo, hi, target, number of rows, steps of work, set sizes summed)."""
    n = finals.shape[0]
    mark = np.zeros(n, np.int64)
    stack = np.empty(n, np.int64)
    found = np.empty(n, np.int64)
    # The DFA states' NFA sets, sorted, in one pool (soff[q] .. soff[q + 1]); an open-addressing hash of them
    # (state + 1, 0 empty), at most half full; the work list; the rows made.
    pool = np.empty(64, np.int64)
    soff = np.zeros(65, np.int64)
    table = np.zeros(128, np.int64)
    dfinal = np.zeros(64, np.uint8)
    work = np.empty(64, np.int64)
    rows = np.empty((256, 4), np.int64)
    nrows = 0
    # The sweep: per target, how many edges over the current point reach it; the active targets as a list.
    cnt = np.zeros(n, np.int64)
    apos = np.full(n, -1, np.int64)
    alist = np.empty(n, np.int64)
    nact = 0
    ev = np.empty((64, 3), np.int64)
    order = np.empty(64, np.int64)
    # The set of targets the last interval interned, marked with its generation, and the state it gave: an
    # interval over the same set (a row's ranges into one state, split by the gaps between them: `\w` in
    # Python's reading has hundreds) takes that state without a closure and a lookup.
    last_mark = np.zeros(n, np.int64)
    last_gen = 0
    last_n = -1
    last_tgt = -1
    alist[0] = start
    ns = _close(1, alist, p_off, p_dst, mark, 1, stack, found)
    gen = 1
    steps = ns
    st = np.zeros(4, np.int64)  # states, pool length, work length, set sizes summed
    _, pool, soff, table, dfinal, work = _intern(
        found, ns, pool, soff, table, dfinal, work, finals, st, max_states
    )
    while st[2]:
        st[2] -= 1
        cur = work[st[2]]
        a = soff[cur]
        b = soff[cur + 1]
        nev = 0
        for k in range(a, b):
            s = pool[k]
            m = 2 * (e_off[s + 1] - e_off[s])
            if nev + m > ev.shape[0]:
                big = np.empty((max(2 * ev.shape[0], nev + m), 3), np.int64)
                big[:nev] = ev[:nev]
                ev = big
            for j in range(e_off[s], e_off[s + 1]):
                ev[nev, 0] = e[j, 0]
                ev[nev, 1] = 1
                ev[nev, 2] = e[j, 2]
                ev[nev + 1, 0] = e[j, 1] + 1
                ev[nev + 1, 1] = -1
                ev[nev + 1, 2] = e[j, 2]
                nev += 2
        steps += nev + b - a
        if steps > work_cap:
            return OVER_WORK, dfinal, rows, nrows, steps, st[3]
        order = _order(ev, nev, order)
        row_start = nrows
        i = 0
        while i < nev:
            lo = ev[order[i], 0]
            while i < nev and ev[order[i], 0] == lo:
                t = ev[order[i], 2]
                c = cnt[t] + ev[order[i], 1]
                cnt[t] = c
                if c != 0 and apos[t] < 0:
                    apos[t] = nact
                    alist[nact] = t
                    nact += 1
                elif c == 0 and apos[t] >= 0:
                    p = apos[t]
                    nact -= 1
                    last = alist[nact]
                    alist[p] = last
                    apos[last] = p
                    apos[t] = -1
                i += 1
            if nact == 0:
                continue
            hi = ev[order[i], 0] - 1
            same = nact == last_n
            if same:
                for k in range(nact):
                    if last_mark[alist[k]] != last_gen:
                        same = False
                        break
            if same:
                tgt = last_tgt
            else:
                gen += 1
                ns = _close(nact, alist, p_off, p_dst, mark, gen, stack, found)
                steps += ns
                tgt, pool, soff, table, dfinal, work = _intern(
                    found, ns, pool, soff, table, dfinal, work, finals, st, max_states
                )
                if tgt < 0:
                    return TOO_MANY, dfinal, rows, nrows, steps, st[3]
                last_gen += 1
                for k in range(nact):
                    last_mark[alist[k]] = last_gen
                last_n = nact
                last_tgt = tgt
            if nrows > row_start and rows[nrows - 1, 3] == tgt and rows[nrows - 1, 2] + 1 == lo:
                rows[nrows - 1, 2] = hi
            else:
                if nrows == rows.shape[0]:
                    big = np.empty((2 * nrows, 4), np.int64)
                    big[:nrows] = rows
                    rows = big
                rows[nrows, 0] = cur
                rows[nrows, 1] = lo
                rows[nrows, 2] = hi
                rows[nrows, 3] = tgt
                nrows += 1
        if steps > work_cap:
            return OVER_WORK, dfinal, rows, nrows, steps, st[3]
    return st[0], dfinal, rows, nrows, steps, st[3]


@numba.njit(cache=True)
def _order(ev, nev, order):
    """The events' order by point (ties in any order: a point's events are all taken before its interval)."""
    if nev > 48:
        return np.argsort(ev[:nev, 0])
    if order.shape[0] < nev:
        order = np.empty(2 * nev, np.int64)
    for k in range(nev):
        v = ev[k, 0]
        j = k - 1
        while j >= 0 and ev[order[j], 0] > v:
            order[j + 1] = order[j]
            j -= 1
        order[j + 1] = k
    return order


@numba.njit(cache=True)
def _intern(found, ns, pool, soff, table, dfinal, work, finals, st, max_states):
    """The DFA state of the NFA set found[:ns] (made and put on the work list if new; -1 past the cap).
    st: states, pool length, work length, set sizes summed."""
    if ns > 32:
        found[:ns] = np.sort(found[:ns])
    else:
        for k in range(1, ns):
            v = found[k]
            j = k - 1
            while j >= 0 and found[j] > v:
                found[j + 1] = found[j]
                j -= 1
            found[j + 1] = v
    members = found[:ns]
    h = _hash(members, 0, ns)
    mask = table.shape[0] - 1
    slot = np.int64(h & np.uint64(mask))
    while table[slot]:
        q = table[slot] - 1
        a = soff[q]
        if soff[q + 1] - a == ns:
            same = True
            for k in range(ns):
                if pool[a + k] != members[k]:
                    same = False
                    break
            if same:
                return q, pool, soff, table, dfinal, work
        slot = (slot + 1) & mask
    q = st[0]
    if q >= max_states:
        return -1, pool, soff, table, dfinal, work
    plen = st[1]
    pool = _grow(pool, plen + ns)
    pool[plen : plen + ns] = members
    st[1] = plen + ns
    soff = _grow(soff, q + 2)
    soff[q + 1] = plen + ns
    dfinal = _grow(dfinal, q + 1)
    f = 0
    for k in range(ns):
        if finals[members[k]]:
            f = 1
            break
    dfinal[q] = f
    table[slot] = q + 1
    st[0] = q + 1
    st[3] += ns
    if 2 * (q + 1) > table.shape[0]:
        table = np.zeros(table.shape[0] * 2, np.int64)
        bmask = table.shape[0] - 1
        for p in range(q + 1):
            sl = np.int64(_hash(pool, soff[p], soff[p + 1]) & np.uint64(bmask))
            while table[sl]:
                sl = (sl + 1) & bmask
            table[sl] = p + 1
    work = _grow(work, st[2] + 1)
    work[st[2]] = q
    st[2] += 1
    return q, pool, soff, table, dfinal, work


# -- "every key but these" (cpauto.not_words) lowered to byte rows -------------------------------------------
# Targets word_rows writes in place of states the caller makes afterwards.
TO_SINK, TO_ESCAPES, TO_HIGH, TO_END = -1, -2, -3, -4


@numba.njit(cache=True, inline="always")
def _edge(edges, ne, q, lo, hi, t):
    edges[ne] = q
    edges[ne + 1] = lo
    edges[ne + 2] = hi
    edges[ne + 3] = t
    return ne + 4


@numba.njit(cache=True)
def word_rows(parent, code, ends):
    """The byte rows of a `not_words` trie whose code points are all written as themselves inside a JSON string
    (0x20-0x7E but quote and backslash), as nfa._Builder.embed_words lowers them, state for state and in the
    same order: per trie state, the runs of such bytes (and 0x7F) that are no child's into the sink, a backslash
    into the sink's escapes, the children by code point; an epsilon edge into the sink's multi-byte forms and,
    unless a word ends there, one to the end. Sources and trie targets are trie states; other targets are the
    TO_* codes. Returns (edges as source, lo, hi, target; epsilon edges as source, target; the budget units
    `_word_row` counts: the rows' plan entries), or a negative count when a code point is not of that kind."""
    n = parent.shape[0]
    start = np.zeros(n + 1, np.int64)
    for t in range(1, n):
        c = code[t]
        if c < 0x20 or c > 0x7E or c == 0x22 or c == 0x5C:
            return np.empty(0, np.int32), np.empty(0, np.int32), -1
        start[parent[t] + 1] += 1
    for q in range(n):
        start[q + 1] += start[q]
    kids = np.empty(max(n - 1, 0), np.int64)
    fill = start[:n].copy()
    for t in range(1, n):
        p = parent[t]
        kids[fill[p]] = t
        fill[p] += 1
    for q in range(n):  # each state's children by code point (a handful: insertion sort)
        for i in range(start[q] + 1, start[q + 1]):
            x = kids[i]
            j = i - 1
            while j >= start[q] and code[kids[j]] > code[x]:
                kids[j + 1] = kids[j]
                j -= 1
            kids[j + 1] = x
    # Per state at most k + 3 runs, the backslash and k children (k children in all, n - 1 over the trie).
    edges = np.empty(4 * (2 * (n - 1) + 4 * n), np.int32)
    eps = np.empty(4 * n, np.int32)
    ne = 0
    np_ = 0
    units = 0
    for q in range(n):
        a, b = start[q], start[q + 1]
        i = a
        run = -1
        for byte in range(0x20, 0x80):
            taken = i < b and code[kids[i]] == byte
            if taken:
                i += 1
            if taken or byte == 0x22 or byte == 0x5C:
                if run >= 0:
                    ne = _edge(edges, ne, q, run, byte - 1, TO_SINK)
                    run = -1
            elif run < 0:
                run = byte
        if run >= 0:
            ne = _edge(edges, ne, q, run, 0x7F, TO_SINK)
        ne = _edge(edges, ne, q, 0x5C, 0x5C, TO_ESCAPES)
        eps[np_] = q
        eps[np_ + 1] = TO_HIGH
        np_ += 2
        for k in range(a, b):
            c = code[kids[k]]
            ne = _edge(edges, ne, q, c, c, kids[k])
        if not ends[q]:
            eps[np_] = q
            eps[np_ + 1] = TO_END
            np_ += 2
        # The plan: the gaps between children (the last one cut at the surrogates: two) and the children.
        if a == b:
            units += 2
        else:
            units += 3 + (b - a)
            for k in range(a + 1, b):
                if code[kids[k]] > code[kids[k - 1]] + 1:
                    units += 1
    return edges[:ne], eps[:np_], units


@numba.njit(cache=True)
def layout_rows(lay):
    """The rows of the layouts' inner states (nfa._Builder.layout), from (a, e, indent) triples: per layout,
    as nfa.layout_rows_into appends them. Returns flat (edges as source, lo, hi, target; epsilon edges as
    source, target)."""
    m = lay.shape[0] // 3
    edges = np.empty(4 * 5 * m, np.int32)
    eps = np.empty(2 * 2 * m, np.int32)
    ne = 0
    np_ = 0
    for i in range(m):
        a = lay[3 * i]
        e = lay[3 * i + 1]
        indent = lay[3 * i + 2]
        n = a + 2 if indent else e
        ne = _edge(edges, ne, a, 0x09, 0x09, e)
        ne = _edge(edges, ne, a, 0x20, 0x20, e)
        ne = _edge(edges, ne, a + 1, 0x0A, 0x0A, n)
        if indent:
            ne = _edge(edges, ne, n, 0x09, 0x09, n)
            ne = _edge(edges, ne, n, 0x20, 0x20, n)
            eps[np_] = n
            eps[np_ + 1] = e
            np_ += 2
        eps[np_] = a
        eps[np_ + 1] = e
        np_ += 2
    return edges[:ne], eps[:np_]


@numba.njit(cache=True)
def word_trie(codes, lens):
    """The trie of words given as their code points end to end (`codes`) and their lengths, states numbered as
    they are made, word by word: (per state the state it hangs from, -1 at the root; the code point into it;
    1 where a word ends; the count of states). Children are found by (state, code point) in an open-addressing
    table of twice the characters."""
    cap = codes.shape[0] + 1
    parent = np.empty(cap, np.int32)
    code = np.empty(cap, np.int32)
    ends = np.zeros(cap, np.uint8)
    parent[0] = -1
    code[0] = -1
    size = 16
    while size < 2 * cap:
        size *= 2
    slot_parent = np.full(size, -1, np.int32)
    slot_code = np.empty(size, np.int32)
    slot_child = np.empty(size, np.int32)
    n = 1
    k = 0
    for w in range(lens.shape[0]):
        s = 0
        for _ in range(lens[w]):
            c = codes[k]
            k += 1
            h = ((s * 1000003) ^ (c * 31)) & (size - 1)
            while True:
                if slot_parent[h] < 0:
                    slot_parent[h] = s
                    slot_code[h] = c
                    slot_child[h] = n
                    parent[n] = s
                    code[n] = c
                    s = n
                    n += 1
                    break
                if slot_parent[h] == s and slot_code[h] == c:
                    s = slot_child[h]
                    break
                h = (h + 1) & (size - 1)
        ends[s] = 1
    return parent[:n], code[:n], ends[:n], n


@numba.njit(cache=True)
def place_word_rows(edges, eps, first, sink, escapes, high, end):
    """word_rows' rows numbered in the NFA, in place: trie state q is state first + q, and the TO_* codes the
    states given."""
    for k in range(0, edges.shape[0], 4):
        edges[k] += first
        t = edges[k + 3]
        edges[k + 3] = t + first if t >= 0 else (sink if t == TO_SINK else escapes)
    for k in range(0, eps.shape[0], 2):
        eps[k] += first
        eps[k + 1] = high if eps[k + 1] == TO_HIGH else end


def warm_up() -> None:
    """Load the kernels (from numba's cache, or compile them on a first run): a two-state automaton, and the
    rows of "every string but ab"."""
    rows, eps, _ = word_rows(
        np.array([-1, 0, 1], np.int32), np.array([-1, 97, 98], np.int32), np.array([0, 0, 1], np.uint8)
    )
    place_word_rows(rows, eps, 0, 3, 4, 5, 6)
    word_trie(np.array([97, 98], np.int32), np.array([2], np.int32))
    layout_rows(np.array([0, 3, 1, 4, 6, 0], np.int32))
    edges = np.array([[97, 97, 1]], np.int64)
    determinize_kernel(
        np.array([0, 1, 1], np.int64),
        edges,
        np.zeros(3, np.int64),
        np.empty(0, np.int64),
        np.array([0, 1], np.uint8),
        0,
        4,
        WORK_CAP,
    )
