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


def warm_up() -> None:
    """Load the kernels (from numba's cache, or compile them on a first run): a two-state automaton."""
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
