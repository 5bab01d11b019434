"""Profile file: the shipped values load and validate; malformed user files fail with file, profile and field."""

import math

import pytest

from tokenseam.planner import PlannerError
from tokenseam.planner.profiles import load_profiles


def test_shipped_profiles():
    ps = load_profiles()
    oa = ps.get("openai")
    assert oa.floor == 1024 and oa.block == 128 and oa.block_status == "historically documented"
    reads = sorted(p.read_multiplier for p in ps.profiles.values() if p.provider == "openai")
    assert reads[0] == 0.1 and reads[-1] == 0.5
    floors = sorted(p.floor for p in ps.profiles.values() if p.provider == "anthropic")
    assert floors == [512, 1024, 2048, 4096]
    for p in ps.profiles.values():
        if p.provider == "anthropic":
            assert {(w.name, w.multiplier, w.ttl_seconds) for w in p.writes} == {
                ("5m", 1.25, 300),
                ("1h", 2.0, 3600),
            }
            assert p.read_multiplier == 0.1
        assert p.verified and p.source
    assert ps.get("gemini").provider == "google" and ps.get("deepseek").provider == "deepseek"
    local = ps.get("local")
    assert local.block == 16 and local.floor == 0 and local.read_multiplier == 0.0
    assert math.isinf(local.writes[0].ttl_seconds)


def _write(tmp_path, text):
    f = tmp_path / "mine.toml"
    f.write_text(text)
    return f


def test_user_file_overrides_and_extends(tmp_path):
    f = _write(
        tmp_path,
        """
[profiles.openai-gpt-5]
read_multiplier = 0.2
[profiles.myco]
provider = "myco"
floor = 256
block = 32
read_multiplier = 0.3
verified = "2026-01-02"
source = "my invoice"
writes = [{name = "x", multiplier = 1.5, ttl_seconds = 60}]
[aliases]
mine = "myco"
""",
    )
    ps = load_profiles(f)
    assert ps.get("openai").read_multiplier == 0.2 and ps.get("openai").floor == 1024
    assert ps.get("mine").floor == 256 and ps.get("myco").origin == str(f)


@pytest.mark.parametrize(
    "body, needles",
    [
        ("[profiles.x\nfloor = 1", ["mine.toml", "not valid TOML"]),
        ('[profiles.x]\nprovider = "a"\n', ["mine.toml", "'x'", "missing", "floor"]),
        ("[profiles.openai-gpt-5]\nfloor = -5\n", ["mine.toml", "openai-gpt-5", "'floor'", ">= 0"]),
        ('[profiles.openai-gpt-5]\nfloor = "many"\n', ["openai-gpt-5", "'floor'", "integer"]),
        ("[profiles.openai-gpt-5]\nfloor = 10.5\n", ["'floor'", "integer"]),
        ("[profiles.openai-gpt-5]\nblock = 0\n", ["'block'", ">= 1"]),
        ("[profiles.openai-gpt-5]\nread_multiplier = nan\n", ["'read_multiplier'", "NaN"]),
        ("[profiles.openai-gpt-5]\nread_multiplier = true\n", ["'read_multiplier'", "number"]),
        ("[profiles.openai-gpt-5]\nwrites = []\n", ["'writes'", "non-empty"]),
        ('[profiles.openai-gpt-5]\nwrites = [{name="a", multiplier=1}]\n', ["writes[0]", "ttl_seconds"]),
        (
            '[profiles.openai-gpt-5]\nwrites = [{name="a", multiplier=1, ttl_seconds=0}]\n',
            ["writes[0]", "> 0"],
        ),
        (
            '[profiles.openai-gpt-5]\nwrites = [{name="a", multiplier=-1, ttl_seconds=5}]\n',
            ["'multiplier'", ">= 0"],
        ),
        ('[profiles.openai-gpt-5]\nverified = "last week"\n', ["'verified'", "YYYY-MM-DD"]),
        ("[profiles.openai-gpt-5]\nflor = 3\n", ["unknown field", "'flor'"]),
        ('[aliases]\nfoo = "nope"\n', ["alias 'foo'", "'nope'"]),
        ("[stuff]\na = 1\n", ["unknown top-level", "stuff"]),
        ("profiles = 3\n", ["profiles"]),
    ],
)
def test_malformed_profile_files(tmp_path, body, needles):
    f = _write(tmp_path, body)
    with pytest.raises(PlannerError) as e:
        load_profiles(f)
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


def test_unknown_profile_and_missing_file(tmp_path):
    with pytest.raises(PlannerError, match="unknown profile 'nope'.*openai"):
        load_profiles().get("nope")
    with pytest.raises(PlannerError, match="profiles file not found"):
        load_profiles(tmp_path / "absent.toml")
    bad = tmp_path / "bin.toml"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PlannerError, match="bin.toml"):
        load_profiles(bad)
