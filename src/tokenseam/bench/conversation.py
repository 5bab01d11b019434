"""`tokenseam bench conversation`: how much of a multi-turn conversation's history each turn reuses.

A stateless chat client sends the whole history every turn (the model's earlier answers as the text it got
back), streamed, sampled at `--temperature` with one seed per conversation. On turn k >= 2 the reused
fraction is `cached_tokens` of turn k over the previous turn's prompt + completion tokens; TTFT is the time to
the first streamed chunk that carries content (or a tool call). Four kinds of conversation: plain chat, code,
Korean text with emoji, and tool calls with their results. tokenseam runs as `tokenseam serve` in its own
process, as deployed; llama-server (`--llama-server PATH`, `--jinja`, `cache_prompt: true`) is the anchor, on
the same conversations in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import machine, median, percentile, write_json

KINDS = ("chat", "code", "korean", "tools")
TARGET = 0.995  # the target: this share of the previous turn's context reused on every turn

# ---------------------------------------------------------------------------------------------- workload

SYSTEM_PROMPTS = {
    "chat": [
        "You are a friendly assistant. Answer briefly and clearly.",
        "You are a patient tutor who explains things step by step.",
        "You are a helpful assistant. Keep answers short.",
    ],
    "code": [
        "You are a senior software engineer. Answer with code in fenced blocks and a short explanation.",
        "You are a careful programmer who reviews code and writes tests.",
    ],
    "korean": [
        "당신은 친절한 한국어 도우미입니다. 짧고 자연스럽게 대답하세요 🙂",
        "You are a bilingual assistant. Answer in Korean unless asked otherwise.",
    ],
    "tools": [
        "You are an assistant with access to functions. Use them when they help, then answer the user.",
    ],
}

CHAT_TOPICS = [
    "how tides work",
    "the history of the bicycle",
    "learning the piano as an adult",
    "composting at home",
    "why the sky is blue",
    "planning a weekend in Lisbon",
    "baking sourdough bread",
    "the rules of chess",
    "how vaccines train the immune system",
    "saving money on groceries",
    "keeping houseplants alive in winter",
    "the water cycle",
]
CHAT_OPENERS = [
    "Hi! Can you tell me about {topic}?",
    "I've always wondered about {topic}. Where should I start?",
    "Explain {topic} to me like I'm new to it.",
    "Quick question about {topic}: what are the basics?\n\nPlease keep it short.",
]
CHAT_FOLLOWUPS = [
    "Can you explain that more simply?",
    "What is the most common mistake people make?",
    "Give me three short tips, as a numbered list.",
    "How would you explain it to a ten-year-old?",
    "Is there anything surprising about it?",
    "Summarise what we discussed in two sentences.",
    "What should I read next about {topic}?",
    "Thanks!  One more thing: how long does it usually take to get good at it?",
    "I don't quite follow the second point. Could you rephrase it?",
    "Can you put that in a small table?\n\n| step | what to do |\n|---|---|",
]

CODE_TASKS = [
    ("reverse_words", "reverses the order of the words in a sentence"),
    ("is_palindrome", "checks whether a string reads the same backwards, ignoring case and spaces"),
    ("merge_sorted", "merges two sorted lists into one sorted list"),
    ("word_counts", "counts how often each word occurs in a text"),
    ("flatten", "flattens an arbitrarily nested list"),
    ("parse_date", "parses a date string like 2024-03-01 into a (year, month, day) tuple"),
    ("chunked", "splits a list into chunks of at most n items"),
    ("roman", "converts an integer between 1 and 3999 to a Roman numeral"),
]
CODE_LANGUAGES = ["Python", "Python", "Python", "JavaScript", "Rust"]
CODE_FOLLOWUPS = [
    "Add a docstring and type hints.",
    "Now make it handle empty input without raising.",
    "Write two unit tests for it.",
    "Rename the function to `{name}_v2` and keep everything else the same.",
    "Rewrite it without any imports.",
    "Make it faster for very large inputs and say why in one line.",
    "Here is my attempt. Can you review it?\n\n```python\n{snippet}\n```",
    "Turn it into a class with a `run` method.",
    "Add logging of the input size, with the `logging` module.",
]

KOREAN_LINES = [
    "안녕하세요! 오늘 기분이 어때요? 😊",
    "서울에서 가 볼 만한 곳을 추천해 주세요 🏙️✨",
    "김치찌개 만드는 법을 알려 주세요 🍲🌶️",
    "한국어 공부를 시작했어요 📚✍️ 좋은 방법이 있을까요?",
    "주말에 친구들이랑 북한산에 등산 가요 ⛰️🥾 준비물은 뭐가 필요해요?",
    '이 문장을 영어로 번역해 주세요: "오늘은 비가 와서 집에 있었어요 ☔"',
    "고양이가 자꾸 밤에 울어요 🐱🌙 왜 그럴까요?",
    "엄마 생일 축하 메시지를 써 주세요 🎂🎉👩‍👩‍👧",
    "한국 🇰🇷 의 전통 음식 세 가지만 알려 주세요.",
    "감사합니다! 👍🏽 지금까지 얘기한 걸 한 줄로 요약해 주세요.",
    "Can you answer in English this time? 그리고 이모지도 하나 넣어 주세요 🙏",
    "부산 여행 2박 3일 일정 짜 줘요 🌊🚄 (예산: 50만 원)",
    "개발자 👩‍💻 로 일하면서 스트레스 푸는 방법이 있을까요?",
    "ㅋㅋㅋ 그거 재밌네요 😂 하나 더 알려 주세요!",
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert_currency",
            "description": "Convert an amount of money from one currency to another",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number"},
                    "from_currency": {"type": "string"},
                    "to_currency": {"type": "string"},
                },
                "required": ["amount", "from_currency", "to_currency"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_notes",
            "description": "Search the user's notes and return the best matches",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    },
]
TOOL_QUESTIONS = [
    "What's the weather like in {city} right now?",
    "Should I take an umbrella in {city} today?",
    "How much is {amount} {cur1} in {cur2}?",
    "I have {amount} {cur1}. What is that in {cur2}?",
    "Find my notes about {subject}.",
    "What did I write down about {subject}?",
]
CITIES = ["Seoul", "Busan", "Lisbon", "Nairobi", "Osaka", "Toronto", "Reykjavik", "São Paulo"]
CURRENCIES = ["EUR", "USD", "KRW", "JPY", "GBP"]
SUBJECTS = ["the project kickoff", "my dentist appointment", "the book club", "tax forms", "the garden"]
FOLLOW_UP_AFTER_MISSED_CALL = "Please go on."


@dataclass(frozen=True)
class Step:
    """One turn as the client scripts it: the user's new message (None on a tools turn that only sends the
    previous calls' results back) and, for the tools kind, the `tool_choice` of the request."""

    user: str | None
    tool_choice: str | None = None


