"""The "tokenseam" structured-output backend for vLLM (engine-core process; imports vLLM and torch).

vLLM compiles each request's grammar on its own thread pool (`StructuredOutputManager._create_grammar`),
off the scheduling step; the plugin routes that call here with the request's options. Masks are written
straight into vLLM's bitmask tensor: the layouts are the same (int32 words, lowest bit first, 1 = allowed).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from vllm.v1.structured_output.backend_types import (
    StructuredOutputBackend,
    StructuredOutputGrammar,
    StructuredOutputOptions,
)

from ..grammar import GrammarCompiler
from .requests import compile_plan, grammar_cache_bytes, plan
from .session import GrammarSession
from .vocabulary import vocabulary_of
from .xargs import default_property_order

log = logging.getLogger("tokenseam.vllm")

CACHE_SIZE = 256  # compiled grammars kept (LRU keyed by grammar, options and vocabulary fingerprint)


@dataclass
class TokenseamBackend(StructuredOutputBackend):
    def __post_init__(self) -> None:
        self.vocab = vocabulary_of(self.tokenizer, self.vocab_size)
        self.compiler = GrammarCompiler(
            self.vocab, cache_size=CACHE_SIZE, cache_bytes=grammar_cache_bytes(os.environ)
        )
        self.compiler.warm_up()
        cfg = self.vllm_config.structured_outputs_config
        self.compact_default = bool(getattr(cfg, "disable_any_whitespace", False))
        default_property_order()  # a bad $TOKENSEAM_PROPERTY_ORDER stops the server at start, not a request
        log.info(
            "tokenseam backend ready: %d tokens, end ids %s, grammar memory budget %d MB",
            self.vocab.size,
            sorted(self.vocab.eos_token_ids),
            self.compiler.cache_bytes >> 20,
        )

    def compile_grammar(
        self,
        request_type: StructuredOutputOptions,
        grammar_spec: str,
        stop_token_ids: set[int] | None = None,
        strict: bool = False,
        compact: bool | None = None,
        healing: bytes = b"",
        property_order: str = "schema",
    ) -> StructuredOutputGrammar:
        p = plan(
            request_type.name,
            grammar_spec,
            strict=strict,
            compact=self.compact_default if compact is None else compact,
            property_order=property_order,
        )
        compiled = compile_plan(self.compiler, p)
        ends = stop_token_ids or self.vocab.eos_token_ids
        return TokenseamGrammar(GrammarSession(compiled, ends, healing))

    def allocate_token_bitmask(self, max_num_seqs: int) -> torch.Tensor:
        return torch.full((max_num_seqs, self.vocab.mask_words), -1, dtype=torch.int32)

    def destroy(self) -> None:
        pass


class TokenseamGrammar(StructuredOutputGrammar):
    def __init__(self, session: GrammarSession) -> None:
        self.session = session

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        ok = self.session.accept(tokens)
        if not ok:
            log.error("tokenseam grammar refused tokens %s for request %s", tokens, request_id)
        return ok

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        return self.session.validate(tokens)

    def rollback(self, num_tokens: int) -> None:
        self.session.rollback(num_tokens)

    def fill_bitmask(self, bitmask: torch.Tensor, batch_index: int) -> None:
        self.session.fill(bitmask[batch_index].numpy())

    def is_terminated(self) -> bool:
        return self.session.terminated

    def reset(self) -> None:
        self.session.reset()
