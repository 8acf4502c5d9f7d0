"""--grader (issue 10 §5): an external grader process that works, crashes, hangs, or prints garbage."""

from __future__ import annotations

import json
import os
import shlex
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flakecheck.analysis.verdicts import grade_traces
from flakecheck.data.rundir import load_run
from flakecheck.data.suite import Case
from flakecheck.data.traces import Trace
from flakecheck.errors import UserError
from flakecheck.grading.external import GradeRequest, GraderError, GraderSpec, grader_spec, run_grader
from flakecheck.replay import driver as replay_run
from flakecheck.replay import simulated
from tests.test_run import cli_run

REQUESTS = [GradeRequest("c1", "solo", "Paris", "Paris", {}), GradeRequest("c1", "batch8", "Lyon", "Paris", {}),
            GradeRequest("c2", "solo", "4", ["4", "four"], {"kind": "math"})]


def script(tmp_path: Path, name: str, body: str) -> GraderSpec:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return grader_spec([sys.executable, str(path)], timeout_s=20)


WORKING = """
    import json, sys
    for line in sys.stdin:
        row = json.loads(line)
        targets = row["target"] if isinstance(row["target"], list) else [row["target"]]
        print(json.dumps({"case_id": row["case_id"], "composition": row["composition"],
                          "passed": any(t in row["output"] for t in targets)}))
"""


def test_a_working_grader_gives_every_verdict(tmp_path: Path) -> None:
    verdicts = run_grader(script(tmp_path, "ok", WORKING), REQUESTS)
    assert verdicts == {("c1", "solo"): True, ("c1", "batch8"): False, ("c2", "solo"): True}


def test_the_grader_reads_exactly_the_protocol(tmp_path: Path) -> None:
    seen = tmp_path / "seen.jsonl"
    spec = script(tmp_path, "record", f"""
        import json, sys
        rows = [json.loads(line) for line in sys.stdin]
        open({str(seen)!r}, "w").write(json.dumps(rows))
        for r in rows:
            print(json.dumps({{"case_id": r["case_id"], "composition": r["composition"], "passed": True}}))
    """)
    run_grader(spec, REQUESTS)
    rows = json.loads(seen.read_text())
    assert rows[2] == {"case_id": "c2", "composition": "solo", "output": "4", "target": ["4", "four"],
                       "metadata": {"kind": "math"}}
    assert all(set(r) == {"case_id", "composition", "output", "target", "metadata"} for r in rows)


def test_a_crashing_grader_is_an_error_with_its_stderr(tmp_path: Path) -> None:
    spec = script(tmp_path, "crash", "import sys\nsys.stdin.read()\nraise RuntimeError('sandbox unavailable')\n")
    with pytest.raises(GraderError) as info:
        run_grader(spec, REQUESTS)
    assert info.value.exit_code == 2
    assert "exited with 1" in str(info.value) and "sandbox unavailable" in str(info.value)


