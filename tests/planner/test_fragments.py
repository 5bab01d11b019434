"""Emitted request fragments are accepted by the providers' official SDKs: checked key by key against the SDKs'
request TypedDicts (unknown keys and wrong literals fail), and sent through `openai.OpenAI` and
`anthropic.Anthropic` clients to a local HTTP server that captures the body (no network)."""

import json
import threading
import typing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import typing_extensions as te

from tokenseam.planner import PlannerError
from tokenseam.planner.fragments import (
    breakpoints,
    detect_dialect,
    load_fragment,
    make_fragment,
    merge_fragment,
    prefix_text,
)
from tokenseam.planner.profiles import load_profiles

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

PREFIX = "You are terse.\n\nQ: What is 2 + 2?\nA: 4."


def strict_check(value, tp, path="body"):
    """Raise AssertionError unless `value` fits the annotated type `tp` exactly (TypedDicts: no unknown keys,
    required keys present; Literals: one of the values; Unions: some member fits)."""
    origin = te.get_origin(tp)
    args = te.get_args(tp)
    if origin in (te.Required, te.NotRequired, typing.Required, typing.NotRequired):
        return strict_check(value, args[0], path)
    if te.is_typeddict(tp):
        assert isinstance(value, dict), f"{path}: expected an object for {tp.__name__}"
        hints = te.get_type_hints(tp, include_extras=True)
        unknown = set(value) - set(hints)
        assert not unknown, f"{path}: keys {unknown} are not in {tp.__name__}"
        required = set(tp.__required_keys__) | {
            k for k, h in hints.items() if te.get_origin(h) in (te.Required, typing.Required)
        }
        missing = required - set(value)
        assert not missing, f"{path}: required keys {missing} of {tp.__name__} missing"
        for k, v in value.items():
            strict_check(v, hints[k], f"{path}.{k}")
        return
    if origin in (typing.Literal, te.Literal):
        assert value in args, f"{path}: {value!r} not in {args}"
        return
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        errors = []
        for a in args:
            try:
                strict_check(value, a, path)
                return
            except AssertionError as e:
                errors.append(str(e))
        raise AssertionError(f"{path}: fits no member of the union: {errors[:4]}")
    if origin is not None and str(origin) in (
        "<class 'collections.abc.Iterable'>",
        "<class 'list'>",
        "typing.Iterable",
    ):
        assert isinstance(value, list), f"{path}: expected a list"
        for i, v in enumerate(value):
            strict_check(v, args[0], f"{path}[{i}]")
        return
    if origin is not None and "Iterable" in str(origin) or origin is list:
        assert isinstance(value, list), f"{path}: expected a list"
        for i, v in enumerate(value):
            strict_check(v, args[0], f"{path}[{i}]")
        return
    if tp is type(None):
        assert value is None, f"{path}: expected null"
        return
    if tp in (str, int, float, bool):
        ok = isinstance(value, tp) and not (tp in (int, float) and isinstance(value, bool))
        assert ok or (tp is float and isinstance(value, int)), (
            f"{path}: expected {tp.__name__}, got {value!r}"
        )
        return
    if origin is dict or tp is dict or origin is typing.Dict:  # noqa: UP006 - the SDK's annotations
        assert isinstance(value, dict), f"{path}: expected an object"
        return
    # anything else (object, Any, sequences of scalars): accept
    return


class Capture:
    def __init__(self, reply: dict):
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        reply_bytes = json.dumps(reply).encode()
        state = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                state.bodies.append(json.loads(self.rfile.read(n)))
                state.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply_bytes)))
                self.end_headers()
                self.wfile.write(reply_bytes)

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


