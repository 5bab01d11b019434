"""Objects whose members may come in any order (`property_order="any"`), each declared property at most once.

An automaton that remembers which of n optional properties it has seen needs 2^n states, so the set is not
states: it is the value of a counter frame (`ByteNFA.sets`) that the lazily determinised automaton carries on
its stack. The frame's value packs the set of declared properties seen (bits 0 .. n-1) and the member count
(the bits above, capped where nothing depends on it any more). Only the sets a generation reaches are ever
built, one per member, so a request costs what it would in schema order.

Four operations act on the frame (`ByteNFA.cset`, with their codes in `ByteNFA.cset_op`):

- ADD i (i >= 0): declared property i may start: it has not been seen, the count is under maxProperties, and
  the object can still be finished afterwards;
- ADD_EXTRA: a pattern or additional property may start, under the same conditions;
- SEP: a separator may follow the member just ended only if some member can still start after it;
- EXIT: the object may close: every required property seen and at least minProperties members.

"Can still be finished" (`viable`) is exact, so no token a mask allows leads where the object cannot close.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import GrammarError

ADD_EXTRA, SEP, EXIT = -1, -2, -3
# The loop table's entry for a set frame: bounds no clamping ever moves a value by (see Automaton.clamped).
SET_HI = 1 << 62
SET_REACH = 1 << 62
MAX_VALUE_BITS = 62  # frame values are int64 in the numba builder


@dataclass(frozen=True)
class SetSpec:
    """One any-order object: its n declared properties, the required ones (a bit mask), the member count's
    bounds, and whether other (pattern or additional) properties may appear."""

    nbits: int
    required: int
    lo: int
    hi: int | None
    extras: bool
    dead: int = 0  # optional properties whose values the trim found cannot finish: never addable

    @property
    def cap(self) -> int:
        """The largest count the frame keeps: maxProperties, or minProperties when there is no maximum."""
        return self.hi if self.hi is not None else self.lo


def viable(spec: SetSpec, seen: int, count: int) -> bool:
    """Whether an object with these members so far can still be closed validly."""
    missing = (spec.required & ~seen).bit_count()
    if spec.hi is not None and count + missing > spec.hi:
        return False
    if not spec.extras and count + spec.nbits - (seen | spec.dead).bit_count() < spec.lo:
        return False
    return True


def _added(spec: SetSpec, seen: int, count: int) -> int:
    return count + 1 if spec.hi is not None else min(count + 1, spec.lo)


def can_add(spec: SetSpec, seen: int, count: int) -> bool:
    """Whether some member can still start (a separator may follow the member just ended)."""
    if spec.hi is not None and count >= spec.hi:
        return False
    c2 = _added(spec, seen, count)
    if spec.extras and viable(spec, seen, c2):
        return True
    gone = seen | spec.dead
    return any(not (gone >> i) & 1 and viable(spec, seen | (1 << i), c2) for i in range(spec.nbits))


def step(spec: SetSpec, value: int, op: int) -> int:
    """The frame's value after operation `op`, or -1 when the operation is not allowed there (SEP and EXIT
    leave the value as it is)."""
    seen = value & ((1 << spec.nbits) - 1)
    count = value >> spec.nbits
    if op == EXIT:
        return value if (seen & spec.required) == spec.required and count >= spec.lo else -1
    if op == SEP:
        return value if can_add(spec, seen, count) else -1
    if op >= 0:
        if ((seen | spec.dead) >> op) & 1:
            return -1
        seen |= 1 << op
    elif not spec.extras:
        return -1
    if spec.hi is not None and count >= spec.hi:
        return -1
    count = _added(spec, seen, count)
    return seen | (count << spec.nbits) if viable(spec, seen, count) else -1


def fits(nbits: int, lo: int, hi: int | None) -> bool:
    """Whether an object of `nbits` declared properties and these count bounds fits a set frame's value."""
    cap = hi if hi is not None else lo
    return nbits + cap.bit_length() <= MAX_VALUE_BITS


def make_spec(items, extras: bool, lo: int, hi: int | None) -> SetSpec:
    """The SetSpec of a Members node's items ((node, required) pairs); GrammarError when its frame value would
    not fit the builder's 62 bits."""
    nbits = len(items)
    spec = SetSpec(nbits, sum(1 << i for i, (_, req) in enumerate(items) if req), lo, hi, extras)
    if not fits(nbits, lo, hi):
        raise GrammarError(
            f'property_order "any" supports objects of up to {MAX_VALUE_BITS - spec.cap.bit_length()} '
            f'declared properties here; this one has {nbits} (use property_order "schema")'
        )
    return spec


def lower(builder, node, s: int, esc: bool, end: int | None):
    """An any-order Members node from NFA state s (a walk, as nfa._Builder._emit): push the set frame, then
    members guarded by ADD, separators by SEP, and the end by EXIT, which pops the frame."""
    nfa = builder.nfa
    if end is None:
        end = nfa.add()
    spec = make_spec(node.items, node.extra is not None, node.min, node.max)
    if (spec.hi is not None and spec.hi < spec.lo) or not viable(spec, 0, 0):
        nfa.may_dead_end = True
        return end
    lid = len(nfa.loops)
    nfa.loops.append((0, SET_HI))
    nfa.sets[lid] = spec

    def op(src: int, dst: int, code: int) -> None:
        g = nfa.add()
        nfa.ep += (src, g)
        nfa.cset[g] = (dst, lid)
        nfa.cset_op[g] = code

    push, first, members, fresh, after = (nfa.add() for _ in range(5))
    nfa.ep += (s, push)
    nfa.cpush[push] = (first, lid)
    op(first, end, EXIT)
    nfa.ep += (first, members)
    for i, (item, _) in enumerate(node.items):
        begin = nfa.add()
        op(members, begin, i)
        yield builder._emit(item, begin, esc, fresh)
    if node.extra is not None:
        begin = nfa.add()
        op(members, begin, ADD_EXTRA)
        yield builder._emit(node.extra, begin, esc, fresh)
    op(fresh, end, EXIT)
    op(fresh, after, SEP)
    yield builder._emit(node.sep, after, esc, members)
    return end
