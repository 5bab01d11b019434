"""`tokenseam generate` and `tokenseam tokenize` from the command line."""

from __future__ import annotations

import pytest

from tokenseam.cli import main


@pytest.mark.model
def test_generate_streams_and_heals(capsys):
    assert main(["generate", 'Visit <a href="http:', "--max-tokens", "4", "--show-ids"]) == 0
    out, err = capsys.readouterr()
    assert "healed: removed" in err and "4 tokens" in err
    assert out.strip()


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "x", "--max-tokens", "0"],
        ["generate", "x", "--model", "nope.gguf"],
        ["generate", "x", "--temperature", "-1"],
    ],
)
def test_generate_bad_input_exits_2(argv, capsys):
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_generate_bad_flag_type_exits_2():
    with pytest.raises(SystemExit) as e:
        main(["generate", "x", "--max-tokens", "many"])
    assert e.value.code == 2


def test_tokenize_json(capsys):
    import json

    assert main(["tokenize", "http://안녕", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert bytes(b for r in rows for b in r["bytes"]).decode() == "http://안녕"
