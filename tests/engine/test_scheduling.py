"""The scheduler: prompts read shortest first in small groups, KV shared from the device tier, a finished
answer's last token taken over by the next turn."""

from __future__ import annotations

import threading
import time

import pytest

from tokenseam.engine import BackendConfig, Engine, GenerationRequest, LlamaCppBackend, SamplingParams
from tokenseam.engine.llm_engine import PREFILL_GROUP_TOKENS, TAIL_KEEP_RATIO, run_sync
from tokenseam.engine.sequence import ChoiceEvent, TailHold

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def engine(model_paths):
    be = LlamaCppBackend(model_paths["smollm2"], BackendConfig(n_ctx=1024, n_seq=4, n_threads=2))
    eng = Engine(be)
    yield eng
    eng.shutdown()
    be.close()


def _req(ids, n=2, hold=None):
    return GenerationRequest(
        prompt_ids=ids, params=SamplingParams(max_tokens=n, temperature=0, ignore_eos=True), tail_hold=hold
    )


def test_short_prompts_get_their_first_token_before_a_long_one(engine):
    """Queued together (the engine cannot admit any before all are in), the long prompt arrives first but
    is read after the short ones; the two short ones (within PREFILL_GROUP_TOKENS together) share a step."""
    tok = engine.backend.tokenizer
    long_ids = tok.encode("A long document about rivers and cities. " * 30)[:400]
    short = [tok.encode("Hi there"), tok.encode("Hello")]
    assert len(short[0]) + len(short[1]) <= PREFILL_GROUP_TOKENS < len(long_ids)
    assert engine.clear_cache()
    order: list[str] = []
    lock = threading.Lock()
    done = threading.Semaphore(0)

    def sink(name):
        def emit(events):
            with lock:
                if name not in order and any(isinstance(e, ChoiceEvent) and e.token_ids for e in events):
                    order.append(name)
            if any(type(e).__name__ == "RequestDone" for e in events):
                done.release()

        return emit

    steps = engine.stats.steps
    with engine._cv:  # held: the engine thread cannot admit until all three are queued
        engine.submit(_req(long_ids), sink("long"))
        engine.submit(_req(short[0]), sink("a"))
        engine.submit(_req(short[1]), sink("b"))
    for _ in range(3):
        assert done.acquire(timeout=120)
    assert order[-1] == "long" and set(order[:2]) == {"a", "b"}
    assert engine.stats.steps > steps


def test_next_turn_reuses_the_answer_through_its_last_token(engine):
    """Sent at once after the answer, a prompt that continues prompt + answer reuses all of it that has KV."""
    tok = engine.backend.tokenizer
    assert engine.clear_cache()
    prompt = tok.encode("Count with me: one, two, three,")
    out = []
    for ev in run_sync(engine, _req(prompt, n=6), timeout=120):
        if isinstance(ev, ChoiceEvent):
            out.extend(ev.token_ids)
    assert len(out) == 6
    nxt = prompt + out + tok.encode(" and then?")
    hits = engine.resident_hits
    cached = [
        ev.cached_tokens for ev in run_sync(engine, _req(nxt), timeout=120) if hasattr(ev, "cached_tokens")
    ]
    # its last token is read now if the next turn came first, or was decoded for the cache if not
    assert (
        cached[0] in (len(prompt) + len(out) - 1, len(prompt) + len(out)) and engine.resident_hits == hits + 1
    )


def _cached(engine, ids, hold=None):
    events = run_sync(engine, _req(ids, hold=hold), timeout=120)
    return next(e.cached_tokens for e in events if hasattr(e, "cached_tokens"))


