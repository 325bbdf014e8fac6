"""Fused class-balanced contrastive loss: autograd Function + backend dispatch, O(N*d) memory.

Factorisation (DESIGN.md §3), per level l and query row i of the level (s = z.z^T / tau)::

    exact:    loss_i = LSE_i - (1/n_i) z_i.(S_c(i) - [not include_self] z_i) / tau
    official: loss_i = log D_i - (1/n_i) sum_{j in P(i)} log(exp(s_ij - M_i) + eps)
              log D_i = logaddexp(LSE_i - M_i, log(eps * #distinct labels))

LSE_i = log sum_k w_k exp(s_ik) and M_i = max_k s_ik are the quadratic core, computed by a
backend (``torch``: ``_lse_torch`` row blocks; ``triton``: ``kernels/balanced_contrastive_loss``).
S_c are class sums (one index_add, O(N*d)); the official positive terms go through
``_contrastive_pairs`` (positive pairs only), read from the torch engine's own blocks
(``_positive_blocks``), or, on the Triton engine, its positives kernel
(``kernels/balanced_contrastive_loss_positives``). Hand-written backward, per-row coefficient g_i:

    exact:    dLSE coefficient g_i;  ds_ij (j in P(i)) = -g_i / n_i   (class-sum form)
    official: dLSE coefficient g_i r_i, r_i = exp(LSE_i - M_i - log D_i);
              ds_ij (j in P(i)) = -(g_i / n_i) q_ij, q_ij = e_ij / (e_ij + eps);
              dM_i = g_i (Q_i / n_i - r_i) routed to s_{i, argmax_i} (as torch.max does).

With a scalar reduction on the torch backend the per-row coefficients are known during forward,
so the gradient is computed there (3 GEMMs per block in total) and backward only scales it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hiertail_fast._validation import validate_contrastive_inputs
from hiertail_fast.ops import (
    _attention_lse,
    _custom_ops,
    _lse_symmetric,
    _lse_torch,
    _triton_loss,
)
from hiertail_fast.ops._amp import autocast_off, loss_inputs
from hiertail_fast.ops._autograd import first_order_backward, graph_anchor
from hiertail_fast.ops._contrastive_pairs import OFFICIAL_EPS, positive_pairs
from hiertail_fast.ops._dispatch import (  # noqa: F401  (LOSS_BACKENDS: re-exported)
    LOSS_BACKENDS,
    choose_loss_backend,
    on_input_device,
    own_engine,
    refine_loss_backend,
    requested_backend,
    triton_available,
)
from hiertail_fast.ops._positive_blocks import POSITIVES_ENV, BlockPositives, positives_plan
from hiertail_fast.ops._tied_keys import first_tied_key
from hiertail_fast.reference.balanced_contrastive_loss import balanced_contrastive_loss_ref


def _backend_module(name: str):
    return {"torch": _lse_torch, "attention": _attention_lse, "triton": _triton_loss}[name]


@dataclass
class _Levels:
    """Label structure of L levels over the N rows of one problem (no autograd)."""

    log_w: torch.Tensor        # [L, N] -log(class size), -inf for rows not in the level
    gid: torch.Tensor          # [L, N] group id within the level, -1 if not in the level
    n_groups: list[int]
    n_pos: torch.Tensor        # [L, N] |P(i)| (compute dtype), 0 if not in the level
    contrib: torch.Tensor      # [L, N] bool, rows with a non-empty positive set
    n_distinct: torch.Tensor   # [L] number of distinct labels = sum_k w_k
    full: list[bool]           # per level: every row is in it (no index lists needed)
    n_common: int = 0          # rows [0, n_common) are in every level (the embeddings)


def _make_levels(n: int, level_rows, include_self: bool, dtype, device,
                 n_common: int = 0) -> _Levels:
    n_levels = len(level_rows)
    log_w = torch.full((n_levels, n), float("-inf"), dtype=dtype, device=device)
    gid = torch.full((n_levels, n), -1, dtype=torch.long, device=device)
    n_pos = torch.zeros(n_levels, n, dtype=dtype, device=device)
    n_groups = []
    for lev, (rows, labels) in enumerate(level_rows):
        _, inv, counts = torch.unique(labels, return_inverse=True, return_counts=True)
        cnt = counts[inv].to(dtype)
        log_w[lev, rows] = -torch.log(cnt)
        gid[lev, rows] = inv
        n_pos[lev, rows] = cnt - (0.0 if include_self else 1.0)
        n_groups.append(int(counts.numel()))
    n_distinct = torch.tensor(n_groups, dtype=dtype, device=device)
    # rows are distinct indices (the ops build them): n of them cover every row
    full = [rows.numel() == n for rows, _ in level_rows]
    return _Levels(log_w, gid, n_groups, n_pos, n_pos > 0, n_distinct, full, n_common)


def _class_sum_term(z, lv: _Levels, scale, include_self, coef=None):
    """pos[l, i] = z_i.(S_c(i) - d z_i) * scale (d = not include_self); dz for coefficients coef.

    coef [L, N] is the coefficient of pos[l, i]; dz_i gets scale * (coef_i (S_c - d z_i)
    + A_c - d coef_i z_i) with A_c = sum_{i in c} coef_i z_i.
    """
    n, d = z.shape
    pos = torch.zeros(lv.gid.shape, dtype=z.dtype, device=z.device)
    dz = torch.zeros_like(z) if coef is not None else None
    delta = 0.0 if include_self else 1.0
    sq = (z * z).sum(1)
    for lev in range(lv.gid.shape[0]):
        # a level over every row takes them all (nonzero would cost a host sync)
        rows = slice(None) if lv.full[lev] else (lv.gid[lev] >= 0).nonzero().squeeze(1)
        g = lv.gid[lev, rows]
        zr = z[rows]
        sums = torch.zeros(lv.n_groups[lev], d, dtype=z.dtype, device=z.device)
        sums.index_add_(0, g, zr)
        s_rows = sums[g]
        pos[lev, rows] = ((zr * s_rows).sum(1) - delta * sq[rows]) * scale
        if coef is not None:
            c = coef[lev, rows].to(z.dtype)
            acc = torch.zeros_like(sums).index_add_(0, g, zr * c[:, None])
            grad = c[:, None] * (s_rows - 2.0 * delta * zr) + acc[g]
            if lv.full[lev]:
                dz.add_(grad, alpha=scale)
            else:
                dz.index_add_(0, rows, grad, alpha=scale)
    return pos, dz


def _argmax_grad(z, lv_argmax, gamma, scale):
    """dz for coefficient gamma [L, N] on s_{i, argmax[l, i]} (the row-max path)."""
    dz = torch.zeros_like(z)
    for lev in range(gamma.shape[0]):
        a = lv_argmax[lev]
        gm = (gamma[lev] * scale).to(z.dtype)[:, None]
        dz.add_(gm * z[a])
        dz.index_add_(0, a, gm * z)
    return dz


def _triton_positives(backend: str, zc: torch.Tensor) -> bool:
    """Whether the official positives run on the Triton kernel: always on the Triton engine; on
    the others where $HIERTAIL_POSITIVES=triton asks and the rows are fp32 (the kernel takes no
    float64)."""
    if backend == "triton":
        return True
    if positives_plan() != "triton" or zc.dtype != torch.float32:
        return False
    if not triton_available(zc.device):
        raise ValueError(f"{POSITIVES_ENV}=triton needs CUDA tensors and triton (or "
                         f"TRITON_INTERPRET=1 set before triton is imported); got a tensor on "
                         f"{zc.device}")
    return True


def _positive_terms(triton_pos: bool, backend, zc, z_in, lv: _Levels, lev: int, rmax, amax,
                    scale, include_self, coef, fp32_dot, need_sums: bool = True):
    """(T, Q, dz) of the official positive pairs of level `lev` (``positive_pairs``' contract):
    on the Triton kernel (``_triton_loss.positive_pairs``: one launch, no host sync) where the
    call's ``_triton_positives`` said so, with the Triton engine's rows and dots (fp32 rows and
    IEEE products under the other engines, whose row max comes from IEEE GEMMs), else the torch
    pass on the compute-dtype rows (which always returns the sums)."""
    args = (lv.gid[lev], lv.n_groups[lev], rmax[lev], amax[lev], scale, include_self, coef)
    if not triton_pos:
        return positive_pairs(zc, *args)
    if backend == "triton":
        return _triton_loss.positive_pairs(z_in, *args, need_sums=need_sums, fp32_dot=fp32_dot)
    return _triton_loss.positive_pairs(zc, *args, need_sums=need_sums, fp32_dot="ieee")


def _lse_backward(mod, z_in, log_w, lse, grad_lse, scale, fp32_dot=None, n_common=0):
    """The engine's LSE gradient, in fp32 for the Triton kernels (16-bit inputs: not rounded to
    16 bits before the positive-pair part, which it can cancel, is added) with the forward's
    fp32 dot and shared-keys prefix."""
    if mod is _lse_torch or mod is _attention_lse:
        return mod.lse_backward(z_in, log_w, lse, grad_lse, scale)
    return mod.lse_backward(z_in, log_w, lse, grad_lse, scale, out_dtype=torch.float32,
                            fp32_dot=fp32_dot, n_common=n_common)


def loss_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype of the returned loss: float32 for 16-bit inputs, else the input's dtype."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _ratio(lse, rmax, log_eps):
    """r = exp(LSE - M) / D, D = exp(LSE - M) + eps * n_groups: the official loss's d/dLSE."""
    a = lse - rmax
    return torch.exp(a - torch.logaddexp(a, log_eps))


