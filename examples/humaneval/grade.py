#!/usr/bin/env python3
"""An example grader for `flakecheck run --grader`: YOUR grader, not part of flakecheck.

flakecheck never runs code from a suite. A code suite gets verdicts by handing its outputs to a grader
process the user owns, which decides how (and where) to execute them. This one grades HumanEval-style
cases: each case's metadata carries `entry_point` (the function's name) and `test` (a `check(f)` that
asserts on it). For every line flakecheck writes to stdin,

    {"case_id": ..., "composition": ..., "output": ..., "target": ..., "metadata": {...}}

it takes the first fenced code block of the output (or the whole output), appends the test and a call
`check(<entry_point>)`, runs that in a fresh `python -I` process in an empty temporary directory, with a
time limit, CPU and memory limits and no stdin, and prints

    {"case_id": ..., "composition": ..., "passed": true | false}

passed = the process exited 0 within the limit. These limits are NOT a sandbox: model output can still
read and write files, use the network and start processes as your user. Run real code suites inside a
container or VM you are prepared to lose, and grade from there.

    flakecheck run examples/humaneval/suite.jsonl --grader "python3 examples/humaneval/grade.py"
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import tempfile

TIMEOUT_S = 10
MEMORY_BYTES = 512 * 1024 * 1024
FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


def program(output: str, metadata: dict) -> str:
    block = FENCE.search(output)
    code = block.group(1) if block else output
    return f"{code}\n\n{metadata['test']}\n\ncheck({metadata['entry_point']})\n"


def limit_resources() -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (TIMEOUT_S, TIMEOUT_S))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def passes(source: str) -> bool:
    with tempfile.TemporaryDirectory() as workdir:
        try:
            done = subprocess.run([sys.executable, "-I", "-c", source], cwd=workdir, stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=TIMEOUT_S, preexec_fn=limit_resources,
                                  env={"PATH": os.environ.get("PATH", "")})
        except subprocess.TimeoutExpired:
            return False
    return done.returncode == 0


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        row = json.loads(line)
        verdict = passes(program(row["output"], row["metadata"]))
        print(json.dumps({"case_id": row["case_id"], "composition": row["composition"], "passed": verdict}),
              flush=True)


if __name__ == "__main__":
    main()
