"""`tokenseam bench cache`'s fingerprint figures: each request form measured (the timings themselves are not
asserted)."""

from __future__ import annotations

import math

from tokenseam.bench.cache import IDS_PROMPT, bench_fingerprint


def test_fingerprint_figures_cover_chat_text_and_token_ids():
    r = bench_fingerprint(3)
    assert r["prompt_tokens"] > 4000 and r["ids_prompt"] == IDS_PROMPT == 8000
    for key in ("p50_us", "p99_us", "ascii_p50_us", "ascii_p99_us", "ids_p50_us", "ids_p99_us"):
        assert math.isfinite(r[key]) and r[key] > 0, key
