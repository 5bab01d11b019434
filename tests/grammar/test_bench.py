"""`tokenseam bench grammar`: argument errors, a tiny real run writing JSON and PNG, and an anchor that is
not installed reported as such instead of failing the run."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import pytest

from tokenseam.bench import grammar as bench

DATA = Path(__file__).resolve().parents[3] / "shared" / "benchdata" / "maskbench-dev"


def _args(**kw) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    argv = []
    for k, v in kw.items():
        argv += [f"--{k}", str(v)]
    return p.parse_args(argv)


def test_bad_arguments(tmp_path, capsys):
    assert bench.run(_args(data=tmp_path / "missing")) == 2
    assert bench.run(_args(data=tmp_path, engines="tokenseam,nope")) == 2
    assert bench.run(_args(data=tmp_path, limit=0)) == 2
    assert bench.run(_args(data=tmp_path, tokenizer="no-such-model", engines="tokenseam")) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.skipif(not DATA.is_dir(), reason="MaskBench dev split not present")
def test_small_run_writes_report(tmp_path, monkeypatch, capsys):
    class Missing:
        def __init__(self, *a, **k):
            raise ImportError("No module named 'xgrammar'")

    monkeypatch.setitem(bench.ADAPTERS, "xgrammar", Missing)
    out = tmp_path / "r.json"
    assert bench.run(_args(data=DATA, limit=3, engines="tokenseam,xgrammar", out=out)) == 0
    report = json.loads(out.read_text())
    by = {s["engine"]: s for s in report["summaries"]}
    assert by["xgrammar"]["status"] == "not installed"
    ts = by["tokenseam"]
    assert ts["files"] == 3 and ts["wrong_accepts"] == 0 and ts["tokens"] > 0
    assert ts["mask_us"]["p50"] is not None and ts["ttfm_ms"]["p50"] is not None
    # Every token that was allowed was committed, and each commit was timed.
    assert ts["accept_us"]["p50"] is not None and ts["accept_us"]["max"] >= ts["accept_us"]["p50"] > 0
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "not installed" in capsys.readouterr().out


def _mini_maskbench(path: Path, files: int = 2) -> Path:
    """`files` MaskBench-format files (the same each): a schema and instances marked valid or not."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 4}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    tests = [
        {"data": {"a": 1, "b": "xy"}, "valid": True},
        {"data": {"b": "xy", "a": 1}, "valid": True},  # another property order
        {"data": {"a": 1, "b": "too long"}, "valid": False},
    ]
    for i in range(files):
        (path / f"mini_{i}.json").write_text(json.dumps({"schema": schema, "tests": tests}))
    return path


def test_busy_streams_and_any_order_engine(tmp_path):
    data = _mini_maskbench(tmp_path)
    out = tmp_path / "r.json"
    args = _args(data=data, engines="tokenseam,tokenseam-any", out=out, **{"busy-streams": 1})
    assert bench.run(args) == 0
    report = json.loads(out.read_text())
    assert report["busy_streams"] == 1
    by = {s["engine"]: s for s in report["summaries"]}
    for s in by.values():  # (a run this short may see no decode step finish: tokens/s can be 0)
        assert s["files"] == 2 and s["wrong_accepts"] == 0 and s["busy_tokens_per_s"] >= 0
    assert by["tokenseam"]["wrong_rejects"] == 2  # schema order refuses the swapped instance of each file
    assert by["tokenseam-any"]["wrong_rejects"] == 0 and by["tokenseam-any"]["passing"] == 2


@pytest.mark.parametrize("bad", ["-1", "17", "x"])
def test_bad_busy_streams(bad):
    with pytest.raises(SystemExit):
        _args(**{"data": ".", "busy-streams": bad})


