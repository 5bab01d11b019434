"""Token healing at the prompt/generation seam: rollback, the healing constraint, stable prefixes, the linter.

A caller runs `heal_prompt` on the prompt ids, prefills `kept_ids` and generates under `request_constraint`
(a `HealingConstraint`, or healing in front of a grammar).
"""

from .constraint import (
    HealedGrammarConstraint,
    HealingConstraint,
    all_allowed_mask,
    prepare_vocabulary,
    request_constraint,
)
from .errors import HealingError
from .heal import DEFAULT_MAX_ROLLBACK, HealResult, heal_prompt, resolve_token_healing
from .lint import LintReport, lint_prompt
from .stable import StablePrefix, join_stable, stable_prefix

__all__ = [
    "DEFAULT_MAX_ROLLBACK",
    "HealResult",
    "HealedGrammarConstraint",
    "HealingConstraint",
    "HealingError",
    "LintReport",
    "StablePrefix",
    "all_allowed_mask",
    "heal_prompt",
    "join_stable",
    "lint_prompt",
    "prepare_vocabulary",
    "request_constraint",
    "resolve_token_healing",
    "stable_prefix",
]
