"""What eval harnesses send to /v1/completions: `echo` with prompt logprobs (log-likelihood scoring, including
`max_tokens: 0`) and batched prompts (one choice per prompt)."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest

pytestmark = [pytest.mark.model, pytest.mark.server]


def post(server, **body):
    return httpx.post(server.url + "/v1/completions", json=body, timeout=120)


def sse_payloads(server, body) -> list:
    out = []
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data:"):
                data = line[5:].strip()
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_echo_scores_the_prompt(smollm2_server):
    prompt = "The capital of France is Paris."
    r = post(smollm2_server, prompt=prompt, echo=True, max_tokens=0, logprobs=1, temperature=0).json()
    c = r["choices"][0]
    assert c["text"] == prompt and c["finish_reason"] == "length"
    lp = c["logprobs"]
    ids = smollm2_server.state.tokenizer.encode(prompt, add_special=True)
    assert (
        len(lp["tokens"]) == len(ids) == r["usage"]["prompt_tokens"] and r["usage"]["completion_tokens"] == 0
    )
    assert lp["token_logprobs"][0] is None and all(x <= 0 for x in lp["token_logprobs"][1:])
    assert "".join(lp["tokens"]) == prompt  # no BOS here: the tokens join to the text
    assert [prompt[o:] for o in lp["text_offset"]] == [
        prompt[len("".join(lp["tokens"][:k])) :] for k in range(len(ids))
    ]
    assert lp["top_logprobs"][0] is None and all(len(t) >= 1 for t in lp["top_logprobs"][1:])


def test_a_prompt_logprob_is_the_logprob_the_model_generates_it_with(smollm2_server):
    """lm-eval's log-likelihood: score A + t with echo; t's logprob there equals t's logprob when generated
    after A."""
    ids = smollm2_server.state.tokenizer.encode("One, two, three,")
    gen = post(
        smollm2_server,
        prompt=ids,
        max_tokens=1,
        temperature=0,
        logprobs=0,
        token_healing=False,
        return_token_ids=True,
    ).json()["choices"][0]
    t, generated_lp = gen["token_ids"][0], gen["logprobs"]["token_logprobs"][0]
    scored = post(smollm2_server, prompt=ids + [t], echo=True, max_tokens=0, logprobs=0).json()["choices"][0]
    assert math.isclose(scored["logprobs"]["token_logprobs"][-1], generated_lp, abs_tol=2e-2)


def test_echo_with_a_completion_and_streamed(smollm2_server):
    prompt = "Colors: red, green,"
    forced = smollm2_server.state.tokenizer.encode(" blue and")
    body = {"prompt": prompt, "echo": True, "max_tokens": 8, "logprobs": 1, "_force_ids": forced}
    c = post(smollm2_server, **body).json()["choices"][0]
    assert c["text"] == prompt + " blue and"
    lp = c["logprobs"]
    n_prompt = len(smollm2_server.state.tokenizer.encode(prompt, add_special=True))
    assert len(lp["tokens"]) == n_prompt + len(forced) + 1  # and the end token
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][n_prompt] == len(prompt)
    events = [e for e in sse_payloads(smollm2_server, {**body, "stream": True}) if e != "[DONE]"]
    assert events[0]["choices"][0]["text"].startswith(prompt)
    assert "".join(ch["text"] for e in events for ch in e["choices"]) == c["text"]
    streamed = [x for e in events for ch in e["choices"] for x in ch["logprobs"]["tokens"]]
    assert streamed == lp["tokens"]


@pytest.mark.parametrize(
    "body,param",
    [
        ({"max_tokens": 0}, "max_tokens"),  # only with echo
        ({"echo": True, "token_healing": True}, "token_healing"),
        ({"echo": "yes"}, "echo"),
    ],
)
def test_echo_refusals(smollm2_server, body, param):
    r = post(smollm2_server, prompt="hi", **body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_echo_on_chat_is_refused(smollm2_server):
    r = httpx.post(
        smollm2_server.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "echo": True},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"


def test_batched_prompts_one_choice_each(smollm2_server):
    client = openai.OpenAI(base_url=smollm2_server.url + "/v1", api_key="unused", max_retries=0)
    prompts = ["Red, green,", "One, two,", "Monday, Tuesday,"]
    # The answer is forced (greedy output depends on the CPU and on what is decoded beside it)
    forced = {"_force_ids": smollm2_server.state.tokenizer.encode(" and more")}
    r = client.completions.create(model="smollm2", prompt=prompts, max_tokens=5, n=2, extra_body=forced)
    assert [c.index for c in r.choices] == list(range(6))
    assert all(c.text == " and more" for c in r.choices)
    singles = [
        client.completions.create(model="smollm2", prompt=p, max_tokens=5, extra_body=forced) for p in prompts
    ]
    assert r.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert r.usage.completion_tokens == 2 * sum(s.usage.completion_tokens for s in singles)
    # token-id prompts, streamed, with usage for the whole batch, against the same batch not streamed
    ids = [smollm2_server.state.tokenizer.encode(p) for p in prompts]
    body = {"prompt": ids, "max_tokens": 5, "token_healing": False, **forced}
    whole = post(smollm2_server, **body).json()
    assert whole["usage"]["prompt_tokens"] == sum(len(x) for x in ids)
    payloads = sse_payloads(
        smollm2_server, {**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert payloads.count("[DONE]") == 1 and payloads[-1] == "[DONE]"
    events = [p for p in payloads if p != "[DONE]"]
    assert {ch["index"] for e in events for ch in e["choices"]} == {0, 1, 2}
    texts = {
        i: "".join(ch["text"] for e in events for ch in e["choices"] if ch["index"] == i) for i in range(3)
    }
    assert [texts[i] for i in range(3)] == [c["text"] for c in whole["choices"]] == [" and more"] * 3
    assert events[-1]["usage"] == whole["usage"]


@pytest.mark.parametrize(
    "prompt,param",
    [
        (["ok", 5], "prompt[1]"),
        (["ok", [1, 2]], "prompt"),  # strings and id lists mixed
        (["p"] * 33, "prompt"),
        (["ok", []], "prompt[1]"),
    ],
)
def test_bad_batches(smollm2_server, prompt, param):
    r = post(smollm2_server, prompt=prompt, max_tokens=1)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_batch_on_completion_is_refused(smollm2_server):
    r = httpx.post(
        smollm2_server.url + "/completion", json={"prompt": ["a", "b"], "n_predict": 1}, timeout=30
    )
    assert r.status_code == 400 and "/v1/completions" in r.json()["error"]["message"]


@pytest.mark.parametrize("prompt", ["http:", "The capital of France is"])
def test_healed_logprobs_join_to_the_text_and_match_usage(smollm2_server, prompt):
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 1, "return_token_ids": True}
    r = post(smollm2_server, **body).json()
    c, healed = r["choices"][0], r.get("token_healing")
    assert healed and healed["removed_bytes"]  # both prompts end on an unstable boundary
    lp = c["logprobs"]
    assert "".join(lp["tokens"]) == c["text"]
    assert lp["text_offset"] == [len("".join(lp["tokens"][:k])) for k in range(len(lp["tokens"]))]
    assert len(lp["tokens"]) == r["usage"]["completion_tokens"] == len(c["token_ids"])
    raw = bytes(b for t in lp["token_bytes"] for b in t)
    assert raw.startswith(bytes(healed["removed_bytes"]))
    assert (
        raw[len(healed["removed_bytes"]) :].decode("utf-8", "ignore").startswith(c["text"].rstrip("\ufffd"))
    )
    # streamed: the same entries, event by event
    events = [e for e in sse_payloads(smollm2_server, {**body, "stream": True}) if e != "[DONE]"]
    toks = [t for e in events for ch in e["choices"] for t in (ch["logprobs"] or {}).get("tokens", [])]
    offs = [o for e in events for ch in e["choices"] for o in (ch["logprobs"] or {}).get("text_offset", [])]
    assert toks == lp["tokens"] and offs == lp["text_offset"]
