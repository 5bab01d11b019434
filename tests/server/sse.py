"""A small real SSE reader over httpx for the server tests."""

from __future__ import annotations

import json

import httpx


def stream_events(url: str, body: dict, timeout: float = 120) -> tuple[list[dict], bool]:
    """POST `body` and parse the SSE response: (event payloads, saw [DONE])."""
    events, done = [], False
    with httpx.stream("POST", url, json=body, timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        data_lines: list[str] = []
        for line in r.iter_lines():
            if line.startswith("data:"):
                data_lines.append(line[5:].lstrip())
            elif line == "" and data_lines:
                payload = "\n".join(data_lines)
                data_lines = []
                if payload == "[DONE]":
                    done = True
                else:
                    events.append(json.loads(payload))
    return events, done
