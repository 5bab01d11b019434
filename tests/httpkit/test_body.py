"""`read_json_body` against hostile bodies: every one is a 4xx with an OpenAI error object, never a 500."""

from __future__ import annotations

import json
import random

import pytest

from tokenseam.httpkit import DEFAULT_MAX_DEPTH, HTTPError, json_depth, parse_json_object

JSON = {"content-type": "application/json"}


def post(client, raw: bytes, headers=JSON):
    return client.post("/echo", content=raw, headers=headers)


def error_of(r, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def test_a_valid_object_is_returned_and_duplicate_keys_keep_the_last(client):
    raw = '{"a": 1, "a": 2, "text": "ü 日本 \\ud83d\\ude00", "n": [1.5, -0, 1e300]}'.encode()
    r = post(client, raw, {"content-type": "application/json; charset=UTF-8"})
    assert r.status_code == 200
    assert r.json()["body"] == {"a": 2, "text": "ü 日本 😀", "n": [1.5, 0, 1e300]}


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "",
        "text/plain",
        "text/plain; charset=utf-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json-patch+json",
        "application/json-patch",
        "application/jsonx",
        "application/json; charset=latin-1",
        "application/json; charset=utf-16",
    ],
)
def test_content_types_other_than_json_are_415(client, content_type):
    headers = {} if content_type is None else {"content-type": content_type}
    r = client.post("/echo", content=b'{"a": 1}', headers=headers)
    err = error_of(r, 415)
    assert err["code"] == "unsupported_media_type"
    assert "application/json" in err["message"] or "must be UTF-8" in err["message"]


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "APPLICATION/JSON",
        " application/json ",
        'application/json; charset="utf-8"',
        "application/json;charset=UTF8",
    ],
)
def test_json_content_types_are_accepted(client, content_type):
    assert post(client, b'{"a": 1}', {"content-type": content_type}).json() == {"body": {"a": 1}}


@pytest.mark.parametrize("n", [10_000, 100_000])
@pytest.mark.parametrize("opening,closing", [("[", "]"), ('{"a":', "}"), ('[{"k":', "}]")])
def test_deep_nesting_is_a_400_without_recursion(make_client, n, opening, closing):
    raw = (opening * n + "1" + closing * n).encode()
    err = error_of(post(make_client(max_bytes=len(raw)), raw), 400)
    assert err["code"] == "invalid_json" and f"more than {DEFAULT_MAX_DEPTH}" in err["message"]


def test_the_depth_limit_is_exact_and_brackets_in_strings_do_not_count():
    ok = "[" * DEFAULT_MAX_DEPTH + "]" * DEFAULT_MAX_DEPTH
    assert parse_json_object(f'{{"a": {ok[2:-2]}}}'.encode()) == {"a": json.loads(ok[2:-2])}
    assert parse_json_object(('{"a": ' + "[" * 127 + "]" * 127 + "}").encode())
    with pytest.raises(HTTPError) as ei:
        parse_json_object(('{"a": ' + "[" * 128 + "]" * 128 + "}").encode())
    assert ei.value.status == 400
    in_string = '{"s": "' + "[{" * 10_000 + '\\"[[[", "t": "\\\\"}'
    assert parse_json_object(in_string.encode())["t"] == "\\"


def _random_json(rng: random.Random, depth: int):
    if depth == 0 or rng.random() < 0.3:
        return rng.choice(['a"[b', "]}\\", '{[\\"', 1, -2.5, None, True, "plain"])
    if rng.random() < 0.5:
        return [_random_json(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    return {f'k{i}]"{{': _random_json(rng, depth - 1) for i in range(rng.randint(0, 3))}


def _depth(v) -> int:
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    return 0


def test_json_depth_matches_a_recursive_walk_on_random_documents():
    rng = random.Random(7)
    for _ in range(500):
        doc = _random_json(rng, rng.randint(0, 12))
        assert json_depth(json.dumps(doc)) == _depth(doc), doc


@pytest.mark.parametrize(
    "raw,param",
    [
        (b'{"content": "\\ud800"}', "content"),
        (b'{"content": "\\udfff"}', "content"),
        (b'{"content": "x\\uDC00y"}', "content"),
        (b'{"content": "\\ude00\\ud83d"}', "content"),  # a pair in the wrong order is two lone halves
        (
            b'{"messages": [{"content": "ok"}, {"role": "user", "content": "a\\ud800"}]}',
            "messages[1].content",
        ),
        (b'{"stop": ["fine", "\\udbff"]}', "stop[1]"),
        (b'{"\\ud800": 1}', None),
        (b'{"tools": [{"\\udfffname": 1}]}', "tools[0]"),
    ],
)
def test_lone_surrogates_are_rejected_naming_where(client, raw, param):
    err = error_of(post(client, raw), 400)
    assert err["code"] == "invalid_json" and "surrogate" in err["message"]
    assert err["param"] == param
    if param:
        assert param in err["message"]


def test_an_escaped_backslash_before_u_is_not_a_surrogate(client):
    assert post(client, b'{"path": "C:\\\\ud800"}').json() == {"body": {"path": "C:\\ud800"}}


@pytest.mark.parametrize(
    "raw",
    [b'{"a": "\xff"}', b'{"a": "\xc0\xaf"}', b'{"a": "\xed\xa0\x80"}', b'{"a": "\xe6\x97"}', b"\xfe\xff{}"],
)
def test_invalid_utf8_is_a_400(client, raw):
    err = error_of(post(client, raw), 400)
    assert err["code"] == "invalid_json" and "UTF-8" in err["message"]


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e400"])
def test_non_finite_numbers_are_rejected(client, literal):
    err = error_of(post(client, b'{"temperature": ' + literal + b"}"), 400)
    assert err["code"] == "invalid_json"


@pytest.mark.parametrize(
    "raw,kind",
    [
        (b"[1, 2]", "an array"),
        (b'"text"', "a string"),
        (b"3", "a number"),
        (b"null", "null"),
        (b"true", "a boolean"),
    ],
)
def test_the_top_level_must_be_an_object(client, raw, kind):
    err = error_of(post(client, raw), 400)
    assert err["code"] == "invalid_request" and err["message"].endswith(kind)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"  \n\t",
        b"{not json",
        b'{"a": 1} trailing',
        b'{"a": 1,}',
        b"\xef\xbb\xbf{}",
        b'{"n": ' + b"7" * 4400 + b"}",
    ],
)  # beyond int()'s 4300-digit limit
def test_empty_and_malformed_bodies_are_400(make_client, raw):
    assert error_of(post(make_client(max_bytes=8192), raw), 400)["code"] == "invalid_json"


def test_oversized_bodies_are_413_declared_or_streamed(client):
    from .conftest import MAX_BYTES

    big = b'{"a": "' + b"x" * MAX_BYTES + b'"}'
    assert error_of(post(client, big), 413)["code"] == "request_too_large"

    def chunks():  # no Content-Length: the limit must hold while streaming
        yield b'{"a": "'
        for _ in range(10):
            yield b"x" * 1024
        yield b'"}'

    r = client.post("/echo", content=chunks(), headers=JSON)
    assert "content-length" not in r.request.headers
    assert error_of(r, 413)["code"] == "request_too_large"


def test_curl_default_form_type_gets_a_hint():
    from tokenseam.httpkit import HTTPError, check_content_type

    with pytest.raises(HTTPError) as ei:
        check_content_type("application/x-www-form-urlencoded")
    assert ei.value.status == 415 and "-H 'Content-Type: application/json'" in ei.value.message
