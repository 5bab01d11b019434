"""Call stacks as interned frames (`Stacks`), and the stack algebra positions are made of.

A stack id stands for a frame on a parent stack: (return state, or -1 - loop for a counter frame; parent id;
counter value). ROOT is the empty stack, BOT the local bottom ("whatever frames lie below", in a
stack-independent local state). A position (local state, parent stack P) keeps the frames above P rebased
onto BOT (`rebase`); `materialize` puts them back onto a real stack. Every stack made here is also written to
the numba builder (localbuild.LocalBuilder), which makes stacks of its own that `take_in` reads back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .budget import current
from .localbuild import BOT, ROOT

if TYPE_CHECKING:
    import numpy as np

    from .localbuild import LocalBuilder


class Stacks:
    """Every stack one automaton has made, by id; the same frame on the same parent is one id."""

    def __init__(self, builder: LocalBuilder) -> None:
        self.frames: list[tuple[int, int, int]] = [(-1, -1, 0), (-3, -3, 0)]  # ROOT and BOT (no frames)
        self.index: dict[tuple[int, int, int], int] = {}
        self.depth: list[int] = [0, 0]
        self._builder = builder
        for sid, (ret, parent, value) in enumerate(self.frames):
            builder.add_stack(sid, ret, parent, value)
        self._rebase_memo: dict[tuple[int, int], int] = {}
        self._mat_memo: dict[tuple[int, int], int] = {}

    def push(self, ret: int, parent: int, value: int = 0) -> int:
        """The stack id of frame (ret, value) on `parent`, made if new."""
        key = (ret, parent, value)
        sid = self.index.get(key)
        if sid is None:
            sid = len(self.frames)
            self.frames.append(key)
            self.index[key] = sid
            self.depth.append(self.depth[parent] + 1)
            self._builder.add_stack(sid, ret, parent, value)
        return sid

    def take_in(self, stk: np.ndarray, count: int) -> None:
        """Take in the stacks the numba builder made, up to id `count` (rows of `stk`)."""
        for sid in range(len(self.frames), count):
            key = ret, parent, value = tuple(stk[sid].tolist())
            self.frames.append(key)
            self.index[key] = sid
            self.depth.append(self.depth[parent] + 1)

    def common(self, sts) -> int:
        """The deepest stack that every stack in `sts` has below (or at) its top (localbuild._common)."""
        cur = set(sts)
        if len(cur) == 1:
            return next(iter(cur))
        stacks, depth = self.frames, self.depth
        d = min(depth[s] for s in cur)
        # Each stack is walked down to depth d only as far as a frame an earlier walk passed (its frame at
        # depth d is then known): every frame is passed once, where walking each stack to the end cost
        # depth x stacks (10,000 nested calls of a rule chain: 50 million steps).
        below: dict[int, int] = {}
        level = set()
        for s in cur:
            path = []
            while depth[s] > d and s not in below:
                path.append(s)
                s = stacks[s][1]
            s = below.get(s, s)
            for x in path:
                below[x] = s
            level.add(s)
        current().tick(len(below) + len(level))
        while len(level) > 1:
            level = {stacks[s][1] for s in level}
        return next(iter(level))

    def cut(self, p: int) -> int:
        """Counter frames on top of the common stack go into the local part (their values change with every
        loop pass); a call frame stays below, so a called rule's states are shared by all its callers."""
        stacks = self.frames
        while p != ROOT and stacks[p][0] < 0:
            p = stacks[p][1]
        return p

    def rebase(self, st: int, p: int) -> int:
        """Stack st with its frames above p put onto BOT instead (localbuild._reroot with base BOT)."""
        if st == p:
            return BOT
        key = (st, p)
        hit = self._rebase_memo.get(key)
        if hit is None:
            ret, parent, v = self.frames[st]
            hit = self._rebase_memo[key] = self.push(ret, self.rebase(parent, p), v)
        return hit

    def materialize(self, lst: int, p: int) -> int:
        """Local stack lst with BOT replaced by the real stack p (localbuild._reroot with `until` BOT)."""
        if lst == BOT:
            return p
        key = (lst, p)
        hit = self._mat_memo.get(key)
        if hit is None:
            ret, parent, v = self.frames[lst]
            hit = self._mat_memo[key] = self.push(ret, self.materialize(parent, p), v)
        return hit

    def top_frame(self, lst: int) -> int:
        """The frame right above the local bottom in local stack lst (BOT for lst == BOT)."""
        stacks = self.frames
        while lst != BOT and stacks[lst][1] != BOT:
            lst = stacks[lst][1]
        return lst
