"""Per-request sampling: penalties, logit bias, constraint mask, temperature, top-k/top-p/min-p, logprobs.

Greedy requests take an argmax only. A greedy pick under a mask and a draw at the temperature alone run in one
numba call each (draw.py); the cuts (top-k, top-p, min-p) in numpy. Nothing here loops over the vocabulary in
Python.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

import numpy as np

from . import draw
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
    # Multiplicative penalty on tokens seen in the last `repeat_last_n` tokens of prompt + output (-1: all of
    # them, 0: none): a positive logit is divided by it, a negative one multiplied (HF, vLLM and llama.cpp agree).
    repetition_penalty: float = 1.0
    repeat_last_n: int = -1
    min_tokens: int = 0  # no end-of-generation token, stop id or stop string before this many tokens
    min_keep: int = 0  # top_p and min_p keep at least this many candidates
    # The order of the truncation steps and the temperature (see SAMPLERS). OpenAI routes scale by the
    # temperature first, as vLLM does; llama-server filters at temperature 1 and scales last.
    samplers: tuple[str, ...] = ("top_k", "temperature", "min_p", "top_p")
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0

    def validate(self, vocab_size: int) -> None:
        def bad(msg: str, param: str) -> None:
            raise InvalidRequestError(msg, param)

        # 0: read the prompt only (echo with prompt logprobs, as scoring harnesses ask)
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 0):
            bad(f"max_tokens must be a non-negative integer, got {self.max_tokens!r}", "max_tokens")
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
        if not _finite(self.repetition_penalty) or not 0 < self.repetition_penalty <= 10:
            bad(
                f"repetition_penalty must be in (0, 10], got {self.repetition_penalty!r}",
                "repetition_penalty",
            )
        if not isinstance(self.repeat_last_n, int) or self.repeat_last_n < -1:
            bad(
                f"repeat_last_n must be -1 (all), 0 (off) or a positive integer, got {self.repeat_last_n!r}",
                "repeat_last_n",
            )
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            bad(f"min_tokens must be a non-negative integer, got {self.min_tokens!r}", "min_tokens")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})", "min_tokens"
            )
        if not isinstance(self.min_keep, int) or self.min_keep < 0:
            bad(f"min_keep must be a non-negative integer, got {self.min_keep!r}", "min_keep")
        if len(set(self.samplers)) != len(self.samplers) or any(x not in SAMPLERS for x in self.samplers):
            bad(f"samplers must be distinct names from {', '.join(SAMPLERS)}", "samplers")
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


SAMPLERS = ("top_k", "top_p", "min_p", "temperature")
LLAMA_SAMPLERS = ("top_k", "top_p", "min_p", "temperature")  # llama-server's default chain, the steps we have


_NO_MASK = np.zeros(0, np.bool_)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def _top(prob: np.ndarray, k: int) -> np.ndarray:
    keep = np.zeros(len(prob), dtype=bool)
    keep[np.argsort(-prob, kind="stable")[:k]] = True
    return keep


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first


class Sampler:
    """Sampling state of one sequence: its RNG and generated-token counts for penalties."""

    def __init__(
        self,
        params: SamplingParams,
        vocab_size: int,
        seed_offset: int = 0,
        prompt_ids: list[int] | None = None,
    ) -> None:
        self.p = params
        self.vocab_size = vocab_size
        # Tokens the repetition penalty sees: a presence array over everything (window -1), or a count per id
        # over the last repeat_last_n tokens.
        self._repeat = params.repetition_penalty != 1.0 and params.repeat_last_n != 0
        self._window: collections.deque[int] | None = None
        self._seen: np.ndarray | None = None
        self._window_counts: dict[int, int] = {}
        if self._repeat:
            history = [t for t in prompt_ids or [] if 0 <= t < vocab_size]
            if params.repeat_last_n == -1:
                self._seen = np.zeros(vocab_size, dtype=bool)
                self._seen[history] = True
            else:
                self._window = collections.deque(maxlen=params.repeat_last_n)
                for t in history[-params.repeat_last_n :]:
                    self._remember(t)
        seed = params.seed if params.seed is not None else int.from_bytes(np.random.bytes(8), "little")
        self.rng = np.random.default_rng([seed & 0xFFFFFFFFFFFFFFFF, seed_offset])
        self.counts: dict[int, int] = {}
        self._bias_ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64, count=len(params.logit_bias))
        self._bias_vals = np.fromiter(
            params.logit_bias.values(), dtype=np.float32, count=len(params.logit_bias)
        )
        self._needs_copy = bool(
            len(self._bias_ids) or params.presence_penalty or params.frequency_penalty or self._repeat
        )

    def _remember(self, tok: int) -> None:
        w = self._window
        if w is None:
            if self._seen is not None:
                self._seen[tok] = True
            return
        if len(w) == w.maxlen:
            old = w[0]
            left = self._window_counts[old] - 1
            if left:
                self._window_counts[old] = left
            else:
                del self._window_counts[old]
        w.append(tok)
        self._window_counts[tok] = self._window_counts.get(tok, 0) + 1

    def _repeated(self) -> np.ndarray:
        if self._seen is not None:
            return np.flatnonzero(self._seen)
        return np.fromiter(self._window_counts.keys(), dtype=np.int64, count=len(self._window_counts))

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
            if self._repeat:
                ids = self._repeated()
                v = x[ids]
                x[ids] = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
        raw = x
        tok = self._pick_in_one_call(x, allowed)
        if tok < 0:
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
        if self._repeat and tok < self.vocab_size:
            self._remember(tok)
        return tok, lp

    def _pick_in_one_call(self, x: np.ndarray, allowed: np.ndarray | None) -> int:
        """The greedy pick under a mask, or a draw at the temperature alone (no top-k, top-p or min-p cut), through
        draw.py: the same token as the numpy path below, in one call that gives up the interpreter lock once
        (numpy gives it up at each pass, and a grammar compile in another thread then keeps it a switch interval
        each time). -1: take that path."""
        p = self.p
        masked = allowed is not None
        if x.dtype != np.float32 or (masked and (allowed.dtype != np.bool_ or allowed.shape != x.shape)):
            return -1
        mask = allowed if masked else _NO_MASK  # (read only when masked)
        if p.greedy:
            return draw.greedy(x, allowed) if masked else -1
        if (0 < p.top_k < len(x) and "top_k" in p.samplers) or (p.min_p > 0 and "min_p" in p.samplers):
            return -1
        if p.top_p < 1.0 and "top_p" in p.samplers:
            return -1
        # (-1 only when there is nothing to draw from, where the numpy path raises: the number drawn here for
        # the kernel is then of no use to anything)
        return draw.temperature(x, mask, masked, p.temperature, self.rng.random(), *draw.scratch(len(x)))

    def _sample_random(self, x: np.ndarray) -> int:
        p = self.p
        steps = p.samplers
        if steps and steps[0] == "top_k" and 0 < p.top_k < len(x):
            # top_k first (both default orders): cut on the float32 logits, no copy of the whole vocabulary
            cand = np.argpartition(x, -p.top_k)[-p.top_k :]
            cand = cand[np.isfinite(x[cand])]
            steps = steps[1:]
        else:
            cand = np.flatnonzero(np.isfinite(x))
        z = x[cand].astype(np.float64)
        keep_at_least = max(1, p.min_keep)
        for step in steps:
            if step == "top_k":
                if 0 < p.top_k < len(z):
                    top = np.argpartition(z, -p.top_k)[-p.top_k :]
                    cand, z = cand[top], z[top]
            elif step == "temperature":
                # Shift before scaling: dividing first overflows to inf for a tiny temperature (5e-324), and
                # inf - inf is NaN. Shifted, the best logit is exactly 0 and the rest are <= 0 at any temperature.
                z = z - z.max()
                with np.errstate(over="ignore"):  # -inf for the unlikely ones is the right answer
                    z = z / p.temperature
            elif step == "min_p":
                if p.min_p > 0:
                    prob = _softmax(z)
                    keep = prob >= p.min_p * prob.max()
                    if keep.sum() < keep_at_least:
                        keep = _top(prob, keep_at_least)
                    cand, z = cand[keep], z[keep]
            elif step == "top_p":
                if p.top_p < 1.0:
                    prob = _softmax(z)
                    order = np.argsort(-prob, kind="stable")
                    cut = int(np.searchsorted(np.cumsum(prob[order]), p.top_p)) + 1
                    kept = order[: max(cut, min(keep_at_least, len(order)))]
                    cand, z = cand[kept], z[kept]
        prob = _softmax(z)
        return int(cand[self.rng.choice(len(cand), p=prob)])

    def _logprob(self, x: np.ndarray, tok: int) -> TokenLogprob:
        # Logprobs of the model's distribution after bias and penalties, before the mask and temperature.
        return token_logprob(x, tok, self.p.top_logprobs)


def token_logprob(x: np.ndarray, tok: int, top_k: int = 0) -> TokenLogprob:
    """`tok`'s logprob under the logits `x` and the `top_k` most likely tokens with theirs."""
    m = float(np.max(x))
    lse = m + math.log(float(np.sum(np.exp(x - m, dtype=np.float64))))
    top: list[tuple[int, float]] = []
    if top_k:
        idx = np.argpartition(x, -top_k)[-top_k:]
        idx = idx[np.argsort(-x[idx], kind="stable")]
        top = [(int(i), float(x[i]) - lse) for i in idx]
    return TokenLogprob(tok, float(x[tok]) - lse, top)
