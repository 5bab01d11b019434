"""The cached entry format: one JSON object that answers both streamed and non-streamed requests.

An entry keeps the full non-streamed response AND the per-choice stream events, so a stream hit replays token by token.

Entry (JSON, stored as is)::

    {"format": "tokenseam-respcache/1",
     "route": "/v1/chat/completions" | "/v1/completions" | "/completion",
     "source": "stream" | "response",     # how the entry was made
     "created": 1764400000.0,              # when it was stored (unix seconds)
     "model": "...", "system_fingerprint": "..." | null,
     "response": {...},                    # the full non-streamed body (id/created replaced on every hit)
     "events": [...],                      # one record per live stream event, in order
     "usage": {...} | null,
     "extensions": {...}}                  # optional: tokenseam's own fields (token_healing, ...)

`events` for the OpenAI routes are choice records exactly as they appear inside a chunk's `choices` list:
chat ``{"index", "delta": {"role"?, "content"?, "tool_calls"?, "reasoning_content"?}, "logprobs",
"finish_reason", "token_ids"?, "all_token_ids"?}``; completions ``{"index", "text", "logprobs", "finish_reason",
"token_ids"?, "all_token_ids"?}``. Replay wraps each record in its own chunk
(``{"id", "object": "chat.completion.chunk" | "text_completion", "created", "model", "choices": [record]}``),
then, when the request sets `stream_options.include_usage`, a chunk with ``"choices": []`` and `usage`,
then ``data: [DONE]``. `extensions` are the tokenseam fields a live answer carries once, at the top of the
response or of its first chunk (`token_healing`, `grammar_warnings`); replay puts them back there. For
llama-server's `/completion` each record is a whole event body
(``{"content", "tokens", "stop": false, ...}``, the last one ``{"content": "", "stop": true, "stop_type", ...}``),
replayed verbatim with no `[DONE]`, as llama-server does.

An entry made from a non-streamed response derives its events: one per token when the response carries
per-token logprobs (token ids aligned when their count matches), otherwise one per word with the token ids
(if any) in the choice's final event. Pass `events=` to `entry_from_response` to keep exact live events.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from ..wire import ROUTE_CHAT, ROUTE_COMPLETIONS, ROUTE_LLAMA, sse
from .errors import ResponseCacheError

ENTRY_FORMAT = "tokenseam-respcache/1"
_WORDS = re.compile(r"\s*\S+|\s+")


class IncompleteStreamError(ResponseCacheError):
    """A recorded stream ended before every choice finished (the answer was aborted); it is never cached."""


class SSEParser:
    """Incremental SSE parser: feed bytes as they arrive, get back the JSON payloads of complete events
    (the literal `[DONE]` comes back as the string "[DONE]"; comments and non-data fields are skipped)."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[Any]:
        self._buf += data.replace(b"\r\n", b"\n")
        out: list[Any] = []
        while True:
            cut = self._buf.find(b"\n\n")
            if cut < 0:
                return out
            block, self._buf = self._buf[:cut], self._buf[cut + 2 :]
            payload = b"\n".join(
                line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")
            )
            if not payload:
                continue
            if payload.strip() == b"[DONE]":
                out.append("[DONE]")
                continue
            try:
                out.append(json.loads(payload))
            except ValueError as e:
                raise ResponseCacheError(f"a stream event is not valid JSON: {payload[:80]!r}") from e

    @property
    def pending(self) -> bool:
        return bool(self._buf.strip())


# ---------------------------------------------------------------- assembling a response from events


def _merge_logprobs(acc: Any, lp: Any) -> Any:
    if lp is None:
        return acc
    if acc is None:
        return json.loads(json.dumps(lp))
    for k, v in lp.items():
        if isinstance(v, list):
            acc.setdefault(k, [])
            acc[k] = (acc[k] or []) + v
        elif k not in acc:
            acc[k] = v
    return acc


def _merge_tool_calls(acc: list[dict[str, Any]], deltas: list[Any]) -> None:
    for d in deltas:
        if not isinstance(d, dict):
            continue
        idx = d.get("index", len(acc))
        while len(acc) <= idx:
            acc.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        call = acc[idx]
        if d.get("id"):
            call["id"] = d["id"]
        if d.get("type"):
            call["type"] = d["type"]
        fn = d.get("function") or {}
        if fn.get("name"):
            call["function"]["name"] += fn["name"]
        if fn.get("arguments"):
            call["function"]["arguments"] += fn["arguments"]


