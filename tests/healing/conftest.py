"""Fixtures for the healing tests: a small fake grammar matcher and the 50 RAG-style appended chunks."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tokenseam.constraint import bitmask_from_ids
from tokenseam.healing.cases import RAG_CHUNKS
from tokenseam.vocab import Vocabulary


class FakeMatcher:
    """A byte-level matcher for the language `pattern` (a regex whose prefixes are checked by `viable`).

    Stands in for `tokenseam.grammar.GrammarMatcher` (same four methods); its mask scans the vocabulary,
    which is fine for a test and exactly what the real matcher avoids.
    """

    def __init__(self, vocab: Vocabulary, viable: str) -> None:
        self.vocab = vocab
        self.viable = re.compile(viable.encode())
        self.consumed = b""
        self.mask_calls = 0
        self.accepted: list[bytes] = []

    def _ok(self, data: bytes) -> bool:
        return self.viable.fullmatch(self.consumed + data) is not None

    def accept_bytes(self, data: bytes) -> bool:
        if not self._ok(data):
            return False
        self.consumed += data
        self.accepted.append(data)
        return True

    def accept_token(self, token_id: int) -> bool:
        if self.vocab.is_special[token_id]:
            return False
        return self.accept_bytes(self.vocab.token_bytes[token_id])

    def allowed_ids(self) -> list[int]:
        tb, sp = self.vocab.token_bytes, self.vocab.is_special
        return [i for i in range(self.vocab.size) if tb[i] and not sp[i] and self._ok(tb[i])]

    def fill_next_token_bitmask(self, out: np.ndarray) -> None:
        self.mask_calls += 1
        bitmask_from_ids(self.allowed_ids(), self.vocab.size, out)

    def is_terminated(self) -> bool:
        return False


@pytest.fixture
def fake_matcher():
    return FakeMatcher


@pytest.fixture
def chunks():
    return list(RAG_CHUNKS)
