"""`tokenseam bench conversation`: the workload, the reuse arithmetic, and one small run on SmolLM2."""

from __future__ import annotations

import argparse
import asyncio
import json

import httpx
import pytest

from tokenseam.bench import conversation as cv
from tokenseam.bench.conversation import (
    KINDS,
    TARGET,
    TOOLS,
    Step,
    TurnResult,
    _assistant_message,
    _read_chunk,
    cached_tokens,
    make_conversations,
    reuse_fraction,
    summarize,
    tool_result,
    ttft_ratio,
    warmup_conversations,
)
from tokenseam.cli import main

# ------------------------------------------------------------------------------------------- the workload


def test_the_workload_is_deterministic_and_seed_dependent():
    a = make_conversations(8, 6, seed=3)
    assert a == make_conversations(8, 6, seed=3)
    assert a != make_conversations(8, 6, seed=4)
    assert [c.id for c in a] == [c.id for c in make_conversations(8, 6, seed=4)]  # ids name kind and index
    assert len({c.seed for c in a}) == 8  # one request seed per conversation


def test_warmup_conversations_are_their_own():
    args = argparse.Namespace(warmup=2, kinds="chat,tools", seed=5)
    w = warmup_conversations(args)
    assert [c.kind for c in w] == ["chat", "tools"] * 2 and all(len(c.steps) == 2 for c in w)
    assert all(c.id.startswith("warmup-") for c in w)
    measured = make_conversations(4, 2, seed=5, kinds=("chat", "tools"))
    assert [c.steps for c in w] != [c.steps for c in measured]
    assert warmup_conversations(argparse.Namespace(warmup=0, kinds="chat", seed=0)) == []


def test_every_kind_is_played_in_turn():
    convs = make_conversations(8, 4)
    assert [c.kind for c in convs] == list(KINDS) * 2
    assert {c.kind for c in make_conversations(3, 4, kinds=("korean",))} == {"korean"}
    with pytest.raises(ValueError):
        make_conversations(2, 4, kinds=())


@pytest.mark.parametrize("turns", [2, 5, 12, 20])
def test_steps_are_well_formed(turns):
    for c in make_conversations(8, turns, seed=1):
        assert len(c.steps) == turns and all(isinstance(s, Step) for s in c.steps)
        first = c.first_messages()
        assert first[0]["role"] == "system" and isinstance(first[0]["content"], str) and first[0]["content"]
        if c.kind == "tools":
            assert c.tools == tuple(TOOLS)
            for t, s in enumerate(c.steps):
                if t % 2 == 0:  # a question that forces a call
                    assert s.tool_choice == "required" and s.user
                else:  # the results go back, nothing new from the user
                    assert s.tool_choice == "none" and s.user is None
        else:
            assert c.tools == ()
            assert all(s.user and s.tool_choice is None for s in c.steps)


def test_the_kinds_carry_what_they_are_for():
    convs = make_conversations(40, 8, seed=0)
    text = {k: "\n".join(s.user or "" for c in convs if c.kind == k for s in c.steps) for k in KINDS}
    assert "```" in text["code"] and "\n    " in text["code"] and "\t" in text["code"]
    assert any("\uac00" <= ch <= "\ud7a3" for ch in text["korean"])  # Hangul syllables
    assert any(ord(ch) >= 0x1F300 for ch in text["korean"])  # emoji beyond the BMP
    assert "\u200d" in text["korean"]  # a ZWJ sequence
    for t in TOOLS:
        assert set(t) == {"type", "function"} and t["type"] == "function"
        assert t["function"]["parameters"]["type"] == "object"


def test_tool_results_are_json_and_depend_only_on_the_call():
    (c,) = [c for c in make_conversations(4, 4) if c.kind == "tools"]
    args = '{"city":"Seoul"}'
    r = tool_result(c, 1, 0, "get_weather", args)
    assert r == tool_result(c, 1, 0, "get_weather", args)
    assert json.loads(r)["city"] == "Seoul"
    assert json.loads(tool_result(c, 1, 0, "convert_currency", '{"amount":2,"from_currency":"EUR"}'))
    assert json.loads(tool_result(c, 1, 0, "search_notes", "not json"))["query"] == ""
    assert "error" in json.loads(tool_result(c, 1, 0, "nope", "{}"))


