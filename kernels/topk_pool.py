"""Triton kernels for top-k pooling (gPool / PyG TopKPooling) and unpooling.

Forward:   t_i = x_i·p̂, p̂ = p/‖p‖; score = tanh(t)   (_topk_score_kernel, reads X once)
           [top-k selection on the device: ``_select`` in hiertail_fast/ops/topk_pool.py]
           out_r = x_{perm_r} · score_{perm_r}          (_topk_gather_scale_kernel)
Backward:  for kept rows only (dropped rows get no gradient through the output):
           ds_r  = Σ_c g_rc x_{perm_r,c} + gs_r         (gs: gradient of the returned score)
           dt_r  = ds_r (1 − s_r²)                      (tanh')
           dx_{perm_r} = g_r s_r + dt_r p̂               (_topk_pool_bwd_kernel, row writes, no
           v = Σ_r dt_r x_{perm_r}  (per-program partials)  atomics: perm is a permutation)
           dp = (v − (v·p̂) p̂) / ‖p‖                      (O(d), in torch)
Induced subgraph: _filter_edges_count_kernel / _filter_edges_compact_kernel, a two-pass
block-offset scan: pass 1 counts the kept entries per block of BLOCK_E CSR entries, a cumsum of
the block counts gives every block its output offset, pass 2 recomputes the keep mask, ranks
the kept entries inside the block with tl.cumsum and writes (new row, new col, entry id).
Unpool: _topk_unpool_scatter_kernel writes out[perm_r] = x'_r (rows distinct: no atomics).

tanh is applied by the caller with torch.tanh (the same function as on every other backend),
so that scores saturating to ±1 tie, and break ties, exactly as the reference does.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._utils import feature_block


@triton.jit
def _topk_score_kernel(x_ptr, p_ptr, score_ptr, n, d, stride_x,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    row_ok = rows < n
    ACC = tl.float64 if x_ptr.dtype.element_ty == tl.float64 else tl.float32
    acc = tl.zeros((BLOCK_N,), ACC)
    for d0 in range(0, d, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        xt = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :],
                     mask=row_ok[:, None] & (cols[None, :] < d), other=0.0).to(ACC)
        pt = tl.load(p_ptr + cols, mask=cols < d, other=0.0).to(ACC)
        acc += tl.sum(xt * pt[None, :], axis=1)
    # every row is reduced by the same fixed-order code: identical rows -> identical bits
    tl.store(score_ptr + rows, acc.to(score_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def _topk_gather_scale_kernel(x_ptr, score_ptr, perm_ptr, out_ptr, k, d, stride_x, stride_o,
                              HAS_SCALE: tl.constexpr, BLOCK_K: tl.constexpr,
                              BLOCK_D: tl.constexpr):
    """out[r] = x[perm[r]] (· score[perm[r]] when HAS_SCALE)."""
    pid = tl.program_id(0).to(tl.int64)
    r = pid * BLOCK_K + tl.arange(0, BLOCK_K).to(tl.int64)
    r_ok = r < k
    src = tl.load(perm_ptr + r, mask=r_ok, other=0).to(tl.int64)
    ACC = tl.float64 if x_ptr.dtype.element_ty == tl.float64 else tl.float32
    if HAS_SCALE:
        s = tl.load(score_ptr + src, mask=r_ok, other=0.0)
    for d0 in range(0, d, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        m = r_ok[:, None] & (cols[None, :] < d)
        xt = tl.load(x_ptr + src[:, None] * stride_x + cols[None, :], mask=m, other=0.0)
        if HAS_SCALE:  # product in fp32 (or fp64), one rounding to the output dtype
            xt = (xt.to(ACC) * s.to(ACC)[:, None]).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + r[:, None] * stride_o + cols[None, :], xt, mask=m)


@triton.jit
def _topk_pool_bwd_kernel(x_ptr, phat_ptr, perm_ptr, s_ptr, g_ptr, gs_ptr, dx_ptr, v_ptr,
                          k, d, stride_x, stride_g, stride_dx,
                          HAS_GS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    r = pid * BLOCK_K + tl.arange(0, BLOCK_K).to(tl.int64)
    r_ok = r < k
    src = tl.load(perm_ptr + r, mask=r_ok, other=0).to(tl.int64)
    ACC = tl.float64 if x_ptr.dtype.element_ty == tl.float64 else tl.float32
    s = tl.load(s_ptr + r, mask=r_ok, other=0.0).to(ACC)
    # pass 1 over features: ds_r = <g_r, x_perm_r> (+ gradient of the returned score)
    ds = tl.zeros((BLOCK_K,), ACC)
    for d0 in range(0, d, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        m = r_ok[:, None] & (cols[None, :] < d)
        xt = tl.load(x_ptr + src[:, None] * stride_x + cols[None, :], mask=m, other=0.0)
        gt = tl.load(g_ptr + r[:, None] * stride_g + cols[None, :], mask=m, other=0.0)
        ds += tl.sum(xt.to(ACC) * gt.to(ACC), axis=1)
    if HAS_GS:
        ds += tl.load(gs_ptr + r, mask=r_ok, other=0.0).to(ACC)
    dt = ds * (1.0 - s * s)
    # pass 2: dx rows and this program's partial v = Σ_r dt_r x_perm_r
    for d0 in range(0, d, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        c_ok = cols < d
        m = r_ok[:, None] & c_ok[None, :]
        xt = tl.load(x_ptr + src[:, None] * stride_x + cols[None, :], mask=m, other=0.0).to(ACC)
        gt = tl.load(g_ptr + r[:, None] * stride_g + cols[None, :], mask=m, other=0.0).to(ACC)
        ph = tl.load(phat_ptr + cols, mask=c_ok, other=0.0).to(ACC)
        dx = gt * s[:, None] + dt[:, None] * ph[None, :]
        tl.store(dx_ptr + src[:, None] * stride_dx + cols[None, :],
                 dx.to(dx_ptr.dtype.element_ty), mask=m)
        tl.store(v_ptr + pid * d + cols, tl.sum(xt * dt[:, None], axis=0), mask=c_ok)


@triton.jit
def _filter_edges_count_kernel(row_ptr, col_ptr, relabel_ptr, count_ptr, nnz,
                               BLOCK_E: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    e = pid * BLOCK_E + tl.arange(0, BLOCK_E).to(tl.int64)
    e_ok = e < nnz
    nr = tl.load(relabel_ptr + tl.load(row_ptr + e, mask=e_ok, other=0), mask=e_ok, other=-1)
    nc = tl.load(relabel_ptr + tl.load(col_ptr + e, mask=e_ok, other=0), mask=e_ok, other=-1)
    keep = (nr >= 0) & (nc >= 0) & e_ok
    tl.store(count_ptr + pid, tl.sum(keep.to(tl.int64), axis=0))


@triton.jit
def _filter_edges_compact_kernel(row_ptr, col_ptr, relabel_ptr, offset_ptr, out_row_ptr,
                                 out_col_ptr, out_eid_ptr, nnz, BLOCK_E: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    e = pid * BLOCK_E + tl.arange(0, BLOCK_E).to(tl.int64)
    e_ok = e < nnz
    nr = tl.load(relabel_ptr + tl.load(row_ptr + e, mask=e_ok, other=0), mask=e_ok, other=-1)
    nc = tl.load(relabel_ptr + tl.load(col_ptr + e, mask=e_ok, other=0), mask=e_ok, other=-1)
    keep = (nr >= 0) & (nc >= 0) & e_ok
    # rank inside the block (inclusive scan) + block offset from the exclusive scan of counts
    pos = tl.load(offset_ptr + pid) + tl.cumsum(keep.to(tl.int64), axis=0) - 1
    tl.store(out_row_ptr + pos, nr, mask=keep)
    tl.store(out_col_ptr + pos, nc, mask=keep)
    tl.store(out_eid_ptr + pos, e, mask=keep)


@triton.jit
def _topk_unpool_scatter_kernel(xp_ptr, perm_ptr, out_ptr, k, d, stride_xp, stride_o,
                                BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    r = pid * BLOCK_K + tl.arange(0, BLOCK_K).to(tl.int64)
    r_ok = r < k
    dst = tl.load(perm_ptr + r, mask=r_ok, other=0).to(tl.int64)
    for d0 in range(0, d, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        m = r_ok[:, None] & (cols[None, :] < d)
        xt = tl.load(xp_ptr + r[:, None] * stride_xp + cols[None, :], mask=m, other=0.0)
        tl.store(out_ptr + dst[:, None] * stride_o + cols[None, :], xt, mask=m)


# ---------------------------------------------------------------------------- launchers
_BLOCK_ROWS = 32
_BLOCK_E = 1024


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x with unit column stride (the kernels take a row stride only). The launchers below
    also make their 1-D arguments contiguous: the kernels read them at stride 1, and a
    strided index view (``perm[::2]``, a CSRGraph's strided indices) gave wrong rows and
    pooled graphs without an error, or an out-of-bounds read."""
    return x if x.stride(-1) == 1 else x.contiguous()


