"""The rule graph of a grammar IR, before it is lowered: which rules each rule refers to, which rules lie on
a reference cycle, which rules derive at least one string, and the grammar without the ones that derive none.
"""

from __future__ import annotations

import dataclasses

from .budget import current
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
)
from .walk import run


def rule_refs(g: Grammar, with_nothing: set[str] | None = None) -> tuple[dict[str, set[str]], list[str]]:
    """The rules each rule refers to, and the rules referred to more than once in all, in the order a walk of
    the rules first meets them. A reference counts once per occurrence in the rules written out as trees: one
    under a subtree shared by two parents counts twice. `with_nothing`, if given, gets the rules whose body
    holds an empty alternative (NOTHING), which prune_unproductive rewrites even where no reference changes.

    Each rule is walked as the graph it is (a node shared within the rule once), not as the tree it stands
    for, which can be far larger; a node met again within its rule is a shared subtree, and the references
    under it are counted twice after the walk (each such subtree walked once)."""
    b = current()
    refs: dict[str, set[str]] = {}
    met: dict[str, bool] = {}  # rule -> referred to more than once (keys in the order first met)
    again: list[Node] = []
    walked = 0
    for name, node in g.rules.items():
        acc: set[str] = set()
        seen: set[int] = set()
        stack = [node]
        while stack:
            n = stack.pop()
            t = type(n)
            if t is Chars or n is LAYOUT or n is LAYOUT_NO_INDENT:
                # shared (one per character, one whitespace node): no reference below them
                continue
            if id(n) in seen:
                again.append(n)
                continue
            seen.add(id(n))
            walked += 1
            if not walked & 255:
                b.tick(256)
            if t is Seq or t is Alt:  # (the common parts dispatched here, without a call)
                if not n.items and t is Alt and with_nothing is not None:
                    with_nothing.add(name)
                # The characters and layouts, most of the parts, are left out here rather than pushed and
                # popped; the others are pushed in order, as the walk meets them.
                for x in n.items:
                    if type(x) is not Chars and x is not LAYOUT and x is not LAYOUT_NO_INDENT:
                        stack.append(x)
            elif t is Ref:
                acc.add(n.name)
                met[n.name] = n.name in met
            else:
                push_parts(n, stack)
        missing = {x for x in acc if x not in g.rules}
        if missing:
            raise GrammarError(f"rule {name!r} references undefined rule(s): {', '.join(sorted(missing))}")
        refs[name] = acc
    done: set[int] = set()
    while again:
        n = again.pop()
        if id(n) in done:
            continue
        done.add(id(n))
        if isinstance(n, Ref):
            met[n.name] = True
        else:
            push_parts(n, again)
    return refs, [name for name, more in met.items() if more]


def push_parts(n: Node, stack: list) -> None:
    """Push the parts of `n` onto `stack` (none for a leaf or a Ref): the walks over the IR share it."""
    if isinstance(n, (Seq, Alt)):
        stack.extend(n.items)
    elif isinstance(n, (Repeat, Escaped)):
        stack.append(n.item)
    elif isinstance(n, Members):
        stack.extend(x for x, _ in n.items)
        stack.append(n.sep)
        if n.extra is not None:
            stack.append(n.extra)


def cyclic_rules(g: Grammar, refs: dict[str, set[str]]) -> set[str]:
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


# Levels of IR the productivity check goes down by plain recursion before it continues as a walk (walk.run),
# which costs no interpreter stack: compiles run in threads with small stacks, under any recursion limit.
FAST_DEPTH = 60
_FAST_TYPES = frozenset((Chars, Auto, Ref, Seq, Alt, Members, Repeat, Escaped))


