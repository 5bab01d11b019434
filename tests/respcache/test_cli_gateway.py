"""`tokenseam gateway` flags: hostile values give a clear message and exit code 2, never a traceback."""

from __future__ import annotations

import argparse

import pytest

from tokenseam.cli import build_parser
from tokenseam.respcache import cli_gateway


def parse(*argv):
    return build_parser("gateway").parse_args(["gateway", *argv])


@pytest.mark.parametrize("argv,needle", [
    (["--upstream", "http://127.0.0.1:9", "--port", "0"], "--port 0"),
    (["--upstream", "http://127.0.0.1:9", "--port", "70000"], "--port 70000"),
    (["--upstream", "http://127.0.0.1:9", "--timeout", "-1"], "--timeout"),
    (["--upstream", "http://127.0.0.1:9", "--cache-ttl", "0"], "--cache-ttl"),
    (["--upstream", "http://127.0.0.1:9", "--cache-max-entries", "-5"], "--cache-max-entries"),
    (["--upstream", "http://127.0.0.1:9", "--upstream-key-env", "TS_SURELY_UNSET_VAR"], "TS_SURELY_UNSET_VAR"),
    (["--upstream", "http://127.0.0.1:9", "--cache-store", "mysql://x"], "unknown cache store"),
    (["--upstream", "ftp://example", "--cache-store", "memory"], "must start with http"),
])
def test_bad_flags_exit_2_with_a_message(argv, needle, capsys, monkeypatch):
    monkeypatch.delenv("TS_SURELY_UNSET_VAR", raising=False)
    assert cli_gateway.run(parse(*argv)) == 2
    assert needle in capsys.readouterr().err


def test_unknown_cache_mode_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as ei:
        parse("--upstream", "http://x", "--cache", "sometimes")
    assert ei.value.code == 2 and "sometimes" in capsys.readouterr().err


def test_build_app_wires_store_and_policy(tmp_path, monkeypatch):
    monkeypatch.setenv("TS_KEY", "sk-up")
    args = parse("--upstream", "http://127.0.0.1:9/v1", "--cache-store", f"sqlite:{tmp_path / 'g.sqlite'}",
                 "--cache", "always", "--upstream-key-env", "TS_KEY")
    assert isinstance(args, argparse.Namespace) and args.func is cli_gateway.run
    from prometheus_client import REGISTRY

    app = cli_gateway.build_app(args)
    assert app.state.upstream == "http://127.0.0.1:9"
    assert app.state.cache.mode == "always" and app.state.cache.store.description.endswith("g.sqlite")
    # the CLI's cache reports to the global registry, which /metrics serves
    assert any(n.startswith("tokenseam_respcache") for n in REGISTRY._names_to_collectors)
