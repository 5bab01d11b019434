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


def add_common(p: argparse.ArgumentParser, profile_required: bool = True) -> None:
    p.add_argument(
        "--profile",
        required=profile_required,
        metavar="PROFILE|MODEL",
        help="provider profile (openai-gpt-5.6, anthropic-1024, local, ...) or a model name that resolves to "
        "one (gpt-5.6, claude-opus-5, gemini-3-pro, ...); an unknown name is an error listing close matches",
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


def add_emit(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--emit",
        choices=("openai", "anthropic", "gemini"),
        default=None,
        help="also write the request fragment that places the cache breakpoint after the prefix "
        "(prompt_cache_breakpoint for OpenAI's explicit-cache models, cache_control for Anthropic, plain "
        "contents for implicit caches)",
    )
    p.add_argument(
        "--emit-out",
        metavar="FILE.json",
        default=None,
        help="where the fragment goes (default: next to the prompt/output file, .DIALECT.json)",
    )
    p.add_argument(
        "--role",
        choices=("user", "system", "developer"),
        default="user",
        help="message role that carries the prefix in the fragment (default user: the changing part is "
        "appended to the same message, as `tokenseam eval` does)",
    )
    p.add_argument(
        "--write",
        metavar="NAME",
        default=None,
        help="write option (TTL) the fragment asks for, e.g. 5m or 1h for Anthropic, 30m or 12h for GPT-5.6 "
        "(default: the profile's first)",
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="cache economics of a prompt prefix for a provider profile",
        description="Cost per call and per month of a prompt prefix uncached, cached as is and padded to the "
        "cache floor, with the verdict per write option. Give PROMPT_FILE, or --from-log with a request log.",
    )
    p.add_argument(
        "prompt_file",
        metavar="PROMPT_FILE",
        nargs="?",
        default=None,
        help="the fixed prompt prefix (UTF-8 text)",
    )
    add_common(p, profile_required=False)
    p.add_argument(
        "--from-log",
        metavar="REQUESTS.jsonl",
        default=None,
        help='a request log: one JSON per line, {"ts": TIME, "body": REQUEST} or a request body with a '
        '"timestamp" field (TIME: Unix seconds or ISO 8601); OpenAI and Anthropic request bodies. Requests are '
        "grouped by model and shared stable prefix, and each group is planned at its own call rate",
    )
    p.add_argument(
        "--min-shared-tokens",
        type=non_negative_int,
        default=256,
        metavar="N",
        help="--from-log: requests join a group when they share at least N prefix tokens (default 256)",
    )
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
    add_emit(p)
    p.set_defaults(func=run)


def plan_for(profile, p: int, exact: bool, calls_per_hour: float | None, price_per_mtok: float | None):
    """make_plan with the profile's figures; an approximate count plans against its worst case."""
    from .counting import APPROX_REL_ERROR
    from .economics import make_plan

    return make_plan(
        p,
        profile.floor,
        profile.block,
        profile.read_multiplier,
        [(w.name, w.multiplier, w.ttl_seconds) for w in profile.writes],
        refresh_on_hit=profile.ttl_refresh_on_hit,
        calls_per_hour=calls_per_hour,
        price_per_mtok=price_per_mtok,
        rel_error=0.0 if exact else APPROX_REL_ERROR,
        explicit=profile.explicit,
    )


def emit_fragment(args: argparse.Namespace, profile, text: str, default_base) -> dict | None:
    """Write the --emit fragment for `text`; returns what the report says about it (None without --emit)."""
    from pathlib import Path

    from .errors import PlannerError
    from .fragments import breakpoints, make_fragment, write_fragment

    if args.emit is None:
        if args.emit_out or args.write:
            raise PlannerError("--emit-out and --write need --emit openai|anthropic|gemini")
        return None
    frag = make_fragment(args.emit, text, profile, profile.write(args.write), args.role)
    base = Path(default_base)
    out = Path(args.emit_out) if args.emit_out else base.with_name(base.stem + f".{args.emit}.json")
    try:
        write_fragment(frag, out)
    except OSError as e:
        raise PlannerError(f"cannot write {out}: {e}") from None
    return {"dialect": args.emit, "file": str(out), "breakpoints": breakpoints(frag), "fragment": frag}


def build_report(args: argparse.Namespace) -> dict:
    from .counting import make_counter
    from .errors import PlannerError
    from .inputs import read_text_file
    from .profiles import load_profiles

    if (args.prompt_file is None) == (args.from_log is None):
        raise PlannerError("give either PROMPT_FILE or --from-log REQUESTS.jsonl")
    if args.profile is None and args.prompt_file is not None:
        raise PlannerError("--profile is required with PROMPT_FILE (a profile or a model name)")
    profiles = load_profiles(args.profiles)
    if args.from_log is not None:
        from .reqlog import plan_log

        if args.emit:
            raise PlannerError("--emit works on one prompt (PROMPT_FILE), not on --from-log")
        return plan_log(args, profiles)
    profile = profiles.get(args.profile)
    text = read_text_file(args.prompt_file, "prompt file")
    counter = make_counter(args.tokenizer, profile.tokenizer, args.leading_tokens)
    p = counter.count(text)
    plan = plan_for(profile, p, counter.exact, args.calls_per_hour, args.price_per_mtok)
    rep = {
        "prompt_file": str(args.prompt_file),
        "profile": profile.to_dict(),
        "count": counter.describe(text),
        "plan": plan.to_dict(),
    }
    frag = emit_fragment(args, profile, text.rstrip(), args.prompt_file)
    if frag is not None:
        rep["emitted"] = frag
    return rep


def _fmt(v, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


def print_report(rep: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=max(Console().width, 160))
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
    if not plan["count_exact"]:
        t.add_row(
            "worst case p",
            _fmt(plan["prefix_tokens_low"]),
            "the fewest tokens the count's error bound allows; cached as is only if this clears F",
        )
    t.add_row("floor F", _fmt(plan["floor"]), "under F nothing is cached")
    if plan["floor_effective"] != plan["floor"]:
        t.add_row("padding target floor", _fmt(plan["floor_effective"]), "F raised by the error bound")
    t.add_row(
        "caching",
        f"{prof['caching']}, {prof['granularity']}",
        f"breakpoint needed at the prefix end (max {prof['max_breakpoints']} per request)"
        if plan["explicit"]
        else "the provider finds shared prefixes itself",
    )
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
        "P(hit)",
        "uncached",
        "as is",
        "planned",
        "verdict",
        "pad pays from/h",
        "cache pays from/h",
        "pad pays from p",
        f"{unit} uncached",
        f"{unit} as is",
        f"{unit} pad",
    ):
        o.add_column(col, justify="right")
    for op in plan["options"]:
        be, ce = op["break_even_calls_per_hour"], op["caching_break_even_calls_per_hour"]
        key = "usd_per_month_" if money else "tokens_per_month_"
        o.add_row(
            f"{op['write_option']} x{op['write_multiplier']:g}",
            "none" if op["ttl_seconds"] is None else f"{op['ttl_seconds']:g}s",
            f"{op['hit_probability']:.3f}",
            _fmt(op["cost_uncached"]),
            _fmt(op["cost_as_is"]),
            _fmt(op["cost_planned"]),
            f"[green]{op['verdict']}[/green]" if "pad" in op["verdict"] else op["verdict"],
            "never" if be is None else _fmt(be, 2),
            "never" if ce is None else _fmt(ce, 2),
            _fmt(op["break_even_prefix"]),
            _fmt(op[key + "uncached"], 2 if money else 0),
            _fmt(op[key + "as_is"], 2 if money else 0),
            _fmt(op[key + "planned"], 2 if money else 0),
        )
    con.print(o)
    if prof.get("confirmed") is False:
        con.print(f"[yellow]unconfirmed figures:[/yellow] {prof['unconfirmed']}", highlight=False)
    if rep.get("emitted"):
        em = rep["emitted"]
        con.print(
            f"wrote the {em['dialect']} request fragment ({em['breakpoints']} breakpoint(s)) to {em['file']}",
            highlight=False,
        )
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
    elif "groups" in rep:
        from .reqlog import print_log_report

        print_log_report(rep)
    else:
        print_report(rep)
    return 0
