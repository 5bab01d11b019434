"""The CPU kernels llama.cpp picks: a batched decode must run on every CPU this package is built on, AMX ones too."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tokenseam.engine.backend import amx_in_build, model_params

# A batch of prompt tokens, decoded in a child process: a kernel that dies with SIGILL ends the child, not the
# test session, and the test names the signal.
CHILD = r"""
import sys
from tokenseam.engine import BackendConfig, LlamaCppBackend
be = LlamaCppBackend(sys.argv[1], BackendConfig(n_ctx=256, n_seq=1, n_threads=2, prefix_cache_tokens=0))
ids = be.tokenizer.encode("The three primary colors are red, green and blue. " * 8)
assert len(ids) >= 64, len(ids)
logits = be.decode([(0, ids, 0, True)])
assert len(logits) == 1 and logits[0].shape == (be.n_vocab,), [getattr(x, "shape", x) for x in logits]
print("ok", len(ids))
"""


def test_extra_buffer_types_are_off_exactly_on_a_build_with_amx_kernels():
    assert model_params().use_extra_bufts is (not amx_in_build())
    assert model_params().n_gpu_layers == 0


@pytest.mark.model
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_a_batch_of_prompt_tokens_decodes_on_this_cpu(model_paths, model):
    """On a CPU with AMX, llama.cpp's native build carries AMX kernels that die with SIGILL at their first tile
    instruction when a batch of several tokens is multiplied; the backend keeps weights out of them."""
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(model_paths[model])], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, f"decode died (exit {r.returncode}): {r.stderr[-2000:]}"
    assert r.stdout.startswith("ok ")
