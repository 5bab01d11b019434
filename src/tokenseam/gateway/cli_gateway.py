"""`tokenseam gateway --upstream URL`: the response cache in front of any OpenAI-compatible server.

Flags choose the store (`sqlite:PATH`, `redis://...`, `memory`) and the policy (`off`, `deterministic`, `always`).
Keys come from environment variables only (`--upstream-key-env`, `--api-key-env`): a command line is visible to
every local user through `ps`. A gateway holding an upstream key refuses to start without client keys unless told
`--no-client-auth`, since it would otherwise spend that key for anyone who can reach it.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..httpkit.cli import add_guard_arguments, allowed_hosts, check_guard_arguments, client_keys
from ..respcache.cli import add_cache_arguments


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gateway", help="serve a response cache in front of an OpenAI-compatible server")
    p.add_argument(
        "--upstream", required=True, help="upstream base URL, e.g. http://127.0.0.1:8000 (a /v1 suffix is ok)"
    )
    p.add_argument(
        "--upstream-key-env",
        default=None,
        metavar="VAR",
        help="environment variable holding the upstream API key (default: forward the client's key)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8090)
    add_cache_arguments(p)
    p.add_argument("--cache-max-entries", type=int, default=None, metavar="N", help="evict beyond N entries")
    p.add_argument("--cache-truncated", action="store_true", help="also cache finish_reason=length answers")
    p.add_argument("--timeout", type=float, default=120.0, help="upstream read timeout in seconds (-> 504)")
    p.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024)
    p.add_argument(
        "--no-client-auth",
        action="store_true",
        help="serve with --upstream-key-env but without client keys: anyone who can reach the gateway "
        "spends the upstream key",
    )
    add_guard_arguments(p, "gateway")
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT: seconds to let running requests finish before they are cut off",
    )
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> str | None:
    if not 0 < args.port < 65536:
        return f"--port {args.port} is not a TCP port (1-65535)"
    if args.timeout <= 0:
        return "--timeout must be positive"
    if args.cache_max_entries is not None and args.cache_max_entries <= 0:
        return "--cache-max-entries must be positive"
    if args.max_body_bytes <= 0:
        return "--max-body-bytes must be positive"
    if args.upstream_key_env and not os.environ.get(args.upstream_key_env):
        return f"--upstream-key-env {args.upstream_key_env}: that environment variable is not set or empty"
    if not 0 <= args.shutdown_timeout <= 3600:
        return "--shutdown-timeout must be between 0 and 3600 seconds"
    problem = check_guard_arguments(args)
    if problem:
        return problem
    if args.api_key_env and args.no_client_auth:
        return "--api-key-env and --no-client-auth contradict each other; pass one"
    if args.upstream_key_env and not args.api_key_env and not args.no_client_auth:
        return (
            "--upstream-key-env makes the gateway call the upstream with that key for every client, so "
            "clients must authenticate: set --api-key-env VAR (VAR holding comma-separated client keys), or "
            "pass --no-client-auth to accept that anyone who can reach the gateway uses the key"
        )
    return None


def build_app(args: argparse.Namespace):
    """The gateway app for parsed CLI arguments (raises ResponseCacheError with an actionable message)."""
    from ..respcache import ResponseCache, open_store
    from .app import create_gateway_app

    store = open_store(args.cache_store, max_entries=args.cache_max_entries, default_ttl=args.cache_ttl)
    cache = ResponseCache(
        store, mode=args.cache, ttl_seconds=args.cache_ttl, cache_truncated=args.cache_truncated
    )
    key = os.environ.get(args.upstream_key_env) if args.upstream_key_env else None
    return create_gateway_app(
        args.upstream,
        cache=cache,
        api_key=key,
        timeout=args.timeout,
        max_body_bytes=args.max_body_bytes,
        client_api_keys=client_keys(args),
        allowed_hosts=allowed_hosts(args),
        cors_origins=args.cors_origin,
    )


def run(args: argparse.Namespace) -> int:
    from ..httpkit import redact_text, url_secrets
    from ..respcache import ResponseCacheError

    problem = _check(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        app = build_app(args)
    except ResponseCacheError as e:
        # The message can quote the upstream URL or a store URL (redis://:password@...).
        print(f"error: {redact_text(str(e), url_secrets(args.upstream))}", file=sys.stderr)
        return 2
    import uvicorn

    hosts = allowed_hosts(args)
    print(
        f"tokenseam gateway on http://{args.host}:{args.port} -> {app.state.upstream} "
        f"(cache {args.cache}, store {app.state.redact(app.state.cache.store.description)}, client auth "
        f"{'on' if app.state.client_auth else 'OFF'}, hosts {', '.join(hosts) if hosts else 'any'}, "
        f"CORS {', '.join(args.cors_origin) if args.cors_origin else 'off'})",
        file=sys.stderr,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        timeout_graceful_shutdown=args.shutdown_timeout,
    )
    return 0
