"""A byte trie over a vocabulary, stored flat: tokens sorted by bytes, so a prefix is a contiguous range.

Lookups are binary searches (no scan of the vocabulary); `lcp` lets walkers skip a rejected subtree.
"""

from __future__ import annotations

import bisect

import numpy as np


class ByteTrie:
    """Non-special, non-empty tokens in byte order.

    `sorted_ids[k]` is the k-th token in byte order, `sorted_bytes[k]` its bytes and `lcp[k]` the length of
    the common prefix with `sorted_bytes[k-1]` (0 for k = 0). Tokens with equal bytes are adjacent.
    """

    def __init__(self, token_bytes: list[bytes], is_special: np.ndarray) -> None:
        ids = [i for i, b in enumerate(token_bytes) if b and not is_special[i]]
        ids.sort(key=lambda i: token_bytes[i])
        self.sorted_ids = np.asarray(ids, dtype=np.int32)
        self.sorted_bytes: list[bytes] = [token_bytes[i] for i in ids]
        lcp = np.zeros(len(ids), dtype=np.int32)
        prev = b""
        for k, b in enumerate(self.sorted_bytes):
            n = min(len(prev), len(b))
            j = 0
            while j < n and prev[j] == b[j]:
                j += 1
            lcp[k] = j
            prev = b
        self.lcp = lcp
        self._exact: dict[bytes, list[int]] = {}
        for i, b in zip(ids, self.sorted_bytes, strict=True):
            self._exact.setdefault(b, []).append(i)

    def __len__(self) -> int:
        return len(self.sorted_ids)

    def prefix_range(self, prefix: bytes) -> tuple[int, int]:
        """[lo, hi) in sorted order of the tokens whose bytes start with `prefix`."""
        lo = bisect.bisect_left(self.sorted_bytes, prefix)
        if not prefix:
            return 0, len(self.sorted_bytes)
        # Every byte string starting with `prefix` sorts before prefix + b"\xff" * inf; bump the last byte.
        hi_key = _successor(prefix)
        hi = len(self.sorted_bytes) if hi_key is None else bisect.bisect_left(self.sorted_bytes, hi_key, lo)
        return lo, hi

    def tokens_with_prefix(self, prefix: bytes) -> np.ndarray:
        lo, hi = self.prefix_range(prefix)
        return self.sorted_ids[lo:hi]

    def tokens_equal(self, data: bytes) -> list[int]:
        return self._exact.get(data, [])

    def prefixes_of(self, data: bytes) -> list[tuple[int, int]]:
        """(length, token id) for every token that is a non-empty prefix of `data` (length <= len(data))."""
        out = []
        for n in range(1, len(data) + 1):
            for i in self._exact.get(data[:n], ()):
                out.append((n, i))
        return out


def _successor(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string that starts with `prefix`."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)
