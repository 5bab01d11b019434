"""`tokenseam bench serve` end to end on a tiny budget: every system really decodes, the JSON is complete."""

from __future__ import annotations

import json

import pytest

from tokenseam.cli import main

pytestmark = [pytest.mark.model, pytest.mark.server]


def test_bench_serve_measures_every_system(tmp_path):
    out = tmp_path / "serve.json"
    # (flash attention on for every system: the setting reaches the server, the raw loop and llama-cpp-python)
    argv = ["bench", "serve", "--tokens", "8", "--streams", "2", "--repeats", "1", "--flash-attn", "on"]
    assert main([*argv, "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["flash_attn"] == "on"
    (rnd,) = res["rounds"]
    assert set(rnd) == {
        "llama_cpp_python_1",
        "tokenseam_1",
        "raw_1",
        "raw_n",
        "tokenseam_n",
        "tokenseam_json_1",
    }
    assert rnd["tokenseam_1"]["tokens"] == 8 and rnd["tokenseam_n"]["tokens"] == 16
    assert all(v["tok_s"] > 0 for v in rnd.values())
    s = res["summary"]
    assert s["ratio_single_vs_llama_cpp_python"] > 0 and s["engine_overhead_ms_per_token_1"] >= 0
    # the server's own counters were read from its /metrics: decode time is part of the wall time
    assert 0 <= rnd["tokenseam_1"]["outside_decode_ms_per_token"] < rnd["tokenseam_1"]["seconds"] * 1000 / 8


@pytest.mark.parametrize("flag", ["--tokens", "--streams", "--repeats", "--threads"])
def test_bench_serve_refuses_non_positive_counts(flag, tmp_path, capsys):
    assert main(["bench", "serve", flag, "0", "--out", str(tmp_path / "x.json")]) == 2
    assert "must be positive" in capsys.readouterr().out
