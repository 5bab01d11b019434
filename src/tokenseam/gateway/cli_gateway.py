"""`tokenseam gateway --upstream URL [--upstream URL ...]` or `--config FILE`: the response cache and the
router in front of one or several OpenAI-compatible servers.

Flags choose the store (`sqlite:PATH`, `redis://...`, `memory`) and the policy (`off`, `deterministic`, `always`).
Keys come from environment variables only (`--upstream-key-env`, `--api-key-env`): a command line is visible to
every local user through `ps`. A gateway holding an upstream key refuses to start without client keys unless told
`--no-client-auth`, since it would otherwise spend that key for anyone who can reach it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tomllib
from typing import Any

from ..httpkit.cli import add_guard_arguments, allowed_hosts, check_guard_arguments, client_keys
from ..respcache.cli import TRUNCATED, add_cache_arguments

POOL_DEFAULTS: dict[str, Any] = {
    "routing": "prefix",
    "load_factor": 1.25,
    "max_in_flight": 128,
    "health_interval": 5.0,
    "fail_threshold": 2,
    "queue_timeout": 10.0,
    "route_prefix_bytes": 1024,
}
POOL_CHOICES = {"routing": ("prefix", "least-loaded", "round-robin")}
# (type, low, high) of each numeric setting, from the command line or the config file.
POOL_RANGES: dict[str, tuple[type, float, float]] = {
    "load_factor": (float, 1.0, 10.0),
    "max_in_flight": (int, 1, 100_000),
    "health_interval": (float, 0.1, 3600),
    "fail_threshold": (int, 1, 1000),
    "queue_timeout": (float, 0, 3600),
    "route_prefix_bytes": (int, 16, 1 << 20),
}
UPSTREAM_KEYS = {"url", "name", "max_in_flight", "kind"}


def load_config(path: str) -> dict[str, Any]:
    """The gateway's TOML config: `[[upstream]]` tables and pool settings. Raises ValueError naming the
    problem (unknown key, wrong type, missing url)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ValueError(f"--config {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--config {path} is not valid TOML: {e}") from None
    unknown = set(data) - set(POOL_DEFAULTS) - {"upstream", "tokenizers"}
    if unknown:
        raise ValueError(f"--config {path}: unknown setting(s) {', '.join(sorted(unknown))}")
    ups = data.get("upstream", [])
    if not isinstance(ups, list) or not all(isinstance(u, dict) for u in ups):
        raise ValueError(f"--config {path}: `upstream` must be a list of tables ([[upstream]])")
    for i, u in enumerate(ups):
        bad = set(u) - UPSTREAM_KEYS
        if bad:
            raise ValueError(f"--config {path}: upstream {i + 1} has unknown key(s) {', '.join(sorted(bad))}")
        if not isinstance(u.get("url"), str):
            raise ValueError(f"--config {path}: upstream {i + 1} needs a url string")
        if "name" in u and not isinstance(u["name"], str):
            raise ValueError(f"--config {path}: upstream {i + 1}: name must be a string")
        if "kind" in u and not isinstance(u["kind"], str):
            raise ValueError(f"--config {path}: upstream {i + 1}: kind must be a string")
        if "max_in_flight" in u:
            _check_value(f"upstream {i + 1} max_in_flight", u["max_in_flight"], POOL_RANGES["max_in_flight"])
    toks = data.get("tokenizers", {})
    if not isinstance(toks, dict) or not all(isinstance(v, str) for v in toks.values()):
        raise ValueError(f"--config {path}: `tokenizers` must be a table of model name = path strings")
    for k, v in data.items():
        if k in POOL_RANGES:
            _check_value(k, v, POOL_RANGES[k])
        elif k in POOL_CHOICES and v not in POOL_CHOICES[k]:
            raise ValueError(f"--config {path}: {k} must be one of {', '.join(POOL_CHOICES[k])}, got {v!r}")
    return data


def _check_value(name: str, value: Any, spec: tuple[type, float, float]) -> None:
    kind, lo, hi = spec
    ok_type = isinstance(value, int) if kind is int else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type:
        raise ValueError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be between {lo:g} and {hi:g}, got {value!r}")


