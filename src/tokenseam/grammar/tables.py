"""The vocabulary flattened for the mask walks: token tables (`TokenTable`, and `SubTable` for suffixes and
subsets of it) and the per-token facts the walk reads (common prefixes, skip links, where a token's tail of
string-safe characters starts, indentation runs).

One table per vocabulary, shared by every grammar compiled for it (`compiler.token_table`).
"""

from __future__ import annotations

import threading

import numba
import numpy as np

SKIP_DEPTHS = 4


@numba.njit(cache=True)
def _safe_from(data, offs):
    """Per token: where its tail of whole string-safe characters starts (ir.SAFE_RANGES: printable ASCII other
    than quote and backslash, or valid multi-byte UTF-8 other than ir.UNSAFE_CODE_POINTS); the token's length
    when it ends otherwise."""
    n = offs.shape[0] - 1
    out = np.empty(n, np.int64)
    for i in range(n):
        start = offs[i]
        j = offs[i + 1]
        while j > start:
            b = data[j - 1]
            if b < 0x80:
                if b < 0x20 or b > 0x7E or b == 0x22 or b == 0x5C:
                    break
                j -= 1
                continue
            # A multi-byte character ends here: find its lead byte and check the whole sequence.
            k = j - 1
            while k > start and k > j - 4 and 0x80 <= data[k] <= 0xBF:
                k -= 1
            lead = data[k]
            m = j - k
            if lead >= 0xF0:
                need = 4
            elif lead >= 0xE0:
                need = 3
            else:
                need = 2
            if lead < 0xC2 or lead > 0xF4 or m != need:
                break
            second = data[k + 1]
            if lead == 0xE0 and second < 0xA0:
                break
            if lead == 0xED and second > 0x9F:
                break
            if lead == 0xF0 and second < 0x90:
                break
            if lead == 0xF4 and second > 0x8F:
                break
            if m == 2 and lead == 0xC2 and second == 0x85:
                break  # U+0085
            if m == 3 and lead == 0xE2 and second == 0x80 and (data[k + 2] == 0xA8 or data[k + 2] == 0xA9):
                break  # U+2028, U+2029
            if m == 3 and lead == 0xEF and second == 0xBB and data[k + 2] == 0xBF:
                break  # U+FEFF
            j = k
        out[i] = j - start
    return out


@numba.njit(cache=True)
def _indent_runs(data, offs):
    """Per token: the length of its leading run of spaces/tabs, and of its longest such run after a newline."""
    n = offs.shape[0] - 1
    lead = np.zeros(n, np.int64)
    inner = np.zeros(n, np.int64)
    for i in range(n):
        run = 0
        after_nl = False
        first = True
        for j in range(offs[i], offs[i + 1]):
            b = data[j]
            if b == 0x20 or b == 0x09:
                run += 1
            else:
                if first:
                    lead[i] = run
                elif after_nl and run > inner[i]:
                    inner[i] = run
                first = False
                after_nl = b == 0x0A
                run = 0
        if first:
            lead[i] = run
        elif after_nl and run > inner[i]:
            inner[i] = run
    return lead, inner


@numba.njit(cache=True)
def _lcp(data, offs):
    """Common-prefix length of each byte string with the one before it (sorted strings, concatenated)."""
    n = offs.shape[0] - 1
    out = np.zeros(n, np.int64)
    for k in range(1, n):
        a = offs[k - 1]
        b = offs[k]
        m = min(offs[k] - a, offs[k + 1] - b)
        j = 0
        while j < m and data[a + j] == data[b + j]:
            j += 1
        out[k] = j
    return out


@numba.njit(cache=True)
def _code_points(data, offs):
    """Code points per (valid UTF-8) byte string: the bytes that are not continuation bytes."""
    n = offs.shape[0] - 1
    out = np.zeros(n, np.int64)
    for i in range(n):
        c = 0
        for j in range(offs[i], offs[i + 1]):
            if data[j] < 0x80 or data[j] >= 0xC0:
                c += 1
        out[i] = c
    return out


