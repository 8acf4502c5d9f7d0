"""Kernels: the reductions of a forward pass under a policy (native, splitk, invariant)."""

from flakecheck.kernels.ops import AttentionBatch, Ops
from flakecheck.kernels.registry import BACKENDS, POLICIES, get_ops, resolve_backend

__all__ = ["AttentionBatch", "Ops", "BACKENDS", "POLICIES", "get_ops", "resolve_backend"]
