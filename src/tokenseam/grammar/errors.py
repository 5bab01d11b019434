"""The grammar part's single exception type.

Raised for malformed or unsupported schemas, regexes, GBNF grammars and requests; the server maps it to 400.
"""

from __future__ import annotations


class GrammarError(ValueError):
    """A grammar (schema, regex, GBNF, choice list or request option) that cannot be compiled exactly."""


class GrammarResourceError(GrammarError):
    """The process reached its memory cap while compiling: not the grammar's fault alone (other compiles may be
    running), so the server answers 503 + Retry-After rather than 400."""


class GrammarEmpty(GrammarError):
    """The grammar accepts no string at all (a schema whose keywords contradict each other, say)."""
