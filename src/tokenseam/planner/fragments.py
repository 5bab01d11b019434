"""Request fragments that place a cache breakpoint after a (padded) prefix, in each provider's request format.

A fragment is the part of a request body that carries the cached prefix: merge it into your request and append
the changing part after it (`merge_fragment` does that for the three formats).

* openai: the prefix as a text content part of one message. On explicit-cache models (GPT-5.6 and later) the
  part carries `prompt_cache_breakpoint: {"mode": "explicit"}` and the request `prompt_cache_options:
  {"mode": "explicit", "ttl": "30m"}`, so only the prefix is written to the cache (in the default implicit
  mode OpenAI also writes a breakpoint near the latest message, i.e. the changing suffix, at the write rate).
  On older models nothing marks the prefix; a `prompt_cache_retention` is set when the plan's write option is
  one of its values.
* anthropic: the prefix as a text block with `cache_control: {"type": "ephemeral", "ttl": "5m" | "1h"}`,
  in `system` or in the first user message. Top-level automatic caching would put the breakpoint on the last
  block, i.e. the changing suffix, so the fragment marks the prefix block itself.
* gemini: implicit caching has no marker: the fragment is just the contents, prefix first.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

from .errors import PlannerError
from .profiles import Profile, WriteOption

DIALECTS = ("openai", "anthropic", "gemini")
ROLES = ("user", "system", "developer")
# Which providers' request formats a dialect can address (DeepSeek serves both the OpenAI and Anthropic formats).
_PROVIDERS = {
    "openai": {"openai", "deepseek", "tokenseam"},
    "anthropic": {"anthropic", "deepseek"},
    "gemini": {"google"},
}
OPENAI_BREAKPOINT_TTLS = ("30m", "12h")
OPENAI_REQUEST_TTL = "30m"
OPENAI_RETENTIONS = ("in_memory", "24h")
ANTHROPIC_TTLS = ("5m", "1h")
MAX_FRAGMENT_BYTES = 8 * 1024 * 1024


def check_dialect(dialect: str, profile: Profile, role: str) -> None:
    if dialect not in DIALECTS:
        raise PlannerError(f"--emit must be one of {', '.join(DIALECTS)}, got {dialect!r}")
    known = set().union(*_PROVIDERS.values())
    if profile.provider in known and profile.provider not in _PROVIDERS[dialect]:
        raise PlannerError(
            f"profile {profile.name!r} is a {profile.provider} cache; a {dialect} fragment would be sent to "
            f"another API. Use --emit {next(d for d in DIALECTS if profile.provider in _PROVIDERS[d])}"
        )
    if role not in ROLES:
        raise PlannerError(f"--role must be one of {', '.join(ROLES)}, got {role!r}")
    if role == "developer" and dialect != "openai":
        raise PlannerError("--role developer exists only in the OpenAI format (use system or user)")
    if profile.explicit and profile.max_breakpoints < 1:
        raise PlannerError(f"profile {profile.name!r} is explicit but allows no breakpoint")


def make_fragment(
    dialect: str, text: str, profile: Profile, write: WriteOption | None = None, role: str = "user"
) -> dict[str, Any]:
    """The request fragment for `text` as the cached prefix (see the module docstring)."""
    check_dialect(dialect, profile, role)
    if not text:
        raise PlannerError("the prefix is empty: there is nothing to cache")
    write = write or profile.writes[0]
    if dialect == "openai":
        part: dict[str, Any] = {"type": "text", "text": text}
        frag: dict[str, Any] = {"messages": [{"role": role, "content": [part]}]}
        if profile.explicit:
            bp: dict[str, Any] = {"mode": "explicit"}
            if write.name in OPENAI_BREAKPOINT_TTLS and write.name != OPENAI_REQUEST_TTL:
                bp["ttl"] = write.name
            part["prompt_cache_breakpoint"] = bp
            frag["prompt_cache_options"] = {"mode": "explicit", "ttl": OPENAI_REQUEST_TTL}
        elif profile.provider == "openai" and write.name in OPENAI_RETENTIONS:
            frag["prompt_cache_retention"] = write.name
        return frag
    if dialect == "anthropic":
        block: dict[str, Any] = {"type": "text", "text": text}
        if profile.explicit:
            cc: dict[str, Any] = {"type": "ephemeral"}
            if write.name in ANTHROPIC_TTLS:
                cc["ttl"] = write.name
            block["cache_control"] = cc
        if role == "system":
            return {"system": [block]}
        return {"messages": [{"role": "user", "content": [block]}]}
    if role == "system":
        return {"systemInstruction": {"parts": [{"text": text}]}}
    return {"contents": [{"role": "user", "parts": [{"text": text}]}]}


def _objects(x: Any):
    """Every JSON object inside a JSON value, depth first, each before what it holds."""
    if isinstance(x, dict):
        yield x
        for v in x.values():
            yield from _objects(v)
    elif isinstance(x, list):
        for v in x:
            yield from _objects(v)


def breakpoints(fragment: dict[str, Any]) -> int:
    """How many cache breakpoints a fragment places (any format)."""
    return sum(
        ("prompt_cache_breakpoint" in x) + ("cache_control" in x and "type" in x) for x in _objects(fragment)
    )


def fragment_sha(fragment: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(fragment).encode("utf-8")).hexdigest()[:16]


def canonical(fragment: dict[str, Any]) -> str:
    return json.dumps(fragment, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def detect_dialect(fragment: Any, where: str) -> str:
    """The format of a fragment written by `--emit` (or one shaped like it)."""
    if not isinstance(fragment, dict) or not fragment:
        raise PlannerError(f"{where}: a request fragment must be a non-empty JSON object")
    if "contents" in fragment or "systemInstruction" in fragment:
        return "gemini"
    if "system" in fragment or '"cache_control"' in canonical(fragment):
        return "anthropic"
    if "messages" in fragment:
        return "openai"
    raise PlannerError(f"{where}: not a request fragment (no messages, system or contents)")


def prefix_text(fragment: dict[str, Any], where: str = "fragment") -> str:
    """The text of the fragment's cached prefix: every text part, in order."""
    out: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if isinstance(x.get("text"), str):
                out.append(x["text"])
            for k, v in x.items():
                if k != "text":
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(fragment)
    if not out:
        raise PlannerError(f"{where}: the fragment holds no text")
    return "".join(out)


