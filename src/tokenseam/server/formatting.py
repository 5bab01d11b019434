"""The wire formats: response and SSE chunk shapes of OpenAI chat, OpenAI completions and llama-server
`/completion`, one `Formatter` subclass each (`FORMATTERS` maps a route to its class), and their shared pieces.

ID-exact rules: every chunk carries the ids generated since the previous chunk; the last chunk of a choice
carries `all_token_ids` (OpenAI routes, with return_token_ids) or `all_tokens` (/completion).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from ..engine.sampling import TokenLogprob
from ..engine.sequence import ChoiceEvent, RequestDone
from ..toolcalls import held_back, split_output
from ..vocab import Vocabulary
from ..wire import sse

if TYPE_CHECKING:
    from .prepare import Prepared
    from .protocol import ParsedRequest
    from .state import ServerState


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

    return {
        "content": [
            {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]} for lp in lps
        ]
    }


def completion_logprobs(vocab: Vocabulary, lps: list[TokenLogprob], offset0: int, prev_bytes: bytes) -> dict:
    """Legacy completions format, plus `token_bytes` (raw bytes of each entry: one entry per token)."""
    toks, lpv, tops, offs, raw = [], [], [], [], []
    acc = bytearray(prev_bytes)
    for lp in lps:
        offs.append(
            offset0 + len(acc.decode("utf-8", errors="ignore")) - len(prev_bytes.decode("utf-8", "ignore"))
        )
        b = vocab.token_bytes[lp.token_id] if not vocab.is_special[lp.token_id] else b""
        acc += b
        toks.append(token_str(vocab, lp.token_id))
        lpv.append(lp.logprob)
        tops.append({token_str(vocab, t): v for t, v in lp.top})
        raw.append(list(vocab.token_bytes[lp.token_id]))
    return {
        "tokens": toks,
        "token_logprobs": lpv,
        "top_logprobs": tops,
        "text_offset": offs,
        "token_bytes": raw,
    }


def llama_probs(vocab: Vocabulary, lps: list[TokenLogprob]) -> list[dict]:
    def entry(tid: int, lp: float) -> dict:
        return {
            "id": tid,
            "token": token_str(vocab, tid),
            "bytes": list(vocab.token_bytes[tid]),
            "logprob": lp,
        }

    return [
        {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]} for lp in lps
    ]


def usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


# ---------------------------------------------------------------------------------------------- formatters
class Formatter:
    """Accumulates one request's events and renders them in one wire format (a subclass per format).

    `absorb` records events; `final_response` is the non-streamed body; `opening_chunks`, `stream_chunks` and
    `closing_chunks` are the SSE events before, during and after generation."""

    route: ClassVar[str]
    id_prefix: ClassVar[str] = "cmpl-"

    def __init__(self, state: ServerState, parsed: ParsedRequest, prep: Prepared, rid: str) -> None:
        self.state = state
        self.vocab = state.vocab
        self.p = parsed
        self.prep = prep
        self.rid = rid
        self.created = int(time.time())
        self.choices = [ChoiceState(i) for i in range(parsed.params.n)]
        self.done: RequestDone | None = None
        self._reported = False

    def absorb(self, evs: list) -> list[tuple[ChoiceEvent, bytes]]:
        """Record events; return (event, bytes generated before it) for the streaming formatter."""
        out = []
        for e in evs:
            if isinstance(e, RequestDone):
                self.done = e
                continue
            c = self.choices[e.index]
            prev = self._track_bytes(c, e)
            c.token_ids += e.token_ids
            c.text += e.text
            c.logprobs += e.logprobs
            if e.finish_reason:
                c.finish_reason = e.finish_reason
                c.stop_string = e.stop_string
            out.append((e, prev))
        return out

    def _track_bytes(self, c: ChoiceState, e: ChoiceEvent) -> bytes:
        """The choice's bytes before `e`, for formats whose logprobs need text offsets (else b"")."""
        return b""

    def _take_report(self) -> dict | None:
        """The extension fields (healing, grammar warnings) the first streamed chunk carries; None later."""
        report = self.prep.report() if not self._reported else None
        self._reported = True
        return report

    def final_response(self) -> dict:
        raise NotImplementedError

    def opening_chunks(self) -> list[bytes]:
        return []

    def stream_chunks(self, evs: list) -> list[bytes]:
        raise NotImplementedError

    def closing_chunks(self) -> list[bytes]:
        return []


