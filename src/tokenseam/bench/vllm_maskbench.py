"""MaskBench through the vLLM backend adapter, against the standalone matcher, in one process of the vLLM
environment: `python -m tokenseam.bench.vllm_maskbench MODEL_DIR DATA_DIR [LIMIT]` prints one JSON report.

Both engines see the same vocabulary (the model's tokenizer.json, as vLLM loads it) and the same token ids
(the instances tokenized by that tokenizer). The adapter path is the one vLLM runs: TokenseamBackend compiles,
TokenseamGrammar writes masks into a torch bitmask and takes tokens through accept_tokens; "accepting" means
the stop token is allowed. Run by `tokenseam bench vllm --maskbench DIR`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace


class _Encoder:
    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)


class AdapterEngine:
    """The vLLM backend adapter, driven the way vLLM's StructuredOutputManager drives it."""

    name = "tokenseam-in-vllm"

    def __init__(self, tokenizer, vocab_size: int) -> None:
        from vllm.v1.structured_output.backend_types import StructuredOutputOptions

        from ..grammar import GrammarError
        from ..vllm.backend import TokenseamBackend

        config = SimpleNamespace(structured_outputs_config=SimpleNamespace(disable_any_whitespace=False))
        self.backend = TokenseamBackend(config, tokenizer=tokenizer, vocab_size=vocab_size)
        self.kind = StructuredOutputOptions.JSON
        self.bitmask = self.backend.allocate_token_bitmask(1)
        self.compile_errors = (GrammarError,)
        self.eos = int(tokenizer.eos_token_id)

    def compile(self, schema):
        return self.backend.compile_grammar(self.kind, json.dumps(schema), {self.eos})

    def fill(self, g):
        g.fill_bitmask(self.bitmask, 0)
        return self.bitmask[0].numpy()

    def accept(self, g, tok: int) -> bool:
        return g.accept_tokens("maskbench", [tok])

    def accepting(self, g) -> bool:
        mask = self.fill(g)
        return bool((int(mask[self.eos >> 5]) >> (self.eos & 31)) & 1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (2, 3):
        print("usage: python -m tokenseam.bench.vllm_maskbench MODEL_DIR DATA_DIR [LIMIT]", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    from ..vllm.vocabulary import vocabulary_of
    from .grammar import TokenseamEngine, load_files, run_file, tokenize_tests

    model_dir, data = Path(argv[0]), Path(argv[1])
    limit = int(argv[2]) if len(argv) == 3 else None
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    vocab = vocabulary_of(tokenizer, vocab_size)
    encoder = _Encoder(tokenizer)
    docs = []
    for p in load_files(data, limit):
        try:
            doc = json.loads(p.read_text())
            docs.append((p.name, doc["schema"], tokenize_tests(encoder, doc)))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    engines = [TokenseamEngine(vocab), AdapterEngine(tokenizer, vocab_size)]
    outcomes: dict[str, dict[str, dict]] = {}
    walls = {}
    for engine in engines:
        t0 = time.perf_counter()
        outcomes[engine.name] = {
            name: run_file(engine, schema, tests, 60.0, []) for name, schema, tests in docs
        }
        walls[engine.name] = round(time.perf_counter() - t0, 1)
    a, b = (outcomes[e.name] for e in engines)
    differ = [
        name
        for name in a
        if (a[name]["status"], a[name]["wrong_accepts"], a[name]["wrong_rejects"])
        != (b[name]["status"], b[name]["wrong_accepts"], b[name]["wrong_rejects"])
    ]
    report = {"files": len(docs), "differ": differ, "wall_s": walls}
    for e in engines:
        rs = outcomes[e.name].values()
        report[e.name] = {
            "passing": sum(r["status"] == "pass" for r in rs),
            "compile_errors": sum(r["status"] == "compile_error" for r in rs),
            "wrong_accepts": sum(r["wrong_accepts"] for r in rs),
            "wrong_rejects": sum(r["wrong_rejects"] for r in rs),
            "other": sum(r["status"] in ("timeout", "crash") for r in rs),
        }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
