"""The compile budget: hostile grammars stop within twice the time budget, with bounded memory, and the
checkpoint names the limit and where it ran out; the budget yields the GIL while it runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import types

import pytest

from tokenseam.bench.faults import allof_tree, gbnf_chain
from tokenseam.grammar import GrammarCompiler, GrammarError, budget

TIME_BUDGET = 2.0
# Unbudgeted, these compiles run for minutes or exhaust memory; the bound leaves a busy machine room.
BOUND = 4 * TIME_BUDGET


def anyof_required(n: int = 18) -> dict:
    """anyOf under an object at every level: each branch is merged with the level above, and the required
    lists of the 2**n paths all differ, so no merged schema is ever met twice."""
    defs = {
        f"d{i}": {
            "type": "object",
            "anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}", "required": [f"y{i}"]}],
        }
        for i in range(n)
    }
    defs[f"d{n}"] = {"type": "object", "properties": {"z": {"type": "integer"}}}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def enum_over_allof_tree() -> dict:
    """The same tree, reached only by the validator that checks an enum value (exponential in jsonschema)."""
    tree = allof_tree()
    return {"enum": [{"a": 1}], "properties": {"a": {"$ref": "#/$defs/d0"}}, "$defs": tree["$defs"]}


# Cases that must end with a GrammarError (a budget, or another limit the work reaches first).
MUST_FAIL = {
    "allOf tree": lambda c: c.compile_json_schema(allof_tree()),
    "anyOf cross product": lambda c: c.compile_json_schema(anyof_required()),
    # Overlapping object branches: each is made exclusive of the 299 others (oneOf disjointness).
    "oneOf of 300 overlapping objects": lambda c: c.compile_json_schema(
        {
            "oneOf": [
                {"type": "object", "required": [f"k{i}"], "properties": {f"k{i}": {"type": "integer"}}}
                for i in range(300)
            ]
        }
    ),
    "allOf of anyOfs": lambda c: c.compile_json_schema(
        {"allOf": [{"anyOf": [{"type": "string", "minLength": i + j} for j in range(2)]} for i in range(30)]}
    ),
    "enum checked over an allOf tree": lambda c: c.compile_json_schema(enum_over_allof_tree()),
    "2,000 patternProperties": lambda c: c.compile_json_schema(
        {"type": "object", "patternProperties": {f"^p{i}_[a-z]+$": {"type": "integer"} for i in range(2000)}}
    ),
    "pattern repeat nest with maxLength": lambda c: c.compile_json_schema(
        {"type": "string", "pattern": "^((a{1,100}){1,100}){1,100}$", "maxLength": 5000}
    ),
    "GBNF chain left-recursive": lambda c: c.compile_gbnf(gbnf_chain("left-recursive")),
    "choice list of 60,000 three-character options": lambda c: c.compile_choice(
        [chr(0x4E00 + i) * 3 for i in range(60_000)]
    ),
}
# Cases that may compile: they must finish, either way, within the bound.
MAY_COMPILE = {
    "GBNF chain cyclic": lambda c: c.compile_gbnf(gbnf_chain("cyclic")),
    "GBNF chain nullable": lambda c: c.compile_gbnf(gbnf_chain("nullable")),
    # Rules inlined 10,000 deep (a{10001}, or "a" behind 10,000 alternatives): the lowering walks them.
    "GBNF chain left": lambda c: c.compile_gbnf(gbnf_chain("left")),
    "GBNF chain right": lambda c: c.compile_gbnf(gbnf_chain("right")),
    "GBNF chain alt": lambda c: c.compile_gbnf(gbnf_chain("alt")),
    # Each rule called twice: its rules are called, not copied (a string of 2**10,000 characters, one
    # call frame per rule).
    "GBNF chain double": lambda c: c.compile_gbnf(gbnf_chain("double")),
    "GBNF repeat nest": lambda c: c.compile_gbnf('root ::= (("a"{1000}){1000}){1000}'),
    "GBNF repeat nest over rules": lambda c: c.compile_gbnf(
        'root ::= x{1000}\nx ::= y{1000}\ny ::= "a"{1000}'
    ),
    "regex repeat nest": lambda c: c.compile_regex("((a{1,100}){1,100}){1,100}"),
    "choice list of 20,000 options": lambda c: c.compile_choice([f"opt {i}" for i in range(20_000)]),
}


@pytest.fixture
def small_budget(smollm2_vocab):
    return GrammarCompiler(smollm2_vocab, cache_size=1, time_budget=TIME_BUDGET)


@pytest.mark.parametrize("name", sorted(MUST_FAIL))
def test_hostile_compile_fails_within_the_bound(small_budget, name):
    t = time.monotonic()
    with pytest.raises(GrammarError) as info:
        MUST_FAIL[name](small_budget)
    elapsed = time.monotonic() - t
    assert elapsed < BOUND, (name, elapsed, str(info.value))
    assert str(info.value)


@pytest.mark.parametrize("name", sorted(MAY_COMPILE))
def test_hostile_compile_ends_within_the_bound(small_budget, name):
    t = time.monotonic()
    try:
        MAY_COMPILE[name](small_budget)
    except GrammarError as exc:
        assert str(exc)
    assert time.monotonic() - t < BOUND, name


def test_time_budget_message_names_the_limit_and_the_place(small_budget):
    with pytest.raises(GrammarError, match=r"time budget \(2 s\) while checking enum/const values"):
        small_budget.compile_json_schema(enum_over_allof_tree())


def test_size_budget_message_names_the_limit_and_the_pointer(smollm2_vocab):
    c = GrammarCompiler(smollm2_vocab, cache_size=1, time_budget=60, size_budget=100_000)
    with pytest.raises(GrammarError) as info:
        c.compile_json_schema(allof_tree())
    msg = str(info.value)
    assert "size budget (100,000 units" in msg and "while merging allOf at #/$defs/d0/allOf/" in msg, msg


def test_size_budget_names_the_rule(smollm2_vocab):
    c = GrammarCompiler(smollm2_vocab, cache_size=1, time_budget=60, size_budget=20_000)
    words = " ".join(f'"w{i}"' for i in range(5000))
    with pytest.raises(GrammarError, match=r"size budget .* while building the byte automaton at rule 'big'"):
        c.compile_gbnf(f"root ::= big big\nbig ::= {words}")


def test_a_compile_under_the_default_budget_is_unaffected(compiler):
    # The default limits leave room for an ordinary schema (MaskBench is checked in test_maskbench).
    assert GrammarCompiler(compiler.vocab).time_budget is None
    compiler.compile_json_schema(
        {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 20} for i in range(300)}}
    )


def test_checkpoint_reads_resident_memory_once_per_interval(monkeypatch):
    # A clock the test drives: the count of reads follows from it, not from how fast this machine is.
    clock = [0.0]
    reads = []
    monkeypatch.setattr(budget, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(budget, "resident_bytes", lambda: reads.append(clock[0]) or 1)
    b = budget.CompileBudget(seconds=60, rss_limit=1 << 40)
    for _ in range(100):
        clock[0] += budget.RSS_CHECK_SECONDS * 0.3
        b.tick(budget.CHECK_EVERY)
    assert len(reads) == 25  # every fourth checkpoint is 1.2 intervals after the last read
    reads.clear()
    free = budget.CompileBudget(seconds=60)  # no cap: memory is never read
    for _ in range(100):
        clock[0] += budget.RSS_CHECK_SECONDS
        free.tick(budget.CHECK_EVERY)
    assert reads == []


def test_a_long_compile_never_sleeps(small_budget, monkeypatch):
    # A clock the test drives: the compile reaches its time budget after about 400 checkpoints on any machine,
    # long before its size budget (a fast machine reached that first on the wall clock). The interpreter's
    # switch interval, not the compile, hands the GIL to the server's other threads.
    clock = [0.0]
    calls = []

    def monotonic() -> float:
        clock[0] += budget.RSS_CHECK_SECONDS / 2
        return clock[0]

    monkeypatch.setattr(budget, "time", types.SimpleNamespace(monotonic=monotonic, sleep=calls.append))
    with pytest.raises(GrammarError, match="time budget"):
        small_budget.compile_json_schema(allof_tree())
    assert calls == []


def test_outside_a_compile_the_budget_counts_nothing_and_never_sleeps(monkeypatch):
    # Request-time work (the automaton's lazy states) reports to it, and must not pay for yields.
    calls = []
    monkeypatch.setattr(budget, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=calls.append))
    b = budget.current()
    for _ in range(3):
        b.tick(10 * budget.CHECK_EVERY)
        b.spend(10 * budget.CHECK_EVERY)
        time.sleep(2 * budget.RSS_CHECK_SECONDS)
    assert calls == [] and b.size_used == 0 and b.work == 0


def test_nested_budgets_share_the_outer_one():
    with budget.compile_budget(5.0, 1000) as outer:
        with budget.compile_budget(100.0, 10**9) as inner:
            assert inner is outer
        outer.spend(999)
        with pytest.raises(GrammarError, match="size budget"):
            outer.spend(budget.CHECK_EVERY)
    assert budget.current() is not outer


# -- memory, measured in a child process under an address-space limit -------------------------------------
CHILD = textwrap.dedent("""
    import json, resource, sys, time
    sys.path[:0] = {paths!r}
    from tokenseam.models import smollm2_path
    from tokenseam.vocab import Vocabulary
    from tokenseam.grammar import GrammarCompiler, GrammarError
    import test_budget as cases

    vocab = Vocabulary.from_gguf(smollm2_path())
    warm = GrammarCompiler(vocab, cache_size=1)
    warm.compile_json_schema({{"enum": [1], "minimum": 0, "properties": {{"a": {{"pattern": "^a+$"}}}}}})
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + {headroom}, vm + {headroom}))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for name, seconds in {runs!r}:
        c = GrammarCompiler(vocab, cache_size=1, time_budget=seconds)
        t = time.monotonic()
        try:
            schema = getattr(cases, name)()
            c.compile_json_schema(schema)
            outcome = "compiled"
        except GrammarError as exc:
            outcome = "GrammarError: " + str(exc)
        except MemoryError:
            outcome = "MemoryError"
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024
        print(json.dumps({{"case": name, "outcome": outcome, "seconds": time.monotonic() - t, "grown": grown}}),
              flush=True)
