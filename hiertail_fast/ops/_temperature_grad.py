"""dL/dτ of a learnable temperature, both variants, summed at the level of the logits.

The loss depends on τ only through S = Z Zᵀ/τ, so dL/dτ = -(1/τ) Σ_ik G_ik s_ik (G = dL/dS).
Taken as ⟨Z, dL/dZ⟩ / 2 (the generic link through the rows, which the exact variant used until
2026-12-05) it carries dL/dZ's rounding times |z|: in the official variant the terms of that
inner product include the row max's gradient times s_{i,argmax} (|s| up to thousands at small
τ) cancelling against the positives' terms, and the result, often 1e-4, came out up to 2e-3 off
where the dense fp32 reference, summing G ⊙ S, is within 1e-5. The exact variant cancels the
same way wherever a row's positives hold its LSE: ``bench/official_fuzz.py --variant exact
--learnable-temperature`` (seed 61) found dL/dτ 1e-3 to 2e-3 off a true ~1e-16 (2-3 rows, each
a class of its own with include_self, at τ 0.01: 100-220x the suite's rule; 15,000x at |s| ~
3e4) where the fp32 reference is within 1e-21. Per row of a level, with the row max M_i taken
out inside the sums (it cancels exactly: Σ_k p_ik = 1, and the positives' weights sum to 1)::

    official: Σ_k G_ik s_ik = r_i Σ_k p_ik (s_ik - M_i) - (1/n_i) Σ_{j∈P(i)} q_ij (s_ij - M_i)
    exact:    Σ_k G_ik s_ik =     Σ_k p_ik (s_ik - M_i) - (1/n_i) Σ_{j∈P(i)}      (s_ij - M_i)

p_ik = w_k exp(s_ik - LSE_i) over the level's keys, e_ij = exp(s_ij - M_i), q_ij = e_ij / (e_ij
+ eps), r_i = exp(LSE_i - M_i) / D_i (``_loss_terms.ratio``): no term carries s's magnitude.
``LogitsTemperature`` adds an exact 0 to the loss whose backward returns that dL/dτ (the loss
itself is taken with τ as a constant): one more pass over the logits in row blocks, in the
backward of a call whose τ requires grad only. Per block one GEMM, then the per-row sums (a, den,
pos below): on CPU in float32 one C kernel (``_temperature_grad.c``: a row read once for its
max, then kept in cache), elsewhere torch operators (``_torch_row_terms``, a few [b, N]
temporaries of at most ``BLOCK_BYTES``; also the kernel's oracle in the tests).
"""
from __future__ import annotations

import torch

from hiertail_fast.ops import _native
from hiertail_fast.ops._autograd import eager_twin, first_order_backward
from hiertail_fast.ops._contrastive_pairs import OFFICIAL_EPS
from hiertail_fast.ops._loss_terms import Levels, ratio
from hiertail_fast.ops._lse_torch import block_bytes, cuda_rows_floor

BLOCK_BYTES = 64 << 20          # one row block's [b, N] temporaries (about four of them)


def kernel():
    """The C kernel (ctypes function), or None (native kernels off or not buildable here)."""
    i64, ptr, f32 = _native.I64, _native.PTR, _native.F32
    return _native.threaded_function("_temperature_grad", "hiertail_temperature_rows_f32",
                                     [i64, i64, i64, ptr, i64, f32, ptr, ptr, ptr, ptr, i64,
                                      f32, ptr])


def _torch_row_terms(x: torch.Tensor, scale: float, gid: torch.Tensor, w: torch.Tensor,
                     rows: torch.Tensor, include_self: bool, official: bool,
                     full: bool = False) -> torch.Tensor:
    """[b, 3] float64 (a, den, pos) of a block of dot products x [b, N] (rows ``rows`` against
    every key; x is not written): s = scale x, M the row max over the level's keys (gid >= 0),
    e = exp(s - M), den = Σ_k w_k e_k, a = Σ_k w_k e_k (s_k - M), pos = Σ over the row's
    positives of q_k (s_k - M), q = 1 (exact) or e / (e + eps) (official). ``full``: every
    key is in the level (no mask to apply)."""
    keys = None if full else gid >= 0
    s = x * scale
    if keys is not None:
        s.masked_fill_(~keys, float("-inf"))     # keys outside the level
    s.sub_(s.amax(dim=1, keepdim=True))          # s - M: <= 0 on the level's keys
    e = torch.exp(s)                             # 0 outside the level
    if keys is not None:
        s.masked_fill_(~keys, 0.0)               # no -inf left to multiply by 0
    we = e * w
    den = we.sum(1)                              # exp(LSE - M)
    a = we.mul_(s).sum(1)                        # den Σ_k p_ik (s_ik - M_i)
    pos = gid[rows, None] == gid[None, :]
    if not include_self:
        pos[torch.arange(rows.numel(), device=x.device), rows] = False
    if official:
        q_s = e.div_(e + OFFICIAL_EPS).mul_(s).mul_(pos)      # q_ij (s_ij - M_i) on P(i)
    else:
        q_s = s.mul_(pos)                                      # (s_ij - M_i) on P(i)
    return torch.stack([a, den, q_s.sum(1)], dim=1).to(torch.float64)


