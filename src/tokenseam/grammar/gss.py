"""The exact fallback for a grammar whose parses multiply: a graph-structured stack (GSS) over the byte NFA.

The automaton (automaton.py) names each position by its set of (NFA state, call stack) configurations. For an
ambiguous grammar that set can grow exponentially with the text: `s ::= "a" s | "a" s "b" | ""` leaves 2^n
stacks open after n "a"s, and the automaton stops at MAX_CLOSURE / MAX_STATE_CONFIGS. A request that reaches
that point must not fail, so its matcher moves here (matcher.GrammarMatcher) and carries on exactly.

Here the stacks of a position share their frames as a graph, as in GLR and GLL parsing: a node is one frame
(return state or -1 - loop, counter value) pushed at one step of the text, with every node below it it was
pushed onto as its parents. Nodes pushed at the same step with the same frame and the same entry state are one
node, so a position holds at most (NFA states) x (nodes) items however many stacks they stand for: polynomial
in the text, never exponential. The price: nothing is determinised or memoised, and every mask walks the
vocabulary in Python, so a mask takes milliseconds where few tokens are viable and up to about a second where
most are (an open string). The semantics are the automaton's (`Automaton._closure_loop`, `_step_bytes`), and
tests/grammar/test_gss.py checks them against it mask by mask.
"""

from __future__ import annotations

import numpy as np

from . import anyorder
from .automaton import indent_after
from .tables import SKIP_DEPTHS, TokenTable

CANON_ENTRIES = 1 << 14  # positions kept by `_canonical` (with their steps and masks) before starting over
MASK_ENTRIES = 256  # masks kept (packed: vocabulary / 8 bytes each)


class _Node:
    """A GSS node: frame (ret, v) pushed at step `pos` onto each of `parents` (the root has none)."""

    __slots__ = ("ret", "v", "pos", "parents", "pops", "derived")

    def __init__(self, ret: int, v: int, pos: int) -> None:
        self.ret = ret
        self.v = v
        self.pos = pos
        self.parents: list[_Node] = []
        # Made at the step being closed, a node may still gain parents: what was done on the old ones is
        # done again on each new one (GLL's pop set): the states popped to, the nodes its top was replaced by.
        self.pops: list[int] = []
        self.derived: list[_Node] = []


class GSSPosition:
    """A position: the items (NFA state with byte edges, node) after some text, whether the grammar may end
    there, and the indentation run (automaton.Automaton: -1 when not in one)."""

    __slots__ = ("items", "acc", "run")

    def __init__(self, items: tuple, acc: bool, run: int) -> None:
        self.items = items
        self.acc = acc
        self.run = run


