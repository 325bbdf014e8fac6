"""Plain, obviously-correct PyTorch references: the oracle for tests and benchmarks.

Dense where that is simplest; float64-safe so `torch.autograd.gradcheck` runs. Never fast.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "gcn_propagate_ref": "hiertail_fast.reference.gcn_propagate",
    "balanced_contrastive_loss_ref": "hiertail_fast.reference.balanced_contrastive_loss",
    "topk_pool_ref": "hiertail_fast.reference.topk_pool",
    "topk_unpool_ref": "hiertail_fast.reference.topk_pool",
    "nearest_prototype_ref": "hiertail_fast.reference.nearest_prototype",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hiertail_fast.reference' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