class OpenAIFormatter(Formatter):
    """What OpenAI's chat and completions formats share: the envelope, usage, the closing `[DONE]`."""

    object_name: ClassVar[str]
    chunk_object_name: ClassVar[str]

    @staticmethod
    def _finish(c: ChoiceState) -> str | None:
        return None if c.finish_reason == "abort" else c.finish_reason

    def _usage(self) -> dict:
        d = self.done
        return usage(d.prompt_tokens, sum(len(c.token_ids) for c in self.choices), d.cached_tokens)

    def _final_choice(self, c: ChoiceState) -> dict:
        """One choice of the non-streamed body, from its `index` and `finish_reason` on."""
        raise NotImplementedError

    def _stream_choice(self, e: ChoiceEvent, c: ChoiceState, prev: bytes, last: bool) -> dict:
        """One event's choice object, from its `index` and `finish_reason` on."""
        raise NotImplementedError

    def final_response(self) -> dict:
        choices = []
        for c in self.choices:
            ch = self._final_choice(c)
            if self.p.return_token_ids:
                ch["token_ids"] = c.token_ids
            choices.append(ch)
        out = {
            "id": self.rid,
            "object": self.object_name,
            "created": self.created,
            "model": self.state.model_id,
            "system_fingerprint": self.state.system_fingerprint,
            "choices": choices,
            "usage": self._usage(),
        }
        out.update(self.prep.report())
        return out

    def _chunk(self, choices: list[dict]) -> dict:
        return {
            "id": self.rid,
            "object": self.chunk_object_name,
            "created": self.created,
            "model": self.state.model_id,
            "system_fingerprint": self.state.system_fingerprint,
            "choices": choices,
        }

    def stream_chunks(self, evs: list) -> list[bytes]:
        out = []
        report = self._take_report()
        for e, prev in self.absorb(evs):
            c = self.choices[e.index]
            last = e.finish_reason is not None
            ch = self._stream_choice(e, c, prev, last)
            if self.p.return_token_ids:
                ch["token_ids"] = e.token_ids
                if last:
                    ch["all_token_ids"] = c.token_ids
            chunk = self._chunk([ch])
            if report:  # what healing removed from the prompt, grammar warnings: once, on the first chunk
                chunk.update(report)
                report = None
            out.append(sse(chunk))
        return out

    def closing_chunks(self) -> list[bytes]:
        out = []
        if self.p.include_usage:
            u = self._chunk([])
            u["usage"] = self._usage()
            out.append(sse(u))
        out.append(sse("[DONE]"))
        return out


