"""Compile the grammar engine's numba functions into this environment's cache (run by `tokenseam vllm setup`):
`python -m tokenseam.vllm.warm TOKENIZER_JSON`. NUMBA_CACHE_DIR says where the cache goes."""

from __future__ import annotations

import sys

from ..grammar import GrammarCompiler
from ..vocab import Vocabulary


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tokenseam.vllm.warm TOKENIZER_JSON", file=sys.stderr)
        return 2
    GrammarCompiler(Vocabulary.from_hf_tokenizer_json(argv[0])).warm_up()
    return 0


if __name__ == "__main__":
    sys.exit(main())
