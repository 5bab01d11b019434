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
        (["--cached-requests", "1"], "--cached-requests must be between 2 and 500"),
        (["--cached-requests", "-3"], "--cached-requests must be between 2 and 500"),
        (["--cached-requests", "1e3"], "--cached-requests must be an integer"),
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
    argv += ["--cached-requests", "12", "--interleaved-tokens", "2"]
    assert main([*argv, "--prompt-form", "text", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["config"] == {
        "rounds": 2,
        "cached_requests": 12,
        "interleaved_tokens": 2,
        "prompt_form": "text",
    }
    m = res["models"]["smollm2"]
    for rag in (m["rag_plain"], m["rag_stable_keys"]):
        assert rag["requests"] > 0 and 0.99 <= rag["mean_share"] <= 1.0
    lp = m["long_prefix"]["96"]
    assert len(lp["ttft_cached_all_s"]) == 12 and all(c >= 96 for c in lp["cached_tokens"])
    il = m["interleaved_8"]
    assert il["prefixes"] == 8 and il["share"] == 1.0 and il["ttft_median_s"] > 0
    assert [len(r) for r in il["ttft_rounds_s"]] == [8]  # one scored round of 8 requests
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


@pytest.mark.model
def test_every_cached_request_asks_a_question_of_its_own(tokenizers):
    from tokenseam.bench.prefix_cache import QUESTIONS, _questions

    tok = tokenizers["smollm2"]
    ten = _questions(tok)
    assert len(ten) == 11 and tok.decode(ten[0]) == f"\nQuestion: {QUESTIONS[0]}\nAnswer:".encode()
    many = _questions(tok, 25)
    assert many[:11] == ten  # the first ten cached questions are the ones runs have always asked
    texts = [tok.decode(q) for q in many]
    assert len(texts) == 26 and len(set(texts)) == 26
    assert texts[11] == f"\nQuestion 1: {QUESTIONS[1]}\nAnswer:".encode()
    assert len(_questions(tok, 3)) == 4


def test_ratio_interval_resamples_paired_blocks():
    from tokenseam.bench.common import ratio_interval

    theirs = [[0.10 + 0.01 * k] for k in range(20)]
    half = [[x / 2 for x in b] for b in theirs]
    assert ratio_interval(half, theirs) == (0.5, 0.5)  # a constant ratio in every pair: no spread at all
    noisy = [[x * (1.2 if k % 2 else 0.8)] for k, (x,) in enumerate(theirs)]
    lo, hi = ratio_interval(noisy, theirs)
    assert lo < 1.0 < hi and ratio_interval(noisy, theirs) == (lo, hi)  # the same samples, the same interval
    assert ratio_interval(noisy, theirs, level=0.5)[0] >= lo  # a narrower level, a narrower interval
    with pytest.raises(ValueError, match="same number"):
        ratio_interval(half, theirs[:-1])
    with pytest.raises(ValueError, match="same number"):
        ratio_interval([], [])


def test_llama_server_reuse_is_its_cache_n_not_the_tokens_its_slot_holds():
    from tokenseam.bench.prefix_cache import llama_reused

    # the last event of a streamed /completion, as llama-server sends it: 3 of 20 prompt tokens reused, the
    # slot holding 21 (prompt + the answer's token)
    last = {"stop": True, "tokens_cached": 21, "timings": {"cache_n": 3, "prompt_n": 17}}
    assert llama_reused(last, 0) == 3
    assert llama_reused({"content": "a", "stop": False}, 0) == 0  # the events before it carry no count
    assert llama_reused({"tokens_cached": 21}, 5) == 5  # a build without timings: nothing is claimed
    assert llama_reused({"timings": {"cache_n": "3"}}, 0) == 0
