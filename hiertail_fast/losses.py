"""Drop-in class-balanced contrastive losses (HierTail SCL Eq. 7 / BCL Eq. 8), O(N*d) memory.

Same numbers as ``hiertail_fast.reference.balanced_contrastive_loss_ref`` (its docstring holds
the definitions). The engine is picked by ``hiertail_fast.ops._dispatch.choose_loss_backend``
(README, "Public API"): on CPU our torch engine (the symmetric C engine for one level from 512
rows; the attention kernel for the exact single level only where the C kernels are missing or
switched off), on CUDA by size, dtype, variant and logits between PyTorch's attention kernels,
our Triton kernels and the torch engine; float64 always on the torch engine. ``backend=``
("reference" | "torch" | "attention" | "triton") or the ``HIERTAIL_BACKEND`` environment
variable ("reference" | "torch" | "triton") forces one.

Example::

    >>> import torch
    >>> from hiertail_fast import balanced_contrastive_loss
    >>> z = torch.randn(1000, 64, requires_grad=True)
    >>> y = torch.randint(0, 10, (1000,))
    >>> loss = balanced_contrastive_loss(z, y, temperature=0.1)
    >>> loss.backward()
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hiertail_fast._validation import check_flag, check_loss_options, check_temperature_value
from hiertail_fast.ops.balanced_contrastive_loss import (
    balanced_contrastive_loss_op,
    hierarchical_contrastive_loss_op,
)

__all__ = [
    "balanced_contrastive_loss",
    "BalancedContrastiveLoss",
    "hierarchical_contrastive_loss",
]


def balanced_contrastive_loss(
    z: torch.Tensor,
    labels: torch.Tensor,
    *,
    prototypes: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 0.1,
    include_self: bool = True,
    reduction: str = "mean",
    variant: str = "exact",
    backend: str | None = None,
) -> torch.Tensor:
    """Class-balanced contrastive loss of ``z`` [N, d] with ``labels`` [N].

    Rows ``prototypes`` [m, d] are appended with labels 0..m-1. Key k is weighted by
    1 / |class of k|; ``include_self`` puts i in its own positive set (official code) or not
    (paper Eq. 7); ``variant="official"`` adds the official code's 1e-7 after the row-max
    shift (clamps positive terms near -16.1), ``"exact"`` is the epsilon-free formula.
    ``reduction``: "mean" over rows with a non-empty positive set | "sum" | "none" ([N + m],
    0 for rows with an empty positive set, e.g. singleton classes with include_self=False).
    ``temperature``: a float, or a 0-d float tensor that may require grad (learnable; its
    gradient is exact on every backend). ``backend``: None (automatic, see the module
    docstring) | "reference" (dense N x N, the definition) | "torch" | "attention" | "triton".
    Extra memory O(B*N) on CPU (row blocks), O(N*d) on GPU. Refused with a ValueError: logits
    or dot products that overflow their dtype, and ``variant="official"`` on a fast backend
    past max ‖z_i‖²/τ = 2^37 (its error there; the reference has no such bound).
    """
    return balanced_contrastive_loss_op(
        z, labels, prototypes, temperature, include_self, reduction, variant, backend
    )


def hierarchical_contrastive_loss(
    z: torch.Tensor,
    level_labels: Sequence[torch.Tensor],
    level_prototypes: Sequence[torch.Tensor | None],
    *,
    temperature: float | torch.Tensor = 0.1,
    include_self: bool = True,
    variant: str = "exact",
    backend: str | None = None,
) -> torch.Tensor:
    """sum_l balanced_contrastive_loss(z, level_labels[l], prototypes=level_prototypes[l]).

    Computed in one pass over the shared z.z^T block (multi-level fusion, DESIGN.md §3): the
    exp of every node-node similarity is taken once for all levels. Each level uses the mean
    reduction; ``level_prototypes[l]`` may be None (no prototypes in that level). ``backend``
    as for :func:`balanced_contrastive_loss`.
    """
    return hierarchical_contrastive_loss_op(
        z, level_labels, level_prototypes, temperature, include_self, variant, backend
    )


class BalancedContrastiveLoss(nn.Module):
    """nn.Module wrapper of :func:`balanced_contrastive_loss` (holds the hyper-parameters)."""

    def __init__(
        self,
        temperature: float | torch.Tensor = 0.1,
        include_self: bool = True,
        reduction: str = "mean",
        variant: str = "exact",
    ) -> None:
        super().__init__()
        # the checks that read no embeddings, now rather than at the first forward
        check_loss_options(temperature, reduction, variant, include_self)
        check_temperature_value(temperature)
        if isinstance(temperature, torch.Tensor) and not isinstance(temperature, nn.Parameter):
            # a buffer: in the state_dict and moved by .to() (it was a plain attribute, so a
            # checkpoint kept the constructor's value); the same tensor, so a gradient still
            # reaches it. An nn.Parameter is registered as one by the assignment below.
            self.register_buffer("temperature", temperature)
        else:
            self.temperature = temperature
        self.include_self = check_flag(include_self, "include_self")
        self.reduction = reduction
        self.variant = variant

    def _apply(self, fn, recurse: bool = True):
        """``.half()`` / ``.bfloat16()`` (a module conversion to a 16-bit float dtype) move a
        tensor temperature but keep its dtype: the losses compute 16-bit rows in float32, and
        a τ rounded to 16 bits changed the loss even of float32 embeddings (τ 0.1 became
        0.0999755859375: 1.6e-2 off in fp16, 6.3e-2 in bf16; an nn-module audit). Every other
        effect of ``fn`` applies as to any parameter or buffer (device, float64, float32,
        ``share_memory()``: fn runs on τ itself — it ran on an empty stand-in before, so τ
        was never shared between processes); a Parameter stays the same object (an
        optimizer holding it keeps working)."""
        tau = self.temperature
        if not isinstance(tau, torch.Tensor):
            return super()._apply(fn, recurse)
        home = self._parameters if "temperature" in self._parameters else self._buffers
        del home["temperature"]
        try:
            super()._apply(fn, recurse)
        finally:
            home["temperature"] = tau

        def applied(t: torch.Tensor) -> torch.Tensor:
            out = fn(t)
            if out.dtype in (torch.float16, torch.bfloat16) and t.dtype.is_floating_point:
                out = t.to(device=out.device)           # moved, not rounded to 16 bits
                # (nor one 16-bit format rounded to the other: a float16 τ under .bfloat16()
                # became bfloat16, 0.0999755859375 -> 0.10009765625; a mutation audit, s72)
            return out

        with torch.no_grad():
            new = applied(tau)
            if isinstance(tau, nn.Parameter):
                if new is not tau:
                    tau.data = new
                if tau.grad is not None:
                    tau.grad = applied(tau.grad)
            else:
                home["temperature"] = new
        return self

    def forward(
        self, z: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`balanced_contrastive_loss` of z [N, d] with labels [N] (and prototypes [m, d],
        prototype t joining class t) under this module's settings."""
        return balanced_contrastive_loss(
            z, labels, prototypes=prototypes, temperature=self.temperature,
            include_self=self.include_self, reduction=self.reduction, variant=self.variant,
        )

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, include_self={self.include_self}, "
            f"reduction={self.reduction!r}, variant={self.variant!r}"
        )