@dataclass(frozen=True)
class Conversation:
    id: str
    kind: str
    seed: int  # the request seed, the same on every turn of the conversation
    system: str
    steps: tuple[Step, ...]
    tools: tuple[dict, ...] = field(default=())

    def first_messages(self) -> list[dict]:
        return [{"role": "system", "content": self.system}]


def _code_snippet(rng: random.Random, name: str) -> str:
    """A small user-written function with 4-space indentation, a blank line and one tab-indented line."""
    var = rng.choice(["items", "xs", "values", "data"])
    lines = [
        f"def {name}({var}):",
        "    result = []",
        f"    for i, x in enumerate({var}):",
        "        if x is None:",
        "\t\tcontinue",
        "        result.append(x)",
        "",
        "    return result",
    ]
    return "\n".join(lines)


def _steps(kind: str, rng: random.Random, turns: int) -> tuple[Step, ...]:
    if kind == "chat":
        topic = rng.choice(CHAT_TOPICS)
        first = rng.choice(CHAT_OPENERS).format(topic=topic)
        rest = rng.sample(CHAT_FOLLOWUPS, k=min(turns - 1, len(CHAT_FOLLOWUPS)))
        while len(rest) < turns - 1:
            rest.append(rng.choice(CHAT_FOLLOWUPS))
        return tuple(Step(t.format(topic=topic)) for t in [first, *rest])
    if kind == "code":
        name, desc = rng.choice(CODE_TASKS)
        lang = rng.choice(CODE_LANGUAGES)
        first = f"Write a {lang} function `{name}` that {desc}."
        rest = rng.sample(CODE_FOLLOWUPS, k=min(turns - 1, len(CODE_FOLLOWUPS)))
        while len(rest) < turns - 1:
            rest.append(rng.choice(CODE_FOLLOWUPS))
        snippet = _code_snippet(rng, name)
        return tuple(Step(t.format(name=name, snippet=snippet)) for t in [first, *rest])
    if kind == "korean":
        lines = rng.sample(KOREAN_LINES, k=min(turns, len(KOREAN_LINES)))
        while len(lines) < turns:
            lines.append(rng.choice(KOREAN_LINES))
        return tuple(Step(t) for t in lines)
    if kind == "tools":
        # odd turns ask a question and force a call; even turns send the results back and let the model answer
        steps = []
        for t in range(turns):
            if t % 2 == 0:
                q = rng.choice(TOOL_QUESTIONS).format(
                    city=rng.choice(CITIES),
                    amount=rng.choice([12, 120, 99.5, 2500, 40000]),
                    cur1=rng.choice(CURRENCIES[:2]),
                    cur2=rng.choice(CURRENCIES[2:]),
                    subject=rng.choice(SUBJECTS),
                )
                steps.append(Step(q, "required"))
            else:
                steps.append(Step(None, "none"))
        return tuple(steps)
    raise ValueError(f"unknown conversation kind {kind!r}")


