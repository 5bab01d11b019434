"""The backend under vLLM's ngram speculator: drafted tokens go through validate_tokens and rollback."""

from __future__ import annotations

import json
import re
import urllib.request

import jsonschema
import openai
import pytest

from .conftest import start_server

MODEL = "smollm2"
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def spec_server(pytestconfig, vllm_env):
    server = start_server(pytestconfig, vllm_env, extra=["--speculative-config", json.dumps(SPEC)])
    yield server
    server.__exit__()


def _counter(url: str, name: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_drafted_tokens_are_validated_and_rolled_back(spec_server):
    client = openai.OpenAI(base_url=spec_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    schema = {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"enum": ["alpha", "beta", "gamma"]}, "maxItems": 8}
        },
        "required": ["items"],
        "additionalProperties": False,
    }
    # Prompts that repeat themselves, so the ngram speculator drafts, and drafts the grammar sometimes refuses.
    prompts = [
        'Copy: {"items": ["alpha", "beta", "alpha", "beta", "alpha", "beta"]}\nCopy: ',
        'Copy: {"items": ["gamma", "delta", "gamma", "delta"]}\nCopy: ',
        'List: {"things": ["alpha", "beta"], "items": ["beta", "beta"]}\nList: ',
    ]
    drafted0 = _counter(spec_server.url, "vllm:spec_decode_num_draft_tokens_total")
    for i, prompt in enumerate(prompts * 2):
        r = client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=80,
            temperature=0 if i < 3 else 0.8,
            seed=i,
            extra_body={"structured_outputs": {"json": schema}},
        )
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].text), schema)
        r = client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=40,
            temperature=0.8,
            seed=i,
            extra_body={
                "structured_outputs": {"regex": r'\{"items": \["(alpha|beta)"(, "(alpha|beta)"){0,5}\]\}'}
            },
        )
        assert re.fullmatch(r'\{"items": \["(alpha|beta)"(, "(alpha|beta)"){0,5}\]\}', r.choices[0].text)
    drafted = _counter(spec_server.url, "vllm:spec_decode_num_draft_tokens_total") - drafted0
    assert drafted > 0, "the speculator drafted nothing: the test did not exercise validate/rollback"


def test_healing_without_the_processor_is_refused_and_with_a_grammar_served(spec_server, vllm_env):
    """This server runs no logits processor (speculative decoding): healing alone is a 400, never ignored;
    healing in front of a grammar is done by the backend, so it works here too."""
    from tokenseam.vllm.client import Healer

    client = openai.OpenAI(base_url=spec_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    healer = Healer.for_server(spec_server.url, MODEL, vllm_env / "models" / MODEL / "tokenizer.json")
    hp = healer.heal("Visit http:")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(
            model=MODEL, prompt=hp.prompt_token_ids, max_tokens=5, extra_body=hp.extra_body()
        )
    assert "healing logits processor" in str(e.value)
    r = client.completions.create(
        model=MODEL,
        prompt=hp.prompt_token_ids,
        max_tokens=30,
        temperature=0.8,
        seed=1,
        extra_body=hp.extra_body(structured_outputs={"regex": r"//[a-z]{2,10}\.com"}),
    )
    assert re.fullmatch(r"//[a-z]{2,10}\.com", hp.completion(r.choices[0].text))
