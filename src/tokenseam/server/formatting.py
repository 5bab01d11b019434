"""Response and SSE chunk shapes: OpenAI chat/completions and llama-server `/completion`.

ID-exact rules: every chunk carries the ids generated since the previous chunk; the last chunk of a choice
carries `all_token_ids` (OpenAI routes, with return_token_ids) or `all_tokens` (/completion).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..engine.sampling import TokenLogprob
from ..vocab import Vocabulary


def token_str(vocab: Vocabulary, tid: int) -> str:
    """A token's text, or `bytes:\\xNN...` when its bytes are not valid UTF-8 on their own (as OpenAI does)."""
    b = vocab.token_bytes[tid]
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{x:02x}" for x in b)


@dataclass
class ChoiceState:
    index: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_string: str | None = None
    raw: bytearray = field(default_factory=bytearray)  # bytes of token_ids (for legacy logprob text offsets)


def chat_logprobs(vocab: Vocabulary, lps: list[TokenLogprob]) -> dict:
    def entry(tid: int, lp: float) -> dict:
        return {"token": token_str(vocab, tid), "logprob": lp, "bytes": list(vocab.token_bytes[tid])}

    return {"content": [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                        for lp in lps]}


def completion_logprobs(vocab: Vocabulary, lps: list[TokenLogprob], offset0: int, prev_bytes: bytes) -> dict:
    """Legacy completions format, plus `token_bytes` (raw bytes of each entry: one entry per token)."""
    toks, lpv, tops, offs, raw = [], [], [], [], []
    acc = bytearray(prev_bytes)
    for lp in lps:
        offs.append(offset0 + len(acc.decode("utf-8", errors="ignore")) - len(prev_bytes.decode("utf-8", "ignore")))
        b = vocab.token_bytes[lp.token_id] if not vocab.is_special[lp.token_id] else b""
        acc += b
        toks.append(token_str(vocab, lp.token_id))
        lpv.append(lp.logprob)
        tops.append({token_str(vocab, t): v for t, v in lp.top})
        raw.append(list(vocab.token_bytes[lp.token_id]))
    return {"tokens": toks, "token_logprobs": lpv, "top_logprobs": tops, "text_offset": offs, "token_bytes": raw}


def llama_probs(vocab: Vocabulary, lps: list[TokenLogprob]) -> list[dict]:
    def entry(tid: int, lp: float) -> dict:
        return {"id": tid, "token": token_str(vocab, tid), "bytes": list(vocab.token_bytes[tid]), "logprob": lp}

    return [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]} for lp in lps]


def usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached}}


def sse(obj: dict | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
