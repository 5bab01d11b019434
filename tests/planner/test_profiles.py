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
        # Every built-in profile says whether its figures were confirmed, and what was not.
        assert isinstance(p.confirmed, bool), p.name
        assert p.confirmed or p.unconfirmed.strip(), p.name
        if p.provider != "tokenseam":
            assert "https://" in p.source, p.name
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
    with pytest.raises(PlannerError, match="unknown profile 'nope'.*known profiles:.*openai"):
        load_profiles().get("nope")
    with pytest.raises(PlannerError, match="profiles file not found"):
        load_profiles(tmp_path / "absent.toml")
    bad = tmp_path / "bin.toml"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PlannerError, match="bin.toml"):
        load_profiles(bad)


def test_2026_mechanics():
    ps = load_profiles()
    new = ps.get("openai-gpt-5.6")
    assert new.explicit and new.granularity == "exact" and new.block == 1 and new.max_breakpoints == 4
    assert {w.multiplier for w in new.writes} == {1.25}
    assert ps.get("openai-gpt-5").granularity == "blocks" and not ps.get("openai-gpt-5").explicit
    assert all(w.multiplier == 1.0 for w in ps.get("openai-gpt-5").writes)
    for name in ("anthropic-512", "anthropic-1024", "anthropic-2048", "anthropic-4096"):
        a = ps.get(name)
        assert a.explicit and a.automatic and a.max_breakpoints == 4 and a.granularity == "exact"
    assert ps.get("gemini-2.5").floor == 2048 and ps.get("gemini-3").floor == 4096
    assert not ps.get("gemini-3").explicit and ps.get("gemini-3").max_breakpoints == 0
    assert (
        ps.get("deepseek-flash").granularity == "units" and ps.get("deepseek-v4-pro").granularity == "units"
    )


@pytest.mark.parametrize(
    "model, profile",
    [
        ("gpt-5.6", "openai-gpt-5.6"),
        ("gpt-5.6-sol", "openai-gpt-5.6"),
        ("openai/gpt-5.7-mini", "openai-gpt-5.6"),
        ("gpt-5", "openai-gpt-5"),
        ("gpt-5-mini", "openai-gpt-5"),
        ("gpt-5.5-pro", "openai-gpt-5"),
        ("gpt-4.1-nano", "openai-gpt-4.1"),
        ("gpt-4o-mini", "openai-gpt-4o"),
        ("claude-opus-5", "anthropic-512"),
        ("Claude-Opus-5", "anthropic-512"),
        ("claude-opus-4-6", "anthropic-4096"),
        ("claude-haiku-4-5-20251001", "anthropic-4096"),
        ("claude-opus-4-1-20250805", "anthropic-1024"),
        ("claude-sonnet-4", "anthropic-1024"),
        ("claude-3-5-haiku-20241022", "anthropic-2048"),
        ("gemini-3-pro", "gemini-3"),
        ("gemini-3.1-pro-preview", "gemini-3"),
        ("gemini-2.5-flash", "gemini-2.5"),
        ("deepseek-chat", "deepseek-flash"),
        ("deepseek-v4-pro", "deepseek-v4-pro"),
        # old profile names and aliases keep working
        ("deepseek", "deepseek-flash"),
        ("openai", "openai-gpt-5"),
        ("anthropic", "anthropic-1024"),
        ("gemini", "gemini-2.5"),
        ("anthropic-4096", "anthropic-4096"),
        ("local", "local"),
    ],
)
def test_model_names_resolve(model, profile):
    assert load_profiles().get(model).name == profile


@pytest.mark.parametrize(
    "name, close",
    [("claude-opus", "claude-opus-5"), ("gemni-3-pro", "gemini-3"), ("gtp-5.6", "gpt-5.6")],
)
def test_unknown_model_lists_close_matches(name, close):
    with pytest.raises(PlannerError) as e:
        load_profiles().get(name)
    msg = str(e.value)
    assert f"unknown profile {name!r}" in msg and "close matches:" in msg and close in msg.split("; known")[0]


