"""`tokenseam lint-prompt FILE | --text TEXT`: is the prompt's end a stable token boundary for this model?

`--against FILE2` instead names the first token where two prompts part and why (an edit, a re-tokenized seam,
text one of them leaves out), so a prefix-cache miss between two requests can be explained.

Exit status: 0 stable (or: one prompt's ids are a prefix of the other's), 1 unstable (or: they part), 2 usage,
input or model errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MAX_PROMPT_BYTES = 4 * 1024 * 1024


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "lint-prompt",
        help="check that a prompt ends on a stable token boundary",
        description="Tokenize the prompt alone and joined with a battery of continuations; "
        "exit 1 if any continuation re-tokenizes the prompt's end.",
    )
    p.add_argument("file", nargs="?", help="prompt file (UTF-8 text, used verbatim; '-' reads stdin)")
    p.add_argument("--text", help="the prompt text instead of a file")
    p.add_argument(
        "--model", default=None, help="model alias (smollm2, gemma3) or .gguf path; default smollm2"
    )
    p.add_argument(
        "--against",
        metavar="FILE2",
        help="compare with a second prompt: the first token where their ids part and its cause",
    )
    p.add_argument(
        "--special",
        action="store_true",
        help="with --against: read special-token text (<|im_start|>) as special tokens, as in a rendered "
        "chat prompt (default: plain text, as /v1/completions reads a text prompt)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--chat-template",
        action="store_true",
        help="use the prompt as a chat message in the model's chat template and check every seam",
    )
    p.set_defaults(func=run)


class _InputError(Exception):
    pass


def _read_prompt(args: argparse.Namespace) -> tuple[str, str]:
    if (args.file is None) == (args.text is None):
        raise _InputError("give exactly one of FILE or --text")
    if args.text is not None:
        text, source = args.text, "--text"
    else:
        text, source = _read_file(args.file)
    if not text:
        raise _InputError(f"the prompt from {source} is empty: there is no boundary to check")
    return text, source


def _read_file(name: str) -> tuple[str, str]:
    if name == "-":
        data, source = sys.stdin.buffer.read(MAX_PROMPT_BYTES + 1), "<stdin>"
    else:
        path = Path(name)
        if not path.exists():
            raise _InputError(f"prompt file not found: {path}")
        if not path.is_file():
            raise _InputError(f"not a regular file: {path}")
        try:
            with path.open("rb") as f:
                data = f.read(MAX_PROMPT_BYTES + 1)
        except OSError as e:
            raise _InputError(f"cannot read {path}: {e.strerror}") from e
        source = str(path)
    if len(data) > MAX_PROMPT_BYTES:
        raise _InputError(f"{source} is larger than {MAX_PROMPT_BYTES // (1024 * 1024)} MiB; not a prompt")
    if b"\0" in data:
        raise _InputError(f"{source} looks binary (it contains NUL bytes); give a UTF-8 text file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _InputError(f"{source} is not UTF-8 text (invalid byte at offset {e.start})") from e
    return text, source


def _prompt_ids(text: str, source: str, tok, vocab, special: bool) -> list[int]:
    """A prompt's ids: a JSON list of ids as is (checked against the vocabulary), else the text tokenized."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            ids = json.loads(stripped)
        except ValueError:
            ids = None
        if isinstance(ids, list) and all(type(t) is int for t in ids):
            bad = [t for t in ids if not 0 <= t < vocab.size]
            if bad:
                raise _InputError(
                    f"{source}: token id {bad[0]} is outside the vocabulary (0..{vocab.size - 1})"
                )
            return ids
    return tok.encode(text, add_special=True, parse_special=special)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..models import ModelNotFoundError, resolve_model
    from ..vocab import Tokenizer, Vocabulary, VocabularyError
    from .errors import HealingError

    err = Console(stderr=True)
    try:
        text, source = _read_prompt(args)
        path = resolve_model(args.model)
        vocab = Vocabulary.from_gguf(path)
        tok = Tokenizer.from_gguf(path)
        name = args.model or "smollm2"
        if args.against is not None:
            if args.chat_template:
                raise _InputError("--against compares two prompts as they are; it takes no --chat-template")
            other, other_source = _read_file(args.against)
            return _compare(
                args,
                vocab,
                _prompt_ids(text, source, tok, vocab, args.special),
                source,
                _prompt_ids(other, other_source, tok, vocab, args.special),
                other_source,
            )
        if args.special:
            raise _InputError("--special goes with --against")
        if args.chat_template:
            from .chat_lint import lint_chat_prompt, load_chat_template

            # (a GGUF without a template: the built-in one the server renders it with)
            report = lint_chat_prompt(tok, vocab, load_chat_template(path, vocab), text, model=name)
        else:
            from .lint import lint_prompt

            report = lint_prompt(tok, vocab, text, model=name)
    except (_InputError, ModelNotFoundError, VocabularyError, HealingError) as e:
        err.print(f"[red]error:[/red] {e}", highlight=False)
        return 2
    if args.json:
        out = report.to_json()
        out["source"] = source
        print(json.dumps(out, ensure_ascii=False, indent=2))
    else:
        _print_report(Console(highlight=False, soft_wrap=True), report, source, args.chat_template)
    return 0 if report.stable else 1


