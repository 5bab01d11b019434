"""GrammarMatcher: one request's position in a compiled grammar; masks, token commits and rollback.

It also satisfies the engine's `Constraint` protocol (fill_mask / accept / is_finished / is_active).

When the automaton cannot go on (an ambiguous grammar leaves more parses open than it keeps: MAX_CLOSURE,
MAX_STATE_CONFIGS), the matcher does not fail the request: it moves to the exact GSS parser (gss.py) at the
position its committed bytes reach, and stays there; its positions are then gss.GSSPosition objects.

A live matcher keeps its grammar from being evicted from the compiler's cache (CompiledGrammar.users). When
the grammar is started over under the memory budget (CompiledGrammar.renew), the matcher moves its position to
the new generation at its next mask or commit (`_move`); the positions in its history are then the old
generation's, and a rollback to one of them replays the bytes committed since the start (`_path`) instead.
"""

from __future__ import annotations

import numpy as np

from .compiled import CompiledGrammar
from .errors import GrammarError
from .gss import GSSParser, GSSPosition

MAX_JUMP = 4096


def _clear_bits(row: np.ndarray, ids: np.ndarray) -> None:
    if ids.size:
        np.bitwise_and.at(row.view(np.uint32), ids >> 5, ~(np.uint32(1) << (ids & 31).astype(np.uint32)))


def _set_bits(row: np.ndarray, ids: np.ndarray) -> None:
    if ids.size:
        np.bitwise_or.at(row.view(np.uint32), ids >> 5, np.uint32(1) << (ids & 31).astype(np.uint32))


