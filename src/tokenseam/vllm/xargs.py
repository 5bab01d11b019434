"""The per-request arguments tokenseam reads from vLLM's `vllm_xargs` (SamplingParams.extra_args)."""

from __future__ import annotations

from typing import Any

from ..wire import VLLM_HEALING_KEY as HEALING_KEY  # hex of the prompt bytes token healing removed

MAX_HEALING_BYTES = 256  # far beyond any token: healing removes a few tokens at most


def healing_bytes(extra_args: dict[str, Any] | None) -> bytes:
    """The removed bytes a request asks to regenerate (b"" for none). Raises ValueError, which vLLM turns into
    a 400, for a value that is not an even-length hex string of at most MAX_HEALING_BYTES bytes, and for an
    unknown `tokenseam_*` key (a typo would otherwise turn healing off silently)."""
    if not extra_args:
        return b""
    unknown = sorted(k for k in extra_args if k.startswith("tokenseam_") and k != HEALING_KEY)
    if unknown:
        raise ValueError(
            f"vllm_xargs.{unknown[0]} is not a tokenseam argument (the one there is: {HEALING_KEY})"
        )
    value = extra_args.get(HEALING_KEY)
    if value is None or value == "":
        return b""
    if not isinstance(value, str):
        raise ValueError(f"vllm_xargs.{HEALING_KEY} must be a hex string of the removed prompt bytes")
    if len(value) > 2 * MAX_HEALING_BYTES:
        raise ValueError(f"vllm_xargs.{HEALING_KEY} is longer than {MAX_HEALING_BYTES} bytes")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise ValueError(
            f"vllm_xargs.{HEALING_KEY} must be a hex string of the removed prompt bytes (e.g. '3a2f' for ':/')"
        ) from None
