"""argparse value types shared by the subcommands (kept apart from `cli`, which imports the subcommands)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_in_range(name: str, lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer from lo to hi, with an error that names the flag."""

    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{name} must be between {lo} and {hi}, got {v}")
        return v

    return conv


def float_in_range(name: str, lo: float, hi: float) -> Callable[[str], float]:
    """An argparse type: a number from lo to hi, with an error that names the flag."""

    def conv(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{name} must be between {lo} and {hi}, got {v}")
        return v

    return conv
