"""Bounded worker pools for request preparation (tokenizing, chat templates, grammar compiles).

A pool runs at most `workers` jobs and lets at most `max_queue` wait; past that a request gets 503 + Retry-After
at once, so a burst of expensive grammars cannot queue up behind each other and starve the cheap requests.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from .errors import APIError

T = TypeVar("T")


def _renice(nice: int) -> None:
    """Lower this worker thread's CPU priority (Linux schedules threads one by one): the decode threads then
    win the cores, and a compile runs on what they leave."""
    if nice and hasattr(os, "setpriority"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        except OSError:
            pass


class WorkPool:
    """A thread pool with a hard limit on jobs in flight; jobs are counted until their thread finishes, even when
    the request that asked for them has gone (a thread cannot be stopped, so its slot stays taken)."""

    def __init__(self, name: str, workers: int, max_queue: int, nice: int = 0) -> None:
        self.name = name
        self.workers = workers
        self.max_queue = max_queue
        self._executor = ThreadPoolExecutor(
            workers, thread_name_prefix=f"tokenseam-{name}", initializer=_renice, initargs=(nice,)
        )
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._queued = 0
        self._running: dict[int, float] = {}  # job -> monotonic start time
        self.rejected = 0

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._queued + len(self._running)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        cf = self.submit(fn, *args)
        return await asyncio.wrap_future(cf)  # a request that goes away cancels a job that has not started

    def submit(self, fn: Callable[..., T], *args: Any) -> Future:
        """Start a job; its future (503 APIError at once when the pool is full)."""
        with self._lock:
            if self._queued + len(self._running) >= self.workers + self.max_queue:
                self.rejected += 1
                raise APIError(
                    503,
                    f"the server is busy preparing other requests ({self.name}: {self.workers} "
                    f"running, {self.max_queue} waiting); retry shortly",
                    "server_overloaded",
                    code="server_busy",
                    headers={"Retry-After": "1"},
                )
            self._queued += 1
            job = next(self._ids)
        try:
            cf = self._executor.submit(self._job, job, fn, args)
        except BaseException:
            with self._lock:
                self._queued -= 1
            raise
        cf.add_done_callback(self._dropped)
        return cf

    def _dropped(self, cf) -> None:
        if cf.cancelled():  # never started: _job did not take it off the queue
            with self._lock:
                self._queued -= 1

    def _job(self, job: int, fn: Callable[..., T], args: tuple) -> T:
        with self._lock:
            self._queued -= 1
            self._running[job] = time.monotonic()
        try:
            return fn(*args)
        finally:
            with self._lock:
                del self._running[job]

    def oldest_seconds(self) -> float:
        """How long the longest-running job has been running (0 when none runs)."""
        with self._lock:
            first = min(self._running.values(), default=None)
        return 0.0 if first is None else time.monotonic() - first

    def health(self) -> dict[str, Any]:
        with self._lock:
            running, queued = len(self._running), self._queued
            first = min(self._running.values(), default=None)
        return {
            "workers": self.workers,
            "running": running,
            "waiting": queued,
            "max_waiting": self.max_queue,
            "oldest_job_seconds": round(0.0 if first is None else time.monotonic() - first, 3),
            "rejected": self.rejected,
        }

    def shutdown(self) -> None:
        """Refuse new work and drop what waits; jobs already running finish in their threads."""
        self._executor.shutdown(wait=False, cancel_futures=True)
