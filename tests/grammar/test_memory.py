"""The grammar memory budget (grammar/memory.py): the estimate follows what is really allocated, a stream of
distinct schemas stays within the budget, grammars in use are never evicted and keep giving exact masks, and a
budget spent mid-generation (grammars started over, masks not memoised) changes no mask and raises nothing."""

from __future__ import annotations

import gc
import json
import random
import tracemalloc

import numpy as np
import pytest

from tokenseam.grammar import GrammarCompiler, GrammarMatcher

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "n": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        "tags": {"type": "array", "items": {"enum": ["a", "bc", "d e"]}},
    },
    "required": ["name"],
}
DOC = json.dumps(
    {"name": "Alice Smith é", "n": [[1, 22], [3], []], "tags": ["bc", "d e"]}, ensure_ascii=False
)


def _compile(c: GrammarCompiler, kind: str, spec):
    return {"json": c.compile_json_schema, "regex": c.compile_regex, "gbnf": c.compile_gbnf}[kind](spec)


def _run(compiled, toks, vocab) -> list[bytes]:
    m = GrammarMatcher(compiled)
    out = np.zeros(vocab.mask_words, dtype=np.int32)
    trace = []
    for t in toks:
        m.fill_next_token_bitmask(out)
        trace.append(out.tobytes())
        assert m.accept_token(t)
    m.fill_next_token_bitmask(out)
    trace.append(out.tobytes())
    return trace


_random = random.Random(1)
ESTIMATE_CASES = [
    ("json", SCHEMA, DOC),
    ("json", {}, "[" * 60 + "1" + "]" * 60),
    (
        "regex",
        "[a-z ]{0,3000}",
        " ".join(
            "".join(_random.choice("abcdefgh") for _ in range(_random.randint(1, 9))) for _ in range(250)
        ),
    ),
    ("gbnf", 'root ::= "[" item ("," item)* "]"\nitem ::= root | [a-z]+\n', "[" * 80 + "ab" + "]" * 80),
]


@pytest.mark.parametrize("kind,spec,doc", ESTIMATE_CASES, ids=["schema", "nested", "counted", "gbnf"])
def test_estimate_follows_what_tracemalloc_measures(smollm2_vocab, tokenizers, kind, spec, doc):
    """CompiledGrammar.nbytes (per-entry constants and array sizes, no walk) is within 25 % of what the
    compile and two requests really allocated, on grammars whose memory goes to masks, states or stacks."""
    toks = tokenizers["smollm2"].encode(doc)
    _run(_compile(GrammarCompiler(smollm2_vocab), kind, spec), toks, smollm2_vocab)  # the vocabulary's tables
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        c = GrammarCompiler(smollm2_vocab)
        g = _compile(c, kind, spec)
        _run(g, toks, smollm2_vocab)
        _run(g, toks, smollm2_vocab)
        gc.collect()
        measured = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert 0.75 <= g.nbytes() / measured <= 1.25, (g.nbytes(), measured)
    assert c.memory_stats()["bytes"] == g.nbytes()


def _distinct_schema(k: int) -> tuple[dict, dict]:
    """The k-th schema of a stream that never repeats one, and a document it accepts."""
    props = {f"f{k}_{j}": {"type": ["integer", "string", "boolean"][(k + j) % 3]} for j in range(1 + k % 4)}
    doc = {
        name: {"integer": k * 7 + j, "string": f"v{k}-{j}", "boolean": bool(j % 2)}[p["type"]]
        for j, (name, p) in enumerate(props.items())
    }
    return {"type": "object", "properties": props, "required": list(props)}, doc


def test_a_stream_of_distinct_schemas_stays_within_the_budget(smollm2_vocab, tokenizers):
    """Each request compiles a new schema and generates its document under the masks: the grammars held stay
    within the budget after every step, unused ones are evicted, and the cache keeps the most recent."""
    budget = 3 << 20
    c = GrammarCompiler(smollm2_vocab, cache_bytes=budget)
    tok = tokenizers["smollm2"]
    peak = 0
    n = 80
    for k in range(n):
        schema, doc = _distinct_schema(k)
        g = c.compile_json_schema(schema)
        m = GrammarMatcher(g)
        out = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
        for t in tok.encode(json.dumps(doc)):
            m.fill_next_token_bitmask(out)
            assert out[t >> 5] >> (t & 31) & 1
            assert m.accept_token(t)
            peak = max(peak, c.memory_stats()["bytes"])
        assert m.is_accepting()
        del g, m
    st = c.memory_stats()
    assert peak <= budget, (peak, st)
    assert st["evictions"] > 0 and 0 < st["cached_grammars"] < n
    assert st["live_grammars"] == st["cached_grammars"]  # nothing else holds them: evicted means freed
    # the latest schema is still cached: compiling it again is a hit (nothing compiled, nothing evicted)
    again = c.compile_json_schema(_distinct_schema(n - 1)[0])
    assert again is next(reversed(c._cache.values())) and c.memory_stats()["evictions"] == st["evictions"]


