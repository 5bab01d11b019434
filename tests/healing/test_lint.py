"""The boundary linter: flags the unstable seams of the boundary set, passes stable prompts; CLI and bad input."""

from __future__ import annotations

import json

import pytest

from tokenseam.cli import main
from tokenseam.healing import HealingError
from tokenseam.healing.cases import BOUNDARY_CASES, STABLE_PROMPTS
from tokenseam.healing.chat_lint import lint_chat_prompt, load_chat_template, render_chat
from tokenseam.healing.lint import lint_prompt, vocabulary_witnesses
from tokenseam.healing.seam import check_seam

MODELS = ["smollm2", "gemma3"]


@pytest.mark.parametrize("model", MODELS)
def test_flags_every_seam_that_breaks(model, vocabs, tokenizers):
    vocab, tok = vocabs[model], tokenizers[model]
    flagged = 0
    for case in BOUNDARY_CASES:
        seam = check_seam(tok, vocab, case.prefix, case.continuation)
        report = lint_prompt(tok, vocab, case.prefix, model, suggest=False)
        if not seam.canonical_without:  # this continuation really re-tokenizes the prefix on this model
            assert not report.stable, case
            assert report.max_retokenized >= 1
            flagged += 1
    assert flagged >= len(BOUNDARY_CASES) // 3


@pytest.mark.parametrize("model", MODELS)
def test_passes_stable_prompts(model, vocabs, tokenizers):
    vocab, tok = vocabs[model], tokenizers[model]
    for p in STABLE_PROMPTS:
        r = lint_prompt(tok, vocab, p, model)
        assert r.stable and r.unstable == [] and r.max_retokenized == 0 and r.suggestion is None, p


def test_vocabulary_witness_catches_gemma_cjk_word(vocabs, tokenizers):
    vocab, tok = vocabs["gemma3"], tokenizers["gemma3"]
    assert "国" in vocabulary_witnesses(vocab, tok.encode("中华人民共和"))
    r = lint_prompt(tok, vocab, "中华人民共和", "gemma3")
    assert not r.stable and r.max_retokenized == 3  # the whole phrase becomes one token
    assert any(c.category == "vocabulary" and c.continuation == "国" for c in r.unstable)


def test_suggestion_is_a_stable_end(vocabs, tokenizers):
    vocab, tok = vocabs["smollm2"], tokenizers["smollm2"]
    text = "def f():\n    "
    r = lint_prompt(tok, vocab, text, "smollm2")
    assert r.suggestion is not None and r.suggestion.drop_chars is not None
    assert lint_prompt(tok, vocab, text[: -r.suggestion.drop_chars], "smollm2").stable


@pytest.mark.parametrize("bad", ["", None, b"bytes"])
def test_bad_prompt_values(bad, vocabs, tokenizers):
    with pytest.raises(HealingError):
        lint_prompt(tokenizers["smollm2"], vocabs["smollm2"], bad)


def test_chat_template_seams(vocabs, tokenizers, model_paths):
    vocab, tok = vocabs["smollm2"], tokenizers["smollm2"]
    tmpl = load_chat_template(model_paths["smollm2"])
    r = lint_chat_prompt(tok, vocab, tmpl, "What is the capital of France?", "smollm2")
    wheres = [b.where for b in r.boundaries]
    assert (
        "before user text" in wheres
        and "after user text" in wheres
        and wheres[-1] == "end of generation prompt"
    )
    after_user = [b for b in r.boundaries if b.where == "after user text"]
    assert all(b.stable for b in after_user)  # <|im_end|> is a special token: nothing merges across it
    end = r.boundaries[-1]
    assert not end.stable and "\n" in end.unstable  # "assistant\n" + "\n" merges into "\n\n"
    assert not r.stable


def test_chat_template_errors(model_paths):
    with pytest.raises(HealingError, match="no chat template"):
        load_chat_template(model_paths["gemma3"])
    with pytest.raises(HealingError, match="cannot render"):
        render_chat("{% for %}", [])
    with pytest.raises(HealingError, match="refused"):
        render_chat("{{ raise_exception('no system role') }}", [])
    with pytest.raises(HealingError, match="cannot render"):  # the sandbox blocks attribute escapes
        render_chat("{{ ''.__class__.__mro__[1].__subclasses__() }}", [])


# ---------------------------------------------------------------- CLI
def test_cli_exit_codes_and_json(tmp_path, capsys):
    f = tmp_path / "p.txt"
    f.write_text("Answer:", encoding="utf-8")
    assert main(["lint-prompt", str(f)]) == 1
    out = capsys.readouterr().out
    assert "UNSTABLE" in out and "token healing rolls back 1" in out
    assert main(["lint-prompt", "--text", "The year was 1984", "--model", "gemma3"]) == 0
    assert "stable" in capsys.readouterr().out
    assert main(["lint-prompt", "--text", "import num", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["stable"] is False and data["source"] == "--text" and data["unstable"]
    assert all({"category", "continuation", "retokenized"} <= set(c) for c in data["unstable"])


def test_cli_chat_template(capsys):
    assert main(["lint-prompt", "--text", "Hello there", "--chat-template", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["boundaries"] and data["boundaries"][-1]["where"] == "end of generation prompt"
    # Gemma's GGUF has no template: the seams are those of the built-in Gemma turns the server renders
    assert main(["lint-prompt", "--text", "Hi", "--chat-template", "--model", "gemma3", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert any("<start_of_turn>model" in b["context"] for b in data["boundaries"]), data["boundaries"]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["lint-prompt"], "exactly one of FILE or --text"),
        (["lint-prompt", "x.txt", "--text", "a"], "exactly one of FILE or --text"),
        (["lint-prompt", "--text", ""], "empty"),
        (["lint-prompt", "/nonexistent/prompt.txt"], "not found"),
        (["lint-prompt", "--text", "hi", "--model", "no-such-model"], "no model"),
    ],
)
def test_cli_usage_errors(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_bad_files(tmp_path, capsys):
    binary = tmp_path / "b.bin"
    binary.write_bytes(b"GGUF\0\0\x01\x02")
    assert main(["lint-prompt", str(binary)]) == 2
    assert "binary" in capsys.readouterr().err
    latin1 = tmp_path / "l.txt"
    latin1.write_bytes("caf\u00e9".encode("latin-1"))
    assert main(["lint-prompt", str(latin1)]) == 2
    assert "not UTF-8" in capsys.readouterr().err
    empty = tmp_path / "e.txt"
    empty.write_bytes(b"")
    assert main(["lint-prompt", str(empty)]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["lint-prompt", str(tmp_path)]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert main(["lint-prompt", "--text", "hi", "--model", str(latin1)]) == 2
    assert "GGUF" in capsys.readouterr().err


def test_cli_reads_stdin(monkeypatch, capsys):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"self.max_")))
    assert main(["lint-prompt", "-", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["source"] == "<stdin>" and data["heal_removed_text"] == "_"