def make_conversations(
    n: int, turns: int, seed: int = 0, kinds: tuple[str, ...] = KINDS, label: str = ""
) -> list[Conversation]:
    """`n` conversations of `turns` turns, the kinds taken in turn; the same arguments give the same list.
    A `label` (e.g. "warmup-") starts the ids and draws other texts from the same seed."""
    if not kinds:
        raise ValueError("no conversation kinds")
    out = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        rng = random.Random(f"tokenseam-conversation:{label}{seed}:{i}")
        out.append(
            Conversation(
                id=f"{label}{kind}-{i:03d}",
                kind=kind,
                seed=seed * 10_000 + i,
                system=rng.choice(SYSTEM_PROMPTS[kind]),
                steps=_steps(kind, rng, turns),
                tools=tuple(TOOLS) if kind == "tools" else (),
            )
        )
    return out


def tool_result(conv: Conversation, turn: int, index: int, name: str, arguments: str) -> str:
    """What the scripted tool returns for a call: a JSON string that depends only on the conversation, the
    turn, the call's position and its name and arguments (the same call gets the same result)."""
    rng = random.Random(f"tool:{conv.seed}:{turn}:{index}:{name}:{arguments}")
    try:
        args = json.loads(arguments)
    except ValueError:
        args = {}
    if not isinstance(args, dict):
        args = {}
    if name == "get_weather":
        out: dict[str, Any] = {
            "city": args.get("city", "unknown"),
            "temperature": rng.randint(-8, 34),
            "unit": args.get("unit", "celsius"),
            "sky": rng.choice(["clear ☀️", "rain 🌧️", "cloudy ☁️", "snow ❄️"]),
            "wind_kmh": rng.randint(0, 60),
        }
    elif name == "convert_currency":
        amount = args.get("amount", 1)
        rate = round(rng.uniform(0.005, 1500), 4)
        out = {
            "amount": amount,
            "from": args.get("from_currency"),
            "to": args.get("to_currency"),
            "rate": rate,
            "result": round(amount * rate, 2) if isinstance(amount, int | float) else None,
        }
    elif name == "search_notes":
        out = {
            "query": args.get("query", ""),
            "matches": [
                {"title": rng.choice(["Kickoff", "메모", "Ideas", "TODO"]), "line": rng.randint(1, 200)}
                for _ in range(rng.randint(1, 3))
            ],
        }
    else:
        out = {"error": f"no function {name!r}"}
    return json.dumps(out, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------- the client


@dataclass
class TurnResult:
    status: int
    ttft_s: float | None = None
    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)  # llama-server's
    prefix_cache: dict | None = None  # tokenseam's, when the server reports it
    prefix_header: str | None = None
    error: str | None = None
    retried: bool = False  # the first try got no response


def _merge_tool_deltas(calls: list[dict], deltas: list[dict]) -> None:
    """OpenAI's streamed tool calls: fragments keyed by `index`; id, type and name once, arguments appended."""
    for d in deltas:
        i = d.get("index", len(calls))
        while len(calls) <= i:
            calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        c = calls[i]
        if d.get("id"):
            c["id"] = d["id"]
        fn = d.get("function") or {}
        if fn.get("name"):
            c["function"]["name"] += fn["name"]
        if fn.get("arguments"):
            c["function"]["arguments"] += fn["arguments"]


async def stream_chat(client, url: str, body: dict) -> TurnResult:
    """One streamed chat request. TTFT is measured to the first chunk whose delta carries content, reasoning
    or a tool call (tokenseam opens every stream with an empty role chunk before the prompt is read).
    An error before the response begins (a kept-alive connection the server had closed) is raised."""
    import httpx

    t0 = time.perf_counter()
    async with client.stream("POST", url, json=body) as r:
        res = TurnResult(status=r.status_code, prefix_header=r.headers.get("x-tokenseam-prefix"))
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")
            try:
                err = json.loads(text).get("error")
                res.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            except (ValueError, AttributeError):
                res.error = text[:500]
            return res
        try:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    _read_chunk(res, json.loads(line[6:]), t0)
        except httpx.HTTPError as e:  # the response had begun: not retried, the turn is lost
            res.error = f"the stream broke: {type(e).__name__}: {e}"
    return res


def _read_chunk(res: TurnResult, obj: dict, t0: float) -> None:
    if isinstance(obj.get("prefix_cache"), dict):
        res.prefix_cache = obj["prefix_cache"]
    if obj.get("usage"):
        res.usage = obj["usage"]
    if isinstance(obj.get("timings"), dict):
        res.timings = obj["timings"]
    if isinstance(obj.get("error"), dict):
        res.error = obj["error"].get("message", str(obj["error"]))
    for ch in obj.get("choices") or []:
        delta = ch.get("delta") or {}
        text = delta.get("content") or ""
        if res.ttft_s is None and (text or delta.get("tool_calls") or delta.get("reasoning_content")):
            res.ttft_s = time.perf_counter() - t0
        res.content += text
        if delta.get("tool_calls"):
            _merge_tool_deltas(res.tool_calls, delta["tool_calls"])
        if ch.get("finish_reason"):
            res.finish_reason = ch["finish_reason"]