def _assemble_openai(
    route: str, events: list[dict[str, Any]], model: Any, fingerprint: Any, usage: Any
) -> dict[str, Any]:
    chat = route == ROUTE_CHAT
    choices: dict[int, dict[str, Any]] = {}
    for ev in events:
        i = int(ev.get("index", 0))
        c = choices.setdefault(
            i,
            {
                "text": [],
                "reasoning": [],
                "refusal": [],
                "tools": [],
                "lp": None,
                "ids": [],
                "all_ids": None,
                "fr": None,
                "role": "assistant",
                "seen_ids": False,
            },
        )
        if chat:
            d = ev.get("delta") or {}
            if isinstance(d.get("role"), str):
                c["role"] = d["role"]
            if isinstance(d.get("content"), str):
                c["text"].append(d["content"])
            if isinstance(d.get("reasoning_content"), str):
                c["reasoning"].append(d["reasoning_content"])
            if isinstance(d.get("refusal"), str):
                c["refusal"].append(d["refusal"])
            if isinstance(d.get("tool_calls"), list):
                _merge_tool_calls(c["tools"], d["tool_calls"])
        elif isinstance(ev.get("text"), str):
            c["text"].append(ev["text"])
        c["lp"] = _merge_logprobs(c["lp"], ev.get("logprobs"))
        if isinstance(ev.get("token_ids"), list):
            c["ids"].extend(ev["token_ids"])
            c["seen_ids"] = True
        if isinstance(ev.get("all_token_ids"), list):
            c["all_ids"] = list(ev["all_token_ids"])
        if ev.get("finish_reason") is not None:
            c["fr"] = ev["finish_reason"]
    out_choices = []
    for i in sorted(choices):
        c = choices[i]
        if chat:
            msg: dict[str, Any] = {
                "role": c["role"],
                "content": "".join(c["text"]) if c["text"] or not c["tools"] else None,
            }
            if c["reasoning"]:
                msg["reasoning_content"] = "".join(c["reasoning"])
            if c["refusal"]:
                msg["refusal"] = "".join(c["refusal"])
            if c["tools"]:
                msg["tool_calls"] = c["tools"]
            choice: dict[str, Any] = {
                "index": i,
                "message": msg,
                "logprobs": c["lp"],
                "finish_reason": c["fr"],
            }
        else:
            choice = {"index": i, "text": "".join(c["text"]), "logprobs": c["lp"], "finish_reason": c["fr"]}
        if c["all_ids"] is not None or c["seen_ids"]:
            choice["token_ids"] = c["all_ids"] if c["all_ids"] is not None else c["ids"]
        out_choices.append(choice)
    resp: dict[str, Any] = {
        "id": "",
        "object": "chat.completion" if chat else "text_completion",
        "created": 0,
        "model": model,
        "choices": out_choices,
    }
    if fingerprint is not None:
        resp["system_fingerprint"] = fingerprint
    if usage is not None:
        resp["usage"] = usage
    return resp


def _assemble_llama(events: list[dict[str, Any]]) -> dict[str, Any]:
    content: list[str] = []
    tokens: list[int] = []
    probs: list[Any] = []
    final: dict[str, Any] = {}
    for ev in events:
        if isinstance(ev.get("content"), str):
            content.append(ev["content"])
        if isinstance(ev.get("tokens"), list):
            tokens.extend(ev["tokens"])
        if isinstance(ev.get("completion_probabilities"), list):
            probs.extend(ev["completion_probabilities"])
        if ev.get("stop"):
            final = ev
    resp = {
        k: v for k, v in final.items() if k not in ("content", "tokens", "completion_probabilities", "index")
    }
    resp["content"] = "".join(content)
    # tokenseam's final event carries every id (`all_tokens`); prefer it over the per-event sum when present.
    all_ids = final.get("all_tokens", final.get("all_token_ids"))
    resp.pop("all_tokens", None)
    resp.pop("all_token_ids", None)
    if isinstance(all_ids, list) or tokens:
        resp["tokens"] = list(all_ids) if isinstance(all_ids, list) else tokens
    resp["stop"] = True
    if probs:
        resp["completion_probabilities"] = probs
    return resp


# ---------------------------------------------------------------- building entries


# Fields a tokenseam answer carries once (response top level, first stream chunk), kept across replay.
EXTENSION_FIELDS = ("token_healing", "grammar_warnings")