def test_the_busy_engine_decodes_until_closed():
    from tokenseam.bench.busy import BusyEngine

    busy = BusyEngine(2, max_tokens=8)  # short streams: each is replaced when it ends
    try:
        assert busy.wait_decoding(120)
        n = busy.tokens
        deadline = time.monotonic() + 120
        while busy.tokens < n + 20 and time.monotonic() < deadline:  # past the first streams' 8 tokens
            time.sleep(0.05)
        assert busy.tokens >= n + 20 and busy.tokens_per_second() > 0
    finally:
        busy.close()


def test_the_busy_engine_pauses_between_steps_and_resumes():
    from tokenseam.bench.busy import BusyEngine

    busy = BusyEngine(2, max_tokens=8)
    try:
        assert busy.wait_decoding(120)
        assert busy.pause(60)
        n = busy.tokens
        time.sleep(1.0)  # 2 streams decode ~20 tokens in that time when not paused
        assert busy.tokens == n
        assert busy.pause(1)  # pausing again is a no-op
        rate = busy.tokens_per_second()  # over the decoding stretch only: the paused second does not count
        busy.resume()
        deadline = time.monotonic() + 120
        while busy.tokens < n + 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert busy.tokens >= n + 20 and rate > 0
    finally:
        busy.close()


class _Crashing(bench.TokenseamEngine):
    """An engine whose compile raises something that is not a compile error, on every file."""

    def compile(self, schema):
        raise RuntimeError("engine bug")


class _Dying:
    """An engine whose process dies before it reports."""

    def __init__(self, *a, **k):
        import os

        os._exit(3)


@pytest.mark.parametrize("adapter", [_Crashing, _Dying])
def test_a_crashed_engine_fails_the_run(tmp_path, monkeypatch, capsys, adapter):
    monkeypatch.setitem(bench.ADAPTERS, "xgrammar", adapter)
    data = _mini_maskbench(tmp_path)
    assert bench.run(_args(data=data, engines="tokenseam,xgrammar")) == 1
    assert "crashed: xgrammar" in capsys.readouterr().err


def test_no_engine_installed_fails_the_run(tmp_path, monkeypatch, capsys):
    class Missing:
        def __init__(self, *a, **k):
            raise ImportError("No module named 'xgrammar'")

    monkeypatch.setitem(bench.ADAPTERS, "xgrammar", Missing)
    assert bench.run(_args(data=_mini_maskbench(tmp_path), engines="xgrammar")) == 1
    assert "none of the requested engines is installed" in capsys.readouterr().err


def _logged_engine(order: Path, forgets: bool = False) -> type:
    """A tokenseam engine that appends each compile (its engine's name) to `order`, and with `forgets` each
    cache clearing (forget-cold / forget-warm)."""

    class Logged(bench.TokenseamEngine):
        def compile(self, schema):
            with order.open("a") as f:
                f.write(f"{self.name}\n")
            return super().compile(schema)

        def forget(self, cold=False):
            if forgets:
                with order.open("a") as f:
                    f.write(f"forget-{'cold' if cold else 'warm'}\n")
            super().forget(cold)

    return Logged


def _logged_any_order(logged: type) -> type:
    """The any-order engine (`tokenseam-any`) of a `_logged_engine` class."""

    class LoggedAny(logged):
        name = "tokenseam-any"
        property_order = "any"

    return LoggedAny


