"""The response cache's command-line flags, shared by `tokenseam serve` and `tokenseam gateway`."""

from __future__ import annotations

import argparse
import math


def _positive_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cache-ttl must be a number of seconds, got {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"--cache-ttl must be positive, got {text}")
    return v


TRUNCATED = {
    "auto": None,
    "always": True,
    "never": False,
}  # --cache-truncated -> ResponseCache(cache_truncated=)


def add_cache_arguments(p: argparse.ArgumentParser) -> None:
    """`--cache` (which requests are cached), `--cache-store`, `--cache-truncated` and `--cache-ttl`."""
    p.add_argument(
        "--cache",
        default="deterministic",
        choices=["off", "deterministic", "always"],
        help="which requests are cached (default: deterministic = temperature 0 or an explicit seed)",
    )
    p.add_argument(
        "--cache-store",
        default="sqlite",
        metavar="SPEC",
        help="sqlite (default file) | sqlite:PATH | redis://HOST:PORT/DB | memory",
    )
    p.add_argument(
        "--cache-truncated",
        nargs="?",
        const="always",
        default="auto",
        choices=list(TRUNCATED),
        help="store answers cut by their output limit: auto (default: when the request names its limit, "
        "which is part of the key), always (the bare flag), never",
    )
    p.add_argument(
        "--cache-ttl",
        type=_positive_seconds,
        default=None,
        metavar="SECONDS",
        help="seconds an entry lives (default: no expiry)",
    )
