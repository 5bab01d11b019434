"""Vocabulary layer: token id -> raw bytes, special-token flags, a byte trie, and llama.cpp tokenization.

Depends on nothing else in tokenseam; every other part builds on it. `Vocabulary` and `ByteTrie` are pure
Python + numpy (a GGUF or tokenizer.json file is read directly); only `Tokenizer` needs llama-cpp-python, and it
is imported on first use, so `import tokenseam.vocab` works where llama.cpp is not installed (a vLLM venv).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import VocabularyError
from .trie import ByteTrie
from .vocabulary import Vocabulary

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

__all__ = ["ByteTrie", "Tokenizer", "Vocabulary", "VocabularyError", "load_vocabulary"]


def __getattr__(name: str) -> type:
    if name == "Tokenizer":
        from .tokenizer import Tokenizer

        return Tokenizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_vocabulary(model: str | None = None) -> Vocabulary:
    """Vocabulary of a bundled model alias (`smollm2`, `gemma3`) or a GGUF path."""
    from ..models import resolve_model

    return Vocabulary.from_gguf(resolve_model(model))
