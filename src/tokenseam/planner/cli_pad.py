"""`tokenseam pad PROMPT_FILE --examples EXAMPLES.jsonl --profile P`: pad a prefix to the cache floor with examples.

Writes the padded prompt and a JSON report; exits 3 when the examples cannot reach the target (never filler).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .cli_plan import add_common, add_emit


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pad", help="append whole examples so a prompt prefix clears the cache floor on a block boundary"
    )
    p.add_argument("prompt_file", metavar="PROMPT_FILE", help="the fixed prompt prefix (UTF-8 text)")
    p.add_argument(
        "--examples",
        required=True,
        metavar="EXAMPLES.jsonl",
        help='worked examples, one per line: {"text": "..."} or a JSON string',
    )
    add_common(p)
    p.add_argument(
        "--out",
        metavar="FILE",
        default=None,
        help="padded prompt file (default PROMPT_FILE with .padded before the suffix); the report "
        "goes to FILE.report.json",
    )
    p.add_argument(
        "--separator",
        default="\\n\\n",
        help="text put before each appended example (backslash escapes allowed; default \\n\\n)",
    )
    p.add_argument(
        "--continuation",
        action="append",
        default=None,
        metavar="TEXT",
        help="text that will follow the padded prefix, for the stable-end check (repeatable; "
        "backslash escapes allowed; default: the separator followed by common starts)",
    )
    p.add_argument(
        "--allow-unstable-end",
        action="store_true",
        help="accept a padded prompt whose last tokens re-tokenize when text is appended",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_emit(p)
    p.set_defaults(func=run)


def _unescape(s: str) -> str:
    try:
        return s.encode("utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8")
    except (UnicodeDecodeError, UnicodeEncodeError):
        return s


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .counting import make_counter
    from .errors import PlannerError
    from .inputs import read_text_file
    from .pad import load_examples, pad_prompt
    from .profiles import load_profiles

    err = Console(stderr=True, soft_wrap=True)
    try:
        profile = load_profiles(args.profiles).get(args.profile)
        if args.emit is not None:  # refuse a bad --emit before any work
            from .fragments import check_dialect

            check_dialect(args.emit, profile, args.role)
            profile.write(args.write)
        elif args.emit_out or args.write:
            raise PlannerError("--emit-out and --write need --emit openai|anthropic|gemini")
        prompt = read_text_file(args.prompt_file, "prompt file")
        examples = load_examples(args.examples)
        counter = make_counter(args.tokenizer, profile.tokenizer, args.leading_tokens)
        conts = None if args.continuation is None else [_unescape(c) for c in args.continuation]
        res = pad_prompt(
            prompt,
            examples,
            profile,
            counter,
            separator=_unescape(args.separator),
            continuations=conts,
            allow_unstable_end=args.allow_unstable_end,
        )
    except PlannerError as e:
        err.print(f"[red]error:[/red] {e}", highlight=False)
        msg = str(e)
        return 3 if ("never pads with filler" in msg or "unstable token boundary" in msg) else 2
    src = Path(args.prompt_file)
    out = Path(args.out) if args.out else src.with_name(src.stem + ".padded" + (src.suffix or ".txt"))
    report_path = out.with_name(out.name + ".report.json")
    res.report.update(
        prompt_file=str(src), examples_file=str(args.examples), out=str(out), report_file=str(report_path)
    )
    from .cli_plan import emit_fragment

    try:
        out.write_text(res.text, encoding="utf-8")
        emitted = emit_fragment(args, profile, res.text, out)
        if emitted is not None:
            res.report["emitted"] = {k: v for k, v in emitted.items() if k != "fragment"}
        report_path.write_text(json.dumps(res.report, indent=2), encoding="utf-8")
    except PlannerError as e:
        err.print(f"[red]error:[/red] {e}", highlight=False)
        return 2
    except OSError as e:
        err.print(f"[red]error:[/red] cannot write {out}: {e}", highlight=False)
        return 2
    if args.json:
        print(json.dumps(res.report, indent=2))
        return 0
    r = res.report
    con = Console()
    con.print(
        f"[bold]{r['status']}[/bold]: {r['prompt_tokens']:,} -> {r['final_tokens']:,} tokens "
        f"(target {r['target_tokens']:,}, floor {r['floor']:,}, block {r['block']}) with "
        f"{len(r['chosen'])} of {r['examples_available']} examples (lines {r['chosen']})",
        highlight=False,
    )
    con.print(
        f"steady cost/call: {r['cost_as_is']:,.1f} -> {r['cost_padded']:,.1f} full-price token equivalents"
    )
    if r["cost_padded"] >= r["cost_as_is"]:
        con.print(
            "[yellow]note:[/yellow] padding does not pay in steady state for this profile (a prefix "
            "under the floor pays off from floor(F*r)+1 tokens); run `tokenseam plan` for the economics."
        )
    st = r["stable_end"]
    con.print(f"stable end: {st['stable'] if st['checked'] else 'not checked'} ({st['method']})")
    if not r["count"]["exact"]:
        con.print(
            f"[yellow]count:[/yellow] {r['count']['error_note']} The floor was raised to "
            f"{r['effective_floor']:,} to absorb that error; block alignment is nominal."
        )
    if r.get("emitted"):
        em = r["emitted"]
        con.print(
            f"wrote the {em['dialect']} request fragment ({em['breakpoints']} breakpoint(s)) to {em['file']}",
            highlight=False,
        )
    con.print(f"wrote {out} and {report_path}", highlight=False)
    return 0
