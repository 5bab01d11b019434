"""Lowering of the grammar IR to one byte-level NFA with pushdown calls for recursive rules.

Rules not on a reference cycle are inlined; a reference to a rule on a cycle becomes a call edge. Here: the
NFA itself (ByteNFA) and the lowering (_Builder, build_nfa). The rule graph analysis it starts from is in
rulegraph.py, code points as UTF-8 bytes in utf8.py, the final rows' flat storage in flatrows.py.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable

import numpy as np

from . import anyorder, cpauto, cpkernels, library
from .budget import compile_budget, current
from .cpauto import CPNFA
from .errors import GrammarError
from .flatrows import FlatRows
from .ir import (
    ANY_RANGES,
    EMPTY,
    LAYOUT,
    LAYOUT_NO_INDENT,
    PLAIN_BYTE,
    PLAIN_BYTE_IN_STRING,
    Alt,
    Auto,
    Chars,
    Escaped,
    Grammar,
    Members,
    Node,
    Ref,
    Repeat,
    Seq,
    covers_safe,
    norm,
)
from .rulegraph import cyclic_rules, productive, prune_unproductive, push_parts, rule_refs
from .utf8 import CodePointEdges, lowering_plan
from .walk import run

MAX_STATES = 300_000
COUNTER_THRESHOLD = 12
INLINE_LIMIT = 400
_OWN_TERM = {Seq: 2, Alt: 2, Repeat: 2, Members: 4, Escaped: 0}  # _Builder.exceeds
LARGE_NFA = 32_768  # states at which the builder estimates the whole grammar's size (_Builder.build)
# States are reported to the compile budget (budget.py) in blocks of this many, 4 units each: a state's two
# rows and its edges.
CHARGE_BLOCK = 64


class ByteNFA:
    """Byte-range edges, epsilon edges and call edges; rule r spans rule_start[r] .. rule_end[r]."""

    def __init__(self) -> None:
        self.n = 0  # states
        # While the NFA is built, its byte edges are one flat list of (source, first byte, last byte, target),
        # in the order they are added (`e`: a lowering appends to it directly); `edges` is None until the NFA
        # is final, then each state's edges in that order, flat (FlatRows, see freeze_rows). No per-state
        # lists or per-edge tuples: made and freed by the thousand in each compile, they cost about as much as
        # the rest of the freeze.
        self.e: list[int] = []
        # Edges a kernel wrote (int32 arrays of the same items), joined to `e` at the freeze: they go into the
        # rows of states no other edge leaves, so where they stand in `e` changes no row.
        self.e_chunks: list[np.ndarray] = []
        # Copies of CodePointEdges.into_fresh's templates whose edges are written at the freeze, one array per
        # template: id(template rows) -> (rows, the rows into the target, first states, targets).
        self.fresh: dict[int, tuple[np.ndarray, np.ndarray, list[int], list[int]]] = {}
        self.edges: FlatRows | None = None
        self._next_check = CHARGE_BLOCK - 1  # add(): the state index at which _check runs next
        # When the NFA reaches `large_at` states, `on_large()` runs once (the builder's size estimate).
        self.large_at = MAX_STATES
        self.on_large: Callable[[], None] | None = None
        # Epsilon edges likewise: (source, target) pairs while built, then `eps`, each state's targets in order.
        self.ep: list[int] = []
        self.ep_chunks: list[np.ndarray] = []
        # Layouts whose inner rows are written at the freeze: (a, e, indent) each (_Builder.layout).
        self.lay: list[int] = []
        self.eps: FlatRows | None = None
        self.call: dict[int, tuple[int, int]] = {}
        self.rule_start: list[int] = []
        self.rule_end: list[int] = []
        self.rule_names: list[str] = []
        self.end_rule: dict[int, int] = {}
        # Counted loops: entering pushes a counter frame, `cinc` bumps it, `cexit` pops it (if >= min).
        self.may_dead_end = False  # set when some path can reach a state that cannot finish
        self.indent_limit: int | None = None  # Grammar.indent_limit
        self.loops: list[tuple[int, int | None]] = []
        self.cpush: dict[int, tuple[int, int]] = {}
        self.cinc: dict[int, tuple[int, int]] = {}
        self.cexit: dict[int, tuple[int, int]] = {}
        self.cguard: dict[int, tuple[int, int]] = {}  # enter the body only while the counter is < max
        # Any-order objects (anyorder.py): a set frame pushed by `cpush`, then operations on it: state ->
        # (target, loop id) in `cset`, the operation's code in `cset_op`; loop id -> anyorder.SetSpec in `sets`.
        self.cset: dict[int, tuple[int, int]] = {}
        self.cset_op: dict[int, int] = {}
        self.sets: dict[int, anyorder.SetSpec] = {}
        self.loop_slack: dict[int, int] = {}  # loop id -> how far below its max its guards' bounds may lie
        self.loop_step: dict[
            int, int
        ] = {}  # loop id -> at least this many bytes per pass of its body (else 1)
        # States from which any string-safe text (ir.SAFE_RANGES) can be read by byte and plain epsilon edges
        # and still finish: a free string body, "any key but these", `.*`. Masks from them take every
        # string-safe token without a walk (see MaskCache.local_info). A subset: it need not name them all.
        self.universal: set[int] = set()
        # Body start of a counted loop over one character class covering every string-safe character -> its
        # loop id: with the counter at v, any string-safe text of up to max - v characters stays alive.
        # In a pattern under a length bound (embed_counted), the start of each guarded character of a pattern
        # state that stays alive on safe text -> the loop id, and in `counted_budget` how many characters the
        # pattern state stays alive on (absent: any number): then min(that, max - slack - v).
        self.counted_body: dict[int, int] = {}
        self.counted_budget: dict[int, int] = {}

    def add(self) -> int:
        n = self.n
        if n >= self._next_check:
            self._check(n)
        self.n = n + 1
        return n

    def add_many(self, k: int) -> int:
        """k new states, numbered from the one returned; budgeted and capped as k calls of add() would be."""
        n = self.n
        while self._next_check < n + k:
            self._check(self._next_check)
        self.n = n + k
        return n

    def _check(self, n: int) -> None:
        """At state n = the next check (the last of a block of CHARGE_BLOCK states, or MAX_STATES): refuse a
        state past MAX_STATES, charge the block to the compile budget, and set the next check."""
        if n >= MAX_STATES:
            raise GrammarError(f"grammar too large: more than {MAX_STATES} automaton states")
        if n % CHARGE_BLOCK == CHARGE_BLOCK - 1:
            current().spend(4 * CHARGE_BLOCK)
        if n >= self.large_at:
            self.large_at = MAX_STATES
            if self.on_large is not None:
                self.on_large()
        self._next_check = min(n + 1 + (CHARGE_BLOCK - 2 - n) % CHARGE_BLOCK, MAX_STATES, self.large_at)

    @property
    def size(self) -> int:
        return self.n

    def freeze_rows(self) -> None:
        """Edges and epsilon edges become per-state rows, flat and read-only (FlatRows), each state's in the
        order they were added: call once the NFA is complete (prepare.prepare_nfa)."""
        if self.edges is None:
            if self.lay:
                edges, eps = cpkernels.layout_rows(np.array(self.lay, np.int32))
                self.e_chunks.append(edges)
                self.ep_chunks.append(eps)
                self.lay = []
            for rows, into_e, firsts, targets in self.fresh.values():
                self.e_chunks.append(_template_copies(rows, into_e, firsts, targets))
            self.fresh = {}
            self.edges = _rows_of(self.e, self.e_chunks, 4, self.n)
            self.eps = _rows_of(self.ep, self.ep_chunks, 2, self.n)
            self.e, self.ep, self.e_chunks, self.ep_chunks = [], [], [], []

    def replace_rows(self, edges: list[list[tuple[int, int, int]]], eps: list[list[int]]) -> None:
        """New frozen rows (the rare rewrite after the freeze that drops edges: prepare._trim)."""
        self.edges = FlatRows(edges, 3)
        self.eps = FlatRows(eps, 1)


def _rows_of(flat: list[int], chunks: list[np.ndarray], width: int, n: int) -> FlatRows:
    """Items of `width` ints (source first), from the list and then the int32 chunks, as the rows of n states,
    each in the order added."""
    # struct reads a list of ints faster than np.array does (about 11 against 15 ns per int); in pieces, so that
    # the argument tuple stays small.
    step = 1 << 14
    raw = b"".join(
        [
            *(
                struct.pack(f"{len(part)}i", *part)
                for part in (flat[k : k + step] for k in range(0, len(flat), step))
            ),
            *(c.tobytes() for c in chunks),
        ]
    )
    return FlatRows.grouped(np.frombuffer(raw, dtype=np.int32).reshape(-1, width), n)


def _template_copies(
    rows: np.ndarray, into_e: np.ndarray, firsts: list[int], targets: list[int]
) -> np.ndarray:
    """The edges of a template's copies, flat, copy after copy: copy k's states numbered from firsts[k] and its
    rows `into_e` led into targets[k]."""
    first = np.array(firsts, np.int32)[:, None]
    edges = np.repeat(rows[None], len(firsts), axis=0)
    edges[:, :, 0] += first
    edges[:, :, 3] += first
    edges[:, into_e, 3] = np.array(targets, np.int32)[:, None]
    return edges.ravel()


def layout_rows_into(edges: list[int], ep: list[int], a: int, e: int, indent: bool) -> None:
    """The rows of a layout's inner states a, r (and n) appended to flat edge and epsilon lists, in the order
    cpkernels.layout_rows writes them: a's blanks into e, r's newline, n's blanks looping and n into e, a into
    e."""
    n = a + 2 if indent else e
    edges += (a, 0x09, 0x09, e, a, 0x20, 0x20, e, a + 1, 0x0A, 0x0A, n)
    if indent:
        edges += (n, 0x09, 0x09, n, n, 0x20, 0x20, n)
        ep += (n, e)
    ep += (a, e)


def _one_safe_char(node: Node) -> bool:
    """Whether `node` reads any one string-safe character by itself, with a class lowered as byte edges from
    where the node starts (a Chars covering ir.SAFE_RANGES, alone or as an alternative)."""
    while isinstance(node, Escaped):
        node = node.item
    if isinstance(node, Alt):
        return any(isinstance(x, Chars) and covers_safe(x.ranges) for x in node.items)
    return isinstance(node, Chars) and covers_safe(node.ranges)


def _by_target(row: list, normed: dict[tuple, tuple]) -> dict[int, tuple]:
    """A code point automaton state's edges as one range set per target state: each set is lowered once, so a
    complement state's many ranges into its sink share their UTF-8 states. `normed`: sets normalised so far
    (the states of a counted class all have the same gaps into their sink)."""
    out: dict[int, list] = {}
    for lo, hi, t in row:
        rs = out.setdefault(t, [])
        if isinstance(lo, tuple):
            rs.extend(lo)
        else:
            rs.append((lo, hi))
    sets = {}
    for t, rs in out.items():
        key = tuple(rs)
        if len(rs) > 1:
            got = normed.get(key)
            if got is None:
                got = normed[key] = norm(rs)
            key = got
        sets[t] = key
    return sets


def _grouped(a: CPNFA) -> list[dict[int, tuple]]:
    """`a`'s rows grouped by target (_by_target), computed once per automaton."""
    if a.by_target is None:
        normed: dict[tuple, tuple] = {}
        a.by_target = [_by_target(row, normed) for row in a.edges]
    return a.by_target


