"""`tokenseam bench grammar`: MaskBench-style correctness and mask-latency comparison of grammar engines.

Every engine is fed the same token sequences, single-threaded, each in its own child process, the engines
interleaved file by file (in turns of a few files with --busy-streams); results go to a table, JSON and a PNG
plot.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from ..argtypes import int_in_range

ENGINES = ("tokenseam", "tokenseam-any", "xgrammar", "llguidance")


class _Timeout(Exception):
    pass


def _alarm(_signum, _frame):
    raise _Timeout()


@contextlib.contextmanager
def _time_limit(timeout_s: float):
    """Raise _Timeout in the block once `timeout_s` pass (SIGALRM; the previous handler restored after)."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -- engine adapters --------------------------------------------------------------------------------------
class TokenseamEngine:
    """tokenseam's default: declared properties in schema order (what OpenAI's strict mode emits)."""

    name = "tokenseam"
    property_order = "schema"

    def __init__(self, vocab) -> None:
        from tokenseam.grammar import GrammarCompiler, GrammarError, GrammarMatcher

        self.vocab = vocab
        self.compiler = GrammarCompiler(vocab, cache_size=1)
        self.compiler.warm_up()  # numba code loaded before timing starts, as `tokenseam serve` does at startup
        self._matcher_cls = GrammarMatcher
        self.compile_errors = (GrammarError,)
        self.mask = np.zeros(vocab.mask_words, dtype=np.int32)

    def compile(self, schema):
        return self._matcher_cls(
            self.compiler.compile_json_schema(schema, property_order=self.property_order)
        )

    def fill(self, m) -> np.ndarray:
        m.fill_next_token_bitmask(self.mask)
        return self.mask

    def accept(self, m, tok: int) -> bool:
        return m.accept_token(tok)

    def accepting(self, m) -> bool:
        return m.is_accepting()

    def forget(self, cold: bool = False) -> None:
        """Drop the file's grammar from the compiler's cache (see run_file); `cold`: also the parsed patterns
        kept for the process, so that the file's next compile parses them again (first_mask)."""
        self.compiler.clear_cache()
        if cold:
            from tokenseam.grammar import regex

            regex.clear_caches()


class TokenseamAnyOrderEngine(TokenseamEngine):
    """tokenseam with `property_order="any"`: declared properties in any order, each at most once."""

    name = "tokenseam-any"
    property_order = "any"


class XGrammarEngine:
    name = "xgrammar"

    def __init__(self, vocab) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        enc = [b"" if vocab.is_special[i] else vocab.token_bytes[i] for i in range(vocab.size)]
        info = xgr.TokenizerInfo(
            enc, xgr.VocabType.RAW, vocab_size=vocab.size, stop_token_ids=sorted(vocab.eos_token_ids)
        )
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.compile_errors = (RuntimeError, ValueError)
        self.mask = xgr.allocate_token_bitmask(1, vocab.size)
        self.eos = sorted(vocab.eos_token_ids)[0]

    def compile(self, schema):
        cg = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=True, strict_mode=False)
        return self.xgr.GrammarMatcher(cg)

    def fill(self, m) -> np.ndarray:
        m.fill_next_token_bitmask(self.mask)
        return self.mask[0].numpy()

    def accept(self, m, tok: int) -> bool:
        return m.accept_token(tok)

    def accepting(self, m) -> bool:
        return m.accept_token(self.eos)


class LLGuidanceEngine:
    name = "llguidance"

    def __init__(self, vocab, tokenizer=None) -> None:
        import llguidance
        import llguidance.numpy as llnp

        self.ll = llguidance
        self.llnp = llnp
        self.tok = _llg_tokenizer(llguidance, vocab, tokenizer)
        self.compile_errors = (ValueError, RuntimeError)
        self.mask = llnp.allocate_token_bitmask(1, vocab.size)

    def compile(self, schema):
        grm = self.ll.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": True}
        )
        m = self.ll.LLMatcher(self.tok, grm)
        err = m.get_error()
        if err:
            raise ValueError(err)
        return m

    def fill(self, m) -> np.ndarray:
        self.llnp.fill_next_token_bitmask(m, self.mask, 0)
        return self.mask[0]

    def accept(self, m, tok: int) -> bool:
        return bool(m.consume_token(tok)) and not m.is_error()

    def accepting(self, m) -> bool:
        return bool(m.is_accepting())


