"""Text <-> token ids through llama.cpp's own tokenizer, so tokenseam tokenizes exactly as the model was trained.

A `Tokenizer` either owns a vocab-only model (cheap: no weights) or borrows the vocab of a loaded model.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from pathlib import Path

import llama_cpp

from .errors import VocabularyError
from .prefix_memo import DEFAULT_BYTES as DEFAULT_MEMO_BYTES
from .prefix_memo import SAMPLE, PrefixMemo

_backend_lock = threading.Lock()
_backend_ready = False


def ensure_llama_backend(quiet: bool = True) -> None:
    """Initialise llama.cpp once per process and silence its logging unless asked."""
    global _backend_ready
    with _backend_lock:
        if _backend_ready:
            return
        if quiet:
            llama_cpp.llama_log_set(_silent_log, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_ready = True


@llama_cpp.llama_log_callback
def _silent_log(level, text, user_data):  # noqa: ARG001 - ctypes callback signature
    return None


class Tokenizer:
    """llama.cpp tokenization for one model. Thread-safe for concurrent encode/decode calls."""

    def __init__(self, model_ptr: llama_cpp.llama_model_p, owns_model: bool, path: str = "") -> None:
        self._model = model_ptr
        self._owns = owns_model
        self._vocab = llama_cpp.llama_model_get_vocab(model_ptr)
        self.path = path
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.memo: PrefixMemo | None = None  # use_prefix_memo
        self._lead: list[int] | None = None

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        path = str(path)
        if not Path(path).is_file():
            raise VocabularyError(f"model file not found: {path}")
        ensure_llama_backend()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not model:
            raise VocabularyError(f"llama.cpp could not load the vocabulary of {path}")
        return cls(model, owns_model=True, path=path)

    def detach(self) -> None:
        """The owner of a borrowed model is freeing it: later calls raise instead of touching freed memory."""
        self._vocab = None
        self._model = None

    def _check(self) -> None:
        if self._vocab is None:
            raise VocabularyError("this tokenizer's model has been closed")

    def close(self) -> None:
        if self._owns and self._model:
            llama_cpp.llama_model_free(self._model)
        self._model = None

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:
            pass

    def use_prefix_memo(self, token_bytes: Sequence[bytes], max_bytes: int = DEFAULT_MEMO_BYTES) -> bool:
        """From now on, long texts that begin like a recent one reuse its ids up to a safe cut (vocab.prefix_memo:
        the same ids as tokenizing the whole text). `token_bytes`: the vocabulary's bytes per id. False (and no
        memo) when this tokenizer fails the memo's check or `max_bytes` is 0."""
        memo = PrefixMemo(self._encode, token_bytes, max_bytes)
        self.memo = memo if memo.enabled else None
        if self.memo is not None:
            sample = SAMPLE.encode()
            lead = self._encode(b"", False, True)
            ok = self._encode(sample, False, True) == lead + self._encode(sample, False, False)
            self._lead = lead if ok else None  # what add_special puts before the text, when only that
        return self.memo is not None

    def encode(self, text: str | bytes, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """Token ids for `text`. `add_special` adds BOS if the model wants it; `parse_special` turns
        special-token text such as `<|im_end|>` into its id (only for trusted text such as chat templates)."""
        self._check()
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        memo = self.memo
        if memo is not None:
            if not add_special:
                return memo.encode(data, parse_special)
            if self._lead is not None:
                return self._lead + memo.encode(data, parse_special)
        return self._encode(data, parse_special, add_special)

    def _encode(self, data: bytes, parse_special: bool, add_special: bool = False) -> list[int]:
        """llama.cpp's tokenization of `data`, whole."""
        self._check()
        n_max = len(data) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
            if n < 0:
                raise VocabularyError("llama.cpp tokenization failed")
        return list(buf[:n])

    def decode(self, ids: list[int], render_special: bool = False) -> bytes:
        """Raw bytes of `ids` as llama.cpp detokenizes them (special tokens dropped unless rendered)."""
        if not ids:
            return b""
        self._check()
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        cap = 16 * len(ids) + 64
        out = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(self._vocab, arr, len(ids), out, cap, False, render_special)
        if n < 0:
            cap = -n
            out = ctypes.create_string_buffer(cap)
            n = llama_cpp.llama_detokenize(self._vocab, arr, len(ids), out, cap, False, render_special)
        return out.raw[:n]

    def piece(self, token_id: int, render_special: bool = True) -> bytes:
        self._check()
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, 256, 0, render_special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, -n, 0, render_special)
        return buf.raw[:n]

    def is_eog(self, token_id: int) -> bool:
        self._check()
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token_id))

    @property
    def bos_id(self) -> int:
        return llama_cpp.llama_vocab_bos(self._vocab)
