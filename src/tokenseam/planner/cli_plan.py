"""`tokenseam plan PROMPT_FILE --profile P`: does padding this prompt prefix to the provider's cache floor pay?

Prints prefix tokens, floor, block remainder, steady-state and TTL-aware costs per call and per month (table or JSON).
"""

from __future__ import annotations

import argparse
import json
import math


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return v


def non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return v


def leading_tokens_arg(text: str) -> int | str:
    return "chat" if text == "chat" else non_negative_int(text)


def non_negative_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return v


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile", required=True, help="provider profile name (e.g. openai, anthropic-1024, local)"
    )
    p.add_argument(
        "--profiles",
        metavar="FILE",
        default=None,
        help="TOML file whose profiles extend/override the built-in ones",
    )
    p.add_argument(
        "--tokenizer",
        metavar="MODEL",
        default=None,
        help="count with this tokenizer: smollm2, gemma3, a .gguf path, or bytes/4 (approximation)",
    )
    p.add_argument(
        "--leading-tokens",
        type=leading_tokens_arg,
        default=None,
        metavar="N|chat",
        help="tokens the request adds before the text (BOS, chat template); `chat` = the model's "
        "chat-template header for one user message; default: the tokenizer's BOS (1 or 0), "
        "0 for the approximation",
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="cache economics of a prompt prefix for a provider profile")
    p.add_argument("prompt_file", metavar="PROMPT_FILE", help="the fixed prompt prefix (UTF-8 text)")
    add_common(p)
    p.add_argument(
        "--calls-per-hour",
        type=positive_float,
        default=None,
        metavar="N",
        help="call rate for TTL expiry and monthly figures (omit for steady state only)",
    )
    p.add_argument(
        "--price-per-mtok",
        type=non_negative_float,
        default=None,
        metavar="X",
        help="full input price in USD per million tokens (omit for token-equivalents only)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=run)


def build_report(args: argparse.Namespace) -> dict:
    from .counting import make_counter
    from .economics import make_plan
    from .inputs import read_text_file
    from .profiles import load_profiles

    profile = load_profiles(args.profiles).get(args.profile)
    text = read_text_file(args.prompt_file, "prompt file")
    counter = make_counter(args.tokenizer, profile.tokenizer, args.leading_tokens)
    p = counter.count(text)
    plan = make_plan(
        p,
        profile.floor,
        profile.block,
        profile.read_multiplier,
        [(w.name, w.multiplier, w.ttl_seconds) for w in profile.writes],
        refresh_on_hit=profile.ttl_refresh_on_hit,
        calls_per_hour=args.calls_per_hour,
        price_per_mtok=args.price_per_mtok,
    )
    return {
        "prompt_file": str(args.prompt_file),
        "profile": profile.to_dict(),
        "count": counter.describe(text),
        "plan": plan.to_dict(),
    }


def _fmt(v, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


def print_report(rep: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=max(Console().width, 110))
    prof, plan, cnt = rep["profile"], rep["plan"], rep["count"]
    t = Table(
        title=f"cache plan: {rep['prompt_file']} on {prof['name']} (figures verified {prof['verified']})"
    )
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("note")
    t.add_row(
        "prefix tokens p", _fmt(plan["prefix_tokens"]), cnt["method"] + ("" if cnt["exact"] else " (approx.)")
    )
    t.add_row("floor F", _fmt(plan["floor"]), "under F nothing is cached")
    t.add_row("block", _fmt(plan["block"]), prof["block_status"])
    t.add_row("read multiplier r", f"{plan['read_multiplier']:g}", "")
    t.add_row("cached as is", _fmt(plan["cached_as_is"]), "")
    t.add_row(
        "remainder p mod block",
        _fmt(plan["remainder_as_is"]),
        "paid at full price every call" if plan["cached_as_is"] else "whole prefix paid at full price",
    )
    t.add_row(
        "planned length T",
        _fmt(plan["planned_tokens"]),
        f"+{plan['padding_needed']} tokens of useful padding",
    )
    t.add_row(
        "break-even prefix floor(F*r)+1",
        _fmt(plan["break_even_prefix"]),
        f"under the floor, padding to F pays from here up to {plan['floor'] - 1}" if plan["floor"] else "",
    )
    t.add_row("steady state cost/call as is", _fmt(plan["steady_cost_as_is"]), "full-price token equivalents")
    t.add_row(
        "steady state cost/call planned",
        _fmt(plan["steady_cost_planned"]),
        "[green]padding wins[/green]" if plan["steady_padding_wins"] else "[yellow]leave as is[/yellow]",
    )
    con.print(t)
    o = Table(
        title="per write option"
        + (f" at {plan['calls_per_hour']:g} calls/hour" if plan["calls_per_hour"] else " (steady state)")
    )
    money = plan["price_per_mtok"] is not None
    unit = "$/mo" if money else "tok/mo"
    for col in (
        "write",
        "TTL",
        "P(miss)",
        "as is",
        "planned",
        "verdict",
        "pays from/h",
        f"{unit} as is",
        f"{unit} pad",
    ):
        o.add_column(col, justify="right")
    for op in plan["options"]:
        be = op["break_even_calls_per_hour"]
        mo_a = op["usd_per_month_as_is"] if money else op["tokens_per_month_as_is"]
        mo_b = op["usd_per_month_planned"] if money else op["tokens_per_month_planned"]
        o.add_row(
            f"{op['write_option']} x{op['write_multiplier']:g}",
            "none" if op["ttl_seconds"] is None else f"{op['ttl_seconds']:g}s",
            f"{op['miss_probability']:.3f}",
            _fmt(op["cost_as_is"]),
            _fmt(op["cost_planned"]),
            "[green]pad[/green]" if op["padding_wins"] else "[yellow]as is[/yellow]",
            "never" if be is None else _fmt(be, 2),
            _fmt(mo_a, 2 if money else 0),
            _fmt(mo_b, 2 if money else 0),
        )
    con.print(o)
    if not cnt["exact"]:
        con.print(f"[yellow]count:[/yellow] {cnt['error_note']}")
        cc = cnt.get("cross_check")
        if cc:
            con.print(
                f"cross-check: SmolLM2 counts {cc['tokens']:,} tokens on this text "
                f"(bytes/4 gives {cc['estimate']:,}, {cc['estimate_error']:+.0%})."
            )
    if plan["calls_per_hour"] is None:
        con.print(
            "no --calls-per-hour: costs assume a warm cache (steady state); monthly figures need a rate."
        )
    elif plan["price_per_mtok"] is None:
        con.print("no --price-per-mtok: monthly cost shown in full-price token equivalents.")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .errors import PlannerError

    try:
        rep = build_report(args)
    except PlannerError as e:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {e}", highlight=False)
        return 2
    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        print_report(rep)
    return 0