def _llg_tokenizer(llguidance, vocab, tokenizer):
    tokens = [vocab.token_bytes[i] for i in range(vocab.size)]
    eos = sorted(vocab.eos_token_ids)[0]
    special = [i for i in range(vocab.size) if vocab.is_special[i]]
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_TokWrap(tokens, eos, special, tokenizer)))


class _TokWrap:
    """The duck-typed tokenizer llguidance wraps: raw token bytes plus our llama.cpp tokenize function."""

    def __init__(self, tokens, eos, special, tokenizer) -> None:
        self.tokens = tokens
        self.eos_token_id = eos
        self.bos_token_id = None
        self.special_token_ids = special
        self._tok = tokenizer

    def __call__(self, s):
        if isinstance(s, bytes):
            s = s.decode("utf-8", errors="replace")
        return self._tok.encode(s)


ADAPTERS = {
    "tokenseam": TokenseamEngine,
    "tokenseam-any": TokenseamAnyOrderEngine,
    "xgrammar": XGrammarEngine,
    "llguidance": LLGuidanceEngine,
}


# -- the benchmark ----------------------------------------------------------------------------------------
def load_files(data_dir: Path, limit: int | None = None) -> list[Path]:
    files = sorted(p for p in data_dir.iterdir() if p.is_file())
    if limit is not None and limit < len(files):
        # A deterministic spread over the sorted list, so a small sample still mixes every source.
        step = len(files) / limit
        files = [files[int(k * step)] for k in range(limit)]
    return files


def tokenize_tests(tokenizer, doc: dict) -> list[tuple[bool, list[int]]]:
    out = []
    for t in doc.get("tests", []):
        text = json.dumps(t["data"], ensure_ascii=False)
        out.append((bool(t["valid"]), tokenizer.encode(text)))
    return out


def first_mask(engine, schema, timeout_s: float) -> float | None:
    """One more cold compile and first mask of `schema`, in µs (None if it fails or times out), the engine's
    caches cleared after it: a repeat that run_file's own first mask is then taken with (--first-mask-repeats)."""
    try:
        with _time_limit(timeout_s):
            t0 = time.perf_counter()
            engine.fill(engine.compile(schema))
            return (time.perf_counter() - t0) * 1e6
    except Exception:  # noqa: BLE001 - run_file reports what goes wrong with this file
        return None
    finally:
        if hasattr(engine, "forget"):
            engine.forget(cold=True)


