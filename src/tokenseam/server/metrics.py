"""Prometheus metrics for the server: requests, tokens, latency histograms, queue depth, prefix-cache hits,
the memory compiled grammars hold."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "tokenseam_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.prompt_tokens = Counter("tokenseam_prompt_tokens", "Prompt tokens processed", registry=r)
        self.completion_tokens = Counter("tokenseam_completion_tokens", "Tokens generated", registry=r)
        self.prefix_hit_tokens = Counter(
            "tokenseam_prefix_cache_hit_tokens", "Prompt tokens served from KV cache", registry=r
        )
        self.prefix_miss_tokens = Counter(
            "tokenseam_prefix_cache_miss_tokens", "Prompt tokens decoded", registry=r
        )
        self.latency = Histogram(
            "tokenseam_request_seconds",
            "End-to-end request latency",
            ["route"],
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.ttft = Histogram(
            "tokenseam_time_to_first_token_seconds",
            "Time to first token",
            ["route"],
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.prefix_evictions = Counter(
            "tokenseam_prefix_cache_evictions", "Cached prefix paths evicted (LRU)", registry=r
        )
        self.prefix_bytes = Gauge(
            "tokenseam_prefix_cache_bytes", "KV bytes held by the prefix cache", registry=r
        )
        self.prefix_tokens = Gauge(
            "tokenseam_prefix_cache_tokens", "Tokens held by the prefix cache", registry=r
        )
        self._evictions_seen = 0
        self.queue_depth = Gauge("tokenseam_queue_depth", "Requests waiting for a sequence slot", registry=r)
        self.running = Gauge("tokenseam_running_requests", "Requests being decoded", registry=r)

    def sync_prefix_cache(self, cache) -> None:
        """Copy the engine's prefix-cache figures into the exported metrics (called on scrape)."""
        self.prefix_bytes.set(cache.bytes_held)
        self.prefix_tokens.set(cache.tokens_held)
        ev = cache.stats.evictions
        if ev > self._evictions_seen:
            self.prefix_evictions.inc(ev - self._evictions_seen)
            self._evictions_seen = ev


class EngineCollector:
    """The engine thread's own counters, read at scrape time: where decode time goes.

    `tokenseam_engine_overhead_seconds` is engine-thread time outside llama_decode (scheduling, sampling,
    masks, detokenizing); with `tokenseam_engine_decode_seconds` it tells what the model costs and what we add.
    """

    def __init__(self, engine) -> None:
        self.engine = engine

    def collect(self):
        st, be = self.engine.stats, self.engine.backend
        for name, doc, value in (
            ("tokenseam_engine_decode_seconds", "Time spent inside llama_decode", be.decode_seconds),
            ("tokenseam_engine_decode_calls", "llama_decode calls", be.decode_calls),
            (
                "tokenseam_engine_upkeep_decode_seconds",
                "Decode time of steps that served no request: finished answers' last tokens, kept for the cache",
                st.upkeep_decode_seconds,
            ),
            (
                "tokenseam_engine_overhead_seconds",
                "Engine-thread time per step outside llama_decode",
                st.overhead_seconds,
            ),
            ("tokenseam_engine_steps", "Scheduler steps (one batched decode each)", st.steps),
            ("tokenseam_engine_generated_tokens", "Tokens sampled by the engine", st.generated_tokens),
            (
                "tokenseam_prefix_resident_hits",
                "Prompts whose prefix was shared from KV still held on the device (nothing restored)",
                self.engine.resident_hits,
            ),
        ):
            m = CounterMetricFamily(name, doc)
            m.add_metric([], value)
            yield m
        g = GaugeMetricFamily("tokenseam_prefix_resident_tokens", "KV tokens free slots keep for a next turn")
        g.add_metric([], self.engine.resident_held)
        yield g


class TurnMemoryCollector:
    """The turn memory (engine/turn_memory.py): the ids of earlier chat answers, read at scrape time."""

    def __init__(self, memory) -> None:
        self.memory = memory

    def collect(self):
        m = self.memory
        for name, doc, value in (
            ("tokenseam_turn_memory_bytes", "Bytes held by remembered answers", m.bytes_held),
            ("tokenseam_turn_memory_budget_bytes", "The turn memory budget (--turn-memory-mb)", m.max_bytes),
            ("tokenseam_turn_memory_prompts", "Prompts with remembered answers", len(m)),
        ):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g
        for name, doc, value in (
            ("tokenseam_turn_memory_hits", "Chat prompts that got earlier answers back as their ids", m.hits),
            ("tokenseam_turn_memory_evictions", "Prompts whose answers were evicted (LRU)", m.evictions),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c


class TokenizeMemoCollector:
    """The tokenization memo (vocab/prefix_memo.py): ids of recent long prompts reused, read at scrape time."""

    def __init__(self, memo) -> None:
        self.memo = memo

    def collect(self):
        st = self.memo.stats()
        for name, doc, value in (
            ("tokenseam_tokenize_memo_bytes", "Bytes held by the tokenization memo", st["bytes"]),
            ("tokenseam_tokenize_memo_budget_bytes", "Its budget (--tokenize-memo-mb)", self.memo.max_bytes),
        ):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g
        for name, doc, value in (
            ("tokenseam_tokenize_memo_calls", "Long texts tokenized through the memo", st["calls"]),
            (
                "tokenseam_tokenize_memo_reused_tokens",
                "Token ids taken from an earlier text instead of tokenized",
                st["reused_tokens"],
            ),
            (
                "tokenseam_tokenize_memo_tokenized_bytes",
                "Bytes those texts still had tokenized",
                st["tokenized_bytes"],
            ),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c


class GrammarCollector:
    """The grammar compiler's memory (grammar/memory.py), read at scrape time.

    `tokenseam_grammar_cache_bytes` is what compiled grammars hold, cached or in use by a request (automata and
    masks grown by requests included), against `tokenseam_grammar_cache_budget_bytes` (`--grammar-cache-mb`).
    """

    def __init__(self, state) -> None:
        self.state = state

    def collect(self):
        st = self.state.grammar_memory()
        for name, doc, key in (
            ("tokenseam_grammar_cache_bytes", "Bytes held by compiled grammars, cached or in use", "bytes"),
            ("tokenseam_grammar_cache_budget_bytes", "The grammar memory budget", "budget_bytes"),
            ("tokenseam_grammar_cache_grammars", "Compiled grammars cached for reuse", "cached_grammars"),
            (
                "tokenseam_grammar_live_grammars",
                "Compiled grammars alive (cached or in use)",
                "live_grammars",
            ),
        ):
            m = GaugeMetricFamily(name, doc)
            m.add_metric([], st[key])
            yield m
        for name, doc, key in (
            (
                "tokenseam_grammar_cache_evictions",
                "Compiled grammars evicted from the cache (LRU)",
                "evictions",
            ),
            (
                "tokenseam_grammar_renewals",
                "Grammars in use started over (a fresh automaton) to keep the budget",
                "renewals",
            ),
            (
                "tokenseam_grammar_unmemoised_masks",
                "Token masks computed without being memoised (the budget was spent)",
                "unmemoised_masks",
            ),
            (
                "tokenseam_grammar_gss_fallbacks",
                "Requests moved to the exact GSS parser (their grammar left more parses open than the automaton"
                " keeps)",
                "gss_fallbacks",
            ),
        ):
            m = CounterMetricFamily(name, doc)
            m.add_metric([], st[key])
            yield m
