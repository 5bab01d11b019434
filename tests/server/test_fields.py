"""Fields real clients send: honoured or refused (400 naming the field), never silently dropped; unknown ones
listed in `x-tokenseam-ignored-fields`; booleans type-checked; every response carries an `x-request-id`."""

from __future__ import annotations

import httpx
import pytest

from tokenseam.engine.chat_template import ChatTemplate

pytestmark = [pytest.mark.model, pytest.mark.server]

HI = [{"role": "user", "content": "Say something."}]


def chat(server, **body):
    body.setdefault("messages", HI)
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)


def test_min_tokens_holds_off_the_end(smollm2_server):
    eos = min(smollm2_server.state.backend.eog_ids)
    push_end = {"logit_bias": {str(eos): 100}, "temperature": 0, "max_tokens": 12}
    assert chat(smollm2_server, **push_end).json()["usage"]["completion_tokens"] == 1
    r = chat(smollm2_server, min_tokens=6, **push_end).json()
    # six tokens before the end can come, then the end token (counted, as the first answer's was)
    assert r["usage"]["completion_tokens"] == 7 and r["choices"][0]["finish_reason"] == "stop"


def test_llama_style_fields_on_completion(smollm2_server):
    body = {
        "prompt": "One, two, three,",
        "n_predict": 4,
        "temperature": 0,
        "repeat_penalty": 1.3,
        "repeat_last_n": 16,
        "min_keep": 2,
        "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
    }
    r = httpx.post(smollm2_server.url + "/completion", json=body, timeout=60)
    assert r.status_code == 200, r.text
    # llama-server's full default chain names samplers that are no-ops at their defaults: accepted
    chain = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]
    r = httpx.post(smollm2_server.url + "/completion", json={**body, "samplers": chain}, timeout=60)
    assert r.status_code == 200, r.text


def test_continue_final_message_leaves_the_turn_open(smollm2_server):
    msgs = [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "The capital is"},
    ]
    closed = chat(smollm2_server, messages=msgs, add_generation_prompt=False, max_tokens=1).json()
    open_ = chat(smollm2_server, messages=msgs, continue_final_message=True, max_tokens=1).json()
    end_of_turn = smollm2_server.state.tokenizer.encode("<|im_end|>\n", parse_special=True)
    assert closed["usage"]["prompt_tokens"] - open_["usage"]["prompt_tokens"] == len(end_of_turn)


