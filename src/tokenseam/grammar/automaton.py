"""The lazily determinised pushdown automaton and its per-state token masks over the vocabulary trie.

A DFA state is a set of (NFA state, call stack) configurations; rows are built on demand, and each mask is
one numba walk over the byte-sorted vocabulary that skips the subtree of every rejected prefix.
"""

from __future__ import annotations

import gc
from collections import OrderedDict

import numba
import numpy as np

from .errors import GrammarError
from .nfa import ByteNFA

UNKNOWN = -2
DEAD = -1
MAX_DFA_STATES = 2_000_000
MAX_CLOSURE = 100_000
MASK_CACHE_BYTES = 128 * 1024 * 1024


SKIP_DEPTHS = 4


@numba.njit(cache=True, nogil=True)
def _walk(trans, byte_class, data, offs, lcp, skip, ids, states, pos, out):
    """Set the bit of every token whose bytes the automaton accepts from states[0].

    Resumable: on reaching a state whose row is not built yet it stores (token index, depth) in `pos`
    and returns 1; the caller builds states[depth] and calls again. Returns 0 when the walk is done.
    """
    n = ids.shape[0]
    i = pos[0]
    first_d = pos[1]
    dead = 1 << 30
    while i < n:
        if first_d >= 0:
            d = first_d
            first_d = -1
        else:
            d = lcp[i]
            if d > dead:
                i += 1
                continue
        o = offs[i]
        ln = offs[i + 1] - o
        ok = True
        while d < ln:
            nx = trans[states[d], byte_class[data[o + d]]]
            if nx < 0:
                if nx == -2:
                    pos[0] = i
                    pos[1] = d
                    return 1
                ok = False
                break
            states[d + 1] = nx
            d += 1
        if ok:
            tid = ids[i]
            out[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
            dead = 1 << 30
            i += 1
        elif d < skip.shape[0]:
            # Jump over every token sharing the rejected prefix (the next one with lcp <= d).
            dead = d
            i = skip[d, i]
        else:
            dead = d
            i += 1
    return 0


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
        self.maxlen = int(lens.max()) if len(lens) else 1
        self.eos = np.asarray(sorted(vocab.eos_token_ids), dtype=np.int64)
        self.is_special = np.asarray(vocab.is_special, dtype=bool)
        self.token_bytes = vocab.token_bytes


class Automaton:
    """Lazy DFA over (NFA state, stack) configuration sets, with an LRU of packed token masks."""

    def __init__(self, nfa: ByteNFA, table: TokenTable) -> None:
        self.nfa = nfa
        self.table = table
        self._expanded_set: set[int] = set()
        self._prepare()
        self.stacks: list[tuple[int, int, int]] = [(-1, -1, 0)]
        self.stack_index: dict[tuple[int, int, int], int] = {}
        self.has_counters = bool(nfa.loops)
        self.canon: dict[int, int] = {}
        self.closure_memo: dict[tuple[int, int], tuple[frozenset, bool]] = {}
        self.state_index: dict[tuple[frozenset, bool], int] = {}
        self.state_configs: list[frozenset] = []
        cap = 256
        self.trans = np.full((cap, self.n_classes), UNKNOWN, dtype=np.int32)
        self.accepting = np.zeros(cap, dtype=bool)
        self.masks: OrderedDict[int, np.ndarray] = OrderedDict()
        self.mask_bytes = 0
        configs, acc = self.closure(nfa.rule_start[0], 0)
        self.start = self._state(configs, acc)

    # -- preparation -------------------------------------------------------------------------------------
    def _prepare(self) -> None:
        nfa = self.nfa
        self._check_left_recursion()
        if nfa.may_dead_end:
            self._trim()
        bounds = {0, 256}
        for row in nfa.edges:
            for lo, hi, _ in row:
                bounds.add(lo)
                bounds.add(hi + 1)
        pts = sorted(bounds)
        cls_of = [0] * 256
        for k in range(len(pts) - 1):
            for b in range(pts[k], pts[k + 1]):
                cls_of[b] = k
        self.byte_class = np.asarray(cls_of, dtype=np.int32)
        self._cls_of = cls_of
        self.n_classes = len(pts) - 1
        self.class_start = pts[:-1]
        # Per-NFA-state byte-class successor tables are built lazily (most states are never reached).
        self._targets: dict[int, dict[int, tuple[int, ...]]] = {}
        self._groups: dict[int, tuple[np.ndarray, list[tuple[int, ...]]]] = {}
        self._local_memo: dict[int, tuple[int, ...] | None] = {}
        self._parts: dict[int, tuple[np.ndarray, list[frozenset]]] = {}

    def targets(self, q: int) -> dict[int, tuple[int, ...]]:
        d = self._targets.get(q)
        if d is None:
            cls_of = self._cls_of
            acc: dict[int, list[int]] = {}
            for lo, hi, t in self.nfa.edges[q]:
                for c in range(cls_of[lo], cls_of[hi] + 1):
                    lst = acc.get(c)
                    if lst is None:
                        acc[c] = [t]
                    elif t not in lst:
                        lst.append(t)
            d = {c: tuple(ts) for c, ts in acc.items()}
            self._targets[q] = d
        return d

    def _nullable_rules(self) -> set[int]:
        nfa = self.nfa
        nullable: set[int] = set()
        changed = True
        while changed:
            changed = False
            for r in range(len(nfa.rule_start)):
                if r in nullable:
                    continue
                if nfa.rule_end[r] in self._eps_reach(nfa.rule_start[r], nullable, None):
                    nullable.add(r)
                    changed = True
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
        return seen

    def _check_left_recursion(self) -> None:
        nfa = self.nfa
        if not nfa.call:
            return
        nullable = self._nullable_rules()
        first: dict[int, set[int]] = {}
        for r in range(len(nfa.rule_start)):
            calls: list[int] = []
            self._eps_reach(nfa.rule_start[r], nullable, calls)
            first[r] = set(calls)
        for r in first:
            seen = set()
            stack = list(first[r])
            while stack:
                x = stack.pop()
                if x == r:
                    raise GrammarError(f"rule {nfa.rule_names[r]!r} is left-recursive (it can call itself "
                                       "without consuming input); rewrite it with repetition")
                if x not in seen:
                    seen.add(x)
                    stack.extend(first[x])

    def _trim(self) -> None:
        """Remove NFA states that cannot complete their rule, so every allowed token keeps a way to finish."""
        nfa = self.nfa
        n = nfa.size
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

    # -- configurations ----------------------------------------------------------------------------------
    def _push(self, ret: int, parent: int, value: int = 0) -> int:
        key = (ret, parent, value)
        sid = self.stack_index.get(key)
        if sid is None:
            sid = len(self.stacks)
            self.stacks.append(key)
            self.stack_index[key] = sid
        return sid

    def _local(self, q0: int) -> tuple[int, ...] | None:
        """The epsilon closure of q0 when it touches no stack operation (same for every stack), else None."""
        hit = self._local_memo.get(q0, 0)
        if hit != 0:
            return hit
        nfa = self.nfa
        special = (nfa.call, nfa.end_rule, nfa.cpush, nfa.cinc, nfa.cexit, nfa.cguard)
        seen = {q0}
        stack = [q0]
        res: tuple[int, ...] | None = None
        ok = True
        while stack and ok:
            q = stack.pop()
            for d in special:
                if q in d:
                    ok = False
                    break
            for t in nfa.eps[q]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
            if len(seen) > 256:
                ok = False
        if ok:
            res = tuple(q for q in seen if nfa.edges[q])
        self._local_memo[q0] = res
        return res

    def closure(self, q0: int, st0: int) -> tuple[frozenset, bool]:
        key = (q0, st0)
        hit = self.closure_memo.get(key)
        if hit is not None:
            return hit
        local = self._local(q0)
        if local is not None:
            res = (frozenset([(q, st0) for q in local]), False)
            self.closure_memo[key] = res
            return res
        nfa = self.nfa
        out = set()
        acc = False
        seen = {key}
        stack = [key]
        while stack:
            q, st = stack.pop()
            nxt = [(t, st) for t in nfa.eps[q]]
            c = nfa.call.get(q)
            if c is not None:
                nxt.append((nfa.rule_start[c[0]], self._push(c[1], st)))
            if self.has_counters:
                cp = nfa.cpush.get(q)
                if cp is not None:
                    nxt.append((cp[0], self._push(-1 - cp[1], st, 0)))
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
                        nxt.append((ce[0], parent))
            r = nfa.end_rule.get(q)
            if r is not None:
                if st == 0:
                    if r == 0:
                        acc = True
                else:
                    ret, parent, _ = self.stacks[st]
                    nxt.append((ret, parent))
            if nfa.edges[q]:
                out.add((q, st))
            for k in nxt:
                if k not in seen:
                    seen.add(k)
                    stack.append(k)
            if len(seen) > MAX_CLOSURE:
                raise GrammarError("grammar is too ambiguous (configuration explosion)")
        res = (frozenset(out), acc)
        self.closure_memo[key] = res
        return res

    def _state(self, configs: frozenset, acc: bool) -> int:
        key = (configs, acc)
        sid = self.state_index.get(key)
        if sid is not None:
            return sid
        sid = len(self.state_configs)
        if sid >= MAX_DFA_STATES:
            raise GrammarError("grammar automaton exceeded its state budget")
        if sid >= self.trans.shape[0]:
            cap = self.trans.shape[0] * 2
            grown = np.full((cap, self.n_classes), UNKNOWN, dtype=np.int32)
            grown[:sid] = self.trans[:sid]
            self.trans = grown
            acc_grown = np.zeros(cap, dtype=bool)
            acc_grown[:sid] = self.accepting[:sid]
            self.accepting = acc_grown
        self.state_index[key] = sid
        self.state_configs.append(configs)
        self.accepting[sid] = acc
        return sid

    def expand(self, sid: int) -> None:
        if sid in self._expanded_set:
            return
        # Building states allocates many small objects; a full GC pass over the vocabulary-sized heap in
        # the middle of a decoding step would cost tens of milliseconds, so collection waits.
        was = gc.isenabled()
        gc.disable()
        try:
            self._expand(sid)
        finally:
            if was:
                gc.enable()

    def groups(self, q: int) -> tuple[np.ndarray, list[tuple[int, ...]]]:
        """NFA state q's byte classes grouped by target set: (group index per class, -1 = none; targets)."""
        g = self._groups.get(q)
        if g is None:
            idx = np.full(self.n_classes, -1, dtype=np.int32)
            tgts: list[tuple[int, ...]] = []
            where: dict[tuple[int, ...], int] = {}
            for c, ts in self.targets(q).items():
                k = where.get(ts)
                if k is None:
                    k = where[ts] = len(tgts)
                    tgts.append(ts)
                idx[c] = k
            g = self._groups[q] = (idx, tgts)
        return g

    def _successor(self, moves: frozenset) -> int:
        configs: set = set()
        acc = False
        for t, st in moves:
            cs, a = self.closure(t, st)
            configs |= cs
            acc = acc or a
        return DEAD if not configs and not acc else self._state(frozenset(configs), acc)

    def _partition(self, sid: int) -> tuple[np.ndarray, list[frozenset]]:
        """State sid's byte classes grouped by their moves: (group per class, -1 = dead; moves per group).

        Grouping is cheap (no closures); successors are built per group only when a byte needs them."""
        p = self._parts.get(sid)
        if p is not None:
            return p
        configs = list(self.state_configs[sid])
        if len(configs) == 1:
            q, st = configs[0]
            idx, tgts = self.groups(q)
            inverse = idx
            moves = [frozenset((t, st) for t in ts) for ts in tgts]
        elif configs:
            gs = [self.groups(q) for q, _ in configs]
            # Classes with the same group in every config move alike: refine a 1-D key config by config.
            key = gs[0][0].astype(np.int64) + 1
            for idx, tgts in gs[1:]:
                key = key * (len(tgts) + 1) + (idx + 1)
                if key.max() > (1 << 40):
                    key = np.unique(key, return_inverse=True)[1].reshape(-1).astype(np.int64)
            _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
            inverse = inverse.reshape(-1).astype(np.int32)
            moves = []
            for j, c in enumerate(first.tolist()):
                mv = set()
                for i, (_, st) in enumerate(configs):
                    k = gs[i][0][c]
                    if k >= 0:
                        for t in gs[i][1][k]:
                            mv.add((t, st))
                if not mv:
                    inverse[inverse == j] = -1
                moves.append(frozenset(mv))
        else:
            inverse = np.full(self.n_classes, -1, dtype=np.int32)
            moves = []
        self.trans[sid, inverse < 0] = DEAD
        p = self._parts[sid] = (inverse, moves)
        return p

    def fill(self, sid: int, c: int) -> None:
        """Build the successor of state sid on byte class c (and on every class moving alike)."""
        was = gc.isenabled()
        gc.disable()
        try:
            inverse, moves = self._partition(sid)
            j = inverse[c]
            if j < 0:
                self.trans[sid, c] = DEAD
                return
            nxt = self._successor(moves[j])
            self.trans[sid, inverse == j] = nxt
        finally:
            if was:
                gc.enable()

    def _expand(self, sid: int) -> None:
        inverse, moves = self._partition(sid)
        row = self.trans[sid]
        for j in range(len(moves)):
            cls = np.flatnonzero(inverse == j)
            if len(cls) and self.trans[sid, cls[0]] == UNKNOWN:
                self.fill(sid, int(cls[0]))
        del row
        self._expanded_set.add(sid)

    def step(self, sid: int, byte: int) -> int:
        c = self._cls_of[byte]
        v = self.trans[sid, c]
        if v == UNKNOWN:
            self.fill(sid, c)
            v = self.trans[sid, c]
        return int(v)

    def step_bytes(self, sid: int, data: bytes) -> int:
        for b in data:
            sid = self.step(sid, b)
            if sid < 0:
                return DEAD
        return sid

    def has_moves(self, sid: int) -> bool:
        if sid not in self._expanded_set:
            self.expand(sid)
        return bool((self.trans[sid] >= 0).any())

    # -- masks -------------------------------------------------------------------------------------------
    def canonical(self, sid: int) -> int:
        """A state with the same token mask: counters far from their bounds are clamped to one value.

        A token of L <= maxlen bytes moves a counter by at most L (loop bodies consume input), so values
        more than maxlen below the minimum, or at/above the minimum and more than maxlen below the maximum,
        behave alike for one token."""
        if not self.has_counters:
            return sid
        hit = self.canon.get(sid)
        if hit is not None:
            return hit
        T = self.table.maxlen
        memo: dict[int, int] = {0: 0}

        def canon_stack(st: int) -> int:
            if st in memo:
                return memo[st]
            ret, parent, v = self.stacks[st]
            p2 = canon_stack(parent)
            if ret < 0:
                lo, hi = self.nfa.loops[-1 - ret]
                if v < lo:
                    if lo - v > T:
                        v = lo - T - 1
                elif hi is None or hi - v > T:
                    v = lo if hi is None or hi - lo > T else v
            res = self._push(ret, p2, v) if (p2, v) != (parent, self.stacks[st][2]) else st
            memo[st] = res
            return res

        configs = frozenset((q, canon_stack(st)) for q, st in self.state_configs[sid])
        c = self._state(configs, bool(self.accepting[sid]))
        self.canon[sid] = c
        return c

    def mask(self, sid: int) -> np.ndarray:
        m = self.masks.get(sid)
        if m is not None:
            self.masks.move_to_end(sid)
            return m
        was = gc.isenabled()
        gc.disable()
        try:
            return self._mask_slow(sid)
        finally:
            if was:
                gc.enable()

    def _mask_slow(self, sid: int) -> np.ndarray:
        csid = self.canonical(sid)
        if csid != sid:
            m = self.mask(csid)
            self.masks[sid] = m
            return m
        tb = self.table
        out = np.zeros(tb.words, dtype=np.uint32)
        states = np.empty(tb.maxlen + 1, dtype=np.int32)
        states[0] = sid
        pos = np.zeros(2, dtype=np.int64)
        while _walk(self.trans, self.byte_class, tb.data, tb.offs, tb.lcp, tb.skip, tb.ids, states, pos, out):
            byte = tb.data[tb.offs[pos[0]] + pos[1]]
            self.fill(int(states[pos[1]]), self._cls_of[byte])
        if self.accepting[sid] and tb.eos.size:
            np.bitwise_or.at(out, tb.eos >> 5, np.uint32(1) << (tb.eos & 31).astype(np.uint32))
        m = out.view(np.int32)
        self.masks[sid] = m
        self.mask_bytes += m.nbytes
        while self.mask_bytes > MASK_CACHE_BYTES and len(self.masks) > 1:
            _, old = self.masks.popitem(last=False)
            self.mask_bytes -= old.nbytes
        return m
