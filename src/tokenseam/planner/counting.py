"""Token counting for the planner: the target model's own tokenizer when it is local, else a named approximation.

The approximation (`bytes/4`) states its error bound wherever a count is shown, and is cross-checked on the same text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from .errors import PlannerError

APPROX_NAME = "bytes/4"
APPROX_REL_ERROR = 0.25


@dataclass
class TokenCounter:
    """Counts tokens of a text. `exact` counters wrap a llama.cpp tokenizer; the approximation has none.

    `leading_tokens` are tokens the request puts before the text (BOS, chat-template headers): they sit in the
    cached prefix too, so they count toward the floor and the block alignment.
    """

    name: str
    exact: bool
    leading_tokens: int = 0
    tokenizer: object | None = None
    error_note: str = ""
    path: str | None = None  # the .gguf the tokenizer came from (for its vocabulary)
    _vocab: object | None = None

    def vocabulary(self):
        """The tokenizer's vocabulary (loaded on first use), or None for the approximation."""
        if self.path is None:
            return None
        if self._vocab is None:
            from ..vocab import Vocabulary

            self._vocab = Vocabulary.from_gguf(self.path)
        return self._vocab

    def count(self, text: str) -> int:
        """Tokens of the cached prefix made of `text`: leading tokens + the text's own tokens."""
        return self.leading_tokens + self.count_text(text)

    def count_text(self, text: str) -> int:
        """Tokens of `text` alone (no leading tokens)."""
        if self.tokenizer is not None:
            return len(self.tokenizer.encode(text, add_special=False))
        return math.ceil(len(text.encode("utf-8")) / 4)

    def encode(self, text: str) -> list[int] | None:
        return None if self.tokenizer is None else self.tokenizer.encode(text, add_special=False)

    def describe(self, text: str | None = None) -> dict:
        """What the count means: method, exactness and, for the approximation, its stated error bound."""
        out: dict = {"method": self.name, "exact": self.exact, "leading_tokens": self.leading_tokens}
        if not self.exact:
            out["relative_error_bound"] = APPROX_REL_ERROR
            out["error_note"] = self.error_note
            if text is not None:
                nbytes = len(text.encode("utf-8"))
                out["hard_bounds"] = [min(1, nbytes) + self.leading_tokens, nbytes + self.leading_tokens]
                out["cross_check"] = _cross_check(text)
        return out


def _cross_check(text: str) -> dict | None:
    """Count the same text with the bundled SmolLM2 tokenizer so the user sees how far bytes/4 is on *this* text."""
    try:
        from ..models import smollm2_path
        from ..vocab import Tokenizer

        n = len(Tokenizer.from_gguf(smollm2_path()).encode(text, add_special=False))
    except Exception:  # the check is a courtesy; a missing model must not break planning
        return None
    est = math.ceil(len(text.encode("utf-8")) / 4)
    return {
        "tokenizer": "smollm2",
        "tokens": n,
        "estimate": est,
        "estimate_error": None if n == 0 else (est - n) / n,
    }


def chat_leading_tokens(model: str | Path) -> int:
    """Tokens the model's chat template puts before a single user message's text (BOS, default system prompt,
    role header): they lead the cached prefix on `/v1/chat/completions`, so they count toward block alignment.

    Found as the common token prefix of two one-message conversations whose texts differ from the first
    character, rendered with the engine's own chat template code."""
    from ..engine.chat_template import ChatTemplate
    from ..models import ModelNotFoundError, resolve_model
    from ..vocab import Tokenizer, Vocabulary, VocabularyError
    from ..vocab.gguf import read_gguf_metadata

    try:
        path = resolve_model(str(model))
        meta = read_gguf_metadata(
            path,
            skip=frozenset(
                {
                    "tokenizer.ggml.tokens",
                    "tokenizer.ggml.scores",
                    "tokenizer.ggml.token_type",
                    "tokenizer.ggml.merges",
                }
            ),
        )
        tok, vocab = Tokenizer.from_gguf(path), Vocabulary.from_gguf(path)
        tmpl = ChatTemplate(meta.get("tokenizer.chat_template"), vocab, tok)
        a = tmpl.encode([{"role": "user", "content": "Alpha beta."}])
        b = tmpl.encode([{"role": "user", "content": "Zulu yankee."}])
    except (ModelNotFoundError, VocabularyError) as e:
        raise PlannerError(f"--leading-tokens chat: {e}") from None
    except Exception as e:  # the template code belongs to the engine; report rather than crash
        raise PlannerError(f"--leading-tokens chat: could not render {model}'s chat template: {e}") from None
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def make_counter(
    tokenizer: str | None, profile_tokenizer: str | None = None, leading_tokens: int | str | None = None
) -> TokenCounter:
    """A counter for `--tokenizer` (alias or .gguf path), else the profile's local tokenizer, else bytes/4.

    `leading_tokens`: a number, None (the tokenizer's BOS), or "chat" (the chat template's header tokens)."""
    name = tokenizer or profile_tokenizer
    if name in (None, "", APPROX_NAME, "approx"):
        if leading_tokens == "chat":
            raise PlannerError(
                "--leading-tokens chat needs a local tokenizer (--tokenizer smollm2|gemma3|PATH.gguf)"
            )
        return TokenCounter(
            name=APPROX_NAME,
            exact=False,
            leading_tokens=leading_tokens or 0,
            error_note=(
                f"approximation {APPROX_NAME}: no local tokenizer for this profile. Expect up to "
                f"±{APPROX_REL_ERROR:.0%} on English prose (BPE vocabularies average 3.5-4.5 bytes per "
                "token), more on code, digits and non-Latin scripts; the true count is never above the "
                "byte count. Pass --tokenizer PATH.gguf for an exact count."
            ),
        )
    from ..models import ModelNotFoundError, resolve_model
    from ..vocab import Tokenizer, VocabularyError

    try:
        path = resolve_model(name)
        tok = Tokenizer.from_gguf(path)
    except (ModelNotFoundError, VocabularyError) as e:
        raise PlannerError(f"tokenizer {name!r}: {e}") from None
    if leading_tokens == "chat":
        lead = chat_leading_tokens(name)
    else:
        lead = leading_tokens if leading_tokens is not None else (1 if tok.add_bos else 0)
    return TokenCounter(
        name=f"{Path(path).name} (llama.cpp)", exact=True, leading_tokens=lead, tokenizer=tok, path=str(path)
    )
