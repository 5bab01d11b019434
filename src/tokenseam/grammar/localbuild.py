"""Building automaton states inside the mask walk, in numba, when no call stack is involved.

Most states a vocabulary walk reaches for the first time are successors whose configurations move only by byte
and plain epsilon edges (string bodies, key names, numbers): every configuration keeps its stack, and the new
state is the union of the targets' local epsilon closures. `build_local` makes such a state without leaving the
walk; anything else (a call, a rule end, a counter operation) is left to the Python builder (`Automaton.fill`).
With counters, the walk reads canonical rows (Automaton.ctrans) and starts at canonical states; a local move
keeps the stacks, so such a successor is canonical too and goes straight into the canonical row. Both produce the same state for the same configurations: the Python side writes
every state it makes into the pool here, and the numba side reads them through one hash index.

Arrays (all owned by `LocalBuilder`, grown from Python when a call reports it is out of room):
- nfa_e (edges, 3): first byte class, last byte class, target; e_off[q] .. e_off[q + 1] are q's edges;
- eps_off / eps_t: plain epsilon edges; qflags[q]: 1 stack operation, 2 universal (see ByteNFA.universal);
- loc[q] = (start, length) of q's local closure in loc_pool (-2 not computed yet, -1 touches a stack operation);
- cbody[q]: the counted loop whose body q is in (ByteNFA.counted_body), else -1; loop_hi[loop]: its maximum
  (-1: none); stk[stack] = (return state or -1 - loop, parent, counter value), as Automaton.stacks;
- cfg (pool, 2): (NFA state, stack) configurations; soff[state] = (offset, length, indexed);
- ht: open-addressing hash of states by configurations (state + 1, 0 empty);
- meta: see the M_* constants.
"""

from __future__ import annotations

import numba
import numpy as np

M_STATES = 0  # states made so far (Python and numba)
M_INDEXED = 1  # states below this are in the hash index (or not eligible)
M_LOC_USED = 2
M_CFG_USED = 3
M_HT_COUNT = 4
M_EPOCH = 5  # stamp for `mark` (visited NFA states of the closure being computed)
M_GROW = 6  # what ran out of room: G_* below
M_MAX_STATES = 7
G_STATES, G_CFG, G_LOC, G_HT = 1, 2, 3, 4
LOCAL_LIMIT = 256  # Automaton._local's limit on a closure's size
NEED_PYTHON = -2  # same value as automaton.UNKNOWN: the walk hands the transition to Python
NO_ROOM = -3
UNBOUNDED = 1 << 30  # automaton.UNBOUNDED


@numba.njit(cache=True, nogil=True, inline="always")
def _key(q, st):
    return (np.int64(q) << 32) | np.int64(st)


@numba.njit(cache=True, nogil=True)
def _hash(cfg, off, n):
    h = np.int64(-3750763034362895579)
    for k in range(off, off + n):
        h = (h ^ _key(cfg[k, 0], cfg[k, 1])) * np.int64(1099511628211)
        h ^= h >> 29
    return h


@numba.njit(cache=True, nogil=True)
def _insert(ht, cfg, soff, sid):
    mask = ht.shape[0] - 1
    j = _hash(cfg, soff[sid, 0], soff[sid, 1]) & mask
    while ht[j] != 0:
        j = (j + 1) & mask
    ht[j] = sid + 1


@numba.njit(cache=True, nogil=True)
def index_states(ht, cfg, soff, meta):
    """Index the states made by Python since the last call (only those marked eligible in soff[:, 2])."""
    for sid in range(meta[M_INDEXED], meta[M_STATES]):
        if soff[sid, 2]:
            _insert(ht, cfg, soff, sid)
            meta[M_HT_COUNT] += 1
    meta[M_INDEXED] = meta[M_STATES]


@numba.njit(cache=True, nogil=True)
def rehash(ht, cfg, soff, n):
    for sid in range(n):
        if soff[sid, 2]:
            _insert(ht, cfg, soff, sid)