def topk_score(x: torch.Tensor, phat: torch.Tensor) -> torch.Tensor:
    """t = x·p̂ [n] in the accumulation dtype (float32; float64 for float64 x; the caller
    applies tanh and rounds), x [n, d] and p̂ [d] contiguous."""
    x, phat = _rows(x), phat.contiguous()
    n, d = x.shape
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    score = torch.empty(n, dtype=acc, device=x.device)
    if n:
        bd = feature_block(d, 128)
        _topk_score_kernel[(triton.cdiv(n, _BLOCK_ROWS),)](
            x, phat, score, n, d, x.stride(0), BLOCK_N=_BLOCK_ROWS, BLOCK_D=bd)
    return score


def gather_rows(x: torch.Tensor, perm: torch.Tensor,
                score: torch.Tensor | None = None) -> torch.Tensor:
    """x[perm] (· score[perm][:, None] when `score` is given: the product in float32 (float64
    for float64 x), rounded once to x's dtype, whatever the score's dtype)."""
    x, perm = _rows(x), perm.contiguous()
    score = None if score is None else score.contiguous()
    k, d = perm.numel(), x.shape[1]
    out = torch.empty(k, d, dtype=x.dtype, device=x.device)
    if k:
        _topk_gather_scale_kernel[(triton.cdiv(k, _BLOCK_ROWS),)](
            x, score if score is not None else x, perm, out, k, d, x.stride(0), out.stride(0),
            HAS_SCALE=score is not None, BLOCK_K=_BLOCK_ROWS, BLOCK_D=feature_block(d, 128))
    return out


