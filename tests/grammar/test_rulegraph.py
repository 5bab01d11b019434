"""The rule graph the NFA builder starts from: which rules each rule refers to, and which are referred to more
than once (those the builder may call instead of copying)."""

from __future__ import annotations

import pytest

from tokenseam.grammar import GrammarError
from tokenseam.grammar.budget import compile_budget
from tokenseam.grammar.ir import NOTHING, Alt, Grammar, Members, Ref, Repeat, Seq, lit
from tokenseam.grammar.nfa import build_nfa
from tokenseam.grammar.rulegraph import productive, prune_unproductive, rule_refs


def _refs(rules: dict, start: str = "root"):
    with compile_budget(10, None, None):
        return rule_refs(Grammar(rules, start))


def test_references_per_rule_and_in_order_first_met():
    refs, multi = _refs(
        {
            "root": Seq((Ref("a"), Ref("b"), Ref("a"))),
            "a": lit("x"),
            "b": Alt((Ref("a"), Ref("c"))),
            "c": lit("y"),
        }
    )
    assert refs == {"root": {"a", "b"}, "a": set(), "b": {"a", "c"}, "c": set()}
    assert multi == ["a"]  # twice in root, once in b; b and c once each


def test_a_subtree_shared_within_a_rule_counts_once_per_parent():
    # One node object in two places of root: written out as a tree, `b` occurs twice.
    shared = Seq((lit("k"), Ref("b")))
    refs, multi = _refs({"root": Alt((shared, Repeat(shared, 0, 3))), "b": lit("v")})
    assert refs["root"] == {"b"}
    assert multi == ["b"]
    # Deeper: the shared node holds the reference two levels down, beside a Members node.
    inner = Members(((Ref("c"), True),), None, lit(","))
    outer = Seq((inner, lit("!")))
    _, multi = _refs({"root": Seq((outer, outer)), "c": lit("z")})
    assert multi == ["c"]


def test_a_subtree_shared_between_rules_counts_in_each():
    shared = Seq((Ref("c"), lit("q")))
    _, multi = _refs({"root": Seq((Ref("a"), shared)), "a": shared, "c": lit("z")})
    assert multi == ["c"]  # once under root, once under a
    _, multi = _refs({"root": Seq((Ref("a"), lit("q"))), "a": Ref("c"), "c": lit("z")})
    assert multi == []


def test_undefined_references_are_named():
    with pytest.raises(GrammarError, match=r"rule 'root' references undefined rule\(s\): nope"):
        _refs({"root": Seq((lit("a"), Ref("nope")))})
    with compile_budget(10, None, None), pytest.raises(GrammarError, match="undefined"):
        productive(Grammar({"root": Ref("gone")}, "root"))


def test_a_deep_dag_is_walked_as_a_graph():
    # 60 levels, each holding the level below twice: as a tree, 2**60 nodes.
    node = Ref("leaf")
    for _ in range(60):
        node = Seq((node, node))
    refs, multi = _refs({"root": node, "leaf": lit("x")})
    assert refs["root"] == {"leaf"} and multi == ["leaf"]


def test_productive_walks_a_shared_subtree_once_to_a_yes():
    # 60 levels, each holding the level below twice: a productive subtree is known as such once, so the check
    # does not walk the 2**60 paths of the tree it stands for.
    node = Ref("leaf")
    for _ in range(60):
        node = Seq((node, node))
    with compile_budget(10, None, None):
        assert productive(Grammar({"root": node, "leaf": lit("x")}, "root")) == {"root": True, "leaf": True}
    # A subtree shared by rules, first met before the rule it needs is known productive (a later round says
    # yes), beside rules that never derive a string.
    shared = Seq((lit("k"), Ref("late")))
    rules = {
        "root": Alt((Ref("dead"), shared)),
        "a": Seq((shared, Repeat(shared, 1, 2))),
        "dead": Seq((lit("d"), Ref("dead"))),
        "late": Ref("later"),
        "later": lit("v"),
        "gone": Seq((shared, Ref("dead"))),
    }
    with compile_budget(10, None, None):
        ok = productive(Grammar(rules, "root"))
    assert ok == {"root": True, "a": True, "dead": False, "late": True, "later": True, "gone": False}


@pytest.mark.parametrize("fast_depth", [0, 3, 60])
def test_productive_by_recursion_then_walk_answers_alike(monkeypatch, fast_depth):
    """The check recurses for its first FAST_DEPTH levels and walks below: at any split, the same answers,
    with rules 200 levels deep, members, escapes, repeats and a Chars subclass at every depth, and with the
    budget ticked per node as the walk ticks it."""
    from tokenseam.grammar import rulegraph
    from tokenseam.grammar.budget import current
    from tokenseam.grammar.ir import Escaped
    from tokenseam.grammar.regex import _Shorthand

    digit = _Shorthand(((48, 57),), ((48, 57),))  # a Chars subclass

    def deep(leaf, levels):
        node = leaf
        for k in range(levels):
            node = [
                Seq((lit("a"), node)),
                Alt((Ref("dead"), node)),
                Members(((node, True), (Ref("dead"), False)), None, lit(",")),
                Escaped(node),
                Repeat(node, 1, 3),
                Seq((digit, node)),
            ][k % 6]
        return node

    rules = {
        "root": deep(Ref("mid"), 200),
        "mid": deep(Seq((Ref("end"), Repeat(Ref("dead"), 0, 2))), 200),
        "end": lit("z"),
        "dead": deep(Ref("dead"), 150),
        "blocked": deep(Seq((Ref("mid"), Ref("dead"))), 120),
    }
    want = {"root": True, "mid": True, "end": True, "dead": False, "blocked": False}
    monkeypatch.setattr(rulegraph, "FAST_DEPTH", fast_depth)
    with compile_budget(10, None, None):
        before = current().work
        assert productive(Grammar(rules, "root")) == want
        spent = current().work - before
    monkeypatch.setattr(rulegraph, "FAST_DEPTH", 0)
    with compile_budget(10, None, None):
        before = current().work
        productive(Grammar(rules, "root"))
        assert current().work - before == spent


