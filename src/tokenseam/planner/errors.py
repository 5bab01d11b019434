"""The planner's one exception type.

Raised for bad profile files, unusable prompts or examples, unreachable padding targets and upstream failures.
"""


class PlannerError(Exception):
    """A planner input or upstream call failed; the message names the file, field or URL and what to do."""
