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

With a scalar reduction on the torch and attention backends the per-row coefficients are known
during forward, so the gradient is computed there (on the row-block engine 3 GEMMs per block in
total; the symmetric engine and the attention kernels have their own counts, docs/LOSS.md) and
backward only scales it.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from hiertail_fast._validation import (
    LossInputValues,
    check_level_sequences,
    check_official_engine_range,
    validate_contrastive_inputs,
    validate_contrastive_levels,
)
from hiertail_fast.ops import _attention_lse, _custom_ops, _lse_symmetric, _lse_torch, _triton_loss
from hiertail_fast.ops._amp import autocast_off, loss_inputs
from hiertail_fast.ops._autograd import eager_twin, first_order_backward, graph_anchor
from hiertail_fast.ops._contrastive_pairs import OFFICIAL_EPS
from hiertail_fast.ops._dispatch import (  # noqa: F401  (LOSS_BACKENDS: re-exported)
    LOSS_BACKENDS,
    choose_loss_backend,
    on_input_device,
    own_engine,
    refine_loss_backend,
    requested_backend,
)
from hiertail_fast.ops._functorch import check_no_tangent, check_transforms
from hiertail_fast.ops._loss_passes import (
    backend_module,
    block_positives,
    fused_pass,
    lse_backward,
    official_sums,
    positive_terms,
    triton_positives,
)
from hiertail_fast.ops._loss_terms import (
    Levels,
    argmax_grad,
    class_sum_term,
    loss_dtype,
    make_levels,
    reduction_weights,
)
from hiertail_fast.ops._matmul_precision import ieee_matmuls
from hiertail_fast.ops._temperature_grad import LogitsTemperature
from hiertail_fast.reference.balanced_contrastive_loss import balanced_contrastive_loss_ref


class _ForBackward:
    """What a loss forward leaves its backward: the path it took and the tensors it needs. A
    plain object, the Function's second output (``setup_context`` saves its tensors; the
    ``setup_context`` style is what torch.func transforms require)."""

    def __init__(self, fused: bool, official: bool, triton_pos: bool, n_common: int,
                 tensors: tuple):
        self.fused, self.official, self.triton_pos = fused, official, triton_pos
        self.n_common, self.tensors = n_common, tensors