def _auto_states(node: Auto) -> int:
    """The estimate's term for an embedded automaton. `embed` shares each target's escapes and multi-byte forms,
    so three states per code point state bound it; `embed_counted` gives every character its own guard, body and
    increment states and its own byte forms, so a length-bounded pattern of non-ASCII classes (`\\S`) makes
    several times more: counted per character here (4 states per multi-byte range, 4 for escapes)."""
    a = node.auto
    if node.limit is None:
        return a.size * 3
    v = a.counted_states
    if v is None:
        v = a.size
        for row in _grouped(a):
            for rs in row.values():
                _, specials, high, _ = lowering_plan(rs, True)
                v += 3 + 4 * len(high) + (4 if specials else 0)
        a.counted_states = v
    return v


@functools.lru_cache(maxsize=4096)
def _word_row(cs: tuple[int, ...], esc: bool) -> tuple[int, tuple]:
    """How `embed` lowers a `not_words` trie state whose children read the code points `cs` (sorted): its row's
    length, and per target in the order `_by_target` groups them (children and the sink at the first gap
    between them), `CodePointEdges.lower`'s steps as (kind, x, y, c): kind 0 a byte edge x..y, kind 1 a
    backslash into the escapes of the code points x, kind 2 an epsilon edge into the multi-byte forms of x;
    c the child's code point, or -1 for the sink."""
    plan, gaps = cpauto._complement_plan(cs)
    if len(_SETS) > 8192:
        _SETS.clear()  # only lookups in embed_words go by content again
    items: list[tuple] = []
    sink_done = False
    for _, _, c in plan:
        if c < 0:
            if sink_done:
                continue
            sink_done = True
            rs = gaps
        else:
            rs = ((c, c),)
        plain, specials, high, _ = lowering_plan(rs, esc)
        items += [(0, lo, hi, c) for lo, hi in plain]
        # Equal sets as one object, which embed_words looks up by identity.
        if specials:
            items.append((1, _SETS.setdefault(specials, specials), 0, c))
        if high:
            items.append((2, _SETS.setdefault(high, high), 0, c))
    return len(plan), tuple(items)


