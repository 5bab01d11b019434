"""`tokenseam gateway --config FILE` and the pool flags: hostile values give a clear message and exit 2."""

from __future__ import annotations

import pytest

from tokenseam.cli import build_parser
from tokenseam.gateway import cli_gateway


def parse(*argv):
    return build_parser("gateway").parse_args(["gateway", *argv])


def write(tmp_path, text):
    p = tmp_path / "gateway.toml"
    p.write_text(text)
    return str(p)


GOOD = """
routing = "least-loaded"
load_factor = 1.5
health_interval = 2
[[upstream]]
url = "http://127.0.0.1:8001"
name = "a"
max_in_flight = 8
kind = "vllm"
[[upstream]]
url = "http://127.0.0.1:8002/v1"
"""


def test_a_config_file_builds_the_pool_and_flags_win(tmp_path):
    args = parse(
        "--config", write(tmp_path, GOOD), "--upstream", "http://127.0.0.1:8003", "--load-factor", "2"
    )
    app = cli_gateway.build_app(args)
    pool = app.state.pool
    assert [r.name for r in pool.replicas] == ["a", "127.0.0.1:8002", "127.0.0.1:8003"]
    assert pool.replicas[0].max_in_flight == 8 and pool.replicas[0].kind == "vllm"
    assert pool.replicas[1].max_in_flight == 128 and pool.replicas[1].kind is None
    assert pool.routing == "least-loaded" and pool.load_factor == 2.0 and pool.health_interval == 2
    assert app.state.upstream.startswith("pool:")


@pytest.mark.parametrize(
    "text,needle",
    [
        ("routing = 'random'\n[[upstream]]\nurl='http://a:1'", "routing must be one of"),
        ("colour = 'blue'\n[[upstream]]\nurl='http://a:1'", "unknown setting(s) colour"),
        ("[[upstream]]\nurl='http://a:1'\nweight=3", "unknown key(s) weight"),
        ("[[upstream]]\nname='a'", "needs a url"),
        ("upstream = 'http://a:1'", "list of tables"),
        ("[[upstream]]\nurl='http://a:1'\nmax_in_flight=0", "between 1 and"),
        ("[[upstream]]\nurl='http://a:1'\nmax_in_flight=true", "must be an integer"),
        ("load_factor = 'x'\n[[upstream]]\nurl='http://a:1'", "load_factor must be a number"),
        ("load_factor = 0.5\n[[upstream]]\nurl='http://a:1'", "between 1 and 10"),
        ("[[upstream]]\nurl='ftp://a:1'", "must start with http"),
        ("[[upstream]]\nurl='http://a:1'\nkind='mystery'", "kind 'mystery'"),
        (
            "[[upstream]]\nurl='http://a:1'\nname='x'\n[[upstream]]\nurl='http://b:1'\nname='x'",
            "names must differ",
        ),
        ("this is [not toml", "not valid TOML"),
    ],
)
def test_bad_config_files_exit_2_with_a_message(tmp_path, capsys, text, needle):
    assert cli_gateway.run(parse("--config", write(tmp_path, text), "--cache-store", "memory")) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,needle",
    [
        ([], "give --upstream URL"),
        (["--config", "/nonexistent/gw.toml"], "--config /nonexistent/gw.toml"),
        (["--upstream", "http://a:1", "--max-in-flight", "0"], "--max-in-flight must be between"),
        (["--upstream", "http://a:1", "--health-interval", "0"], "--health-interval must be between"),
        (["--upstream", "http://a:1", "--route-prefix-bytes", "1"], "--route-prefix-bytes must be between"),
        (["--upstream", "http://a:1", "--load-factor", "nan"], "--load-factor must be between"),
    ],
)
def test_bad_pool_flags_exit_2(capsys, argv, needle):
    assert cli_gateway.run(parse(*argv, "--cache-store", "memory")) == 2
    assert needle in capsys.readouterr().err


def test_a_config_url_with_credentials_is_redacted_in_errors(tmp_path, capsys):
    text = "[[upstream]]\nurl='http://u:hunter2@a:1'\n[[upstream]]\nurl='http://u:hunter2@a:1'"
    assert cli_gateway.run(parse("--config", write(tmp_path, text), "--cache-store", "memory")) == 2
    err = capsys.readouterr().err
    assert "names must differ" in err and "hunter2" not in err


def test_a_cache_namespace_is_shared_whatever_the_urls(capsys):
    a = cli_gateway.build_app(
        parse(
            "--upstream", "http://127.0.0.1:8001", "--cache-namespace", "rag-prod", "--cache-store", "memory"
        )
    )
    b = cli_gateway.build_app(
        parse(
            "--upstream",
            "http://localhost:8001/v1",
            "--cache-namespace",
            "rag-prod",
            "--cache-store",
            "memory",
        )
    )
    assert a.state.cache.namespace == b.state.cache.namespace == "rag-prod"
    plan = {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 0}
    fa = a.state.cache.plan("/v1/chat/completions", plan).fingerprint
    assert fa == b.state.cache.plan("/v1/chat/completions", plan).fingerprint
    assert (
        cli_gateway.run(parse("--upstream", "http://a:1", "--cache-namespace", "", "--cache-store", "memory"))
        == 2
    )
    assert "--cache-namespace" in capsys.readouterr().err
