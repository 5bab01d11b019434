"""tokenseam: an LLM serving layer that gets the seam between text and tokens right.

Each seam lives in its own subpackage: vocab, grammar, healing, engine, stream, respcache, planner, server.
"""

__version__ = "0.1.0"
