"""The wire contract the server, the gateway and the response cache share: routes, per-route field defaults,
the `token_healing` rule, the error object, and how a server-sent event is framed.

Imports nothing else of tokenseam, so both may import it. `DEFAULTS[route][field]` is `(mode, default)`: the
default is what the server assumes when the field is absent or null (a tuple lists equivalent values, the
first is the one the server uses). `mode` is the cache's: a `FILL` default is always written into the request
the cache generates (so every upstream samples with it, whatever its own default); a `DROP` default is removed
when the value equals it (extension fields some upstreams reject). Fields the server does not read are here
for the upstreams the cache gateway forwards to.
"""

from __future__ import annotations

import json
from typing import Any

ROUTE_CHAT = "/v1/chat/completions"
ROUTE_COMPLETIONS = "/v1/completions"
ROUTE_LLAMA = "/completion"
ROUTES = (ROUTE_CHAT, ROUTE_COMPLETIONS, ROUTE_LLAMA)

FILL = "fill"
DROP = "drop"

DEFAULTS: dict[str, dict[str, tuple[str, Any]]] = {
    ROUTE_CHAT: {
        "temperature": (FILL, 1),
        "top_p": (FILL, 1),
        "n": (FILL, 1),
        "presence_penalty": (FILL, 0),
        "frequency_penalty": (FILL, 0),
        "logprobs": (DROP, False),
        "top_logprobs": (DROP, 0),
        "top_k": (DROP, (0, -1)),
        "min_p": (DROP, 0),
        "repetition_penalty": (DROP, 1),
        "response_format": (DROP, {"type": "text"}),
        "parallel_tool_calls": (DROP, True),
        "logit_bias": (DROP, {}),
        "stop": (DROP, []),
        "echo": (DROP, False),
        "ignore_eos": (DROP, False),
        "token_healing": (DROP, False),
        "return_token_ids": (DROP, False),
        "json_schema_options": (DROP, {}),
    },
    ROUTE_COMPLETIONS: {
        "temperature": (FILL, 1),
        "top_p": (FILL, 1),
        "n": (FILL, 1),
        "presence_penalty": (FILL, 0),
        "frequency_penalty": (FILL, 0),
        "max_tokens": (FILL, 16),  # the OpenAI completions default
        "echo": (DROP, False),
        "best_of": (DROP, 1),
        "logprobs": (DROP, None),  # absent or null: no logprobs; 0 asks for the sampled tokens' own
        "suffix": (DROP, ""),
        "top_k": (DROP, (0, -1)),
        "min_p": (DROP, 0),
        "repetition_penalty": (DROP, 1),
        "logit_bias": (DROP, {}),
        "stop": (DROP, []),
        "ignore_eos": (DROP, False),
        "token_healing": (DROP, True),  # healing is on by default for raw prompts
        "return_token_ids": (DROP, False),
        "json_schema_options": (DROP, {}),
    },
    ROUTE_LLAMA: {  # llama-server's own defaults
        "temperature": (FILL, 0.8),
        "top_k": (FILL, 40),
        "top_p": (FILL, 0.95),
        "min_p": (FILL, 0.05),
        "n_predict": (FILL, -1),
        "seed": (DROP, (-1, 0xFFFFFFFF)),  # "random"
        "typical_p": (DROP, 1),
        "repeat_penalty": (DROP, 1),
        "repeat_last_n": (DROP, 64),
        "presence_penalty": (DROP, 0),
        "frequency_penalty": (DROP, 0),
        "mirostat": (DROP, 0),
        "n_probs": (DROP, 0),
        "n_keep": (DROP, 0),
        "ignore_eos": (DROP, False),
        "return_tokens": (DROP, False),
        "post_sampling_probs": (DROP, False),
        "dry_multiplier": (DROP, 0),
        "xtc_probability": (DROP, 0),
        "logit_bias": (DROP, []),
        "stop": (DROP, []),
        "grammar": (DROP, ""),
        "token_healing": (DROP, True),  # healing is on by default for raw prompts
        "return_token_ids": (DROP, False),
        "json_schema_options": (DROP, {}),
    },
}


def field_default(route: str, name: str) -> Any:
    """The value a request on `route` gets for field `name` when it is absent (KeyError if the table has none)."""
    value = DEFAULTS[route][name][1]
    return value[0] if isinstance(value, tuple) else value


# The per-request argument tokenseam's vLLM healing processor reads (`vllm_xargs`): hex of the removed bytes.
# Here because the gateway sends it and the vLLM adapter reads it.
VLLM_HEALING_KEY = "tokenseam_healing"

# `token_healing`: true, false, or at most how many prompt tokens to roll back.
TOKEN_HEALING_MAX = 16
TOKEN_HEALING_ERROR = f"token_healing must be true, false or a number of tokens from 0 to {TOKEN_HEALING_MAX}"


def check_token_healing(value: object, route_default: bool) -> bool | int:
    """`token_healing` as sent (null: `route_default`). Raises ValueError(TOKEN_HEALING_ERROR) for any other value."""
    if value is None:
        return route_default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and 0 <= value <= TOKEN_HEALING_MAX:
        return value
    raise ValueError(TOKEN_HEALING_ERROR)


# A server-sent event is `data: <compact JSON>` (or the literal `data: [DONE]`) and a blank line; UTF-8, no
# ASCII escaping. `respcache.entry.SSEParser` reads what this writes.
def sse(obj: Any) -> bytes:
    """One SSE event: `obj` as compact JSON, except the literal string `[DONE]` (the OpenAI stream's end)."""
    if obj == "[DONE]":
        return b"data: [DONE]\n\n"
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    """The OpenAI error object every tokenseam app answers with: `{"error": {message, type, param, code}}`."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
