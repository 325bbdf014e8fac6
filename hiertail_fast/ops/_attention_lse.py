"""The loss's log-sum-exp and its gradient from PyTorch's fused attention kernels (one adapter).

The quadratic core of the balanced contrastive loss (DESIGN.md §3.1),
``lse[l, i] = log sum_k exp(scale * z_i.z_k + log_w[l, k])``, is attention's log-normaliser with
Q = K = Z and a per-key additive bias: level l is head l with the bias row ``log_w[l]``
(a stride-0 view over the query axis, never N x N memory). PyTorch ships attention kernels
tuned per device (CPU flash attention, CUDA memory-efficient attention) that return that LSE.
This module is the ONE place that calls their private ``torch.ops.aten`` entry points: a
version check (``supported``), a probe of the op's schema, and a fallback the caller takes
when this adapter says no (``available`` is False, or ``AttentionUnavailable`` is raised).

The gradient of ``sum_{l,i} g_li * lse_li`` needs no backward kernel, only forward calls
(p_lik = exp(scale s_ik + log_w_lk - lse_li)):

    query side  dz_i += scale * sum_l g_li * O_li,          O_l = softmax_l(Z Z^T) Z  (V = Z)
    key side    dz_k += scale * sum_l sum_i g_li p_lik z_i
                      = scale * sum_l exp(log_w_lk + lse'_lk) * O'_lk

where (O', lse') is a second call with keys' bias ``log |g_li| - lse_li`` and values
``sign(g_li) z_i`` (rows with g = 0 hidden): both signs of g in the one call. The PyTorch
*backward* kernels are never used: on CPU they are slower than our whole engine.

Contract: the same ``lse_forward`` / ``lse_backward`` / ``lse_fused`` as ``_lse_torch``. The
official variant's unweighted row max and arg-max are not an attention quantity: with
``need_max`` they come from one extra blocked GEMM + max pass (``_row_max``: MKL / cuBLAS).
lse is returned in float64 (from the kernel's fp32) so the caller's formulas are unchanged.
A level with no visible key gets lse = -inf.
"""
from __future__ import annotations

import functools
import os

import torch

from hiertail_fast.ops import _lse_torch
from hiertail_fast.ops._finite import finite
from hiertail_fast.ops._torch_release import torch_release

# The private ops and the exact signatures used below, checked on torch 2.11 (the GPU image)
# and 2.13 (the CPU machines). Older or newer releases go through the schema probe in
# `_op()`; anything unexpected makes the adapter unavailable rather than wrong.
MIN_TORCH = (2, 4)
_CPU_OP = "_scaled_dot_product_flash_attention_for_cpu"
_CUDA_OP = "_scaled_dot_product_efficient_attention"
_CPU_ARGS = ("query", "key", "value", "dropout_p", "is_causal", "attn_mask", "scale")
_CUDA_ARGS = ("query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p",
              "is_causal", "scale")
# bf16 on CUDA: flash attention (bf16 tensor cores) has no bias argument, so the bias is folded
# into FOLD_COLS extra feature columns: q' = [z, 1, 1, 1], k'_k = [z_k, b_k / scale split into
# three bf16 parts] (hi + mid + lo carry b to ~fp32 precision; the products with 1 are exact and
# accumulate in fp32), head dim padded to HEAD_ALIGN. DESIGN.md §3.1.
_FLASH_OP = "_scaled_dot_product_flash_attention"
_FLASH_ARGS = ("query", "key", "value", "dropout_p", "is_causal", "return_debug_mask", "scale")
# The same folded operands on cuDNN attention, opt in (HIERTAIL_ATTENTION_BF16=cudnn): it takes
# head dims in steps of 8 (72 at d = 64, where flash runs its 96-wide kernels); untimed on a
# card (bench/attention_kernels.py times the one call, gpu_next.sh's profile the whole loss as
# "attention[cudnn]"). Its LSE comes back as [B, H, N, 1].
_CUDNN_OP = "_scaled_dot_product_cudnn_attention"
_CUDNN_ARGS = ("query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p",
               "is_causal", "return_debug_mask", "scale")
BF16_KERNEL_ENV = "HIERTAIL_ATTENTION_BF16"
BF16_KERNELS = ("flash", "cudnn")
FOLD_COLS = 3
HEAD_ALIGN = 8
# Memory-efficient attention reads the bias in 16-byte vectors: its row stride must be a
# multiple of 16 elements (what F.scaled_dot_product_attention's own pad_bias does).
BIAS_ALIGN = 16
# Bias of a hidden key. Finite (not -inf): a row whose keys are all hidden must not produce NaN.
HIDDEN = -1e30
# CPU flash attention holds q/k/v/out as [1, H, N, d]; more levels than this are done in groups
# of heads so the per-call O(H*N*d) copies stay small.
MAX_HEADS = 8