def cached_tokens(res: TurnResult) -> tuple[int | None, str]:
    """The prompt tokens served from the cache and where the number came from: OpenAI's
    usage.prompt_tokens_details.cached_tokens, else llama-server's timings.cache_n."""
    details = res.usage.get("prompt_tokens_details") or {}
    if isinstance(details.get("cached_tokens"), int):
        return details["cached_tokens"], "usage"
    if isinstance(res.timings.get("cache_n"), int):
        return res.timings["cache_n"], "timings.cache_n"
    return None, "none"


@dataclass
class Server:
    """A chat server under test: its name, /v1/chat/completions URL and what its requests add."""

    name: str
    url: str
    model: str
    extra: dict


def _assistant_message(res: TurnResult) -> dict:
    """The assistant's answer as a stateless client puts it back into the history: the text exactly as
    streamed, and the calls as returned (content null when the answer is calls only)."""
    msg: dict[str, Any] = {"role": "assistant", "content": res.content}
    if res.tool_calls:
        msg["tool_calls"] = [
            {
                "id": c["id"] or f"call_{k}",
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
            }
            for k, c in enumerate(res.tool_calls)
        ]
        if not res.content:
            msg["content"] = None
    return msg


def _message_text(m: dict) -> str:
    parts = [m.get("content") or ""]
    for c in m.get("tool_calls") or []:
        parts.append(c["function"]["name"] + c["function"]["arguments"])
    return "".join(parts)


async def _send(client, url: str, body: dict) -> TurnResult:
    """stream_chat, sent once more when no response began, as OpenAI's client does: a server may close a
    kept-alive connection just as the next request goes out on it. The second try's TTFT is the one kept."""
    import httpx

    try:
        return await stream_chat(client, url, body)
    except (httpx.RemoteProtocolError, httpx.ConnectError, httpx.ReadError, httpx.WriteError):
        res = await stream_chat(client, url, body)
        res.retried = True
        return res


async def run_conversation(client, server: Server, conv: Conversation, args, count_tokens) -> dict:
    """Play one conversation against one server: a record per turn, and why it stopped early if it did.
    `count_tokens(text)` estimates a message's tokens, to stop before the history outgrows the context."""
    import httpx

    messages = conv.first_messages()
    turns: list[dict] = []
    out: dict[str, Any] = {"id": conv.id, "kind": conv.kind, "seed": conv.seed, "turns": turns}
    prev_context: int | None = None
    new: list[dict] = []  # messages added since the previous request
    missed_call = False
    for t, step in enumerate(conv.steps, 1):
        if step.user is not None:
            new.append({"role": "user", "content": step.user})
        elif missed_call:  # the forced call did not come back: nothing to answer, so the user nudges
            new.append({"role": "user", "content": FOLLOW_UP_AFTER_MISSED_CALL})
        if prev_context is not None:
            estimate = prev_context + sum(count_tokens(_message_text(m)) + 8 for m in new) + 8
            if estimate + args.max_tokens > args.ctx:
                out["stopped"] = {"turn": t, "reason": "context", "estimated_prompt_tokens": estimate}
                break
        messages.extend(new)
        new = []
        body: dict[str, Any] = {
            "model": server.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": args.temperature,
            "seed": conv.seed,
            "max_tokens": args.max_tokens,
            **server.extra,
        }
        if conv.tools:
            body["tools"] = list(conv.tools)
            body["tool_choice"] = step.tool_choice or "auto"
            # one call per answer: it ends with the call, so the answer fits in max_tokens
            body["parallel_tool_calls"] = False
        try:
            res = await _send(client, server.url, body)
        except httpx.HTTPError as e:  # twice no response: record it and go on with the next conversation
            out["stopped"] = {"turn": t, "reason": "error", "message": f"{type(e).__name__}: {e}"}
            break
        if res.status != 200 or res.error is not None:
            out["stopped"] = {"turn": t, "reason": "error", "status": res.status, "message": res.error}
            break
        prompt = res.usage.get("prompt_tokens")
        completion = res.usage.get("completion_tokens")
        cached, source = cached_tokens(res)
        rec: dict[str, Any] = {
            "turn": t,
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "cached_tokens": cached,
            "cached_source": source,
            "previous_context": prev_context,
            "reuse": reuse_fraction(cached, prev_context),
            "ttft_s": res.ttft_s,
            "finish_reason": res.finish_reason,
            "tool_calls": len(res.tool_calls),
        }
        if res.retried:
            rec["retried"] = True
        if step.tool_choice == "required":
            rec["call_forced"] = True
            if not res.tool_calls:
                rec["call_missing"] = True  # the next turn nudges instead of sending results
        if res.prefix_cache is not None:
            rec["prefix_cache"] = {
                k: res.prefix_cache[k]
                for k in (
                    "matched_tokens",
                    "prompt_tokens",
                    "cause",
                    "at_token",
                    "answers_reused",
                    "answers_cut",
                )
                if k in res.prefix_cache
            }
            rec["prefix_cache_cause"] = res.prefix_cache.get("cause")
        if res.prefix_header is not None:
            rec["prefix_header"] = res.prefix_header
        turns.append(rec)
        if not isinstance(prompt, int) or not isinstance(completion, int):
            out["stopped"] = {"turn": t, "reason": "no usage in the stream"}
            break
        prev_context = prompt + completion
        reply = _assistant_message(res)
        messages.append(reply)
        missed_call = step.tool_choice == "required" and not res.tool_calls
        for k, c in enumerate(reply.get("tool_calls") or []):
            fn = c["function"]
            new.append(
                {
                    "role": "tool",
                    "tool_call_id": c["id"],
                    "content": tool_result(conv, t, k, fn["name"], fn["arguments"]),
                }
            )
    return out


