"""constraint_from_request: every request style maps to the right grammar; bad and conflicting options
raise GrammarError; forced tool calls follow the documented {"name", "arguments"} shape."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tokenseam.grammar import GrammarError
from tokenseam.grammar.request import constraint_from_request

from .conftest import accepts_text, sample

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def test_no_constraint(compiler):
    assert constraint_from_request(compiler, {"messages": []}, "/v1/chat/completions") is None
    assert (
        constraint_from_request(compiler, {"response_format": {"type": "text"}}, "/v1/chat/completions")
        is None
    )
    # tools belong to chat; elsewhere they are not a constraint
    assert (
        constraint_from_request(compiler, {"tools": [WEATHER], "tool_choice": "auto"}, "/v1/completions")
        is None
    )
    assert constraint_from_request(compiler, {"grammar": ""}, "/completion") is None


def test_response_format_json_object(compiler):
    g = constraint_from_request(
        compiler, {"response_format": {"type": "json_object"}}, "/v1/chat/completions"
    )
    assert accepts_text(g, '{"a": [1]}')
    assert not accepts_text(g, "[1]")


def test_response_format_json_schema_strict(compiler):
    body = {
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "x",
                "strict": True,
                "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            },
        }
    }
    g = constraint_from_request(compiler, body, "/v1/chat/completions")
    assert accepts_text(g, '{"a": 1}')
    assert not accepts_text(g, '{"a": 1, "b": 2}')
    body["response_format"]["json_schema"]["strict"] = False
    g = constraint_from_request(compiler, body, "/v1/chat/completions")
    assert accepts_text(g, '{"a": 1, "b": 2}')


@pytest.mark.parametrize(
    "body,good,bad",
    [
        ({"guided_json": {"type": "integer"}}, "12", "1.5"),
        ({"guided_json": '{"type": "boolean"}'}, "true", "1"),
        ({"guided_regex": "[0-9]{3}"}, "123", "12"),
        ({"guided_grammar": 'root ::= "yes" | "no"'}, "yes", "maybe"),
        ({"guided_choice": ["red", "blue"]}, "blue", "green"),
        ({"grammar": "root ::= [a-c]+"}, "abc", "abd"),
        ({"json_schema": {"type": "string", "maxLength": 2}}, '"ab"', '"abc"'),
        ({"structured_outputs": {"json": {"type": "integer"}}}, "12", "1.5"),
        ({"structured_outputs": {"json": '{"type": "boolean"}'}}, "true", "1"),
        ({"structured_outputs": {"json_object": True}}, '{"a": 1}', "[1]"),
        ({"structured_outputs": {"regex": "[0-9]{3}"}}, "123", "12"),
        ({"structured_outputs": {"choice": ["red", "blue"]}}, "blue", "green"),
        ({"structured_outputs": {"grammar": 'root ::= "yes" | "no"'}}, "yes", "maybe"),
        (
            {"structured_outputs": {"json": {"type": "object"}, "disable_any_whitespace": True}},
            '{"a":1}',
            '{"a": 1}',
        ),
        (
            {
                "structured_outputs": {
                    "json": {"type": "object", "properties": {"a": {}}},
                    "disable_additional_properties": True,
                }
            },
            '{"a": 1}',
            '{"a": 1, "b": 2}',
        ),
        ({"structured_outputs": {"json": {"type": "integer"}, "_backend": "xgrammar"}}, "7", "x"),
    ],
)
def test_guided_and_llama_server_fields(compiler, body, good, bad):
    g = constraint_from_request(compiler, body, "/completion")
    assert accepts_text(g, good)
    assert not accepts_text(g, bad)


def call(name: str, arguments: dict) -> str:
    return (
        "<tool_call>"
        + json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))
        + "</tool_call>"
    )


def test_forced_tool_call_shape(compiler, smollm2_vocab):
    body = {
        "tools": [WEATHER, TIME],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    g = constraint_from_request(compiler, body, "/v1/chat/completions")
    assert accepts_text(g, call("get_weather", {"city": "Oslo", "unit": "c"}))
    two = (call("get_weather", {"city": "Oslo"}), call("get_weather", {"city": "Rome"}))
    assert accepts_text(g, "".join(two))
    # the layout is exactly the one a call is rendered back into a later prompt with (toolcalls.call_text)
    assert not accepts_text(g, "\n".join(two))
    assert not accepts_text(g, "\n" + two[0])
    assert not accepts_text(g, two[0].replace("<tool_call>", "<tool_call>\n"))
    assert not accepts_text(g, call("get_time", {}))
    assert not accepts_text(g, call("get_weather", {"unit": "c"}))
    assert not accepts_text(g, "Sure. " + call("get_weather", {"city": "Oslo"}))  # forced: calls only
    rng = np.random.default_rng(0)
    for mode in ("random", "close", "long"):
        out, done = sample(g, smollm2_vocab, rng, 300, mode)
        if done:
            text = out.decode()
            for block in text.split("</tool_call>")[:-1]:
                obj = json.loads(block.strip().removeprefix("<tool_call>"))
                assert obj["name"] == "get_weather" and "city" in obj["arguments"]


def test_required_tool_choice_any_function(compiler):
    g = constraint_from_request(
        compiler, {"tools": [WEATHER, TIME], "tool_choice": "required"}, "/v1/chat/completions"
    )
    assert accepts_text(g, call("get_time", {}))
    assert not accepts_text(g, call("get_time", {"tz": "UTC"}))  # no parameters declared: none taken
    assert accepts_text(g, call("get_weather", {"city": "x"}))
    assert not accepts_text(g, "\n" + call("get_weather", {"city": "x"}))  # nothing before the call
    assert not accepts_text(g, call("other", {}))
    assert not accepts_text(g, "")
    one = constraint_from_request(
        compiler,
        {"tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": False},
        "/v1/chat/completions",
    )
    assert accepts_text(one, call("get_time", {}))
    assert not accepts_text(one, call("get_time", {}) + call("get_time", {}))


def test_auto_is_free_text_or_calls(compiler, smollm2_vocab):
    g = constraint_from_request(
        compiler, {"tools": [WEATHER, TIME]}, "/v1/chat/completions"
    )  # auto by default
    for text in ("", "Hello!", "a < b and <tool c", "I'll check.\n" + call("get_weather", {"city": "Oslo"})):
        assert accepts_text(g, text), text
    assert accepts_text(g, call("get_time", {}) + call("get_weather", {"city": "x"}))
    for text in (
        call("get_time", {}) + "\n" + call("get_weather", {"city": "x"}),  # calls are back to back
        "<tool_call>",  # a call that never closes
        "<tool_call>hello</tool_call>",  # not a call
        call("get_weather", {"city": "x", "extra": 1}),  # undeclared argument
        call("get_weather", {"city": "x"}) + " and then text",  # nothing after the calls
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',  # not compact
        call("nope", {}),
    ):
        assert not accepts_text(g, text), text
    # sampled adversarially: whatever ends is text without a call marker, or text and then valid calls
    rng = np.random.default_rng(1)
    for mode in ("random", "close", "long", "random"):
        out, done = sample(g, smollm2_vocab, rng, 200, mode)
        text = out.decode("utf-8", errors="replace")
        if done and "<tool_call>" in text:
            tail = text[text.index("<tool_call>") :]
            for block in tail.split("</tool_call>")[:-1]:
                obj = json.loads(block.strip().removeprefix("<tool_call>"))
                assert obj["name"] in ("get_weather", "get_time")


def test_tool_choice_none_keeps_call_markers_out(compiler):
    g = constraint_from_request(compiler, {"tools": [WEATHER], "tool_choice": "none"}, "/v1/chat/completions")
    assert accepts_text(g, "Plain answer <tool")
    assert not accepts_text(g, call("get_weather", {"city": "x"}))
    # with another constraint, `none` adds nothing
    other = constraint_from_request(
        compiler,
        {"tools": [WEATHER], "tool_choice": "none", "guided_regex": "a+"},
        "/v1/chat/completions",
    )
    assert accepts_text(other, "aaa")


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "conflicting"),
        ({"guided_json": {"type": "integer"}, "grammar": 'root ::= "a"'}, "conflicting"),
        (
            {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "conflicting",
        ),
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "unsupported response_format"),
        ({"response_format": {"type": "json_schema"}}, "json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}},
            "strict",
        ),
        ({"guided_json": "{not json"}, "not valid JSON"),
        ({"guided_json": [1]}, "JSON Schema"),
        ({"guided_regex": 5}, "guided_regex"),
        ({"guided_regex": "(?=x)"}, "lookaround"),
        ({"guided_grammar": "root ::= nope"}, "undefined"),
        ({"guided_choice": []}, "non-empty"),
        ({"guided_choice": ["a", 1]}, "choice[1]"),
        ({"grammar": 7}, "GBNF"),
        ({"tool_choice": "required"}, "tools"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "not in 'tools'",
        ),
        ({"tools": [{"type": "function"}], "tool_choice": "required"}, "tools[0]"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "conflicting"),  # auto + JSON
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tools": [WEATHER, WEATHER]}, "given twice"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "strict": 1}}]}, "strict"),
        ({"tools": "f"}, "non-empty array"),
        ({"tools": [WEATHER], "json_schema_options": {"compact": True}}, "does not apply to tool calls"),
        ({"json_schema": {"type": "array", "uniqueItems": True}}, "uniqueItems"),
        ({"structured_outputs": "json"}, "must be an object"),
        ({"structured_outputs": {}}, "exactly one of"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "got regex, choice"),
        ({"structured_outputs": {"jsn": {}}}, "structured_outputs.jsn is not a field"),
        ({"structured_outputs": {"json_object": False}}, "json_object must be true"),
        ({"structured_outputs": {"grammar": "start: 'a'"}}, "Lark/EBNF"),
        ({"structured_outputs": {"grammar": ""}}, "non-empty GBNF"),
        ({"structured_outputs": {"regex": 5}}, "regex must be a string"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structural_tag is not supported"),
        (
            {"structured_outputs": {"regex": "a", "whitespace_pattern": " "}},
            "whitespace_pattern is not supported",
        ),
        ({"structured_outputs": {"regex": "a", "disable_any_whitespace": True}}, "applies to json"),
        ({"structured_outputs": {"json": {}, "disable_any_whitespace": "yes"}}, "true or false"),
        ({"structured_outputs": {"json": {"type": "strnig"}}}, "strnig"),
        ({"structured_outputs": {"regex": "a"}, "guided_regex": "a"}, "conflicting"),
    ],
)
def test_bad_requests(compiler, body, needle):
    with pytest.raises(GrammarError) as ei:
        constraint_from_request(compiler, body, "/v1/chat/completions")
    assert needle in str(ei.value)


def test_body_must_be_object(compiler):
    with pytest.raises(GrammarError):
        constraint_from_request(compiler, [], "/completion")  # type: ignore[arg-type]


def test_json_schema_options(compiler):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    g = constraint_from_request(
        compiler, {"guided_json": schema, "json_schema_options": {"compact": True}}, "/v1/completions"
    )
    assert accepts_text(g, '{"a":1}') and not accepts_text(g, '{"a": 1}')
    g = constraint_from_request(
        compiler, {"json_schema": schema, "json_schema_options": {"max_ws": 2}}, "/completion"
    )
    assert accepts_text(g, '{\n  "a": 1\n}') and not accepts_text(g, '{\n   "a": 1\n}')
    body = {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"strict": True, "schema": {"type": "array", "uniqueItems": True}},
        },
        "json_schema_options": {"lenient": True},
    }
    g = constraint_from_request(compiler, body, "/v1/chat/completions")
    assert g.warnings and "uniqueItems" in g.warnings[0]
    # strict comes from response_format, not from the options
    body = {
        "response_format": {"type": "json_schema", "json_schema": {"strict": True, "schema": schema}},
        "json_schema_options": {"compact": True},
    }
    g = constraint_from_request(compiler, body, "/v1/chat/completions")
    assert accepts_text(g, '{"a":1}') and not accepts_text(g, '{"a":1,"b":2}')
    two = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    for order, swapped in (("schema", False), ("any", True)):
        g = constraint_from_request(
            compiler,
            {"guided_json": two, "json_schema_options": {"property_order": order}},
            "/v1/completions",
        )
        assert accepts_text(g, '{"a": 1, "b": 2}') and accepts_text(g, '{"b": 2, "a": 1}') == swapped


@pytest.mark.parametrize(
    "opts,match",
    [
        ({"compact": "yes"}, "compact must be true or false"),
        ({"max_ws": True}, "max_ws must be an integer"),
        ({"max_ws": 5000}, "max_ws must be an integer between"),
        ({"max_ws": -1}, "max_ws must be an integer between"),
        ({"indent": 2}, "not an option"),
        ({"property_order": "sorted"}, 'property_order must be "schema" or "any"'),
        ({"property_order": ["any"]}, 'property_order must be "schema" or "any"'),
        ({"property_order": None}, 'property_order must be "schema" or "any"'),
        ([1], "must be an object"),
        ("compact", "must be an object"),
    ],
)
def test_bad_json_schema_options(compiler, opts, match):
    with pytest.raises(GrammarError, match=match) as info:
        constraint_from_request(
            compiler, {"guided_json": {"type": "object"}, "json_schema_options": opts}, "/v1/completions"
        )
    assert info.value.param == "json_schema_options"


def test_compile_errors_name_their_request_field(compiler):
    for body, field in (
        ({"guided_json": {"not": {}}}, "guided_json"),
        ({"guided_regex": "(?=a)"}, "guided_regex"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"if": {"const": 1.5}}}}},
            "response_format",
        ),
    ):
        with pytest.raises(GrammarError) as info:
            constraint_from_request(compiler, body, "/v1/chat/completions")
        assert info.value.param == field


def test_json_schema_options_need_a_json_constraint(compiler):
    for body in (
        {"json_schema_options": {"compact": True}},
        {"guided_regex": "a+", "json_schema_options": {"compact": True}},
    ):
        with pytest.raises(GrammarError, match="needs a JSON Schema constraint"):
            constraint_from_request(compiler, body, "/v1/completions")


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {"name": "bad"}}])
def test_a_bad_parameter_schema_is_named_by_its_request_field(compiler, choice):
    bad_fn = {
        "type": "function",
        "function": {
            "name": "bad",
            "parameters": {"type": "object", "properties": {"x": {"type": "strnig"}}},
        },
    }
    with pytest.raises(GrammarError) as ei:
        constraint_from_request(
            compiler, {"tools": [WEATHER, bad_fn], "tool_choice": choice}, "/v1/chat/completions"
        )
    assert ei.value.param == "tools[1].function.parameters.properties.x", str(ei.value)
    assert "tools[1].function.parameters.properties.x" in str(ei.value) and "anyOf" not in str(ei.value)
