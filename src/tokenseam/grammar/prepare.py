"""The checks and rewrites an NFA goes through before an Automaton is built on it (`prepare_nfa`).

Left recursion and grammars that accept nothing are refused; states that cannot finish their rule are removed
(`_trim`, so every token a mask allows keeps a way to finish); the edge rows are frozen flat, and the byte
classes (runs of bytes every edge treats alike) computed from their bounds. The compiler runs this once per
compile; the Automaton only reads the NFA it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from . import anyorder
from .budget import compile_budget, current
from .errors import GrammarEmpty, GrammarError
from .nfa import ByteNFA


@dataclass(frozen=True)
class PreparedNFA:
    """A checked, trimmed NFA with flat rows, and its byte classes."""

    nfa: ByteNFA
    byte_class: np.ndarray  # int32[256]: the class of each byte
    class_start: list[int]  # the first byte of each class

    @property
    def n_classes(self) -> int:
        return len(self.class_start)


def prepare_nfa(nfa: ByteNFA) -> PreparedNFA:
    """Check `nfa` (GrammarError for left recursion or no string at all), trim it and freeze its rows, in
    place, inside the compile's budget; with the byte classes of its edges."""
    with compile_budget() as b:
        stage, b.stage = b.stage, "preparing the automaton"
        try:
            # Rows per state, flat, from here on: the checks read them, byte classes come from their bounds, and
            # the walk's state builder (localbuild) reads the same arrays.
            nfa.freeze_rows()
            _check_left_recursion(nfa)
            if nfa.may_dead_end:
                edges, eps = nfa.edges.lists(), nfa.eps.lists()
                _trim(nfa, edges, eps)
                while _settle_sets(nfa):
                    _trim(nfa, edges, eps)
                nfa.replace_rows(edges, eps)
            rows = nfa.edges.data
            # 1 where a byte class starts: at a range's first byte, and at the byte past its last
            starts = np.zeros(257, dtype=np.int32)
            starts[rows[:, 0]] = 1
            starts[rows[:, 1] + 1] = 1
            starts[0] = 1
            byte_class = np.cumsum(starts[:256], dtype=np.int32) - 1
            return PreparedNFA(nfa, byte_class, np.flatnonzero(starts[:256]).tolist())
        finally:
            b.stage = stage


def _nullable_rules(nfa: ByteNFA) -> set[int]:
    """The rules that can finish without reading a byte (least fixed point). After a first look at every
    rule, a rule is looked at again only when a rule it calls on its way has been found nullable:
    sweeping every rule until nothing changed cost one sweep per link of a chain of such rules."""
    nullable: set[int] = set()
    callers: dict[int, set[int]] = {}
    todo = list(range(len(nfa.rule_start)))
    while todo:
        found = []
        for r in todo:
            if r in nullable:
                continue
            calls: list[int] = []
            if nfa.rule_end[r] in _eps_reach(nfa, nfa.rule_start[r], nullable, calls):
                nullable.add(r)
                found.append(r)
            else:
                for c in calls:
                    callers.setdefault(c, set()).add(r)
        todo = sorted({y for x in found for y in callers.get(x, ()) if y not in nullable})
    return nullable


def _eps_reach(nfa: ByteNFA, s: int, nullable: set[int] | range, calls: list | None) -> set[int]:
    """The states reached from s by epsilon moves, counter operations and calls of nullable rules (the rules
    called on the way appended to `calls`)."""
    seen = {s}
    stack = [s]
    while stack:
        q = stack.pop()
        nxt = list(nfa.eps[q])
        for d in (nfa.cpush, nfa.cinc, nfa.cexit, nfa.cguard, nfa.cset):
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
    current().tick(len(seen))
    return seen


def _check_left_recursion(nfa: ByteNFA) -> None:
    """Refuse a grammar with a rule that can call itself before reading a byte."""
    if not nfa.call:
        return
    # Taking every rule as nullable gives each rule more calls before its first byte, never fewer: when even
    # those make no cycle (JSON-schema grammars: every rule starts with a byte or a call that does), there is
    # no left recursion, and the nullable rules need not be found.
    if not any(_on_cycle(_first_calls(nfa, range(len(nfa.rule_start))))):
        return
    first = _first_calls(nfa, _nullable_rules(nfa))
    # A rule is left-recursive when it lies on a cycle of "calls at its start". The first such rule (by
    # index) is named, as a search from every rule in turn named it, but in time linear in the calls.
    for r, cyclic in enumerate(_on_cycle(first)):
        if cyclic:
            raise GrammarError(
                f"rule {nfa.rule_names[r]!r} is left-recursive (it can call itself "
                "without consuming input); rewrite it with repetition"
            )


