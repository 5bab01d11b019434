"""A request's grammar compiles while the engine reads its prompt: the prompt is read (all but its last token)
before the compile ends, a refused grammar is still a 400 with nothing left running, and `grammar_overlap` off
compiles first."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import jsonschema
import pytest

pytestmark = [pytest.mark.model, pytest.mark.server]

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "year": {"type": "integer"}},
    "required": ["city", "year"],
    "additionalProperties": False,
}
PROMPT = "Name a city and the year it was founded, as JSON. " * 12


def _gated(state, monkeypatch):
    """Compiles wait for `gate`; `started` is set when one begins."""
    gate, started = threading.Event(), threading.Event()
    compile_first = state.compile_request_grammar

    def gated(body, route):
        started.set()
        assert gate.wait(60)
        return compile_first(body, route)

    monkeypatch.setattr(state, "compile_request_grammar", gated)
    return gate, started


def _wait_for(cond, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def _post(url: str, body: dict, out: list) -> None:
    out.append(httpx.post(url + "/v1/completions", json=body, timeout=120))


def _idle(state) -> bool:
    e = state.engine
    return e.running_count == 0 and e.queue_depth == 0 and len(e._free) == e.n_slots


def test_the_prompt_is_read_while_the_grammar_compiles(smollm2_server, monkeypatch):
    state = smollm2_server.state
    gate, started = _gated(state, monkeypatch)
    body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0.7, "seed": 1, "guided_json": SCHEMA}
    out: list = []
    t = threading.Thread(target=_post, args=(smollm2_server.url, body, out))
    t.start()
    try:
        assert started.wait(60)
        # the compile is held, and the engine has read every prompt token but the last, which waits for it
        _wait_for(lambda: bool(state.engine._running))
        st = state.engine._running[0]
        _wait_for(lambda: st.prefill_pos == len(st.prompt) - 1)
        assert len(st.prompt) > 100 and st.seqs[0].constraint is None
        assert not out
    finally:
        gate.set()
        t.join(120)
    r = out[0]
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["choices"][0]["text"]), SCHEMA)
    _wait_for(lambda: _idle(state))


def test_a_refused_grammar_is_a_400_and_leaves_nothing_running(smollm2_server, monkeypatch):
    state = smollm2_server.state
    gate, started = _gated(state, monkeypatch)
    bad = {"type": "object", "properties": {"a": {"type": "string", "format": "uri-template"}}}
    body = {
        "prompt": PROMPT,
        "max_tokens": 8,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": bad}},
    }
    out: list = []
    t = threading.Thread(target=_post, args=(smollm2_server.url, body, out))
    t.start()
    try:
        assert started.wait(60)
        _wait_for(lambda: bool(state.engine._running))  # the prompt is being read
    finally:
        gate.set()
        t.join(120)
    r = out[0]
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "uri-template" in err["message"] and err["param"] == "response_format"
    _wait_for(lambda: _idle(state))


def test_overlap_off_compiles_before_the_prompt_is_read(smollm2_server, monkeypatch):
    state = smollm2_server.state
    monkeypatch.setattr(state, "grammar_overlap", False)
    gate, started = _gated(state, monkeypatch)
    body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "guided_json": SCHEMA}
    out: list = []
    t = threading.Thread(target=_post, args=(smollm2_server.url, body, out))
    t.start()
    try:
        assert started.wait(60)
        time.sleep(0.3)
        assert state.engine.running_count == 0 and state.engine.queue_depth == 0  # nothing submitted yet
    finally:
        gate.set()
        t.join(120)
    assert out[0].status_code == 200, out[0].text
    jsonschema.validate(json.loads(out[0].json()["choices"][0]["text"]), SCHEMA)
    _wait_for(lambda: _idle(state))


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_gone_during_the_compile_frees_its_slot_at_once(smollm2_server, monkeypatch, caplog, stream):
    caplog.set_level(logging.INFO)
    state = smollm2_server.state
    gate, started = _gated(state, monkeypatch)
    payload = json.dumps(
        {"prompt": PROMPT, "max_tokens": 40, "guided_json": SCHEMA, "stream": stream}
    ).encode()
    url = httpx.URL(smollm2_server.url)
    sock = socket.create_connection((url.host, url.port), timeout=60)
    try:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        assert started.wait(60)
        _wait_for(lambda: bool(state.engine._running))  # the prompt is being read, the compile held
    finally:
        sock.close()  # the client goes away before any byte of the answer
    try:
        _wait_for(
            lambda: _idle(state), timeout=20
        )  # the compile is held for up to 60 s: the slot did not wait
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert "while its grammar compiled" in logged, logged
    finally:
        gate.set()
