"""`tokenseam bench NAME`: dispatch to the benchmark modules (each defines add_arguments and run)."""

from __future__ import annotations

import argparse
import importlib

BENCHES = {
    "serve": ("tokenseam.bench.serve", "decode speed vs llama-cpp-python and raw llama.cpp batching"),
    "grammar": ("tokenseam.bench.grammar", "constrained decoding masks vs xgrammar / llguidance (MaskBench)"),
    "grammar-memory": (
        "tokenseam.bench.grammar_memory",
        "grammar memory held under a stream of distinct schemas, against --grammar-cache-mb's budget",
    ),
    "grammar-overlap": (
        "tokenseam.bench.grammar_overlap",
        "time to first token with a large schema: grammar compiled while the prompt is read vs first",
    ),
    "healing": ("tokenseam.bench.healing", "token healing cost and canonicality"),
    "flash-attn": (
        "tokenseam.bench.flash_attn",
        "llama.cpp's flash attention on and off: decode steps and prompt reads at several context lengths",
    ),
    "prefix-cache": ("tokenseam.bench.prefix_cache", "prefix KV cache reuse and TTFT on a RAG workload"),
    "conversation": (
        "tokenseam.bench.conversation",
        "multi-turn chats re-sent whole each turn: previous context reused and TTFT per turn",
    ),
    "cache": ("tokenseam.bench.cache", "response cache fingerprint, hit latency and gateway load"),
    "gateway": (
        "tokenseam.bench.gateway",
        "the gateway over several replicas: stable-prefix routing vs round-robin / least-loaded, overhead, chaos",
    ),
    "chaos": ("tokenseam.bench.chaos", "the fault set against a real server and gateway: 5xx, hangs, leaks"),
    "vllm": (
        "tokenseam.bench.vllm",
        "tokenseam's backend inside vLLM vs xgrammar / guidance (throughput, TTFT)",
    ),
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a benchmark against its anchors")
    bsub = p.add_subparsers(dest="bench", metavar="BENCH")
    for name, (module, help_) in BENCHES.items():
        mod = importlib.import_module(module)
        bp = bsub.add_parser(name, help=help_)
        mod.add_arguments(bp)
        bp.set_defaults(func=mod.run)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
