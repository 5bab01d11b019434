"""Structured outputs: JSON Schema, regex, GBNF and choice lists compiled to per-state token masks.

Public API: GrammarCompiler -> CompiledGrammar, GrammarMatcher per request, GrammarError for bad input;
check_grammar validates a grammar without a vocabulary.
"""

from __future__ import annotations

from .compiled import CompiledGrammar
from .compiler import GrammarCompiler, check_grammar
from .errors import GrammarError, GrammarResourceError
from .matcher import GrammarMatcher

__all__ = [
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarMatcher",
    "GrammarResourceError",
    "check_grammar",
]
