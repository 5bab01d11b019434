"""`tokenseam serve`: the OpenAI- and llama-server-compatible HTTP server on a local GGUF model."""

from __future__ import annotations

import argparse


def _positive(name: str, lo: int = 1, hi: int = 1 << 20):
    from ..cli import int_in_range

    return int_in_range(name, lo, hi)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    p.add_argument("--model", default=None, help="smollm2 (default, bundled), gemma3, or a path to a .gguf file")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_positive("--port", 0, 65535), default=8080)
    p.add_argument("--ctx-size", type=_positive("--ctx-size", 64, 1 << 18), default=4096,
                   help="context window per sequence, in tokens")
    p.add_argument("--parallel", type=_positive("--parallel", 1, 64), default=8,
                   help="sequences decoded together (continuous batching)")
    p.add_argument("--threads", type=_positive("--threads", 0, 512), default=0, help="CPU threads (0 = all cores)")
    p.add_argument("--max-queue", type=_positive("--max-queue", 0, 100000), default=64,
                   help="requests allowed to wait for a free sequence; beyond it: 503 with Retry-After")
    p.add_argument("--prefix-cache-tokens", type=_positive("--prefix-cache-tokens", 0, 1 << 22), default=16384,
                   help="tokens of KV the radix prefix cache keeps in host memory (0 disables it)")
    p.add_argument("--prefix-block", type=_positive("--prefix-block", 1, 4096), default=16,
                   help="prefix cache granularity in tokens")
    p.add_argument("--cache", default="deterministic", choices=["off", "deterministic", "always"],
                   help="response cache policy (deterministic: temperature 0 or an explicit seed)")
    p.add_argument("--cache-store", default="sqlite",
                   help="sqlite (default file), sqlite:PATH, redis://HOST:PORT/DB or memory")
    p.add_argument("--cache-ttl", type=float, default=None, help="seconds an entry lives (default: no expiry)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import gc
    import logging
    import sys

    import uvicorn

    from ..engine.errors import BackendError
    from ..models import ModelNotFoundError
    from ..respcache import ResponseCacheError
    from ..vocab import VocabularyError
    from .runtime import build_server

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app, state = build_server(args.model, n_ctx=args.ctx_size, parallel=args.parallel, threads=args.threads,
                                  max_queue=args.max_queue, prefix_cache_tokens=args.prefix_cache_tokens,
                                  prefix_block=args.prefix_block, cache_mode=args.cache,
                                  cache_store=args.cache_store, cache_ttl=args.cache_ttl)
    except (ModelNotFoundError, VocabularyError, BackendError, ResponseCacheError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # The model, vocabulary tables and grammar engine are loaded for good: move them out of the garbage
    # collector's reach, so a full collection during decoding (70-200 ms measured) does not walk them.
    gc.collect()
    gc.freeze()
    print(f"tokenseam: serving {state.model_id} on http://{args.host}:{args.port} "
          f"(ctx {args.ctx_size} x {args.parallel} sequences)", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        state.engine.shutdown()
    return 0
