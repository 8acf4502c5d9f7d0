"""Kernels on the paths this machine's self-check verified, for tests that build Ops directly.

A property test of the fast paths would fail on a machine where flakecheck itself falls back to another
path; built through the self-check, the tests hold on any machine and test the paths a run would use.
"""

from __future__ import annotations

import functools

import torch

from flakecheck.engine.models import probe_dims
from flakecheck.engine.settings import EngineSettings
from flakecheck.engine.spec import conservative, resolve_engine
from flakecheck.kernels import Ops
from flakecheck.kernels.paths import KernelPaths
from flakecheck.kernels.policy import parse_policy
from flakecheck.kernels.registry import get_ops
from flakecheck.machine.invariance_probes import SMOLLM2, ProbeDims
from flakecheck.machine.selfcheck import Verification, verify


@functools.cache
def verified(policy: str, dims: ProbeDims = SMOLLM2, dtype: torch.dtype = torch.bfloat16) -> Verification:
    return verify(parse_policy(policy), dims, dtype)


def paths(*policies: str, dims: ProbeDims = SMOLLM2) -> KernelPaths:
    """The paths verified for every one of `policies` (each primitive on the safer of their choices)."""
    result = KernelPaths()
    for policy in policies:
        result = conservative(result, verified(policy, dims).paths)
    return result


def ops(policy: str, *also: str, profile: str = "h100", dims: ProbeDims = SMOLLM2) -> Ops:
    """The Ops of `policy` on the verified paths (of `also` too, for tests that run their orders)."""
    return get_ops(parse_policy(policy), "torch", profile, paths=paths(policy, *also, dims=dims))


def engine_ops(policy: str, config: object, dtype: str = "bfloat16") -> Ops:
    """A model's kernels as a run builds them: the spec resolved for its shapes on this machine."""
    return resolve_engine(EngineSettings(dtype=dtype, policy=parse_policy(policy)), probe_dims(config)).ops()