@pytest.mark.parametrize("name", ["", "   ", "llama-3-70b"])
def test_unknown_or_empty_model_is_an_error_not_a_default(name):
    with pytest.raises(PlannerError):
        load_profiles().get(name)


def test_user_profile_models_win_and_ambiguity_is_an_error(tmp_path):
    f = _write(
        tmp_path,
        """
[profiles.mine]
provider = "me"
caching = "explicit"
granularity = "exact"
max_breakpoints = 2
floor = 100
read_multiplier = 0.2
verified = 2026-01-01
source = "my invoice"
confirmed = true
models = ["gpt-5.6*"]
writes = [{name = "w", multiplier = 1.1, ttl_seconds = 60}]
[profiles.other]
provider = "me"
floor = 100
read_multiplier = 0.2
verified = 2026-01-01
source = "x"
models = ["gpt-5.6*"]
writes = [{name = "w", multiplier = 1.1, ttl_seconds = 60}]
""",
    )
    with pytest.raises(PlannerError, match="several profiles.*mine.*other"):
        load_profiles(f).get("gpt-5.6")
    f.write_text(
        f.read_text()
        .replace("[profiles.other]", "[profiles.other]\nblock = 1")
        .replace('source = "x"\nmodels = ["gpt-5.6*"]', 'source = "x"\nmodels = ["other-*"]')
    )
    ps = load_profiles(f)
    assert ps.get("gpt-5.6").name == "mine" and ps.get("other-1").name == "other"
    assert ps.get("mine").block == 1 and ps.get("other").granularity == "exact"


@pytest.mark.parametrize(
    "body, needles",
    [
        ('[profiles.openai-gpt-5]\ncaching = "sometimes"\n', ["'caching'", "implicit, explicit"]),
        ('[profiles.openai-gpt-5]\ngranularity = "bytes"\n', ["'granularity'", "blocks, exact, units"]),
        ('[profiles."openai-gpt-5.6"]\nblock = 128\n', ["'exact'", "'block' must be 1"]),
        ('[profiles."openai-gpt-5.6"]\nmax_breakpoints = 0\n', ["explicit", "max_breakpoints"]),
        ('[profiles."openai-gpt-5.6"]\nmax_breakpoints = 1000\n', ["max_breakpoints", "<= 64"]),
        ('[profiles."openai-gpt-5.6"]\nmax_breakpoints = -1\n', ["max_breakpoints", ">= 0"]),
        ('[profiles.openai-gpt-5]\nconfirmed = "yes"\n', ["'confirmed'", "true or false"]),
        ("[profiles.local]\nconfirmed = false\n", ["local", "unconfirmed"]),
        ("[profiles.local]\nunconfirmed = 3\n", ["'unconfirmed'", "string"]),
        ("[profiles.anthropic-512]\nautomatic = 1\n", ["'automatic'", "true or false"]),
        ("[profiles.openai-gpt-5]\nfloor = 100000000000\n", ["'floor'", "<= 100,000,000"]),
        ("[profiles.openai-gpt-5]\nblock = 100000000000\n", ["'block'", "<= 100,000,000"]),
        ("[profiles.openai-gpt-5]\nmodels = [1]\n", ["'models'", "list of non-empty strings"]),
        ('[profiles.openai-gpt-5]\nmodels = [""]\n', ["'models'"]),
        (
            '[profiles.x]\nprovider="a"\nfloor=1\nread_multiplier=0.1\nverified=2026-01-01\nsource="s"\n'
            'granularity="blocks"\nwrites=[{name="a", multiplier=1, ttl_seconds=5}]\n',
            ["'blocks' needs the field 'block'"],
        ),
    ],
)
def test_malformed_2026_fields(tmp_path, body, needles):
    f = _write(tmp_path, body)
    with pytest.raises(PlannerError) as e:
        load_profiles(f)
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


def test_write_option_lookup():
    p = load_profiles().get("anthropic-1024")
    assert p.write(None).name == "5m" and p.write("1h").multiplier == 2.0
    with pytest.raises(PlannerError, match="no write option '2h'.*5m, 1h"):
        p.write("2h")
