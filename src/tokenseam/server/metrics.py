"""Prometheus metrics for the server: requests, tokens, latency histograms, queue depth, prefix-cache hits."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("tokenseam_requests", "HTTP requests by route and status", ["route", "status"],
                                registry=r)
        self.prompt_tokens = Counter("tokenseam_prompt_tokens", "Prompt tokens processed", registry=r)
        self.completion_tokens = Counter("tokenseam_completion_tokens", "Tokens generated", registry=r)
        self.prefix_hit_tokens = Counter("tokenseam_prefix_cache_hit_tokens", "Prompt tokens served from KV cache",
                                         registry=r)
        self.prefix_miss_tokens = Counter("tokenseam_prefix_cache_miss_tokens", "Prompt tokens decoded", registry=r)
        self.latency = Histogram("tokenseam_request_seconds", "End-to-end request latency", ["route"], registry=r,
                                 buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120))
        self.ttft = Histogram("tokenseam_time_to_first_token_seconds", "Time to first token", ["route"], registry=r,
                              buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
        self.queue_depth = Gauge("tokenseam_queue_depth", "Requests waiting for a sequence slot", registry=r)
        self.running = Gauge("tokenseam_running_requests", "Requests being decoded", registry=r)