def test_a_hanging_grader_times_out_and_leaves_nothing_running(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    spec = script(tmp_path, "hang", f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(120)
    """)
    spec = GraderSpec(spec.argv, timeout_s=3)
    with pytest.raises(GraderError, match=r"no answer within 3 s \(--grader-timeout\)"):
        run_grader(spec, REQUESTS)
    child = int(pid_file.read_text())
    for _ in range(100):  # the kill is sent; give the kernel a moment to reap the orphan
        if not _alive(child):
            break
        time.sleep(0.05)
    assert not _alive(child), "the grader's own child process survived the timeout"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state


@pytest.mark.parametrize("output, message", [
    ("hello\n", "output line 1: not JSON"),
    ('[1, 2]\n', "output line 1: expected an object"),
    ('{"case_id": "c1", "composition": "solo", "passed": "yes"}\n', "'passed' must be true or false"),
    ('{"case_id": "c9", "composition": "solo", "passed": true}\n', "'c9' under 'solo' was not asked for"),
    ('{"case_id": "c1", "composition": "solo", "passed": true}\n' * 2, "a second verdict for case 'c1'"),
    ('{"case_id": "c1", "composition": "solo", "passed": true}\n', "no verdict for 2 of 3 outputs"),
])
def test_garbage_and_incomplete_answers_are_errors(tmp_path: Path, output: str, message: str) -> None:
    spec = script(tmp_path, "garbage", f"import sys\nsys.stdin.read()\nsys.stdout.write({output!r})\n")
    with pytest.raises(GraderError, match=message.replace("(", r"\(")):
        run_grader(spec, REQUESTS)


def test_grader_commands_are_checked_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        grader_spec("no-such-grader-program --x")
    with pytest.raises(UserError, match="empty"):
        grader_spec("  ")
    with pytest.raises(UserError, match="cannot split"):
        grader_spec("python 'unclosed")
    with pytest.raises(UserError, match="--grader-timeout"):
        grader_spec([sys.executable], timeout_s=0)
    spec = grader_spec(f"{shlex.quote(sys.executable)} grade.py --strict 'two words'")
    assert spec.argv == (sys.executable, "grade.py", "--strict", "two words")  # argv, no shell


def test_identical_outputs_are_graded_once_and_share_the_verdict(tmp_path: Path) -> None:
    count = tmp_path / "count"
    spec = script(tmp_path, "count", f"""
        import json, sys
        rows = [json.loads(line) for line in sys.stdin]
        open({str(count)!r}, "w").write(str(len(rows)))
        for r in rows:
            print(json.dumps({{"case_id": r["case_id"], "composition": r["composition"],
                              "passed": r["output"] == "ab"}}))
    """)
    traces = [Trace("a", comp, rep, ids, ids, [0.0] * len(ids), ids, [0.0] * len(ids), "stop")
              for comp, rep, ids in (("solo", 0, [1, 2]), ("b8", 0, [1, 2]), ("b8", 1, [1, 3]), ("load", 0, [1, 2]))]
    case = Case("a", "q", (), (), None, {}, 1)
    verdicts = grade_traces(traces, [case], lambda ids: "".join("_ab"[i] if i < 3 else "c" for i in ids), spec)
    assert count.read_text() == "2"
    assert verdicts == {("a", "solo", 0): True, ("a", "b8", 0): True, ("a", "b8", 1): False, ("a", "load", 0): True}


# ------------------------------------------------------------------------------------- through `flakecheck run`


def _suite(tmp_path: Path) -> Path:
    path = tmp_path / "graded.jsonl"
    path.write_text("".join(json.dumps({"id": f"c{i}", "input": q, "target": "a"}) + "\n"
                            for i, q in enumerate(["What is 2 + 2?", "Name a colour.", "Capital of Italy?"])))
    return path


def _args(tmp_path: Path, model_dir: Path, out: Path, grader: str, *extra: str) -> list[str]:
    return ["run", str(_suite(tmp_path)), "--model", str(model_dir), "--out", str(out), "--kernels", "splitk",
            "--composition", "name=solo", "--composition", "name=b3,max_batch=3", "--max-tokens", "4",
            "--grader", grader, "--quiet", *extra]


def test_run_with_a_grader_records_its_verdicts(tiny_wide_model_dir, tmp_path, monkeypatch, capsys) -> None:
    grader = f"{shlex.quote(sys.executable)} {tmp_path / 'ok.py'}"
    (tmp_path / "ok.py").write_text(textwrap.dedent(WORKING))
    out = tmp_path / "graded"
    code, _, err = cli_run(monkeypatch, capsys, *_args(tmp_path, tiny_wide_model_dir, out, grader))
    assert code == 0, err
    run = load_run(out)
    assert run.meta["grader"] == {"argv": [sys.executable, str(tmp_path / "ok.py")], "timeout_s": 600.0}
    assert run.runs.passed.notna().all()
    assert list(run.runs.passed) == [("a" in text) for text in run.runs.text]


def test_a_failing_grader_keeps_the_outputs_and_resume_grades_them_without_replaying(
        tiny_wide_model_dir, tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "bad.py").write_text("print('not json')\n")
    (tmp_path / "ok.py").write_text(textwrap.dedent(WORKING))
    out = tmp_path / "kept"
    bad = f"{shlex.quote(sys.executable)} {tmp_path / 'bad.py'}"
    code, _, err = cli_run(monkeypatch, capsys, *_args(tmp_path, tiny_wide_model_dir, out, bad))
    flat = " ".join(err.split())
    assert code == 2 and "output line 1: not JSON" in flat
    assert f"kept in {out / 'partial'}" in flat and "--resume" in flat and "Traceback" not in err
    assert len(list((out / "partial").glob("*.parquet"))) == 2 and not (out / "runs.parquet").exists()

    replayed = lambda *a, **k: pytest.fail("resume replayed a composition")
    monkeypatch.setattr(replay_run, "replay", replayed)  # physical replay
    monkeypatch.setattr(simulated, "simulate", replayed)  # simulated replay
    good = f"{shlex.quote(sys.executable)} {tmp_path / 'ok.py'}"
    code, _, err = cli_run(monkeypatch, capsys, *_args(tmp_path, tiny_wide_model_dir, out, good, "--resume"))
    assert code == 0, err
    assert load_run(out).runs.passed.notna().all() and not (out / "partial").exists()
    assert os.path.basename(load_run(out).meta["grader"]["argv"][1]) == "ok.py"
