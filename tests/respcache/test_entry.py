"""Entry format: stream <-> full response in both directions, token-by-token replay shapes, cacheability."""

from __future__ import annotations

import asyncio
import json

import pytest

from tokenseam.respcache import (
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_LLAMA,
    entry_from_response,
    entry_from_stream_events,
    replay_as_sse,
    replay_chunks,
    response_from_entry,
    uncacheable_reason,
)
from tokenseam.respcache.entry import IncompleteStreamError, SSEParser, validate_entry


def chat_stream(with_usage=True):
    head = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "system_fingerprint": "fp",
    }
    chunks = [
        dict(
            head,
            choices=[
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        )
    ]
    # "é" split across two tokens: the first event carries no text but its id.
    for text, ids in (("Caf", [10]), ("", [11]), ("é", [12]), (" ok", [13])):
        chunks.append(
            dict(
                head,
                choices=[
                    {
                        "index": 0,
                        "delta": {"content": text},
                        "logprobs": None,
                        "finish_reason": None,
                        "token_ids": ids,
                    }
                ],
            )
        )
    chunks.append(
        dict(
            head,
            choices=[
                {
                    "index": 0,
                    "delta": {},
                    "logprobs": None,
                    "finish_reason": "stop",
                    "token_ids": [2],
                    "all_token_ids": [10, 11, 12, 13, 2],
                }
            ],
        )
    )
    if with_usage:
        chunks.append(
            dict(head, choices=[], usage={"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10})
        )
    return chunks


def test_chat_stream_entry_serves_non_stream_and_replays_event_by_event():
    entry = entry_from_stream_events(ROUTE_CHAT, chat_stream())
    assert validate_entry(entry) and entry["source"] == "stream"
    resp = response_from_entry(entry)
    assert (
        resp["object"] == "chat.completion"
        and resp["id"].startswith("chatcmpl-")
        and resp["id"] != "chatcmpl-1"
    )
    ch = resp["choices"][0]
    assert ch["message"] == {"role": "assistant", "content": "Café ok"}
    assert ch["token_ids"] == [10, 11, 12, 13, 2] and ch["finish_reason"] == "stop"
    assert resp["usage"]["total_tokens"] == 10 and resp["system_fingerprint"] == "fp"

    replay = replay_chunks(entry, include_usage=False)
    assert replay[-1] == "[DONE]" and len(replay) == 1 + 6  # six live events, no usage chunk
    live_choices = [c["choices"][0] for c in chat_stream()[:-1]]
    assert [c["choices"][0] for c in replay[:-1]] == live_choices
    assert all(c["object"] == "chat.completion.chunk" and len(c["choices"]) == 1 for c in replay[:-1])
    assert len({c["id"] for c in replay[:-1]}) == 1

    with_usage = replay_chunks(entry, include_usage=True)
    assert with_usage[-2]["choices"] == [] and with_usage[-2]["usage"]["total_tokens"] == 10


def test_replay_as_sse_yields_one_event_per_token():
    entry = entry_from_stream_events(ROUTE_CHAT, chat_stream())

    async def collect():
        return [b async for b in replay_as_sse(entry, include_usage=True)]

    raw = asyncio.run(collect())
    assert all(b.startswith(b"data: ") and b.endswith(b"\n\n") for b in raw)
    parsed = SSEParser().feed(b"".join(raw))
    assert parsed[-1] == "[DONE]" and len(parsed) == 8
    # Rebuilding from the replay gives back the same answer (stream -> entry -> stream is lossless).
    again = entry_from_stream_events(ROUTE_CHAT, parsed[:-1])
    assert again["response"]["choices"] == entry["response"]["choices"]


def test_chat_response_with_logprob_bytes_becomes_per_token_events():
    lps = [
        {"token": "Caf", "logprob": -0.1, "bytes": list(b"Caf"), "top_logprobs": []},
        {"token": "bytes:\\xc3", "logprob": -0.2, "bytes": [0xC3], "top_logprobs": []},
        {"token": "bytes:\\xa9", "logprob": -0.3, "bytes": [0xA9], "top_logprobs": []},
        {"token": " ok", "logprob": -0.4, "bytes": list(b" ok"), "top_logprobs": []},
    ]
    resp = {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Café ok"},
                "logprobs": {"content": lps},
                "finish_reason": "stop",
                "token_ids": [10, 11, 12, 13],
            }
        ],
        "usage": {"total_tokens": 3},
    }
    entry = entry_from_response(ROUTE_CHAT, resp)
    evs = entry["events"]
    assert [e["delta"].get("content") for e in evs] == ["Caf", "", "é", " ok", None]
    assert [e.get("token_ids") for e in evs] == [[10], [11], [12], [13], []]
    assert evs[0]["delta"]["role"] == "assistant" and evs[-1]["finish_reason"] == "stop"
    assert evs[-1]["all_token_ids"] == [10, 11, 12, 13]
    assert [e["logprobs"]["content"][0]["logprob"] for e in evs[:-1]] == [-0.1, -0.2, -0.3, -0.4]
    # The entry serves the non-streamed request as it was, with a fresh id.
    out = response_from_entry(entry)
    assert out["choices"] == resp["choices"] and out["id"] != "x"
    rebuilt = entry_from_stream_events(ROUTE_CHAT, [c for c in replay_chunks(entry) if c != "[DONE]"])
    assert rebuilt["response"]["choices"][0]["message"]["content"] == "Café ok"
    assert rebuilt["response"]["choices"][0]["token_ids"] == [10, 11, 12, 13]


def test_chat_response_without_alignment_streams_words_and_ids_at_the_end():
    resp = {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "one two  three"},
                "finish_reason": "stop",
                "token_ids": [1, 2, 3, 4],
            },
            {"index": 1, "message": {"role": "assistant", "content": "four"}, "finish_reason": "stop"},
        ],
    }
    entry = entry_from_response(ROUTE_CHAT, resp)
    chunks = replay_chunks(entry)
    texts = [c["choices"][0]["delta"].get("content") for c in chunks[:-1] if c["choices"][0]["index"] == 0]
    assert texts == ["one", " two", "  three", None]
    assert len(chunks) > 3  # never one aggregated chunk
    rebuilt = entry_from_stream_events(ROUTE_CHAT, chunks[:-1])["response"]
    assert rebuilt["choices"][0]["token_ids"] == [1, 2, 3, 4]
    assert rebuilt["choices"][1]["message"]["content"] == "four" and "token_ids" not in rebuilt["choices"][1]


