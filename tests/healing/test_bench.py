"""`tokenseam bench healing` runs end to end on a small slice and writes consistent JSON (no timing asserts)."""

from __future__ import annotations

import json

from tokenseam.cli import main


def test_bench_healing_small(tmp_path, capsys):
    out = tmp_path / "healing.json"
    rc = main(["bench", "healing", "--models", "smollm2", "--repeats", "1", "--limit", "15", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "token healing" in printed and "per token" in printed
    data = json.loads(out.read_text())
    (r,) = data["results"]
    assert r["model"] == "smollm2" and r["vocab_size"] == 49152
    assert r["boundary"]["prompts"] == 21 and r["realistic"]["prompts"] == 15
    assert r["boundary"]["canonical_with_healing"] == 1.0
    assert r["boundary"]["canonical_without_healing"] < 1.0
    for wl in ("boundary", "realistic"):
        h = r[wl]["healing"]
        assert h["n"] == r[wl]["prompts"] and 0 < h["p50_us"] <= h["p99_us"] <= h["max_us"]


def test_bench_healing_bad_arguments(tmp_path, capsys):
    assert main(["bench", "healing", "--repeats", "0", "--out", str(tmp_path / "x.json")]) == 2
    assert main(["bench", "healing", "--models", "nope", "--out", str(tmp_path / "x.json")]) == 2
    assert "no model" in capsys.readouterr().err
