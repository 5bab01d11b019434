"""Useful padding: append whole examples to a prompt prefix until it clears the cache floor on a block boundary.

Never filler: if the examples cannot reach the target, `pad_prompt` raises. Counts are verified by re-tokenizing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from .align import Candidate, candidates, length_cost, rank_key
from .counting import APPROX_REL_ERROR, TokenCounter
from .economics import planned_length
from .errors import PlannerError
from .inputs import read_jsonl
from .profiles import Profile

MAX_EXAMPLES = 2000
MAX_EXAMPLES_BYTES = 8 * 1024 * 1024
MAX_VERIFY_ATTEMPTS = 200
MAX_ARRANGEMENTS = 8
WEIGHT_CONTEXT_CHARS = 4096
STABILITY_CONTEXT_CHARS = 16384
DEFAULT_SEPARATOR = "\n\n"
# What usually follows a cached prefix: the separator and the start of the variable part of the prompt.
DEFAULT_CONTINUATION_STARTS = ("Q", "Question:", "The", "1", "#", "{", "-", "中", "")


def load_examples(
    path: str | Path, max_examples: int = MAX_EXAMPLES, max_bytes: int = MAX_EXAMPLES_BYTES
) -> list[str]:
    """Examples from a JSONL file: one per line, `{"text": "..."}` or a bare JSON string; blank lines skipped."""
    out: list[str] = []
    p = Path(path)
    for p, n, obj in read_jsonl(path, "examples", max_bytes):
        text = obj.get("text") if isinstance(obj, dict) else obj
        if not isinstance(text, str):
            raise PlannerError(f'{p} line {n}: expected {{"text": "..."}} or a JSON string')
        if not text.strip():
            raise PlannerError(f"{p} line {n}: the example is empty")
        out.append(text.strip())
        if len(out) > max_examples:
            raise PlannerError(f"{p} has more than {max_examples:,} examples; the limit is {max_examples:,}")
    if not out:
        raise PlannerError(f"examples file {p} holds no examples")
    return out


@dataclass
class StabilityCheck:
    checked: bool
    stable: bool | None
    method: str
    unstable_continuations: list[str] = field(default_factory=list)


def check_end_stability(counter: TokenCounter, text: str, continuations: list[str]) -> StabilityCheck:
    """Is tokenize(text) a prefix of tokenize(text + c) for every continuation c?

    Uses the healing part's linter (`tokenseam.healing.lint.check_continuations`) when it is installed, else the
    same check done here. The approximation has no tokenizer, so nothing can be checked.
    """
    if counter.tokenizer is None:
        return StabilityCheck(False, None, "not checked: no local tokenizer (approximate count)")
    try:
        from ..healing.lint import check_continuations
    except Exception:  # another part's module: if it is absent or broken, do the same check here
        check_continuations = None
    if check_continuations is not None:
        try:
            _, checks = check_continuations(
                counter.tokenizer, text, continuations=tuple(("pad", c) for c in continuations)
            )
            bad = [c.continuation for c in checks if c.retokenized]
            return StabilityCheck(True, not bad, "tokenseam.healing.lint.check_continuations", bad)
        except (TypeError, AttributeError):
            pass  # the linter's interface changed: fall back to the same check done here
    base = counter.tokenizer.encode(text, add_special=False)
    bad = [
        c for c in continuations if counter.tokenizer.encode(text + c, add_special=False)[: len(base)] != base
    ]
    return StabilityCheck(True, not bad, "tokenize(text) is a prefix of tokenize(text + continuation)", bad)


@dataclass
class PadResult:
    text: str
    report: dict


def _end_window(text: str) -> str:
    """The text whose end is checked for stability: all of it, or for very long prompts the last 16k characters
    (re-tokenization only reaches a few tokens back from the end, so this keeps the check cheap)."""
    return text if len(text) <= STABILITY_CONTEXT_CHARS else text[-STABILITY_CONTEXT_CHARS:]


def _join(prompt: str, examples: list[str], order: tuple[int, ...], sep: str) -> str:
    return prompt + "".join(sep + examples[i] for i in order)


def _arrangements(indices: tuple[int, ...]) -> list[tuple[int, ...]]:
    """File order first, then each other example moved to the end (the end decides stability)."""
    out = [indices]
    for i in reversed(indices[:-1]):
        out.append(tuple(j for j in indices if j != i) + (i,))
        if len(out) >= MAX_ARRANGEMENTS:
            break
    return out


def pad_prompt(
    prompt: str,
    examples: list[str],
    profile: Profile,
    counter: TokenCounter,
    separator: str = DEFAULT_SEPARATOR,
    continuations: list[str] | None = None,
    allow_unstable_end: bool = False,
) -> PadResult:
    """Append a subset of `examples` (each preceded by `separator`) to `prompt` so that the token count clears
    the floor and ends on a block boundary, with the least overshoot; see docs/planner.md for the ranking."""
    if not separator:
        raise PlannerError("the separator must not be empty (examples would run into each other)")
    conts = [separator + c for c in DEFAULT_CONTINUATION_STARTS] if continuations is None else continuations
    core = prompt.rstrip()  # trailing whitespace at a cache boundary re-tokenizes with what follows
    if not core:
        raise PlannerError("the prompt is empty")
    floor, block, read = profile.floor, profile.block, profile.read_multiplier
    if not counter.exact:
        # Aim above the floor by the approximation's error bound so the real count still clears it.
        floor = math.ceil(floor * (1 + APPROX_REL_ERROR))
    base = counter.count(core)
    target = planned_length(base, floor, block)
    report: dict = {
        "profile": profile.name,
        "floor": profile.floor,
        "effective_floor": floor,
        "block": block,
        "read_multiplier": read,
        "separator": separator,
        "count": counter.describe(core),
        "prompt_tokens": base,
        "target_tokens": target,
        "examples_available": len(examples),
    }
    if base == target:
        stab = check_end_stability(counter, _end_window(core), conts)
        report.update(
            final_tokens=base,
            on_boundary=base % block == 0,
            overshoot=0,
            chosen=[],
            status="already aligned: nothing appended",
            stable_end=stab.__dict__,
            cost_as_is=length_cost(base, floor, block, read),
            cost_padded=length_cost(base, floor, block, read),
        )
        return PadResult(core, report)
    # Predicted cost of each example: tokens it adds behind the prompt's last few thousand characters (enough
    # context for any merge across the join; re-tokenizing a multi-megabyte prompt per example would be slow).
    tail = core[-WEIGHT_CONTEXT_CHARS:]
    tail_n = counter.count_text(tail)
    weights = [max(1, counter.count_text(tail + separator + ex) - tail_n) for ex in examples]
    best: tuple[tuple[float, int], str, tuple[int, ...], int, StabilityCheck] | None = None
    attempts = mismatches = 0
    unstable_seen: StabilityCheck | None = None
    for cand in candidates(weights, base, floor, block, read):
        if attempts >= MAX_VERIFY_ATTEMPTS:
            break
        if best is not None and rank_key(cand.total, floor, block, read) > best[0]:
            break  # predictions come best first; nothing later can beat a verified result
        found = _verify(cand, core, examples, separator, counter, conts, floor, block, read)
        attempts += found[0]
        for key, text, order, n, stab in found[1]:
            if n != cand.total:
                mismatches += 1
            if not (stab.stable or not stab.checked or allow_unstable_end):
                unstable_seen = stab
                continue
            if n >= floor and (best is None or key < best[0]):
                best = (key, text, order, n, stab)
    if best is None:
        if unstable_seen is not None:
            raise PlannerError(
                "every padded candidate ends on an unstable token boundary (re-tokenized by "
                f"{', '.join(repr(c) for c in unstable_seen.unstable_continuations[:4])}): end your examples "
                "with punctuation or pass --allow-unstable-end"
            )
        raise PlannerError(
            f"no subset of the {len(examples)} examples reaches {target:,} tokens once "
            "re-tokenized; add more examples (tokenseam never pads with filler)"
        )
    key, text, order, n, stab = best
    report.update(
        final_tokens=n,
        on_boundary=n % block == 0 and n >= floor,
        overshoot=n - target,
        chosen=[i + 1 for i in order],
        appended_tokens=n - base,
        verify_attempts=attempts,
        count_mismatches=mismatches,
        stable_end=stab.__dict__,
        cost_as_is=length_cost(base, profile.floor, block, read),
        cost_padded=key[0],
        status=(
            (
                "floor reached exactly"
                if n == target
                else f"floor reached: {n:,} tokens, {n - target} past {target:,}"
            )
            if block == 1
            else "exact block boundary"
            if n == target
            else f"exact block boundary at {n:,} (no subset lands on {target:,})"
            if n % block == 0
            else f"overshoot {n - target} tokens past {target:,} (no subset lands on a block boundary)"
        ),
    )
    return PadResult(text, report)


def _verify(
    cand: Candidate,
    core: str,
    examples: list[str],
    sep: str,
    counter: TokenCounter,
    conts: list[str],
    floor: int,
    block: int,
    read: float,
):
    """Re-tokenize the joined text for a few arrangements; return (tokenizations used, verified results)."""
    used, results = 0, []
    for order in _arrangements(cand.indices):
        text = _join(core, examples, order, sep)
        n = counter.count(text)
        used += 1
        stab = check_end_stability(counter, _end_window(text), conts)
        results.append((rank_key(n, floor, block, read), text, order, n, stab))
        if stab.stable or not stab.checked:
            break
    return used, results