class AttentionUnavailable(RuntimeError):
    """The attention kernels cannot serve this call (caller falls back to its own engine)."""


def supported(version: tuple[int, int] | None = None) -> bool:
    """Whether this torch release is one the adapter knows (>= MIN_TORCH)."""
    return (version or torch_release()) >= MIN_TORCH


@functools.lru_cache(maxsize=None)
def _op(name: str, args: tuple[str, ...]):
    """The aten op `name` if it exists with (at least) the named arguments, else None."""
    if not supported():
        return None
    op = getattr(torch.ops.aten, name, None)
    if op is None:
        return None
    try:
        schema = op.default._schema
    except (AttributeError, RuntimeError):
        return None
    have = {a.name for a in schema.arguments}
    return op.default if set(args) <= have else None


def available(device: torch.device | str) -> bool:
    """Whether the attention kernels can compute the LSE for tensors on `device`."""
    device = torch.device(device)
    if device.type == "cpu":
        return _op(_CPU_OP, _CPU_ARGS) is not None
    if device.type == "cuda":
        return _op(_CUDA_OP, _CUDA_ARGS) is not None
    return False


def _bias(rows: torch.Tensor, n: int) -> torch.Tensor:
    """[H, N] bias rows -> [1, H, N, N] stride-0 view over the query axis, 16-aligned rows."""
    h = rows.shape[0]
    n_pad = -(-n // BIAS_ALIGN) * BIAS_ALIGN
    store = torch.full((h, n_pad), HIDDEN, dtype=rows.dtype, device=rows.device)
    store[:, :n] = rows
    return store[:, :n].view(1, h, 1, n).expand(1, h, n, n)


def _call(q: torch.Tensor, bias_rows: torch.Tensor, scale: float,
          v_sign: torch.Tensor | None = None, fold: _Fold | None = None):
    """One attention call with q = k = q [N, d] for H heads with key-bias rows [H, N], and
    values q, or ``v_sign[h, k] * q_k`` in head h (the key side's coefficient signs, +-1 / 0);
    `fold`: the call's folded operands on the bf16 flash branch (built here if None).

    Returns (out [H, N, d] in q's dtype, lse [H, N] float32)."""
    if _folds(q):
        return _call_folded(q, bias_rows, scale, v_sign, fold)
    n, d = q.shape
    h = bias_rows.shape[0]
    # heads share q = k = v; materialised (O(H*N*d)) since the kernels want dense heads
    qh = q.view(1, 1, n, d).expand(1, h, n, d).contiguous()
    if _kernel_kind(q.device) == "cpu":
        op = _op(_CPU_OP, _CPU_ARGS)
        if op is None:
            raise AttentionUnavailable(f"torch.ops.aten.{_CPU_OP} is not available")
        out, lse = op(qh, qh, _signed(qh, v_sign), 0.0, False,
                      attn_mask=_bias(bias_rows.to(q.dtype), n), scale=scale)
    else:
        op = _op(_CUDA_OP, _CUDA_ARGS)
        if op is None:
            raise AttentionUnavailable(f"torch.ops.aten.{_CUDA_OP} is not available")
        # The kernel reads q/k/v rows in 16-byte vectors: F.scaled_dot_product_attention refuses
        # a head dim that is not a multiple of 16 bytes before it gets there, but the private op
        # is called directly (on an H200, d = 3 failed). Zero columns change no dot product.
        qh = _pad_head_dim(qh, HEAD_ALIGN)
        try:
            out, lse = op(qh, qh, _signed(qh, v_sign), _bias(bias_rows.to(q.dtype), n), True,
                          0.0, False, scale=scale)[:2]
        except RuntimeError as err:  # shape/dtype/arch the kernel refuses
            raise AttentionUnavailable(str(err)) from err
        out = out[..., :d]
    # the CUDA kernel pads the LSE's sequence axis to a multiple of 32: keep the first N
    return out[0], lse[0, :, :n].float()


def _signed(vh: torch.Tensor, v_sign: torch.Tensor | None) -> torch.Tensor:
    """Values [1, H, N, d] with row k of head h times v_sign[h, k] (exact: +-1 or 0)."""
    return vh if v_sign is None else vh * v_sign.to(vh.dtype)[None, :, :, None]


def _pad_head_dim(x: torch.Tensor, align: int) -> torch.Tensor:
    """x [..., d] with zero columns appended up to a multiple of `align` (x itself if aligned)."""
    d = x.shape[-1]
    dp = -(-d // align) * align
    if dp == d:
        return x
    out = x.new_zeros(*x.shape[:-1], dp)
    out[..., :d] = x
    return out


def _kernel_kind(device: torch.device) -> str:
    """Which kernel serves tensors of `device` ("cpu" flash or "cuda" memory-efficient / bf16
    flash); a seam for the tests that run the CUDA branches' contracts on CPU with emulated
    ops."""
    return "cpu" if device.type == "cpu" else "cuda"


def _folds(q: torch.Tensor) -> bool:
    """Whether q's calls take the bf16 flash branch (the bias folded into feature columns)."""
    return kernel_dtype(q) == torch.bfloat16


class _Fold:
    """The folded operands of one loss call's bf16 flash calls, built once and shared by them
    (each rebuilt them: ~20 kernel launches a call, ~12 now): q' = [z, 1, 1, 1, 0...] [N, d'],
    v' = [z, 0...] [N, d'], and k' [H, N, d'] = [z, hi, mid, lo, 0...] per head, whose z and
    zero columns are written once and whose bias columns each call rewrites (``keys``: a call's
    flash kernel has read them before the next call's writes run, in stream order)."""

    def __init__(self, q: torch.Tensor) -> None:
        n, d = q.shape
        dp = -(-(d + FOLD_COLS) // HEAD_ALIGN) * HEAD_ALIGN
        self.d, self.dp = d, dp
        self.q = q.new_empty(n, dp)
        self.q[:, :d] = q
        self.q[:, d:d + FOLD_COLS].fill_(1.0)
        self.v = q.new_empty(n, dp)
        self.v[:, :d] = q
        self.v[:, d:].fill_(0.0)
        if dp > d + FOLD_COLS:
            self.q[:, d + FOLD_COLS:].fill_(0.0)
        self._k: torch.Tensor | None = None

    def keys(self, bias_rows: torch.Tensor, scale: float) -> torch.Tensor:
        """k' [H, N, d'] for bias rows [H, N]: scale * q'_i . k'_hk = scale * z_i.z_k +
        bias_rows[h, k] to fp32 precision of the bias (hi + mid + lo of b / scale)."""
        h, d = bias_rows.shape[0], self.d
        if self._k is None or self._k.shape[0] < h:
            self._k = self.q.new_empty(h, *self.q.shape)
            self._k[:, :, :d] = self.v[:, :d]
            if self.dp > d + FOLD_COLS:
                self._k[:, :, d + FOLD_COLS:].fill_(0.0)
        k = self._k[:h]
        rest = torch.div(bias_rows.float(), scale).clamp_(min=-1e37)
        for c in range(FOLD_COLS):                              # hi, mid, lo parts of b / scale
            part = k[:, :, d + c]
            part.copy_(rest)                    # rounded to bf16 straight into its column
            if c + 1 < FOLD_COLS:
                rest.sub_(part)     # what is left, in fp32 (the bf16 part promoted exactly)
        return k


def fold_bias(q: torch.Tensor, bias_rows: torch.Tensor, scale: float):
    """(q' [N, d'], k' [H, N, d'], v' [N, d']) in q's dtype with scale * q'_i . k'_hk =
    scale * q_i . q_k + bias_rows[h, k] (to fp32 precision of the bias) and v' = [q, 0]."""
    fold = _Fold(q)
    return fold.q, fold.keys(bias_rows, scale), fold.v


def bf16_kernel() -> str:
    """The kernel of the bf16 branch: ``$HIERTAIL_ATTENTION_BF16``, "flash" (default) or
    "cudnn"; another value is a ValueError naming the variable."""
    value = os.environ.get(BF16_KERNEL_ENV) or "flash"
    if value not in BF16_KERNELS:
        raise ValueError(f"{BF16_KERNEL_ENV}={value!r} is not one of {', '.join(BF16_KERNELS)}")
    return value


def _call_folded(q: torch.Tensor, bias_rows: torch.Tensor, scale: float,
                 v_sign: torch.Tensor | None = None, fold: _Fold | None = None):
    cudnn = bf16_kernel() == "cudnn"
    name, args = (_CUDNN_OP, _CUDNN_ARGS) if cudnn else (_FLASH_OP, _FLASH_ARGS)
    op = _op(name, args)
    if op is None:
        raise AttentionUnavailable(f"torch.ops.aten.{name} is not available")
    n, d = q.shape
    h = bias_rows.shape[0]
    fold = fold or _Fold(q)
    kf, dp = fold.keys(bias_rows, scale), fold.dp
    qh = fold.q.view(1, 1, n, dp).expand(1, h, n, dp).contiguous()
    vh = _signed(fold.v.view(1, 1, n, dp).expand(1, h, n, dp), v_sign).contiguous()
    try:
        if cudnn:       # (no bias: it is in the folded columns; the LSE asked for)
            out, lse = op(qh, kf.unsqueeze(0), vh, None, True, 0.0, False, False,
                          scale=scale)[:2]
        else:
            out, lse = op(qh, kf.unsqueeze(0), vh, 0.0, False, False, scale=scale)[:2]
    except RuntimeError as err:
        raise AttentionUnavailable(str(err)) from err
    # flash: [1, H, N]; cuDNN: [1, H, N, 1]
    return out[0, :, :, :d], lse.reshape(1, h, -1)[0, :, :n].float()


def _heads(log_w: torch.Tensor):
    for h0 in range(0, log_w.shape[0], MAX_HEADS):
        yield h0, min(log_w.shape[0], h0 + MAX_HEADS)


class _Keys:
    """What one loss call's attention calls share about its keys: the fp32 log-weights, which
    keys each level sees (finite log_w, tested once for every call) and, on the bf16 flash
    branch, the folded operands (``_Fold``)."""

    def __init__(self, z: torch.Tensor, log_w: torch.Tensor) -> None:
        self.log_w = log_w.float()
        self.visible = finite(self.log_w)
        self.fold = _Fold(z) if _folds(z) else None


def _lse_and_out(z: torch.Tensor, keys: _Keys, scale: float, want_out: bool):
    bias = torch.where(keys.visible, keys.log_w, HIDDEN)          # a hidden key: HIDDEN
    lses, outs = [], []
    for h0, h1 in _heads(keys.log_w):
        out, l_h = _call(z, bias[h0:h1], scale, fold=keys.fold)
        lses.append(l_h)
        if want_out:
            outs.append(out)
    lse = (lses[0] if len(lses) == 1 else torch.cat(lses)).double()
    hidden = ~keys.visible.any(dim=1, keepdim=True)                 # a level with no visible key
    lse.masked_fill_(hidden, float("-inf"))                # (no host sync, unlike lse[hidden])
    if not want_out:
        return lse, None
    return lse, (outs[0] if len(outs) == 1 else torch.cat(outs))


def _key_side(z, keys: _Keys, scale, lse, g):
    """dz_k = scale * sum_l sum_i g_li p_lik z_i, one call per head group for both signs of g:
    the rows (keys of this call) get the bias log|g_li| - lse_li and the values
    sign(g_li) z_i, so the kernel's fp32 accumulator sums the positive and negative terms
    together. (It was a host read of which signs occur, after the forward's kernels, and a
    second call where some g < 0: each sign's sum rounded on its own, then subtracted.)"""
    # (g is 0 wherever lse is not finite: ``_grad`` zeroed it, so g != 0 alone picks the rows)
    rows = torch.where(g != 0, torch.log(g.abs().clamp(min=1e-38)) - lse.float(), HIDDEN)
    sign = torch.sign(g)
    dz = None
    for h0, h1 in _heads(keys.log_w):
        out, l2 = _call(z, rows[h0:h1], scale, v_sign=sign[h0:h1], fold=keys.fold)
        # keys that no row reaches with g != 0: lse' = HIDDEN -> exp underflows to exactly 0
        coef = torch.where(keys.visible[h0:h1], torch.exp(keys.log_w[h0:h1] + l2), 0.0)
        term = torch.einsum("hk,hkd->kd", coef, out.float())
        dz = term.mul_(scale) if dz is None else dz.add_(term, alpha=scale)
    return dz


def _max_first(s: torch.Tensor):
    """s.max(dim=1) (first arg-max); on CPU through the vectorised two-level search."""
    return _lse_torch.row_max_first_argmax(s) if s.device.type == "cpu" else s.max(dim=1)


def _row_max(z: torch.Tensor, log_w: torch.Tensor, scale: float,
             visible: torch.Tensor | None = None):
    """Unweighted max_k scale * z_i.z_k over the keys visible in each level, and its first
    arg-max (torch.max's tie rule), in row blocks of the device's block budget
    (``_lse_torch.block_bytes``: 48 MB on CPU, 128 MB on CUDA; with 32 MB blocks the official
    loss took 3-5x the exact one's time on an H200 at N = 20k): (rowmax [L, N], argmax [L, N]).
    ``visible``: finite(log_w), where the caller has it (``_Keys``).

    Keys [0, p) visible in every level (the hierarchical loss's embedding rows; p = N for one
    level) take ONE max per block for all levels, over a view of the block; only the keys past
    p are masked per level (their few columns: the levels' prototypes). On a tie the common
    max wins: its key ids are the smaller ones. (It was a masked copy and a max of the whole
    block per level.)"""
    n = z.shape[0]
    zc = z.float()
    if visible is None:
        visible = finite(log_w)
    p = _common_prefix(visible)         # the call's one host read
    rest_visible = visible[:, p:]
    rowmax = torch.empty(log_w.shape, dtype=torch.float32, device=z.device)
    argmax = torch.empty(log_w.shape, dtype=torch.long, device=z.device)
    b = _max_block_rows(n, z.device)
    for r0 in range(0, n, b):
        s = torch.mm(zc[r0:r0 + b], zc.t()).mul_(scale)
        if p:
            m_c, a_c = _max_first(s if p == n else s[:, :p])
        if p == n:
            rowmax[:, r0:r0 + b], argmax[:, r0:r0 + b] = m_c, a_c
            continue
        rest = s[:, p:]
        for lev in range(log_w.shape[0]):
            m, a = _max_first(rest.masked_fill(~rest_visible[lev][None, :], float("-inf")))
            a = a + p
            if p:
                take = m > m_c
                m, a = torch.where(take, m, m_c), torch.where(take, a, a_c)
            rowmax[lev, r0:r0 + b], argmax[lev, r0:r0 + b] = m, a
    return rowmax, argmax


def _common_prefix(visible: torch.Tensor) -> int:
    """p: keys [0, p) are visible in every level (one host read)."""
    return int(visible.all(dim=0).cumprod(0, dtype=torch.int32).sum())


def _max_block_rows(n: int, device: torch.device) -> int:
    """Rows per block of ``_row_max``: the device's block budget over n fp32 columns, on CUDA at
    least ``_lse_torch.cuda_rows_floor`` (the budget alone is 33 rows at a million keys)."""
    b = _lse_torch.block_bytes(device) // (4 * max(n, 1))
    if device.type == "cuda":
        b = _lse_torch.cuda_rows_floor(b, n, device)
    return max(1, min(n, b))


def lse_forward(z: torch.Tensor, log_w: torch.Tensor, scale: float, need_max: bool):
    """-> (lse [L, N] float64, rowmax [L, N] or None, argmax [L, N] or None)."""
    zi = _input(z)
    keys = _Keys(zi, log_w)
    # the row max first: its one host read (which keys all levels see) comes before the
    # attention calls are queued (the host would wait for them), after the keys' few kernels
    rowmax, argmax = ((None, None) if not need_max
                      else _row_max(zi, keys.log_w, float(scale), keys.visible))
    lse, _ = _lse_and_out(zi, keys, float(scale), want_out=False)
    return lse, rowmax, argmax


def lse_backward(
    z: torch.Tensor, log_w: torch.Tensor, lse: torch.Tensor, grad_lse: torch.Tensor, scale: float
) -> torch.Tensor:
    """dz [N, d] (float32) of sum_{l,i} grad_lse[l, i] * lse[l, i]; recomputes O."""
    zi = _input(z)
    keys = _Keys(zi, log_w)
    _, out = _lse_and_out(zi, keys, float(scale), want_out=True)
    return _grad(zi, keys, float(scale), lse, grad_lse, out)


def lse_fused(z: torch.Tensor, log_w: torch.Tensor, scale: float, need_max: bool, coef_fn):
    """Forward and gradient: coef_fn(slice(None), lse, rowmax) -> g [L, N]; dz = d/dz sum g * lse.

    Returns (lse, rowmax, argmax, dz) like ``_lse_torch.lse_fused``."""
    zi = _input(z)
    keys = _Keys(zi, log_w)
    # the row max first, for lse_forward's reason (its host read before the attention calls)
    rowmax, argmax = ((None, None) if not need_max
                      else _row_max(zi, keys.log_w, float(scale), keys.visible))
    lse, out = _lse_and_out(zi, keys, float(scale), want_out=True)
    g = coef_fn(slice(None), lse, rowmax)
    return lse, rowmax, argmax, _grad(zi, keys, float(scale), lse, g, out)


def _grad(z, keys: _Keys, scale, lse, g, out):
    """dz of sum g * lse, g [L, N] in its caller's dtype (float64 from the loss). The gradient
    is linear in g: it is taken for g / max|g| in float32 and scaled back (a 0-dim tensor, no
    host read; four launches). Upstream gradients of ~1e-39, below float32's normal range,
    came out up to 28x off the reference's: ``_key_side``'s log|g| clamps |g| at 1e-38, and
    float32 g that small has lost bits (2026-12-06)."""
    g = torch.where(finite(lse), g, 0.0)
    # (max|g| of an all-zero g: the dtype's smallest normal, so 0 / norm = 0)
    norm = torch.linalg.vector_norm(g, float("inf")).clamp(min=torch.finfo(g.dtype).tiny)
    g = (g / norm).float()
    dz = torch.einsum("hi,hid->id", g, out.float()).mul_(scale)   # query side
    return dz.add_(_key_side(z, keys, scale, lse, g)).mul_(norm)


def kernel_dtype(z: torch.Tensor) -> torch.dtype:
    """The dtype the kernels compute on for rows `z` (float32 or bfloat16): bf16 on CUDA stays
    bf16 (flash attention with the folded bias); other 16-bit inputs, and every 16-bit input on
    CPU, run in fp32 (the memory-efficient kernel takes its bias in the inputs' dtype:
    log-weights in 16 bits would be off by up to ~3 %). The precision guard keys on it too."""
    if z.dtype == torch.bfloat16 and _kernel_kind(z.device) == "cuda":
        return torch.bfloat16
    return torch.float32


def _input(z: torch.Tensor) -> torch.Tensor:
    """The kernels' input: z in ``kernel_dtype(z)``. float64 is refused (the caller keeps its
    exact engine: never a silent downgrade)."""
    if z.dtype == torch.float64:
        raise AttentionUnavailable("float64 inputs stay on the exact engine")
    return z.to(kernel_dtype(z)).contiguous()


# The attention kernels return the LSE in fp32 and recompute s inside the kernel, so p_ik =
# exp(s_ik + log w_k - lse_i) carries a relative error of about |lse_i| * 2^-24 (the rounding of
# lse). Our own engines keep lse as shift + rel in float64 and reuse one s per block, and stay
# exact at any |s|. Above a bound on |s| (Cauchy-Schwarz: scale * max_i |z_i|^2 >= |s_ik|,
# attained by s_ii) a call goes to our engine. The bound depends on the variant: the official
# variant's gradient cancels more (positives clamped at the row max), so its error grows ~8x
# faster. Measured with the guard off (`python bench/attention_guard.py`, N = 2,000, d = 64,
# relu / randn embeddings; max-norm relative gradient error), CPU flash kernel (2-core EPYC)
# and CUDA memory-efficient kernel (NVIDIA H200, 2026-11-27): exact 3.4e-6 / 6.2e-6 (CPU) and
# 4.9e-6 / 1.2e-5 (H200) at a bound of 256, 1.1e-5 / 2.2e-5 and 1.6e-5 / 4.3e-5 at 1,024,
# 1.7e-5 / 6.3e-5 and 3.2e-5 / 7.5e-5 at 2,048; official (relu) 3.4e-5 / 4.4e-5 at 256,
# 1.7e-4 / 1.8e-4 at 1,024. The limits keep every measured error >= 2x inside fp32's test
# tolerance (1e-4). HierTail's own embeddings sit at ~400-450 (scale 10, unnormalised hidden
# layer), which 256 sent to a slower engine for the exact variant.
MAX_LOGIT = {"exact": 1024.0, "official": 256.0}
# bf16 inputs on the bf16 kernels (CUDA flash; on CPU they run the fp32 kernel and take the fp32
# limits, ``within_precision``): the gradient comes back in bf16 (rounded to 2^-9 relative, 2e-3),
# so the exact variant may go further: measured with `python bench/attention_guard.py --dtype
# bfloat16` (NVIDIA H200, 2026-11-27, flash attention with the folded bias; against float64 on the
# same bf16 inputs), max-norm relative gradient error, attention / our exact torch engine (both
# include bf16's rounding of the returned gradient): exact relu 1.7e-3 / 1.7e-3 at B = 1,024, 2.2e-3
# / 1.7e-3 at 4,096, 2.1e-3 / 1.3e-3 at 8,192, 2.0e-3 / 1.7e-3 at 16,384; randn 3.0e-3 / 3.0e-3 up
# to 4,096, 2.3e-3 / 2.1e-3 at 8,192. The official variant is never served there: flash attention
# returns its output O in bf16, and the official gradient cancels (its LSE part against its
# positives) so much that this rounding became 3.6e-2 at B = 1,024 (torch engine 1.7e-3). HierTail's
# own embeddings reach ~1,200 at 100k nodes (scale 10), over the fp32 limit: with --loss-dtype
# bfloat16 they stay on the bf16 kernels. float16 rounds 4x finer: it keeps the fp32 limits (and
# runs the fp32 memory-efficient kernel).
MAX_LOGIT_BF16 = {"exact": 8192.0, "official": 0.0}


def logit_bound(z: torch.Tensor, scale: float) -> float:
    """scale * max_i |z_i|^2: >= every |s_ik| (Cauchy-Schwarz), attained by s_ii (one
    reduction and one host sync)."""
    with torch.no_grad():
        return abs(scale) * float(z.float().pow(2).sum(1).max()) if z.shape[0] else 0.0


class LogitBound:
    """One loss call's ``logit_bound``, computed on first use and then shared by every guard
    that asks (the automatic CUDA choice, the attention guard, the Triton dots): one reduction
    and one host sync per call at most, none when no guard asks. ``max_row_norm``: max_i ‖z_i‖
    already read (the loss's input checks, ``_validation.LossInputValues``): the bound is then
    scale · max_row_norm², no reduction and no sync (the same bound to a few ulps: the norm is
    rounded in the logits' dtype, then squared in float64)."""

    def __init__(self, z: torch.Tensor, scale: float,
                 max_row_norm: float | None = None) -> None:
        self._z, self._scale = z, scale
        self._value = None if max_row_norm is None else abs(scale) * max_row_norm ** 2

    @property
    def value(self) -> float:
        if self._value is None:
            self._value = logit_bound(self._z, self._scale)
        return self._value


# The official variant at small N (a fuzzing find, 2026-11-27): with few rows the official
# gradient nearly cancels in every row (near-singleton classes, each row's own key far ahead)
# while the fp32 LSE's rounding does not, so inside MAX_LOGIT small problems still missed the
# tests' rule. Measured (``python bench/official_small_n.py --engine attention --n N --dims 1 3
# 8 16 64 --bounds ... --seeds 12``, CPU flash kernel, 2026-11-27), worst error / rule: N = 8
# 0.04 / 1.43 at B = 32 / 64; N = 16 0.03 / 0.35 at 32 / 64; N = 31 0.24 / 0.84 at 64 / 128
# (2.8 at 256); N = 48 0.28 at 96; N = 64 0.37 / 0.96 at 128 / 256; N = 96 0.42 at 192; N =
# 128, 256, 512 0.66, 0.38, 0.30 at 256. So the official limit is also OFFICIAL_LOGIT_PER_ROW
# times the rows (queries and prototypes together): B <= 2N keeps every measured case under
# its limit at or below 0.66 of the rule, as MAX_LOGIT does at N >= 128. Beyond it the call
# runs our own engine (instant at that size). The Triton kernels need no such rule: they
# carry lse - rowmax apart from rowmax (their relative mode, ``_triton_loss``).
# Lowered from 2 to 0.5 (a fuzzing find, 2026-12-05, session 58): keys that are the arg-max
# of many rows (hubs: low d, or prototypes of the largest norm) add a second cancellation, the
# arg-max's share of many rows against their LSE parts on one key (docs/LOSS.md, "many rows
# share an arg-max key"; our torch engines fold it, these kernels cannot), and
# `python bench/official_fuzz.py --rows 150 257 --max-log-bound 2.408 --engines attention
# --levels 3` found the prototypes' gradient up to 3.7x the rule at B ~ N (100-260 rows, d 1-3,
# B 180-250). Worst error / rule by B / N over ~7,300 cases of that script's generator with
# B <= 256 (one level with the hierarchical cases' prototypes, and 2-3 levels): <= 0.25 0.12 /
# 0.05, (0.25, 0.5] 0.27 / 0.17, (0.5, 0.75] 1.40 / 0.24, (0.75, 1] 3.74 / 1.48, (1, 2] 1.61 /
# 1.37. Problems of 512 rows and more keep the limit MAX_LOGIT: ``--rows 512 1024 2048 --dims 1
# 2 3 8 --max-log-bound 2.41 --levels 3`` found none over the rule in 416 cases (worst 0.47).
OFFICIAL_LOGIT_PER_ROW = 0.5

# The exact variant at small N (a fuzzing find, 2026-12-05, session 59: `python
# bench/official_fuzz.py --variant exact`): a row whose own key takes its whole softmax
# (p_ii ~ 1: a large norm, the other keys far behind) and is its only positive (include_self,
# a class of its own: a long tail's singletons) has a gradient that cancels, p_ii - 1 ~ 0. The
# query side (scale g O_i) cancels exactly, O_i being normalised inside the kernel; the key
# side's p_ii = e^{s_ii + log w_i - lse_i} takes lse_i from the first call, rounded to fp32 at
# |s|'s size, and s_ii from the second: ~B 2^-24 of the term stays (our torch engine reuses one
# s per block: nothing stays). With many rows, such rows' other terms are larger against it,
# so the excess shrinks with N. Seed 59 of the fuzz (18,115 one-level and 12,411 up-to-three-
# level cases) put 26 cases over the tests' rule, all at 2-3 rows and B / N > 8 (worst 8.4x at
# B 616, 2 rows). `python bench/exact_small_n.py` (rows of equal norm in classes of their own,
# include_self, tau 0.1, d 2 / 16 / 64, 4 seeds; CPU flash kernel), worst error / rule: B 64:
# 0.42 / 0.29 / 0.10 at N = 2 / 8 / 64; B = N: 0.10 / 0.23 / 0.39 / 0.57 / 0.68 at N = 64 / 128
# / 256 / 512 / 1,000; above B = N the kernels miss it: B 128 at N = 2 1.07, B 512 at N = 64
# 1.50, B 1,000 at N = 256 1.18. So the exact limit is also max(EXACT_MIN_LOGIT,
# EXACT_LOGIT_PER_ROW x the rows): problems of 1,024 rows and more keep MAX_LOGIT, smaller ones
# with larger logits run our engine (instant there). The same seeds with the rule: 0 cases
# over it (worst 0.81). Unlike the official rule this one reaches the automatic choice: on
# CUDA, fp32 exact single-level calls below the Triton engine's rows run these kernels.
EXACT_LOGIT_PER_ROW = 1.0
EXACT_MIN_LOGIT = 64.0


def max_logit(variant: str, dtype: torch.dtype) -> float:
    """The guard's limit for `variant` on inputs of `dtype`."""
    return (MAX_LOGIT_BF16 if dtype == torch.bfloat16 else MAX_LOGIT)[variant]


def rows_limit(variant: str, dtype: torch.dtype, rows: int) -> float:
    """The guard's limit for `variant` on `rows` rows (queries and prototypes) of `dtype`:
    ``max_logit`` and, for the fp32 kernels, the rows rule of the variant (official: at most
    ``OFFICIAL_LOGIT_PER_ROW`` x the rows; exact: at most the larger of ``EXACT_MIN_LOGIT`` and
    ``EXACT_LOGIT_PER_ROW`` x the rows). `dtype` is the kernels' (``kernel_dtype``): the bf16
    kernels, whose gradient comes back rounded to bf16, keep their own limits
    (``MAX_LOGIT_BF16``)."""
    limit = max_logit(variant, dtype)
    if variant == "official":
        return min(limit, OFFICIAL_LOGIT_PER_ROW * rows)
    if dtype != torch.bfloat16:
        return min(limit, max(EXACT_MIN_LOGIT, EXACT_LOGIT_PER_ROW * rows))
    return limit


def within_precision(z: torch.Tensor, scale: float, variant: str = "official",
                     bound: LogitBound | None = None) -> bool:
    """Whether the kernels' fp32 LSE is precise enough for these logits: the bound (the call's
    shared ``LogitBound`` if given) <= ``rows_limit(variant, kernel_dtype(z), rows of z)``.
    The dtype the kernels compute on, not z's: bf16 rows on CPU run the fp32 kernel, whose
    error is the fp32 one, so they take the fp32 limits and rows rules (with the bf16 limits
    they did not: ``bench/official_fuzz.py --dtype bfloat16 --variant exact --engines
    attention``, seed 62, found 2-3 row cases up to 55x the tests' rule at B 1e3-1e4, each
    within it on our engine; a fuzzing find, 2026-12-05)."""
    limit = rows_limit(variant, kernel_dtype(z), z.shape[0])
    return (bound or LogitBound(z, scale)).value <= limit


__all__ = [
    "AttentionUnavailable",
    "LogitBound",
    "available",
    "kernel_dtype",
    "logit_bound",
    "lse_backward",
    "lse_forward",
    "lse_fused",
    "max_logit",
    "rows_limit",
    "supported",
    "within_precision",
]