def _block_positives(zc, lv: _Levels, include_self: bool, coef, scale: float):
    """The official positives read from the row-block engine's own blocks (no extra GEMM);
    coef: their gradient coefficients (None: forward only)."""
    return BlockPositives(zc, lv.gid, lv.n_groups, include_self, coef, scale,
                          torch.isfinite(lv.log_w).all(dim=0), lv.log_w)


def _official_sums(positives, triton_pos: bool, backend, zc, z_in, lv: _Levels, lse, rmax,
                   amax, scale, include_self, coef, fp32_dot):
    """The official variant's terms after the LSE pass: (amax moved to the first of equal key
    rows, as torch.max (_tied_keys), T [L, N], Q [L, N], dz of the positives or None). Levels
    the engine's `positives` collected are taken from it, the others run ``_positive_terms``
    with coefficients coef [L, N] (None: forward only)."""
    amax = first_tied_key(zc, amax, torch.isfinite(lv.log_w))
    big_t, big_q = torch.zeros_like(lse), torch.zeros_like(lse)
    dz = None
    for lev in range(lse.shape[0]):
        if positives is not None and positives.handled[lev]:
            big_t[lev], big_q[lev] = positives.T[lev], positives.Q[lev]
            continue
        big_t[lev], big_q[lev], dzp = _positive_terms(
            triton_pos, backend, zc, z_in, lv, lev, rmax, amax, scale, include_self,
            None if coef is None else coef[lev], fp32_dot)
        if dzp is not None:
            dz = dzp if dz is None else dz + dzp
    return amax, big_t, big_q, dz


