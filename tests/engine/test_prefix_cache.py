"""The radix prefix cache's bookkeeping, checked against a model of llama.cpp's sequence/cell semantics."""

from __future__ import annotations

import random

import pytest

from tokenseam.engine.prefix_cache import KVRestoreError, PrefixCache


class FakeKV:
    """seq id -> {position: token}; seq_cp shares positions, seq_rm drops them (as llama.cpp's cells do)."""

    def __init__(self) -> None:
        self.seqs: dict[int, dict[int, int]] = {}

    def seq_cp(self, src, dst, p0=-1, p1=-1):
        d = self.seqs.setdefault(dst, {})
        for pos, t in self.seqs.get(src, {}).items():
            if (p0 < 0 or pos >= p0) and (p1 < 0 or pos < p1):
                d[pos] = t

    def seq_rm(self, seq, p0=-1, p1=-1):
        s = self.seqs.get(seq, {})
        for pos in [p for p in s if (p0 < 0 or p >= p0) and (p1 < 0 or p < p1)]:
            del s[pos]

    def fill(self, seq, tokens):
        self.seqs[seq] = dict(enumerate(tokens))


class FakeHostKV(FakeKV):
    """HostKV's semantics: a cache sequence (id >= 100) is a snapshot of positions [0, p1) of the source."""

    def seq_cp(self, src, dst, p0=-1, p1=-1):
        if dst >= 100:
            assert src < 100
            self.seqs[dst] = {pos: t for pos, t in self.seqs.get(src, {}).items() if pos < p1}
            return
        if src >= 100:
            if src not in self.seqs:
                raise KVRestoreError("no blob")
            self.seqs[dst] = {pos: t for pos, t in self.seqs[src].items() if pos < p1}
            return
        super().seq_cp(src, dst, p0, p1)

    def seq_rm(self, seq, p0=-1, p1=-1):
        if seq >= 100 and p0 < 0 and p1 < 0:
            self.seqs.pop(seq, None)
            return
        super().seq_rm(seq, p0, p1)


def check(cache: PrefixCache, kv: FakeKV):
    total = 0
    stack = [(c, []) for c in cache.root.children.values()]
    while stack:
        node, path = stack.pop()
        path = path + node.tokens
        total += node.depth if node.is_leaf else 0  # a leaf's sequence holds its whole path
        assert node.depth == len(path)
        held = kv.seqs[node.seq_id]
        assert [held.get(i) for i in range(len(path))] == path  # the node's sequence really holds its path
        assert node.is_leaf or len(node.children) >= 2  # compressed
        stack.extend((c, path) for c in node.children.values())
    assert total == cache.tokens_held <= cache.max_tokens


def test_shared_prefix_is_found_and_loaded():
    kv = FakeKV()
    cache = PrefixCache(kv, list(range(100, 104)), max_tokens=1000, block_size=4)
    a = list(range(40))
    kv.fill(0, a)
    cache.insert(a, 0)
    kv.seq_rm(0)  # the request's own sequence is cleared; the cache keeps the cells
    b = a[:22] + [999] * 10
    n = cache.load(b, 1, limit=len(b) - 1)
    assert n == 22 and [kv.seqs[1][i] for i in range(22)] == a[:22]
    assert cache.stats.hit_tokens == 22 and cache.stats.miss_tokens == 10
    check(cache, kv)


def test_a_new_branch_is_kept_only_when_it_adds_a_block():
    kv = FakeKV()
    cache = PrefixCache(kv, [10, 11, 12], max_tokens=200, block_size=16)
    kv.fill(0, list(range(40)))
    cache.insert(list(range(40)), 0)
    assert cache.tokens_held == 40 and cache.match(list(range(40)))[0] == 40  # to the token
    near = list(range(30)) + [99] * 15  # parts at 30 and adds 15 < 16 tokens: not worth a copy of its path
    kv.fill(1, near)
    cache.insert(near, 1)
    assert cache.tokens_held == 40 and cache.match(near)[0] == 30
    far = list(range(30)) + [98] * 16
    kv.fill(1, far)
    cache.insert(far, 1)
    assert cache.match(far)[0] == 46 and cache.tokens_held == 86
    check(cache, kv)


