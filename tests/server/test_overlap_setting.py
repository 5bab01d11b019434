"""`--grammar-overlap auto|on|off`: auto overlaps only where llama.cpp leaves a core free; bad values are
refused before a model loads."""

from __future__ import annotations

import os

import pytest

from tokenseam.cli import main
from tokenseam.server.runtime import build_server
from tokenseam.server.state import overlap_compiles


@pytest.mark.parametrize(
    ("setting", "threads", "cores", "expected"),
    [
        ("on", 0, 2, True),
        ("off", 1, 8, False),
        ("auto", 0, 8, False),  # every core decodes
        ("auto", 2, 2, False),
        ("auto", 4, 2, False),
        ("auto", 1, 2, True),
        ("auto", 7, 8, True),
    ],
)
def test_auto_overlaps_only_with_a_free_core(monkeypatch, setting, threads, cores, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)), raising=False)
    assert overlap_compiles(setting, threads) is expected


@pytest.mark.parametrize("bad", ["yes", "", "ON", None, True])
def test_a_bad_setting_is_refused_before_the_model_loads(bad):
    with pytest.raises(ValueError, match="grammar_overlap must be one of auto, on, off"):
        build_server("no-such-model.gguf", grammar_overlap=bad)


def test_the_cli_refuses_a_bad_setting(capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--grammar-overlap", "maybe"])
    assert e.value.code == 2
    assert "invalid choice: 'maybe'" in capsys.readouterr().err