def _fused_pass(zc, z_in, lv: _Levels, base, inv_n, log_eps_w, log_w, scale: float,
                include_self: bool, official: bool, backend: str):
    """The torch / attention engines' one pass over the logits for the loss sum_l,i base_li *
    loss_li: (lse, rmax, amax, T, Q, dz) with its gradient dz, every term of it from the same
    logits (the row max and its arg-max, LSE, the positives). The forward of the "mean" and
    "sum" reductions, and the backward of "none" (base = grad_out on the rows): a backward
    that recomputed the logits in other GEMMs than the forward's LSE came from would see them
    rounded differently, by ulps of |s|, and the official gradient's cancellation of the
    arg-max term against p_argmax ~ 1 leaves those ulps standing (0.1 % of the terms at
    |s| ~ 1e4, a fuzzing find)."""
    mod = _backend_module(backend)
    # one level, every key visible, CPU float32: the symmetric engine (each pair once)
    symmetric = backend == "torch" and _lse_symmetric.applicable(zc, lv.log_w)
    if symmetric:
        mod = _lse_symmetric
    # the official positives read from the torch engine's own blocks (no extra GEMM)
    positives = None
    triton_pos = official and _triton_positives(backend, zc)
    if official and symmetric and not triton_pos:
        positives = _lse_symmetric.Positives(lv.gid[0], include_self, -(base * inv_n)[0])
    elif official and backend == "torch" and not triton_pos:
        positives = _block_positives(zc, lv, include_self, -(base * inv_n), scale)
    kw = {} if positives is None else {"positives": positives}

    def coef_fn(rows, lse_b, max_b):
        g = base[:, rows]
        return g * _ratio(lse_b, max_b, log_eps_w) if official else g

    # the attention engine takes the input dtype (bf16 on CUDA: flash attention)
    z_eng = z_in if backend == "attention" else zc
    lse, rmax, amax, dz = mod.lse_fused(z_eng, log_w, scale, official, coef_fn, **kw)
    dz = dz.to(zc.dtype)
    lse = lse.double()
    if not official:
        pos, dzp = _class_sum_term(zc, lv, scale, include_self, -(base * inv_n))
        return lse, None, None, pos, None, dz + dzp
    rmax = rmax.to(zc.dtype)
    amax, big_t, big_q, dzp = _official_sums(positives, triton_pos, backend, zc, z_in, lv, lse,
                                             rmax, amax, scale, include_self, -(base * inv_n),
                                             None)
    if dzp is not None:
        dz += dzp
    gamma = base * (big_q * inv_n - _ratio(lse, rmax, log_eps_w))
    dz += _argmax_grad(zc, amax, gamma, scale)
    return lse, rmax, amax, big_t, big_q, dz


