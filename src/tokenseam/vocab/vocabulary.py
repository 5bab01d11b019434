"""Token id -> raw bytes for GGUF (gpt2 byte-level BPE, llama SentencePiece) and HF tokenizer.json vocabularies.

Display strings lie (GPT-2's `Ġ`, SentencePiece's `▁`, `<0xE2>`); every other part of tokenseam sees raw bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TypeVar

import numpy as np

from .errors import VocabularyError
from .gguf import read_gguf_metadata
from .trie import ByteTrie

# GGUF token types (llama.cpp's llama_token_type).
TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = 1, 2, 3, 4, 5, 6

# Texts that end a turn in common chat templates; llama.cpp treats them as end-of-generation too.
_EOG_TEXTS = frozenset(
    {
        "<|endoftext|>",
        "<|im_end|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<end_of_turn>",
        "<|end|>",
        "<EOT>",
        "<|end_of_text|>",
        "<｜end▁of▁sentence｜>",
        "</s>",
        "<eos>",
    }
)
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_T = TypeVar("_T")


def gpt2_unicode_to_byte() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode table: printable stand-in character -> byte value."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_U2B = gpt2_unicode_to_byte()


def _gpt2_bytes(text: str) -> bytes | None:
    try:
        return bytes(_U2B[ch] for ch in text)
    except KeyError:
        return None


def _spm_bytes(text: str) -> bytes:
    m = _BYTE_TOKEN.fullmatch(text)
    if m:
        return bytes([int(m.group(1), 16)])
    return text.replace("\u2581", " ").encode("utf-8", errors="surrogateescape")


@dataclass(eq=False)
class Vocabulary:
    """A model's vocabulary as raw bytes.

    `token_bytes[i]` is what token i contributes to the output byte stream. Special (control) tokens keep
    their text in `token_bytes` for display, but `is_special[i]` is set and they never match text.
    """

    token_bytes: list[bytes]
    is_special: np.ndarray  # bool, shape (V,)
    kind: str  # "gpt2", "llama" or "hf-bytelevel" / "hf-sentencepiece"
    bos_token_id: int | None = None
    eos_token_ids: frozenset[int] = frozenset()
    token_text: list[str] = field(default_factory=list, repr=False)  # display strings, as stored
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.token_bytes) != len(self.is_special):
            raise VocabularyError("token_bytes and is_special differ in length")
        if len(self.token_bytes) == 0:
            raise VocabularyError(f"{self.source or 'vocabulary'} has no tokens")
        self._derived: dict[str, object] = {}
        self._derived_lock = threading.Lock()

    def derived(self, name: str, build: Callable[[], _T]) -> _T:
        """The table `name` computed from this vocabulary, built once by `build()` (thread-safe) and kept as
        long as the vocabulary lives. The one per-vocabulary cache every layer uses, so tables die with their
        vocabulary; name tables by their module (`grammar.token_table`)."""
        with self._derived_lock:
            if name not in self._derived:
                self._derived[name] = build()
            return self._derived[name]  # type: ignore[return-value]

    @property
    def size(self) -> int:
        return len(self.token_bytes)

    def __len__(self) -> int:
        return len(self.token_bytes)

    @property
    def mask_words(self) -> int:
        """Length of the packed int32 allowed-token bitmask: ceil(V / 32)."""
        return (self.size + 31) // 32

    @cached_property
    def max_token_bytes(self) -> int:
        return max(len(b) for b, s in zip(self.token_bytes, self.is_special, strict=True) if not s)

    @cached_property
    def trie(self) -> ByteTrie:
        return ByteTrie(self.token_bytes, self.is_special)

    @cached_property
    def fingerprint(self) -> str:
        """A stable hash of the byte table and special flags, for keying compiled grammars."""
        h = hashlib.sha256()
        for b in self.token_bytes:
            h.update(len(b).to_bytes(4, "little"))
            h.update(b)
        h.update(np.packbits(self.is_special.astype(np.uint8)).tobytes())
        return h.hexdigest()[:32]

    def decode_bytes(self, ids: list[int] | np.ndarray, skip_special: bool = True) -> bytes:
        """Concatenate the raw bytes of `ids` (special tokens dropped unless skip_special is False)."""
        tb, sp = self.token_bytes, self.is_special
        return b"".join(tb[i] for i in ids if not (skip_special and sp[i]))

    # ------------------------------------------------------------------ loaders
    @classmethod
    def from_gguf(cls, path: str | Path) -> Vocabulary:
        meta = read_gguf_metadata(path, skip=frozenset({"tokenizer.ggml.merges", "tokenizer.ggml.scores"}))
        model = meta.get("tokenizer.ggml.model")
        tokens = meta.get("tokenizer.ggml.tokens")
        if model is None or tokens is None:
            raise VocabularyError(f"{path}: GGUF file has no tokenizer.ggml.model / tokens")
        types = meta.get("tokenizer.ggml.token_type")
        if types is None:
            types = np.full(len(tokens), TYPE_NORMAL, dtype=np.int32)
        types = np.asarray(types, dtype=np.int32)
        if len(types) != len(tokens):
            raise VocabularyError(f"{path}: {len(tokens)} tokens but {len(types)} token types")
        out: list[bytes] = []
        if model == "gpt2":
            for text, t in zip(tokens, types, strict=True):
                if t in (TYPE_NORMAL, TYPE_BYTE):
                    b = _gpt2_bytes(text)
                    out.append(b if b is not None else text.encode("utf-8", "surrogateescape"))
                else:
                    out.append(text.encode("utf-8", "surrogateescape"))
        elif model == "llama":
            for text, t in zip(tokens, types, strict=True):
                if t in (TYPE_NORMAL, TYPE_BYTE, TYPE_UNKNOWN):
                    out.append(_spm_bytes(text))
                else:  # user-defined and control tokens are stored verbatim
                    out.append(text.encode("utf-8", "surrogateescape"))
        else:
            raise VocabularyError(
                f"{path}: tokenizer model {model!r} is not supported (supported: 'gpt2', 'llama')"
            )
        special = np.isin(types, (TYPE_CONTROL, TYPE_UNKNOWN, TYPE_UNUSED))
        # llama.cpp also treats user-defined end-of-turn texts (Gemma's `</s>`) as control tokens.
        for i in np.flatnonzero(types == TYPE_USER_DEFINED):
            if tokens[i] in _EOG_TEXTS:
                special[i] = True
        eos = set()
        for key in (
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ):
            if key in meta and 0 <= int(meta[key]) < len(tokens):
                eos.add(int(meta[key]))
        for i in np.flatnonzero(special):
            if tokens[i] in _EOG_TEXTS:
                eos.add(int(i))
        bos = meta.get("tokenizer.ggml.bos_token_id")
        return cls(
            out,
            special,
            kind=model,
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=frozenset(eos),
            token_text=list(tokens),
            source=str(path),
        )

    @classmethod
    def from_hf_tokenizer_json(cls, path: str | Path) -> Vocabulary:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise VocabularyError(f"cannot read tokenizer.json {path}: {e}") from e
        return cls.from_hf_tokenizer_data(data, source=str(path))

    @classmethod
    def from_hf_tokenizer_data(
        cls,
        data: dict,
        source: str = "tokenizer.json",
        size: int | None = None,
        eos_token_ids: set[int] | frozenset[int] | None = None,
    ) -> Vocabulary:
        """The vocabulary of a parsed Hugging Face tokenizer.json (what `tokenizers.Tokenizer.to_str()` gives).

        `size`: the model's vocabulary size when its embedding has more rows than the tokenizer has tokens
        (the extra ids are special and empty: never allowed as text). `eos_token_ids`: the model's end tokens
        (default: the special tokens whose text ends a turn in common chat templates)."""
        if not isinstance(data, dict):
            raise VocabularyError(f"{source}: a tokenizer.json document is a JSON object")
        model = data.get("model") or {}
        vocab = model.get("vocab")
        if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
            pieces = {p[0]: i for i, p in enumerate(vocab)}
        elif isinstance(vocab, dict):
            pieces = dict(vocab)
        else:
            raise VocabularyError(f"{source}: model.vocab is missing or not a dict/list")
        added = data.get("added_tokens") or []
        for a in added:
            pieces[a["content"]] = int(a["id"])
        n = max(pieces.values()) + 1
        if size is None:
            size = n
        elif size < n:
            raise VocabularyError(f"{source}: the tokenizer has {n} tokens, more than the model's {size}")
        text = [""] * size
        for piece, i in pieces.items():
            text[i] = piece
        byte_level = "ByteLevel" in json.dumps(data.get("decoder") or {}) or "ByteLevel" in json.dumps(
            data.get("pre_tokenizer") or {}
        )
        added_ids = {int(a["id"]): bool(a.get("special")) for a in added}
        out: list[bytes] = []
        special = np.zeros(size, dtype=bool)
        for i, t in enumerate(text):
            if i in added_ids:
                special[i] = added_ids[i]
                out.append(t.encode("utf-8"))
            elif i >= n:  # a padding row of the model's embedding: no text, never generated as text
                special[i] = True
                out.append(b"")
            elif byte_level:
                b = _gpt2_bytes(t)
                out.append(b if b is not None else t.encode("utf-8"))
            else:
                out.append(_spm_bytes(t))
        if eos_token_ids is None:
            eos = {i for i in np.flatnonzero(special) if text[i] in _EOG_TEXTS}
        else:
            eos = set(eos_token_ids)
            bad = sorted(i for i in eos if not 0 <= i < size)
            if bad:
                raise VocabularyError(
                    f"{source}: end token ids {bad} are outside the vocabulary (size {size})"
                )
        return cls(
            out,
            special,
            kind="hf-bytelevel" if byte_level else "hf-sentencepiece",
            eos_token_ids=frozenset(int(i) for i in eos),
            token_text=text,
            source=source,
        )
