"""The compiled Triton matmuls' launch configuration per row count, and the FP-fusion setting of every launch.

Pure Python (no Triton import): the self-check's probes read the boundaries below on machines without Triton.

A row's reduction order in the fixed-order matmul depends on BLOCK_K alone, but the tile a row lands in
decides the tensor-core instruction Triton emits for the `tl.dot` (`flakecheck kernels compile` lists it per
GPU target: on sm_90 `mma.sync` for 16-row tiles and `wgmma` for 64- and 128-row ones, on sm_100 `mma.sync`
then `tcgen05.mma`). Whether two instructions sum a row's products in the same order is not documented, so the
self-check probes row counts on both sides of every M where the configuration changes (`boundary_rows`).

num_warps: 8 for the 64- and 128-row tiles — with 4 they spill registers on sm_80 and sm_90 (ptxas, measured
by the compile check); 128x64 rather than 128x128 for the largest, which spills even with 8 warps there.
"""

from __future__ import annotations

from typing import NamedTuple

# FMA contraction off on every launch: `a * b + c` rounds twice, as written, on every target and Triton version
# (Triton 3.9 contracts by default and 3.10 will not; an unpinned default would change the kernels' bits).
FP_FUSION = False
# the row counts the boundaries are searched over: past the engine's largest step (a plan's 2048 rows)
MAX_ROWS = 4096


class MatmulTiles(NamedTuple):
    block_m: int
    block_n: int
    num_warps: int


def matmul_tiles(m: int) -> MatmulTiles:
    """The compiled matmuls' output tile and warps for an M-row call (fixed-order and split-K alike)."""
    if m <= 16:
        return MatmulTiles(16, 64, 4)
    return MatmulTiles(64, 64, 8) if m <= 128 else MatmulTiles(128, 64, 8)


def attention_warps(head_dim: int) -> int:
    """The attention kernel's warps: a 64-key block of 256-wide heads (Gemma 3) spills registers with 4 on
    every target, and since the kernel reads a sliding window's first key so do 64-wide heads (SmolLM2) on sm_80
    and sm_90 (the compile check); the split's reduction order is the same for every batch either way."""
    return 4 if head_dim < 64 else 8


def tile_boundaries(max_rows: int = MAX_ROWS) -> tuple[int, ...]:
    """Every M whose configuration differs from M + 1's: an instruction can change only there."""
    return tuple(m for m in range(1, max_rows) if matmul_tiles(m) != matmul_tiles(m + 1))


def boundary_rows(backend: str, interpreted: bool) -> tuple[int, ...]:
    """Row counts the matmul probes add for the compiled Triton kernels: M and M + 1 at every boundary
    (none for the torch twins, nor under the interpreter, which runs no tensor-core instruction)."""
    if backend != "triton" or interpreted:
        return ()
    return tuple(sorted({r for m in tile_boundaries() for r in (m, m + 1)}))