class BalancedContrastiveFunction(torch.autograd.Function):
    """Sum over levels of the reduced balanced contrastive loss on the rows of ``z``."""

    @staticmethod
    def forward(ctx, z, lv: _Levels, scale: float, include_self: bool, variant: str,
                reduction: str, backend: str, want_grad: bool, fp32_dot: str | None,
                anchor: torch.Tensor | None):
        official = variant == "official"
        cdt = torch.float64 if z.dtype == torch.float64 else torch.float32
        zc = z.detach().to(cdt).contiguous()
        mod = _backend_module(backend)
        z_in = z.detach().contiguous() if backend in ("triton", "attention") else zc
        if backend == "triton" and z_in.dtype == torch.float64:
            z_in = zc.float()
        contrib = lv.contrib.to(cdt)
        if reduction == "mean":
            base = contrib / contrib.sum(1, keepdim=True).clamp(min=1)
        else:
            base = contrib                                      # "sum"; "none" uses it as a mask
        inv_n = torch.where(lv.contrib, 1.0 / lv.n_pos.clamp(min=1), torch.zeros_like(base))
        log_eps_w = torch.log(OFFICIAL_EPS * lv.n_distinct)[:, None]     # [L, 1]
        # the torch / attention engines: the gradient in the forward's pass for "mean" / "sum",
        # in a pass of the backward for "none" (its weights, grad_out, come with it)
        fusable = backend in ("torch", "attention")
        fused = reduction != "none" and fusable and want_grad
        log_w = lv.log_w if backend == "torch" else lv.log_w.float()
        triton_pos = official and _triton_positives(backend, zc)
        n_common = 0
        if fused:
            lse, rmax, amax, big_t, big_q, dz = _fused_pass(
                zc, z_in, lv, base, inv_n, log_eps_w, log_w, scale, include_self, official,
                backend)
        else:
            # forward only. One level, every key visible, CPU float32: the symmetric engine's
            # pass 1; the official positives after it (positive_pairs), or read from the
            # row-block engine's blocks
            symmetric = backend == "torch" and _lse_symmetric.applicable(zc, lv.log_w)
            positives = None
            if official and backend == "torch" and not symmetric and not triton_pos:
                positives = _block_positives(zc, lv, include_self, None, scale)
            kw = {} if positives is None else {"positives": positives}
            # the Triton kernels' fp32 dot (chosen in _apply), saved for the backward, whose
            # one-pass kernel must recompute the forward's scores
            if fp32_dot is not None:
                kw["fp32_dot"] = fp32_dot
            # several levels on the Triton kernels: the embedding rows, visible in every
            # level, take one exp per entry for all levels when
            # $HIERTAIL_TRITON_SHARED_LEVELS asks
            n_common = (lv.n_common if backend == "triton" and lv.log_w.shape[0] > 1
                        and _triton_loss.shared_levels() else 0)
            if n_common:
                kw["n_common"] = n_common
            if symmetric:
                lse, rmax, amax, _ = _lse_symmetric.lse_fused(zc, log_w, scale, official)
            else:
                lse, rmax, amax = mod.lse_forward(z_in, log_w, scale, official, **kw)
            lse = lse.double()       # loss formulas in float64: lse - rowmax to full precision
            big_t = big_q = None
            if official:
                rmax = rmax.to(cdt)
                amax, big_t, big_q, _ = _official_sums(positives, triton_pos, backend, zc, z_in,
                                                       lv, lse, rmax, amax, scale, include_self,
                                                       None, fp32_dot)
            else:
                big_t = _class_sum_term(zc, lv, scale, include_self)[0]
        if official:
            loss = torch.logaddexp(lse - rmax, log_eps_w) - big_t * inv_n
        else:
            loss = lse - big_t * inv_n
        loss = torch.where(lv.contrib, loss, torch.zeros_like(loss))
        if reduction == "none":
            out = loss[0]
        else:
            out = (loss * base).sum()
        ctx.fused, ctx.reduction, ctx.official = fused, reduction, official
        ctx.scale, ctx.include_self, ctx.backend, ctx.lv = scale, include_self, backend, lv
        ctx.z_dtype, ctx.fp32_dot, ctx.n_common = z.dtype, fp32_dot, n_common
        ctx.triton_pos = triton_pos
        # the anchor last (_autograd.graph_anchor: one element, tied to z's graph, holding none
        # of z's memory): what a second derivative through this loss would reach and fail on
        if fused:
            ctx.save_for_backward(dz, anchor)
        elif want_grad and fusable:
            ctx.save_for_backward(zc, z_in, log_w, base, inv_n, log_eps_w, anchor)
        elif want_grad:
            extra = (rmax, amax, big_q) if official else ()
            ctx.save_for_backward(zc, z_in, log_w, lse, base, inv_n, log_eps_w, *extra, anchor)
        # the loss value of 16-bit inputs stays fp32 (computed in fp32; as autocast keeps losses
        # in fp32): a float16 loss above 65,504 would otherwise come back as inf
        return out.to(loss_dtype(z.dtype))

    @staticmethod
    @first_order_backward("balanced_contrastive_loss")
    def backward(ctx, grad_out):
        # None for: lv, scale, include_self, variant, reduction, backend, want_grad, fp32_dot,
        # anchor (its gradient reaches z's sources through z)
        nones = (None,) * 9
        if ctx.fused:
            dz, _ = ctx.saved_tensors
            return (dz * grad_out.to(dz.dtype)).to(ctx.z_dtype), *nones
        lv, scale = ctx.lv, ctx.scale
        if ctx.backend in ("torch", "attention"):             # "none": one fused pass
            zc, z_in, log_w, base, inv_n, log_eps_w, _ = ctx.saved_tensors
            g = base * grad_out.to(zc.dtype)[None]
            dz = _fused_pass(zc, z_in, lv, g, inv_n, log_eps_w, log_w, scale,
                             ctx.include_self, ctx.official, ctx.backend)[5]
            return dz.to(ctx.z_dtype), *nones
        zc, z_in, log_w, lse, base, inv_n, log_eps_w, *extra, _ = ctx.saved_tensors
        go = grad_out.to(zc.dtype)
        g = base * go[None] if ctx.reduction == "none" else base * go     # [L, N]
        mod = _backend_module(ctx.backend)
        if ctx.official:
            rmax, amax, big_q = extra
            a = lse - rmax
            r = torch.exp(a - torch.logaddexp(a, log_eps_w))
            dz = _lse_backward(mod, z_in, log_w, lse, (g * r).to(log_w.dtype), scale,
                               ctx.fp32_dot, ctx.n_common)
            dz = dz.to(zc.dtype)
            for lev in range(lse.shape[0]):
                dz += _positive_terms(ctx.triton_pos, ctx.backend, zc, z_in, lv, lev, rmax,
                                      amax, scale, ctx.include_self, -(g[lev] * inv_n[lev]),
                                      ctx.fp32_dot, need_sums=False)[2]
            dz += _argmax_grad(zc, amax, g * (big_q * inv_n - r), scale)
        else:
            dz = _lse_backward(mod, z_in, log_w, lse, g.to(log_w.dtype), scale, ctx.fp32_dot,
                               ctx.n_common)
            dz = dz.to(zc.dtype) + _class_sum_term(zc, lv, scale, ctx.include_self,
                                                   -(g * inv_n))[1]
        return dz.to(ctx.z_dtype), *nones


