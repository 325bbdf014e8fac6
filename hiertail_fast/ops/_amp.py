"""The ops under ``torch.autocast``: one defined precision instead of whatever autocast does to
the torch calls inside them.

Autocast rewrites eligible torch calls (``mm``, ``addmm``, ``matmul``, attention) to run in its
lower-precision dtype, inside our ops too, where the engines' error analysis assumes the input
dtype. Measured before this module (CPU autocast, bfloat16): ``nearest_prototype`` returned a
prototype that is not the nearest for ~0.5 % of the rows (its near-tie re-check assumes fp32
distances), and the loss's ``torch`` engine mixed bf16 gradient GEMMs with fp32 logits
(gradient 1e-3 off, its value fp32-exact). The rule now:

* the contrastive losses take autocast's dtype as their input dtype, as PyTorch's own
  attention does (``scaled_dot_product_attention`` is on autocast's lower-precision list):
  float32 ``z`` / prototypes are cast to ``torch.get_autocast_dtype(device)`` (bf16 or fp16),
  which selects the library's 16-bit path (exact products, fp32 accumulation, an fp32 loss
  value; on CUDA the bf16 kernels) — what ``--loss-dtype bfloat16`` does explicitly.
  float64 inputs are left alone, as autocast leaves them;
* every op then runs with autocast switched off (``autocast_off``, entered by
  ``_dispatch.public_op``, the loss ops and ``_autograd.first_order_backward``), forward and
  backward, so its engines compute exactly as they do for inputs of that dtype outside
  autocast. The graph ops (``gcn_propagate``, ``topk_pool``, ``nearest_prototype``) keep their
  input dtype, as PyTorch's sparse products and ``torch.cdist`` do under autocast.
"""
from __future__ import annotations

import contextlib

import torch

from hiertail_fast._validation import all_finite


def autocast_dtype(t: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast is running ``t``'s device type in, or None when it is off there."""
    kind = t.device.type
    try:
        if not torch.is_autocast_enabled(kind):
            return None
        return torch.get_autocast_dtype(kind)
    except (RuntimeError, ValueError):      # a device type without autocast support
        return None


def autocast_off(t: torch.Tensor | None):
    """A context with autocast switched off for ``t``'s device type (nothing to do when it is
    off already, or for None)."""
    if t is None or autocast_dtype(t) is None:
        return contextlib.nullcontext()
    return torch.autocast(t.device.type, enabled=False)


def loss_inputs(z: torch.Tensor, *others: torch.Tensor | None):
    """(z, *others) in autocast's dtype when autocast is on for z's device and z is float32
    (differentiable casts: the gradients come back in float32); as given otherwise, and also
    when a value does not fit the 16-bit dtype (float16 holds |x| <= 65,504): then the call
    stays in float32, exact, rather than computing on infinities (NaN) or failing mid-run."""
    dtype = autocast_dtype(z)
    if dtype is None or z.dtype != torch.float32:
        return (z, *others)
    out = tuple(None if t is None else t.to(dtype) for t in (z, *others))
    if all(t is None or all_finite(t.detach()) for t in out):
        return out
    return (z, *others)

