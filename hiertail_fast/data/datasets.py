"""The paper's six datasets by name: ``load_dataset(name, root=...)``.

Where a dataset is read from, in this order (``source="auto"``):

1. ``<root>/<name>.npz`` in the uniform format (``hiertail_fast.data.io``; shared/data/README.md);
2. for ``cora_full`` and ``wiki``, PyTorch Geometric's dataset class over its raw files under
   ``root`` (``CitationFull(root, "cora")``: ``<root>/cora/raw/cora.npz``;
   ``AttributedGraphDataset(root, "Wiki")``: ``<root>/wiki/raw/{attrs.npz, edgelist.txt,
   labels.txt}``), as the official harness loads them. PyG downloads missing raw files only
   with ``download=True`` (a network is needed); otherwise a FileNotFoundError names every
   missing file, where to place it and where to get it.

``email``, ``blogcatalog``, ``amazon_clothing`` and ``amazon_electronics`` have no PyG class
(PyG's ``AttributedGraphDataset("BlogCatalog")`` is a different graph: 5,196 nodes, 6 classes,
not the paper's 10,312 / 38): their error names the expected ``.npz`` path. ``root`` is the
argument or, when None, the environment variable ``HIERTAIL_DATA``; nothing else is guessed.

The official preprocessing (PROTOCOL_AND_BASELINES.md §1.1) is applied identically on both paths
by :func:`official_preprocess`:

- graph: undirected, duplicates and self-loops removed, edges sorted by (src, dst) (the uniform
  format); the one self-loop per node is added by ``prepare_graph`` when training, exactly as
  the official ``remove_self_loops`` + ``add_self_loops``; edge weights are dropped (the
  official loaders keep only the edge index);
- labels relabelled by descending class size (class 0 largest; stable tie-break, see
  ``relabel_by_size``); ``label_map`` records the mapping;
- features raw, except ``cora_full``: binarised (x > 0 -> 1, else 0; PyG's ``read_npz`` sets
  x[x > 0] = 1, the same on the dataset's non-negative counts, so a ``cora_full.npz`` made from
  the raw graph2gauss counts loads the same) and ``blogcatalog``:
  row-normalised as the official BlogCatalog loader does (x_i / Σ_j x_ij, a zero sum gives a
  zero row; DeepWalk rows have signed entries, so this is a signed-sum division as in the code:
  on shared/data's recomputed embeddings a few rows with a sum near 0 reach |x| ~ 3,300, median
  row max 0.43; ``preprocess=False``, or ``--data blogcatalog.npz``, keeps the raw embeddings).

Optional, off by default as in the official harness: ``feature_norm="row"`` divides every
feature row by its sum after that preprocessing (:func:`normalize_features`), what the official
code's ``--is_normalize`` flag (``utils.normalize``) does. Wiki needs it: its raw TF-IDF rows sum
to ~2,800 (median), and with them neither HierTail nor GCN learns (best validation epoch 1-2,
training loss stuck at the class prior's entropy; docs/REPRODUCTION.md).

BlogCatalog's label rule (first group of the multi-label ``group`` matrix, groups after 16
shifted down: 38 classes) is a property of its raw ``.mat``; ``blogcatalog.npz`` already
carries it (shared/data/README.md), so it is not re-applied here.
"""
from __future__ import annotations

import dataclasses
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hiertail_fast._validation import all_finite, check_feature_norm, check_flag
from hiertail_fast.data.io import GraphData, load_npz, relabel_classes
from hiertail_fast.data.pyg import from_pyg_data, import_pyg

__all__ = ["DATASETS", "DatasetSpec", "load_dataset", "official_preprocess", "resolve_root",
           "canonical_name", "undirected_edges", "normalize_features", "ENV_ROOT",
           "dataset_input_paths"]

ENV_ROOT = "HIERTAIL_DATA"
_SOURCES = ("auto", "npz", "pyg")