def settle_engine(z_all: torch.Tensor, scale: float, variant: str, n_levels: int, backend: str,
                  automatic: bool, bound: _attention_lse.LogitBound | None = None
                  ) -> tuple[str, str | None]:
    """(engine, Triton fp32 dot or None) of one loss call on the rows z_all (with any
    prototypes), settled from the logits' bound (one shared ``LogitBound``, computed only if a
    rule asks): an automatic choice refined for CUDA (``refine_loss_backend``); the attention
    engine's precision guard (``_attention_lse.max_logit``, per variant and dtype), our own
    engine where the logits are too large for its fp32 LSE; the same for the Triton engine's
    fp32 LSE (``_triton_loss.lse_precise``), else its fp32 dot (``_triton_loss.fp32_dot``).
    bench/_gpu_checks.py labels its "auto" rows with it."""
    bound = bound or _attention_lse.LogitBound(z_all, scale)
    if automatic:
        backend = refine_loss_backend(backend, z_all, scale, variant, n_levels, bound)
    if backend == "attention" and not _attention_lse.within_precision(z_all, scale, variant,
                                                                      bound):
        backend = own_engine(z_all.device)
    if backend == "triton" and not _triton_loss.lse_precise(z_all, scale, variant, bound):
        backend = own_engine(z_all.device)              # the same for the Triton kernels' LSE
    fp32_dot = (_triton_loss.fp32_dot(z_all, scale, variant, bound) if backend == "triton"
                else None)
    return backend, fp32_dot


