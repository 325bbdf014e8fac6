"""Triton kernel for the official variant's positive-pair pass (DESIGN.md §3), one level.

The official loss adds, for every row i of a level and every positive j in P(i) (same label;
i itself unless include_self is False),

    t_ij = log(e_ij + eps),   q_ij = e_ij / (e_ij + eps),   e_ij = exp(s_ij - M_i),

with s_ij = scale·z_i·z_j and M_i the level's unweighted row max (from ``lse_forward``'s
NEED_MAX pass). These do not factor through class sums, so they are visited pair by pair, but
only over positive pairs: with the level's rows SORTED BY LABEL, row i's positives are one
column range [lo_i, hi_i) of the sorted order, and a block of sorted rows scans only the union
of its rows' ranges. Work: sum_c n_c^2 pairs (not N^2), no host synchronisation, one launch.

Forward (NEED_SUMS): T_i = sum_j t_ij and Q_i = sum_j q_ij (the loss and the row-max path's
gradient coefficient). Backward (NEED_DZ) of sum_{i, j in P(i)} c_i t_ij with M held fixed,
dt_ij/ds_ij = q_ij: since P is symmetric (j in P(i) iff i in P(j)), both sides of row r are
sums over the same tile row, as in the LSE kernel's one-pass backward:

    dz_r += scale · sum_{c in P(r)} W_rc z_c,   W_rc = c_r q_rc + c_c q_cr,

where q_cr uses the row max of c (one more exp per pair, no second GEMM, no atomics; each dz
row is written by exactly one program: deterministic). DZ is accumulated in place (+=).

Consistency with the max (as ``ops/_contrastive_pairs._consistent_with_max``): M_i came from
another product (the LSE kernel's tile), so a recomputed s_ij carries other rounding. A pair
within the rounding bound tie_i of the max whose key row equals the arg-max row gets x = s - M =
0 exactly (the dense reference's exact 0), and every x is clamped to <= 0 (no exp overflow at
|s| ~ 1e4). "Equals" is tested on row ids (``row_ids``: a hash of the row's bits, equal for
equal rows); a collision between unequal rows could only move an x already within tie_i of 0
to 0, an error of the rounding's size. (No exp cut-off as in the CPU engines: their reason,
denormal products in CPU GEMMs, does not arise here; e < 1e-20 changes no sum next to eps.)

Dots as in ``balanced_contrastive_loss.py``: fp32 inputs multiply with ``fp32_dot`` ("ieee" or
"tf32x3"; the loss engine passes the forward's choice), 16-bit inputs natively (exact products,
fp32 accumulation; interpreter: upcast first); W·Z multiplies fp32 W with ``fp32_dot`` for fp32
inputs and IEEE fp32 for 16-bit ones (W is fp32: c_i can be ~1e-10; the pairs are few).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hiertail_fast.ops._contrastive_pairs import OFFICIAL_EPS, _tie_bound
from hiertail_fast.ops._tied_keys import row_ids

from ._utils import (
    cuda_arch,
    feature_block,
    fp32_dot_tiles,
    fp_fusion,
    launch_fitting,
    pair_blocks,
)
from ._utils import fp32_dot as fp32_dot_precision
from .balanced_contrastive_loss import _SUPPORTED, _precisions

# (BLOCK_M, BLOCK_N, num_warps) on a GPU, every d. Chosen from the compiled code, not from
# timings (none yet): `python bench/kernel_resources.py` (sm_90, 3 stages; triton 3.6, the GPU
# image's, and 3.9 agree) gives the gradient pass with the LSE kernels' then fixed tile (128 x 64,
# 4 warps) 1,800 / 2,076 bytes of register spills per thread (fp32 / bf16, d 64; 3.9: 900 /
# 5,908) and 4 warps per SM in fp32; 64 x 32 with 8 warps spills 0 / 0 at d 64 (8 warps per SM)
# and the least of all tiles at d 128 (fp32 304 bytes with 3.6, 812 with 3.9).
# Smaller row blocks also scan fewer columns outside their rows' ranges at group boundaries.
GPU_TILES = (64, 32, 8)


def gpu_tiles(d_pad: int, arch: tuple[int, int] | None,
              fp32_dot: str | None) -> tuple[int, int, int]:
    """The kernel's tile on a GPU: GPU_TILES, or the fp32 tile `_utils.fp32_dot_tiles` gives
    (`fp32_dot` the fp32 inputs' dots, None for 16-bit inputs): for 3xTF32 on compute
    capability 8.x / 12.x at d_pad <= 128, AMPERE_FP32_TILES (32 x 64, 4 warps). Compiled for
    sm_80 / sm_86 (triton 3.6), GPU_TILES' gradient pass spills 9.9 / 1.3 KB per thread at
    d 128 and 552 bytes at d 64; 32 x 64 x 4 spills 1.3 / 1.2 KB and 152 / 96 bytes (its sums
    pass 400 bytes at d 128 against 100, 0 at d 64). From the compiled code, untimed."""
    return fp32_dot_tiles(d_pad, arch, fp32_dot) or GPU_TILES


@triton.jit
def _shifted_exp(s, m, tie, same_as_max):
    """exp(x), x = s - m made consistent with the max: 0 exactly at a tie with (a duplicate
    of) the arg-max row, clamped to <= 0 (m = -inf, a row outside the level: 1, masked by the
    caller)."""
    x = s - m
    x = tl.where((x > -tie) & same_as_max, 0.0, x)
    return tl.exp(tl.minimum(x, 0.0))


@triton.jit
def _positive_pairs_kernel(
    Z, ORDER, LO, HI, ROWMAX, TIE, UID, UID_MAX, COEF, T, Q, DZ,
    N, D, stride_z, scale, eps,
    D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NEED_SUMS: tl.constexpr, NEED_DZ: tl.constexpr, INCLUDE_SELF: tl.constexpr,
    DOT_PRECISION: tl.constexpr, GRAD_DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    # Everything per row is indexed by SORTED position p (ORDER[p] = the row of z); rows
    # outside the level have an empty range (LO = HI).
    offs_m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_valid = offs_m < N
    lo_r = tl.load(LO + offs_m, mask=m_valid, other=0)
    hi_r = tl.load(HI + offs_m, mask=m_valid, other=0)
    has = hi_r > lo_r
    # the union of this block's ranges (sorted rows: one contiguous span of columns)
    start = tl.min(tl.where(has, lo_r, N), 0)
    stop = tl.max(tl.where(has, hi_r, 0), 0)
    row_r = tl.load(ORDER + offs_m, mask=m_valid, other=0)
    offs_d = tl.arange(0, D_PAD)
    d_valid = offs_d < D
    q = tl.load(Z + row_r[:, None] * stride_z + offs_d[None, :],
                mask=m_valid[:, None] & d_valid[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_r = tl.load(ROWMAX + offs_m, mask=m_valid, other=0.0)
    tie_r = tl.load(TIE + offs_m, mask=m_valid, other=0.0)
    uid_max_r = tl.load(UID_MAX + offs_m, mask=m_valid, other=0)
    if NEED_DZ:
        uid_r = tl.load(UID + offs_m, mask=m_valid, other=0)
        c_r = tl.load(COEF + offs_m, mask=m_valid, other=0.0)
    sum_t = tl.zeros([BLOCK_M], tl.float32)
    sum_q = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_valid = offs_n < stop
        row_c = tl.load(ORDER + offs_n, mask=n_valid, other=0)
        k = tl.load(Z + row_c[:, None] * stride_z + offs_d[None, :],
                    mask=n_valid[:, None] & d_valid[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
        pos = (offs_n[None, :] >= lo_r[:, None]) & (offs_n[None, :] < hi_r[:, None])
        if not INCLUDE_SELF:
            pos = pos & (offs_n[None, :] != offs_m[:, None])
        uid_c = tl.load(UID + offs_n, mask=n_valid, other=0)
        e_rc = _shifted_exp(s, m_r[:, None], tie_r[:, None],
                            uid_c[None, :] == uid_max_r[:, None])
        q_rc = e_rc / (e_rc + eps)
        if NEED_SUMS:
            sum_t += tl.sum(tl.where(pos, tl.log(e_rc + eps), 0.0), 1)
            sum_q += tl.sum(tl.where(pos, q_rc, 0.0), 1)
        if NEED_DZ:
            # the same pairs seen from the columns' rows: (query c, key r)
            m_c = tl.load(ROWMAX + offs_n, mask=n_valid, other=0.0)
            tie_c = tl.load(TIE + offs_n, mask=n_valid, other=0.0)
            uid_max_c = tl.load(UID_MAX + offs_n, mask=n_valid, other=0)
            c_c = tl.load(COEF + offs_n, mask=n_valid, other=0.0)
            e_cr = _shifted_exp(s, m_c[None, :], tie_c[None, :],
                                uid_r[:, None] == uid_max_c[None, :])
            w = c_r[:, None] * q_rc + c_c[None, :] * (e_cr / (e_cr + eps))
            w = tl.where(pos, w, 0.0)
            acc = tl.dot(w, k.to(tl.float32), acc, input_precision=GRAD_DOT_PRECISION)
    if NEED_SUMS:
        tl.store(T + row_r, sum_t, mask=m_valid)
        tl.store(Q + row_r, sum_q, mask=m_valid)
    if NEED_DZ:
        out = row_r[:, None] * D + offs_d[None, :]
        out_mask = m_valid[:, None] & d_valid[None, :]
        prev = tl.load(DZ + out, mask=out_mask, other=0.0)
        tl.store(DZ + out, prev + acc * scale, mask=out_mask)


def _ranges(gid: torch.Tensor, n_groups: int):
    """(order, lo, hi): rows sorted by group (rows outside the level, gid -1, first), and each
    sorted row's positive range [lo, hi) of sorted positions (empty outside the level)."""
    order = torch.argsort(gid, stable=True)
    g_srt = gid[order]
    counts = torch.bincount(g_srt + 1, minlength=n_groups + 1)
    starts = torch.cumsum(counts, 0) - counts
    lo = starts[g_srt + 1]
    hi = lo + counts[g_srt + 1]
    inside = g_srt >= 0
    lo = torch.where(inside, lo, 0).to(torch.int32)
    hi = torch.where(inside, hi, 0).to(torch.int32)
    return order, lo.contiguous(), hi.contiguous()


def positive_pairs(
    z: torch.Tensor, gid: torch.Tensor, n_groups: int, row_max: torch.Tensor,
    arg_max: torch.Tensor, scale: float, include_self: bool, coef: torch.Tensor | None = None,
    *, need_sums: bool = True, fp32_dot: str | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Sums over the positive pairs of one level (``ops/_contrastive_pairs.positive_pairs``'s
    contract, on the Triton kernel).

    Args:
        z: [N, d] float32/float16/bfloat16 (the LSE kernels' input), d <= 256.
        gid: [N] group id in 0..n_groups-1 of each row in the level, -1 for rows not in it.
        row_max, arg_max: [N] the level's M_i (fp32) and its arg-max (int64, rows of z).
        coef: optional [N] c_i: dz of sum_{i, j in P(i)} c_i t_ij (M held fixed) is returned.
        need_sums: compute T and Q (False: dz only, the backward's call).
        fp32_dot: "ieee" / "tf32x3" for fp32 inputs (default $HIERTAIL_TRITON_FP32_DOT, else
            "ieee"); use the forward's, whose M the pairs are compared with.
    Returns:
        T [N] and Q [N] fp32 (None without need_sums; 0 for rows with no positive) and dz
        [N, d] fp32 or None.
    """
    if z.dim() != 2 or z.dtype not in _SUPPORTED:
        raise TypeError(f"z must be a 2-D float32/float16/bfloat16 tensor, got {z.dtype} "
                        f"with shape {tuple(z.shape)}")
    n, d = z.shape
    if d > 256:
        raise ValueError(f"the triton kernels support d <= 256, got d = {d}")
    for name, t in (("gid", gid), ("row_max", row_max), ("arg_max", arg_max)):
        if t.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},), got {tuple(t.shape)}")
        if t.device != z.device:
            raise ValueError(f"{name} is on {t.device}, z on {z.device}")
    precision = fp32_dot_precision(fp32_dot)
    s_prec, _, upcast = _precisions(z.dtype, z.is_cuda, precision)
    w_prec = precision if z.dtype == torch.float32 else "ieee"
    dev = z.device
    big_t = torch.zeros(n, dtype=torch.float32, device=dev) if need_sums else None
    big_q = torch.zeros_like(big_t) if need_sums else None
    dz = torch.zeros(n, d, dtype=torch.float32, device=dev) if coef is not None else None
    if n == 0 or (not need_sums and coef is None):
        return big_t, big_q, dz
    z = z.contiguous()
    order, lo, hi = _ranges(gid.long(), n_groups)
    ids = row_ids(z)
    rmax = row_max.float()
    tie = _tie_bound(z.float(), rmax, scale)     # fp32 rounding (fp32 accumulation)
    # every per-row input in sorted order: the kernel reads them as contiguous slices
    sorted_in = [t[order].contiguous() for t in (rmax, tie, ids, ids[arg_max.long()])]
    c_s = (coef.float()[order].contiguous() if coef is not None
           else torch.zeros(n, dtype=torch.float32, device=dev))
    d_pad = feature_block(d)
    tiles = (gpu_tiles(d_pad, cuda_arch(z), s_prec if z.dtype == torch.float32 else None)
             if z.is_cuda else pair_blocks(n, d_pad, False))
    out_t = big_t if need_sums else rmax          # placeholders where a flag is off
    meta = dict(D_PAD=d_pad, NEED_SUMS=bool(need_sums), NEED_DZ=coef is not None,
                INCLUDE_SELF=bool(include_self), DOT_PRECISION=s_prec, GRAD_DOT_PRECISION=w_prec,
                UPCAST=upcast)

    def run(tile):
        block_m, block_n, warps = tile
        _positive_pairs_kernel[(triton.cdiv(n, block_m),)](
            z, order, lo, hi, *sorted_in, c_s, out_t, big_q if need_sums else rmax,
            dz if dz is not None else rmax,
            n, d, z.stride(0), float(scale), OFFICIAL_EPS,
            BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, **meta,
            **fp_fusion(True))   # its s must be the forward's rounded s

    launch_fitting(run, tiles, "the official positives' Triton kernel", z, meta)
    return big_t, big_q, dz


__all__ = ["GPU_TILES", "gpu_tiles", "positive_pairs", "row_ids"]
