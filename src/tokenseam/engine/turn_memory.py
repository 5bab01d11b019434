"""The ids of the server's own answers, so a chat history sent back as text gets them back (issue: multi-turn KV).

A chat client sends the whole conversation again each turn, as text. Re-tokenizing an earlier answer need not
give the ids the model generated (`\\n` `\\n` generated, `\\n\\n` re-tokenized; SentencePiece merges that shift
with what follows), and a token-keyed prefix cache misses from the first such id on. `TurnMemory` keeps, for
each finished chat generation, the ids it produced, keyed by the tenant and the exact prompt text it answered.
When a later prompt contains that prompt text followed by the answer's bytes, `ChatTemplate` splices the
generated ids in instead of re-tokenizing them.

Bounded by bytes (LRU over whole entries); no per-connection state: clients are stateless, and the key is the
text itself. A tenant only ever sees its own entries (the tenant is part of the key).
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass

# Answers remembered per prompt (n > 1 choices, regenerated answers); the newest are kept.
MAX_PER_PROMPT = 4
# Bytes an entry costs beyond its ids and answer bytes (key, list, object headers), for the budget.
ENTRY_OVERHEAD = 160


@dataclass(frozen=True)
class Answer:
    """One generated answer: `ids` (no end-of-turn id), their bytes `data` and the byte offset each id ends at.
    With token healing, `removed` are the prompt ids rolled back before it and `lead` their bytes, which
    `data` starts with (the answer's first ids re-generated them)."""

    ids: array
    ends: array  # ends[i] = bytes of ids[: i + 1]
    data: bytes
    removed: tuple[int, ...] = ()
    lead: bytes = b""

    @property
    def cost(self) -> int:
        return ENTRY_OVERHEAD + self.ids.itemsize * len(self.ids) * 2 + len(self.data) + 4 * len(self.removed)

    def matched(self, text: bytes, start: int) -> int:
        """How many of `ids` the bytes text[start:] continue whole (their bytes equal, token for token)."""
        n = len(self.data)
        k = 0
        limit = min(n, len(text) - start)
        # compare in strides: the common case is a whole match
        while k < limit:
            step = min(4096, limit - k)
            if self.data[k : k + step] == text[start + k : start + k + step]:
                k += step
                continue
            while k < limit and self.data[k] == text[start + k]:
                k += 1
            break
        # the ids whose bytes lie within the k matched bytes
        lo, hi = 0, len(self.ends)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.ends[mid] <= k:
                lo = mid + 1
            else:
                hi = mid
        # short of the whole answer, ids of no bytes of their own at the end (a special id the client's text
        # does not show, the start of a character the next id completes) go with the ids after them
        if lo < len(self.ends):
            while lo and self.ends[lo - 1] == (self.ends[lo - 2] if lo > 1 else 0):
                lo -= 1
        return lo


class TurnMemory:
    """LRU map (tenant, prompt text) -> the answers generated for it, bounded by `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.bytes_held = 0
        self._entries: OrderedDict[bytes, list[Answer]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def hasher(tenant: str):
        """A hash of the tenant that the prompt's bytes are fed to (`key`); copy() it to key several prefixes
        of one text in one pass."""
        t = tenant.encode("utf-8", "surrogatepass")
        h = hashlib.blake2b(digest_size=20)
        h.update(len(t).to_bytes(4, "little") + t)  # length-prefixed: no tenant/prompt split collides
        return h

    @classmethod
    def key(cls, tenant: str, prompt: bytes) -> bytes:
        h = cls.hasher(tenant)
        h.update(prompt)
        return h.digest()

    def get(self, key: bytes) -> list[Answer]:
        with self._lock:
            answers = self._entries.get(key)
            if answers is None:
                return []
            self._entries.move_to_end(key)
            return list(answers)

    def put(self, key: bytes, answer: Answer) -> None:
        cost = answer.cost
        if cost > self.max_bytes:
            return
        with self._lock:
            answers = self._entries.pop(key, [])
            kept = [a for a in answers if a.data != answer.data or a.ids != answer.ids]
            self.bytes_held -= sum(a.cost for a in answers) - sum(a.cost for a in kept)
            kept.append(answer)
            while len(kept) > MAX_PER_PROMPT:
                self.bytes_held -= kept.pop(0).cost
            self._entries[key] = kept
            self.bytes_held += cost
            while self.bytes_held > self.max_bytes and self._entries:
                _, old = self._entries.popitem(last=False)
                self.bytes_held -= sum(a.cost for a in old)
                self.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes_held = 0


def make_answer(
    ids: list[int], token_bytes: list[bytes], is_special, removed=(), lead: bytes = b""
) -> Answer | None:
    """An `Answer` from generated ids, without the special ids it ends with (the end of turn, which the template
    writes as its own text). A special id inside the answer (a base model's `<start_of_turn>` mid-answer) is
    kept with no bytes: the client's text does not show it, and the ids around it come back with it. With
    healing, the ids' bytes start with the removed ids' bytes `lead`; None if not."""
    last = len(ids)
    while last and is_special[ids[last - 1]]:
        last -= 1
    out = array("i")
    ends = array("i")
    parts = []
    n = 0
    for t in ids[:last]:
        b = b"" if is_special[t] else token_bytes[t]
        out.append(t)
        n += len(b)
        ends.append(n)
        parts.append(b)
    data = b"".join(parts)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        data, ends = _as_sent(parts)
    if not out or not data.startswith(lead):
        return None
    return Answer(out, ends, data, tuple(removed), lead)


def _as_sent(parts: list[bytes]) -> tuple[bytes, array]:
    """Ids whose bytes are not valid UTF-8 (a byte-level model can generate any byte) reach the client as text
    with U+FFFD in place of the bad bytes, and that is the text it sends back: the answer's bytes and the
    offset each id ends at, in that text. A character an id starts and a later one completes is counted at
    the later id, and an incomplete one at the end is left out, as the streamed text does."""
    import codecs

    dec = codecs.getincrementaldecoder("utf-8")("replace")
    out, ends, n = [], array("i"), 0
    for b in parts:
        piece = dec.decode(b).encode("utf-8")
        n += len(piece)
        ends.append(n)
        out.append(piece)
    return b"".join(out), ends