@dataclass(frozen=True)
class DatasetSpec:
    """How one paper dataset is found and preprocessed.

    pyg: (class name in ``torch_geometric.datasets``, its ``name`` argument) or None;
    raw_files: the files that class reads, relative to ``root``; get_raw: where to get them;
    features: ``"raw"`` | ``"binary"`` | ``"row_normalized"``; hint: for the missing-file error.
    """

    name: str
    pyg: tuple[str, str] | None = None
    raw_files: tuple[str, ...] = ()
    get_raw: str = ""
    features: str = "raw"
    hint: str = ""


DATASETS: dict[str, DatasetSpec] = {s.name: s for s in (
    DatasetSpec("cora_full", ("CitationFull", "cora"), ("cora/raw/cora.npz",),
                "https://github.com/abojchevski/graph2gauss/raw/master/data/cora.npz",
                features="binary"),
    DatasetSpec("wiki", ("AttributedGraphDataset", "wiki"),
                ("wiki/raw/attrs.npz", "wiki/raw/edgelist.txt", "wiki/raw/labels.txt"),
                "the files of wiki.attr/ in PyG's Google Drive zip (id "
                "1EPhlbziZTQv19OsTrKrAJwsElbVPEbiV, torch_geometric.datasets."
                "AttributedGraphDataset.datasets['wiki'])"),
    DatasetSpec("email", hint="convert Tail-GNN's dataset/email files (edges.txt, "
                "graph.embeddings, labels.txt) as shared/data/README.md describes"),
    DatasetSpec("blogcatalog", features="row_normalized",
                hint="PyG's AttributedGraphDataset('BlogCatalog') is a different graph (5,196 "
                "nodes, 6 classes); convert blogcatalog.mat + 64-d DeepWalk embeddings as "
                "shared/data/README.md describes"),
    DatasetSpec("amazon_clothing", hint="convert GPN's few_shot_data/Amazon_clothing_* files"),
    DatasetSpec("amazon_electronics",
                hint="convert GPN's few_shot_data/Amazon_eletronics_* files"),
)}

# The official harness's names (data_load.decide_config) and common spellings.
_ALIASES = {"cora": "cora_full", "corafull": "cora_full", "blog": "blogcatalog",
            "amz_cloth": "amazon_clothing", "amz_eletronics": "amazon_electronics",
            "amz_electronics": "amazon_electronics"}


