"""ID-exact streaming: token ids -> text deltas that never split a UTF-8 character or leak a stop string.

Text is held back; ids never are. See `IncrementalDetokenizer`.
"""

from .detokenizer import IncrementalDetokenizer, utf8_incomplete_tail

__all__ = ["IncrementalDetokenizer", "utf8_incomplete_tail"]
