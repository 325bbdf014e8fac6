"""Positive-pair pass of the official balanced contrastive loss, O(sum_c n_c^2 * d) work.

The official variant's positive terms log(exp(s_ij - M_i) + 1e-7) do not factor through class
sums, so they are visited pair by pair, but ONLY over positive pairs: rows sorted by label make
the positives diagonal blocks, and sum_c n_c^2 << N^2 for long-tailed labels. Small groups
(<= ``SMALL_GROUP`` members) are enumerated as explicit (i, j) index pairs in chunks (one
vectorised gather-dot, no Python loop per group); big groups go through GEMM row blocks.
"""
from __future__ import annotations

import torch

from hiertail_fast.ops._lse_torch import exp_floor

OFFICIAL_EPS = 1e-7
SMALL_GROUP = 48
PAIR_CHUNK = 1 << 16           # explicit pairs per chunk (3 gathers of PAIR_CHUNK x d floats)
BLOCK_ELEMS = 1 << 22          # elements of one big-group GEMM block


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
    srt = rows[torch.argsort(gid[rows], stable=True)]                    # rows sorted by group
    g_srt = gid[srt]
    counts = torch.bincount(g_srt, minlength=n_groups)
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
        x.masked_fill_(j == arg_max[i], 0.0).clamp_(min=exp_floor(dt))  # no denormal exp
        e = torch.exp(x)
        big_t.index_add_(0, i, torch.log(e + OFFICIAL_EPS))
        q = e / (e + OFFICIAL_EPS)
        big_q.index_add_(0, i, q)
        if coef is not None:
            c = (coef[i] * q * scale)[:, None]
            dz.index_add_(0, i, c * zj)
            dz.index_add_(0, j, c * zi)

    # ---- big groups: GEMM blocks within the diagonal block of the group
    for g in (counts > SMALL_GROUP).nonzero().squeeze(1).tolist():
        s0, ng = int(starts[g]), int(counts[g])
        idx = srt[s0 : s0 + ng]
        zg = z[idx]
        rb = max(1, BLOCK_ELEMS // ng)
        for a0 in range(0, ng, rb):
            a1 = min(ng, a0 + rb)
            ia = idx[a0:a1]
            x = torch.mm(zg[a0:a1], zg.t()).mul_(scale).sub_(row_max[ia][:, None])
            x.masked_fill_(idx[None, :] == arg_max[ia][:, None], 0.0)
            e = x.clamp_(min=exp_floor(dt)).exp_()
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
