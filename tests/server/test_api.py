"""The HTTP API through the official openai client, llama-server-style calls, and hostile input."""

from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import RunningServer

pytestmark = [pytest.mark.model, pytest.mark.server]


@pytest.fixture(scope="module")
def client(smollm2_server):
    return openai.OpenAI(base_url=smollm2_server.url + "/v1", api_key="unused", max_retries=0)


def test_openai_client_chat_and_completions(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2"]
    r = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Say hello."}], max_tokens=12, temperature=0
    )
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content and r.usage.completion_tokens <= 12
    c = client.completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=5, temperature=0
    )
    assert c.object == "text_completion" and "Paris" in c.choices[0].text


def test_openai_client_streaming(client):
    stream = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Count to 5."}],
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    full = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Count to 5."}], max_tokens=20, temperature=0
    )
    assert text == full.choices[0].message.content


def test_logprobs_carry_raw_bytes_one_entry_per_token(client, smollm2_server):
    r = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Write 😊"}],
        max_tokens=10,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"return_token_ids": True},
    )
    entries = r.choices[0].logprobs.content
    ids = r.choices[0].model_extra["token_ids"]
    assert len(entries) == len(ids)
    vocab = smollm2_server.state.vocab
    for e, t in zip(entries, ids, strict=True):
        assert bytes(e.bytes) == vocab.token_bytes[t]
        assert len(e.top_logprobs) == 3 and e.logprob <= 0
    # greedy: the chosen token is the most likely one
    assert all(e.top_logprobs[0].logprob == pytest.approx(e.logprob, abs=1e-4) for e in entries)


def test_prefix_reuse_reports_cached_tokens(client):
    msgs = [{"role": "system", "content": "You are terse. " * 20}, {"role": "user", "content": "Hi"}]
    client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=2, temperature=0)
    r = client.chat.completions.create(
        model="smollm2", messages=msgs[:1] + [{"role": "user", "content": "Yo"}], max_tokens=2, temperature=0
    )
    assert r.usage.prompt_tokens_details.cached_tokens >= 60


def test_llama_server_style_routes(smollm2_server):
    url = smollm2_server.url
    t = httpx.post(url + "/tokenize", json={"content": "Hello world", "with_pieces": True}).json()
    ids = [x["id"] for x in t["tokens"]]
    assert "".join(x["piece"] for x in t["tokens"]) == "Hello world"
    assert httpx.post(url + "/detokenize", json={"tokens": ids}).json() == {"content": "Hello world"}
    r = httpx.post(
        url + "/completion",
        json={"prompt": "1, 2, 3,", "n_predict": 6, "temperature": 0, "return_tokens": True},
        timeout=60,
    ).json()
    assert r["stop"] is True and r["tokens_predicted"] == len(r["tokens"]) == 6 and r["stop_type"] == "limit"
    assert httpx.get(url + "/health").json()["status"] == "ok"
    m = httpx.get(url + "/metrics").text
    assert "tokenseam_requests_total" in m and "tokenseam_queue_depth" in m
    import re

    decode = float(re.search(r"^tokenseam_engine_decode_seconds_total (\S+)$", m, re.M).group(1))
    gen = float(re.search(r"^tokenseam_engine_generated_tokens_total (\S+)$", m, re.M).group(1))
    assert decode > 0 and gen >= 6  # the engine's own counters: the 6 tokens above at least


BAD = [
    ("/v1/completions", b"{not json", 400, "invalid_json"),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", b"", 400, None),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', 400, None),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": -5}', 400, None),
    ("/v1/completions", b'{"prompt": "x", "temperature": -1}', 400, None),
    ("/v1/completions", b'{"prompt": "x", "temperature": "hot"}', 400, None),
    ("/v1/completions", b'{"prompt": "x", "n": 0}', 400, None),
    ("/v1/completions", b'{"prompt": "x", "top_p": 1.5}', 400, None),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "x"}], "echo": true}',
        400,
        "unsupported_parameter",
    ),
    ("/v1/completions", b'{"prompt": "x", "logit_bias": {"99999999": 5}}', 400, None),
    ("/v1/completions", b'{"prompt": "x", "stop": 5}', 400, None),
    ("/v1/completions", b'{"prompt": 12}', 400, None),
    ("/v1/completions", b'{"prompt": [999999999]}', 400, None),
    ("/v1/completions", b'{"prompt": [5, -1, 7]}', 400, None),
    ("/v1/completions", b'{"prompt": "x", "model": "gpt-9"}', 404, "model_not_found"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 100000}', 400, "context_length_exceeded"),
    ("/v1/chat/completions", b'{"messages": []}', 400, None),
    ("/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, None),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
        400,
        None,
    ),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "n": 1.5}', 400, None),
    ("/completion", b'{"prompt": "x", "n_predict": 0}', 400, None),
    ("/completion", b'{"n_predict": 3}', 400, None),
    ("/tokenize", b'{"content": 5}', 400, None),
    ("/detokenize", b'{"tokens": [-1]}', 400, None),
]


