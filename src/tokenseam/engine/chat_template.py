"""Chat prompts: render the GGUF's `tokenizer.chat_template` with jinja2 as Hugging Face does, then tokenize
so that special-token text inside user messages stays plain text (no prompt injection of `<|im_end|>`).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..chat_formats import BUILT_IN, fallback_template
from ..toolcalls import ToolFormatError, native_tools, render_messages
from ..vocab import Tokenizer, Vocabulary
from .errors import InvalidRequestError
from .turn_memory import Answer, TurnMemory

_MARK = "\x00tokenseam-content-{}\x00"
_END = "\x00tokenseam-final-end\x00"  # marks where the final message's content ends (continue_final_message)
# Template variables a request's chat_template_kwargs may not set: the ones the server renders with.
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})
# The window around an answer's end that decides how much of it the text after it may re-tokenize.
SEAM_TOKENS = 8
SEAM_BYTES = 64
# Assistant contents a prompt may hold that its rendered text does not show (a template that rewrites them), or
# further occurrences of a content looked at: past this many, the rest of the prompt is tokenized as usual (each
# one costs a scan of the text).
MAX_UNFOUND = 8


@dataclass(frozen=True)
class SplicedAnswer:
    """An earlier answer given back as its generated ids: `n_ids` ids for the prompt's bytes [start, end);
    `cut`: the client changed or shortened the answer (or text follows it), so only its first ids came back
    and the rest was re-tokenized."""

    start: int
    end: int
    n_ids: int
    cut: bool


@dataclass
class EncodedPrompt:
    ids: list[int]
    text: str | None  # the rendered prompt a new answer is remembered under; None: not rememberable
    spliced: list[SplicedAnswer] = field(default_factory=list)


class ChatTemplate:
    def __init__(self, template: str | None, vocab: Vocabulary, tokenizer: Tokenizer) -> None:
        """`template`: the GGUF's (or the server's --chat-template); None: the built-in one that
        `fallback_template` picks for the vocabulary, whose name `builtin` then holds."""
        self.builtin = None if template else fallback_template(vocab)
        self.source = template or BUILT_IN[self.builtin]
        self._tmpl = _environment().from_string(self.source)
        self.vocab = vocab
        self.tokenizer = tokenizer
        control = {
            vocab.token_text[i] for i in range(vocab.size) if vocab.is_special[i] and vocab.token_text[i]
        }
        # A SentencePiece vocabulary's tag-like tokens that are not control tokens (Gemma's `<b>`, `<td>`): the
        # tokenizer takes them whole wherever they occur, so nothing merges across them, but message text that
        # holds them tokenizes the same with or without special parsing (nothing to guard).
        tags = {
            t
            for t in vocab.token_text
            if vocab.kind == "llama"
            and len(t) > 2
            and t[0] == "<"
            and t[-1] == ">"
            and not t.startswith("<0x")
        }

        def alternation(texts: set[str]) -> re.Pattern | None:
            return (
                re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True)))
                if texts
                else None
            )

        # Text that becomes a control token only when special tokens are parsed: a message holding it is
        # tokenized as plain text (no prompt injection of `<|im_end|>`).
        self._control_re = alternation(control)
        # Text the tokenizer always takes as one token (control tokens, as the template writes them, and tags).
        self._special_re = alternation(control | tags)
        bos = vocab.token_text[vocab.bos_token_id] if vocab.bos_token_id is not None else ""
        eos_id = min(vocab.eos_token_ids) if vocab.eos_token_ids else None
        self._vars = {"bos_token": bos, "eos_token": vocab.token_text[eos_id] if eos_id is not None else ""}
        # Thinking models open a <think> block in the generation prompt.
        self.is_thinking = "<think>" in self.source
        # Whether the template renders `tools` in tokenseam's call format itself (else: toolcalls' fallback).
        self.native_tools = native_tools(self.source)

    @functools.cached_property
    def turn_end_id(self) -> int | None:
        """The special token the template writes right after an assistant message's text (ChatML's
        `<|im_end|>`, Gemma's `<end_of_turn>`), or None when it writes no such token there (ChatML on a
        vocabulary without `<|im_end|>`, a template that rejects the probe)."""
        answer = "Quartz answer 7"
        probe = [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "Ok"},
        ]
        try:
            text = self.render(probe, add_generation_prompt=False)
        except InvalidRequestError:
            return None
        at = text.find(answer)
        found = self._control_re.match(text, at + len(answer)) if at >= 0 and self._control_re else None
        if found is None:
            return None
        ids = self.tokenizer.encode(found.group(0), add_special=False, parse_special=True)
        return ids[0] if len(ids) == 1 and self.vocab.is_special[ids[0]] else None

    def render(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list | None = None, **extra
    ) -> str:
        try:
            return self._tmpl.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                **self._vars,
                **extra,
            )
        except TemplateError as e:
            raise InvalidRequestError(
                f"the model's chat template rejected these messages: {e}", "messages"
            ) from e

    def encode(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list | None = None,
        *,
        continue_final: bool = False,
        kwargs: dict | None = None,
    ) -> list[int]:
        """Token ids of the rendered prompt. Template text may contain special tokens; message text may not.
        Tools, earlier calls and tool results are rendered as `toolcalls.render_messages` says.
        `continue_final`: the prompt ends right after the final message's content (no end of turn), so the
        model continues that message. `kwargs`: extra template variables (chat_template_kwargs)."""
        return self.encode_prompt(
            messages, add_generation_prompt, tools, continue_final=continue_final, kwargs=kwargs
        ).ids

    def encode_prompt(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list | None = None,
        *,
        continue_final: bool = False,
        kwargs: dict | None = None,
        memory: TurnMemory | None = None,
        tenant: str = "",
    ) -> EncodedPrompt:
        """`encode`, and with a `TurnMemory`: earlier answers this server generated come back as the ids it
        generated (see `_splice`). `text` is the rendered prompt, the key a new answer is remembered under
        (None when the prompt cannot key one: a message held special-token text, or the final message is
        continued)."""
        try:
            messages, tools = render_messages(messages, tools, self.native_tools)
        except ToolFormatError as e:
            raise InvalidRequestError(str(e), e.param) from None
        if continue_final:
            if add_generation_prompt:
                raise InvalidRequestError(
                    "continue_final_message needs add_generation_prompt: false", "continue_final_message"
                )
            if not messages or messages[-1].get("role") != "assistant":
                raise InvalidRequestError(
                    "continue_final_message needs an assistant message last", "continue_final_message"
                )
            messages = [*messages[:-1], {**messages[-1], "content": messages[-1]["content"] + _END}]
        extra = dict(kwargs or {})
        guarded = [
            m for m in messages if isinstance(m.get("content"), str) and self._has_special(m["content"])
        ]
        if not guarded:
            text = self._cut(self.render(messages, add_generation_prompt, tools, **extra), continue_final)
            if memory is None or not len(memory):
                return EncodedPrompt(self._encode_template_text(text), None if continue_final else text)
            return self._splice(text, messages, memory, tenant, continue_final)
        # Render with placeholders for the risky contents, then tokenize those as plain text.
        subst = []
        msgs = []
        for m in messages:
            if m in guarded:
                k = len(subst)
                content = m["content"]
                end = _END if content.endswith(_END) else ""  # the marker stays template text
                subst.append(content[: len(content) - len(end)])
                m = {**m, "content": _MARK.format(k) + end}
            msgs.append(m)
        text = self._cut(self.render(msgs, add_generation_prompt, tools, **extra), continue_final)
        ids: list[int] = []
        parts = re.split("\x00tokenseam-content-(\\d+)\x00", text)
        # parts alternate: template text, content index, template text, ...; plain runs are joined so the
        # seam between template text and message text tokenizes as one string would.
        run = ""
        for i, part in enumerate(parts):
            if i % 2 == 1:
                run += subst[int(part)]
                continue
            pieces = self._split_special(part)
            for j, (piece, is_special) in enumerate(pieces):
                if is_special:
                    ids += self.tokenizer.encode(run) if run else []
                    run = ""
                    ids += self.tokenizer.encode(piece, parse_special=True)
                else:
                    run += piece
                del j
        ids += self.tokenizer.encode(run) if run else []
        return EncodedPrompt(self._add_bos(ids), None)

    def _splice(
        self, text: str, messages: list[dict], memory: TurnMemory, tenant: str, continue_final: bool
    ) -> EncodedPrompt:
        """Token ids of `text` where earlier answers the memory holds come back as their generated ids.

        For each assistant message, in order, its content is found in the text; if the memory holds an answer
        to exactly the text before it (same tenant), and the text goes on with that answer's bytes, the
        answer's ids are used for those bytes. The text between is tokenized as usual, piece by piece, which
        is how every earlier turn's prompt was built too, so the ids repeat turn after turn. An answer the
        client changed is used up to the last whole id before the first changed byte; where the client's text
        (not the template's) follows the ids used, they end before any token the text's own tokenization
        would run across that seam (`_seam`). A whole answer that is the whole content keeps all its ids."""
        tb = text.encode("utf-8", "surrogatepass")
        ids: list[int] = []
        done = 0  # bytes of tb already turned into ids
        reused: list[SplicedAnswer] = []
        char_at, byte_at = 0, 0  # a char offset and its byte offset, to convert find()'s results cheaply
        search = 0
        h, hashed = memory.hasher(tenant), 0  # the key of tb[:byte_at], fed once over the text
        misses = 0  # contents not found in the text: each costs a scan to its end, so they are bounded
        for m in messages:
            content = m.get("content")
            if m.get("role") != "assistant" or not isinstance(content, str) or not content:
                continue
            s = text.find(content, search)
            if s < 0:
                s = text.find(content.strip(), search) if content.strip() else -1
                if s < 0:
                    misses += 1
                    if misses > MAX_UNFOUND:
                        break
                    continue
                content = content.strip()
            while True:
                search = s + len(content)
                byte_at += len(text[char_at:s].encode("utf-8", "surrogatepass"))
                char_at = s
                h.update(tb[hashed:byte_at])
                hashed = byte_at
                content_end = byte_at + len(content.encode("utf-8", "surrogatepass"))
                got = self._reuse(tb, done, byte_at, content_end, memory.get(h.copy().digest()))
                if got is not None or misses >= MAX_UNFOUND:
                    break
                # the same text may come earlier in the prompt (a tool call that copied the system prompt's
                # example): look at its next occurrence, the scans shared with the bound on missing contents
                nxt = text.find(content, s + 1)
                if nxt < 0:
                    misses += 1
                    break
                misses += 1
                s = nxt
            if got is None:
                continue
            seg_ids, answer_ids, start, end, cut = got
            ids += seg_ids + answer_ids
            reused.append(SplicedAnswer(start, end, len(answer_ids), cut))
            done = end
        tail = tb[done:].decode("utf-8", "surrogatepass")
        ids += self.tokenizer.encode(tail, add_special=False, parse_special=True) if tail else []
        memory.hits += bool(reused)
        return EncodedPrompt(self._add_bos(ids), None if continue_final else text, reused)

    def _reuse(
        self, tb: bytes, done: int, at: int, content_end: int, answers: list[Answer]
    ) -> tuple[list[int], list[int], int, int, bool] | None:
        """(ids of tb[done:at] minus healing's removed ids, the answer ids that continue there, the byte offsets
        they start and end at, whether the answer was cut) for the answer that goes on longest; None if none.
        `content_end`: where the message's content ends in tb (template text follows it)."""
        best = None
        for a in answers:
            start = at - len(a.lead)
            if start < done or tb[start:at] != a.lead:
                continue
            n = a.matched(tb, start)
            if best is None or n > best[1]:
                best = (a, n, start)
        if best is None or best[1] == 0:
            return None
        a, n, start = best
        seg = tb[done:at].decode("utf-8", "surrogatepass")
        seg_ids = self.tokenizer.encode(seg, add_special=False, parse_special=True) if seg else []
        if a.removed:
            r = len(a.removed)
            if len(seg_ids) < r or tuple(seg_ids[-r:]) != a.removed:
                return None  # the prompt no longer ends as it did when healing rolled it back
            seg_ids = seg_ids[:-r]
        answer_ids = list(a.ids[:n])
        end = start + a.ends[n - 1]
        whole = n == len(a.ids)
        # The whole answer is the whole content: template text follows, and it is tokenized on its own every
        # turn, so the seam needs no check. Otherwise the client's own text goes on from the ids' end.
        after = b"" if whole and end == content_end else tb[end : end + SEAM_BYTES]
        keep = self._seam(answer_ids, after)
        if keep < len(answer_ids):
            answer_ids, whole = answer_ids[:keep], False
        while answer_ids:  # the rest must start on a character boundary
            end = start + a.ends[len(answer_ids) - 1]
            if end >= len(tb) or (tb[end] & 0xC0) != 0x80:
                break
            answer_ids.pop()
            whole = False
        if not answer_ids:
            return None
        return seg_ids, answer_ids, start, end, not whole

    def _seam(self, ids: list[int], after: bytes) -> int:
        """How many of `ids` (an answer's, followed in the prompt by the bytes `after`) to keep so that the
        text from there on can be tokenized on its own: all of them when the text's own tokenization has a
        token boundary at the seam (a special token follows, or nothing merges across); else up to the start
        of the token that spans it. Where the window cannot be checked, token healing's rollback decides."""
        from ..healing import DEFAULT_MAX_ROLLBACK, heal_prompt
        from ..healing.divergence import piece

        if not after or (self._special_re and self._special_re.match(after.decode("utf-8", "ignore"))):
            return len(ids)
        tb = self.vocab.token_bytes
        k = min(len(ids), SEAM_TOKENS)
        while k < len(ids) and tb[ids[-k]][:1] and (tb[ids[-k]][0] & 0xC0) == 0x80:
            k += 1  # the window starts on a character boundary
        head = b"".join(tb[t] for t in ids[-k:])
        try:
            window = (head + after).decode("utf-8")
        except UnicodeDecodeError:
            window = None  # `after` was cut inside a character: shorten it to a whole one
            for cut in range(1, 4):
                try:
                    window = (head + after[:-cut]).decode("utf-8")
                    break
                except UnicodeDecodeError:
                    continue
        if window is None or (head and (head[0] & 0xC0) == 0x80):
            return len(heal_prompt(ids, self.vocab, DEFAULT_MAX_ROLLBACK).kept_ids)
        at = 0
        for t in self.tokenizer.encode(window, add_special=False, parse_special=True):
            nxt = at + len(piece(self.vocab, t))
            if nxt > len(head) > at:  # this token spans the seam: keep the ids that end before it starts
                keep, n = len(ids) - k, 0
                for t2 in ids[-k:]:
                    n += len(tb[t2])
                    if n > at:
                        break
                    keep += 1
                return keep
            if nxt >= len(head):
                break
            at = nxt
        return len(ids)

    @staticmethod
    def _cut(text: str, continue_final: bool) -> str:
        if not continue_final:
            return text
        at = text.rfind(_END)
        if at < 0:
            raise InvalidRequestError(
                "the chat template does not render the final message's content, so it cannot be continued",
                "continue_final_message",
            )
        return text[:at]

    def _encode_template_text(self, text: str) -> list[int]:
        return self._add_bos(self.tokenizer.encode(text, add_special=False, parse_special=True))

    def _add_bos(self, ids: list[int]) -> list[int]:
        bos = self.vocab.bos_token_id
        if self.tokenizer.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids = [bos] + ids
        return ids

    def _has_special(self, text: str) -> bool:
        return bool(self._control_re and self._control_re.search(text))

    def _split_special(self, text: str) -> list[tuple[str, bool]]:
        if not self._special_re:
            return [(text, False)]
        out, pos = [], 0
        for m in self._special_re.finditer(text):
            if m.start() > pos:
                out.append((text[pos : m.start()], False))
            out.append((m.group(0), True))
            pos = m.end()
        if pos < len(text):
            out.append((text[pos:], False))
        return out


def _environment() -> ImmutableSandboxedEnvironment:
    """Where templates are rendered: Hugging Face's conventions (trimmed blocks, `tojson`, `raise_exception`,
    `strftime_now`) in jinja2's sandbox, so a template cannot reach attributes or mutate what it is given."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


MAX_TEMPLATE_BYTES = 1 << 20


class ChatTemplateError(ValueError):
    """A --chat-template that cannot be used (not a built-in name, an unreadable file, not a template)."""


def load_template_option(value: str) -> str:
    """The template source `--chat-template VALUE` names: a BUILT_IN name, or a file holding a Jinja template
    (UTF-8, at most 1 MiB). Raises ChatTemplateError saying what is wrong."""
    if value in BUILT_IN:
        return BUILT_IN[value]
    path = Path(value)
    try:
        if not path.is_file():
            raise ChatTemplateError(
                f"--chat-template {value!r} is neither a built-in template ({', '.join(BUILT_IN)}) nor a file"
            )
        if path.stat().st_size > MAX_TEMPLATE_BYTES:
            raise ChatTemplateError(f"--chat-template file {value!r} is over {MAX_TEMPLATE_BYTES} bytes")
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ChatTemplateError(f"--chat-template file {value!r} cannot be read: {e}") from None
    if not source.strip():
        raise ChatTemplateError(f"--chat-template file {value!r} is empty")
    try:
        tmpl = _environment().from_string(source)
    except TemplateError as e:
        raise ChatTemplateError(
            f"--chat-template file {value!r} is not a valid Jinja template: {e}"
        ) from None
    try:  # a template that cannot render a plain conversation (an include, a filter it lacks) is found now
        tmpl.render(messages=_SAMPLE, add_generation_prompt=True, tools=None, bos_token="", eos_token="")
    except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise ChatTemplateError(
            f"--chat-template file {value!r} cannot render a sample conversation: {type(e).__name__}: {e}"
        ) from None
    return source


_SAMPLE = [
    {"role": "user", "content": "Hello."},
    {"role": "assistant", "content": "Hi."},
    {"role": "user", "content": "Bye."},
]


def _raise(msg: str):
    raise TemplateError(msg)
