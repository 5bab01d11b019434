"""MaskBench dev split, deterministic sample on SmolLM2's vocabulary: zero wrong accepts, no crashes or
timeouts, valid instances accepted to an accepting end. The full split is `tokenseam bench grammar`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenseam.bench.grammar import TokenseamEngine, load_files, run_file, summarize, tokenize_tests

DATA = Path(__file__).resolve().parents[3] / "shared" / "benchdata" / "maskbench-dev"
SAMPLE = 60


@pytest.mark.skipif(not DATA.is_dir(), reason="MaskBench dev split not present")
def test_maskbench_sample(smollm2_vocab, tokenizers):
    engine = TokenseamEngine(smollm2_vocab)
    results, times = [], []
    for path in load_files(DATA, SAMPLE):
        doc = json.loads(path.read_text())
        r = run_file(engine, doc["schema"], tokenize_tests(tokenizers["smollm2"], doc), 30.0, times)
        r["file"] = path.name
        results.append(r)
        assert engine.compiler.memory_stats()["cached_grammars"] == 0  # freed after the file, outside timing
    s = summarize("tokenseam", results, times, None)
    bad = [
        (r["file"], r["status"], r["error"])
        for r in results
        if r["wrong_accepts"] or r["status"] in ("crash", "timeout")
    ]
    assert s["wrong_accepts"] == 0 and s["crashes"] == 0 and s["timeouts"] == 0, bad
    # Regression floor: the sample passed 54/60 when this test was written.
    assert s["passing"] >= 0.75 * SAMPLE, s
