"""Radix-tree prefix KV cache over token ids: requests that share a token prefix reuse its KV.

The tree records which *cache sequence* holds which path; `HostKV` keeps those sequences as host-memory
blobs (llama.cpp sequence state), so cached prefixes cost no KV cells and no attention time in the decode of
other requests. A hit restores the blob into the request's sequence.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from dataclasses import dataclass, field

# Ids of a cached continuation the miss report compares with a prompt's.
CONTINUATION_TOKENS = 256


@dataclass(eq=False)
class RadixNode:
    """An edge of the tree: `tokens` continue the parent's path; `depth` = tokens from the root to our end.

    `seq_id` is a cache sequence holding KV for at least positions [0, depth): a leaf owns its sequence;
    an inner node borrows one of its descendants'. `last_access` orders leaves for LRU eviction.
    No lock count is needed: a request that copied a path holds its own references to the cells, so
    evicting the path never takes KV away from a request in flight.
    """

    tokens: list[int]
    parent: RadixNode | None
    depth: int
    seq_id: int = -1
    children: dict[int, RadixNode] = field(default_factory=dict)
    last_access: float = 0.0

    @property
    def is_leaf(self) -> bool:
        return not self.children


class KVOps:
    """What the cache needs: llama.cpp's sequence operations (`HostKV` maps cache sequences to host blobs)."""

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None: ...


class KVRestoreError(Exception):
    """A cached prefix could not be put back into a request's sequence (treated as a miss)."""


class HostKV:
    """KVOps where the cache sequences (ids >= `first_cache_id`) live in host memory.

    Copying a request's sequence to a cache sequence saves positions [0, p1) of it as a blob (the whole path:
    a leaf always holds its path from the root); copying a cache sequence into a request's sequence restores
    the blob and trims it to p1. Cached prefixes thus take no KV cells: the device holds the running requests
    and what free slots keep from their last ones.
    """

    def __init__(self, backend, first_cache_id: int) -> None:
        self.backend = backend
        self.first_cache_id = first_cache_id
        self.blobs: dict[int, bytes] = {}

    @property
    def bytes_held(self) -> int:
        return sum(len(b) for b in self.blobs.values())

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        cache_src, cache_dst = src >= self.first_cache_id, dst >= self.first_cache_id
        if cache_dst and not cache_src:
            self.blobs[dst] = self.backend.save_prefix(src, p1)
        elif cache_src and not cache_dst:
            blob = self.blobs.get(src)
            if blob is None:
                raise KVRestoreError(f"cache sequence {src} holds no blob")
            if p0 > 0:
                raise ValueError("a cached path is restored from position 0")
            try:
                self.backend.load_prefix(dst, blob, p1)
            except Exception as e:
                raise KVRestoreError(str(e)) from e
        elif not cache_src and not cache_dst:
            self.backend.seq_cp(src, dst, p0, p1)
        else:
            raise ValueError("copying between two cache sequences is not supported")

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None:
        if seq_id >= self.first_cache_id:
            if p0 <= 0 and p1 < 0:
                self.blobs.pop(seq_id, None)
            return
        self.backend.seq_rm(seq_id, p0, p1)


@dataclass
class PrefixCacheStats:
    hit_tokens: int = 0
    miss_tokens: int = 0
    evictions: int = 0
    inserted_tokens: int = 0