def test_a_grammar_in_use_is_not_evicted(smollm2_vocab, tokenizers):
    """Under a budget every new compile spends, the grammar a live matcher uses stays cached (found again by
    the next compile of it); once the matcher is gone it is evicted like the others."""
    c = GrammarCompiler(smollm2_vocab, cache_bytes=1 << 20)
    g = c.compile_json_schema(SCHEMA)
    m = GrammarMatcher(g)
    assert m.accept_bytes(b'{"name": "x"')
    for k in range(30):
        c.compile_json_schema(_distinct_schema(k)[0])
        assert c.compile_json_schema(SCHEMA) is g
    assert c.memory_stats()["evictions"] > 0
    del m
    for k in range(30, 60):
        c.compile_json_schema(_distinct_schema(k)[0])
    assert c.compile_json_schema(SCHEMA) is not g


def test_clear_cache_drops_every_cached_grammar_and_spares_those_in_use(smollm2_vocab, tokenizers):
    c = GrammarCompiler(smollm2_vocab, cache_size=8)
    a, b = _distinct_schema(1), _distinct_schema(2)
    m = GrammarMatcher(c.compile_json_schema(a[0]))
    c.compile_json_schema(b[0])
    assert c.clear_cache() == 2 and c.memory_stats()["cached_grammars"] == 0
    assert c.clear_cache() == 0
    out = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
    for t in tokenizers["smollm2"].encode(json.dumps(a[1])):  # the matcher still has its grammar
        m.fill_next_token_bitmask(out)
        assert out[t >> 5] >> (t & 31) & 1 and m.accept_token(t)
    assert m.is_accepting()
    assert c.compile_json_schema(a[0]) is not m.compiled  # built again, and cached again
    assert c.memory_stats()["cached_grammars"] == 1
    del m
    gc.collect()
    assert c.memory_stats()["live_grammars"] == 1


def test_an_evicted_grammar_in_use_keeps_exact_masks(smollm2_vocab, tokenizers):
    """A grammar evicted as soon as it is compiled (the cache's one place holds a grammar in use) is still the
    caller's: a request on it gets the masks of a compiler that never evicted anything, while other grammars
    come and go beside it."""
    toks = tokenizers["smollm2"].encode(DOC)
    ref = _run(GrammarCompiler(smollm2_vocab).compile_json_schema(SCHEMA), toks, smollm2_vocab)
    c = GrammarCompiler(smollm2_vocab, cache_size=1, cache_bytes=2 << 20)
    busy = GrammarMatcher(c.compile_regex("[a-z]+"))
    g = c.compile_json_schema(SCHEMA)
    assert c.memory_stats()["evictions"] == 1 and c.compile_regex("[a-z]+") is busy.compiled
    m = GrammarMatcher(g)
    out = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
    trace = []
    for i, t in enumerate(toks):
        if i % 4 == 0:
            c.compile_json_schema(_distinct_schema(i)[0])
        m.fill_next_token_bitmask(out)
        trace.append(out.tobytes())
        assert m.accept_token(t)
    m.fill_next_token_bitmask(out)
    trace.append(out.tobytes())
    assert trace == ref
    assert c.compile_json_schema(SCHEMA) is not g  # never found again: compiled afresh
    del busy


@pytest.mark.parametrize("budget", [0, 400_000])
def test_a_budget_spent_mid_generation_changes_no_mask(smollm2_vocab, tokenizers, budget):
    """With a budget too small for one request, grammars are started over and masks computed unmemoised in
    the middle of the generation: no exception, the same masks as without a budget, rollbacks across a
    renewal included (they replay the committed bytes)."""
    toks = tokenizers["smollm2"].encode(DOC)

    def trace(c):
        m = GrammarMatcher(c.compile_json_schema(SCHEMA))
        out = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
        tr = []
        for i, t in enumerate(toks):
            m.fill_next_token_bitmask(out)
            tr.append(out.tobytes())
            assert m.accept_token(t)
            if i % 7 == 6:
                m.rollback(4)
                for t2 in toks[i - 3 : i + 1]:
                    m.fill_next_token_bitmask(out)
                    tr.append(out.tobytes())
                    assert m.accept_token(t2)
        m.fill_next_token_bitmask(out)
        tr.append(out.tobytes())
        tr.append(bytes([m.is_accepting(), m.is_terminated()]))
        return tr, m

    ref, _ = trace(GrammarCompiler(smollm2_vocab))
    c = GrammarCompiler(smollm2_vocab, cache_bytes=budget)
    got, m = trace(c)
    assert got == ref
    st = c.memory_stats()
    assert st["renewals"] > 0 and st["unmemoised_masks"] > 0 and m.compiled.generation > 0
    if budget:
        assert st["bytes"] <= budget