# ---------------------------------------------------------------------------------------------- arithmetic


def reuse_fraction(cached: int | None, previous_context: int | None) -> float | None:
    """cached_tokens of turn k over prompt + completion tokens of turn k-1 (None on turn 1). Capped at 1: a
    turn cannot reuse more of the previous context than there was (a larger count would be cached tokens
    of the new messages, which the previous turn did not hold)."""
    if previous_context is None or cached is None or previous_context <= 0:
        return None
    return min(cached, previous_context) / previous_context


def summarize(conversations: list[dict], target: float = TARGET) -> dict:
    """Per turn index: turns played, reuse (median, min, share at or above `target`) and TTFT (median, p90,
    over the turns whose answer was not a forced call); overall and per kind: the same reuse figures over every turn from 2 on; the turns below `target`."""
    by_turn: dict[int, list[dict]] = {}
    by_kind: dict[str, list[float]] = {}
    scored: list[float] = []
    low: list[dict] = []
    for conv in conversations:
        for rec in conv["turns"]:
            by_turn.setdefault(rec["turn"], []).append(rec)
            r = rec.get("reuse")
            if r is None:
                continue
            scored.append(r)
            by_kind.setdefault(conv["kind"], []).append(r)
            if r < target:
                low.append(
                    {
                        "conversation": conv["id"],
                        "turn": rec["turn"],
                        "reuse": r,
                        "cached_tokens": rec.get("cached_tokens"),
                        "previous_context": rec.get("previous_context"),
                        "cause": rec.get("prefix_cache_cause"),
                    }
                )

    def reuse_stats(xs: list[float]) -> dict:
        return {
            "n": len(xs),
            "reuse_median": median(xs) if xs else None,
            "reuse_min": min(xs) if xs else None,
            "share_at_target": sum(x >= target for x in xs) / len(xs) if xs else None,
        }

    turns = {}
    for t in sorted(by_turn):
        recs = by_turn[t]
        reuses = [r["reuse"] for r in recs if r.get("reuse") is not None]
        # An answer that is a forced call has no comparable first token: tokenseam sends a call whole once it
        # is closed, llama-server streams its name and arguments in pieces. Its TTFT is kept per turn only.
        ttfts = [r["ttft_s"] for r in recs if r.get("ttft_s") is not None and not r.get("call_forced")]
        turns[str(t)] = {
            **reuse_stats(reuses),
            "turns": len(recs),
            "ttft_n": len(ttfts),
            "ttft_median_s": median(ttfts) if ttfts else None,
            "ttft_p90_s": percentile(ttfts, 90) if ttfts else None,
        }
    overall = reuse_stats(scored)
    overall["target_met"] = bool(scored) and all(x >= target for x in scored)
    recs = [r for conv in conversations for r in conv["turns"]]
    # forced calls that did not come back (a server may drop `tools` its template cannot render): those
    # conversations went on as text, with the user nudging, so their tools turns measure another workload
    calls = {
        "forced": sum(bool(r.get("call_forced")) for r in recs),
        "missing": sum(bool(r.get("call_missing")) for r in recs),
        # of those, the answers that ran to max_tokens (a call still open, or text that went on)
        "missing_at_length": sum(
            bool(r.get("call_missing")) and r.get("finish_reason") == "length" for r in recs
        ),
    }
    return {
        "target": target,
        "turns": turns,
        "overall": overall,
        "by_kind": {k: reuse_stats(v) for k, v in sorted(by_kind.items())},
        "below_target": low,
        "forced_calls": calls,
        "retried_turns": sum(bool(r.get("retried")) for r in recs),
        "conversations": len(conversations),
        "stopped_early": [{"conversation": c["id"], **c["stopped"]} for c in conversations if "stopped" in c],
    }


