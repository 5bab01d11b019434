"""The vocabulary layer's one exception type."""


class VocabularyError(Exception):
    """A model file or tokenizer file could not be read as a vocabulary (the message says why)."""