def productive(
    g: Grammar, refs: dict[str, set[str]] | None = None, with_nothing: set[str] | None = None
) -> dict[str, bool]:
    """Which rules derive at least one string (least fixed point). `refs`: rule_refs(g)'s first half, if the
    caller has it; `with_nothing`: the set rule_refs(g, with_nothing) filled, if it has that too.

    Each round evaluates only the rules that refer to one found productive in the round before (the first
    round: every rule, in order). Sweeping every rule until nothing changed took one sweep per link of a rule
    chain whose rules come in the order they refer to each other: 10,000 rules cost 10,000 sweeps.

    With `with_nothing`, a rule that holds no empty alternative is productive as soon as every rule it refers
    to is (each of its nodes then derives a string): such rules are found on the reference graph, without a
    walk, and the first round takes the rules after the ones they refer to. In a JSON Schema grammar that
    leaves the rules on a reference cycle (the "any value" rule) to be walked."""
    b = current()
    if refs is None:
        refs = rule_refs(g)[0]
    ok: dict[str, bool] = {name: False for name in g.rules}
    order = {name: i for i, name in enumerate(g.rules)}
    referrers: dict[str, list[str]] = {}
    for name in g.rules:
        for ref in refs[name]:
            referrers.setdefault(ref, []).append(name)

    # The nodes found productive (by id): a node stays productive as rules are found productive, so a subtree
    # shared by several rules or met again in a later round is walked once to a yes.
    yes: set[int] = set()

    def prod(node: Node, depth: int = 0):
        """Whether `node` derives a string, with the rules in `ok` as they stand (or the walk that finds out:
        walk.run)."""
        b.tick()
        if depth > 500:
            return False
        if isinstance(node, (Chars, Auto)):
            return True
        if isinstance(node, Ref):
            return ok.get(node.name, False)  # an undefined rule is reported when the automaton is built
        if id(node) in yes:
            return True
        return prod_parts(node, depth)

    def prod_parts(node: Node, depth: int):
        # (a leaf's answer is taken at once, not through the walk's trampoline)
        if isinstance(node, Seq):
            for x in node.items:
                r = prod(x, depth + 1)
                if not (r if type(r) is bool else (yield r)):
                    return False
        elif isinstance(node, Alt):
            for x in node.items:
                r = prod(x, depth + 1)
                if r if type(r) is bool else (yield r):
                    break
            else:
                return False
        elif isinstance(node, Repeat):
            if node.min and not (yield prod(node.item, depth + 1)):
                return False
        elif isinstance(node, Escaped):
            if not (yield prod(node.item, depth + 1)):
                return False
        elif isinstance(node, Members):
            for x, req in node.items:
                if req and not (yield prod(x, depth + 1)):
                    return False
        else:
            return False
        yes.add(id(node))
        return True

    def fast(node: Node, depth: int = 0) -> bool:
        """prod by plain recursion, for the first levels (most grammars end there); deeper, the walk."""
        t = type(node)
        if depth >= FAST_DEPTH or t not in _FAST_TYPES:
            return run(prod(node, depth))  # (or a subclass: the walk's isinstance tests decide)
        b.tick()
        if t is Chars or t is Auto:
            return True
        if t is Ref:
            return ok.get(node.name, False)
        if id(node) in yes:
            return True
        if t is Seq:
            for x in node.items:
                if not fast(x, depth + 1):
                    return False
        elif t is Alt:
            for x in node.items:
                if fast(x, depth + 1):
                    break
            else:
                return False
        elif t is Members:
            for x, req in node.items:
                if req and not fast(x, depth + 1):
                    return False
        elif t is Repeat:
            if node.min and not fast(node.item, depth + 1):
                return False
        elif not fast(node.item, depth + 1):  # Escaped
            return False
        yes.add(id(node))
        return True

    # rule -> how many of the rules it refers to are not known productive yet (with `with_nothing`)
    waits = {} if with_nothing is None else {x: len(refs[x]) for x in g.rules if x not in with_nothing}

    def mark(name: str, found: list[str]) -> None:
        """`name` is productive, and so is every rule of `waits` left waiting on nothing else."""
        stack = [name]
        while stack:
            x = stack.pop()
            ok[x] = True
            found.append(x)
            for y in referrers.get(x, ()):
                if not ok[y] and y in waits:
                    waits[y] -= 1
                    if not waits[y]:
                        stack.append(y)

    found: list[str] = []
    for name in [x for x, n in waits.items() if not n]:
        mark(name, found)
    todo = list(g.rules) if with_nothing is None else _after_their_references(g, refs)
    while todo:
        found = []
        for name in todo:
            if not ok[name]:
                b.where = f"rule {name!r}"
                if fast(g.rules[name]):
                    mark(name, found)
        again = {y for x in found for y in referrers.get(x, ()) if not ok[y]}
        todo = sorted(again, key=order.__getitem__)
    # prod, prod_parts and fast refer to each other: without this the cycle keeps the grammar for the collector
    # to find
    prod = fast = None  # noqa: F811
    b.where = ""
    return ok


