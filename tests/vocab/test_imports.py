"""The pure-Python library (vocabulary, grammar, healing) must work where llama-cpp-python is not installed:
a vLLM environment imports it to serve tokenseam's grammar engine and healing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# The library's own dependencies are numpy, numba and jsonschema: the engine and the HTTP stack are extras.
BLOCK = """
import importlib.abc, json, sys
EXTRAS = {"llama_cpp", "starlette", "uvicorn", "httpx", "prometheus_client", "redis", "jinja2", "rich", "fastapi"}
class NoExtras(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in EXTRAS:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
sys.meta_path.insert(0, NoExtras())
"""


def _run(body: str) -> dict:
    out = subprocess.run([sys.executable, "-c", BLOCK + body], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_vocab_grammar_healing_and_cache_keys_work_without_the_extras(model_paths):
    res = _run(f"""
import numpy as np
from tokenseam.vocab import Vocabulary
from tokenseam.grammar import GrammarCompiler, GrammarMatcher
from tokenseam.healing import HealingConstraint, heal_prompt
from tokenseam.respcache import fingerprint_request
fp = fingerprint_request("/v1/chat/completions", {{"model": "m", "messages": [{{"role": "user", "content": "hi"}}]}})
vocab = Vocabulary.from_gguf({str(model_paths["smollm2"])!r})
m = GrammarMatcher(GrammarCompiler(vocab).compile_json_schema({{"type": "boolean"}}))
mask = np.zeros(vocab.mask_words, dtype=np.int32)
m.fill_next_token_bitmask(mask)
allowed = [i for i in range(vocab.size) if mask[i >> 5] >> (i & 31) & 1]
print(json.dumps({{"allowed": len(allowed), "llama": "llama_cpp" in sys.modules,
                  "t_first": all(vocab.token_bytes[i][:1] in b"tf" for i in allowed)}}))
""")
    assert res == {"allowed": res["allowed"], "llama": False, "t_first": True} and res["allowed"] > 0


def test_tokenizer_is_loaded_on_first_use_and_says_what_is_missing():
    res = _run("""
import tokenseam.vocab as v
try:
    v.Tokenizer
    err = None
except ImportError as exc:
    err = str(exc)
print(json.dumps({"err": err}))
""")
    assert res["err"] and "llama_cpp" in res["err"]


def test_unknown_attribute_is_still_an_attribute_error():
    import tokenseam.vocab as v

    with pytest.raises(AttributeError):
        v.NoSuchThing  # noqa: B018


def test_the_gateway_needs_the_http_stack_but_not_llama_cpp():
    # `pip install tokenseam[gateway]` is the gateway's install: no engine.
    body = BLOCK.replace(
        '"llama_cpp", "starlette", "uvicorn", "httpx", "prometheus_client", ', '"llama_cpp", '
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            body
            + """
from tokenseam.gateway import create_gateway_app
from tokenseam.gateway import cli_gateway, healing, relay, dialects, routing, pool, http1
print(json.dumps({"llama": "llama_cpp" in sys.modules}))
""",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"llama": False}
