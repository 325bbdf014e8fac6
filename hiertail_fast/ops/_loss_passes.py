"""The passes of the balanced contrastive loss over its logits, per engine: the torch /
attention engines' fused pass (value and gradient from the same logits), the official
variant's positive-pair terms (the engine's own blocks, the Triton kernel, or
``positive_pairs``), and the engines' LSE backward. ``balanced_contrastive_loss`` puts them
together; the notation is in its docstring."""
from __future__ import annotations

import torch

from hiertail_fast.ops import _attention_lse, _lse_symmetric, _lse_torch, _triton_loss
from hiertail_fast.ops._contrastive_pairs import positive_pairs
from hiertail_fast.ops._dispatch import triton_available, triton_refusal
from hiertail_fast.ops._finite import finite
from hiertail_fast.ops._loss_terms import Levels, argmax_grad, class_sum_term, ratio
from hiertail_fast.ops._max_fold import ArgmaxShare
from hiertail_fast.ops._positive_blocks import POSITIVES_ENV, BlockPositives, positives_plan
from hiertail_fast.ops._tied_keys import first_tied_key


def backend_module(name: str):
    return {"torch": _lse_torch, "attention": _attention_lse, "triton": _triton_loss}[name]


def triton_positives(backend: str, zc: torch.Tensor) -> bool:
    """Whether the official positives run on the Triton kernel: always on the Triton engine; on
    the others where $HIERTAIL_POSITIVES=triton asks and the rows are fp32 (the kernel takes no
    float64)."""
    if backend == "triton":
        return True
    if positives_plan() != "triton" or zc.dtype != torch.float32:
        return False
    if not triton_available(zc.device):
        raise ValueError(f"{POSITIVES_ENV}=triton cannot run here: "
                         f"{triton_refusal(zc.device)}")
    return True


def positive_terms(triton_pos: bool, backend, zc, z_in, lv: Levels, lev: int, rmax, amax,
                    scale, include_self, coef, fp32_dot, need_sums: bool = True):
    """(T, Q, dz) of the official positive pairs of level `lev` (``positive_pairs``' contract):
    on the Triton kernel (``_triton_loss.positive_pairs``: one launch, no host sync) where the
    call's ``triton_positives`` said so, with the Triton engine's rows and dots (fp32 rows and
    IEEE products under the other engines, whose row max comes from IEEE GEMMs), else the torch
    pass on the compute-dtype rows (which always returns the sums)."""
    args = (lv.gid[lev], lv.n_groups[lev], rmax[lev], amax[lev], scale, include_self, coef)
    if not triton_pos:
        return positive_pairs(zc, *args)
    if backend == "triton":
        return _triton_loss.positive_pairs(z_in, *args, need_sums=need_sums, fp32_dot=fp32_dot)
    return _triton_loss.positive_pairs(zc, *args, need_sums=need_sums, fp32_dot="ieee")


def lse_backward(mod, z_in, log_w, lse, grad_lse, scale, fp32_dot=None, n_common=0,
                 rowmax=None, argmax=None, argmax_coef=None, delta=None):
    """The engine's LSE gradient, in fp32 for the Triton kernels (16-bit inputs: not rounded to
    16 bits before the positive-pair part, which it can cancel, is added) with the forward's
    fp32 dot, shared-keys prefix and (official variant) row max: the kernels' relative mode,
    ``_triton_loss.relative_forward``, whose δ is `delta`; with `argmax` the kernels also add
    the key side of argmax_coef - grad_lse on each row's arg-max score (the row max's share of
    the official gradient and the positives' share of it, cancelled per entry; its query side
    is the caller's)."""
    if mod is _lse_torch or mod is _attention_lse:
        return mod.lse_backward(z_in, log_w, lse, grad_lse, scale)
    return mod.lse_backward(z_in, log_w, lse, grad_lse, scale, out_dtype=torch.float32,
                            fp32_dot=fp32_dot, n_common=n_common, rowmax=rowmax,
                            argmax=argmax, argmax_coef=argmax_coef, delta=delta)


def block_positives(zc, lv: Levels, include_self: bool, coef, scale: float):
    """The official positives read from the row-block engine's own blocks (no extra GEMM);
    coef: their gradient coefficients (None: forward only)."""
    return BlockPositives(zc, lv.gid, lv.n_groups, include_self, coef, scale,
                          finite(lv.log_w).all(dim=0), lv.log_w)


