"""The tree stays as `ruff` formats and lints it (the configuration is in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    exe = Path(sys.executable).with_name("ruff")
    if exe.exists():
        return [str(exe)]
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.fail("ruff is not installed (it is in the test extra: pip install -e '.[test]')")


@pytest.mark.parametrize(
    "args", [["check", "src", "tests"], ["format", "--check", "src", "tests"]], ids=["lint", "format"]
)
def test_ruff_is_clean(args):
    r = subprocess.run(_ruff() + args, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
