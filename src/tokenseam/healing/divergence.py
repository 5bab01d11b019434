"""Where two token sequences part, and why: the prefix cache's miss report and `lint-prompt --against`.

Given two id sequences that agree up to position `at`, the cause is named from the bytes after it:
- `retokenized`: the text goes on the same, but the ids differ (a re-tokenized seam: the same bytes cut into
  other tokens, as when `\\n` `\\n` comes back as `\\n\\n`);
- `stripped`: one side leaves out a run of text the other holds and then goes on with it (a chat template that
  drops an earlier reasoning block from the history; `removed` says which side lost the text);
- `end_of_turn`: one side has an end-of-generation token of the model where the other has other text (an answer
  that ended with the model's own end token, which the chat template writes as another mark: Gemma's
  `<end_of_turn>` under a ChatML template's `<|im_end|>`; `end_token` says which side has the token);
- `edited`: the text itself differs from this byte on (the client changed it);
- `extended`: one side simply ends there (nothing differs; the other goes on).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..vocab import Vocabulary
from ..vocab.prefix_memo import common_prefix

# How far past the parting point the bytes are compared (tokens of each side).
LOOKAHEAD_TOKENS = 256
# A run of text one side leaves out is recognised when the other side resumes with this many equal bytes.
RESUME_BYTES = 12
MIN_RESUME_BYTES = 4  # fewer bytes left on a side: too little to tell a stripped run from chance
SHOWN_TOKENS = 8


@dataclass(frozen=True)
class Divergence:
    at: int  # index of the first differing id
    cause: str  # retokenized | stripped | end_of_turn | edited | extended | same
    byte: int  # bytes of the common ids before `at` (the offset where the two parted, in text)
    a_ids: list[int]  # the next few ids of each side from `at`
    b_ids: list[int]
    a_text: str
    b_text: str
    same_bytes: int = 0  # bytes after the parting point that both sides still agree on
    removed: str = ""  # for `stripped`: "a" or "b", the side that leaves the text out
    removed_bytes: int = 0
    end_token: str = ""  # for `end_of_turn`: "a" or "b", the side with the model's end-of-generation token

    def to_json(self) -> dict:
        out = {
            "at_token": self.at,
            "at_byte": self.byte,
            "cause": self.cause,
            "a": {"ids": self.a_ids, "text": self.a_text},
            "b": {"ids": self.b_ids, "text": self.b_text},
        }
        if self.cause == "retokenized":
            out["same_bytes"] = self.same_bytes
        if self.cause == "stripped":
            out["removed_from"] = self.removed
            out["removed_bytes"] = self.removed_bytes
        if self.cause == "end_of_turn":
            out["end_token_in"] = self.end_token
        return out


def piece(vocab: Vocabulary, t: int) -> bytes:
    """A token's bytes as the text shows them (special tokens by their text)."""
    if vocab.is_special[t]:
        return vocab.token_text[t].encode("utf-8", "surrogatepass")
    return vocab.token_bytes[t]


def diverge(vocab: Vocabulary, a: Sequence[int], b: Sequence[int], at: int | None = None) -> Divergence:
    """Where `a` and `b` part (`at`: already known to be their common prefix length) and the cause."""
    if at is None:
        at = common_prefix(a, b)
    byte = sum(len(piece(vocab, t)) for t in a[:at])
    a_next = list(a[at : at + LOOKAHEAD_TOKENS])
    b_next = list(b[at : at + LOOKAHEAD_TOKENS])
    ab = b"".join(piece(vocab, t) for t in a_next)
    bb = b"".join(piece(vocab, t) for t in b_next)

    def show(ids: list[int]) -> str:
        return b"".join(piece(vocab, t) for t in ids[:SHOWN_TOKENS]).decode("utf-8", "replace")

    base = dict(
        at=at,
        byte=byte,
        a_ids=a_next[:SHOWN_TOKENS],
        b_ids=b_next[:SHOWN_TOKENS],
        a_text=show(a_next),
        b_text=show(b_next),
    )
    if not a_next and not b_next:
        return Divergence(cause="same", **base)
    if not a_next or not b_next:
        return Divergence(cause="extended", **base)
    same = 0
    n = min(len(ab), len(bb))
    while same < n and ab[same] == bb[same]:
        same += 1
    first = max(len(piece(vocab, a_next[0])), len(piece(vocab, b_next[0])))
    if same >= first:
        # the bytes agree through both first ids: the same text, cut into other ids
        return Divergence(cause="retokenized", same_bytes=same, **base)
    for side, t in (("a", a_next[0]), ("b", b_next[0])):
        if t in vocab.eos_token_ids:
            return Divergence(cause="end_of_turn", end_token=side, **base)
    for side, short, long_ in (("b", bb, ab), ("a", ab, bb)):
        resume = short[same : same + RESUME_BYTES]  # where this side goes on; found later in the other?
        if len(resume) < MIN_RESUME_BYTES:
            continue
        k = long_.find(resume, same + 1)
        if k > same:
            return Divergence(cause="stripped", removed=side, removed_bytes=k - same, **base)
    return Divergence(cause="edited", same_bytes=same, **base)
