"""The machine a run computes on: its reproducibility settings (pinned before torch loads), its
fingerprint, and the row-invariance properties verified on it."""