def run_file(
    engine,
    schema,
    tests,
    timeout_s: float,
    mask_times: list[float],
    accept_times: list[float] | None = None,
    more_first_masks: list[float | None] = (),
) -> dict:
    """Compile, then replay each test's tokens: mask, check the token is allowed, commit it. Mask times (and
    commit times, into `accept_times`) are appended in µs. With `more_first_masks` (first_mask's results for
    this file), the time to first mask is the median of those and this compile's, and `ttfm_runs_us` lists
    them."""
    res = {"status": "pass", "ttfm_us": None, "wrong_accepts": 0, "wrong_rejects": 0, "error": None}
    try:
        with _time_limit(timeout_s):
            t0 = time.perf_counter()
            try:
                m = engine.compile(schema)
                engine.fill(m)
            except engine.compile_errors as exc:
                res["status"] = "compile_error"
                res["error"] = str(exc)[:300]
                return res
            res["ttfm_us"] = (time.perf_counter() - t0) * 1e6
            if more_first_masks:
                runs = [t for t in more_first_masks if t is not None] + [res["ttfm_us"]]
                res["ttfm_runs_us"] = [round(t, 1) for t in runs]
                res["ttfm_us"] = statistics.median(runs)
            first = True
            for valid, toks in tests:
                if not first:
                    m = engine.compile(schema)
                first = False
                ok = True
                for tok in toks:
                    t1 = time.perf_counter()
                    mask = engine.fill(m)
                    mask_times.append((time.perf_counter() - t1) * 1e6)
                    allowed = (int(mask[tok >> 5]) >> (tok & 31)) & 1
                    if not allowed:
                        ok = False
                        break
                    t1 = time.perf_counter()
                    taken = engine.accept(m, tok)
                    if accept_times is not None:
                        accept_times.append((time.perf_counter() - t1) * 1e6)
                    if not taken:
                        ok = False
                        break
                if ok:
                    ok = engine.accepting(m)
                if valid and not ok:
                    res["wrong_rejects"] += 1
                elif not valid and ok:
                    res["wrong_accepts"] += 1
            if res["wrong_accepts"] or res["wrong_rejects"]:
                res["status"] = "fail"
            # The file's grammar is freed here, outside any timing, as the other engines' matchers are when this
            # function returns: kept in tokenseam's compiler cache, it was freed while the next file compiled.
            if hasattr(engine, "forget"):
                engine.forget()
    except _Timeout:
        res["status"] = "timeout"
    except Exception as exc:  # noqa: BLE001 - an engine crash is a result, not a benchmark failure
        res["status"] = "crash"
        res["error"] = f"{type(exc).__name__}: {exc}"[:300]
    return res


def _pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def _dist(xs: list[float]) -> dict:
    return {"p50": _pct(xs, 50), "p99": _pct(xs, 99), "p99.9": _pct(xs, 99.9), "max": max(xs) if xs else None}


def summarize(
    name: str,
    results: list[dict],
    mask_times: list[float],
    peak_mb: float | None,
    accept_times: list[float] | None = None,
) -> dict:
    ttfm = [r["ttfm_us"] for r in results if r["ttfm_us"] is not None]
    return {
        "engine": name,
        "files": len(results),
        "passing": sum(r["status"] == "pass" for r in results),
        "compile_errors": sum(r["status"] == "compile_error" for r in results),
        "wrong_accepts": sum(r["wrong_accepts"] for r in results),
        "wrong_rejects": sum(r["wrong_rejects"] for r in results),
        "files_with_wrong_accepts": sum(r["wrong_accepts"] > 0 for r in results),
        "timeouts": sum(r["status"] == "timeout" for r in results),
        "crashes": sum(r["status"] == "crash" for r in results),
        "tokens": len(mask_times),
        "mask_us": _dist(mask_times),
        # Committing a token (accept_token): the other half of the per-token cost.
        "accept_us": _dist(accept_times or []),
        "ttfm_ms": {
            "p50": (_pct(ttfm, 50) or 0) / 1000 if ttfm else None,
            "p99": (_pct(ttfm, 99) or 0) / 1000 if ttfm else None,
        },
        "peak_mem_mb": peak_mb,
    }


