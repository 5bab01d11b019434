"""`plan --from-log`: a constructed log is grouped by model and stable prefix (appended text does not split a
group), rates come from the timestamps, and every malformed line is an error naming the line."""

import json
import math
import subprocess
import sys

import pytest

from tokenseam.planner import PlannerError
from tokenseam.planner.counting import make_counter
from tokenseam.planner.reqlog import (
    group_requests,
    observed_hit_fraction,
    parse_time,
    plain,
    rate_per_hour,
    read_log,
)

SYS_A = (
    "You are the support agent of Acme. Answer from the policy below.\n" + "Refunds within 30 days. " * 120
)
SYS_B = "Translate English to French literally.\n" + "Keep names unchanged. " * 80
T0 = 1_800_000_000


def _log(tmp_path, rows, name="log.jsonl"):
    f = tmp_path / name
    f.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return f


def constructed_log():
    rows = []
    # Group A (OpenAI bodies, gpt-5.6): one call every 60 s, the question varies and shares its first word.
    for i in range(10):
        rows.append(
            {
                "ts": T0 + 60 * i,
                "body": {
                    "model": "gpt-5.6",
                    "messages": [
                        {"role": "system", "content": SYS_A},
                        {
                            "role": "user",
                            "content": f"Where is order {i}? " + ("Please hurry." if i % 2 else ""),
                        },
                    ],
                },
            }
        )
    # Group B (Anthropic bodies, claude-opus-5, "timestamp" inline, ISO times): a conversation that grows turn by
    # turn (appended text), interleaved with group A, every 120 s.
    turns = []
    for i in range(6):
        turns = turns + [
            {"role": "user", "content": [{"type": "text", "text": f"Sentence {i}: the cat sleeps."}]}
        ]
        rows.append(
            {
                "timestamp": f"2027-01-15T08:{2 * i:02d}:00Z",
                "model": "claude-opus-5",
                "max_tokens": 50,
                "system": [{"type": "text", "text": SYS_B, "cache_control": {"type": "ephemeral"}}],
                "messages": list(turns),
            }
        )
        turns.append({"role": "assistant", "content": f"Phrase {i} : le chat dort."})
    # Same system prompt as A but another model: its own group... of one, so ungrouped.
    rows.append(
        {
            "ts": T0,
            "body": {
                "model": "gpt-5",
                "messages": [{"role": "system", "content": SYS_A}, {"role": "user", "content": "hi"}],
            },
        }
    )
    # A request that shares nothing with group A.
    rows.append(
        {
            "ts": T0 + 5,
            "body": {"model": "gpt-5.6", "messages": [{"role": "user", "content": "Tell me a joke."}]},
        }
    )
    return rows


def test_constructed_log_groups(tmp_path):
    counter = make_counter(None)
    reqs = read_log(_log(tmp_path, constructed_log()))
    assert len(reqs) == 18
    groups, loose = group_requests(reqs, counter, 256)
    assert loose == 2 and len(groups) == 2
    a = next(g for g in groups if g.model == "gpt-5.6")
    b = next(g for g in groups if g.model == "claude-opus-5")
    assert len(a.members) == 10 and len(b.members) == 6
    # A: the shared text is the system prompt plus "Where is order " (common to every question), cut back to the
    # last whitespace; the whole-block prefix (for an explicit breakpoint) is the system prompt alone.
    assert a.shared_text == SYS_A + "Where is order "
    assert a.block_text == SYS_A and a.block_tokens == math.ceil(len(SYS_A.encode()) / 4)
    # B: every request extends the previous one; the shared prefix is the system prompt plus the first turn
    # up to its last whole word: appended turns did not split the group.
    assert b.shared_text == SYS_B + "Sentence 0: the cat sleeps."
    assert b.block_text == SYS_B + "Sentence 0: the cat sleeps."
    assert rate_per_hour([r.ts for r in a.members]) == pytest.approx(60.0)  # 9 gaps of 60 s
    assert rate_per_hour([r.ts for r in b.members]) == pytest.approx(30.0)


