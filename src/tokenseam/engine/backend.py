"""The llama.cpp model backend: tokenize, vocabulary bytes, batched multi-sequence decode, KV sequence ops.

Everything above it (scheduler, sampler, constraints, caches) is backend-independent.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from ..vocab import Tokenizer, Vocabulary
from ..vocab.gguf import read_gguf_metadata
from ..vocab.tokenizer import ensure_llama_backend
from .errors import BackendError


def amx_in_build() -> bool:
    """Whether this llama.cpp build carries its AMX matrix kernels (a native build on a CPU that reports AMX)."""
    return b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()


def model_params():
    """llama.cpp model parameters for the CPU: defaults, no GPU layers, and no extra buffer types on a build with
    AMX kernels. Those kernels die with SIGILL at their first tile instruction (ggml lets the compiler drop the
    tile configuration it loads: llama.cpp issue 28756, pull request 26954), and weights reach them only through
    the CPU backend's extra buffer types; without those the weights stay in plain CPU buffers (no AMX, and no
    weight repacking either, which llama-server's `--no-repack` matches)."""
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    params.use_extra_bufts = not amx_in_build()
    return params


@dataclass(frozen=True)
class BackendConfig:
    n_ctx: int = 4096  # tokens per sequence
    n_seq: int = 8  # sequences decoded together (`--parallel`)
    n_threads: int = 0  # 0 = all cores
    n_batch: int = 512  # max tokens per llama_decode call
    prefix_cache_tokens: int = (
        16384  # tokens of KV the radix prefix cache keeps in host memory (0 = no cache)
    )
    prefix_cache_seqs: int = 256  # cached leaf paths at most
    prefix_block: int = 16  # only whole blocks of this many tokens are cached
    # KV that free slots keep from their last request, for a next prompt that continues it (-1: n_ctx)
    resident_tokens: int = -1
    # llama.cpp's flash attention: "on", "off" or "auto" (see LlamaCppBackend.flash_attention_for)
    flash_attn: str = "auto"


