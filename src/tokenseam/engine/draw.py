"""Two common picks of the next token, in one numba call each: greedy under a constraint mask, and sampling at
the temperature alone (no top-k, top-p or min-p cut), with or without a mask.

The numpy path (sampling.Sampler) makes a dozen passes over the vocabulary for a temperature draw, and numpy
gives up the interpreter lock in each one. Beside a thread that holds the lock (a grammar compile), every pass
then waits up to a switch interval to take it back: one draw over SmolLM2's 49,152 logits took 7 ms beside a
busy Python thread against 1 ms alone. A call here runs without the lock from start to end (other threads, the
event loop among them, go on meanwhile) and waits once to take it back.

Each function takes the same steps as the numpy path, in the same order, and consumes the same random number
(the one double `Generator.choice` draws), so a seeded request picks the same tokens. The sums differ in
rounding (numpy adds pairwise, these in order), which could move a draw only if the random number fell within
about 1e-12 of the boundary between two tokens. A result of -1 sends the caller to the numpy path: for
`greedy`, a NaN among the allowed logits (numpy's argmax picks it); for `temperature`, no token at all to
pick, where the numpy path raises. (Greedy without a mask is one numpy argmax, which is faster and
holds the lock for most of its pass.)
"""

from __future__ import annotations

import threading

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def greedy(x: np.ndarray, allowed: np.ndarray) -> int:
    """np.argmax of `x` with the tokens `allowed` does not hold at -inf; if no allowed logit is finite, the first
    allowed token (numpy: the argmax of 0 over the allowed and -inf elsewhere)."""
    best = -1
    m = -np.inf
    finite = False
    for i in range(x.shape[0]):
        if not allowed[i]:
            continue
        v = x[i]
        if np.isnan(v):
            return -1
        if best < 0:
            best, m = i, v
        elif v > m:
            best, m = i, v
        finite |= np.isfinite(v)
    if not finite and best >= 0:
        for i in range(x.shape[0]):
            if allowed[i]:
                return i
    return best


@numba.njit(cache=True, nogil=True)
def temperature(
    x: np.ndarray, allowed: np.ndarray, masked: bool, t: float, u: float, cand: np.ndarray, z: np.ndarray
) -> int:
    """The numpy path's draw at temperature `t` with the random number `u`: the finite (allowed) logits as
    float64, less their maximum, over t, their softmax, and the first token whose cumulative probability
    (divided by the last one) is above u. If no allowed logit is finite, every allowed token alike. `cand` and
    `z` are scratch of at least len(x) items. One pass over the vocabulary gathers the candidates without
    branching on the mask or on a logit (a mask's allowed tokens are scattered); the rest runs over them."""
    n = x.shape[0]
    m = -np.inf
    count = 0
    for i in range(n):
        v = x[i]
        # (NaN is not finite: left out, as numpy leaves it)
        keep = (allowed[i] if masked else True) & np.isfinite(v)
        cand[count] = i
        z[count] = v
        m = max(m, v if keep else -np.inf)
        count += 1 if keep else 0
    if count == 0:  # no allowed logit is finite: every allowed token alike (none allowed: the numpy path)
        if not masked:
            return -1
        for i in range(n):
            cand[count] = i
            z[count] = 0.0
            count += 1 if allowed[i] else 0
        if count == 0:
            return -1
        m = 0.0
    top = -np.inf
    for k in range(count):
        z[k] = (z[k] - m) / t
        top = max(top, z[k])
    total = 0.0
    for k in range(count):
        z[k] = np.exp(z[k] - top)
        total += z[k]
    acc = 0.0
    for k in range(count):
        acc += z[k] / total
        z[k] = acc
    last = z[count - 1]
    for k in range(count):
        if z[k] / last > u:
            return cand[k]
    return cand[count - 1]


def scratch(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Arrays for `temperature` of at least n items, one pair per thread (the engine's thread samples)."""
    got = getattr(_scratch, "arrays", None)
    if got is None or len(got[0]) < n:
        got = _scratch.arrays = (np.empty(n, np.int64), np.empty(n, np.float64))
    return got


_scratch = threading.local()


def warm_up() -> None:
    """Load both functions (from numba's on-disk cache, or compiled on a first run) before a request needs
    them."""
    x = np.zeros(4, np.float32)
    allowed = np.ones(4, np.bool_)
    greedy(x, allowed)
    temperature(x, allowed, False, 1.0, 0.5, *scratch(4))
