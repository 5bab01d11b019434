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
from . import draw
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
    TailHold,
)

log = logging.getLogger("tokenseam.engine")
# Prompt tokens per decode when every position's logits are wanted (prompt logprobs): llama.cpp keeps a row of
# vocabulary-size floats per such token (64 x 262k x 4 bytes = 64 MiB for Gemma 3).
PROMPT_LOGPROB_CHUNK = 64
# How many prompt tokens one step reads from several prompts together, and how many steps a waiting prompt
# may be passed over (see Engine._step).
PREFILL_GROUP_TOKENS = 16
PREFILL_MAX_PASSES = 8
# A finished answer's last token is decoded for the cache (the next turn's match) in a step of generated tokens
# when there is one; an idle engine decodes it at once, unless the request holds it (`TailHold`): then it waits
# until its holder releases it (the server, once the answer is written out) or TAIL_HOLD_SECONDS pass. That
# decode takes the cores: before the answer is out, it slows the writing of it. A fixed pause instead would
# make a client that sends its next turn at once find the token undecoded and read it again.
TAIL_HOLD_SECONDS = 0.05
# How long the engine sleeps when every running request holds its last prompt token for a constraint still
# being made (the constraint's future wakes it sooner; this only bounds a missed wake-up).
HELD_WAIT_SECONDS = 0.05
# A free slot's path that a prompt parts from keeps its tail (the part the prompt does not share) only when the
# tail is at least 1/TAIL_KEEP_RATIO of the path: keeping it copies the whole path (into another slot, or to
# host memory), while dropping it costs a re-read of the tail's tokens, and only if they are asked for again.
# A copied token costs far less than a read one (SmolLM2: 8,000 tokens through host memory in about 140 ms,
# 0.02 ms a token; a prompt token read in a long batch 0.5-1.5 ms), so the ratio leans towards keeping.
TAIL_KEEP_RATIO = 32


