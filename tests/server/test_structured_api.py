"""Structured outputs through the API: every constrained output parses and validates."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest

pytestmark = [pytest.mark.model, pytest.mark.server]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(smollm2_server):
    return openai.OpenAI(base_url=smollm2_server.url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_response_format_json_schema_validates(client, temperature):
    r = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Give me a person as JSON."}],
        max_tokens=80,
        temperature=temperature,
        seed=3,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_json_object_mode(client):
    msg = 'Reply with a JSON object with one key "ok" set to true.'
    r = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": msg}],
        max_tokens=100,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_forced_tool_call_becomes_tool_calls(client):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 30}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        }
    ]
    r = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
        temperature=0,
    )
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    call = c.message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), tools[0]["function"]["parameters"])
    # streamed: ids on every event, the call once complete
    chunks = list(
        client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=tools,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False,
            max_tokens=60,
            temperature=0,
            stream=True,
        )
    )
    deltas = [
        ch.choices[0].delta.tool_calls for ch in chunks if ch.choices and ch.choices[0].delta.tool_calls
    ]
    assert len(deltas) == 1 and deltas[0][0].function.name == "get_weather"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_vllm_style_guided_options(smollm2_server):
    url = smollm2_server.url + "/v1/completions"
    r = httpx.post(
        url,
        json={
            "prompt": "Is the sky blue? Answer:",
            "guided_choice": ["yes", "no", "maybe"],
            "max_tokens": 10,
            "temperature": 0,
            "token_healing": False,
        },
        timeout=60,
    ).json()
    assert r["choices"][0]["text"] in ("yes", "no", "maybe")
    r = httpx.post(
        url,
        json={
            "prompt": "A date:",
            "guided_regex": r"\d{4}-\d{2}-\d{2}",
            "max_tokens": 20,
            "temperature": 1.0,
            "seed": 1,
        },
        timeout=60,
    ).json()
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", r["choices"][0]["text"])


def test_vllm_structured_outputs_field(smollm2_server):
    """vLLM's current constraint field, through the official client's extra_body (vLLM 0.12+ dropped guided_*)."""
    client = openai.OpenAI(base_url=smollm2_server.url + "/v1", api_key="unused", max_retries=0)
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "A number as JSON"}],
        max_tokens=30,
        temperature=1.0,
        seed=2,
        extra_body={"structured_outputs": {"json": schema, "disable_any_whitespace": True}},
    )
    text = r.choices[0].message.content
    assert re.fullmatch(r'\{"n":[0-9]\}', text), text
    r = client.completions.create(
        model="smollm2",
        prompt="Pick:",
        max_tokens=10,
        extra_body={"structured_outputs": {"choice": ["left", "right"]}, "token_healing": False},
    )
    assert r.choices[0].text in ("left", "right")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(
            model="smollm2",
            prompt="x",
            max_tokens=5,
            extra_body={"structured_outputs": {"grammar": "start: 'a'"}},
        )
    assert "Lark/EBNF" in str(e.value)


def test_llama_server_grammar_on_completion(smollm2_server):
    gbnf = 'root ::= "The answer is " [0-9]+ "."'
    r = httpx.post(
        smollm2_server.url + "/completion",
        json={"prompt": "2+2? ", "grammar": gbnf, "n_predict": 20, "temperature": 0},
        timeout=60,
    ).json()
    assert re.fullmatch(r"The answer is [0-9]+\.", r["content"])


@pytest.mark.parametrize(
    "extra",
    [
        {
            "response_format": {
                "type": "json_schema",
                # unique strings of any kind: no exact automaton (uniqueItems on an object asserts nothing)
                "json_schema": {
                    "schema": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
                },
            }
        },
        {"guided_regex": "(?<=a)b"},
        {"guided_grammar": "root ::= undefined_rule"},
        {"guided_choice": []},
        {"guided_regex": "a", "guided_choice": ["a"]},
        {"response_format": {"type": "xml"}},
    ],
)
def test_bad_constraints_are_400(smollm2_server, extra):
    r = httpx.post(
        smollm2_server.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 5, **extra},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"]


def test_json_schema_options_over_http(client, smollm2_server):
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 8}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Give me JSON with a and b."}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        extra_body={"json_schema_options": {"compact": True}},
    )
    text = r.choices[0].message.content
    jsonschema.validate(json.loads(text), schema)
    assert json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False) == text
    for seed in range(3):
        r = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Give me JSON with b and a."}],
            max_tokens=60,
            temperature=1.0,
            seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            extra_body={"json_schema_options": {"property_order": "any"}},
        )
        pairs = json.loads(r.choices[0].message.content, object_pairs_hook=lambda kv: kv)
        assert len({k for k, _ in pairs}) == len(pairs) == 2
        jsonschema.validate(dict(pairs), schema)
    # lenient: the ignored keyword is reported once, on the response and on the first streamed chunk
    body = {
        "prompt": "A list:",
        "guided_json": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "maxItems": 3},
        "json_schema_options": {"lenient": True},
        "max_tokens": 30,
        "temperature": 0,
    }
    url = smollm2_server.url + "/v1/completions"
    out = httpx.post(url, json=body, timeout=60).json()
    assert any("uniqueItems" in w for w in out["grammar_warnings"])
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    assert "grammar_warnings" in events[0] and not any("grammar_warnings" in e for e in events[1:])
    bad = httpx.post(url, json={**body, "json_schema_options": {"max_ws": "wide"}}, timeout=60)
    assert bad.status_code == 400 and "max_ws" in bad.json()["error"]["message"]
    assert bad.json()["error"]["param"] == "json_schema_options"
    bad = httpx.post(url, json={**body, "json_schema_options": {"property_order": "az"}}, timeout=60)
    assert bad.status_code == 400 and "property_order" in bad.json()["error"]["message"]
    bad = httpx.post(url, json={"prompt": "x", "json_schema_options": {"compact": True}}, timeout=60)
    assert bad.status_code == 400 and "needs a JSON Schema constraint" in bad.json()["error"]["message"]
