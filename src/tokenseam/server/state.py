"""The server's shared state: engine, preparation pools, metrics, chat template, grammar compiler, health.

One `ServerState` per served model; routes, request preparation and formatters read it, nothing else owns it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..engine import Engine
from ..engine.chat_template import ChatTemplate
from .errors import known_error
from .metrics import (
    EngineCollector,
    GrammarCollector,
    ServerMetrics,
    TokenizeMemoCollector,
    TurnMemoryCollector,
)
from .pool import WorkPool
from .protocol import ParsedRequest
from .relay import EventRelay

if TYPE_CHECKING:
    from ..grammar import CompiledGrammar

MAX_BODY_BYTES = 8 * 1024 * 1024
GRAMMAR_NICE = 10


def _whole_mb(name: str, value) -> int:
    """`value` if it is a whole number of MB >= 0 (a bool is not), else ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a whole number of MB >= 0, got {value!r}")
    return value


GRAMMAR_OVERLAP = ("auto", "on", "off")


def overlap_compiles(setting: str, threads: int) -> bool:
    """Whether grammars compile while the prompt is read. "auto": only when llama.cpp leaves a core free
    (`threads` set, and below the cores this process may use). The compile runs at a lower priority than
    decoding, so with every core decoding it runs mostly after the prompt anyway and gains nothing
    (`tokenseam bench grammar-overlap`, 2 cores: paired ratio 0.75-0.76 with --threads 1, 1.00-1.02 with
    both cores)."""
    if setting not in GRAMMAR_OVERLAP:
        raise ValueError(f"grammar_overlap must be one of {', '.join(GRAMMAR_OVERLAP)}, not {setting!r}")
    if setting != "auto":
        return setting == "on"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 0 < threads < cores