def topk_pool_bwd(x, phat, qn, m, perm, score_sel, grad_out, grad_score):
    """(dx [n, d], dp [d]) of (x[perm]·s[perm], s[perm]) with s = tanh(x·p̂), p̂ = p/‖p‖ and
    ‖p‖ = m·qn (m = max|p|, qn = ‖p/m‖: the scaled norm, which neither under- nor overflows)."""
    x, grad_out, perm, score_sel = _rows(x), _rows(grad_out), perm.contiguous(), \
        score_sel.contiguous()
    grad_score = None if grad_score is None else grad_score.contiguous()
    n, d = x.shape
    k = perm.numel()
    phat = phat.contiguous()
    dx = torch.zeros_like(x)
    grid = triton.cdiv(k, _BLOCK_ROWS)
    acc_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    v = torch.zeros(max(grid, 1), d, dtype=acc_dtype, device=x.device)
    if k:
        _topk_pool_bwd_kernel[(grid,)](
            x, phat, perm, score_sel, grad_out, grad_score if grad_score is not None else x,
            dx, v, k, d, x.stride(0), grad_out.stride(0), dx.stride(0),
            HAS_GS=grad_score is not None, BLOCK_K=_BLOCK_ROWS, BLOCK_D=feature_block(d, 128))
    v = v.sum(dim=0)  # fixed-order reduction of the per-program partials: deterministic
    ph = phat.to(acc_dtype)
    # d(x·p/‖p‖)/dp = (I − p̂p̂ᵀ)x/‖p‖, divided by ‖p‖ = m·qn in two steps (no overflow);
    # in the accumulation dtype (the caller casts to p's)
    dp = (v - (v @ ph) * ph) / qn.to(acc_dtype) / m.to(acc_dtype)
    return dx, dp


def filter_edges(row: torch.Tensor, col: torch.Tensor, relabel: torch.Tensor):
    """Kept entries (both ends relabelled >= 0) in input order: (new_row, new_col, entry_id)."""
    row, col, relabel = row.contiguous(), col.contiguous(), relabel.contiguous()
    nnz = row.numel()
    blocks = triton.cdiv(nnz, _BLOCK_E)
    counts = torch.empty(blocks, dtype=torch.long, device=row.device)
    if blocks:
        _filter_edges_count_kernel[(blocks,)](row, col, relabel, counts, nnz, BLOCK_E=_BLOCK_E)
    offsets = torch.zeros(blocks + 1, dtype=torch.long, device=row.device)
    torch.cumsum(counts, 0, out=offsets[1:])  # exclusive scan of the block counts
    total = int(offsets[-1])  # one host sync: the output size
    out_row = torch.empty(total, dtype=torch.long, device=row.device)
    out_col = torch.empty_like(out_row)
    out_eid = torch.empty_like(out_row)
    if blocks and total:
        _filter_edges_compact_kernel[(blocks,)](row, col, relabel, offsets, out_row, out_col,
                                                out_eid, nnz, BLOCK_E=_BLOCK_E)
    return out_row, out_col, out_eid


def unpool_scatter(x_pooled: torch.Tensor, perm: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """zeros(num_nodes, d) with rows perm <- x_pooled."""
    x_pooled, perm = _rows(x_pooled), perm.contiguous()
    k, d = x_pooled.shape
    out = torch.zeros(num_nodes, d, dtype=x_pooled.dtype, device=x_pooled.device)
    if k:
        _topk_unpool_scatter_kernel[(triton.cdiv(k, _BLOCK_ROWS),)](
            x_pooled, perm, out, k, d, x_pooled.stride(0), out.stride(0),
            BLOCK_K=_BLOCK_ROWS, BLOCK_D=feature_block(d, 128))
    return out