""")
HEADROOM = 2_500_000_000


def test_memory_stays_bounded_under_an_address_space_limit():
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [here, *[p for p in sys.path if p]]
    # The allOf tree with a long time budget meets the size budget (default limit), then the others as the
    # time tests run them.
    runs = [("allof_tree", 60.0), ("anyof_required", TIME_BUDGET), ("enum_over_allof_tree", TIME_BUDGET)]
    code = CHILD.format(paths=paths, headroom=HEADROOM, runs=runs)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["case"] for r in results] == [name for name, _ in runs], proc.stdout
    for r, (_, seconds) in zip(results, runs, strict=True):
        assert r["outcome"].startswith("GrammarError"), r
        assert r["seconds"] < 2 * seconds, r
        # The default size budget stands for 300-450 MB of compile data (budget.COMPILE_SIZE); the allOf
        # tree grew the process by 5 GB in 100 s before it.
        assert r["grown"] < 800_000_000, r
    assert "size budget" in results[0]["outcome"], results[0]


CAP_CHILD = """
import json, sys
sys.path[:0] = {paths!r}
from tokenseam.bench.faults import allof_tree
from tokenseam.grammar import GrammarCompiler, GrammarResourceError, budget
from tokenseam.models import smollm2_path
from tokenseam.vocab import Vocabulary