@numba.njit(cache=True, nogil=True)
def _local(q0, e_off, eps_off, eps_t, qflags, loc, loc_pool, mark, meta):
    """Start of q0's local closure in loc_pool (its NFA states with byte edges, ascending), -1 if the closure
    touches a stack operation or grows past LOCAL_LIMIT, NO_ROOM if the pool is full."""
    s = loc[q0, 0]
    if s != -2:
        return s
    meta[M_EPOCH] += 1
    ep = meta[M_EPOCH]
    seen = np.empty(LOCAL_LIMIT + 64, np.int64)
    stack = np.empty(LOCAL_LIMIT + 64, np.int64)
    ns = 1
    seen[0] = q0
    mark[q0] = ep
    top = 1
    stack[0] = q0
    ok = True
    while top > 0:
        top -= 1
        q = stack[top]
        if qflags[q] & 1:
            ok = False
            break
        for k in range(eps_off[q], eps_off[q + 1]):
            t = eps_t[k]
            if mark[t] != ep:
                mark[t] = ep
                if ns == seen.shape[0]:
                    grown = np.empty(ns * 2, np.int64)
                    grown[:ns] = seen
                    seen = grown
                    grown = np.empty(ns * 2, np.int64)
                    grown[:top] = stack[:top]
                    stack = grown
                seen[ns] = t
                ns += 1
                stack[top] = t
                top += 1
        if ns > LOCAL_LIMIT:
            ok = False
            break
    if not ok:
        loc[q0, 0] = -1
        return -1
    used = meta[M_LOC_USED]
    if used + ns > loc_pool.shape[0]:
        meta[M_GROW] = G_LOC
        return NO_ROOM
    res = np.sort(seen[:ns])
    m = 0
    for k in range(ns):
        q = res[k]
        if e_off[q + 1] > e_off[q]:
            loc_pool[used + m] = q
            m += 1
    loc[q0, 0] = used
    loc[q0, 1] = m
    meta[M_LOC_USED] = used + m
    return used


