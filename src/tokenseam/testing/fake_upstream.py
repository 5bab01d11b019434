"""Test support: a small real OpenAI-compatible HTTP server with a deterministic fake model (gateway tests and
`tokenseam bench cache`); run it with `httpkit.BackgroundServer`.

Answers are a pure function of the request (unless it samples: temperature > 0 and no seed); it can be told to fail.

Behaviour: `/v1/chat/completions` and `/v1/completions` (streamed or not, `n`, `max_tokens` -> `length`,
`return_token_ids`, `logprobs`, `stream_options.include_usage`), `/v1/models`, `/health`. Control
(in-process via the `FakeUpstream` object, or `POST /_fake/mode`): `ok`, `error` (status + OpenAI error
body), `hang` (never answers), `midstream` (a stream that breaks after two events), `garbage` (200 with a
non-JSON body), `nostream` (answers a stream request with plain JSON), each for the next `count` generation
requests (or all). `GET /_fake/stats` reports calls.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..httpkit import BackgroundServer
from ..respcache import fingerprint_text
from ..wire import error_body, sse

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "café",
    "naïve",
    "日本",
    "über",
    "seam",
    "token",
    "cache",
    "byte",
    "prime",
    "seven",
    "eleven",
    "north",
    "south",
    "river",
    "stone",
    "light",
]
TOKEN_BASE = 100  # token id of WORDS[0]


def fake_answer(body: dict[str, Any], index: int = 0, nonce: str = "") -> tuple[list[str], list[int], str]:
    """(text pieces, token ids, finish_reason) for one choice of a request, as the fake model would produce.

    Deterministic in everything but `stream`/`stream_options`; `nonce` makes a sampling request vary."""
    key = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    h = hashlib.sha256(f"{fingerprint_text(key)}|{index}|{nonce}".encode("utf-8", "surrogatepass")).digest()
    length = 3 + h[0] % 10
    limit = body.get("max_tokens", body.get("max_completion_tokens", 16))
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        limit = 16
    n = min(length, limit)
    ids = [TOKEN_BASE + h[1 + i] % len(WORDS) for i in range(n)]
    pieces = [" " + WORDS[t - TOKEN_BASE] for t in ids]
    return pieces, ids, "length" if limit < length else "stop"


def samples(body: dict[str, Any]) -> bool:
    return body.get("temperature", 1) != 0 and "seed" not in body


@dataclass
class FakeState:
    mode: str = "ok"
    mode_count: int | None = None  # None: every request
    error_status: int = 503
    latency: float = 0.0  # seconds before answering
    token_delay: float = 0.0  # seconds between stream events
    calls: int = 0
    calls_by_route: Counter = field(default_factory=Counter)
    bodies: Counter = field(default_factory=Counter)  # canonical JSON of each generation body -> count
    last_body: dict | None = None  # the last generation request, as received
    # How token ids come back: "tokenseam" (per event + `all_token_ids` in the final one), "vllm" (per event
    # only), "llama" (per event as `tokens`), "none" (never).
    id_shape: str = "tokenseam"
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_mode(self) -> str:
        with self.lock:
            mode = self.mode
            if self.mode_count is not None:
                self.mode_count -= 1
                if self.mode_count <= 0:
                    self.mode, self.mode_count = "ok", None
            return mode


def _err(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(error_body(message, "fake_upstream_error", code), status_code=status)


def create_fake_app(
    state: FakeState | None = None, model: str = "fake-model", owned_by: str = "fake"
) -> Starlette:
    state = state or FakeState()

    async def generate(request: Request) -> Response:
        route = request.url.path
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _err(400, "body is not JSON", "invalid_json")
        if not isinstance(body, dict):
            return _err(400, "body must be an object", "invalid_request")
        chat = route == "/v1/chat/completions"
        if chat and not isinstance(body.get("messages"), list):
            return _err(400, "messages is required", "invalid_request")
        if not chat and "prompt" not in body:
            return _err(400, "prompt is required", "invalid_request")
        with state.lock:
            state.calls += 1
            state.calls_by_route[route] += 1
            key = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
            state.bodies[route + fingerprint_text(key)] += 1
            state.last_body = body
        # Healing arguments get a 400, as from a vLLM without tokenseam's processor (the fake cannot heal).
        xargs = body.get("vllm_xargs")
        if isinstance(xargs, dict) and "tokenseam_healing" in xargs:
            return _err(400, "tokenseam_healing: this server has no tokenseam healing processor", "bad_xargs")
        mode = state.take_mode()
        if mode == "error":
            return _err(state.error_status, f"fake upstream failure ({state.error_status})", "fake_failure")
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "garbage":
            return Response(b"<html>not json</html>", media_type="application/json")
        if state.latency:
            await asyncio.sleep(state.latency)
        nonce = uuid.uuid4().hex if samples(body) else ""
        n = body.get("n", 1) if isinstance(body.get("n"), int) else 1
        answers = [fake_answer(body, i, nonce) for i in range(max(1, min(n, 8)))]
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:20]
        created = int(time.time())
        want_ids = body.get("return_token_ids") is True
        want_lp = bool(body.get("logprobs"))
        usage = {
            "prompt_tokens": 7,
            "completion_tokens": sum(len(a[1]) for a in answers),
            "total_tokens": 7 + sum(len(a[1]) for a in answers),
        }
        if body.get("stream") is True and mode != "nostream":
            so = body.get("stream_options")
            include_usage = isinstance(so, dict) and so.get("include_usage") is True
            return StreamingResponse(
                _stream(
                    state,
                    chat,
                    rid,
                    created,
                    model,
                    answers,
                    want_ids,
                    want_lp,
                    include_usage,
                    usage,
                    mode == "midstream",
                ),
                media_type="text/event-stream",
            )
        choices = []
        for i, (pieces, ids, finish) in enumerate(answers):
            text = "".join(pieces)
            ch: dict[str, Any] = {"index": i, "finish_reason": finish}
            if chat:
                ch["message"] = {"role": "assistant", "content": text}
                ch["logprobs"] = (
                    {"content": [_lp(p, t) for p, t in zip(pieces, ids, strict=True)]} if want_lp else None
                )
            else:
                ch["text"] = text
                ch["logprobs"] = (
                    {"tokens": pieces, "token_logprobs": [-0.5] * len(pieces)} if want_lp else None
                )
            if want_ids and state.id_shape != "none":
                ch["tokens" if state.id_shape == "llama" else "token_ids"] = ids
            choices.append(ch)
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": model,
                "system_fingerprint": "fake-fp",
                "choices": choices,
                "usage": usage,
            }
        )

    async def models(request: Request) -> Response:
        # The fault modes are for generations: a gateway's probes here must not use them up.
        return JSONResponse(
            {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": owned_by}]}
        )

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def control(request: Request) -> Response:
        cfg = await request.json()
        with state.lock:
            state.mode = cfg.get("mode", "ok")
            state.mode_count = cfg.get("count")
            state.error_status = int(cfg.get("status", state.error_status))
            state.latency = float(cfg.get("latency", state.latency))
            state.token_delay = float(cfg.get("token_delay", state.token_delay))
        return JSONResponse({"ok": True})

    async def stats(request: Request) -> Response:
        with state.lock:
            return JSONResponse(
                {"calls": state.calls, "distinct": len(state.bodies), "by_route": dict(state.calls_by_route)}
            )

    async def reset(request: Request) -> Response:
        with state.lock:
            state.calls = 0
            state.calls_by_route.clear()
            state.bodies.clear()
        return JSONResponse({"ok": True})

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", generate, methods=["POST"]),
            Route("/v1/completions", generate, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/_fake/mode", control, methods=["POST"]),
            Route("/_fake/stats", stats, methods=["GET"]),
            Route("/_fake/reset", reset, methods=["POST"]),
        ]
    )
    app.state.fake = state
    return app


def _lp(piece: str, tid: int) -> dict[str, Any]:
    return {"token": piece, "logprob": -0.5, "bytes": list(piece.encode("utf-8")), "top_logprobs": []}


async def _stream(
    state: FakeState,
    chat: bool,
    rid: str,
    created: int,
    model: str,
    answers: list,
    want_ids: bool,
    want_lp: bool,
    include_usage: bool,
    usage: dict,
    break_midway: bool,
):
    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse(
            {
                "id": rid,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created,
                "model": model,
                "system_fingerprint": "fake-fp",
                "choices": choices,
                **extra,
            }
        )

    sent = 0
    if chat:
        for i in range(len(answers)):
            yield chunk(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )
    for i, (pieces, ids, finish) in enumerate(answers):
        for p, t in zip(pieces, ids, strict=True):
            if break_midway and sent >= 2:
                raise ConnectionResetError("fake upstream breaks the stream")
            ch: dict[str, Any] = {"index": i, "finish_reason": None}
            if chat:
                ch["delta"] = {"content": p}
                ch["logprobs"] = {"content": [_lp(p, t)]} if want_lp else None
            else:
                ch["text"] = p
                ch["logprobs"] = {"tokens": [p], "token_logprobs": [-0.5]} if want_lp else None
            if want_ids and state.id_shape != "none":
                ch["tokens" if state.id_shape == "llama" else "token_ids"] = [t]
            yield chunk([ch])
            sent += 1
            if state.token_delay:
                await asyncio.sleep(state.token_delay)
        last: dict[str, Any] = {"index": i, "finish_reason": finish, "logprobs": None}
        if chat:
            last["delta"] = {}
        else:
            last["text"] = ""
        if want_ids and state.id_shape == "tokenseam":
            last["token_ids"] = []
            last["all_token_ids"] = ids
        yield chunk([last])
    if include_usage:
        yield chunk([], usage=usage)
    yield sse("[DONE]")


class FakeUpstream(BackgroundServer):
    """The fake OpenAI server running in a background thread; `state` controls and observes it."""

    def __init__(self, model: str = "fake-model", port: int = 0, owned_by: str = "fake") -> None:
        self.state = FakeState()
        super().__init__(create_fake_app(self.state, model, owned_by), port=port)

    def set_mode(self, mode: str, count: int | None = None, status: int = 503) -> None:
        with self.state.lock:
            self.state.mode, self.state.mode_count, self.state.error_status = mode, count, status

    def reset(self) -> None:
        with self.state.lock:
            self.state.calls = 0
            self.state.calls_by_route.clear()
            self.state.bodies.clear()