def _first_calls(nfa: ByteNFA, nullable: set[int] | range) -> list[list[int]]:
    """Per rule, the rules it can call before reading a byte, with the rules in `nullable` finishing empty."""
    first: list[list[int]] = []
    for r in range(len(nfa.rule_start)):
        calls: list[int] = []
        _eps_reach(nfa, nfa.rule_start[r], nullable, calls)
        first.append(sorted(set(calls)))
    return first


def _trim(nfa: ByteNFA, edges: list[list[tuple[int, int, int]]], eps: list[list[int]]) -> None:
    """Remove NFA states that cannot complete their rule, so every allowed token keeps a way to finish.
    `edges`, `eps`: the NFA's byte and epsilon edges per state, as lists, trimmed in place."""
    n = nfa.size
    current().spend(2 * n)  # the reversed rows, and three passes over the states
    rev: list[list[int]] = [[] for _ in range(n)]
    for q in range(n):
        for _, _, t in edges[q]:
            rev[t].append(q)
        for t in eps[q]:
            rev[t].append(q)
    for d in (nfa.cpush, nfa.cinc, nfa.cexit, nfa.cguard, nfa.cset):
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
        raise GrammarEmpty("the grammar accepts no string at all")
    for q in range(n):
        if live[q]:
            if edges[q]:
                edges[q] = [e for e in edges[q] if live[e[2]]]
            if eps[q]:
                eps[q] = [t for t in eps[q] if live[t]]
            if q in nfa.call and not (rule_ok[nfa.call[q][0]] and live[nfa.call[q][1]]):
                del nfa.call[q]
        else:
            edges[q] = []
            eps[q] = []
            nfa.call.pop(q, None)
    for d in (nfa.cpush, nfa.cinc, nfa.cexit, nfa.cguard, nfa.cset):
        for q in [q for q, (t, _) in d.items() if not (live[q] and live[t])]:
            del d[q]
    nfa.cset_op = {q: code for q, code in nfa.cset_op.items() if q in nfa.cset}
    # A live universal state keeps its paths: they lead to where it finishes, which is live with it.
    nfa.universal = {q for q in nfa.universal if live[q]}
    nfa.may_dead_end = False


def _settle_sets(nfa: ByteNFA) -> bool:
    """After a trim, the any-order objects (anyorder.py) whose members it removed: a removed optional member
    is marked dead in its SetSpec (the object's guards must not count on it); a removed required member makes
    the object impossible, so its frame push is removed too. True when that calls for another trim."""
    if not nfa.sets:
        return False
    alive: dict[int, int] = dict.fromkeys(nfa.sets, 0)
    extras: dict[int, bool] = dict.fromkeys(nfa.sets, False)
    for q, (_, lid) in nfa.cset.items():
        code = nfa.cset_op[q]
        if code >= 0:
            alive[lid] |= 1 << code
        elif code == anyorder.ADD_EXTRA:
            extras[lid] = True
    retrim = False
    for lid, spec in list(nfa.sets.items()):
        full = (1 << spec.nbits) - 1
        dead = full & ~alive[lid]
        if spec.required & dead or not anyorder.viable(replace(spec, dead=dead, extras=extras[lid]), 0, 0):
            for q in [q for q, (_, x) in nfa.cpush.items() if x == lid]:
                del nfa.cpush[q]
            nfa.may_dead_end = True
            retrim = True
        elif dead != spec.dead or extras[lid] != spec.extras:
            nfa.sets[lid] = replace(spec, dead=dead, extras=extras[lid])
    return retrim


def _on_cycle(succ: list[list[int]]) -> list[bool]:
    """For each node of the graph (node -> successors), whether it lies on a cycle (Tarjan's strongly
    connected components, iterative)."""
    n = len(succ)
    index = [-1] * n
    low = [0] * n
    on = [False] * n
    out = [False] * n
    stack: list[int] = []
    counter = 0
    b = current()
    for root in range(n):
        if index[root] >= 0:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on[root] = True
        work = [(root, iter(succ[root]))]
        while work:
            v, it = work[-1]
            b.tick()
            advanced = False
            for w in it:
                if index[w] < 0:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on[w] = True
                    work.append((w, iter(succ[w])))
                    advanced = True
                    break
                if on[w]:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on[w] = False
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in succ[v]:
                    for w in comp:
                        out[w] = True
    return out
