"""`tokenseam plan` end to end: JSON figures match the formulas; bad inputs give clear errors and exit 2."""

import json
import subprocess
import sys

import pytest


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "tokenseam.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_plan_json_matches_formulas(tmp_path, tokenizers):
    text = "Answer questions about the attached policy. Be brief.\n" * 15
    f = tmp_path / "p.txt"
    f.write_text(text)
    p = len(tokenizers["smollm2"].encode(text))
    r = _cli(
        "plan",
        str(f),
        "--profile",
        "anthropic-1024",
        "--tokenizer",
        "smollm2",
        "--leading-tokens",
        "0",
        "--calls-per-hour",
        "12",
        "--price-per-mtok",
        "3",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    plan = rep["plan"]
    assert plan["prefix_tokens"] == p and p < 1024
    assert plan["steady_cost_as_is"] == p and plan["steady_cost_planned"] == pytest.approx(102.4)
    five = next(o for o in plan["options"] if o["write_option"] == "5m")
    q = 2.718281828459045**-1  # 12 calls/hour against a 5-minute idle TTL
    assert five["miss_probability"] == pytest.approx(q)
    assert five["cost_planned"] == pytest.approx(1024 * (1.25 * q + 0.1 * (1 - q)))
    assert five["usd_per_month_as_is"] == pytest.approx(p * 3e-6 * 12 * 730)
    assert rep["count"]["exact"] is True


def test_plan_table_and_approximation(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("word " * 800)
    r = _cli("plan", str(f), "--profile", "openai", "--calls-per-hour", "30")
    assert r.returncode == 0, r.stderr
    assert "bytes/4" in r.stdout and "±25%" in r.stdout and "prefix tokens p" in r.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--profile", "openai", "MISSING"], "prompt file not found"),
        (["--profile", "nope", "PROMPT"], "unknown profile"),
        (["--profile", "openai", "PROMPT", "--calls-per-hour", "0"], "--calls-per-hour"),
        (["--profile", "openai", "PROMPT", "--calls-per-hour", "nan"], "--calls-per-hour"),
        (["--profile", "openai", "PROMPT", "--price-per-mtok", "-1"], "--price-per-mtok"),
        (["--profile", "openai", "PROMPT", "--profiles", "MISSING"], "profiles file not found"),
        (["PROMPT"], "--profile"),
        (["--profile", "openai", "EMPTY"], "is empty"),
        (["--profile", "openai", "BINARY"], "not UTF-8"),
        (["--profile", "openai", "DIR"], "not a regular file"),
    ],
)
def test_plan_bad_inputs(tmp_path, args, needle):
    (tmp_path / "p.txt").write_text("hello " * 50)
    (tmp_path / "e.txt").write_text("")
    (tmp_path / "b.txt").write_bytes(b"\xff\xfe" * 10)
    sub = {
        "PROMPT": tmp_path / "p.txt",
        "MISSING": tmp_path / "missing",
        "EMPTY": tmp_path / "e.txt",
        "BINARY": tmp_path / "b.txt",
        "DIR": tmp_path,
    }
    r = _cli("plan", *[str(sub.get(a, a)) for a in args])
    assert r.returncode == 2
    assert needle in r.stderr, r.stderr


def test_plan_with_user_profile_file(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("x " * 300)
    prof = tmp_path / "mine.toml"
    prof.write_text(
        '[profiles.tiny]\nprovider = "me"\nfloor = 256\nblock = 32\nread_multiplier = 0.25\n'
        'verified = 2026-01-01\nsource = "test"\nwrites = [{name = "w", multiplier = 1.5, ttl_seconds = 60}]\n'
    )
    r = _cli("plan", str(f), "--profile", "tiny", "--profiles", str(prof), "--tokenizer", "bytes/4", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)["plan"]
    # 600 bytes -> 150 tokens (approx.) under a 256 floor. The count may be 25 % high, so the padding target is
    # ceil(256 * 1.25) = 320 (on a 32-token boundary): steady 0.25 * 320 = 80 < 150.
    assert (
        plan["prefix_tokens"] == 150 and plan["prefix_tokens_low"] == 120 and plan["floor_effective"] == 320
    )
    assert plan["planned_tokens"] == 320
    assert plan["steady_cost_planned"] == 80 and plan["steady_padding_wins"]
    prof.write_text("[profiles.tiny]\nfloor = -1\n")
    r = _cli("plan", str(f), "--profile", "tiny", "--profiles", str(prof))
    assert r.returncode == 2 and "mine.toml" in r.stderr and "'tiny'" in r.stderr