def ttft_ratio(ours: dict, anchor: dict) -> dict[str, float | None]:
    """Per turn index: tokenseam's median TTFT over the anchor's (None where either has no figure)."""
    out: dict[str, float | None] = {}
    for t, s in ours["turns"].items():
        a = anchor["turns"].get(t, {}).get("ttft_median_s")
        o = s.get("ttft_median_s")
        out[t] = o / a if o is not None and a else None
    return out


# ---------------------------------------------------------------------------------------------- the run


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..argtypes import float_in_range, int_in_range

    p.add_argument("--models", default="smollm2,gemma3", help="comma-separated model aliases or .gguf paths")
    p.add_argument(
        "--conversations",
        type=int_in_range("--conversations", 1, 9_999),
        default=12,
        help="conversations per model and server, the kinds taken in turn (12)",
    )
    p.add_argument(
        "--turns", type=int_in_range("--turns", 2, 64), default=6, help="turns per conversation (6)"
    )
    p.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help=f"comma-separated conversation kinds, from {', '.join(KINDS)} (all)",
    )
    p.add_argument(
        "--max-tokens",
        type=int_in_range("--max-tokens", 1, 4096),
        default=128,
        help="max_tokens of every request (128)",
    )
    p.add_argument("--temperature", type=float_in_range("--temperature", 0.0, 2.0), default=0.8, help="(0.8)")
    p.add_argument(
        "--seed",
        type=int_in_range("--seed", 0, 99_999),
        default=0,
        help="workload seed (0); conversation i sends the request seed seed*10000+i",
    )
    p.add_argument("--threads", type=int_in_range("--threads", 1, 512), default=2)
    p.add_argument(
        "--ctx",
        type=int_in_range("--ctx", 512, 1 << 20),
        default=4096,
        help="context per sequence, both servers (4096); a conversation that would outgrow it stops early",
    )
    p.add_argument(
        "--parallel",
        type=int_in_range("--parallel", 1, 256),
        default=1,
        help="tokenseam's sequences (1; the client plays one conversation at a time)",
    )
    p.add_argument(
        "--warmup",
        type=int_in_range("--warmup", 0, 100),
        default=1,
        help="unrecorded 2-turn conversations of each kind played first on every server (1): one-time costs "
        "such as compiling the tools' grammars stay out of the figures",
    )
    p.add_argument("--llama-server", default=None, help="path to a llama-server binary (the anchor)")
    p.add_argument(
        "--llama-swa-full",
        action="store_true",
        help="run llama-server with --swa-full: a full-size cache for sliding-window models (Gemma 3), whose "
        "default cache cannot roll back past the window and restores the last prompt checkpoint instead",
    )
    p.add_argument(
        "--llama-parallel",
        default="1",
        help="comma-separated llama-server -np values, one run each (1)",
    )
    p.add_argument(
        "--out", default="bench-results/conversation.json", help="the JSON (the PNG goes beside it)"
    )


def _check(args: argparse.Namespace) -> str | None:
    """A message for bad input that argparse's types cannot see, or None."""
    from ..models import ModelNotFoundError, resolve_model

    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if not kinds or bad:
        return f"--kinds: unknown kind(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(KINDS)}"
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        return "--models: no model given"
    for m in models:
        try:
            resolve_model(m)
        except ModelNotFoundError as e:
            return f"--models: {e}"
    if args.llama_server is not None:
        import os

        if not os.path.isfile(args.llama_server) or not os.access(args.llama_server, os.X_OK):
            return f"--llama-server: {args.llama_server!r} is not an executable file"
    try:
        nps = [int(x) for x in args.llama_parallel.split(",") if x.strip()]
    except ValueError:
        nps = []
    if not nps or any(n < 1 for n in nps):
        return "--llama-parallel must be comma-separated positive integers"
    return None


