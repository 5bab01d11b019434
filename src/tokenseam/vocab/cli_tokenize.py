"""`tokenseam tokenize "text"`: ids, raw bytes and display pieces in a table."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokenize", help="show how a model tokenizes text (ids, raw bytes, pieces)")
    p.add_argument("text", help="text to tokenize (use $'...' in bash for escapes)")
    p.add_argument(
        "--model", default=None, help="model alias (smollm2, gemma3) or .gguf path; default smollm2"
    )
    p.add_argument("--special", action="store_true", help="parse special-token text such as <|im_end|>")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console
    from rich.table import Table

    from ..models import ModelNotFoundError, resolve_model
    from . import Tokenizer, Vocabulary, VocabularyError

    try:
        path = resolve_model(args.model)
        vocab = Vocabulary.from_gguf(path)
        tok = Tokenizer.from_gguf(path)
    except (ModelNotFoundError, VocabularyError) as e:
        Console(stderr=True).print(f"[red]error:[/red] {e}")
        return 2
    ids = tok.encode(args.text, add_special=False, parse_special=args.special)
    rows = [(t, vocab.token_bytes[t], vocab.token_text[t], bool(vocab.is_special[t])) for t in ids]
    if args.json:
        print(json.dumps([{"id": t, "bytes": list(b), "piece": p, "special": s} for t, b, p, s in rows]))
        return 0
    table = Table(title=f"{len(ids)} tokens ({path.name})")
    for col in ("#", "id", "bytes", "piece", "text"):
        table.add_column(col)
    for n, (t, b, p, s) in enumerate(rows):
        table.add_row(
            str(n),
            str(t),
            b.hex(" "),
            repr(p),
            ("[special] " if s else "") + repr(b.decode("utf-8", "replace")),
        )
    Console().print(table)
    return 0
