"""Alignment solver (exact boundary, least overshoot, unreachable) and `pad` with a real tokenizer."""

import itertools
import json
import subprocess
import sys

import pytest

from tokenseam.planner import PlannerError
from tokenseam.planner.align import candidates, length_cost
from tokenseam.planner.counting import make_counter
from tokenseam.planner.pad import MAX_EXAMPLES, load_examples, pad_prompt
from tokenseam.planner.profiles import load_profiles


def brute_best(weights, base, floor, block, read):
    target = -(-max(base, floor) // block) * block
    best = None
    for k in range(len(weights) + 1):
        for combo in itertools.combinations(range(len(weights)), k):
            n = base + sum(weights[i] for i in combo)
            if n >= target:
                key = (length_cost(n, floor, block, read), n)
                best = key if best is None or key < best else best
    return best


def test_exact_boundary_when_possible():
    # base 900, floor 1024, block 128: need exactly 124 = 100 + 24.
    first = next(candidates([50, 100, 30, 24, 70], 900, 1024, 128, 0.1))
    assert first.total == 1024 and sorted(first.indices) == [1, 3]
    assert first.cost == pytest.approx(102.4)


def test_least_overshoot_otherwise():
    # Nothing sums to 124: the best is the smallest overshoot (1030: 90 + 40), not a far-away boundary.
    first = next(candidates([90, 40, 200], 900, 1024, 128, 0.1))
    assert first.total == 1030 and first.indices == (0, 1)
    # With a cheap read, the next block boundary can beat a long overshoot: 1152 (r*1152 = 115.2) beats
    # 1130 (102.4 + 106).
    first = next(candidates([230, 252], 900, 1024, 128, 0.1))
    assert first.total == 1152 and first.indices == (1,)


def test_solver_matches_brute_force():
    import random

    rng = random.Random(7)
    for _ in range(60):
        weights = [rng.randint(1, 120) for _ in range(rng.randint(1, 9))]
        base, floor, block = rng.randint(0, 300), rng.choice([0, 256, 512]), rng.choice([1, 16, 64])
        read = rng.choice([0.0, 0.1, 0.5])
        want = brute_best(weights, base, floor, block, read)
        try:
            got = next(candidates(weights, base, floor, block, read), None)
        except PlannerError:
            assert want is None
            continue
        if got is None:  # already aligned
            assert base == -(-max(base, floor) // block) * block
            continue
        assert (got.cost, got.total) == pytest.approx(want)
        assert base + sum(weights[i] for i in got.indices) == got.total


def test_unreachable_is_an_error():
    with pytest.raises(PlannerError, match="never pads with filler"):
        next(candidates([10, 20], 900, 1024, 128, 0.1))
    with pytest.raises(PlannerError, match="at least one token"):
        next(candidates([0, 20], 900, 1024, 128, 0.1))


@pytest.fixture(scope="module")
def smollm2_counter():
    return make_counter("smollm2", leading_tokens=0)


def _examples(n=60, seed=3):
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 999), rng.randint(10, 999)
        filler = " ".join(
            rng.choice(["apples", "boxes", "trains", "rivers"]) for _ in range(rng.randint(1, 14))
        )
        out.append(f"Q: What is {a} + {b}? Context: {filler}.\nA: {a + b}.")
    return out


def test_pad_reaches_exact_boundary_with_real_tokenizer(smollm2_counter, tokenizers):
    profile = load_profiles().get("openai")
    prompt = "You are a careful assistant. Answer with the number only.\n" * 10
    res = pad_prompt(prompt, _examples(), profile, smollm2_counter)
    r = res.report
    n = len(tokenizers["smollm2"].encode(res.text))  # independent re-count of the joined text
    assert n == r["final_tokens"] == 1024 and r["on_boundary"] and r["status"] == "exact block boundary"
    assert r["stable_end"]["checked"] and r["stable_end"]["stable"]
    # Only whole examples, each behind the separator, in the report's order; nothing else was added.
    exs = _examples()
    assert res.text == prompt.rstrip() + "".join("\n\n" + exs[i - 1] for i in r["chosen"])


def test_pad_unreachable_and_bad_inputs(smollm2_counter, tmp_path):
    profile = load_profiles().get("anthropic-4096")
    with pytest.raises(PlannerError, match="never pads with filler"):
        pad_prompt("Short prompt.", _examples(5), profile, smollm2_counter)
    with pytest.raises(PlannerError, match="prompt is empty"):
        pad_prompt("  \n", _examples(5), profile, smollm2_counter)
    with pytest.raises(PlannerError, match="separator"):
        pad_prompt("Hi.", _examples(5), profile, smollm2_counter, separator="")


def test_load_examples_errors(tmp_path):
    f = tmp_path / "ex.jsonl"
    with pytest.raises(PlannerError, match="not found"):
        load_examples(f)
    f.write_text("")
    with pytest.raises(PlannerError, match="holds no examples"):
        load_examples(f)
    f.write_text('{"text": "ok"}\n{"text": 3}\n')
    with pytest.raises(PlannerError, match="line 2"):
        load_examples(f)
    f.write_text('{"text": "ok"}\n{oops\n')
    with pytest.raises(PlannerError, match="line 2: not valid JSON"):
        load_examples(f)
    f.write_text('"  "\n')
    with pytest.raises(PlannerError, match="line 1: the example is empty"):
        load_examples(f)
    f.write_text("\n".join(json.dumps({"text": f"e{i}"}) for i in range(MAX_EXAMPLES + 1)))
    with pytest.raises(PlannerError, match="more than 2,000 examples"):
        load_examples(f)
    f.write_bytes(b"x" * 101)
    with pytest.raises(PlannerError, match="limit is 100 bytes"):
        load_examples(f, max_bytes=100)
    f.write_bytes(b'"\xff"\n')
    with pytest.raises(PlannerError, match="not UTF-8"):
        load_examples(f)
    assert load_examples(_write(tmp_path, '"a"\n\n{"text": " b "}\n')) == ["a", "b"]


def _write(tmp_path, text, name="x.jsonl"):
    p = tmp_path / name
    p.write_text(text)
    return p


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "tokenseam.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_pad_cli(tmp_path):
    prompt = _write(tmp_path, "You are terse. Reply with a number.\n" * 12, "prompt.txt")
    ex = _write(tmp_path, "\n".join(json.dumps({"text": e}) for e in _examples()), "ex.jsonl")
    out = tmp_path / "padded.txt"
    r = _cli(
        "pad",
        str(prompt),
        "--examples",
        str(ex),
        "--profile",
        "openai",
        "--tokenizer",
        "smollm2",
        "--out",
        str(out),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "padded.txt.report.json").read_text())
    assert rep["final_tokens"] == 1024 and out.read_text().startswith("You are terse.")
    # Unreachable -> exit 3 with the reason, nothing written.
    r = _cli(
        "pad",
        str(prompt),
        "--examples",
        str(ex),
        "--profile",
        "anthropic-4096",
        "--tokenizer",
        "smollm2",
        "--out",
        str(tmp_path / "no.txt"),
    )
    assert r.returncode == 3 and "never pads with filler" in r.stderr and not (tmp_path / "no.txt").exists()
    # Missing prompt, empty examples, unknown profile, bad flag -> clear errors, exit 2.
    r = _cli("pad", str(tmp_path / "absent.txt"), "--examples", str(ex), "--profile", "openai")
    assert r.returncode == 2 and "prompt file not found" in r.stderr
    r = _cli(
        "pad", str(prompt), "--examples", str(_write(tmp_path, "", "empty.jsonl")), "--profile", "openai"
    )
    assert r.returncode == 2 and "holds no examples" in r.stderr
    r = _cli("pad", str(prompt), "--examples", str(ex), "--profile", "nope")
    assert r.returncode == 2 and "unknown profile 'nope'" in r.stderr
    r = _cli(
        "pad", str(prompt), "--examples", str(ex), "--profile", "openai", "--tokenizer", "/no/model.gguf"
    )
    assert r.returncode == 2 and "/no/model.gguf" in r.stderr
    r = _cli("pad", str(prompt), "--profile", "openai")
    assert r.returncode == 2 and "--examples" in r.stderr