def canonical_name(name: Any) -> str:
    """The registry name of ``name`` (case, '-' and the official aliases accepted)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    key = name.strip().lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in DATASETS:
        raise ValueError(f"unknown dataset name {name!r}; known: {', '.join(DATASETS)}")
    return key


def resolve_root(root: Any = None) -> Path:
    """``root`` or ``$HIERTAIL_DATA`` as an existing directory (no other default)."""
    if root is None:
        root = os.environ.get(ENV_ROOT) or None
        if root is None:
            raise ValueError(f"root is not given and {ENV_ROOT} is not set: pass root=DIR "
                             f"(--root DIR) or set {ENV_ROOT}=DIR")
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a path, got {type(root).__name__}")
    if not os.fspath(root).strip():  # Path("") is ".": the working directory, silently
        raise ValueError(f"root is an empty path: pass root=DIR (--root DIR) or set "
                         f"{ENV_ROOT}=DIR")
    path = Path(root).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"root {path} is not a directory")
    return path


def undirected_edges(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """int64 [2, E]: both directions, no duplicates, no self-loops, sorted by (src, dst)."""
    ei = torch.as_tensor(edge_index).long()
    src, dst = ei[0], ei[1]
    keep = src != dst
    src, dst = src[keep], dst[keep]
    n = int(num_nodes)
    key = torch.unique(torch.cat([src * n + dst, dst * n + src]))  # sorted
    return torch.stack([key // n, key % n])


def _row_normalize(x: torch.Tensor) -> torch.Tensor:
    """x_i / Σ_j x_ij in float64 (the official numpy ``normalize``); zero sums give zero rows.
    A row whose entries nearly cancel (1e30, -1e30, 1e-30) divides past float32's range:
    ValueError naming the node and its sum (the loader's later NaN / Inf check blamed the
    file for values the normalisation made)."""
    x64 = x.double()
    s = x64.sum(dim=1, keepdim=True)
    inv = torch.where(s == 0, torch.zeros_like(s), 1.0 / s)
    out = (x64 * inv).float()
    if not all_finite(out):
        node = int((~torch.isfinite(out)).any(dim=1).nonzero()[0])
        raise ValueError(f"row normalisation (x_i / sum_j x_ij) of node {node} leaves float32's "
                         f"range: its features sum to {float(s[node]):.3g} (entries that "
                         f"cancel); use the raw features (--feature-norm none) or fix that row")
    return out


def official_preprocess(graph: GraphData, name: str) -> GraphData:
    """The official harness's preprocessing of dataset ``name`` (module docstring); a new
    GraphData, the input is not modified."""
    spec = DATASETS[canonical_name(name)]
    n = graph.num_nodes
    x = graph.x
    if spec.features == "binary":
        x = (x > 0).to(torch.float32)
    elif spec.features == "row_normalized":
        x = _row_normalize(x)
    # O(n) memory whatever the largest label, as load_npz (a dense table over the labels took
    # 460 MB at a label of 2e7 and a MemoryError at 2^40; a data audit)
    y, original_labels, label_map = relabel_classes(graph.y.numpy())
    y = np.ascontiguousarray(y)
    return GraphData(edge_index=undirected_edges(graph.edge_index, n), x=x,
                     y=torch.from_numpy(y), num_classes=int(original_labels.shape[0]),
                     name=spec.name, label_map=label_map, original_labels=original_labels)


def normalize_features(graph: GraphData, feature_norm: str = "none") -> GraphData:
    """``graph`` with its features normalised: ``"none"`` returns ``graph`` itself; ``"row"`` a
    new GraphData whose feature rows are x_i / Σ_j x_ij (the official ``utils.normalize`` behind
    ``--is_normalize``; a zero row stays zero). The input is not modified."""
    if check_feature_norm(feature_norm) == "none":
        return graph
    return dataclasses.replace(graph, x=_row_normalize(graph.x))


def _missing_message(spec: DatasetSpec, root: Path, missing: list[Path]) -> str:
    npz = root / f"{spec.name}.npz"
    if spec.pyg is None:
        return (f"load_dataset({spec.name!r}): {npz} not found. {spec.name!r} has no PyTorch "
                f"Geometric dataset class, so it is read only from a uniform .npz file: place "
                f"it at {npz} ({spec.hint}).")
    cls, arg = spec.pyg
    files = "; ".join(str(p) for p in missing)
    return (f"load_dataset({spec.name!r}): neither {npz} nor the raw files of PyG's "
            f"{cls}(root, {arg!r}) are there. Place {files} (from {spec.get_raw}), or the "
            f"uniform .npz at {npz}; with a network, download=True (the --download option of "
            f"python -m hiertail_fast.train and of python -m hiertail_fast.data convert) lets "
            f"PyG fetch the raw files.")


def _load_pyg(spec: DatasetSpec, root: Path, download: bool) -> GraphData:
    assert spec.pyg is not None
    cls_name, arg = spec.pyg
    missing = [root / f for f in spec.raw_files if not (root / f).is_file()]
    if missing and not download:
        raise FileNotFoundError(_missing_message(spec, root, missing))
    datasets = import_pyg("torch_geometric.datasets",
                          f"load_dataset({spec.name!r}) without {root / (spec.name + '.npz')}")
    try:
        dataset = getattr(datasets, cls_name)(str(root), arg)
    except ImportError as exc:  # AttributedGraphDataset.process needs pandas
        dep = exc.name or "a missing module"
        raise ImportError(f"PyG's {cls_name} needs {dep} to read the raw files of "
                          f"{spec.name!r}: pip install {dep}") from exc
    except OSError as exc:  # the download failed (no network, moved URL)
        raise FileNotFoundError(_missing_message(spec, root, missing) + f" ({exc})") from exc
    except (ValueError, KeyError, IndexError, TypeError, EOFError, RuntimeError,
            zipfile.BadZipFile) as exc:  # raw files there but not in the expected format
        files = ", ".join(str(root / f) for f in spec.raw_files)
        raise ValueError(f"load_dataset({spec.name!r}): PyG's {cls_name}(root, {arg!r}) could "
                         f"not read the raw files {files} ({type(exc).__name__}: {exc}); they "
                         f"must be the original files from {spec.get_raw} (delete "
                         f"{root / arg / 'processed'} if it was written from other files)"
                         ) from exc
    return from_pyg_data(dataset[0], name=spec.name)


def dataset_input_paths(name: str, root: Any = None) -> list[Path]:
    """The paths :func:`load_dataset` reads for ``name`` under ``root``: ``ROOT/NAME.npz`` and,
    for the PyG datasets, the dataset's folder (raw files and PyG's processed cache). For the
    command lines' check that an output is not an input."""
    spec = DATASETS[canonical_name(name)]
    root = resolve_root(root)
    paths = [root / f"{spec.name}.npz"]
    if spec.pyg is not None:
        paths.append(root / spec.pyg[1])
    return paths