def native_row_terms(fn, x: torch.Tensor, scale: float, gid: torch.Tensor, w: torch.Tensor,
                     rows: torch.Tensor, include_self: bool, official: bool) -> torch.Tensor:
    """``_torch_row_terms`` through the C kernel ``fn`` (from ``kernel()``): x float32 [b, N]
    with unit column stride (not written), gid int32 or int64 [N] (the labels, < 2^31, taken
    as int32 for the kernel's 8-lane compares: g_dot_s converts them once per call), w float32
    [N] (> 0 exactly on the level's keys: 1 / class size there, exp(-inf) = 0 elsewhere), rows
    int64 [b]."""
    b, n = x.shape
    if x.dtype != torch.float32 or w.dtype != torch.float32 or x.stride(1) != 1:
        raise TypeError("the temperature kernel takes float32 blocks with unit column stride")
    lab, w = gid.to(torch.int32).contiguous(), w.contiguous()
    own = lab[rows].contiguous()
    self_col = (torch.full_like(rows, -1) if include_self else rows).contiguous()
    out = torch.empty(b, 3, dtype=torch.float64)
    fn(torch.get_num_threads(), b, n, x.data_ptr(), x.stride(0), float(scale), lab.data_ptr(),
       w.data_ptr(), own.data_ptr(), self_col.data_ptr(), int(official), OFFICIAL_EPS,
       out.data_ptr())
    return out


def _block_rows(n: int, element_size: int, device: torch.device) -> int:
    """Rows per block of the pass over n keys: within BLOCK_BYTES for its ~four [b, N]
    temporaries and within the engines' block budget too (the default 48 MB gives BLOCK_BYTES:
    64 MB for the ~four temporaries was fixed whatever $HIERTAIL_CPU_BLOCK_BYTES; a memory
    audit). On CUDA at least the engines' floor of rows where free memory holds them
    (``_lse_torch.cuda_rows_floor``): the budget alone is 4 rows a block at a million keys,
    ~250,000 blocks of ~15 launches each. The floor counts what the pass keeps live at its
    peak (``_torch_row_terms``: the block x, s, e, w e and e + eps, five [b, N] temporaries of
    the rows' dtype, and the bool positives mask; it sized for one fp32 buffer until
    2026-12-05, up to a third of the free memory in fp32 then, two thirds in fp64). The budget
    on its own still counts four temporaries, as it did."""
    budget = min(BLOCK_BYTES, block_bytes(device) * 4 // 3)
    rows = max(1, budget // (4 * n * element_size))
    if device.type == "cuda":
        rows = cuda_rows_floor(rows, n, device, 5 * element_size + 1)
    return rows


def g_dot_s(z: torch.Tensor, lv: Levels, scale: float, include_self: bool, g: torch.Tensor,
            variant: str) -> torch.Tensor:
    """Σ_l Σ_i g[l, i] Σ_k G_lik s_lik of the loss (the module docstring's per-row formulas),
    z [N, d] in the compute dtype, g [L, N] the rows' incoming coefficients. Per row block: one
    GEMM, then the rows' sums (``native_row_terms`` / ``_torch_row_terms``)."""
    official = variant == "official"
    n = z.shape[0]
    total = torch.zeros((), dtype=torch.float64, device=z.device)
    log_eps = torch.log(OFFICIAL_EPS * lv.n_distinct.to(torch.float64))           # [L]
    fn = kernel() if z.device.type == "cpu" and z.dtype == torch.float32 else None
    rows_per_block = _block_rows(n, z.element_size(), z.device)
    ws = torch.exp(lv.log_w.to(z.dtype))                # [L, N], 0 outside each level
    gids = lv.gid.to(torch.int32) if fn is not None else lv.gid      # (the kernel's labels)
    # one GEMM per row block for every level (a level's rows outside it: g 0, finite terms)
    active = (g != 0).any(0).nonzero().squeeze(1)        # rows that reach the loss
    for start in range(0, active.numel(), rows_per_block):
        rows = active[start:start + rows_per_block]
        x = torch.mm(z[rows], z.t())                                          # [b, N] dots
        for lev in range(lv.log_w.shape[0]):
            gid = gids[lev]
            if fn is not None:
                a, den, pos = native_row_terms(fn, x, scale, gid, ws[lev], rows, include_self,
                                               official).unbind(1)
            else:
                a, den, pos = _torch_row_terms(x, scale, gid, ws[lev], rows, include_self,
                                               official, bool(lv.full[lev])).unbind(1)
            a = a / den                                  # Σ_k p_ik (s_ik - M_i)
            if official:
                a = a * ratio(torch.log(den), torch.zeros_like(den), log_eps[lev])
            per_row = a - pos / lv.n_pos[lev, rows].to(torch.float64).clamp(min=1)
            total += (g[lev, rows].to(torch.float64) * per_row).sum()
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