def test_engines_run_interleaved_and_a_crash_stays_in_its_engine(tmp_path, monkeypatch):
    """Each file goes through every engine before the next file; an engine whose process dies on the second
    file is reported as crashed, and the others finish every file."""
    data = _mini_maskbench(tmp_path, files=3)
    order = tmp_path / "order.log"
    Logged = _logged_engine(order)

    class Dies(Logged):
        name = "xgrammar"
        calls = 0

        def compile(self, schema):
            Dies.calls += 1
            if Dies.calls == 4:  # the second file's first compile (each file compiles once per test)
                os._exit(3)
            return super().compile(schema)

    monkeypatch.setitem(bench.ADAPTERS, "tokenseam", Logged)
    monkeypatch.setitem(bench.ADAPTERS, "xgrammar", Dies)
    out = tmp_path / "r.json"
    bench.run(_args(data=data, engines="tokenseam,xgrammar", out=out))
    report = json.loads(out.read_text())
    by = {s["engine"]: s for s in report["summaries"]}
    assert by["xgrammar"]["status"] == "crashed" and "exit code 3" in by["xgrammar"]["error"]
    ts = by["tokenseam"]
    assert ts["files"] == 3 and ts["wrong_accepts"] == 0 and ts["tokens"] > 0 and ts["peak_rss_mb"] > 0
    # File 0: tokenseam then xgrammar (3 compiles each); file 1 starts with xgrammar (rotated), which dies.
    names = order.read_text().split()
    assert names[:6] == ["tokenseam"] * 3 + ["xgrammar"] * 3
    assert names[6:] == ["tokenseam"] * 6


def test_beside_busy_streams_engines_take_turns_and_only_one_decodes_at_a_time(tmp_path, monkeypatch):
    """With --busy-streams, each engine's child has its own decoding streams, running only in that engine's
    turns of BUSY_TURN_FILES files; the engines' order rotates from turn to turn."""
    from tokenseam.bench import busy as busy_mod

    data = _mini_maskbench(tmp_path, files=3)
    order = tmp_path / "order.log"
    Logged = _logged_engine(order)

    LoggedAny = _logged_any_order(Logged)

    class LoggedBusy(busy_mod.BusyEngine):  # forked into each engine's child with the module
        def resume(self):
            with order.open("a") as f:
                f.write(f"resume-{os.getpid()}\n")
            super().resume()

        def pause(self, timeout=60.0):
            ok = super().pause(timeout)
            with order.open("a") as f:
                f.write(f"pause-{os.getpid()}\n")
            return ok

    monkeypatch.setattr(busy_mod, "BusyEngine", LoggedBusy)
    monkeypatch.setattr(bench, "BUSY_TURN_FILES", 2)
    monkeypatch.setitem(bench.ADAPTERS, "tokenseam", Logged)
    monkeypatch.setitem(bench.ADAPTERS, "tokenseam-any", LoggedAny)
    out = tmp_path / "r.json"
    assert bench.run(_args(data=data, engines="tokenseam,tokenseam-any", out=out, **{"busy-streams": 1})) == 0
    by = {s["engine"]: s for s in json.loads(out.read_text())["summaries"]}
    assert all(
        s["files"] == 3 and s["busy_streams"] == 1 and s["busy_tokens_per_s"] >= 0 for s in by.values()
    )
    lines = order.read_text().split()
    pids = [x.split("-")[1] for x in lines if x.startswith("pause-")]
    a_pid, b_pid = pids[0], pids[1]  # each child pauses its streams once they decode, before the first turn
    assert a_pid != b_pid
    body = lines[2:]
    end = max(i for i, x in enumerate(body) if x.startswith("pause-")) + 1
    assert sorted(body[end:]) == sorted([f"resume-{a_pid}", f"resume-{b_pid}"])  # closing the streams
    turns, current = [], None
    for x in body[:end]:
        kind, _, who = x.partition("-")
        if kind == "resume":
            assert current is None  # no other engine's streams are decoding
            current = (who, [])
        elif kind == "pause":
            assert current is not None and current[0] == who
            turns.append(current)
            current = None
        else:
            assert current is not None  # every compile runs in a turn, beside its own streams
            current[1].append(x)
    t, a = "tokenseam", "tokenseam-any"
    # Files 0-1 (3 compiles each): tokenseam's turn, then tokenseam-any's; file 2: the order rotated.
    assert [c for _, c in turns] == [[t] * 6, [a] * 6, [a] * 3, [t] * 3]
    assert [who for who, _ in turns] == [a_pid, b_pid, b_pid, a_pid]


