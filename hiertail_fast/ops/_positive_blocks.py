"""The official variant's positive pairs, read from the torch engine's own blocks: no extra GEMM.

Every row block of the engine (``_lse_torch._engine``) holds e_ik = exp(s_ik - m_i) for all
common keys k, m_i being the row max over those keys. With the common keys SORTED BY LABEL, the
positives of row i at level l are one column range [start_c, end_c) of its block row, so

    t_ij = log(e_ij f_i + eps),  q_ij = e_ij f_i / (e_ij f_i + eps),  f_i = exp(m_i - M_i)

(M_i: the level's row max, level-specific keys included) are element-wise work on entries the
forward already computed, summed per row into T_i and Q_i. Their gradient coefficient c_i q_ij
(c_i = -g_i / n_i) is added into the block's gradient matrix before its two GEMMs. The official
variant then costs the exact variant's 3 GEMMs plus element-wise work over sum_c n_c^2 entries,
where the separate pass (``_contrastive_pairs.positive_pairs``) paid 3 more GEMMs over them.

Same values as the dense reference: s_ij and m_i come from the same product, so the pair
(i, arg-max) gets e = 1 exactly and no x exceeds 0. Where M_i comes from another product (a
level-specific key holds the max; f_i < 1), a positive can tie it only as a bitwise duplicate of
the arg-max row: those rows go through explicit pair lists with ``_consistent_with_max``, as
the level-specific (rest) keys do.

A level whose label groups are not contiguous in the one key order (levels that do not nest;
the order favours the level with the most positive pairs) is left to ``positive_pairs``;
``handled`` says which.
"""
from __future__ import annotations

import torch

from hiertail_fast.ops._contrastive_pairs import OFFICIAL_EPS, _consistent_with_max, _tie_bound
from hiertail_fast.ops._lse_torch import exp_shifted_

SLICE_GROUP = 64        # groups with at least this many common keys are read as 2-D slices


def _constant_per_group(values: torch.Tensor, g: torch.Tensor) -> bool:
    """Whether every group (g >= 0) has one value (rows outside every group: ignored)."""
    inside = g >= 0
    if not bool(inside.any()):
        return True
    v, gi = values[inside], g[inside]
    first = torch.zeros(int(gi.max()) + 1, dtype=v.dtype, device=v.device)
    first[gi] = v                          # one member's value per group (any member)
    return bool((first[gi] == v).all())


def key_order(gid: torch.Tensor) -> torch.Tensor:
    """Stable lexicographic order of the rows by their group ids, the level with the most
    positive pairs (sum_c n_c^2) most significant: that level's groups are always contiguous,
    and for nested levels (the costliest is then the coarsest) every level's are."""
    cost = [float((torch.bincount(g[g >= 0]).double() ** 2).sum()) if bool((g >= 0).any())
            else 0.0 for g in gid]
    order = torch.arange(gid.shape[1], device=gid.device)
    for lev in sorted(range(gid.shape[0]), key=lambda lev: cost[lev]):
        order = order[torch.argsort(gid[lev, order], stable=True)]
    return order