_SETS: dict[tuple, tuple] = {}  # the code point sets in _word_row's steps, one object per content
# The escaped and the multi-byte code points of a not_words sink: the sets of a trie state without children.
_SINK_SETS = tuple(next(x for kind, x, _, _ in _word_row((), True)[1] if kind == k) for k in (1, 2))


class _Builder:
    def __init__(self, g: Grammar, graph: tuple[dict[str, set[str]], list[str]] | None = None) -> None:
        """`graph`: rule_refs(g), if the caller has it."""
        self.g = g
        self.nfa = ByteNFA()
        self.budget = current()
        refs, multi = rule_refs(g) if graph is None else graph
        self.refs = refs
        self.cyclic = cyclic_rules(g, refs) | {name for name in g.shared if name in g.rules}
        self.est_memo: dict[int, int] = {}
        self.null_memo: dict[int, bool] = {}
        self.min_memo: dict[int, int] = {}
        # A big rule referenced from several places is called (shared) rather than copied at each use.
        # (Sizes are estimated as the calls stood when each was measured; `build` measures afresh.)
        for name in multi:
            self.budget.where = f"rule {name!r}"
            if name not in self.cyclic and self.exceeds(g.rules[name], INLINE_LIMIT):
                self.cyclic.add(name)
        self.rule_index: dict[str, int] = {}
        self.rule_log: list | None = None
        self.code_points = CodePointEdges(self.nfa)

    def estimate(self, node: Node) -> int:
        return self._estimate(node, 0)

    def exceeds(self, node: Node, limit: int) -> bool:
        """estimate(node) > limit, without estimating all of a big node: the parts' own terms summed over the
        tree (rules inlined, each occurrence counted) never exceed the estimate, whose factors are all at least
        1, so the walk stops once they pass `limit`. Below it, the estimate itself decides (a small walk)."""
        memo, rules, cyclic = self.est_memo, self.g.rules, self.cyclic
        total = 0
        stack = [node]
        while stack:
            x = stack.pop()
            hit = memo.get(id(x))
            if hit is not None:
                total += hit
            elif isinstance(x, Ref):
                if x.name in cyclic:
                    total += 2
                else:
                    stack.append(rules[x.name])
            else:
                t = type(x)
                if t is Seq or t is Alt:
                    # (their characters, most of the parts, summed here rather than each pushed and popped)
                    total += 2
                    for it in x.items:
                        if type(it) is Chars:
                            total += 2 * len(it.ranges) + 2
                        else:
                            stack.append(it)
                elif t is Chars:
                    total += 2 * len(x.ranges) + 2
                elif t is Auto:
                    total += _auto_states(x)
                else:  # Repeat 2, Members 4, Escaped 0: the estimate's own terms
                    total += _OWN_TERM.get(t, 1)
                    push_parts(x, stack)
            if total > limit:
                return True
        return self.estimate(node) > limit

    def _estimate(self, node: Node, depth: int) -> int:
        """An upper bound on the NFA states of `node` (capped). Plain recursion: past 200 levels it refuses
        the grammar, so it never nests deeper than that (a Members' separator counts from 0 again, and a
        separator is a few nodes)."""
        hit = self.est_memo.get(id(node))
        if hit is not None:
            return hit
        self.budget.spend(1)  # the memo entry
        if depth > 200:
            raise GrammarError("grammar nesting too deep")
        if isinstance(node, Chars):
            v = 2 * len(node.ranges) + 2
        elif isinstance(node, (Seq, Alt)):
            v = 2
            for x in node.items:
                v += self._estimate(x, depth + 1)
        elif isinstance(node, Repeat):
            if self.counted(node):
                v = 6 + self._estimate(node.item, depth + 1)
            else:
                v = 2 + self._estimate(node.item, depth + 1) * max(
                    1, node.max if node.max is not None else node.min + 1
                )
        elif isinstance(node, Escaped):
            v = self._estimate(node.item, depth + 1) * 2
        elif isinstance(node, Ref):
            v = 2 if node.name in self.cyclic else self._estimate(self.g.rules[node.name], depth + 1)
        elif isinstance(node, Members):
            copies = max(node.min, node.max or 0) + 1
            parts = 0
            for x, _ in node.items:
                parts += self._estimate(x, depth + 1)
            parts += self._estimate(node.sep, 0)
            if node.extra is not None:
                parts += self._estimate(node.extra, depth + 1)
            v = copies * parts + 4
        elif isinstance(node, Auto):
            v = _auto_states(node)
        else:
            v = 1
        v = min(v, 10 * MAX_STATES)
        self.est_memo[id(node)] = v
        return v

    # The analyses below and `_emit` are walks (walk.run): `_x(node, ...)` is the memo's value, the value of a
    # leaf, or the walk that computes it, so IR depth costs no interpreter stack.
    def counted(self, node: Repeat) -> bool:
        big = (node.max if node.max is not None else node.min) > COUNTER_THRESHOLD
        return big and not self.nullable(node.item)

    def min_bytes(self, node: Node) -> int:
        """A lower bound on the length in bytes of the strings of `node` (0 where a cycle or deep nesting
        makes it unsure)."""
        return run(self._min_bytes(node, 0))

    def _min_bytes(self, node: Node, depth: int):
        hit = self.min_memo.get(id(node))
        if hit is not None:
            return hit
        if depth > 200:
            return 0
        return self._min_bytes_walk(node, depth)

    def _min_bytes_walk(self, node: Node, depth: int):
        key = id(node)
        self.min_memo[key] = 0  # inside a cycle: 0 is always a lower bound
        if isinstance(node, Chars):
            v = 1
        elif isinstance(node, Seq):
            v = 0
            for x in node.items:
                v += yield self._min_bytes(x, depth + 1)
        elif isinstance(node, Alt):
            lengths = []
            for x in node.items:
                lengths.append((yield self._min_bytes(x, depth + 1)))
            v = min(lengths, default=0)
        elif isinstance(node, Repeat):
            v = node.min * (yield self._min_bytes(node.item, depth + 1))
        elif isinstance(node, Escaped):
            v = yield self._min_bytes(node.item, depth + 1)
        elif isinstance(node, Ref):
            v = yield self._min_bytes(self.g.rules[node.name], depth + 1)
        elif isinstance(node, Members):
            v = 0
            for x, required in node.items:
                if required:
                    v += yield self._min_bytes(x, depth + 1)
        else:
            v = 0
        self.min_memo[key] = v
        return v

    def nullable(self, node: Node) -> bool:
        return run(self._nullable(node, 0))

    def _nullable(self, node: Node, depth: int):
        hit = self.null_memo.get(id(node))
        if hit is not None:
            return hit
        if depth > 200:
            return True
        return self._nullable_walk(node, depth)

    def _nullable_walk(self, node: Node, depth: int):
        key = id(node)
        self.null_memo[key] = True  # a cycle is conservatively nullable
        if isinstance(node, Chars):
            v = False
        elif isinstance(node, Seq):
            v = True
            for x in node.items:
                if not (yield self._nullable(x, depth + 1)):
                    v = False
                    break
        elif isinstance(node, Alt):
            v = False
            for x in node.items:
                if (yield self._nullable(x, depth + 1)):
                    v = True
                    break
        elif isinstance(node, Repeat):
            v = node.min == 0 or (yield self._nullable(node.item, depth + 1))
        elif isinstance(node, Escaped):
            v = yield self._nullable(node.item, depth + 1)
        elif isinstance(node, Ref):
            v = yield self._nullable(self.g.rules[node.name], depth + 1)
        elif isinstance(node, Members):
            v = node.min == 0
        else:
            v = True
        self.null_memo[key] = v
        return v

    def rule(self, name: str) -> int:
        if self.rule_log is not None:  # a library rule's lowering is watched (library.record)
            self.rule_log.append((self.nfa.size, name, name not in self.rule_index))
        if name in self.rule_index:
            return self.rule_index[name]
        r = len(self.nfa.rule_start)
        self.rule_index[name] = r
        s = self.nfa.add()
        e = self.nfa.add()
        self.nfa.rule_start.append(s)
        self.nfa.rule_end.append(e)
        self.nfa.rule_names.append(name)
        self.nfa.end_rule[e] = r
        self.pending.append((name, s, e))
        return r

    def build(self) -> ByteNFA:
        if self.g.start not in self.g.rules:
            raise GrammarError(f"start rule {self.g.start!r} is not defined")
        self.est_memo.clear()
        # The grammar's size is estimated only once its NFA is large: most grammars never get there, and the
        # estimate walks the whole start rule (2.6 ms of a 37 ms compile for a 17 KB schema of long enums). The
        # large schemas served most (Kubernetes objects: 23,000-26,000 states) stay below LARGE_NFA; a grammar
        # past MAX_STATES is refused after at most LARGE_NFA states' work.
        self.nfa.large_at = LARGE_NFA
        self.nfa.on_large = self._refuse_if_too_large
        try:
            self.pending: list[tuple[str, int, int]] = []
            self.rule(self.g.start)
            while self.pending:
                name, s, e = self.pending.pop()
                self.budget.where = f"rule {name!r}"
                end = self._lower_rule(name, s)
                self.nfa.ep += (end, e)
        finally:
            self.nfa.on_large = None
        return self.nfa

    def _refuse_if_too_large(self) -> None:
        """Refuse a grammar whose estimated size is past MAX_STATES, before it is lowered further."""
        where, self.budget.where = self.budget.where, f"rule {self.g.start!r}"
        est = self.estimate(self.g.rules[self.g.start])
        if est > MAX_STATES:
            raise GrammarError(
                f"grammar too large (about {est} automaton states, limit {MAX_STATES}); "
                "reduce repeat counts or nesting"
            )
        self.budget.where = where

    def _lower_rule(self, name: str, s: int) -> int:
        """A called rule's body from its start state s; the state it ends in. A library body (library.py) is
        copied when it was lowered before in this process, and watched while it is lowered the first time;
        only when every rule it names is called (a copied-in rule would make the lowering depend on it)."""
        body = self.g.rules[name]
        frag = library.lookup(body)
        if frag is library.ABSENT or frag is library.NOT_COPYABLE or not self.refs[name] <= self.cyclic:
            return run(self._emit(body, s, False, None))
        if frag is not None:
            return frag.stamp(self, s)
        end, made = library.record(self, body, s)
        library.keep(body, made)
        return end

    def _emit(self, node: Node, s: int, esc: bool, end: int | None):
        """Lower `node` starting at state `s`; the state reached after it (a node without parts to walk is
        lowered at once), or the walk that lowers it. With `end`, the node finishes in that state (the caller's join or loop head),
        so no extra state and epsilon edge are needed there.

        Invariant: no edge ever enters `s` from inside the node, so alternatives can all start at `s`."""
        nfa = self.nfa
        if isinstance(node, Chars):
            e = nfa.add() if end is None else end
            self.code_points.lower(node.ranges, s, e, esc)
            return e
        if isinstance(node, Ref) and node.name in self.cyclic:
            r = self.rule(node.name)
            ret = nfa.add() if end is None else end
            c = nfa.add()
            nfa.ep += (s, c)
            nfa.call[c] = (r, ret)
            return ret
        if isinstance(node, Auto):
            if node.limit is not None:
                return self.embed_counted(node.auto, node.limit, s, esc or node.escape, end)
            return self.embed(node.auto, s, esc or node.escape, end)
        if (node is LAYOUT or node is LAYOUT_NO_INDENT) and not esc:
            return self.layout(node is LAYOUT, s, end)
        return self._emit_walk(node, s, esc, end)

    def _emit_walk(self, node: Node, s: int, esc: bool, end: int | None):
        nfa = self.nfa
        if isinstance(node, Seq):
            items = node.items
            if not items:
                if end is None:
                    return s
                nfa.ep += (s, end)
                return end
            last = len(items) - 1
            edges = nfa.e
            plain = PLAIN_BYTE_IN_STRING if esc else PLAIN_BYTE
            for k, it in enumerate(items):
                a = plain.get(id(it))
                if a is not None:
                    # A shared node of a plain ASCII character (most of a literal key): one byte edge, and its
                    # state made as add() makes it, without the call.
                    if k == last and end is not None:
                        t = end
                    else:
                        t = nfa.n
                        if t >= nfa._next_check:
                            nfa._check(t)
                        nfa.n = t + 1
                    edges += (s, a, a, t)
                    s = t
                    continue
                if (it is LAYOUT or it is LAYOUT_NO_INDENT) and not esc:  # (around a colon, comma or brace)
                    s = self.layout(it is LAYOUT, s, end if k == last else None)
                    continue
                t = self._emit(it, s, esc, end if k == last else None)
                s = t if type(t) is int else (yield t)  # a leaf is lowered at once: no round trip
            return s
        if isinstance(node, Alt):
            if not node.items:
                nfa.may_dead_end = True
                return nfa.add() if end is None else end  # nothing reaches it: the empty language
            e = nfa.add() if end is None else end
            for it in node.items:
                t = self._emit(it, s, esc, e)
                if type(t) is not int:
                    yield t
            return e
        if isinstance(node, Repeat) and self.counted(node):
            lid = len(nfa.loops)
            nfa.loops.append((node.min, node.max))
            nfa.loop_step[lid] = max(1, self.min_bytes(node.item))
            p, h, x, ci = nfa.add(), nfa.add(), nfa.add(), nfa.add()
            e = nfa.add() if end is None else end
            nfa.ep += (s, p)
            nfa.cpush[p] = (h, lid)
            nfa.ep += (h, x)
            nfa.cexit[x] = (e, lid)
            g, b = nfa.add(), nfa.add()
            nfa.ep += (h, g)
            nfa.cguard[g] = (b, lid)
            yield self._emit(node.item, b, esc, ci)
            nfa.cinc[ci] = (h, lid)
            if _one_safe_char(node.item):
                nfa.counted_body[b] = lid
            return e
        if isinstance(node, Repeat):
            if self.estimate(node) > MAX_STATES:
                raise GrammarError(f"repeat {{{node.min},{node.max}}} makes the grammar too large")
            if node.max is None:
                for _ in range(node.min):
                    s = yield self._emit(node.item, s, esc, None)
                # A fresh loop head: the body returns to it, and it is where the repeat may stop.
                loop = nfa.add()
                nfa.ep += (s, loop)
                yield self._emit(node.item, loop, esc, loop)
                if end is None:
                    return loop
                nfa.ep += (loop, end)
                return end
            if node.max == 0:
                return (yield self._emit(EMPTY, s, esc, end))
            e = nfa.add() if end is None else end
            for k in range(node.max):
                if k >= node.min:
                    nfa.ep += (s, e)
                s = yield self._emit(node.item, s, esc, e if k == node.max - 1 else None)
            return e
        if isinstance(node, Escaped):
            return (yield self._emit(node.item, s, True, end))
        if isinstance(node, Ref):  # not on a cycle: inlined
            return (yield self._emit(self.g.rules[node.name], s, esc, end))
        if isinstance(node, Members):
            if node.any_order:
                return (yield anyorder.lower(self, node, s, esc, end))
            return (yield self._members(node, s, esc, end))
        raise GrammarError(f"internal: unknown IR node {type(node).__name__}")

    def layout(self, indent: bool, s: int, end: int | None) -> int:
        """ir.LAYOUT (or LAYOUT_NO_INDENT) from s: [ \\t]{0,2} | \\r?\\n[ \\t]*, the language of the general
        lowering without its walk of the tree, and with indentation one state fewer (the run loops on the state
        after the newline). States: after one blank a, after a carriage return r, after the newline n (the end
        without indentation). The rows of a, r and n, which no other edge leaves, are written at the freeze
        from (a, e, indent) (`ByteNFA.lay`, cpkernels.layout_rows): a third of a large schema's states are
        these, and their edges as Python ints cost more than the rest of the layout."""
        nfa = self.nfa
        e = nfa.add() if end is None else end
        a = nfa.add_many(3 if indent else 2)  # a, r (and n), numbered as one add() each would be
        r = a + 1
        n = a + 2 if indent else e
        nfa.e += (s, 0x09, 0x09, a, s, 0x20, 0x20, a, s, 0x0D, 0x0D, r, s, 0x0A, 0x0A, n)
        nfa.ep += (s, e)
        if self.rule_log is None:
            nfa.lay += (a, e, indent)
        else:  # a library body being recorded: library.record reads the edges it added from the lists
            layout_rows_into(nfa.e, nfa.ep, a, e, indent)
        return e

    def _members(self, node: Members, s: int, esc: bool, end: int | None):
        """Layers of states, one per item: a state is (count so far, mode). FIRST: nothing yet, a member may
        start. FRESH: a member just ended; the object may end, or one separator follows. AFTER: past that
        separator, so a member must start, this item or (skipping optional ones) a later one. CHAIN: a FRESH
        state carried past skipped items so the object can still end there. A walk, as `_emit` is.

        The separator after a member is lowered once (FRESH -> AFTER), not once per item that may come next:
        the states after a comma then hold one whitespace run and the next keys' first bytes."""
        nfa = self.nfa
        lo, hi = node.min, node.max
        cap = hi if hi is not None else lo
        if end is None:
            end = nfa.add()
        n = len(node.items)
        # A count c after the first k items can still finish only if the items left can bring it to `lo`
        # and the required ones left fit under `hi`; other counts are never built (no dead ends).
        room = [0] * (n + 1)
        need = [0] * (n + 1)
        room[n] = lo if node.extra is not None else 0
        for k in range(n - 1, -1, -1):
            room[k] = room[k + 1] + 1
            need[k] = need[k + 1] + node.items[k][1]

        def viable(c: int, k: int) -> bool:
            return c + room[k] >= lo and (hi is None or c + need[k] <= hi)

        def can_add(c: int) -> bool:
            return hi is None or c < hi

        def bump(c: int) -> int:
            return min(c + 1, cap) if hi is None else c + 1

        follows: dict[int, list[bool]] = {}

        def useful(c: int, k: int) -> bool:
            """After a separator at layer k with count c, a member can still start and the object finish."""
            u = follows.get(c)
            if u is None:
                u = [False] * (n + 1)
                u[n] = node.extra is not None and can_add(c)
                for j in range(n - 1, -1, -1):
                    u[j] = (can_add(c) and viable(bump(c), j + 1)) or (
                        not node.items[j][1] and viable(c, j + 1) and u[j + 1]
                    )
                follows[c] = u
            return u[k]

        if not viable(0, 0):
            nfa.may_dead_end = True
            return end
        FIRST, FRESH, AFTER, CHAIN = 0, 1, 2, 3

        def separator(layer: dict, c: int, q: int):
            """The separator after a member (FRESH state q), into the layer's AFTER state for count c; that
            state, if it is new (a walk)."""
            a = layer.get((c, AFTER))
            if a is not None:
                yield self._emit(node.sep, q, esc, a)
                return None
            a = layer[(c, AFTER)] = yield self._emit(node.sep, q, esc, None)
            return a

        layer: dict[tuple[int, int], int] = {(0, FIRST): s}
        for k in range(n):
            for (c, mode), q in list(layer.items()):
                if mode == FRESH and useful(c, k):
                    yield separator(layer, c, q)
            item, required = node.items[k]
            nxt: dict[tuple[int, int], int] = {}

            def target(key: tuple[int, int], nxt: dict = nxt) -> int:
                if key not in nxt:
                    nxt[key] = nfa.add()
                return nxt[key]

            entries: dict[int, list[int]] = {}
            for (c, mode), q in layer.items():
                if not required and viable(c, k + 1):
                    if mode == FIRST:
                        nfa.ep += (q, target((c, FIRST)))
                    elif mode == AFTER:
                        if useful(c, k + 1):
                            nfa.ep += (q, target((c, AFTER)))
                    elif c >= lo:
                        nfa.ep += (q, target((c, CHAIN)))  # its separator (if any) went to AFTER here
                if mode in (FRESH, CHAIN) or not can_add(c):
                    continue
                nc = bump(c)
                if viable(nc, k + 1):
                    entries.setdefault(nc, []).append(q)
            for nc, srcs in entries.items():
                begin = nfa.add()
                for q in srcs:
                    nfa.ep += (q, begin)
                yield self._emit(item, begin, esc, target((nc, FRESH)))
            layer = nxt
        if node.extra is None:
            for (c, mode), q in layer.items():
                if mode != AFTER and c >= lo:
                    nfa.ep += (q, end)
            return end
        # Extra members: any number, each FRESH state followed by its separator once.
        work = list(layer.items())
        done: set[tuple[int, int]] = set()
        while work:
            key, q = work.pop()
            if key in done:
                continue
            done.add(key)
            c, mode = key
            if mode != AFTER and c >= lo:
                nfa.ep += (q, end)
            if mode == FRESH and useful(c, n):
                a = yield separator(layer, c, q)
                if a is not None:
                    work.append(((c, AFTER), a))
            if mode in (FRESH, CHAIN) or not can_add(c):
                continue
            nkey = (bump(c), FRESH)
            if nkey not in layer:
                layer[nkey] = nfa.add()
                work.append((nkey, layer[nkey]))
            yield self._emit(node.extra, q, esc, layer[nkey])
        return end

    def embed(self, a: CPNFA, s: int, esc: bool, end: int | None) -> int:
        if type(a) is cpauto.WordsComplement and a._rows is None:
            return self.embed_words(a, s, esc, end)
        nfa = self.nfa
        self.budget.spend(sum(map(len, a.edges)))  # lowered to at least as many byte edges
        first = nfa.add_many(a.size)
        m = range(first, first + a.size)
        e = nfa.add() if end is None else end
        nfa.ep += (s, m[a.start])
        univ = a.universal_states
        if univ is None:
            univ = a.universal_states = cpauto.universal(a)
        nfa.universal.update(m[q] for q in univ)
        grouped = _grouped(a)
        for q in range(a.size):
            for t, rs in grouped[q].items():
                self.code_points.lower(rs, m[q], m[t], esc)
            for t in a.eps[q]:
                nfa.ep += (m[q], m[t])
            if q in a.finals:
                nfa.ep += (m[q], e)
        return e

    def embed_words(
        self, a: cpauto.WordsComplement, s: int, esc: bool, end: int | None, kernel: bool = True
    ) -> int:
        """`embed` for "every string but these words", read from its trie without making its code point rows:
        each trie state's byte edges follow from its children's code points (_word_row), into the same states
        in the same order as `embed` lowers the rows (the NFA is the same, state for state). Keys whose
        characters are all written as themselves (most keys) go through cpkernels.word_rows, which writes the
        same rows; `kernel=False` keeps to the loop below, the reference."""
        written = None
        if kernel and esc:
            edges, eps, units = cpkernels.word_rows(a.parent, a.code, a.word_end)
            if units >= 0:
                written = edges, eps
        if written is None:
            rows = [(kids, _word_row(tuple(sorted(kids)), esc)) for kids in a.children]
            units = sum(r[1][0] for r in rows)
        nfa = self.nfa
        self.budget.spend(units + len(ANY_RANGES))
        first = nfa.add_many(a.size)
        sink = first + a.sink
        e = nfa.add() if end is None else end
        nfa.ep += (s, first)
        nfa.universal.update(range(first, sink + 1))
        cpe = self.code_points
        if written is not None:
            self._place_word_rows(*written, first, sink, e)
        else:
            edges, ep, ends = nfa.e, nfa.ep, a.ends
            # The states the sink's escapes and multi-byte forms start in, by the plan's tuple (the same object
            # for every trie state with those gaps): looked up by content once.
            into_sink: dict[tuple[int, int], int] = {}
            mq = first
            for q, (kids, (_, items)) in enumerate(rows):
                for kind, x, y, c in items:
                    if kind == 0:
                        edges += (mq, x, y, sink if c < 0 else first + kids[c])
                        continue
                    make = cpe.escapes if kind == 1 else cpe.high_state
                    if c < 0:
                        u = into_sink.get((kind, id(x)))
                        if u is None:
                            u = into_sink[(kind, id(x))] = make(x, sink)
                    else:
                        u = make(x, first + kids[c])
                    if kind == 1:
                        edges += (mq, 0x5C, 0x5C, u)
                    else:
                        ep += (mq, u)
                if q not in ends:
                    ep += (mq, e)
                mq += 1
        cpe.lower(ANY_RANGES, sink, sink, esc)
        nfa.ep += (sink, e)
        return e

    def _place_word_rows(self, edges: np.ndarray, eps: np.ndarray, first: int, sink: int, e: int) -> None:
        """The rows cpkernels.word_rows wrote, numbered in the NFA: the sink's escapes and multi-byte forms made
        here, in the order the loop makes them at its first trie state (a state without children has the
        sink's sets: every key character has a set of its own)."""
        escapes, high = self.code_points.into_fresh(*_SINK_SETS, sink)
        cpkernels.place_word_rows(edges, eps, first, sink, escapes, high, e)
        if self.rule_log is None:
            self.nfa.e_chunks.append(edges)
            self.nfa.ep_chunks.append(eps)
        else:  # a library body being recorded: library.record reads the edges it added from the lists
            self.nfa.e += edges.tolist()
            self.nfa.ep += eps.tolist()

    def embed_counted(self, a: CPNFA, limit: int, s: int, esc: bool, end: int | None) -> int:
        """The strings of `a` of at most `limit` code points, with one counter frame instead of a copy of `a`
        per length. Each character is guarded: it is taken only if the state it leads to can still reach a
        final state within the characters left (v + 1 + dist <= limit), so no path is a dead end and the
        language is exact. (A lower bound could not be exact this way: the lengths a state can still
        reach need not form an interval, so `minLength` keeps the unrolled `cpauto.count`.)"""
        nfa = self.nfa
        dist = cpauto.dist_to_final(a)
        e = nfa.add() if end is None else end
        if dist[a.start] is None or dist[a.start] > limit:
            nfa.may_dead_end = True
            return e
        lid = len(nfa.loops)
        nfa.loops.append((0, limit))
        # Guards are bounded below `limit`; counter values are clamped (Automaton.clamped) only far enough
        # from the lowest of those bounds.
        nfa.loop_slack[lid] = max(d for d in dist if d is not None)
        guard_lids: dict[int, int] = {}
        grouped = _grouped(a)
        # Pattern states alive on any safe text (univ), or on any up to a length (budgets): the starts of their
        # guarded characters get a safe-text budget (Automaton._safe_budget). With the budget at least 1 every
        # guard of the state has passed (v <= max - slack - 1 < max - dist), so all its characters are there.
        univ, budgets = cpauto.safe_states(a)
        first = nfa.add_many(a.size)
        head = range(first, first + a.size)
        p = nfa.add()
        nfa.ep += (s, p)
        nfa.cpush[p] = (head[a.start], lid)
        for q in range(a.size):
            if dist[q] is None:
                continue
            for t in a.eps[q]:
                if dist[t] is not None:
                    nfa.ep += (head[q], head[t])
            if q in a.finals:
                x = nfa.add()
                nfa.ep += (head[q], x)
                nfa.cexit[x] = (e, lid)
            for t, rs in grouped[q].items():
                if dist[t] is None or dist[t] + 1 > limit:
                    continue
                bound = limit - dist[t]  # the character is allowed while the count v < bound
                glid = guard_lids.get(bound)
                if glid is None:
                    glid = guard_lids[bound] = len(nfa.loops)
                    nfa.loops.append((0, bound))
                g, b, ci = nfa.add(), nfa.add(), nfa.add()
                nfa.ep += (head[q], g)
                nfa.cguard[g] = (b, glid)
                if q in univ:
                    nfa.counted_body[b] = lid
                elif q in budgets:
                    nfa.counted_body[b] = lid
                    nfa.counted_budget[b] = budgets[q]
                self.code_points.lower(rs, b, ci, esc)
                nfa.cinc[ci] = (head[t], lid)
        return e


def build_nfa(g: Grammar) -> ByteNFA:
    with compile_budget() as b:
        stage, b.stage = b.stage, "building the byte automaton"
        try:
            return _build_nfa(g)
        finally:
            b.stage = stage


def _build_nfa(g: Grammar) -> ByteNFA:
    with_nothing: set[str] = set()
    graph = rule_refs(g, with_nothing)  # (one walk of each rule for its references: the analyses read it)
    ok = productive(g, graph[0], with_nothing)
    partial = not all(ok.values())
    if partial and ok.get(g.start, False):
        g = prune_unproductive(g, ok, graph[0], with_nothing)
        graph = None  # another grammar: the builder walks it afresh
    builder = _Builder(g, graph)
    if partial and not ok.get(g.start, False):
        # Nothing to keep: the automaton's checks say why (left recursion, or no string at all).
        builder.nfa.may_dead_end = True
    nfa = builder.build()
    nfa.indent_limit = g.indent_limit
    return nfa
