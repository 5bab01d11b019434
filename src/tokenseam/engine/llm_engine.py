"""The engine: one thread that batches every running sequence into each llama_decode call (continuous batching).

Callers submit a `GenerationRequest` with an emit callback and receive `ChoiceEvent`s then one `RequestDone`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque

import numpy as np

from ..constraint import bitmask_to_bool
from ..healing.divergence import common_prefix
from .backend import LlamaCppBackend
from .errors import BackendError, ContextLengthError, InvalidRequestError, QueueFullError
from .prefix_cache import HostKV, PrefixCache
from .sampling import token_logprob
from .sequence import (
    ChoiceEvent,
    Emit,
    GenerationRequest,
    PromptLogprobs,
    RequestDone,
    RequestState,
    Sequence,
)

log = logging.getLogger("tokenseam.engine")
# Prompt tokens per decode when every position's logits are wanted (prompt logprobs): llama.cpp keeps a row of
# vocabulary-size floats per such token (64 x 262k x 4 bytes = 64 MiB for Gemma 3).
PROMPT_LOGPROB_CHUNK = 64


class Engine:
    """Continuous-batching scheduler over a `LlamaCppBackend`.

    Prompts are looked up in the radix prefix cache: the cached part is restored into the request's sequence
    from host memory and only the rest is decoded (`cached_tokens`). Prompts are cached after prefill, and
    prompt + output when a request finishes.
    """

    def __init__(self, backend: LlamaCppBackend, max_queue: int = 64) -> None:
        self.backend = backend
        self.vocab = backend.vocab
        self.max_queue = max_queue
        self.n_slots = backend.config.n_seq
        cfg = backend.config
        first = backend.n_seq_total  # cache sequence ids are host blobs, numbered past llama.cpp's sequences
        self.prefix_cache = PrefixCache(
            HostKV(backend, first),
            list(range(first, first + backend.n_cache_seqs)),
            cfg.prefix_cache_tokens,
            cfg.prefix_block,
            backend.kv_bytes_per_token,
        )
        self._slot_tokens: list[list[int]] = [[] for _ in range(self.n_slots)]
        self._free: set[int] = set(range(self.n_slots))
        # Finished sequences whose last sampled token is decoded in the next step before their KV is cached
        # (slot, token, position): the cache then holds the whole output, so a conversation's next turn, which
        # sends the answer back followed by the end of turn, matches through that token.
        self._tails: list[tuple[int, int, int]] = []
        # Free slots that still hold their last request's KV (slot -> its tokens, least recently used first):
        # a prompt that continues one is decoded in that slot with nothing restored. Bounded by
        # `resident_tokens`, since every held cell is visited by the other sequences' decodes.
        self._resident: OrderedDict[int, list[int]] = OrderedDict()
        rt = backend.config.resident_tokens
        self.resident_tokens = backend.config.n_ctx if rt < 0 else rt
        self.resident_hits = 0
        self._waiting: deque[RequestState] = deque()
        self._running: list[RequestState] = []
        self._cancel: set[int] = set()
        self._clears: list[threading.Event] = []  # clear_cache() calls for the engine thread to carry out
        self._cv = threading.Condition()
        self._stop = False
        self._mask = np.zeros(self.vocab.mask_words, dtype=np.int32)
        self.stats = EngineStats()
        # When the engine thread last finished a loop turn (monotonic): /health reads it to tell a busy engine
        # from a stuck one.
        self.last_progress = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="tokenseam-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API (any thread)
    def submit(self, request: GenerationRequest, emit: Emit) -> RequestState:
        """Queue a request. Raises InvalidRequestError / ContextLengthError / QueueFullError at once."""
        p = request.params
        p.validate(self.backend.n_vocab)
        n_prompt = len(request.prompt_ids)
        if n_prompt == 0:
            raise InvalidRequestError("the prompt is empty (it tokenizes to no tokens)", "prompt")
        if any(not 0 <= t < self.backend.n_vocab for t in request.prompt_ids):
            raise InvalidRequestError("the prompt contains token ids outside the vocabulary", "prompt")
        n_ctx = self.backend.n_ctx
        if n_prompt >= n_ctx:
            raise ContextLengthError(
                f"the prompt is {n_prompt} tokens but the context window is {n_ctx} tokens", "prompt"
            )
        if p.max_tokens is not None and n_prompt + p.max_tokens > n_ctx:
            raise ContextLengthError(
                f"prompt ({n_prompt} tokens) + max_tokens ({p.max_tokens}) exceeds the context window of "
                f"{n_ctx} tokens",
                "max_tokens",
            )
        if p.n > self.n_slots:
            raise InvalidRequestError(
                f"n={p.n} exceeds the server's parallel sequences ({self.n_slots})", "n"
            )
        state = RequestState(request, emit)
        with self._cv:
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(f"the request queue is full ({self.max_queue} waiting); retry shortly")
            if not self._waiting and not self._running:
                self.last_progress = time.monotonic()  # idle until now: the stall clock starts here
            self._waiting.append(state)
            self._cv.notify()
        return state

    def cancel(self, state: RequestState) -> None:
        """Abort a request (client gone): its sequences stop and their KV is freed before the next decode."""
        with self._cv:
            self._cancel.add(state.id)
            self._cv.notify()

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    @property
    def running_count(self) -> int:
        return len(self._running)

    def stalled_seconds(self) -> float:
        """How long the engine has had work without finishing a step (0 when idle or progressing); a dead
        engine thread counts as stalled since its last step."""
        busy = bool(self._waiting or self._running)
        if not self._thread.is_alive() and not self._stop:
            busy = True
        return time.monotonic() - self.last_progress if busy else 0.0

    def clear_cache(self, timeout: float = 30.0) -> bool:
        """Drop every cached prefix, the radix tree's and the resident slots', then return (True once done).
        The engine thread does it between steps, since it owns the KV."""
        done = threading.Event()
        with self._cv:
            self._clears.append(done)
            self._cv.notify()
        return done.wait(timeout)

    def _do_clears(self, clears: list[threading.Event]) -> None:
        self.prefix_cache.clear()
        for slot in self._resident:
            self.backend.seq_rm(slot)
        self._resident.clear()
        for ev in clears:
            ev.set()

    def shutdown(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        while True:
            with self._cv:
                while (
                    not self._stop
                    and not self._waiting
                    and not self._running
                    and not self._cancel
                    and not self._tails
                    and not self._clears
                ):
                    self._cv.wait()
                if self._stop:
                    break
                cancels, self._cancel = self._cancel, set()
                clears, self._clears = self._clears, []
            self.last_progress = time.monotonic()
            self._apply_cancels(cancels)
            if clears:
                self._do_clears(clears)
            self._admit()
            if not self._running and not self._tails:
                continue
            try:
                self._step()
            except BackendError as e:
                log.error("decode failed, aborting %d requests: %s", len(self._running), e)
                for st in list(self._running):
                    self._abort(st, str(e))
                self.backend.clear()
                self.prefix_cache.clear()
                self._slot_tokens = [[] for _ in range(self.n_slots)]
                self._free.update(slot for slot, _, _ in self._tails)
                self._tails = []
                self._resident.clear()
            except Exception as e:  # a bug must not kill the engine thread and hang every client
                log.exception("engine step failed")
                for st in list(self._running):
                    self._abort(st, f"internal error: {e}")
                for slot, _, _ in self._tails:  # freed, not cached: their KV is not known to be sound
                    self.backend.seq_rm(slot)
                    self._slot_tokens[slot] = []
                    self._free.add(slot)
                self._tails = []
            self.last_progress = time.monotonic()

    def _apply_cancels(self, ids: set[int]) -> None:
        if not ids:
            return
        for st in list(self._running):
            if st.id in ids:
                self._abort(st, None, reason="abort")
        with self._cv:
            for st in list(self._waiting):
                if st.id in ids:
                    self._waiting.remove(st)
                    st.emit([RequestDone(len(st.prompt), 0, 0, error=None)])

    def _abort(self, st: RequestState, error: str | None, reason: str = "abort") -> None:
        events: list = []
        for s in st.seqs:
            if not s.finished:
                s.finish_reason = reason
                events.append(ChoiceEvent(s.index, [], "", finish_reason=reason))
            self.backend.seq_rm(s.seq_id)  # free the KV now
            self._slot_tokens[s.seq_id] = []
            self._free.add(s.seq_id)
        st.seqs = []
        st.done = True
        if st in self._running:
            self._running.remove(st)
        events.append(RequestDone(len(st.prompt), 0, st.cached_tokens, error=error))
        st.emit(events)

    def _admit(self) -> None:
        while True:
            with self._cv:
                if not self._waiting or len(self._free) < self._waiting[0].request.params.n:
                    return
                st = self._waiting.popleft()
            prompt = st.prompt
            # decode at least one prompt token, to get logits; all of them when their logprobs are wanted
            wants_lps = st.request.prompt_logprobs is not None
            limit = len(prompt) - 1
            home, held = (-1, 0) if wants_lps else self._resident_match(prompt, limit)
            cached = 0 if wants_lps or held == limit else min(self.prefix_cache.match(prompt)[0], limit)
            use_home = held > 0 and held >= cached
            held_toks = self._resident.get(home) if use_home else None
            slots = self._take_slots(st.request.params.n, home if use_home else -1)
            if use_home:
                reuse = held  # the slot still holds this prefix: keep it, drop the rest
                self.backend.seq_rm(home, reuse, -1)
                self.resident_hits += 1
                self.prefix_cache.stats.hit_tokens += reuse
                self.prefix_cache.stats.miss_tokens += len(prompt) - reuse
            else:
                reuse = 0 if wants_lps else self.prefix_cache.load(prompt, slots[0], limit=limit)
            if wants_lps:
                st.prompt_lps = [None]
            if st.request.explain_prefix:
                st.prefix_report = (
                    {"prompt_tokens": len(prompt), "matched_tokens": 0, "cause": "disabled"}
                    if wants_lps or not self.prefix_cache.enabled
                    else self.prefix_cache.explain(prompt, reuse, self.vocab, held=held_toks)
                )
            self._slot_tokens[slots[0]] = list(prompt[:reuse])
            st.prefill_pos = reuse
            st.cached_tokens = reuse
            st.seqs = [
                Sequence(st, i, slot, self.vocab, self.backend.n_vocab) for i, slot in enumerate(slots)
            ]
            st.seqs[0].n_past = reuse
            self.stats.prompt_tokens += len(prompt)
            self.stats.cached_tokens += reuse
            self._running.append(st)

    def _step(self) -> None:
        t0 = time.perf_counter()
        dec0 = self.backend.decode_seconds
        budget = self.backend.config.n_batch
        items: list[tuple[int, list[int], int, bool]] = []
        owners: list[tuple[RequestState, Sequence | None]] = []
        tails = list(self._tails)
        for slot, tok, pos in tails:
            items.append((slot, [tok], pos, False))
        budget -= len(tails)
        for st in self._running:
            if st.prefilling:
                continue
            for s in st.seqs:
                if not s.finished and budget > 0:
                    items.append((s.seq_id, [s.generated[-1]], s.n_past, True))
                    owners.append((st, s))
                    budget -= 1
        for st in self._running:
            if budget <= 0:
                break
            if not st.prefilling:
                continue
            s0 = st.seqs[0]
            # The last prompt token is always decoded on its own, so its logits do not depend on how much of
            # the prompt came from the prefix cache (llama.cpp's numerics vary with batch shape).
            end = len(st.prompt) if st.prefill_pos == len(st.prompt) - 1 else len(st.prompt) - 1
            size = budget if st.prompt_lps is None else min(budget, PROMPT_LOGPROB_CHUNK)
            chunk = st.prompt[st.prefill_pos : min(end, st.prefill_pos + size)]
            last = st.prefill_pos + len(chunk) == len(st.prompt)
            items.append(
                (
                    s0.seq_id,
                    chunk,
                    st.prefill_pos,
                    True if last else "all" if st.prompt_lps is not None else False,
                )
            )
            owners.append((st, None))
            budget -= len(chunk)
        logits = self.backend.decode(items)
        # A step of only finished requests' last tokens (decoded for the cache after their answers went out)
        if not owners:
            self.stats.upkeep_decode_seconds += self.backend.decode_seconds - dec0
        self._tails = []
        for slot, tok, _ in tails:
            self._slot_tokens[slot].append(tok)
        # Cache inserts copy a path's KV to host memory (tens of ms for a long one): they wait until this
        # step's tokens are out, so no request's next token waits for them.
        saves: list[tuple[list[int], int]] = []
        logits = logits[len(tails) :]
        items = items[len(tails) :]
        out: dict[int, list] = {}
        n_sampled = 0
        for (st, s), (_, toks, _, _), lg in zip(owners, items, logits, strict=True):
            if st.done:  # aborted earlier in this step (its constraint failed)
                continue
            if s is None:  # a prefill chunk
                if isinstance(lg, list):  # every position's logits: the logprob of the prompt token after it
                    k = st.request.prompt_logprobs or 0
                    for j, row in enumerate(lg):
                        st.prompt_lps.append(token_logprob(row, st.prompt[st.prefill_pos + j + 1], k))
                    lg = None
                st.prefill_pos += len(toks)
                st.seqs[0].n_past = st.prefill_pos
                self._slot_tokens[st.seqs[0].seq_id].extend(toks)
                if lg is None:
                    continue
                saves.append((st.prompt, st.seqs[0].seq_id))
                for sib in st.seqs[1:]:
                    self.backend.seq_cp(st.seqs[0].seq_id, sib.seq_id)
                    sib.n_past = st.prefill_pos
                    self._slot_tokens[sib.seq_id] = list(st.prompt)
                if st.prompt_lps is not None:
                    out.setdefault(st.id, []).append(PromptLogprobs(st.prompt_lps))
                if st.request.params.max_tokens == 0:  # the prompt was all that was asked for
                    for seq in st.seqs:
                        seq.finish_reason = "length"
                        out.setdefault(st.id, []).append(ChoiceEvent(seq.index, [], "", [], "length"))
                    continue
                for seq in st.seqs:
                    if not self._sample_into(out, st, seq, lg):
                        break
                    n_sampled += 1
            else:
                s.n_past += 1
                self._slot_tokens[s.seq_id].append(toks[0])
                if self._sample_into(out, st, s, lg):
                    n_sampled += 1
        for st in list(self._running):
            events = out.get(st.id)
            if all(s.finished for s in st.seqs):
                for s in st.seqs:
                    if self.prefix_cache.enabled and s.generated and s.n_past + 1 < self.backend.n_ctx:
                        self._tails.append((s.seq_id, s.generated[-1], s.n_past))
                    else:
                        self._release(s.seq_id)
                self._running.remove(st)
                st.done = True
                events = (events or []) + [
                    RequestDone(
                        len(st.prompt),
                        sum(len(s.generated) for s in st.seqs),
                        st.cached_tokens,
                        prefix_report=st.prefix_report,
                    )
                ]
            if events:
                st.emit(events)
        for slot, _, _ in tails:
            self._release(slot)
        for prompt, slot in saves:
            if self._slot_tokens[slot][: len(prompt)] == prompt:  # still held (not aborted meanwhile)
                self.prefix_cache.insert(prompt, slot)
        self.stats.generated_tokens += n_sampled
        self.stats.steps += 1
        self.stats.overhead_seconds += (time.perf_counter() - t0) - (self.backend.decode_seconds - dec0)

    def _release(self, slot: int) -> None:
        """A finished sequence's slot: its KV goes to the prefix cache and stays in the slot while the resident
        budget allows (the least recently used resident slots are cleared first)."""
        tokens = self._slot_tokens[slot]
        self.prefix_cache.insert(tokens, slot)
        self._slot_tokens[slot] = []
        self._free.add(slot)
        if not tokens or len(tokens) > self.resident_tokens or not self.prefix_cache.enabled:
            self.backend.seq_rm(slot)
            return
        self._resident[slot] = tokens
        held = sum(len(t) for t in self._resident.values())
        while held > self.resident_tokens:
            old, toks = self._resident.popitem(last=False)
            self.backend.seq_rm(old)
            held -= len(toks)

    @property
    def resident_held(self) -> int:
        """KV tokens the free slots keep for a next turn (read from other threads: a snapshot)."""
        return sum(len(t) for t in list(self._resident.values()))

    def _resident_match(self, prompt: list[int], limit: int) -> tuple[int, int]:
        """(free slot, length) of the longest prefix of `prompt` (at most `limit`) a resident slot holds."""
        best, best_n = -1, 0
        for slot, toks in self._resident.items():
            n = min(common_prefix(toks, prompt), limit)
            if n > best_n:
                best, best_n = slot, n
        return best, best_n

    def _take_slots(self, n: int, home: int) -> list[int]:
        """n free slots, `home` first if given; the others prefer slots that hold no resident KV, then the
        least recently used. Each is emptied except `home`, whose KV the caller trims."""
        rest = sorted(s for s in self._free if s != home and s not in self._resident)
        rest += [s for s in self._resident if s != home and s in self._free]
        slots = ([home] if home >= 0 else []) + rest
        slots = slots[:n]
        for s in slots:
            self._free.discard(s)
            self._resident.pop(s, None)
            if s != home:
                self.backend.seq_rm(s)
            self._slot_tokens[s] = []
        return slots

    def _sample_into(self, out: dict[int, list], st: RequestState, s: Sequence, logits: np.ndarray) -> bool:
        """Sample s's next token into out[st.id]. A failure here (a grammar over its state budget, a bug in an
        embedder's constraint) ends this request alone with an error; the others in the batch go on."""
        try:
            ev = self._sample(s, logits)
        except Exception as e:
            log.exception("request %d: sampling failed", st.id)
            out.pop(st.id, None)
            self._abort(st, f"sampling failed: {e}")
            return False
        out.setdefault(st.id, []).append(ev)
        return True

    def _without_ends(self, allowed: np.ndarray | None, p) -> np.ndarray | None:
        """`allowed` minus end-of-generation and stop ids (before `min_tokens`). When a constraint allows
        nothing else (a grammar that is complete), its end wins: the mask is left as it is."""
        ends = [t for t in (*self.backend.eog_ids, *p.stop_token_ids) if 0 <= t < self.backend.n_vocab]
        if p.ignore_eos:
            ends = [t for t in p.stop_token_ids if 0 <= t < self.backend.n_vocab]
        if not ends:
            return allowed
        out = np.ones(self.backend.n_vocab, dtype=bool) if allowed is None else allowed.copy()
        out[ends] = False
        return out if out.any() else allowed

    def _sample(self, s: Sequence, logits: np.ndarray) -> ChoiceEvent:
        allowed = None
        c = s.constraint
        if c is not None:
            self._mask.fill(0)
            c.fill_mask(self._mask)
            allowed = bitmask_to_bool(self._mask, self.backend.n_vocab)
        p = s.req.request.params
        if len(s.generated) < p.min_tokens:
            allowed = self._without_ends(allowed, p)
        tok, lp = s.sampler.sample(logits, allowed)
        if c is not None:
            if not c.accept(tok):
                log.warning("constraint refused the token it allowed (id %d)", tok)
            if not c.is_active():
                s.constraint = c = None  # it restricts nothing any more: no cost for later tokens
        s.generated.append(tok)
        text = s.detok.push(tok)
        reason = None
        if tok in self.backend.eog_ids and not p.ignore_eos:
            reason = "stop"
        elif tok in p.stop_token_ids:
            reason = "stop"
        elif s.detok.stopped:
            reason = "stop"
        elif c is not None and c.is_finished():
            reason = "stop"
        elif p.max_tokens is not None and len(s.generated) >= p.max_tokens:
            reason = "length"
        elif s.n_past + 1 >= self.backend.n_ctx:
            reason = "length"
        if reason is not None:
            text += s.detok.finish()
            s.finish_reason = reason
        return ChoiceEvent(s.index, [tok], text, [lp] if lp else [], reason, s.detok.stop_reason)


class EngineStats:
    """Counters the server exports to /metrics and the benchmark reads."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generated_tokens = 0
        self.steps = 0
        self.overhead_seconds = 0.0
        self.upkeep_decode_seconds = 0.0  # decode time of steps that served no request (cache upkeep only)


def run_sync(engine: Engine, request: GenerationRequest, timeout: float | None = None):
    """Submit and yield events from the calling thread (CLI, benchmarks, tests); cancels on early exit."""
    import queue

    q: queue.Queue = queue.Queue()
    st = engine.submit(request, lambda evs: q.put(evs))
    finished = False
    try:
        while True:
            for ev in q.get(timeout=timeout):
                yield ev
                if isinstance(ev, RequestDone):
                    finished = True
                    return
    finally:
        if not finished:
            engine.cancel(st)
