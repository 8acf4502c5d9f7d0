"""Kernels: the reductions of a forward pass under a policy (native, splitk, invariant, or one per op class)."""

from flakecheck.kernels.layout import AttentionLayout, BatchLayout, Segment
from flakecheck.kernels.ops import Ops
from flakecheck.kernels.plan import FIXED, NATIVE, ModelDims, StepPlan, StepShape
from flakecheck.kernels.registry import BACKENDS, POLICIES, get_ops, resolve_backend

__all__ = ["AttentionLayout", "BACKENDS", "BatchLayout", "FIXED", "ModelDims", "NATIVE", "Ops", "POLICIES",
           "Segment", "StepPlan", "StepShape", "get_ops", "resolve_backend"]
