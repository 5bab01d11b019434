"""common_prefix: the same answer as comparing element by element, for bytes, lists, tuples and mixed kinds."""

from __future__ import annotations

import random

from tokenseam.vocab.prefix_memo import common_prefix


def _by_element(a, b, start=0):
    n = min(len(a), len(b))
    k = start
    while k < n and a[k] == b[k]:
        k += 1
    return k


def test_agrees_with_an_element_by_element_comparison():
    rng = random.Random(0)
    for _ in range(5000):
        n = rng.randrange(0, 300)
        a = [rng.randrange(3) for _ in range(n)]
        b = a[: rng.randrange(0, n + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 50))]
        start = min(rng.randrange(0, min(len(a), len(b)) + 1), _by_element(a, b))
        for x, y in (
            (a, b),
            (b, a),
            (tuple(a), tuple(b)),
            (a, tuple(b)),
            (bytes(a), bytes(b)),
            (a, bytes(b)),
        ):
            assert common_prefix(x, y, start) == _by_element(x, y, start), (x, y, start)


def test_long_texts_and_edges():
    a = bytes(range(256)) * 200
    for at in (0, 1, 31, 32, 33, 25_000, len(a) - 1):
        b = bytearray(a)
        b[at] ^= 1
        assert common_prefix(a, bytes(b)) == at
    assert common_prefix(a, a) == len(a)
    assert common_prefix(a, a[:100]) == 100
    assert common_prefix(b"", a) == 0 and common_prefix([], []) == 0
    assert common_prefix([1, 2, 3], [1, 2, 3], start=3) == 3
