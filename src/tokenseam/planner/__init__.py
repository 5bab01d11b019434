"""Prompt-cache planner: provider cache profiles, cache economics, useful padding, paired A/B evaluation.

Depends only on `tokenseam.vocab` (for exact token counts); everything else is standard library or rich/httpx.
"""

from .errors import PlannerError

__all__ = ["PlannerError"]