def test_rules_holding_an_empty_alternative_are_named():
    nothing_in: set[str] = set()
    with compile_budget(10, None, None):
        rule_refs(
            Grammar(
                {
                    "root": Seq((Ref("a"), Ref("b"))),
                    "a": Alt((lit("x"), Seq((lit("y"), NOTHING)))),
                    # an empty Alt of its own, as the extra member
                    "b": Members(((lit("v"), False),), Alt(()), lit(",")),
                    "c": Repeat(Alt((lit("p"), lit("q"))), 0, 2),
                },
                "root",
            ),
            nothing_in,
        )
    assert nothing_in == {"a", "b"}


def _prune_nfa(g: Grammar, *, skip: bool) -> tuple[Grammar, tuple]:
    with compile_budget(10, None, None):
        nothing_in: set[str] = set()
        refs, _ = rule_refs(g, nothing_in)
        ok = productive(g, refs)
        pruned = prune_unproductive(g, ok, refs, nothing_in) if skip else prune_unproductive(g, ok)
        nfa = build_nfa(pruned)
    return pruned, (nfa.n, tuple(nfa.e), tuple(nfa.ep), sorted(nfa.call.items()))


def test_pruning_keeps_the_rules_it_would_not_change_as_they_are():
    kept = Members(((lit("k"), True), (lit("m"), False)), Ref("tail"), lit(","))
    g = Grammar(
        {
            "root": Alt((Seq((lit("a"), Ref("uses_bad"))), Ref("clean"), Ref("dead_branch"))),
            "uses_bad": Alt((Seq((lit("b"), Ref("bad"))), lit("c"))),
            "bad": Seq((lit("x"), Ref("bad"))),  # derives no string
            "clean": Seq((lit("{"), kept, lit("}"))),
            "tail": lit("t"),
            # no unproductive reference, but a branch that can never finish: still rewritten
            "dead_branch": Alt((lit("d"), Seq((lit("e"), NOTHING)))),
        },
        "root",
    )
    fast, nfa_fast = _prune_nfa(g, skip=True)
    full, nfa_full = _prune_nfa(g, skip=False)
    assert "bad" not in fast.rules and list(fast.rules) == list(full.rules)
    assert fast.rules["clean"] is g.rules["clean"] and fast.rules["tail"] is g.rules["tail"]
    assert full.rules["clean"] is not g.rules["clean"]  # the walk rebuilds object nodes
    assert fast.rules["uses_bad"] == lit("c") == full.rules["uses_bad"]
    assert fast.rules["dead_branch"] == lit("d") == full.rules["dead_branch"]
    assert nfa_fast == nfa_full


def _productive_both_ways(rules: dict, start: str = "root") -> dict[str, bool]:
    g = Grammar(rules, start)
    with compile_budget(10, None, None) as b:
        nothing_in: set[str] = set()
        refs, _ = rule_refs(g, nothing_in)
        plain = productive(g, refs)
        work = b.work
        graph = productive(g, refs, nothing_in)
        walked = b.work - work
    assert graph == plain
    return graph, walked


def test_productive_from_the_reference_graph_answers_as_the_walk():
    ok, _ = _productive_both_ways(
        {
            "root": Alt((Ref("loop"), Ref("chain0"), Ref("holds_nothing"), Ref("never"))),
            "loop": Alt((Seq((lit("["), Ref("loop"), lit("]"))), lit("x"))),  # on a cycle, productive
            "chain0": Seq((lit("a"), Ref("chain1"))),
            "chain1": Seq((lit("b"), Ref("loop"))),
            "holds_nothing": Alt((lit("c"), NOTHING)),  # productive through its other branch
            "never": Seq((lit("n"), Ref("never"))),  # a cycle that never ends
            "needs_never": Seq((lit("m"), Ref("never"))),
            "uses_dead": Alt((Ref("needs_never"), lit("ok"))),
            "empty_only": Members(((NOTHING, True),), None, lit(",")),
        }
    )
    assert [x for x, v in ok.items() if not v] == ["never", "needs_never", "empty_only"]


def test_a_rule_whose_references_are_productive_is_not_walked():
    # A chain of 300 rules, each defined before the one it refers to (as a front end defines them), and one
    # rule on a cycle: only that one is walked.
    rules = {f"r{k}": Seq((lit("k"), Ref(f"r{k + 1}"))) for k in range(300)}
    rules["r300"] = Alt((Seq((lit("["), Ref("r300"), lit("]"))), lit("x")))
    rules["root"] = Ref("r0")
    ok, walked = _productive_both_ways(rules)
    assert all(ok.values())
    assert 0 < walked < 20