def _rss_mb() -> float:
    """Peak resident memory of this process so far (MB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _say_failure(name: str, r: dict) -> None:
    if r["status"] != "pass":
        print(
            f"  {name} {r['file']}: {r['status']} wa={r['wrong_accepts']} wr={r['wrong_rejects']} "
            f"{r['error'] or ''}",
            file=sys.stderr,
        )


def print_table(summaries: list[dict]) -> None:
    cols = [
        "engine",
        "passing",
        "compile_errors",
        "wrong_accepts",
        "wrong_rejects",
        "timeouts",
        "crashes",
        "mask p50",
        "p99",
        "p99.9",
        "max",
        "ttfm p50",
        "ttfm p99",
        "accept p50",
        "p99",
        "p99.9",
        "peak MB",
    ]
    print(" | ".join(cols))
    for s in summaries:
        if s.get("status") in ("not installed", "crashed"):
            print(f"{s['engine']} | {s['status']} ({s['error']})")
            continue
        mk, tf, ac = s["mask_us"], s["ttfm_ms"], s["accept_us"]

        def f(x, nd=1):
            return "-" if x is None else f"{x:.{nd}f}"

        print(
            " | ".join(
                [
                    s["engine"],
                    f"{s['passing']}/{s['files']}",
                    str(s["compile_errors"]),
                    str(s["wrong_accepts"]),
                    str(s["wrong_rejects"]),
                    str(s["timeouts"]),
                    str(s["crashes"]),
                    f(mk["p50"]) + "us",
                    f(mk["p99"]) + "us",
                    f(mk["p99.9"]) + "us",
                    f(mk["max"]) + "us",
                    f(tf["p50"], 2) + "ms",
                    f(tf["p99"], 2) + "ms",
                    f(ac["p50"]) + "us",
                    f(ac["p99"]) + "us",
                    f(ac["p99.9"]) + "us",
                    f(s["peak_mem_mb"]),
                ]
            )
        )


def plot(summaries: list[dict], all_times: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, xs in all_times.items():
        if not xs:
            continue
        ys = np.sort(np.asarray(xs))
        axes[0].plot(ys, np.linspace(0, 1, len(ys)), label=name)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("mask time per token (us)")
    axes[0].set_ylabel("CDF")
    axes[0].legend()
    ok = [s for s in summaries if "status" not in s]
    names = [s["engine"] for s in ok]
    x = np.arange(len(names))
    for k, key in enumerate(("passing", "compile_errors", "wrong_accepts", "wrong_rejects")):
        axes[1].bar(x + k * 0.2, [s[key] for s in ok], width=0.2, label=key)
    axes[1].set_xticks(x + 0.3)
    axes[1].set_xticklabels(names)
    axes[1].legend()
    axes[1].set_title("files / tests")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="directory of MaskBench JSON files")
    parser.add_argument("--tokenizer", default="smollm2", help="smollm2, gemma3 or a GGUF path")
    parser.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help="comma-separated: " + ",".join(ENGINES) + " (tokenseam-any: property_order any)",
    )
    parser.add_argument("--limit", type=int, default=None, help="use a deterministic sample of N files")
    parser.add_argument("--timeout", type=float, default=60.0, help="per-file time limit in seconds")
    parser.add_argument("--out", default=None, help="write the JSON report here (a PNG plot next to it)")
    parser.add_argument("--verbose", action="store_true", help="print every file that does not pass")
    parser.add_argument(
        "--busy-streams",
        type=int_in_range("--busy-streams", 0, 16),
        default=0,
        metavar="N",
        help="time each engine while the embedded engine (SmolLM2, 1 thread) decodes N streams in the same "
        "process, as in `tokenseam serve` (default 0: a quiet process)",
    )
    parser.add_argument(
        "--first-mask-repeats",
        type=int_in_range("--first-mask-repeats", 1, 9),
        default=1,
        metavar="N",
        help="time each file's first mask N times, each compile cold (the engines taking turns), and keep "
        "the median: a shared machine's bursts then move the tail less (default 1)",
    )


class _EngineWorker:
    """One engine in a forked child that stays up for the whole run and compiles and replays the files it is
    sent one at a time: the parent hands each file to every engine in turn, so all engines are timed in the
    same stretch of the machine's speed (a shared machine drifts by tens of percent within minutes, more than
    the differences measured). Peak memory is the engine's own, and a crash stays in its child. With
    `busy_streams`, the child also runs the embedded engine decoding that many streams (bench/busy.py), paused
    but for the stretches the parent gives this engine (`resume` .. `pause`)."""

    def __init__(self, name: str, vocab, docs, timeout_s: float, tokenizer, busy_streams: int = 0) -> None:
        import multiprocessing as mp

        self.name = name
        self.results: list[dict] = []
        self.mask_times: list[float] = []
        self.accept_times: list[float] = []
        self.more: dict[int, list[float | None]] = {}  # file -> its first masks taken before run_file
        self.summary: dict | None = None  # set when the engine cannot run (not installed, crashed)
        self.busy_streams = busy_streams
        ctx = mp.get_context("fork")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=self._serve, args=(child, name, vocab, docs, timeout_s, tokenizer, busy_streams)
        )
        self._proc.start()
        child.close()
        ready = self._recv()
        if ready != "ready":
            self.summary = ready  # not installed, or crashed while starting
            self._stop()

    @staticmethod
    def _serve(conn, name, vocab, docs, timeout_s, tokenizer, busy_streams) -> None:
        from ..server.runtime import settle_serving_process

        busy = None
        try:
            try:
                engine = ADAPTERS[name](vocab, tokenizer) if name == "llguidance" else ADAPTERS[name](vocab)
            except ImportError as exc:
                conn.send({"engine": name, "status": "not installed", "error": str(exc)})
                return
            if busy_streams:
                from .busy import BusyEngine

                busy = BusyEngine(busy_streams)
                # Past the prompts' prefill, so the streams are decoding whenever this engine is timed.
                if not busy.wait_decoding() or not busy.pause():
                    raise RuntimeError(f"the {busy_streams} busy streams did not start decoding")
            # What is loaded now (vocabulary, tables, the engine's code, the busy engine's model) stays: the
            # collector and the switch interval (which decides how long a compile holding the interpreter lock
            # keeps the busy engine's thread waiting) are set as `tokenseam serve` sets them before serving.
            # Every engine gets the same treatment.
            settle_serving_process()
            base_rss = _rss_mb()
            conn.send("ready")
            while True:
                msg = conn.recv()
                if msg is None:
                    conn.send((base_rss, _rss_mb(), busy.tokens_per_second() if busy else None))
                    return
                if msg in ("resume", "pause"):
                    if busy is not None:
                        if msg == "resume":
                            busy.resume()
                        elif not busy.pause():
                            raise RuntimeError("the busy streams did not pause")
                    conn.send("ok")
                    continue
                k, more = msg
                path, schema, tests = docs[k]
                if more is None:  # a first mask only (--first-mask-repeats)
                    conn.send(first_mask(engine, schema, timeout_s))
                    continue
                masks: list[float] = []
                accepts: list[float] = []
                r = run_file(engine, schema, tests, timeout_s, masks, accepts, more)
                r["file"] = path.name
                conn.send((r, masks, accepts))
        except BaseException as exc:  # noqa: BLE001 - reported as the engine's crash
            conn.send({"engine": name, "status": "crashed", "error": repr(exc)})
        finally:
            if busy is not None:
                busy.close()
            conn.close()

    def _recv(self):
        try:
            return self._conn.recv()
        except EOFError:
            # The pipe closes as the child dies, before it is reaped: wait for its exit code.
            self._proc.join(timeout=30)
            return {"engine": self.name, "status": "crashed", "error": f"exit code {self._proc.exitcode}"}

    def _control(self, msg: str) -> None:
        if self.summary is None and self.busy_streams:
            self._conn.send(msg)
            got = self._recv()
            if isinstance(got, dict):
                self.summary = got
                self._stop()

    def resume(self) -> None:
        """This engine's turn: its busy streams decode (nothing without them)."""
        self._control("resume")

    def pause(self) -> None:
        """The end of its turn: its busy streams stop at their next step."""
        self._control("pause")

    def first_mask(self, k: int) -> None:
        """One more first mask of file k (first_mask), kept for its run_file."""
        if self.summary is not None:
            return
        self._conn.send((k, None))
        got = self._recv()
        if isinstance(got, dict):
            self.summary = got
            self._stop()
            return
        self.more.setdefault(k, []).append(got)

    def run_file(self, k: int, verbose: bool) -> None:
        if self.summary is not None:
            return
        self._conn.send((k, self.more.pop(k, [])))
        got = self._recv()
        if isinstance(got, dict):
            self.summary = got
            self._stop()
            return
        r, masks, accepts = got
        self.results.append(r)
        self.mask_times.extend(masks)
        self.accept_times.extend(accepts)
        if verbose:
            _say_failure(self.name, r)

    def finish(self) -> dict:
        """The engine's summary, once the child has reported its memory and exited."""
        if self.summary is None:
            self._conn.send(None)
            got = self._recv()
            self._stop()
            if isinstance(got, dict):
                return got
            base_rss, peak, busy_rate = got
            self.summary = summarize(
                self.name, self.results, self.mask_times, peak - base_rss, self.accept_times
            )
            self.summary["peak_rss_mb"] = peak
            if self.busy_streams:
                self.summary["busy_streams"] = self.busy_streams
                self.summary["busy_tokens_per_s"] = round(busy_rate, 1)
        return self.summary

    def _stop(self) -> None:
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()


