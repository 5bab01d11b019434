"""Library rules: called rules whose body is the same in every grammar, lowered to byte states once per process
and copied into each later NFA.

The JSON Schema front end's "any JSON value" and its plain string bodies are in most grammars it makes (every
object that allows undeclared properties calls the any-value rule). Lowered afresh they cost about 0.17 ms per
compile, a tenth of a median schema's time to first mask; copied, about a fifth of that.

A body is marked with `library_rule` by whoever makes it (json_schema). The byte NFA builder (nfa._Builder)
lowers a marked body the first time it meets it and keeps a `Fragment`: the states the lowering made, their
edges and counter, call and set entries, numbered from the rule's start state. Later grammars get a copy
(`Fragment.stamp`) with the same state numbering, edges and entries the lowering itself would have made there:
the NFA is the same as without the library, state for state.

What makes the copy exact: the builder lowers a rule's body from a fresh start state, with no end state given
and outside any escape; the byte states the body makes are reached from nothing else, so its lowering depends
on the body alone, as long as every rule it names is called, not copied in (nfa._Builder checks that). The
rules it calls are named, and the copy calls `rule()` for them at the same points of the state numbering as
the lowering did, so a called rule not yet met gets its start and end states where it would have.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from .ir import Node
from .walk import run

if TYPE_CHECKING:
    from .nfa import _Builder

LIBRARY_SIZE = 64  # bodies kept (least recently used dropped first); each is a few hundred states at most
ABSENT = object()
NOT_COPYABLE = object()  # a body whose lowering reached states outside itself: always lowered afresh
_lock = threading.Lock()
# id(body) -> [body, its Fragment, None (not lowered yet) or NOT_COPYABLE]. Keyed by identity: the front end
# hands out the same body object each time (it keeps them), and a lookup costs no hash of a large rule body.
# The entry holds the body, so its id is not reused while it is here.
_library: OrderedDict[int, list] = OrderedDict()


def library_rule(body: Node) -> Node:
    """Mark `body`, a called rule's body that is the same in every grammar, to be lowered once per process.
    Returns `body`."""
    with _lock:
        if id(body) in _library:
            _library.move_to_end(id(body))
        else:
            _library[id(body)] = [body, None]
            while len(_library) > LIBRARY_SIZE:
                _library.popitem(last=False)
    return body


def lookup(body: Node) -> object:
    """The body's Fragment, None if it is marked but not lowered yet, NOT_COPYABLE, or ABSENT."""
    hit = _library.get(id(body))
    return hit[1] if hit is not None and hit[0] is body else ABSENT


def keep(body: Node, frag: Fragment | None) -> None:
    with _lock:
        hit = _library.get(id(body))
        if hit is not None and hit[0] is body:
            hit[1] = frag if frag is not None else NOT_COPYABLE


def clear() -> None:
    """Forget every lowered body (tests)."""
    with _lock:
        _library.clear()


class Fragment:
    """A body's lowering from start state s, with its states numbered locally: 0 is s, 1.. the states it made
    in order. `events`: how those states were made, in order: an int k for k new states, a rule name for a
    `rule()` call (which makes the called rule's start and end states if it is new). `edges` and `eps`: the
    byte edges (source, first byte, last byte, target) and epsilon edges (source, target) it added, in the
    order added; then the calls and counter entries of the local states that have them. Loop ids are numbered
    from the first loop the body made."""

    __slots__ = (
        "events",
        "edges",
        "eps",
        "end",
        "calls",
        "ops",
        "cset_op",
        "universal",
        "counted_body",
        "counted_budget",
        "loops",
        "loop_step",
        "loop_slack",
        "sets",
        "dead_end",
        "units",
    )

    def stamp(self, b: _Builder, s: int) -> int:
        """Copy the lowering into b's NFA from its rule start state `s`; the state the body ends in."""
        nfa = b.nfa
        loc = [s]
        for ev in self.events:
            if type(ev) is int:
                first = nfa.add_many(ev)
                loc.extend(range(first, first + ev))
            else:
                b.rule(ev)
        b.budget.spend(self.units)
        lid0 = len(nfa.loops)
        nfa.loops.extend(self.loops)
        for lid, v in self.loop_step:
            nfa.loop_step[lid0 + lid] = v
        for lid, v in self.loop_slack:
            nfa.loop_slack[lid0 + lid] = v
        for lid, spec in self.sets:
            nfa.sets[lid0 + lid] = spec
        edges, ep = nfa.e, nfa.ep
        for i, lo, hi, t in self.edges:
            edges += (loc[i], lo, hi, loc[t])
        for i, t in self.eps:
            ep += (loc[i], loc[t])
        for i, name, ret in self.calls:
            nfa.call[loc[i]] = (b.rule_index[name], loc[ret])
        for op, entries in self.ops:
            d = getattr(nfa, op)
            for i, t, lid in entries:
                d[loc[i]] = (loc[t], lid0 + lid)
        for i, code in self.cset_op:
            nfa.cset_op[loc[i]] = code
        nfa.universal.update(loc[i] for i in self.universal)
        for i, lid in self.counted_body:
            nfa.counted_body[loc[i]] = lid0 + lid
        for i, v in self.counted_budget:
            nfa.counted_budget[loc[i]] = v
        if self.dead_end:
            nfa.may_dead_end = True
        return loc[self.end]