def test_first_mask_is_also_compared_on_the_files_both_engines_compile():
    from tokenseam.bench.grammar import first_mask_on_shared_files

    def rows(times):
        return [{"file": f, "ttfm_us": t} for f, t in times.items()]

    per_file = {
        "tokenseam": rows({"a": 2000.0, "b": 4000.0, "slow": 900_000.0, "gone": None}),
        "llguidance": rows({"a": 1000.0, "b": 1000.0, "slow": None, "gone": 500.0}),
        "xgrammar": rows({"gone": None}),
    }
    (row,) = first_mask_on_shared_files(per_file)
    assert (row["engine"], row["anchor"], row["files"]) == ("tokenseam", "llguidance", 2)
    assert row["p50_ms"] == 3.0 and row["anchor_p50_ms"] == 1.0 and row["p50_ratio"] == 3.0
    assert row["p99_ms"] < 4.0 and row["p99_ratio"] < 4.0  # the file llguidance refused is left out
    assert first_mask_on_shared_files({"tokenseam": per_file["tokenseam"]}) == []


def test_first_mask_repeats_take_turns_and_keep_the_median(tmp_path, monkeypatch):
    """With --first-mask-repeats 3, each file's first mask is taken twice more before its run, in two passes
    over all the files before the pass that runs them, every engine in turn (the order rotating from file to
    file and from pass to pass), each compile cold; the median of the three is kept."""
    data = _mini_maskbench(tmp_path)
    order = tmp_path / "order.log"
    Logged = _logged_engine(order, forgets=True)

    LoggedAny = _logged_any_order(Logged)
    monkeypatch.setitem(bench.ADAPTERS, "tokenseam", Logged)
    monkeypatch.setitem(bench.ADAPTERS, "tokenseam-any", LoggedAny)
    out = tmp_path / "r.json"
    assert (
        bench.run(_args(data=data, engines="tokenseam,tokenseam-any", out=out, **{"first-mask-repeats": 3}))
        == 0
    )
    report = json.loads(out.read_text())
    assert report["first_mask_repeats"] == 3
    for rows in report["per_file"].values():
        for r in rows:
            runs = r["ttfm_runs_us"]
            assert len(runs) == 3 and r["ttfm_us"] == pytest.approx(sorted(runs)[1], abs=0.1)
    a, b = "tokenseam", "tokenseam-any"
    ab, ba = [a, "forget-cold", b, "forget-cold"], [b, "forget-cold", a, "forget-cold"]
    passes = ab + ba + ba + ab  # files 0 and 1, then again with the order turned
    runs = [a, a, a, "forget-warm", b, b, b, "forget-warm", b, b, b, "forget-warm", a, a, a, "forget-warm"]
    assert order.read_text().split() == passes + runs


def test_first_mask_repeats_beside_busy_streams(tmp_path):
    out = tmp_path / "r.json"
    args = _args(data=_mini_maskbench(tmp_path), engines="tokenseam", out=out, **{"busy-streams": 1})
    args.first_mask_repeats = 2
    assert bench.run(args) == 0
    rows = json.loads(out.read_text())["per_file"]["tokenseam"]
    assert [len(r["ttfm_runs_us"]) for r in rows] == [2, 2]


@pytest.mark.parametrize("bad", ["0", "10", "x"])
def test_bad_first_mask_repeats(bad):
    with pytest.raises(SystemExit):
        _args(**{"data": ".", "first-mask-repeats": bad})


def test_a_compile_past_the_time_limit_is_a_timeout_and_the_alarm_is_restored():
    import signal

    class Slow:
        compile_errors = ()
        forgotten = 0

        def compile(self, schema):
            time.sleep(5)

        def forget(self, cold=False):
            self.forgotten += 1

    before = signal.getsignal(signal.SIGALRM)
    engine = Slow()
    assert bench.run_file(engine, {}, [], 0.05, [])["status"] == "timeout"
    assert bench.first_mask(engine, {}, 0.05) is None and engine.forgotten == 1
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
