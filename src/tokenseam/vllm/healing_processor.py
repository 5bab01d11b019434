"""Token healing inside vLLM: a v1 logits processor (runs where vLLM samples; needs no numba).

A request asks for healing with `vllm_xargs: {"tokenseam_healing": "<hex of the removed prompt bytes>"}`
and a prompt that ends before them (the kept token ids; `tokenseam.vllm.client.heal` builds both). Until the
output has regenerated those bytes, every token that is neither a prefix of what remains nor a token that
starts with all of it is masked out; after that the request costs nothing. With a grammar on the same
request, the tokenseam grammar backend does the healing itself, in front of the grammar (one mask, so the
two cannot conflict), and this processor leaves the request alone.

Load it with `--logits-processors tokenseam.vllm.healing_processor:HealingLogitsProcessor` (`tokenseam vllm
serve` does). vLLM does not run custom logits processors with speculative decoding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from ..healing import HealingConstraint
from .xargs import healing_bytes

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig


class _Row:
    __slots__ = ("constraint", "output_ids", "seen")

    def __init__(self, constraint: HealingConstraint, output_ids: list[int]) -> None:
        self.constraint = constraint
        self.output_ids = output_ids  # vLLM's live list of the request's generated ids
        self.seen = 0


class HealingLogitsProcessor(LogitsProcessor):
    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        healing_bytes(sampling_params.extra_args)  # raises ValueError (a 400) for a malformed value

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self._config = vllm_config
        self._vocab = None
        self._rows: dict[int, _Row] = {}

    def _vocabulary(self):
        if self._vocab is None:
            from vllm.tokenizers import cached_tokenizer_from_config

            from .vocabulary import vocabulary_of

            model_config = self._config.model_config
            self._vocab = vocabulary_of(
                cached_tokenizer_from_config(model_config), model_config.get_vocab_size()
            )
        return self._vocab

    def is_argmax_invariant(self) -> bool:
        return False

    def _new_row(self, params: Any, output_ids: list[int]) -> _Row | None:
        removed = healing_bytes(params.extra_args)
        if not removed or params.structured_outputs is not None:
            return None  # nothing to heal, or the grammar backend heals in front of the grammar
        return _Row(HealingConstraint(self._vocabulary(), removed), output_ids)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        rows = self._rows
        if batch_update is not None:
            # vLLM's documented order: removed, then added, then moved.
            for index in batch_update.removed:
                rows.pop(index, None)
            for index, params, _prompt_ids, output_ids in batch_update.added:
                row = self._new_row(params, output_ids)
                if row is None:
                    rows.pop(index, None)
                else:
                    rows[index] = row
            for a, b, direction in batch_update.moved:
                ra, rb = rows.pop(a, None), rows.pop(b, None)
                if ra is not None:
                    rows[b] = ra
                if rb is not None and direction == MoveDirectionality.SWAP:
                    rows[a] = rb
        for index in list(rows):
            row = rows[index]
            c = row.constraint
            while row.seen < len(row.output_ids) and c.is_active():
                c.accept(int(row.output_ids[row.seen]))
                row.seen += 1
            if not c.is_active():
                del rows[index]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, row in self._rows.items():
            allowed = torch.from_numpy(row.constraint.allowed_ids().astype(np.int64, copy=False))
            keep = logits[index, allowed].clone()
            logits[index].fill_(float("-inf"))
            logits[index, allowed] = keep
        return logits
