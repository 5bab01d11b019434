"""A request whose constraint fails mid-generation ends alone, with an error; its neighbours in the batch go on."""

from __future__ import annotations

import threading

import pytest

from tokenseam.engine import GenerationRequest, SamplingParams
from tokenseam.engine.llm_engine import run_sync
from tokenseam.engine.sequence import ChoiceEvent, RequestDone

pytestmark = pytest.mark.model


class FailsAfter:
    """Allows every token, then raises on the n-th mask (as a grammar over its state budget would)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def fill_mask(self, out):
        self.n -= 1
        if self.n < 0:
            raise RuntimeError("automaton exceeded its state budget")
        out[:] = -1

    def accept(self, token_id: int) -> bool:
        return True

    def is_finished(self) -> bool:
        return False

    def is_active(self) -> bool:
        return True


def _run(engine, req, sink):
    sink.extend(run_sync(engine, req, timeout=120))


@pytest.mark.parametrize("fail_at", [0, 3])  # on the first token (after prefill) and mid-generation
def test_failing_constraint_ends_only_its_request(engine, fail_at):
    ids = engine.backend.tokenizer.encode("Once upon a time")
    params = dict(max_tokens=12, temperature=0, ignore_eos=True)
    bad = GenerationRequest(
        prompt_ids=ids, params=SamplingParams(n=2, **params), constraint_factory=lambda: FailsAfter(fail_at)
    )
    good = [GenerationRequest(prompt_ids=ids, params=SamplingParams(**params)) for _ in range(2)]
    sinks = [[] for _ in range(3)]
    threads = [
        threading.Thread(target=_run, args=(engine, r, k)) for r, k in zip([bad, *good], sinks, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    bad_done = sinks[0][-1]
    assert isinstance(bad_done, RequestDone) and "state budget" in bad_done.error
    assert sum(len(e.token_ids) for e in sinks[0] if isinstance(e, ChoiceEvent)) <= 2 * fail_at
    for sink in sinks[1:]:
        done = sink[-1]
        assert isinstance(done, RequestDone) and done.error is None and done.completion_tokens == 12
    # the engine is still serving, and the failed request's sequences were freed
    again = list(run_sync(engine, good[0], timeout=120))
    assert again[-1].completion_tokens == 12 and engine.running_count == 0
    assert len(engine._free) == engine.n_slots
