"""The `tokenseam` command when an extra is not installed: a clear error naming the extra, not a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCK = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED or name in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Missing())
from tokenseam.cli import main
sys.exit(main({argv!r}))
"""


def _run(blocked: set[str], argv: list[str]) -> subprocess.CompletedProcess:
    code = BLOCK.format(blocked=sorted(blocked), argv=argv)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_serve_without_the_http_stack_names_the_extra():
    r = _run({"starlette", "uvicorn"}, ["serve", "--port", "0"])
    assert r.returncode == 2, r.stderr
    assert "tokenseam[gateway]" in r.stderr and "starlette" in r.stderr and "Traceback" not in r.stderr


def test_tokenize_without_llama_cpp_names_the_engine_extra():
    r = _run({"llama_cpp"}, ["tokenize", "hello"])
    assert r.returncode == 2, r.stderr
    assert "tokenseam[engine]" in r.stderr and "llama_cpp" in r.stderr and "Traceback" not in r.stderr


def test_a_missing_module_of_tokenseam_itself_is_not_hidden():
    r = _run({"tokenseam.server"}, ["serve", "--help"])
    assert r.returncode != 0 and "Traceback" in r.stderr and "tokenseam.server" in r.stderr


def test_extras_in_the_error_exist_in_pyproject():
    import tomllib
    from pathlib import Path

    from tokenseam.cli import EXTRA_OF_MODULE

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(EXTRA_OF_MODULE.values()) <= set(extras)


def test_help_lists_every_command_and_what_a_missing_one_needs():
    r = _run({"starlette"}, ["--help"])
    assert r.returncode == 0, r.stderr
    assert "serve" in r.stdout and "tokenseam[gateway]" in r.stdout and "tokenize" in r.stdout


@pytest.mark.parametrize("command,extra", [("serve", []), ("gateway", ["--upstream", "http://127.0.0.1:9"])])
@pytest.mark.parametrize("ttl", ["0", "-5", "nan", "inf", "soon"])
def test_serve_and_gateway_refuse_the_same_bad_cache_ttl(command, extra, ttl, capsys):
    from tokenseam.cli import build_parser

    with pytest.raises(SystemExit) as ei:
        build_parser(command).parse_args([command, *extra, "--cache-ttl", ttl])
    assert ei.value.code == 2 and "--cache-ttl" in capsys.readouterr().err


@pytest.mark.parametrize("command,extra", [("serve", []), ("gateway", ["--upstream", "http://127.0.0.1:9"])])
def test_serve_and_gateway_share_the_cache_flags(command, extra):
    from tokenseam.cli import build_parser

    args = build_parser(command).parse_args([command, *extra, "--cache", "always", "--cache-ttl", "2.5"])
    assert (args.cache, args.cache_store, args.cache_ttl) == ("always", "sqlite", 2.5)


def test_json_output_into_a_closed_pipe_prints_no_traceback():
    text = "hello world " * 2000
    cmd = f"{sys.executable} -m tokenseam.cli tokenize --json '{text}' | head -c 20"
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert len(r.stdout) == 20
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr


@pytest.mark.parametrize("flag", ["--grammar-cache-mb", "--tokenize-memo-mb", "--turn-memory-mb"])
@pytest.mark.parametrize("value", ["-1", "x", "1.5", "", "1e3", str((1 << 20) + 1)])
def test_serve_refuses_a_bad_memory_size(flag, value, capsys):
    from tokenseam.cli import build_parser

    with pytest.raises(SystemExit) as ei:
        build_parser("serve").parse_args(["serve", flag, value])
    assert ei.value.code == 2 and flag in capsys.readouterr().err


def test_serve_tokenize_memo_default_and_zero():
    from tokenseam.cli import build_parser

    parser = build_parser("serve")
    assert parser.parse_args(["serve"]).tokenize_memo_mb == 16
    assert parser.parse_args(["serve", "--tokenize-memo-mb", "0"]).tokenize_memo_mb == 0


def test_serve_grammar_cache_size_default_and_zero():
    from tokenseam.cli import build_parser
    from tokenseam.grammar.memory import DEFAULT_BUDGET_MB

    parser = build_parser("serve")
    assert parser.parse_args(["serve"]).grammar_cache_mb is None  # ServerState applies DEFAULT_BUDGET_MB
    assert parser.parse_args(["serve", "--grammar-cache-mb", "0"]).grammar_cache_mb == 0
    serve = next(
        a
        for a in parser._subparsers._group_actions[0].choices["serve"]._actions
        if a.dest == "grammar_cache_mb"
    )
    assert f"default {DEFAULT_BUDGET_MB})" in serve.help


@pytest.mark.parametrize("value", ["", "yes", "ON", "1"])
def test_serve_refuses_a_bad_flash_attention_setting(value, capsys):
    from tokenseam.cli import build_parser

    with pytest.raises(SystemExit) as ei:
        build_parser("serve").parse_args(["serve", "--flash-attn", value])
    assert ei.value.code == 2 and "--flash-attn" in capsys.readouterr().err


def test_serve_flash_attention_defaults_to_auto():
    from tokenseam.cli import build_parser

    assert build_parser("serve").parse_args(["serve"]).flash_attn == "auto"
