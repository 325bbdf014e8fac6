"""PyTorch Geometric ``Data`` in and out, without importing ``torch_geometric`` unless needed.

``torch_geometric`` is an optional dependency. Reading a ``Data`` (:func:`from_pyg_data`,
:func:`as_graph_data`, :func:`graph_inputs`) needs no import: a ``Data`` is recognised by its class
(:func:`is_pyg_data`). Making one (:func:`to_pyg_data`) and PyG's dataset classes import it
lazily through :func:`import_pyg`, whose ImportError says ``pip install torch_geometric``.

No copies: ``from_pyg_data`` keeps ``x`` / ``y`` / ``edge_index`` / ``edge_weight`` as the very
tensors of the ``Data`` when they already have the library's dtypes (float32 / int64 / int64 /
float) and live on the CPU; only a dtype change, a sparse ``x`` (densified) or a CUDA tensor
(moved, as every GraphData is a CPU graph) copies. ``to_pyg_data`` shares the GraphData's tensors.

Split precedence (the training entry points, ``hiertail_fast.train``): an explicit split (the
``split`` argument, ``--split FILE``) > the ``train_mask`` / ``val_mask`` / ``test_mask`` of a
``Data`` > the protocol's natural split redone per seed. Masks are taken only as a full set of
three 1-D boolean masks; a partial set or 2-D masks (several stored splits) are an error rather
than being silently ignored.
"""
from __future__ import annotations

import importlib
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hiertail_fast._validation import INDEX_DTYPES, all_finite, check_has_values
from hiertail_fast.data.io import GraphData, load_npz
from hiertail_fast.data.splits import SPLIT_PARTS, split_part_names, user_split

__all__ = ["is_pyg_data", "import_pyg", "from_pyg_data", "to_pyg_data", "split_from_masks",
           "as_graph_data", "graph_inputs", "MASK_KEYS"]

MASK_KEYS = ("train_mask", "val_mask", "test_mask")
PIP_HINT = "pip install torch_geometric"


def import_pyg(module: str = "torch_geometric", what: str = "this"):
    """Import ``module`` (a ``torch_geometric`` module); a clear ImportError when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{what} needs PyTorch Geometric ({module}), which is not installed or not "
            f"importable: {PIP_HINT}  ({exc})"
        ) from exc


def is_pyg_data(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch_geometric.data.Data`` (or a subclass); imports nothing."""
    return any(c.__name__ == "Data" and c.__module__.startswith("torch_geometric.")
               for c in type(obj).__mro__)


def _get(data: Any, key: str) -> Any:
    try:
        return getattr(data, key, None)
    except (AttributeError, KeyError):  # some storages raise KeyError for unknown keys
        return None


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t if t.device.type == "cpu" else t.cpu()


def graph_inputs(data: Any, num_nodes: int | None = None, edge_weight: Any = None
                 ) -> tuple[torch.Tensor, int, torch.Tensor | None]:
    """``(edge_index, num_nodes, edge_weight)`` of a PyG ``Data`` (for ``prepare_graph``).

    ``num_nodes`` / ``edge_weight`` given here must agree with / replace the ``Data``'s.
    Raises TypeError for a non-``Data`` and ValueError for a missing or malformed edge_index.
    """
    if not is_pyg_data(data):
        raise TypeError(f"data must be a torch_geometric.data.Data, got {type(data).__name__}")
    ei = _get(data, "edge_index")
    if not isinstance(ei, torch.Tensor):
        raise ValueError("data.edge_index is missing: the Data must carry edge_index [2, E]")
    check_has_values(ei, "data.edge_index")
    n = data.num_nodes
    if n is None:
        raise ValueError("data.num_nodes is unknown: give the Data an x or a num_nodes")
    if num_nodes is not None and int(num_nodes) != int(n):
        raise ValueError(f"num_nodes={num_nodes} but the Data has {n} nodes")
    w = edge_weight if edge_weight is not None else _get(data, "edge_weight")
    if w is None and isinstance(_get(data, "edge_attr"), torch.Tensor):
        # (as the npz loader says of arrays outside its format: the graph was read unweighted
        # without a word, where a user's weights may sit in edge_attr)
        warnings.warn("the Data's edge_attr is not read: the graph is used unweighted, as "
                      "PyG's GCNConv uses it; for one weight per edge set data.edge_weight "
                      "(e.g. data.edge_weight = data.edge_attr)", stacklevel=3)
    return ei, int(n), w