def load_dataset(name: str, root: Any = None, *, source: str = "auto",
                 download: bool = False, preprocess: bool = True,
                 feature_norm: str = "none") -> GraphData:
    """Load a paper dataset by name with the official preprocessing (module docstring).

    Args:
        name: ``cora_full``, ``wiki``, ``email``, ``blogcatalog``, ``amazon_clothing``,
            ``amazon_electronics`` (also the official harness's ``blog``, ``amz_cloth``, ...).
        root: the data directory; None reads ``$HIERTAIL_DATA``.
        source: ``"auto"`` (the .npz if present, else PyG), ``"npz"`` or ``"pyg"`` only.
        download: let PyG download missing raw files (needs a network).
        preprocess: apply :func:`official_preprocess` (False: the graph as stored/read).
        feature_norm: ``"none"`` (default, the official harness) or ``"row"``, applied last
            (:func:`normalize_features`).
    Raises:
        TypeError / ValueError for a bad name, root or source; FileNotFoundError naming the
        files to place and where; ImportError naming the package to install.
    """
    spec = DATASETS[canonical_name(name)]
    check_feature_norm(feature_norm)
    download, preprocess = check_flag(download, "download"), check_flag(preprocess, "preprocess")
    if source not in _SOURCES:
        raise ValueError(f"source={source!r} is not one of {_SOURCES}")
    root = resolve_root(root)
    npz = root / f"{spec.name}.npz"
    if source in ("auto", "npz") and npz.is_dir():     # was reported as "not found"
        raise IsADirectoryError(f"load_dataset({spec.name!r}): {npz} is a directory, not the "
                                "dataset's .npz file")
    if source in ("auto", "npz") and npz.is_file():
        graph = load_npz(npz, name=spec.name)
    elif source == "pyg" and spec.pyg is None:  # was "<npz> not found" even when it was there
        raise ValueError(f"load_dataset({spec.name!r}, source='pyg'): {spec.name!r} has no "
                         f"PyTorch Geometric dataset class; it is read only from the uniform "
                         f"{npz} (source='auto' or 'npz')")
    elif source == "npz" or spec.pyg is None:
        raise FileNotFoundError(_missing_message(spec, root, [npz]) if spec.pyg is None
                                else f"load_dataset({spec.name!r}, source='npz'): {npz} not "
                                "found")
    else:
        graph = _load_pyg(spec, root, download)
    graph = official_preprocess(graph, spec.name) if preprocess else graph
    return normalize_features(graph, feature_norm)
