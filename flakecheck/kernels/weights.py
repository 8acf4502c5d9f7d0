"""What a policy derives from a weight, made once when the model is built (not on first use).

`LinearWeights` holds a projection's weight and bias and the copies the CPU kernels read: an exact
fp16 pack for FBGEMM's fp16 GEMM (fixed-order and native matmuls) and an fp32 copy (split-K partial
GEMMs, and the fallback where the fp16 pack would not be exact).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Fp16Packed:
    """A weight packed for FBGEMM's fp16 GEMM (fp16 storage, fp32 products and accumulation),
    scaled by 2**shift so that every value is an exact fp16 normal number."""

    packed: Any  # weight * 2**shift, and the bias as it is
    unscale: float  # 2**-shift: (x * 2**-shift) @ (w * 2**shift).T + b == x @ w.T + b, exactly


FP16_MIN_EXP, FP16_MAX_EXP = -14, 15  # binades of fp16's normal numbers


def fp16_pack(weight: torch.Tensor, bias: torch.Tensor | None) -> Fp16Packed | None:
    """FBGEMM fp16 packing of a bf16/fp16 weight (and bias), or None where it would not be exact.

    A bf16 value has 8 significant bits and fp16 11, so a bf16 tensor whose nonzero magnitudes span
    at most 30 binades fits exactly in fp16 after one power-of-two scale; its products with bf16
    activations are then exact in fp32, and the result is what a bf16 GEMM with fp32 accumulation
    gives (up to summation order). None also where FBGEMM is missing."""
    if weight.device.type != "cpu" or weight.dtype == torch.float32:
        return None
    w32 = weight.detach().float()
    magnitudes = w32.abs()
    largest = float(magnitudes.max()) if magnitudes.numel() else 0.0
    if largest == 0.0 or not math.isfinite(largest):
        return None
    smallest = float(torch.where(magnitudes > 0, magnitudes, largest).min())  # no gather of the nonzeros
    top, bottom = math.floor(math.log2(largest)), math.floor(math.log2(smallest))
    shift = FP16_MIN_EXP - bottom
    if top + shift > FP16_MAX_EXP:
        return None
    scaled = w32 * 2.0**shift
    if not torch.equal(scaled.half().float(), scaled):
        return None
    b32 = None if bias is None else bias.detach().float()
    try:
        return Fp16Packed(torch.ops.quantized.linear_prepack_fp16(scaled, b32), 2.0**-shift)
    except (RuntimeError, AttributeError, NotImplementedError):  # a build without FBGEMM
        return None


@dataclass(frozen=True)
class LinearWeights:
    weight: torch.Tensor  # [N, K] in the model dtype
    bias: torch.Tensor | None
    w32: torch.Tensor | None  # fp32 contiguous copy (None where no kernel of the policy reads it)
    pack: Fp16Packed | None  # exact FBGEMM fp16 pack (None where not exact or not needed)

    @property
    def shape(self) -> tuple[int, int]:
        n, k = self.weight.shape
        return int(n), int(k)

    @classmethod
    def prepare(cls, weight: torch.Tensor, bias: torch.Tensor | None, fp32: bool, fp16: bool) -> LinearWeights:
        """The copies a policy's kernels read: `fp32` for split-K partials, `fp16` for FBGEMM; an fp32
        copy is also made where an fp16 pack was wanted but would not be exact."""
        weight = weight.detach().contiguous()
        pack = fp16_pack(weight, bias) if fp16 else None
        needs32 = fp32 or (fp16 and pack is None and weight.dtype != torch.float32)
        w32 = weight if weight.dtype == torch.float32 else (weight.float().contiguous() if needs32 else None)
        return cls(weight, bias, w32, pack)