class GrammarMatcher:
    """Per-request matcher. EOS is allowed exactly when the grammar accepts; special tokens never.

    With `reasoning_end` (e.g. "</think>"), generation is free (any non-special token, never EOS) until the
    output ends with that tag (as text or as the special token whose text it is); the grammar starts right
    after it.

    `end_ids`: the tokens that end generation, in place of the vocabulary's EOS set (vLLM's per-request stop
    token ids). They are allowed exactly where the grammar accepts, and only as an end.
    """

    def __init__(
        self,
        compiled: CompiledGrammar,
        reasoning_end: str | None = None,
        end_ids: set[int] | frozenset[int] | list[int] | None = None,
    ) -> None:
        self.compiled = compiled
        compiled.users.add(self)
        self._auto, self._masks = compiled.current
        self._table = self._auto.table
        table_eos = {int(x) for x in self._table.eos}
        self._eos = table_eos if end_ids is None else {int(x) for x in end_ids}
        bad = sorted(i for i in self._eos if not 0 <= i < self._table.vocab_size)
        if bad:
            raise ValueError(
                f"end token ids {bad} are outside the vocabulary (size {self._table.vocab_size})"
            )
        # When the end set differs from the vocabulary's, the cached masks' EOS bits are swapped per fill.
        self._swap_ends: tuple[np.ndarray, np.ndarray] | None = None
        if self._eos != table_eos:
            self._swap_ends = (
                np.asarray(sorted(table_eos | self._eos), dtype=np.int64),
                np.asarray(sorted(self._eos), dtype=np.int64),
            )
        self._gss: GSSParser | None = None  # set when the automaton could not go on (see the module text)
        self._end_tag = reasoning_end.encode("utf-8") if reasoning_end else None
        self._free_mask: np.ndarray | None = None
        self._end_ids: set[int] = set()
        if self._end_tag is not None:
            tb = self._table
            self._end_ids = {i for i, b in enumerate(tb.token_bytes) if b == self._end_tag}
            free = ~tb.is_special.copy()
            free[list(self._end_ids)] = True
            free[list(self._eos)] = False
            bits = np.packbits(
                np.concatenate([free, np.zeros(tb.words * 32 - len(free), bool)]), bitorder="little"
            )
            self._free_mask = bits.view(np.int32).copy()
        self.reset()

    def reset(self) -> None:
        self._auto, self._masks = self.compiled.current
        self._state = self._auto.start if self._gss is None else self._gss.start
        self._history: list[int] = []
        self._path: list[bytes] = []  # the bytes committed to the grammar since its start, chunk by chunk
        self._marks: list[int] = []  # len(_path) at each history entry
        self._stale = 0  # history entries below this are positions of an older generation (see _move)
        self._terminated = False
        self._free = self._end_tag is not None
        self._tail = b""
        self._tail_stack: list[bytes] = []

    def _accept_free(self, tid: int) -> bool:
        tb = self._table
        if tid in self._eos or tid < 0 or tid >= tb.vocab_size:
            return False
        if tb.is_special[tid] and tid not in self._end_ids:
            return False
        # History entries in the free phase are -1 - (length of the kept tail) so rollback can restore it.
        self._history.append(-1 - len(self._tail))
        self._marks.append(len(self._path))
        self._tail_stack.append(self._tail)
        data = self._end_tag if tid in self._end_ids else tb.token_bytes[tid]
        tail = self._tail + data
        k = tail.find(self._end_tag)
        if k < 0:
            self._tail = tail[-len(self._end_tag) :]
            return True
        # The tag may end inside the token ("</think>\n{"): what follows it is the grammar's first input.
        rest = tail[k + len(self._end_tag) :]
        if rest:
            nxt = self._advance(rest)
            if nxt is None:
                self._history.pop()
                self._marks.pop()
                self._tail_stack.pop()
                return False
            self._state = nxt
            self._path.append(rest)
        self._free = False
        self._tail = b""
        return True

    # -- commits -----------------------------------------------------------------------------------------
    def accept_token(self, token_id: int) -> bool:
        if self._terminated:
            return False
        if self._auto is not self.compiled.current[0]:
            self._move()
        tid = int(token_id)
        if self._free:
            return self._accept_free(tid)
        if tid in self._eos:
            if not self.is_accepting():
                return False
            self._history.append(self._state)
            self._marks.append(len(self._path))
            self._terminated = True
            return True
        if tid < 0 or tid >= self._table.vocab_size or self._table.is_special[tid]:
            return False
        data = self._table.token_bytes[tid]
        if not data:
            return False
        nxt = self._advance(data)
        if nxt is None:
            return False
        self._history.append(self._state)
        self._marks.append(len(self._path))
        self._path.append(data)
        self._state = nxt
        return True

    def accept_bytes(self, data: bytes) -> bool:
        """Advance over raw bytes (e.g. prompt bytes removed by token healing); not a rollback step."""
        if self._terminated:
            return False
        if self._auto is not self.compiled.current[0]:
            self._move()
        if self._free:
            tail = self._tail + bytes(data)
            k = tail.find(self._end_tag)
            if k < 0:
                self._tail = tail[-len(self._end_tag) :]
                return True
            self._free = False
            self._tail = b""
            data = tail[k + len(self._end_tag) :]
        data = bytes(data)
        nxt = self._advance(data)
        if nxt is None:
            return False
        self._state = nxt
        if data:
            self._path.append(data)
        return True

    def rollback(self, n: int = 1) -> None:
        if n < 0 or n > len(self._history):
            raise ValueError(f"cannot roll back {n} tokens (only {len(self._history)} accepted)")
        for _ in range(n):
            h = self._history.pop()
            del self._path[self._marks.pop() :]
            if isinstance(h, GSSPosition):
                self._state = h
            elif h < 0:
                # Back into the free (reasoning) phase, before any grammar input.
                self._free = True
                self._tail = self._tail_stack.pop()
                self._state = self._auto.start if self._gss is None else self._gss.start
            else:
                self._state = h
        if n:
            self._terminated = False
        if self._gss is not None:
            if not isinstance(self._state, GSSPosition):  # a position from before the move to the GSS parser
                self._state = self._replay(self._gss)
            return
        if len(self._history) < self._stale:
            # Back to a position of an older generation: the same position in this one, from the start.
            self._stale = len(self._history)
            if not self._free:
                pid = self._auto.start
                try:
                    for chunk in self._path:
                        pid = self._auto.step_bytes(pid, chunk)
                except GrammarError:
                    self._fall_back()
                    return
                self._state = pid

    def _advance(self, data: bytes):
        """The position after `data` from the current one (None if the grammar cannot read it); moves to the GSS
        parser when the automaton cannot go on."""
        if self._gss is None:
            try:
                nxt = self._auto.step_bytes(self._state, data)
            except GrammarError:
                self._fall_back()
            else:
                self.compiled.settle()
                return None if nxt < 0 else nxt
        return self._gss.step_bytes(self._state, data)

    def _fall_back(self) -> None:
        """Move to the exact GSS parser, at the position the bytes committed so far reach (gss.py)."""
        auto = self._auto
        gss = GSSParser(auto.nfa, auto.table, self._masks._indent_rows)
        self._state = gss.start if self._free else self._replay(gss)
        self._gss = gss
        self.compiled.gss_fallbacks += 1
        memory = self.compiled.memory() if self.compiled.memory is not None else None
        if memory is not None:
            memory.note_gss_fallback()

    def _replay(self, gss: GSSParser) -> GSSPosition:
        p = gss.start
        for chunk in self._path:
            p = gss.step_bytes(p, chunk)
        assert p is not None, "committed bytes the GSS parser refuses"
        return p

    def _query(self, fn, *args):
        """fn(*args) on the automaton; after a move to the GSS parser (also when fn could not go on), None."""
        if self._gss is None:
            try:
                return fn(*args)
            except GrammarError:
                self._fall_back()
        return None

    def _move(self) -> None:
        """Move to the grammar's current generation (it was started over): the same position, in the new one."""
        auto, masks = self.compiled.current
        if self._gss is not None:  # positions are the GSS parser's: nothing to move
            self._auto, self._masks = auto, masks
            return
        if self._free:
            self._state = auto.start
        else:
            try:
                self._state = auto.import_position(self._auto.export_position(self._state))
            except GrammarError:
                self._fall_back()
                self._auto, self._masks = auto, masks
                return
        self._stale = len(self._history)
        self._auto, self._masks = auto, masks

    # -- queries -----------------------------------------------------------------------------------------
    def fill_next_token_bitmask(self, out: np.ndarray, index: int = 0) -> None:
        """Write the allowed-token bitmask (packed int32, bit i of word i//32) into `out` (or row `index`)."""
        row = out[index] if out.ndim == 2 else out
        if self._terminated:
            row[:] = 0
            return
        if self._free:
            row[:] = self._free_mask
            if self._swap_ends is not None:
                _clear_bits(row, self._swap_ends[0])
            return
        if self._auto is not self.compiled.current[0]:
            self._move()
        m = self._query(self._masks.mask, self._state)
        row[:] = self._gss.mask(self._state) if m is None else m
        self.compiled.settle()
        if self._swap_ends is not None:
            _clear_bits(row, self._swap_ends[0])
            if self.is_accepting():
                _set_bits(row, self._swap_ends[1])

    def is_accepting(self) -> bool:
        if self._free:
            return False
        return self._state.acc if self._gss is not None else self._auto.is_accepting(self._state)

    def is_terminated(self) -> bool:
        if self._terminated:
            return True
        if self._free:
            return False
        if not self.is_accepting():
            return False
        moves = self._query(self._masks.has_moves, self._state)
        if moves is None:
            moves = self._gss.has_moves(self._state)
        self.compiled.settle()  # the mask it took may be new
        return not moves

    def find_jump_forward_string(self) -> str:
        """The continuation the grammar forces from here (longest complete-UTF-8 prefix), or ''."""
        if self._free:
            return ""
        data = self._query(self._auto.forced_bytes, self._state, MAX_JUMP)
        if data is None:
            data = self._gss.forced_bytes(self._state, MAX_JUMP)
        self.compiled.settle()
        for cut in range(len(data), max(-1, len(data) - 4), -1):
            try:
                return data[:cut].decode("utf-8")
            except UnicodeDecodeError:
                continue
        return ""

    # -- engine Constraint protocol ----------------------------------------------------------------------
    def fill_mask(self, out: np.ndarray) -> None:
        self.fill_next_token_bitmask(out)

    def accept(self, token_id: int) -> bool:
        return self.accept_token(token_id)

    def is_finished(self) -> bool:
        return self.is_terminated()

    def is_active(self) -> bool:
        return True  # a grammar restricts every token, to the end

    @property
    def num_accepted_tokens(self) -> int:
        return len(self._history)
