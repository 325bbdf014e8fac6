"""Triton CSR row-split SpMM with the GCN normalisation fused in.

    out_i = Σ_{e in row i} (dinv_i · w_e · dinv_{col_e}) · x_{col_e}  +  loop_i · dinv_i² · x_i

One program owns ROWS consecutive rows and one BLOCK_D-wide slice of the features; for each row
it walks the row's entries in chunks of BLOCK_E, gathers the [BLOCK_E, BLOCK_D] tile of source
rows, scales by dinv[row]·w·dinv[col] on the fly and reduces into a register accumulator
(fp32, fp64 for fp64 inputs). Â is never built and there are no atomics: every output element
is written by exactly one program, in a fixed order, so the result is deterministic.

The backward Âᵀ·G runs the SAME kernel on the transposed CSR (Âᵀ_ij = dinv_i w_ji dinv_j has the
same form), or on the forward CSR itself when the graph is symmetric. For the edge-weight
gradient, `gcn_edge_dots` (an SDDMM) gives a_e = <g_row_e, x_col_e> for every entry: one program
per BLOCK_E entries, feature chunks of BLOCK_D, no [E, d] temporaries and no atomics; the caller
(ops/gcn_propagate.py) turns a into the weight and degree gradients with segment sums.

Byte count per call (roofline): indptr (8 B/row) + per entry an int64 index and, if weighted, a
value + one feature row read (d · itemsize) + dinv, + the output row written.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._utils import feature_block


@triton.jit
def _gcn_propagate_fwd_kernel(
    indptr_ptr, indices_ptr, weight_ptr, dinv_ptr, loop_ptr, x_ptr, out_ptr,
    n_rows, d, stride_x, stride_out,
    HAS_WEIGHT: tl.constexpr, HAS_LOOP: tl.constexpr, ACC_FP64: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_r = tl.program_id(0).to(tl.int64)  # int64 offsets: large graphs overflow int32
    pid_d = tl.program_id(1).to(tl.int64)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < d
    acc_dtype = tl.float64 if ACC_FP64 else tl.float32
    for r in tl.static_range(ROWS):
        row = pid_r * ROWS + r
        if row < n_rows:
            start = tl.load(indptr_ptr + row)
            end = tl.load(indptr_ptr + row + 1)
            di = tl.load(dinv_ptr + row).to(acc_dtype)
            acc = tl.zeros([BLOCK_D], dtype=acc_dtype)
            for e0 in range(start, end, BLOCK_E):
                offs_e = e0 + tl.arange(0, BLOCK_E)
                mask_e = offs_e < end
                col = tl.load(indices_ptr + offs_e, mask=mask_e, other=0)
                # fused normalisation: the per-entry factor (dinv[row] · w_e) · dinv[col], in
                # the torch path's order, applied to each term before the sum (a per-entry
                # scalar, not per channel): scaling the row's sum by dinv[row] after it
                # overflowed where terms near float32's largest value sum past it before
                # dinv[row] < 1 brings them back (an extremes audit)
                scale = di
                if HAS_WEIGHT:
                    scale = scale * tl.load(weight_ptr + offs_e, mask=mask_e, other=0.0).to(
                        acc_dtype)
                scale = scale * tl.load(dinv_ptr + col, mask=mask_e, other=0.0).to(acc_dtype)
                xs = tl.load(
                    x_ptr + col[:, None] * stride_x + offs_d[None, :],
                    mask=mask_e[:, None] & mask_d[None, :], other=0.0,
                ).to(acc_dtype)
                acc += tl.sum(scale[:, None] * xs, axis=0)
            if HAS_LOOP:  # the added self-loop as a diagonal term: A + I is never built
                xi = tl.load(x_ptr + row * stride_x + offs_d, mask=mask_d, other=0.0)
                lp = tl.load(loop_ptr + row).to(acc_dtype)
                acc += (lp * di * di) * xi.to(acc_dtype)
            tl.store(out_ptr + row * stride_out + offs_d, acc.to(out_ptr.dtype.element_ty),
                     mask=mask_d)


def gcn_spmm(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    weight: torch.Tensor | None,
    dinv: torch.Tensor,
    loop: torch.Tensor | None,
    x: torch.Tensor,
    *,
    rows_per_program: int = 4,
    block_e: int | None = None,
) -> torch.Tensor:
    """Launcher: ``D^-1/2 (M + diag(loop)) D^-1/2 · x`` for the CSR ``M`` (indptr [n+1] int64,
    indices [nnz] int64, weight [nnz] or None = unit), dinv [n], loop [n] or None; x [n, d].
    Returns a new [n, d] tensor in x's dtype. Inputs are made contiguous, never modified."""
    n, d = x.shape
    x = x.contiguous()
    out = torch.empty_like(x)
    if n == 0 or d == 0:
        return out
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32  # scalars at acc precision
    dinv = dinv.to(acc).contiguous()
    has_w, has_loop = weight is not None, loop is not None
    w = weight.to(acc).contiguous() if has_w else dinv  # dummy pointer when unweighted
    lp = loop.to(acc).contiguous() if has_loop else dinv
    block_d = feature_block(d, max_block=128)
    if block_e is None:  # entries per chunk ~ the mean degree: few masked lanes on sparse graphs
        mean_deg = -(-indices.numel() // n)
        block_e = min(64, max(8, triton.next_power_of_2(max(1, mean_deg))))
    grid = (triton.cdiv(n, rows_per_program), triton.cdiv(d, block_d))
    _gcn_propagate_fwd_kernel[grid](
        indptr.contiguous(), indices.contiguous(), w, dinv, lp, x, out,
        n, d, x.stride(0), out.stride(0),
        HAS_WEIGHT=has_w, HAS_LOOP=has_loop, ACC_FP64=x.dtype == torch.float64,
        ROWS=rows_per_program, BLOCK_E=block_e, BLOCK_D=block_d,
    )
    return out


@triton.jit
def _gcn_edge_dots_kernel(
    row_ptr, col_ptr, g_ptr, x_ptr, out_ptr, nnz, d, stride_g, stride_x,
    ACC_FP64: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    offs_e = pid * BLOCK_E + tl.arange(0, BLOCK_E).to(tl.int64)
    mask_e = offs_e < nnz
    row = tl.load(row_ptr + offs_e, mask=mask_e, other=0)
    col = tl.load(col_ptr + offs_e, mask=mask_e, other=0)
    acc_dtype = tl.float64 if ACC_FP64 else tl.float32
    acc = tl.zeros([BLOCK_E], dtype=acc_dtype)
    for d0 in range(0, d, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        m = mask_e[:, None] & (offs_d[None, :] < d)
        gt = tl.load(g_ptr + row[:, None] * stride_g + offs_d[None, :], mask=m, other=0.0)
        xt = tl.load(x_ptr + col[:, None] * stride_x + offs_d[None, :], mask=m, other=0.0)
        acc += tl.sum(gt.to(acc_dtype) * xt.to(acc_dtype), axis=1)
    tl.store(out_ptr + offs_e, acc.to(out_ptr.dtype.element_ty), mask=mask_e)


def gcn_edge_dots(g: torch.Tensor, x: torch.Tensor, row: torch.Tensor, col: torch.Tensor,
                  *, block_e: int = 64) -> torch.Tensor:
    """Launcher: a_e = <g[row_e], x[col_e]> for every entry e (SDDMM), g and x [n, d] of one
    dtype, row/col [nnz] int64. Returns [nnz] float32 (float64 for float64 inputs), the
    accumulation precision. Deterministic: every output is one program's fixed-order sum."""
    nnz, d = row.numel(), g.shape[1]
    acc = torch.float64 if g.dtype == torch.float64 else torch.float32
    out = torch.empty(nnz, dtype=acc, device=g.device)
    if nnz == 0:
        return out
    if d == 0:
        return out.zero_()
    g, x = g.contiguous(), x.contiguous()
    block_d = feature_block(d, max_block=64)
    _gcn_edge_dots_kernel[(triton.cdiv(nnz, block_e),)](
        row.contiguous(), col.contiguous(), g, x, out, nnz, d, g.stride(0), x.stride(0),
        ACC_FP64=g.dtype == torch.float64, BLOCK_E=block_e, BLOCK_D=block_d,
    )
    return out