@pytest.mark.parametrize("route,body,status,code", BAD)
def test_bad_input_gets_openai_error_object(smollm2_server, route, body, status, code):
    r = httpx.post(
        smollm2_server.url + route, content=body, headers={"content-type": "application/json"}, timeout=30
    )
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code:
        assert err["code"] == code


STREAM_BAD = [
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, None),
    ("/v1/completions", {"prompt": "x", "model": "gpt-9"}, 404, "model_not_found"),
    ("/v1/completions", {"prompt": "word " * 3000, "max_tokens": 1}, 400, "context_length_exceeded"),
    ("/v1/completions", {"prompt": "x", "guided_json": {"type": "array", "uniqueItems": True}}, 400, None),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "guided_regex": "(a"},
        400,
        None,
    ),
    ("/completion", {"prompt": "x", "grammar": "root ::= missing"}, 400, None),
]


@pytest.mark.parametrize("route,body,status,code", STREAM_BAD)
def test_bad_streaming_request_gets_an_error_status_not_a_broken_stream(
    smollm2_server, route, body, status, code
):
    r = httpx.post(smollm2_server.url + route, json={**body, "stream": True}, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and (code is None or err["code"] == code)


def test_prompt_longer_than_context(smollm2_server):
    r = httpx.post(
        smollm2_server.url + "/v1/completions", json={"prompt": "word " * 3000, "max_tokens": 1}, timeout=30
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_oversized_body_is_413(smollm2_server):
    r = httpx.post(
        smollm2_server.url + "/v1/completions",
        content=b'{"prompt": "' + b"a" * (9 << 20) + b'"}',
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_unknown_route_and_method(smollm2_server):
    assert httpx.get(smollm2_server.url + "/v1/nope").status_code == 404
    assert httpx.get(smollm2_server.url + "/v1/completions").status_code == 405


def test_queue_bound_gives_503_with_retry_after():
    from tokenseam.engine import GenerationRequest, SamplingParams

    s = RunningServer("smollm2", n_ctx=512, parallel=1, max_queue=1)
    try:
        engine = s.state.engine
        ids = s.state.tokenizer.encode("Tell a long story:")
        import time

        def hold():
            return engine.submit(
                GenerationRequest(ids, SamplingParams(max_tokens=480, ignore_eos=True)), lambda e: None
            )

        # one request decoding, one waiting: the queue (bound 1) is full
        held = [hold()]
        deadline = time.time() + 30
        while engine.running_count < 1 and time.time() < deadline:
            time.sleep(0.005)
        held.append(hold())
        assert engine.running_count == 1 and engine.queue_depth == 1
        body = {"prompt": "Hello", "max_tokens": 5}
        r = httpx.post(s.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "queue_full"
        for h in held:
            engine.cancel(h)
        deadline = time.time() + 30
        while (engine.running_count or engine.queue_depth) and time.time() < deadline:
            time.sleep(0.02)
        r = httpx.post(s.url + "/v1/completions", json=body, timeout=60)  # served again once there is room
        assert r.status_code == 200
    finally:
        s.stop()


def test_legacy_completion_logprobs_one_entry_per_token(smollm2_server):
    r = httpx.post(
        smollm2_server.url + "/v1/completions",
        json={
            "prompt": "Emoji: 😊 and Korean: 안녕",
            "max_tokens": 12,
            "temperature": 0,
            "logprobs": 2,
            "return_token_ids": True,
            "token_healing": False,
        },
        timeout=60,
    ).json()
    c = r["choices"][0]
    lp = c["logprobs"]
    vocab = smollm2_server.state.vocab
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["token_bytes"]) == len(c["token_ids"])
    assert [bytes(b) for b in lp["token_bytes"]] == [vocab.token_bytes[t] for t in c["token_ids"]]
    assert lp["text_offset"] == sorted(lp["text_offset"]) and all(len(t) <= 2 for t in lp["top_logprobs"])