OPENAI_REPLY = {
    "id": "x",
    "object": "chat.completion",
    "created": 0,
    "model": "gpt-5.6",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "4"}}],
}
ANTHROPIC_REPLY = {
    "id": "msg_x",
    "type": "message",
    "role": "assistant",
    "model": "claude-opus-5",
    "content": [{"type": "text", "text": "4"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 1, "output_tokens": 1},
}


@pytest.mark.parametrize(
    "profile, write, role",
    [
        ("openai-gpt-5.6", "30m", "user"),
        ("openai-gpt-5.6", "12h", "system"),
        ("openai-gpt-5.6", "30m", "developer"),
        ("openai-gpt-5", "24h", "user"),
        ("openai-gpt-5", "in_memory", "system"),
        ("deepseek-flash", None, "user"),
        ("local", None, "user"),
    ],
)
def test_openai_fragments_fit_the_sdk_and_reach_the_wire(profile, write, role):
    from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming

    prof = load_profiles().get(profile)
    frag = make_fragment("openai", PREFIX, prof, prof.write(write), role)
    body = merge_fragment(frag, "openai", "Q: What is 3 + 3?")
    strict_check({"model": "gpt-5.6", **body}, CompletionCreateParamsNonStreaming)
    assert breakpoints(frag) == (1 if prof.explicit else 0)
    if prof.explicit:
        part = frag["messages"][0]["content"][0]
        assert part["prompt_cache_breakpoint"] == (
            {"mode": "explicit", "ttl": "12h"} if write == "12h" else {"mode": "explicit"}
        )
        assert frag["prompt_cache_options"] == {"mode": "explicit", "ttl": "30m"}
    cap = Capture(OPENAI_REPLY)
    try:
        client = openai.OpenAI(base_url=cap.url + "/v1", api_key="test", max_retries=0)
        out = client.chat.completions.create(model="gpt-5.6", max_completion_tokens=8, **body)
    finally:
        cap.close()
    assert out.choices[0].message.content == "4"
    sent = cap.bodies[0]
    assert cap.paths == ["/v1/chat/completions"]
    assert {k: v for k, v in sent.items() if k not in ("model", "max_completion_tokens")} == body
    # The prefix is sent first, whole, and the appended question comes after it.
    texts = [
        p["text"]
        for m in sent["messages"]
        for p in (m["content"] if isinstance(m["content"], list) else [{"text": m["content"]}])
    ]
    assert texts[0] == PREFIX and texts[-1].endswith("Q: What is 3 + 3?")


@pytest.mark.parametrize("write, role", [("5m", "system"), ("1h", "user"), ("5m", "user")])
def test_anthropic_fragments_fit_the_sdk_and_reach_the_wire(write, role):
    from anthropic.types.message_create_params import MessageCreateParamsNonStreaming

    prof = load_profiles().get("claude-opus-5")
    frag = make_fragment("anthropic", PREFIX, prof, prof.write(write), role)
    body = merge_fragment(frag, "anthropic", "Q: What is 3 + 3?")
    strict_check({"model": "claude-opus-5", "max_tokens": 8, **body}, MessageCreateParamsNonStreaming)
    block = (frag["system"] if role == "system" else frag["messages"][0]["content"])[0]
    assert block["cache_control"] == {"type": "ephemeral", "ttl": write} and breakpoints(frag) == 1
    cap = Capture(ANTHROPIC_REPLY)
    try:
        client = anthropic.Anthropic(base_url=cap.url, api_key="test", max_retries=0)
        out = client.messages.create(model="claude-opus-5", max_tokens=8, **body)
    finally:
        cap.close()
    assert out.content[0].text == "4" and cap.paths == ["/v1/messages"]
    sent = cap.bodies[0]
    assert {k: v for k, v in sent.items() if k not in ("model", "max_tokens")} == body


def test_strict_check_catches_wrong_fields():
    """The checker itself fails on a misspelt field, a wrong TTL and a missing required key."""
    from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
    from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming

    good = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}
    strict_check(good, CompletionCreateParamsNonStreaming)
    for bad in (
        {**good, "prompt_cache_option": {"mode": "explicit"}},
        {**good, "prompt_cache_options": {"mode": "sometimes"}},
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "text",
                            "text": "x",
                            "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "5m"},
                        }
                    ],
                }
            ],
        },
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}],
                }
            ],
        },
    ):
        with pytest.raises(AssertionError):
            strict_check(bad, CompletionCreateParamsNonStreaming)
    with pytest.raises(AssertionError):
        strict_check(
            {
                "model": "m",
                "max_tokens": 1,
                "system": [
                    {"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "2h"}}
                ],
                "messages": [],
            },
            MessageCreateParamsNonStreaming,
        )
    with pytest.raises(AssertionError):
        strict_check({"model": "m", "messages": []}, MessageCreateParamsNonStreaming)  # no max_tokens


def test_gemini_fragment_is_just_the_contents():
    prof = load_profiles().get("gemini-3-pro")
    frag = make_fragment("gemini", PREFIX, prof)
    assert frag == {"contents": [{"role": "user", "parts": [{"text": PREFIX}]}]} and breakpoints(frag) == 0
    body = merge_fragment(frag, "gemini", "Q?")
    assert body["contents"][0]["parts"] == [{"text": PREFIX}, {"text": "\n\nQ?"}]
    assert make_fragment("gemini", PREFIX, prof, role="system") == {
        "systemInstruction": {"parts": [{"text": PREFIX}]}
    }


@pytest.mark.parametrize(
    "dialect, profile, role, needle",
    [
        ("openai", "claude-opus-5", "user", "anthropic cache"),
        ("anthropic", "gpt-5.6", "user", "openai cache"),
        ("gemini", "gpt-5.6", "user", "--emit openai"),
        ("anthropic", "claude-opus-5", "developer", "only in the OpenAI format"),
        ("openai", "gpt-5.6", "tool", "--role must be one of"),
        ("xml", "gpt-5.6", "user", "--emit must be one of"),
    ],
)
def test_fragment_refuses_the_wrong_api(dialect, profile, role, needle):
    with pytest.raises(PlannerError, match=needle):
        make_fragment(dialect, PREFIX, load_profiles().get(profile), role=role)


def test_fragment_files_round_trip_and_bad_files(tmp_path):
    prof = load_profiles().get("gpt-5.6")
    f = tmp_path / "f.json"
    f.write_text(json.dumps(make_fragment("openai", PREFIX, prof)))
    frag, dialect = load_fragment(f)
    assert dialect == "openai" and prefix_text(frag) == PREFIX
    assert (
        detect_dialect(make_fragment("anthropic", PREFIX, load_profiles().get("anthropic")), "x")
        == "anthropic"
    )
    for body, needle in (
        ("{oops", "not valid JSON"),
        ("[1, 2]", "non-empty JSON object"),
        ('{"model": "x"}', "not a request fragment"),
        ('{"messages": [{"role": "user", "content": []}]}', "holds no text"),
        ("", "is empty"),
    ):
        f.write_text(body)
        with pytest.raises(PlannerError, match=needle):
            load_fragment(f)
    f.write_bytes(b"\xff\xfe{}")
    with pytest.raises(PlannerError, match="not UTF-8"):
        load_fragment(f)