class GSSParser:
    """Positions, commits and masks of one grammar over a graph-structured stack (see the module text)."""

    def __init__(self, nfa, table: TokenTable, indent_rows: tuple[np.ndarray, np.ndarray] | None) -> None:
        self.nfa = nfa
        self.table = table
        self._indent_rows = indent_rows  # MaskCache's filters when the grammar limits indentation
        self._step = 0
        self.root = _Node(-1, 0, -1)
        self._special = set().union(
            nfa.call, nfa.end_rule, nfa.cpush, nfa.cinc, nfa.cexit, nfa.cguard, nfa.cset
        )
        self._local_memo: dict[int, tuple[int, ...] | None] = {}
        # Positions with the same items are one object (`_canonical`), so that a step or a mask is computed once
        # per position: (items as (state, node id), accepting, run) -> position; (id, byte, run) -> (position,
        # next position); id -> (position, mask). Each memo entry holds the position its key names, so an id
        # is never read for another object.
        self._canon: dict[tuple, GSSPosition] = {}
        self._next: dict[tuple[int, int, int], tuple[GSSPosition, GSSPosition | None]] = {}
        self._masks: dict[int, tuple[GSSPosition, np.ndarray]] = {}
        self.start = self._canonical(self._close([(nfa.rule_start[0], self.root)], -1))

    def _canonical(self, p: GSSPosition | None) -> GSSPosition | None:
        if p is None:
            return None
        key = (tuple([(q, id(n)) for q, n in p.items]), p.acc, p.run)
        hit = self._canon.get(key)
        if hit is not None:
            return hit
        if len(self._canon) >= CANON_ENTRIES:
            self._canon.clear()
            self._next.clear()
            self._masks.clear()
        self._canon[key] = p
        return p

    def _local(self, q0: int) -> tuple[int, ...] | None:
        """The states with byte edges that epsilon edges reach from q0 when none of them touches a stack (the
        same under every node), else None."""
        hit = self._local_memo.get(q0, 0)
        if hit != 0:
            return hit
        eps, special = self.nfa.eps, self._special
        seen = {q0}
        todo = [q0]
        res: tuple[int, ...] | None = None
        while todo and len(seen) <= 256:
            q = todo.pop()
            if q in special:
                break
            for t in eps[q]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        else:
            if not todo:
                edges = self.nfa.edges
                res = tuple(q for q in seen if edges[q])
        self._local_memo[q0] = res
        return res

    def _close(self, seeds: list, run: int) -> GSSPosition | None:
        """The position made of `seeds` (state, node) and everything epsilon moves reach from them."""
        nfa = self.nfa
        eps, call, end_rule, edges = nfa.eps, nfa.call, nfa.end_rule, nfa.edges
        counters = bool(nfa.loops)
        self._step += 1
        pos = self._step
        made: dict[tuple[int, int, int], _Node] = {}
        seen: set[tuple[int, int]] = set()
        work: list[tuple[int, _Node]] = []
        out: list[tuple[int, _Node]] = []
        acc = False

        def add(q: int, n: _Node) -> None:
            k = (q, id(n))
            if k not in seen:
                seen.add(k)
                work.append((q, n))

        def node(ret: int, v: int, entry: int) -> _Node:
            key = (ret, v, entry)
            m = made.get(key)
            if m is None:
                m = made[key] = _Node(ret, v, pos)
                add(entry, m)
            return m

        def link(m: _Node, p: _Node) -> None:
            if any(x is p for x in m.parents):
                return
            m.parents.append(p)
            for t in m.pops:
                add(t, p)
            for d in m.derived:
                link(d, p)

        def pop(n: _Node, t: int) -> None:
            if n.pos == pos:
                n.pops.append(t)
            for p in n.parents:
                add(t, p)

        def replace(n: _Node, ret: int, v: int, t: int) -> None:
            m = node(ret, v, t)
            if n.pos == pos:
                n.derived.append(m)
            for p in list(n.parents):
                link(m, p)

        for q, n in seeds:
            add(q, n)
        while work:
            q, n = work.pop()
            for t in eps[q]:
                add(t, n)
            c = call.get(q)
            if c is not None:
                link(node(c[1], 0, nfa.rule_start[c[0]]), n)
            if counters:
                cp = nfa.cpush.get(q)
                if cp is not None:
                    link(node(-1 - cp[1], 0, cp[0]), n)
                if n is not self.root:
                    cs = nfa.cset.get(q)
                    if cs is not None:
                        code = nfa.cset_op[q]
                        v2 = anyorder.step(nfa.sets[cs[1]], n.v, code)
                        if v2 < 0:
                            pass
                        elif code == anyorder.EXIT:
                            pop(n, cs[0])
                        elif code == anyorder.SEP:
                            add(cs[0], n)
                        else:
                            replace(n, -1 - cs[1], v2, cs[0])
                    ci = nfa.cinc.get(q)
                    if ci is not None:
                        lo, hi = nfa.loops[ci[1]]
                        v = n.v + 1
                        if hi is None:
                            v = min(v, lo)
                        if hi is None or v <= hi:
                            replace(n, -1 - ci[1], v, ci[0])
                    cg = nfa.cguard.get(q)
                    if cg is not None:
                        hi = nfa.loops[cg[1]][1]
                        if hi is None or n.v < hi:
                            add(cg[0], n)
                    ce = nfa.cexit.get(q)
                    if ce is not None and n.v >= nfa.loops[ce[1]][0]:
                        pop(n, ce[0])
            r = end_rule.get(q)
            if r is not None:
                if n is self.root:
                    if r == 0:
                        acc = True
                else:
                    pop(n, n.ret)
            if edges[q]:
                out.append((q, n))
        if not out and not acc:
            return None
        return GSSPosition(tuple(out), acc, run)

    # -- commits -----------------------------------------------------------------------------------------
    def step_byte(self, p: GSSPosition, b: int, run: int) -> GSSPosition | None:
        """The (canonical) position after byte b from canonical position p, with indentation run `run`."""
        key = (id(p), b, run)
        hit = self._next.get(key)
        if hit is not None and hit[0] is p:
            return hit[1]
        edges = self.nfa.edges
        seeds = [(t, n) for q, n in p.items for lo, hi, t in edges[q] if lo <= b <= hi]
        nxt = None
        if seeds:
            # Most steps (a string body, a literal) touch no stack: their items are the seeds' local closures.
            items: dict[tuple[int, int], tuple[int, _Node]] = {}
            for t, n in seeds:
                loc = self._local(t)
                if loc is None:
                    nxt = self._close(seeds, run)
                    break
                for x in loc:
                    items[(x, id(n))] = (x, n)
            else:
                nxt = GSSPosition(tuple(items.values()), False, run) if items else None
            nxt = self._canonical(nxt)
        self._next[key] = (p, nxt)
        return nxt

    def step_bytes(self, p: GSSPosition | None, data: bytes) -> GSSPosition | None:
        """The position after `data` from p, or None when the grammar cannot read it."""
        if p is None or not data:
            return p
        run = p.run
        if self.nfa.indent_limit is not None:
            run = indent_after(self.nfa.indent_limit, run, data)
            if run is None:
                return None
        for b in data:
            p = self.step_byte(p, b, run)
            if p is None:
                return None
        return p

    # -- queries -----------------------------------------------------------------------------------------
    def mask(self, p: GSSPosition) -> np.ndarray:
        """The packed (int32) mask of the tokens allowed at p, as MaskCache.mask makes it."""
        hit = self._masks.get(id(p))
        if hit is not None and hit[0] is p:
            return hit[1]
        tb = self.table
        data, offs, lcp, skip, ids = tb.data, tb.offs, tb.lcp, tb.skip, tb.ids
        allowed: list[int] = []
        n = len(ids)
        states: list[GSSPosition] = [p]  # states[d]: the position after the first d bytes of token i
        dead = 0  # > 0: token i died reading its byte dead - 1, so tokens sharing that many bytes die too
        i = 0
        while i < n:
            if dead:
                if dead <= SKIP_DEPTHS:
                    i = int(skip[dead - 1, i - 1])
                    if i >= n:
                        break
                elif lcp[i] >= dead:
                    i += 1
                    continue
                dead = 0
            keep = min(int(lcp[i]), len(states) - 1)
            del states[keep + 1 :]
            s = states[-1]
            start, end = int(offs[i]), int(offs[i + 1])
            for j in range(start + keep, end):
                s = self.step_byte(s, int(data[j]), -1)
                if s is None:
                    dead = j - start + 1
                    break
                states.append(s)
            if not dead:
                allowed.append(int(ids[i]))
            i += 1
        row = np.zeros(tb.words * 32, dtype=bool)
        row[np.asarray(allowed, dtype=np.int64)] = True
        if p.acc and tb.eos.size:
            row[tb.eos] = True
        out = np.packbits(row, bitorder="little").view(np.uint32)
        if self._indent_rows is not None:
            outside, inside = self._indent_rows
            limit = self.nfa.indent_limit
            out = out & (outside if p.run < 0 else inside[min(limit - p.run, len(inside) - 1)])
        if len(self._masks) >= MASK_ENTRIES:
            self._masks.clear()
        out = out.view(np.int32)
        self._masks[id(p)] = (p, out)
        return out

    def has_moves(self, p: GSSPosition) -> bool:
        """Whether some non-EOS token is allowed at p."""
        m = self.mask(p).view(np.uint32).copy()
        eos = self.table.eos
        if p.acc and eos.size:
            np.bitwise_and.at(m, eos >> 5, ~(np.uint32(1) << (eos & 31).astype(np.uint32)))
        return bool(m.any())

    def forced_bytes(self, p: GSSPosition, limit: int) -> bytes:
        """The bytes every continuation from p starts with (stops where the grammar may end)."""
        edges = self.nfa.edges
        out = bytearray()
        while len(out) < limit and not p.acc:
            ranges = {(lo, hi) for q, _ in p.items for lo, hi, _t in edges[q]}
            live = [b for b in range(256) if any(lo <= b <= hi for lo, hi in ranges)]
            if len(live) != 1:
                break
            nxt = self.step_bytes(p, bytes(live))
            if nxt is None:
                break
            out.append(live[0])
            p = nxt
        return bytes(out)
