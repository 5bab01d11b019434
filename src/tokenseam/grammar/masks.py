"""Token masks of an automaton's positions, and their caches (`MaskCache`, one per Automaton).

A mask is one numba walk (localbuild.walk_esc) over the byte-sorted vocabulary from a position's local state:
tokens the local state takes whole are certain under any parent stack; tokens that run past the local bottom
are grouped by the state they escape from and resolved against the real parent stack (`_resolve`). A position
whose configurations sit in several call frames is the union of its frame groups' masks (`frame_groups`).
Masks are kept in an LRU bounded by MASK_CACHE_BYTES; the per-local-state walks are kept whole. When the
compiler's grammar budget is spent (memory.py), `memoise` is turned off: masks are then computed exactly as
before but not kept (`unmemoised` counts them). `nbytes` is what the cache holds, kept as it grows.

The cache asks its automaton for states, rows and positions; it builds nothing itself. It belongs to the
CompiledGrammar beside the automaton (the automaton does not know it, so no reference cycle keeps them).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from .automaton import MAX_NEST
from .errors import GrammarError
from .localbuild import (
    BOT,
    NEED_PYTHON,
    NO_DEAD,
    TOO_DEEP,
    WALK_DONE,
    WALK_NEEDS_PYTHON,
    WALK_NO_ROOM,
    Direct,
)
from .localbuild import group_by_frame as _group_by_frame_nb
from .localbuild import walk_esc as _walk_esc_nb
from .tables import SubTable, TokenTable

if TYPE_CHECKING:
    from .automaton import Automaton

# The builders Python calls, at their compiled entry points (localbuild.Direct).
walk_esc = Direct(_walk_esc_nb)
group_by_frame = Direct(_group_by_frame_nb)

MASK_CACHE_BYTES = 128 * 1024 * 1024
# Python's share of a memo entry, beside its arrays' data (key tuple, dict slot, array headers), in bytes: the
# constants of memory.py's estimate, measured with tracemalloc (tests/grammar/test_memory.py checks them).
ENTRY_BYTES = 250


class MaskCache:
    """The masks of one automaton's positions: an LRU of packed masks over per-local-state walks."""

    def __init__(self, auto: Automaton) -> None:
        self._auto = auto
        self.table = auto.table
        self._lru: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self.mask_bytes = 0
        self.memoise = True  # whether computed masks are kept in the LRU (memory.GrammarMemory turns it off)
        self.unmemoised = 0  # masks computed and not kept because memoise was off
        self.walk_bytes = 0  # what the per-local-state walks, suffix tables and frame groups hold
        # With an indentation limit, each mask is filtered by the position's run of spaces/tabs.
        limit = auto.indent_limit
        self._indent_rows = self.table.indent_filters(limit) if limit is not None else None
        self._local_info: dict[int, tuple[np.ndarray, list[tuple[int, int]]]] = {}
        self._suffix_info: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]] = {}
        self._groups_tab: list[SubTable] = []
        self._frame_group_memo: dict[tuple[int, int], list[tuple] | None] = {}
        self._groups_out = np.empty((64, 2), dtype=np.int64)

    def mask(self, pid: int) -> np.ndarray:
        """The packed (int32) mask of the tokens allowed at position pid."""
        auto = self._auto
        k, p, acc, run = auto.pairs[pid]
        kc = auto.clamped(k) if k >= 0 else -1
        if self._indent_rows is None:
            return self._cached_mask((kc, p, acc), None)
        return self._cached_mask((kc, p, acc, run), run)

    def has_moves(self, pid: int) -> bool:
        """Whether some non-EOS token is allowed at pid."""
        m = self.mask(pid).view(np.uint32)
        eos = self.table.eos
        if self._auto.pairs[pid][2] and eos.size:
            m = m.copy()
            np.bitwise_and.at(m, eos >> 5, ~(np.uint32(1) << (eos & 31).astype(np.uint32)))
        return bool(m.any())

    @property
    def nbytes(self) -> int:
        """Bytes this cache holds (estimated as memory.py describes; no walk over its entries)."""
        return self.mask_bytes + len(self._lru) * ENTRY_BYTES + self.walk_bytes

    def forget_masks(self) -> None:
        """Drop every memoised mask (the walks they are made from stay)."""
        self._lru.clear()
        self.mask_bytes = 0

    def _cached_mask(self, key: tuple, run: int | None, depth: int = 0) -> np.ndarray:
        """The LRU of masks: keyed (local state, parent, accepting) before the indentation filter, with the
        run appended after it. `depth`: the masks this one is a part of (frame_groups)."""
        m = self._lru.get(key)
        if m is not None:
            self._lru.move_to_end(key)
            return m
        if run is None:
            m = self._mask_slow(key, depth)
        else:
            base = self._cached_mask(key[:3], None).view(np.uint32)
            outside, inside = self._indent_rows
            row = outside if run < 0 else inside[min(self._auto.indent_limit - run, len(inside) - 1)]
            m = (base & row).view(np.int32)
        if not self.memoise:
            self.unmemoised += 1
            return m
        self._lru[key] = m
        self.mask_bytes += m.nbytes
        while self.mask_bytes > MASK_CACHE_BYTES and len(self._lru) > 1:
            _, old = self._lru.popitem(last=False)
            self.mask_bytes -= old.nbytes
        return m

    def _mask_slow(self, key: tuple[int, int, bool], depth: int) -> np.ndarray:
        if depth > MAX_NEST:
            raise GrammarError(f"a mask split over more than {MAX_NEST} call frames")
        kc, p, acc = key
        tb = self.table
        parts = self.frame_groups(kc, p) if kc >= 0 else None
        if parts is not None:
            out = np.zeros(tb.words, dtype=np.uint32)
            for part in parts:
                out |= self._cached_mask(part, None, depth + 1).view(np.uint32)
        elif kc >= 0:
            certain, groups = self.local_info(kc)
            out = certain.copy()
            for s, gid in groups:
                self._resolve(s, p, gid, out)
        else:
            out = np.zeros(tb.words, dtype=np.uint32)
        if acc and tb.eos.size:
            np.bitwise_or.at(out, tb.eos >> 5, np.uint32(1) << (tb.eos & 31).astype(np.uint32))
        return out.view(np.int32)

    # -- walks -------------------------------------------------------------------------------------------
    def _walk_table(self, sid: int, tab: TokenTable | SubTable) -> tuple[np.ndarray, np.ndarray]:
        """Walk `tab` from local state sid: (packed mask of the tokens taken whole, escape records)."""
        auto = self._auto
        tb = self.table
        out = np.zeros(tb.words, dtype=np.uint32)
        states = np.empty(tb.maxlen + 1, dtype=np.int32)
        states[0] = sid
        pos = np.array([0, -1, NO_DEAD, 0, 0], dtype=np.int64)
        rec = np.empty((256, 3), dtype=np.int64)
        nrec = np.zeros(1, dtype=np.int64)
        fast = auto._fast
        while True:
            fast.index(auto)
            r = walk_esc(
                tab.data,
                tab.offs,
                tab.lcp,
                tab.skip,
                tab.ids,
                tab.safe_from,
                states,
                pos,
                out,
                rec,
                nrec,
                auto.builder_arrays(auto._walk_trans),
            )
            auto._sync()
            if r == WALK_DONE:
                break
            if r == WALK_NEEDS_PYTHON:
                byte = tab.data[tab.offs[pos[0]] + pos[1]]
                auto.fill(int(states[pos[1]]), auto._cls_of[byte])
            elif r == WALK_NO_ROOM:
                fast.grow(auto)
            else:  # WALK_REC_FULL
                grown = np.empty((rec.shape[0] * 4, 3), dtype=np.int64)
                grown[: rec.shape[0]] = rec
                rec = grown
        return out, rec[: nrec[0]]

    def _groups_of(self, tab: TokenTable | SubTable, rec: np.ndarray) -> list[tuple[int, int]]:
        """Escaping tokens grouped by the local state they escape from: [(state, group id)]."""
        if not len(rec):
            return []
        st = rec[:, 2]
        if (st == st[0]).all():  # the usual case: one group, in walk order already
            chunks = [rec]
        else:
            rec = rec[np.argsort(st, kind="stable")]
            chunks = np.split(rec, np.flatnonzero(np.diff(rec[:, 2])) + 1)
        groups = []
        for chunk in chunks:
            idx = chunk[:, 0]
            gid = len(self._groups_tab)
            sub = SubTable.suffixes(tab, idx, chunk[:, 1])
            self._groups_tab.append(sub)
            self.walk_bytes += ENTRY_BYTES + sum(
                a.nbytes for a in (sub.ids, sub.base, sub.offs, sub.data, sub.lcp, sub.skip, sub.safe_from)
            )
            groups.append((int(chunk[0, 2]), gid))
        return groups

    def local_info(self, kc: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """For local state kc: the tokens taken under any parent stack, and the escaping token groups."""
        hit = self._local_info.get(kc)
        if hit is None:
            tab = self.table
            budget = int(self._auto.budget[kc])
            bulk = tab.bulk(budget) if budget > 0 else None
            if bulk is not None:
                tab = bulk[1]
            out, rec = self._walk_table(kc, tab)
            if bulk is not None:
                out |= bulk[0]
            hit = self._local_info[kc] = (out, self._groups_of(tab, rec))
            self.walk_bytes += ENTRY_BYTES + out.nbytes + 64 * len(hit[1])
        return hit

    def suffix_info(self, kc: int, gid: int) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
        """Group gid's token suffixes from local state kc: (certain word indices, bits, escaping groups)."""
        key = (kc, gid)
        hit = self._suffix_info.get(key)
        if hit is None:
            tab = self._groups_tab[gid]
            out, rec = self._walk_table(kc, tab)
            idx = np.flatnonzero(out)
            hit = self._suffix_info[key] = (idx, out[idx], self._groups_of(tab, rec))
            self.walk_bytes += ENTRY_BYTES + idx.nbytes + hit[1].nbytes + 64 * len(hit[2])
        return hit

    def _resolve(self, s: int, p: int, gid: int, out: np.ndarray, depth: int = 0) -> None:
        """OR into `out` the tokens of group gid (escaping at local state s) that the real stack p accepts.
        `depth`: the frames below the local state the group has escaped through."""
        if depth > MAX_NEST:
            raise GrammarError(f"a token escapes through more than {MAX_NEST} call frames")
        k2, p2, acc2 = self._auto._escape_to(s, p, True)
        if k2 < 0:
            if acc2:
                w, b = self._groups_tab[gid].empty
                out[w] |= b
            return
        idx, bits, subs = self.suffix_info(k2, gid)
        out[idx] |= bits
        for s2, g2 in subs:
            self._resolve(s2, p2, g2, out, depth + 1)

    # -- positions split by call frame -------------------------------------------------------------------
    def frame_groups(self, kc: int, p: int) -> list[tuple] | None:
        """Local state kc's configurations grouped by the call frame right above the bottom, as the mask keys
        of their own positions; None when there is nothing to split. Built by localbuild.group_by_frame, else by
        its Python twin `_group_by_frame_py`; memoised.

        A set of configurations takes a token when one of them does, so a mask is the union of its groups'
        masks. A group inside a called rule is keyed by the rule's own states, shared by every call site (the
        extra members of each layer of a JSON object), so its walk over the vocabulary is done once."""
        hit = self._frame_group_memo.get((kc, p), 0)
        if hit != 0:
            return hit
        out = self._groups_out
        auto = self._auto
        n = auto._fast_call(group_by_frame, kc, p, auto.has_counters, out)
        if n == TOO_DEEP:
            raise GrammarError("a mask's configurations lie too deep below their call frames")
        if n != NEED_PYTHON:
            res = [(int(k), int(q), False) for k, q in out[:n].tolist()] if n else None
            self._frame_group_memo[(kc, p)] = res
            self.walk_bytes += ENTRY_BYTES + 64 * n
            return res
        return self._group_by_frame_py(kc, p)

    def _group_by_frame_py(self, kc: int, p: int) -> list[tuple] | None:
        """The Python twin of localbuild.group_by_frame, for what the numba one hands back."""
        auto = self._auto
        groups: dict[int, list] = {}
        stacks = auto.stacks
        for q, lst in auto._configs(kc):
            f = auto._stacks.top_frame(lst)
            if f != BOT and stacks[f][0] < 0:
                f = BOT  # a counter frame's configurations stay with the rest
            groups.setdefault(f, []).append((q, lst))
        res = None
        if len(groups) > 1:
            res = []
            for g in groups.values():
                real = {(q, auto._stacks.materialize(lst, p)) for q, lst in g}
                k2, p2, _, _ = auto.pairs[auto._position(real, False)]
                res.append((auto.clamped(k2), p2, False))
        self._frame_group_memo[(kc, p)] = res
        self.walk_bytes += ENTRY_BYTES + 64 * len(res or ())
        return res