@eager_twin
class BalancedContrastiveFunction(torch.autograd.Function):
    """Sum over levels of the reduced balanced contrastive loss on the rows of ``z``:
    ``apply(...)[0]`` (the second output is the forward's ``_ForBackward``)."""

    @staticmethod
    def forward(z, lv: Levels, scale: float, include_self: bool, variant: str,
                reduction: str, backend: str, want_grad: bool, fp32_dot: str | None,
                anchor: torch.Tensor | None):
        official = variant == "official"
        cdt = torch.float64 if z.dtype == torch.float64 else torch.float32
        zc = z.detach().to(cdt).contiguous()
        mod = backend_module(backend)
        z_in = z.detach().contiguous() if backend in ("triton", "attention") else zc
        if backend == "triton" and z_in.dtype == torch.float64:
            z_in = zc.float()
        base = reduction_weights(lv, reduction, cdt)          # "none": a mask
        # (reciprocal(): what 1.0 / x runs, less its product with 1.0, one launch on CUDA)
        inv_n = torch.where(lv.contrib, lv.n_pos.clamp(min=1).reciprocal(), torch.zeros_like(base))
        # the official formula's log(eps * n_groups) [L, 1] (None: the exact variant has none)
        log_eps_w = torch.log(OFFICIAL_EPS * lv.n_distinct)[:, None] if official else None
        # the torch / attention engines: the gradient in the forward's pass for "mean" / "sum",
        # in a pass of the backward for "none" (its weights, grad_out, come with it)
        fusable = backend in ("torch", "attention")
        fused = reduction != "none" and fusable and want_grad
        log_w = lv.log_w if backend == "torch" else lv.log_w.float()
        triton_pos = official and triton_positives(backend, zc)
        n_common = 0
        rel = None                  # the official variant's lse - rowmax, where an engine has it
        if fused:
            lse, rmax, amax, big_t, big_q, dz = fused_pass(
                zc, z_in, lv, base, inv_n, log_eps_w, log_w, scale, include_self, official,
                backend)
        else:
            # forward only. One level, every key visible, CPU float32: the symmetric engine's
            # pass 1; the official positives after it (positive_pairs), or read from the
            # row-block engine's blocks
            symmetric = backend == "torch" and _lse_symmetric.applicable(zc, lv.log_w)
            positives = None
            if official and backend == "torch" and not symmetric and not triton_pos:
                positives = block_positives(zc, lv, include_self, None, scale)
            kw = {} if positives is None else {"positives": positives}
            # the Triton kernels' fp32 dot (chosen in _apply), saved for the backward, whose
            # one-pass kernel must recompute the forward's scores
            if fp32_dot is not None:
                kw["fp32_dot"] = fp32_dot
            # several levels on the Triton kernels: the embedding rows, visible in every
            # level, take one exp per entry for all levels when
            # $HIERTAIL_TRITON_SHARED_LEVELS asks (exact variant: the official one runs the
            # kernels' relative mode, which that mode does not have; _triton_loss)
            n_common = (lv.n_common if backend == "triton" and lv.log_w.shape[0] > 1
                        and _triton_loss.shared_levels() and not official else 0)
            if n_common:
                kw["n_common"] = n_common
            if mod is _lse_torch:
                kw["all_visible"] = all(lv.full)    # (the engine reads nothing to learn it)
            if symmetric:
                lse, rmax, amax, _ = _lse_symmetric.lse_fused(zc, log_w, scale, official)
            elif official and backend == "triton":
                # the kernels keep δ = lse - rowmax apart from rowmax: float64 rowmax + δ holds
                # δ to fp32 precision only while |rowmax| <= 2^29 (_triton_loss)
                lse, rmax, amax, rel = _triton_loss.relative_forward(z_in, log_w, scale, **kw)
            else:
                lse, rmax, amax = mod.lse_forward(z_in, log_w, scale, official, **kw)
            lse = lse.double()       # loss formulas in float64: lse - rowmax to full precision
            big_t = big_q = None
            if official:
                rmax = rmax.to(cdt)
                amax, big_t, big_q, _ = official_sums(positives, triton_pos, backend, zc, z_in,
                                                       lv, lse, rmax, amax, scale, include_self,
                                                       None, fp32_dot)
            else:
                big_t = class_sum_term(zc, lv, scale, include_self)[0]
        if official:
            # lse - rowmax: the Triton kernels' own δ (above), the others' in float64
            rel = lse - rmax if rel is None else rel
            loss = torch.logaddexp(rel, log_eps_w) - big_t * inv_n
        else:
            loss = lse - big_t * inv_n
        loss = torch.where(lv.contrib, loss, torch.zeros_like(loss))
        if reduction == "none":
            out = loss[0]
        else:
            out = (loss * base).sum()
        if fused:
            saved = (dz,)
        elif want_grad and fusable:
            saved = (zc, z_in, log_w, base, inv_n, log_eps_w)
        elif want_grad:
            extra = (rmax, amax, big_q, rel) if official else ()
            saved = (zc, z_in, log_w, lse, base, inv_n, log_eps_w, *extra)
        else:
            saved = ()
        # the loss value of 16-bit inputs stays fp32 (computed in fp32; as autocast keeps losses
        # in fp32): a float16 loss above 65,504 would otherwise come back as inf
        return (out.to(loss_dtype(z.dtype)),
                _ForBackward(fused, official, triton_pos, n_common, saved))

    @staticmethod
    def setup_context(ctx, inputs, output):
        (z, ctx.lv, ctx.scale, ctx.include_self, _, ctx.reduction, ctx.backend, _,
         ctx.fp32_dot, anchor) = inputs
        plan = output[1]
        ctx.fused, ctx.official, ctx.triton_pos = plan.fused, plan.official, plan.triton_pos
        ctx.n_common, ctx.z_dtype = plan.n_common, z.dtype
        # the anchor last (_autograd.graph_anchor: one element, tied to z's graph, holding none
        # of z's memory): what a second derivative through this loss would reach and fail on
        if plan.tensors:
            ctx.save_for_backward(*plan.tensors, anchor)

    @staticmethod
    @first_order_backward("balanced_contrastive_loss")
    def backward(ctx, grad_out, _):          # _: the plan output has no gradient
        # None for: lv, scale, include_self, variant, reduction, backend, want_grad, fp32_dot,
        # anchor (its gradient reaches z's sources through z)
        nones = (None,) * 9
        if ctx.fused:
            dz, _ = ctx.saved_tensors
            return (dz * grad_out.to(dz.dtype)).to(ctx.z_dtype), *nones
        lv, scale = ctx.lv, ctx.scale
        if ctx.backend in ("torch", "attention"):             # "none": one fused pass
            zc, z_in, log_w, base, inv_n, log_eps_w, _ = ctx.saved_tensors
            go, norm = pow2_normalised(grad_out, zc.dtype)
            g = base * go[None]
            dz = fused_pass(zc, z_in, lv, g, inv_n, log_eps_w, log_w, scale,
                             ctx.include_self, ctx.official, ctx.backend)[5]
            return dz.mul_(norm).to(ctx.z_dtype), *nones
        zc, z_in, log_w, lse, base, inv_n, log_eps_w, *extra, _ = ctx.saved_tensors
        go, norm = pow2_normalised(grad_out, zc.dtype)
        g = base * go[None] if ctx.reduction == "none" else base * go     # [L, N]
        mod = backend_module(ctx.backend)
        if ctx.official:
            rmax, amax, big_q, a = extra      # a: lse - rowmax (the forward's rel)
            r = torch.exp(a - torch.logaddexp(a, log_eps_w))
            # the key side of the row max's share, -g r + g Q / n on s_{i, argmax}: folded
            # into the Triton kernels' gradient blocks, where it cancels against g r p_ia per
            # entry (added here after both were summed over the rows sharing a key, it left ~N
            # ulp of the terms: bench/official_fuzz.py; -g r cancels g r p at large logits, g Q
            # / n cancels -g r at moderate ones, where every positive's q ~ 1); its query side
            # stays here
            fold = ctx.backend == "triton"
            dz = lse_backward(mod, z_in, log_w, lse, (g * r).to(log_w.dtype), scale,
                               ctx.fp32_dot, ctx.n_common, rowmax=rmax,
                               argmax=amax if fold else None,
                               argmax_coef=g * big_q * inv_n if fold else None, delta=a)
            dz = dz.to(zc.dtype)
            for lev in range(lse.shape[0]):
                dz += positive_terms(ctx.triton_pos, ctx.backend, zc, z_in, lv, lev, rmax,
                                      amax, scale, ctx.include_self, -(g[lev] * inv_n[lev]),
                                      ctx.fp32_dot, need_sums=False)[2]
            dz += argmax_grad(zc, amax, g * (big_q * inv_n - r), scale,
                              key_side=not fold)
        else:
            dz = lse_backward(mod, z_in, log_w, lse, g.to(log_w.dtype), scale, ctx.fp32_dot,
                               ctx.n_common)
            dz = dz.to(zc.dtype) + class_sum_term(zc, lv, scale, ctx.include_self,
                                                   -(g * inv_n), need_pos=False)[1]
        return dz.mul_(norm).to(ctx.z_dtype), *nones


