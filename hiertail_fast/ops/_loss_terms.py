"""The balanced contrastive loss's label structure and its O(N*d) terms (no logits): the
levels (class weights, groups, positive counts), the class-sum term of the exact variant, the
row-max (arg-max) gradient of the official one, and the official loss's d/dLSE ratio.
Notation in ``balanced_contrastive_loss``'s docstring."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hiertail_fast.ops._host_reads import device_values


@dataclass
class Levels:
    """Label structure of L levels over the N rows of one problem (no autograd)."""

    log_w: torch.Tensor        # [L, N] -log(class size), -inf for rows not in the level
    gid: torch.Tensor          # [L, N] group id within the level, -1 if not in the level
    n_groups: list[int]
    n_pos: torch.Tensor        # [L, N] |P(i)| (compute dtype), 0 if not in the level
    contrib: torch.Tensor      # [L, N] bool, rows with a non-empty positive set
    n_distinct: torch.Tensor   # [L] number of distinct labels = sum_k w_k
    full: list[bool]           # per level: every row is in it (no index lists needed)
    n_common: int = 0          # rows [0, n_common) are in every level (the embeddings)


def make_levels(n: int, level_rows, include_self: bool, dtype, device,
                 n_common: int = 0) -> Levels:
    """The Levels of `level_rows`: per level (rows, labels), rows the level's distinct row ids
    (labels[j] the label of row rows[j]) or None for every row in order (labels [N]), whose
    entries are written in place, with no index kernel (and no fill of the tables, when every
    level is so: each op is a kernel launch on CUDA)."""
    n_levels = len(level_rows)
    every = all(rows is None for rows, _ in level_rows)
    if every:
        log_w = torch.empty(n_levels, n, dtype=dtype, device=device)
        gid = torch.empty(n_levels, n, dtype=torch.long, device=device)
        n_pos = torch.empty(n_levels, n, dtype=dtype, device=device)
    else:
        log_w = torch.full((n_levels, n), float("-inf"), dtype=dtype, device=device)
        gid = torch.full((n_levels, n), -1, dtype=torch.long, device=device)
        n_pos = torch.zeros(n_levels, n, dtype=dtype, device=device)
    n_groups = []
    for lev, (rows, labels) in enumerate(level_rows):
        _, inv, counts = torch.unique(labels, return_inverse=True, return_counts=True)
        cnt = counts[inv].to(dtype)
        if rows is None:
            torch.log(cnt, out=log_w[lev]).neg_()
            gid[lev].copy_(inv)
            torch.sub(cnt, 0.0 if include_self else 1.0, out=n_pos[lev])
        else:
            log_w[lev, rows] = -torch.log(cnt)
            gid[lev, rows] = inv
            n_pos[lev, rows] = cnt if include_self else cnt - 1.0
        n_groups.append(int(counts.numel()))
    n_distinct = device_values(n_groups, dtype, device)         # (no blocking host copy)
    # rows are distinct indices (the ops build them): n of them cover every row
    full = [rows is None or rows.numel() == n for rows, _ in level_rows]
    return Levels(log_w, gid, n_groups, n_pos, n_pos > 0, n_distinct, full, n_common)


def reduction_weights(lv: Levels, reduction: str, dtype) -> torch.Tensor:
    """[L, N] weight of each row's loss in the reduced loss: "mean", 1 / (contributing rows
    of the level) on those rows; "sum", 1 on them; "none", the same 0/1 mask (the incoming
    gradient vector multiplies it)."""
    contrib = lv.contrib.to(dtype)
    if reduction == "mean":
        return contrib / contrib.sum(1, keepdim=True).clamp(min=1)
    return contrib


SPARE_GROUPS = 64      # ``class_sum_term``: groups for the rows outside a level


def class_sum_term(z, lv: Levels, scale, include_self, coef=None, need_pos: bool = True):
    """pos[l, i] = z_i.(S_c(i) - d z_i) * scale (d = not include_self), float64; dz for
    coefficients coef. ``need_pos=False`` (a backward pass that has pos): (None, dz).

    coef [L, N] is the coefficient of pos[l, i]; dz_i gets scale * (coef_i (S_c - d z_i)
    + A_c - d coef_i z_i) with A_c = sum_{i in c} coef_i z_i.

    z_i.S_c is taken as |c| (z_i.S_c / |c|) and summed in float64: |c| logits inside the
    validated bound sum past float32's range (a class of 17 rows at the bound), and the exact
    loss was -inf (an extremes audit).

    Every row takes part in every level's sums, with no index list of a level's rows (a
    ``nonzero`` per level and pass: a host sync on CUDA): the rows outside a level (gid -1)
    go to SPARE_GROUPS spare groups before the level's own (row i to spare i mod SPARE_GROUPS:
    on CUDA index_add_ adds with atomics, and half the rows in one group would queue on one
    row's addresses), which nothing reads, and their pos and dz terms are masked to exactly
    0. The level's groups sum their rows in the same order as over the level's rows alone, so
    fp32 / fp64 numbers are those of that form, bit for bit (a 16-bit dz now adds
    scale * grad in one rounding, as a full level always did; the index list's
    ``index_add_`` rounded the product first).
    """
    n, d = z.shape
    n_levels = lv.gid.shape[0]
    dz = torch.zeros_like(z) if coef is not None else None
    delta = 0.0 if include_self else 1.0
    # Everything of shape [L, N] is formed once for all levels; only the [N, d] work (the sums,
    # their gather, the products with z) runs per level: each op is a kernel launch on CUDA,
    # and a three-level loss spent ~100 of them here.
    partial = not all(lv.full)
    inside = lv.gid >= 0 if partial else None
    if partial:
        # the rows outside a level: spare groups 0 .. SPARE_GROUPS - 1, the level's own groups
        # after them (an offset of a whole level's table, so every group sums the same rows in
        # the same order)
        spread = torch.arange(n, device=z.device) % SPARE_GROUPS
        spare_first = torch.where(inside, lv.gid + SPARE_GROUPS, spread)
    if need_pos:
        mean_dot = torch.empty(lv.gid.shape, dtype=torch.float64, device=z.device)
        # |c(i)| (>= 1 inside a level, where i is in c; the clamp only keeps the spare rows of
        # an include_self level, 0 there, from dividing by 0)
        size = (lv.n_pos.double() + delta).clamp(min=1.0)
        size_z = size.to(z.dtype)
    if coef is not None:
        two_delta_z = 2.0 * delta * z
    for lev in range(n_levels):
        full = lv.full[lev]
        g = lv.gid[lev] if full else spare_first[lev]
        sums = torch.zeros(lv.n_groups[lev] + (0 if full else SPARE_GROUPS), d, dtype=z.dtype,
                           device=z.device)
        sums.index_add_(0, g, z)
        s_rows = sums[g]
        if need_pos:
            torch.sum(z * (s_rows / size_z[lev][:, None]), dim=1, dtype=torch.float64,
                      out=mean_dot[lev])
        if coef is not None:
            c = coef[lev].to(z.dtype)
            # (rows outside the level add only to the spare groups' acc, which only they read)
            acc = torch.zeros_like(sums).index_add_(0, g, z * c[:, None])
            grad = c[:, None] * (s_rows - two_delta_z) + acc[g]
            if not full:
                grad = torch.where(inside[lev][:, None], grad, torch.zeros_like(grad))
            dz.add_(grad, alpha=scale)
    if not need_pos:
        return None, dz
    # the scale as z's dtype (float32 or float64, the compute dtype) holds it, as a Python
    # float: torch.as_tensor(scale, device=cuda) was a blocking host-to-device copy here, after
    # the LSE kernels
    scale_z = float(np.float32(scale)) if z.dtype == torch.float32 else float(scale)
    sq = (z * z).sum(1)
    term = (mean_dot * size - delta * sq.double()) * scale_z
    pos = torch.where(inside, term, torch.zeros_like(term)) if partial else term
    return pos, dz


ARGMAX_GRAD_ROWS = 4096      # rows per block of `argmax_grad`'s float64 temporaries


def argmax_grad(z, lv_argmax, gamma, scale, key_side: bool = True, precise: bool = False):
    """dz for coefficient gamma [L, N] on s_{i, argmax[l, i]} (the row-max path): row i gets
    gamma z_a (query side), key a gets gamma z_i (key side; ``key_side=False``: not, for an
    engine that folded it into its own blocks). ``precise``: summed in float64 (a key shared by
    many rows sums terms that may cancel), returned in z's dtype; its float64 copies of z are
    made a block of rows at a time (the whole-matrix copies, gathered and scaled, were ~4 N x d
    float64 arrays: +50 % on the official loss's peak; a memory audit). The order of the sums
    is the whole-matrix one: every query-side term, then the key sides in row order."""
    acc = torch.float64 if precise else z.dtype
    n = z.shape[0]
    step = ARGMAX_GRAD_ROWS if precise else max(n, 1)
    dz = torch.zeros(z.shape, dtype=acc, device=z.device)
    for lev in range(gamma.shape[0]):
        a = lv_argmax[lev]
        gm = (gamma[lev] * scale).to(acc)[:, None]
        for r0 in range(0, n, step):
            r = slice(r0, r0 + step)
            dz[r].add_(gm[r] * z[a[r]].to(acc))
        if key_side:
            for r0 in range(0, n, step):
                r = slice(r0, r0 + step)
                dz.index_add_(0, a[r], gm[r] * z[r].to(acc))
    return dz.to(z.dtype)


def loss_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype of the returned loss: float32 for 16-bit inputs, else the input's dtype."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def ratio(lse, rmax, log_eps):
    """r = exp(LSE - M) / D, D = exp(LSE - M) + eps * n_groups: the official loss's d/dLSE."""
    a = lse - rmax
    return torch.exp(a - torch.logaddexp(a, log_eps))
