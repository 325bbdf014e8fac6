"""The Triton loss kernels as a loss engine: which fp32 dot each call multiplies with, and the
official variant's positive-pair pass on its own kernel (``positive_pairs``, the same dots).

``kernels/balanced_contrastive_loss.py`` multiplies fp32 tiles either with IEEE fp32 FMAs
("ieee": exact products, no tensor cores) or with 3xTF32 tensor-core dots ("tf32x3": each
product within ~2^-22 relative, fp32 accumulation). On an NVIDIA H200 (torch 2.11, triton 3.6,
2026-11-27, bench/loss_profile.py, exact loss fwd+bwd, d = 64) tf32x3 took 11.6 ms at N = 20k
where ieee took 258 ms, and 120 ms at N = 100k: 0.47x SDPA fp32 fwd+bwd, at the cuBLAS 3-GEMM
floor.

Like the attention kernels' fp32 LSE (``_attention_lse``, the comment above ``MAX_LOGIT``), the
tf32x3 error can grow with the logits (an error of ~|s_ik| 2^-22 in a logit is a relative error
of that size in p_ik = exp(s_ik + log w_k - lse_i)). So the engine picks per call from the bound
B = scale * max_i |z_i|^2 (>= every |s_ik|): "tf32x3" while B <= TF32X3_MAX_LOGIT[variant],
else "ieee" (exact products at any B, slow). $HIERTAIL_TRITON_FP32_DOT
(``kernels/_utils.FP32_DOT_ENV``) forces one for every call. 16-bit inputs use native
tensor-core dots (exact products) whatever this says.

The limits are measured (``python bench/attention_guard.py --engines triton[tf32x3] torch``,
NVIDIA H200, 2026-11-27, N = 2,000, d = 64; max-norm relative gradient error against float64,
relu embeddings, tf32x3 / our exact torch engine): exact 1.1e-6 / 6.3e-7 at B = 256, 3.0e-6 /
1.7e-6 at 1,024, 5.5e-6 / 3.3e-6 at 2,048; official 2.0e-5 / 3.0e-5 at 512, 4.3e-5 / 2.4e-5 at
1,024, 8.4e-5 / 5.1e-5 at 2,048 (randn embeddings: below 1e-6 for the exact variant at every
B). tf32x3 stays within ~2x of the exact engine, far closer than the attention kernels' fp32
LSE (exact 1.7e-5 at 1,024). Each limit is the largest measured bound whose error is >= 2x
inside fp32's test tolerance (1e-4): exact 2,048 (18x inside), official 1,024 (2.3x).
"""
from __future__ import annotations

import importlib
import os

import torch

from hiertail_fast.ops._attention_lse import LogitBound

TF32X3_MAX_LOGIT = {"exact": 2048.0, "official": 1024.0}
# No limit on the logits for the kernels' LSE (2026-11-27, session 22). The kernels used to
# keep the official variant's LSE as one fp32 number of |s|'s size (rounded to ~B 2^-25), and
# its gradient cancels the arg-max term against p_argmax ~ 1, where the reference works on
# s - M (small) and cancels exactly: above 4,096 (fp32, fp16) / 16,384 (bf16) official calls
# went to our torch engine, and even inside those limits small problems missed the tests'
# rule (N = 31, B = 1,024: 28x; bench/official_small_n.py). The official calls now run the
# kernels' relative mode (``lse_forward`` below): sums against the unweighted row max, lse
# returned as rowmax + δ with δ to fp32 precision of log N (and δ itself, ``relative_forward``:
# float64 rowmax + δ holds δ only while |rowmax| <= 2^29; 2026-12-07). Measured after the change
# (``python bench/attention_guard.py --engines triton torch --dtype {float32,float16,
# bfloat16} --n 300 --d 16 --bounds 4096 16384 65536 262144 1048576``, Triton interpreter,
# official variant): the Triton gradient and value errors equal the torch engine's at every
# bound and dtype (fp32 relu 2.3e-4 / 2.4e-4 at 65,536, where the old kernels gave 4.3e-3;
# values 1e-8 where they were 1e-5), and official_small_n's worst error / rule went from
# 2.9 / 28 to 0.24 / 0.70 at B = 256 / 1,024 (N = 31). One regime where they differ (a
# Triton-kernels audit, 2026-12-02, interpreter): every term saturated (τ 0.01, every row of
# norm 30-100, B 9e4-1e6), where the exact gradient is 0 and the torch engine cancels to 0
# exactly, the kernels leave 1.5e-5 - 2.4e-4: fp32 rounding, ~4e-7 of the row's terms
# (scale·|z|·g ~ 300), outside the tests' absolute 1e-5 there (their float32 sweep stops at
# B = 6,144); the value stays within 1e-7. The shared-keys mode keeps the old (m, δ) pair, so
# the loss uses it for the exact variant only.
FP32_DOT_ENV = "HIERTAIL_TRITON_FP32_DOT"     # the same name as kernels/_utils.FP32_DOT_ENV


def _kernels():
    # lazily: `import hiertail_fast` must never import triton
    return importlib.import_module("hiertail_fast.kernels.balanced_contrastive_loss")


