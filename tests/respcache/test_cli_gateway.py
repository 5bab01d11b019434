"""`tokenseam gateway` flags: hostile values give a clear message and exit code 2, never a traceback."""

from __future__ import annotations

import argparse

import pytest

from tokenseam.cli import build_parser
from tokenseam.gateway import cli_gateway


def parse(*argv):
    return build_parser("gateway").parse_args(["gateway", *argv])


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--upstream", "http://127.0.0.1:9", "--port", "0"], "--port 0"),
        (["--upstream", "http://127.0.0.1:9", "--port", "70000"], "--port 70000"),
        (["--upstream", "http://127.0.0.1:9", "--timeout", "-1"], "--timeout"),
        (["--upstream", "http://127.0.0.1:9", "--cache-max-entries", "-5"], "--cache-max-entries"),
        (
            ["--upstream", "http://127.0.0.1:9", "--upstream-key-env", "TS_SURELY_UNSET_VAR"],
            "TS_SURELY_UNSET_VAR",
        ),
        (["--upstream", "http://127.0.0.1:9", "--cache-store", "mysql://x"], "unknown cache store"),
        (["--upstream", "ftp://example", "--cache-store", "memory"], "must start with http"),
        (["--upstream", "http://127.0.0.1:9", "--shutdown-timeout", "-1"], "--shutdown-timeout"),
    ],
)
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
    args = parse(
        "--upstream",
        "http://127.0.0.1:9/v1",
        "--cache-store",
        f"sqlite:{tmp_path / 'g.sqlite'}",
        "--cache",
        "always",
        "--upstream-key-env",
        "TS_KEY",
    )
    assert isinstance(args, argparse.Namespace) and args.func is cli_gateway.run
    from prometheus_client import REGISTRY

    app = cli_gateway.build_app(args)
    assert app.state.upstream == "http://127.0.0.1:9"
    assert app.state.cache.mode == "always" and app.state.cache.store.description.endswith("g.sqlite")
    # the CLI's cache reports to the global registry, which /metrics serves
    assert any(n.startswith("tokenseam_respcache") for n in REGISTRY._names_to_collectors)


@pytest.mark.parametrize(
    "argv,env,needles",
    [
        (["--upstream-key-env", "TS_UP"], {"TS_UP": "sk-up"}, ["--api-key-env", "--no-client-auth"]),
        (["--api-key-env", "TS_CLIENTS"], {}, ["--api-key-env TS_CLIENTS", "not set"]),
        (["--api-key-env", "TS_CLIENTS"], {"TS_CLIENTS": " , ,"}, ["holds no key"]),
        (["--api-key-env", "TS_CLIENTS", "--no-client-auth"], {"TS_CLIENTS": "ck"}, ["contradict"]),
    ],
)
def test_an_upstream_key_needs_client_auth_or_an_explicit_opt_out(argv, env, needles, capsys, monkeypatch):
    monkeypatch.delenv("TS_CLIENTS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cli_gateway.run(parse("--upstream", "http://127.0.0.1:9", "--cache-store", "memory", *argv)) == 2
    err = capsys.readouterr().err
    assert all(n in err for n in needles), err
    assert "sk-up" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--upstream-key-env", "TS_UP", "--api-key-env", "TS_CLIENTS"],
        ["--upstream-key-env", "TS_UP", "--no-client-auth"],
        ["--api-key-env", "TS_CLIENTS"],
        [],
    ],
)
def test_accepted_auth_combinations(argv, monkeypatch):
    monkeypatch.setenv("TS_UP", "sk-up")
    monkeypatch.setenv("TS_CLIENTS", "ck-1, ck-2,,")
    args = parse("--upstream", "http://127.0.0.1:9", *argv)
    assert cli_gateway._check(args) is None
    assert cli_gateway.client_keys(args) == (["ck-1", "ck-2"] if "--api-key-env" in argv else [])


def test_client_keys_host_and_cors_flags_reach_the_app(monkeypatch):
    from starlette.testclient import TestClient

    monkeypatch.setenv("TS_CLIENTS", "ck-1,ck-2")
    args = parse(
        "--upstream",
        "http://127.0.0.1:9",
        "--cache-store",
        "memory",
        "--api-key-env",
        "TS_CLIENTS",
        "--allowed-host",
        "gw.internal",
        "--allowed-host",
        "localhost",
        "--cors-origin",
        "https://app.example",
    )
    app = cli_gateway.build_app(args)
    assert app.state.client_auth is True
    with TestClient(app, base_url="http://gw.internal") as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers={"authorization": "Bearer ck-2"}).status_code == 200
        assert c.get("/health", headers={"host": "127.0.0.1"}).status_code == 400  # not in the given list
        pre = c.options(
            "/v1/chat/completions",
            headers={"origin": "https://app.example", "access-control-request-method": "POST"},
        )
        assert pre.status_code == 204


@pytest.mark.parametrize(
    "host,expected",
    [
        ("127.0.0.1", ["localhost", "127.0.0.1", "[::1]"]),
        ("0.0.0.0", None),
        ("::1", ["localhost", "127.0.0.1", "[::1]"]),
    ],
)
def test_allowed_hosts_default_from_the_bind_address(host, expected):
    assert cli_gateway.allowed_hosts(parse("--upstream", "http://x", "--host", host)) == expected
    assert cli_gateway.allowed_hosts(
        parse("--upstream", "http://x", "--host", host, "--allowed-host", "*")
    ) == ["*"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--upstream", "ftp://user:s3cret@example/?token=s3cret"],
        ["--upstream", "http://user:s3cret@127.0.0.1:9", "--cache-store", "mysql://root:dbpass9@db/x"],
    ],
)
def test_startup_errors_do_not_print_credentials(argv, capsys):
    assert cli_gateway.run(parse(*argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "s3cret" not in err and "dbpass9" not in err and "***" in err