def test_a_prompt_that_parts_from_a_free_slot_gets_a_copy_when_the_tail_is_worth_keeping(engine):
    """Another question after the same document, where the first question is a long part of the slot's path:
    the shared part is copied into a slot of its own, and the slot that held the first question keeps it (a
    third request with the first question again reuses it whole)."""
    tok = engine.backend.tokenizer
    assert engine.clear_cache()
    doc = tok.encode("Document: the river runs through the old city and past the harbor. " * 8)
    q1 = tok.encode("\nQuestion: where does the river run, which city does it pass, and what does it reach?")
    q2 = tok.encode("\nAnother question: what?")
    assert len(q1) >= engine.prefix_cache.block_size and len(q1) * TAIL_KEEP_RATIO >= len(doc + q1)
    hits = engine.resident_hits
    assert _cached(engine, doc + q1) == 0
    assert _cached(engine, doc + q2) >= len(doc)
    assert _cached(engine, doc + q1) == len(doc + q1) - 1  # all but the last token, decoded for its logits
    assert engine.resident_hits == hits + 2


def test_a_prompt_that_parts_from_a_free_slot_takes_it_when_the_tail_is_short(engine):
    """A tail shorter than a block, or than 1/TAIL_KEEP_RATIO of the path, is not worth copying the whole path
    for: the slot is taken and trimmed, and the first question is read again if it comes back."""
    tok = engine.backend.tokenizer
    assert engine.clear_cache()
    doc = tok.encode("Document: the river runs through the old city and past the harbor. " * 8)
    q1, q2 = tok.encode("\nQuestion: where?"), tok.encode("\nQuestion: what?")
    assert _cached(engine, doc + q1) == 0
    assert _cached(engine, doc + q2) >= len(doc)
    again = _cached(engine, doc + q1)
    assert len(doc) <= again < len(doc + q1) - 1


def test_a_prompt_sent_at_once_that_parts_from_a_finished_path_takes_its_slot(engine, monkeypatch):
    """Another question after the same document, sent before the first answer's last token was decoded: the
    prompt has no use for that token, so the slot is released without it and taken over (trimmed), not copied
    as a busy slot's path would be."""
    import tokenseam.engine.llm_engine as le

    tok = engine.backend.tokenizer
    assert engine.clear_cache()
    monkeypatch.setattr(le, "TAIL_HOLD_SECONDS", 60.0)  # the first answer's last token is still waiting
    doc = tok.encode("Document: the river runs through the old city and past the harbor. " * 8)
    q1, q2 = tok.encode("\nQuestion: where?"), tok.encode("\nQuestion: what?")
    assert _cached(engine, doc + q1, TailHold()) == 0
    (slot, _, _), *more = engine._tails
    assert not more
    seen: list[int] = []
    copies: list[tuple] = []
    real_decode, real_cp = engine.backend.decode, engine.backend.seq_cp
    monkeypatch.setattr(
        engine.backend, "decode", lambda items: seen.extend(i[0] for i in items) or real_decode(items)
    )
    monkeypatch.setattr(engine.backend, "seq_cp", lambda *a: copies.append(a) or real_cp(*a))
    assert _cached(engine, doc + q2) >= len(doc)
    assert not copies and set(seen) == {slot}  # read in the first request's slot, nothing copied
    ((s, _, pos),) = engine._tails  # the second answer's last token waits now; the first's was dropped
    assert s == slot and pos >= len(doc + q2)


def test_a_prompt_sent_at_once_leaves_a_finished_path_worth_keeping_to_its_decode(engine, monkeypatch):
    """The same, where the first question is a long part of the path: that path keeps its slot and its last
    token's decode, and the second prompt gets a copy of the document."""
    import tokenseam.engine.llm_engine as le

    tok = engine.backend.tokenizer
    assert engine.clear_cache()
    monkeypatch.setattr(le, "TAIL_HOLD_SECONDS", 60.0)
    doc = tok.encode("Document: the river runs through the old city and past the harbor. " * 8)
    q1 = tok.encode("\nQuestion: where does the river run, which city does it pass, and what does it reach?")
    q2 = tok.encode("\nQuestion: what?")
    assert _cached(engine, doc + q1, TailHold()) == 0
    (slot, _, _), *more = engine._tails
    assert not more
    copies: list[tuple] = []
    real_cp = engine.backend.seq_cp
    monkeypatch.setattr(engine.backend, "seq_cp", lambda *a: copies.append(a) or real_cp(*a))
    assert _cached(engine, doc + q2) >= len(doc)
    assert [c[0] for c in copies] == [slot]  # copied from the first request's slot, which kept its path
    assert _cached(engine, doc + q1) == len(doc + q1) - 1  # the first path was kept whole


