"""Eval-harness runs as input: inspect_ai logs and lm-evaluation-harness samples files.

harness log -> HarnessLog (what each sample sent, got and was scored; model.py) -> a suite that replays the
requests (to_suite.py) and, with two or more runs of one task, traces and the harness's verdicts -> the
analysis and run directory every report reads (to_run.py). `flakecheck import` is command.py.
"""