def from_pyg_data(data: Any, *, name: str | None = None) -> GraphData:
    """A PyG ``Data`` (x, edge_index, y, optional edge_weight) as a :class:`GraphData`.

    Labels are kept as they are (``num_classes`` = max label + 1); masks are not part of a
    GraphData: :func:`split_from_masks` reads them. Raises TypeError for a non-``Data`` or
    non-integer ``y``, ValueError naming the attribute for missing or inconsistent parts.
    """
    if not is_pyg_data(data):
        raise TypeError(f"data must be a torch_geometric.data.Data, got {type(data).__name__}")
    x, y = _get(data, "x"), _get(data, "y")
    if x is None:
        raise ValueError("data.x is missing: HierTail needs node features x [n, F]")
    # (a torch_sparse SparseTensor or a numpy x was reported "missing"; a data audit)
    if type(x).__name__ == "SparseTensor" and hasattr(x, "to_dense"):
        x = x.to_dense()
    elif isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"data.x must be a tensor of node features [n, F], got "
                        f"{type(x).__name__}")
    # (an API audit, session 68: a meta x failed inside torch, a complex x lost its imaginary
    # part to x.float() with torch's generic warning only)
    check_has_values(x, "data.x")
    if x.is_complex():
        raise TypeError(f"data.x is complex ({x.dtype}); the model takes real features: pass "
                        "x.real, x.abs() or both as columns")
    if x.layout != torch.strided:  # e.g. AttributedGraphDataset's sparse CSR x (> 10k features)
        x = x.to_dense()
    if x.dim() != 2:
        raise ValueError(f"data.x must be 2-D [n, F], got shape {tuple(x.shape)}")
    if not isinstance(y, torch.Tensor):
        raise ValueError("data.y is missing: node labels y [n] are required")
    check_has_values(y, "data.y")
    if y.dim() == 2 and y.shape[1] == 1:
        y = y.view(-1)
    if y.dim() != 1:
        raise ValueError(f"data.y must be 1-D [n] (single-label node classification), got shape "
                         f"{tuple(y.shape)}")
    if y.dtype not in INDEX_DTYPES:
        raise TypeError(f"data.y must hold integer labels (int64, int32, int16, int8 or uint8), "
                        f"got {y.dtype}")
    n = x.shape[0]
    if y.shape[0] != n:
        raise ValueError(f"data.y has {y.shape[0]} labels but data.x has {n} rows")
    given = data["num_nodes"] if "num_nodes" in data else None    # set, not inferred by PyG
    if given is not None and int(given) != n:
        # (graph_inputs' own message named the two the other way round; a data audit)
        raise ValueError(f"data.num_nodes = {int(given)} but data.x has {n} rows")
    if not y.numel():
        raise ValueError("data has no nodes")
    if int(y.min()) < 0:
        raise ValueError(f"data.y has negative labels (min {int(y.min())}); -1 'unlabelled' "
                         "nodes are not supported: drop them or give them a class")
    ei, _, w = graph_inputs(data, n)
    if ei.dim() != 2 or ei.shape[0] != 2 or ei.dtype not in INDEX_DTYPES:
        raise ValueError(f"data.edge_index must be an integer tensor [2, E], got {ei.dtype} "
                         f"{tuple(ei.shape)}")
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
        raise ValueError(f"data.edge_index has node ids outside [0, {n}) (n = data.x rows)")
    if w is not None:
        w = torch.as_tensor(w)
        if w.shape != (ei.shape[1],):
            raise ValueError(f"data.edge_weight must have shape [{ei.shape[1]}] (one per edge), "
                             f"got {tuple(w.shape)}")
        w = _cpu(w if w.is_floating_point() else w.float())
    x32 = x if x.dtype == torch.float32 else x.float()
    if x32 is not x and x.is_floating_point() and not all_finite(x32) and all_finite(x):
        big = float(x.detach().abs().max())
        raise ValueError(f"data.x has values beyond float32's range (|x| up to {big:.3g}), "
                         "which would become inf: rescale the features")
    return GraphData(
        edge_index=_cpu(ei if ei.dtype == torch.int64 else ei.long()),
        x=_cpu(x32),
        y=_cpu(y if y.dtype == torch.int64 else y.long()),
        num_classes=int(y.max()) + 1,
        name=name if name is not None else type(data).__name__.lower(),
        edge_weight=w,
    )