def run(args: argparse.Namespace) -> int:
    import signal

    from rich.console import Console

    problem = _check(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    # A SIGTERM (a `timeout`, a CI cancel) unwinds through the `with` blocks, so no server is left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    console = Console()
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    convs = make_conversations(args.conversations, args.turns, args.seed, kinds)
    res: dict[str, Any] = {
        "machine": machine(),
        "config": {
            k: getattr(args, k)
            for k in (
                "conversations",
                "turns",
                "kinds",
                "max_tokens",
                "temperature",
                "seed",
                "threads",
                "ctx",
                "parallel",
                "warmup",
                "llama_parallel",
                "llama_swa_full",
            )
        }
        | {"llama_server": bool(args.llama_server)},
        "target": TARGET,
        "metric": "turn k >= 2: cached_tokens(k) / (prompt_tokens(k-1) + completion_tokens(k-1))",
        "workload": [{"id": c.id, "kind": c.kind, "seed": c.seed, "steps": len(c.steps)} for c in convs],
        "models": {},
    }
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        console.print(f"[bold]{model}[/bold]")
        res["models"][model] = _bench_model(model, convs, args, console)
        write_json(args.out, res)  # a partial result survives a later model's failure
    _report(console, res)
    out = write_json(args.out, res)
    try:
        plot(res, out.with_suffix(".png"))
        console.print(f"wrote {out} and {out.with_suffix('.png')}")
    except ImportError:
        print("(matplotlib is not installed: no plot)", file=sys.stderr)
        console.print(f"wrote {out}")
    return 0


def warmup_conversations(args) -> list[Conversation]:
    """`--warmup` 2-turn conversations of each kind, from a seed the measured ones do not use."""
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    return make_conversations(args.warmup * len(kinds), 2, args.seed, kinds, label="warmup-")


def _play(server: Server, convs: list[Conversation], args, count_tokens, console) -> dict:
    import httpx

    async def go() -> list[dict]:
        done = []
        async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=30)) as c:
            for conv in warmup_conversations(args):
                await run_conversation(c, server, conv, args, count_tokens)
            for conv in convs:
                done.append(await run_conversation(c, server, conv, args, count_tokens))
        return done

    t0 = time.perf_counter()
    played = asyncio.run(go())
    summary = summarize(played)
    o = summary["overall"]
    console.print(
        f"  {server.name}: {len(played)} conversations, {sum(len(c['turns']) for c in played)} turns, "
        f"{o['n']} scored, {len(summary['below_target'])} below {TARGET:.1%}, "
        f"{len(summary['stopped_early'])} stopped early ({time.perf_counter() - t0:.0f} s)"
    )
    return {"conversations": played, "summary": summary}


def _bench_model(model: str, convs: list[Conversation], args, console) -> dict:
    import httpx

    from ..models import resolve_model
    from ..vocab import Tokenizer
    from .common import TokenseamServe

    path = resolve_model(model)
    tok = Tokenizer.from_gguf(path)

    def count_tokens(text: str) -> int:
        return len(tok.encode(text))

    serve = ["--ctx-size", str(args.ctx), "--parallel", str(args.parallel), "--threads", str(args.threads)]
    serve += ["--prefix-cache-tokens", str(max(16384, 4 * args.ctx))]
    m: dict[str, Any] = {"gguf": Path(path).name, "servers": {}}
    with TokenseamServe(path, serve) as ts:
        # Without a template in the GGUF, tokenseam renders the built-in one its vocabulary marks, and
        # llama-server is given the same one (--chat-template-file): both render the same turns.
        builtin = ts.chat_template()
        m["chat_template"] = (
            "gguf" if builtin is None else f"none in the GGUF: built-in {builtin} on both servers"
        )
        served = httpx.get(ts.url + "/v1/models", timeout=30).json()["data"][0]["id"]
        server = Server("tokenseam", ts.url + "/v1/chat/completions", served, {"prefix_cache": True})
        m["servers"]["tokenseam"] = _play(server, convs, args, count_tokens, console)
        m["servers"]["tokenseam"]["config"] = {"parallel": args.parallel, "ctx": args.ctx}
    if args.llama_server:
        flags = ["--jinja"] + (["--swa-full"] if args.llama_swa_full else [])
        with tempfile.TemporaryDirectory(prefix="tokenseam-template-") as tmp:
            if builtin is not None:
                from ..chat_formats import BUILT_IN

                template_file = Path(tmp) / f"{builtin}.jinja"
                template_file.write_text(BUILT_IN[builtin], encoding="utf-8")
                flags += ["--chat-template-file", str(template_file)]
            _play_llama_servers(args, m, flags, path, model, convs, count_tokens, console)
        ours = m["servers"]["tokenseam"]["summary"]
        m["ttft_ratio_vs"] = {
            name: ttft_ratio(ours, s["summary"])
            for name, s in m["servers"].items()
            if name != "tokenseam" and "summary" in s
        }
    return m


def _play_llama_servers(
    args, m: dict, flags: list[str], path, model: str, convs, count_tokens, console
) -> None:
    """The conversations on llama-server, once per --llama-parallel value, into m["servers"]."""
    from .common import LlamaServer

    for np_ in [int(x) for x in args.llama_parallel.split(",") if x.strip()]:
        name = f"llama-server-np{np_}"
        config = {"parallel": np_, "ctx_per_slot": args.ctx, "flags": flags}
        ls = None
        try:
            ls = LlamaServer(args.llama_server, path, np_, args.threads, args.ctx, extra_args=flags)
            ls.__enter__()
        except (OSError, RuntimeError) as e:  # it did not start: say so, keep tokenseam's figures
            if ls is not None:
                ls.killed_on_purpose = True  # its log's end is in the message already
                ls.__exit__()
            console.print(f"  {name} did not start: {e}")
            m["servers"][name] = {"error": str(e), "config": config}
            continue
        try:
            srv = Server(name, ls.url + "/v1/chat/completions", model, {"cache_prompt": True})
            m["servers"][name] = _play(srv, convs, args, count_tokens, console) | {"config": config}
        finally:
            ls.__exit__()


# ---------------------------------------------------------------------------------------------- output


