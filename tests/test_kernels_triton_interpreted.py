"""Run the Triton kernel tests on CPU under TRITON_INTERPRET=1, in a subprocess.

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

TESTS = Path(__file__).with_name("test_kernels_triton.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA: test_kernels_triton.py runs natively")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="already interpreted in this process")
def test_triton_kernels_under_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", str(TESTS)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=TESTS.parent.parent)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout.splitlines()[-1]