def test_tool_call_deltas_merge():
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [
        dict(
            head,
            choices=[
                {
                    "index": 0,
                    "delta": {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "add", "arguments": ""},
                            }
                        ],
                    },
                    "finish_reason": None,
                }
            ],
        ),
        dict(
            head,
            choices=[
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]},
                    "finish_reason": None,
                }
            ],
        ),
        dict(
            head,
            choices=[
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
                    "finish_reason": "tool_calls",
                }
            ],
        ),
    ]
    resp = entry_from_stream_events(ROUTE_CHAT, chunks)["response"]
    msg = resp["choices"][0]["message"]
    assert msg["content"] is None
    assert msg["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}}
    ]
    assert uncacheable_reason(entry_from_response(ROUTE_CHAT, resp)) is None
    events = entry_from_response(ROUTE_CHAT, resp)["events"]
    assert events[0]["delta"]["tool_calls"][0]["index"] == 0


def test_completions_stream_and_logprob_lists_merge():
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}
    chunks = [
        dict(
            head,
            choices=[
                {
                    "index": 0,
                    "text": t,
                    "logprobs": {"tokens": [t], "token_logprobs": [lp]},
                    "finish_reason": fr,
                    "token_ids": [i],
                }
            ],
        )
        for t, lp, fr, i in (("A", -1.0, None, 5), ("B", -2.0, None, 6), ("C", -3.0, "stop", 7))
    ]
    entry = entry_from_stream_events(ROUTE_COMPLETIONS, chunks)
    ch = entry["response"]["choices"][0]
    assert ch["text"] == "ABC" and ch["token_ids"] == [5, 6, 7]
    assert ch["logprobs"] == {"tokens": ["A", "B", "C"], "token_logprobs": [-1.0, -2.0, -3.0]}
    assert entry["response"]["object"] == "text_completion"
    # and back: a response-made entry splits on the logprob tokens
    e2 = entry_from_response(ROUTE_COMPLETIONS, entry["response"])
    assert [e["text"] for e in e2["events"]] == ["A", "B", "C", ""]
    assert [e["token_ids"] for e in e2["events"]] == [[5], [6], [7], []]
    assert all(c["object"] == "text_completion" for c in replay_chunks(e2)[:-1])


