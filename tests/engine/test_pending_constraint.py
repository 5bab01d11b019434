"""A request whose constraint is still being made (a grammar compiling in another thread) has its prompt read
meanwhile, all but the last token; it samples nothing until the constraint is there, and a constraint that
cannot be made ends that request alone."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest

from tokenseam.engine import GenerationRequest, SamplingParams
from tokenseam.engine.llm_engine import run_sync
from tokenseam.engine.sequence import ChoiceEvent, RequestDone
from tokenseam.grammar import GrammarError

pytestmark = pytest.mark.model


class Forced:
    """Allows exactly the next id of `ids`; finished after the last."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = list(ids)

    def fill_mask(self, out):
        out[:] = 0
        t = self.ids[0]
        out[t >> 5] = (1 << (t & 31)) - (1 << 32 if t & 31 == 31 else 0)

    def accept(self, token_id: int) -> bool:
        ok = token_id == self.ids[0]
        self.ids.pop(0)
        return ok

    def is_finished(self) -> bool:
        return not self.ids

    def is_active(self) -> bool:
        return True


class Sink:
    def __init__(self) -> None:
        self.events: list = []
        self.done = threading.Event()

    def __call__(self, events: list) -> None:
        self.events.extend(events)
        if any(isinstance(e, RequestDone) for e in events):
            self.done.set()

    @property
    def tokens(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for e in self.events:
            if isinstance(e, ChoiceEvent):
                out.setdefault(e.index, []).extend(e.token_ids)
        return out


def _wait_for(cond, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def _held(engine, ids, pending, factory):
    """Submit a request whose constraint waits for `pending`, once it has read all but its last token."""
    sink = Sink()
    st = engine.submit(
        GenerationRequest(
            prompt_ids=ids,
            params=SamplingParams(max_tokens=8, temperature=0),
            constraint_factory=factory,
            constraint_pending=pending,
        ),
        sink,
    )
    _wait_for(lambda: st.seqs and st.prefill_pos == len(ids) - 1)
    return st, sink


def test_held_request_reads_its_prompt_then_waits_for_its_constraint(engine):
    ids = engine.backend.tokenizer.encode("The three primary colours are red, yellow and")
    forced = engine.backend.tokenizer.encode(" purple, always")
    pending: Future = Future()
    made = []

    def factory():
        made.append(1)
        return Forced(forced)

    sink = Sink()
    st = engine.submit(
        GenerationRequest(
            prompt_ids=ids,
            params=SamplingParams(n=2, max_tokens=20, temperature=1.0, seed=3),
            constraint_factory=factory,
            constraint_pending=pending,
        ),
        sink,
    )
    _wait_for(lambda: st.seqs and st.prefill_pos == len(ids) - 1)
    steps = engine.stats.steps
    time.sleep(0.3)
    # all but the last prompt token are in the KV; nothing sampled, no constraint made, and the engine sleeps
    # rather than stepping over nothing (a wait of HELD_WAIT_SECONDS per step at most)
    assert engine.backend.seq_len(st.seqs[0].seq_id) == len(ids) - 1
    assert not sink.events and not made
    assert engine.stats.steps - steps < 100
    # a plain request is served meanwhile
    plain = list(run_sync(engine, GenerationRequest(ids, SamplingParams(max_tokens=4, temperature=0)), 120))
    assert plain[-1].error is None and plain[-1].completion_tokens == 4
    assert not sink.events
    pending.set_result(None)
    assert sink.done.wait(120)
    done = sink.events[-1]
    assert done.error is None and done.completion_tokens == 2 * len(forced)
    assert sink.tokens == {0: forced, 1: forced}  # both choices follow it, one constraint each
    assert len(made) == 2
    assert engine.running_count == 0 and len(engine._free) == engine.n_slots


def test_a_constraint_that_cannot_be_made_ends_its_request_alone(engine):
    ids = engine.backend.tokenizer.encode("Once upon a time")
    pending: Future = Future()
    st, sink = _held(engine, ids, pending, lambda: pending.result(timeout=0))
    pending.set_exception(GrammarError("unsupported JSON Schema keyword 'x'"))
    assert sink.done.wait(120)
    assert not any(sink.tokens.values())
    assert "constraint failed" in sink.events[-1].error and "'x'" in sink.events[-1].error
    again = list(run_sync(engine, GenerationRequest(ids, SamplingParams(max_tokens=3, temperature=0)), 120))
    assert again[-1].error is None and again[-1].completion_tokens == 3
    assert engine.running_count == 0 and len(engine._free) == engine.n_slots


def test_a_held_request_can_be_cancelled(engine):
    ids = engine.backend.tokenizer.encode("A long time ago, in a galaxy far away")
    pending: Future = Future()
    st, sink = _held(engine, ids, pending, lambda: None)
    engine.cancel(st)
    assert sink.done.wait(60)
    assert sink.events[-1].completion_tokens == 0
    pending.set_result(None)  # too late: nothing happens
    _wait_for(lambda: engine.running_count == 0 and len(engine._free) == engine.n_slots)
    assert not any(sink.tokens.values())


def test_a_constraint_ready_before_the_prompt_is_read_costs_nothing(engine):
    ids = engine.backend.tokenizer.encode("Hello there")
    forced = engine.backend.tokenizer.encode(" friend")
    pending: Future = Future()
    pending.set_result(None)
    events = list(
        run_sync(
            engine,
            GenerationRequest(
                prompt_ids=ids,
                params=SamplingParams(max_tokens=5, temperature=0),
                constraint_factory=lambda: Forced(forced),
                constraint_pending=pending,
            ),
            120,
        )
    )
    assert events[-1].error is None
    assert [t for e in events if isinstance(e, ChoiceEvent) for t in e.token_ids] == forced
