"""The mask walk over the vocabulary, and the automaton states it builds, in numba.

Why this file is over 700 lines: every numba function the walk calls lives here, since numba's cache is checked
against each function's own source file, so a walk cached beside a changed builder in another file would run
the old builder.

A vocabulary walk that meets a missing transition used to return to Python for every new state (25-35 µs
each). `fill` makes the successor here instead: the moves on the byte class, then each target's epsilon
closure through plain epsilon edges, rule calls (pushing a frame) and rule ends (popping one), as
`Automaton.closure` does, counter operations included. A closure that grows past CLOSURE_LIMIT is left to
Python (`Automaton.fill`, the reference). Both sides make the same state for the same (configurations,
accepting, escapes): Python writes every state and stack it makes into the arrays here, numba reads them
through hash indexes, and `Automaton._sync` takes in what numba made.

The first visit of a position does more than walk: `group_by_frame` groups its configurations by call frame
(the mask keys of its parts, as `MaskCache._group_by_frame_py`), and `escape_target` finds where a local
state's escapes lead on a real stack (`Automaton._escape_target_py`, for tokens that run past the end of a
called rule). Both rebuild stacks and make states with the same helpers as `fill` (`_position` is
`Automaton._position`, `_intern` is `Automaton._intern`). What they cannot do (a set too large, a state budget
reached) they hand back to the Python versions, which stay the reference.

These functions (and the walk calling them) hold the GIL: they change the automaton's arrays, which Python
code in another thread must not see half-made.

No reference counting: the walk and the builders it calls are compiled with numba's reference counting off
(`_nrt=False`). With it on, every call of a function handed the `BuilderArrays` tuple incremented and
decremented the count of each of its arrays (atomic operations, about 60 per call), which was most of the cost
of a new state. So they allocate nothing: their working arrays are one process-wide `Scratch`, and what would
outgrow it goes to Python like any case they leave. Only the first-visit functions below that allocate
(`group_by_frame`, `escape_target`, `_position`, `_common`) keep reference counting; they run once per new
position.

Counter clamping: with counters, the walk reads clamped rows (`Automaton.clamped_trans`), whose successors have
every counter far from its bounds clamped to one value (`Automaton.clamped`), and starts at clamped states. A
successor built here is clamped (`_clamp_stack`, as `Automaton._clamp_stack`) when its closure ran a counter
operation; else its new frames are calls on clamped stacks, so it is clamped already. Either way it goes
straight into the clamped row. Commits need the real successors: they call `fill` with clamp False, on the
real rows.

Arrays (one `BuilderArrays` tuple per call; a call that runs out of room returns NO_ROOM and Python grows
meta[M_GROW]):
- trans, flags, budget, accepting: the automaton's per-state arrays (flags: LIVE, ESCAPES, SAFE_SINK);
- nfa_e (edges, 3): first byte class, last byte class, target; e_off[q] .. e_off[q + 1] are q's edges;
- eps_off / eps_t: plain epsilon edges;
- qinfo[q] = (flags, called rule, return state, ended rule, counted loop of the body q is in, counter operation's
  target, its loop, set operation code, safe-text budget of a counted body's pattern state), -1 for none;
  flags: Q_STACK any stack operation, Q_UNIV universal (ByteNFA.universal), the counter operation (Q_CPUSH,
  Q_CINC, Q_CGUARD, Q_CEXIT, Q_SET), Q_COUNTER more than one (left to Python);
- loops[loop] = (min, max or -1 for none, reach T, slack): what `Automaton.clamped` clamps by;
- sets[loop] = (declared properties, required mask, min, max or -1, extras allowed, dead mask) of an any-order
  object's set frame (anyorder.SetSpec; zeros for other loops), whose operation code is qinfo[q, 7];
- loc[q] = (start, length) of q's local closure (no stack operation) in loc_pool; start LOC_TODO not computed,
  NOT_LOCAL not local;
- cfg (pool, 2): (NFA state, stack) configurations; escp: escape NFA states;
  soff[state] = (configurations offset, count, escapes offset, count);
- stk[stack] = (return state or -1 - loop, parent, counter value), as stacks.Stacks;
- ht / sht: open-addressing hashes of states / stacks (id + 1, 0 empty), at most half full;
- meta: the M_* counters;
- sc_*: the process's `Scratch` (working arrays, not state).
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from .anyorder import EXIT, SEP

M_STATES = 0  # states made so far (Python and numba)
M_INDEXED = 1  # states below this are in ht
M_LOC_USED = 2
M_CFG_USED = 3
M_EPOCH = 4  # stamp for `mark` (NFA states seen by the local closure being computed)
M_GROW = 5  # what ran out of room: G_* below
M_MAX_STATES = 6  # 0: every state is built by Python (LocalBuilder's python_builder)
M_STACKS = 7  # stacks made so far
M_SINDEXED = 8  # stacks below this are in sht
M_ESC_USED = 9
N_META = 10
START_ROWS = 256  # first sizes of the arrays (a power of two); they double when full
G_STATES, G_CFG, G_LOC, G_HT, G_STACKS, G_ESC = 1, 2, 3, 4, 5, 6
Q_STACK, Q_UNIV, Q_COUNTER, Q_CPUSH, Q_CINC, Q_CGUARD, Q_CEXIT, Q_SET = 1, 2, 4, 8, 16, 32, 64, 128
Q_CTR = Q_CPUSH | Q_CINC | Q_CGUARD | Q_CEXIT
CLOSED, COUNTED = 0, 1  # from _closure: done; done, and a counter operation ran
LOCAL_LIMIT = 256  # Automaton._local's limit on a local closure's size
CLOSURE_LIMIT = 4096  # larger closures go to Python (which also raises on explosions)
# A state holding more configurations than this is an error (Automaton._intern): every mask and commit from
# it costs time in their number, and an ambiguous grammar doubles them with every byte. The largest state of
# the MaskBench dev split holds 1,554.
MAX_STATE_CONFIGS = 20_000
CHAIN_LIMIT = 1 << 14  # stacks deeper than this are rebuilt by Python
SC_EPOCH, SC_SEEN = 0, 1  # Scratch.meta: the stamp of the closure being computed, how many it has seen
LOC_TODO, NOT_LOCAL = -2, -1  # loc[q, 0] before q's local closure is computed; when it is not local
# Shared with automaton.py and masks.py, which import them from here.
DEAD = -1  # a transition (or state) with nothing left alive
UNKNOWN = -2  # a transition not built yet; from `fill`: hand it to Python
NEED_PYTHON = UNKNOWN  # a builder's answer: this case is Python's
NO_ROOM = -3  # a builder's answer: an array is full (meta[M_GROW] says which)
TOO_DEEP = -4  # group_by_frame's answer: its configurations lie too deep below their frames (GROUP_WORK)
# Frames group_by_frame walks down, over all of a state's configurations, before it gives up: a state of n
# configurations n frames deep (a chain of n nullable rules) would cost n * n steps at each of its frames.
GROUP_WORK = 1 << 18
ROOT = 0  # the stack id of the empty stack
BOT = 1  # the stack id standing for "whatever frames lie below" in a stack-independent (local) state
UNBOUNDED = 1 << 30  # a safe-text budget without limit
# State flags (Automaton.flags): LIVE has configurations or accepts; ESCAPES needs the frames below BOT (a rule
# end or counter operation there); SAFE_SINK: any string-safe text of up to budget[state] code points stays
# alive (a free string body, "any key but these", a maxLength string with room left; Automaton._safe_budget).
LIVE, ESCAPES, SAFE_SINK = 1, 2, 4
# walk_esc's answers: done; Python must build states[pos[1]]'s transition; `rec` is full; an array is full.
WALK_DONE, WALK_NEEDS_PYTHON, WALK_REC_FULL, WALK_NO_ROOM = 0, 1, 2, 3
NO_DEAD = 1 << 30  # walk_esc's dead depth when the previous token did not die
_SEED = -3750763034362895579
_MUL = 1099511628211


class BuilderArrays(NamedTuple):
    """Every array the builders read or write, handed to numba as one tuple (`LocalBuilder.arrays`; see the
    module docstring). The first four are the automaton's per-state arrays; `trans` is the rows being built:
    the clamped rows for a walk, the real ones for a commit."""

    trans: np.ndarray
    flags: np.ndarray
    budget: np.ndarray
    accepting: np.ndarray
    byte_class: np.ndarray
    e_off: np.ndarray
    nfa_e: np.ndarray
    eps_off: np.ndarray
    eps_t: np.ndarray
    qinfo: np.ndarray
    rule_start: np.ndarray
    loops: np.ndarray
    sets: np.ndarray
    loc: np.ndarray
    loc_pool: np.ndarray
    mark: np.ndarray
    cfg: np.ndarray
    soff: np.ndarray
    escp: np.ndarray
    ht: np.ndarray
    stk: np.ndarray
    sht: np.ndarray
    meta: np.ndarray
    # Scratch space (the process's one `Scratch`), so that the builders allocate nothing.
    sc_keys: np.ndarray
    sc_escs: np.ndarray
    sc_moves: np.ndarray
    sc_seen: np.ndarray
    sc_work: np.ndarray
    sc_local: np.ndarray
    sc_chain: np.ndarray
    sc_meta: np.ndarray


class Scratch:
    """The builders' working arrays, one set per process: `fill`'s moves and the successor's configurations
    and escapes, `_closure`'s seen set (open addressing over (key, stamp) rows, SC_EPOCH the current stamp) and
    work stack, `_local`'s seen list and stack, `_chain`'s frames. A builder that would outgrow them leaves the
    case to Python, as past CLOSURE_LIMIT. One set is enough: every builder holds the GIL and none calls back
    into Python, so two never run at once.

    The builders allocate nothing (they are compiled without numba's reference counting, which would cost each
    call an atomic increment and decrement per array it is handed). `closure`, `local`, `chain`: room for
    that many closure configurations, local closure states and stack frames (smaller only in tests)."""

    def __init__(
        self, closure: int = CLOSURE_LIMIT, local: int = LOCAL_LIMIT + 64, chain: int = CHAIN_LIMIT
    ) -> None:
        self.keys = np.empty(8 * closure, np.int64)
        self.escs = np.empty(2 * closure, np.int64)
        self.moves = np.empty((8 * closure, 2), np.int64)
        # rows: a power of two, so a closure of `closure` configurations fills at most a quarter of it
        self.seen = np.zeros((1 << (4 * closure - 1).bit_length(), 2), np.int64)
        self.work = np.empty((closure, 2), np.int64)
        self.local = np.empty((2, local), np.int64)
        self.chain = np.empty(chain, np.int64)
        self.meta = np.zeros(2, np.int64)


@numba.njit(cache=True, inline="always", _nrt=False)
def _key(q, st):
    return (np.int64(q) << 32) | np.int64(st)


@numba.njit(cache=True, inline="always", _nrt=False)
def _mix(h, x):
    h = (h ^ x) * np.int64(_MUL)
    return h ^ (h >> 29)


@numba.njit(cache=True, _nrt=False)
def _state_hash(cfg, soff, escp, accepting, sid):
    h = np.int64(_SEED)
    o = soff[sid, 0]
    for k in range(o, o + soff[sid, 1]):
        h = _mix(h, _key(cfg[k, 0], cfg[k, 1]))
    h = _mix(h, np.int64(1 if accepting[sid] else 0))
    o = soff[sid, 2]
    for k in range(o, o + soff[sid, 3]):
        h = _mix(h, np.int64(escp[k]))
    return h


@numba.njit(cache=True, _nrt=False)
def _stack_hash(ret, parent, value):
    return _mix(_mix(_mix(np.int64(_SEED), np.int64(ret)), np.int64(parent)), np.int64(value))


@numba.njit(cache=True, _nrt=False)
def _put(table, h, v):
    mask = table.shape[0] - 1
    j = h & mask
    while table[j] != 0:
        j = (j + 1) & mask
    table[j] = v + 1


@numba.njit(cache=True, _nrt=False)
def rehash(ht, sht, cfg, soff, escp, accepting, stk, meta):
    """Fill empty hash tables with every indexed state and stack."""
    for sid in range(meta[M_INDEXED]):
        _put(ht, _state_hash(cfg, soff, escp, accepting, sid), sid)
    for x in range(meta[M_SINDEXED]):
        _put(sht, _stack_hash(stk[x, 0], stk[x, 1], stk[x, 2]), x)


@numba.njit(cache=True, _nrt=False)
def index_new(ht, sht, cfg, soff, escp, accepting, stk, meta):
    """Index the states and stacks Python made since the last call."""
    for sid in range(meta[M_INDEXED], meta[M_STATES]):
        _put(ht, _state_hash(cfg, soff, escp, accepting, sid), sid)
    meta[M_INDEXED] = meta[M_STATES]
    for x in range(meta[M_SINDEXED], meta[M_STACKS]):
        _put(sht, _stack_hash(stk[x, 0], stk[x, 1], stk[x, 2]), x)
    meta[M_SINDEXED] = meta[M_STACKS]


@numba.njit(cache=True, _nrt=False)
def _push(ret, parent, value, ar):
    """The stack id of frame (ret, value) on `parent`, made if new; NO_ROOM when an array is full."""
    stk, sht, meta = ar.stk, ar.sht, ar.meta
    h = _stack_hash(ret, parent, value)
    mask = sht.shape[0] - 1
    j = h & mask
    while sht[j] != 0:
        x = sht[j] - 1
        if stk[x, 0] == ret and stk[x, 1] == parent and stk[x, 2] == value:
            return x
        j = (j + 1) & mask
    x = meta[M_STACKS]
    if x >= stk.shape[0] or 2 * (x + 1) > sht.shape[0]:
        meta[M_GROW] = G_STACKS
        return NO_ROOM
    stk[x, 0] = ret
    stk[x, 1] = parent
    stk[x, 2] = value
    sht[j] = x + 1
    meta[M_STACKS] = x + 1
    meta[M_SINDEXED] = x + 1
    return x


@numba.njit(cache=True, _nrt=False)
def _chain(st, until, stk, chain):
    """The frames of stack st from its top down to `until` or a root (0, BOT), top first, into `chain` (scratch):
    (how many, the stack where it stopped); how many is -1 when `chain` is too short (Python's case)."""
    n = 0
    x = st
    while x != until and x > BOT:
        if n == chain.shape[0]:
            return -1, x
        chain[n] = x
        n += 1
        x = stk[x, 1]
    return n, x


@numba.njit(cache=True, _nrt=False)
def _clamp_stack(st, ar):
    """Stack st with every counter frame's value clamped as Automaton._clamp_stack does (NO_ROOM when full)."""
    loops, stk, chain = ar.loops, ar.stk, ar.sc_chain
    n, cur = _chain(st, -1, stk, chain)
    if n < 0:
        return NEED_PYTHON
    for k in range(n - 1, -1, -1):
        f = chain[k]
        ret = stk[f, 0]
        v0 = stk[f, 2]
        v = v0
        if ret < 0:
            lid = -1 - ret
            lo = loops[lid, 0]
            unbounded = loops[lid, 1] < 0
            hi = loops[lid, 1] - loops[lid, 3]
            t = loops[lid, 2]
            if v < lo:
                if lo - v > t:
                    v = lo - t - 1
            elif unbounded or hi - v > t:
                if unbounded or hi - lo > t:
                    v = lo
        if cur == stk[f, 1] and v == v0:
            cur = f
        else:
            cur = _push(ret, cur, v, ar)
            if cur < 0:
                return cur
    return cur


@numba.njit(cache=True, _nrt=False)
def _local(q0, ar):
    """Start of q0's local closure in loc_pool (its NFA states with byte edges, ascending), -1 if the closure
    touches a stack operation or grows past LOCAL_LIMIT (as Automaton._local), NO_ROOM if the pool is full."""
    e_off, eps_off, eps_t, qinfo, loc, loc_pool, mark, meta = (
        ar.e_off,
        ar.eps_off,
        ar.eps_t,
        ar.qinfo,
        ar.loc,
        ar.loc_pool,
        ar.mark,
        ar.meta,
    )
    s = loc[q0, 0]
    if s != LOC_TODO:
        return s
    meta[M_EPOCH] += 1
    ep = meta[M_EPOCH]
    seen = ar.sc_local[0]
    stack = ar.sc_local[1]
    ns = 1
    seen[0] = q0
    mark[q0] = ep
    top = 1
    stack[0] = q0
    ok = True
    while top > 0:
        top -= 1
        q = stack[top]
        if qinfo[q, 0] & Q_STACK:
            ok = False
            break
        for k in range(eps_off[q], eps_off[q + 1]):
            t = eps_t[k]
            if mark[t] != ep:
                mark[t] = ep
                if ns == seen.shape[0]:  # past LOCAL_LIMIT already: not local
                    ok = False
                    break
                seen[ns] = t
                ns += 1
                stack[top] = t
                top += 1
        if not ok or ns > LOCAL_LIMIT:
            ok = False
            break
    if not ok:
        loc[q0, 0] = NOT_LOCAL
        return NOT_LOCAL
    used = meta[M_LOC_USED]
    if used + ns > loc_pool.shape[0]:
        meta[M_GROW] = G_LOC
        return NO_ROOM
    _sort(seen, ns)
    m = 0
    for k in range(ns):
        q = seen[k]
        if e_off[q + 1] > e_off[q]:
            loc_pool[used + m] = q
            m += 1
    loc[q0, 0] = used
    loc[q0, 1] = m
    meta[M_LOC_USED] = used + m
    return used


@numba.njit(cache=True, inline="always", _nrt=False)
def _popcount(x):
    n = 0
    while x:
        x &= x - 1
        n += 1
    return n


@numba.njit(cache=True, _nrt=False)
def _set_viable(row, seen, count):
    """anyorder.viable on a `sets` row (nbits, required, min, max or -1, extras, dead)."""
    if row[3] >= 0 and count + _popcount(row[1] & ~seen) > row[3]:
        return False
    return row[4] != 0 or count + row[0] - _popcount(seen | row[5]) >= row[2]


@numba.njit(cache=True, _nrt=False)
def _set_added(row, count):
    return count + 1 if row[3] >= 0 else min(count + 1, row[2])


@numba.njit(cache=True, _nrt=False)
def _set_step(sets, lid, value, code):
    """anyorder.step: the set frame's value after operation `code`, -1 when it is not allowed."""
    row = sets[lid]
    nbits = row[0]
    seen = value & ((np.int64(1) << nbits) - 1)
    count = value >> nbits
    if code == EXIT:
        return value if (seen & row[1]) == row[1] and count >= row[2] else -1
    full = row[3] >= 0 and count >= row[3]
    if code == SEP:
        if full:
            return -1
        c2 = _set_added(row, count)
        if row[4] != 0 and _set_viable(row, seen, c2):
            return value
        for i in range(nbits):
            b = np.int64(1) << i
            if not (seen | row[5]) & b and _set_viable(row, seen | b, c2):
                return value
        return -1
    if code >= 0:
        b = np.int64(1) << code
        if (seen | row[5]) & b:
            return -1
        seen |= b
    elif row[4] == 0:
        return -1
    if full:
        return -1
    count = _set_added(row, count)
    return seen | (count << nbits) if _set_viable(row, seen, count) else -1


@numba.njit(cache=True, _nrt=False, inline="always")
def _visit(q, st, top, limit, ar):
    """Push configuration (q, st) on the closure's work stack above `top` unless the closure (stamped
    sc_meta[SC_EPOCH]) has seen it: the new top, or -1 when that would make more than `limit` configurations seen.
    The seen set is open addressing over (key, stamp) rows: rows of other stamps are empty."""
    seen, work, meta = ar.sc_seen, ar.sc_work, ar.sc_meta
    ep = meta[SC_EPOCH]
    x = _key(q, st)
    mask = seen.shape[0] - 1
    j = _mix(np.int64(_SEED), x) & mask
    while seen[j, 1] == ep:
        if seen[j, 0] == x:
            return top
        j = (j + 1) & mask
    if meta[SC_SEEN] == limit:
        return -1
    meta[SC_SEEN] += 1
    seen[j, 0] = x
    seen[j, 1] = ep
    work[top, 0] = q
    work[top, 1] = st
    return top + 1


@numba.njit(cache=True, _nrt=False)
def _closure(t0, st0, keys, nk, escs, ne, ar):
    """Append the closure of (t0, st0) to keys (configurations with byte edges) and escs (escape states), as
    Automaton._closure_loop. Returns (status, nk, ne, accepting): status CLOSED, COUNTED (a counter operation ran),
    NEED_PYTHON (too large for CLOSURE_LIMIT or the scratch arrays, or a case left to Python) or NO_ROOM."""
    e_off, eps_off, eps_t, qinfo, rule_start, loops, stk, work = (
        ar.e_off,
        ar.eps_off,
        ar.eps_t,
        ar.qinfo,
        ar.rule_start,
        ar.loops,
        ar.stk,
        ar.sc_work,
    )
    limit = min(CLOSURE_LIMIT, work.shape[0], ar.sc_seen.shape[0] // 4)
    ar.sc_meta[SC_EPOCH] += 1
    ar.sc_meta[SC_SEEN] = 0
    top = _visit(t0, st0, 0, limit, ar)
    acc = False
    if top < 0:
        return NEED_PYTHON, nk, ne, acc
    counted = False
    while top:
        top -= 1
        q = work[top, 0]
        st = work[top, 1]
        f = qinfo[q, 0]
        if f & Q_COUNTER:
            return NEED_PYTHON, nk, ne, acc
        for k in range(eps_off[q], eps_off[q + 1]):
            top = _visit(eps_t[k], st, top, limit, ar)
            if top < 0:
                return NEED_PYTHON, nk, ne, acc
        r = qinfo[q, 1]
        if r >= 0:
            st2 = _push(qinfo[q, 2], st, 0, ar)
            if st2 < 0:
                return NO_ROOM, nk, ne, acc
            top = _visit(rule_start[r], st2, top, limit, ar)
            if top < 0:
                return NEED_PYTHON, nk, ne, acc
        if f & (Q_CTR | Q_SET):
            counted = True
            tq = np.int64(qinfo[q, 5])
            lid = qinfo[q, 6]
            nq = -1
            ns = np.int64(-1)
            if f & Q_CPUSH:
                ns = _push(-1 - lid, st, 0, ar)
                if ns < 0:
                    return NO_ROOM, nk, ne, acc
                nq = tq
            elif st == BOT:
                if ne == escs.shape[0]:
                    return NEED_PYTHON, nk, ne, acc
                escs[ne] = q
                ne += 1
            elif st == ROOT:
                return NEED_PYTHON, nk, ne, acc
            elif f & Q_SET:  # an any-order object's set frame (anyorder.py)
                code = qinfo[q, 7]
                v2 = _set_step(ar.sets, lid, stk[st, 2], code)
                if v2 >= 0:
                    nq = tq
                    if code == EXIT:
                        ns = stk[st, 1]
                    elif code == SEP:
                        ns = st
                    else:
                        ns = _push(-1 - lid, stk[st, 1], v2, ar)
                        if ns < 0:
                            return NO_ROOM, nk, ne, acc
            elif f & Q_CINC:
                v = stk[st, 2] + 1
                if loops[lid, 1] < 0:
                    v = min(v, loops[lid, 0])
                if loops[lid, 1] < 0 or v <= loops[lid, 1]:
                    ns = _push(-1 - lid, stk[st, 1], v, ar)
                    if ns < 0:
                        return NO_ROOM, nk, ne, acc
                    nq = tq
            elif f & Q_CGUARD:
                if loops[lid, 1] < 0 or stk[st, 2] < loops[lid, 1]:
                    nq = tq
                    ns = st
            elif stk[st, 2] >= loops[lid, 0]:  # Q_CEXIT: pop the counter frame
                nq = tq
                ns = stk[st, 1]
            if nq >= 0:
                top = _visit(nq, ns, top, limit, ar)
                if top < 0:
                    return NEED_PYTHON, nk, ne, acc
        r = qinfo[q, 3]
        if r >= 0:
            if st == ROOT:
                if r == 0:  # the root rule ended
                    acc = True
            elif st == BOT:
                if ne == escs.shape[0]:
                    return NEED_PYTHON, nk, ne, acc
                escs[ne] = q
                ne += 1
            else:
                if stk[st, 0] < 0:
                    return NEED_PYTHON, nk, ne, acc  # a counter frame on top: left to Python
                top = _visit(stk[st, 0], stk[st, 1], top, limit, ar)
                if top < 0:
                    return NEED_PYTHON, nk, ne, acc
        if e_off[q + 1] > e_off[q]:
            if nk == keys.shape[0]:
                return NEED_PYTHON, nk, ne, acc
            keys[nk] = _key(q, st)
            nk += 1
    return COUNTED if counted else CLOSED, nk, ne, acc


@numba.njit(cache=True, _nrt=False)
def _keys_hash(keys, acc, escs):
    """_state_hash of a state with these configuration keys, acceptance and escapes."""
    h = np.int64(_SEED)
    for k in range(keys.shape[0]):
        h = _mix(h, keys[k])
    h = _mix(h, np.int64(1 if acc else 0))
    for k in range(escs.shape[0]):
        h = _mix(h, escs[k])
    return h


@numba.njit(cache=True, _nrt=False)
def _find(h, keys, acc, escs, ht, cfg, soff, escp, accepting):
    """The indexed state with these configuration keys, acceptance and escapes (hash h), or -1."""
    u = keys.shape[0]
    ue = escs.shape[0]
    hmask = ht.shape[0] - 1
    j = h & hmask
    while ht[j] != 0:
        sid = ht[j] - 1
        if soff[sid, 1] == u and soff[sid, 3] == ue and accepting[sid] == acc:
            same = True
            o = soff[sid, 0]
            for k in range(u):
                if _key(cfg[o + k, 0], cfg[o + k, 1]) != keys[k]:
                    same = False
                    break
            o = soff[sid, 2]
            for k in range(ue):
                if escp[o + k] != escs[k]:
                    same = False
            if same:
                return sid
        j = (j + 1) & hmask
    return -1


@numba.njit(cache=True, _nrt=False)
def find_state(keys, acc, escs, ht, cfg, soff, escp, accepting):
    return _find(_keys_hash(keys, acc, escs), keys, acc, escs, ht, cfg, soff, escp, accepting)


@numba.njit(cache=True, _nrt=False)
def _sort(a, n):
    """Sort a[:n] in place: insertion sort for a few items (the usual case), else heapsort (numba's sort
    allocates, which the builders do not)."""
    if n <= 16:
        for i in range(1, n):
            x = a[i]
            j = i - 1
            while j >= 0 and a[j] > x:
                a[j + 1] = a[j]
                j -= 1
            a[j + 1] = x
        return
    for root in range(n // 2 - 1, -1, -1):
        _sift(a, root, n)
    for end in range(n - 1, 0, -1):
        a[0], a[end] = a[end], a[0]
        _sift(a, 0, end)


@numba.njit(cache=True, _nrt=False, inline="always")
def _sift(a, root, n):
    """Move a[root] down the max-heap a[:n] to its place."""
    x = a[root]
    while True:
        child = 2 * root + 1
        if child >= n:
            break
        if child + 1 < n and a[child + 1] > a[child]:
            child += 1
        if a[child] <= x:
            break
        a[root] = a[child]
        root = child
    a[root] = x


@numba.njit(cache=True, _nrt=False)
def _uniq(a, n):
    """Sort a[:n] and drop repeats in place; returns the new length."""
    _sort(a, n)
    u = 0
    for k in range(n):
        if u == 0 or a[k] != a[u - 1]:
            a[u] = a[k]
            u += 1
    return u


@numba.njit(cache=True, _nrt=False)
def _intern(keys, acc, escs, ar):
    """The state with these configuration keys (sorted, unique), acceptance and escapes, made if new (flags and
    safe-text budget as Automaton._intern); NEED_PYTHON or NO_ROOM."""
    trans, flags, budget, accepting, qinfo, loops = (
        ar.trans,
        ar.flags,
        ar.budget,
        ar.accepting,
        ar.qinfo,
        ar.loops,
    )
    cfg, soff, escp, ht, stk, meta = ar.cfg, ar.soff, ar.escp, ar.ht, ar.stk, ar.meta
    u = keys.shape[0]
    ue = escs.shape[0]
    h = _keys_hash(keys, acc, escs)
    found = _find(h, keys, acc, escs, ht, cfg, soff, escp, accepting)
    if found >= 0:
        return found
    sid = meta[M_STATES]
    if sid >= meta[M_MAX_STATES] or u > MAX_STATE_CONFIGS:
        return NEED_PYTHON  # Python raises the state-budget or ambiguity error
    if sid >= trans.shape[0] or sid >= soff.shape[0]:
        meta[M_GROW] = G_STATES
        return NO_ROOM
    o = meta[M_CFG_USED]
    if o + u > cfg.shape[0]:
        meta[M_GROW] = G_CFG
        return NO_ROOM
    oe = meta[M_ESC_USED]
    if oe + ue > escp.shape[0]:
        meta[M_GROW] = G_ESC
        return NO_ROOM
    if 2 * (sid + 1) > ht.shape[0]:
        meta[M_GROW] = G_HT
        return NO_ROOM
    room = -1  # as Automaton._safe_budget
    for k in range(u):
        q = keys[k] >> 32
        st = keys[k] & 0xFFFFFFFF
        cfg[o + k, 0] = q
        cfg[o + k, 1] = st
        if qinfo[q, 0] & Q_UNIV:
            room = UNBOUNDED
        lid = qinfo[q, 4]
        if lid >= 0 and st > BOT and stk[st, 0] == -1 - lid:
            r = UNBOUNDED if loops[lid, 1] < 0 else loops[lid, 1] - loops[lid, 3] - stk[st, 2]
            if 0 <= qinfo[q, 8] < r:
                r = qinfo[q, 8]
            room = max(room, r)
    room = min(room, UNBOUNDED)
    for k in range(ue):
        escp[oe + k] = escs[k]
    meta[M_CFG_USED] = o + u
    meta[M_ESC_USED] = oe + ue
    soff[sid, 0] = o
    soff[sid, 1] = u
    soff[sid, 2] = oe
    soff[sid, 3] = ue
    accepting[sid] = acc
    flags[sid] = (LIVE if u or acc else 0) | (ESCAPES if ue else 0) | (SAFE_SINK if room > 0 else 0)
    budget[sid] = max(room, 0)
    _put(ht, h, sid)
    meta[M_STATES] = sid + 1
    meta[M_INDEXED] = sid + 1
    return sid


@numba.njit(cache=True, _nrt=False)
def fill(s, c, clamp, ar):
    """The successor of state s on byte class c, written to trans for the run of classes around c that every
    edge treats alike (as Automaton.fill); NEED_PYTHON when Python must build it, NO_ROOM when an array is full.
    `clamp`: the successor's counters clamped (walks, on clamped rows) rather than real (commits)."""
    trans, e_off, nfa_e, loc, loc_pool, cfg, soff = (
        ar.trans,
        ar.e_off,
        ar.nfa_e,
        ar.loc,
        ar.loc_pool,
        ar.cfg,
        ar.soff,
    )
    ncls = trans.shape[1]
    a = soff[s, 0]
    m = soff[s, 1]
    c0 = 0
    c1 = ncls - 1
    moves = ar.sc_moves  # (target, stack) of each edge taking class c
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
                if nm == moves.shape[0]:
                    return NEED_PYTHON
                moves[nm, 0] = nfa_e[e, 2]
                moves[nm, 1] = cfg[k, 1]
                nm += 1
            elif hi < c:
                if hi + 1 > c0:
                    c0 = hi + 1
            elif lo - 1 < c1:
                c1 = lo - 1
    if nm == 0:
        for j in range(c0, c1 + 1):
            trans[s, j] = DEAD
        return DEAD
    # Configurations of the successor: local closures from the pool, the others computed. Past the scratch
    # arrays' room, Python builds the state.
    keys = ar.sc_keys
    escs = ar.sc_escs
    nk = 0
    ne = 0
    acc = False
    counted = False
    for k in range(nm):
        t = moves[k, 0]
        r = _local(t, ar)
        if r == NO_ROOM:
            return NO_ROOM
        if r >= 0:
            n = loc[t, 1]
            if nk + n > keys.shape[0]:
                return NEED_PYTHON
            for x in range(r, r + n):
                keys[nk] = _key(loc_pool[x], moves[k, 1])
                nk += 1
            continue
        status, nk2, ne2, a2 = _closure(t, moves[k, 1], keys, nk, escs, ne, ar)
        if status < 0:
            return status
        counted = counted or status == COUNTED
        nk = nk2
        ne = ne2
        acc = acc or a2
    if clamp and counted:  # counter values moved: clamp them (clamped rows hold clamped states)
        for k in range(nk):
            st = _clamp_stack(keys[k] & 0xFFFFFFFF, ar)
            if st < 0:
                return st
            keys[k] = _key(keys[k] >> 32, st)
    u = _uniq(keys, nk)
    ue = _uniq(escs, ne)
    if u == 0 and not acc and ue == 0:
        for j in range(c0, c1 + 1):
            trans[s, j] = DEAD
        return DEAD
    found = _intern(keys[:u], acc, escs[:ue], ar)
    if found < 0:
        return found
    for j in range(c0, c1 + 1):
        trans[s, j] = found
    return found


@numba.njit(cache=True, _nrt=False)
def _reroot(st, until, base, ar):
    """The frames of stack st above `until` (an ancestor of st) pushed in order onto `base` (NO_ROOM when full):
    Stacks.rebase with base BOT, Stacks.materialize with until BOT."""
    stk, chain = ar.stk, ar.sc_chain
    if st == until:
        return base
    n, x = _chain(st, until, stk, chain)
    if n < 0 or x != until:
        return NEED_PYTHON  # `until` is not below st: not a case these functions make
    cur = base
    for k in range(n - 1, -1, -1):
        f = chain[k]
        cur = _push(stk[f, 0], cur, stk[f, 2], ar)
        if cur < 0:
            return cur
    return cur


@numba.njit(cache=True)
def _common(sts, stk):
    """The deepest stack that every (real) stack in sts has below or at its top (Stacks.common); NEED_PYTHON
    if they do not share a root."""
    n = sts.shape[0]
    depth = np.empty(n, np.int64)
    cur = sts.copy()
    low = 1 << 62
    for k in range(n):
        d = 0
        x = cur[k]
        while x > BOT:
            x = stk[x, 1]
            d += 1
        depth[k] = d
        low = min(low, d)
    for k in range(n):
        while depth[k] > low:
            cur[k] = stk[cur[k], 1]
            depth[k] -= 1
    while True:
        same = True
        for k in range(1, n):
            if cur[k] != cur[0]:
                same = False
                break
        if same:
            return cur[0]
        for k in range(n):
            if cur[k] <= BOT:
                return NEED_PYTHON
            cur[k] = stk[cur[k], 1]


@numba.njit(cache=True)
def group_by_frame(kc, p, clamp, out, ar):
    """MaskCache.group_by_frame in numba: local state kc's configurations grouped by the call frame right above the
    bottom (counter frames stay with the rest). With more than one group, each group's position on the real
    parent stack p, as (local state, parent stack) rows of `out`, the local state clamped when `clamp`;
    returns the number of groups, 0 when there is nothing to split, NEED_PYTHON, NO_ROOM or TOO_DEEP."""
    cfg, soff, stk = ar.cfg, ar.soff, ar.stk
    a = soff[kc, 0]
    m = soff[kc, 1]
    tops = np.empty(m, np.int64)
    gtop = np.empty(m, np.int64)
    ng = 0
    steps = 0
    for k in range(m):
        f = cfg[a + k, 1]
        if f < BOT:
            return NEED_PYTHON
        while f != BOT and stk[f, 1] != BOT:
            f = stk[f, 1]
            steps += 1
        if steps > GROUP_WORK:
            return TOO_DEEP
        if f != BOT and stk[f, 0] < 0:
            f = BOT  # a counter frame's configurations stay with the rest
        tops[k] = f
        known = False
        for g in range(ng):
            if gtop[g] == f:
                known = True
                break
        if not known:
            gtop[ng] = f
            ng += 1
    if ng <= 1:
        return 0
    if ng > out.shape[0]:
        return NEED_PYTHON
    qs = np.empty(m, np.int64)
    sts = np.empty(m, np.int64)
    keys = np.empty(m, np.int64)
    for g in range(ng):
        n = 0
        for k in range(m):
            if tops[k] == gtop[g]:
                st = _reroot(cfg[a + k, 1], BOT, p, ar)  # materialized on p
                if st < 0:
                    return st
                qs[n] = cfg[a + k, 0]
                sts[n] = st
                n += 1
        sid, c = _position(qs[:n], sts[:n], keys, clamp, ar)
        if sid < 0:
            return sid
        out[g, 0] = sid
        out[g, 1] = c
    return ng


@numba.njit(cache=True)
def _position(qs, sts, keys, clamp, ar):
    """Automaton._position for real configurations (qs[k], sts[k]): (local state, parent stack), the local state
    clamped when `clamp`; (NEED_PYTHON or NO_ROOM, 0) when it cannot. `keys`: scratch, at least as long."""
    stk = ar.stk
    n = qs.shape[0]
    c = _common(sts, stk)
    if c < 0:
        return c, 0
    while c > BOT and stk[c, 0] < 0:  # Stacks.cut
        c = stk[c, 1]
    for k in range(n):
        st = _reroot(sts[k], c, BOT, ar)  # rebased on c
        if st >= 0 and clamp:
            st = _clamp_stack(st, ar)
        if st < 0:
            return st, 0
        keys[k] = _key(qs[k], st)
    u = _uniq(keys, n)
    sid = _intern(keys[:u], False, np.empty(0, np.int64), ar)
    return sid, c


@numba.njit(cache=True)
def escape_target(s, p, clamp, out, ar):
    """Where local state s's escapes lead on the real parent stack p (Automaton._escape_target_py): out = (local
    state, parent stack, accepting), the local state -1 when no configuration is left, clamped when `clamp`. Returns 0,
    NEED_PYTHON or NO_ROOM."""
    soff, escp = ar.soff, ar.escp
    keys = np.empty(64, np.int64)
    escs = np.empty(1, np.int64)
    nk = 0
    acc = False
    for x in range(soff[s, 2], soff[s, 2] + soff[s, 3]):
        while True:
            status, nk2, ne, a2 = _closure(escp[x], p, keys, nk, escs, 0, ar)
            if status == NEED_PYTHON and nk2 == keys.shape[0] and keys.shape[0] <= 8 * CLOSURE_LIMIT:
                grown = np.empty(2 * keys.shape[0], np.int64)
                grown[:nk] = keys[:nk]
                keys = grown
                continue
            break
        if status < 0:
            return status
        if ne:
            return NEED_PYTHON  # a real stack has no local bottom
        nk = nk2
        acc = acc or a2
    out[2] = 1 if acc else 0
    if nk == 0:
        out[0] = -1
        out[1] = 0
        return 0
    u = _uniq(keys, nk)
    qs = keys[:u] >> 32
    sts = keys[:u] & 0xFFFFFFFF
    sid, c = _position(qs, sts, np.empty(u, np.int64), clamp, ar)
    if sid < 0:
        return sid
    out[0] = sid
    out[1] = c
    return 0


@numba.njit(cache=True, inline="always", _nrt=False)
def _record_escapes(flags, states, depth, i, rec, r):
    """Record (token index, depth, state) in rec from row r on for each escaping state on the path up to
    `depth`; returns the next free row."""
    for k in range(depth + 1):
        if flags[states[k]] & ESCAPES:
            rec[r, 0] = i
            rec[r, 1] = k
            rec[r, 2] = states[k]
            r += 1
    return r


@numba.njit(cache=True, _nrt=False)
def walk_esc(data, offs, lcp, skip, ids, safe_from, states, pos, out, rec, nrec, ar):
    """Walk the byte-sorted tokens from local state states[0]: tokens the local automaton takes whole go to
    `out`; for every other token, each depth whose state escapes (needs the frames below BOT) is recorded as
    (index, depth, state) in `rec`, since the token's fate depends on the real stack there.

    A token whose remaining bytes (from safe_from[i] on) are whole string-safe characters is taken as soon as
    the walk reaches a state flagged SAFE_SINK whose budget covers them: JSON string bodies then cost one
    check per token, not one step per byte. states[] is then valid only up to that depth.

    A missing transition is built here when it can be (`fill`), else by Python. Resumable through
    pos = (index, resume depth or -1, dead depth, dead path escapes, valid depth): returns WALK_NEEDS_PYTHON when
    Python must build a transition (states[pos[1]]), WALK_REC_FULL when `rec` is full, WALK_NO_ROOM when an
    array of this module is full, WALK_DONE when done."""
    trans, flags, budget, byte_class = ar.trans, ar.flags, ar.budget, ar.byte_class
    n = ids.shape[0]
    cap = rec.shape[0]
    maxd = states.shape[0]
    nskip = skip.shape[0]
    i = pos[0]
    first_d = pos[1]
    dead = pos[2]
    dead_esc = pos[3] != 0
    valid = pos[4]
    r = nrec[0]
    status = WALK_DONE
    while i < n:
        if r + maxd + 1 > cap:
            status = WALK_REC_FULL
            break
        if first_d >= 0:
            d = first_d
            first_d = -1
        else:
            d = lcp[i]
            if d > dead:
                # Same path as the previous token up to its dead byte: same escapes.
                if dead_esc:
                    r = _record_escapes(flags, states, dead, i, rec, r)
                i += 1
                continue
            if d > valid:
                d = valid
        o = offs[i]
        ln = offs[i + 1] - o
        sf = safe_from[i]
        st = states[d]
        nx = 0
        sunk = False
        # The current state stays in a register: each byte costs one dependent load (its transition).
        while d < ln:
            if d >= sf and flags[st] & SAFE_SINK and not 0x80 <= data[o + d] < 0xC0:
                left = ln - d
                if budget[st] < left:  # count the code points left: the bytes that start one
                    left = 0
                    for k in range(o + d, o + ln):
                        if not 0x80 <= data[k] < 0xC0:
                            left += 1
                if left <= budget[st]:
                    sunk = True
                    break
            nx = trans[st, byte_class[data[o + d]]]
            if nx == UNKNOWN:
                nx = fill(st, byte_class[data[o + d]], True, ar)
            if nx < 0:
                break
            d += 1
            states[d] = nx
            st = nx
        valid = d
        if sunk:
            d = ln
        if d == ln:
            if flags[st] & LIVE:
                tid = ids[i]
                out[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
                dead = NO_DEAD
                dead_esc = False
                i += 1
                continue
        elif nx == NEED_PYTHON or nx == NO_ROOM:
            first_d = d
            status = WALK_NEEDS_PYTHON if nx == NEED_PYTHON else WALK_NO_ROOM
            break
        r0 = r
        r = _record_escapes(flags, states, d, i, rec, r)
        has = r > r0
        if d == ln:
            dead = NO_DEAD
            dead_esc = False
            i += 1
        else:
            dead = d
            dead_esc = has
            if not has and d < nskip:
                i = skip[d, i]
            else:
                i += 1
    nrec[0] = r
    pos[0] = i
    pos[1] = first_d
    pos[2] = dead
    pos[3] = 1 if dead_esc else 0
    pos[4] = valid
    return status


_SCRATCH = Scratch()

# -- calling the builders from Python ----------------------------------------------------------------------
# Tests: every call of a Direct through numba's dispatcher, which checks the argument types.
CHECK_TYPES = False


class Direct:
    """A numba function called from Python at its compiled entry point, past numba's dispatcher.

    The dispatcher works out the type of every argument at each call, to pick (or compile) the machine code for
    them: about 3 of the 3.5 µs a builder call costs with BuilderArrays' 31 arrays, and a mask that builds
    states makes several calls (mask p99 went 118 -> 105 µs on 200 MaskBench files). The entry point of a
    compiled version converts the arguments as that version's types say, without looking at them. So the
    first call goes through the dispatcher (which loads or compiles the code) and finds the version for its
    argument types; later calls go straight to that version's entry point. (A function may have other
    versions too: numba compiles one for each set of types another numba function calls it with.)

    What makes this safe: every call from Python passes the same types. The arrays are made with fixed dtypes,
    here and in tables.py (C-contiguous; never a strided view), and the other arguments are Python ints and
    bools. A test runs a varied workload with CHECK_TYPES set, where every call goes through the dispatcher and
    its argument types are collected (`seen`), and checks that each function was called with one set."""

    __slots__ = ("fn", "entry", "seen")

    def __init__(self, fn) -> None:
        self.fn = fn
        self.entry = None
        self.seen: set[tuple] = set()  # argument types of the calls made with CHECK_TYPES set

    def __call__(self, *args):
        entry = self.entry
        if entry is not None:
            return entry(*args)
        out = self.fn(*args)
        types = tuple(numba.typeof(a) for a in args)
        if CHECK_TYPES:
            self.seen.add(types)
        else:
            version = self.fn.overloads.get(types)
            if version is not None:
                self.entry = version.entry_point
        return out


def _grown(a: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows,) + a.shape[1:], dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


class LocalBuilder:
    """The numba-side view of an automaton's NFA, states and stacks (see the module docstring)."""

    def __init__(
        self, nfa, byte_class: np.ndarray, special: set[int], max_states: int, loop_reach: list[int]
    ) -> None:
        n = nfa.size
        self.meta = np.zeros(N_META, dtype=np.int64)
        self.meta[M_MAX_STATES] = max_states
        k = START_ROWS
        self.cfg = np.zeros((4 * k, 2), dtype=np.int32)
        self.escp = np.zeros(k, dtype=np.int32)
        self.soff = np.zeros((k, 4), dtype=np.int64)
        self.ht = np.zeros(4 * k, dtype=np.int32)
        self.stk = np.zeros((k, 3), dtype=np.int64)
        self.sht = np.zeros(4 * k, dtype=np.int32)
        qinfo = np.full((n, 9), -1, dtype=np.int32)
        qinfo[:, 0] = 0

        def ids(keys) -> np.ndarray:
            return np.fromiter(keys, dtype=np.int64, count=len(keys))

        if special:
            qinfo[ids(special), 0] |= Q_STACK
        for flag, ops in (
            (Q_CPUSH, nfa.cpush),
            (Q_CINC, nfa.cinc),
            (Q_CGUARD, nfa.cguard),
            (Q_CEXIT, nfa.cexit),
        ):
            if ops:
                at = ids(ops)
                qinfo[at[(qinfo[at, 0] & Q_CTR) != 0], 0] |= Q_COUNTER  # two operations on one state
                qinfo[at, 0] |= flag
                qinfo[at, 5:7] = np.asarray(list(ops.values()), dtype=np.int32)
        if nfa.cset:
            at = ids(nfa.cset)
            qinfo[at[(qinfo[at, 0] & Q_CTR) != 0], 0] |= Q_COUNTER
            qinfo[at, 0] |= Q_SET
            qinfo[at, 5:7] = np.asarray(list(nfa.cset.values()), dtype=np.int32)
            qinfo[at, 7] = np.asarray([nfa.cset_op[q] for q in nfa.cset], dtype=np.int32)
        self.sets = np.zeros((max(1, len(nfa.loops)), 6), dtype=np.int64)
        for lid, spec in nfa.sets.items():
            self.sets[lid] = (
                spec.nbits,
                spec.required,
                spec.lo,
                -1 if spec.hi is None else spec.hi,
                spec.extras,
                spec.dead,
            )
        if nfa.universal:
            qinfo[ids(nfa.universal), 0] |= Q_UNIV
        if nfa.call:
            qinfo[ids(nfa.call), 1:3] = np.asarray(list(nfa.call.values()), dtype=np.int32)
        for col, d in ((3, nfa.end_rule), (4, nfa.counted_body), (8, nfa.counted_budget)):
            if d:
                qinfo[ids(d), col] = ids(d.values())
        self.qinfo = qinfo
        self.byte_class = byte_class
        self.rule_start = np.asarray(nfa.rule_start, dtype=np.int32)
        self.loops = np.asarray(
            [
                (lo, -1 if hi is None else hi, reach, nfa.loop_slack.get(lid, 0))
                for lid, ((lo, hi), reach) in enumerate(zip(nfa.loops, loop_reach, strict=True))
            ]
            or [(0, 0, 0, 0)],
            dtype=np.int64,
        )
        # The NFA's rows are flat since prepare.prepare_nfa (nfa.FlatRows).
        edge_rows = nfa.edges.data
        self.e_off = nfa.edges.off
        self.nfa_e = edge_rows.copy() if len(edge_rows) else np.zeros((1, 3), dtype=np.int32)
        if len(edge_rows):  # byte ranges as class ranges
            self.nfa_e[:, 0] = byte_class[edge_rows[:, 0]]
            self.nfa_e[:, 1] = byte_class[edge_rows[:, 1]]
        self.eps_off = nfa.eps.off
        self.eps_t = nfa.eps.data if len(nfa.eps.data) else np.zeros(1, np.int32)
        self.loc = np.full((n, 2), LOC_TODO, dtype=np.int32)
        self.loc_pool = np.zeros(max(4 * k, 2 * n) if k > 1 else 1, dtype=np.int32)
        self.mark = np.zeros(n, dtype=np.int32)

    def arrays(
        self, trans: np.ndarray, flags: np.ndarray, budget: np.ndarray, accepting: np.ndarray
    ) -> BuilderArrays:
        """The automaton's per-state arrays (`trans`: the rows to build) and the builder's, for one numba call
        (made anew for each call: growing replaces the arrays)."""
        return BuilderArrays(
            trans,
            flags,
            budget,
            accepting,
            self.byte_class,
            self.e_off,
            self.nfa_e,
            self.eps_off,
            self.eps_t,
            self.qinfo,
            self.rule_start,
            self.loops,
            self.sets,
            self.loc,
            self.loc_pool,
            self.mark,
            self.cfg,
            self.soff,
            self.escp,
            self.ht,
            self.stk,
            self.sht,
            self.meta,
            _SCRATCH.keys,
            _SCRATCH.escs,
            _SCRATCH.moves,
            _SCRATCH.seen,
            _SCRATCH.work,
            _SCRATCH.local,
            _SCRATCH.chain,
            _SCRATCH.meta,
        )

    def add(self, sid: int, configs: tuple, esc: tuple) -> None:
        """Record a state made by Python."""
        meta = self.meta
        o = int(meta[M_CFG_USED])
        u = len(configs)
        if o + u > self.cfg.shape[0]:
            self.cfg = _grown(self.cfg, max(2 * self.cfg.shape[0], o + u))
        if u:
            self.cfg[o : o + u] = configs
        oe = int(meta[M_ESC_USED])
        ue = len(esc)
        if oe + ue > self.escp.shape[0]:
            self.escp = _grown(self.escp, max(2 * self.escp.shape[0], oe + ue))
        if ue:
            self.escp[oe : oe + ue] = esc
        if sid >= self.soff.shape[0]:
            self.grow_states(2 * self.soff.shape[0])
        self.soff[sid] = (o, u, oe, ue)
        meta[M_CFG_USED] = o + u
        meta[M_ESC_USED] = oe + ue
        meta[M_STATES] = sid + 1

    def add_stack(self, sid: int, ret: int, parent: int, value: int) -> None:
        """Record a stack made by Python."""
        if sid >= self.stk.shape[0]:
            self.stk = _grown(self.stk, 2 * self.stk.shape[0])
        self.stk[sid] = (ret, parent, value)
        self.meta[M_STACKS] = sid + 1

    def grow_states(self, cap: int) -> None:
        if cap > self.soff.shape[0]:
            self.soff = _grown(self.soff, cap)

    def grow(self, automaton) -> None:
        """Make room for whatever the last numba call ran out of (meta[M_GROW])."""
        what = int(self.meta[M_GROW])
        self.meta[M_GROW] = 0
        if what == G_STATES:
            automaton._grow(2 * automaton.trans.shape[0])
        elif what == G_CFG:
            self.cfg = _grown(self.cfg, 2 * self.cfg.shape[0])
        elif what == G_ESC:
            self.escp = _grown(self.escp, 2 * self.escp.shape[0])
        elif what == G_LOC:
            self.loc_pool = _grown(self.loc_pool, 2 * self.loc_pool.shape[0])
        elif what == G_STACKS:
            self.stk = _grown(self.stk, 2 * self.stk.shape[0])
            self.rehash(automaton)
        elif what == G_HT:
            self.rehash(automaton)

    def index(self, automaton) -> None:
        """Index the states and stacks Python made since the last walk."""
        meta = self.meta
        if meta[M_INDEXED] < meta[M_STATES] or meta[M_SINDEXED] < meta[M_STACKS]:
            if 2 * (meta[M_STATES] + 1) > self.ht.shape[0] or 2 * (meta[M_STACKS] + 1) > self.sht.shape[0]:
                self.rehash(automaton)
            index_new(self.ht, self.sht, self.cfg, self.soff, self.escp, automaton.accepting, self.stk, meta)

    def rehash(self, automaton) -> None:
        """Hash tables at most a quarter full for every state and stack made so far."""
        meta = self.meta
        self.ht = np.zeros(1 << (4 * int(meta[M_STATES]) + 4).bit_length(), dtype=np.int32)
        self.sht = np.zeros(1 << (4 * int(meta[M_STACKS]) + 4).bit_length(), dtype=np.int32)
        rehash(self.ht, self.sht, self.cfg, self.soff, self.escp, automaton.accepting, self.stk, meta)

    def find(self, configs: tuple, acc: bool, esc: tuple, accepting: np.ndarray) -> int:
        """The indexed state with these configurations, acceptance and escapes, or -1 (Python looks here for
        the states the walk made, which its own index does not hold yet)."""
        keys = np.fromiter([(q << 32) | st for q, st in configs], dtype=np.int64, count=len(configs))
        escs = np.asarray(esc, dtype=np.int64)
        return int(find_state(keys, bool(acc), escs, self.ht, self.cfg, self.soff, self.escp, accepting))

    def state(self, sid: int) -> tuple[tuple, tuple]:
        """(configurations, escapes) of a state numba made."""
        o, u, oe, ue = self.soff[sid].tolist()
        configs = tuple([(q, st) for q, st in self.cfg[o : o + u].tolist()])
        return configs, tuple(self.escp[oe : oe + ue].tolist())
