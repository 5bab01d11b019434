"""`tokenseam eval`: paired A/B test of two prompt variants; `tokenseam eval make-tasks`: a seeded task set.

Table + JSON + PNG of flips, accuracies, McNemar's test and the paired 95 % CI, overall and per task group.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .cli_plan import positive_float


def _pos_int(lo: int, hi: int, name: str):
    from ..argtypes import int_in_range

    return int_in_range(name, lo, hi)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="paired A/B evaluation of two prompt variants (or `eval make-tasks` for a task set)",
        description="Run two prompt variants over an exact-match task set and compare them pairwise. "
        "`tokenseam eval make-tasks --out FILE` writes a seeded task set.",
    )
    p.add_argument(
        "--tasks", metavar="TASKS.jsonl", help='tasks: {"id", "group", "input", "answer"} per line'
    )
    p.add_argument(
        "--variant",
        action="append",
        metavar="FILE",
        default=[],
        help="prompt variant: a text file, or a request fragment (.json) written by `tokenseam pad/plan "
        "--emit openai`, whose prefix and breakpoint are merged into each request with the task appended; "
        "give exactly two (A then B)",
    )
    p.add_argument(
        "--upstream", metavar="URL", help="OpenAI-compatible base URL (http://host:port or .../v1)"
    )
    p.add_argument(
        "--api-key-env", metavar="VAR", default=None, help="environment variable holding the API key"
    )
    p.add_argument(
        "--model",
        metavar="NAME",
        default=None,
        help="model name sent upstream; `local` starts `tokenseam serve` on the bundled model instead",
    )
    p.add_argument(
        "--local-model", default="smollm2", help="model for --model local (smollm2, gemma3, .gguf path)"
    )
    p.add_argument(
        "--endpoint",
        choices=("chat", "completions"),
        default="chat",
        help="/v1/chat/completions (default) or /v1/completions",
    )
    p.add_argument("--out", metavar="DIR", default="eval-out", help="results directory (default ./eval-out)")
    p.add_argument(
        "--limit",
        type=_pos_int(1, 10**6, "--limit"),
        default=None,
        metavar="N",
        help="use only the first N tasks",
    )
    p.add_argument("--concurrency", type=_pos_int(1, 64, "--concurrency"), default=4, metavar="N")
    p.add_argument("--max-tokens", type=_pos_int(1, 4096, "--max-tokens"), default=32, metavar="N")
    p.add_argument(
        "--retries",
        type=_pos_int(0, 10, "--retries"),
        default=3,
        metavar="N",
        help="retries per request on 5xx, 429 and connection errors (default 3)",
    )
    p.add_argument("--timeout", type=positive_float, default=120.0, metavar="S", help="seconds per request")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)
    actions = p.add_subparsers(dest="eval_action", metavar="ACTION")
    m = actions.add_parser("make-tasks", help="write a reproducible (seeded) exact-match task set")
    m.add_argument("--out", dest="tasks_out", metavar="FILE", required=True, help="tasks JSONL to write")
    m.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    m.add_argument("--n", type=_pos_int(1, 100_000, "--n"), default=500, help="number of tasks (default 500)")
    m.set_defaults(func=run_make_tasks)


def run_make_tasks(args: argparse.Namespace) -> int:
    from collections import Counter

    from rich.console import Console

    from .tasks import make_tasks, write_tasks

    try:
        tasks = make_tasks(args.n, args.seed)
        write_tasks(tasks, args.tasks_out)
    except OSError as e:
        Console(stderr=True, soft_wrap=True).print(
            f"[red]error:[/red] cannot write {args.tasks_out}: {e}", highlight=False
        )
        return 2
    groups = Counter(t.group for t in tasks)
    Console(stderr=True, soft_wrap=True).print(
        f"wrote {len(tasks)} tasks to {args.tasks_out} (seed {args.seed}): "
        + ", ".join(f"{g} {c}" for g, c in groups.items()),
        highlight=False,
    )
    return 0


def _print_table(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=max(Console().width, 150))
    v = summary["variants"]
    t = Table(title=f"paired A/B: A = {v['A']['label']}, B = {v['B']['label']} ({summary['pairs']} pairs)")
    t.add_column("group", no_wrap=True)
    for col in (
        "n",
        "acc A",
        "acc B",
        "both right",
        "both wrong",
        "A only",
        "B only",
        "B - A [95% CI]",
        "McNemar exact p",
        "chi2 (cc) p",
    ):
        t.add_column(col, justify="right", no_wrap=col.startswith("B - A"))
    rows = [*summary.get("groups", {}).items(), ("overall", summary["overall"])]
    for name, s in rows:
        t.add_row(
            name,
            str(s["n"]),
            f"{s['accuracy_a']:.3f}",
            f"{s['accuracy_b']:.3f}",
            str(s["both_right"]),
            str(s["both_wrong"]),
            str(s["a_only"]),
            str(s["b_only"]),
            f"{100 * s['diff']:+.1f} pt [{100 * s['ci_low']:+.1f}, {100 * s['ci_high']:+.1f}]",
            f"{s['mcnemar_exact_p']:.3g}",
            f"{s['mcnemar_chi2_p']:.3g}",
            style="bold" if name == "overall" else None,
        )
    con.print(t)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .errors import PlannerError
    from .evaluate import (
        PLOT_FILE,
        SUMMARY_FILE,
        Endpoint,
        LocalServer,
        UpstreamClient,
        api_key_from_env,
        api_root,
        check_run_meta,
        plot_summary,
        run_pairs,
        summarize,
    )
    from .inputs import read_text_file
    from .tasks import load_tasks

    err = Console(stderr=True, soft_wrap=True)

    def fail(msg: str, code: int = 2) -> int:
        err.print(f"[red]error:[/red] {msg}", highlight=False)
        return code

    if not args.tasks:
        return fail("--tasks TASKS.jsonl is required (make one with `tokenseam eval make-tasks --out FILE`)")
    if len(args.variant) != 2:
        return fail(f"give exactly two --variant files (A and B), got {len(args.variant)}")
    local = args.model == "local"
    if local == bool(args.upstream):
        return fail("give either --upstream URL or --model local")
    out = Path(args.out)
    try:
        tasks = load_tasks(args.tasks)[: args.limit]
        variants, fragments, fragment_meta = [], {}, {}
        for f in args.variant:
            if str(f).endswith(".json"):
                from .fragments import canonical, load_fragment, prefix_text

                frag, dialect = load_fragment(f)
                if dialect != "openai":
                    return fail(
                        f"{f} is a {dialect} request fragment; eval talks to an OpenAI-compatible chat API, "
                        "so it can send only --emit openai fragments"
                    )
                key = canonical(frag)
                fragments[key] = frag
                fragment_meta[Path(f).name] = {"file": str(f), "prefix_chars": len(prefix_text(frag)), **frag}
                variants.append((Path(f).name, key))
            else:
                variants.append(
                    (Path(f).name, read_text_file(f, "variant file", max_bytes=1024 * 1024, allow_empty=True))
                )
        if fragments and args.endpoint != "chat":
            return fail("request-fragment variants need --endpoint chat")
        if variants[0][1] == variants[1][1]:
            return fail("the two variants are identical: there is nothing to compare")
        if args.upstream:
            api_root(args.upstream)  # reject a malformed URL before any work
        key = api_key_from_env(args.api_key_env)
        if out.exists() and not out.is_dir():
            return fail(f"--out {out} exists and is not a directory")
        out.mkdir(parents=True, exist_ok=True)
        meta = {
            "upstream": f"local:{args.local_model}" if local else args.upstream.rstrip("/"),
            "model": None if local else args.model,
            "endpoint": args.endpoint,
            "max_tokens": args.max_tokens,
            "tasks_file": str(args.tasks),
            "variants": {lbl: f for (lbl, _), f in zip(variants, args.variant, strict=True)},
        }
        if fragment_meta:
            meta["fragments"] = fragment_meta
        check_run_meta(out, meta)
    except PlannerError as e:
        return fail(str(e))
    except OSError as e:
        return fail(f"cannot use {out}: {e}")

    def go(base_url: str) -> dict:
        client = UpstreamClient(
            Endpoint(
                base_url,
                model=None if local else args.model,
                api_key=key,
                kind=args.endpoint,
                max_tokens=args.max_tokens,
                timeout=args.timeout,
                retries=args.retries,
            )
        )
        try:
            return run_pairs(
                tasks,
                variants,
                client.complete,
                out,
                args.endpoint,
                args.concurrency,
                progress=not args.no_progress,
                fragments=fragments,
            )
        finally:
            client.close()

    from .evaluate import RESULTS_FILE, read_results, saved_result

    try:
        done = read_results(out / RESULTS_FILE)
    except PlannerError as e:
        return fail(str(e))
    pending = sum(saved_result(done, text, t) is None for _, text in variants for t in tasks)
    import signal
    import threading

    def on_term(signum, frame):  # SIGTERM: unwind like Ctrl-C so the local server is stopped too
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)
    try:
        if not pending:
            results = done  # everything answered already: no server, no upstream calls
        elif local:
            with LocalServer(args.local_model, log_path=out / "server.log") as srv:
                results = go(srv.base_url)
        else:
            results = go(args.upstream)
    except PlannerError as e:
        return fail(str(e), 1)
    summary = summarize(tasks, variants, results)
    if not summary.get("pairs"):
        return fail("no paired results", 1)
    summary["plot"] = str(out / PLOT_FILE)
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
    plot_summary(summary, out / PLOT_FILE)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_table(summary)
        Console().print(
            f"wrote {out / SUMMARY_FILE}, {out / PLOT_FILE}, {out / 'results.jsonl'}", highlight=False
        )
    return 0