class LlamaCppBackend:
    """One llama.cpp model + context holding `n_seq` sequences (+ a scratch one), each in a KV stream of its own."""

    FLASH_ATTN = ("auto", "on", "off")

    @staticmethod
    def flash_attention_for(setting: str, n_swa: int) -> bool:
        """Whether to use llama.cpp's flash attention. Each sequence has a KV stream of its own, so a decode reads
        only its own cells. Flash attention's CPU kernel skips the cells a token may not see: it wins where most
        cells are masked, in a model's sliding-window layers (Gemma-3, 15 tokens after 8,000 cached: 68 ms with
        it, 89 without). Under full attention (SmolLM2) it depends on the work (`tokenseam bench flash-attn`): a
        step of 8 streams at 300 tokens each takes 46 ms with it against 50 without, but reading a short prompt
        after a long cached prefix is 1.7x slower with it (15 tokens after 1,450 cached: 124 against 78 ms), and
        one stream at 1,000 tokens a little slower. "auto" turns it on for a model with sliding-window layers
        only: a cached prefix's time to first token is what the prefix cache is for."""
        if setting not in LlamaCppBackend.FLASH_ATTN:
            raise BackendError(
                f"flash_attn must be one of {', '.join(LlamaCppBackend.FLASH_ATTN)}, not {setting!r}"
            )
        if setting != "auto":
            return setting == "on"
        return n_swa > 0

    def __init__(self, model_path: str | Path, config: BackendConfig = BackendConfig()) -> None:
        # a bad setting fails before the model loads
        self.flash_attention_for(config.flash_attn, 0)
        ensure_llama_backend()
        self.path = Path(model_path)
        self.config = config
        self.vocab = Vocabulary.from_gguf(self.path)
        meta = read_gguf_metadata(
            self.path,
            skip=frozenset(
                {
                    "tokenizer.ggml.merges",
                    "tokenizer.ggml.scores",
                    "tokenizer.ggml.tokens",
                    "tokenizer.ggml.token_type",
                }
            ),
        )
        self.chat_template: str | None = meta.get("tokenizer.chat_template")
        self.model_name = self.path.stem
        self._model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), model_params())
        if not self._model:
            raise BackendError(f"llama.cpp could not load model {self.path}")
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(self._model)
        self.n_cache_seqs = config.prefix_cache_seqs if config.prefix_cache_tokens > 0 else 0
        # One extra sequence, `scratch_seq`, through which a prefix of a request's KV is saved to host memory.
        self.scratch_seq = config.n_seq
        self.n_seq_total = config.n_seq + 1
        self.kv_bytes_per_token = _kv_bytes_per_token(meta)
        cparams = llama_cpp.llama_context_default_params()
        # Each sequence gets a KV stream of its own, of n_ctx cells: a decode then reads only its own
        # sequence's cells (in one unified stream it visits every held cell, masked, and flash attention is the
        # only way to skip them; see flash_attention_for). The price: a copy between sequences moves data
        # (seq_cp), where a unified stream shares cells. Cached prefixes live in host memory, not here (see
        # PrefixCache / HostKV).
        cparams.n_ctx = config.n_ctx * self.n_seq_total
        cparams.n_batch = config.n_batch
        cparams.n_ubatch = config.n_batch
        cparams.n_seq_max = self.n_seq_total
        cparams.kv_unified = False
        threads = config.n_threads or os.cpu_count() or 1
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.no_perf = False
        self.flash_attn = self.flash_attention_for(
            config.flash_attn, llama_cpp.llama_model_n_swa(self._model)
        )
        cparams.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if self.flash_attn
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx and self.flash_attn:
            cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
            self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise BackendError("llama.cpp could not create a context (n_ctx too large for memory?)")
        self.n_ctx = config.n_ctx  # per sequence
        if llama_cpp.llama_n_ctx_seq(self._ctx) < config.n_ctx:
            raise BackendError(
                f"llama.cpp gave each sequence {llama_cpp.llama_n_ctx_seq(self._ctx)} KV cells, not {config.n_ctx}"
            )
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self.tokenizer = Tokenizer(self._model, owns_model=False, path=str(self.path))
        self.n_vocab = self.tokenizer.n_vocab
        self._batch = llama_cpp.llama_batch_init(config.n_batch, 0, self.n_seq_total)
        self.decode_seconds = 0.0  # time spent inside llama_decode, for the benchmark's overhead figure
        self.decode_calls = 0
        eog = {i for i in range(self.n_vocab) if self.vocab.is_special[i] and self.tokenizer.is_eog(i)}
        self.eog_ids = frozenset(eog | set(self.vocab.eos_token_ids))

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            self.tokenizer.detach()  # it borrowed the model's vocabulary
            llama_cpp.llama_model_free(self._model)
            self._model = None

    # ---------------------------------------------------------------- decode
    def decode(self, items: list[tuple[int, list[int], int, bool | str]]) -> list:
        """Decode several sequences in one llama_decode call.

        items: (seq_id, tokens, first position, want): want True for the last token's logits, "all" for every
        token's. The total token count must not exceed n_batch. Returns, per item, a view of the last token's
        logits, a list of views (one per token) for "all", or None. Views are valid until the next decode.
        """
        import time

        n_all = sum(len(tokens) for _, tokens, _, _ in items)
        if n_all == 0:
            return []
        if n_all > self.config.n_batch:
            raise BackendError(f"batch of {n_all} tokens exceeds n_batch={self.config.n_batch}")
        b = self._batch
        n = 0
        out_idx = [-1] * len(items)
        all_rows: dict[int, range] = {}
        # in order of sequence id: llama.cpp puts sequences of separate streams in one micro-batch only when
        # their ids follow each other in the batch (0, 1, 2, ...); otherwise each run is computed on its own
        for k in sorted(range(len(items)), key=lambda k: items[k][0]):
            seq_id, tokens, pos0, want = items[k]
            first = n
            for j, t in enumerate(tokens):
                b.token[n] = t
                b.pos[n] = pos0 + j
                b.n_seq_id[n] = 1
                b.seq_id[n][0] = seq_id
                b.logits[n] = 1 if want == "all" else 0
                n += 1
            if want == "all":
                all_rows[k] = range(first, n)
                out_idx[k] = n - 1
            elif want:
                b.logits[n - 1] = 1
                out_idx[k] = n - 1
        b.n_tokens = n
        t0 = time.perf_counter()
        rc = llama_cpp.llama_decode(self._ctx, b)
        self.decode_seconds += time.perf_counter() - t0
        self.decode_calls += 1
        if rc != 0:
            raise BackendError(
                f"llama_decode failed with code {rc}"
                + (" (no free KV cells: the context is full)" if rc == 1 else "")
            )
        res: list = []
        for k, i in enumerate(out_idx):
            if i < 0:
                res.append(None)
            elif k in all_rows:
                res.append([self._logits_row(j) for j in all_rows[k]])
            else:
                res.append(self._logits_row(i))
        return res

    def _logits_row(self, i: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    # ---------------------------------------------------------------- KV sequence operations
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None:
        """Drop positions [p0, p1) of a sequence (-1 = open end)."""
        llama_cpp.llama_memory_seq_rm(self._mem, seq_id, p0, p1)

    def seq_cp(self, src: int, dst: int | list[int], p0: int = -1, p1: int = -1) -> None:
        """Replace dst's KV (each of a list's) with src's positions [0, p1) (p1 = -1: all of them). The
        sequences live in streams of their own, so the rows are copied, through host memory: llama.cpp copies
        between streams only whole streams, and only at the next decode, which a save of dst before that
        decode would not see."""
        if p0 > 0:
            raise BackendError("a sequence is copied from position 0")
        dsts = [d for d in (dst if isinstance(dst, list) else [dst]) if d != src]
        if not dsts:
            return
        data = self.seq_save(src)
        for d in dsts:
            self.seq_rm(d)
            self.seq_restore(d, data)
            if p1 >= 0:
                self.seq_rm(d, p1, -1)

    def seq_len(self, seq_id: int) -> int:
        return llama_cpp.llama_memory_seq_pos_max(self._mem, seq_id) + 1

    def seq_save(self, seq_id: int) -> bytearray:
        """The sequence's KV (positions, K and V rows) as llama.cpp's sequence-state bytes."""
        size = llama_cpp.llama_state_seq_get_size(self._ctx, seq_id)
        data = bytearray(size)
        n = llama_cpp.llama_state_seq_get_data(
            self._ctx, (ctypes.c_uint8 * size).from_buffer(data), size, seq_id
        )
        del data[n:]
        return data

    def seq_restore(self, seq_id: int, data: bytes | bytearray) -> None:
        """Replace the sequence's KV with saved state (needs a contiguous run of free cells)."""
        buf = (
            (ctypes.c_uint8 * len(data)).from_buffer(data)
            if isinstance(data, bytearray)
            else (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        )
        if llama_cpp.llama_state_seq_set_data(self._ctx, buf, len(data), seq_id) == 0:
            raise BackendError("could not restore sequence state (no contiguous free KV cells)")

    def save_prefix(self, seq_id: int, n: int) -> bytearray:
        """Positions [0, n) of a sequence as state bytes: the sequence's own bytes when it holds no more, else
        those of a copy in the scratch sequence, trimmed to n."""
        if self.seq_len(seq_id) <= n:
            return self.seq_save(seq_id)
        try:
            self.seq_cp(seq_id, self.scratch_seq, 0, n)
            return self.seq_save(self.scratch_seq)
        finally:
            self.seq_rm(self.scratch_seq)

    def load_prefix(self, seq_id: int, data: bytes | bytearray, n: int) -> None:
        """Restore saved state into an empty sequence and keep its positions [0, n)."""
        self.seq_restore(seq_id, data)
        self.seq_rm(seq_id, n, -1)

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self._mem, True)


def _kv_bytes_per_token(meta: dict) -> int:
    """KV cache bytes one token occupies (f16 K and V over all layers), from the GGUF header; 0 if unknown."""
    arch = meta.get("general.architecture", "")
    try:
        layers = int(meta[f"{arch}.block_count"])
        heads = int(meta[f"{arch}.attention.head_count"])
        kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
        head_dim = int(
            meta.get(f"{arch}.attention.key_length", int(meta[f"{arch}.embedding_length"]) // heads)
        )
        v_dim = int(meta.get(f"{arch}.attention.value_length", head_dim))
    except (KeyError, ValueError, ZeroDivisionError):
        return 0
    return layers * kv_heads * (head_dim + v_dim) * 2
