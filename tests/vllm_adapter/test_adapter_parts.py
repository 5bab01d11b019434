"""The adapter's vLLM-free parts: the vocabulary of a tokenizer, end-id masks, healing rollback, the client
helper and the `tokenseam vllm serve` command line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from tokenseam.constraint import bitmask_to_bool
from tokenseam.grammar import GrammarCompiler, GrammarMatcher
from tokenseam.healing import HealingConstraint, HealingError
from tokenseam.vllm.cli import HEALING_PROCESSOR, serve_command
from tokenseam.vllm.client import HealedPrompt, Healer
from tokenseam.vllm.setup import STATE, SetupError
from tokenseam.vllm.vocabulary import vocabulary_of
from tokenseam.vllm.xargs import HEALING_KEY
from tokenseam.vocab import Vocabulary, VocabularyError

TOKENIZER_JSON = {
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġc": 3}},
    "added_tokens": [{"id": 4, "content": "<|end|>", "special": True}],
    "decoder": {"type": "ByteLevel"},
}


class FakeBackend:
    def to_str(self) -> str:
        return json.dumps(TOKENIZER_JSON)


class FakeTokenizer:
    backend_tokenizer = FakeBackend()
    eos_token_id = 4
    name_or_path = "fake"


def test_vocabulary_of_a_tokenizer_is_padded_to_the_model():
    v = vocabulary_of(FakeTokenizer(), vocab_size=40)
    assert v.size == 40 and v.mask_words == 2
    assert v.token_bytes[3] == b" c" and v.is_special[4] and v.eos_token_ids == frozenset({4})
    assert all(v.is_special[5:]) and all(b == b"" for b in v.token_bytes[5:])
    with pytest.raises(VocabularyError, match="more than the model"):
        vocabulary_of(FakeTokenizer(), vocab_size=3)
    with pytest.raises(VocabularyError, match="outside the vocabulary"):
        Vocabulary.from_hf_tokenizer_data(TOKENIZER_JSON, eos_token_ids={99})
    with pytest.raises(VocabularyError, match="JSON object"):
        Vocabulary.from_hf_tokenizer_data([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fast tokenizer"):
        vocabulary_of(object())


def test_padded_ids_are_never_allowed():
    v = vocabulary_of(FakeTokenizer(), vocab_size=40)
    m = GrammarMatcher(GrammarCompiler(v).compile_regex("(a|b)+"), end_ids=[4])
    row = np.zeros(v.mask_words, dtype=np.int32)
    m.fill_next_token_bitmask(row)
    assert np.flatnonzero(bitmask_to_bool(row, v.size)).tolist() == [0, 1, 2]
    assert m.accept_token(2)
    m.fill_next_token_bitmask(row)
    assert np.flatnonzero(bitmask_to_bool(row, v.size)).tolist() == [0, 1, 2, 4]


def test_matcher_end_ids_replace_the_vocabularys(smollm2_vocab):
    g = GrammarCompiler(smollm2_vocab).compile_choice(["ok"])
    assert 0 in smollm2_vocab.eos_token_ids and 2 in smollm2_vocab.eos_token_ids
    m = GrammarMatcher(g, end_ids={2})
    assert m.accept_bytes(b"ok")
    row = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
    m.fill_next_token_bitmask(row)
    ok = bitmask_to_bool(row, smollm2_vocab.size)
    assert ok[2] and not ok[0]
    assert not m.accept_token(0) and m.accept_token(2)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        GrammarMatcher(g, end_ids={-1})


def test_healing_rollback(smollm2_vocab):
    v = smollm2_vocab
    h = HealingConstraint(v, b"http:")
    first = next(i for i in h.allowed_ids() if v.token_bytes[i] == b"http")
    h.accept(int(first))
    colon = next(i for i in h.allowed_ids() if v.token_bytes[i] == b"://")
    h.accept(int(colon))
    assert not h.is_active() and h.overflow == b"//"
    h.accept(5)
    h.rollback(2)
    assert h.is_active() and h.remaining == b":" and h.overflow == b"" and h.output_ids == [first]
    h.rollback(1)
    assert h.remaining == b"http:"
    for bad in (1, -1, True, 1.0):
        with pytest.raises(HealingError):
            h.rollback(bad)


def test_healed_prompt_request_fields():
    hp = HealedPrompt([1, 2], [3], b":")
    assert hp.healed
    assert hp.extra_body(structured_outputs={"regex": "a"}, vllm_xargs={"x": 1}) == {
        "structured_outputs": {"regex": "a"},
        "vllm_xargs": {"x": 1, HEALING_KEY: "3a"},
    }
    assert hp.completion("://x") == "//x"
    with pytest.raises(ValueError, match="does not start with"):
        hp.completion("//x")
    plain = HealedPrompt([1], [], b"")
    assert plain.extra_body() == {} and plain.completion("abc") == "abc"


def test_healer_rolls_back_with_the_models_bytes(smollm2_vocab, tokenizers):
    tok = tokenizers["smollm2"]
    healer = Healer(smollm2_vocab, tok.encode)
    hp = healer.heal("The link is http:")
    assert (
        hp.removed.endswith(b":")
        and b"".join(smollm2_vocab.token_bytes[i] for i in hp.removed_ids) == hp.removed
    )
    assert healer.heal("The link is http:", max_rollback=0).removed == b""
    assert healer.heal([1, 2, 3]).prompt_token_ids + healer.heal([1, 2, 3]).removed_ids == [1, 2, 3]


def _args(venv: Path, **kw) -> argparse.Namespace:
    base = {"venv": venv, "model": None, "host": "127.0.0.1", "port": 8123, "no_healing": False}
    return argparse.Namespace(**{**base, **kw})


def test_serve_command(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    model = tmp_path / "models" / "smollm2"
    (tmp_path / STATE).write_text(
        json.dumps({"models": {"smollm2": {"path": str(model)}}, "default_model": "smollm2"})
    )
    cmd, env = serve_command(_args(tmp_path), [])
    joined = " ".join(cmd)
    assert cmd[:3] == [str(tmp_path / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]
    assert f"--model {model}" in joined and "--port 8123" in joined and "--host 127.0.0.1" in joined
    assert '{"backend": "tokenseam"}' in cmd and HEALING_PROCESSOR in cmd
    assert "--dtype float32" in joined and "--enforce-eager" in cmd
    assert env["OMP_NUM_THREADS"] == "1" and "PYTHONPATH" not in env
    # a vLLM flag given by the user replaces tokenseam's default
    cmd, _ = serve_command(_args(tmp_path), ["--dtype", "bfloat16", "--max-num-seqs", "4"])
    assert cmd.count("--dtype") == 1 and cmd[-4:] == ["--dtype", "bfloat16", "--max-num-seqs", "4"]
    cmd, _ = serve_command(_args(tmp_path), ["--speculative-config", "{}"])
    assert HEALING_PROCESSOR not in cmd
    cmd, _ = serve_command(_args(tmp_path, no_healing=True), [])
    assert HEALING_PROCESSOR not in cmd
    with pytest.raises(SetupError, match="no model 'gemma3'"):
        serve_command(_args(tmp_path, model="gemma3"), [])
    with pytest.raises(SetupError, match="not an environment"):
        serve_command(_args(tmp_path / "nowhere"), [])


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({"backends": "xgrammar"}, "must name tokenseam"),
        ({"backends": "tokenseam,outlines"}, "must name tokenseam"),
        ({"concurrency": "1,x"}, "comma-separated"),
        ({"concurrency": "0"}, "between 1 and 64"),
        ({"tokens": 4}, "--tokens"),
        ({"rounds": 0}, "--rounds"),
        ({"maskbench": Path("/nonexistent-dir")}, "not a directory"),
    ],
)
def test_bench_vllm_arguments(kw, needle):
    from tokenseam.bench.vllm import _check_args

    base = {"backends": "tokenseam,xgrammar", "concurrency": "1,8", "tokens": 128, "rounds": 3}
    args = argparse.Namespace(**{**base, "maskbench": None, "maskbench_limit": 300, **kw})
    with pytest.raises(ValueError, match=needle):
        _check_args(args)


def test_healing_processor_detection():
    from types import SimpleNamespace

    from tokenseam.vllm.plugin import HEALING_PROCESSOR, _healing_processor_loaded

    class HealingLogitsProcessor:  # what vLLM holds when the class itself was given
        pass

    HealingLogitsProcessor.__module__ = "tokenseam.vllm.healing_processor"
    HealingLogitsProcessor.__qualname__ = "HealingLogitsProcessor"
    for procs in (
        [HEALING_PROCESSOR],
        [HEALING_PROCESSOR.replace(":", ".")],
        ["x:Y", HealingLogitsProcessor],
    ):
        assert _healing_processor_loaded(SimpleNamespace(logits_processors=procs))
    for procs in (None, [], ["other.module:HealingLogitsProcessor"]):
        assert not _healing_processor_loaded(SimpleNamespace(logits_processors=procs))


def test_setup_says_when_vllm_cannot_be_installed(tmp_path, capsys):
    """Where the vLLM requirement cannot be installed, setup stops with VenvUnavailable (the tests then skip)
    and says why; nothing else is attempted."""
    from tokenseam.vllm.setup import VenvUnavailable, setup

    with pytest.raises(VenvUnavailable) as e:
        setup(tmp_path / "venv", ["smollm2"], vllm_spec="tokenseam-no-such-package==0.0.1")
    assert "could not be installed" in str(e.value) and "tokenseam-no-such-package" in str(e.value)
    assert not (tmp_path / "venv" / STATE).exists()
    assert "installing tokenseam-no-such-package==0.0.1" in capsys.readouterr().out


def test_setup_refuses_a_malformed_vllm_requirement(tmp_path):
    from tokenseam.vllm.setup import setup

    with pytest.raises(SetupError, match="is not a requirement"):
        setup(tmp_path / "venv", ["smollm2"], vllm_spec="==0.32")
    assert not (tmp_path / "venv").exists()  # refused before anything is built


def test_grammar_cache_budget_reaches_the_backend(tmp_path):
    """`tokenseam vllm serve --grammar-cache-mb N` sets TOKENSEAM_GRAMMAR_CACHE_MB for the engine-core
    process, whose backend reads it as its compiler's budget; a bad value is an error naming the variable."""
    from tokenseam.grammar.memory import DEFAULT_BUDGET_MB
    from tokenseam.vllm.requests import grammar_cache_bytes

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    (tmp_path / STATE).write_text(
        json.dumps({"models": {"smollm2": {"path": str(tmp_path / "m")}}, "default_model": "smollm2"})
    )
    _, env = serve_command(_args(tmp_path, grammar_cache_mb=64), [])
    assert env["TOKENSEAM_GRAMMAR_CACHE_MB"] == "64" and grammar_cache_bytes(env) == 64 << 20
    assert grammar_cache_bytes({}) == DEFAULT_BUDGET_MB << 20
    assert grammar_cache_bytes({"TOKENSEAM_GRAMMAR_CACHE_MB": "0"}) == 0
    for bad in ("-1", "1.5", "lots", str((1 << 20) + 1)):
        with pytest.raises(ValueError, match="TOKENSEAM_GRAMMAR_CACHE_MB"):
            grammar_cache_bytes({"TOKENSEAM_GRAMMAR_CACHE_MB": bad})