class ServerState:
    """What every request of one server shares. `reasoning_end`: the tag that ends a thinking model's reasoning
    (a grammar then starts after it)."""

    def __init__(
        self,
        engine: Engine,
        model_id: str,
        aliases: tuple[str, ...] = (),
        max_body_bytes: int = MAX_BODY_BYTES,
        response_cache=None,
        prepare_workers: int = 4,
        prepare_queue: int = 256,
        grammar_workers: int = 2,
        grammar_queue: int = 16,
        stall_seconds: float = 30.0,
        max_memory_mb: int | None = None,
        grammar_seconds: float | None = None,
        reasoning_end: str = "</think>",
        grammar_cache_mb: int | None = None,
        turn_memory_mb: int = 64,
        tokenize_memo_mb: int = 16,
        grammar_overlap: str = "auto",
        chat_template: str | None = None,
    ) -> None:
        """`chat_template`: a template source to render chats with instead of the GGUF's (--chat-template)."""
        self.engine = engine
        self.reasoning_end = reasoning_end
        self.max_memory_bytes = max_memory_mb * 1024 * 1024 if max_memory_mb else None
        self.grammar_seconds = grammar_seconds  # each compile's time budget (None: the grammar default)
        # A request's grammar compiles while the engine reads its prompt (False: before it is submitted).
        self.grammar_overlap = overlap_compiles(grammar_overlap, engine.backend.config.n_threads)
        from ..grammar.memory import DEFAULT_BUDGET_MB, MB

        mb = _whole_mb(
            "grammar_cache_mb", DEFAULT_BUDGET_MB if grammar_cache_mb is None else grammar_cache_mb
        )
        self.grammar_cache_bytes = mb * MB  # what compiled grammars may hold, cached or in use
        # Requests are prepared off the event loop in two pools: grammar compiles (seconds at worst, bounded by
        # the compiler's budget) cannot take the threads that tokenize plain prompts.
        self.prepare_pool = WorkPool("prepare", prepare_workers, prepare_queue)
        # Compiles run at a lower CPU priority: beside them, decoding keeps the cores (measured with `tokenseam
        # bench chaos`: a plain request's p99 beside a hostile compile 4.1x at the same priority, 1.3x at nice 10).
        self.grammar_pool = WorkPool("grammar", grammar_workers, grammar_queue, nice=GRAMMAR_NICE)
        self.stall_seconds = stall_seconds
        self.backend = engine.backend
        self.vocab = engine.vocab
        self.tokenizer = engine.backend.tokenizer
        self.model_id = model_id
        self.model_names = {model_id, *aliases, engine.backend.model_name, engine.backend.path.name}
        self.max_body_bytes = max_body_bytes
        self.metrics = ServerMetrics()
        self.relay = EventRelay()
        self.metrics.registry.register(EngineCollector(engine))
        self.metrics.registry.register(GrammarCollector(self))
        self.chat = ChatTemplate(chat_template or engine.backend.chat_template, self.vocab, self.tokenizer)
        _whole_mb("turn_memory_mb", turn_memory_mb)
        from ..engine.turn_memory import TurnMemory

        # The ids of earlier answers, so a chat history sent back as text keeps its KV (None: off).
        self.turns = (
            TurnMemory(turn_memory_mb * MB) if turn_memory_mb and engine.prefix_cache.enabled else None
        )
        if self.turns is not None:
            self.metrics.registry.register(TurnMemoryCollector(self.turns))
        _whole_mb("tokenize_memo_mb", tokenize_memo_mb)
        # Long prompts that begin like a recent one reuse its ids up to a safe cut (vocab/prefix_memo.py; the
        # same ids as tokenizing the whole prompt), so a cached prefix is not tokenized again on every request.
        if tokenize_memo_mb and self.tokenizer.use_prefix_memo(self.vocab.token_bytes, tokenize_memo_mb * MB):
            self.metrics.registry.register(TokenizeMemoCollector(self.tokenizer.memo))
        self.started = int(time.time())
        self.system_fingerprint = "ts-" + self.vocab.fingerprint[:12]  # the OpenAI routes' system_fingerprint
        # Extra per-request constraint source (an embedding application's own rules; tests use it to force
        # exact outputs): (parsed request, body as the client sent it) -> constraint factory or None.
        self.constraint_hook: Callable[[ParsedRequest, dict], Callable | None] | None = None
        self.response_cache = response_cache  # tokenseam.respcache.ResponseCache or None
        from ..healing import prepare_vocabulary

        prepare_vocabulary(self.vocab)  # healing's lookup tables, built once here rather than by a request
        self._grammar_compiler = None
        self._grammar_lock = threading.Lock()

    def health(self) -> tuple[dict, int]:
        """The /health body and status: 503 when the engine is stuck (a load balancer should stop sending),
        200 "degraded" when a preparation pool is full or a job in it runs past the compile budget."""
        problems = []
        stalled = self.engine.stalled_seconds()
        if stalled > self.stall_seconds:
            problems.append(f"the engine has made no progress for {stalled:.0f} s")
        pools = {p.name: p.health() for p in (self.prepare_pool, self.grammar_pool)}
        for name, h in pools.items():
            if h["running"] + h["waiting"] >= h["workers"] + h["max_waiting"]:
                problems.append(f"the {name} pool is full")
            if h["oldest_job_seconds"] > self.stall_seconds:
                problems.append(f"a {name} job has run for {h['oldest_job_seconds']:.0f} s")
        cache = self.response_cache.health() if self.response_cache is not None else None
        if cache is not None and (not cache.get("ok", True) or cache.get("degraded")):
            problems.append("the response cache store is unavailable (requests are generated)")
        engine_stuck = stalled > self.stall_seconds
        body = {
            "status": "error" if engine_stuck else "degraded" if problems else "ok",
            "model": self.model_id,
            "queue_depth": self.engine.queue_depth,
            "running": self.engine.running_count,
            "engine_stalled_seconds": round(stalled, 3),
            "pools": pools,
        }
        if cache is not None:
            body["cache"] = cache
        if problems:
            body["problems"] = problems
        return body, 503 if engine_stuck else 200

    def shutdown(self) -> None:
        """Stop the engine and the preparation pools (jobs already running finish in their threads)."""
        for pool in (self.prepare_pool, self.grammar_pool):
            pool.shutdown()
        self.engine.shutdown()

    def busy_threads(self) -> int:
        """Preparation jobs running or waiting in either pool."""
        return self.prepare_pool.in_flight + self.grammar_pool.in_flight

    def warm_up(self) -> None:
        """Load what the first request would otherwise wait for: the grammar engine's numba code and vocabulary
        tables (about a second), so no request pays for it."""
        from ..grammar import GrammarMatcher

        compiled = self.compile_request_grammar({"guided_regex": "[a-z]{1,4}"}, "/v1/completions")
        GrammarMatcher(compiled).fill_next_token_bitmask(np.zeros(self.vocab.mask_words, dtype=np.int32))
        self._grammar_compiler.warm_up()  # the rest of the numba code JSON schemas need

    def grammar_memory(self) -> dict[str, int]:
        """The grammar compiler's memory figures (GrammarCompiler.memory_stats); zeros before its first use."""
        compiler = self._grammar_compiler
        if compiler is None:
            return {
                "bytes": 0,
                "budget_bytes": self.grammar_cache_bytes,
                "cached_grammars": 0,
                "live_grammars": 0,
                "evictions": 0,
                "renewals": 0,
                "unmemoised_masks": 0,
                "gss_fallbacks": 0,
            }
        return compiler.memory_stats()

    def compile_request_grammar(self, body: dict, route: str) -> CompiledGrammar | None:
        """The request's grammar (response_format, guided_*, grammar, json_schema, tools) or None."""
        from ..grammar import GrammarCompiler
        from ..grammar.request import constraint_from_request

        with self._grammar_lock:  # requests are prepared in worker threads
            if self._grammar_compiler is None:
                # compiles stop at 95 % of the cap: memory is read every 10 ms of compile work, and the rest
                # of the process (decoding, responses) needs room too
                rss = int(self.max_memory_bytes * 0.95) if self.max_memory_bytes else None
                self._grammar_compiler = GrammarCompiler(
                    self.vocab,
                    time_budget=self.grammar_seconds,
                    rss_limit=rss,
                    cache_bytes=self.grammar_cache_bytes,
                )
        try:
            return constraint_from_request(self._grammar_compiler, body, route)
        except Exception as e:
            if (err := known_error(e)) is None:
                raise
            raise err from e
