"""`tokenseam bench grammar-overlap` end to end on a tiny budget: every request is answered, every figure is
there, and bad counts are refused."""

from __future__ import annotations

import json

import pytest

from tokenseam.bench.grammar_overlap import big_schema, prompt
from tokenseam.cli import main


def test_schemas_and_prompts_never_repeat():
    assert big_schema(1, 3) != big_schema(2, 3) and len(big_schema(1, 7)["properties"]) == 7
    assert prompt(1, 4) != prompt(2, 4) and prompt(1, 4).split(". ", 1)[1] == prompt(2, 4).split(". ", 1)[1]


@pytest.mark.model
@pytest.mark.server
def test_bench_grammar_overlap_measures_both_modes(tmp_path):
    out = tmp_path / "overlap.json"
    rc = main(
        [
            "bench",
            "grammar-overlap",
            "--rounds",
            "2",
            "--properties",
            "4",
            "--prompt-words",
            "3",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert {k: len(v) for k, v in res["ttft_s"].items()} == {
        "overlap": 2,
        "compile_first": 2,
        "no_grammar": 2,
    }
    assert all(t > 0 for v in res["ttft_s"].values() for t in v) and len(res["compile_s"]) == 2
    s = res["summary"]
    assert s["paired_ratio_overlap_vs_compile_first"] > 0 and s["bound_ms"] > 0
    assert s["ttft_overlap"]["n"] == 2 and "llama_cpp_extra_buffers" in res["machine"]


@pytest.mark.parametrize("flag", ["--rounds", "--properties", "--prompt-words"])
def test_bench_grammar_overlap_refuses_non_positive_counts(flag, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "grammar-overlap", flag, "0", "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2
    assert f"{flag} must be between 1" in capsys.readouterr().err
