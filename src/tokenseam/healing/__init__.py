"""Token healing at the prompt/generation seam: rollback, the healing constraint, stable prefixes, the linter.

The engine calls `heal_prompt` on prompt ids, prefills `kept_ids` and installs a `HealingConstraint`.
"""

from .constraint import (
    HealedGrammarConstraint,
    HealingConstraint,
    all_allowed_mask,
    healing_step_ids,
    prepare_vocabulary,
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
    "healing_step_ids",
    "join_stable",
    "lint_prompt",
    "prepare_vocabulary",
    "resolve_token_healing",
    "stable_prefix",
]