# Files per turn beside busy streams: each engine's turn starts its streams and ends waiting for their step.
BUSY_TURN_FILES = 10


def _run_interleaved(engines: list[str], vocab, docs, args, tokenizer):
    """Every file through every engine before the next file (the engines' order rotating from file to file),
    each engine in its own child (_EngineWorker). Beside busy streams, a turn is BUSY_TURN_FILES files (each
    engine's streams decode only in its turns, so one engine is beside decoding streams at a time, and a
    switch waits for a decode step to end). With --first-mask-repeats N, the files are gone through N times:
    N - 1 passes of first masks, then the pass that runs each file's tests, so a file's first masks are
    taken minutes apart and a burst of the machine's load reaches one of them, not all."""
    busy = args.busy_streams
    workers = [_EngineWorker(name, vocab, docs, args.timeout, tokenizer, busy) for name in engines]
    wall = dict.fromkeys(engines, 0.0)
    turn = BUSY_TURN_FILES if busy else 1
    try:
        repeats = args.first_mask_repeats
        for r in range(repeats):  # each pass through every engine, the last one the files' runs
            for c, start in enumerate(range(0, len(docs), turn)):
                files = range(start, min(start + turn, len(docs)))
                for j in range(len(workers)):
                    w = workers[(c + r + j) % len(workers)]
                    t0 = time.time()
                    w.resume()
                    for k in files:
                        if r < repeats - 1:
                            w.first_mask(k)
                        else:
                            w.run_file(k, args.verbose)
                    w.pause()
                    wall[w.name] += time.time() - t0
                if (files[-1] + 1) // 50 > start // 50 or files[-1] + 1 == len(docs):
                    what = f"first masks {r + 1} of {repeats - 1}, " if r < repeats - 1 else ""
                    print(f"[{what}{files[-1] + 1}/{len(docs)} files]", file=sys.stderr)
        summaries = []
        for w in workers:
            summary = w.finish()
            summary["wall_s"] = round(wall[w.name], 2)
            summaries.append(summary)
    finally:
        for w in workers:
            if w._proc.is_alive():
                w._proc.kill()
    return summaries, {w.name: w.results for w in workers}, {w.name: w.mask_times for w in workers}