def test_chat_template_kwargs_reach_the_template(smollm2_server):
    st = smollm2_server.state
    t = ChatTemplate(
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if shout %}!{% endif %}",
        st.vocab,
        st.tokenizer,
    )
    plain = t.encode([{"role": "user", "content": "hi"}])
    loud = t.encode([{"role": "user", "content": "hi"}], kwargs={"shout": True})
    assert st.tokenizer.decode(loud).endswith(b"hi!") and not st.tokenizer.decode(plain).endswith(b"!")
    r = chat(smollm2_server, chat_template_kwargs={"enable_thinking": False}, max_tokens=1)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "body,param",
    [
        ({"stream": "yes"}, "stream"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
        ({"add_generation_prompt": "no"}, "add_generation_prompt"),
        ({"continue_final_message": True}, "continue_final_message"),  # the last message is the user's
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": ["x"]}, "chat_template_kwargs"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 9, "max_tokens": 3}, "min_tokens"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": 1.2, "repeat_penalty": 1.1}, "repeat_penalty"),
        ({"repetition_penalty": "high"}, "repetition_penalty"),
        ({"samplers": ["top_k", "mirostat"]}, "samplers"),
        ({"samplers": "kt"}, "samplers"),
        ({"samplers": ["top_k", "penalties"], "repeat_penalty": 1.2}, "samplers"),
        ({"mirostat": 2}, "mirostat"),
        ({"typical_p": 0.5}, "typical_p"),
        ({"dry_multiplier": 0.8}, "dry_multiplier"),
        ({"xtc_probability": 0.5}, "xtc_probability"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"prompt_logprobs": 1}, "prompt_logprobs"),
        ({"include_stop_str_in_output": True}, "include_stop_str_in_output"),
        ({"skip_special_tokens": False}, "skip_special_tokens"),
        ({"skip_special_tokens": "no"}, "skip_special_tokens"),
        ({"cache_prompt": "yes"}, "cache_prompt"),
        ({"store": 1}, "store"),
    ],
)
def test_refused_with_the_field_named(smollm2_server, body, param):
    r = chat(smollm2_server, **{"max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_unknown_fields_are_named_in_a_header(smollm2_server):
    r = chat(smollm2_server, max_tokens=1, temprature=0.2, maxtokens=3, user="u1", _test_only=1)
    assert r.status_code == 200
    assert r.headers["x-tokenseam-ignored-fields"] == "maxtokens, temprature"
    r = chat(smollm2_server, max_tokens=1, user="u1", metadata={"a": "b"})
    assert "x-tokenseam-ignored-fields" not in r.headers
    with httpx.stream(
        "POST",
        smollm2_server.url + "/v1/chat/completions",
        json={"messages": HI, "max_tokens": 1, "stream": True, "seeed": 1},
        timeout=60,
    ) as s:
        assert s.headers["x-tokenseam-ignored-fields"] == "seeed"
    hostile = {"messages": HI, "max_tokens": 1, "a\r\nx-evil: 1": 1, "b" * 300: 2}
    r = httpx.post(smollm2_server.url + "/v1/chat/completions", json=hostile, timeout=60)
    assert r.status_code == 200 and "x-evil" not in r.headers
    assert r.headers["x-tokenseam-ignored-fields"] == "(2 more with names not shown)"


def test_tokenize_booleans_are_checked(smollm2_server):
    r = httpx.post(smollm2_server.url + "/tokenize", json={"content": "hi", "with_pieces": "no"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "with_pieces"


def test_request_id_is_echoed_or_generated(smollm2_server):
    r = httpx.get(smollm2_server.url + "/health", headers={"x-request-id": "trace-42"})
    assert r.headers["x-request-id"] == "trace-42"
    generated = httpx.get(smollm2_server.url + "/health").headers["x-request-id"]
    assert len(generated) == 16
    odd = httpx.get(smollm2_server.url + "/health", headers={"x-request-id": "a b;c"}).headers["x-request-id"]
    assert odd != "a b;c" and len(odd) == 16  # not a plain token: replaced


@pytest.mark.parametrize(
    "route,body,field",
    [
        (
            "/v1/chat/completions",
            {"messages": HI, "max_tokens": 1, "logprobs": True, "top_logprobs": 5},
            "repetition_penalty",
        ),
        (
            "/v1/completions",
            {"prompt": "Say say say say", "max_tokens": 1, "logprobs": 5},
            "repetition_penalty",
        ),
        ("/completion", {"prompt": "Say say say say", "n_predict": 1, "n_probs": 5}, "repeat_penalty"),
    ],
)
def test_the_repetition_penalty_reaches_the_distribution(smollm2_server, route, body, field):
    """Logprobs are reported after penalties: a penalty that was dropped would leave them unchanged."""

    def dist(extra):
        r = httpx.post(
            smollm2_server.url + route, json={**body, "temperature": 0, **extra}, timeout=60
        ).json()
        if route == "/completion":
            return [
                (t["token"], round(t["logprob"], 4)) for t in r["completion_probabilities"][0]["top_logprobs"]
            ]
        if route == "/v1/completions":
            return sorted((k, round(v, 4)) for k, v in r["choices"][0]["logprobs"]["top_logprobs"][0].items())
        return [
            (t["token"], round(t["logprob"], 4))
            for t in r["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        ]

    assert dist({field: 3.0}) != dist({})


@pytest.mark.parametrize(
    "route,body,listed",
    [
        ("/v1/completions", {"prompt": "x", "max_tokens": 1, "n_predict": 5}, "n_predict"),
        ("/completion", {"prompt": "x", "n_predict": 1, "return_token_ids": True}, "return_token_ids"),
        ("/v1/chat/completions", {"messages": HI, "max_tokens": 1, "vllm_xargs": {"a": 1}}, "vllm_xargs"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 1, "tools": []}, "tools"),
    ],
)
def test_another_dialects_field_is_named_not_dropped(smollm2_server, route, body, listed):
    r = httpx.post(smollm2_server.url + route, json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers.get("x-tokenseam-ignored-fields") == listed
