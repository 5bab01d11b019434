"""`tokenseam bench grammar`: argument errors, a tiny real run writing JSON and PNG, and an anchor that is
not installed reported as such instead of failing the run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tokenseam.bench import grammar as bench

DATA = Path(__file__).resolve().parents[3] / "shared" / "benchdata" / "maskbench-dev"


def _args(**kw) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    argv = []
    for k, v in kw.items():
        argv += [f"--{k}", str(v)]
    return p.parse_args(argv)


def test_bad_arguments(tmp_path, capsys):
    assert bench.run(_args(data=tmp_path / "missing")) == 2
    assert bench.run(_args(data=tmp_path, engines="tokenseam,nope")) == 2
    assert bench.run(_args(data=tmp_path, limit=0)) == 2
    assert bench.run(_args(data=tmp_path, tokenizer="no-such-model", engines="tokenseam")) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.skipif(not DATA.is_dir(), reason="MaskBench dev split not present")
def test_small_run_writes_report(tmp_path, monkeypatch, capsys):
    class Missing:
        def __init__(self, *a, **k):
            raise ImportError("No module named 'xgrammar'")

    monkeypatch.setitem(bench.ADAPTERS, "xgrammar", Missing)
    out = tmp_path / "r.json"
    assert bench.run(_args(data=DATA, limit=3, engines="tokenseam,xgrammar", out=out)) == 0
    report = json.loads(out.read_text())
    by = {s["engine"]: s for s in report["summaries"]}
    assert by["xgrammar"]["status"] == "not installed"
    ts = by["tokenseam"]
    assert ts["files"] == 3 and ts["wrong_accepts"] == 0 and ts["tokens"] > 0
    assert ts["mask_us"]["p50"] is not None and ts["ttfm_ms"]["p50"] is not None
    # Every token that was allowed was committed, and each commit was timed.
    assert ts["accept_us"]["p50"] is not None and ts["accept_us"]["max"] >= ts["accept_us"]["p50"] > 0
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "not installed" in capsys.readouterr().out
