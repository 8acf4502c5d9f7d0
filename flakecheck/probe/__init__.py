"""`flakecheck probe`: diagnose a real OpenAI-compatible server at several load levels.

    from flakecheck.probe import ProbeConfig, probe_suite
    run = probe_suite(ProbeConfig("suites/demo.jsonl", "http://127.0.0.1:8000", concurrency=(1, 8)))
"""

from flakecheck.probe.probe import ProbeFailed, probe_suite
from flakecheck.probe.settings import ProbeConfig

__all__ = ["ProbeConfig", "ProbeFailed", "probe_suite"]