def _after_their_references(g: Grammar, refs: dict[str, set[str]]) -> list[str]:
    """The rules in a depth-first post-order of the reference graph: each after the rules it refers to, but
    for the references that close a cycle."""
    out: list[str] = []
    met: set[str] = set()
    for root in g.rules:
        if root in met:
            continue
        met.add(root)
        stack = [(root, iter(refs[root]))]
        while stack:
            name, it = stack[-1]
            for r in it:
                if r not in met:
                    met.add(r)
                    stack.append((r, iter(refs[r])))
                    break
            else:
                stack.pop()
                out.append(name)
    return out


def prune_unproductive(
    g: Grammar,
    ok: dict[str, bool],
    refs: dict[str, set[str]] | None = None,
    with_nothing: set[str] | None = None,
) -> Grammar:
    """The same language without the rules that derive nothing: references to them become the empty
    language, which removes the sequences holding them and the alternatives they are. Every path left in
    the automaton can then finish, so it needs no trimming pass.

    `refs` and `with_nothing`, from rule_refs(g, with_nothing): a kept rule that refers only to productive
    rules and holds no empty alternative would come out of the walk with nothing removed (only rebuilt), so
    it is kept as it is, unwalked, and a dropped rule is not walked either. Most grammars with an
    unproductive rule have one, named by a few rules, and walking every rule took a third or more of their
    byte automaton's build."""
    memo: dict[int, Node] = {}
    current_rule = [""]
    b = current()

    def p(node: Node):
        """`node` pruned (the memo's node, or a node without parts), or the walk (walk.run) that prunes it."""
        hit = memo.get(id(node))
        if hit is not None:
            return hit
        if isinstance(node, (Seq, Alt, Repeat, Escaped, Members)):
            return prune(node)
        b.spend(1)  # the memo entry
        r: Node = node
        if isinstance(node, Ref):
            if node.name not in ok:
                raise GrammarError(f"rule {current_rule[0]!r} references undefined rule(s): {node.name}")
            r = node if ok[node.name] else NOTHING
        memo[id(node)] = r
        return r

    def prune(node: Node):
        b.spend(1)  # the memo entry, and perhaps a new node
        r: Node = node
        if isinstance(node, Seq):
            items = []
            for x in node.items:
                items.append((yield p(x)))
            if any(x is NOTHING for x in items):
                r = NOTHING
            elif any(x is not y for x, y in zip(items, node.items, strict=True)):
                r = Seq(tuple(items))
        elif isinstance(node, Alt):
            items = []
            for y in node.items:
                x = yield p(y)
                if x is not NOTHING:
                    items.append(x)
            if not items:
                r = NOTHING
            elif len(items) != len(node.items) or any(
                x is not y for x, y in zip(items, node.items, strict=True)
            ):
                r = items[0] if len(items) == 1 else Alt(tuple(items))
        elif isinstance(node, Repeat):
            it = yield p(node.item)
            if it is NOTHING:
                r = EMPTY if node.min == 0 else NOTHING
            elif it is not node.item:
                r = Repeat(it, node.min, node.max)
        elif isinstance(node, Escaped):
            it = yield p(node.item)
            r = NOTHING if it is NOTHING else node if it is node.item else Escaped(it)
        elif isinstance(node, Members):
            items = []
            for x, req in node.items:
                px = yield p(x)
                if px is NOTHING:
                    if req:
                        r = NOTHING
                        break
                    continue
                items.append((px, req))
            else:
                extra = None if node.extra is None else (yield p(node.extra))
                sep = yield p(node.sep)
                if extra is NOTHING:
                    extra = None
                # A separator that derives nothing is not something a front end builds: left as it is.
                if sep is not NOTHING:
                    r = Members(tuple(items), extra, sep, node.min, node.max, node.any_order)
        memo[id(node)] = r
        return r

    # Without `refs`, every rule is walked, the dropped ones too, so an undefined reference anywhere is still an
    # error (with them, rule_refs has checked that).
    rules = {}
    for name, node in g.rules.items():
        if refs is not None and with_nothing is not None:
            if not ok[name]:
                continue  # dropped
            if name not in with_nothing and all(ok[r] for r in refs[name]):
                rules[name] = node
                continue
        current_rule[0] = name
        b.where = f"rule {name!r}"
        pruned = run(p(node))
        if ok[name]:
            rules[name] = pruned
    p = None  # p and prune refer to each other: drop the cycle (it holds the memo of every node) now
    return dataclasses.replace(g, rules=rules)
