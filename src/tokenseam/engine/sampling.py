"""Per-request sampling in numpy: penalties, logit bias, constraint mask, temperature, top-k/top-p/min-p, logprobs.

Greedy requests take an argmax only; nothing here loops over the vocabulary in Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .errors import InvalidRequestError


@dataclass
class SamplingParams:
    max_tokens: int | None = 256  # None: until EOS or the context is full
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logit_bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0

    def validate(self, vocab_size: int) -> None:
        def bad(msg: str, param: str) -> None:
            raise InvalidRequestError(msg, param)

        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            bad(f"max_tokens must be a positive integer, got {self.max_tokens!r}", "max_tokens")
        if not _finite(self.temperature) or self.temperature < 0 or self.temperature > 100:
            bad(f"temperature must be between 0 and 100, got {self.temperature!r}", "temperature")
        if not _finite(self.top_p) or not 0 < self.top_p <= 1:
            bad(f"top_p must be in (0, 1], got {self.top_p!r}", "top_p")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            bad(f"top_k must be a non-negative integer, got {self.top_k!r}", "top_k")
        if not _finite(self.min_p) or not 0 <= self.min_p <= 1:
            bad(f"min_p must be in [0, 1], got {self.min_p!r}", "min_p")
        if not isinstance(self.n, int) or not 1 <= self.n <= 16:
            bad(f"n must be an integer from 1 to 16, got {self.n!r}", "n")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _finite(v) or not -2 <= v <= 2:
                bad(f"{name} must be between -2 and 2, got {v!r}", name)
        if not isinstance(self.top_logprobs, int) or not 0 <= self.top_logprobs <= 20:
            bad(f"top_logprobs must be an integer from 0 to 20, got {self.top_logprobs!r}", "top_logprobs")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            bad(f"seed must be an integer, got {self.seed!r}", "seed")
        if len(self.stop) > 16 or any(not isinstance(s, str) or not s or len(s) > 512 for s in self.stop):
            bad("stop must be at most 16 non-empty strings of at most 512 characters", "stop")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or not 0 <= t < vocab_size:
                bad(f"stop token id {t!r} is outside the vocabulary (0..{vocab_size - 1})", "stop_token_ids")
        for t, v in self.logit_bias.items():
            if not 0 <= t < vocab_size:
                bad(f"logit_bias token id {t} is outside the vocabulary (0..{vocab_size - 1})", "logit_bias")
            if not _finite(v) or not -100 <= v <= 100:
                bad(f"logit_bias values must be between -100 and 100, got {v!r}", "logit_bias")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first


class Sampler:
    """Sampling state of one sequence: its RNG and generated-token counts for penalties."""

    def __init__(self, params: SamplingParams, vocab_size: int, seed_offset: int = 0) -> None:
        self.p = params
        self.vocab_size = vocab_size
        seed = params.seed if params.seed is not None else int.from_bytes(np.random.bytes(8), "little")
        self.rng = np.random.default_rng([seed & 0xFFFFFFFFFFFFFFFF, seed_offset])
        self.counts: dict[int, int] = {}
        self._bias_ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64, count=len(params.logit_bias))
        self._bias_vals = np.fromiter(
            params.logit_bias.values(), dtype=np.float32, count=len(params.logit_bias)
        )
        self._needs_copy = bool(len(self._bias_ids) or params.presence_penalty or params.frequency_penalty)

    def sample(self, logits: np.ndarray, allowed: np.ndarray | None) -> tuple[int, TokenLogprob | None]:
        """Pick the next token. `logits` may be a view into llama.cpp memory: it is never written to.
        `allowed` is a bool array of length V (None = everything allowed)."""
        p = self.p
        x = logits[: self.vocab_size]
        if self._needs_copy:
            x = x.astype(np.float32, copy=True)
            if len(self._bias_ids):
                x[self._bias_ids] += self._bias_vals
            if self.counts and (p.presence_penalty or p.frequency_penalty):
                ids = np.fromiter(self.counts.keys(), dtype=np.int64, count=len(self.counts))
                cnt = np.fromiter(self.counts.values(), dtype=np.float32, count=len(self.counts))
                x[ids] -= p.presence_penalty + p.frequency_penalty * cnt
        raw = x
        if allowed is not None:
            x = np.where(allowed, x, np.float32(-np.inf))
            if not np.isfinite(x).any():
                # the constraint allows nothing the model can say: pick the least bad allowed token
                x = np.where(allowed, np.float32(0), np.float32(-np.inf))
        if p.greedy:
            tok = int(np.argmax(x))
        else:
            tok = self._sample_random(x)
        lp = self._logprob(raw, tok) if p.logprobs else None
        self.counts[tok] = self.counts.get(tok, 0) + 1
        return tok, lp

    def _sample_random(self, x: np.ndarray) -> int:
        p = self.p
        k = p.top_k if 0 < p.top_k < len(x) else 0
        if k:
            cand = np.argpartition(x, -k)[-k:]
        else:
            cand = np.flatnonzero(np.isfinite(x))
        z = x[cand].astype(np.float64)
        # Shift before scaling: dividing first overflows to inf for a tiny temperature (5e-324), and inf - inf
        # is NaN. Shifted, the best logit is exactly 0 and the rest are <= 0 at any temperature.
        z -= z.max()
        with np.errstate(over="ignore"):  # -inf for the unlikely ones is the right answer
            z /= p.temperature
        prob = np.exp(z)
        prob /= prob.sum()
        if p.min_p > 0:
            keep = prob >= p.min_p * prob.max()
            cand, prob = cand[keep], prob[keep]
            prob /= prob.sum()
        if p.top_p < 1.0:
            order = np.argsort(-prob, kind="stable")
            cum = np.cumsum(prob[order])
            cut = int(np.searchsorted(cum, p.top_p)) + 1
            keep = order[:cut]
            cand, prob = cand[keep], prob[keep]
            prob /= prob.sum()
        return int(cand[self.rng.choice(len(cand), p=prob)])

    def _logprob(self, x: np.ndarray, tok: int) -> TokenLogprob:
        # Logprobs of the model's distribution after bias and penalties, before the mask and temperature.
        m = float(np.max(x))
        lse = m + math.log(float(np.sum(np.exp(x - m, dtype=np.float64))))
        top: list[tuple[int, float]] = []
        if self.p.top_logprobs:
            k = self.p.top_logprobs
            idx = np.argpartition(x, -k)[-k:]
            idx = idx[np.argsort(-x[idx], kind="stable")]
            top = [(int(i), float(x[i]) - lse) for i in idx]
        return TokenLogprob(tok, float(x[tok]) - lse, top)
