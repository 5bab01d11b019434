"""Pinned fingerprints and generated-request JSON: a refactor of the request form must not move any cache key."""

from __future__ import annotations

import hashlib
import json

import pytest

from tokenseam.respcache import fingerprint_request, normalize_request

_SCHEMA = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}

# (route, body, tenant, namespace, fingerprint, first 16 hex of SHA-256 over the generated request's sorted JSON)
PINS = [
    (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        "",
        "",
        "6a19038a8bd4b1a682c23589dbfc29cb2bb0372d0281f8b5319c104c0e144461",
        "b19d19b40afea2af",
    ),
    (
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief\r\n"},
                {"role": "user", "content": "caf\u00e9 " * 12},
            ],
            "temperature": 0,
            "top_k": -1,
            "stop": ["b", "a"],
            "logprobs": True,
            "top_logprobs": 2,
            "seed": 7,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": _SCHEMA}},
            "tools": [
                {"type": "function", "function": {"name": "z", "parameters": {"type": "object"}}},
                {"type": "function", "function": {"name": "a"}},
            ],
            "tool_choice": "required",
        },
        "t1",
        "ns",
        "1a1aa85dc99876b000b3206507a1e87917252d9519111e920abdaf1b13b5b0c9",
        "09e8d3da4ed9611a",
    ),
    (
        "/v1/completions",
        {"model": "m", "prompt": "Visit http:", "temperature": 0.0},
        "",
        "",
        "a44a039f65544ff216dc91e23a11d2dafdc3790788b3433636fb67aad52f91dc",
        "b504687b9d2ef7db",
    ),
    (
        "/v1/completions",
        {
            "model": "m",
            "prompt": [1, 2, 3],
            "max_tokens": 5,
            "token_healing": 3,
            "logprobs": 2,
            "logit_bias": {"5": -1.5},
        },
        "tenant",
        "",
        "5f3529212de75ae8c58c9c168a0a3dc66b4345ad6c9ea556036aa543a08fc52d",
        "9769b1853ac5f34d",
    ),
    (
        "/completion",
        {"prompt": "Hello", "n_predict": 8, "seed": -1, "grammar": 'root ::= "a"'},
        "",
        "",
        "3d3a412fa2742af689ccb78b1c26ce16160a26173130818856c479737d669cb6",
        "e29b0efd49f77ea7",
    ),
    (
        "/completion",
        {
            "prompt": "Hello",
            "temperature": 0.8,
            "top_k": 40,
            "logit_bias": [[1, False]],
            "token_healing": False,
        },
        "",
        "ns2",
        "84f862ef7c42dd272822bb113028c46c686d066a089718e50c1a103aff9bd973",
        "36a27206f0c61d22",
    ),
]


@pytest.mark.parametrize("route,body,tenant,namespace,fingerprint,generated", PINS)
def test_pinned(route, body, tenant, namespace, fingerprint, generated):
    assert fingerprint_request(route, body, tenant=tenant, namespace=namespace) == fingerprint
    text = json.dumps(normalize_request(route, body), sort_keys=True)
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == generated


# Prompts of token ids, long enough for the serialisation's shortcut for lists of plain ints (keys pinned
# before it existed).
ID_PINS = [
    (
        {"model": "m", "prompt": [0, 7, 262143, 15, 1, 2, 3, 99999, 42, 5], "temperature": 0},
        "2f1a32dbfedca515d6cef14f639f923a5c9e25d9fd2ed6d0e783312be598f965",
    ),
    (
        {"model": "m", "prompt": [[5, 6, 7, 8, 9, 10, 11, 12, 13], [1, 2]], "max_tokens": 3},
        "6240a136cb252a65c66444c4aac56538ac9623e196fd46e75fcaaa7b4ee66d30",
    ),
]


@pytest.mark.parametrize("body,fingerprint", ID_PINS)
def test_pinned_token_ids(body, fingerprint):
    assert fingerprint_request("/v1/completions", body) == fingerprint


def test_lists_of_ints_serialise_as_the_general_form():
    from tokenseam.respcache.request_form import fingerprint_text

    def general(v) -> str:
        return "[" + ",".join(fingerprint_text(x) for x in v) + "]"

    for v in (
        [-3, 10**20, 0, 1, 2, 3, 4, 5, 6],
        tuple(range(9)),
        list(range(5000)),
        [True, 1, 2, 3, 4, 5, 6, 7, 8],  # a bool among them: written as JSON's true
        [1, 2, 3, 4, 5, 6, 7, 8, 9.0],
        [1, 2, 3, 4, 5, 6, 7, 8, "9"],
        [1, 2, 3],
    ):
        assert fingerprint_text(v) == general(v), v
    assert fingerprint_text([True, *range(8)]).startswith("[true,0,")
    from collections import namedtuple

    nine = namedtuple("Nine", "a b c d e f g h i")(*range(9))  # its own repr: written item by item
    assert fingerprint_text(nine) == general(nine) == "[0,1,2,3,4,5,6,7,8]"