class PrefixCache:
    """LRU radix cache of token paths, stored in llama.cpp sequences `seq_ids`, bounded by `max_tokens`.

    A new branch is inserted only when it adds at least `block_size` tokens, so the cache does not hold a copy
    of the path for every stray tail; a path that continues a leaf extends it to the token. Each leaf's sequence holds its whole path from the root (a host blob cannot share its head with
    another), so the budget counts every leaf's depth.
    """

    def __init__(
        self, kv: KVOps, seq_ids: list[int], max_tokens: int, block_size: int = 16, bytes_per_token: int = 0
    ) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.kv = kv
        self.block_size = block_size
        self.max_tokens = max_tokens
        self.bytes_per_token = bytes_per_token
        self.root = RadixNode([], None, 0)
        self._free_seqs = list(reversed(seq_ids))
        self.tokens_held = 0
        self.stats = PrefixCacheStats()
        # The paths of the latest evictions (ids), for the miss report to name "evicted"; bounded in tokens.
        self._ghosts: deque[array] = deque()
        self._ghost_tokens = 0
        self.max_ghost_tokens = max(4096, max_tokens)

    @property
    def bytes_held(self) -> int:
        return self.tokens_held * self.bytes_per_token

    @property
    def enabled(self) -> bool:
        return self.max_tokens >= self.block_size and bool(self._free_seqs or self.root.children)

    # ------------------------------------------------------------------ lookup
    def match(self, tokens: list[int]) -> tuple[int, int]:
        """(matched length, cache sequence holding it) for the longest cached prefix of `tokens`."""
        node, matched, now = self.root, 0, time.monotonic()
        seq = -1
        while matched < len(tokens):
            child = node.children.get(tokens[matched])
            if child is None:
                break
            k = _common(child.tokens, tokens, matched)
            matched += k
            child.last_access = now
            seq = child.seq_id
            if k < len(child.tokens):
                break
            node = child
        return matched, seq

    def load(self, tokens: list[int], dst_seq: int, limit: int) -> int:
        """Share the longest cached prefix of `tokens` (at most `limit` tokens) into `dst_seq`; return its length.

        `dst_seq` must be empty. Counts hit and miss tokens against len(tokens).
        """
        matched, seq = self.match(tokens)
        n = min(matched, limit)
        if n > 0:
            try:
                self.kv.seq_cp(seq, dst_seq, 0, n)
            except KVRestoreError:
                self.kv.seq_rm(dst_seq)
                n = 0
        self.stats.hit_tokens += n
        self.stats.miss_tokens += len(tokens) - n
        return n

    # ------------------------------------------------------------------ miss report
    def explain(self, tokens: list[int], reused: int, vocab, held: list[int] | None = None) -> dict:
        """Why `tokens` reused `reused` ids and not more: the cause and where the cache parted from the prompt.

        Causes: `hit` (all but the last prompt token, which is always decoded); `new` (the cache holds nothing
        that goes on past this point); `retokenized` (the cache goes on with the same text in other ids);
        `template` (the prompt leaves out text the cache holds here, as a chat template that strips an earlier
        reasoning block does); `end_of_turn` (one side has the model's end-of-generation token where the other
        has other text: an answer ended with the model's own end token, which the template writes as another
        mark); `edited` (the text differs from here on); `evicted` (a path that went on
        further was evicted); `restore_failed` (the cached KV could not be restored). `held`: the ids of the
        slot the prompt was decoded in when its prefix came from there (a resident slot) rather than the tree."""
        from ..healing.divergence import common_prefix, diverge

        out: dict = {"prompt_tokens": len(tokens), "matched_tokens": reused}
        if reused >= len(tokens) - 1:
            return {**out, "cause": "hit"}
        matched, _ = self.match(tokens)
        if matched > reused:
            return {**out, "cause": "restore_failed"}
        from_slot = held is not None and reused >= matched  # the slot held it: that is what the prompt left
        matched = max(matched, reused)
        best = max((common_prefix(g, tokens) for g in self._ghosts), default=0)
        if best > matched:
            return {**out, "cause": "evicted", "at_token": matched, "evicted_match_tokens": best}
        if from_slot:
            cont = list(held[matched : matched + CONTINUATION_TOKENS])
        else:
            cont = self.continuation(tokens, matched)
        if cont:
            d = diverge(vocab, tokens, list(tokens[:matched]) + cont, at=matched)
            cause = d.cause
            if cause == "stripped":
                cause = "template" if d.removed == "a" else "edited"
            detail = d.to_json()
            detail["prompt"], detail["cached"] = detail.pop("a"), detail.pop("b")
            detail.pop("cause")
            if "removed_from" in detail:
                detail["removed_from"] = "prompt" if d.removed == "a" else "cache"
            if "end_token_in" in detail:
                detail["end_token_in"] = "prompt" if d.end_token == "a" else "cache"
            return {**out, "cause": cause, **detail}
        return {**out, "cause": "new", "at_token": matched}

    def continuation(self, tokens: list[int], matched: int) -> list[int]:
        """The ids the cache holds after tokens[:matched] (which it holds), along the most recently used path."""
        node, pos = self.root, 0
        out: list[int] = []
        while pos < matched:
            child = node.children[tokens[pos]]
            if pos + len(child.tokens) > matched:
                out = child.tokens[matched - pos :]
                node = child
                break
            node, pos = child, pos + len(child.tokens)
        while node.children and len(out) < CONTINUATION_TOKENS:
            node = max(node.children.values(), key=lambda c: c.last_access)
            out = out + node.tokens
        return out[:CONTINUATION_TOKENS]

    def _remember_evicted(self, leaf: RadixNode) -> None:
        parts = []
        nd = leaf
        while nd is not None and nd is not self.root:
            parts.append(nd.tokens)
            nd = nd.parent
        path = array("i", [t for part in reversed(parts) for t in part])
        self._ghosts.append(path)
        self._ghost_tokens += len(path)
        while self._ghost_tokens > self.max_ghost_tokens and self._ghosts:
            self._ghost_tokens -= len(self._ghosts.popleft())

    # ------------------------------------------------------------------ insert
    def insert(self, tokens: list[int], src_seq: int) -> None:
        """Record that `src_seq` holds KV for `tokens` (positions 0..len-1).

        A path that continues a leaf extends it to the token (its sequence gains the positions: a conversation's
        next turn then matches all of it). A new branch stores its whole path as a new sequence, so it is kept
        (to the token) only when it adds at least a block of tokens the cache does not hold: a stray tail of a
        few tokens is not worth a copy of the path."""
        if self.max_tokens < self.block_size:
            return
        while True:  # make room first; an eviction may reshape the path, so walk again after each one
            node, pos, child, k = self._walk(tokens)
            extend = child is None and node is not self.root and node.is_leaf
            n = len(tokens)
            if pos + k >= n or (not extend and n - pos - k < self.block_size):
                return  # already covered (or, for a new branch, all but less than a block)
            grow = n - pos if extend else n  # a new leaf stores its whole path
            if self.tokens_held + grow <= self.max_tokens and (extend or self._free_seqs):
                break
            guard = {id(child)} if child is not None else set()
            p = node
            while p is not None:
                guard.add(id(p))
                p = p.parent
            if not self._evict_one(guard):
                return
        tokens = tokens[:n]
        now = time.monotonic()
        if child is not None:
            self._cut_node(child, k)
            node, pos = child.parent, pos + k
        rest = tokens[pos:]
        if extend:  # the leaf's sequence gains the new positions
            self.kv.seq_cp(src_seq, node.seq_id, pos, n)
            node.tokens = node.tokens + rest
            node.depth = n
            node.last_access = now
        else:
            seq = self._free_seqs.pop()
            self.kv.seq_rm(seq)
            self.kv.seq_cp(src_seq, seq, 0, n)
            node.children[rest[0]] = RadixNode(rest, node, n, seq, last_access=now)
        self.tokens_held += grow
        self.stats.inserted_tokens += len(rest)

    def _walk(self, tokens: list[int]) -> tuple[RadixNode, int, RadixNode | None, int]:
        """Deepest node whose whole path prefixes `tokens`, its depth, and a partially matched child (+ length)."""
        node, pos, now = self.root, 0, time.monotonic()
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            k = _common(child.tokens, tokens, pos)
            child.last_access = now
            if k < len(child.tokens):
                return node, pos, child, k
            node, pos = child, pos + k
        return node, pos, None, 0

    def _cut_node(self, node: RadixNode, k: int) -> None:
        """Cut `node` after its first k tokens: a new inner node takes its place above it."""
        upper = RadixNode(
            node.tokens[:k],
            node.parent,
            node.depth - len(node.tokens) + k,
            node.seq_id,
            last_access=node.last_access,
        )
        node.parent.children[upper.tokens[0]] = upper
        node.tokens = node.tokens[k:]
        node.parent = upper
        upper.children[node.tokens[0]] = node

    # ------------------------------------------------------------------ eviction
    def _evict_one(self, guarded: set[int]) -> bool:
        """Evict the least recently used leaf whose id() is not in `guarded`; free its sequence."""
        victim = None
        stack = [self.root]
        while stack:
            nd = stack.pop()
            if nd.is_leaf and nd is not self.root and id(nd) not in guarded:
                if victim is None or nd.last_access < victim.last_access:
                    victim = nd
            stack.extend(nd.children.values())
        if victim is None:
            return False
        self._remember_evicted(victim)
        parent = victim.parent
        del parent.children[victim.tokens[0]]
        self.kv.seq_rm(victim.seq_id)
        self._free_seqs.append(victim.seq_id)
        self.tokens_held -= victim.depth
        self.stats.evictions += 1
        # ancestors that borrowed the victim's sequence borrow a surviving descendant's instead
        p = parent
        while p is not self.root:
            if p.seq_id == victim.seq_id:
                p.seq_id = next(iter(p.children.values())).seq_id if p.children else -1
            p = p.parent
        if parent is not self.root and len(parent.children) == 1:
            only = next(iter(parent.children.values()))
            parent.tokens = parent.tokens + only.tokens
            parent.depth = only.depth
            parent.seq_id = only.seq_id
            parent.children = only.children
            for c in parent.children.values():
                c.parent = parent
            parent.last_access = max(parent.last_access, only.last_access)
        return True

    def clear(self) -> None:
        stack = list(self.root.children.values())
        while stack:
            nd = stack.pop()
            if nd.is_leaf:
                self.kv.seq_rm(nd.seq_id)
                self._free_seqs.append(nd.seq_id)
            stack.extend(nd.children.values())
        self.root.children = {}
        self.tokens_held = 0


def _common(edge: list[int], tokens: list[int], start: int) -> int:
    n = min(len(edge), len(tokens) - start)
    k = 0
    while k < n and edge[k] == tokens[start + k]:
        k += 1
    return k