def test_lru_eviction_under_budget_and_sequence_pool():
    kv = FakeKV()
    cache = PrefixCache(kv, [50, 51, 52], max_tokens=64, block_size=8)
    for i in range(6):
        toks = [1000 * i + j for j in range(32)]
        kv.fill(0, toks)
        cache.insert(toks, 0)
        check(cache, kv)
    assert cache.tokens_held <= 64 and cache.stats.evictions >= 4
    assert cache.match([5000 + j for j in range(32)])[0] == 32  # the newest survives
    assert cache.match([0 + j for j in range(32)])[0] == 0


@pytest.mark.parametrize("host_blobs", [False, True])
def test_random_workload_keeps_invariants(host_blobs):
    rng = random.Random(7)
    kv = FakeHostKV() if host_blobs else FakeKV()
    cache = PrefixCache(kv, list(range(200, 216)), max_tokens=600, block_size=4)
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(4, 60))] for _ in range(10)]
    for step in range(400):
        base = rng.choice(prefixes)
        toks = base[: rng.randrange(1, len(base) + 1)] + [
            rng.randrange(50) for _ in range(rng.randrange(0, 30))
        ]
        slot = step % 4
        kv.seq_rm(slot)
        n = cache.load(toks, slot, limit=len(toks) - 1)
        assert [kv.seqs.get(slot, {}).get(i) for i in range(n)] == toks[:n]
        kv.fill(slot, toks)
        cache.insert(toks, slot)
        check(cache, kv)
    assert cache.stats.hit_tokens > 0 and cache.stats.evictions > 0


def test_host_blobs_budget_counts_each_leaf_whole_path():
    kv = FakeHostKV()
    cache = PrefixCache(kv, list(range(100, 110)), max_tokens=100, block_size=4)
    head = list(range(32))
    for i in range(4):
        toks = head + [1000 * (i + 1) + j for j in range(8)]
        kv.fill(0, toks)
        cache.insert(toks, 0)
        check(cache, kv)
    # two 40-token leaves fit in 100 tokens; the third insert evicted the oldest, and so on
    assert cache.tokens_held == 80 and cache.stats.evictions == 2
    assert cache.match(head + [4000 + j for j in range(8)])[0] == 40
    assert cache.match(head + [1000 + j for j in range(8)])[0] == 32  # the shared head is still there
    kv.seq_rm(1)
    assert cache.load(head + [1, 2, 3], 1, limit=34) == 32
    assert [kv.seqs[1][i] for i in range(32)] == head and 32 not in kv.seqs[1]


def test_host_blob_that_cannot_be_restored_is_a_miss():
    kv = FakeHostKV()
    cache = PrefixCache(kv, [100, 101], max_tokens=100, block_size=4)
    toks = list(range(16))
    kv.fill(0, toks)
    cache.insert(toks, 0)
    kv.seqs.pop(100)  # the blob is gone (a restore that llama.cpp refuses looks the same)
    kv.seq_rm(1)
    assert cache.load(toks + [99], 1, limit=16) == 0
    assert not kv.seqs.get(1) and cache.stats.miss_tokens == 17


def test_a_path_that_continues_a_leaf_is_kept_to_the_token():
    """A conversation's next turn: prompt + answer continue the cached prompt, so the leaf grows to the exact
    length (no block-edge loss), by any number of tokens."""
    kv = FakeHostKV()
    cache = PrefixCache(kv, [100, 101, 102], max_tokens=1000, block_size=16)
    prompt = list(range(40))
    kv.fill(0, prompt)
    cache.insert(prompt, 0)
    assert cache.match(prompt)[0] == 40
    turn = prompt + list(range(500, 523))  # the answer, 23 more tokens
    kv.fill(0, turn)
    cache.insert(turn, 0)
    check(cache, kv)
    assert cache.match(turn + [7, 8])[0] == len(turn)
    nxt = turn + [9, 9, 9]
    kv.fill(1, nxt)
    cache.insert(nxt, 1)  # and again, by 3 tokens
    assert cache.match(nxt)[0] == len(nxt) and cache.tokens_held == len(nxt)
    check(cache, kv)
    other = prompt[:20] + [77] * 30  # branches off inside, adding 30 tokens: a path of its own
    kv.fill(2, other)
    cache.insert(other, 2)
    assert cache.match(other)[0] == 50
    check(cache, kv)