class BlockPositives:
    """Positive-pair sums T, Q [L, N] (and gradient terms) of the levels whose groups are
    contiguous among the common keys ``cidx`` (common key order = ``key_order``)."""

    def __init__(self, z, gid, n_groups, include_self: bool, pos_coef, scale: float, common,
                 log_w=None):
        n_levels, n = gid.shape
        dev = gid.device
        self.z, self.gid, self.include_self = z, gid, include_self
        self.pos_coef = None if pos_coef is None else pos_coef.to(z.dtype)
        self.order = key_order(gid)
        self.cidx = self.order[common[self.order]]
        self.n_c = int(self.cidx.numel())
        self.cpos = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.cpos[self.cidx] = torch.arange(self.n_c, device=dev)
        self.T = torch.zeros(n_levels, n, dtype=z.dtype, device=dev)
        self.Q = torch.zeros_like(self.T)
        self.start, self.count, self.handled = [], [], []
        for lev in range(n_levels):
            g = gid[lev, self.cidx]
            inside = g >= 0
            cnt = torch.bincount(g[inside], minlength=n_groups[lev])
            first = torch.full((n_groups[lev],), self.n_c, dtype=torch.long, device=dev)
            pos = torch.arange(self.n_c, device=dev)
            first.scatter_reduce_(0, g[inside], pos[inside], "amin")
            # contiguous <=> every member sits inside [first, first + count)
            ok = bool(((pos[inside] - first[g[inside]]) < cnt[g[inside]]).all())
            self.start.append(first)
            self.count.append(cnt)
            self.handled.append(ok)
        self._scale = scale
        self._tie_unit = None
        self._rest_map = None
        # one level whose key weights are constant inside each group (w_k = 1 / class size):
        # the engine may keep w folded into its GEMM operands (``_lse_torch._engine``)
        self.foldable = n_levels == 1 and self.handled[0] and log_w is not None and bool(
            _constant_per_group(log_w[0, self.cidx], gid[0, self.cidx]))

    def _tie(self, rows, row_max_b):
        """``_contrastive_pairs._tie_bound`` of the block's rows (their maxima row_max_b)."""
        if self._tie_unit is None:                       # the row-max-free part, once
            zero = torch.zeros(self.z.shape[0], dtype=self.z.dtype, device=self.z.device)
            self._tie_unit = _tie_bound(self.z, zero, self._scale)
        return self._tie_unit[rows] + torch.finfo(self.z.dtype).eps * row_max_b.abs()

    # ---- forward: common keys
    def common_block(self, rows, e, m_c, max_b, arg_b, target=None, inv_norm=1.0):
        """Sums of the block's positives with a common key, into T and Q.

        rows [b] (original ids); e [b, n_c] = exp(s - m_c), the forward values; target: the
        block's gradient matrix (E * weights, normalised by 1 / inv_norm; a float or a [b]
        tensor of per-row factors), which gets the positives' coefficients c_i q_ij * inv_norm
        added in place (no copy of q is kept). target may be e itself: every positive entry
        is read before it is written."""
        for lev, ok in enumerate(self.handled):
            if not ok:
                continue
            g = self.gid[lev, rows]
            f = torch.exp(m_c - max_b[lev]).clamp_(max=1.0)         # 1 when the max is common
            cnt = torch.where(g >= 0, self.count[lev][g.clamp(min=0)], torch.zeros_like(g))
            big = (cnt >= SLICE_GROUP) & (f == 1.0)
            t_row = torch.zeros(rows.numel(), dtype=e.dtype, device=e.device)
            q_row = torch.zeros_like(t_row)
            coef = None if target is None else self.pos_coef[lev, rows] * inv_norm
            for grp in torch.unique(g[big]).tolist():
                loc = ((g == grp) & big).nonzero().squeeze(1)
                self._slice(lev, grp, loc, rows, e, t_row, q_row, coef, target)
            small = ((cnt > 0) & ~big).nonzero().squeeze(1)
            if small.numel():
                self._pairs(lev, small, cnt, g, rows, e, f, max_b[lev], arg_b[lev],
                            t_row, q_row, coef, target)
            self.T[lev, rows] += t_row
            self.Q[lev, rows] += q_row

    def _slice(self, lev, grp, loc, rows, e, t_row, q_row, coef, target):
        """One group's rows x its common keys as a 2-D slice of the block (f = 1, so
        x = exp(s - M) exactly). Passes: x + eps, x / that, log of it in place, two row sums,
        one addcmul into the target."""
        c0 = int(self.start[lev][grp])
        c1 = c0 + int(self.count[lev][grp])
        r0, r1 = int(loc[0]), int(loc[-1]) + 1
        rsel = slice(r0, r1) if r1 - r0 == loc.numel() else loc
        x = e[rsel, c0:c1]
        den = x + OFFICIAL_EPS
        q = torch.div(x, den)
        t_sum = torch.log_(den).sum(1)
        q_sum = q.sum(1)
        if not self.include_self:                   # take the row's own key back out
            cp = self.cpos[rows[loc]] - c0
            mine = ((cp >= 0) & (cp < c1 - c0)).nonzero().squeeze(1)
            if mine.numel():
                x_self = x[mine, cp[mine]]
                t_sum[mine] -= torch.log(x_self + OFFICIAL_EPS)
                q_sum[mine] -= x_self / (x_self + OFFICIAL_EPS)
                q[mine, cp[mine]] = 0.0
        t_row[rsel] += t_sum
        q_row[rsel] += q_sum
        if target is not None:
            c = coef[rsel][:, None]
            if isinstance(rsel, slice):
                target[rsel, c0:c1].addcmul_(q, c)
            else:
                target[rsel, c0:c1] += q * c

    def _pairs(self, lev, small, cnt, g, rows, e, f, row_max, arg_max, t_row, q_row, coef,
               target):
        """Explicit (row, key) lists for small groups and for rows whose max is not common."""
        ne = cnt[small]
        r = torch.repeat_interleave(small, ne)
        offs = torch.arange(r.numel(), device=e.device) - torch.repeat_interleave(
            torch.cumsum(ne, 0) - ne, ne)
        col = self.start[lev][g[r]] + offs
        if not self.include_self:
            keep = col != self.cpos[rows[r]]
            r, col = r[keep], col[keep]
        if not r.numel():
            return
        flat = r * e.shape[1] + col
        x = e.reshape(-1)[flat] * f[r]
        odd = (f[r] < 1.0).nonzero().squeeze(1)
        if odd.numel():                       # max from another product: tie rule by rows
            xo = torch.log(x[odd]).clamp_(min=-1e30)
            xo = _consistent_with_max(xo, r[odd], self.cidx[col[odd]], self.z, row_max,
                                      arg_max, self._tie(rows, row_max))
            x[odd] = exp_shifted_(xo)
        den = x + OFFICIAL_EPS
        q = torch.div(x, den)
        t_row.index_add_(0, r, torch.log_(den))
        q_row.index_add_(0, r, q)
        if target is not None:
            target.view(-1).index_add_(0, flat, q.mul_(coef[r]))

    def coef_max(self, rows) -> float:
        if self.pos_coef is None:
            return 0.0
        return float(self.pos_coef[:, rows].abs().max()) if rows.numel() else 0.0

    # ---- level-specific (rest) keys: small dense [b, N_r]
    def _rest_columns(self, ridx):
        """[L', G] column (in ridx) of each handled level's group's one rest key, -1 if none,
        and the handled levels L'; None when a group has several rest keys (then the general
        mask path). The usual case: level-specific keys are that level's prototypes, one per
        label."""
        if self._rest_map is None:
            levels = [lev for lev, ok in enumerate(self.handled) if ok]
            width = max([self.count[lev].numel() for lev in levels] + [1])
            cols = torch.full((len(levels), width), -1, dtype=torch.long, device=ridx.device)
            pos = torch.arange(ridx.numel(), device=ridx.device)
            one_each = True
            for k, lev in enumerate(levels):
                g = self.gid[lev, ridx]
                inside = g >= 0
                if bool((torch.bincount(g[inside], minlength=width) > 1).any()):
                    one_each = False
                    break
                cols[k, g[inside]] = pos[inside]
            self._rest_map = (cols, torch.tensor(levels, dtype=torch.long, device=ridx.device)
                              ) if one_each else False
        return self._rest_map or None

    def rest_block(self, rows, ridx, s_r, max_b, arg_b, want_grad: bool):
        """Positive pairs with a rest key; returns their gradient coefficients [b, N_r] (or
        None). s_r = scale * z_rows . z_ridx (unshifted)."""
        out = None
        if not ridx.numel():
            return out
        rest_map = self._rest_columns(ridx)
        if rest_map is not None:
            return self._rest_block_one_each(rows, ridx, s_r, max_b, arg_b, want_grad, *rest_map)
        for lev, ok in enumerate(self.handled):
            if not ok:
                continue
            g_rows, g_keys = self.gid[lev, rows], self.gid[lev, ridx]
            mask = (g_rows[:, None] == g_keys[None, :]) & (g_rows[:, None] >= 0)
            if not self.include_self:
                mask &= rows[:, None] != ridx[None, :]
            pi, pj = mask.nonzero(as_tuple=True)
            if not pi.numel():
                continue
            i = rows[pi]
            x = s_r[pi, pj] - max_b[lev][pi]
            # pi: block-local rows (index the block's arg-max and tie bound); ridx[pj] global
            x = exp_shifted_(_consistent_with_max(x, pi, ridx[pj], self.z, max_b[lev],
                                                  arg_b[lev], self._tie(rows, max_b[lev])))
            q = x / (x + OFFICIAL_EPS)
            self.T[lev].index_add_(0, i, torch.log(x + OFFICIAL_EPS))
            self.Q[lev].index_add_(0, i, q)
            if want_grad:
                if out is None:
                    out = torch.zeros_like(s_r)
                out.index_put_((pi, pj), q * self.pos_coef[lev, i], accumulate=True)
        return out

    def _rest_block_one_each(self, rows, ridx, s_r, max_b, arg_b, want_grad, cols, levels):
        """``rest_block`` when every group has at most one rest key: each (level, row) has at
        most one rest positive, looked up in ``cols``; all handled levels in one vectorised
        pass (flattened (level, row) index f = k * b + row)."""
        b = rows.numel()
        g = self.gid[levels][:, rows]                                     # [L', b]
        pj = torch.where(g >= 0, cols.gather(1, g.clamp(min=0)), torch.full_like(g, -1))
        valid = pj >= 0
        if not self.include_self:
            valid &= rows[None, :] != ridx[pj.clamp(min=0)]
        k, pi = valid.nonzero(as_tuple=True)
        if not pi.numel():
            return None
        pj = pj[k, pi]
        lev_max, lev_arg = max_b[levels], arg_b[levels]                  # [L', b]
        flat = k * b + pi
        x = s_r[pi, pj] - lev_max.reshape(-1)[flat]
        tie = self._tie(rows, lev_max).reshape(-1)                        # [L' * b]
        x = exp_shifted_(_consistent_with_max(x, flat, ridx[pj], self.z, lev_max.reshape(-1),
                                              lev_arg.reshape(-1), tie))
        q = x / (x + OFFICIAL_EPS)
        n = self.T.shape[1]
        at = levels[k] * n + rows[pi]                                     # into T, Q [L, N]
        self.T.view(-1).index_add_(0, at, torch.log(x + OFFICIAL_EPS))
        self.Q.view(-1).index_add_(0, at, q)
        if not want_grad:
            return None
        out = torch.zeros_like(s_r)
        out.index_put_((pi, pj), q * self.pos_coef.view(-1)[at], accumulate=True)
        return out