# ------------------------------------------------------------------------------------------- the client


def test_streamed_chunks_make_the_answer():
    res = TurnResult(status=200)

    def chunk(delta=None, **top):
        return {"choices": [] if delta is None else [{"index": 0, "delta": delta}], **top}

    _read_chunk(res, chunk({"role": "assistant", "content": ""}), 0.0)
    assert res.ttft_s is None  # the opening chunk is not the first token
    _read_chunk(res, chunk({}), 0.0)
    assert res.ttft_s is None
    # a call in pieces (as llama-server streams it), then the usage chunk
    _read_chunk(
        res, chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "get_weather"}}]}), 0.0
    )
    assert res.ttft_s is not None
    _read_chunk(res, chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}), 0.0)
    _read_chunk(res, chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Seoul"}'}}]}), 0.0)
    usage = {"prompt_tokens": 9, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}
    _read_chunk(res, chunk(usage=usage, prefix_cache={"matched_tokens": 4, "cause": "new text"}), 0.0)
    assert res.usage == usage and res.prefix_cache["cause"] == "new text"
    assert _assistant_message(res) == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Seoul"}'},
            }
        ],
    }
    text = TurnResult(status=200)
    for piece in ["안녕", "하세요 👋", "\n"]:
        _read_chunk(text, chunk({"content": piece}), 0.0)
    assert _assistant_message(text) == {"role": "assistant", "content": "안녕하세요 👋\n"}


def test_cached_tokens_come_from_usage_or_llama_timings():
    assert cached_tokens(TurnResult(200, usage={"prompt_tokens_details": {"cached_tokens": 7}})) == (
        7,
        "usage",
    )
    assert cached_tokens(TurnResult(200, usage={"prompt_tokens": 9}, timings={"cache_n": 5})) == (
        5,
        "timings.cache_n",
    )
    assert cached_tokens(TurnResult(200)) == (None, "none")


def test_a_request_without_a_response_is_sent_once_more(monkeypatch):
    calls = []

    async def flaky(client, url, body):
        calls.append(url)
        if len(calls) % 2:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return cv.TurnResult(status=200)

    monkeypatch.setattr(cv, "stream_chat", flaky)
    res = asyncio.run(cv._send(None, "u", {}))
    assert res.retried and len(calls) == 2

    async def dead(client, url, body):
        raise httpx.ConnectError("refused")

    monkeypatch.setattr(cv, "stream_chat", dead)
    with pytest.raises(httpx.ConnectError):
        asyncio.run(cv._send(None, "u", {}))


def _fake_server(monkeypatch, answer):
    """stream_chat replaced by `answer(body, n) -> TurnResult`; returns the bodies it was sent (copied)."""
    sent = []

    async def fake(client, url, body):
        sent.append(json.loads(json.dumps(body)))
        return answer(body, len(sent))

    monkeypatch.setattr(cv, "stream_chat", fake)
    return sent