def run(args: argparse.Namespace) -> int:
    from tokenseam.models import resolve_model
    from tokenseam.vocab import Tokenizer, load_vocabulary

    data = Path(args.data)
    if not data.is_dir():
        print(f"error: --data {data} is not a directory", file=sys.stderr)
        return 2
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        print(f"error: unknown engine(s) {bad}; choose from {', '.join(ENGINES)}", file=sys.stderr)
        return 2
    if args.limit is not None and args.limit <= 0:
        print("error: --limit must be positive", file=sys.stderr)
        return 2
    try:
        vocab = load_vocabulary(args.tokenizer)
        tokenizer = Tokenizer.from_gguf(resolve_model(args.tokenizer))
    except Exception as exc:  # noqa: BLE001
        print(f"error: cannot load tokenizer {args.tokenizer!r}: {exc}", file=sys.stderr)
        return 2
    docs = []
    for p in load_files(data, args.limit):
        try:
            doc = json.loads(p.read_text())
            docs.append((p, doc["schema"], tokenize_tests(tokenizer, doc)))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"warning: skipping {p.name}: {exc}", file=sys.stderr)
    summaries, per_file, all_times = _run_interleaved(engines, vocab, docs, args, tokenizer)
    beside = (
        f", beside {args.busy_streams} streams decoding in the same process (tokens/s: "
        + ", ".join(f"{s['engine']} {s.get('busy_tokens_per_s', '-')}" for s in summaries)
        + ")"
        if args.busy_streams
        else ", single-threaded"
    )
    if len(engines) > 1:
        beside += (
            f", engines taking turns of {BUSY_TURN_FILES} files"
            if args.busy_streams
            else ", engines interleaved file by file"
        )
    if args.first_mask_repeats > 1:
        beside += f", first mask the median of {args.first_mask_repeats} cold compiles per file"
    print(f"MaskBench files: {len(docs)} from {data}, tokenizer {args.tokenizer}{beside}")
    print_table(summaries)
    shared = first_mask_on_shared_files(per_file)
    for row in shared:
        print(
            f"first mask on the {row['files']} files both compile: {row['engine']} p50 {row['p50_ms']:.2f} / "
            f"p99 {row['p99_ms']:.2f} ms, {row['anchor']} p50 {row['anchor_p50_ms']:.2f} / p99 "
            f"{row['anchor_p99_ms']:.2f} ms (ratio {row['p50_ratio']:.2f}x / {row['p99_ratio']:.2f}x)"
        )
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "data": str(data),
            "tokenizer": args.tokenizer,
            "files": len(docs),
            "limit": args.limit,
            "busy_streams": args.busy_streams,
            "first_mask_repeats": args.first_mask_repeats,
            "pid": os.getpid(),
            "summaries": summaries,
            "first_mask_shared": shared,
            "per_file": per_file,
        }
        out.write_text(json.dumps(report, indent=2))
        try:
            plot(summaries, all_times, out.with_suffix(".png"))
        except Exception as exc:  # noqa: BLE001 - the plot is a convenience; the JSON is the result
            print(f"warning: plot failed: {exc}", file=sys.stderr)
        print(f"wrote {out} and {out.with_suffix('.png')}")
    return exit_code(summaries)


