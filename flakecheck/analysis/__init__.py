"""From traces to findings: first divergences, statuses, verdicts, flip kinds, the score's swing and flip
probability."""