class Engine:
    """Continuous-batching scheduler over a `LlamaCppBackend`.

    A prompt's longest known prefix is reused and only the rest is decoded (`cached_tokens`). Known prefixes
    live in two tiers: the KV cells still on the device (running sequences, and free slots that keep their last
    request's KV, bounded by `resident_tokens`), taken as they are by a prompt that continues a free slot's path
    and copied into the request's sequence otherwise; and the radix prefix cache in host memory, restored from
    there. A path is copied to host memory only when its cells are about to be dropped (a slot evicted or taken
    for another prompt), never between a prompt and its first token when a free slot can take it.
    """

    def __init__(self, backend: LlamaCppBackend, max_queue: int = 64) -> None:
        draw.warm_up()  # the sampler's numba code, loaded now rather than by the first request's first token
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
        # slot -> (its request's TailHold, when the hold ends): read only for the slots in _tails
        self._tail_holds: dict[int, tuple[TailHold, float]] = {}
        # Free slots that still hold their last request's KV (slot -> its tokens, least recently used first):
        # a prompt that continues one reuses its cells with nothing restored. Bounded by `resident_tokens`: past
        # it, the least recently used slot's path is copied to the host prefix cache when another is released,
        # rather than when a prompt needs the slot.
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
        ids = request.prompt_ids
        if min(ids) < 0 or max(ids) >= self.backend.n_vocab:  # (two passes in C)
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
        if request.constraint_pending is not None:  # a step may be waiting for it: wake the engine when done
            request.constraint_pending.add_done_callback(lambda _: self._wake())
        return state

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify()

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
        for slot, _, _ in self._tails:  # finished, their last token not decoded yet: not kept either
            self.backend.seq_rm(slot)
            self._slot_tokens[slot] = []
            self._free.add(slot)
        self._tails = []
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
                    and not self._clears
                ):
                    if not self._tails:
                        self._cv.wait()
                        continue
                    now = time.monotonic()
                    ready = self._tails_ready_at(now)
                    if now >= ready:
                        break
                    self._cv.wait(ready - now)
                if self._stop:
                    break
                cancels, self._cancel = self._cancel, set()
                clears, self._clears = self._clears, []
            self.last_progress = time.monotonic()
            self._apply_cancels(cancels)
            if clears:
                self._do_clears(clears)
            try:
                if self._tails and self._next_turn_waits():
                    # A next turn came before its answer's last token was decoded (the server released the
                    # token once the answer was out, and the client was quicker than this thread): that token
                    # first, so the turn finds it cached rather than reading it again.
                    self._step()
                self._admit()
                if not self._running and not self._tails:
                    continue
                if not self._step():
                    # Nothing could be decoded: every running request holds its last prompt token for a
                    # constraint still being made. Wait for one (its future wakes us) or for new work.
                    with self._cv:
                        if not (self._waiting or self._cancel or self._clears or self._stop):
                            self._cv.wait(HELD_WAIT_SECONDS)
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

    def _next_turn_waits(self) -> bool:
        """Whether a waiting prompt continues a finished answer whose last token waits for its decode, in a step
        that can take that token (no running prompt being read)."""
        if any(st.prefilling for st in self._running):
            return False
        with self._cv:
            prompts = [st.prompt for st in self._waiting]
        for p in prompts:
            for slot, tok, _ in self._tails:
                toks = self._slot_tokens[slot]
                n = len(toks)
                if len(p) > n and p[n] == tok and p[:n] == toks:
                    return True
        return False

    def _tails_ready_at(self, now: float) -> float:
        """When an idle engine decodes the finished answers' last tokens: at once, unless every one is held
        (then when the first hold ends). Called under the lock."""
        ready = float("inf")
        for slot, _, _ in self._tails:
            held = self._tail_holds.get(slot)
            if held is None or held[0].released:
                return now
            ready = min(ready, held[1])
        return ready

    def release_tail(self, hold: TailHold) -> None:
        """The holder of a request's last tokens is done (its answer is out): an idle engine decodes them now.
        Any thread."""
        with self._cv:
            hold.released = True
            self._cv.notify()

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
                need = self._waiting[0].request.params.n if self._waiting else 0
            while len(self._free) < need and self._tails:
                slot, _, _ = self._tails.pop()  # a waiting request needs the slot: its last token is left out
                self._release(slot)
            with self._cv:
                if not self._waiting or len(self._free) < self._waiting[0].request.params.n:
                    return
                st = self._waiting.popleft()
            prompt = st.prompt
            # decode at least one prompt token, to get logits; all of them when their logprobs are wanted
            wants_lps = st.request.prompt_logprobs is not None
            self._adopt_tail(prompt)
            limit = len(prompt) - 1
            reusing = self.prefix_cache.enabled and not wants_lps
            src, held = self._device_match(prompt, limit) if reusing else (-1, 0)
            cached = 0 if not reusing or held == limit else min(self.prefix_cache.match(prompt)[0], limit)
            on_device = held > 0 and held >= cached
            held_toks = self._device_tokens(src) if on_device else None
            # A free slot whose whole path the prompt continues is taken as it is, and so is one the prompt
            # parts from when its tail is not worth a copy or no empty slot is left (it is trimmed); another
            # source (a running sequence, or a free slot whose tail is kept) is copied into a slot of its own.
            home = -1
            if on_device and src in self._free:
                if not self._tail_worth_keeping(held, len(held_toks)) or not self._has_empty_slot(
                    st.request.params.n, src
                ):
                    home = src
            slots = self._take_slots(st.request.params.n, home)
            if on_device:
                reuse = held
                if home >= 0:
                    # the part the prompt leaves goes to host memory first, if it is worth the copy (the slot
                    # keeps the prefix)
                    if self._tail_worth_keeping(reuse, len(held_toks)):
                        self.prefix_cache.insert(held_toks, home)
                    self.backend.seq_rm(home, reuse, -1)  # the slot holds this prefix: keep it, drop the rest
                else:
                    self.backend.seq_cp(src, slots[0], 0, reuse)
                self.resident_hits += 1
                self.prefix_cache.stats.hit_tokens += reuse
                self.prefix_cache.stats.miss_tokens += len(prompt) - reuse
            else:
                reuse = self.prefix_cache.load(prompt, slots[0], limit=limit) if reusing else 0
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

    def _step(self) -> bool:
        """One llama_decode over the running requests, then sampling; False if there was nothing to decode."""
        t0 = time.perf_counter()
        dec0 = self.backend.decode_seconds
        budget = self.backend.config.n_batch
        items: list[tuple[int, list[int], int, bool]] = []
        owners: list[tuple[RequestState, Sequence | None]] = []
        # Finished answers' last tokens ride in a step of generated tokens, where one more costs little, or in a
        # step of their own once the engine is idle; never in a step that reads a prompt, which on a CPU is
        # bound by arithmetic: each one would be a prompt token more before that prompt's first token.
        tails = [] if any(st.prefilling for st in self._running) else list(self._tails)
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
        # Prompts are read shortest remaining first, and a step takes further prompts only while its prompt
        # tokens stay within PREFILL_GROUP_TOKENS: on a CPU the prompt pass is bound by arithmetic, so reading
        # eight short prompts in one step gives none of them its first token before all are read (8 cached
        # prefixes with 8-token questions, SmolLM2: median first token 414 ms in one step, 240-300 ms read
        # in pairs, for 10-15 % more time to the last one). A prompt passed over for
        # PREFILL_MAX_PASSES steps goes first, so a long one is not starved by a stream of short ones.
        prefilling = sorted(
            (st for st in self._running if st.prefilling),
            key=lambda st: (st.passed_over < PREFILL_MAX_PASSES, len(st.prompt) - st.prefill_pos),
        )
        group = 0
        for st in prefilling:
            if st.held and not self._release_constraints(st):
                continue
            left = len(st.prompt) - st.prefill_pos
            if budget <= 0 or (group and group + left > PREFILL_GROUP_TOKENS):
                st.passed_over += 1
                continue
            st.passed_over = 0
            s0 = st.seqs[0]
            size = budget if st.prompt_lps is None else min(budget, PROMPT_LOGPROB_CHUNK)
            end = len(st.prompt)
            if st.prompt_lps is not None and st.prefill_pos < end - 1:
                end -= 1  # every position's logits up to the last token, then the last one's for sampling
            if st.held:  # its constraint is not there yet: the last token, whose logits are sampled, waits
                end = min(end, len(st.prompt) - 1)
                if st.prefill_pos >= end:
                    continue
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
            group += len(chunk)
        if not items:
            return False
        logits = self.backend.decode(items)
        # A step of only finished requests' last tokens (decoded for the cache after their answers went out)
        if not owners:
            self.stats.upkeep_decode_seconds += self.backend.decode_seconds - dec0
        if tails:
            self._tails = []
        for slot, tok, _ in tails:
            self._slot_tokens[slot].append(tok)
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
                # the other choices start from the prompt's KV (one save, a restore each)
                if len(st.seqs) > 1:
                    self.backend.seq_cp(st.seqs[0].seq_id, [sib.seq_id for sib in st.seqs[1:]])
                for sib in st.seqs[1:]:
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
                hold = st.request.tail_hold
                for s in st.seqs:
                    if self.prefix_cache.enabled and s.generated and s.n_past + 1 < self.backend.n_ctx:
                        self._tails.append((s.seq_id, self._tail_token(st, s), s.n_past))
                        if hold is None:
                            self._tail_holds.pop(s.seq_id, None)
                        else:
                            self._tail_holds[s.seq_id] = (hold, time.monotonic() + TAIL_HOLD_SECONDS)
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
        for slot, _, _ in tails:  # after this step's tokens are out: an eviction may copy KV to host memory
            self._release(slot)
        self.stats.generated_tokens += n_sampled
        self.stats.steps += 1
        self.stats.overhead_seconds += (time.perf_counter() - t0) - (self.backend.decode_seconds - dec0)
        return True

    def _release_constraints(self, st: RequestState) -> bool:
        """A held request whose constraint is ready gets it (one per choice) and may read its last prompt
        token; one still held reads the rest of its prompt meanwhile. False if its constraint could not be
        made: the request has ended alone with that error."""
        if not st.request.constraint_pending.done():
            return True  # still held: it reads all but its last token meanwhile
        factory = st.request.constraint_factory
        try:
            for s in st.seqs:
                s.constraint = factory() if factory else None
        except Exception as e:
            self._abort(st, f"constraint failed: {e}")
            return False
        st.held = False
        return True

    def _tail_token(self, st: RequestState, s: Sequence) -> int:
        """The id decoded after a finished answer, at its last position: the one generated, or, for a chat answer
        that ended with an end-of-generation id its template does not write (Gemma's `<eos>` where the template
        closes the turn with `<end_of_turn>`), the template's own, which the next turn's prompt holds there. The
        generated end id is never shown to the client, and its KV would be computed for nothing."""
        tok = s.generated[-1]
        end = st.request.turn_end
        if end is not None and tok != end and tok in self.backend.eog_ids:
            return end
        return tok

    def _adopt_tail(self, prompt: list[int]) -> None:
        """A finished request's slot whose last token waits for its decode (`_tails`), released now as a free
        slot when the prompt takes it over: a prompt that continues its path through that token (the next turn,
        sent at once) decodes the token as part of its prompt; one whose longest match is that path and that
        parts from it where the rest is not worth keeping (another question after the same document: see
        `_tail_worth_keeping`) takes the slot and trims it, as it would once the token was decoded, rather than
        copying the path from a busy slot. Any other tail waits for its decode."""
        for i, (slot, tok, _) in enumerate(self._tails):
            toks = self._slot_tokens[slot]
            if len(prompt) > len(toks) and prompt[len(toks)] == tok and prompt[: len(toks)] == toks:
                del self._tails[i]
                self._release(slot)
                return
        if not self._tails or len(prompt) < 2:
            return
        src, held = self._device_match(prompt, len(prompt) - 1)
        for i, (slot, _, _) in enumerate(self._tails):
            if slot == src and not self._tail_worth_keeping(held, len(self._slot_tokens[slot]) + 1):
                del self._tails[i]
                self._release(slot)
                return

    def _release(self, slot: int) -> None:
        """A finished sequence's slot: it keeps its KV for a next turn while the resident budget allows (the
        least recently used free slots are evicted first: their paths go to the host prefix cache)."""
        tokens = self._slot_tokens[slot]
        self._slot_tokens[slot] = []
        self._free.add(slot)
        if not tokens or not self.prefix_cache.enabled:
            self.backend.seq_rm(slot)
            return
        self._resident[slot] = tokens
        held = self.resident_held
        while held > self.resident_tokens and self._resident:
            old = next(iter(self._resident))
            held -= len(self._resident[old])
            self._evict(old)

    def _evict(self, slot: int) -> None:
        """Drop a free slot's KV. Its path is copied to the host prefix cache first, unless another slot holds
        all of it but less than a block (a prompt that parted from it late has a copy of that prefix) or the host
        cache already has it."""
        toks = self._resident.pop(slot)
        kept = max(
            (common_prefix(self._device_tokens(s), toks) for s in range(self.n_slots) if s != slot),
            default=0,
        )
        if len(toks) - kept >= self.prefix_cache.block_size:
            self.prefix_cache.insert(toks, slot)
        self.backend.seq_rm(slot)

    @property
    def resident_held(self) -> int:
        """KV tokens the free slots keep for a next turn (read from other threads: a snapshot)."""
        return sum(len(t) for t in list(self._resident.values()))

    def _device_tokens(self, slot: int) -> list[int]:
        """The ids whose KV a slot holds: a free slot's resident path, or a busy slot's decoded positions."""
        return self._resident.get(slot, []) if slot in self._free else self._slot_tokens[slot]

    def _device_match(self, prompt: list[int], limit: int) -> tuple[int, int]:
        """(slot, length) of the longest prefix of `prompt` (at most `limit`) whose KV a slot holds: a free
        slot's resident path, or the decoded positions of a busy one (which only grow while it runs)."""
        best, best_n = -1, 0
        for slot in range(self.n_slots):
            toks = self._device_tokens(slot)
            if toks and toks[0] == prompt[0]:
                n = min(common_prefix(toks, prompt), limit)
                if n > best_n:
                    best, best_n = slot, n
        return best, best_n

    def _tail_worth_keeping(self, shared: int, total: int) -> bool:
        """Whether a path of `total` tokens, `shared` of which a prompt continues, is worth copying whole so that
        its other `total - shared` keep their KV: a block or more (the host tree keeps no shorter branch) and at
        least 1/TAIL_KEEP_RATIO of the path."""
        tail = total - shared
        return tail >= self.prefix_cache.block_size and tail * TAIL_KEEP_RATIO >= total

    def _has_empty_slot(self, n: int, home: int) -> bool:
        """Whether n free slots other than `home` hold nothing (so `home` can keep its path)."""
        return sum(1 for s in self._free if s != home and s not in self._resident) >= n

    def _take_slots(self, n: int, home: int) -> list[int]:
        """n free slots, `home` first if given; the others prefer slots that hold no resident KV, then the
        least recently used (evicted: their paths go to host memory). Each is emptied except `home`, whose KV
        the caller trims."""
        rest = sorted(s for s in self._free if s != home and s not in self._resident)
        rest += [s for s in self._resident if s != home and s in self._free]
        slots = ([home] if home >= 0 else []) + rest
        slots = slots[:n]
        for s in slots:
            self._free.discard(s)
            if s == home:
                self._resident.pop(s, None)
            elif s in self._resident:
                self._evict(s)
            else:
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
