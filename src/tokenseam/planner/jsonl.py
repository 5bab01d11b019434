"""Reading the planner's JSONL inputs (examples, tasks) with errors that name the file and line.

Size-limited, UTF-8 only, blank lines skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import PlannerError


def read_jsonl(path: str | Path, what: str, max_bytes: int) -> Iterator[tuple[Path, int, Any]]:
    """Yield (path, line number, decoded JSON value) for each non-blank line of a `what` file."""
    p = Path(path)
    if not p.exists():
        raise PlannerError(f"{what} file not found: {p}")
    if not p.is_file():
        raise PlannerError(f"{what} file is not a regular file: {p}")
    size = p.stat().st_size
    if size > max_bytes:
        raise PlannerError(f"{what} file {p} is {size:,} bytes; the limit is {max_bytes:,} bytes")
    try:
        lines = p.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise PlannerError(f"{what} file {p} is not UTF-8 text (byte offset {e.start})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield p, n, json.loads(line)
        except json.JSONDecodeError as e:
            raise PlannerError(f"{p} line {n}: not valid JSON ({e.msg} at column {e.colno})") from None
