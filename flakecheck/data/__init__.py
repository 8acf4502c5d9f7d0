"""The data a run reads and writes: suites, compositions, traces, the run directory and its record."""
