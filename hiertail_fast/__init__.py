"""hiertail_fast: fast, memory-lean HierTail (KDD'24) for long-tail node classification.

Public API (imported lazily: `import hiertail_fast` imports neither triton nor the kernels):

Kernels / ops
    balanced_contrastive_loss, BalancedContrastiveLoss, hierarchical_contrastive_loss
    gcn_propagate, GCNConv
    topk_pool, TopKPool, topk_unpool, nearest_prototype
Model and data
    HierTail, CSRGraph, make_synthetic_graph, load_npz, load_dataset, from_pyg_data, to_pyg_data
Metrics
    evaluate, accuracy, balanced_accuracy, macro_f1, g_means, per_class_accuracy,
    class_imbalance_ratio, long_tailedness_ratio, loss_range
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hiertail_fast._lazy import lazy_getattr

__version__ = "0.1.0"

# public name -> submodule that defines it
_EXPORTS = {
    "CSRGraph": "hiertail_fast.graph",
    "balanced_contrastive_loss": "hiertail_fast.losses",
    "BalancedContrastiveLoss": "hiertail_fast.losses",
    "hierarchical_contrastive_loss": "hiertail_fast.losses",
    "gcn_propagate": "hiertail_fast.ops.gcn_propagate",
    "topk_pool": "hiertail_fast.ops.topk_pool",
    "topk_unpool": "hiertail_fast.ops.topk_pool",
    "TopKPoolResult": "hiertail_fast.ops.topk_pool",
    "nearest_prototype": "hiertail_fast.ops.nearest_prototype",
    "GCNConv": "hiertail_fast.nn.conv",
    "TopKPool": "hiertail_fast.nn.pool",
    "HierTail": "hiertail_fast.nn.hiertail",
    "make_synthetic_graph": "hiertail_fast.data.synthetic",
    "load_npz": "hiertail_fast.data.io",
    "load_dataset": "hiertail_fast.data.datasets",
    "from_pyg_data": "hiertail_fast.data.pyg",
    "to_pyg_data": "hiertail_fast.data.pyg",
    "evaluate": "hiertail_fast.metrics",
    "accuracy": "hiertail_fast.metrics",
    "balanced_accuracy": "hiertail_fast.metrics",
    "macro_f1": "hiertail_fast.metrics",
    "g_means": "hiertail_fast.metrics",
    "per_class_accuracy": "hiertail_fast.metrics",
    "class_imbalance_ratio": "hiertail_fast.metrics",
    "long_tailedness_ratio": "hiertail_fast.metrics",
    "loss_range": "hiertail_fast.metrics",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    # what type checkers and IDEs see (``X as X``: an explicit re-export; __all__ is
    # computed, which they do not read): the names __getattr__ resolves lazily
    from hiertail_fast.data.datasets import load_dataset as load_dataset
    from hiertail_fast.data.io import load_npz as load_npz
    from hiertail_fast.data.pyg import from_pyg_data as from_pyg_data
    from hiertail_fast.data.pyg import to_pyg_data as to_pyg_data
    from hiertail_fast.data.synthetic import make_synthetic_graph as make_synthetic_graph
    from hiertail_fast.graph import CSRGraph as CSRGraph
    from hiertail_fast.losses import BalancedContrastiveLoss as BalancedContrastiveLoss
    from hiertail_fast.losses import balanced_contrastive_loss as balanced_contrastive_loss
    from hiertail_fast.losses import hierarchical_contrastive_loss as hierarchical_contrastive_loss
    from hiertail_fast.metrics import accuracy as accuracy
    from hiertail_fast.metrics import balanced_accuracy as balanced_accuracy
    from hiertail_fast.metrics import class_imbalance_ratio as class_imbalance_ratio
    from hiertail_fast.metrics import evaluate as evaluate
    from hiertail_fast.metrics import g_means as g_means
    from hiertail_fast.metrics import long_tailedness_ratio as long_tailedness_ratio
    from hiertail_fast.metrics import loss_range as loss_range
    from hiertail_fast.metrics import macro_f1 as macro_f1
    from hiertail_fast.metrics import per_class_accuracy as per_class_accuracy
    from hiertail_fast.nn.conv import GCNConv as GCNConv
    from hiertail_fast.nn.hiertail import HierTail as HierTail
    from hiertail_fast.nn.pool import TopKPool as TopKPool
    from hiertail_fast.ops.gcn_propagate import gcn_propagate as gcn_propagate
    from hiertail_fast.ops.nearest_prototype import nearest_prototype as nearest_prototype
    from hiertail_fast.ops.topk_pool import TopKPoolResult as TopKPoolResult
    from hiertail_fast.ops.topk_pool import topk_pool as topk_pool
    from hiertail_fast.ops.topk_pool import topk_unpool as topk_unpool


_resolve = lazy_getattr(__name__, _EXPORTS)


def __getattr__(name: str) -> Any:
    value = _resolve(name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
