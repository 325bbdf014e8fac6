"""The official row max's share of the gradient, folded into the row-block engine's blocks.

The official loss subtracts each row's max M_l,i = s_{i,a} (a = a_l,i: the arg-max the dense
reference takes, ``_tied_keys``), so its gradient puts -g_li on s_ia, where the LSE part puts
g_li p_l,ia, and p_l,ia ~ 1 wherever one key dominates the row (large logits). The dense
reference adds both into one gradient entry, g (p - 1), before its GEMM. Added apart (the LSE
part inside the engine's GEMMs, -g after them), both are summed over every row sharing the key
a, at the size of the terms, and their difference keeps ~N ulp of them: on low-dimensional
embeddings most rows share one or two arg-max keys (``bench/official_fuzz.py``: 23x the tests'
rule at d = 1).

So the engine (``_lse_torch._engine(fold_argmax=True)``) writes the entry g (p - 1) itself,
formed so that the cancellation is exact: with t = w_a e_ia the arg-max term of the row's sum
and o = the sum of all its other terms (both relative to the block's shift),

    g (p - 1) = -g o / (t + o) = -g sigmoid(log o - log t),

where o is the float64 sum minus t (the block step's float64 sums of fp32 products: t is one
of them, the same fp32 product) and the level-specific keys' part a log-sum-exp without a:
o = 0 (every other term below e^-C) gives exactly 0, as the reference's p - 1 = 1 - 1 does.
"""
from __future__ import annotations

import torch

from hiertail_fast.ops._tied_keys import first_tied_key


class MaxFold:
    """Per call: each key's reference arg-max among equal rows, and its block column."""

    def __init__(self, z: torch.Tensor, visible: torch.Tensor, cidx: torch.Tensor | None,
                 ridx: torch.Tensor):
        n, n_levels = z.shape[0], visible.shape[0]
        ids = torch.arange(n, device=z.device)
        # each key id moved to the first equal visible key (duplicate rows: the reference's
        # arg-max), per level
        self.tied = first_tied_key(z, ids.expand(n_levels, n), visible)
        common = ids if cidx is None else cidx
        self.col_of = torch.full((n,), -1, dtype=torch.long, device=z.device)
        self.col_of[common] = torch.arange(common.numel(), device=z.device)
        self.rcol_of = torch.full((n,), -1, dtype=torch.long, device=z.device)
        self.rcol_of[ridx] = torch.arange(ridx.numel(), device=z.device)

    def shares(self, arg_b, g, e, sums, wc, v_r):
        """The entries g (p - 1) of one block, read from its forward values (before the
        positives write into them). arg_b [L, b]: the engine's arg-max key ids; g [L, b]: the
        LSE coefficients; e [b, N_c] = exp(s - shift) on the common keys (None if none), sums
        [L, b] their weighted sums, wc [L, N_c] their weights; v_r [L, b, N_r] = s + log w -
        shift on the level-specific keys (-inf hidden; None if none).
        -> (col, rcol [L, b]: the entry's common / rest column, -1 where it is not one;
            share [L, b] in g's dtype; x [L, b]: e at col (0 where col < 0))."""
        tgt = self.tied.gather(1, arg_b)
        col, rcol = self.col_of[tgt], self.rcol_of[tgt]
        at_c = col >= 0
        dt = torch.float64
        log_t = torch.zeros(g.shape, dtype=dt, device=g.device)
        others = torch.zeros(g.shape, dtype=dt, device=g.device)
        x = torch.zeros_like(g)
        if e is not None:
            cc = col.clamp(min=0)
            x = torch.where(at_c, e.gather(1, cc.t()).t(), x)
            t_c = (wc.gather(1, cc) * x).to(dt)                   # the same fp32 product
            log_t = torch.where(at_c, torch.log(t_c), log_t)
            others = (sums.to(dt) - torch.where(at_c, t_c, 0.0)).clamp_(min=0.0)
        log_o = torch.log(others)
        if v_r is not None:
            at_r = rcol >= 0
            rc = rcol.clamp(min=0)[:, :, None]
            v = v_r.to(dt)
            log_t = torch.where(at_r, v.gather(2, rc).squeeze(2), log_t)
            own = torch.zeros(v.shape, dtype=torch.bool, device=v.device)
            v = v.masked_fill(own.scatter_(2, rc, at_r[:, :, None]), float("-inf"))
            log_o = torch.logaddexp(log_o, torch.logsumexp(v, dim=2))
        share = -g.to(dt) * torch.sigmoid(log_o - log_t)
        return col, rcol, share.to(g.dtype), x


def set_at(block: torch.Tensor, col: torch.Tensor, take: torch.Tensor, val: torch.Tensor):
    """block[i, col[i]] = val[i] where take[i] and col[i] >= 0 (block: a contiguous [b, n]
    matrix), no host sync: rows not taken write their own entry back."""
    rows, width = block.shape
    flat = torch.arange(rows, device=block.device) * width + col.clamp(min=0)
    view = block.view(-1)
    view.index_put_((flat,), torch.where(take & (col >= 0), val, view[flat]))