def test_from_log_cli_plans_each_group_at_its_rate(tmp_path):
    f = _log(tmp_path, constructed_log())
    r = subprocess.run(
        [sys.executable, "-m", "tokenseam.cli", "plan", "--from-log", str(f), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["requests"] == 18 and rep["ungrouped_requests"] == 2
    by_model = {g["model"]: g for g in rep["groups"]}
    a, b = by_model["gpt-5.6"], by_model["claude-opus-5"]
    assert a["profile"] == "openai-gpt-5.6" and b["profile"] == "anthropic-512"
    assert a["dialects"] == ["openai"] and b["dialects"] == ["anthropic"]
    # Explicit caches are planned on whole blocks: A's prefix is the system prompt.
    assert a["plan"]["prefix_tokens"] == math.ceil(len(SYS_A.encode()) / 4)
    o = a["plan"]["options"][0]  # 30m counted from the write at 60 calls/hour: q = 1 / (1 + 30)
    assert a["calls_per_hour"] == pytest.approx(60.0) and o["miss_probability"] == pytest.approx(1 / 31)
    # The log's own hit fraction under the same rule: 9 calls after the first, all within 30 min of the write.
    assert a["observed_hit_fraction"]["30m"] == 1.0
    assert b["observed_hit_fraction"]["5m"] == 1.0  # 120 s gaps under a 5 min idle TTL
    # --profile overrides the models; the table prints.
    r = subprocess.run(
        [sys.executable, "-m", "tokenseam.cli", "plan", "--from-log", str(f), "--profile", "anthropic-1024"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "18 requests, 2 groups, 2 ungrouped" in r.stdout and "P(hit) log" in r.stdout
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tokenseam.cli",
            "plan",
            "--from-log",
            str(f),
            "--profile",
            "anthropic-1024",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert {g["profile"] for g in json.loads(r.stdout)["groups"]} == {"anthropic-1024"}


def test_stable_cut_with_a_real_tokenizer(tokenizers, tmp_path):
    """With a local tokenizer the shared prefix ends at the healing part's stable point."""
    from tokenseam.healing.stable import stable_prefix
    from tokenseam.vocab import Vocabulary

    counter = make_counter("smollm2", leading_tokens=0)
    rows = [
        {"ts": T0 + i, "body": {"model": "local", "messages": [{"role": "user", "content": SYS_B + q}]}}
        for i, q in enumerate(["Answer: yes", "Answer: no", "Answer: maybe"])
    ]
    groups, loose = group_requests(read_log(_log(tmp_path, rows)), counter, 32)
    (g,) = groups
    shared = SYS_B + "Answer: "
    sp = stable_prefix(tokenizers["smollm2"], Vocabulary.from_gguf(counter.path), shared)
    assert g.shared_tokens == len(sp.ids) and g.shared_tokens < len(tokenizers["smollm2"].encode(shared))
    assert g.shared_text == tokenizers["smollm2"].decode(sp.ids).decode()


def test_hit_fraction_and_rate_helpers():
    assert observed_hit_fraction([0, 100, 500, 550], 300, True) == pytest.approx(2 / 3)
    # Counted from the write: 0 written, 100 hit, 500 > 300 after the write -> miss (written 500), 550 hit.
    assert observed_hit_fraction([0, 100, 290, 500, 550], 300, False) == pytest.approx(3 / 4)
    assert rate_per_hour([5.0]) is None and rate_per_hour([5.0, 5.0]) is None
    assert parse_time("2027-01-15T08:00:00Z", "x") == parse_time("2027-01-15T08:00:00+00:00", "x")
    assert parse_time("2027-01-15T08:00:00", "x") == parse_time("2027-01-15T08:00:00Z", "x")
    assert plain("\x1esystem\x1eabc\x1euser\x1ede\x1eassis") == "abcde"


@pytest.mark.parametrize(
    "line, needle",
    [
        ("{oops", "line 2: not valid JSON"),
        ("[1, 2]", "line 2: expected an object"),
        ('{"model": "m", "messages": [{"role": "user", "content": "x"}]}', "line 2: no timestamp"),
        ('{"ts": NaN, "body": {"messages": [{"role": "user", "content": "x"}]}}', "line 2: timestamp nan"),
        (
            '{"ts": Infinity, "body": {"messages": [{"role": "user", "content": "x"}]}}',
            "line 2: timestamp inf",
        ),
        (
            '{"ts": true, "body": {"messages": [{"role": "user", "content": "x"}]}}',
            "line 2: the timestamp must",
        ),
        ('{"ts": -5, "body": {"messages": [{"role": "user", "content": "x"}]}}', "between 1970 and 3000"),
        ('{"ts": 1800000000000, "body": {"messages": [{"role": "user", "content": "x"}]}}', "between 1970"),
        ('{"ts": "yesterday", "body": {"messages": [{"role": "user", "content": "x"}]}}', "not ISO 8601"),
        ('{"ts": [1], "body": {"messages": [{"role": "user", "content": "x"}]}}', "got list"),
        ('{"ts": 1, "body": "hello"}', "line 2: the request body must be a JSON object"),
        ('{"ts": 1, "body": {"messages": []}}', "'messages' must be a non-empty list"),
        ('{"ts": 1, "body": {"messages": [3]}}', "messages[0] must be an object"),
        ('{"ts": 1, "body": {"messages": [{"content": "x"}]}}', "'role' must be a non-empty string"),
        (
            '{"ts": 1, "body": {"messages": [{"role": "user", "content": 5}]}}',
            "'content' must be a string or a list",
        ),
        ('{"ts": 1, "body": {"messages": [{"role": "user", "content": [7]}]}}', "each content part must be"),
        (
            '{"ts": 1, "body": {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}}',
            "'text' must be a string",
        ),
        ('{"ts": 1, "body": {"prompt": ["a", "b"]}}', "batched prompts"),
        ('{"ts": 1, "body": {"model": "m"}}', "has no 'messages'"),
        (
            '{"ts": 1, "body": {"messages": [{"role": "user", "content": "x"}]}, "extra": 1}',
            "unexpected field(s) extra",
        ),
        (
            '{"ts": 1, "body": {"model": 5, "messages": [{"role": "user", "content": "x"}]}}',
            "'model' must be",
        ),
        (
            '{"ts": 1, "body": {"tools": {}, "messages": [{"role": "user", "content": "x"}]}}',
            "'tools' must be a list",
        ),
    ],
)
def test_malformed_log_lines_name_the_line(tmp_path, line, needle):
    good = json.dumps({"ts": 1, "body": {"messages": [{"role": "user", "content": "ok"}]}})
    f = _log(tmp_path, [good, line])
    with pytest.raises(PlannerError) as e:
        read_log(f)
    assert needle in str(e.value) and "log.jsonl" in str(e.value), str(e.value)


def test_hostile_log_files(tmp_path):
    good = json.dumps({"ts": 1, "body": {"messages": [{"role": "user", "content": "ok"}]}})
    with pytest.raises(PlannerError, match="not found"):
        read_log(tmp_path / "absent.jsonl")
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(PlannerError, match="holds no requests"):
        read_log(tmp_path / "e.jsonl")
    (tmp_path / "b.jsonl").write_bytes(
        b'{"ts": 1, "body": {"messages": [{"role": "user", "content": "\xff"}]}}\n'
    )
    with pytest.raises(PlannerError, match="not UTF-8"):
        read_log(tmp_path / "b.jsonl")
    f = _log(tmp_path, [good] * 50)
    with pytest.raises(PlannerError, match="limit is 100 bytes"):
        read_log(f, max_bytes=100)
    with pytest.raises(PlannerError, match="more than 10 requests"):
        read_log(f, max_requests=10)
    with pytest.raises(PlannerError, match="not a regular file"):
        read_log(tmp_path)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["PROMPT", "--from-log", "LOG"], "either PROMPT_FILE or --from-log"),
        ([], "either PROMPT_FILE or --from-log"),
        (["PROMPT"], "--profile is required"),
        (["--from-log", "LOG", "--emit", "openai"], "--emit works on one prompt"),
        (["--from-log", "NOMODEL"], "names no model; pass --profile"),
        (["--from-log", "LOG", "--profile", "gtp-9"], "unknown profile 'gtp-9'"),
        (["--from-log", "LOG", "--min-shared-tokens", "-3"], "--min-shared-tokens"),
        (["PROMPT", "--profile", "gpt-5.6", "--write", "12h"], "need --emit"),
        (["PROMPT", "--profile", "gpt-5.6", "--emit", "openai", "--write", "5m"], "no write option '5m'"),
        (["PROMPT", "--profile", "gpt-5.6", "--emit", "anthropic"], "openai cache"),
    ],
)
def test_plan_cli_log_and_emit_errors(tmp_path, args, needle):
    (tmp_path / "p.txt").write_text("hello " * 50)
    log = _log(tmp_path, constructed_log())
    nomodel = _log(
        tmp_path,
        [
            {"ts": T0 + i, "body": {"messages": [{"role": "user", "content": SYS_A + str(i)}]}}
            for i in range(3)
        ],
        "n.jsonl",
    )
    sub = {"PROMPT": tmp_path / "p.txt", "LOG": log, "NOMODEL": nomodel}
    r = subprocess.run(
        [sys.executable, "-m", "tokenseam.cli", "plan", *[str(sub.get(a, a)) for a in args]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and needle in r.stderr, r.stderr


def test_plan_emit_writes_the_fragment(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("Answer briefly.\n" * 400)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tokenseam.cli",
            "plan",
            str(f),
            "--profile",
            "claude-opus-5",
            "--emit",
            "anthropic",
            "--write",
            "1h",
            "--role",
            "system",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    frag = json.loads((tmp_path / "p.anthropic.json").read_text())
    assert rep["emitted"]["file"] == str(tmp_path / "p.anthropic.json") and rep["emitted"]["breakpoints"] == 1
    assert frag == {
        "system": [
            {
                "type": "text",
                "text": f.read_text().rstrip(),
                "cache_control": {"type": "ephemeral", "ttl": "1h"},
            }
        ]
    }
