"""Recursive walks over the grammar IR without Python recursion.

A walk is written as a generator: where it needs the result of a sub-walk it yields that sub-walk (another
such generator, or the result itself when it is known at once) and receives the result back. `run` keeps the
pending walks on a list, so the depth of the IR costs list entries, not interpreter frames, and no walk needs
the process-wide recursion limit raised.
"""

from __future__ import annotations

from collections.abc import Generator
from types import GeneratorType
from typing import Any

Walk = Generator[Any, Any, Any]


def run(walk: Walk | Any) -> Any:
    """The result of `walk` (a walk generator, or a value returned as it is)."""
    if type(walk) is not GeneratorType:
        return walk
    stack = [walk]
    value = None
    while True:
        try:
            sub = stack[-1].send(value)
        except StopIteration as stop:
            stack.pop()
            value = stop.value
            if not stack:
                return value
            continue
        if type(sub) is GeneratorType:
            stack.append(sub)
            value = None
        else:
            value = sub
