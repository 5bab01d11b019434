"""Shared fixtures: the two bundled models, their vocabularies and tokenizers (loaded once per session)."""

from __future__ import annotations

import pytest

from tokenseam.models import gemma3_path, smollm2_path
from tokenseam.vocab import Tokenizer, Vocabulary

MODELS = {"smollm2": smollm2_path, "gemma3": gemma3_path}


@pytest.fixture(scope="session")
def model_paths():
    return {name: fn() for name, fn in MODELS.items()}


@pytest.fixture(scope="session")
def smollm2_vocab(model_paths):
    return Vocabulary.from_gguf(model_paths["smollm2"])


@pytest.fixture(scope="session")
def gemma3_vocab(model_paths):
    return Vocabulary.from_gguf(model_paths["gemma3"])


@pytest.fixture(scope="session")
def vocabs(smollm2_vocab, gemma3_vocab):
    return {"smollm2": smollm2_vocab, "gemma3": gemma3_vocab}


@pytest.fixture(scope="session")
def tokenizers(model_paths):
    return {name: Tokenizer.from_gguf(p) for name, p in model_paths.items()}
