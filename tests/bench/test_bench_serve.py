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


def test_llama_server_rounds_pair_with_tokenseam_in_the_summary():
    # llama-server's figures come from the same rounds as tokenseam's, so its ratios are taken round by round
    from argparse import Namespace

    from tokenseam.bench.serve import _summarise

    def rnd(ts1, tsn, ls1, lsn):
        x = {"tok_s": 1.0, "engine_overhead_ms_per_step": 0.1, "outside_decode_ms_per_token": 0.2}
        r = {k: dict(x) for k in ("llama_cpp_python_1", "raw_1", "raw_n", "tokenseam_json_1")}
        r["tokenseam_1"], r["tokenseam_n"] = dict(x, tok_s=ts1), dict(x, tok_s=tsn)
        r["llama_server_1"], r["llama_server_n"] = {"tok_s": ls1}, {"tok_s": lsn}
        return r

    # a slow round slows both sides: per-round ratios stay 0.9 / 1.0 while the medians of the rates alone do not
    res = {"rounds": [rnd(90, 200, 100, 200), rnd(45, 100, 50, 100), rnd(99, 150, 110, 150)]}
    _summarise(res, Namespace())
    assert res["llama_server"] == {"tok_s_1": 100, "tok_s_n": 150}
    assert res["summary"]["ratio_single_vs_llama_server"] == pytest.approx(0.9)
    assert res["summary"]["ratio_batched_vs_llama_server"] == pytest.approx(1.0)
    without = {
        "rounds": [{k: v for k, v in r.items() if not k.startswith("llama_server")} for r in res["rounds"]]
    }
    _summarise(without, Namespace())
    assert "llama_server" not in without and "ratio_single_vs_llama_server" not in without["summary"]
