"""Lowering of the grammar IR to one byte-level NFA with pushdown calls for recursive rules.

Rules not on a reference cycle are inlined; a reference to a rule on a cycle becomes a call edge.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from itertools import chain

import numpy as np

from . import cpauto
from .budget import compile_budget, current
from .cpauto import CPNFA
from .errors import GrammarError
from .ir import (
    EMPTY,
    LAYOUT,
    LAYOUT_NO_INDENT,
    NOTHING,
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

MAX_STATES = 300_000
COUNTER_THRESHOLD = 12
INLINE_LIMIT = 400
# States are reported to the compile budget (budget.py) in blocks of this many, 4 units each: a state's two
# rows and its edges.
CHARGE_BLOCK = 64

# json.dumps escapes for the code points that cannot appear raw inside a JSON string.
_SHORT_ESC = {0x22: b'\\"', 0x5C: b"\\\\", 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t", 0x08: b"\\b", 0x0C: b"\\f"}


def json_escape_bytes(cp: int) -> bytes | None:
    if cp in _SHORT_ESC:
        return _SHORT_ESC[cp]
    if cp < 0x20:
        return b"\\u%04x" % cp
    return None


@functools.lru_cache(maxsize=4096)
def utf8_sequences(lo: int, hi: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Split the code point range [lo, hi] into sequences of byte ranges (one per UTF-8 shape)."""
    out: list[list[tuple[int, int]]] = []
    _split(lo, hi, out)
    return tuple(tuple(x) for x in out)


def _split(lo: int, hi: int, out: list) -> None:
    if lo > hi:
        return
    for mx in (0x7F, 0x7FF, 0xFFFF):
        if lo <= mx < hi:
            _split(lo, mx, out)
            _split(mx + 1, hi, out)
            return
    if hi <= 0x7F:
        out.append([(lo, hi)])
        return
    for i in range(1, 4):
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m != 0:
                _split(lo, lo | m, out)
                _split((lo | m) + 1, hi, out)
                return
            if hi & m != m:
                _split(lo, (hi & ~m) - 1, out)
                _split(hi & ~m, hi, out)
                return
    a = chr(lo).encode("utf-8", "surrogatepass")
    b = chr(hi).encode("utf-8", "surrogatepass")
    out.append(list(zip(a, b, strict=True)))


def _plan(ranges, esc: bool) -> tuple[tuple, tuple, tuple]:
    """How a code point set lowers: plain ASCII byte ranges, the code points written as escapes (when `esc`:
    controls, quote, backslash), and the multi-byte part."""
    plain: list[tuple[int, int]] = []
    specials: list[int] = []
    for lo, hi in ranges:
        if lo >= 0x80:
            continue
        hi = min(hi, 0x7F)
        if esc:
            if lo < 0x20:
                specials.extend(range(lo, min(hi, 0x1F) + 1))
                lo = 0x20
            for c in (0x22, 0x5C):
                if lo <= c <= hi:
                    specials.append(c)
                    if lo < c:
                        plain.append((lo, c - 1))
                    lo = c + 1
        if lo <= hi:
            plain.append((lo, hi))
    high = tuple((max(a, 0x80), b) for a, b in ranges if b >= 0x80)
    return tuple(plain), tuple(sorted(specials)), high


class FlatRows(dict):
    """A list of rows kept flat once it is final: offsets plus one numpy array (`off`, `data`). Row q is made
    into a tuple when first read and kept, so reading a row again is a plain dict lookup. Read-only.

    A large grammar's NFA has tens of thousands of states, each with a list of edges and a list of epsilon
    edges. As Python lists and tuples they are objects the cyclic GC must traverse: the first collection
    after a compile took 10-30 ms, and every later full collection paid again. Flat, only the rows that
    Python-side state building reads become objects; the numba walk reads the arrays themselves."""

    __slots__ = ("off", "data", "_off")

    def __init__(self, rows: list[list], width: int) -> None:
        super().__init__()
        n = len(rows)
        self.off = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(np.fromiter(map(len, rows), dtype=np.int32, count=n), out=self.off[1:])
        m = int(self.off[-1])
        items = chain.from_iterable(chain.from_iterable(rows)) if width > 1 else chain.from_iterable(rows)
        data = np.fromiter(items, dtype=np.int32, count=width * m)
        self.data = data.reshape(m, width) if width > 1 else data
        self._off = self.off.tolist()

    def __missing__(self, q: int) -> tuple:
        if not 0 <= q < len(self._off) - 1:
            raise IndexError(q)
        part = self.data[self._off[q]:self._off[q + 1]].tolist()
        r = tuple(map(tuple, part)) if self.data.ndim == 2 else tuple(part)
        dict.__setitem__(self, q, r)
        return r

    def __setitem__(self, q, row) -> None:
        raise TypeError("FlatRows is read-only")

    def __len__(self) -> int:
        return len(self._off) - 1

    def __iter__(self):
        return (self[q] for q in range(len(self)))


