"""A compile runs in a worker thread beside the serving threads: it must not change process-wide interpreter
state (the garbage collector, the recursion limit). The serving process sets the collector once
(`server.runtime.settle_heap`)."""

from __future__ import annotations

import gc
import sys

import pytest

from tokenseam.grammar import GrammarCompiler, GrammarError


def test_a_compile_leaves_the_collector_and_recursion_limit_alone(smollm2_vocab, monkeypatch):
    calls = []
    monkeypatch.setattr(gc, "disable", lambda: calls.append("gc.disable"))
    monkeypatch.setattr(gc, "set_threshold", lambda *a: calls.append("gc.set_threshold"))
    monkeypatch.setattr(sys, "setrecursionlimit", lambda n: calls.append("setrecursionlimit"))
    deep: dict = {"type": "integer"}
    for _ in range(60):
        deep = {
            "type": "object",
            "properties": {"a": {"anyOf": [deep, {"type": "null"}]}, "b": {"type": "string"}},
        }
    c = GrammarCompiler(smollm2_vocab, cache_size=1)
    for schema in (deep, {"type": "array", "items": {"$ref": "#"}}):
        try:
            c.compile_json_schema(schema)
        except GrammarError:
            pass
    c.compile_gbnf('root ::= "(" root ")" | "x"')
    assert calls == []


def test_settle_heap_freezes_and_raises_the_thresholds():
    pytest.importorskip("llama_cpp")
    from tokenseam.server.runtime import SERVING_GC_THRESHOLDS, settle_heap

    before = gc.get_threshold()
    try:
        settle_heap()
        assert gc.get_threshold() == SERVING_GC_THRESHOLDS and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
