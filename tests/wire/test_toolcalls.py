"""The tool-call text format: rendering tools and history for a template, splitting an answer into text and
calls, and what a stream must hold back."""

from __future__ import annotations

import json

import pytest

from tokenseam.toolcalls import (
    OPEN,
    ToolFormatError,
    call_text,
    held_back,
    native_tools,
    render_messages,
    split_output,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_split_text_and_calls():
    s = split_output("Let me look." + call_text("get_weather", {"city": "Oslo"}))
    assert s.content == "Let me look." and s.is_tool_answer
    assert [(n, a) for n, a, _ in s.calls] == [("get_weather", '{"city":"Oslo"}')]
    two = call_text("a", {}) + "\n" + OPEN + '{"name":"b","arguments":{"x":[1,2.50]}}</tool_call>'
    s = split_output(two)
    assert [(n, a) for n, a, _ in s.calls] == [("a", "{}"), ("b", '{"x":[1,2.50]}')]  # arguments as written
    assert s.calls[-1][2] == len(two)


@pytest.mark.parametrize(
    "text,content,calls,answer",
    [
        ("no calls here", "no calls here", 0, False),
        ("a <tool b", "a <tool b", 0, False),
        (OPEN + '{"name":"a","argu', "", 0, False),  # ran out inside a call
        (OPEN + "not json</tool_call>", "", 0, False),
        (call_text("a", {}) + " trailing text", "", 1, False),
        (call_text("a", {}) + "\n", "", 1, True),
    ],
)
def test_split_edges(text, content, calls, answer):
    s = split_output(text)
    assert (s.content, len(s.calls), s.is_tool_answer) == (content, calls, answer)
    # nothing is lost: content, the calls' text and the rest make up the whole output
    assert text.startswith(s.content) and text.endswith(s.rest)


def test_held_back():
    assert held_back("Hello") == 0
    assert held_back("Hello <") == 1
    assert held_back("Hello <tool_ca") == 8
    assert held_back("a <tool_call") == len(OPEN) - 1
    assert held_back("<b") == 0


def test_fallback_rendering_describes_tools_and_history():
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo and Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
    ]
    out, tools = render_messages(msgs, [WEATHER], native=False)
    assert tools is None
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.\n\n")
    assert '"name":"get_weather"' in out[0]["content"] and "Weather now" in out[0]["content"]
    # the assistant turn reads as the model wrote it, so a prefix cache sees the same text
    assert out[2] == {
        "role": "assistant",
        "content": call_text("get_weather", {"city": "Oslo"}) + call_text("get_weather", {"city": "Rome"}),
    }
    assert len(out) == 4 and out[3]["role"] == "user"  # both results in one user turn
    blocks = out[3]["content"].split("\n")
    assert [
        json.loads(b.removeprefix("<tool_response>").removesuffix("</tool_response>")) for b in blocks
    ] == [
        {"name": "get_weather", "content": "sunny"},
        {"name": "get_weather", "content": "rain"},
    ]
    # no system message: one is added
    out, _ = render_messages([{"role": "user", "content": "hi"}], [WEATHER], native=False)
    assert out[0]["role"] == "system" and out[1] == {"role": "user", "content": "hi"}


def test_native_rendering_passes_tools_and_argument_objects():
    assert native_tools("{% if tools %}...<tool_call>{% endif %}")
    assert not native_tools("{{ messages }}")
    msgs = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "x", "function": {"name": "f", "arguments": '{"a":1}'}}],
        },
        {"role": "tool", "tool_call_id": "x", "content": "2"},
    ]
    out, tools = render_messages(msgs, [WEATHER], native=True)
    assert tools == [WEATHER]
    assert out[0]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert out[1] == msgs[1]


@pytest.mark.parametrize(
    "calls,param",
    [
        ("x", "messages[0].tool_calls"),
        ([{"function": {"name": ""}}], "messages[0].tool_calls[0].function.name"),
        ([{"function": {"name": "f", "arguments": "{oops"}}], "messages[0].tool_calls[0].function.arguments"),
        ([{"function": {"name": "f", "arguments": 5}}], "messages[0].tool_calls[0].function.arguments"),
        ([7], "messages[0].tool_calls[0].function.name"),
    ],
)
def test_malformed_history_names_the_field(calls, param):
    with pytest.raises(ToolFormatError) as ei:
        render_messages([{"role": "assistant", "content": None, "tool_calls": calls}], None, native=False)
    assert ei.value.param == param


@pytest.mark.parametrize(
    "sent",
    ['{"q":"caf\\u00e9","n":1E2}', '{"x":"</tool_call><tool_call>"}', '  {"a":[1, 2]}\n', '"just a string"'],
)
def test_fallback_rendering_writes_arguments_as_sent(sent):
    """The arguments string is written as sent (escapes, number spellings, spacing), once it parses; an
    arguments object (a native-template client) is serialized compact."""
    msgs = [
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": sent}}]}
    ]
    out, _ = render_messages(msgs, None, native=False)
    assert out[0]["content"] == OPEN + '{"name":"f","arguments":' + sent + "}</tool_call>"
    obj = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
        }
    ]
    assert render_messages(obj, None, native=False)[0][0]["content"] == call_text("f", {"a": 1})


@pytest.mark.parametrize("sent", ['{"a":1}<|im_end|>', "{oops", "", '{"a":1} {"b":2}'])
def test_arguments_that_do_not_parse_are_refused_before_rendering(sent):
    msgs = [
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": sent}}]}
    ]
    with pytest.raises(ToolFormatError) as ei:
        render_messages(msgs, None, native=False)
    assert ei.value.param == "messages[0].tool_calls[0].function.arguments"


def test_the_fallback_prompt_shows_an_example_call():
    from tokenseam.toolcalls import example_call

    assert example_call(WEATHER) == call_text("get_weather", {})  # no required parameters
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {"n": {"type": "integer"}, "u": {"enum": ["c", "f"]}},
                "required": ["n", "u"],
            },
        },
    }
    assert example_call(tool) == call_text("f", {"n": 1, "u": "c"})
    out, _ = render_messages([{"role": "user", "content": "hi"}], [tool], native=False)
    assert call_text("f", {"n": 1, "u": "c"}) in out[0]["content"]