@numba.njit(cache=True, nogil=True)
def build_local(s, c, trans, flags, budget, e_off, nfa_e, eps_off, eps_t, qflags, cbody, loop_hi, stk, loc, loc_pool,
                mark, cfg, soff, ht, meta):
    """The successor of state s on byte class c, written to trans for the run of classes around c that every
    edge treats alike; NEED_PYTHON when a move's closure is not local, NO_ROOM when an array is full."""
    ncls = trans.shape[1]
    a = soff[s, 0]
    m = soff[s, 1]
    c0 = 0
    c1 = ncls - 1
    nm = 0
    for k in range(a, a + m):
        q = cfg[k, 0]
        nm += e_off[q + 1] - e_off[q]
    mt = np.empty(max(nm, 1), np.int64)
    ms = np.empty(max(nm, 1), np.int64)
    nm = 0
    for k in range(a, a + m):
        q = cfg[k, 0]
        for e in range(e_off[q], e_off[q + 1]):
            lo = nfa_e[e, 0]
            hi = nfa_e[e, 1]
            if lo <= c <= hi:
                if lo > c0:
                    c0 = lo
                if hi < c1:
                    c1 = hi
                mt[nm] = nfa_e[e, 2]
                ms[nm] = cfg[k, 1]
                nm += 1
            elif hi < c:
                if hi + 1 > c0:
                    c0 = hi + 1
            elif lo - 1 < c1:
                c1 = lo - 1
    if nm == 0:
        for j in range(c0, c1 + 1):
            trans[s, j] = -1
        return -1
    total = 0
    for k in range(nm):
        r = _local(mt[k], e_off, eps_off, eps_t, qflags, loc, loc_pool, mark, meta)
        if r < 0:
            return NEED_PYTHON if r == -1 else NO_ROOM
        total += loc[mt[k], 1]
    if total == 0:
        return NEED_PYTHON  # Python decides what an empty successor is
    keys = np.empty(total, np.int64)
    j = 0
    for k in range(nm):
        st = ms[k]
        p0 = loc[mt[k], 0]
        for x in range(p0, p0 + loc[mt[k], 1]):
            keys[j] = _key(loc_pool[x], st)
            j += 1
    keys.sort()
    u = 0
    for k in range(total):
        if u == 0 or keys[k] != keys[u - 1]:
            keys[u] = keys[k]
            u += 1
    # Look the configurations up.
    h = np.int64(-3750763034362895579)
    for k in range(u):
        h = (h ^ keys[k]) * np.int64(1099511628211)
        h ^= h >> 29
    hmask = ht.shape[0] - 1
    jj = h & hmask
    found = -1
    while ht[jj] != 0:
        sid = ht[jj] - 1
        if soff[sid, 1] == u:
            o = soff[sid, 0]
            same = True
            for k in range(u):
                if _key(cfg[o + k, 0], cfg[o + k, 1]) != keys[k]:
                    same = False
                    break
            if same:
                found = sid
                break
        jj = (jj + 1) & hmask
    if found < 0:
        sid = meta[M_STATES]
        if sid >= meta[M_MAX_STATES]:
            return NEED_PYTHON  # Python raises the state-budget error
        if sid >= trans.shape[0] or sid >= soff.shape[0]:
            meta[M_GROW] = G_STATES
            return NO_ROOM
        o = meta[M_CFG_USED]
        if o + u > cfg.shape[0]:
            meta[M_GROW] = G_CFG
            return NO_ROOM
        if 2 * (meta[M_HT_COUNT] + 1) > ht.shape[0]:
            meta[M_GROW] = G_HT
            return NO_ROOM
        room = -1  # as Automaton._safe_budget
        for k in range(u):
            q = keys[k] >> 32
            st = keys[k] & 0xFFFFFFFF
            cfg[o + k, 0] = q
            cfg[o + k, 1] = st
            if qflags[q] & 2:
                room = UNBOUNDED
            lid = cbody[q]
            if lid >= 0 and st > 1 and stk[st, 0] == -1 - lid:
                room = UNBOUNDED if loop_hi[lid] < 0 else max(room, loop_hi[lid] - stk[st, 2])
        room = min(room, UNBOUNDED)
        meta[M_CFG_USED] = o + u
        soff[sid, 0] = o
        soff[sid, 1] = u
        soff[sid, 2] = 1
        flags[sid] = 5 if room > 0 else 1
        budget[sid] = max(room, 0)
        ht[jj] = sid + 1
        meta[M_HT_COUNT] += 1
        meta[M_STATES] = sid + 1
        meta[M_INDEXED] = sid + 1
        found = sid
    for j in range(c0, c1 + 1):
        trans[s, j] = found
    return found


