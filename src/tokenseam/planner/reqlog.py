"""`tokenseam plan --from-log`: call rates and shared prefixes estimated from a log of request bodies.

Log format (JSONL, UTF-8, one request per line, blank lines skipped):

* `{"ts": TIME, "body": REQUEST}`, or
* a request body with a `"timestamp": TIME` field (removed before the body is read),

where TIME is Unix seconds (a number) or an ISO 8601 string (no zone = UTC), and REQUEST is an OpenAI
(`/v1/chat/completions` or `/v1/completions`) or Anthropic (`/v1/messages`) request body.

A request is rendered as the text its cache sees, in order: tools, the system prompt, then each message's
text parts (other parts — images, tool calls — as their JSON; cache markers are left out, so marking a prefix
does not split a group). Requests of one model are sorted; neighbours sharing at least `--min-shared-tokens`
tokens form a group whose shared prefix is the longest prefix common to all of them, cut back to its stable
end: with a local tokenizer the healing part's stable point (`tokenseam.healing.stable_prefix`: tokens no
appended text can re-tokenize), without one the last whitespace or punctuation. So a conversation that grows
turn by turn, or a fixed prompt followed by different questions, stays one group whatever is appended.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import dataclass
from typing import Any

from .errors import PlannerError
from .inputs import read_jsonl

MAX_LOG_BYTES = 64 * 1024 * 1024
MAX_LOG_REQUESTS = 100_000
MAX_TIMESTAMP = 32503680000.0  # year 3000: larger numbers are milliseconds or garbage
PREVIEW_CHARS = 80
_MARK = "\x1e"  # separates rendered segments; never counted as tokens
_MARK_RE = re.compile(_MARK + r"[^" + _MARK + r"]*" + _MARK)
_CACHE_KEYS = ("cache_control", "prompt_cache_breakpoint")


@dataclass
class LoggedRequest:
    line: int
    ts: float
    model: str | None
    dialect: str
    text: str  # rendered prefix text with segment marks


def parse_time(v: Any, where: str) -> float:
    """Unix seconds from a number or an ISO 8601 string; errors name the line."""
    if isinstance(v, bool) or v is None:
        raise PlannerError(f"{where}: the timestamp must be Unix seconds or an ISO 8601 string, got {v!r}")
    if isinstance(v, int | float):
        t = float(v)
    elif isinstance(v, str):
        try:
            d = _dt.datetime.fromisoformat(v.strip())
        except ValueError:
            raise PlannerError(
                f"{where}: timestamp {v[:40]!r} is not ISO 8601 (e.g. 2026-11-30T12:00:00Z)"
            ) from None
        if d.tzinfo is None:
            d = d.replace(tzinfo=_dt.UTC)
        t = d.timestamp()
    else:
        raise PlannerError(
            f"{where}: the timestamp must be Unix seconds or an ISO 8601 string, got {type(v).__name__}"
        )
    if not math.isfinite(t) or t < 0 or t > MAX_TIMESTAMP:
        raise PlannerError(f"{where}: timestamp {v!r} is not a time between 1970 and 3000 in seconds")
    return t


def _strip_cache(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _strip_cache(v) for k, v in x.items() if k not in _CACHE_KEYS}
    if isinstance(x, list):
        return [_strip_cache(v) for v in x]
    return x


def _content_text(content: Any, where: str) -> str:
    import json

    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise PlannerError(
            f"{where}: 'content' must be a string or a list of parts, got {type(content).__name__}"
        )
    out = []
    for part in content:
        if not isinstance(part, dict):
            raise PlannerError(f"{where}: each content part must be an object, got {type(part).__name__}")
        if part.get("type") == "text" or ("text" in part and "type" not in part):
            if not isinstance(part.get("text"), str):
                raise PlannerError(f"{where}: a text part's 'text' must be a string")
            out.append(part["text"])
        else:
            out.append(json.dumps(_strip_cache(part), sort_keys=True, ensure_ascii=False))
    return "".join(out)


def render_request(body: Any, where: str) -> tuple[str, str]:
    """(dialect, rendered prefix text) of one request body."""
    import json

    if not isinstance(body, dict):
        raise PlannerError(f"{where}: the request body must be a JSON object, got {type(body).__name__}")
    segs: list[tuple[str, str]] = []
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise PlannerError(f"{where}: 'tools' must be a list")
        segs.append(("tools", json.dumps(_strip_cache(tools), sort_keys=True, ensure_ascii=False)))
    dialect = "openai"
    if "system" in body:
        dialect = "anthropic"
        system = body["system"]
        segs.append(("system", _content_text(system, f"{where}: system")))
    if "messages" in body:
        msgs = body["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise PlannerError(f"{where}: 'messages' must be a non-empty list")
        for i, m in enumerate(msgs):
            mw = f"{where}: messages[{i}]"
            if not isinstance(m, dict):
                raise PlannerError(f"{mw} must be an object")
            role = m.get("role")
            if not isinstance(role, str) or not role:
                raise PlannerError(f"{mw}: 'role' must be a non-empty string")
            content = m.get("content")
            if isinstance(content, list) and any(
                isinstance(p, dict) and ("cache_control" in p or p.get("type") in ("tool_use", "tool_result"))
                for p in content
            ):
                dialect = "anthropic"
            segs.append((role, _content_text(content, mw)))
    elif "prompt" in body:
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            raise PlannerError(f"{where}: 'prompt' must be a string (batched prompts are not supported)")
        segs.append(("prompt", prompt))
    else:
        raise PlannerError(
            f"{where}: the request has no 'messages' (chat / messages API) or 'prompt' (completions)"
        )
    return dialect, "".join(f"{_MARK}{role}{_MARK}{text}" for role, text in segs)


def read_log(
    path, max_bytes: int = MAX_LOG_BYTES, max_requests: int = MAX_LOG_REQUESTS
) -> list[LoggedRequest]:
    out: list[LoggedRequest] = []
    for p, n, obj in read_jsonl(path, "request log", max_bytes):
        where = f"{p} line {n}"
        if not isinstance(obj, dict):
            raise PlannerError(
                f'{where}: expected an object ({{"ts": ..., "body": {{...}}}} or a request body)'
            )
        if "body" in obj and "ts" in obj:
            extra = sorted(set(obj) - {"ts", "body"})
            if extra:
                raise PlannerError(f"{where}: unexpected field(s) {', '.join(extra)} next to ts and body")
            ts, body = parse_time(obj["ts"], where), obj["body"]
        elif "timestamp" in obj:
            body = {k: v for k, v in obj.items() if k != "timestamp"}
            ts = parse_time(obj["timestamp"], where)
        else:
            raise PlannerError(
                f'{where}: no timestamp: wrap the body as {{"ts": TIME, "body": {{...}}}} or add "timestamp": TIME'
            )
        dialect, text = render_request(body, where)
        model = body.get("model")
        if model is not None and (not isinstance(model, str) or not model.strip()):
            raise PlannerError(f"{where}: 'model' must be a non-empty string")
        out.append(LoggedRequest(n, ts, model, dialect, text))
        if len(out) > max_requests:
            raise PlannerError(f"{p} has more than {max_requests:,} requests; the limit is {max_requests:,}")
    if not out:
        raise PlannerError(f"request log {path} holds no requests")
    return out


def _lcp(a: str, b: str) -> int:
    """Length of the longest common prefix (binary search on slice equality: fast on long texts)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def plain(text: str) -> str:
    """The rendered text without segment marks: what is counted as tokens."""
    text = _MARK_RE.sub("", text)
    cut = text.find(_MARK)  # a prefix that stops inside a segment mark
    return text if cut < 0 else text[:cut]