def first_mask_on_shared_files(per_file: dict[str, list[dict]], anchor: str = "llguidance") -> list[dict]:
    """Time to first mask of each engine against the anchor's over the files both compiled: the summaries'
    percentiles run over each engine's own passing files, and an engine that refuses its slowest files (as
    llguidance does with several large schemas) shows a lower p99 for it."""
    ref = {r["file"]: r["ttfm_us"] for r in per_file.get(anchor, []) if r.get("ttfm_us") is not None}
    rows = []
    for name, results in per_file.items():
        mine = {r["file"]: r["ttfm_us"] for r in results if r.get("ttfm_us") is not None}
        files = sorted(mine.keys() & ref.keys())
        if name == anchor or not files:
            continue
        a = [mine[f] for f in files]
        b = [ref[f] for f in files]
        row = {"engine": name, "anchor": anchor, "files": len(files)}
        for q in (50, 99):
            row[f"p{q}_ms"] = _pct(a, q) / 1000
            row[f"anchor_p{q}_ms"] = _pct(b, q) / 1000
            row[f"p{q}_ratio"] = _pct(a, q) / _pct(b, q)
        rows.append(row)
    return rows


def exit_code(summaries: list[dict]) -> int:
    """1 when an engine's run crashed (its process died, or it raised on every file) or no engine ran at all
    (every one missing): a report that measured nothing must not read as a success. An engine that is not
    installed is skipped, not a failure."""
    crashed = [
        s["engine"]
        for s in summaries
        if s.get("status") == "crashed" or (s.get("files") and s.get("crashes") == s["files"])
    ]
    if crashed:
        print(f"error: engine run(s) crashed: {', '.join(crashed)}", file=sys.stderr)
        return 1
    if all(s.get("status") == "not installed" for s in summaries):
        print("error: none of the requested engines is installed", file=sys.stderr)
        return 1
    return 0
