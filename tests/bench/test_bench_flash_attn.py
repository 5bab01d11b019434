"""`tokenseam bench flash-attn` on a tiny budget: both settings really decode every case, the JSON is complete."""

from __future__ import annotations

import json

import pytest

from tokenseam.bench.flash_attn import CASES
from tokenseam.cli import main


@pytest.mark.model
def test_bench_flash_attn_times_every_case_with_both_settings(tmp_path):
    out = tmp_path / "fa.json"
    assert main(["bench", "flash-attn", "--rounds", "2", "--steps", "2", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [c["case"] for c in res["cases"]] == [c[0] for c in CASES]
    for c in res["cases"]:
        assert len(c["on_ms"]) == len(c["off_ms"]) == 2
        assert all(x > 0 for x in c["on_ms"] + c["off_ms"])
        assert c["ratio_on_off"] > 0
    # a prompt of 300 tokens is read in more time than one 8-stream step at 300 tokens, with either setting
    cases = {c["case"]: c for c in res["cases"]}
    for fa in ("on_median_ms", "off_median_ms"):
        assert cases["prompt of 300 tokens"][fa] > cases["decode step, 8 streams at 300 tokens"][fa]


@pytest.mark.parametrize(
    "flag,value",
    [("--rounds", "0"), ("--rounds", "51"), ("--steps", "0"), ("--threads", "-1"), ("--steps", "100000")],
)
def test_bench_flash_attn_refuses_out_of_range_counts(flag, value, tmp_path, capsys):
    assert main(["bench", "flash-attn", flag, value, "--out", str(tmp_path / "x.json")]) == 2
    assert f"{flag} must be between" in capsys.readouterr().out
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("bench", ["flash-attn", "serve"])
def test_bench_refuses_an_unknown_model_clearly(bench, tmp_path, capsys):
    missing = tmp_path / "none.gguf"
    assert main(["bench", bench, "--model", str(missing), "--out", str(tmp_path / "x.json")]) == 2
    assert "error: --model: no model" in capsys.readouterr().out