class ByteNFA:
    """Byte-range edges, epsilon edges and call edges; rule r spans rule_start[r] .. rule_end[r]."""

    def __init__(self) -> None:
        # Lists while the NFA is built; FlatRows once it is final (freeze_rows).
        self.edges: list[list[tuple[int, int, int]]] | FlatRows = []
        self.eps: list[list[int]] | FlatRows = []
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
        self.loop_slack: dict[int, int] = {}  # loop id -> how far below its max its guards' bounds may lie
        self.loop_step: dict[int, int] = {}  # loop id -> at least this many bytes per pass of its body (else 1)
        # States from which any string-safe text (ir.SAFE_RANGES) can be read by byte and plain epsilon edges
        # and still finish: a free string body, "any key but these", `.*`. Masks from them take every
        # string-safe token without a walk (see Automaton.local_info). A subset: it need not name them all.
        self.universal: set[int] = set()
        # Body start of a counted loop over one character class covering every string-safe character -> its
        # loop id: with the counter at v, any string-safe text of up to max - v characters stays alive.
        self.counted_body: dict[int, int] = {}

    def add(self) -> int:
        n = len(self.edges)
        if n >= MAX_STATES:
            raise GrammarError(f"grammar too large: more than {MAX_STATES} automaton states")
        if n % CHARGE_BLOCK == CHARGE_BLOCK - 1:
            current().spend(4 * CHARGE_BLOCK)
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1

    @property
    def size(self) -> int:
        return len(self.edges)

    def freeze_rows(self) -> None:
        """Edges and epsilon edges become flat and read-only (FlatRows): call once the NFA is final."""
        if not isinstance(self.edges, FlatRows):
            self.edges = FlatRows(self.edges, 3)
            self.eps = FlatRows(self.eps, 1)


def _rule_refs(g: Grammar) -> tuple[dict[str, set[str]], dict[str, int]]:
    """The rules each rule refers to, and how often each rule is referred to in all (one walk per rule)."""
    refs: dict[str, set[str]] = {}
    counts: dict[str, int] = {}
    for name, node in g.rules.items():
        acc: set[str] = set()
        for ref in _iter_refs(node):
            acc.add(ref)
            counts[ref] = counts.get(ref, 0) + 1
        missing = {x for x in acc if x not in g.rules}
        if missing:
            raise GrammarError(f"rule {name!r} references undefined rule(s): {', '.join(sorted(missing))}")
        refs[name] = acc
    return refs, counts


