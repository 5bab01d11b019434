"""`tokenseam eval` end to end against a fake OpenAI-compatible server on 127.0.0.1 (resume, retries, errors),
`eval make-tasks` determinism, answer extraction, and one run on the real local model server."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tokenseam.cli import main
from tokenseam.planner import PlannerError
from tokenseam.planner.evaluate import LocalServer, read_results
from tokenseam.planner.stats import paired_summary
from tokenseam.planner.tasks import (
    GROUPS,
    extract_answer,
    is_correct,
    load_tasks,
    make_tasks,
    normalize,
    write_tasks,
)

from . import fake_openai

VAR_A = "Answer the question."
VAR_B = "EXAMPLES\nQ: Compute 2 + 2.\nA: 4"


@pytest.fixture
def setup(tmp_path):
    tasks = make_tasks(40, seed=3)
    write_tasks(tasks, tmp_path / "tasks.jsonl")
    (tmp_path / "A.txt").write_text(VAR_A + "\n")
    (tmp_path / "B.txt").write_text(VAR_B)
    srv, state = fake_openai.start([t.to_dict() for t in tasks])
    yield tmp_path, tasks, state, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _eval(tmp_path, url, *extra):
    return main(
        [
            "eval",
            "--tasks",
            str(tmp_path / "tasks.jsonl"),
            "--variant",
            str(tmp_path / "A.txt"),
            "--variant",
            str(tmp_path / "B.txt"),
            "--upstream",
            url,
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
            "--json",
            *extra,
        ]
    )


def _expected(tasks):
    a = [fake_openai.answers_right(VAR_A, t.id) for t in tasks]
    b = [fake_openai.answers_right(VAR_B, t.id) for t in tasks]
    return a, b


def test_eval_end_to_end(setup, capsys):
    tmp_path, tasks, state, url = setup
    assert _eval(tmp_path, url) == 0
    summary = json.loads(capsys.readouterr().out)
    a, b = _expected(tasks)
    want = paired_summary(a, b).to_dict()
    assert summary["overall"] == pytest.approx(want)
    assert summary["pairs"] == 40 and set(summary["groups"]) == set(GROUPS)
    for g in GROUPS:
        idx = [i for i, t in enumerate(tasks) if t.group == g]
        assert summary["groups"][g] == pytest.approx(
            paired_summary([a[i] for i in idx], [b[i] for i in idx]).to_dict()
        )
    out = tmp_path / "out"
    assert (out / "paired.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "summary.json").read_text())["overall"] == summary["overall"]
    assert len((out / "results.jsonl").read_text().splitlines()) == 80 and state.requests == 80
    # A second run asks nothing and reports the same.
    assert _eval(tmp_path, url) == 0
    assert json.loads(capsys.readouterr().out)["overall"] == summary["overall"] and state.requests == 80


def test_eval_resumes_after_outage(setup, capsys):
    tmp_path, tasks, state, url = setup
    state.fail_after = 30
    rc = _eval(tmp_path, url, "--retries", "1", "--concurrency", "2")
    err = capsys.readouterr().err
    assert rc == 1 and "failed after 2 attempts" in err and "rerun the same command to resume" in err
    saved = read_results(tmp_path / "out" / "results.jsonl")
    assert len(saved) == 30
    state.fail_after = None
    before = state.requests
    assert _eval(tmp_path, url) == 0
    assert state.requests - before == 50  # only the missing items were asked
    lines = (tmp_path / "out" / "results.jsonl").read_text().splitlines()
    keys = [(json.loads(x)["variant_sha"], json.loads(x)["task_id"]) for x in lines]
    assert len(keys) == 80 == len(set(keys))
    a, b = _expected(tasks)
    assert json.loads(capsys.readouterr().out)["overall"] == pytest.approx(paired_summary(a, b).to_dict())


def test_eval_torn_last_line_is_redone(setup, capsys):
    tmp_path, tasks, state, url = setup
    assert _eval(tmp_path, url, "--limit", "4") == 0
    res = tmp_path / "out" / "results.jsonl"
    lines = res.read_text().splitlines()
    res.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:25])  # crash mid-write
    before = state.requests
    assert _eval(tmp_path, url, "--limit", "4") == 0
    assert state.requests - before == 1
    assert len(res.read_text().splitlines()) == 8


def test_eval_retries_flaky_upstream_and_completions_endpoint(setup, capsys):
    tmp_path, tasks, state, url = setup
    state.flaky_every = 4
    assert _eval(tmp_path, url + "/v1/", "--endpoint", "completions", "--retries", "2") == 0
    assert state.answered == 80 and state.requests == 100  # 20 first attempts failed once, then succeeded
    a, b = _expected(tasks)
    assert json.loads(capsys.readouterr().out)["overall"]["both_right"] == paired_summary(a, b).both_right


def test_eval_regenerated_tasks_are_asked_again(setup, capsys):
    tmp_path, tasks, state, url = setup
    assert _eval(tmp_path, url, "--limit", "4") == 0
    # Same ids, other seed: the saved answers belong to other questions and must not be reused.
    other = make_tasks(40, seed=4)
    state.tasks.extend(t.to_dict() for t in other)
    write_tasks(other, tmp_path / "tasks.jsonl")
    before = state.requests
    assert _eval(tmp_path, url, "--limit", "4") == 0
    assert state.requests - before == 8


def test_eval_client_error_is_not_retried(setup, capsys):
    tmp_path, tasks, state, url = setup
    state.reject = True
    assert _eval(tmp_path, url, "--concurrency", "1") == 1
    assert "HTTP 400" in capsys.readouterr().err and state.requests <= 2


def test_eval_malformed_upstream_response(setup, capsys):
    tmp_path, tasks, state, url = setup
    state.garbage = True
    assert _eval(tmp_path, url, "--concurrency", "1", "--limit", "1") == 1
    assert "without choices[0] text" in capsys.readouterr().err


def test_eval_unreachable_upstream(setup, capsys):
    tmp_path, *_ = setup
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert (
        _eval(tmp_path, f"http://127.0.0.1:{port}", "--retries", "1", "--concurrency", "1", "--limit", "1")
        == 1
    )
    assert "ConnectError" in capsys.readouterr().err


def test_eval_refuses_mixing_runs(setup, capsys):
    tmp_path, tasks, state, url = setup
    assert _eval(tmp_path, url, "--limit", "2") == 0
    assert _eval(tmp_path, url, "--limit", "2", "--max-tokens", "5") == 2
    assert "holds results for max_tokens=32" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--variant", "A", "--upstream", "U"], "exactly two --variant"),
        (["--variant", "A", "--variant", "B"], "either --upstream URL or --model local"),
        (["--variant", "A", "--variant", "B", "--upstream", "U", "--model", "local"], "either --upstream"),
        (["--variant", "A", "--variant", "A", "--upstream", "U"], "identical"),
        (["--variant", "A", "--variant", "MISSING", "--upstream", "U"], "variant file not found"),
        (["--variant", "A", "--variant", "B", "--upstream", "ftp://x"], "http(s) URL"),
        (
            ["--variant", "A", "--variant", "B", "--upstream", "U", "--api-key-env", "TS_SURELY_UNSET_VAR"],
            "not set",
        ),
    ],
)
def test_eval_bad_flags(setup, capsys, args, needle):
    tmp_path, tasks, state, url = setup
    sub = {
        "A": str(tmp_path / "A.txt"),
        "B": str(tmp_path / "B.txt"),
        "U": url,
        "MISSING": str(tmp_path / "nope"),
    }
    rc = main(
        [
            "eval",
            "--tasks",
            str(tmp_path / "tasks.jsonl"),
            "--out",
            str(tmp_path / "o"),
            *[sub.get(a, a) for a in args],
        ]
    )
    assert rc == 2 and needle in capsys.readouterr().err
    assert state.requests == 0


def test_eval_argparse_errors(tmp_path, capsys):
    for argv, needle in (
        (["eval", "--limit", "0"], "--limit"),
        (["eval", "make-tasks"], "--out"),
        (["eval", "make-tasks", "--out", "x", "--n", "-1"], "--n"),
        (["eval", "--frob"], "--frob"),
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and needle in capsys.readouterr().err
    assert main(["eval", "--variant", "a"]) == 2 and "--tasks" in capsys.readouterr().err


@pytest.mark.parametrize(
    "body, needle",
    [
        ("", "holds no tasks"),
        ("{oops\n", "line 1: not valid JSON"),
        ("[1]\n", "expected an object"),
        ('{"id": "a", "input": "x"}\n', "'answer'"),
        ('{"id": "", "input": "x", "answer": "1"}\n', "'id'"),
        (
            '{"id": "a", "input": "x", "answer": "1"}\n{"id": "a", "input": "y", "answer": "2"}\n',
            "duplicate id",
        ),
        ('{"id": "a", "input": "x", "answer": "1", "group": 3}\n', "'group'"),
    ],
)
def test_malformed_tasks(tmp_path, body, needle):
    f = tmp_path / "t.jsonl"
    f.write_text(body)
    with pytest.raises(PlannerError, match=needle):
        load_tasks(f)


def test_make_tasks_deterministic_and_well_formed(tmp_path):
    files = []
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        p = tmp_path / f"{name}.jsonl"
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "tokenseam.cli",
                "eval",
                "make-tasks",
                "--out",
                str(p),
                "--seed",
                str(seed),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        files.append(p.read_bytes())
    assert files[0] == files[1] and files[0] != files[2]
    tasks = load_tasks(tmp_path / "a.jsonl")
    assert len(tasks) == 500 and len({t.id for t in tasks}) == 500
    assert {g: sum(t.group == g for t in tasks) for g in GROUPS} == dict.fromkeys(GROUPS, 125)
    for t in tasks:
        assert t.answer and is_correct(f"Answer: {t.answer}", t.answer)
        if t.group == "arithmetic":
            expr = t.input.removeprefix("Compute ").split(".")[0]
            assert str(eval(expr)) == t.answer  # noqa: S307 - our own generated digits and operators
        elif t.group == "sorting":
            items = t.answer.split(", ")
            key = int if items[0].isdigit() else str
            assert items == sorted(items, key=key)
        elif t.group == "reading_comprehension":
            passage = t.input.split("Passage: ")[1].split("\n\nQuestion:")[0]
            assert t.answer in passage
        else:
            assert t.answer in t.input
    # A smaller set is the same generator: its items are the first ones of each group.
    small = make_tasks(8, seed=7)
    assert [t.to_dict() for t in small] == [t.to_dict() for t in tasks[:8]]


def test_extraction_and_normalisation():
    assert extract_answer("The answer is 143.") == "143"
    assert extract_answer("Reasoning...\nAnswer: **Shanybel**") == "Shanybel"
    assert extract_answer("\n\n  `pencil`  \nmore") == "pencil"
    assert extract_answer("") == ""
    assert normalize("1,200.0") == "1200" and normalize("+007") == "7" and normalize("\u221258") == "-58"
    assert is_correct("Answer: 7,19 and 42", "7, 19, 42")
    assert not is_correct("19, 7, 42", "7, 19, 42")
    assert is_correct("BAKER.", "baker") and not is_correct("a baker", "baker")
    assert is_correct("1,637", "1637")


def test_local_server_wrapper_waits_for_health_and_stops(tmp_path):
    fake = Path(fake_openai.__file__)
    with LocalServer(
        cmd=[sys.executable, str(fake), "--port", "{port}"], log_path=tmp_path / "log", startup_timeout=60
    ) as srv:
        import httpx

        assert httpx.get(srv.base_url + "/health").status_code == 200
        proc = srv.proc
    assert proc.poll() is not None
    with pytest.raises(PlannerError, match="exited with code 3 before it was ready"):
        with LocalServer(cmd=[sys.executable, "-c", "raise SystemExit(3)"], startup_timeout=60):
            pass


@pytest.mark.server
@pytest.mark.model
def test_eval_against_real_local_server(tmp_path, capsys):
    write_tasks(make_tasks(8, seed=1), tmp_path / "tasks.jsonl")
    (tmp_path / "A.txt").write_text("Answer with the answer only.")
    (tmp_path / "B.txt").write_text(
        "Q: Compute 3 + 4. Reply with the number only.\nA: 7\n\nAnswer with the answer only."
    )
    rc = main(
        [
            "eval",
            "--tasks",
            str(tmp_path / "tasks.jsonl"),
            "--variant",
            str(tmp_path / "A.txt"),
            "--variant",
            str(tmp_path / "B.txt"),
            "--model",
            "local",
            "--out",
            str(tmp_path / "out"),
            "--limit",
            "4",
            "--max-tokens",
            "16",
            "--no-progress",
            "--json",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    s = json.loads(capsys.readouterr().out)
    o = s["overall"]
    assert s["pairs"] == 4 and o["both_right"] + o["both_wrong"] + o["a_only"] + o["b_only"] == 4
    recs = read_results(tmp_path / "out" / "results.jsonl")
    assert len(recs) == 8 and all(isinstance(r["output"], str) for r in recs.values())


def test_eval_with_an_emitted_fragment(setup, capsys):
    """Variant B is the request fragment `pad --emit openai` wrote: every B request carries its prefix and
    breakpoint with the task appended, and each result records the fragment's cache fields."""
    from tokenseam.planner.fragments import make_fragment, prefix_text
    from tokenseam.planner.profiles import load_profiles

    tmp_path, tasks, state, url = setup
    frag = make_fragment("openai", VAR_B, load_profiles().get("gpt-5.6"))
    (tmp_path / "B.json").write_text(json.dumps(frag))
    rc = main(
        [
            "eval",
            "--tasks",
            str(tmp_path / "tasks.jsonl"),
            "--variant",
            str(tmp_path / "A.txt"),
            "--variant",
            str(tmp_path / "B.json"),
            "--upstream",
            url,
            "--model",
            "gpt-5.6",
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
            "--json",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    a, b = _expected(tasks)
    assert summary["overall"] == pytest.approx(paired_summary(a, b).to_dict())
    frag_bodies = [x for x in state.bodies if isinstance(x["messages"][-1]["content"], list)]
    assert len(frag_bodies) == 40 and len(state.bodies) == 80
    for body in frag_bodies:
        assert (
            body["prompt_cache_options"] == {"mode": "explicit", "ttl": "30m"} and body["model"] == "gpt-5.6"
        )
        first, second = body["messages"][-1]["content"]
        assert first == {"type": "text", "text": VAR_B, "prompt_cache_breakpoint": {"mode": "explicit"}}
        assert second["text"].startswith("\n\n") and "prompt_cache_breakpoint" not in second
    recs = read_results(tmp_path / "out" / "results.jsonl")
    b_recs = [r for r in recs.values() if r["variant"] == "B.json"]
    assert len(b_recs) == 40
    for r in b_recs:
        assert r["fragment"]["breakpoints"] == 1
        assert r["fragment"]["request"] == {"prompt_cache_options": {"mode": "explicit", "ttl": "30m"}}
        assert r["fragment"]["markers"] == [{"prompt_cache_breakpoint": {"mode": "explicit"}}]
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert prefix_text(run["fragments"]["B.json"]) == VAR_B
    # A rerun asks nothing; an edited fragment is a new variant and is asked again.
    before = len(state.bodies)
    assert _eval_frag(tmp_path, url) == 0 and len(state.bodies) == before
    frag["prompt_cache_options"]["mode"] = "implicit"
    (tmp_path / "B.json").write_text(json.dumps(frag))
    assert _eval_frag(tmp_path, url) == 0 and len(state.bodies) == before + 40


def _eval_frag(tmp_path, url, *extra):
    return main(
        [
            "eval",
            "--tasks",
            str(tmp_path / "tasks.jsonl"),
            "--variant",
            str(tmp_path / "A.txt"),
            "--variant",
            str(tmp_path / "B.json"),
            "--upstream",
            url,
            "--model",
            "gpt-5.6",
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
            "--json",
            *extra,
        ]
    )


@pytest.mark.parametrize(
    "content, extra, needle",
    [
        (None, [], "anthropic request fragment"),
        (
            '{"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}',
            ["--endpoint", "completions"],
            "need --endpoint chat",
        ),
        ("{oops", [], "not valid JSON"),
        ('{"model": "x"}', [], "not a request fragment"),
    ],
)
def test_eval_refuses_fragments_it_cannot_send(setup, capsys, content, extra, needle):
    from tokenseam.planner.fragments import make_fragment
    from tokenseam.planner.profiles import load_profiles

    tmp_path, tasks, state, url = setup
    if content is None:
        content = json.dumps(make_fragment("anthropic", VAR_B, load_profiles().get("claude-opus-5")))
    (tmp_path / "B.json").write_text(content)
    assert _eval_frag(tmp_path, url, *extra) == 2
    assert needle in capsys.readouterr().err and state.requests == 0
