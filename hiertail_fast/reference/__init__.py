"""Plain, obviously-correct PyTorch references: the oracle for tests and benchmarks.

Dense where that is simplest; float64-safe so `torch.autograd.gradcheck` runs. Never fast.
"""
from __future__ import annotations

from hiertail_fast._lazy import lazy_getattr

_EXPORTS = {
    "gcn_propagate_ref": "hiertail_fast.reference.gcn_propagate",
    "balanced_contrastive_loss_ref": "hiertail_fast.reference.balanced_contrastive_loss",
    "topk_pool_ref": "hiertail_fast.reference.topk_pool",
    "topk_unpool_ref": "hiertail_fast.reference.topk_pool",
    "nearest_prototype_ref": "hiertail_fast.reference.nearest_prototype",
}
__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS)
