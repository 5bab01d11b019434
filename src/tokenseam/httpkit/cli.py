"""The guard's command-line flags, shared by `tokenseam serve` and `tokenseam gateway`.

Keys come from environment variables only: a command line is visible to every local user through `ps`.
"""

from __future__ import annotations

import argparse
import os

from .guard import default_allowed_hosts


def add_guard_arguments(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--api-key-env",
        default=None,
        metavar="VAR",
        help="environment variable holding the client API key(s), comma-separated; every route but "
        "/health then needs Authorization: Bearer <key>",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=None,
        metavar="HOST",
        help="Host header value to accept (repeatable; '*' accepts any). Default on a loopback bind: "
        "localhost, 127.0.0.1, [::1] and the bound host; elsewhere: no check",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=None,
        metavar="ORIGIN",
        help=f"browser origin allowed to call the {what}, e.g. https://app.example (repeatable; '*' "
        "allows any). Default: no CORS",
    )


def client_keys(args: argparse.Namespace) -> list[str]:
    """The client keys in `--api-key-env`'s variable (comma-separated, blanks ignored); [] when not set."""
    if not args.api_key_env:
        return []
    return [k.strip() for k in os.environ.get(args.api_key_env, "").split(",") if k.strip()]


def allowed_hosts(args: argparse.Namespace) -> list[str] | None:
    return args.allowed_host if args.allowed_host else default_allowed_hosts(args.host)


def check_guard_arguments(args: argparse.Namespace) -> str | None:
    """What is wrong with the guard flags, or None."""
    if args.api_key_env and not client_keys(args):
        return f"--api-key-env {args.api_key_env}: that environment variable is not set or holds no key"
    return None