def merge_fragment(
    fragment: dict[str, Any], dialect: str, suffix: str, separator: str = "\n\n"
) -> dict[str, Any]:
    """A request body (without model and sampling fields) made of the fragment with `suffix` appended after the
    cached prefix: a further text part of the same user message, or a new user message after a system prefix."""
    body = copy.deepcopy(fragment)
    if dialect == "gemini":
        contents = body.setdefault("contents", [])
        if contents and contents[-1].get("role") == "user":
            contents[-1]["parts"].append({"text": separator + suffix})
        else:
            contents.append({"role": "user", "parts": [{"text": suffix}]})
        return body
    if dialect not in ("openai", "anthropic"):
        raise PlannerError(f"unknown fragment format {dialect!r}")
    messages = body.setdefault("messages", [])
    last = messages[-1] if messages else None
    if last is not None and last.get("role") == "user":
        if isinstance(last.get("content"), str):
            last["content"] = [{"type": "text", "text": last["content"]}]
        last["content"].append({"type": "text", "text": separator + suffix})
    else:
        messages.append({"role": "user", "content": suffix})
    return body


def write_fragment(fragment: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(fragment, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def load_fragment(path: str | Path) -> tuple[dict[str, Any], str]:
    """(fragment, format) from a JSON file written by `--emit`, with errors that name the file."""
    from .inputs import read_text_file

    p = Path(path)
    raw = read_text_file(p, "fragment file", max_bytes=MAX_FRAGMENT_BYTES)
    try:
        frag = json.loads(raw)
    except json.JSONDecodeError as e:
        raise PlannerError(f"{p}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    dialect = detect_dialect(frag, str(p))
    prefix_text(frag, str(p))
    return frag, dialect


def fragment_cache_fields(fragment: dict[str, Any]) -> dict[str, Any]:
    """What a result records about a fragment: its hash, breakpoint count, request-level cache fields and the
    breakpoint markers themselves (the prefix text is recorded once, in run.json)."""
    marks = [
        {k: x[k]} for x in _objects(fragment) for k in ("prompt_cache_breakpoint", "cache_control") if k in x
    ]
    top = {k: v for k, v in fragment.items() if k.startswith("prompt_cache")}
    return {
        "sha": fragment_sha(fragment),
        "breakpoints": breakpoints(fragment),
        "request": top,
        "markers": marks,
    }