def _usage(prompt, completion, cached):
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def test_a_tools_conversation_sends_the_openai_shapes(monkeypatch):
    (conv,) = make_conversations(1, 4, kinds=("tools",))
    call = {
        "id": "call_a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Seoul"}'},
    }

    def answer(body, n):
        if n == 1:  # the forced call
            return TurnResult(200, 0.1, "", [call], "tool_calls", _usage(300, 20, 0))
        if n == 2:
            return TurnResult(200, 0.1, "It is sunny.", [], "stop", _usage(350, 5, 320))
        return TurnResult(200, 0.1, "No call.", [], "length", _usage(380, 9, 355))  # a call that did not come

    sent = _fake_server(monkeypatch, answer)
    args = argparse.Namespace(max_tokens=32, ctx=4096, temperature=0.8)
    out = asyncio.run(cv.run_conversation(None, cv.Server("s", "u", "m", {"x": 1}), conv, args, len))
    assert len(sent) == 4 and "stopped" not in out
    for b in sent:
        assert b["stream"] and b["stream_options"] == {"include_usage": True} and b["x"] == 1
        assert b["seed"] == conv.seed and b["temperature"] == 0.8 and b["parallel_tool_calls"] is False
        assert b["tools"] == list(TOOLS)
    assert [b["tool_choice"] for b in sent] == ["required", "none", "required", "none"]
    roles = [m["role"] for m in sent[3]["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "assistant", "user"]
    m = sent[3]["messages"]
    assert m[2] == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert m[3]["tool_call_id"] == "call_a" and json.loads(m[3]["content"])["city"] == "Seoul"
    assert m[4] == {"role": "assistant", "content": "It is sunny."}
    assert m[7]["content"] == cv.FOLLOW_UP_AFTER_MISSED_CALL  # nothing to send back, so the user nudges
    t = out["turns"]
    assert [r["previous_context"] for r in t] == [None, 320, 355, 389]
    assert t[1]["reuse"] == 1.0 and t[2]["reuse"] == 1.0 and t[3]["reuse"] == pytest.approx(355 / 389)
    assert t[2]["call_missing"] and not t[0].get("call_missing")
    assert summarize([out])["forced_calls"] == {"forced": 2, "missing": 1, "missing_at_length": 1}


def test_a_conversation_stops_before_it_outgrows_the_context(monkeypatch):
    (conv,) = make_conversations(1, 5, kinds=("chat",))
    _fake_server(
        monkeypatch, lambda body, n: TurnResult(200, 0.1, "x" * 10, [], "length", _usage(900 * n, 100, 0))
    )
    args = argparse.Namespace(max_tokens=100, ctx=2048, temperature=0.8)
    out = asyncio.run(cv.run_conversation(None, cv.Server("s", "u", "m", {}), conv, args, len))
    assert [r["turn"] for r in out["turns"]] == [1, 2]  # turn 3 would start from 1,900 tokens + 100 to write
    assert out["stopped"]["turn"] == 3 and out["stopped"]["reason"] == "context"


def test_a_refused_request_stops_its_conversation_and_says_why(monkeypatch):
    (conv,) = make_conversations(1, 3, kinds=("korean",))
    _fake_server(
        monkeypatch, lambda body, n: TurnResult(400, error="the chat template rejected these messages")
    )
    args = argparse.Namespace(max_tokens=16, ctx=4096, temperature=0.8)
    out = asyncio.run(cv.run_conversation(None, cv.Server("s", "u", "m", {}), conv, args, len))
    assert out["turns"] == []
    assert out["stopped"] == {
        "turn": 1,
        "reason": "error",
        "status": 400,
        "message": "the chat template rejected these messages",
    }


# ------------------------------------------------------------------------------------- the reuse arithmetic


def test_reuse_fraction():
    assert reuse_fraction(None, 100) is None
    assert reuse_fraction(50, None) is None  # turn 1
    assert reuse_fraction(99, 100) == pytest.approx(0.99)
    assert reuse_fraction(130, 100) == 1.0  # never more than the previous context


def _rec(turn, prompt, completion, cached, prev, ttft, cause=None):
    r = {
        "turn": turn,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "cached_tokens": cached,
        "previous_context": prev,
        "reuse": reuse_fraction(cached, prev),
        "ttft_s": ttft,
    }
    if cause:
        r["prefix_cache_cause"] = cause
    return r


def test_summary_from_constructed_turns():
    a = {
        "id": "chat-000",
        "kind": "chat",
        "turns": [
            _rec(1, 100, 50, 0, None, 1.0),
            _rec(2, 200, 40, 150, 150, 0.1),  # all of it
            _rec(3, 300, 30, 216, 240, 0.3, cause="retokenized"),  # 0.9
        ],
    }
    b = {
        "id": "code-001",
        "kind": "code",
        "turns": [
            _rec(1, 80, 20, 16, None, 2.0),
            _rec(2, 150, 10, 99, 100, 0.2),  # 0.99
            {**_rec(3, 190, 30, 160, 160, 9.0), "call_forced": True},  # reuse counts, its TTFT does not
        ],
        "stopped": {"turn": 4, "reason": "context"},
    }
    s = summarize([a, b])
    t1, t2, t3 = s["turns"]["1"], s["turns"]["2"], s["turns"]["3"]
    assert t1["turns"] == 2 and t1["n"] == 0 and t1["reuse_median"] is None
    assert t1["ttft_median_s"] == pytest.approx(1.5) and t1["ttft_p90_s"] == 2.0
    assert t2["n"] == 2 and t2["reuse_median"] == pytest.approx(0.995) and t2["reuse_min"] == 0.99
    assert t2["share_at_target"] == 0.5
    assert t3["n"] == 2 and t3["reuse_min"] == pytest.approx(0.9) and t3["share_at_target"] == 0.5
    assert t3["turns"] == 2 and t3["ttft_n"] == 1 and t3["ttft_median_s"] == 0.3
    o = s["overall"]
    assert o["n"] == 4 and o["reuse_median"] == pytest.approx(0.995) and o["reuse_min"] == pytest.approx(0.9)
    assert o["share_at_target"] == 0.5 and o["target_met"] is False
    assert s["by_kind"]["code"] == {"n": 2, "reuse_median": 0.995, "reuse_min": 0.99, "share_at_target": 0.5}
    assert [(x["conversation"], x["turn"], x["cause"]) for x in s["below_target"]] == [
        ("chat-000", 3, "retokenized"),
        ("code-001", 2, None),
    ]
    assert s["stopped_early"] == [{"conversation": "code-001", "turn": 4, "reason": "context"}]
    assert s["target"] == TARGET
    assert s["forced_calls"] == {"forced": 1, "missing": 0, "missing_at_length": 0}
    assert s["retried_turns"] == 0

    whole = summarize([{**a, "turns": a["turns"][:2]}])
    assert whole["overall"]["target_met"] is True and whole["below_target"] == []

    anchor = summarize([{"id": "x", "kind": "chat", "turns": [_rec(1, 1, 1, 0, None, 0.5)]}])
    assert ttft_ratio(s, anchor) == {"1": pytest.approx(3.0), "2": None, "3": None}
    assert ttft_ratio(anchor, s) == {"1": pytest.approx(1 / 3)}


# ----------------------------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--turns", "0"], "--turns must be between"),
        (["--conversations", "0"], "--conversations must be between"),
        (["--temperature", "hot"], "--temperature must be a number"),
    ],
)
def test_bad_counts_are_refused(argv, says, tmp_path, capsys):
    with pytest.raises(SystemExit) as ei:
        main(["bench", "conversation", *argv, "--out", str(tmp_path / "x.json")])
    assert ei.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--models", "no-such-model"], "--models: no model 'no-such-model'"),
        (["--kinds", "chat,poetry"], "unknown kind(s) poetry"),
        (["--llama-server", "/nonexistent/llama-server"], "is not an executable file"),
        (["--llama-parallel", "1,x"], "--llama-parallel"),
    ],
)
def test_bad_inputs_are_clear_errors(argv, says, tmp_path, capsys):
    out = tmp_path / "x.json"
    assert main(["bench", "conversation", "--models", "smollm2", *argv, "--out", str(out)]) == 2
    assert says in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.model
