"""Paired A/B evaluation of two prompt variants over an exact-match task set on an OpenAI-compatible endpoint.

Results are appended to a JSONL file as they arrive, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import httpx

from .errors import PlannerError
from .stats import paired_summary
from .tasks import Task, extract_answer, is_correct

RESULTS_FILE = "results.jsonl"
RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"
PLOT_FILE = "paired.png"
MAX_VARIANT_BYTES = 1024 * 1024


def variant_sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def task_sha(t: Task) -> str:
    return hashlib.sha256(f"{t.input}\x00{t.answer}".encode()).hexdigest()[:16]


def saved_result(results: dict[tuple[str, str], dict], variant_text: str, t: Task) -> dict | None:
    """The saved answer for (variant, task), unless the task with that id has since changed (e.g. a task set
    regenerated with another seed reuses ids): then it is stale and asked again."""
    rec = results.get((variant_sha(variant_text), t.id))
    if rec is None or rec.get("task_sha", task_sha(t)) != task_sha(t):
        return None
    return rec


def build_prompt(variant: str, task: Task, endpoint: str = "chat") -> str:
    """The text sent for one item: the variant, a blank line, the task input (the variant is the shared, cacheable
    prefix). On the completions endpoint "\\nAnswer:" is appended so a base model knows where to answer."""
    body = task.input if not variant.strip() else variant.rstrip() + "\n\n" + task.input
    return body + "\nAnswer:" if endpoint == "completions" else body


def api_root(url: str) -> str:
    """`http://host:port`, `.../v1` or `.../v1/` -> `.../v1` (where OpenAI-style routes live)."""
    u = url.strip().rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise PlannerError(f"--upstream must be an http(s) URL, got {url!r}")
    return u if u.endswith("/v1") else u + "/v1"


@dataclass
class Endpoint:
    base_url: str
    model: str | None = None
    api_key: str | None = None
    kind: str = "chat"  # "chat" -> /v1/chat/completions, "completions" -> /v1/completions
    max_tokens: int = 32
    timeout: float = 120.0
    retries: int = 3
    backoff: float = 0.5


class UpstreamClient:
    """One OpenAI-compatible endpoint: temperature 0, bounded retries on 5xx/429/connection errors."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        headers = {"Authorization": f"Bearer {ep.api_key}"} if ep.api_key else {}
        self.url = api_root(ep.base_url) + ("/chat/completions" if ep.kind == "chat" else "/completions")
        self._http = httpx.Client(timeout=ep.timeout, headers=headers)

    def close(self) -> None:
        self._http.close()

    def _body(self, prompt: str, fragment: dict | None = None) -> dict:
        body: dict = {"temperature": 0, "max_tokens": self.ep.max_tokens}
        if self.ep.model:
            body["model"] = self.ep.model
        if fragment is not None:
            # The fragment carries the cached prefix (and its breakpoint); the task goes after it.
            from .fragments import merge_fragment

            if self.ep.kind != "chat":
                raise PlannerError("a request-fragment variant needs --endpoint chat")
            body.update(merge_fragment(fragment, "openai", prompt))
        elif self.ep.kind == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    def complete(self, prompt: str, fragment: dict | None = None) -> str:
        """The answer to `prompt`; with `fragment`, `prompt` is the part appended after the fragment's prefix."""
        body = self._body(prompt, fragment)
        last = ""
        for attempt in range(self.ep.retries + 1):
            if attempt:
                time.sleep(self.ep.backoff * 2 ** (attempt - 1))
            try:
                r = self._http.post(self.url, json=body)
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if r.status_code >= 500 or r.status_code == 429:
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                continue
            if r.status_code >= 400:
                raise PlannerError(f"{self.url} rejected the request: HTTP {r.status_code}: {r.text[:300]}")
            try:
                choice = r.json()["choices"][0]
                text = choice["message"]["content"] if self.ep.kind == "chat" else choice["text"]
            except (ValueError, KeyError, IndexError, TypeError):
                raise PlannerError(
                    f"{self.url} returned a response without choices[0] text: {r.text[:300]}"
                ) from None
            return text or ""
        raise PlannerError(
            f"{self.url} failed after {self.ep.retries + 1} attempts; last error: {last}. "
            "Results so far are saved: rerun the same command to resume."
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """Runs `tokenseam serve` (or `cmd`, with "{port}" filled in) on a free loopback port until closed."""

    def __init__(
        self,
        model: str = "smollm2",
        cmd: list[str] | None = None,
        log_path: Path | None = None,
        startup_timeout: float = 300.0,
    ) -> None:
        self.port = _free_port()
        self.cmd = (
            [c.replace("{port}", str(self.port)) for c in cmd]
            if cmd
            else [
                sys.executable,
                "-m",
                "tokenseam.cli",
                "serve",
                "--model",
                model,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ]
        )
        self.log_path = log_path
        self.timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.base_url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LocalServer:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115 - closed in close()
        self._log = log
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.timeout
        with httpx.Client(timeout=2.0) as c:
            while True:
                code = self.proc.poll()
                if code is not None:
                    self.close()
                    raise PlannerError(
                        f"the local server exited with code {code} before it was ready"
                        + (f"; see {self.log_path}" if self.log_path else "")
                    )
                try:
                    if c.get(self.base_url + "/health").status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.close()
                    raise PlannerError(f"the local server did not answer /health within {self.timeout:g} s")
                time.sleep(0.2)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not subprocess.DEVNULL:
            self._log.close()

    def __exit__(self, *exc) -> None:
        self.close()


def read_results(path: Path) -> dict[tuple[str, str], dict]:
    """Saved results keyed by (variant sha, task id). A torn last line (crash mid-write) is dropped and cut off."""
    out: dict[tuple[str, str], dict] = {}
    if not path.exists():
        return out
    data = path.read_bytes()
    good_end = data.rfind(b"\n") + 1
    if good_end < len(data):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    for n, line in enumerate(data[:good_end].decode("utf-8", "replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            out[(rec["variant_sha"], rec["task_id"])] = rec
        except (ValueError, KeyError, TypeError):
            raise PlannerError(
                f"{path} line {n} is not a result record; move the file away to start over"
            ) from None
    return out


def check_run_meta(out_dir: Path, meta: dict) -> None:
    """Refuse to mix results of a different model/endpoint into the same directory."""
    p = out_dir / RUN_FILE
    if p.exists():
        try:
            old = json.loads(p.read_text())
        except ValueError:
            old = None
        if not isinstance(old, dict):
            raise PlannerError(f"{p} is damaged; remove it (and {RESULTS_FILE}) or use another --out")
        for k in ("upstream", "model", "endpoint", "max_tokens"):
            if old.get(k) != meta.get(k):
                raise PlannerError(
                    f"{out_dir} holds results for {k}={old.get(k)!r}, this run has {meta.get(k)!r}: "
                    "use another --out directory"
                )
    p.write_text(json.dumps(meta, indent=2))


def run_pairs(
    tasks: list[Task],
    variants: list[tuple[str, str]],
    complete: Callable[[str], str],
    out_dir: Path,
    endpoint: str = "chat",
    concurrency: int = 4,
    progress: bool = True,
    fragments: dict[str, dict] | None = None,
) -> dict[tuple[str, str], dict]:
    """Ask for every (variant, task) not yet in results.jsonl; append each result as it arrives.

    `fragments` maps a variant's text (its canonical JSON) to a request fragment: that variant's requests are
    the fragment with the task appended (`complete(task_input, fragment)`), and each result records the
    fragment's cache fields."""
    fragments = fragments or {}
    out_dir.mkdir(parents=True, exist_ok=True)
    res_path = out_dir / RESULTS_FILE
    done = read_results(res_path)
    todo = [
        (label, text, t) for label, text in variants for t in tasks if saved_result(done, text, t) is None
    ]
    if not todo:
        return done
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    lock = threading.Lock()
    bar = Progress(
        TextColumn("A/B eval"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not progress,
    )

    def one(label: str, text: str, t: Task) -> dict:
        frag = fragments.get(text)
        output = complete(build_prompt(text, t, endpoint)) if frag is None else complete(t.input, frag)
        rec = {
            "variant": label,
            "variant_sha": variant_sha(text),
            "task_id": t.id,
            "task_sha": task_sha(t),
            "group": t.group,
            "answer": t.answer,
            "output": output,
            "extracted": extract_answer(output),
            "correct": is_correct(output, t.answer),
        }
        if frag is not None:
            from .fragments import fragment_cache_fields

            rec["fragment"] = fragment_cache_fields(frag)
        return rec

    failure: BaseException | None = None
    with bar, open(res_path, "a", encoding="utf-8") as f, ThreadPoolExecutor(max(1, concurrency)) as pool:
        job = bar.add_task("eval", total=len(todo))
        it = iter(todo)
        running: set[Future] = set()
        while True:
            while failure is None and len(running) < max(1, concurrency) * 2:
                nxt = next(it, None)
                if nxt is None:
                    break
                running.add(pool.submit(one, *nxt))
            if not running:
                break
            try:
                finished, running = wait(running, return_when=FIRST_COMPLETED)
            except BaseException:  # Ctrl-C: drop queued requests; what was written stays for the resume
                for fut in running:
                    fut.cancel()
                raise
            for fut in finished:
                try:
                    rec = fut.result()
                except BaseException as e:  # keep what finished; report the first failure after draining
                    failure = failure or e
                    continue
                with lock:
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    f.flush()
                done[(rec["variant_sha"], rec["task_id"])] = rec
                bar.advance(job)
    if failure is not None:
        raise failure
    return done


def summarize(
    tasks: list[Task], variants: list[tuple[str, str]], results: dict[tuple[str, str], dict]
) -> dict:
    """Paired summary overall and per group, over the items both variants have answered."""
    (la, ta), (lb, tb) = variants
    sa, sb = variant_sha(ta), variant_sha(tb)
    # Scored from the saved raw outputs, so a result file stays valid if the scoring rules are refined.
    pairs = []
    for t in tasks:
        ra, rb = saved_result(results, ta, t), saved_result(results, tb, t)
        if ra is not None and rb is not None:
            pairs.append((t.group, is_correct(ra["output"], t.answer), is_correct(rb["output"], t.answer)))
    groups = sorted({g for g, _, _ in pairs})
    out = {
        "variants": {"A": {"label": la, "sha": sa}, "B": {"label": lb, "sha": sb}},
        "pairs": len(pairs),
        "tasks": len(tasks),
    }
    if pairs:
        out["overall"] = paired_summary([a for _, a, _ in pairs], [b for _, _, b in pairs]).to_dict()
        out["groups"] = {
            g: paired_summary(
                [a for gg, a, _ in pairs if gg == g], [b for gg, _, b in pairs if gg == g]
            ).to_dict()
            for g in groups
        }
    return out


def plot_summary(summary: dict, path: Path) -> None:
    """Two panels: accuracy of A and B per group, and B - A with its 95 % CI (overall last)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [*summary.get("groups", {}).items(), ("overall", summary["overall"])]
    names = [r[0] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 0.6 * len(rows) + 2.2))
    ys = list(range(len(rows)))
    ax1.barh(
        [y + 0.2 for y in ys],
        [r[1]["accuracy_a"] for r in rows],
        height=0.4,
        label=f"A: {summary['variants']['A']['label']}",
    )
    ax1.barh(
        [y - 0.2 for y in ys],
        [r[1]["accuracy_b"] for r in rows],
        height=0.4,
        label=f"B: {summary['variants']['B']['label']}",
    )
    ax1.set_yticks(ys, names)
    ax1.set_xlim(0, 1)
    ax1.set_xlabel("accuracy (exact match)")
    ax1.legend(loc="lower right", fontsize=8)
    diffs = [r[1]["diff"] for r in rows]
    err = [
        [d - r[1]["ci_low"] for d, r in zip(diffs, rows, strict=True)],
        [r[1]["ci_high"] - d for d, r in zip(diffs, rows, strict=True)],
    ]
    ax2.errorbar(diffs, ys, xerr=err, fmt="o", capsize=4)
    ax2.axvline(0, color="grey", lw=1)
    ax2.set_yticks(ys, [f"{n} (McNemar p={s['mcnemar_exact_p']:.3g})" for n, s in rows])
    ax2.set_xlabel("accuracy B - A, 95 % CI (paired)")
    fig.suptitle(f"paired A/B on {summary['pairs']} items")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def api_key_from_env(var: str | None) -> str | None:
    if not var:
        return None
    v = os.environ.get(var)
    if v is None:
        raise PlannerError(f"--api-key-env {var}: that environment variable is not set")
    return v