def _apply(z_all, lv: _Levels, scale: float, include_self: bool, variant: str, reduction: str,
           backend: str, want_grad: bool, automatic: bool):
    """BalancedContrastiveFunction.apply with the engine of ``settle_engine``, and the fallback
    to our own engine when the attention kernels refuse the call (a shape, dtype or GPU they do
    not support)."""
    backend, fp32_dot = settle_engine(z_all, scale, variant, lv.log_w.shape[0], backend,
                                      automatic)
    args = [z_all, lv, scale, include_self, variant, reduction, backend, want_grad, fp32_dot,
            graph_anchor(z_all)]
    try:
        return BalancedContrastiveFunction.apply(*args)
    except _attention_lse.AttentionUnavailable:
        args[6] = own_engine(z_all.device)
        return BalancedContrastiveFunction.apply(*args)


def balanced_contrastive_loss_op(
    z: torch.Tensor,
    labels: torch.Tensor,
    prototypes: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 0.1,
    include_self: bool = True,
    reduction: str = "mean",
    variant: str = "exact",
    backend: str | None = None,
) -> torch.Tensor:
    """Fast balanced contrastive loss; same arguments and numbers as the reference. Under
    torch.autocast: on autocast's dtype, with autocast off inside (``_amp``); the reference
    backend is plain PyTorch under autocast as it is. Under torch.compile: one custom op
    (``_custom_ops``)."""
    if torch.compiler.is_compiling() and _custom_ops.READY:
        return _custom_ops.traced_loss(z, [labels], [prototypes], temperature, include_self,
                                       reduction, variant, backend, hierarchical=False)
    validate_contrastive_inputs(z, labels, prototypes, temperature, reduction, variant,
                                include_self=include_self)
    if _reference_requested(backend):
        return balanced_contrastive_loss_ref(
            z, labels, prototypes=prototypes, temperature=temperature,
            include_self=include_self, reduction=reduction, variant=variant,
        )
    z, prototypes = loss_inputs(z, prototypes)
    with autocast_off(z), on_input_device(z):
        return _balanced_loss(z, labels, prototypes, temperature, include_self, reduction,
                              variant, backend)


