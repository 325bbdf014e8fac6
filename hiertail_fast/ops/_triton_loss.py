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
import math
import os

import torch

from hiertail_fast.ops._attention_lse import LogitBound

TF32X3_MAX_LOGIT = {"exact": 2048.0, "official": 1024.0}
# The kernels keep LSE in fp32 whatever the dot: an absolute error of ~ulp(|lse|) / 2 in every
# p_ik = exp(s_ik + log w_k - lse_i), relative ~B 2^-25. The exact variant's fp32 reference has
# the same (the tests' rule passed at B ~ 3e4). The official gradient cancels the arg-max term
# against p_argmax ~ 1, where the reference works on s - M (small) and cancels exactly: with
# fp32 inputs the Triton engine failed the tests' rule (error 1.5-15x the bound) from B ~ 1.2e4
# and passed at 6.1e3 (Triton interpreter, N = 203, d = 8, tau 0.01, every reduction;
# tests/test_balanced_contrastive_loss.py::test_reduction_none_at_large_logits, a fuzzing
# find). Above this limit an fp32 official call on the Triton engine runs our torch engine
# (exact at any B), as the attention kernels' guard does; bf16 inputs passed at B ~ 1.2e5.
FP32_LSE_MAX_LOGIT = {"exact": float("inf"), "official": 4096.0}
# The same fp32 LSE serves 16-bit rows (exact products, fp32 accumulation), and its error in
# the official variant grows with B as for fp32 rows (abs. gradient error ~ the same at a given
# B), while the tolerances are 10x (fp16) and 100x (bf16) fp32's. The guard was missing for
# them (a fuzzing find: fp16 rows at B ~ 1.3e7 gave an official loss 3.6 % off, 0.485 on 13.6;
# bf16 at 2.6e5 a gradient 4.5 % off). Measured with the guard off (python
# bench/attention_guard.py --engines triton torch --dtype {float16,bfloat16} --n 300 --d 16
# --bounds 1024 4096 16384 65536 262144 1048576 4194304; Triton interpreter, 2026-11-27,
# docs/results/triton_lse_guard_*.json), official variant, Triton / torch engine, max-norm
# relative gradient error: fp16 relu 3.5e-4 / 3.5e-4 at 16,384, 6.2e-4 / 4.3e-4 at 65,536,
# 8.1e-3 / 2.2e-3 at 262,144; fp16 randn 3.3e-4 / 3.0e-4 at 4,096, 1.7e-2 / 2.8e-4 at 16,384;
# bf16 relu 1.1e-3 / 1.1e-3 at 65,536, 4.5e-2 / 2.8e-3 at 262,144; bf16 randn 1.6e-3 / 1.6e-3
# at 16,384, 1.09 / 3.5e-3 at 65,536 (a gradient of 1.4e-4: every positive clamped). Limit:
# the largest measured bound with both regimes within 2.5x the dtype's rtol (1e-3, 1e-2), the
# margin fp32's 4,096 has by the same measure (randn 2.5e-4). The exact variant's 16-bit
# errors equal the torch engine's at every bound measured (to 4.2e6): no limit.
LSE_MAX_LOGIT = {torch.float32: FP32_LSE_MAX_LOGIT,
                 torch.float16: {"exact": float("inf"), "official": 4096.0},
                 torch.bfloat16: {"exact": float("inf"), "official": 16384.0}}
FP32_DOT_ENV = "HIERTAIL_TRITON_FP32_DOT"     # the same name as kernels/_utils.FP32_DOT_ENV


def _kernels():
    # lazily: `import hiertail_fast` must never import triton
    return importlib.import_module("hiertail_fast.kernels.balanced_contrastive_loss")


def tf32x3_precise(z: torch.Tensor, scale: float, variant: str,
                   bound: LogitBound | None = None) -> bool:
    """Whether 3xTF32 dots keep this call's error inside fp32's tolerances (B <= limit; B from
    the call's shared ``LogitBound`` if given)."""
    return (bound or LogitBound(z, scale)).value <= TF32X3_MAX_LOGIT[variant]


def lse_precise(z: torch.Tensor, scale: float, variant: str,
                bound: LogitBound | None = None) -> bool:
    """Whether the kernels' fp32 LSE is precise enough for this call: logits not over
    LSE_MAX_LOGIT[z.dtype][variant] (the bound is computed only where that limit is finite)."""
    limit = LSE_MAX_LOGIT.get(z.dtype, {}).get(variant, float("inf"))
    if math.isinf(limit):
        return True
    return (bound or LogitBound(z, scale)).value <= limit


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
    return _kernels().lse_forward(z, log_w, scale, need_max, fp32_dot=fp32_dot,
                                  n_common=n_common)


def lse_backward(z, log_w, lse, grad_lse, scale, *, fp32_dot: str | None = None,
                 out_dtype: torch.dtype | None = None, n_common: int = 0):
    """The kernels' backward with the forward's `fp32_dot` (its one-pass kernel recomputes the
    forward's scores and relies on getting the same ones) and shared-keys prefix."""
    return _kernels().lse_backward(z, log_w, lse, grad_lse, scale, fp32_dot=fp32_dot,
                                   out_dtype=out_dtype, n_common=n_common)


__all__ = ["FP32_LSE_MAX_LOGIT", "TF32X3_MAX_LOGIT", "fp32_dot", "lse_backward", "lse_forward",
           "lse_precise", "positive_pairs", "shared_levels", "tf32_cores", "tf32x3_precise"]
