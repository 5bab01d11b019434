"""A client that leaves mid-stream: the request is cancelled and the log gets no traceback."""

from __future__ import annotations

import logging
import time

import httpx
import pytest

pytestmark = [pytest.mark.model, pytest.mark.server]


def test_a_client_leaving_mid_stream_leaves_no_traceback(smollm2_server, caplog):
    caplog.set_level(logging.INFO)
    body = {
        "prompt": "Once upon a time",
        "max_tokens": 300,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
    }
    with httpx.stream("POST", smollm2_server.url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                break  # leave after the first event
    deadline = time.monotonic() + 20
    while smollm2_server.state.engine.running_count and time.monotonic() < deadline:
        time.sleep(0.1)
    assert smollm2_server.state.engine.running_count == 0  # the generation was cancelled
    time.sleep(0.5)
    logged = "\n".join(f"{r.name}: {r.getMessage()}\n{r.exc_text or ''}" for r in caplog.records)
    assert "Traceback" not in logged and "Exception in ASGI" not in logged, logged
    assert "client closed the connection" in logged  # one line says what happened


def test_a_client_leaving_a_non_streamed_request_leaves_no_traceback(smollm2_server, caplog):
    caplog.set_level(logging.INFO)
    body = {"prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": True, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(smollm2_server.url + "/v1/completions", json=body, timeout=httpx.Timeout(5, read=0.5))
    deadline = time.monotonic() + 20
    while smollm2_server.state.engine.running_count and time.monotonic() < deadline:
        time.sleep(0.1)
    assert smollm2_server.state.engine.running_count == 0
    time.sleep(0.5)
    logged = "\n".join(f"{r.name}: {r.getMessage()}\n{r.exc_text or ''}" for r in caplog.records)
    assert "Traceback" not in logged and "internal error" not in logged, logged
    assert "client closed the connection" in logged  # one line says what happened
