"""dL/dτ of a learnable temperature, both variants, summed at the level of the logits.

The loss depends on τ only through S = Z Zᵀ/τ, so dL/dτ = -(1/τ) Σ_ik G_ik s_ik (G = dL/dS).
Taken as ⟨Z, dL/dZ⟩ / 2 (the generic link through the rows, which the exact variant used until
2026-12-05) it carries dL/dZ's rounding times |z|: in the official variant the terms of that
inner product include the row max's gradient times s_{i,argmax} (|s| up to thousands at small
τ) cancelling against the positives' terms, and the result, often 1e-4, came out up to 2e-3 off
where the dense fp32 reference, summing G ⊙ S, is within 1e-5. The exact variant cancels the
same way wherever a row's positives hold its LSE: ``bench/official_fuzz.py --variant exact
--learnable-temperature`` (seed 61) found dL/dτ 1e-3 to 2e-3 off a true ~1e-16 (3 rows of one
class at τ 0.01; 100-220x the suite's rule) where the fp32 reference is within 1e-21. Per row
of a level, with the row max M_i taken out inside the sums (it cancels exactly: Σ_k p_ik = 1,
and the positives' weights sum to 1)::

    official: Σ_k G_ik s_ik = r_i Σ_k p_ik (s_ik - M_i) - (1/n_i) Σ_{j∈P(i)} q_ij (s_ij - M_i)
    exact:    Σ_k G_ik s_ik =     Σ_k p_ik (s_ik - M_i) - (1/n_i) Σ_{j∈P(i)}      (s_ij - M_i)

p_ik = w_k exp(s_ik - LSE_i) over the level's keys, e_ij = exp(s_ij - M_i), q_ij = e_ij / (e_ij
+ eps), r_i = exp(LSE_i - M_i) / D_i (``_loss_terms.ratio``): no term carries s's magnitude.
``LogitsTemperature`` adds an exact 0 to the loss whose backward returns that dL/dτ (the loss
itself is taken with τ as a constant): one more pass over the logits in row blocks (torch
operators, a few [b, N] temporaries of at most ``BLOCK_BYTES``), in the backward of a call whose
τ requires grad only.
"""
from __future__ import annotations

import torch

from hiertail_fast.ops._autograd import eager_twin, first_order_backward
from hiertail_fast.ops._contrastive_pairs import OFFICIAL_EPS
from hiertail_fast.ops._loss_terms import Levels, ratio
from hiertail_fast.ops._lse_torch import block_bytes

BLOCK_BYTES = 64 << 20          # one row block's [b, N] temporaries (about four of them)


def g_dot_s(z: torch.Tensor, lv: Levels, scale: float, include_self: bool, g: torch.Tensor,
            variant: str) -> torch.Tensor:
    """Σ_l Σ_i g[l, i] Σ_k G_lik s_lik of the loss (the module docstring's per-row formulas),
    z [N, d] in the compute dtype, g [L, N] the rows' incoming coefficients. Per row block: one
    GEMM, one exp; p = w e / Σ w e with e = exp(s - M)."""
    official = variant == "official"
    n = z.shape[0]
    total = torch.zeros((), dtype=torch.float64, device=z.device)
    log_eps = torch.log(OFFICIAL_EPS * lv.n_distinct.to(z.dtype))             # [L]
    # within the engines' block budget too (the default 48 MB gives BLOCK_BYTES: 64 MB for the
    # ~four temporaries was fixed whatever $HIERTAIL_CPU_BLOCK_BYTES; a memory audit)
    budget = min(BLOCK_BYTES, block_bytes(z.device) * 4 // 3)
    rows_per_block = max(1, budget // (4 * n * z.element_size()))
    for lev in range(lv.log_w.shape[0]):
        active = (g[lev] != 0).nonzero().squeeze(1)      # rows that reach the loss here
        gid = lv.gid[lev]
        keys = None if lv.full[lev] else gid >= 0        # None: every row is a key
        w = torch.exp(lv.log_w[lev].to(z.dtype))         # 0 outside the level
        for start in range(0, active.numel(), rows_per_block):
            rows = active[start:start + rows_per_block]
            s = torch.mm(z[rows], z.t()).mul_(scale)                          # [b, N]
            if keys is not None:
                s.masked_fill_(~keys, float("-inf"))     # keys outside the level
            s.sub_(s.amax(dim=1, keepdim=True))          # s - M: <= 0 on the level's keys
            e = torch.exp(s)                             # 0 outside the level
            if keys is not None:
                s.masked_fill_(~keys, 0.0)               # no -inf left to multiply by 0
            we = e * w
            den = we.sum(1)                              # exp(LSE - M)
            a = (we.mul_(s)).sum(1) / den                # Σ_k p_ik (s_ik - M_i)
            pos = gid[rows, None] == gid[None, :]
            if not include_self:
                pos[torch.arange(rows.numel(), device=z.device), rows] = False
            if official:
                q_s = e.div_(e + OFFICIAL_EPS).mul_(s).mul_(pos)   # q_ij (s_ij - M_i) on P(i)
                a = a * ratio(torch.log(den), torch.zeros_like(den), log_eps[lev])
            else:
                q_s = s.mul_(pos)                                  # (s_ij - M_i) on P(i)
            per_row = a - q_s.sum(1) / lv.n_pos[lev, rows].to(z.dtype).clamp(min=1)
            total += (g[lev, rows].to(torch.float64) * per_row.to(torch.float64)).sum()
    return total


@eager_twin
class LogitsTemperature(torch.autograd.Function):
    """(τ, z, lv, scale, include_self, variant, base, shape, dtype) -> zeros(shape): an exact 0
    added to the loss, whose backward gives dL/dτ (the module docstring). ``base`` [L, N]: the
    reduction's row weights (``mean``: contributing rows / their count; ``sum`` and ``none``:
    the contributing rows)."""

    @staticmethod
    def forward(tau, z, lv, scale, include_self, variant, base, shape, dtype):
        return torch.zeros(shape, dtype=dtype, device=z.device)

    @staticmethod
    def setup_context(ctx, inputs, output):
        tau, z, ctx.lv, ctx.scale, ctx.include_self, ctx.variant, base, _, _ = inputs
        ctx.save_for_backward(tau, z, base)

    @staticmethod
    @first_order_backward("balanced_contrastive_loss")
    def backward(ctx, grad_out):
        tau, z, base = ctx.saved_tensors
        go = grad_out.to(base.dtype)
        g = base * (go[None] if go.dim() else go)                             # [L, N]
        dot = g_dot_s(z, ctx.lv, ctx.scale, ctx.include_self, g, ctx.variant)
        # dL/dτ = -(1/τ) Σ G s, τ = 1 / scale
        grad_tau = (-ctx.scale * dot).to(device=tau.device, dtype=tau.dtype)
        return grad_tau, None, None, None, None, None, None, None, None
