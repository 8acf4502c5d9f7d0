"""Tie vs near-tie vs confident flips (issue 10 §2): one ulp checked against numpy and torch, not against itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from flakecheck.analysis.flip_kind import FLIP_KINDS, classify_flip, dtype_name, ulp

TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def next_up(value: float, dtype: str) -> float:
    """The next representable number above `value` in `dtype` (torch's nextafter)."""
    x = torch.tensor([value], dtype=TORCH[dtype])
    return float(torch.nextafter(x, torch.full_like(x, float("inf")))[0])


@given(st.sampled_from(sorted(TORCH)), st.floats(1e-3, 6e4))
def test_one_ulp_is_the_gap_to_the_next_representable_number(dtype: str, raw: float) -> None:
    value = float(torch.tensor([raw], dtype=TORCH[dtype])[0])  # a number the dtype holds
    assert ulp(value, dtype) == next_up(value, dtype) - value
    assert ulp(-value, dtype) == ulp(value, dtype)


def test_ulp_agrees_with_numpy_spacing() -> None:
    for value in (0.3, 1.0, 5.0, 17.5, 1000.0):
        assert ulp(value, "float16") == float(np.spacing(np.float16(value)))
        assert ulp(value, "float32") == float(np.spacing(np.float32(value)))


def test_adjacent_bf16_logits_are_a_tie() -> None:
    low = 5.0
    high = next_up(low, "bfloat16")  # 5.03125: one bf16 step above
    assert classify_flip(high - low, high, "bfloat16", 0.05) == "tie"
    assert classify_flip(0.0, high, "bfloat16", 0.05) == "tie"


def test_two_bf16_steps_are_no_tie_and_the_threshold_decides() -> None:
    two_steps = 2 / 32  # logits in [4, 8) sit 1/32 apart in bf16
    assert classify_flip(two_steps, 5.0, "bfloat16", threshold=0.1) == "near_tie"
    assert classify_flip(two_steps, 5.0, "bfloat16", threshold=0.05) == "confident"


def test_the_logit_magnitude_sets_the_noise() -> None:
    # 1/8 is one bf16 step for logits in [16, 32) but four steps in [4, 8)
    assert classify_flip(0.125, 20.0, "bfloat16", 0.05) == "tie"
    assert classify_flip(0.125, 5.0, "bfloat16", 0.05) == "confident"
    # the runner-up's logit (top-1 − gap) can have the larger magnitude: −15.9 − 0.125 is in [16, 32)
    assert classify_flip(0.125, -15.9, "bfloat16", 0.05) == "tie"


def test_unknown_logit_claims_neither_tie_nor_confident_unless_it_holds_for_every_plausible_logit() -> None:
    one_step_at_1 = 2.0 ** -7  # bf16 spacing of [1, 2): a tie at any |logit| >= 1
    assert classify_flip(one_step_at_1, None, "bfloat16", 0.05) == "tie"
    assert classify_flip(1 / 32, None, "bfloat16", 0.05) == "near_tie"  # a tie only if |logit| >= 4: not claimed
    assert classify_flip(1 / 32, 5.0, "bfloat16", 0.05) == "tie"
    # 0.25 is above the threshold, but one bf16 step for logits in [32, 64): not flagged without the logit
    assert classify_flip(0.25, None, "bfloat16", 0.05) == "near_tie"
    assert classify_flip(0.25, 5.0, "bfloat16", 0.05) == "confident"
    assert classify_flip(0.25, 40.0, "bfloat16", 0.05) == "tie"
    assert classify_flip(0.75, None, "bfloat16", 0.05) == "confident"  # above one step even at |logit| 64
    assert classify_flip(0.1, None, "float32", 0.05) == "confident"  # fp32 noise is tiny at any magnitude


def test_fp32_and_fp16_noise() -> None:
    assert classify_flip(1e-3, 5.0, "float32", 0.05) == "near_tie"  # far above fp32's 5e-7 spacing
    assert classify_flip(1e-6, 5.0, "float32", 0.05) == "tie"  # within one ulp plus the fp32 slack
    assert classify_flip(2 ** -8, 5.0, "float16", 0.05) == "tie"  # fp16 spacing of [4, 8)
    assert classify_flip(2 ** -6, 5.0, "float16", 0.05) == "near_tie"


def test_no_gap_no_kind_and_dtype_spellings() -> None:
    assert classify_flip(None, 5.0, "bfloat16", 0.05) is None
    assert classify_flip(float("nan"), 5.0, "bfloat16", 0.05) is None
    assert [dtype_name(d) for d in ("torch.bfloat16", "bf16", "fp16", "float32")] == [
        "bfloat16", "bfloat16", "float16", "float32"]
    with pytest.raises(ValueError):
        dtype_name("int8")


@given(st.floats(0, 10), st.floats(0, 10), st.one_of(st.none(), st.floats(-40, 40)),
       st.sampled_from(sorted(TORCH)))
def test_a_larger_gap_is_never_a_closer_call(a: float, b: float, logit: float | None, dtype: str) -> None:
    small, large = sorted((a, b))
    rank = {kind: i for i, kind in enumerate(FLIP_KINDS)}
    if logit is not None:
        logit = abs(logit)  # same top-1 logit; the runner-up's moves further away as the gap grows
    assert rank[classify_flip(small, logit, dtype, 0.05)] <= rank[classify_flip(large, logit, dtype, 0.05)]