def official_sums(positives, triton_pos: bool, backend, zc, z_in, lv: Levels, lse, rmax,
                   amax, scale, include_self, coef, fp32_dot, tied: bool = False):
    """The official variant's terms after the LSE pass: (amax moved to the first of equal key
    rows, as torch.max (_tied_keys; ``tied``: it already is), T [L, N], Q [L, N], dz of the
    positives or None). Levels the engine's `positives` collected are taken from it, the
    others run ``positive_terms`` with coefficients coef [L, N] (None: forward only)."""
    if not tied:
        amax = first_tied_key(zc, amax, finite(lv.log_w))
    big_t, big_q = torch.zeros_like(lse), torch.zeros_like(lse)
    dz = None
    for lev in range(lse.shape[0]):
        if positives is not None and positives.handled[lev]:
            big_t[lev], big_q[lev] = positives.T[lev], positives.Q[lev]
            continue
        big_t[lev], big_q[lev], dzp = positive_terms(
            triton_pos, backend, zc, z_in, lv, lev, rmax, amax, scale, include_self,
            None if coef is None else coef[lev], fp32_dot)
        if dzp is not None:
            dz = dzp if dz is None else dz + dzp
    return amax, big_t, big_q, dz


def fused_pass(zc, z_in, lv: Levels, base, inv_n, log_eps_w, log_w, scale: float,
                include_self: bool, official: bool, backend: str):
    """The torch / attention engines' one pass over the logits for the loss sum_l,i base_li *
    loss_li: (lse, rmax, amax, T, Q, dz) with its gradient dz, every term of it from the same
    logits (the row max and its arg-max, LSE, the positives). The forward of the "mean" and
    "sum" reductions, and the backward of "none" (base = grad_out on the rows): a backward
    that recomputed the logits in other GEMMs than the forward's LSE came from would see them
    rounded differently, by ulps of |s|, and the official gradient's cancellation of the
    arg-max term against p_argmax ~ 1 leaves those ulps standing (0.1 % of the terms at
    |s| ~ 1e4, a fuzzing find)."""
    mod = backend_module(backend)
    # one level, every key visible, CPU float32: the symmetric engine (each pair once)
    symmetric = backend == "torch" and _lse_symmetric.applicable(zc, lv.log_w)
    if symmetric:
        mod = _lse_symmetric
    # the official positives read from the torch engine's own blocks (no extra GEMM)
    positives = None
    triton_pos = official and triton_positives(backend, zc)
    if official and symmetric and not triton_pos:
        positives = _lse_symmetric.Positives(lv.gid[0], include_self, -(base * inv_n)[0])
    elif official and backend == "torch" and not triton_pos:
        positives = block_positives(zc, lv, include_self, -(base * inv_n), scale)
    kw = {} if positives is None else {"positives": positives}
    # our engines take the arg-max entries out of their GEMMs and hand back their LSE part
    # and positive term, added below with the rest of the entry (``_max_fold``)
    share = None
    if official and mod in (_lse_torch, _lse_symmetric):
        share = kw["fold_argmax"] = ArgmaxShare(lv.log_w.shape[0], zc.shape[0], zc.device)
    if mod is _lse_torch:
        kw["all_visible"] = all(lv.full)        # (the engine reads nothing to learn it)

    def coef_fn(rows, lse_b, max_b):
        g = base[:, rows]
        return g * ratio(lse_b, max_b, log_eps_w) if official else g

    # the attention engine takes the input dtype (bf16 on CUDA: flash attention)
    z_eng = z_in if backend == "attention" else zc
    lse, rmax, amax, dz = mod.lse_fused(z_eng, log_w, scale, official, coef_fn, **kw)
    dz = dz.to(zc.dtype)
    lse = lse.double()
    if not official:
        pos, dzp = class_sum_term(zc, lv, scale, include_self, -(base * inv_n))
        return lse, None, None, pos, None, dz + dzp
    rmax = rmax.to(zc.dtype)
    tied = share is not None and share.amax is not None
    amax, big_t, big_q, dzp = official_sums(positives, triton_pos, backend, zc, z_in, lv, lse,
                                             rmax, share.amax if tied else amax, scale,
                                             include_self, -(base * inv_n), None, tied=tied)
    if dzp is not None:
        dz += dzp
    if share is not None:
        # the whole entry (i, a): LSE part u = g (p - 1), the positive term c q_out the engine
        # left out, the positives' share g_b Q / n of the max, summed per row in float64
        gamma = share.u + base.double() * inv_n.double() * (big_q - share.q_out)
        dz += argmax_grad(zc, amax, gamma, scale, precise=True)
    else:
        # the row max's share: gamma_i on s_{i, argmax_i}
        gamma = base * (big_q * inv_n - ratio(lse, rmax, log_eps_w))
        dz += argmax_grad(zc, amax, gamma, scale)
    return lse, rmax, amax, big_t, big_q, dz