def _stable_cut(shared: str, counter) -> tuple[str, int]:
    """(stable part of a shared prefix, its token count incl. leading tokens)."""
    text = plain(shared)
    if counter.tokenizer is not None:
        from ..healing.stable import stable_prefix

        sp = stable_prefix(counter.tokenizer, counter.vocabulary(), text)
        kept = counter.tokenizer.decode(sp.ids).decode("utf-8", "replace")
        return kept, counter.leading_tokens + len(sp.ids)
    # No tokenizer: the last whitespace or punctuation is where a token surely ends.
    i = len(text)
    while i > 0 and not (text[i - 1].isspace() or (not text[i - 1].isalnum() and text[i - 1] != "_")):
        i -= 1
    kept = text[:i]
    return kept, counter.count(kept) if kept else counter.leading_tokens


@dataclass
class Group:
    model: str | None
    members: list[LoggedRequest]
    shared_text: str
    shared_tokens: int
    block_text: str  # the shared prefix cut back to the end of its last whole content block
    block_tokens: int


def group_requests(reqs: list[LoggedRequest], counter, min_shared_tokens: int) -> tuple[list[Group], int]:
    """Groups of at least two requests of one model sharing a stable prefix of >= min_shared_tokens tokens,
    and the number of requests in no group."""
    groups: list[Group] = []
    loose = 0
    by_model: dict[str | None, list[LoggedRequest]] = {}
    for r in reqs:
        by_model.setdefault(r.model, []).append(r)
    for model, rs in by_model.items():
        rs = sorted(rs, key=lambda r: r.text)
        runs: list[list[LoggedRequest]] = [[rs[0]]]
        lcps: list[list[int]] = [[]]
        for prev, cur in zip(rs, rs[1:], strict=False):
            n = _lcp(prev.text, cur.text)
            if counter.count_text(plain(prev.text[:n])) >= min_shared_tokens and n > 0:
                runs[-1].append(cur)
                lcps[-1].append(n)
            else:
                runs.append([cur])
                lcps.append([])
        for run, ls in zip(runs, lcps, strict=True):
            if len(run) < 2:
                loose += 1
                continue
            n = min(ls)
            shared = run[0].text[:n]
            kept, tokens = _stable_cut(shared, counter)
            # An explicit breakpoint sits at the end of a content block: the last whole block of the shared text.
            if n == len(run[0].text) or n == len(run[-1].text):
                whole = shared
            else:
                starts = [m.start() for m in _MARK_RE.finditer(shared)]
                whole = shared[: starts[-1]] if starts else ""
            block = plain(whole)
            block_tokens = counter.count(block) if block else 0
            groups.append(Group(model, sorted(run, key=lambda r: r.ts), kept, tokens, block, block_tokens))
    groups.sort(key=lambda g: (-len(g.members), -g.shared_tokens))
    return groups, loose


