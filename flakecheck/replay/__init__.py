"""Replay: a suite's cases through the engine under batch compositions, physically (one composition at a
time, one forward pass a step) or simulated (every composition at once, bitwise the same), in shards."""

from flakecheck.replay.driver import replay_mode, replay_runs
from flakecheck.replay.requests import CaseRequest, FillerId, build_requests, is_filler, trace_of

__all__ = ["CaseRequest", "FillerId", "build_requests", "is_filler", "replay_mode", "replay_runs", "trace_of"]
