"""Datasets: the uniform .npz format, the paper's datasets by name (``load_dataset``), PyG
``Data`` conversion, splits, and the synthetic long-tail graph generator.

Public names resolve lazily (``torch_geometric`` is imported only by the functions needing it).
"""
from __future__ import annotations

from hiertail_fast._lazy import lazy_getattr

_EXPORTS = {
    "GraphData": "hiertail_fast.data.io",
    "load_npz": "hiertail_fast.data.io",
    "save_npz": "hiertail_fast.data.io",
    "load_dataset": "hiertail_fast.data.datasets",
    "DATASETS": "hiertail_fast.data.datasets",
    "from_pyg_data": "hiertail_fast.data.pyg",
    "to_pyg_data": "hiertail_fast.data.pyg",
    "convert": "hiertail_fast.data.conversion",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
