"""Chat prompts: render the GGUF's `tokenizer.chat_template` with jinja2 as Hugging Face does, then tokenize
so that special-token text inside user messages stays plain text (no prompt injection of `<|im_end|>`).
"""

from __future__ import annotations

import json
import re
from datetime import datetime

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..toolcalls import ToolFormatError, native_tools, render_messages
from ..vocab import Tokenizer, Vocabulary
from .errors import InvalidRequestError

# Used only when a GGUF carries no template.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_MARK = "\x00tokenseam-content-{}\x00"
_END = "\x00tokenseam-final-end\x00"  # marks where the final message's content ends (continue_final_message)
# Template variables a request's chat_template_kwargs may not set: the ones the server renders with.
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


class ChatTemplate:
    def __init__(self, template: str | None, vocab: Vocabulary, tokenizer: Tokenizer) -> None:
        self.source = template or CHATML
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._tmpl = env.from_string(self.source)
        self.vocab = vocab
        self.tokenizer = tokenizer
        specials = sorted(
            {vocab.token_text[i] for i in range(vocab.size) if vocab.is_special[i] and vocab.token_text[i]}
            | {
                vocab.token_text[i]
                for i in range(vocab.size)
                if vocab.token_text[i].startswith("<")
                and vocab.token_text[i].endswith(">")
                and len(vocab.token_text[i]) > 2
                and vocab.kind == "llama"
                and not vocab.token_text[i].startswith("<0x")
            },
            key=len,
            reverse=True,
        )
        self._special_re = re.compile("|".join(re.escape(s) for s in specials)) if specials else None
        bos = vocab.token_text[vocab.bos_token_id] if vocab.bos_token_id is not None else ""
        eos_id = min(vocab.eos_token_ids) if vocab.eos_token_ids else None
        self._vars = {"bos_token": bos, "eos_token": vocab.token_text[eos_id] if eos_id is not None else ""}
        # Thinking models open a <think> block in the generation prompt.
        self.is_thinking = "<think>" in self.source
        # Whether the template renders `tools` in tokenseam's call format itself (else: toolcalls' fallback).
        self.native_tools = native_tools(self.source)

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
            return self._encode_template_text(text)
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
        return self._add_bos(ids)

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
        return bool(self._special_re and self._special_re.search(text))

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


def _raise(msg: str):
    raise TemplateError(msg)
