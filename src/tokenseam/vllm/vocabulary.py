"""tokenseam's byte vocabulary of a vLLM model's tokenizer (no vLLM and no numba needed)."""

from __future__ import annotations

import json
from typing import Any

from ..vocab import Vocabulary


def vocabulary_of(tokenizer: Any, vocab_size: int | None = None) -> Vocabulary:
    """The vocabulary of a Hugging Face fast tokenizer (what vLLM loads), padded to the model's vocabulary
    size `vocab_size` (the embedding may have more rows than the tokenizer has tokens). Its end tokens are
    the tokenizer's EOS; vLLM's per-request stop token ids override them where they differ."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        raise ValueError(
            "tokenseam needs a Hugging Face fast tokenizer (tokenizer.json); this model's tokenizer is "
            f"{type(tokenizer).__name__}"
        )
    eos = getattr(tokenizer, "eos_token_id", None)
    return Vocabulary.from_hf_tokenizer_data(
        json.loads(backend.to_str()),
        source=f"tokenizer of {getattr(tokenizer, 'name_or_path', '') or 'the model'}",
        size=vocab_size,
        eos_token_ids=None if eos is None else {int(eos)},
    )