class TinyVocab:
    """What the miss report reads of a vocabulary: bytes per id, special flags, texts and end-of-generation ids."""

    def __init__(
        self, pieces: list[bytes], special: set[int] = frozenset(), eos: set[int] = frozenset()
    ) -> None:
        self.token_bytes = pieces
        self.eos_token_ids = frozenset(eos)
        self.is_special = [i in special for i in range(len(pieces))]
        self.token_text = [p.decode("utf-8", "replace") for p in pieces]


# ids: 0 "<s>", 1 "\n", 2 "\n\n", 3 "Hi", 4 " there", 5 "Bye", 6 "<think>x</think>", 7 "ok", 8 "a", 9 "b",
# 10 "<eot>" (the model's end of turn)
VOCAB = TinyVocab(
    [b"<s>", b"\n", b"\n\n", b"Hi", b" there", b"Bye", b"<think>x</think>", b"ok", b"a", b"b", b"<eot>"],
    {0, 10},
    {10},
)


def _cached(paths: list[list[int]], max_tokens=1000) -> PrefixCache:
    kv = FakeHostKV()
    cache = PrefixCache(kv, list(range(100, 108)), max_tokens=max_tokens, block_size=1)
    for p in paths:
        kv.fill(0, p)
        cache.insert(p, 0)
    return cache


@pytest.mark.parametrize(
    "cached, prompt, cause",
    [
        ([[0, 8, 1, 1, 3, 4]], [0, 8, 2, 3, 4, 9], "retokenized"),  # "\n" "\n" came back as "\n\n"
        ([[0, 8, 3, 4, 9]], [0, 8, 5, 4, 9], "edited"),  # "Hi" became "Bye"
        ([[0, 8, 6, 7, 4, 4, 4]], [0, 8, 7, 4, 4, 4, 9], "template"),  # the reasoning block is gone
        ([[0, 8, 3]], [0, 8, 3, 4, 9, 9], "new"),  # the cache holds all it ever had of this prompt
        # the answer ended with the model's own end token; the template wrote "ok" after it instead
        ([[0, 8, 3, 10, 1, 9]], [0, 8, 3, 7, 1, 9, 9], "end_of_turn"),
        ([[0, 8, 3, 4, 9]], [0, 8, 3, 4, 9, 9], "hit"),
    ],
)
def test_the_miss_report_names_the_cause(cached, prompt, cause):
    cache = _cached(cached)
    n, _ = cache.match(prompt)
    n = min(n, len(prompt) - 1)
    rep = cache.explain(prompt, n, VOCAB)
    assert rep["cause"] == cause, rep
    assert rep["matched_tokens"] == n and rep["prompt_tokens"] == len(prompt)
    if cause == "retokenized":
        assert rep["prompt"]["ids"][0] == 2 and rep["cached"]["ids"][:2] == [1, 1]
        assert rep["at_token"] == 2 and rep["at_byte"] == len(b"<s>a")
    if cause == "template":
        assert rep["removed_from"] == "prompt" and rep["removed_bytes"] == len(b"<think>x</think>")
    if cause == "end_of_turn":
        assert rep["end_token_in"] == "cache" and rep["at_token"] == 3 and rep["cached"]["ids"][0] == 10


def test_the_miss_report_names_an_eviction():
    cache = _cached([], max_tokens=8)
    kv = cache.kv
    first = [0, 8, 8, 8, 8, 8]
    kv.fill(0, first)
    cache.insert(first, 0)
    kv.fill(0, [5, 9, 9, 9, 9, 9])
    cache.insert([5, 9, 9, 9, 9, 9], 0)  # no room for both: the first path is evicted
    n, _ = cache.match(first + [3])
    rep = cache.explain(first + [3], n, VOCAB)
    assert rep["cause"] == "evicted" and rep["evicted_match_tokens"] == len(first)
