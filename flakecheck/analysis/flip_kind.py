"""Tie flip or confident flip: the reference's top-1/top-2 gap at a case's first divergence, against the
numeric noise of the dtype its logits were computed in.

- `tie`: the gap is at most one ulp of the logits involved (plus a few fp32 ulps for the log-softmax
  arithmetic): the two candidates are equal or adjacent representable numbers, and any reordering of a
  reduction can swap them;
- `near_tie`: above one ulp but under the near-tie gap threshold (`--gap-threshold`) or within the noise the
  run itself measured (`gap_noise`: the largest shift of a top-1/top-2 gap between the reference and another
  composition at a step before they diverged, where both still read the same context): accumulated rounding
  noise of a few ulps, of the size the run saw elsewhere, flips it;
- `confident`: above both. No batch composition moved a gap that far anywhere else in the run, so these
  deserve a look: a bug (a kernel that is wrong, not just reordered), or a numeric difference larger than
  reduction order (another dtype, a quantised path, a different model or server build);
- `routing` (a mixture of experts): a gap that would be `confident`, where the diverging composition's router
  chose other experts than the reference's at that step or an earlier one (flakecheck.data.routing). Another
  expert is another computation, not a rounding: a near-tie in the router's scores flipped a token whose own
  top-1/top-2 gap is ordinary. A tie or near-tie gap keeps its kind even then (the gap explains the flip).

In bf16 the measured noise matters: rounding differences in 30 layers of bf16 activations move a logit of
~25 by several ulps (1/8 each), so a gap of two ulps is routinely flipped by reordering alone.

Logprob gaps equal logit gaps: log-softmax subtracts one constant from every logit of a row. One ulp depends
on the logit's magnitude (in bf16 it is 1/32 for logits in [4, 8), 1/8 in [16, 32)), so the classifier takes
the reference's top-1 logit at that step; the runner-up's logit is top-1 − gap and the larger magnitude of
the two sets the ulp. When the logit is unknown (a run directory without the `top1_logit` column, or a
server that reports only logprobs) neither strong claim is made unless it holds for every plausible
magnitude, |logit| in UNKNOWN_LOGIT_RANGE = [1, 64) (greedy top-1 logits of language models sit there):
`tie` only if the gap is within one ulp at |logit| = 1 (the smallest such ulp), `confident` only if it is
at or above the threshold and above one ulp at |logit| = 64 (the largest: 0.5 in bf16); every other gap is
a `near_tie`.
"""

from __future__ import annotations

import math

FLIP_KINDS = ("tie", "near_tie", "confident", "routing")
# explicit mantissa bits and the smallest normal exponent of each floating-point format
FORMATS = {"bfloat16": (7, -126), "float16": (10, -14), "float32": (23, -126)}
ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
UNKNOWN_LOGIT_RANGE = (1.0, 64.0)
FP32_SLACK_ULPS = 4  # the fp32 log-softmax and the stored fp32 logprobs round the gap by a few fp32 ulps


def dtype_name(dtype: str) -> str:
    """'bfloat16' | 'float16' | 'float32' from those names, 'torch.bfloat16', 'bf16', 'fp16', 'fp32'."""
    name = str(dtype).removeprefix("torch.").lower()
    name = ALIASES.get(name, name)
    if name not in FORMATS:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(FORMATS)}")
    return name


def ulp(value: float, dtype: str) -> float:
    """The spacing of `dtype`'s representable numbers at |value|: 2**(e - mantissa bits) for |value| in
    [2**e, 2**(e+1)), and the subnormal spacing below the smallest normal number."""
    bits, min_exponent = FORMATS[dtype_name(dtype)]
    magnitude = abs(value)
    exponent = math.frexp(magnitude)[1] - 1 if magnitude > 0 else min_exponent
    return 2.0 ** (max(exponent, min_exponent) - bits)


def noise_floor(gap: float, logit: float, dtype: str) -> float:
    """One ulp of the two candidates' logits in `dtype` plus the fp32 slack: the largest gap that is a tie."""
    magnitude = max(abs(logit), abs(logit - gap))
    return ulp(magnitude, dtype) + FP32_SLACK_ULPS * ulp(max(magnitude, 1.0), "float32")


def classify_flip(gap: float | None, logit: float | None, dtype: str, threshold: float,
                  gap_noise: float = 0.0, rerouted: bool = False) -> str | None:
    """'tie' | 'near_tie' | 'confident' | 'routing' for the reference's top-1/top-2 gap at a first divergence;
    None when there is no gap (no divergence, or the reference had ended there). `gap_noise`: the largest gap
    shift the run measured before any divergence (0 when unknown); `rerouted`: the diverging run's experts
    differed from the reference's at that step or before (a mixture of experts)."""
    if gap is None or not math.isfinite(gap):
        return None
    gap = max(gap, 0.0)
    if logit is not None and math.isfinite(logit):
        tie_below = above = noise_floor(gap, logit, dtype)
    else:  # unknown: a tie at the smallest plausible magnitude, no noise even at the largest
        tie_below, above = (noise_floor(gap, m, dtype) for m in UNKNOWN_LOGIT_RANGE)
    if gap <= tie_below:
        return "tie"
    if gap < threshold or gap <= max(above, gap_noise):
        return "near_tie"
    return "routing" if rerouted else "confident"
