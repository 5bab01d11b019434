"""The `tokenseam` command: one subcommand per job, each defined in the part it belongs to.

Subcommand modules are imported lazily so `tokenseam tokenize` does not pay for the server's imports.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> module exposing `add_parser(subparsers) -> None` and `run(args) -> int`.
COMMANDS: dict[str, str] = {
    "serve": "tokenseam.server.cli_serve",
    "generate": "tokenseam.engine.cli_generate",
    "tokenize": "tokenseam.vocab.cli_tokenize",
    "gateway": "tokenseam.gateway.cli_gateway",
    "lint-prompt": "tokenseam.healing.cli_lint",
    "plan": "tokenseam.planner.cli_plan",
    "pad": "tokenseam.planner.cli_pad",
    "eval": "tokenseam.planner.cli_eval",
    "bench": "tokenseam.bench.cli",
}


def int_in_range(name: str, lo: int, hi: int):
    """An argparse type: an integer from lo to hi, with an error that names the flag."""

    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{name} must be between {lo} and {hi}, got {v}")
        return v

    return conv


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenseam", description="LLM serving that gets the text/token seam right.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=f"(run `tokenseam {name} --help`)")
            continue
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("tokenseam"):
                continue  # that part is not built yet
            raise
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(first if first in COMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
