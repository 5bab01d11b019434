"""httpkit is shared by the server and the gateway: it must load nothing of tokenseam beyond itself and the
wire contract (which imports nothing)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_httpkit_imports_only_itself_the_wire_contract_starlette_and_the_standard_library():
    code = "import json, sys; import tokenseam.httpkit; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    ours = {m for m in loaded if m.split(".")[0] == "tokenseam"}
    assert ours and all(
        m in ("tokenseam", "tokenseam.wire") or m.startswith("tokenseam.httpkit") for m in ours
    ), ours
    # starlette's own dependencies (anyio, sniffio, typing_extensions) are fine; the heavy or app-level ones not
    assert not loaded & {
        "llama_cpp",
        "fastapi",
        "httpx",
        "numpy",
        "numba",
        "prometheus_client",
        "redis",
        "uvicorn",
    }


def test_the_wire_contract_imports_nothing_of_tokenseam():
    code = "import json, sys; import tokenseam.wire; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    ours = {m for m in json.loads(out) if m.split(".")[0] == "tokenseam"}
    assert ours == {"tokenseam", "tokenseam.wire"}, ours
