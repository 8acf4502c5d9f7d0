"""Run the Triton kernel and engine tests on CPU under TRITON_INTERPRET=1, in a subprocess.

The variable must be set before the kernels are decorated, and setting it in this process would
switch every Triton kernel any later test touches to the interpreter; a child pytest keeps it
contained. On CUDA the tests run natively in the main process instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA: the files run natively")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="already interpreted in this process")
@pytest.mark.parametrize("tests", ["test_kernels_triton.py", "test_engine_triton.py"])
def test_triton_under_the_interpreter(tests: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", str(HERE / tests)],
                          env=env, capture_output=True, text=True, timeout=1200, cwd=HERE.parent)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout.splitlines()[-1]