_OPS = ("cpush", "cinc", "cexit", "cguard", "cset")


def record(b: _Builder, body: Node, s: int) -> tuple[int, Fragment | None]:
    """Lower `body` from s with the builder's own lowering, watching what it makes: the state it ends in, and
    its Fragment (None if the lowering reached a state it did not make, so a copy would not be the same)."""
    nfa = b.nfa
    n0, lid0, dead0, e0, p0 = nfa.size, len(nfa.loops), nfa.may_dead_end, len(nfa.e), len(nfa.ep)
    nfa.may_dead_end = False
    log: list[tuple[int, str, bool]] = []
    b.rule_log = log
    b.code_points.listed = True
    try:
        end = run(b._emit(body, s, False, None))
    finally:
        b.rule_log = None
        b.code_points.listed = False
        dead = nfa.may_dead_end
        nfa.may_dead_end = dead0 or dead
    n1 = nfa.size
    events: list = []
    local = {s: 0}
    order = [s]
    pos = n0

    def take(upto: int) -> None:
        if upto > pos:
            events.append(upto - pos)
            for q in range(pos, upto):
                local[q] = len(order)
                order.append(q)

    for at, name, made in log:
        take(at)
        events.append(name)
        pos = at + 2 if made else at
    take(n1)
    if end not in local:
        return end, None
    frag = Fragment()
    frag.events = tuple(events)
    frag.end = local[end]
    # The edges the lowering added (all between its own states, else it is not copyable), in the order added.
    e, ep = nfa.e, nfa.ep
    try:
        frag.edges = tuple((local[e[k]], e[k + 1], e[k + 2], local[e[k + 3]]) for k in range(e0, len(e), 4))
        frag.eps = tuple((local[ep[k]], local[ep[k + 1]]) for k in range(p0, len(ep), 2))
    except KeyError:
        return end, None
    frag.units = len(frag.edges) + len(frag.eps)
    calls = []
    ops = {op: [] for op in _OPS}
    cset_op, counted_body, counted_budget = [], [], []
    for i, q in enumerate(order):
        if q in nfa.call:
            r, ret = nfa.call[q]
            if ret not in local:
                return end, None
            calls.append((i, nfa.rule_names[r], local[ret]))
        for op in _OPS:
            hit = getattr(nfa, op).get(q)
            if hit is not None:
                t, lid = hit
                if t not in local or lid < lid0:
                    return end, None
                ops[op].append((i, local[t], lid - lid0))
        if q in nfa.cset_op:
            cset_op.append((i, nfa.cset_op[q]))
        if q in nfa.counted_body:
            if nfa.counted_body[q] < lid0:
                return end, None
            counted_body.append((i, nfa.counted_body[q] - lid0))
        if q in nfa.counted_budget:
            counted_budget.append((i, nfa.counted_budget[q]))
        if q in nfa.end_rule:
            return end, None
    frag.calls = tuple(calls)
    frag.ops = tuple((op, tuple(v)) for op, v in ops.items() if v)
    frag.cset_op = tuple(cset_op)
    frag.universal = tuple(local[q] for q in order if q in nfa.universal)
    frag.counted_body = tuple(counted_body)
    frag.counted_budget = tuple(counted_budget)
    lid1 = len(nfa.loops)
    frag.loops = tuple(nfa.loops[lid0:lid1])
    frag.loop_step = tuple(
        (lid - lid0, nfa.loop_step[lid]) for lid in range(lid0, lid1) if lid in nfa.loop_step
    )
    frag.loop_slack = tuple(
        (lid - lid0, nfa.loop_slack[lid]) for lid in range(lid0, lid1) if lid in nfa.loop_slack
    )
    frag.sets = tuple((lid - lid0, nfa.sets[lid]) for lid in range(lid0, lid1) if lid in nfa.sets)
    frag.dead_end = dead
    return end, frag
