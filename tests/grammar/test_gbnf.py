"""GBNF front end: llama.cpp's example grammars compile unchanged, accept/refuse the right texts, generate
well-formed output under adversarial sampling; malformed grammars raise GrammarError with a location."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tokenseam.grammar import GrammarError

from .conftest import accepts_text, sample

HERE = Path(__file__).parent / "gbnf"
NAMES = ["json", "arithmetic", "list", "chess", "japanese", "c"]

TEXTS = {
    "json": (
        ['{"a": [1, 2.5e3, "x\\n"], "b": {"c": null}}', "{}", '{"k":true}'],
        ["[1]", '{"a" 1}', "{'a': 1}", '{"a": 01}'],
    ),
    "arithmetic": (["x=1\n", "(a +b)*3 = y\n1=2\n"], ["x=1", "=1\n", "(a=1\n"]),
    "list": (["- milk\n- eggs\n"], ["- milk", "* milk\n", "- a\rb\n"]),
    "chess": (
        ["1. e4 e5\n2. Nf3 Nc6\n", "1. e4 e5\n2. O-O-O Qxd8#\n"],
        ["1. e4 e5\n", "1. e9 e5\n2. a3 a4\n"],
    ),
    "japanese": (["こんにちは 世界", "カタカナ、ひらがな"], ["hello", "こんにちは  世界", ""]),
    "c": (
        ["int main(){return 0;}", "int f(int x){while(x<10){x = x+1;}return x;}"],
        ["int main(){return 0}", "main(){}"],
    ),
}
PYREGEX = {
    "list": r"(- [^\r\n\x0b\x0c\x85\u2028\u2029]+\n)+",
    "chess": r"1\. M M\n([1-9][0-9]?\. M M\n)+".replace(
        "M", r"(?:(?:(?:[a-h]x)?[a-h][1-8](?:=[NBKQR])?|[NBKQR][a-h]?[1-8]?x?[a-h][1-8]|O-O(?:-O)?)[+#]?)"
    ),
    "japanese": r"[ぁ-ゟァ-ヿ、-〾一-鿿]+([ \t\n][ぁ-ゟァ-ヿ、-〾一-鿿]+)*",
}


def _load(name: str) -> str:
    return (HERE / f"{name}.gbnf").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", NAMES)
def test_example_grammar_texts(compiler, name):
    g = compiler.compile_gbnf(_load(name))
    assert not g.warnings
    good, bad = TEXTS[name]
    for t in good:
        assert accepts_text(g, t), t
    for t in bad:
        assert not accepts_text(g, t), t


@pytest.mark.parametrize("name", NAMES)
def test_example_grammar_generation(compiler, smollm2_vocab, name):
    g = compiler.compile_gbnf(_load(name))
    rng = np.random.default_rng(7)
    for mode in ("random", "long", "close"):
        out, done = sample(g, smollm2_vocab, rng, 150, mode)
        text = out.decode("utf-8")
        if done:
            if name == "json":
                assert isinstance(json.loads(text), dict)
            if name in PYREGEX:
                assert re.fullmatch(PYREGEX[name], text), text
            if name in ("arithmetic", "c"):
                assert text.count("(") == text.count(")")


def test_example_grammars_on_gemma(gemma_compiler, gemma3_vocab):
    rng = np.random.default_rng(3)
    for name in NAMES:
        g = gemma_compiler.compile_gbnf(_load(name))
        sample(g, gemma3_vocab, rng, 60, "random")


@pytest.mark.parametrize(
    "text,needle",
    [
        ('root = "a"', "'::='"),
        ("root ::= foo", "undefined"),
        ('root ::= "abc', "unterminated string"),
        ("root ::= [abc", "unterminated character class"),
        ('root ::= root "a" | "a"', "left-recursive"),
        ('root ::= a\na ::= b? a "x"\nb ::= "y"', "left-recursive"),
        ('start ::= "a"', "no 'root'"),
        ('root ::= "a"{3,1}', "bad repetition"),
        ('root ::= "a"{1000000}', "too large"),
        ("root ::= <think>", "token references"),
        ("", "no rules"),
        ('root ::= "a"\nroot ::= "b"', "defined twice"),
        ('root ::= ("a"', "expected ')'"),
        ('root ::= "\\q"', "unknown escape"),
        ("root ::= [z-a]", "end before start"),
        ('root ::= "a" @', "unexpected character"),
        ("root ::= x\nx ::= x", "left-recursive"),
    ],
)
def test_malformed_gbnf(compiler, text, needle):
    with pytest.raises(GrammarError) as ei:
        compiler.compile_gbnf(text)
    assert needle in str(ei.value)


def test_nested_repeats_are_bounded(compiler):
    # Large counts are counted lazily (a counter on the stack), not unrolled: compile stays small.
    g = compiler.compile_gbnf('root ::= ("a"{0,1000} "b"){0,1000}')
    assert g.automaton.nfa.size < 10_000
    assert accepts_text(g, ("a" * 1000 + "b") * 3)
    assert not accepts_text(g, "a" * 1001 + "b")
    with pytest.raises(GrammarError, match="too large"):
        compiler.compile_gbnf('root ::= (("a" | "b"?){0,99999}){0,99999}')


def test_recursion_depth_is_unbounded(compiler):
    g = compiler.compile_gbnf('root ::= "(" root ")" | "x"')
    assert accepts_text(g, "(" * 300 + "x" + ")" * 300)
    assert not accepts_text(g, "(" * 300 + "x" + ")" * 299)


def test_rules_that_never_finish_are_dropped_exactly(compiler):
    """`x` can never finish, so `root` is just "a": "b" must be refused outright, not accepted into a dead end."""
    g = compiler.compile_gbnf('root ::= "a" | x\nx ::= "b" x\n')
    assert accepts_text(g, "a")
    assert not accepts_text(g, "b")
    from tokenseam.grammar import GrammarMatcher

    assert not GrammarMatcher(g).accept_bytes(b"b")
    assert not g.automaton.nfa.may_dead_end
    assert len(g.warnings) == 1 and "'x' can never finish" in g.warnings[0]
    assert not compiler.compile_gbnf('root ::= "a" | x\nx ::= "b" x | "c"\n').warnings


def test_lowering_leaves_the_recursion_limit_alone(monkeypatch):
    """build_nfa walks deep rules with explicit stacks: it never changes the process-wide recursion limit
    (compiles run in threads beside the server), and lowers rules however deep (the size estimate, which
    recurses, runs only once the automaton is large: below)."""
    import sys

    from tokenseam.grammar.gbnf import parse_gbnf
    from tokenseam.grammar.ir import NOTHING, Alt, Grammar, Ref, Seq, lit
    from tokenseam.grammar.nfa import build_nfa

    def refuse(n):
        raise AssertionError("sys.setrecursionlimit called")

    monkeypatch.setattr(sys, "setrecursionlimit", refuse)
    nfa = build_nfa(parse_gbnf("root ::= " + '("a" ' * 150 + ")" * 150 + " | dead\ndead ::= dead"))
    assert nfa.size > 150
    node = lit("x")
    for _ in range(240):  # 480 nodes deep, with an unproductive rule to prune at each level
        node = Alt((Seq((lit("a"), node)), Ref("dead"), NOTHING))
    assert build_nfa(Grammar({"root": node, "dead": Ref("dead")}, "root")).size > 240


def test_size_estimate_nests_to_its_bound_in_a_small_thread_stack(monkeypatch):
    """The NFA builder's size estimate recurses (it refuses past 200 levels, so it never goes deeper): 200
    levels pass and 202 are refused, under a low recursion limit and in a thread with a small stack, as
    compiles run in threads beside the server. (It runs once the automaton reaches nfa.LARGE_NFA states: here
    at once.)"""
    import sys
    import threading

    from tokenseam.grammar import nfa as nfa_module
    from tokenseam.grammar.budget import compile_budget
    from tokenseam.grammar.ir import Grammar, Seq, lit
    from tokenseam.grammar.nfa import build_nfa

    monkeypatch.setattr(nfa_module, "LARGE_NFA", 0)

    def nested(levels):
        node = lit("x")
        for _ in range(levels):
            node = Seq((lit("a"), node))
        return Grammar({"root": node}, "root")

    results = []

    def run():
        with compile_budget(10, None, None):
            results.append(build_nfa(nested(199)).size)
            try:
                build_nfa(nested(202))
            except GrammarError as exc:
                results.append(str(exc))

    old_limit, old_size = sys.getrecursionlimit(), threading.stack_size()
    sys.setrecursionlimit(400)
    threading.stack_size(256 * 1024)
    try:
        t = threading.Thread(target=run)
        t.start()
        t.join()
    finally:
        threading.stack_size(old_size)
        sys.setrecursionlimit(old_limit)
    assert len(results) == 2 and results[0] > 199
    assert "grammar nesting too deep" in results[1]


def test_whole_grammar_estimated_only_once_its_automaton_is_large(monkeypatch):
    """The builder estimates the start rule's size (and refuses a grammar past MAX_STATES with that figure)
    only when the NFA reaches LARGE_NFA states: a small grammar is never walked for it, a large one is refused
    with the estimate before it is lowered to the end."""
    from tokenseam.grammar import nfa as nfa_module
    from tokenseam.grammar.budget import compile_budget
    from tokenseam.grammar.json_schema import schema_to_grammar

    schema = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "maxLength": 5} for i in range(40)},
    }
    estimated = []
    real = nfa_module._Builder.estimate

    def spy(self, node):
        if node is self.g.rules[self.g.start]:
            estimated.append(self.nfa.size)
        return real(self, node)

    monkeypatch.setattr(nfa_module._Builder, "estimate", spy)
    with compile_budget(10, None, None):
        g = schema_to_grammar(schema)
        size = nfa_module.build_nfa(g).size
        assert estimated == [] and size < nfa_module.LARGE_NFA
        monkeypatch.setattr(nfa_module, "LARGE_NFA", 100)
        assert nfa_module.build_nfa(g).size == size and len(estimated) == 1 and 100 <= estimated[0] < size
        monkeypatch.setattr(nfa_module, "MAX_STATES", size - 1)
        with pytest.raises(
            GrammarError, match=rf"grammar too large \(about \d+ automaton states, limit {size - 1}\)"
        ):
            nfa_module.build_nfa(g)
        assert estimated[-1] < size - 1  # refused partway


@pytest.mark.parametrize(
    "schema",
    [
        {
            "$defs": {
                "d": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(30)}}
            },
            "type": "array",
            "items": [{"$ref": "#/$defs/d"}, {"$ref": "#/$defs/d"}],
        },
        {
            "type": "object",
            "properties": {
                "a": {"type": "array", "items": {"type": "integer"}, "maxItems": 9},
                "b": {"enum": ["x" * 40, "y" * 40]},
                "c": {"not": {"type": "null"}},
            },
        },
    ],
)
def test_size_bound_check_agrees_with_the_estimate(schema):
    """Whether a rule referenced from several places is called or copied is decided by `exceeds` (the
    estimate over a limit, with a walk that stops early): for every part of every rule, at the estimate
    itself, just under it and at fractions of it, it answers as the estimate does, before and after
    estimates are remembered."""
    from tokenseam.grammar.budget import compile_budget
    from tokenseam.grammar.json_schema import schema_to_grammar
    from tokenseam.grammar.nfa import _Builder
    from tokenseam.grammar.rulegraph import push_parts

    def parts(node):
        stack, seen = [node], set()
        while stack:
            x = stack.pop()
            if id(x) not in seen:
                seen.add(id(x))
                yield x
                push_parts(x, stack)

    checked = 0
    with compile_budget(10, None, None):
        g = schema_to_grammar(schema)
        for warm in (False, True):
            b = _Builder(g)
            if not warm:
                b.est_memo.clear()
            for body in g.rules.values():
                for node in parts(body):
                    fresh = _Builder(g)
                    fresh.est_memo.clear()
                    est = fresh.estimate(node)
                    for limit in {0, est // 4, est // 2, est - 2, est - 1, est, est + 1}:
                        if limit >= 0:
                            assert b.exceeds(node, limit) == (est > limit), (node, limit, warm)
                            checked += 1
    assert checked > 500


def test_left_recursion_is_looked_for_exactly_only_when_a_cycle_might_be_one(compiler, monkeypatch):
    """The check first takes every rule as nullable (more calls before the first byte, never fewer): no cycle
    then means no left recursion, without finding the nullable rules. A cycle there is checked exactly: a
    rule called after one that reads a byte is not left recursion, one after a nullable rule is."""
    from tokenseam.grammar import prepare

    exact = []
    real = prepare._nullable_rules
    monkeypatch.setattr(prepare, "_nullable_rules", lambda nfa: exact.append(1) or real(nfa))
    g = compiler.compile_json_schema(
        {
            "type": "object",
            "properties": {"a": {"$ref": "#"}, "b": {"type": "string"}},
            "additionalProperties": True,
        }
    )
    assert accepts_text(g, '{"a": {"b": "x"}, "c": [1]}') and exact == []
    # b is called (it is recursive) and reads "z" before a calls itself
    g = compiler.compile_gbnf('root ::= a\na ::= b a | "y"\nb ::= "z" | "z" b\n')
    assert accepts_text(g, "zzy") and not accepts_text(g, "zz") and exact == [1]
    with pytest.raises(GrammarError, match="rule 'a' is left-recursive"):
        compiler.compile_gbnf('root ::= a\na ::= b a | "y"\nb ::= ("z" b)?\n')
