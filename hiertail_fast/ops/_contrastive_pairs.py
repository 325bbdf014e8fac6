"""Positive-pair pass of the official balanced contrastive loss, O(sum_c n_c^2 * d) work.

The official variant's positive terms log(exp(s_ij - M_i) + 1e-7) do not factor through class
sums, so they are visited pair by pair, but ONLY over positive pairs: rows sorted by label make
the positives diagonal blocks, and sum_c n_c^2 << N^2 for long-tailed labels. Small groups
(<= ``SMALL_GROUP`` members) are enumerated as explicit (i, j) index pairs in chunks (one
vectorised gather-dot, no Python loop per group); big groups go through GEMM row blocks.
"""
from __future__ import annotations

import torch

from hiertail_fast.ops._host_reads import host_reads_cheap, slot_counts
from hiertail_fast.ops._lse_torch import block_bytes, exp_shifted_
from hiertail_fast.ops._tied_keys import first_equal_rows

OFFICIAL_EPS = 1e-7
SMALL_GROUP = 48
PAIR_CHUNK = 1 << 16           # explicit pairs per chunk (3 gathers of PAIR_CHUNK x d floats)
BLOCK_ELEMS = 1 << 22          # elements of one big-group GEMM block on CPU at most (on CUDA:
                               # the engine's block budget, _lse_torch.block_bytes: fewer launches)


def scaled_coefficients(coef: torch.Tensor, norm, dtype: torch.dtype) -> torch.Tensor:
    """coef / norm in ``dtype`` (0 where norm is 0), the quotient taken in float64. norm is a
    gradient block's normaliser (a float, a 0-dim tensor, or [b] per-row divisors): tiny where
    the block's upstream gradients are (an entry of 1e-39 in the backward of reduction "none":
    its inverse, which this took until 2026-12-06, was inf in float32, 1e-310 in float64, and
    c * inf and 0 * inf made the gradient inf and NaN), while the quotient, a coefficient over
    the normaliser it is part of, stays O(1)."""
    c = coef.to(torch.float64)
    if not isinstance(norm, torch.Tensor):
        return (c / norm).to(dtype)
    norm = norm.to(torch.float64)
    return torch.where(norm != 0, c / norm, 0.0).to(dtype)


def _tie_bound(z: torch.Tensor, row_max: torch.Tensor, scale: float) -> torch.Tensor:
    """[N] bound on |fl(s_ij - M_i) - (s_ij - M_i)|: the rounding of two length-d dot products
    (gamma_d * scale * |z_i| * max|z| each) and of the subtraction, in z's precision (fp32 also
    covers 3xTF32 products: the Triton positives kernel passes fp32 rows). No host sync."""
    eps = torch.finfo(z.dtype).eps
    norms = z.norm(dim=1)
    zmax = norms.max() if norms.numel() else norms.new_zeros(())
    d = z.shape[1]
    return 2.0 * (d + 2) * eps * abs(scale) * norms * zmax + eps * row_max.abs()


def _consistent_with_max(x, i, j, z, row_max, arg_max, tie, first_equal=None):
    """x = s_ij - M_i recomputed for positive pairs, made consistent with the max M_i.

    M_i came from another product (the LSE engine's GEMM), so a recomputed s_ij carries other
    rounding: a positive that ties the max (j = argmax_i, or z_j a bitwise duplicate of
    z_argmax_i) could come out > 0 (exp overflows at |s| ~ 1e4) or a few ulp of |s| < 0 (a
    wrong term where the dense reference, which uses one s for both, has exactly 0). So:
    pairs within the rounding bound of the max whose key row equals the arg-max row exactly
    get x = 0 exactly (true s_ij = M_i), and every x is clamped to <= 0 (s_ij <= M_i holds
    for the true values). Other near-ties keep an error <= the rounding bound, as the fp32
    reference's own s does.

    ``first_equal`` (``_tied_keys.first_equal_rows(z)``): the same rule in a fixed-shape form
    that reads nothing on the host (CUDA: no sync per block), the rows compared through their
    first equal row's index; a 2-D block then takes its key ids from j's first row (the big
    groups' blocks: j expands the group's ids over the block's rows)."""
    # a block's rows share i along dim 1 (an expanded view): the bound per row, broadcast, not
    # gathered into a [b, n_g] temporary (a memory audit)
    bound = tie[i] if i.dim() == 1 else tie[i[:, 0]][:, None]
    if first_equal is not None:
        if i.dim() == 1:
            same = first_equal[j] == first_equal[arg_max[i]]
        else:
            same = first_equal[j[0]][None, :] == first_equal[arg_max[i[:, 0]]][:, None]
        return x.masked_fill_((x > -bound) & same, 0.0).clamp_(max=0.0)
    near = (x > -bound).nonzero(as_tuple=True)
    if near[0].numel():
        jn, an = j[near], arg_max[i[near]]
        same = (jn == an) | (z[jn] == z[an]).all(dim=1)
        x[tuple(t[same] for t in near)] = 0.0
    return x.clamp_(max=0.0)


