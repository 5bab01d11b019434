"""FlatRows: the final NFA's edge and epsilon rows stored flat (offsets plus one numpy array)."""

from __future__ import annotations

from itertools import chain

import numba
import numpy as np


class FlatRows(dict):
    """A list of rows kept flat once it is final: offsets plus one numpy array (`off`, `data`). Row q is made
    into a tuple when first read and kept, so reading a row again is a plain dict lookup. Read-only. A compile
    reads a few hundred rows of tens of thousands, so nothing is converted for the rows never read (the
    offsets as a list cost more than every row read); `lists()` converts them all at once.

    A large grammar's NFA has tens of thousands of states, each with a list of edges and a list of epsilon
    edges. As Python lists and tuples they are objects the cyclic GC must traverse: the first collection
    after a compile took 10-30 ms, and every later full collection paid again. Flat, only the rows that
    Python-side state building reads become objects; the numba walk reads the arrays themselves."""

    __slots__ = ("off", "data", "_at")

    def __init__(self, rows: list[list], width: int) -> None:
        super().__init__()
        n = len(rows)
        self.off = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(np.fromiter(map(len, rows), dtype=np.int32, count=n), out=self.off[1:])
        m = int(self.off[-1])
        items = chain.from_iterable(chain.from_iterable(rows)) if width > 1 else chain.from_iterable(rows)
        data = np.fromiter(items, dtype=np.int32, count=width * m)
        self.data = data.reshape(m, width) if width > 1 else data
        self._at = memoryview(self.off)  # the offsets read as Python ints, without a copy

    @classmethod
    def grouped(cls, items: np.ndarray, n: int) -> FlatRows:
        """The rows of n states from `items` (int32, one per row: its state, then its values), each state's in
        the order they come."""
        off, data = _group(items, n)
        if off[0] < 0:
            raise ValueError("an item names a state out of range")
        self = cls.__new__(cls)
        dict.__init__(self)
        self.off = off
        self.data = data if items.shape[1] > 2 else data.reshape(-1)
        self._at = memoryview(off)
        return self

    def __missing__(self, q: int) -> tuple:
        at = self._at
        if not 0 <= q < len(at) - 1:
            raise IndexError(q)
        part = self.data[at[q] : at[q + 1]].tolist()
        r = tuple(map(tuple, part)) if self.data.ndim == 2 else tuple(part)
        dict.__setitem__(self, q, r)
        return r

    def lists(self) -> list[list]:
        """Every row as a list (of tuples, or of ints for width 1), converted in bulk: for a pass over all of
        them."""
        off = self.off.tolist()
        items = self.data.tolist()
        if self.data.ndim == 2:
            items = list(map(tuple, items))
        return [items[off[q] : off[q + 1]] for q in range(len(off) - 1)]

    def __setitem__(self, q, row) -> None:
        raise TypeError("FlatRows is read-only")

    def __len__(self) -> int:
        return len(self.off) - 1

    def __iter__(self):
        return (self[q] for q in range(len(self)))


@numba.njit(cache=True)
def _group(items, n):
    """A stable counting sort of `items` by their first column: (offsets per state, the other columns).
    off[0] is -1 if a state is out of range."""
    m, w = items.shape
    off = np.zeros(n + 1, np.int32)
    for i in range(m):
        q = items[i, 0]
        if q < 0 or q >= n:
            off[0] = -1
            return off, np.empty((0, w - 1), np.int32)
        off[q + 1] += 1
    for q in range(n):
        off[q + 1] += off[q]
    pos = off[:n].copy()
    data = np.empty((m, w - 1), np.int32)
    for i in range(m):
        q = items[i, 0]
        p = pos[q]
        for j in range(1, w):
            data[p, j - 1] = items[i, j]
        pos[q] = p + 1
    return off, data