def rate_per_hour(ts: list[float]) -> float | None:
    """Calls per hour: (n - 1) arrivals over the span from the first to the last call (None if no span)."""
    if len(ts) < 2:
        return None
    span = max(ts) - min(ts)
    return None if span <= 0 else (len(ts) - 1) * 3600.0 / span


def observed_hit_fraction(ts: list[float], ttl_seconds: float, refresh_on_hit: bool) -> float | None:
    """Fraction of calls after the first that came while an entry was alive (the log's own hit rate under the
    same TTL rule as the plan: within the TTL of the previous call, or of the last write)."""
    ts = sorted(ts)
    if len(ts) < 2:
        return None
    hits, written = 0, ts[0]
    for prev, t in zip(ts, ts[1:], strict=False):
        ref = prev if refresh_on_hit else written
        if t - ref <= ttl_seconds:
            hits += 1
        else:
            written = t
    return hits / (len(ts) - 1)


def plan_log(args, profiles) -> dict:
    """The `--from-log` report: one plan per group, at the group's own call rate."""
    from .cli_plan import plan_for
    from .counting import make_counter

    fixed = profiles.get(args.profile) if args.profile else None
    counter = make_counter(args.tokenizer, fixed.tokenizer if fixed else None, args.leading_tokens)
    reqs = read_log(args.from_log)
    groups, loose = group_requests(reqs, counter, args.min_shared_tokens)
    out_groups = []
    for g in groups:
        if fixed is not None:
            profile = fixed
        elif g.model is None:
            raise PlannerError(
                f"{args.from_log} line {g.members[0].line}: the request names no model; pass --profile"
            )
        else:
            profile = profiles.get(g.model)
        ts = [r.ts for r in g.members]
        rate = rate_per_hour(ts)
        p = g.block_tokens if profile.explicit else g.shared_tokens
        plan = plan_for(profile, p, counter.exact, rate, args.price_per_mtok)
        out_groups.append(
            {
                "model": g.model,
                "profile": profile.name,
                "requests": len(g.members),
                "lines": [r.line for r in g.members[:20]],
                "dialects": sorted({r.dialect for r in g.members}),
                "span_seconds": max(ts) - min(ts),
                "calls_per_hour": rate,
                "shared_tokens": g.shared_tokens,
                "shared_chars": len(g.shared_text),
                "block_tokens": g.block_tokens,
                "planned_prefix": "whole content blocks (explicit breakpoint)"
                if profile.explicit
                else "stable prefix",
                "prefix_preview": g.shared_text[:PREVIEW_CHARS],
                "observed_hit_fraction": {
                    w.name: observed_hit_fraction(ts, w.ttl_seconds, profile.ttl_refresh_on_hit)
                    for w in profile.writes
                },
                "plan": plan.to_dict(),
            }
        )
    return {
        "log_file": str(args.from_log),
        "requests": len(reqs),
        "ungrouped_requests": loose,
        "min_shared_tokens": args.min_shared_tokens,
        "count": counter.describe(),
        "groups": out_groups,
    }


def print_log_report(rep: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=max(Console().width, 120))
    t = Table(
        title=f"request log {rep['log_file']}: {rep['requests']} requests, {len(rep['groups'])} groups, "
        f"{rep['ungrouped_requests']} ungrouped"
    )
    for col in (
        "group",
        "model / profile",
        "requests",
        "calls/h",
        "shared tokens",
        "write",
        "P(hit) model",
        "P(hit) log",
        "verdict",
        "prefix",
    ):
        t.add_column(col, justify="left" if col in ("model / profile", "verdict", "prefix") else "right")
    for i, g in enumerate(rep["groups"], 1):
        for j, op in enumerate(g["plan"]["options"]):
            obs = g["observed_hit_fraction"].get(op["write_option"])
            t.add_row(
                str(i) if j == 0 else "",
                f"{g['model'] or '-'} / {g['profile']}" if j == 0 else "",
                str(g["requests"]) if j == 0 else "",
                ("-" if g["calls_per_hour"] is None else f"{g['calls_per_hour']:,.2f}") if j == 0 else "",
                f"{g['plan']['prefix_tokens']:,}" if j == 0 else "",
                op["write_option"],
                f"{op['hit_probability']:.3f}",
                "-" if obs is None else f"{obs:.3f}",
                op["verdict"],
                repr(g["prefix_preview"][:40]) if j == 0 else "",
            )
    con.print(t)
    if not rep["count"]["exact"]:
        con.print(f"[yellow]count:[/yellow] {rep['count']['error_note']}")
    if any(g["calls_per_hour"] is None for g in rep["groups"]):
        con.print("groups whose requests share one timestamp have no rate: their costs are steady state.")