def _cyclic_rules(g: Grammar, refs: dict[str, set[str]]) -> set[str]:
    # Tarjan's SCC, iterative to survive deep grammars.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    cyclic: set[str] = set()
    counter = 0
    for root in g.rules:
        if root in index:
            continue
        work = [(root, iter(sorted(refs[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(refs[w]))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in refs[v]:
                    cyclic.update(comp)
    return cyclic


def _iter_refs(node: Node):
    """Names of the rule references under `node`, once per occurrence (a shared subtree once per parent)."""
    b = current()
    stack = [node]
    seen = 0
    while stack:
        n = stack.pop()
        seen += 1
        if not seen & 255:
            b.tick(256)  # a tree of shared subtrees can be far larger than the grammar that holds it
        if isinstance(n, Ref):
            yield n.name
        elif isinstance(n, (Seq, Alt)):
            stack.extend(n.items)
        elif isinstance(n, (Repeat, Escaped)):
            stack.append(n.item)
        elif isinstance(n, Members):
            stack.extend(x for x, _ in n.items)
            stack.append(n.sep)
            if n.extra is not None:
                stack.append(n.extra)


def productive(g: Grammar) -> dict[str, bool]:
    """Which rules derive at least one string (least fixed point).

    Each round evaluates only the rules that refer to one found productive in the round before (the first
    round: every rule, in order). Sweeping every rule until nothing changed took one sweep per link of a rule
    chain whose rules come in the order they refer to each other: 10,000 rules cost 10,000 sweeps."""
    b = current()
    ok: dict[str, bool] = {name: False for name in g.rules}
    order = {name: i for i, name in enumerate(g.rules)}
    referrers: dict[str, list[str]] = {}
    for name, node in g.rules.items():
        b.where = f"rule {name!r}"
        for ref in set(_iter_refs(node)):
            referrers.setdefault(ref, []).append(name)

    def prod(node: Node, depth: int = 0) -> bool:
        b.tick()
        if depth > 500:
            return False
        if isinstance(node, (Chars, Auto)):
            return True
        if isinstance(node, Seq):
            return all(prod(x, depth + 1) for x in node.items)
        if isinstance(node, Alt):
            return any(prod(x, depth + 1) for x in node.items)
        if isinstance(node, Repeat):
            return node.min == 0 or prod(node.item, depth + 1)
        if isinstance(node, Escaped):
            return prod(node.item, depth + 1)
        if isinstance(node, Ref):
            return ok.get(node.name, False)  # an undefined rule is reported when the automaton is built
        if isinstance(node, Members):
            return all(prod(x, depth + 1) for x, req in node.items if req)
        return False

    todo = list(g.rules)
    while todo:
        found = []
        for name in todo:
            if not ok[name]:
                b.where = f"rule {name!r}"
                if prod(g.rules[name]):
                    ok[name] = True
                    found.append(name)
        again = {y for x in found for y in referrers.get(x, ()) if not ok[y]}
        todo = sorted(again, key=order.__getitem__)
    prod = None  # it refers to itself: without this the cycle keeps the grammar for the collector to find
    b.where = ""
    return ok


def _prune(g: Grammar, ok: dict[str, bool]) -> Grammar:
    """The same language without the rules that derive nothing: references to them become the empty
    language, which removes the sequences holding them and the alternatives they are. Every path left in
    the automaton can then finish, so it needs no trimming pass."""
    memo: dict[int, Node] = {}
    current_rule = [""]
    b = current()

    def p(node: Node) -> Node:
        key = id(node)
        hit = memo.get(key)
        if hit is not None:
            return hit
        b.spend(1)  # the memo entry, and perhaps a new node
        r: Node = node
        if isinstance(node, Ref):
            if node.name not in ok:
                raise GrammarError(f"rule {current_rule[0]!r} references undefined rule(s): {node.name}")
            r = node if ok[node.name] else NOTHING
        elif isinstance(node, Seq):
            items = [p(x) for x in node.items]
            if any(x is NOTHING for x in items):
                r = NOTHING
            elif any(x is not y for x, y in zip(items, node.items, strict=True)):
                r = Seq(tuple(items))
        elif isinstance(node, Alt):
            items = [x for x in (p(y) for y in node.items) if x is not NOTHING]
            if not items:
                r = NOTHING
            elif len(items) != len(node.items) or any(x is not y for x, y in zip(items, node.items, strict=True)):
                r = items[0] if len(items) == 1 else Alt(tuple(items))
        elif isinstance(node, Repeat):
            it = p(node.item)
            if it is NOTHING:
                r = EMPTY if node.min == 0 else NOTHING
            elif it is not node.item:
                r = Repeat(it, node.min, node.max)
        elif isinstance(node, Escaped):
            it = p(node.item)
            r = NOTHING if it is NOTHING else node if it is node.item else Escaped(it)
        elif isinstance(node, Members):
            items = []
            for x, req in node.items:
                px = p(x)
                if px is NOTHING:
                    if req:
                        r = NOTHING
                        break
                    continue
                items.append((px, req))
            else:
                extra = None if node.extra is None else p(node.extra)
                sep = p(node.sep)
                if extra is NOTHING:
                    extra = None
                # A separator that derives nothing is not something a front end builds: left as it is.
                if sep is not NOTHING:
                    r = Members(tuple(items), extra, sep, node.min, node.max)
        memo[key] = r
        return r

    # Every rule is walked, the dropped ones too, so an undefined reference anywhere is still an error.
    rules = {}
    for name, node in g.rules.items():
        current_rule[0] = name
        b.where = f"rule {name!r}"
        pruned = p(node)
        if ok[name]:
            rules[name] = pruned
    p = None  # it refers to itself: drop the cycle (it holds the memo of every node) now
    return dataclasses.replace(g, rules=rules)


def _one_safe_char(node: Node) -> bool:
    """Whether `node` reads any one string-safe character by itself, with a class lowered as byte edges from
    where the node starts (a Chars covering ir.SAFE_RANGES, alone or as an alternative)."""
    while isinstance(node, Escaped):
        node = node.item
    if isinstance(node, Alt):
        return any(isinstance(x, Chars) and covers_safe(x.ranges) for x in node.items)
    return isinstance(node, Chars) and covers_safe(node.ranges)


def _by_target(row: list) -> dict[int, tuple]:
    """A code point automaton state's edges as one range set per target state: each set is lowered once, so a
    complement state's many ranges into its sink share their UTF-8 states."""
    out: dict[int, list] = {}
    for lo, hi, t in row:
        rs = out.setdefault(t, [])
        if isinstance(lo, tuple):
            rs.extend(lo)
        else:
            rs.append((lo, hi))
    return {t: norm(rs) if len(rs) > 1 else tuple(rs) for t, rs in out.items()}


class _Builder:
    def __init__(self, g: Grammar) -> None:
        self.g = g
        self.nfa = ByteNFA()
        self.budget = current()
        refs, counts = _rule_refs(g)
        self.cyclic = _cyclic_rules(g, refs) | {name for name in g.shared if name in g.rules}
        self.est_memo: dict[int, int] = {}
        self.null_memo: dict[int, bool] = {}
        self.min_memo: dict[int, int] = {}
        # A big rule referenced from several places is called (shared) rather than copied at each use.
        # (Sizes are estimated as the calls stood when each was measured; `build` measures afresh.)
        for name, n in counts.items():
            self.budget.where = f"rule {name!r}"
            if name not in self.cyclic and n > 1 and self.estimate(g.rules[name]) > INLINE_LIMIT:
                self.cyclic.add(name)
        self.rule_index: dict[str, int] = {}
        self.tails: dict[tuple[int, int], int] = {}
        self.plans: dict[tuple, tuple] = {}
        self.high_cache: dict[tuple, int] = {}
        self.esc_cache: dict[tuple, int] = {}

    def estimate(self, node: Node, depth: int = 0) -> int:
        key = id(node)
        if key in self.est_memo:
            return self.est_memo[key]
        self.budget.spend(1)  # the memo entry
        if depth > 200:
            raise GrammarError("grammar nesting too deep")
        if isinstance(node, Chars):
            v = 2 * len(node.ranges) + 2
        elif isinstance(node, (Seq, Alt)):
            v = 2 + sum(self.estimate(x, depth + 1) for x in node.items)
        elif isinstance(node, Repeat):
            if self.counted(node):
                v = 6 + self.estimate(node.item, depth + 1)
            else:
                v = 2 + self.estimate(node.item, depth + 1) * max(1, node.max if node.max is not None
                                                                  else node.min + 1)
        elif isinstance(node, Escaped):
            v = self.estimate(node.item, depth + 1) * 2
        elif isinstance(node, Ref):
            v = 2 if node.name in self.cyclic else self.estimate(self.g.rules[node.name], depth + 1)
        elif isinstance(node, Auto):
            v = node.auto.size * 3
        elif isinstance(node, Members):
            copies = max(node.min, node.max or 0) + 1
            v = copies * (sum(self.estimate(x, depth + 1) for x, _ in node.items) + self.estimate(node.sep)
                          + (self.estimate(node.extra, depth + 1) if node.extra is not None else 0)) + 4
        else:
            v = 1
        v = min(v, 10 * MAX_STATES)
        self.est_memo[key] = v
        return v

    def counted(self, node: Repeat) -> bool:
        big = (node.max if node.max is not None else node.min) > COUNTER_THRESHOLD
        return big and not self.nullable(node.item)

    def min_bytes(self, node: Node, depth: int = 0) -> int:
        """A lower bound on the length in bytes of the strings of `node` (0 where a cycle or deep nesting
        makes it unsure)."""
        key = id(node)
        hit = self.min_memo.get(key)
        if hit is not None:
            return hit
        if depth > 200:
            return 0
        self.min_memo[key] = 0  # inside a cycle: 0 is always a lower bound
        if isinstance(node, Chars):
            v = 1
        elif isinstance(node, Seq):
            v = sum(self.min_bytes(x, depth + 1) for x in node.items)
        elif isinstance(node, Alt):
            v = min((self.min_bytes(x, depth + 1) for x in node.items), default=0)
        elif isinstance(node, Repeat):
            v = node.min * self.min_bytes(node.item, depth + 1)
        elif isinstance(node, Escaped):
            v = self.min_bytes(node.item, depth + 1)
        elif isinstance(node, Ref):
            v = self.min_bytes(self.g.rules[node.name], depth + 1)
        elif isinstance(node, Members):
            v = sum(self.min_bytes(x, depth + 1) for x, required in node.items if required)
        else:
            v = 0
        self.min_memo[key] = v
        return v

    def nullable(self, node: Node, depth: int = 0) -> bool:
        key = id(node)
        hit = self.null_memo.get(key)
        if hit is not None:
            return hit
        if depth > 200:
            return True
        self.null_memo[key] = True  # a cycle is conservatively nullable
        if isinstance(node, Chars):
            v = False
        elif isinstance(node, Seq):
            v = all(self.nullable(x, depth + 1) for x in node.items)
        elif isinstance(node, Alt):
            v = any(self.nullable(x, depth + 1) for x in node.items)
        elif isinstance(node, Repeat):
            v = node.min == 0 or self.nullable(node.item, depth + 1)
        elif isinstance(node, Escaped):
            v = self.nullable(node.item, depth + 1)
        elif isinstance(node, Ref):
            v = self.nullable(self.g.rules[node.name], depth + 1)
        elif isinstance(node, Members):
            v = node.min == 0
        else:
            v = True
        self.null_memo[key] = v
        return v

    def rule(self, name: str) -> int:
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
        self.budget.where = f"rule {self.g.start!r}"
        est = self.estimate(self.g.rules[self.g.start])
        if est > MAX_STATES:
            raise GrammarError(f"grammar too large (about {est} automaton states, limit {MAX_STATES}); "
                               "reduce repeat counts or nesting")
        self.pending: list[tuple[str, int, int]] = []
        self.rule(self.g.start)
        while self.pending:
            name, s, e = self.pending.pop()
            self.budget.where = f"rule {name!r}"
            end = self.emit(self.g.rules[name], s, False)
            self.nfa.eps[end].append(e)
        return self.nfa

    def emit(self, node: Node, s: int, esc: bool, end: int | None = None) -> int:
        """Lower `node` starting at state `s`; return the state reached after it. With `end`, the node finishes
        in that state (the caller's join or loop head), so no extra state and epsilon edge are needed there.

        Invariant: no edge ever enters `s` from inside the node, so alternatives can all start at `s`."""
        nfa = self.nfa
        if isinstance(node, Chars):
            e = nfa.add() if end is None else end
            self.lower(node.ranges, s, e, esc)
            return e
        if isinstance(node, Seq):
            items = node.items
            if not items:
                if end is None:
                    return s
                nfa.eps[s].append(end)
                return end
            last = len(items) - 1
            edges = nfa.edges
            for k, it in enumerate(items):
                if type(it) is Chars and len(it.ranges) == 1:
                    # A single plain ASCII character (most of a literal key): one byte edge, no call.
                    a, b = it.ranges[0]
                    if a == b and 0x20 <= a < 0x80 and not (esc and (a == 0x22 or a == 0x5C)):
                        t = end if k == last and end is not None else nfa.add()
                        edges[s].append((a, a, t))
                        s = t
                        continue
                s = self.emit(it, s, esc, end if k == last else None)
            return s
        if isinstance(node, Alt):
            if (node is LAYOUT or node is LAYOUT_NO_INDENT) and not esc:
                return self.layout(node is LAYOUT, s, end)
            if not node.items:
                nfa.may_dead_end = True
                return nfa.add() if end is None else end  # nothing reaches it: the empty language
            e = nfa.add() if end is None else end
            for it in node.items:
                self.emit(it, s, esc, e)
            return e
        if isinstance(node, Repeat) and self.counted(node):
            lid = len(nfa.loops)
            nfa.loops.append((node.min, node.max))
            nfa.loop_step[lid] = max(1, self.min_bytes(node.item))
            p, h, x, ci = nfa.add(), nfa.add(), nfa.add(), nfa.add()
            e = nfa.add() if end is None else end
            nfa.eps[s].append(p)
            nfa.cpush[p] = (h, lid)
            nfa.eps[h].append(x)
            nfa.cexit[x] = (e, lid)
            g, b = nfa.add(), nfa.add()
            nfa.eps[h].append(g)
            nfa.cguard[g] = (b, lid)
            self.emit(node.item, b, esc, ci)
            nfa.cinc[ci] = (h, lid)
            if _one_safe_char(node.item):
                nfa.counted_body[b] = lid
            return e
        if isinstance(node, Repeat):
            if self.estimate(node) > MAX_STATES:
                raise GrammarError(f"repeat {{{node.min},{node.max}}} makes the grammar too large")
            if node.max is None:
                for _ in range(node.min):
                    s = self.emit(node.item, s, esc)
                # A fresh loop head: the body returns to it, and it is where the repeat may stop.
                loop = nfa.add()
                nfa.eps[s].append(loop)
                self.emit(node.item, loop, esc, loop)
                if end is None:
                    return loop
                nfa.eps[loop].append(end)
                return end
            if node.max == 0:
                return self.emit(EMPTY, s, esc, end)
            e = nfa.add() if end is None else end
            for k in range(node.max):
                if k >= node.min:
                    nfa.eps[s].append(e)
                s = self.emit(node.item, s, esc, e if k == node.max - 1 else None)
            return e
        if isinstance(node, Escaped):
            return self.emit(node.item, s, True, end)
        if isinstance(node, Ref):
            if node.name in self.cyclic:
                r = self.rule(node.name)
                ret = nfa.add() if end is None else end
                c = nfa.add()
                nfa.eps[s].append(c)
                nfa.call[c] = (r, ret)
                return ret
            return self.emit(self.g.rules[node.name], s, esc, end)
        if isinstance(node, Auto):
            if node.limit is not None:
                return self.embed_counted(node.auto, node.limit, s, esc or node.escape, end)
            return self.embed(node.auto, s, esc or node.escape, end)
        if isinstance(node, Members):
            return self.members(node, s, esc, end)
        raise GrammarError(f"internal: unknown IR node {type(node).__name__}")

    def layout(self, indent: bool, s: int, end: int | None) -> int:
        """ir.LAYOUT (or LAYOUT_NO_INDENT) from s: [ \\t]{0,2} | \\r?\\n[ \\t]*, the language of the general
        lowering without its walk of the tree, and with indentation one state fewer (the run loops on the state
        after the newline). States: after one blank a, after a carriage return r, after the newline n (the end
        without indentation)."""
        nfa = self.nfa
        e = nfa.add() if end is None else end
        a, r = nfa.add(), nfa.add()
        n = nfa.add() if indent else e
        edges, eps = nfa.edges, nfa.eps
        edges[s].extend(((0x09, 0x09, a), (0x20, 0x20, a), (0x0D, 0x0D, r), (0x0A, 0x0A, n)))
        edges[a].extend(((0x09, 0x09, e), (0x20, 0x20, e)))
        edges[r].append((0x0A, 0x0A, n))
        if indent:
            edges[n].extend(((0x09, 0x09, n), (0x20, 0x20, n)))
            eps[n].append(e)
        eps[s].append(e)
        eps[a].append(e)
        return e

    def members(self, node: Members, s: int, esc: bool, end: int | None) -> int:
        """Layers of states, one per item: a state is (count so far, mode). FIRST: nothing yet, a member may
        start. FRESH: a member just ended; the object may end, or one separator follows. AFTER: past that
        separator, so a member must start, this item or (skipping optional ones) a later one. CHAIN: a FRESH
        state carried past skipped items so the object can still end there.

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
                        not node.items[j][1] and viable(c, j + 1) and u[j + 1])
                follows[c] = u
            return u[k]

        if not viable(0, 0):
            nfa.may_dead_end = True
            return end
        FIRST, FRESH, AFTER, CHAIN = 0, 1, 2, 3

        def separator(layer: dict, c: int, q: int) -> int | None:
            """The separator after a member (FRESH state q), into the layer's AFTER state for count c; that
            state, if it is new."""
            a = layer.get((c, AFTER))
            if a is not None:
                self.emit(node.sep, q, esc, a)
                return None
            a = layer[(c, AFTER)] = self.emit(node.sep, q, esc)
            return a

        layer: dict[tuple[int, int], int] = {(0, FIRST): s}
        for k in range(n):
            for (c, mode), q in list(layer.items()):
                if mode == FRESH and useful(c, k):
                    separator(layer, c, q)
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
                        nfa.eps[q].append(target((c, FIRST)))
                    elif mode == AFTER:
                        if useful(c, k + 1):
                            nfa.eps[q].append(target((c, AFTER)))
                    elif c >= lo:
                        nfa.eps[q].append(target((c, CHAIN)))  # its separator (if any) went to AFTER here
                if mode in (FRESH, CHAIN) or not can_add(c):
                    continue
                nc = bump(c)
                if viable(nc, k + 1):
                    entries.setdefault(nc, []).append(q)
            for nc, srcs in entries.items():
                begin = nfa.add()
                for q in srcs:
                    nfa.eps[q].append(begin)
                self.emit(item, begin, esc, target((nc, FRESH)))
            layer = nxt
        if node.extra is None:
            for (c, mode), q in layer.items():
                if mode != AFTER and c >= lo:
                    nfa.eps[q].append(end)
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
                nfa.eps[q].append(end)
            if mode == FRESH and useful(c, n):
                a = separator(layer, c, q)
                if a is not None:
                    work.append(((c, AFTER), a))
            if mode in (FRESH, CHAIN) or not can_add(c):
                continue
            nkey = (bump(c), FRESH)
            if nkey not in layer:
                layer[nkey] = nfa.add()
                work.append((nkey, layer[nkey]))
            self.emit(node.extra, q, esc, layer[nkey])
        return end

    def embed(self, a: CPNFA, s: int, esc: bool, end: int | None) -> int:
        nfa = self.nfa
        self.budget.spend(sum(map(len, a.edges)))  # lowered to at least as many byte edges
        m = [nfa.add() for _ in range(a.size)]
        e = nfa.add() if end is None else end
        nfa.eps[s].append(m[a.start])
        univ = a.universal_states
        if univ is None:
            univ = a.universal_states = cpauto.universal(a)
        nfa.universal.update(m[q] for q in univ)
        for q in range(a.size):
            for t, rs in _by_target(a.edges[q]).items():
                self.lower(rs, m[q], m[t], esc)
            for t in a.eps[q]:
                nfa.eps[m[q]].append(m[t])
            if q in a.finals:
                nfa.eps[m[q]].append(e)
        return e

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
        # Guards are bounded below `limit`; counter values are clamped (Automaton.canonical) only far enough
        # from the lowest of those bounds.
        nfa.loop_slack[lid] = max(d for d in dist if d is not None)
        guard_lids: dict[int, int] = {}
        head = [nfa.add() for _ in range(a.size)]
        p = nfa.add()
        nfa.eps[s].append(p)
        nfa.cpush[p] = (head[a.start], lid)
        for q in range(a.size):
            if dist[q] is None:
                continue
            for t in a.eps[q]:
                if dist[t] is not None:
                    nfa.eps[head[q]].append(head[t])
            if q in a.finals:
                x = nfa.add()
                nfa.eps[head[q]].append(x)
                nfa.cexit[x] = (e, lid)
            for t, rs in _by_target(a.edges[q]).items():
                if dist[t] is None or dist[t] + 1 > limit:
                    continue
                bound = limit - dist[t]  # the character is allowed while the count v < bound
                glid = guard_lids.get(bound)
                if glid is None:
                    glid = guard_lids[bound] = len(nfa.loops)
                    nfa.loops.append((0, bound))
                g, b, ci = nfa.add(), nfa.add(), nfa.add()
                nfa.eps[head[q]].append(g)
                nfa.cguard[g] = (b, glid)
                self.lower(rs, b, ci, esc)
                nfa.cinc[ci] = (head[t], lid)
        return e

    def lower(self, ranges, s: int, e: int, esc: bool) -> None:
        """Byte edges from `s` to `e` for one code point of `ranges` (JSON-escaped when `esc`)."""
        plan = self.plans.get((ranges, esc))
        if plan is None:
            plan = self.plans[(ranges, esc)] = _plan(ranges, esc) + (covers_safe(ranges),)
        plain, specials, high, safe = plan
        nfa = self.nfa
        if safe and s == e:
            nfa.universal.add(s)  # a loop on every string-safe character
        row = nfa.edges[s]
        for a, b in plain:
            row.append((a, b, e))
        if specials:
            row.append((0x5C, 0x5C, self.escapes(specials, e)))
        if high:
            # Multi-byte UTF-8 into the same target is lowered once and shared (the states of a complement
            # automaton, "any key but these", all share one lowering into their sink).
            hk = (high, e)
            y = self.high_cache.get(hk)
            if y is None:
                y = self.high_cache[hk] = nfa.add()
                for lo, hi in high:
                    self.lower_raw(lo, hi, y, e)
            nfa.eps[s].append(y)

    def escapes(self, specials: tuple[int, ...], e: int) -> int:
        """The state after a backslash from which the escapes of `specials` lead to `e` (shared per target)."""
        nfa = self.nfa
        bkey = (specials, e)
        bs = self.esc_cache.get(bkey)
        if bs is not None:
            return bs
        bs = self.esc_cache[bkey] = nfa.add()
        uhex: dict[int, list[int]] = {}
        for c in specials:
            code = json_escape_bytes(c)
            if len(code) == 2:
                nfa.edges[bs].append((code[1], code[1], e))
            else:
                uhex.setdefault(code[4], []).append(code[5])
        if uhex:
            u = nfa.add()
            z1 = nfa.add()
            z2 = nfa.add()
            nfa.edges[bs].append((0x75, 0x75, u))
            nfa.edges[u].append((0x30, 0x30, z1))
            nfa.edges[z1].append((0x30, 0x30, z2))
            for d1, lasts in uhex.items():
                x = nfa.add()
                nfa.edges[z2].append((d1, d1, x))
                for d2 in lasts:
                    nfa.edges[x].append((d2, d2, e))
        return bs

    def lower_raw(self, lo: int, hi: int, s: int, e: int) -> None:
        nfa = self.nfa
        for sq in utf8_sequences(lo, hi):
            n = len(sq)
            # Trailing full continuation-byte ranges end in shared per-target tail states.
            k_full = n
            while k_full > 1 and sq[k_full - 1] == (0x80, 0xBF):
                k_full -= 1
            cur = s
            for k in range(k_full):
                a, b = sq[k]
                if k == n - 1:
                    nxt = e
                elif k == k_full - 1:
                    nxt = self.tail(e, n - 1 - k)
                else:
                    nxt = nfa.add()
                nfa.edges[cur].append((a, b, nxt))
                cur = nxt

    def tail(self, e: int, depth: int) -> int:
        key = (e, depth)
        t = self.tails.get(key)
        if t is None:
            t = self.nfa.add()
            nxt = e if depth == 1 else self.tail(e, depth - 1)
            self.nfa.edges[t].append((0x80, 0xBF, nxt))
            self.tails[key] = t
        return t

    def path(self, data: bytes, s: int, e: int) -> None:
        cur = s
        for k, byte in enumerate(data):
            nxt = e if k == len(data) - 1 else self.nfa.add()
            self.nfa.edges[cur].append((byte, byte, nxt))
            cur = nxt


def build_nfa(g: Grammar) -> ByteNFA:
    with compile_budget() as b:
        stage, b.stage = b.stage, "building the byte automaton"
        try:
            return _build_nfa(g)
        finally:
            b.stage = stage


def _build_nfa(g: Grammar) -> ByteNFA:
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20000))
    try:
        ok = productive(g)
        partial = not all(ok.values())
        if partial and ok.get(g.start, False):
            g = _prune(g, ok)
        builder = _Builder(g)
        if partial and not ok.get(g.start, False):
            # Nothing to keep: the automaton's checks say why (left recursion, or no string at all).
            builder.nfa.may_dead_end = True
        nfa = builder.build()
        nfa.indent_limit = g.indent_limit
        return nfa
    except RecursionError as exc:
        raise GrammarError("grammar nesting too deep") from exc
    finally:
        sys.setrecursionlimit(old)
