"""Masks of stack-independent positions (local state + parent stack, escaping tokens resolved per parent)
checked token by token against a plain simulation of the pushdown NFA with full stacks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tokenseam.grammar import GrammarMatcher


def _oracle_start(auto):
    configs, acc, esc = auto.closure(auto.nfa.rule_start[0], 0)
    assert not esc
    return set(configs), acc


def _oracle_step(auto, configs, data: bytes):
    acc = False
    for b in data:
        nxt: set = set()
        acc = False
        for q, st in configs:
            for t in {t for lo, hi, t in auto.nfa.edges[q] if lo <= b <= hi}:
                cs, a, esc = auto.closure(t, st)
                assert not esc  # real stacks never reach the local bottom
                nxt.update(cs)
                acc = acc or a
        configs = nxt
        if not configs and not acc:
            return set(), False
    return configs, acc


def _indent_ok(data: bytes, limit: int | None) -> bool:
    """Every run of spaces/tabs after a raw newline is within the grammar's indentation limit."""
    return limit is None or all(len(x) - len(x.lstrip(b" \t")) <= limit for x in data.split(b"\n")[1:])


def _sample(vocab, seed: int) -> list[int]:
    """Tokens around structure (quotes, brackets, commas, colons, whitespace) plus a random spread."""
    rng = np.random.default_rng(seed)
    tb = vocab.token_bytes
    structural = [i for i in range(vocab.size) if not vocab.is_special[i] and tb[i]
                  and any(ch in tb[i] for ch in b'"{}[],: \n')]
    rest = [i for i in range(vocab.size) if not vocab.is_special[i] and tb[i]]
    pick = rng.choice(structural, size=min(1500, len(structural)), replace=False).tolist()
    pick += rng.choice(rest, size=500, replace=False).tolist()
    return sorted(set(pick))


def _check(compiled, vocab, text: str, cuts: list[int], seed: int = 0) -> None:
    m = GrammarMatcher(compiled)
    auto = m._auto
    data = text.encode("utf-8")
    tokens = _sample(vocab, seed)
    out = np.zeros(vocab.mask_words, dtype=np.int32)
    configs, acc = _oracle_start(auto)
    done = 0
    for cut in cuts:
        assert m.accept_bytes(data[done:cut])
        configs, acc = _oracle_step(auto, configs, data[done:cut])
        assert configs or acc
        done = cut
        assert m.is_accepting() == acc, (text[:cut], acc)
        m.fill_next_token_bitmask(out)
        bits = out.view(np.uint32)
        for tid in tokens:
            got = bool((bits[tid >> 5] >> (tid & 31)) & 1)
            c2, a2 = _oracle_step(auto, configs, vocab.token_bytes[tid])
            want = (bool(c2) or a2) and _indent_ok(data[:cut] + vocab.token_bytes[tid], auto.indent_limit)
            assert got == want, (text[:cut], vocab.token_bytes[tid], got, want)


DOC = '{"a": [1, {"b": "x\\"y", "c": [[], {}]}, "s"], "d": {"e": {"f": null}}, "g": -1.5e3}'


def _cuts(text: str) -> list[int]:
    """Positions right after each structural byte and inside strings and numbers."""
    data = text.encode()
    return sorted({k + 1 for k, ch in enumerate(data) if ch in b'{[,:"' or k % 7 == 0})


@pytest.mark.parametrize("schema,doc", [
    ({}, DOC),  # any JSON: a recursive rule, tokens escaping through called frames
    ({"type": "object", "additionalProperties": {"$ref": "#"}, "properties": {
        "a": {"type": "array", "maxItems": 20, "items": {}}, "g": {"type": "number"}}},
     '{"a": [1, {"b": "x"}, [[2]], "s"], "g": -1.5e3, "d": {"e": {"f": {}}, "h": {}}}'),
    # Indented layout: positions inside indentation runs, filtered by the run length so far.
    ({}, json.dumps(json.loads(DOC), indent=2)),
])
def test_positions_match_full_stack_simulation(compiler, smollm2_vocab, schema, doc):
    _check(compiler.compile_json_schema(schema), smollm2_vocab, doc, _cuts(doc))


def test_bounded_strings_in_bounded_arrays(compiler, smollm2_vocab):
    schema = {"type": "array", "maxItems": 15, "items": {
        "type": "object", "properties": {"k": {"type": "string", "maxLength": 14}},
        "required": ["k"], "additionalProperties": False}}
    doc = json.dumps([{"k": "abcdefghijklmn"[: (3 * i) % 15]} for i in range(14)])
    cuts = _cuts(doc)[::3]
    _check(compiler.compile_json_schema(schema), smollm2_vocab, doc, cuts, seed=1)


def test_recursive_gbnf(compiler, smollm2_vocab):
    g = compiler.compile_gbnf('root ::= list\nlist ::= "(" (item (" " item)*)? ")"\n'
                              'item ::= list | [a-z]+ | "\\"" [^"]* "\\""\n')
    text = '((ab (c "x y") ()) ("q" (((z)))))'
    _check(g, smollm2_vocab, text, list(range(1, len(text))), seed=2)
