"""Vocabulary layer: token id -> raw bytes, special-token flags, a byte trie, and llama.cpp tokenization.

Depends on nothing else in tokenseam; every other part builds on it.
"""

from .errors import VocabularyError
from .tokenizer import Tokenizer
from .trie import ByteTrie
from .vocabulary import Vocabulary

__all__ = ["ByteTrie", "Tokenizer", "Vocabulary", "VocabularyError", "load_vocabulary"]


def load_vocabulary(model: str | None = None) -> Vocabulary:
    """Vocabulary of a bundled model alias (`smollm2`, `gemma3`) or a GGUF path."""
    from ..models import resolve_model

    return Vocabulary.from_gguf(resolve_model(model))
