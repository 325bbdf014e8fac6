"""Datasets: the uniform .npz format, the paper's datasets by name (``load_dataset``), PyG
``Data`` conversion, splits, and the synthetic long-tail graph generator.

Public names resolve lazily (``torch_geometric`` is imported only by the functions needing it).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

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
    "relabel_by_size": "hiertail_fast.data.io",
    "natural_split": "hiertail_fast.data.splits",
    "make_synthetic_graph": "hiertail_fast.data.synthetic",
    "semi_synthetic_long_tail": "hiertail_fast.data.semi_synthetic",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    # what type checkers and IDEs see (``X as X``: an explicit re-export; __all__ is
    # computed, which they do not read): the names __getattr__ resolves lazily
    from hiertail_fast.data.conversion import convert as convert
    from hiertail_fast.data.datasets import DATASETS as DATASETS
    from hiertail_fast.data.datasets import load_dataset as load_dataset
    from hiertail_fast.data.io import GraphData as GraphData
    from hiertail_fast.data.io import load_npz as load_npz
    from hiertail_fast.data.io import relabel_by_size as relabel_by_size
    from hiertail_fast.data.io import save_npz as save_npz
    from hiertail_fast.data.pyg import from_pyg_data as from_pyg_data
    from hiertail_fast.data.pyg import to_pyg_data as to_pyg_data
    from hiertail_fast.data.semi_synthetic import (
        semi_synthetic_long_tail as semi_synthetic_long_tail,
    )
    from hiertail_fast.data.splits import natural_split as natural_split
    from hiertail_fast.data.synthetic import make_synthetic_graph as make_synthetic_graph

__getattr__ = lazy_getattr(__name__, _EXPORTS)
