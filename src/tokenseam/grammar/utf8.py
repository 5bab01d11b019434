"""Code points as UTF-8 bytes for the byte automaton: a code point range as sequences of byte ranges, a code
point set split into plain ASCII, JSON escapes and the multi-byte part, the escape bytes themselves, and
CodePointEdges, which writes a code point set as byte edges into a ByteNFA."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from .ir import covers_safe

if TYPE_CHECKING:
    from .nfa import ByteNFA

# json.dumps escapes for the code points that cannot appear raw inside a JSON string.
_SHORT_ESC = {
    0x22: b'\\"',
    0x5C: b"\\\\",
    0x0A: b"\\n",
    0x0D: b"\\r",
    0x09: b"\\t",
    0x08: b"\\b",
    0x0C: b"\\f",
}


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
    _split_code_point_range(lo, hi, out)
    return tuple(tuple(x) for x in out)


def _split_code_point_range(lo: int, hi: int, out: list) -> None:
    """Append to `out` the pieces of [lo, hi] whose UTF-8 forms are exactly one byte range per position: one
    encoded length each, and below the first differing byte only full continuation ranges."""
    if lo > hi:
        return
    for mx in (0x7F, 0x7FF, 0xFFFF):
        if lo <= mx < hi:
            _split_code_point_range(lo, mx, out)
            _split_code_point_range(mx + 1, hi, out)
            return
    if hi <= 0x7F:
        out.append([(lo, hi)])
        return
    for i in range(1, 4):
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m != 0:
                _split_code_point_range(lo, lo | m, out)
                _split_code_point_range((lo | m) + 1, hi, out)
                return
            if hi & m != m:
                _split_code_point_range(lo, (hi & ~m) - 1, out)
                _split_code_point_range(hi & ~m, hi, out)
                return
    a = chr(lo).encode("utf-8", "surrogatepass")
    b = chr(hi).encode("utf-8", "surrogatepass")
    out.append(list(zip(a, b, strict=True)))


@functools.lru_cache(maxsize=8192)
def lowering_plan(ranges: tuple, esc: bool) -> tuple[tuple, tuple, tuple, bool]:
    """byte_plan(ranges, esc) and whether the set covers every string-safe character, kept for the process: the
    same sets (a string's characters, "any character but these") recur in every grammar."""
    return byte_plan(ranges, esc) + (covers_safe(ranges),)


def byte_plan(ranges, esc: bool) -> tuple[tuple, tuple, tuple]:
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


@functools.lru_cache(maxsize=1024)
def escape_plan(specials: tuple[int, ...]) -> tuple[int, tuple[tuple[int, int, int], ...]]:
    """The escapes of `specials` after a backslash, as states 0.. (0: after the backslash) and byte edges
    (state, byte, target state; -1: the end)."""
    edges: list[tuple[int, int, int]] = []
    uhex: dict[int, list[int]] = {}
    for c in specials:
        code = json_escape_bytes(c)
        if len(code) == 2:
            edges.append((0, code[1], -1))
        else:
            uhex.setdefault(code[4], []).append(code[5])
    size = 1
    if uhex:
        u, z1, z2 = 1, 2, 3
        size = 4
        edges += [(0, 0x75, u), (u, 0x30, z1), (z1, 0x30, z2)]
        for d1, lasts in uhex.items():
            x = size
            size += 1
            edges.append((z2, d1, x))
            edges.extend((x, d2, -1) for d2 in lasts)
    return size, tuple(edges)


class CodePointEdges:
    """Byte edges for code point sets in one ByteNFA, sharing per target state the states after a backslash,
    the multi-byte UTF-8 part and the trailing continuation bytes."""

    def __init__(self, nfa: ByteNFA) -> None:
        self.nfa = nfa
        self.tails: dict[tuple[int, int], int] = {}
        self.high_cache: dict[tuple, int] = {}
        self.esc_cache: dict[tuple, int] = {}
        # Edges written to the NFA's lists at once, none left for the freeze: set while a library body is
        # recorded (library.record reads what the lowering added from the lists).
        self.listed = False

    def lower(self, ranges, s: int, e: int, esc: bool) -> None:
        """Byte edges from `s` to `e` for one code point of `ranges` (JSON-escaped when `esc`)."""
        plain, specials, high, safe = lowering_plan(ranges, esc)
        nfa = self.nfa
        if safe and s == e:
            nfa.universal.add(s)  # a loop on every string-safe character
        edges = nfa.e
        for a, b in plain:
            edges += (s, a, b, e)
        if specials:
            bs = self.escapes(specials, e)
            edges += (s, 0x5C, 0x5C, bs)
        if high:
            nfa.ep += (s, self.high_state(high, e))

    def high_state(self, high: tuple, e: int) -> int:
        """The state from which the multi-byte UTF-8 forms of `high` lead to `e`. Lowered once per target and
        shared (the states of a complement automaton, "any key but these", all share one into their sink)."""
        hk = (high, e)
        y = self.high_cache.get(hk)
        if y is None:
            if (e, 1) not in self.tails:  # no shared tail into e yet: a template's copy (or edge by edge)
                return self.into_fresh((), high, e)[1]
            y = self._lower_high(high, e)
        return y

    def _lower_high(self, high: tuple, e: int) -> int:
        y = self.high_cache[(high, e)] = self.nfa.add()
        for lo, hi in high:
            self.lower_raw(lo, hi, y, e)
        return y

    def escapes(self, specials: tuple[int, ...], e: int) -> int:
        """The state after a backslash from which the escapes of `specials` lead to `e` (shared per target)."""
        nfa = self.nfa
        bkey = (specials, e)
        bs = self.esc_cache.get(bkey)
        if bs is not None:
            return bs
        size, plan = escape_plan(specials)
        bs = self.esc_cache[bkey] = nfa.add_many(size)
        edges = nfa.e
        for q, c, t in plan:
            edges += (bs + q, c, c, e if t < 0 else bs + t)
        return bs

    def into_fresh(self, specials: tuple[int, ...], high: tuple, e: int) -> tuple[int, int]:
        """escapes(specials, e) (none if `specials` is empty), then high_state(high, e), for a target `e` that
        nothing leads into yet (no shared state of e's exists): the same states, edges and shared entries,
        copied from a template made once per pair of sets. The edges are written at the freeze, with the
        template's other copies (`ByteNFA.fresh`: no other edge ever leaves these states), or at once on the
        lists while `listed`. The states after the backslash (-1 if none) and the multi-byte forms' state."""
        template = _fresh_template(specials, high)
        if template is None:  # (none kept for these sets: written edge by edge, as they would be)
            return self.escapes(specials, e) if specials else -1, self._lower_high(high, e)
        size, rows, into_e, esc_at, high_at, tails = template
        nfa = self.nfa
        first = nfa.add_many(size)
        if not self.listed:
            # Noted, and written at the freeze with every other copy of this template (ByteNFA.freeze_rows).
            copies = nfa.fresh.get(id(rows))
            if copies is None:
                copies = nfa.fresh[id(rows)] = (rows, into_e, [], [])
            copies[2].append(first)
            copies[3].append(e)
        else:
            edges = rows + np.array((first, 0, 0, first), np.int32)
            edges[into_e, 3] = e
            nfa.e += edges.ravel().tolist()
        bs = -1
        if specials:
            self.esc_cache[(specials, e)] = bs = first + esc_at
        self.high_cache[(high, e)] = y = first + high_at
        for depth, at in tails:
            self.tails[(e, depth)] = first + at
        return bs, y

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
                nfa.e += (cur, a, b, nxt)
                cur = nxt

    def tail(self, e: int, depth: int) -> int:
        key = (e, depth)
        t = self.tails.get(key)
        if t is None:
            t = self.nfa.add()
            nxt = e if depth == 1 else self.tail(e, depth - 1)
            self.nfa.e += (t, 0x80, 0xBF, nxt)
            self.tails[key] = t
        return t


# Templates kept (a few dozen edges each); once full, a set without one is lowered edge by edge.
FRESH_KEPT = 1024
_FRESH: dict[tuple, tuple] = {}


def _fresh_template(specials: tuple[int, ...], high: tuple) -> tuple | None:
    """CodePointEdges.into_fresh's template: escapes and high_state run on a scratch NFA whose target is state
    0. Its states are numbered from 0 in the order they were made; the byte edges as an int32 array of
    (source, first byte, last byte, target) rows in the order written, and the rows into the target. None
    when FRESH_KEPT templates are kept and this one is not among them."""
    hit = _FRESH.get((specials, high))
    if hit is not None or len(_FRESH) >= FRESH_KEPT:
        return hit
    from .nfa import ByteNFA  # (nfa imports this module)

    scratch = CodePointEdges(ByteNFA())
    target = scratch.nfa.add()
    bs = scratch.escapes(specials, target) if specials else 0
    y = scratch._lower_high(high, target)
    rows = np.array(scratch.nfa.e, np.int32).reshape(-1, 4)
    rows[:, 0] -= 1
    rows[:, 3] -= 1
    into_e = np.flatnonzero(rows[:, 3] < 0)  # (the target was state 0)
    tails = tuple((depth, t - 1) for (_, depth), t in scratch.tails.items())
    hit = _FRESH[(specials, high)] = (scratch.nfa.n - 1, rows, into_e, bs - 1, y - 1, tails)
    return hit
