"""Plain, obviously-correct PyTorch references: the oracle for tests and benchmarks.

Dense where that is simplest; float64-safe so `torch.autograd.gradcheck` runs. Never fast.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from hiertail_fast._lazy import lazy_getattr

_EXPORTS = {
    "gcn_propagate_ref": "hiertail_fast.reference.gcn_propagate",
    "balanced_contrastive_loss_ref": "hiertail_fast.reference.balanced_contrastive_loss",
    "topk_pool_ref": "hiertail_fast.reference.topk_pool",
    "topk_unpool_ref": "hiertail_fast.reference.topk_pool",
    "nearest_prototype_ref": "hiertail_fast.reference.nearest_prototype",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    # what type checkers and IDEs see (``X as X``: an explicit re-export; __all__ is
    # computed, which they do not read): the names __getattr__ resolves lazily
    from hiertail_fast.reference.balanced_contrastive_loss import (
        balanced_contrastive_loss_ref as balanced_contrastive_loss_ref,
    )
    from hiertail_fast.reference.gcn_propagate import gcn_propagate_ref as gcn_propagate_ref
    from hiertail_fast.reference.nearest_prototype import (
        nearest_prototype_ref as nearest_prototype_ref,
    )
    from hiertail_fast.reference.topk_pool import topk_pool_ref as topk_pool_ref
    from hiertail_fast.reference.topk_pool import topk_unpool_ref as topk_unpool_ref


__getattr__ = lazy_getattr(__name__, _EXPORTS)
