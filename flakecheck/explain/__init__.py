"""Explaining a run's flips: which mechanism alone reproduces each one (`flakecheck explain`), the smallest
fix and what it costs, and a self-contained repro directory for one case (`flakecheck repro`)."""