def split_from_masks(data: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(train, val, test)`` node ids from a ``Data``'s three boolean masks, or None if it has
    none. Raises ValueError for a partial set or masks that are not 1-D boolean of length n."""
    masks = {k: _get(data, k) for k in MASK_KEYS}
    present = [k for k, m in masks.items() if m is not None]
    if not present:
        return None
    if len(present) != 3:
        missing = [k for k in MASK_KEYS if k not in present]
        raise ValueError(f"data has {', '.join(present)} but not {', '.join(missing)}: give all "
                         "three masks, or pass split= explicitly")
    n = data.num_nodes
    if n is None:   # no x, no num_nodes: int(None) raised a TypeError naming neither
        raise ValueError("data has masks but no node count (no x and no num_nodes)")
    for k, m in masks.items():
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
            raise ValueError(f"data.{k} must be a boolean tensor, got {type(m).__name__}"
                             f"{'' if not isinstance(m, torch.Tensor) else ' ' + str(m.dtype)}")
        if m.dim() != 1:
            raise ValueError(f"data.{k} has shape {tuple(m.shape)}: several stored splits; pick "
                             f"one, e.g. data.{k} = data.{k}[:, 0]")
    return user_split(int(n), *(masks[k] for k in MASK_KEYS))


def as_graph_data(data: Any, split: Any = None) -> tuple[Any, Any]:
    """The training entry points' input rule: ``(graph, split)``.

    A PyG ``Data`` becomes a :class:`GraphData` (:func:`from_pyg_data`) and, when ``split`` is
    None, its masks give the split (None when it has none). Anything else is returned as is.
    """
    if not is_pyg_data(data):
        missing = [a for a in ("x", "edge_index", "y", "num_classes") if _get(data, a) is None]
        if missing:   # (a dict, a tuple, a HeteroData: an AttributeError deep in the loop)
            raise TypeError(f"data must be a GraphData (load_npz, load_dataset, "
                            f"make_synthetic_graph) or a PyG Data, got {type(data).__name__} "
                            f"(no {', '.join(missing)})")
        return data, split
    graph = from_pyg_data(data)
    return graph, split if split is not None else split_from_masks(data)


def to_pyg_data(source: Any, *, split: Any = None):
    """A PyG ``Data(x, edge_index, y[, edge_weight][, masks])`` from a :class:`GraphData` or a
    path to a uniform ``.npz`` file; the tensors are shared with the GraphData, not copied.

    ``split``: (train, val, test) index arrays or masks, stored as ``train_mask`` etc.
    Needs ``torch_geometric`` (ImportError naming ``pip install torch_geometric`` otherwise).
    """
    if isinstance(source, (str, os.PathLike)):
        source = load_npz(Path(source))
    if not isinstance(source, GraphData):
        raise TypeError(f"source must be a GraphData or a path to a .npz file, got "
                        f"{type(source).__name__}")
    data_cls = import_pyg("torch_geometric.data", "to_pyg_data").Data
    kwargs: dict[str, Any] = dict(x=source.x, edge_index=source.edge_index, y=source.y)
    if source.edge_weight is not None:
        kwargs["edge_weight"] = source.edge_weight
    if split is not None:
        if isinstance(split, dict):
            unknown = sorted(set(split) - {f"{k}{s}" for k in SPLIT_PARTS
                                           for s in ("", "_idx", "_mask")})
            if unknown:   # a misspelt key ("valid") gave an empty mask, silently
                raise ValueError(f"split has keys {unknown}; expected train, val, test (or "
                                 "train_idx, ..., or train_mask, ...)")
            split = [None if name is None else split[name]    # (a None value: not given)
                     for name in split_part_names(lambda key: split.get(key) is not None)]
        if not isinstance(split, (list, tuple)) or len(split) != 3 or any(
                p is None for p in split):
            raise ValueError("split must give train, val and test (index arrays or masks)")
        n = source.num_nodes
        for key, idx in zip(MASK_KEYS, user_split(n, *split), strict=True):
            mask = torch.zeros(n, dtype=torch.bool)
            mask[idx] = True
            kwargs[key] = mask
    return data_cls(**kwargs)
