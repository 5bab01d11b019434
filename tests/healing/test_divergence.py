"""Where two prompts part and why, on the real vocabularies, and `lint-prompt --against`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tokenseam.healing.divergence import diverge

pytestmark = pytest.mark.model


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_causes_on_real_tokenizations(model, vocabs, tokenizers):
    tok, vocab = tokenizers[model], vocabs[model]
    base = tok.encode("Hello there. ", add_special=False)
    nl = tok.encode("\n", add_special=False)
    # the same text cut differently: "\n" "\n" then the rest, against the text tokenized whole
    split = base + nl + nl + tok.encode("More text here.", add_special=False)
    whole = tok.encode("Hello there. \n\nMore text here.", add_special=False)
    d = diverge(vocab, split, whole)
    if split != whole:
        assert d.cause == "retokenized" and d.same_bytes >= 2
    edit = diverge(
        vocab,
        base + tok.encode("Paris is big.", add_special=False),
        base + tok.encode("Rome is old.", add_special=False),
    )
    assert edit.cause == "edited" and edit.at == len(base)
    think = tok.encode("<think>a long thought here</think>", add_special=False)
    rest = tok.encode("The answer is four.", add_special=False)
    strip = diverge(vocab, base + rest, base + think + rest)
    assert strip.cause == "stripped" and strip.removed == "a"
    assert strip.removed_bytes == len(b"<think>a long thought here</think>")
    assert diverge(vocab, base, base + rest).cause == "extended"
    assert diverge(vocab, base, base).cause == "same"
    # an answer that ended with the model's own end token, where the next prompt's template writes other text
    for end in sorted(vocab.eos_token_ids):
        mark = tok.encode("</turn>\n", add_special=False)
        eot = diverge(vocab, base + rest + [end] + base, base + rest + mark + base)
        assert eot.cause == "end_of_turn" and eot.end_token == "a" and eot.at == len(base + rest)
        assert eot.to_json()["end_token_in"] == "a"
        assert diverge(vocab, base + mark, base + [end]).end_token == "b"


def run_lint(*args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "tokenseam.cli", "lint-prompt", *args],
        capture_output=True,
        text=True,
        timeout=120,
        input=stdin,
    )


def test_lint_prompt_against(tmp_path):
    a = tmp_path / "a.txt"
    b = tmp_path / "b.txt"
    a.write_text("System: be brief.\nUser: what is 2+2?\nAssistant: 4\n\nUser: and 3+3?")
    b.write_text("System: be brief.\nUser: what is 2+2?\nAssistant: 5\n\nUser: and 3+3?")
    r = run_lint(str(a), "--against", str(b), "--json")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["cause"] == "edited" and out["a"]["source"] == str(a)
    assert "4" in out["a"]["text"] and "5" in out["b"]["text"]
    same = run_lint(str(a), "--against", str(a))
    assert same.returncode == 0 and "same ids" in same.stdout
    ids = tmp_path / "ids.json"
    ids.write_text("[1, 2, 3]")
    longer = tmp_path / "ids2.json"
    longer.write_text("[1, 2, 3, 4]")
    r = run_lint(str(ids), "--against", str(longer), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["cause"] == "extended"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--against", "MISSING"], "not found"),
        (["--against", "A", "--chat-template"], "no --chat-template"),
        (["--special"], "--special goes with --against"),
        (["--against", "BAD_IDS"], "outside the vocabulary"),
        (["--against", "BINARY"], "binary"),
    ],
)
def test_lint_prompt_against_bad_input(tmp_path, args, message):
    a = tmp_path / "a.txt"
    a.write_text("hello")
    (tmp_path / "bad.json").write_text("[1, 99999999]")
    (tmp_path / "bin.txt").write_bytes(b"ab\x00cd")
    names = {
        "A": str(a),
        "MISSING": str(tmp_path / "nope.txt"),
        "BAD_IDS": str(tmp_path / "bad.json"),
        "BINARY": str(tmp_path / "bin.txt"),
    }
    r = run_lint(str(a), *[names.get(x, x) for x in args])
    assert r.returncode == 2 and message in r.stderr, r.stderr