def _temperature_link(z_all: torch.Tensor, temperature) -> tuple[float, torch.Tensor]:
    """(scale = 1/tau as a float for the engines, the rows the engines see). A tensor tau that
    autograd tracks (a learnable temperature) is tied in exactly: the loss depends on the rows
    and tau only through S = z_all z_all^T / tau, so with tau0 = tau's value the rows
    z_all * sqrt(tau0 / tau) -- equal to z_all, the factor being exactly 1 -- give S the same
    value and dS/dtau = -S/tau; autograd then carries dL/dtau = -<z_all, dL/dz_all> / (2 tau)
    through this one [N, d] product, whatever engine computed dL/dz_all. Its error is
    dL/dz_all's, summed over the rows (README, Guarantees: absolute, not relative, where the
    official variant's gradient nearly vanishes)."""
    tensor = isinstance(temperature, torch.Tensor)
    tau0 = float(temperature.detach() if tensor else temperature)
    if tensor and temperature.requires_grad and torch.is_grad_enabled():
        acc = torch.float64 if z_all.dtype == torch.float64 else torch.float32
        factor = torch.sqrt(tau0 / temperature.to(z_all.device, acc))
        z_all = z_all * factor.to(z_all.dtype)
    return 1.0 / tau0, z_all


def _reference_requested(backend: str | None) -> bool:
    """Whether this call runs the dense reference (asked for by argument or $HIERTAIL_BACKEND;
    the automatic choice never takes it). An unknown name is left to choose_loss_backend."""
    return (backend if backend is not None else requested_backend()) == "reference"


def _balanced_loss(z, labels, prototypes, temperature, include_self, reduction, variant,
                   backend):
    choice = choose_loss_backend(z, backend, variant)
    labels = labels.long()
    if prototypes is not None and prototypes.shape[0]:
        m = prototypes.shape[0]
        z_all = torch.cat([z, prototypes], dim=0)
        labels = torch.cat([labels, torch.arange(m, device=labels.device)])
    else:
        z_all = z
    n = z_all.shape[0]
    cdt = torch.float64 if z.dtype == torch.float64 else torch.float32
    rows = torch.arange(n, device=z.device)
    lv = _make_levels(n, [(rows, labels)], include_self, cdt, z.device, n_common=n)
    scale, z_all = _temperature_link(z_all, temperature)
    return _apply(
        z_all, lv, scale, bool(include_self), variant, reduction, choice,
        torch.is_grad_enabled() and z_all.requires_grad,
        automatic=backend is None and requested_backend() is None,
    )


