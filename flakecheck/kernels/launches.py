"""Every launch configuration of the Triton kernels that the engine makes for a model's shapes.

A configuration is what Triton compiles once: the kernel, its constexprs, its warps and its argument types.
The runtime values (M, N, K, strides, split widths, program counts past the constexprs) do not change the
compiled code. The shapes come from transformers config objects (`ModelShapes.of`), never from weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import triton

from flakecheck.kernels.profiles import MAX_ROW_SPLITS
from flakecheck.kernels.tiles import MAX_ROWS, attention_warps, matmul_tiles, tile_boundaries
from flakecheck.kernels.triton_kernels import SPLIT_BLOCK_K, fixed_block_k, softmax_block

ATTENTION_BLOCK_N = 64  # attention_splits' default block of keys; every split size is a multiple of 64 keys
DTYPE = "bf16"  # the engine's default dtype; the fp32 dots compile to FMAs, not tensor-core instructions
MATMULS = ("_matmul_persistent_kernel", "_matmul_splitk_kernel")  # the kernels with a tl.dot


@dataclass(frozen=True)
class ModelShapes:
    """The shapes of a model that decide the Triton kernels' constexprs."""

    name: str
    source: str  # where the numbers come from
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    qk_norm: bool

    @classmethod
    def of(cls, name: str, source: str, config: Any, qk_norm: bool = False) -> ModelShapes:
        """From a transformers config object."""
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(name, source, config.hidden_size, config.intermediate_size, config.num_attention_heads,
                   config.num_key_value_heads, head_dim, config.vocab_size, qk_norm)

    @property
    def norm_widths(self) -> tuple[int, ...]:
        return (self.hidden, self.head_dim) if self.qk_norm else (self.hidden,)


def compiled_models() -> tuple[ModelShapes, ...]:
    """The models the compile check covers, each as the transformers config its checkpoint ships."""
    from transformers import Gemma3TextConfig, LlamaConfig

    smollm2 = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                          num_key_value_heads=3, vocab_size=49152)
    llama8b = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                          num_key_value_heads=8, vocab_size=128256)
    gemma = Gemma3TextConfig(hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
                             num_key_value_heads=1, head_dim=256, vocab_size=262144)
    return (ModelShapes.of("SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M-Instruct config.json", smollm2),
            ModelShapes.of("Llama-3.1-8B", "meta-llama/Llama-3.1-8B config.json", llama8b),
            ModelShapes.of("Gemma-3-270M", "google/gemma-3-270m config.json (q/k norms)", gemma, qk_norm=True))


@dataclass(frozen=True)
class Launch:
    """One compiled configuration: the kernel's name in triton_kernels, its constexprs and warps, the types of
    its pointer and float arguments (every other runtime argument is an i32), and the rows it serves."""

    kernel: str
    constexprs: tuple[tuple[str, Any], ...]
    num_warps: int
    pointers: tuple[tuple[str, str], ...]
    floats: tuple[str, ...] = ()
    rows: tuple[int, int] | None = None  # the matmuls: the first and last M launched with it
    fixed_order: bool = False  # a fixed-order policy's kernel (the persistent matmul, a norm of one part)

    @property
    def label(self) -> str:
        shown = [f"{k}={v}" for k, v in self.constexprs if k not in ("UPCAST", "HAS_BIAS", "NUM_PROGRAMS")]
        rows = ""
        if self.rows:
            lo, hi = self.rows
            rows = f" M {lo}+" if hi >= MAX_ROWS else f" M {lo}..{hi}"
        return f"{' '.join(shown)} warps={self.num_warps}{rows}"


def tile_classes() -> list[tuple[int, int]]:
    """The M ranges that share a matmul configuration (the last runs on past MAX_ROWS)."""
    edges = (0, *tile_boundaries(), MAX_ROWS)
    return [(lo + 1, hi) for lo, hi in zip(edges, edges[1:], strict=False)]


def launches(models: tuple[ModelShapes, ...], sms: int) -> list[Launch]:
    """Every distinct configuration the engine launches for these models (`sms`: the persistent matmul's
    program count, compiled at the target's SM count; it is only the tile loop's stride)."""
    found: dict[Launch, None] = {}
    mm = (("x_ptr", DTYPE), ("w_ptr", DTYPE), ("b_ptr", DTYPE), ("y_ptr", DTYPE))
    block_ks = sorted({fixed_block_k(k) for m in models for k in (m.hidden, m.heads * m.head_dim, m.intermediate)})
    for lo, hi in tile_classes():
        tiles = matmul_tiles(lo)
        for block_k in block_ks:
            found[Launch(MATMULS[0], (("HAS_BIAS", False), ("BLOCK_M", tiles.block_m), ("BLOCK_N", tiles.block_n),
                                      ("BLOCK_K", block_k), ("NUM_PROGRAMS", sms), ("UPCAST", False)),
                         tiles.num_warps, mm, rows=(lo, hi), fixed_order=True)] = None
        found[Launch(MATMULS[1], (("BLOCK_M", tiles.block_m), ("BLOCK_N", tiles.block_n), ("BLOCK_K", SPLIT_BLOCK_K),
                                  ("UPCAST", False)),
                     tiles.num_warps, (("x_ptr", DTYPE), ("w_ptr", DTYPE), ("ws_ptr", "fp32")), rows=(lo, hi))] = None
    for model in models:
        for parts in range(1, MAX_ROW_SPLITS + 1):  # 1: the fixed order; 2..: split-K's row splits
            for width in model.norm_widths:
                # a weight in the model dtype (Llama's epilogue), and one kept in fp32 (Gemma's 1 + w, OLMo 2)
                for scale_fp32, weight in ((False, DTYPE), (True, "fp32")):
                    found[Launch("_rmsnorm_kernel", (("BLOCK", triton.next_power_of_2(width)), ("PARTS", parts),
                                                     ("SCALE_FP32", scale_fp32)), 4,
                                 (("x_ptr", DTYPE), ("w_ptr", weight), ("y_ptr", DTYPE)), ("eps",),
                                 fixed_order=parts == 1)] = None
            found[Launch("_log_softmax_kernel", (("BLOCK", softmax_block(model.vocab)), ("PARTS", parts)),
                         4, (("x_ptr", DTYPE), ("y_ptr", "fp32")), fixed_order=parts == 1)] = None
        for capped in (False, True):  # Gemma 2's soft-capped scores
            found[Launch("_attention_split_kernel", (("D", model.head_dim), ("BLOCK_N", ATTENTION_BLOCK_N),
                                                     ("UPCAST", False), ("CAPPED", capped)),
                         attention_warps(model.head_dim),
                         (("q_ptr", DTYPE), ("k_ptr", DTYPE), ("v_ptr", DTYPE), ("row_slot_ptr", "i32"),
                          ("row_limit_ptr", "i32"), ("row_first_ptr", "i32"), ("m_ptr", "fp32"), ("l_ptr", "fp32"),
                          ("o_ptr", "fp32")), ("scale", "softcap"))] = None
    return list(found)

