"""Requests and sequences as the scheduler sees them, and the events they emit to the caller.

A request with n choices owns n sequences; they share the prompt's KV and diverge after it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from ..stream import IncrementalDetokenizer
from .constraint import Constraint
from .sampling import Sampler, SamplingParams, TokenLogprob

_ids = itertools.count(1)


@dataclass
class GenerationRequest:
    """What to generate. `constraint_factory(choice_index)` builds one constraint per choice (or None)."""

    prompt_ids: list[int]
    params: SamplingParams
    constraint_factory: Callable[[int], Constraint | None] | None = None
    request_id: str = ""


@dataclass
class ChoiceEvent:
    """Tokens generated for one choice since its previous event. `text` is the text they made certain."""

    index: int
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "abort" when this is the choice's last event
    stop_string: str | None = None


@dataclass
class RequestDone:
    """Sent once, after every choice finished."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    error: str | None = None


Emit = Callable[[list], None]


class Sequence:
    """One choice: its llama.cpp sequence id, generated tokens, sampler, detokenizer and constraint."""

    def __init__(self, req: RequestState, index: int, seq_id: int, vocab, vocab_size: int) -> None:
        p = req.request.params
        self.req = req
        self.index = index
        self.seq_id = seq_id
        self.generated: list[int] = []
        self.sampler = Sampler(p, vocab_size, seed_offset=index)
        self.detok = IncrementalDetokenizer(vocab, p.stop)
        factory = req.request.constraint_factory
        self.constraint: Constraint | None = factory(index) if factory else None
        self.finish_reason: str | None = None
        self.n_past = 0  # positions of this sequence already in the KV cache

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestState:
    """Scheduler-side state of one request."""

    def __init__(self, request: GenerationRequest, emit: Emit) -> None:
        self.id = next(_ids)
        self.request = request
        self.emit = emit
        self.seqs: list[Sequence] = []
        self.prefill_pos = 0  # prompt tokens already decoded into seqs[0]
        self.cached_tokens = 0
        self.cancelled = False
        self.done = False

    @property
    def prompt(self) -> list[int]:
        return self.request.prompt_ids

    @property
    def prefilling(self) -> bool:
        return self.prefill_pos < len(self.request.prompt_ids)