def hierarchical_contrastive_loss_op(
    z: torch.Tensor,
    level_labels: Sequence[torch.Tensor],
    level_prototypes: Sequence[torch.Tensor | None],
    temperature: float | torch.Tensor = 0.1,
    include_self: bool = True,
    variant: str = "exact",
    backend: str | None = None,
) -> torch.Tensor:
    """sum_l mean-reduced balanced loss on cat(z, P_l) with labels_l, in ONE pass over the block.

    Z_big = cat(z, P_1, ..., P_L); level l sees the rows of z and of P_l (log_w = -inf hides the
    other levels' prototypes), so the z.z^T part of the block and its exp are shared by all levels.
    Under torch.autocast: on autocast's dtype, with autocast off inside (``_amp``).
    """
    if isinstance(level_labels, torch.Tensor) or isinstance(level_prototypes, torch.Tensor):
        raise TypeError("level_labels and level_prototypes must be sequences of tensors")
    level_labels, level_prototypes = list(level_labels), list(level_prototypes)
    if torch.compiler.is_compiling() and _custom_ops.READY:      # one custom op
        return _custom_ops.traced_loss(z, level_labels, level_prototypes, temperature,
                                       include_self, "mean", variant, backend, hierarchical=True)
    if len(level_labels) == 0 or len(level_labels) != len(level_prototypes):
        raise ValueError(
            f"need one prototype tensor per level: got {len(level_labels)} label tensors and "
            f"{len(level_prototypes)} prototype tensors (at least one level)"
        )
    for lab, pro in zip(level_labels, level_prototypes, strict=True):
        validate_contrastive_inputs(z, lab, pro, temperature, "mean", variant,
                                    include_self=include_self)
    if _reference_requested(backend):
        total = 0
        for lab, pro in zip(level_labels, level_prototypes, strict=True):
            total = total + balanced_contrastive_loss_ref(
                z, lab, prototypes=pro, temperature=temperature, include_self=include_self,
                variant=variant,
            )
        return total
    z, *level_prototypes = loss_inputs(z, *level_prototypes)
    with autocast_off(z), on_input_device(z):
        return _hierarchical_loss(z, level_labels, level_prototypes, temperature, include_self,
                                  variant, backend)


def _hierarchical_loss(z, level_labels, level_prototypes, temperature, include_self, variant,
                       backend):
    choice = choose_loss_backend(z, backend, variant, len(level_labels))
    n = z.shape[0]
    parts, level_rows, off = [z], [], n
    for lab, pro in zip(level_labels, level_prototypes, strict=True):
        m = 0 if pro is None else pro.shape[0]
        rows = torch.cat([torch.arange(n, device=z.device),
                          torch.arange(off, off + m, device=z.device)])
        labels = torch.cat([lab.long(), torch.arange(m, device=z.device)])
        level_rows.append((rows, labels))
        if m:
            parts.append(pro)
        off += m
    z_big = torch.cat(parts, dim=0) if len(parts) > 1 else z
    cdt = torch.float64 if z.dtype == torch.float64 else torch.float32
    lv = _make_levels(off, level_rows, include_self, cdt, z.device, n_common=n)
    scale, z_big = _temperature_link(z_big, temperature)
    return _apply(
        z_big, lv, scale, bool(include_self), variant, "mean", choice,
        torch.is_grad_enabled() and z_big.requires_grad,
        automatic=backend is None and requested_backend() is None,
    )


__all__ = [
    "BalancedContrastiveFunction",
    "balanced_contrastive_loss_op",
    "hierarchical_contrastive_loss_op",
    "settle_engine",
]
