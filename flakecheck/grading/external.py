"""An external grader process (`--grader CMD`): how suites whose verdicts need the user's own code (a
HumanEval-style suite graded by running the completion against tests in the user's sandbox) get verdicts,
while flakecheck itself never runs suite code.

Protocol: flakecheck starts CMD once (an argv list; a string is split the way a POSIX shell splits words,
but no shell runs it), writes JSON Lines to its stdin and closes it, one line per distinct output of a case:

    {"case_id": "he-3", "composition": "batch8", "output": "...", "target": "..." | [...] | null,
     "metadata": {...}}

and reads JSON Lines from its stdout, one per input line, in any order:

    {"case_id": "he-3", "composition": "batch8", "passed": true}

`composition` is the run label (`batch8`, or `batch8 #1` for a repeat). Compositions that produced the same
text for a case are graded once (the line names the first of them) and share the verdict. Anything on the
grader's stderr is shown when it fails. A grader that cannot start, exits non-zero, runs past its timeout,
prints a line that is not such an object, or leaves out, repeats or invents a (case_id, composition) is a
GraderError (exit 2); the caller keeps the generated outputs.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flakecheck.errors import UserError

DEFAULT_TIMEOUT_S = 600.0
STDERR_TAIL_CHARS = 2000


class GraderError(UserError):
    """The external grader failed or answered wrongly: exit 2, with what it said."""


@dataclass(frozen=True)
class GraderSpec:
    argv: tuple[str, ...]
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def to_dict(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "timeout_s": self.timeout_s}


@dataclass(frozen=True)
class GradeRequest:
    case_id: str
    composition: str
    output: str
    target: str | list[str] | None
    metadata: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps({"case_id": self.case_id, "composition": self.composition, "output": self.output,
                           "target": self.target, "metadata": self.metadata}, ensure_ascii=False, default=str)


def grader_argv(command: str | Sequence[str]) -> tuple[str, ...]:
    """A --grader command as argv: a string is split the way a POSIX shell splits words (no shell runs it)."""
    if isinstance(command, str):
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise UserError(f"--grader {command!r}: cannot split into arguments ({exc})") from None
    else:
        argv = [str(a) for a in command]
    if not argv:
        raise UserError("--grader: the command is empty")
    return tuple(argv)


def check_timeout(timeout_s: float) -> float:
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or not timeout_s > 0:
        raise UserError(f"--grader-timeout must be a positive number of seconds, got {timeout_s!r}")
    return float(timeout_s)


def grader_spec(command: str | Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S) -> GraderSpec:
    """Check a --grader command before anything runs: it splits into argv and its program exists."""
    argv = grader_argv(command)
    timeout_s = check_timeout(timeout_s)
    program = argv[0]
    found = shutil.which(program) if os.sep not in program else (program if os.access(program, os.X_OK) else None)
    if found is None:
        raise UserError(f"--grader: cannot run {program!r} (not found{' on PATH' if os.sep not in program else ''}"
                        f"{'' if os.sep not in program else ' or not executable'})")
    return GraderSpec(argv, timeout_s)


def run_grader(spec: GraderSpec, requests: Sequence[GradeRequest]) -> dict[tuple[str, str], bool]:
    """Every request's verdict by (case_id, composition), from one run of the grader process."""
    payload = "".join(r.to_json() + "\n" for r in requests)
    try:
        # a session of its own: on a timeout the grader's whole process group (its sandboxes too) is killed
        proc = subprocess.Popen(list(spec.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, encoding="utf-8", errors="replace",
                                start_new_session=True)
    except OSError as exc:
        raise GraderError(f"--grader {spec.command}: cannot start it ({exc.strerror or exc})") from None
    try:
        out, err = proc.communicate(payload, timeout=spec.timeout_s)
    except subprocess.TimeoutExpired:
        err = _kill(proc)
        raise GraderError(f"--grader {spec.command}: no answer within {spec.timeout_s:g} s "
                          f"(--grader-timeout){_stderr_tail(err)}") from None
    except BaseException:  # Ctrl-C: leave no grader running
        _kill(proc)
        raise
    if proc.returncode != 0:
        how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited with {proc.returncode}"
        raise GraderError(f"--grader {spec.command}: {how}{_stderr_tail(err)}")
    return parse_answers(spec.command, out, requests)


def parse_answers(command: str, stdout: str, requests: Sequence[GradeRequest]) -> dict[tuple[str, str], bool]:
    """The grader's JSON Lines against what was asked: each asked (case_id, composition) exactly once."""
    asked = {(r.case_id, r.composition) for r in requests}
    verdicts: dict[tuple[str, str], bool] = {}

    def fail(number: int, message: str) -> GraderError:
        return GraderError(f"--grader {command}: output line {number}: {message}")

    for number, line in enumerate(stdout.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise fail(number, f"not JSON ({exc.msg}): {line[:120]!r}") from None
        if not isinstance(obj, dict):
            raise fail(number, f"expected an object with case_id, composition and passed, got {line[:120]!r}")
        case_id, composition, passed = obj.get("case_id"), obj.get("composition"), obj.get("passed")
        if isinstance(case_id, int) and not isinstance(case_id, bool):
            case_id = str(case_id)
        if not isinstance(case_id, str) or not isinstance(composition, str):
            raise fail(number, "'case_id' and 'composition' must be strings, as they were sent")
        if not isinstance(passed, bool):
            raise fail(number, f"'passed' must be true or false, got {json.dumps(passed)}")
        key = (case_id, composition)
        if key not in asked:
            raise fail(number, f"case {case_id!r} under {composition!r} was not asked for")
        if key in verdicts:
            raise fail(number, f"a second verdict for case {case_id!r} under {composition!r}")
        verdicts[key] = passed
    missing = sorted(asked - set(verdicts))
    if missing:
        shown = ", ".join(f"{c!r} under {comp!r}" for c, comp in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise GraderError(f"--grader {command}: no verdict for {len(missing)} of {len(asked)} outputs: "
                          f"{shown}{more}")
    return verdicts


def _kill(proc: subprocess.Popen) -> str:
    """Kill the grader's process group; what it had written to stderr (bounded wait: a process that left the
    group may still hold the pipes)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    try:
        return proc.communicate(timeout=5)[1] or ""
    except (subprocess.TimeoutExpired, ValueError):
        return ""


def _stderr_tail(err: str | None) -> str:
    text = (err or "").strip()
    if not text:
        return ""
    if len(text) > STDERR_TAIL_CHARS:
        text = "…" + text[-STDERR_TAIL_CHARS:]
    return "; its stderr ends:\n" + text