class LocalBuilder:
    """The numba-side view of an automaton's NFA and states (see the module docstring)."""

    def __init__(self, nfa, cls_of: list[int], special: set[int]) -> None:
        from .automaton import MAX_DFA_STATES

        n = nfa.size
        self.meta = np.zeros(8, dtype=np.int64)
        self.meta[M_MAX_STATES] = MAX_DFA_STATES
        self.cfg = np.zeros((1024, 2), dtype=np.int32)
        self.soff = np.zeros((256, 3), dtype=np.int64)
        self.ht = np.zeros(1024, dtype=np.int32)
        self.stk = np.zeros((256, 3), dtype=np.int64)
        self.cbody = np.full(n, -1, dtype=np.int32)
        for q, lid in nfa.counted_body.items():
            self.cbody[q] = lid
        self.loop_hi = np.asarray([-1 if hi is None else hi for _, hi in nfa.loops] or [0], dtype=np.int64)
        edges = nfa.edges
        counts = np.fromiter((len(r) for r in edges), dtype=np.int32, count=n)
        self.e_off = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(counts, out=self.e_off[1:])
        flat = [(cls_of[lo], cls_of[hi], t) for r in edges for lo, hi, t in r]
        self.nfa_e = np.asarray(flat, dtype=np.int32).reshape(-1, 3) if flat else np.zeros((1, 3), dtype=np.int32)
        eps = nfa.eps
        counts = np.fromiter((len(r) for r in eps), dtype=np.int32, count=n)
        self.eps_off = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(counts, out=self.eps_off[1:])
        flat_t = [t for r in eps for t in r]
        self.eps_t = np.asarray(flat_t, dtype=np.int32) if flat_t else np.zeros(1, dtype=np.int32)
        self.qflags = np.zeros(n, dtype=np.int8)
        if special:
            self.qflags[np.fromiter(special, dtype=np.int64)] |= 1
        if nfa.universal:
            self.qflags[np.fromiter(nfa.universal, dtype=np.int64)] |= 2
        self.loc = np.full((n, 2), -2, dtype=np.int32)
        self.loc_pool = np.zeros(max(1024, 2 * n), dtype=np.int32)
        self.mark = np.zeros(n, dtype=np.int32)

    def add(self, sid: int, configs: tuple, eligible: bool) -> None:
        """Record a state made by Python (eligible: not accepting and without escapes, as local successors)."""
        meta = self.meta
        o = int(meta[M_CFG_USED])
        u = len(configs)
        if o + u > self.cfg.shape[0]:
            self._grow_cfg(o + u)
        if u:
            self.cfg[o:o + u] = configs
        if sid >= self.soff.shape[0]:
            self.grow_states(2 * self.soff.shape[0])
        self.soff[sid] = (o, u, 1 if eligible and u else 0)
        meta[M_CFG_USED] = o + u
        meta[M_STATES] = sid + 1

    def add_stack(self, sid: int, ret: int, parent: int, value: int) -> None:
        if sid >= self.stk.shape[0]:
            grown = np.zeros((2 * self.stk.shape[0], 3), dtype=np.int64)
            grown[: self.stk.shape[0]] = self.stk
            self.stk = grown
        self.stk[sid] = (ret, parent, value)

    def grow_states(self, cap: int) -> None:
        if cap > self.soff.shape[0]:
            grown = np.zeros((cap, 3), dtype=np.int64)
            grown[: self.soff.shape[0]] = self.soff
            self.soff = grown

    def _grow_cfg(self, need: int) -> None:
        cap = max(2 * self.cfg.shape[0], need)
        grown = np.zeros((cap, 2), dtype=np.int32)
        grown[: self.cfg.shape[0]] = self.cfg
        self.cfg = grown

    def grow(self, automaton) -> None:
        """Make room for whatever the last numba call ran out of (meta[M_GROW])."""
        what = int(self.meta[M_GROW])
        self.meta[M_GROW] = 0
        if what == G_STATES:
            automaton._grow(2 * automaton.trans.shape[0])
        elif what == G_CFG:
            self._grow_cfg(2 * self.cfg.shape[0])
        elif what == G_LOC:
            grown = np.zeros(2 * self.loc_pool.shape[0], dtype=np.int32)
            grown[: self.loc_pool.shape[0]] = self.loc_pool
            self.loc_pool = grown
        elif what == G_HT:
            self._rehash(2 * self.ht.shape[0])

    def index(self) -> None:
        """Index the states Python made since the last walk (the hash stays at most half full)."""
        meta = self.meta
        if meta[M_INDEXED] < meta[M_STATES]:
            need = 2 * int(meta[M_HT_COUNT] + meta[M_STATES] - meta[M_INDEXED]) + 2
            if need > self.ht.shape[0]:
                self._rehash(1 << need.bit_length())
            index_states(self.ht, self.cfg, self.soff, meta)

    def _rehash(self, size: int) -> None:
        self.ht = np.zeros(size, dtype=np.int32)
        rehash(self.ht, self.cfg, self.soff, int(self.meta[M_INDEXED]))

    def new_configs(self, sid: int) -> tuple:
        o, u, _ = self.soff[sid]
        rows = self.cfg[o:o + u].tolist()
        return tuple([(q, st) for q, st in rows])