_CAUSES = {
    "same": "the two prompts have the same ids",
    "extended": "one prompt's ids are a prefix of the other's (a cache holding the shorter one is reused whole)",
    "retokenized": "the text goes on the same, but its bytes are cut into other tokens (a re-tokenized seam)",
    "stripped": "one prompt leaves out text the other holds here, then goes on the same",
    "end_of_turn": "one prompt has the model's end-of-generation token where the other has other text "
    "(an answer that ended with the model's own end token, which the chat template writes as another mark)",
    "edited": "the text differs from here on",
}


def _compare(args, vocab, a: list[int], a_src: str, b: list[int], b_src: str) -> int:
    from rich.console import Console

    from .divergence import diverge

    d = diverge(vocab, a, b)
    if args.json:
        out = d.to_json()
        out.update(
            {
                "a": {**out["a"], "source": a_src, "tokens": len(a)},
                "b": {**out["b"], "source": b_src, "tokens": len(b)},
            }
        )
        if d.cause == "stripped":
            out["removed_from"] = a_src if d.removed == "a" else b_src
        print(json.dumps(out, ensure_ascii=False, indent=2))
    else:
        con = Console(highlight=False, soft_wrap=True)
        con.print(f"{a_src}: {len(a)} tokens; {b_src}: {len(b)} tokens; {d.at} shared")
        con.print(f"  cause: {d.cause}: {_CAUSES[d.cause]}")
        if d.cause not in ("same", "extended"):
            con.print(f"  they part at token {d.at} (byte {d.byte}):")
            for src, ids, txt in ((a_src, d.a_ids, d.a_text), (b_src, d.b_ids, d.b_text)):
                con.print(f"    {src}: ids {ids} text {txt!r}")
        if d.cause == "retokenized":
            con.print(f"  the next {d.same_bytes} bytes are the same in both")
        if d.cause == "stripped":
            side = a_src if d.removed == "a" else b_src
            con.print(f"  {side} leaves out {d.removed_bytes} bytes here")
    return 0 if d.cause in ("same", "extended") else 1


def _print_report(con, report, source: str, chat: bool) -> None:
    verdict = "[green]stable[/green]" if report.stable else "[red]UNSTABLE[/red]"
    if chat:
        n_bad = sum(not b.stable for b in report.boundaries)
        con.print(
            f"{source} as a chat message ({report.model}): {len(report.boundaries)} template seams, "
            f"{n_bad} unstable; {verdict}"
        )
    else:
        con.print(f"{source}: {report.prompt_tokens} tokens ({report.model}); end is {verdict}")
    if report.unstable and not chat:
        con.print(
            f"  {len(report.unstable)} of {report.checked} continuations re-tokenize up to "
            f"{report.max_retokenized} trailing token(s) of the prompt:"
        )
        by_cat: dict[str, list[str]] = {}
        for c in report.unstable:
            by_cat.setdefault(c.category, []).append(repr(c.continuation))
        for cat, items in by_cat.items():
            more = f" (+{len(items) - 8} more)" if len(items) > 8 else ""
            con.print(f"    {cat}: {', '.join(items[:8])}{more}")
    if report.heal_removed_tokens and not chat:
        con.print(
            f"  token healing rolls back {report.heal_removed_tokens} token(s) "
            f"{report.heal_removed_text!r}: the stable prefix ends before them"
        )
    s = report.suggestion
    if s is not None:
        if s.drop_chars is not None:
            con.print(
                f"  suggestion: drop the last {s.drop_chars} character(s); the prompt then ends "
                f"...{s.stable_end!r}"
            )
        if s.append is not None:
            con.print(f"  suggestion: append {s.append!r}")
    elif report.unstable and not chat:
        con.print("  no stable end within 64 characters: keep token healing on for this prompt")
    for b in report.boundaries:
        mark = "[green]ok[/green]      " if b.stable else "[red]unstable[/red]"
        detail = "" if b.stable else f"  re-tokenized by {', '.join(map(repr, b.unstable[:6]))}"
        con.print(f"  {mark} {b.where:<26} {b.context!r}{detail}")
