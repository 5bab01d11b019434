"""`tokenseam serve`: the OpenAI- and llama-server-compatible HTTP server on a local GGUF model."""

from __future__ import annotations

import argparse
import os

from ..httpkit.cli import add_guard_arguments, allowed_hosts, check_guard_arguments, client_keys
from ..respcache.cli import TRUNCATED, add_cache_arguments


def _positive(name: str, lo: int = 1, hi: int = 1 << 20):
    from ..argtypes import int_in_range

    return int_in_range(name, lo, hi)


def serve_keys(args) -> list[str]:
    """The client keys: --api-key flags, the --api-key-env variable's, else TOKENSEAM_API_KEY's
    (comma-separated, blanks ignored). Several keys are all valid."""
    keys = [k.strip() for k in args.api_key or [] if k.strip()] + client_keys(args)
    if not args.api_key_env:
        keys += [k.strip() for k in os.environ.get("TOKENSEAM_API_KEY", "").split(",") if k.strip()]
    return list(dict.fromkeys(keys))


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    p.add_argument(
        "--model", default=None, help="smollm2 (default, bundled), gemma3, or a path to a .gguf file"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_positive("--port", 0, 65535), default=8080)
    p.add_argument(
        "--ctx-size",
        type=_positive("--ctx-size", 64, 1 << 18),
        default=4096,
        help="context window per sequence, in tokens",
    )
    p.add_argument(
        "--parallel",
        type=_positive("--parallel", 1, 64),
        default=8,
        help="sequences decoded together (continuous batching)",
    )
    p.add_argument(
        "--threads", type=_positive("--threads", 0, 512), default=0, help="CPU threads (0 = all cores)"
    )
    p.add_argument(
        "--max-queue",
        type=_positive("--max-queue", 0, 100000),
        default=64,
        help="requests allowed to wait for a free sequence; beyond it: 503 with Retry-After",
    )
    p.add_argument(
        "--prefix-cache-tokens",
        type=_positive("--prefix-cache-tokens", 0, 1 << 22),
        default=16384,
        help="tokens of KV the radix prefix cache keeps in host memory (0 disables it)",
    )
    p.add_argument(
        "--prefix-block",
        type=_positive("--prefix-block", 1, 4096),
        default=16,
        help="the fewest new tokens a branch must add for the host prefix cache to store a copy of its path",
    )
    p.add_argument(
        "--resident-kv-tokens",
        type=_positive("--resident-kv-tokens", 0, 1 << 22),
        default=None,
        metavar="TOKENS",
        help="KV that free slots keep from their last request, so a prompt that continues or shares it (a "
        "conversation's next turn) reuses it with nothing restored (default: --ctx-size; 0: off). Past it, the "
        "least recently used free slot's path is copied to the host prefix cache when another slot is released",
    )
    p.add_argument(
        "--flash-attn",
        choices=("auto", "on", "off"),
        default="auto",
        help="llama.cpp's flash attention. It skips the KV cells a token may not see (outside a sliding "
        "window) and decodes many streams of short contexts faster, but reads a prompt over a long cached prefix "
        "more slowly; auto: on for a model with sliding-window layers, off for one without",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="NAME|FILE",
        help="how chats are rendered: chatml or gemma (built in), or a file holding a Jinja chat template; default: "
        "the GGUF's template, else the built-in one whose turn markers are special tokens of the model's "
        "vocabulary (gemma for Gemma's, otherwise chatml)",
    )
    add_cache_arguments(p)
    p.add_argument(
        "--api-key",
        action="append",
        default=None,
        metavar="KEY",
        help="a client API key (repeatable), as vLLM takes it; visible to local users in `ps`, so prefer "
        "TOKENSEAM_API_KEY or --api-key-env",
    )
    p.add_argument(
        "--max-memory-mb",
        type=_positive("--max-memory-mb", 64, 1 << 22),
        default=None,
        metavar="MB",
        help="resident memory the process may reach before grammar compiles are refused or stopped "
        "(503 + Retry-After; default: no cap beyond each compile's own size budget)",
    )
    p.add_argument(
        "--grammar-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="wall-clock budget of one grammar compile (default 20); past it the request gets a 400",
    )
    p.add_argument(
        "--grammar-overlap",
        choices=("auto", "on", "off"),
        default="auto",
        help="on: a request's grammar compiles while the engine reads its prompt, whose last token waits for it "
        "(the first token comes after the longer of the two, not after both); off: it compiles first, so no "
        "prompt is read for a request whose grammar is refused; auto (default): on when --threads leaves a core "
        "free for the compile",
    )
    p.add_argument(
        "--turn-memory-mb",
        type=_positive("--turn-memory-mb", 0, 1 << 20),
        default=64,
        metavar="MB",
        help="memory for the ids of earlier chat answers, per tenant and prompt, so a history sent back as "
        "text reuses its cached KV (default 64; LRU; 0: histories are re-tokenized)",
    )
    p.add_argument(
        "--tokenize-memo-mb",
        type=_positive("--tokenize-memo-mb", 0, 1 << 20),
        default=16,
        metavar="MB",
        help="memory for the ids of recent long prompts: a prompt that begins like one of them reuses its ids "
        "up to a safe cut and tokenizes only the rest, with the same ids as a whole tokenization (default 16; "
        "LRU; 0: every prompt is tokenized whole)",
    )
    p.add_argument(
        "--grammar-cache-mb",
        type=_positive("--grammar-cache-mb", 0, 1 << 20),
        default=None,
        metavar="MB",
        # the default is grammar.memory.DEFAULT_BUDGET_MB (not imported here: it would load the grammar engine)
        help="memory the compiled grammars may hold, cached or in use, automata and masks grown by requests "
        "included (default 256); past it unused grammars are evicted (LRU) and grammars in use stop "
        "memoising, no request fails. 0: nothing kept between requests or steps (slow; for measuring)",
    )
    add_guard_arguments(p, "server")
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT: seconds to let running requests finish before they are cut off",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging
    import os
    import sys

    import uvicorn

    from ..engine.chat_template import ChatTemplateError
    from ..engine.errors import BackendError
    from ..httpkit import redact_text, url_secrets
    from ..models import ModelNotFoundError
    from ..respcache import ResponseCacheError
    from ..vocab import VocabularyError
    from .runtime import build_server, settle_serving_process

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    problem = check_guard_arguments(args)
    if problem is None and args.grammar_timeout is not None and not 0.1 <= args.grammar_timeout <= 600:
        problem = "--grammar-timeout must be between 0.1 and 600 seconds"
    if problem is None and not 0 <= args.shutdown_timeout <= 3600:
        problem = "--shutdown-timeout must be between 0 and 3600 seconds"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    keys, hosts = serve_keys(args), allowed_hosts(args)
    try:
        app, state = build_server(
            args.model,
            n_ctx=args.ctx_size,
            parallel=args.parallel,
            threads=args.threads,
            max_queue=args.max_queue,
            prefix_cache_tokens=args.prefix_cache_tokens,
            prefix_block=args.prefix_block,
            resident_tokens=-1 if args.resident_kv_tokens is None else args.resident_kv_tokens,
            cache_mode=args.cache,
            cache_store=args.cache_store,
            cache_ttl=args.cache_ttl,
            cache_truncated=TRUNCATED[args.cache_truncated],
            api_keys=keys or None,
            allowed_hosts=hosts,
            cors_origins=args.cors_origin,
            max_memory_mb=args.max_memory_mb,
            grammar_seconds=args.grammar_timeout,
            grammar_cache_mb=args.grammar_cache_mb,
            turn_memory_mb=args.turn_memory_mb,
            tokenize_memo_mb=args.tokenize_memo_mb,
            flash_attn=args.flash_attn,
            grammar_overlap=args.grammar_overlap,
            chat_template=args.chat_template,
        )
    except (ModelNotFoundError, VocabularyError, BackendError, ResponseCacheError, ChatTemplateError) as e:
        print(f"error: {redact_text(str(e), url_secrets(args.cache_store))}", file=sys.stderr)
        return 2
    settle_serving_process()  # the model, vocabulary tables and grammar engine are loaded for good
    template = args.chat_template or (
        "the GGUF's" if state.backend.chat_template else f"built-in {state.chat.builtin} (none in the GGUF)"
    )
    print(
        f"tokenseam: serving {state.model_id} on http://{args.host}:{args.port} "
        f"(ctx {args.ctx_size} x {args.parallel} sequences, flash attention "
        f"{'on' if state.engine.backend.flash_attn else 'off'}, grammars compiled "
        f"{'beside' if state.grammar_overlap else 'before'} the prompt, chat template {template}; API keys "
        f"{'on' if keys else 'off'}, hosts "
        f"{', '.join(hosts) if hosts else 'any'}, CORS {', '.join(args.cors_origin) if args.cors_origin else 'off'})",
        file=sys.stderr,
        flush=True,
    )
    if not keys and not hosts:
        print(
            "tokenseam: warning: bound to a non-loopback address without an API key: anyone who can reach "
            "this port can use it",
            file=sys.stderr,
            flush=True,
        )
    try:
        # On SIGTERM uvicorn stops accepting, waits up to the timeout for open requests, then cancels them.
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=args.shutdown_timeout,
        )
    finally:
        state.shutdown()
    if state.busy_threads():
        # A grammar compile cannot be interrupted from outside its thread; it ends at its budget, but the
        # process must not wait for it once the drain is over.
        logging.getLogger("tokenseam.server").warning(
            "exiting with %d preparation jobs still running", state.busy_threads()
        )
        sys.stderr.flush()
        os._exit(0)
    return 0
