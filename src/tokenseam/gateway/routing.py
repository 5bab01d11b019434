"""The routing key: the part of a request's prompt that other requests share, and that does not move when
different text is appended.

- Chat: the fixed head of the conversation, i.e. `tools` and the leading run of `system`/`developer`
  messages and few-shot examples (messages named `example_*`, OpenAI's convention). Every turn of every
  conversation under one system prompt has the same key, so the conversation stays on the replica that holds
  its KV (stickiness without per-client state). A chat without such a head keys on its first
  message, which every later turn of the same conversation repeats.
- Completions: a prompt of token ids keys on its first `prefix_tokens` ids. A text prompt keys on its first
  `prefix_bytes` bytes, cut back to the last whitespace inside them: a token can run across the cut, never
  across whitespace-led word starts, so the bytes before the cut tokenize the same whatever follows.
  A prompt shorter than that keys on everything before its last word (the unstable tail).

The key is bytes (the model name, then the canonical JSON or UTF-8 of the part); `describe` says what it
covered, for the `x-tokenseam-route` header.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

HEAD_ROLES = ("system", "developer")
DEFAULT_PREFIX_BYTES = 1024
DEFAULT_PREFIX_TOKENS = 256
_WHITESPACE = b" \t\n\r\f\v"


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )


def _is_head(message: Any) -> bool:
    if not isinstance(message, dict):
        return False
    if message.get("role") in HEAD_ROLES:
        return True
    name = message.get("name")
    return isinstance(name, str) and name.startswith("example_")


def chat_head(body: dict[str, Any]) -> tuple[list[Any], str]:
    """(the messages that form the key, a description)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return [], "none"
    n = 0
    while n < len(messages) - 1 and _is_head(messages[n]):
        n += 1
    if n:
        return messages[:n], f"head:{n}"
    return messages[:1], "first-message"


def text_cut(text: str, prefix_bytes: int) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > prefix_bytes:
        cut = data[:prefix_bytes]
        at = max(cut.rfind(bytes([c])) for c in _WHITESPACE)
        return cut[:at] if at > 0 else cut
    # The whole prompt is short: drop its last word, which text appended to it could extend.
    at = max(data.rfind(bytes([c])) for c in _WHITESPACE)
    return data[:at] if at > 0 else data


def route_key(
    route: str,
    body: dict[str, Any],
    *,
    prefix_bytes: int = DEFAULT_PREFIX_BYTES,
    prefix_tokens: int = DEFAULT_PREFIX_TOKENS,
) -> tuple[bytes | None, str]:
    """(routing key or None when the request has nothing to key on, what the key covers)."""
    model = body.get("model")
    head = _canonical(model if isinstance(model, str) else None) + b"\x00"
    if route.endswith("/chat/completions"):
        part, what = chat_head(body)
        tools = body.get("tools")
        if not part and not tools:
            return None, "none"
        return head + _canonical([tools or [], part]), what + ("+tools" if tools else "")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # one prompt in a batch of one
    if isinstance(prompt, str) and prompt:
        cut = text_cut(prompt, prefix_bytes)
        return head + cut, f"bytes:{len(cut)}"
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        ids = prompt[:prefix_tokens]
        return head + _canonical(ids), f"tokens:{len(ids)}"
    return None, "none"


def key_digest(key: bytes | None) -> str:
    """A short printable form of a key for the response header and logs (never the prompt itself)."""
    if key is None:
        return "-"
    return hashlib.blake2b(key, digest_size=6).hexdigest()
