"""The boundary test set: prompts that end mid-token (prefix | continuation) and prompts that end cleanly.

Shared by the healing tests and `tokenseam bench healing` (which imports it from the package copy).
"""

from tokenseam.healing.cases import BOUNDARY_CASES, STABLE_PROMPTS, BoundaryCase

__all__ = ["BOUNDARY_CASES", "STABLE_PROMPTS", "BoundaryCase"]
