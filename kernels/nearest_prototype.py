"""Triton kernel: blocked nearest-prototype argmin (euclidean), running over prototype tiles.

For a block of BLOCK_N rows of z the program walks the m prototypes in tiles of BLOCK_M and
keeps, per row, the smallest and second-smallest value of

    d̃_ij = ‖p_j‖² − 2 z_i·p_j        (= ‖z_i − p_j‖² − ‖z_i‖², same argmin)

plus the index of the smallest (lowest index among equal values: tiles are visited in
increasing order and only a strictly smaller value replaces the best). ‖z_i‖² is dropped: it is
a constant per row, and leaving it out avoids one rounding of a large number. The second value
lets the caller re-check near-ties with exact distances (hiertail_fast/ops/nearest_prototype.py).
Memory: O(BLOCK_N·BLOCK_M) registers, nothing of size N·m ever exists.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._utils import feature_block


@triton.jit
def _nearest_prototype_fwd_kernel(
    z_ptr, p_ptr, pnorm_ptr, idx_ptr, best_ptr, second_ptr,
    n, m, d, stride_z, stride_p,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    USE_DOT: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    row_ok = rows < n
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ACC = tl.float64 if z_ptr.dtype.element_ty == tl.float64 else tl.float32
    best = tl.full((BLOCK_N,), float("inf"), ACC)
    second = tl.full((BLOCK_N,), float("inf"), ACC)
    best_idx = tl.zeros((BLOCK_N,), tl.int64)
    for m0 in range(0, m, BLOCK_M):
        cols = (m0 + offs_m).to(tl.int64)
        col_ok = cols < m
        acc = tl.zeros((BLOCK_N, BLOCK_M), ACC)
        for d0 in range(0, d, BLOCK_D):
            dd = d0 + offs_d
            d_ok = dd < d
            zt = tl.load(z_ptr + rows[:, None] * stride_z + dd[None, :],
                         mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            pt = tl.load(p_ptr + cols[:, None] * stride_p + dd[None, :],
                         mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            if USE_DOT:
                # full fp32 products (no TF32): the argmin must not depend on the card
                # (16-bit tiles upcast: exact products, as a bf16/fp16 MMA with fp32 acc)
                acc += tl.dot(zt.to(tl.float32), tl.trans(pt.to(tl.float32)),
                              input_precision="ieee")
            else:
                acc += tl.sum(zt.to(ACC)[:, None, :] * pt.to(ACC)[None, :, :], axis=2)
        pn = tl.load(pnorm_ptr + cols, mask=col_ok, other=0.0).to(ACC)
        dist = pn[None, :] - 2.0 * acc
        dist = tl.where(col_ok[None, :], dist, float("inf"))
        tile_min, tile_arg = tl.min(dist, axis=1, return_indices=True,
                                    return_indices_tie_break_left=True)
        tile_arg = tile_arg.to(tl.int64) + m0
        # second smallest of the tile: the argmin column removed (a tie shows up as equal)
        masked = tl.where(cols[None, :] == tile_arg[:, None], float("inf"), dist)
        tile_second = tl.min(masked, axis=1)
        better = tile_min < best  # strict: an equal value later keeps the lower index
        second = tl.where(better, tl.minimum(best, tile_second), tl.minimum(second, tile_min))
        best_idx = tl.where(better, tile_arg, best_idx)
        best = tl.where(better, tile_min, best)
    tl.store(idx_ptr + rows, best_idx, mask=row_ok)
    tl.store(best_ptr + rows, best, mask=row_ok)
    tl.store(second_ptr + rows, second, mask=row_ok)


def nearest_prototype_fwd(
    z: torch.Tensor, prototypes: torch.Tensor, pnorm: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the argmin kernel.

    Args:
        z: [N, d] contiguous; prototypes: [m, d] contiguous, same dtype;
        pnorm: [m] squared norms ‖p_j‖² in the accumulation dtype (float64 for float64 input,
        float32 otherwise).
    Returns:
        (idx int64 [N], best [N], second [N]) with best/second in the accumulation dtype.
    """
    n, d = z.shape
    m = prototypes.shape[0]
    use_dot = z.dtype != torch.float64
    acc_dtype = torch.float64 if z.dtype == torch.float64 else torch.float32
    idx = torch.empty(n, dtype=torch.long, device=z.device)
    best = torch.empty(n, dtype=acc_dtype, device=z.device)
    second = torch.empty(n, dtype=acc_dtype, device=z.device)
    if n == 0:
        return idx, best, second
    if use_dot:
        block_n, block_m, block_d = 64, 64, min(feature_block(d), 64)
    else:  # broadcast-multiply path: BLOCK_N·BLOCK_M·BLOCK_D lives in registers
        block_n, block_m, block_d = 32, 32, 8
    grid = (triton.cdiv(n, block_n),)
    _nearest_prototype_fwd_kernel[grid](
        z, prototypes, pnorm, idx, best, second,
        n, m, d, z.stride(0), prototypes.stride(0),
        BLOCK_N=block_n, BLOCK_M=block_m, BLOCK_D=block_d, USE_DOT=use_dot,
    )
    return idx, best, second
