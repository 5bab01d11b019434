"""One wire contract: the server's parser and the response cache read the same defaults and token_healing rule."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tokenseam.wire as wire
from tokenseam.healing import HealingError, resolve_token_healing
from tokenseam.respcache import request_form
from tokenseam.server.errors import APIError
from tokenseam.server.protocol import parse_llama_completion, parse_openai
from tokenseam.wire import DEFAULTS, ROUTE_CHAT, ROUTE_COMPLETIONS, ROUTE_LLAMA, ROUTES, TOKEN_HEALING_ERROR

BASE = {
    ROUTE_CHAT: {"messages": [{"role": "user", "content": "hi"}]},
    ROUTE_COMPLETIONS: {"prompt": "hi"},
    ROUTE_LLAMA: {"prompt": "hi"},
}


def _parse(route: str, body: dict):
    return parse_llama_completion(body) if route == ROUTE_LLAMA else parse_openai(body, route)


def _cases() -> list:
    return [
        pytest.param(route, name, v, id=f"{route}:{name}={v!r}")
        for route in ROUTES
        for name, (_, value) in DEFAULTS[route].items()
        for v in (value if isinstance(value, tuple) else (value,))
    ]


@pytest.mark.parametrize("route,name,value", _cases())
def test_the_cache_default_is_the_server_default(route, name, value):
    """Sending a field at the cache's default parses exactly like leaving it out: a FILL default is what the
    server assumes, a DROP default can be removed without changing the answer."""
    omitted = _parse(route, dict(BASE[route]))
    sent = _parse(route, dict(BASE[route], **{name: value}))
    assert sent == omitted


def test_the_cache_reads_the_wire_table():
    assert request_form.DEFAULTS is wire.DEFAULTS


@pytest.mark.parametrize("route", ROUTES)
def test_fill_defaults_reach_the_generated_request(route):
    out = request_form.normalize_request(route, BASE[route])
    for name, (mode, value) in DEFAULTS[route].items():
        if mode == wire.FILL:
            assert out[name] == value


@pytest.mark.parametrize(
    "value",
    [
        True,
        False,
        None,
        0,
        1,
        wire.TOKEN_HEALING_MAX,
        wire.TOKEN_HEALING_MAX + 1,
        -1,
        1.5,
        "true",
        [4],
        10**18,
    ],
)
@pytest.mark.parametrize("route", [ROUTE_COMPLETIONS, ROUTE_LLAMA])
def test_one_token_healing_rule(route, value):
    """The server's parser and `resolve_token_healing` accept and refuse the same values, with one message."""
    body = dict(BASE[route], token_healing=value)
    try:
        wire.check_token_healing(value, True)
    except ValueError:
        with pytest.raises(APIError) as e:
            _parse(route, body)
        assert e.value.param == "token_healing" and e.value.message == TOKEN_HEALING_ERROR
        with pytest.raises(HealingError, match=TOKEN_HEALING_ERROR):
            resolve_token_healing(value)
        return
    parsed = _parse(route, body).token_healing
    assert parsed == (True if value is None else value)
    assert resolve_token_healing(value) == (4 if parsed is True else int(parsed))


def test_wire_imports_nothing_of_tokenseam():
    tree = ast.parse(Path(wire.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and not (node.module or "").startswith("tokenseam"), ast.dump(node)
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("tokenseam") for a in node.names)


def test_completions_logprobs_zero_is_not_the_absent_default():
    """`logprobs: 0` on /v1/completions asks for the sampled tokens' logprobs: it must not share a cache key
    with a request that asks for none."""
    absent = request_form.normalize_request(ROUTE_COMPLETIONS, BASE[ROUTE_COMPLETIONS])
    zero = request_form.normalize_request(ROUTE_COMPLETIONS, dict(BASE[ROUTE_COMPLETIONS], logprobs=0))
    null = request_form.normalize_request(ROUTE_COMPLETIONS, dict(BASE[ROUTE_COMPLETIONS], logprobs=None))
    assert zero != absent and null == absent
    assert _parse(ROUTE_COMPLETIONS, dict(BASE[ROUTE_COMPLETIONS], logprobs=0)).params.logprobs


@pytest.mark.parametrize("value", [True, "2", 2.5, 21, -1])
def test_completions_logprobs_errors_state_the_accepted_range(value):
    with pytest.raises(APIError) as ei:
        _parse(ROUTE_COMPLETIONS, dict(BASE[ROUTE_COMPLETIONS], logprobs=value))
    msg = ei.value.message
    assert ei.value.param == "logprobs" and ("20" in msg or ">= 0" in msg), msg
