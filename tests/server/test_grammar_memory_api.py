"""The grammar memory budget on a real server (`--grammar-cache-mb`): a stream of distinct schemas stays
within it, every output still validates, and /metrics exports what grammars hold."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

from .conftest import RunningServer

pytestmark = [pytest.mark.model, pytest.mark.server]

BUDGET_MB = 1


@pytest.fixture(scope="module")
def small_budget_server():
    s = RunningServer("smollm2", n_ctx=512, parallel=2, grammar_cache_mb=BUDGET_MB)
    yield s
    s.stop()


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def test_distinct_schemas_stay_within_the_budget_and_metrics_show_it(small_budget_server):
    url = small_budget_server.url
    before = httpx.get(url + "/metrics").text
    assert _metric(before, "tokenseam_grammar_cache_budget_bytes") == BUDGET_MB << 20
    for k in range(10):
        schema = {
            "type": "object",
            "properties": {f"key{k}": {"type": "integer"}, f"word{k}": {"enum": ["yes", "no", f"maybe{k}"]}},
            "required": [f"key{k}", f"word{k}"],
            "additionalProperties": False,
        }
        r = httpx.post(
            url + "/v1/chat/completions",
            json={
                "model": "smollm2",
                "messages": [{"role": "user", "content": "A JSON object, please."}],
                "max_tokens": 40,
                "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            },
            timeout=120,
        )
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        text = httpx.get(url + "/metrics").text
        assert 0 < _metric(text, "tokenseam_grammar_cache_bytes") <= BUDGET_MB << 20
    assert _metric(text, "tokenseam_grammar_cache_evictions_total") > _metric(
        before, "tokenseam_grammar_cache_evictions_total"
    )
    assert 1 <= _metric(text, "tokenseam_grammar_cache_grammars") < 10
    assert _metric(text, "tokenseam_grammar_live_grammars") >= _metric(
        text, "tokenseam_grammar_cache_grammars"
    )
    for name in ("tokenseam_grammar_renewals_total", "tokenseam_grammar_unmemoised_masks_total"):
        assert _metric(text, name) >= 0


def test_the_default_server_exports_the_default_budget(smollm2_server):
    from tokenseam.grammar.memory import DEFAULT_BUDGET_MB

    text = httpx.get(smollm2_server.url + "/metrics").text
    assert _metric(text, "tokenseam_grammar_cache_budget_bytes") == DEFAULT_BUDGET_MB << 20
    assert _metric(text, "tokenseam_grammar_cache_bytes") > 0  # the warm-up grammar, at least


def test_a_grammar_too_ambiguous_for_the_automaton_still_completes(smollm2_server):
    """24 forced "a"s, each of which may or may not be matched by a "b" later: 2^24 parses, more than the
    automaton keeps. The request moves to the GSS parser and ends with a valid output."""
    url = smollm2_server.url
    n = 24
    rules = (
        ["root ::= l0"] + [f'l{i} ::= "a" l{i + 1} | "a" l{i + 1} "b"' for i in range(n)] + [f'l{n} ::= ""']
    )
    before = _metric(httpx.get(url + "/metrics").text, "tokenseam_grammar_gss_fallbacks_total")
    r = httpx.post(
        url + "/v1/completions",
        json={"model": "smollm2", "prompt": "Letters:", "max_tokens": 60, "guided_grammar": "\n".join(rules)},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    text = choice["text"]
    assert text.startswith("a" * n) and set(text[n:]) <= {"b"} and len(text) - n <= n, text
    assert choice["finish_reason"] in ("stop", "length")
    after = _metric(httpx.get(url + "/metrics").text, "tokenseam_grammar_gss_fallbacks_total")
    assert after == before + 1