def positive_pairs(
    z: torch.Tensor,
    gid: torch.Tensor,
    n_groups: int,
    row_max: torch.Tensor,
    arg_max: torch.Tensor,
    scale: float,
    include_self: bool,
    coef: torch.Tensor | None = None,
):
    """Sums over positive pairs of one level.

    Args:
        z: [N, d] compute-dtype embeddings (all rows of the problem).
        gid: [N] group id in 0..n_groups-1 of each row in the level, -1 for rows not in it.
        row_max: [N] M_i (the level's row max of scale * z_i.z_k); arg_max: [N] its index.
            The positive pair (i, arg_max_i) gets s_ij - M_i = 0 exactly, as in the dense
            reference (the pair's s recomputed here would carry a different fp32 rounding than
            M_i, and this term is never clamped, so the rounding would show in the loss).
        coef: optional [N] coefficient c_i; the gradient of sum_{i, j in P(i)} c_i t_ij, with
            t_ij = log(exp(s_ij - M_i) + eps), w.r.t. s_ij (M_i held fixed) is returned as dz.

    Returns:
        T [N] = sum_{j in P(i)} t_ij, Q [N] = sum_{j in P(i)} q_ij with q = e / (e + eps)
        (q_ij = dt_ij/ds_ij = -dt_ij/dM_i), and dz [N, d] or None.
    """
    n, d = z.shape
    dev, dt = z.device, z.dtype
    big_t = torch.zeros(n, dtype=dt, device=dev)
    big_q = torch.zeros(n, dtype=dt, device=dev)
    dz = torch.zeros(n, d, dtype=dt, device=dev) if coef is not None else None
    coef = coef.to(dt) if coef is not None else None
    rows = (gid >= 0).nonzero().squeeze(1)
    if rows.numel() == 0:
        return big_t, big_q, dz
    tie = _tie_bound(z, row_max, scale)
    # CUDA: the tie rule without a host read per block or chunk (_consistent_with_max)
    first_equal = None if host_reads_cheap(dev) else first_equal_rows(z)
    # on CPU within $HIERTAIL_CPU_BLOCK_BYTES too (about three [b, n_g] temporaries live per
    # block; the default 48 MB gives BLOCK_ELEMS exactly): a fixed 16 MB block held ~80 MB
    # whatever the budget (a memory audit)
    block_elems = (block_bytes(dev) // z.element_size() if dev.type == "cuda"
                   else max(1, min(BLOCK_ELEMS, block_bytes(dev) // (3 * z.element_size()))))
    srt = rows[torch.argsort(gid[rows], stable=True)]                    # rows sorted by group
    g_srt = gid[srt]
    counts = slot_counts(g_srt, n_groups)
    starts = torch.cumsum(counts, 0) - counts
    n_each = counts[g_srt]                                                # group size per row

    # ---- small groups: explicit pair lists
    small = (n_each <= SMALL_GROUP).nonzero().squeeze(1)                 # positions in srt
    rows_per_chunk = max(1, PAIR_CHUNK // SMALL_GROUP)
    for c0 in range(0, small.numel(), rows_per_chunk):
        p = small[c0 : c0 + rows_per_chunk]
        ne = n_each[p]
        q_pos = torch.repeat_interleave(p, ne)
        offs = torch.arange(q_pos.numel(), device=dev) - torch.repeat_interleave(
            torch.cumsum(ne, 0) - ne, ne
        )
        k_pos = torch.repeat_interleave(starts[g_srt[p]], ne) + offs
        i, j = srt[q_pos], srt[k_pos]
        if not include_self:
            keep = i != j
            i, j = i[keep], j[keep]
        if i.numel() == 0:
            continue
        zi, zj = z[i], z[j]
        x = (zi * zj).sum(1) * scale - row_max[i]
        e = exp_shifted_(_consistent_with_max(x, i, j, z, row_max, arg_max, tie,
                                              first_equal))
        big_t.index_add_(0, i, torch.log(e + OFFICIAL_EPS))
        q = e / (e + OFFICIAL_EPS)
        big_q.index_add_(0, i, q)
        if coef is not None:
            c = (coef[i] * q * scale)[:, None]
            dz.index_add_(0, i, c * zj)
            dz.index_add_(0, j, c * zi)

    # ---- big groups: GEMM blocks within the diagonal block of the group
    big = (counts > SMALL_GROUP).nonzero().squeeze(1)
    for s0, ng in torch.stack([starts[big], counts[big]], 1).tolist():   # one read for all
        idx = srt[s0 : s0 + ng]
        zg = z[idx]
        rb = max(1, block_elems // ng)
        for a0 in range(0, ng, rb):
            a1 = min(ng, a0 + rb)
            ia = idx[a0:a1]
            x = torch.mm(zg[a0:a1], zg.t()).mul_(scale).sub_(row_max[ia][:, None])
            ii = ia[:, None].expand_as(x)
            jj = idx[None, :].expand_as(x)
            e = exp_shifted_(_consistent_with_max(x, ii, jj, z, row_max, arg_max, tie,
                                                  first_equal))
            t = torch.log(e + OFFICIAL_EPS)
            q = e.div_(e + OFFICIAL_EPS)
            if not include_self:
                diag = torch.arange(a1 - a0, device=dev)
                t[diag, diag + a0] = 0
                q[diag, diag + a0] = 0
            big_t.index_add_(0, ia, t.sum(1))
            big_q.index_add_(0, ia, q.sum(1))
            if coef is not None:
                q.mul_(coef[ia][:, None] * scale)
                dz.index_add_(0, ia, q @ zg)
                dz.index_add_(0, idx, q.t() @ zg[a0:a1])
    return big_t, big_q, dz
