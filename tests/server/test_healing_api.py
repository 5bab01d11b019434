"""Token healing through the API: the output starts with the removed bytes, which are never re-sent as text."""

from __future__ import annotations

import httpx
import pytest

from .sse import stream_events

pytestmark = [pytest.mark.model, pytest.mark.server]


def test_url_prompt_is_healed_and_canonical(smollm2_server):
    url = smollm2_server.url
    body = {
        "prompt": 'The link is <a href="http:',
        "max_tokens": 8,
        "temperature": 0,
        "return_token_ids": True,
    }
    r = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
    healed = r["token_healing"]
    removed = bytes(healed["removed_bytes"])
    assert removed.endswith(b":") and healed["removed_ids"]
    vocab, tok = smollm2_server.state.vocab, smollm2_server.state.tokenizer
    out_ids = r["choices"][0]["token_ids"]
    out_bytes = vocab.decode_bytes(out_ids)
    assert out_bytes.startswith(removed)
    # the text shown is what follows the prompt: the removed bytes are not repeated
    assert r["choices"][0]["text"].encode() == out_bytes[len(removed) :]
    assert r["choices"][0]["text"].startswith("//")
    kept = tok.encode(body["prompt"])[: -len(healed["removed_ids"])]
    joined = vocab.decode_bytes(kept + out_ids)
    assert kept + out_ids == tok.encode(joined.decode())  # canonical tokenization of the whole text
    assert r["usage"]["prompt_tokens"] == len(kept)

    # without healing the model sees the split boundary
    r2 = httpx.post(url + "/v1/completions", json={**body, "token_healing": False}, timeout=60).json()
    assert "token_healing" not in r2


def test_healed_stream_matches_non_stream(server):
    body = {"prompt": "The answer is: Fran", "max_tokens": 6, "temperature": 0, "return_token_ids": True}
    full = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    events, done = stream_events(server.url + "/v1/completions", {**body, "stream": True})
    assert done
    ids = [t for e in events for c in e["choices"] for t in c.get("token_ids", [])]
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert ids == full["choices"][0]["token_ids"] == events[-1]["choices"][0]["all_token_ids"]
    assert text == full["choices"][0]["text"]
    removed = bytes(full.get("token_healing", {}).get("removed_bytes", []))
    assert server.state.vocab.decode_bytes(ids).startswith(removed)


def test_chat_is_not_healed_by_default(smollm2_server):
    r = httpx.post(
        smollm2_server.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        timeout=60,
    ).json()
    assert "token_healing" not in r


@pytest.mark.parametrize("value", ["yes", -1, 99, 1.5])
def test_bad_token_healing_values(smollm2_server, value):
    r = httpx.post(
        smollm2_server.url + "/v1/completions", json={"prompt": "x", "token_healing": value}, timeout=30
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "token_healing"
