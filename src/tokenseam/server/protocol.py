"""Request bodies -> engine requests: field-by-field validation with errors that name the field.

OpenAI `/v1/completions`, `/v1/chat/completions` and llama-server's `/completion` share one parser.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..engine.sampling import SamplingParams
from ..wire import DEFAULTS, ROUTE_CHAT, ROUTE_LLAMA, TOKEN_HEALING_ERROR, check_token_healing, field_default
from .errors import APIError

# Fields we know and refuse rather than silently ignore.
_UNSUPPORTED = {
    "echo": lambda v: bool(v),
    "suffix": lambda v: v not in (None, ""),
    "best_of": lambda v: v not in (None, 1),
    "functions": lambda v: bool(v),
    "function_call": lambda v: v not in (None, "none", "auto"),
    "audio": lambda v: v is not None,
    "modalities": lambda v: v not in (None, ["text"]),
    "prediction": lambda v: v is not None,
    "web_search_options": lambda v: v is not None,
}


def bad(msg: str, param: str | None = None, status: int = 400, code: str | None = None) -> APIError:
    return APIError(status, msg, param=param, code=code)


@dataclass
class ParsedRequest:
    route: str
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False
    prompt_text: str | None = None
    prompt_ids: list[int] | None = None
    messages: list[dict] | None = None
    model: str | None = None
    token_healing: bool | int = False
    extra: dict[str, Any] = field(default_factory=dict)


def _num(body: dict, name: str, default, lo=None, hi=None, integer=False, allow_none=True):
    v = body.get(name, default)
    if v is None:
        if allow_none:
            return default
        raise bad(f"{name} must not be null", name)
    if (
        isinstance(v, bool)
        or not isinstance(v, int | float)
        or (isinstance(v, float) and not math.isfinite(v))
    ):
        raise bad(f"{name} must be a {'integer' if integer else 'number'}, got {v!r}", name)
    if integer:
        if isinstance(v, float):
            if not v.is_integer():
                raise bad(f"{name} must be an integer, got {v!r}", name)
            v = int(v)
    if lo is not None and v < lo:
        raise bad(f"{name} must be >= {lo}, got {v!r}", name)
    if hi is not None and v > hi:
        raise bad(f"{name} must be <= {hi}, got {v!r}", name)
    return v


def bool_field(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"{name} must be true or false, got {v!r}", name)
    return v


def _stop(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise bad("stop must be a string or a list of strings", "stop")
    if len(v) > 16:
        raise bad("stop accepts at most 16 strings", "stop")
    return [s for s in dict.fromkeys(v) if s]


def _logit_bias(body: dict) -> dict[int, float]:
    v = body.get("logit_bias")
    if v is None:
        return {}
    out: dict[int, float] = {}
    if isinstance(v, dict):
        items = v.items()
    elif isinstance(v, list):  # llama-server: [[id, bias], ...]; false means "never"
        items = []
        for pair in v:
            if not isinstance(pair, list) or len(pair) != 2:
                raise bad("logit_bias list entries must be [token_id, bias]", "logit_bias")
            items.append((pair[0], -100 if pair[1] is False else pair[1]))
    else:
        raise bad("logit_bias must be an object mapping token ids to biases", "logit_bias")
    for k, b in items:
        try:
            tid = int(k)
        except (TypeError, ValueError):
            raise bad(f"logit_bias key {k!r} is not a token id", "logit_bias") from None
        if isinstance(b, bool) or not isinstance(b, int | float) or not math.isfinite(b):
            raise bad(f"logit_bias value for {k!r} must be a number", "logit_bias")
        out[tid] = float(b)
    return out


def _check_unsupported(body: dict) -> None:
    for name, is_set in _UNSUPPORTED.items():
        if name in body and is_set(body[name]):
            raise bad(f"{name} is not supported by this server", name, code="unsupported_parameter")


def parse_openai(body: dict, route: str) -> ParsedRequest:
    """`/v1/completions` or `/v1/chat/completions`."""
    _check_unsupported(body)
    chat = route == ROUTE_CHAT
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        max_tokens = _num({"max_tokens": max_tokens}, "max_tokens", None, lo=1, integer=True)
    elif not chat:
        max_tokens = field_default(route, "max_tokens")
    logprobs = body.get("logprobs")
    top_logprobs = 0
    if chat:
        want_lp = bool_field(body, "logprobs", field_default(route, "logprobs"))
        top_logprobs = _num(body, "top_logprobs", field_default(route, "top_logprobs"), 0, 20, integer=True)
        if top_logprobs and not want_lp:
            raise bad("top_logprobs requires logprobs: true", "top_logprobs")
    else:
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)):
            raise bad("logprobs must be an integer from 0 to 20 on /v1/completions", "logprobs")
        want_lp = logprobs is not None
        top_logprobs = _num(body, "logprobs", 0, 0, 20, integer=True)  # alternatives per token
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=_num(body, "temperature", _float(route, "temperature"), 0, 2),
        top_p=_num(body, "top_p", _float(route, "top_p"), 0, 1),
        top_k=_num(body, "top_k", field_default(route, "top_k"), -1, integer=True),
        min_p=_num(body, "min_p", _float(route, "min_p"), 0, 1),
        seed=_num(body, "seed", None, integer=True),
        stop=_stop(body),
        stop_token_ids=_int_list(body, "stop_token_ids"),
        ignore_eos=bool_field(body, "ignore_eos", field_default(route, "ignore_eos")),
        logit_bias=_logit_bias(body),
        presence_penalty=_num(body, "presence_penalty", _float(route, "presence_penalty"), -2, 2),
        frequency_penalty=_num(body, "frequency_penalty", _float(route, "frequency_penalty"), -2, 2),
        n=_num(body, "n", field_default(route, "n"), 1, 16, integer=True),
        logprobs=want_lp,
        top_logprobs=top_logprobs,
    )
    if params.top_k == -1:
        params.top_k = 0
    if params.top_p == 0:
        raise bad("top_p must be greater than 0", "top_p")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise bad("stream_options must be an object", "stream_options")
    req = ParsedRequest(
        route=route,
        params=params,
        stream=bool_field(body, "stream"),
        include_usage=bool((so or {}).get("include_usage")),
        return_token_ids=bool_field(body, "return_token_ids", field_default(route, "return_token_ids")),
        model=_model(body),
    )
    req.token_healing = _healing(body, route)
    if chat:
        req.messages = _messages(body)
    else:
        req.prompt_text, req.prompt_ids = _prompt(body.get("prompt"), "prompt")
    return req


def parse_llama_completion(body: dict) -> ParsedRequest:
    """llama-server's `/completion`, with llama-server's defaults (`wire.DEFAULTS`)."""
    route = ROUTE_LLAMA
    n_predict = _num(body, "n_predict", field_default(route, "n_predict"), integer=True)
    if n_predict == 0 or n_predict < -1:
        raise bad("n_predict must be -1 (until the end) or a positive integer", "n_predict")
    n_probs = _num(body, "n_probs", field_default(route, "n_probs"), 0, 20, integer=True)
    params = SamplingParams(
        max_tokens=None if n_predict == -1 else n_predict,
        # llama-server: temperature <= 0 means greedy
        temperature=max(0.0, _num(body, "temperature", _float(route, "temperature"), -100, 100)),
        top_p=_num(body, "top_p", _float(route, "top_p"), 0, 1) or 1.0,
        top_k=max(0, _num(body, "top_k", field_default(route, "top_k"), -1, integer=True)),
        min_p=_num(body, "min_p", _float(route, "min_p"), 0, 1),
        seed=_seed(body.get("seed")),
        stop=_stop(body),
        ignore_eos=bool_field(body, "ignore_eos", field_default(route, "ignore_eos")),
        logit_bias=_logit_bias(body),
        presence_penalty=_num(body, "presence_penalty", _float(route, "presence_penalty"), -2, 2),
        frequency_penalty=_num(body, "frequency_penalty", _float(route, "frequency_penalty"), -2, 2),
        logprobs=n_probs > 0,
        top_logprobs=n_probs,
    )
    req = ParsedRequest(
        route=route,
        params=params,
        stream=bool_field(body, "stream"),
        return_token_ids=bool_field(body, "return_tokens", field_default(route, "return_tokens")),
        model=_model(body),
    )
    req.token_healing = _healing(body, route)
    req.prompt_text, req.prompt_ids = _prompt(body.get("prompt"), "prompt")
    return req


def _seed(v):
    if v is None or v in DEFAULTS[ROUTE_LLAMA]["seed"][1]:  # llama-server's "random"
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(f"seed must be an integer, got {v!r}", "seed")
    return v


def _float(route: str, name: str) -> float:
    return float(field_default(route, name))


def _healing(body: dict, route: str) -> bool | int:
    try:
        return check_token_healing(body.get("token_healing"), field_default(route, "token_healing"))
    except ValueError:
        raise bad(TOKEN_HEALING_ERROR, "token_healing") from None


def _model(body: dict) -> str | None:
    m = body.get("model")
    if m is not None and not isinstance(m, str):
        raise bad("model must be a string", "model")
    return m


def _int_list(body: dict, name: str) -> list[int]:
    v = body.get(name)
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        raise bad(f"{name} must be a list of integers", name)
    return v


def _prompt(p, name: str) -> tuple[str | None, list[int] | None]:
    if isinstance(p, str):
        return p, None
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return None, list(p)
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        return p[0], None
    if isinstance(p, list) and len(p) > 1:
        raise bad(
            "batched prompts (a list of several prompts) are not supported; send one request each", name
        )
    if p is None:
        raise bad(f"{name} is required", name)
    raise bad(f"{name} must be a string or a list of token ids", name)


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{where} must be an object", where)
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise bad(f"{where}.role must be system, developer, user, assistant or tool; got {role!r}", where)
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if (
                    not isinstance(part, dict)
                    or part.get("type") != "text"
                    or not isinstance(part.get("text"), str)
                ):
                    raise bad(f"{where}.content[{j}]: only text parts are supported", where)
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None:
            if role != "assistant" or not m.get("tool_calls"):
                raise bad(f"{where}.content is required", where)
            content = ""
        elif not isinstance(content, str):
            raise bad(f"{where}.content must be a string or a list of text parts", where)
        msg = {"role": "system" if role == "developer" else role, "content": content}
        for k in ("name", "tool_calls", "tool_call_id"):
            if k in m:
                msg[k] = m[k]
        out.append(msg)
    return out
