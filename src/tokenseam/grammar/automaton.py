"""The lazily determinised pushdown automaton: states, their transition rows, call stacks, positions, commits.

A DFA state is a set of (NFA state, call stack) configurations; rows are built on demand (in Python here, or by
the numba twins in localbuild.py). A position is (local state, parent stack): its masks live in masks.py, the
token tables in tables.py; the NFA arrives checked and trimmed (prepare.py) and is only read here.

Why this file is about 700 lines: it holds the Python reference twins of localbuild.py's numba functions
(closure, fill, clamping, positions), which share its state tables and must stay readable side by side with
them; masks, token tables, stacks and NFA preparation already live in their own modules.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import numpy as np

from . import anyorder
from .anyorder import SET_REACH
from .budget import compile_budget, current
from .errors import GrammarError
from .localbuild import (
    BOT,
    DEAD,
    ESCAPES,
    LIVE,
    M_STACKS,
    M_STATES,
    MAX_STATE_CONFIGS,
    NEED_PYTHON,
    NO_ROOM,
    ROOT,
    SAFE_SINK,
    UNBOUNDED,
    UNKNOWN,
    BuilderArrays,
    Direct,
    LocalBuilder,
)
from .localbuild import escape_target as _escape_target_nb
from .localbuild import fill as _fill_nb
from .prepare import PreparedNFA
from .stacks import Stacks
from .tables import TokenTable

# The builders Python calls, at their compiled entry points (localbuild.Direct).
fill = Direct(_fill_nb)
escape_target = Direct(_escape_target_nb)

# State ids are int32 (the transition rows). No other cap on the number of states: they are a cache of the
# determinisation, rebuilt from the NFA whenever needed, and their memory is bounded by the compiler's grammar
# budget (memory.GrammarMemory), which starts a grammar over between two requests' steps, never inside one.
MAX_STATE_ID = (1 << 31) - 1
MAX_CLOSURE = 100_000
# Call frames the Python side follows by recursion: a closure through the frames below it (returns that read
# no byte), a mask through its frames (masks.py). Past this the automaton gives up (a GrammarError: the
# matcher moves to the GSS parser, which keeps its stacks as data), instead of running into the interpreter's
# recursion limit. Right recursion that reads no byte before it returns (`r ::= x r | ""`) or a long chain
# of nullable rules reaches it.
MAX_NEST = 120
STEP_MEMO_ENTRIES = 1 << 15  # the commit memo starts over when it holds this many entries (a few MB)
NO_ESC: tuple = ()
NO_PENDING: tuple[list, list] = ([], [])  # a swept row with nothing left to build (never appended to)
# Configuration sets are sorted tuples of (NFA state, stack) int pairs, not frozensets: tuples of ints leave the
# cyclic GC's tracking, so the millions of them a long request builds do not make every full collection slow.


class Automaton:
    """Lazy DFA over (NFA state, stack) configuration sets (its masks: masks.MaskCache)."""

    def __init__(self, prepared: PreparedNFA, table: TokenTable, python_builder: bool = False) -> None:
        """`python_builder`: every state is built by the Python code here, none by the numba builder
        (localbuild): the reference the numba twins are tested against, much slower."""
        # The eager part (the start state) runs inside the compile's budget; states built later, as requests
        # reach them are bounded by the grammar memory budget (memory.py) and MAX_CLOSURE.
        with compile_budget() as b:
            stage, b.stage = b.stage, "preparing the automaton"
            try:
                self._init(prepared, table, python_builder)
            finally:
                b.stage = stage

    def _init(self, prepared: PreparedNFA, table: TokenTable, python_builder: bool) -> None:
        self.prepared = prepared  # what a fresh generation of this grammar is built from (memory.py)
        self.python_builder = python_builder
        self.nfa = nfa = prepared.nfa
        self.table = table
        self.byte_class = prepared.byte_class
        self._cls_of = self.byte_class.tolist()
        self.n_classes = prepared.n_classes
        self.class_start = prepared.class_start
        self._local_memo: dict[int, tuple[int, ...] | None] = {}
        self._succ_memo: dict[tuple, int] = {}
        self._pending: dict[int, tuple[list, list]] = {}
        self.has_counters = bool(nfa.loops)
        maxlen = table.maxlen
        self._loop_reach = [
            SET_REACH if lid in nfa.sets else 1 + (maxlen - 1) // nfa.loop_step.get(lid, 1)
            for lid in range(len(nfa.loops))
        ]
        self._clamp_memo: dict[int, int] = {}  # state -> its clamped state
        self.closure_memo: dict[tuple[int, int], tuple[tuple, bool, tuple]] = {}
        self._closing: set[tuple[int, int]] = set()
        self.state_index: dict[tuple[tuple, bool, tuple], int] = {}
        self.state_configs: list[tuple] = []
        self.state_esc: list[tuple] = []
        # (NFA state, stack) pairs held in configuration tuples (states and closures): the memory estimate's
        # measure of them (memory.automaton_bytes), kept as they are made
        self.config_entries = 0
        self._numba_states = False  # whether the walk has made states (see _sync)
        cap = 256
        self.flags = np.zeros(cap, dtype=np.int8)
        self.budget = np.zeros(cap, dtype=np.int32)
        self.trans = np.full((cap, self.n_classes), UNKNOWN, dtype=np.int32)
        # Mask walks read `clamped_trans`: the same rows with every successor replaced by its clamped state
        # (counters far from their bounds clamped to one value, `clamped`). A token never moves a counter far
        # enough for the difference to matter, and a clamped counted loop (a long maxLength string body) becomes
        # a state that string-safe characters loop on, so the walk takes such tokens whole instead of building
        # a state per count.
        self.clamped_trans = (
            np.full((cap, self.n_classes), UNKNOWN, dtype=np.int32) if self.has_counters else None
        )
        self.accepting = np.zeros(cap, dtype=bool)
        # A position is a pair (local state K, parent stack P): K holds every configuration with its frames
        # above P rebased onto BOT, so K (and its masks) is shared by every place the same shape recurs.
        # With an indentation limit (Grammar.indent_limit), a position also records how long the current run
        # of spaces/tabs after a raw newline is (-1: not in one); masks are filtered by it.
        self.indent_limit = nfa.indent_limit
        self.pairs: list[tuple[int, int, bool, int]] = []
        self.pair_index: dict[tuple[int, int, bool, int], int] = {}
        self._escape_memo: dict[tuple[int, int, bool], tuple[int, int, bool]] = {}
        self._escape_out = np.empty(3, dtype=np.int64)
        self._escape_py_memo: dict[tuple[int, int], tuple[tuple, bool, int]] = {}
        # (position, bytes) -> position after them: requests revisit positions (every item of an array, every
        # request of a schema), and a commit is then one lookup instead of a run over the bytes.
        self._step_memo: dict[tuple[int, bytes], int] = {}
        self._special = set().union(
            nfa.call, nfa.end_rule, nfa.cpush, nfa.cinc, nfa.cexit, nfa.cguard, nfa.cset
        )
        # Successors built inside the walk (localbuild).
        current().spend(nfa.size)  # its arrays: about 60 bytes per NFA state
        max_states = 0 if python_builder else MAX_STATE_ID
        self._fast = LocalBuilder(nfa, self.byte_class, self._special, max_states, self._loop_reach)
        self._stacks = Stacks(self._fast)
        self.stacks = self._stacks.frames  # stack id -> (return state or -1 - loop, parent, counter value)
        configs, acc, _ = self.closure(nfa.rule_start[0], ROOT)
        self.start = self._position(configs, acc)

    @property
    def num_states(self) -> int:
        """Automaton states built so far (they grow as requests reach new parts of the grammar)."""
        return len(self.state_configs)

    # -- configurations ----------------------------------------------------------------------------------
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

    def closure(self, q0: int, st0: int, depth: int = 0) -> tuple[tuple, bool, tuple]:
        """(configs with byte edges, root end reached, escapes): an escape is an NFA state that needs the
        frame under the local bottom BOT (a rule end or a counter operation there). `depth`: closures this one
        is computed for (returns into the frames below)."""
        key = (q0, st0)
        hit = self.closure_memo.get(key)
        if hit is not None:
            return hit
        if depth > MAX_NEST:
            raise GrammarError(f"the grammar returns through more than {MAX_NEST} call frames without a byte")
        local = self._local(q0)
        if local is not None:
            res = (tuple([(q, st0) for q in local]), False, NO_ESC)
            self.config_entries += len(local)
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
            return self._closure_loop(key, nfa, out, esc, acc, seen, stack, pops, depth)
        finally:
            self._closing.discard(key)

    def _closure_loop(self, key, nfa, out, esc, acc, seen, stack, pops, depth):
        steps = 0
        while stack:
            steps += 1
            if not steps & 4095:
                current().tick(4096)  # a compile's start state can take MAX_CLOSURE steps
            q, st = stack.pop()
            nxt = [(t, st) for t in nfa.eps[q]]
            c = nfa.call.get(q)
            if c is not None:
                nxt.append((nfa.rule_start[c[0]], self._stacks.push(c[1], st)))
            if self.has_counters:
                cp = nfa.cpush.get(q)
                if cp is not None:
                    nxt.append((cp[0], self._stacks.push(-1 - cp[1], st, 0)))
                if st == BOT:
                    if q in nfa.cinc or q in nfa.cguard or q in nfa.cexit or q in nfa.cset:
                        esc.add(q)
                else:
                    cs = nfa.cset.get(q)
                    if cs is not None:
                        _, parent, v = self.stacks[st]
                        code = nfa.cset_op[q]
                        v2 = anyorder.step(nfa.sets[cs[1]], v, code)
                        if v2 < 0:
                            pass
                        elif code == anyorder.EXIT:
                            pops.append((cs[0], parent))
                        elif code == anyorder.SEP:
                            nxt.append((cs[0], st))
                        else:
                            nxt.append((cs[0], self._stacks.push(-1 - cs[1], parent, v2)))
                    ci = nfa.cinc.get(q)
                    if ci is not None:
                        _, parent, v = self.stacks[st]
                        lo, hi = nfa.loops[ci[1]]
                        v += 1
                        if hi is None:
                            v = min(v, lo)
                        if hi is None or v <= hi:
                            nxt.append((ci[0], self._stacks.push(-1 - ci[1], parent, v)))
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
                if st == ROOT:
                    if r == 0:  # the root rule ended
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
                    cs, a, e = self.closure(k[0], k[1], depth + 1)
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
        self.config_entries += len(out)
        self.closure_memo[key] = res
        return res

    def _intern(self, configs: tuple, acc: bool, esc: tuple = NO_ESC) -> int:
        key = (configs, acc, esc)
        sid = self.state_index.get(key)
        if sid is not None:
            return sid
        if self._numba_states:
            sid = self._fast.find(configs, acc, esc, self.accepting)
            if sid >= 0:
                self.state_index[key] = sid
                return sid
        if len(configs) > MAX_STATE_CONFIGS:
            raise GrammarError(
                f"grammar is too ambiguous: the text so far leaves {len(configs)} parses open (limit "
                f"{MAX_STATE_CONFIGS}); rewrite the rules that read the same text in several ways"
            )
        sid = len(self.state_configs)
        if sid >= self.trans.shape[0]:
            self._grow(self.trans.shape[0] * 2)
        self.state_index[key] = sid
        self.state_configs.append(configs)
        self.state_esc.append(esc)
        self.config_entries += len(configs)
        self.accepting[sid] = acc
        room = self._safe_budget(configs)
        self.flags[sid] = (
            (LIVE if configs or acc else 0) | (ESCAPES if esc else 0) | (SAFE_SINK if room > 0 else 0)
        )
        self.budget[sid] = max(room, 0)
        self._fast.add(sid, configs, esc)
        return sid

    def _grow(self, cap: int) -> None:
        """Room for `cap` states in the per-state arrays."""
        n = self.trans.shape[0]
        # Growing a large automaton is a pause in the mask that makes the state, mostly spent writing fresh
        # pages: the rows grow in place (realloc moves a large block's pages rather than copying them) when
        # nothing else refers to them, else they are copied once.
        for name in ("trans", "clamped_trans"):
            rows = getattr(self, name)
            if rows is None:
                continue
            setattr(self, name, None)  # `rows` is then the only reference, unless something else holds one
            try:
                rows.resize((cap, rows.shape[1]))  # refuses (ValueError) while another reference exists
            except ValueError:
                grown = np.empty((cap, rows.shape[1]), dtype=rows.dtype)
                grown[:n] = rows
                rows = grown
            rows[n:] = UNKNOWN
            setattr(self, name, rows)
        for name in ("accepting", "flags", "budget"):
            old = getattr(self, name)
            grown = np.zeros(cap, dtype=old.dtype)
            grown[:n] = old
            setattr(self, name, grown)
        self._fast.grow_states(cap)

    def _sync(self, clamped: bool = True) -> None:
        """Take in the stacks and states the numba builder made (localbuild.fill): clamped ones for a walk,
        real ones for a commit. A state's configurations are read from the numba side when first needed
        (`_configs`); until then `_intern` finds it there."""
        fast = self._fast
        if fast.meta[M_STATES] <= len(self.state_configs) and fast.meta[M_STACKS] <= len(self.stacks):
            return
        self._stacks.take_in(fast.stk, int(fast.meta[M_STACKS]))
        n0 = len(self.state_configs)
        k = int(fast.meta[M_STATES]) - n0
        if k > 0:
            if self.has_counters and clamped:  # clamped by the walk's builder (localbuild)
                self._clamp_memo.update((sid, sid) for sid in range(n0, n0 + k))
            self.state_configs.extend([None] * k)
            self.state_esc.extend([None] * k)
            self._numba_states = True

    def _configs(self, sid: int) -> tuple:
        """State sid's configurations."""
        c = self.state_configs[sid]
        if c is None:
            c, e = self._fast.state(sid)
            self.config_entries += len(c)
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
        return self._intern(tuple(sorted(configs)), acc, tuple(sorted(esc)) if esc else NO_ESC)

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
                run(
                    cls_of[r[0]],
                    cls_of[r[1]] + 1,
                    tuple(sorted(set(moves))) if len(moves) > 1 else tuple(moves),
                )
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
            if self.clamped_trans is not None:
                row = self.trans[sid].copy()  # clamped() may grow (reallocate) the tables
                crow = row.copy()
                for v in set(row[row >= 0].tolist()):
                    cv = self.clamped(v)
                    if cv != v:
                        crow[row == v] = cv
                self.clamped_trans[sid] = crow
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
        self.trans[sid, c0 : c1 + 1] = nxt
        if self.clamped_trans is not None:
            cn = self.clamped(nxt) if nxt >= 0 else nxt
            self.clamped_trans[sid, c0 : c1 + 1] = cn

    @property
    def _walk_trans(self) -> np.ndarray:
        return self.trans if self.clamped_trans is None else self.clamped_trans

    def expand(self, sid: int) -> None:
        """Build state sid's whole transition row."""
        for c in range(self.n_classes):
            if self.trans[sid, c] == UNKNOWN:
                self.fill(sid, c)

    def step(self, sid: int, byte: int) -> int:
        c = self._cls_of[byte]
        v = self.trans[sid, c]
        if v == UNKNOWN:
            v = self._fill_numba(sid, c)
            if v == UNKNOWN:
                self.fill(sid, c)
                v = self.trans[sid, c]
        return int(v)

    def _fill_numba(self, sid: int, c: int) -> int:
        """The real successor of sid on class c built by the numba twin of `fill` (localbuild.fill, counters
        not clamped); UNKNOWN when it must be built in Python."""
        return int(self._fast_call(fill, sid, c, False, clamp=False))

    def builder_arrays(self, trans: np.ndarray) -> BuilderArrays:
        """The arrays for one call of a numba builder that builds rows `trans` (the real or the clamped ones)."""
        return self._fast.arrays(trans, self.flags, self.budget, self.accepting)

    def _fast_call(self, fn: Callable[..., int], *head: object, clamp: bool = True) -> int:
        """fn(*head, arrays), one of localbuild's state builders, with Python's new states and stacks indexed
        first, what it made taken in after (as clamped states, unless told), and arrays grown until it has room."""
        fast = self._fast
        while True:
            fast.index(self)
            r = fn(*head, self.builder_arrays(self.trans))
            self._sync(clamp)
            if r != NO_ROOM:
                return r
            fast.grow(self)

    def clamped(self, sid: int) -> int:
        """Counter clamping: a state with the same token mask, its counters far from their bounds clamped to one
        value (mask walks read these states, `clamped_trans`).

        A loop body takes at least m >= 1 bytes (ByteNFA.loop_step), so a token of L <= maxlen bytes moves
        its counter by at most T = 1 + (maxlen - 1) // m: the first pass may need one byte to finish, each
        later one m. Values more than T below the minimum, or at/above the minimum and more than T below
        the maximum, therefore behave alike for one token."""
        if not self.has_counters:
            return sid
        hit = self._clamp_memo.get(sid)
        if hit is not None:
            return hit
        memo: dict[int, int] = {ROOT: ROOT, BOT: BOT}
        configs = tuple(sorted({(q, self._clamp_stack(st, memo)) for q, st in self._configs(sid)}))
        c = self._intern(configs, bool(self.accepting[sid]), self._escapes(sid))
        self._clamp_memo[sid] = c
        return c

    def _clamp_stack(self, st: int, memo: dict[int, int]) -> int:
        """Stack st with every counter frame's value clamped as `clamped` describes (localbuild._clamp_stack)."""
        hit = memo.get(st)
        if hit is not None:
            return hit
        ret, parent, v0 = self.stacks[st]
        p2 = self._clamp_stack(parent, memo)
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
        res = self._stacks.push(ret, p2, v) if (p2, v) != (parent, v0) else st
        memo[st] = res
        return res

    # -- positions (local state, parent stack) -------------------------------------------------------------
    def _position(self, configs, acc: bool, run: int = -1) -> int:
        """The position for a set of real (NFA state, stack) configurations (and indentation run)."""
        if not configs:
            key = (-1, 0, bool(acc), run)
        else:
            p = self._stacks.cut(self._stacks.common({st for _, st in configs}))
            local = tuple(sorted({(q, self._stacks.rebase(st, p)) for q, st in configs}))
            key = (self._intern(local, False, NO_ESC), p, bool(acc), run)
        pid = self.pair_index.get(key)
        if pid is None:
            pid = len(self.pairs)
            self.pairs.append(key)
            self.pair_index[key] = pid
        return pid

    def export_position(self, pid: int) -> tuple[tuple, bool, int]:
        """Position pid as data no automaton owns: (real configurations with each stack spelled out as its
        frames (return state or -1 - loop, counter value) from the top down, accepting, indentation run).
        Another automaton on the same NFA makes the same position of it (`import_position`)."""
        k, p, acc, run = self.pairs[pid]
        if k < 0:
            return (), acc, run
        frames = self._stacks.frames

        def spell(st: int) -> tuple:
            out = []
            while st != ROOT:
                ret, st, v = frames[st]
                out.append((ret, v))
            return tuple(out)

        return tuple(sorted((q, spell(st)) for q, st in self._real_configs(k, p))), acc, run

    def import_position(self, data: tuple[tuple, bool, int]) -> int:
        """The position of data made by `export_position` (of this automaton or another on the same NFA)."""
        configs, acc, run = data
        push = self._stacks.push
        real = set()
        for q, spelled in configs:
            st = ROOT
            for ret, v in reversed(spelled):
                st = push(ret, st, v)
            real.add((q, st))
        return self._position(real, acc, run)

    def _escape_target_py(self, s: int, p: int) -> tuple[tuple, bool, int]:
        """Where local state s's escapes lead on the real parent stack p: (configs, accepting, position). The
        reference for its numba twin localbuild.escape_target (see `_escape_to`)."""
        key = (s, p)
        hit = self._escape_py_memo.get(key)
        if hit is None:
            configs: set = set()
            acc = False
            for q in self._escapes(s):
                cs, a, _ = self.closure(q, p)
                configs.update(cs)
                acc = acc or a
            hit = self._escape_py_memo[key] = (tuple(sorted(configs)), acc, self._position(configs, acc))
        return hit

    def _run(self, k: int, p: int, data: bytes) -> tuple[set, bool]:
        """Real configurations (and acceptance) after `data` from position (k, p)."""
        res: set = set()
        acc = False
        s = k
        flags = self.flags
        for i, b in enumerate(data):
            if flags[s] & ESCAPES:
                k2, p2, _ = self._escape_to(s, p, False)
                if k2 >= 0:
                    c2, a2 = self._run(k2, p2, data[i:])
                    res |= c2
                    acc = acc or a2
            s = self.step(s, b)
            if s < 0:
                return res, acc
            flags = self.flags
        if flags[s] & ESCAPES:
            k2, p2, a = self._escape_to(s, p, False)
            if k2 >= 0:
                res |= self._real_configs(k2, p2)
            acc = acc or a
        return res | self._real_configs(s, p), acc

    def _real_configs(self, k: int, p: int) -> set:
        """The real configurations of position (local state k, parent stack p)."""
        return {(q, self._stacks.materialize(lst, p)) for q, lst in self._configs(k)}

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
            run = indent_after(self.indent_limit, run, data)
            if run is None:
                return DEAD
        configs, acc = self._run(k, p, data)
        if not configs and not acc:
            return DEAD
        return self._position(configs, acc, run)

    def is_accepting(self, pid: int) -> bool:
        return self.pairs[pid][2]

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

    # -- what masks read --------------------------------------------------------------------------------
    def _safe_budget(self, configs: tuple) -> int:
        """How many code points of any string-safe text a state with these configurations stays alive on (-1:
        not known to): unbounded from a universal NFA state, hi - v from the body of a counted loop over every
        safe character whose counter stands at v (a maxLength string), or of a pattern under a length bound
        (ByteNFA.counted_body and counted_budget)."""
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
                    room = UNBOUNDED if hi is None else hi - nfa.loop_slack.get(lid, 0) - v
                    best = max(best, min(room, nfa.counted_budget.get(q, UNBOUNDED)))
        return min(best, UNBOUNDED)

    def _escape_to(self, s: int, p: int, clamp: bool) -> tuple[int, int, bool]:
        """Where local state s's escapes lead on the real parent stack p: (local state or -1 for none, parent
        stack, accepting), the local state clamped if asked (a mask key) or real (a commit's position). Built by
        localbuild.escape_target, else by its Python twin `_escape_target_py`; memoised."""
        clamp = clamp and self.has_counters
        key = (s, p, clamp)
        hit = self._escape_memo.get(key)
        if hit is None:
            out = self._escape_out
            if self._fast_call(escape_target, s, p, clamp, out, clamp=clamp) != NEED_PYTHON:
                k2, p2, acc2 = out.tolist()
            else:
                k2, p2, acc2, _ = self.pairs[self._escape_target_py(s, p)[2]]
                if k2 >= 0 and clamp:
                    k2 = self.clamped(k2)
            hit = self._escape_memo[key] = (k2, p2, bool(acc2))
        return hit


def indent_after(lim: int, run: int, data: bytes) -> int | None:
    """The indentation run after `data` from a run of `run` (-1: none), or None if a run passes the limit."""
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