class ChatFormatter(OpenAIFormatter):
    """`/v1/chat/completions`: messages and deltas, forced tool calls, chat logprobs, a role chunk first."""

    route = "/v1/chat/completions"
    id_prefix = "chatcmpl-"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._sent: dict[
            int, list[int]
        ] = {}  # per choice, for tool answers: [content characters, calls] sent

    def _call(self, c: ChoiceState, k: int, name: str, arguments: str) -> dict:
        return {
            "id": f"call_{self.rid[-12:]}_{c.index}_{k}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    def _tool_calls(self, c: ChoiceState) -> tuple[str | None, list[dict]] | None:
        """(content, tool_calls) when the answer is complete calls (after its text, if any); else None (no
        tools, no call, or the output ran out inside one: then the text is the answer, nothing is lost)."""
        if self.prep.tool_call is None or c.finish_reason != "stop":
            return None
        split = split_output(c.text)
        if not split.is_tool_answer:
            return None
        calls = [self._call(c, k, name, args) for k, (name, args, _) in enumerate(split.calls)]
        return (split.content if split.content.strip() else None), calls

    def _tool_delta(self, c: ChoiceState, last: bool) -> dict:
        """The delta of a streamed answer that may hold calls: its text as content deltas, except what may be
        the start of a call (held until the next text decides) and layout before a call; each call whole,
        once it has closed. An answer that ends without being complete calls sends the rest of its text as
        content: every character of the output reaches the client once."""
        sent = self._sent.setdefault(c.index, [0, 0])  # [characters of c.text represented, calls sent]
        split = split_output(c.text)
        delta: dict = {}
        content = []
        if split.calls or split.rest:  # a call has started: the content before it is final
            head = split.content
        else:
            head = c.text if last else c.text[: len(c.text) - held_back(c.text)]
        if sent[0] < len(head) and (head.strip() or (last and not split.calls)):
            content.append(head[sent[0] :])
            sent[0] = len(head)
        calls = []
        for k, (name, args, end) in enumerate(split.calls):
            if k >= sent[1]:
                calls.append({"index": k, **self._call(c, k, name, args)})
                sent[0], sent[1] = end, k + 1
        if last and self._tool_calls(c) is None and sent[0] < len(c.text):
            content.append(c.text[sent[0] :])
            sent[0] = len(c.text)
        if content:
            delta["content"] = "".join(content)
        if calls:
            delta["tool_calls"] = calls
        return delta

    def _logprobs(self, lps: list[TokenLogprob]) -> dict | None:
        return chat_logprobs(self.vocab, lps) if self.p.params.logprobs else None

    def _final_choice(self, c: ChoiceState) -> dict:
        ch: dict = {"index": c.index, "finish_reason": self._finish(c)}
        found = self._tool_calls(c)
        if found is not None:
            ch["message"] = {"role": "assistant", "content": found[0], "tool_calls": found[1]}
            ch["finish_reason"] = "tool_calls"
        else:
            ch["message"] = {"role": "assistant", "content": c.text}
        ch["logprobs"] = self._logprobs(c.logprobs)
        return ch

    def opening_chunks(self) -> list[bytes]:
        return [
            sse(
                self._chunk(
                    [
                        {
                            "index": c.index,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ]
                )
            )
            for c in self.choices
        ]

    def _stream_choice(self, e: ChoiceEvent, c: ChoiceState, prev: bytes, last: bool) -> dict:
        ch: dict = {"index": e.index, "finish_reason": self._finish(c) if last else None}
        if self.prep.tool_call is not None:
            ch["delta"] = self._tool_delta(c, last)
            if last and self._tool_calls(c) is not None:
                ch["finish_reason"] = "tool_calls"
        else:
            ch["delta"] = {"content": e.text} if e.text or not last else {}
        ch["logprobs"] = self._logprobs(e.logprobs)
        return ch


class CompletionsFormatter(OpenAIFormatter):
    """`/v1/completions`: text choices and legacy logprobs (with text offsets and token bytes)."""

    route = "/v1/completions"
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def _track_bytes(self, c: ChoiceState, e: ChoiceEvent) -> bytes:
        if not self.p.params.logprobs:
            return b""
        prev = bytes(c.raw)
        c.raw += self.vocab.decode_bytes(e.token_ids)
        return prev

    def _final_choice(self, c: ChoiceState) -> dict:
        lp = completion_logprobs(self.vocab, c.logprobs, 0, b"") if self.p.params.logprobs else None
        return {"index": c.index, "finish_reason": self._finish(c), "text": c.text, "logprobs": lp}

    def _stream_choice(self, e: ChoiceEvent, c: ChoiceState, prev: bytes, last: bool) -> dict:
        lp = (
            completion_logprobs(self.vocab, e.logprobs, len(c.text) - len(e.text), prev)
            if self.p.params.logprobs
            else None
        )
        return {
            "index": e.index,
            "finish_reason": self._finish(c) if last else None,
            "text": e.text,
            "logprobs": lp,
        }


class LlamaFormatter(Formatter):
    """llama-server's `/completion`: one choice, `content` and `stop_type`, no envelope and no `[DONE]`."""

    route = "/completion"

    def final_response(self) -> dict:
        c = self.choices[0]
        d = self.done
        stop_type = {"length": "limit", "stop": "word" if c.stop_string else "eos"}.get(
            c.finish_reason or "", "none"
        )
        out = {
            "index": 0,
            "content": c.text,
            "id_slot": -1,
            "stop": True,
            "model": self.state.model_id,
            "tokens_predicted": len(c.token_ids),
            "tokens_evaluated": d.prompt_tokens,
            "tokens_cached": d.cached_tokens,
            "stop_type": stop_type,
            "stopping_word": c.stop_string or "",
            "truncated": False,
        }
        if self.p.return_token_ids:
            out["tokens"] = c.token_ids
        if self.p.params.logprobs:
            out["completion_probabilities"] = llama_probs(self.vocab, c.logprobs)
        out.update(self.prep.report())
        return out

    def stream_chunks(self, evs: list) -> list[bytes]:
        out = []
        report = self._take_report()
        for e, _ in self.absorb(evs):
            c = self.choices[e.index]
            obj = {"index": 0, "content": e.text, "tokens": e.token_ids, "stop": False, "id_slot": -1}
            if self.p.params.logprobs:
                obj["completion_probabilities"] = llama_probs(self.vocab, e.logprobs)
            if e.finish_reason is not None:
                obj.update(self.final_response())
                obj["content"] = e.text
                obj["tokens"] = e.token_ids
                obj["all_tokens"] = c.token_ids
            if report:
                obj.update(report)
                report = None
            out.append(sse(obj))
        return out


FORMATTERS: dict[str, type[Formatter]] = {
    f.route: f for f in (ChatFormatter, CompletionsFormatter, LlamaFormatter)
}
