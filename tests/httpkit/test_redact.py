"""Credentials out of URLs and free text."""

from __future__ import annotations

import pytest

from tokenseam.httpkit import is_secret_param, redact_text, redact_url, url_secrets


@pytest.mark.parametrize(
    "url,shown",
    [
        ("http://user:pass@h", "http://user:***@h"),
        ("https://:tok@h:8443/v1", "https://:***@h:8443/v1"),
        (
            "http://user:p@ss@h/x",
            "http://user:***@h/x",
        ),  # an unencoded "@" in the password: the host is after the last
        ("http://user@h/x", "http://user@h/x"),  # a user name alone is kept: there is no password to hide
        ("http://h/v1?api_key=k1&model=m", "http://h/v1?api_key=***&model=m"),
        (
            "http://h/?key=a&token=b&password=c&secret=d&sig=e&X-Api-Key=f&api-version=2024",
            "http://h/?key=***&token=***&password=***&secret=***&sig=***&X-Api-Key=***&api-version=2024",
        ),
        (
            "http://h/?access_token=a&client_secret=b&keep=1&key=",
            "http://h/?access_token=***&client_secret=***&keep=1&key=",
        ),
        (
            "http://u:s3cret@127.0.0.1:9/v1?api_key=s3cret#token=t",
            "http://u:***@127.0.0.1:9/v1?api_key=***#token=***",
        ),
        ("http://[::1]:8000/v1", "http://[::1]:8000/v1"),
        ("redis://:pw@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("not a url ?token=abc", "not a url ?token=***"),
    ],
)
def test_redact_url(url, shown):
    assert redact_url(url) == shown


def test_url_secrets_are_raw_and_decoded():
    assert set(url_secrets("http://u:s%40c@h/?token=a+b&x=1")) == {"s%40c", "s@c", "a+b", "a b"}
    assert url_secrets("http://h/v1") == []
    assert url_secrets("garbage") == []


@pytest.mark.parametrize(
    "name,secret",
    [
        ("api_key", True),
        ("API-KEY", True),
        ("x-api-key", True),
        ("upstream_token", True),
        ("sig", True),
        ("model", False),
        ("api-version", False),
        ("keyword", False),
        ("monkey", False),
    ],
)
def test_is_secret_param(name, secret):
    assert is_secret_param(name) is secret


def test_redact_text_masks_known_secrets_and_urls_in_messages():
    text = (
        "ConnectError: cannot connect to http://bob:hunter2@10.0.0.1:8000/v1/chat?api_key=k-9 "
        "(store redis:redis://:redispw@cache:6379/0), key sk-abcdef sent, see https://docs.example/x?page=2"
    )
    out = redact_text(text, ["sk-abcdef", None, ""])
    for s in ("hunter2", "k-9", "redispw", "sk-abcdef"):
        assert s not in out
    assert "http://bob:***@10.0.0.1:8000/v1/chat?api_key=***" in out
    assert "redis://:***@cache:6379/0" in out and "https://docs.example/x?page=2" in out
    # the longest secret first, so a secret containing another is not left half-masked
    assert redact_text("token abcdef", ["abc", "abcdef"]) == "token ***"
    # a short secret is still masked everywhere (a mangled message beats a leak)
    assert redact_text("a-b-a", ["a"]) == "***-b-***"


def test_redacting_filter_cleans_messages_arguments_and_tracebacks(caplog):
    import logging

    from tokenseam.httpkit import redacting_logs

    caplog.set_level(logging.DEBUG)
    lg = logging.getLogger("tests.httpkit.redact")
    with redacting_logs(lambda t: redact_text(t, ["sk-live-1"]), lg.name):
        lg.info("HTTP Request: POST %s %r", "http://u:pw9@h/v1?api_key=k7", "sk-live-1")
        try:
            raise ValueError("bad key sk-live-1 for http://u:pw9@h")
        except ValueError:
            lg.exception("failed")
    lg.info("after %s", "sk-live-1")  # the filter is gone once the block ends
    text = caplog.text
    assert "pw9" not in text and "k7" not in text and text.count("sk-live-1") == 1
    assert "http://u:***@h/v1?api_key=***" in text and "ValueError: bad key *** for http://u:***@h" in text
    assert "Traceback" in text