@pytest.mark.server
def test_a_small_run_on_smollm2(tmp_path):
    out = tmp_path / "conv.json"
    fake = tmp_path / "llama-server"  # an anchor that fails to start: recorded, tokenseam's figures kept
    fake.write_text("#!/bin/sh\necho 'no model here' >&2\nexit 3\n")
    fake.chmod(0o755)
    argv = ["bench", "conversation", "--models", "smollm2", "--conversations", "2", "--turns", "3"]
    argv += ["--llama-server", str(fake)]
    assert (
        main([*argv, "--kinds", "chat,tools", "--max-tokens", "40", "--warmup", "0", "--out", str(out)]) == 0
    )
    res = json.loads(out.read_text())
    assert {"machine", "config", "target", "metric", "workload", "models"} <= set(res)
    assert [w["kind"] for w in res["workload"]] == ["chat", "tools"]
    m = res["models"]["smollm2"]
    assert m["chat_template"] == "gguf"  # read off the `tokenseam serve` process's startup line
    assert set(m["servers"]) == {"tokenseam", "llama-server-np1"}
    ls = m["servers"]["llama-server-np1"]
    assert "exited with code 3" in ls["error"] and "no model here" in ls["error"]
    assert ls["config"]["flags"] == ["--jinja"] and m["ttft_ratio_vs"] == {}
    s = m["servers"]["tokenseam"]
    assert [c["id"] for c in s["conversations"]] == ["chat-000", "tools-001"]
    for conv in s["conversations"]:
        assert "stopped" not in conv, conv.get("stopped")
        assert [t["turn"] for t in conv["turns"]] == [1, 2, 3]
        for t in conv["turns"]:
            assert t["prompt_tokens"] > 0 and 0 < t["completion_tokens"] <= 40
            assert 0 <= t["cached_tokens"] <= t["prompt_tokens"] and t["cached_source"] == "usage"
            if t["turn"] == 1:
                assert t["reuse"] is None and t["previous_context"] is None
            else:
                assert 0 <= t["reuse"] <= 1
                prev = conv["turns"][t["turn"] - 2]
                assert t["previous_context"] == prev["prompt_tokens"] + prev["completion_tokens"]
                assert t["prompt_tokens"] > t["previous_context"]  # the history came back, and more
    call, answer, _ = s["conversations"][1]["turns"]
    assert call["call_forced"] and answer.get("call_forced") is None
    if call["finish_reason"] == "tool_calls":  # the forced call fitted in max_tokens: one call
        assert call["tool_calls"] == 1
    else:
        assert call["finish_reason"] == "length" and call["completion_tokens"] == 40
    for t in [t for conv in s["conversations"] for t in conv["turns"]]:  # when the server reports it
        if "prefix_cache" in t:
            assert 0 <= t["prefix_cache"]["matched_tokens"] <= t["prompt_tokens"]
            assert (
                isinstance(t["prefix_cache_cause"], str)
                and t["prefix_cache_cause"] == t["prefix_cache"]["cause"]
            )
    summary = s["summary"]
    assert set(summary["turns"]) == {"1", "2", "3"} and summary["overall"]["n"] == 4
    assert 0 <= summary["overall"]["reuse_min"] <= summary["overall"]["reuse_median"] <= 1
    assert out.with_suffix(".png").stat().st_size > 0


def test_a_serve_process_is_read_off_its_startup_line():
    import tempfile

    from tokenseam.bench.common import TokenseamServe

    def process(log: bytes) -> TokenseamServe:
        ts = object.__new__(TokenseamServe)  # its log only: no process started
        ts._log = tempfile.TemporaryFile()
        ts._log.write(log)
        return ts

    line = (
        b"tokenseam: serving gemma3 on http://127.0.0.1:1 (ctx 2048 x 8 sequences, flash attention on, grammars "
        b"compiled beside the prompt, chat template built-in gemma (none in the GGUF); API keys off)\n"
    )
    ts = process(b"loading\n" + line)
    assert ts.flash_attention() is True and ts.chat_template() == "gemma"
    ts = process(
        line.replace(b"on, grammars", b"off, grammars").replace(
            b"built-in gemma (none in the GGUF)", b"the GGUF's"
        )
    )
    assert ts.flash_attention() is False and ts.chat_template() is None
    with pytest.raises(RuntimeError, match="printed no startup line"):
        process(b"error: the model file is missing\n").flash_attention()
