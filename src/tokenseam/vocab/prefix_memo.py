"""Tokenizing a text that starts like one tokenized before: the earlier ids up to a safe cut, the rest anew.

A server sees the same long beginnings again and again (a document asked new questions, a conversation's
history), and llama.cpp tokenizes every prompt whole: 8,000 Gemma-3 tokens take 15-20 ms, about a fifth of
the time to the first token when their KV is cached. `PrefixMemo` keeps the ids of recent long texts and, for
a text sharing a beginning with one, reuses its ids up to a cut and tokenizes only the rest.

The result is exactly llama.cpp's tokenization of the whole text. A cut is a token boundary p inside the shared
beginning where an ASCII letter or digit is followed by a space and no token of the vocabulary holds those two
bytes side by side. No token can then cross p, so the merges of a BPE or SentencePiece tokenizer never join
across it; and a regex pre-tokenizer (GPT-2's and its kin) ends a word chunk at p in both the whole text and
the part before it, and starts the part after it where the whole text's next chunk starts (a space begins its
chunk; no pattern looks behind). Whitespace before p is excluded because `\\s+(?!\\S)` looks ahead across it;
a punctuation run is excluded because a pre-tokenizer may join it with what follows. Each tokenizer is checked
at construction on a sample of prose, code, JSON and non-Latin text, every cut of it against the whole text;
one that splits differently anywhere gets no memo.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

MIN_BYTES = 2048  # shorter texts are tokenized whole: there is little to save
SCAN_TOKENS = 512  # how far back from the end of the shared beginning a cut is looked for
LOOKUP_ENTRIES = 8  # texts compared with a new one (the most recent first)
DEFAULT_BYTES = 16 * 1024 * 1024

SAMPLE = (
    "The river city report 42 says the market opened at 9 and closed at 5. Next, the harbor letters\n"
    "were sent; the doctor's number is 311.  Two  spaces,\ttabs\tand\r\nCRLF lines follow it.\n\n"
    "def total(items, rate=0.25):\n    return sum(x * rate for x in items)  # it's done\n\n"
    '{"name": "widget", "tags": ["a b", "c"], "price": 12.5, "ok": true, "n": null}\n'
    "안녕하세요 세계 2024 😊 👍🏽 caf\u00e9 na\u00efve \u00a0x y\u3000z I'll we've they're A1 b2 C3 d4\n"
)


def common_prefix(a: Sequence, b: Sequence, start: int = 0) -> int:
    """The length of the longest common prefix of two sequences that agree before `start`. Two bytes, lists or
    tuples are compared by halving on slice equality, in C (bytes at memcmp speed: two 32 KB prompts in some
    tens of microseconds, where a loop in Python takes a millisecond); other sequences element by element."""
    n = min(len(a), len(b))
    lo = start
    if type(a) is type(b) and isinstance(a, (bytes, list, tuple)):  # slices of one kind compare as values
        if lo < n and a[lo:n] == b[lo:n]:
            return n
        hi = n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
        while hi - lo > 32:
            mid = (lo + hi) // 2
            if a[lo:mid] == b[lo:mid]:
                lo = mid
            else:
                hi = mid
    while lo < n and a[lo] == b[lo]:
        lo += 1
    return lo


class _Entry:
    __slots__ = ("data", "ids", "ends")

    def __init__(self, data: bytes, ids: np.ndarray, ends: np.ndarray) -> None:
        self.data = data
        self.ids = ids  # int32 token ids
        self.ends = ends  # int64: byte offset where each token ends

    @property
    def nbytes(self) -> int:
        return len(self.data) + self.ids.nbytes + self.ends.nbytes + 200


class PrefixMemo:
    """Exact tokenization of long texts that reuses the ids of a recent text with the same beginning.

    `encode(data, parse_special)` is a tokenizer's own function (no BOS added); `token_bytes` its vocabulary's
    bytes per id; the memo keeps at most `max_bytes` (texts, ids and offsets, least recently used dropped).
    Thread-safe. `enabled` is False when the tokenizer failed the check on the sample (see the module text);
    then every call tokenizes the whole text."""

    def __init__(
        self,
        encode: Callable[[bytes, bool], list[int]],
        token_bytes: Sequence[bytes],
        max_bytes: int = DEFAULT_BYTES,
    ) -> None:
        self._encode = encode
        self.max_bytes = max_bytes
        self._len = np.fromiter((len(b) for b in token_bytes), dtype=np.int64, count=len(token_bytes))
        # every pair of bytes side by side inside some token: all tokens' bytes in a row, minus the pairs
        # that straddle two tokens
        flat = np.frombuffer(b"".join(token_bytes), dtype=np.uint8)
        inside = np.ones(max(len(flat) - 1, 0), dtype=bool)
        starts = np.cumsum(self._len)[:-1]
        inside[starts[(starts > 0) & (starts < len(flat))] - 1] = False
        spans = np.zeros((256, 256), dtype=bool)
        spans[flat[:-1][inside], flat[1:][inside]] = True
        alnum = np.zeros(256, dtype=bool)
        for lo, hi in ((0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A)):
            alnum[lo : hi + 1] = True
        self._cut = alnum[:, None] & (np.arange(256) == 0x20)[None, :] & ~spans  # (byte before, byte after)
        self._entries: OrderedDict[tuple[bool, bytes], _Entry] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self.calls = 0  # texts of MIN_BYTES or more asked for
        self.reused_tokens = 0  # ids taken from the memo instead of tokenized
        self.tokenized_bytes = 0  # bytes tokenized by those calls
        self.enabled = max_bytes > 0 and self._passes_check()

    def _passes_check(self) -> bool:
        data = SAMPLE.encode()
        for special in (False, True):
            whole = self._encode(data, special)
            ends = self._ends(whole)
            if ends is None or not len(ends) or ends[-1] != len(data):
                return False
            cuts = [int(p) for p in ends[:-1] if p > 0 and self._cut[data[p - 1], data[p]]]
            if not cuts:
                return False
            for p in cuts:
                if self._encode(data[:p], special) + self._encode(data[p:], special) != whole:
                    return False
        return True

    def _ends(self, ids: list[int]) -> np.ndarray | None:
        arr = np.asarray(ids, dtype=np.int64)
        if len(arr) and (arr.min() < 0 or arr.max() >= len(self._len)):
            return None
        return np.cumsum(self._len[arr])

    def encode(self, data: bytes, parse_special: bool = False) -> list[int]:
        """The ids of `data`, as the tokenizer gives them for the whole text."""
        if not self.enabled or len(data) < MIN_BYTES:
            return self._encode(data, parse_special)
        key = (parse_special, data)
        with self._lock:
            self.calls += 1
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                self.reused_tokens += len(hit.ids)
                return hit.ids.tolist()
            head, cut = self._find_cut(data, parse_special)
        tail = self._encode(data[cut:], parse_special)
        ids = head + tail
        with self._lock:
            self.reused_tokens += len(head)
            self.tokenized_bytes += len(data) - cut
        self._remember(key, ids)
        return ids

    def _find_cut(self, data: bytes, parse_special: bool) -> tuple[list[int], int]:
        """(ids of data[:p], p) for the best cut p found in a recent text's ids; ([], 0) if none. Holds the lock."""
        best, best_len, looked = None, 0, 0
        for (special, _), e in reversed(self._entries.items()):
            if special != parse_special:
                continue
            n = common_prefix(data, e.data)
            if n > best_len:
                best, best_len = e, n
            looked += 1
            if looked == LOOKUP_ENTRIES:
                break
        if best is None or best_len < MIN_BYTES // 2:
            return [], 0
        # tokens ending at or before best_len - 1: a cut p needs data[p] inside the shared beginning too
        k = int(np.searchsorted(best.ends, best_len - 1, side="right"))
        cut = self._cut
        for j in range(k, max(0, k - SCAN_TOKENS), -1):
            p = int(best.ends[j - 1])
            if p > 0 and cut[data[p - 1], data[p]]:
                self._entries.move_to_end((parse_special, best.data))
                return best.ids[:j].tolist(), p
        return [], 0

    def _remember(self, key: tuple[bool, bytes], ids: list[int]) -> None:
        ends = self._ends(ids)
        if ends is None or not len(ends) or ends[-1] != len(key[1]):
            return  # ids whose bytes do not add up to the text (never seen; nothing to cut from)
        e = _Entry(key[1], np.asarray(ids, dtype=np.int32), ends)
        if e.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._held -= old.nbytes
            self._entries[key] = e
            self._held += e.nbytes
            while self._held > self.max_bytes:
                _, gone = self._entries.popitem(last=False)
                self._held -= gone.nbytes

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "calls": self.calls,
                "reused_tokens": self.reused_tokens,
                "tokenized_bytes": self.tokenized_bytes,
                "entries": len(self._entries),
                "bytes": self._held,
            }