def pool_settings(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(upstream tables, pool settings) from the config file and the flags (flags win). Raises ValueError."""
    config = load_config(args.config) if args.config else {}
    settings = {}
    for k, default in POOL_DEFAULTS.items():
        flag = getattr(args, k, None)
        value = flag if flag is not None else config.get(k, default)
        if k in POOL_RANGES:
            _check_value("--" + k.replace("_", "-"), value, POOL_RANGES[k])
        settings[k] = value
    settings["tokenizers"] = [f"{m}={p}" for m, p in config.get("tokenizers", {}).items()] + list(
        args.tokenizer or []
    )
    upstreams = [dict(u) for u in config.get("upstream", [])]
    upstreams += [{"url": u} for u in args.upstream or []]
    if not upstreams:
        raise ValueError("give --upstream URL (once per replica) or --config FILE with [[upstream]] tables")
    return upstreams, settings


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gateway", help="serve a response cache in front of an OpenAI-compatible server")
    p.add_argument(
        "--upstream",
        action="append",
        default=None,
        metavar="URL",
        help="upstream base URL, e.g. http://127.0.0.1:8000 (a /v1 suffix is ok); repeat for several replicas",
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="a TOML file with [[upstream]] tables (url, name, max_in_flight, kind) and pool settings "
        "(routing, load_factor, max_in_flight, health_interval, fail_threshold, queue_timeout, "
        "route_prefix_bytes); flags given on the command line win",
    )
    p.add_argument(
        "--routing",
        choices=POOL_CHOICES["routing"],
        default=None,
        help="how a replica is chosen: prefix (stable-prefix consistent hashing with bounded load, the default), "
        "least-loaded, round-robin",
    )
    p.add_argument("--load-factor", type=float, default=None, help="bounded-load factor (default 1.25)")
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        metavar="N",
        help="requests in flight per replica (default 128)",
    )
    p.add_argument(
        "--health-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds between health probes (5)",
    )
    p.add_argument(
        "--fail-threshold",
        type=int,
        default=None,
        metavar="N",
        help="consecutive failures that take a replica out of rotation (2; a refused connection: at once)",
    )
    p.add_argument(
        "--queue-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds a request waits for a slot when every replica is at its limit (10), then 503",
    )
    p.add_argument(
        "--tokenizer",
        action="append",
        default=None,
        metavar="MODEL=PATH",
        help="the byte vocabulary of a served model (its tokenizer.json, or a .gguf), for token healing through "
        "vLLM replicas with tokenseam's healing processor; repeat per model",
    )
    p.add_argument(
        "--route-prefix-bytes",
        type=int,
        default=None,
        metavar="N",
        help="bytes of a text completion prompt the routing key covers (1024)",
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
    p.add_argument(
        "--cache-namespace",
        default=None,
        metavar="NAME",
        help="entries are shared by every gateway with this namespace, whatever their upstream URLs (default: the "
        "redacted upstream URL, or the sorted URLs of several)",
    )
    p.add_argument("--cache-max-entries", type=int, default=None, metavar="N", help="evict beyond N entries")
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
    try:
        pool_settings(args)
    except ValueError as e:
        return str(e)
    if not 0 < args.port < 65536:
        return f"--port {args.port} is not a TCP port (1-65535)"
    if args.timeout <= 0:
        return "--timeout must be positive"
    if args.cache_max_entries is not None and args.cache_max_entries <= 0:
        return "--cache-max-entries must be positive"
    if args.max_body_bytes <= 0:
        return "--max-body-bytes must be positive"
    if args.cache_namespace is not None and not 0 < len(args.cache_namespace) <= 200:
        return "--cache-namespace must be 1 to 200 characters"
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
    from ..respcache import ResponseCache, ResponseCacheError, open_store
    from .app import create_gateway_app
    from .healing import load_tokenizers
    from .pool import Replica

    try:
        upstreams, settings = pool_settings(args)
        tokenizers = load_tokenizers(settings["tokenizers"])
    except ValueError as e:
        raise ResponseCacheError(str(e)) from None
    replicas = [
        Replica(
            u["url"],
            name=u.get("name", ""),
            max_in_flight=u.get("max_in_flight", settings["max_in_flight"]),
            kind=u.get("kind"),
        )
        for u in upstreams
    ]

    store = open_store(args.cache_store, max_entries=args.cache_max_entries, default_ttl=args.cache_ttl)
    cache = ResponseCache(
        store,
        mode=args.cache,
        ttl_seconds=args.cache_ttl,
        cache_truncated=TRUNCATED[args.cache_truncated],
        namespace=args.cache_namespace or "",
    )
    key = os.environ.get(args.upstream_key_env) if args.upstream_key_env else None
    return create_gateway_app(
        replicas,
        cache=cache,
        api_key=key,
        timeout=args.timeout,
        max_body_bytes=args.max_body_bytes,
        client_api_keys=client_keys(args),
        allowed_hosts=allowed_hosts(args),
        cors_origins=args.cors_origin,
        routing=settings["routing"],
        load_factor=settings["load_factor"],
        health_interval=settings["health_interval"],
        fail_threshold=settings["fail_threshold"],
        queue_timeout=settings["queue_timeout"],
        prefix_bytes=settings["route_prefix_bytes"],
        tokenizers=tokenizers,
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
        urls = list(args.upstream or [])
        try:
            urls += [u["url"] for u in pool_settings(args)[0]]
        except ValueError:
            pass
        secrets = [s for u in urls for s in url_secrets(u)]
        print(f"error: {redact_text(str(e), secrets)}", file=sys.stderr)
        return 2
    import uvicorn

    hosts = allowed_hosts(args)
    print(
        f"tokenseam gateway on http://{args.host}:{args.port} -> {app.state.upstream} "
        f"(routing {app.state.pool.routing}) "
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
        # Per-request work the gateway does not use: X-Forwarded-* rewriting, the access log, the Server header.
        proxy_headers=False,
        # Clients and load balancers keep connections open between requests (nginx: 75 s); a gateway that
        # closes them after uvicorn's 5 s races every client that sends on one just then.
        timeout_keep_alive=75,
        access_log=False,
        server_header=False,
    )
    return 0