@numba.njit(cache=True)
def _gather(data, starts, lens, total):
    """The byte strings data[starts[k] : starts[k] + lens[k]], concatenated (at least one byte)."""
    out = np.zeros(max(total, 1), np.uint8)
    k = 0
    for j in range(starts.shape[0]):
        for b in range(starts[j], starts[j] + lens[j]):
            out[k] = data[b]
            k += 1
    return out


@numba.njit(cache=True)
def _skip_table(lcp, depths):
    n = lcp.shape[0]
    skip = np.empty((depths, n), np.int64)
    for k in range(depths):
        last = n
        for i in range(n - 1, -1, -1):
            skip[k, i] = last
            if lcp[i] <= k:
                last = i
    return skip


class TokenTable:
    """The vocabulary's trie flattened for the numba walk (shared by every grammar on that vocabulary)."""

    def __init__(self, vocab) -> None:
        trie = vocab.trie
        self.vocab_size = vocab.size
        self.words = vocab.mask_words
        lens = np.fromiter((len(b) for b in trie.sorted_bytes), dtype=np.int64, count=len(trie.sorted_bytes))
        self.offs = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=self.offs[1:])
        self.data = np.frombuffer(b"".join(trie.sorted_bytes), dtype=np.uint8).copy()
        self.lcp = trie.lcp.astype(np.int64)
        self.skip = _skip_table(self.lcp, SKIP_DEPTHS)
        self.ids = trie.sorted_ids.astype(np.int64)
        self.safe_from = _safe_from(self.data, self.offs)
        # Per token, its code points when it is made only of string-safe characters (see `bulk`).
        self.safe_cps = np.where(self.safe_from == 0, _code_points(self.data, self.offs), -1)
        self.max_safe_cps = int(self.safe_cps.max()) if len(self.ids) else 0
        self._bulk: dict[int, tuple[np.ndarray, SubTable] | None] = {}
        self._bulk_levels = [self.max_safe_cps] + [
            x for x in (48, 32, 24, 16, 12, 8) if x < self.max_safe_cps
        ]
        self._bulk_lock = threading.Lock()
        self.maxlen = int(lens.max()) if len(lens) else 1
        self.eos = np.asarray(sorted(vocab.eos_token_ids), dtype=np.int64)
        self.is_special = np.asarray(vocab.is_special, dtype=bool)
        self.token_bytes = vocab.token_bytes
        self.base = np.zeros(len(self.ids), dtype=np.int64)
        # (longest leading run, longest inner run, the longest inner run of all) per token, made once
        self._indent_runs: tuple[np.ndarray, np.ndarray, int] | None = None
        self._indent_filters: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._indent_lock = threading.Lock()  # grammars for one vocabulary compile in several threads

    def bulk(self, budget: int) -> tuple[np.ndarray, SubTable] | None:
        """For a state where any string-safe text of up to `budget` code points stays alive: (packed mask of the
        string-safe tokens that short, which it takes without a walk; the table of all other tokens, to walk).
        None when the walk would not be much smaller than the vocabulary's."""
        # A few budget levels (walking a token that could have been taken is only slower), so few tables.
        level = next((x for x in self._bulk_levels if x <= budget), None)
        if level is None:
            return None
        with self._bulk_lock:
            hit = self._bulk.get(level, 0)
            if hit == 0:
                take = (self.safe_cps >= 0) & (self.safe_cps <= level)
                rest = np.flatnonzero(~take)
                hit = None
                if len(rest) <= len(self.ids) // 8:
                    row = np.zeros(self.words * 32, dtype=bool)
                    row[self.ids[take]] = True
                    hit = (np.packbits(row, bitorder="little").view(np.uint32), SubTable.rows(self, rest))
                self._bulk[level] = hit
            return hit

    def indent_filters(self, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Packed masks of the tokens that keep every run of spaces/tabs after a raw newline within `limit`:
        (outside such a run; inside one with b more characters allowed, b = 0 .. longest leading run, one row
        each). Rows only depend on `limit` up to the longest run inside any token, and few limits are kept, so
        memory stays small whatever limits grammars ask for."""
        with self._indent_lock:
            return self._indent_filters_locked(limit)

    def _indent_filters_locked(self, limit: int) -> tuple[np.ndarray, np.ndarray]:
        if self._indent_runs is None:
            lead_s, inner_s = _indent_runs(self.data, self.offs)
            lead = np.zeros(self.vocab_size, dtype=np.int64)
            inner = np.zeros(self.vocab_size, dtype=np.int64)
            lead[self.ids] = lead_s
            inner[self.ids] = inner_s
            self._indent_runs = (lead, inner, int(inner.max()))
        lead, inner, longest = self._indent_runs
        cap = min(limit, longest)  # (the max over a 262k vocabulary took 60 µs, paid by every compile)
        f = self._indent_filters.get(cap)
        if f is not None:
            return f
        pad = np.zeros(self.words * 32 - self.vocab_size, dtype=bool)

        def pack(row: np.ndarray) -> np.ndarray:
            return np.packbits(np.concatenate([row, pad]), bitorder="little").view(np.uint32)

        outside = inner <= cap
        f = (pack(outside), np.stack([pack(outside & (lead <= b)) for b in range(int(lead.max()) + 1)]))
        if len(self._indent_filters) >= 8:
            self._indent_filters.pop(next(iter(self._indent_filters)))
        self._indent_filters[cap] = f
        return f


class SubTable:
    """Entries of a token table from some depth on, for walks that resume mid-token (tokens escaping a local
    state), or a subset of whole tokens walked like the vocabulary (`rows`)."""

    ids: np.ndarray
    base: np.ndarray  # where each entry starts inside its token
    offs: np.ndarray
    data: np.ndarray
    lcp: np.ndarray
    skip: np.ndarray
    safe_from: np.ndarray
    empty: tuple[np.ndarray, np.ndarray]  # entries with no bytes left: taken whenever the state is alive

    @classmethod
    def suffixes(cls, tab, idx: np.ndarray, depth: np.ndarray) -> SubTable:
        """The suffixes from `depth` on of the entries at positions `idx` of table `tab`, in that order: a walk
        needs no sorted order to be exact, and `idx` ascending keeps the entries that share a path together."""
        self = cls.__new__(cls)
        (self.ids, self.base, self.offs, self.data, self.lcp, self.skip, self.safe_from, words, bits) = (
            _suffix_arrays(tab.ids, tab.base, tab.offs, tab.data, idx, depth)
        )
        # suffix walks take every byte (safe_from = length): mid-token, no safe sink is known for the rest
        self.empty = (words, bits)
        return self

    @classmethod
    def rows(cls, table: TokenTable, idx: np.ndarray) -> SubTable:
        """Whole tokens at sorted positions `idx` (ascending) of `table`, walked like the vocabulary."""
        self = cls.suffixes(table, idx, np.zeros(len(idx), dtype=np.int64))
        self.safe_from = table.safe_from[idx]
        return self


@numba.njit(cache=True)
def _suffix_arrays(ids, base, offs, data, idx, depth):
    """SubTable.suffixes' arrays: ids, base, offs, data, lcp, skip, lengths, and the (word index, bits) of the
    entries with no bytes left, each word once."""
    n = idx.shape[0]
    s_ids = ids[idx]
    s_base = base[idx] + depth
    starts = offs[idx] + depth
    lens = offs[idx + 1] - starts
    s_offs = np.zeros(n + 1, np.int64)
    for k in range(n):
        s_offs[k + 1] = s_offs[k] + lens[k]
    s_data = _gather(data, starts, lens, s_offs[n])
    lcp = _lcp(s_data, s_offs)
    skip = _skip_table(lcp, SKIP_DEPTHS)
    m = 0
    for k in range(n):
        if lens[k] == 0:
            m += 1
    empty = np.empty(m, np.int64)
    m = 0
    for k in range(n):
        if lens[k] == 0:
            empty[m] = s_ids[k]
            m += 1
    empty.sort()
    words = np.empty(m, np.int64)
    bits = np.zeros(m, np.uint32)
    u = 0
    for k in range(m):
        w = empty[k] >> 5
        if u == 0 or words[u - 1] != w:
            words[u] = w
            u += 1
        bits[u - 1] |= np.uint32(1) << np.uint32(empty[k] & 31)
    return s_ids, s_base, s_offs, s_data, lcp, skip, lens, words[:u], bits[:u]
