"""One budget per grammar compile: a wall-clock deadline and a size counter, checked by every stage.

A request can make a small grammar expand enormously (nested allOf merges, anyOf cross products, repeat
nests, long rule chains), and the compile runs in the server process. Each stage that can blow up reports its
work to the compile's budget: `spend(n)` for n units of data it keeps (about 64 bytes each: sub-schemas and
merged schemas, IR nodes, automaton states and edges), `release(n)` when such data is freed, `tick(n)` for n
steps of work that keep nothing. Every CHECK_EVERY units the budget compares the clock with its deadline and
the size counter with its limit, and raises GrammarError naming the limit, the stage and where in the grammar
it was (a JSON pointer, a rule name).
With a memory cap (`rss_limit`), the same checkpoint reads the process's resident memory, at most every
RSS_CHECK_SECONDS. A long compile in a worker thread needs nothing here to let the event loop and engine
threads of the process run: the interpreter hands the GIL to a waiting thread after its switch interval (5 ms
by default, 0.5 ms in `tokenseam serve`). The checkpoint also slept for 0 s every 10 ms once, which gave a
thread waking every millisecond beside 40 large compiles no earlier turn (the same lateness, p50 0.7 ms and
p99 2-3 ms at a 0.5 ms interval) and cost each compile about 1 % (and the core, on a busy machine).

The budget in force is kept in a context variable: the stages deep inside (code point automata, the NFA
builder) find it there without it being passed through every call. `compile_budget()` opens one, or joins
the one already open (a front end called by GrammarCompiler shares the compiler's budget). Outside any
compile, `current()` is a budget that does nothing, so the helpers still work when called on their own and
request-time work (the automaton's lazy states) neither counts nor checks.
"""

from __future__ import annotations

import contextvars
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import GrammarError, GrammarResourceError

# Before this budget, the JSON front end and the NFA builder had 10 s each (and the automaton's preparation
# no limit). One budget now covers all three, so it is their sum: the largest MaskBench dev schema takes 6-9 s
# of it on a shared 2-core machine, which a single 10 s would reject under load.
COMPILE_SECONDS = 20.0
# A unit stands for about 64 bytes of compile-time data (50-75 measured with tracemalloc): 6,000,000 units are
# 300-450 MB. The counter is what the compile holds, not all it ever made: scratch data a stage frees gives
# its units back (CompileBudget.release). The largest MaskBench dev schema (544 KB of JSON, an NFA of 247,000
# states) peaks at 2,650,000 units; the next largest at 360,000.
COMPILE_SIZE = 6_000_000
CHECK_EVERY = 2048  # units between two looks at the clock (a unit is well under a microsecond of work)
RSS_CHECK_SECONDS = 0.01  # under a memory cap, resident memory is read at most this often (a read of /proc)

_CURRENT: contextvars.ContextVar[CompileBudget | None] = contextvars.ContextVar(
    "tokenseam_compile_budget", default=None
)


class CompileBudget:
    """A deadline (`seconds` from creation) and a size limit (`size` units) for one compile.

    Stages set `stage` (what is being done) and `where` (a JSON pointer or rule name) so that the error says
    where the budget ran out; both are plain attributes, cheap to set in a loop."""

    __slots__ = (
        "seconds",
        "size",
        "rss_limit",
        "deadline",
        "size_used",
        "work",
        "stage",
        "where",
        "_next",
        "_rss_read",
        "_peak",
    )

    def __init__(
        self, seconds: float = COMPILE_SECONDS, size: float = COMPILE_SIZE, rss_limit: int | None = None
    ) -> None:
        if not seconds > 0 or not size > 0:
            raise ValueError("compile budgets must be positive")
        self.seconds = seconds
        self.size = size
        self.rss_limit = rss_limit  # bytes of resident memory the whole process may reach (None: no cap)
        now = time.monotonic()
        self.deadline = now + seconds
        self.size_used = 0
        self._peak = 0
        self.work = 0
        self.stage = "compiling"
        self.where = ""
        self._next = CHECK_EVERY
        self._rss_read = now

    def spend(self, n: int = 1) -> None:
        """Record n units of data the compile keeps (they count against the size limit and as work)."""
        self.size_used += n
        self.work += n
        if self.work >= self._next:
            self.checkpoint()

    def release(self, n: int) -> None:
        """Give back n units spent on data that has been freed (a stage's scratch lists)."""
        if self.size_used > self._peak:
            self._peak = self.size_used
        self.size_used -= n

    @property
    def peak(self) -> int:
        """The most units held at any one time so far."""
        return max(self._peak, self.size_used)

    def tick(self, n: int = 1) -> None:
        """Record n steps of work that keep nothing (time only)."""
        self.work += n
        if self.work >= self._next:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Check both limits now (the counters call this every CHECK_EVERY units)."""
        self._next = self.work + CHECK_EVERY
        if self.size_used > self.size:
            raise GrammarError(
                self._message(
                    f"size budget ({self.size:,} units, about 64 bytes each, of "
                    "sub-schemas, IR nodes and automaton states and edges)"
                )
            )
        now = time.monotonic()
        if now > self.deadline:
            raise GrammarError(self._message(f"time budget ({self.seconds:g} s)"))
        if self.rss_limit is not None and now - self._rss_read >= RSS_CHECK_SECONDS:
            self._rss_read = now
            if resident_bytes() > self.rss_limit:
                raise GrammarResourceError(
                    f"the server reached its memory cap ({self.rss_limit // (1 << 20)} MB) while {self.stage}; "
                    "retry later or simplify the grammar"
                )

    def _message(self, limit: str) -> str:
        at = f" at {self.where}" if self.where else ""
        return (
            f"grammar compile exceeded its {limit} while {self.stage}{at}; simplify the grammar (fewer "
            "nested allOf/anyOf/oneOf combinations, smaller repeat counts, fewer or shallower rules)"
        )


class _Unbounded(CompileBudget):
    """What `current()` gives outside any compile: it counts nothing, never stops and never checks. Code that
    also runs at request time (the automaton's states built lazily, as masks reach them) reports to it."""

    __slots__ = ()

    def spend(self, n: int = 1) -> None:
        pass

    def tick(self, n: int = 1) -> None:
        pass

    def release(self, n: int) -> None:
        pass

    def checkpoint(self) -> None:
        pass


_UNLIMITED = _Unbounded(math.inf, math.inf)


def current() -> CompileBudget:
    """The budget of the compile running in this context (unlimited outside any compile)."""
    b = _CURRENT.get()
    return _UNLIMITED if b is None else b


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """This process's resident memory now (Linux /proc; 0 where it cannot be read, so no cap applies)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


@contextmanager
def compile_budget(
    seconds: float | None = None, size: float | None = None, rss_limit: int | None = None
) -> Iterator[CompileBudget]:
    """The budget for the code inside: the one already open (its limits rule; the arguments are then
    ignored), or a new one with these limits (module defaults for None; `rss_limit` None: no memory cap)."""
    b = _CURRENT.get()
    if b is not None:
        yield b
        return
    if rss_limit is not None and resident_bytes() > rss_limit:
        raise GrammarResourceError(
            f"the server is at its memory cap ({rss_limit // (1 << 20)} MB); no grammar "
            "is compiled until memory is freed; retry later"
        )
    b = CompileBudget(
        COMPILE_SECONDS if seconds is None else seconds, COMPILE_SIZE if size is None else size, rss_limit
    )
    token = _CURRENT.set(b)
    try:
        yield b
    finally:
        _CURRENT.reset(token)
