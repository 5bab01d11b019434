"""The prompt-boundary linter: does a prompt's end survive whatever text is appended to it?

Tokenizes the prompt alone and joined with a battery of continuations, reports which ones re-tokenize the
prompt's tail and suggests the nearest stable end; can also check every segment boundary of a chat template.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from ..vocab import Vocabulary
from ..vocab.prefix_memo import common_prefix

if TYPE_CHECKING:
    from ..vocab import Tokenizer
from .errors import HealingError
from .heal import DEFAULT_MAX_ROLLBACK, heal_prompt

# (category, continuation): what realistically follows a prompt or a template segment.
CONTINUATIONS: tuple[tuple[str, str], ...] = (
    ("letters", "the"),
    ("letters", "The"),
    ("letters", "s"),
    ("letters", "ing"),
    ("letters", "é"),
    ("space+word", " the"),
    ("space+word", " The"),
    ("space+word", " a"),
    ("space+word", " "),
    ("space+word", "  "),
    ("digits", "0"),
    ("digits", "1"),
    ("digits", "42"),
    ("digits", "2024"),
    ("punctuation", "."),
    ("punctuation", ","),
    ("punctuation", "!"),
    ("punctuation", "?"),
    ("punctuation", ":"),
    ("punctuation", ";"),
    ("punctuation", "..."),
    ("punctuation", "-"),
    ("punctuation", "'"),
    ("punctuation", '"'),
    ("punctuation", ")"),
    ("punctuation", "("),
    ("newlines", "\n"),
    ("newlines", "\n\n"),
    ("newlines", "\t"),
    ("newlines", "\r\n"),
    ("cjk", "中"),
    ("cjk", "中文"),
    ("cjk", "日本語"),
    ("cjk", "こんにちは"),
    ("cjk", "한국어"),
    ("code", "def"),
    ("code", "()"),
    ("code", "{"),
    ("code", "}"),
    ("code", "["),
    ("code", "_id"),
    ("code", "="),
    ("code", "=="),
    ("code", "->"),
    ("code", "//"),
    ("code", "#"),
    ("latex", "\\"),
    ("latex", "\\alpha"),
    ("latex", "$x$"),
    ("latex", "{a}"),
    ("latex", "^2"),
    ("emoji", "😀"),
)

# Texts tried when suggesting what to append to reach a stable end.
_ADD_CANDIDATES = ("\n", " ", ".", ":", "\n\n", ".\n", ":\n", ": ", "\n\n---\n")
_MAX_DROP = 64
_WITNESSES_PER_SUFFIX = 3
_WITNESS_SCAN = 256


@dataclass(frozen=True)
class ContinuationCheck:
    category: str
    continuation: str
    retokenized: int  # prompt tokens (counted from the end) that this continuation changes; 0 = stable


@dataclass
class Suggestion:
    drop_chars: int | None = None  # drop this many trailing characters ...
    stable_end: str | None = None  # ... leaving the prompt ending in this text (last 40 characters)
    append: str | None = None  # or append this text


@dataclass
class LintReport:
    model: str
    prompt_tokens: int
    stable: bool
    max_retokenized: int
    unstable: list[ContinuationCheck]
    checked: int
    heal_removed_tokens: int  # what token healing would roll back (the stable-prefix point)
    heal_removed_text: str
    suggestion: Suggestion | None = None
    boundaries: list[BoundaryCheck] = field(default_factory=list)  # chat-template mode only

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class BoundaryCheck:
    """One place in a rendered chat template where a message's text meets template text."""

    where: str  # e.g. "before user content", "after user content", "end of generation prompt"
    offset: int  # character offset in the rendered text
    stable: bool
    max_retokenized: int
    unstable: list[str]  # continuations (or user-text endings) that re-tokenize across the boundary
    context: str  # up to 30 characters either side, `|` marking the boundary


