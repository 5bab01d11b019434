"""Tool calling as agent frameworks use it: tools rendered into the prompt, `auto` by default, calls parsed
into `tool_calls` (streamed in OpenAI's delta format), tool results rendered back, bad input named."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

pytestmark = [pytest.mark.model, pytest.mark.server]

PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city now", "parameters": PARAMS},
    }
]
CALL = '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'


@pytest.fixture(scope="module")
def client(smollm2_server):
    return openai.OpenAI(base_url=smollm2_server.url + "/v1", api_key="unused", max_retries=0)


def forced(server, text: str) -> dict:
    return {"_force_ids": server.state.tokenizer.encode(text)}


def ask(client, messages, **kw):
    kw.setdefault("max_tokens", 80)
    return client.chat.completions.create(model="smollm2", messages=messages, **kw)


def stream(client, messages, **kw):
    chunks = list(ask(client, messages, stream=True, **kw))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    return chunks, content, calls


def test_an_agent_loop_with_auto(client, smollm2_server):
    """The loop every agent framework runs: tools (auto by default), a call, its result, the final answer."""
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = ask(client, msgs, tools=TOOLS, extra_body=forced(smollm2_server, CALL))
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    msgs.append(c.message.model_dump(exclude_none=True))
    msgs.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"})
    answer = "It is sunny in Paris, 21 C."
    r2 = ask(client, msgs, tools=TOOLS, extra_body=forced(smollm2_server, answer))
    assert r2.choices[0].finish_reason == "stop"
    assert r2.choices[0].message.content == answer and not r2.choices[0].message.tool_calls
    result_tokens = len(smollm2_server.state.tokenizer.encode("sunny, 21 C"))
    assert r2.usage.prompt_tokens >= r.usage.prompt_tokens + result_tokens  # the call and its result went in
    # the same loop streamed
    chunks, content, calls = stream(client, msgs[:1], tools=TOOLS, extra_body=forced(smollm2_server, CALL))
    assert content == "" and len(calls) == 1 and calls[0].index == 0
    assert calls[0].function.name == "get_weather" and json.loads(calls[0].function.arguments) == {
        "city": "Paris"
    }
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    _, content, calls = stream(client, msgs, tools=TOOLS, extra_body=forced(smollm2_server, answer))
    assert content == answer and calls == []


def test_tools_are_rendered_into_the_prompt(client):
    msgs = [{"role": "user", "content": "Hi"}]
    plain = ask(client, msgs, max_tokens=1).usage.prompt_tokens
    with_tools = ask(client, msgs, max_tokens=1, tools=TOOLS).usage.prompt_tokens
    assert with_tools > plain + 30  # the function, its description and parameters, and how to call it


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampled_auto_answers_are_text_or_valid_calls(client, seed):
    msgs = [{"role": "user", "content": "Call get_weather for Oslo, then tell me."}]
    r = ask(client, msgs, tools=TOOLS, temperature=1.0, seed=seed, max_tokens=120)
    c = r.choices[0]
    if c.message.tool_calls:
        assert c.finish_reason == "tool_calls"
        for call in c.message.tool_calls:
            assert call.function.name == "get_weather"
            jsonschema.validate(json.loads(call.function.arguments), PARAMS)
    else:
        assert "<tool_call>" not in (c.message.content or "") or c.finish_reason == "length"


def test_text_then_call_streams_the_text_and_holds_nothing_back(client, smollm2_server):
    text = "Let me check <that> for you. "
    chunks, content, calls = stream(
        client,
        [{"role": "user", "content": "Weather?"}],
        tools=TOOLS,
        extra_body={**forced(smollm2_server, text + CALL), "return_token_ids": True},
    )
    assert content == text and len(calls) == 1 and chunks[-1].choices[0].finish_reason == "tool_calls"
    ids = [t for c in chunks if c.choices for t in (c.choices[0].model_extra.get("token_ids") or [])]
    assert ids == chunks[-1].choices[0].model_extra["all_token_ids"]  # every event still carries its ids
    r = ask(
        client,
        [{"role": "user", "content": "Weather?"}],
        tools=TOOLS,
        extra_body=forced(smollm2_server, text + CALL),
    )
    assert r.choices[0].message.content == text and r.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("text", ["a <tool b", "x <tool_call", "<tool_call>not json</tool_call>"])
def test_text_that_only_looks_like_a_call_is_content(client, smollm2_server, text):
    msgs = [{"role": "user", "content": "x"}]
    r = ask(client, msgs, tools=TOOLS, extra_body=forced(smollm2_server, text))
    assert r.choices[0].message.content == text and not r.choices[0].message.tool_calls
    _, content, calls = stream(client, msgs, tools=TOOLS, extra_body=forced(smollm2_server, text))
    assert content == text and calls == []


def test_a_call_cut_by_max_tokens_comes_back_as_text(client, smollm2_server):
    msgs = [{"role": "user", "content": "x"}]
    r = ask(client, msgs, tools=TOOLS, max_tokens=6, extra_body=forced(smollm2_server, CALL))
    c = r.choices[0]
    assert c.finish_reason == "length" and not c.message.tool_calls
    assert CALL.startswith(c.message.content) and len(c.message.content) > 5
    _, content, calls = stream(
        client, msgs, tools=TOOLS, max_tokens=6, extra_body=forced(smollm2_server, CALL)
    )
    assert content == c.message.content and calls == []


def test_parallel_calls(client, smollm2_server):
    two = CALL + "\n" + CALL.replace("Paris", "Rome")
    r = ask(client, [{"role": "user", "content": "x"}], tools=TOOLS, extra_body=forced(smollm2_server, two))
    calls = r.choices[0].message.tool_calls
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    assert len({c.id for c in calls}) == 2
    _, _, streamed = stream(
        client, [{"role": "user", "content": "x"}], tools=TOOLS, extra_body=forced(smollm2_server, two)
    )
    assert [c.index for c in streamed] == [0, 1]


def test_tool_choice_none_never_parses_calls(client, smollm2_server):
    r = ask(
        client,
        [{"role": "user", "content": "x"}],
        tools=TOOLS,
        tool_choice="none",
        extra_body=forced(smollm2_server, CALL),
    )
    assert r.choices[0].message.content == CALL and not r.choices[0].message.tool_calls


def test_required_and_named_calls_validate(client):
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = ask(
            client,
            [{"role": "user", "content": "Weather in Paris?"}],
            tools=TOOLS,
            tool_choice=choice,
            parallel_tool_calls=False,
            temperature=0,
            max_tokens=120,
        )
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.content is None
        (call,) = c.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), PARAMS)


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": "get_weather"}, "tools"),
        ({"tool_choice": "required"}, "tools"),
        (
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{x"}}
                        ],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
    ],
)
def test_bad_tool_input_names_the_field(smollm2_server, extra, param):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **extra}
    r = httpx.post(smollm2_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
