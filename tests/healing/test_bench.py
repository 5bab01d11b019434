"""`tokenseam bench healing` runs end to end on a small slice and writes consistent JSON (no timing asserts)."""

from __future__ import annotations

import json

import pytest

from tokenseam.cli import main


def test_bench_healing_small(tmp_path, capsys):
    out = tmp_path / "healing.json"
    rc = main(
        ["bench", "healing", "--models", "smollm2", "--repeats", "1", "--limit", "15", "--out", str(out)]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "token healing" in printed and "per token" in printed
    data = json.loads(out.read_text())
    (r,) = data["results"]
    assert r["model"] == "smollm2" and r["vocab_size"] == 49152
    assert r["boundary"]["prompts"] == 21 and r["realistic"]["prompts"] == 15
    assert r["boundary"]["canonical_with_healing"] == 1.0
    assert r["boundary"]["canonical_without_healing"] < 1.0
    heads = r["rag_key_reuse"]["heads"]
    assert len(heads) == 4 and r["rag_key_reuse"]["chunks"] == 50
    for h in heads:
        assert h["join_stable_equals_full_tokenization"] == 1.0
        assert 0 < h["stable_tokens"] <= h["head_tokens"]
        assert h["mean_reuse_with_healing"] == pytest.approx(h["stable_tokens"] / h["head_tokens"])
    for wl in ("boundary", "realistic"):
        h = r[wl]["healing"]
        assert h["n"] == r[wl]["prompts"] and 0 < h["p50_us"] <= h["p99_us"] <= h["max_us"]


def test_bench_healing_bad_arguments(tmp_path, capsys):
    assert main(["bench", "healing", "--repeats", "0", "--out", str(tmp_path / "x.json")]) == 2
    assert main(["bench", "healing", "--models", "nope", "--out", str(tmp_path / "x.json")]) == 2
    assert "no model" in capsys.readouterr().err
