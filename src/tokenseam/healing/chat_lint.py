"""Chat-template boundary checks: render the GGUF's template around sample messages and test every seam.

A seam is where a message's text meets template text; each is checked with the linter's continuation battery.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..vocab import Vocabulary

if TYPE_CHECKING:
    from ..vocab import Tokenizer
from ..vocab.errors import VocabularyError
from ..vocab.gguf import read_gguf_metadata
from .errors import HealingError
from .lint import CONTINUATIONS, BoundaryCheck, LintReport, check_continuations, lint_prompt

SYSTEM_SAMPLE = "You are a careful assistant. Answer briefly."
ASSISTANT_SAMPLE = "Sure, here is the answer."
# How a user's message may end; each is checked against the template text that follows it.
USER_ENDINGS = (
    "Hello",
    "Hello.",
    "Hello ",
    "Hello\n",
    "What is 2+2?",
    "你好",
    "x = 1",
    "\\alpha",
    "http:",
    "end)",
)
_META_SKIP = frozenset(
    {"tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"}
)


def load_chat_template(model_path: str | Path, vocab: Vocabulary | None = None) -> str:
    """The jinja2 chat template stored in a GGUF file (`tokenizer.chat_template`). A GGUF without one: with
    the model's `vocab`, the built-in template the server renders it with (chat_formats.fallback_template);
    without, HealingError."""
    try:
        meta = read_gguf_metadata(model_path, skip=_META_SKIP)
    except VocabularyError as e:
        raise HealingError(str(e)) from e
    tmpl = meta.get("tokenizer.chat_template")
    if not isinstance(tmpl, str) or not tmpl.strip():
        if vocab is not None:
            from ..chat_formats import BUILT_IN, fallback_template

            return BUILT_IN[fallback_template(vocab)]
        raise HealingError(
            f"{Path(model_path).name} has no chat template (GGUF key tokenizer.chat_template is "
            "missing): lint the prompt without --chat-template"
        )
    return tmpl


def render_chat(
    template: str,
    messages: list[dict[str, str]],
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
) -> str:
    """Render a chat template in a sandbox (templates come from model files, which may be untrusted)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg: str) -> None:
        raise HealingError(f"the chat template refused the sample conversation: {msg}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except HealingError:
        raise
    except jinja2.TemplateError as e:
        raise HealingError(f"cannot render the chat template: {e}") from e


def _sample_render(template: str, user_text: str) -> tuple[str, list[tuple[str, str]]]:
    convs = [
        [
            ("system", SYSTEM_SAMPLE),
            ("user", user_text),
            ("assistant", ASSISTANT_SAMPLE),
            ("user", user_text),
        ],
        [("user", user_text), ("assistant", ASSISTANT_SAMPLE), ("user", user_text)],
    ]
    err: HealingError | None = None
    for conv in convs:
        try:
            return render_chat(template, [{"role": r, "content": c} for r, c in conv]), conv
        except HealingError as e:  # e.g. a template that rejects system messages
            err = e
    assert err is not None
    raise err


def _context(text: str, offset: int) -> str:
    return text[max(0, offset - 30) : offset] + "|" + text[offset : offset + 30]


def lint_chat_template(
    tokenizer: Tokenizer, vocab: Vocabulary, template: str, user_text: str
) -> list[BoundaryCheck]:
    """Check every seam of the rendered sample conversation (user text = `user_text`) and the prompt's end."""
    rendered, conv = _sample_render(template, user_text)
    checks: list[BoundaryCheck] = []
    cursor = 0
    for role, content in conv:
        needle = content if content in rendered[cursor:] else content.strip()
        start = rendered.find(needle, cursor) if needle else -1
        if start < 0:
            raise HealingError(
                f"the chat template does not reproduce the {role} message text; cannot locate its boundaries"
            )
        end = start + len(needle)
        cursor = end
        # Template text followed by whatever the message starts with.
        _, conts = check_continuations(tokenizer, rendered[:start], parse_special=True, vocab=vocab)
        bad = [c for c in conts if c.retokenized]
        checks.append(
            BoundaryCheck(
                f"before {role} text",
                start,
                not bad,
                max((c.retokenized for c in conts), default=0),
                [c.continuation for c in bad],
                _context(rendered, start),
            )
        )
        # Whatever the message ends with, followed by the template text.
        bad_end, worst = [], 0
        for ending in dict.fromkeys((needle, *USER_ENDINGS)):
            part = rendered[:start] + ending
            a = tokenizer.encode(part, parse_special=True)
            b = tokenizer.encode(part + rendered[end:], parse_special=True)
            n = 0
            while n < len(a) and n < len(b) and a[n] == b[n]:
                n += 1
            if n < len(a):
                bad_end.append(ending)
                worst = max(worst, len(a) - n)
        checks.append(
            BoundaryCheck(f"after {role} text", end, not bad_end, worst, bad_end, _context(rendered, end))
        )
    _, conts = check_continuations(tokenizer, rendered, parse_special=True, vocab=vocab)
    bad = [c for c in conts if c.retokenized]
    checks.append(
        BoundaryCheck(
            "end of generation prompt",
            len(rendered),
            not bad,
            max((c.retokenized for c in conts), default=0),
            [c.continuation for c in bad],
            _context(rendered, len(rendered)),
        )
    )
    return checks


def lint_chat_prompt(
    tokenizer: Tokenizer, vocab: Vocabulary, template: str, user_text: str, model: str = ""
) -> LintReport:
    """The linter's report for `user_text` used as a chat message: stable only if every seam is."""
    report = lint_prompt(tokenizer, vocab, user_text, model=model, suggest=False)
    report.boundaries = lint_chat_template(tokenizer, vocab, template, user_text)
    report.stable = all(b.stable for b in report.boundaries)
    return report


__all__ = ["CONTINUATIONS", "lint_chat_prompt", "lint_chat_template", "load_chat_template", "render_chat"]