def _played(m: dict) -> list[tuple[str, dict]]:
    """A model's servers that ran (a llama-server that did not start has only an `error`)."""
    return [(name, s) for name, s in m["servers"].items() if "summary" in s]


def _pct(x: float | None) -> str:
    # two decimals: 99.48 % must not print as the 99.5 % target
    return "-" if x is None else f"{x:.2%}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


def _report(console, res: dict) -> None:
    from rich.table import Table

    table = Table(
        title=f"conversations: reuse of the previous turn's context (target ≥ {TARGET:.1%}) and TTFT per turn"
    )
    for col in (
        "model",
        "server",
        "turn",
        "n",
        "reuse median",
        "reuse min",
        f"≥ {TARGET:.1%}",
        "TTFT median",
        "TTFT p90",
        "TTFT / anchor",
    ):
        table.add_column(col)
    for model, m in res["models"].items():
        for name, s in _played(m):
            ratios = (m.get("ttft_ratio_vs") or {}) if name == "tokenseam" else {}
            anchor = next(iter(ratios.values()), {})
            for t, row in s["summary"]["turns"].items():
                r = anchor.get(t)
                table.add_row(
                    model,
                    name,
                    t,
                    str(row["turns"]),
                    _pct(row["reuse_median"]),
                    _pct(row["reuse_min"]),
                    _pct(row["share_at_target"]),
                    _ms(row["ttft_median_s"]),
                    _ms(row["ttft_p90_s"]),
                    "-" if r is None else f"{r:.2f}",
                )
            o = s["summary"]["overall"]
            table.add_row(
                model,
                name,
                "all ≥ 2",
                str(o["n"]),
                _pct(o["reuse_median"]),
                _pct(o["reuse_min"]),
                _pct(o["share_at_target"]),
                "",
                "",
                "met" if o["target_met"] else "not met",
                end_section=True,
            )
    console.print(table)
    anchors = [next(iter(m["ttft_ratio_vs"])) for m in res["models"].values() if m.get("ttft_ratio_vs")]
    if anchors:
        console.print(f"TTFT / anchor: tokenseam's median TTFT over {anchors[0]}'s, per turn")
    for model, m in res["models"].items():
        for name, s in m["servers"].items():
            if "error" in s:
                console.print(f"  {model} {name}: not run ({s['error'][:200]})")
                continue
            low = s["summary"]["below_target"]
            for x in low[:8]:
                console.print(
                    f"  below target: {model} {name} {x['conversation']} turn {x['turn']}: "
                    f"{x['cached_tokens']}/{x['previous_context']} ({_pct(x['reuse'])})"
                    + (f", cause {x['cause']}" if x.get("cause") else "")
                )
            if len(low) > 8:
                console.print(f"  ... and {len(low) - 8} more below target ({model}, {name})")
            for x in s["summary"]["stopped_early"]:
                console.print(f"  stopped early: {model} {name} {x}")
            calls = s["summary"]["forced_calls"]
            if calls["missing"]:
                console.print(
                    f"  {model} {name}: {calls['missing']} of {calls['forced']} forced tool calls did not "
                    f"come back ({calls['missing_at_length']} of those answers ran to max_tokens); the conversations "
                    "went on as text"
                )


def plot(res: dict, path: Path) -> None:
    """Reuse (median, with the minimum dotted) and TTFT (median, p90 dotted) per turn index: one column per
    model, one line per server."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    models = list(res["models"])
    if not models:
        return
    fig, axes = plt.subplots(2, len(models), figsize=(5.5 * len(models), 7), squeeze=False)
    for j, model in enumerate(models):
        a, b = axes[0][j], axes[1][j]
        for k, (name, s) in enumerate(_played(res["models"][model])):
            color = f"C{k}"
            rows = s["summary"]["turns"]
            ts = [int(t) for t, r in rows.items() if r["reuse_median"] is not None]
            a.plot(ts, [rows[str(t)]["reuse_median"] for t in ts], "o-", color=color, label=f"{name} median")
            a.plot(ts, [rows[str(t)]["reuse_min"] for t in ts], "v:", color=color, label=f"{name} min")
            tt = [int(t) for t, r in rows.items() if r["ttft_median_s"] is not None]
            b.plot(tt, [rows[str(t)]["ttft_median_s"] * 1000 for t in tt], "o-", color=color, label=name)
            b.plot(tt, [rows[str(t)]["ttft_p90_s"] * 1000 for t in tt], ":", color=color)
        a.axhline(TARGET, color="grey", lw=0.8, ls="--")
        a.set_ylim(min(0.9, a.get_ylim()[0]), 1.005)
        a.set_title(f"{model}: previous context reused")
        a.set_xlabel("turn")
        a.legend(fontsize=7)
        b.set_title(f"{model}: TTFT (ms; dotted p90)")
        b.set_xlabel("turn")
        b.set_ylim(bottom=0)
        b.legend(fontsize=7)
        for ax in (a, b):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
