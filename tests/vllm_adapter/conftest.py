"""Fixtures for the tests against a real vLLM: the environment `tokenseam vllm setup` builds, and servers.

The environment lives in $TOKENSEAM_VLLM_VENV (default ~/.cache/tokenseam/vllm-venv) and is reused; setup
repairs or completes it (first build: about 5 minutes of pip, 40 s of model conversion, a minute or two of
numba). Where vLLM cannot be installed at all (no CPU torch wheel), these tests skip and say why; any other
setup failure fails them. TOKENSEAM_VLLM=0 skips them on purpose.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tokenseam.vllm.setup import VenvUnavailable, setup

MODEL = "smollm2"


def venv_dir() -> Path:
    return Path(os.environ.get("TOKENSEAM_VLLM_VENV") or Path.home() / ".cache" / "tokenseam" / "vllm-venv")


def _visible(config):
    """A context manager that lets output through pytest's capture (progress of the long setup)."""
    return config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled()


@pytest.fixture(scope="session")
def vllm_env(pytestconfig):
    if os.environ.get("TOKENSEAM_VLLM") == "0":
        pytest.skip("TOKENSEAM_VLLM=0: the vLLM tests are turned off")
    venv = venv_dir()
    with _visible(pytestconfig):
        t0 = time.monotonic()
        try:
            setup(venv, ["smollm2"])
        except VenvUnavailable as e:
            pytest.skip(f"no vLLM environment on this machine: {e}")
        print(f"[vllm tests] environment ready in {time.monotonic() - t0:.0f} s: {venv}", flush=True)
    return venv


def start_server(config, venv: Path, **kw):
    from tokenseam.bench.vllm import VLLMServer

    with _visible(config):
        t0 = time.monotonic()
        print("[vllm tests] starting vLLM ...", flush=True)
        server = VLLMServer(venv, **kw)
        server.__enter__()
        print(f"[vllm tests] vLLM up in {time.monotonic() - t0:.0f} s at {server.url}", flush=True)
    return server


@pytest.fixture(scope="session")
def vllm_server(pytestconfig, vllm_env):
    """vLLM with the tokenseam backend and the healing processor (what `tokenseam vllm serve` starts), shared
    by the adapter's and the gateway's tests."""
    server = start_server(pytestconfig, vllm_env, extra=["--max-num-seqs", "8"])
    yield server
    server.__exit__()


@pytest.fixture(scope="session")
def client(vllm_server):
    import openai

    return openai.OpenAI(base_url=vllm_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def hf_vocab(vllm_env):
    from tokenseam.vocab import Vocabulary

    return Vocabulary.from_hf_tokenizer_json(vllm_env / "models" / MODEL / "tokenizer.json")
