"""The grammar IR every front end lowers to: code-point sets, sequences, alternatives, repeats, rule refs.

Code points are lowered to UTF-8 bytes only when the byte automaton is built (see `nfa.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

MAX_CP = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)

Ranges = tuple[tuple[int, int], ...]


def norm(ranges) -> Ranges:
    """Sorted, merged, surrogate-free code point ranges."""
    rs = sorted((int(a), int(b)) for a, b in ranges if a <= b)
    out: list[list[int]] = []
    for a, b in rs:
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    res: list[tuple[int, int]] = []
    for a, b in out:
        res.extend(cut_surrogates(a, b))
    return tuple(res)


def cut_surrogates(lo: int, hi: int) -> list[tuple[int, int]]:
    """The range [lo, hi] without the surrogates: UTF-8 cannot carry them, so they never belong to a set."""
    if lo > hi:
        return []
    if hi < SURROGATES[0] or lo > SURROGATES[1]:
        return [(lo, hi)]
    out = []
    if lo < SURROGATES[0]:
        out.append((lo, SURROGATES[0] - 1))
    if hi > SURROGATES[1]:
        out.append((SURROGATES[1] + 1, hi))
    return out


def complement(ranges: Ranges) -> Ranges:
    out = []
    prev = 0
    for a, b in norm(ranges):
        if a > prev:
            out.append((prev, a - 1))
        prev = b + 1
    if prev <= MAX_CP:
        out.append((prev, MAX_CP))
    return norm(out)


def intersect(a: Ranges, b: Ranges) -> Ranges:
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


class Node:
    __slots__ = ()


def _cached_hash(node) -> int:
    """The hash of a composite node, computed once: `alt` deduplicates alternatives by value, and without the
    cache every enclosing `alt` hashed the whole subtree again."""
    h = node._hash
    if h is None:
        h = hash((type(node).__name__,) + tuple(getattr(node, f) for f in node.__match_args__))
        object.__setattr__(node, "_hash", h)
    return h


def _items_hash(node) -> int:
    """_cached_hash of a Seq or Alt (the same value), without its walk over the fields: most nodes hashed."""
    h = node._hash
    if h is None:
        h = hash((type(node).__name__, node.items))
        object.__setattr__(node, "_hash", h)
    return h


@dataclass(frozen=True, slots=True)
class Chars(Node):
    """One code point from `ranges`."""

    ranges: Ranges


@dataclass(frozen=True, slots=True)
class Seq(Node):
    """The items one after the other. No item is an empty Alt (a sequence holding one is the empty language,
    NOTHING, which `seq` returns instead): every Seq is built by `seq`, or of parts that cannot be empty."""

    items: tuple[Node, ...]
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)
    __hash__ = _items_hash


@dataclass(frozen=True, slots=True)
class Alt(Node):
    items: tuple[Node, ...]
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)
    __hash__ = _items_hash


@dataclass(frozen=True, slots=True)
class Repeat(Node):
    item: Node
    min: int
    max: int | None
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)
    __hash__ = _cached_hash


@dataclass(frozen=True, slots=True)
class Ref(Node):
    name: str


@dataclass(frozen=True, slots=True)
class Escaped(Node):
    """Code points inside are written as JSON string content (quote, backslash, controls escaped)."""

    item: Node
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)
    __hash__ = _cached_hash


@dataclass(frozen=True, slots=True)
class Auto(Node):
    """An embedded code point automaton (built by `cpauto` for intersections and complements)."""

    auto: object
    escape: bool = False
    # At most this many code points (strings of `auto` longer than that are left out). The automaton counts
    # them with a counter frame instead of a copy of `auto` per length; see `nfa._Builder.embed_counted`.
    limit: int | None = None


EMPTY = Seq(())
NOTHING = Alt(())

# Seq and Alt made without the frozen dataclass's __init__ (a call setting each field through
# object.__setattr__): the same node, in a third less time. Large schemas build thousands of them.
_new = object.__new__
_SEQ_ITEMS, _SEQ_HASH = Seq.__dict__["items"].__set__, Seq.__dict__["_hash"].__set__
_ALT_ITEMS, _ALT_HASH = Alt.__dict__["items"].__set__, Alt.__dict__["_hash"].__set__


def _seq_of(items: tuple[Node, ...]) -> Seq:
    node = _new(Seq)
    _SEQ_ITEMS(node, items)
    _SEQ_HASH(node, None)
    return node


def _alt_of(items: tuple[Node, ...]) -> Alt:
    node = _new(Alt)
    _ALT_ITEMS(node, items)
    _ALT_HASH(node, None)
    return node


_ONE_CHAR: dict[str, Chars] = {}  # shared nodes for single characters (literals are most of a big enum)
# The shared nodes of printable ASCII characters by id, to their byte: the byte NFA writes each as one edge
# (most of a literal key). The second leaves out the quote and the backslash, which inside a JSON string are
# escaped. (The nodes are kept for the process, so their ids stay theirs.)
PLAIN_BYTE: dict[int, int] = {}
PLAIN_BYTE_IN_STRING: dict[int, int] = {}


def _char(c: str) -> Chars:
    node = _ONE_CHAR.get(c)
    if node is None:
        o = ord(c)
        node = Chars(((o, o),))
        if len(_ONE_CHAR) < 1 << 16:
            _ONE_CHAR[c] = node
            if 0x20 <= o < 0x80:
                PLAIN_BYTE[id(node)] = o
                if o != 0x22 and o != 0x5C:
                    PLAIN_BYTE_IN_STRING[id(node)] = o
    return node


def lit(text: str) -> Node:
    if len(text) == 1:
        return _char(text)
    parts = tuple(map(_ONE_CHAR.get, text))  # (a loop in C when every character was met before)
    if not all(parts):
        parts = tuple(map(_char, text))
    return _seq_of(parts)


def chars(*ranges: tuple[int, int]) -> Chars:
    return Chars(norm(ranges))


def cls(spec: str) -> Chars:
    """A class from 'a-z0-9_' style text (ASCII convenience for hand-written grammars)."""
    rs = []
    i = 0
    while i < len(spec):
        if i + 2 < len(spec) and spec[i + 1] == "-":
            rs.append((ord(spec[i]), ord(spec[i + 2])))
            i += 3
        else:
            rs.append((ord(spec[i]), ord(spec[i])))
            i += 1
    return Chars(norm(rs))


def largest_repeat(node: Node) -> int:
    """The largest bound (max, or min when unbounded) of a repeat in `node` (0 without one), over characters,
    sequences, alternatives, repeats and escapes (a parsed regex)."""
    best = 0
    stack = [node]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is Seq or t is Alt:
            stack.extend(x.items)
        elif t is Repeat:
            best = max(best, x.max if x.max is not None else x.min)
            stack.append(x.item)
        elif t is Escaped:
            stack.append(x.item)
    return best


def seq(*items: Node) -> Node:
    flat: list[Node] = []
    for it in items:
        if isinstance(it, Seq):
            flat.extend(it.items)  # (a Seq holds no empty Alt: see Seq)
        elif type(it) is Alt and not it.items:  # the empty language (NOTHING, or an Alt built empty)
            return NOTHING
        else:
            flat.append(it)
    return flat[0] if len(flat) == 1 else _seq_of(tuple(flat))


def alt(*items: Node) -> Node:
    flat: list[Node] = []
    for it in items:
        if isinstance(it, Alt):
            flat.extend(it.items)
        else:
            flat.append(it)
    if len(flat) == 1:
        return flat[0]  # (most calls: a schema of one type), without hashing the subtree
    uniq: list[Node] = []
    seen = set()
    for it in flat:
        key = id(it) if isinstance(it, Auto) else it
        if key not in seen:
            seen.add(key)
            uniq.append(it)
    return uniq[0] if len(uniq) == 1 else _alt_of(tuple(uniq))


def literal_alt(texts) -> Node:
    """alt(*map(lit, texts)) with common prefixes written once (a radix tree of the texts): an enum of many
    codes (`"005-001"`, `"005-002"`, ...) is then one automaton state per distinct prefix, not one per
    character of every value. Read off the sorted texts, where each subtree is a run of neighbours; built
    without recursion (values may be long and share long prefixes)."""
    ts = sorted(set(texts))
    if not ts:
        return NOTHING
    done: dict[tuple[int, int], Node] = {}  # (first, end) of a run sharing a branching point -> its tree
    # A node is a run ts[lo:hi] sharing their first `pos` characters; post-order over an explicit stack.
    stack: list[tuple[int, int, int, list | None]] = [(0, len(ts), 0, None)]
    while stack:
        lo, hi, pos, kids = stack.pop()
        first, last = ts[lo], ts[hi - 1]
        p = pos
        n = min(len(first), len(last))
        while p < n and first[p] == last[p]:  # sorted: the first and last share what all share
            p += 1
        if kids is None:
            kids = []
            k = lo + (len(first) == p)  # the shortest comes first: it may end here
            while k < hi:
                c = ts[k][p]
                j = k + 1
                while j < hi and ts[j][p] == c:
                    j += 1
                kids.append((k, j))
                k = j
            stack.append((lo, hi, pos, kids))
            # A run of one text (most leaves of a big enum) is its characters: written below, not walked.
            stack.extend((k, j, p + 1, None) for k, j in kids if j > k + 1)
            continue
        # Built without seq() and alt(): the parts are apart by construction (distinct first characters, one
        # empty text at most) and nothing nests that would need flattening.
        parts = [EMPTY] if len(first) == p else []
        for k, j in kids:
            if j == k + 1:
                text = ts[k]
                parts.append(_char(text[p]) if len(text) == p + 1 else _seq_of(tuple(map(_char, text[p:]))))
                continue
            sub = done.pop((k, j))
            c = _char(ts[k][p])
            parts.append(
                c if sub is EMPTY else _seq_of((c, *sub.items)) if type(sub) is Seq else _seq_of((c, sub))
            )
        node = parts[0] if len(parts) == 1 else _alt_of(tuple(parts))
        if p > pos:
            run = tuple(map(_char, first[pos:p]))
            if node is EMPTY:
                node = run[0] if len(run) == 1 else _seq_of(run)
            else:
                node = _seq_of((*run, *node.items)) if type(node) is Seq else _seq_of((*run, node))
        done[(lo, hi)] = node
    return done[(0, len(ts))]


def opt(item: Node) -> Node:
    return Repeat(item, 0, 1)


def star(item: Node) -> Node:
    return Repeat(item, 0, None)


def plus(item: Node) -> Node:
    return Repeat(item, 1, None)


@dataclass
class Grammar:
    """Named rules and a start rule; refs to rules on a cycle become pushdown calls, others are inlined."""

    rules: dict[str, Node]
    start: str
    warnings: list[str] = field(default_factory=list)
    # Rules always lowered as calls, even when not recursive: a lexeme used in many places (a JSON string
    # body) is then one set of automaton states, and its token masks are shared by every place it occurs.
    shared: frozenset[str] = frozenset()
    # If set, a run of spaces and tabs right after a raw newline is at most this long. The rules leave such
    # runs unbounded and the automaton enforces the limit per token (see Automaton), so an indentation run
    # costs one automaton state instead of one per column. Only valid where every raw newline is layout
    # (JSON: strings cannot hold one).
    indent_limit: int | None = None
    # Called when the grammar turns out to accept nothing: a sentence naming the part that accepts nothing
    # (the JSON front end names the sub-schema), or None.
    explain_empty: Callable[[], str | None] | None = None


ANY_RANGES: Ranges = norm([(0, MAX_CP)])
# The code points the mask walk treats as "string-safe" (see tables._safe_from): what a JSON string may hold
# unescaped (printable ASCII but quote and backslash, and non-ASCII scalar values) but for U+0085, U+2028,
# U+2029 and U+FEFF. Python's and ECMA's `.` or `\s` disagree on those four, so a pattern held to both readings
# takes them as neither `.` nor `\S` nor `\s`; without them, `.*` and word-count patterns such as
# (\S+\s+){0,9}\S+ take any safe text. A token holding one of them is walked byte by byte.
UNSAFE_CODE_POINTS = (0x85, 0x2028, 0x2029, 0xFEFF)
SAFE_RANGES: Ranges = norm(
    [
        (0x20, 0x21),
        (0x23, 0x5B),
        (0x5D, 0x7E),
        (0x80, 0x84),
        (0x86, 0x2027),
        (0x202A, 0xD7FF),
        (0xE000, 0xFEFE),
        (0xFF00, MAX_CP),
    ]
)


def covers_safe(ranges) -> bool:
    """Whether the code point ranges (any order, may overlap) include every one of SAFE_RANGES."""
    if not ranges or max(hi for _, hi in ranges) < MAX_CP:
        return False  # the common case (a few characters), without sorting
    merged: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    # Both lists are sorted and disjoint: one pass over each.
    j, m = 0, len(merged)
    for a, b in SAFE_RANGES:
        while j < m and merged[j][1] < a:
            j += 1
        if j == m or merged[j][0] > a or merged[j][1] < b:
            return False
    return True


@dataclass(frozen=True, slots=True, eq=False)
class Members(Node):
    """A separated list: `items` in order (optional ones may be skipped), then any number of `extra`,
    with the total count within [min, max]; with `any_order`, items and extras interleave in any order. Lowered to a graph (not a tree) so optional members do not
    multiply the automaton size."""

    items: tuple[tuple[Node, bool], ...]
    extra: Node | None
    sep: Node
    min: int = 0
    max: int | None = None
    any_order: bool = False  # items in any order, each at most once (grammar/anyorder.py)


# JSON layout whitespace between tokens: up to two spaces or tabs, or a line break and then an indentation run
# (without it when indentation is off). Every separator uses one of these two nodes, thousands of times in a
# large schema: the NFA builder recognises them by identity and lowers them straight to their few states
# (nfa._Builder.layout) instead of walking the tree each time.
LAYOUT = alt(Repeat(cls(" \t"), 0, 2), seq(opt(lit("\r")), lit("\n"), star(cls(" \t"))))
LAYOUT_NO_INDENT = alt(Repeat(cls(" \t"), 0, 2), seq(opt(lit("\r")), lit("\n")))