def tf32x3_precise(z: torch.Tensor, scale: float, variant: str,
                   bound: LogitBound | None = None) -> bool:
    """Whether 3xTF32 dots keep this call's error inside fp32's tolerances (B <= limit; B from
    the call's shared ``LogitBound`` if given)."""
    return (bound or LogitBound(z, scale)).value <= TF32X3_MAX_LOGIT[variant]


def tf32_cores(device: torch.device) -> bool:
    """Whether `device` multiplies TF32 on tensor cores (NVIDIA compute capability >= 8.0,
    Ampere on): older cards would run "tf32x3" slowly or not at all. CPU tensors (the Triton
    interpreter, whose dots are numpy fp32 whatever is asked): True."""
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device) >= (8, 0)


def fp32_dot(z: torch.Tensor, scale: float, variant: str,
             bound: LogitBound | None = None) -> str:
    """The fp32 dot for one loss call on `z`: $HIERTAIL_TRITON_FP32_DOT when set (validated by
    the kernels' own parser), else "tf32x3" where precise enough on a card with TF32 tensor
    cores, else "ieee". Inputs that are not fp32 get "ieee" (unused: 16-bit tiles have their
    own dots)."""
    if os.environ.get(FP32_DOT_ENV, "").strip():
        return importlib.import_module("hiertail_fast.kernels._utils").fp32_dot()
    if z.dtype != torch.float32 or not tf32_cores(z.device):
        return "ieee"
    return "tf32x3" if tf32x3_precise(z, scale, variant, bound) else "ieee"


def positive_pairs(z, gid, n_groups, row_max, arg_max, scale, include_self, coef=None, *,
                   need_sums: bool = True, fp32_dot: str | None = None):
    """The official positive-pair pass on the Triton kernel
    (``kernels/balanced_contrastive_loss_positives.py``), with the forward's `fp32_dot`."""
    mod = importlib.import_module("hiertail_fast.kernels.balanced_contrastive_loss_positives")
    return mod.positive_pairs(z, gid, n_groups, row_max, arg_max, scale, include_self, coef,
                              need_sums=need_sums, fp32_dot=fp32_dot)


def shared_levels() -> bool:
    """Whether several levels run the kernels' shared-keys mode ($HIERTAIL_TRITON_SHARED_LEVELS,
    validated by the kernels' own parser; off by default until timed on a GPU)."""
    return importlib.import_module("hiertail_fast.kernels._utils").shared_levels_requested()


def lse_forward(z, log_w, scale, need_max, *, fp32_dot: str | None = None, n_common: int = 0):
    """The kernels' forward: (lse, rowmax, argmax) as ``_lse_torch``'s; with need_max (the
    official variant) and no shared-keys prefix, ``relative_forward``'s without its δ."""
    if need_max and not n_common:
        return relative_forward(z, log_w, scale, fp32_dot=fp32_dot)[:3]
    return _kernels().lse_forward(z, log_w, scale, need_max, fp32_dot=fp32_dot,
                                  n_common=n_common)


def relative_forward(z, log_w, scale, *, fp32_dot: str | None = None):
    """The official variant's forward, the kernels' relative mode: (lse float64 = rowmax + δ,
    rowmax, argmax, δ = lse - rowmax float64). δ is kept apart to fp32 precision of its own
    size (~log N), so the official gradient's cancellation at the arg-max is not swamped by an
    fp32 lse's rounding (~|s| 2^-24; at small N it was up to 28x the tests' rule,
    bench/official_small_n.py), nor by the float64 sum's past |s| ~ 2^29 (2.7x the rule at
    |s| 1.1e11). The backward takes the rowmax and this δ (``lse_backward``)."""
    return _kernels().lse_forward(z, log_w, scale, True, fp32_dot=fp32_dot, relative=True,
                                  return_delta=True)


def lse_backward(z, log_w, lse, grad_lse, scale, *, fp32_dot: str | None = None,
                 out_dtype: torch.dtype | None = None, n_common: int = 0,
                 rowmax: torch.Tensor | None = None, argmax: torch.Tensor | None = None,
                 argmax_coef: torch.Tensor | None = None, delta: torch.Tensor | None = None):
    """The kernels' backward with the forward's `fp32_dot` (its one-pass kernel recomputes the
    forward's scores and relies on getting the same ones) and shared-keys prefix; `rowmax`:
    the forward's, when it ran the relative mode (``relative_forward``; None otherwise), and
    `delta` its δ (None: lse - rowmax, short of fp32 precision past |s| ~ 2^29); `argmax`
    (with rowmax): fold the key side of argmax_coef - grad_lse on each row's arg-max score
    into the kernel's gradient blocks, where it cancels against p per entry (the official
    row max's share and the positives' share of it; its query side is the caller's)."""
    return _kernels().lse_backward(z, log_w, lse, grad_lse, scale, fp32_dot=fp32_dot,
                                   out_dtype=out_dtype, n_common=n_common, rowmax=rowmax,
                                   argmax=argmax, argmax_coef=argmax_coef, delta=delta)


__all__ = ["TF32X3_MAX_LOGIT", "fp32_dot", "lse_backward", "lse_forward", "positive_pairs",
           "relative_forward", "shared_levels", "tf32_cores", "tf32x3_precise"]