def pow2_normalised(grad_out: torch.Tensor, dtype: torch.dtype
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_out / 2^k in ``dtype``, 2^k as a float64 0-dim tensor): 2^k the power of two at
    max|grad_out| (1 where that is 0 or not finite), an exact scaling, no host read. The
    backward is linear in grad_out, so it runs on coefficients of O(1) and its dz is scaled
    back once. Upstream gradients below the rows' normal range (~1e-39 for fp32 rows, 1e-310
    for float64 ones) lost their bits in the engines' products (the exact variant's class sums
    391x the suite's rule at tau 1e-6 on small rows) or overflowed an inverse (NaN), and ones
    of ~1e37 overflowed the key side's sums (inf) where the gradient itself fits (an audit of
    extreme upstream gradients, 2026-12-06)."""
    g = grad_out.to(torch.float64)
    top = torch.linalg.vector_norm(g, float("inf")) if g.numel() else g.new_zeros(())
    ok = (top > 0) & torch.isfinite(top)
    norm = torch.where(ok, torch.exp2(torch.floor(torch.log2(torch.where(ok, top, 1.0)))), 1.0)
    return (g / norm).to(dtype), norm


def settle_engine(z_all: torch.Tensor, scale: float, variant: str, n_levels: int, backend: str,
                  automatic: bool, bound: _attention_lse.LogitBound | None = None
                  ) -> tuple[str, str | None]:
    """(engine, Triton fp32 dot or None) of one loss call on the rows z_all (with any
    prototypes), settled from the logits' bound (one shared ``LogitBound``, computed only if a
    rule asks): an automatic choice refined for CUDA (``refine_loss_backend``); the attention
    engine's precision guard (``_attention_lse.within_precision``: per variant and dtype, and
    the official variant's fewest rows), our own engine where its fp32 LSE is not precise
    enough; the Triton engine's fp32 dot (``_triton_loss.fp32_dot``).
    bench/_gpu_checks.py labels its "auto" rows with it."""
    bound = bound or _attention_lse.LogitBound(z_all, scale)
    if automatic:
        backend = refine_loss_backend(backend, z_all, scale, variant, n_levels, bound)
    if backend == "attention" and not _attention_lse.within_precision(z_all, scale, variant,
                                                                      bound):
        backend = own_engine(z_all.device)
    fp32_dot = (_triton_loss.fp32_dot(z_all, scale, variant, bound) if backend == "triton"
                else None)
    return backend, fp32_dot


def _apply(z_all, lv: Levels, scale: float, include_self: bool, variant: str, reduction: str,
           backend: str, want_grad: bool, automatic: bool, tau: torch.Tensor | None = None,
           max_row_norm: float | None = None):
    """BalancedContrastiveFunction.run with the engine of ``settle_engine``, and the fallback
    to our own engine when the attention kernels refuse the call (a shape, dtype or GPU they do
    not support). ``tau``: a learnable temperature (``_temperature_link``), which reaches the
    loss outside z_all: tied into the anchor with a zero factor, so that differentiating dL/dz
    w.r.t. tau raises as every second derivative does (it was a silent None / 0).
    ``max_row_norm``: z_all's largest row norm as the input checks read it (None: unknown),
    which bounds the logits without a reduction and a host sync (``LogitBound``). The
    official variant past its fast engines' range: a ValueError
    (``_validation.check_official_engine_range``)."""
    bound = _attention_lse.LogitBound(z_all, scale, max_row_norm)
    if variant == "official":
        check_official_engine_range(bound.value)
    backend, fp32_dot = settle_engine(z_all, scale, variant, lv.log_w.shape[0], backend,
                                      automatic, bound)
    anchor = graph_anchor(z_all)
    if tau is not None and anchor is not None:      # (no dL/dz, nothing to guard: None)
        anchor = anchor + (tau * 0).to(anchor.device, anchor.dtype)
    args = [z_all, lv, scale, include_self, variant, reduction, backend, want_grad, fp32_dot,
            anchor]
    try:
        return BalancedContrastiveFunction.run(*args)[0]
    except _attention_lse.AttentionUnavailable:
        args[6] = own_engine(z_all.device)
        return BalancedContrastiveFunction.run(*args)[0]


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
    check_transforms("balanced_contrastive_loss", z, labels, prototypes, temperature)
    read = validate_contrastive_inputs(z, labels, prototypes, temperature, reduction, variant,
                                       include_self=include_self)
    if _reference_requested(backend):
        return balanced_contrastive_loss_ref(
            z, labels, prototypes=prototypes, temperature=temperature,
            include_self=include_self, reduction=reduction, variant=variant,
        )
    check_transforms("balanced_contrastive_loss", grad_only=True, jvp_ok=True)    # no vmap
    check_no_tangent("balanced_contrastive_loss", z, prototypes, temperature)   # forward AD
    read, z, prototypes = read_rows(read, z, *loss_inputs(z, prototypes))
    with autocast_off(z), on_input_device(z), ieee_matmuls():
        return _balanced_loss(z, labels, prototypes, temperature, read, include_self,
                              reduction, variant, backend)


def read_rows(read: LossInputValues, z: torch.Tensor, z_run: torch.Tensor, *others
               ) -> tuple[LossInputValues, torch.Tensor, ...]:
    """(read, z_run, *others) after ``loss_inputs``: read's row norm dropped where the rows
    the loss runs on are autocast's copies, not the rows checked (their bound is recomputed
    then, from the copies)."""
    if z_run is not z:
        read = read._replace(max_row_norm=None)
    return read, z_run, *others


def _temperature_link(temperature, tau0: float) -> tuple[float, torch.Tensor | None]:
    """(scale = 1/tau as a float for the engines, the tau tensor whose gradient ``_with_tau``
    adds, or None); ``tau0`` the temperature's value, read by the input checks (a tensor's
    read is a host sync on CUDA: it was read twice). The engines take tau as a constant; a
    tensor tau that autograd tracks (a learnable temperature) gets dL/dtau summed at the
    logits' level, the row max taken out (``_temperature_grad``), in both variants: taken as
    -<z_all, dL/dz_all> / (2 tau) through the rows, it carried dL/dz's rounding times |z| (2e-3
    off a true 0 in the exact variant, a fuzzing find; up to 2e-3 off a true ~1e-4 in the
    official one)."""
    tensor = isinstance(temperature, torch.Tensor)
    tracked = tensor and temperature.requires_grad and torch.is_grad_enabled()
    return 1.0 / tau0, (temperature if tracked else None)


def _with_tau(out: torch.Tensor, tau: torch.Tensor | None, z_all: torch.Tensor, lv: Levels,
              scale: float, include_self: bool, variant: str, reduction: str) -> torch.Tensor:
    """out plus an exact 0 whose backward gives dL/dtau summed at the logits' level
    (``_temperature_grad``); out itself when tau is None."""
    if tau is None:
        return out
    cdt = torch.float64 if z_all.dtype == torch.float64 else torch.float32
    # z_all itself, not detached: its backward then ties dL/dtau to z's sources, so a second
    # derivative of it w.r.t. z or the prototypes raises (it was a silent None / 0)
    return out + LogitsTemperature.run(tau, z_all.to(cdt), lv, scale, include_self, variant,
                                       reduction_weights(lv, reduction, cdt), out.shape,
                                       out.dtype)


def _reference_requested(backend: str | None) -> bool:
    """Whether this call runs the dense reference (asked for by argument or $HIERTAIL_BACKEND;
    the automatic choice never takes it). An unknown name is left to choose_loss_backend."""
    return (backend if backend is not None else requested_backend()) == "reference"


def _balanced_loss(z, labels, prototypes, temperature, read: LossInputValues, include_self,
                   reduction, variant, backend):
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
    lv = make_levels(n, [(None, labels)], include_self, cdt, z.device, n_common=n)
    scale, tau = _temperature_link(temperature, read.tau)
    out = _apply(
        z_all, lv, scale, bool(include_self), variant, reduction, choice,
        torch.is_grad_enabled() and z_all.requires_grad,
        automatic=backend is None and requested_backend() is None, tau=tau,
        max_row_norm=read.max_row_norm,
    )
    return _with_tau(out, tau, z_all, lv, scale, bool(include_self), variant, reduction)


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
    level_labels, level_prototypes = check_level_sequences(level_labels, level_prototypes)
    if torch.compiler.is_compiling() and _custom_ops.READY:      # one custom op
        return _custom_ops.traced_loss(z, level_labels, level_prototypes, temperature,
                                       include_self, "mean", variant, backend, hierarchical=True)
    check_transforms("hierarchical_contrastive_loss", z, level_labels, level_prototypes,
                     temperature)
    if len(level_labels) == 0 or len(level_labels) != len(level_prototypes):
        raise ValueError(
            f"need one prototype tensor per level: got {len(level_labels)} label tensors and "
            f"{len(level_prototypes)} prototype tensors (at least one level)"
        )
    read = validate_contrastive_levels(z, level_labels, level_prototypes, temperature, "mean",
                                       variant, include_self=include_self)  # one host read

    if _reference_requested(backend):
        # 16-bit inputs widened once, so that the levels' gradients add up in float32 and are
        # rounded once (cast per level, each level's share was rounded to 16 bits before the
        # sum, whose cancellation then showed: 30 bf16 ulps, found by fuzzing)
        wide: dict[int, torch.Tensor] = {}
        def widen(t):
            if t is None:
                return None
            return wide.setdefault(id(t), t.to(torch.promote_types(t.dtype, torch.float32)))
        total = 0
        for lab, pro in zip(level_labels, level_prototypes, strict=True):
            total = total + balanced_contrastive_loss_ref(
                widen(z), lab, prototypes=widen(pro), temperature=temperature,
                include_self=include_self, variant=variant,
            )
        return total
    check_transforms("hierarchical_contrastive_loss", grad_only=True, jvp_ok=True)  # no vmap
    check_no_tangent("hierarchical_contrastive_loss", z, *level_prototypes, temperature)
    read, z, *level_prototypes = read_rows(read, z, *loss_inputs(z, *level_prototypes))
    with autocast_off(z), on_input_device(z), ieee_matmuls():
        return _hierarchical_loss(z, level_labels, level_prototypes, temperature, read,
                                  include_self, variant, backend)


def _hierarchical_loss(z, level_labels, level_prototypes, temperature, read: LossInputValues,
                       include_self, variant, backend):
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
    lv = make_levels(off, level_rows, include_self, cdt, z.device, n_common=n)
    scale, tau = _temperature_link(temperature, read.tau)
    out = _apply(
        z_big, lv, scale, bool(include_self), variant, "mean", choice,
        torch.is_grad_enabled() and z_big.requires_grad,
        automatic=backend is None and requested_backend() is None, tau=tau,
        max_row_norm=read.max_row_norm,
    )
    return _with_tau(out, tau, z_big, lv, scale, bool(include_self), variant, "mean")


__all__ = [
    "BalancedContrastiveFunction",
    "balanced_contrastive_loss_op",
    "hierarchical_contrastive_loss_op",
    "settle_engine",
]