def _new_entry(
    route: str, source: str, response: dict[str, Any], events: list[dict[str, Any]], usage: Any
) -> dict[str, Any]:
    ext = {k: response[k] for k in EXTENSION_FIELDS if k in response}
    return {
        **({"extensions": ext} if ext else {}),
        "format": ENTRY_FORMAT,
        "route": route,
        "source": source,
        "created": time.time(),
        "model": response.get("model"),
        "system_fingerprint": response.get("system_fingerprint"),
        "response": response,
        "events": events,
        "usage": usage,
    }


def _check_complete(route: str, events: list[dict[str, Any]]) -> None:
    if route == ROUTE_LLAMA:
        if not events or not events[-1].get("stop"):
            raise IncompleteStreamError("the /completion stream ended without its final `stop: true` event")
        return
    finished: dict[int, bool] = {}
    for ev in events:
        i = int(ev.get("index", 0))
        finished[i] = finished.get(i, False) or ev.get("finish_reason") is not None
    if not finished or not all(finished.values()):
        raise IncompleteStreamError("the stream ended before every choice had a finish_reason")


def entry_from_stream_events(route: str, chunks: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """An entry from the parsed chunk objects of a finished live stream (without `[DONE]`).

    Raises `IncompleteStreamError` if a choice never finished (the stream was aborted).
    """
    chunks = [dict(c) for c in chunks]
    if route == ROUTE_LLAMA:
        events = [c for c in chunks if isinstance(c, dict)]
        _check_complete(route, events)
        return _new_entry(route, "stream", _assemble_llama(events), events, None)
    events: list[dict[str, Any]] = []
    usage = None
    model = fingerprint = None
    ext: dict[str, Any] = {}
    for c in chunks:
        model = model or c.get("model")
        fingerprint = fingerprint or c.get("system_fingerprint")
        if c.get("usage"):
            usage = c["usage"]
        for k in EXTENSION_FIELDS:
            if k in c and k not in ext:
                ext[k] = c[k]
        for choice in c.get("choices") or []:
            if isinstance(choice, dict):
                events.append(choice)
    _check_complete(route, events)
    response = _assemble_openai(route, events, model, fingerprint, usage)
    response.update(ext)
    return _new_entry(route, "stream", response, events, usage)


def _pieces_from_logprob_bytes(entries: list[Any], text: str) -> list[str] | None:
    """Per-token text pieces rebuilt from logprob `bytes` (a character split across tokens goes with its last
    byte, as a live stream would send it); None if they do not rebuild `text` exactly."""
    pieces: list[str] = []
    pending = b""
    for e in entries:
        b = e.get("bytes") if isinstance(e, dict) else None
        if not isinstance(b, list):
            tok = e.get("token") if isinstance(e, dict) else None
            if not isinstance(tok, str):
                return None
            b = list(tok.encode("utf-8"))
        pending += bytes(b)
        try:
            pieces.append(pending.decode("utf-8"))
            pending = b""
        except UnicodeDecodeError:
            pieces.append("")
    if pending or "".join(pieces) != text:
        return None
    return pieces


def _derive_openai_events(route: str, response: Mapping[str, Any]) -> list[dict[str, Any]]:
    chat = route == ROUTE_CHAT
    events: list[dict[str, Any]] = []
    for ch in response.get("choices") or []:
        i = ch.get("index", 0)
        ids = ch.get("token_ids") if isinstance(ch.get("token_ids"), list) else None
        lp = ch.get("logprobs")
        if chat:
            msg = ch.get("message") or {}
            text = msg.get("content") if isinstance(msg.get("content"), str) else ""
            lp_entries = (
                lp.get("content") if isinstance(lp, dict) and isinstance(lp.get("content"), list) else None
            )
        else:
            text = ch.get("text") if isinstance(ch.get("text"), str) else ""
            lp_entries = None
            if isinstance(lp, dict) and isinstance(lp.get("tokens"), list):
                lp_entries = [{"token": t} for t in lp["tokens"]]
        pieces = _pieces_from_logprob_bytes(lp_entries, text) if lp_entries else None
        per_token = pieces is not None
        if not per_token:
            pieces = _WORDS.findall(text) if text else []
        aligned = per_token and ids is not None and len(ids) == len(pieces)
        first = True
        for n, piece in enumerate(pieces):
            ev: dict[str, Any] = {"index": i}
            if chat:
                ev["delta"] = (
                    {"role": msg.get("role", "assistant"), "content": piece} if first else {"content": piece}
                )
            else:
                ev["text"] = piece
            if per_token:
                if chat:
                    ev["logprobs"] = {"content": [lp_entries[n]]}
                else:
                    ev["logprobs"] = {
                        k: [v[n]] if isinstance(v, list) and len(v) == len(pieces) else v
                        for k, v in lp.items()
                    }
            else:
                ev["logprobs"] = None
            ev["finish_reason"] = None
            if ids is not None:
                ev["token_ids"] = [ids[n]] if aligned else []
            events.append(ev)
            first = False
        if chat and isinstance(msg.get("tool_calls"), list):
            calls = [dict(c, index=k) for k, c in enumerate(msg["tool_calls"]) if isinstance(c, dict)]
            delta: dict[str, Any] = {"tool_calls": calls}
            if first:
                delta["role"] = msg.get("role", "assistant")
                first = False
            events.append({"index": i, "delta": delta, "logprobs": None, "finish_reason": None})
        final: dict[str, Any] = {"index": i}
        if chat:
            final["delta"] = {"role": msg.get("role", "assistant"), "content": ""} if first else {}
        else:
            final["text"] = ""
        final["logprobs"] = None
        final["finish_reason"] = ch.get("finish_reason")
        if ids is not None:
            final["token_ids"] = [] if aligned else list(ids)
            final["all_token_ids"] = list(ids)
        events.append(final)
    return events


def _derive_llama_events(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    text = response.get("content") if isinstance(response.get("content"), str) else ""
    ids = response.get("tokens") if isinstance(response.get("tokens"), list) else []
    probs = response.get("completion_probabilities")
    events: list[dict[str, Any]] = []
    pieces = None
    if isinstance(probs, list) and probs:
        pieces = _pieces_from_logprob_bytes(probs, text)
    if pieces is not None:
        for n, piece in enumerate(pieces):
            p = probs[n]
            tok = [p["id"]] if isinstance(p, dict) and isinstance(p.get("id"), int) else []
            events.append({"content": piece, "tokens": tok, "stop": False, "completion_probabilities": [p]})
    else:
        words = _WORDS.findall(text)
        for n, w in enumerate(words):
            events.append({"content": w, "tokens": list(ids) if n == len(words) - 1 else [], "stop": False})
    final = {k: v for k, v in response.items() if k not in ("content", "tokens", "completion_probabilities")}
    final.update(content="", tokens=[], stop=True)
    if not events and ids:
        final["tokens"] = list(ids)
    events.append(final)
    return events


def entry_from_response(
    route: str, response: Mapping[str, Any], events: Iterable[Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """An entry from a full non-streamed response; `events` (live chunk objects) keep exact token events."""
    response = json.loads(json.dumps(response))
    if events is not None:
        entry = entry_from_stream_events(route, events)
        entry["response"] = response
        entry["source"] = "response"
        return entry
    if route == ROUTE_LLAMA:
        return _new_entry(route, "response", response, _derive_llama_events(response), None)
    return _new_entry(
        route, "response", response, _derive_openai_events(route, response), response.get("usage")
    )


# ---------------------------------------------------------------- serving entries


def _int_list(x: Any) -> bool:
    return isinstance(x, list) and all(type(t) is int for t in x)


def _usage_problem(usage: Any, where: str) -> str | None:
    if usage is None:
        return None
    if not isinstance(usage, dict):
        return f"{where} is not an object"
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        v = usage.get(k)
        if v is not None and not (type(v) is int and v >= 0):
            return f"{where}.{k} is not a count"
    return None


def _common_problem(d: dict[str, Any], where: str) -> str | None:
    """Checks on a choice or an event of the OpenAI routes; `where` names it in the message."""
    if type(d.get("index", 0)) is not int:
        return f"{where}.index is not an int"
    for k in ("token_ids", "all_token_ids"):
        if k in d and not _int_list(d[k]):
            return f"{where}.{k} is not a list of ints"
    if d.get("logprobs") is not None and not isinstance(d["logprobs"], dict):
        return f"{where}.logprobs is not an object"
    return None


def _message_problem(m: Any, where: str) -> str | None:
    """A chat `message` or `delta`: the text fields strings (content may be null), tool calls objects."""
    if not isinstance(m, dict):
        return f"{where} is not an object"
    if "role" in m and not isinstance(m["role"], str):
        return f"{where}.role is not a string"
    for k in ("content", "reasoning_content", "refusal"):
        if m.get(k) is not None and not isinstance(m[k], str):
            return f"{where}.{k} is not a string"
    if "tool_calls" in m and not (
        isinstance(m["tool_calls"], list) and all(isinstance(c, dict) for c in m["tool_calls"])
    ):
        return f"{where}.tool_calls is not a list of objects"
    return None


def _openai_problem(route: str, resp: dict[str, Any], events: list[dict[str, Any]]) -> str | None:
    chat = route == ROUTE_CHAT
    choices = resp.get("choices")
    if not isinstance(choices, list) or not choices:
        return "response.choices is not a non-empty list"
    indices: set[int] = set()
    for n, c in enumerate(choices):
        where = f"response.choices[{n}]"
        if not isinstance(c, dict):
            return f"{where} is not an object"
        problem = _common_problem(c, where)
        if problem:
            return problem
        if not isinstance(c.get("finish_reason"), str):
            return f"{where}.finish_reason is not a string"
        problem = (
            _message_problem(c.get("message"), where + ".message")
            if chat
            else (None if isinstance(c.get("text"), str) else f"{where}.text is not a string")
        )
        if problem:
            return problem
        i = c.get("index", 0)
        if i in indices:
            return f"{where}.index {i} is repeated"
        indices.add(i)
    problem = _usage_problem(resp.get("usage"), "response.usage")
    if problem:
        return problem
    finished: set[int] = set()
    for n, ev in enumerate(events):
        where = f"events[{n}]"
        problem = _common_problem(ev, where)
        if problem:
            return problem
        fr = ev.get("finish_reason")
        if fr is not None and not isinstance(fr, str):
            return f"{where}.finish_reason is not a string"
        if chat:
            problem = _message_problem(ev.get("delta"), where + ".delta")
            if problem:
                return problem
        elif "text" in ev and not isinstance(ev["text"], str):
            return f"{where}.text is not a string"
        i = ev.get("index", 0)
        if i not in indices:
            return f"{where}.index {i} has no choice in the response"
        if fr is not None:
            finished.add(i)
    if finished != indices:
        return "the events do not finish every choice"
    return None


def _llama_problem(resp: dict[str, Any], events: list[dict[str, Any]]) -> str | None:
    if not isinstance(resp.get("content"), str):
        return "response.content is not a string"
    if "tokens" in resp and not _int_list(resp["tokens"]):
        return "response.tokens is not a list of ints"
    if resp.get("stop", True) is not True:
        return "response.stop is not true"
    for n, ev in enumerate(events):
        where = f"events[{n}]"
        if "content" in ev and not isinstance(ev["content"], str):
            return f"{where}.content is not a string"
        for k in ("tokens", "all_tokens", "all_token_ids"):
            if k in ev and not _int_list(ev[k]):
                return f"{where}.{k} is not a list of ints"
        if not isinstance(ev.get("stop", False), bool):
            return f"{where}.stop is not a boolean"
    if events[-1].get("stop") is not True:
        return "the last event is not `stop: true`"
    return None


def entry_problem(entry: Any, route: str | None = None) -> str | None:
    """What makes a stored object unusable as an entry (None: nothing), checking every field the response and
    replay functions rely on, so a value of the wrong shape is a miss instead of a broken answer. `route`,
    when given, must be the entry's route. The cache checks entries before storing them too, so this never
    rejects what it wrote itself."""
    if not isinstance(entry, dict):
        return "not an object"
    if entry.get("format") != ENTRY_FORMAT:
        return f"format is not {ENTRY_FORMAT}"
    r = entry.get("route")
    if r not in (ROUTE_CHAT, ROUTE_COMPLETIONS, ROUTE_LLAMA):
        return "unknown route"
    if route is not None and r != route:
        return f"route {r} is not the request's {route}"
    if entry.get("source") not in ("stream", "response"):
        return "source is not stream or response"
    created = entry.get("created")
    if type(created) not in (int, float):
        return "created is not a number"
    for k in ("model", "system_fingerprint"):
        if entry.get(k) is not None and not isinstance(entry[k], str):
            return f"{k} is not a string"
    problem = _usage_problem(entry.get("usage"), "usage")
    if problem:
        return problem
    ext = entry.get("extensions", {})
    if not isinstance(ext, dict) or not set(ext) <= set(EXTENSION_FIELDS):
        return "extensions is not an object of known fields"
    resp, events = entry.get("response"), entry.get("events")
    if not isinstance(resp, dict):
        return "response is not an object"
    if not isinstance(events, list) or not events or not all(isinstance(e, dict) for e in events):
        return "events is not a non-empty list of objects"
    return _llama_problem(resp, events) if r == ROUTE_LLAMA else _openai_problem(r, resp, events)


def validate_entry(entry: Any, route: str | None = None) -> bool:
    """Whether a stored object is a usable entry (a corrupt or foreign value is treated as a miss)."""
    return entry_problem(entry, route) is None


def uncacheable_reason(
    entry: Mapping[str, Any], *, cache_empty: bool = False, cache_truncated: bool = False
) -> str | None:
    """Why an answer must not be stored ("aborted", "length", "empty", "error"), or None if it may be.
    `cache_truncated`: an answer cut by its output limit may be stored (the policy decides it per request)."""
    resp = entry.get("response") or {}
    if "error" in resp:
        return "error"
    if entry.get("route") == ROUTE_LLAMA:
        if not resp.get("stop", True):
            return "aborted"
        if not cache_truncated and (resp.get("stop_type") == "limit" or resp.get("truncated") is True):
            return "length"
        if not cache_empty and not resp.get("content") and not resp.get("tokens"):
            return "empty"
        return None
    choices = resp.get("choices") or []
    if not choices:
        return "empty"
    for c in choices:
        fr = c.get("finish_reason")
        if fr is None or fr in ("abort", "error", "cancelled"):
            return "aborted"
        if fr == "length" and not cache_truncated:
            return "length"
    if not cache_empty:

        def empty(c: Mapping[str, Any]) -> bool:
            if entry.get("route") == ROUTE_CHAT:
                m = c.get("message") or {}
                return not m.get("content") and not m.get("tool_calls") and not m.get("reasoning_content")
            return not c.get("text")

        if all(empty(c) for c in choices):
            return "empty"
    return None


def _fresh_id(route: str) -> str:
    return ("chatcmpl-" if route == ROUTE_CHAT else "cmpl-") + uuid.uuid4().hex


def response_from_entry(
    entry: Mapping[str, Any], *, response_id: str | None = None, created: int | None = None
) -> dict[str, Any]:
    """The non-streamed body for a hit: the stored response with a fresh id and creation time.

    A shallow copy: nested objects are shared with `entry` (which a store returns freshly decoded)."""
    resp = dict(entry["response"])
    if entry["route"] != ROUTE_LLAMA:
        resp["id"] = response_id or _fresh_id(entry["route"])
        resp["created"] = int(time.time()) if created is None else created
    return resp


def replay_chunks(
    entry: Mapping[str, Any],
    *,
    include_usage: bool = False,
    response_id: str | None = None,
    created: int | None = None,
) -> list[Any]:
    """The chunk objects a live stream would have sent (ending with "[DONE]" on the OpenAI routes)."""
    route = entry["route"]
    if route == ROUTE_LLAMA:
        return list(entry["events"])
    rid = response_id or _fresh_id(route)
    ts = int(time.time()) if created is None else created
    obj = "chat.completion.chunk" if route == ROUTE_CHAT else "text_completion"
    head: dict[str, Any] = {"id": rid, "object": obj, "created": ts, "model": entry.get("model")}
    if entry.get("system_fingerprint") is not None:
        head["system_fingerprint"] = entry["system_fingerprint"]
    out: list[Any] = []
    for n, ev in enumerate(entry["events"]):
        chunk = dict(head, choices=[ev])
        if include_usage:
            chunk["usage"] = None
        if n == 0:
            chunk.update(entry.get("extensions") or {})
        out.append(chunk)
    if include_usage and entry.get("usage") is not None:
        out.append(dict(head, choices=[], usage=entry["usage"]))
    out.append("[DONE]")
    return out


async def replay_as_sse(
    entry: Mapping[str, Any],
    *,
    include_usage: bool = False,
    response_id: str | None = None,
    created: int | None = None,
    event_delay: float = 0.0,
) -> AsyncIterator[bytes]:
    """A stream hit: the entry's events as SSE byte strings, one per token event, as a live stream sends them."""
    for chunk in replay_chunks(entry, include_usage=include_usage, response_id=response_id, created=created):
        yield sse(chunk)
        # Yield to the loop between events so one long replay does not starve other requests.
        await asyncio.sleep(event_delay)
