"""Request bodies -> engine requests: field-by-field validation with errors that name the field.

OpenAI `/v1/completions`, `/v1/chat/completions` and llama-server's `/completion` share one parser.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..engine.chat_template import RESERVED
from ..engine.sampling import LLAMA_SAMPLERS, SAMPLERS, SamplingParams
from ..wire import (
    DEFAULTS,
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_LLAMA,
    TOKEN_HEALING_ERROR,
    check_token_healing,
    field_default,
)
from .errors import APIError

# Fields a peer server (OpenAI, vLLM, llama-server) honours and this one does not: refused when set to
# anything but their no-op value, never silently ignored.
_UNSUPPORTED = {
    "suffix": lambda v: v not in (None, ""),
    "best_of": lambda v: v not in (None, 1),
    "functions": lambda v: bool(v),
    "function_call": lambda v: v not in (None, "none", "auto"),
    "audio": lambda v: v is not None,
    "modalities": lambda v: v not in (None, ["text"]),
    "prediction": lambda v: v is not None,
    "web_search_options": lambda v: v is not None,
    # vLLM
    "use_beam_search": lambda v: bool(v),
    "length_penalty": lambda v: v not in (None, 1, 1.0),
    "prompt_logprobs": lambda v: v is not None,
    "bad_words": lambda v: bool(v),
    "allowed_token_ids": lambda v: v is not None,
    "truncate_prompt_tokens": lambda v: v is not None,
    "include_stop_str_in_output": lambda v: bool(v),
    "skip_special_tokens": lambda v: v is False,
    "logits_processors": lambda v: bool(v),
    # llama-server
    "mirostat": lambda v: v not in (None, 0),
    "typical_p": lambda v: v not in (None, 1, 1.0),
    "typ_p": lambda v: v not in (None, 1, 1.0),
    "dry_multiplier": lambda v: v not in (None, 0, 0.0),
    "xtc_probability": lambda v: v not in (None, 0, 0.0),
    "top_n_sigma": lambda v: v is not None and v > 0 if isinstance(v, int | float) else v is not None,
    "dynatemp_range": lambda v: v not in (None, 0, 0.0),
    "post_sampling_probs": lambda v: bool(v),
    "lora": lambda v: bool(v),
}

# Fields each route reads or knowingly accepts (OpenAI fields with no effect on a local model: `user`,
# `metadata`, `store`, `service_tier`; llama-server's slot and cache controls, and the parameters of samplers
# that are off). Anything else in a body, a field of another route's dialect included (`n_predict` on
# /v1/completions, `return_token_ids` on /completion), is ignored and named in the
# `x-tokenseam-ignored-fields` response header, so a typo is visible.
_COMMON = frozenset(
    {
        "model", "stream", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "ignore_eos",
        "logit_bias", "presence_penalty", "frequency_penalty", "repetition_penalty", "repeat_penalty",
        "repeat_last_n", "min_tokens", "min_keep", "samplers", "token_healing", "response_format",
        "structured_outputs", "guided_json", "guided_regex", "guided_grammar", "guided_choice",
        "guided_decoding_backend", "grammar", "json_schema", "json_schema_options", "grammar_after_think",
        "cache_prompt", "mirostat_tau", "mirostat_eta", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
        "dry_sequence_breakers", "xtc_threshold", "dynatemp_exponent", "penalize_nl",
        "spaces_between_special_tokens", "priority", "request_id", "prefix_cache",
    }
    | set(_UNSUPPORTED)
)  # fmt: skip
_OPENAI = frozenset(
    {
        "max_tokens", "max_completion_tokens", "stream_options", "logprobs", "top_logprobs", "n",
        "return_token_ids", "stop_token_ids", "echo", "user", "metadata", "store", "service_tier",
    }
)  # fmt: skip
_ACCEPTED = {
    ROUTE_CHAT: _COMMON
    | _OPENAI
    | {
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
    },
    ROUTE_COMPLETIONS: _COMMON | _OPENAI | {"prompt"},
    ROUTE_LLAMA: _COMMON
    | {"prompt", "n_predict", "n_probs", "return_tokens", "id_slot", "n_keep", "n_indent"},
}


IGNORED_HEADER = "x-tokenseam-ignored-fields"


_SHOWN_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def ignored_fields(route: str, body: dict) -> list[str]:
    """Top-level fields of `body` that nothing on `route` reads (sorted); `_`-prefixed test fields are not
    listed. A name that cannot be shown in a header as it is (control characters, commas, very long) is counted
    instead."""
    accepted = _ACCEPTED[route]
    names = [k for k in body if k not in accepted and not k.startswith("_")]
    shown = sorted(k for k in names if _SHOWN_NAME.fullmatch(k))
    if len(shown) < len(names):
        shown.append(f"({len(names) - len(shown)} more with names not shown)")
    return shown


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
    echo: bool = False  # /v1/completions: the prompt (and its logprobs) lead each choice
    batch: bool = False  # /v1/completions with several prompts (answered one sub-request each)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    prefix_cache: bool = False  # report how much of the prompt the prefix cache held, and why not more
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


# Booleans read nowhere else (accepted without effect, or refused when true): a wrong type is still a 400.
_BOOLEANS = (
    "cache_prompt",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "penalize_nl",
    "include_stop_str_in_output",
    "use_beam_search",
    "post_sampling_probs",
    "store",
)


def _check_unsupported(body: dict) -> None:
    for name in _BOOLEANS:
        bool_field(body, name)
    for name, is_set in _UNSUPPORTED.items():
        if name in body:
            try:
                on = is_set(body[name])
            except TypeError:
                on = True
            if on:
                raise bad(f"{name} is not supported by this server", name, code="unsupported_parameter")


def parse_openai(body: dict, route: str) -> ParsedRequest:
    """`/v1/completions` or `/v1/chat/completions`."""
    _check_unsupported(body)
    chat = route == ROUTE_CHAT
    echo = bool_field(body, "echo")
    if echo and chat:
        raise bad(
            "echo is not supported on chat completions (it is on /v1/completions)",
            "echo",
            code="unsupported_parameter",
        )
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        # 0 with echo: score the prompt only (lm-eval-harness's log-likelihood calls)
        max_tokens = _num({"max_tokens": max_tokens}, "max_tokens", None, lo=0 if echo else 1, integer=True)
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
        **_llama_style(body, route),
    )
    if params.top_k == -1:
        params.top_k = 0
    if params.top_p == 0:
        raise bad("top_p must be greater than 0", "top_p")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise bad("stream_options must be an object", "stream_options")
    if so is not None and so.get("include_usage") is not None and not isinstance(so["include_usage"], bool):
        raise bad("stream_options.include_usage must be true or false", "stream_options.include_usage")
    req = ParsedRequest(
        route=route,
        params=params,
        stream=bool_field(body, "stream"),
        include_usage=bool((so or {}).get("include_usage")),
        return_token_ids=bool_field(body, "return_token_ids", field_default(route, "return_token_ids")),
        model=_model(body),
    )
    req.token_healing = _healing(body, route)
    req.prefix_cache = bool_field(body, "prefix_cache", False)
    if echo:
        # The echoed prompt is the prompt as sent: healing would change what its tokens and logprobs are.
        if body.get("token_healing") not in (None, False, 0):
            raise bad(
                "token_healing cannot be combined with echo (echo returns the prompt as sent)",
                "token_healing",
            )
        req.token_healing = False
        req.echo = True
    if chat:
        req.messages = _messages(body)
        req.add_generation_prompt = bool_field(body, "add_generation_prompt", True)
        req.continue_final_message = bool_field(body, "continue_final_message", False)
        if req.continue_final_message and "add_generation_prompt" not in body:
            req.add_generation_prompt = False  # vLLM's rule: continuing implies no new turn
        req.chat_template_kwargs = _template_kwargs(body)
    else:
        batch = batch_prompts(body.get("prompt"))
        req.batch = batch is not None
        req.prompt_text, req.prompt_ids = _prompt(batch[0] if batch else body.get("prompt"), "prompt")
    return req


def parse_llama_completion(body: dict) -> ParsedRequest:
    """llama-server's `/completion`, with llama-server's defaults (`wire.DEFAULTS`)."""
    _check_unsupported(body)
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
        **_llama_style(body, route),
    )
    req = ParsedRequest(
        route=route,
        params=params,
        stream=bool_field(body, "stream"),
        return_token_ids=bool_field(body, "return_tokens", field_default(route, "return_tokens")),
        model=_model(body),
    )
    req.token_healing = _healing(body, route)
    req.prefix_cache = bool_field(body, "prefix_cache", False)
    req.prompt_text, req.prompt_ids = _prompt(body.get("prompt"), "prompt")
    return req


def _llama_style(body: dict, route: str) -> dict[str, Any]:
    """min_tokens, the repetition penalty (vLLM's `repetition_penalty`: every prompt and output token;
    llama-server's `repeat_penalty`: the last `repeat_last_n`, 64 by default), min_keep and the sampler order."""
    llama = route == ROUTE_LLAMA
    out: dict[str, Any] = {"min_tokens": _num(body, "min_tokens", 0, 0, integer=True)}
    rp = _num(body, "repetition_penalty", None, 0, 10)
    lp = _num(body, "repeat_penalty", None, 0, 10)
    if rp is not None and lp is not None and rp != lp:
        raise bad("repetition_penalty and repeat_penalty disagree (send one)", "repeat_penalty")
    penalty = rp if rp is not None else lp
    if penalty is not None:
        if penalty == 0:
            raise bad(
                "the repetition penalty must be greater than 0 (1 is off)",
                "repetition_penalty" if rp is not None else "repeat_penalty",
            )
        out["repetition_penalty"] = float(penalty)
    window = 64 if llama or lp is not None else -1
    out["repeat_last_n"] = _num(body, "repeat_last_n", window, -1, 1 << 20, integer=True)
    out["min_keep"] = _num(body, "min_keep", 0, 0, 1 << 20, integer=True)
    order = body.get("samplers")
    if order is None:
        out["samplers"] = LLAMA_SAMPLERS if llama else SamplingParams.samplers
    else:
        out["samplers"] = _samplers(
            order,
            penalty not in (None, 1)
            or bool(body.get("presence_penalty"))
            or bool(body.get("frequency_penalty")),
        )
    return out


# llama-server sampler names that are no-ops unless their own fields are set (and those fields are refused
# above when set), so a chain that names them is honoured as the chain without them.
_NOOP_SAMPLERS = frozenset({"dry", "typ_p", "xtc", "top_n_sigma"})


def _samplers(order: Any, penalties: bool) -> tuple[str, ...]:
    if not isinstance(order, list) or not all(isinstance(x, str) for x in order):
        raise bad(
            'samplers must be a list of sampler names, such as ["top_k", "top_p", "temperature"]', "samplers"
        )
    known = set(SAMPLERS) | _NOOP_SAMPLERS | {"penalties"}
    for name in order:
        if name not in known:
            raise bad(
                f"samplers: {name!r} is not supported (supported: penalties, {', '.join(SAMPLERS)}; "
                f"{', '.join(sorted(_NOOP_SAMPLERS))} only at their defaults)",
                "samplers",
            )
    if len(set(order)) != len(order):
        raise bad("samplers names a sampler twice", "samplers")
    if penalties and (not order or order[0] != "penalties"):
        raise bad(
            'with a penalty set, samplers must start with "penalties" (penalties apply first)', "samplers"
        )
    return tuple(x for x in order if x in SAMPLERS)


def _template_kwargs(body: dict) -> dict[str, Any]:
    v = body.get("chat_template_kwargs")
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise bad("chat_template_kwargs must be an object of template variables", "chat_template_kwargs")
    for k in v:
        if not k.isidentifier():
            raise bad(f"chat_template_kwargs.{k} is not a template variable name", "chat_template_kwargs")
        if k in RESERVED:
            raise bad(
                f"chat_template_kwargs.{k} is set by the server (use the request field)",
                "chat_template_kwargs",
            )
    return dict(v)


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


MAX_BATCH = 32  # prompts in one /v1/completions request


def _ids(p) -> bool:
    # JSON integers decode as int exactly (bool is its own type): one pass in C over a long prompt
    return isinstance(p, list) and bool(p) and set(map(type, p)) == {int}


def batch_prompts(p) -> list | None:
    """The prompts of a batched `/v1/completions` prompt (a list of strings or of token-id lists, OpenAI's
    form), each to be answered as its own choice(s); None for a single prompt. Raises APIError."""
    if not isinstance(p, list) or not p or _ids(p):
        return None
    if all(isinstance(x, str) for x in p) or all(_ids(x) for x in p):
        if len(p) == 1:
            return None  # one prompt in a list
        if len(p) > MAX_BATCH:
            raise bad(f"prompt holds {len(p)} prompts; at most {MAX_BATCH} in one request", "prompt")
        return list(p)
    for k, x in enumerate(p):
        if not isinstance(x, str) and not _ids(x):
            raise bad(
                f"prompt[{k}] must be a string or a non-empty list of token ids (and all prompts of one kind)",
                f"prompt[{k}]",
            )
    raise bad("a batch of prompts must be all strings or all token-id lists", "prompt")


def _prompt(p, name: str) -> tuple[str | None, list[int] | None]:
    if isinstance(p, str):
        return p, None
    if _ids(p):
        return None, list(p)
    if isinstance(p, list) and len(p) == 1 and (isinstance(p[0], str) or _ids(p[0])):
        return _prompt(p[0], name)
    if isinstance(p, list) and len(p) > 1 and batch_prompts(p) is not None:
        raise bad("several prompts in one request are taken on /v1/completions; send one prompt here", name)
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