def test_an_answers_last_token_does_not_ride_in_a_step_that_reads_a_prompt(engine, monkeypatch):
    """A finished answer's last token is decoded for the cache, but not in the step that reads the next,
    unrelated prompt (on a CPU each token there delays that prompt's first token): it rides in a step of
    generated tokens instead."""
    import tokenseam.engine.llm_engine as le

    tok = engine.backend.tokenizer
    assert engine.clear_cache()
    monkeypatch.setattr(le, "TAIL_HOLD_SECONDS", 60.0)  # the tail waits for other work, not for idleness
    calls: list[list[tuple[int, int]]] = []
    real = engine.backend.decode

    def decode(items):
        calls.append([(slot, len(toks)) for slot, toks, _, _ in items])
        return real(items)

    monkeypatch.setattr(engine.backend, "decode", decode)
    a = tok.encode("The first request, answered and done.")
    b = tok.encode("An unrelated second prompt about harbors and winter.")
    list(run_sync(engine, _req(a, n=3, hold=TailHold()), timeout=120))
    tail_slot = next(s for s, *_ in engine._tails)
    start = len(calls)
    list(run_sync(engine, _req(b, n=3), timeout=120))
    first, after = calls[start], calls[start + 1 :]
    assert len(first) == 1 and first[0][0] != tail_slot and first[0][1] > 1  # b's prompt, alone
    assert any((tail_slot, 1) in c and len(c) > 1 for c in after)  # with b's generated tokens
    assert all(slot != tail_slot for slot, _, _ in engine._tails)


def _wait(cond, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def test_a_held_answers_last_token_waits_for_its_release_or_the_time_limit(engine, monkeypatch):
    """An idle engine decodes a finished answer's last token at once; with a TailHold, only once the holder
    releases it (the server, when the answer is out) or TAIL_HOLD_SECONDS pass. A next turn then finds it."""
    import tokenseam.engine.llm_engine as le

    tok = engine.backend.tokenizer
    ids = tok.encode("A question about the harbor and its boats, asked once.")
    assert engine.clear_cache()
    monkeypatch.setattr(le, "TAIL_HOLD_SECONDS", 60.0)
    hold = TailHold()
    events = list(run_sync(engine, _req(ids, n=3, hold=hold), timeout=120))
    answer = [t for e in events if hasattr(e, "token_ids") for t in e.token_ids]
    time.sleep(0.3)
    assert len(engine._tails) == 1  # held
    engine.release_tail(hold)
    assert _wait(lambda: not engine._tails, 10)
    assert _cached(engine, ids + answer + tok.encode(" And then?")) == len(ids + answer)  # the whole answer
    # Still held when the next turn comes (a client quicker than the release): the token is decoded first.
    hold = TailHold()
    ids2 = tok.encode("Another question about the boats, asked quickly.")
    events = list(run_sync(engine, _req(ids2, n=3, hold=hold), timeout=120))
    answer2 = [t for e in events if hasattr(e, "token_ids") for t in e.token_ids]
    assert len(engine._tails) == 1 and not hold.released
    assert _cached(engine, ids2 + answer2 + tok.encode(" Why?")) == len(ids2 + answer2)
    # Without a hold: at once. Held and never released: once the time limit passes.
    for hold, limit in ((None, 60.0), (TailHold(), 0.3)):
        monkeypatch.setattr(le, "TAIL_HOLD_SECONDS", limit)
        t0 = time.monotonic()
        list(run_sync(engine, _req(tok.encode(f"Another question {limit}"), n=2, hold=hold), timeout=120))
        assert _wait(lambda: not engine._tails, 10)
        waited = time.monotonic() - t0
        assert (waited >= 0.3) if hold is not None else (waited < 30)
