"""`tokenseam bench prefix-cache`: its options' errors, and a small run on SmolLM2 (no anchor)."""

from __future__ import annotations

import json

import pytest

from tokenseam.cli import main


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--rounds", "1"], "--rounds must be between 2 and 100"),
        (["--interleaved-tokens", "0"], "--interleaved-tokens must be between 1 and 64"),
        (["--interleaved-tokens", "four"], "--interleaved-tokens must be an integer"),
        (["--prompt-form", "bytes"], "--prompt-form: invalid choice"),
    ],
)
def test_bad_options_are_clear_errors(argv, says, tmp_path, capsys):
    with pytest.raises(SystemExit) as ei:
        main(["bench", "prefix-cache", *argv, "--out", str(tmp_path / "x.json")])
    assert ei.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.model
@pytest.mark.server
def test_a_small_run_on_smollm2(tmp_path):
    """Prompts as text, as clients send them (the server tokenizes each; `ids` sends the same ids directly)."""
    out = tmp_path / "pc.json"
    argv = ["bench", "prefix-cache", "--models", "smollm2", "--long-prefix-tokens", "96", "--rounds", "2"]
    assert main([*argv, "--interleaved-tokens", "2", "--prompt-form", "text", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["config"] == {"rounds": 2, "interleaved_tokens": 2, "prompt_form": "text"}
    m = res["models"]["smollm2"]
    for rag in (m["rag_plain"], m["rag_stable_keys"]):
        assert rag["requests"] > 0 and 0.99 <= rag["mean_share"] <= 1.0
    lp = m["long_prefix"]["96"]
    assert len(lp["ttft_cached_all_s"]) == 10 and all(c >= 96 for c in lp["cached_tokens"])
    il = m["interleaved_8"]
    assert il["prefixes"] == 8 and il["share"] == 1.0 and il["ttft_median_s"] > 0
    one = m["one_slot"]  # the same workloads on a one-slot server
    assert m["flash_attn"] == {"tokenseam": False, "tokenseam-p1": False}  # no sliding-window layers
    assert all(c >= 96 for c in one["long_prefix"]["96"]["cached_tokens"])
    assert one["interleaved_8"]["prefixes"] == 8 and one["interleaved_8"]["ttft_median_s"] > 0
    assert "llama_server" not in m


@pytest.mark.model
def test_a_text_prompt_is_the_text_of_the_ids(tokenizers):
    from tokenseam.bench.prefix_cache import _doc_ids, _form, _questions

    tok = tokenizers["smollm2"]
    ids = _doc_ids(tok, 300, seed=3) + _questions(tok)[1]
    assert _form(tok, ids, "ids") is ids
    text = _form(tok, ids, "text")
    assert isinstance(text, str) and text.encode() == tok.decode(ids)
    assert text.startswith("Document:\n") and text.endswith("\nAnswer:")


def test_llama_server_reuse_is_its_cache_n_not_the_tokens_its_slot_holds():
    from tokenseam.bench.prefix_cache import llama_reused

    # the last event of a streamed /completion, as llama-server sends it: 3 of 20 prompt tokens reused, the
    # slot holding 21 (prompt + the answer's token)
    last = {"stop": True, "tokens_cached": 21, "timings": {"cache_n": 3, "prompt_n": 17}}
    assert llama_reused(last, 0) == 3
    assert llama_reused({"content": "a", "stop": False}, 0) == 0  # the events before it carry no count
    assert llama_reused({"tokens_cached": 21}, 5) == 5  # a build without timings: nothing is claimed
    assert llama_reused({"timings": {"cache_n": "3"}}, 0) == 0