vocab = Vocabulary.from_gguf(smollm2_path())
out = {{}}
now = budget.resident_bytes()
for name, limit in (("growing", now + (64 << 20)), ("full", now // 2)):
    try:
        GrammarCompiler(vocab, cache_size=1, time_budget=20, rss_limit=limit).compile_json_schema(
            allof_tree() if name == "growing" else {{"type": "integer"}})
        out[name] = "compiled"
    except GrammarResourceError as exc:
        out[name] = "GrammarResourceError: " + str(exc)
    except Exception as exc:
        out[name] = type(exc).__name__ + ": " + str(exc)
print(json.dumps(out))
"""


def test_memory_cap_stops_a_growing_compile_and_refuses_a_new_one():
    # In a fresh process: one that has freed memory before reuses it without its resident size growing.
    paths = [p for p in sys.path if p]
    proc = subprocess.run(
        [sys.executable, "-c", CAP_CHILD.format(paths=paths)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # a cap just above the memory at start: the allOf tree grows past it long before its size budget
    assert out["growing"].startswith("GrammarResourceError") and "memory cap" in out["growing"], out
    # a cap already passed: nothing is compiled
    assert out["full"].startswith("GrammarResourceError") and "no grammar is compiled" in out["full"], out


def test_the_byte_nfa_state_cap_and_its_charges_fall_where_they_did(monkeypatch):
    """ByteNFA.add checks only at block ends and at the cap: the cap is still exact (state MAX_STATES is
    refused, the one before it made), and each block of CHARGE_BLOCK states is charged once."""
    from tokenseam.grammar import nfa as nfa_mod
    from tokenseam.grammar.budget import compile_budget as budget_of

    monkeypatch.setattr(nfa_mod, "MAX_STATES", 1000)
    a = nfa_mod.ByteNFA()
    with budget_of(10, None, None) as b:
        spent0 = b.size_used
        with pytest.raises(GrammarError, match="more than 1000 automaton states"):
            while True:
                a.add()
        assert a.size == 1000
        assert b.size_used - spent0 == (1000 // nfa_mod.CHARGE_BLOCK) * 4 * nfa_mod.CHARGE_BLOCK


def test_add_many_is_budgeted_and_capped_like_single_adds(monkeypatch):
    """ByteNFA.add_many(k) numbers, charges and caps its states as k calls of add() do."""
    from tokenseam.grammar import nfa as nfa_mod
    from tokenseam.grammar.budget import compile_budget

    def run(step_sizes):
        with compile_budget(None, 10**9) as b:
            nfa = nfa_mod.ByteNFA()
            firsts = []
            for k in step_sizes:
                firsts.append(nfa.add_many(k) if k != 1 else nfa.add())
            return firsts, nfa.size, b.size_used

    sizes = [1, 5, 63, 1, 64, 130, 2, 1, 200]
    firsts, size, used = run(sizes)
    assert firsts == [sum(sizes[:i]) for i in range(len(sizes))]
    assert (size, used) == run([1] * sum(sizes))[1:]
    monkeypatch.setattr(nfa_mod, "MAX_STATES", 300)
    with compile_budget(None, 10**9):
        nfa = nfa_mod.ByteNFA()
        nfa.add_many(299)
        with pytest.raises(GrammarError, match="more than 300 automaton states"):
            nfa.add_many(2)