def test_llama_completion_shapes():
    # tokenseam's own /completion stream: the final event carries content, its ids and `all_tokens`.
    events = [
        {"index": 0, "content": "Hel", "tokens": [1], "stop": False, "id_slot": -1},
        {"index": 0, "content": "lo", "tokens": [2], "stop": False, "id_slot": -1},
        {
            "index": 0,
            "content": "!",
            "tokens": [3],
            "stop": True,
            "stop_type": "eos",
            "tokens_predicted": 3,
            "all_tokens": [1, 2, 3],
            "model": "m",
        },
    ]
    entry = entry_from_stream_events(ROUTE_LLAMA, events)
    resp = response_from_entry(entry)
    assert resp["content"] == "Hello!" and resp["tokens"] == [1, 2, 3] and resp["stop"] is True
    assert resp["stop_type"] == "eos" and "all_tokens" not in resp
    assert replay_chunks(entry) == events  # verbatim, no [DONE]
    # llama-server's shape: the final event has empty content and `tokens: []`.
    srv = [
        {"content": "a", "tokens": [7], "stop": False},
        {"content": "b", "tokens": [8], "stop": False},
        {"content": "", "tokens": [], "stop": True, "stop_type": "limit", "truncated": False},
    ]
    e2 = entry_from_stream_events(ROUTE_LLAMA, srv)
    assert e2["response"]["tokens"] == [7, 8]
    assert uncacheable_reason(e2) == "length" and uncacheable_reason(e2, cache_truncated=True) is None
    # a non-streamed /completion response replays as several events ending with stop
    e3 = entry_from_response(
        ROUTE_LLAMA, {"content": "x y z", "tokens": [1, 2, 3], "stop": True, "stop_type": "eos"}
    )
    ch = replay_chunks(e3)
    assert [c["content"] for c in ch] == ["x", " y", " z", ""] and ch[-1]["stop"] is True
    assert sum((c["tokens"] for c in ch), []) == [1, 2, 3]
    assert uncacheable_reason(e3) is None


def test_aborted_streams_are_rejected():
    chunks = chat_stream()[:-2]  # no finish_reason, no usage
    with pytest.raises(IncompleteStreamError):
        entry_from_stream_events(ROUTE_CHAT, chunks)
    with pytest.raises(IncompleteStreamError):
        entry_from_stream_events(ROUTE_CHAT, [])
    with pytest.raises(IncompleteStreamError):
        entry_from_stream_events(ROUTE_LLAMA, [{"content": "a", "tokens": [1], "stop": False}])


@pytest.mark.parametrize(
    "choices,reason",
    [
        (
            [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}],
            "length",
        ),
        ([{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}], "empty"),
        ([{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": None}], "aborted"),
        (
            [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "abort"}],
            "aborted",
        ),
        ([], "empty"),
        (
            [
                {"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"},
                {"index": 1, "message": {"role": "assistant", "content": "y"}, "finish_reason": "length"},
            ],
            "length",
        ),
    ],
)
def test_uncacheable_reasons(choices, reason):
    entry = entry_from_response(ROUTE_CHAT, {"id": "i", "model": "m", "choices": choices})
    assert uncacheable_reason(entry) == reason
    if reason == "empty" and choices:
        assert uncacheable_reason(entry, cache_empty=True) is None
    assert uncacheable_reason(entry_from_response(ROUTE_CHAT, {"error": {"message": "x"}})) == "error"


def test_sse_parser_handles_split_events_crlf_and_comments():
    p = SSEParser()
    assert p.feed(b': keepalive\n\ndata: {"a"') == []
    assert p.feed(b":1}\r\n\r\ndata: [DONE]\n") == [{"a": 1}]
    assert p.feed(b"\n") == ["[DONE]"]
    assert p.feed(b"event: x\nid: 3\n\n") == []
    from tokenseam.respcache import ResponseCacheError

    with pytest.raises(ResponseCacheError, match="not valid JSON"):
        p.feed(b"data: {oops\n\n")


def test_entries_are_plain_json():
    entry = entry_from_stream_events(ROUTE_CHAT, chat_stream())
    assert json.loads(json.dumps(entry)) == entry


def test_tokenseam_extension_fields_survive_storage_and_replay():
    from tokenseam.respcache.entry import (
        entry_from_response,
        entry_from_stream_events,
        entry_problem,
        replay_chunks,
    )

    healing = {"removed_ids": [5], "removed_bytes": [104], "removed_text": "h"}
    head = {"id": "x", "object": "text_completion", "created": 1, "model": "m"}
    chunks = [
        {**head, "choices": [{"index": 0, "text": "ttp", "finish_reason": None}], "token_healing": healing},
        {**head, "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]},
    ]
    streamed = entry_from_stream_events("/v1/completions", chunks)
    assert streamed["response"]["token_healing"] == healing and entry_problem(streamed) is None
    first = replay_chunks(streamed)[0]
    assert first["token_healing"] == healing and "token_healing" not in replay_chunks(streamed)[1]
    plain = entry_from_response(
        "/v1/completions",
        {**head, "choices": [{"index": 0, "text": "ttp", "finish_reason": "stop"}], "token_healing": healing},
    )
    assert replay_chunks(plain)[0]["token_healing"] == healing
    assert (
        entry_problem({**plain, "extensions": {"secret": 1}}) == "extensions is not an object of known fields"
    )
    assert entry_problem({**plain, "extensions": []}) == "extensions is not an object of known fields"