GRAMMARS = [
    ("json", SCHEMA, DOC),
    (
        "gbnf",
        'root ::= "[" item ("," item){0,20} "]"\nitem ::= root | [a-z]{1,30}\n',
        "[ab,[c,[d,x,y]],abcdefghijklmnop,e]",
    ),
    ("regex", "(ab|a)*c[0-9]{2,40}", "abaababc" + "1234567890" * 3),
]


@pytest.mark.parametrize("kind,spec,doc", GRAMMARS, ids=["schema", "counted-gbnf", "regex"])
def test_random_commits_and_rollbacks_across_renewals(smollm2_vocab, tokenizers, kind, spec, doc):
    """Random accepts (of the document's tokens and of tokens the mask refuses), rollbacks and raw-byte
    commits, with the grammar started over at random steps: every mask and answer equals an unbudgeted run's."""
    toks = tokenizers["smollm2"].encode(doc)
    rng = random.Random(7)
    script = []
    pos = 0
    for _ in range(120):
        r = rng.random()
        if r < 0.55 and pos < len(toks):
            script.append(("tok", toks[pos]))
            pos += 1
        elif r < 0.65:
            script.append(("tok", rng.randrange(smollm2_vocab.size)))
        elif r < 0.85 and pos:
            n = rng.randint(1, min(pos, 5))
            script.append(("rollback", n))
            pos -= n
        else:
            script.append(("renew", None))

    def play(c, renew: bool):
        g = _compile(c, kind, spec)
        m = GrammarMatcher(g)
        out = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
        accepted = 0
        tr = []
        for op, arg in script:
            if op == "renew":
                if renew:
                    g.renew()
                continue
            if op == "tok":
                ok = m.accept_token(arg)
                accepted += ok
                tr.append(ok)
            elif op == "rollback":
                n = min(arg, accepted)
                m.rollback(n)
                accepted -= n
            m.fill_next_token_bitmask(out)
            tr.append(out.tobytes())
            tr.append((m.is_accepting(), m.find_jump_forward_string()))
        return tr, g

    ref, _ = play(GrammarCompiler(smollm2_vocab), False)
    got, g = play(GrammarCompiler(smollm2_vocab), True)
    assert g.generation > 0
    assert got == ref


def test_renewal_in_the_reasoning_phase(smollm2_vocab):
    """A matcher still in its free (reasoning) phase when the grammar is started over enters the grammar of
    the new generation at its end tag."""
    c = GrammarCompiler(smollm2_vocab)
    g = c.compile_regex("[0-9]+")
    m = GrammarMatcher(g, reasoning_end="</think>")
    assert m.accept_bytes(b"thinking about it")
    g.renew()
    assert m.accept_bytes(b"</think>12") and m.is_accepting()
    assert m._auto is g.automaton
    assert not m.accept_bytes(b"x")


def test_budget_arguments_are_checked(smollm2_vocab):
    for bad in (-1, 1.5, "256", True):
        with pytest.raises(ValueError, match="cache_bytes"):
            GrammarCompiler(smollm2_vocab, cache_bytes=bad)
    st = GrammarCompiler(smollm2_vocab).memory_stats()
    assert st["budget_bytes"] == 256 << 20 and st["bytes"] == 0 and st["cached_grammars"] == 0


def test_the_memory_bench_runs_a_small_stream_within_its_budget():
    """`tokenseam bench grammar-memory` on 24 schemas, 3 at a time, 2 MB: every document is generated under
    the masks, the peak stays within the budget, and most grammars are evicted."""
    import jsonschema

    from tokenseam.bench.grammar_memory import distinct_schema, measure

    for k in range(5):
        schema, doc = distinct_schema(k)
        jsonschema.validate(doc, schema)
    res = measure("smollm2", 24, 2, 3, False)
    assert res["within_budget"] and res["peak_bytes"] <= 2 << 20
    assert res["final"]["evictions"] >= 10 and res["unbounded_bytes"] > res["peak_bytes"]