def vocabulary_witnesses(
    vocab: Vocabulary, ids: list[int], max_rollback: int = DEFAULT_MAX_ROLLBACK
) -> list[str]:
    """Continuations the vocabulary itself suggests: for each suffix of the prompt's end that a longer token
    extends, the text that token adds (shortest first). They catch seams no fixed battery anticipates, such
    as Gemma's single token for 中华人民共和国."""
    tb, special = vocab.token_bytes, vocab.is_special
    start = len(ids)
    while start > 0 and len(ids) - start < max_rollback and not special[ids[start - 1]]:
        start -= 1
    window = b"".join(tb[t] for t in ids[start:])
    trie = vocab.trie
    out: list[str] = []
    for off in range(max(0, len(window) - vocab.max_token_bytes), len(window)):
        suffix = window[off:]
        lo, hi = trie.prefix_range(suffix)
        found: list[str] = []
        for b in sorted(trie.sorted_bytes[lo : min(hi, lo + _WITNESS_SCAN)], key=len):
            if len(b) <= len(suffix):
                continue
            try:
                text = b[len(suffix) :].decode("utf-8")
            except UnicodeDecodeError:
                continue  # the suffix ends inside a character: not text a user could append
            if text not in found and text not in out:
                found.append(text)
            if len(found) >= _WITNESSES_PER_SUFFIX:
                break
        out.extend(found)
    return out


def check_continuations(
    tokenizer: Tokenizer,
    text: str,
    parse_special: bool = False,
    continuations: tuple[tuple[str, str], ...] = CONTINUATIONS,
    vocab: Vocabulary | None = None,
) -> tuple[list[int], list[ContinuationCheck]]:
    """Tokenize `text` alone and with each continuation (plus the vocabulary's witnesses when `vocab` is
    given); report how many of its tokens each one changes."""
    base = tokenizer.encode(text, add_special=False, parse_special=parse_special)
    if vocab is not None:
        battery = {c for _, c in continuations}
        continuations = continuations + tuple(
            ("vocabulary", w) for w in vocabulary_witnesses(vocab, base) if w not in battery
        )
    out = []
    for cat, c in continuations:
        joined = tokenizer.encode(text + c, add_special=False, parse_special=parse_special)
        out.append(ContinuationCheck(cat, c, len(base) - common_prefix(base, joined)))
    return base, out


def _is_stable(tokenizer: Tokenizer, vocab: Vocabulary, text: str, parse_special: bool) -> bool:
    base = tokenizer.encode(text, add_special=False, parse_special=parse_special)
    n = len(base)
    battery = [c for _, c in CONTINUATIONS] + vocabulary_witnesses(vocab, base)
    for c in battery:
        if tokenizer.encode(text + c, add_special=False, parse_special=parse_special)[:n] != base:
            return False
    return True


def suggest_stable_end(
    tokenizer: Tokenizer, vocab: Vocabulary, text: str, parse_special: bool = False
) -> Suggestion | None:
    """The fewest trailing characters to drop (up to 64), and a short text to append, that give a stable end."""
    s = Suggestion()
    for k in range(1, min(_MAX_DROP, len(text) - 1) + 1):
        cand = text[:-k]
        if cand.strip() and _is_stable(tokenizer, vocab, cand, parse_special):
            s.drop_chars, s.stable_end = k, cand[-40:]
            break
    for add in _ADD_CANDIDATES:
        if _is_stable(tokenizer, vocab, text + add, parse_special):
            s.append = add
            break
    return s if (s.drop_chars is not None or s.append is not None) else None


def lint_prompt(
    tokenizer: Tokenizer,
    vocab: Vocabulary,
    text: str,
    model: str = "",
    parse_special: bool = False,
    suggest: bool = True,
    max_rollback: int = DEFAULT_MAX_ROLLBACK,
) -> LintReport:
    """Is the end of `text` a stable token boundary for this model? See `LintReport`."""
    if not isinstance(text, str):
        raise HealingError(f"the prompt must be text, got {type(text).__name__}")
    if not text:
        raise HealingError("the prompt is empty: there is no boundary to check")
    base, checks = check_continuations(tokenizer, text, parse_special, vocab=vocab)
    unstable = [c for c in checks if c.retokenized]
    h = heal_prompt(base, vocab, max_rollback)
    report = LintReport(
        model=model,
        prompt_tokens=len(base),
        stable=not unstable,
        max_retokenized=max((c.retokenized for c in checks), default=0),
        unstable=unstable,
        checked=len(checks),
        heal_removed_tokens=len(h.removed_ids),
        heal_removed_text=h.removed_bytes.decode("utf-8", "replace"),
    )
    if unstable and suggest:
        report.suggestion = suggest_stable_end(tokenizer, vocab, text, parse_special)
    return report
