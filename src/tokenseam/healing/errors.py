"""The one exception type of the healing part.

Raised for inputs a caller can fix: bad token ids, bad options, unreadable prompts or chat templates.
"""

from __future__ import annotations


class HealingError(ValueError):
    """A token-healing, stable-prefix or prompt-lint input is invalid; the message says which and why."""
