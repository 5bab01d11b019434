"""Reading the planner's input files (prompts, examples, tasks) with errors a user can act on.

Size-limited, UTF-8 only; in JSONL files blank lines are skipped and errors name the line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import PlannerError

MAX_PROMPT_BYTES = 4 * 1024 * 1024  # a prompt file beyond this is almost surely the wrong file


def read_text_file(
    path: str | Path, what: str, max_bytes: int = MAX_PROMPT_BYTES, allow_empty: bool = False
) -> str:
    """Read a UTF-8 text file with errors a user can act on (missing, directory, binary, empty, too big)."""
    p = Path(path)
    if not p.exists():
        raise PlannerError(f"{what} not found: {p}")
    if not p.is_file():
        raise PlannerError(f"{what} is not a regular file: {p}")
    size = p.stat().st_size
    if size > max_bytes:
        raise PlannerError(f"{what} {p} is {size:,} bytes; the limit is {max_bytes:,} bytes")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise PlannerError(f"{what} {p} is not UTF-8 text (byte offset {e.start})") from None
    if not text.strip() and not allow_empty:
        raise PlannerError(f"{what} {p} is empty")
    return text


def read_jsonl(path: str | Path, what: str, max_bytes: int) -> Iterator[tuple[Path, int, Any]]:
    """Yield (path, line number, decoded JSON value) for each non-blank line of a `what` file."""
    p = Path(path)
    lines = read_text_file(p, f"{what} file", max_bytes, allow_empty=True).splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield p, n, json.loads(line)
        except json.JSONDecodeError as e:
            raise PlannerError(f"{p} line {n}: not valid JSON ({e.msg} at column {e.colno})") from None
