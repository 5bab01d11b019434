"""The per-request arguments tokenseam reads from vLLM's `vllm_xargs` (SamplingParams.extra_args)."""

from __future__ import annotations

import os
from typing import Any

from ..wire import VLLM_HEALING_KEY as HEALING_KEY  # hex of the prompt bytes token healing removed

PROPERTY_ORDER_KEY = "tokenseam_property_order"  # "schema" or "any" (GrammarCompiler.compile_json_schema)
KEYS = (HEALING_KEY, PROPERTY_ORDER_KEY)
MAX_HEALING_BYTES = 256  # far beyond any token: healing removes a few tokens at most


def check_keys(extra_args: dict[str, Any] | None) -> None:
    """ValueError (vLLM's 400) for an unknown `tokenseam_*` key: a typo would otherwise be ignored silently."""
    unknown = sorted(k for k in extra_args or () if k.startswith("tokenseam_") and k not in KEYS)
    if unknown:
        raise ValueError(
            f"vllm_xargs.{unknown[0]} is not a tokenseam argument (there are: {', '.join(KEYS)})"
        )


PROPERTY_ORDER_ENV = "TOKENSEAM_PROPERTY_ORDER"  # the server's default, "schema" when unset


def property_order(extra_args: dict[str, Any] | None) -> str:
    """The request's `tokenseam_property_order` ("schema" or "any"), else the server's default."""
    check_keys(extra_args)
    value = (extra_args or {}).get(PROPERTY_ORDER_KEY)
    if value is None:
        return default_property_order()
    if value not in ("schema", "any"):
        raise ValueError(f'vllm_xargs.{PROPERTY_ORDER_KEY} must be "schema" or "any"')
    return value


def default_property_order() -> str:
    """$TOKENSEAM_PROPERTY_ORDER ("schema" when unset); ValueError for another value."""
    value = os.environ.get(PROPERTY_ORDER_ENV) or "schema"
    if value not in ("schema", "any"):
        raise ValueError(f'{PROPERTY_ORDER_ENV} must be "schema" or "any", not {value!r}')
    return value


def healing_bytes(extra_args: dict[str, Any] | None) -> bytes:
    """The removed bytes a request asks to regenerate (b"" for none). Raises ValueError, which vLLM turns into
    a 400, for a value that is not an even-length hex string of at most MAX_HEALING_BYTES bytes, and for an
    unknown `tokenseam_*` key (a typo would otherwise turn healing off silently)."""
    if not extra_args:
        return b""
    check_keys(extra_args)
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
