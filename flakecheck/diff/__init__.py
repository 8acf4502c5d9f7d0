"""`flakecheck diff A B`: two versions of a suite, a prompt or a model, compared case by case with each side's own
batch-composition spread as the yardstick. side (a run directory's verdicts and answers per composition), pairing
(which case of A meets which of B), classify (regression / improvement / noise / same / changed-text), score (the
score change and its batch-noise interval), compare (the whole comparison), gate (exit 1 or 0), both (run two
suites under the same settings), and the renderers: terminal, markdown, json_report, html, junit."""