def test_oversized_inputs_are_refused(tmp_path):
    from tokenseam.planner.inputs import MAX_PROMPT_BYTES
    from tokenseam.planner.pad import MAX_EXAMPLES_BYTES

    big_prompt = tmp_path / "big.txt"
    big_prompt.write_bytes(b"a" * (MAX_PROMPT_BYTES + 1))
    ex = _write(tmp_path, '"one example"\n', "ex.jsonl")
    r = _cli("pad", str(big_prompt), "--examples", str(ex), "--profile", "openai")
    assert r.returncode == 2 and "the limit is 4,194,304 bytes" in r.stderr
    r = _cli("plan", str(big_prompt), "--profile", "openai")
    assert r.returncode == 2 and "the limit is 4,194,304 bytes" in r.stderr
    big_ex = tmp_path / "big.jsonl"
    big_ex.write_bytes(b'"x"\n' * (MAX_EXAMPLES_BYTES // 4 + 1))
    small = _write(tmp_path, "Prompt.", "p.txt")
    r = _cli("pad", str(small), "--examples", str(big_ex), "--profile", "openai")
    assert r.returncode == 2 and "the limit is 8,388,608 bytes" in r.stderr


def test_pad_without_healing_linter_uses_own_check(smollm2_counter, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_healing(name, globals=None, locals=None, fromlist=(), level=0):
        if "healing" in name or (fromlist and any("lint" == f for f in fromlist) and level):
            raise ImportError("simulated absence")
        return real_import(name, globals, locals, fromlist, level)

    from tokenseam.planner.pad import check_end_stability

    monkeypatch.setattr(builtins, "__import__", no_healing)
    ok = check_end_stability(smollm2_counter, "The end.", ["\n\nQ: x"])
    bad = check_end_stability(smollm2_counter, "The end.\n", ["\n\nQ: x"])
    assert ok.method.startswith("tokenize(text) is a prefix") and ok.stable
    assert not bad.stable and bad.unstable_continuations == ["\n\nQ: x"]


def test_pad_local_profile_aligns_to_16(tokenizers):
    counter = make_counter("smollm2")
    profile = load_profiles().get("local")
    res = pad_prompt("Solve the task. Reply briefly.", _examples(30), profile, counter)
    n = counter.leading_tokens + len(tokenizers["smollm2"].encode(res.text))
    assert n == res.report["final_tokens"] and n % 16 == 0 and res.report["on_boundary"]
    assert res.report["status"].startswith("exact block boundary")


def test_pad_with_approximate_count_raises_the_floor():
    from tokenseam.planner.counting import make_counter as mk

    counter = mk(None)  # hosted profile, no local tokenizer: bytes/4
    profile = load_profiles().get("openai")
    res = pad_prompt("Answer briefly.", _examples(200), profile, counter)
    r = res.report
    assert r["count"]["exact"] is False and r["count"]["relative_error_bound"] == 0.25
    assert r["effective_floor"] == 1280 and r["final_tokens"] >= 1280
    assert r["final_tokens"] == -(-len(res.text.encode()) // 4)
    assert r["stable_end"]["checked"] is False


def test_pad_local_chat_prefix_is_block_aligned_in_rendered_requests(model_paths):
    """With --leading-tokens chat, the padded prefix as the engine tokenizes two real chat requests (template
    header + padded text + different questions) is shared for exactly final_tokens tokens, a multiple of 16."""
    from tokenseam.engine.chat_template import ChatTemplate
    from tokenseam.vocab import Tokenizer, Vocabulary
    from tokenseam.vocab.gguf import read_gguf_metadata

    counter = make_counter("smollm2", leading_tokens="chat")
    res = pad_prompt(
        "Solve the task. Reply with the answer only.", _examples(40), load_profiles().get("local"), counter
    )
    n = res.report["final_tokens"]
    assert n % 16 == 0 and counter.leading_tokens > 0
    path = model_paths["smollm2"]
    tmpl = ChatTemplate(
        read_gguf_metadata(path).get("tokenizer.chat_template"),
        Vocabulary.from_gguf(path),
        Tokenizer.from_gguf(path),
    )
    a = tmpl.encode([{"role": "user", "content": res.text + "\n\nQuestion: what is 2 + 2?"}])
    b = tmpl.encode([{"role": "user", "content": res.text + "\n\nThe list: pear, fig."}])
    common = 0
    while a[common] == b[common]:
        common += 1
    assert common >= n
    assert a[:n] == b[:n]
    # The n shared tokens end exactly where the padded text ends: the header plus the padded text is n tokens.
    tok = Tokenizer.from_gguf(path)
    assert tok.decode(a[:n]).endswith(res.text[-30:].encode()) and tok.decode(a[n : n + 1]).startswith(b"\n")
