"""The uniform ``.npz`` graph format (shared/data/README.md): load with validation, save.

Arrays of a file:

=========================================  ====================  ==================================
``edge_index``                             int [2, E]            edges, both directions stored for
                                                                 an undirected graph (not enforced:
                                                                 the graph container symmetrises)
``x``                                      float [n, F]          dense node attributes, or instead
``x_data, x_indices, x_indptr, x_shape``   CSR parts             of a sparse attribute matrix
``y``                                      int [n]               labels 0..C-1
=========================================  ====================  ==================================

CSR attributes are densified on load (``n·F·4`` bytes of float32): the format stores CSR only
when the dense matrix would exceed 200 MB, so plan memory for it; every file in shared/data is
dense. Loading returns CPU torch tensors sharing memory with the decoded numpy arrays.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hiertail_fast._files import write_atomic
from hiertail_fast._validation import (
    INT64_MAX,
    check_flag,
    check_has_values,
    check_label_array,
    check_num_classes,
    check_path,
    is_integer_array,
)

__all__ = ["GraphData", "load_npz", "save_npz", "relabel_by_size", "size_order",
           "open_npz"]

PathLike = str | os.PathLike
# `load_npz` keeps a dense old -> new `label_map` only up to max(this, 4 n) label values: one
# label of 10^9 made the dense table (and the class count behind it) 7.45 GiB.
DENSE_LABEL_MAP_MIN = 1 << 16
_FP32_MAX = float(np.finfo(np.float32).max)


@dataclass
class GraphData:
    """A node-classification graph on the CPU.

    Attributes:
        edge_index: int64 [2, E] (directed entries; E counts an undirected edge twice).
        x: float32 [n, F] node attributes.
        y: int64 [n] labels in 0..num_classes-1.
        num_classes: C = max label + 1 (classes may be empty in user files).
        name: a short name (file stem for loaded files).
        label_map: int64 [C_old] with new = label_map[old] when labels were relabelled by size,
            else None; also None when the labels are too sparse for a dense table (a label far
            above the node count, see `DENSE_LABEL_MAP_MIN`): ``original_labels`` has the map.
        edge_weight: float [E] or None (unit weights); never stored in the .npz format.
        original_labels: int64 [C] with original_labels[new] = the label class ``new`` had
            before relabelling by size (the inverse of ``label_map``), else None.
    """

    edge_index: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    name: str = "graph"
    label_map: np.ndarray | None = None
    edge_weight: torch.Tensor | None = None
    original_labels: np.ndarray | None = None

    @property
    def num_nodes(self) -> int:
        return int(self.y.shape[0])

    @property
    def num_edges(self) -> int:
        """Number of stored (directed) edges E."""
        return int(self.edge_index.shape[1])

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    def class_sizes(self) -> torch.Tensor:
        """int64 [C] number of nodes per class."""
        return torch.bincount(self.y, minlength=self.num_classes)

    def to_npz(self, path: PathLike, *, sparse_x: bool = False, force: bool = False) -> Path:
        """Write the graph to ``path`` in the uniform format (see :func:`save_npz`). The format
        has no edge weights: a weighted graph is refused unless every weight is 1 (they were
        dropped without a word, where ``save_graph`` / convert refused; a data audit)."""
        check_unit_weights(self.edge_weight, path)
        return save_npz(path, self.edge_index, self.x, self.y, sparse_x=sparse_x, force=force)


def check_unit_weights(edge_weight: torch.Tensor | None, path: PathLike) -> None:
    """ValueError for edge weights other than 1, which the .npz format cannot store."""
    if edge_weight is not None and not bool((edge_weight == 1).all()):
        raise ValueError(f"output {path}: the graph has edge weights, which the .npz format "
                         "cannot store; drop them (edge_weight=None) or write a .pt file "
                         "(hiertail_fast.data.conversion.save_graph)")


def _np(a: Any, name: str) -> np.ndarray:
    """``a`` (named ``name`` in errors) as a numpy array; a tensor densified, bf16 widened."""
    if isinstance(a, torch.Tensor):
        a = check_has_values(a, name).detach()
        if a.layout != torch.strided:       # a sparse x (torch's own TypeError before)
            a = a.to_dense()
        if a.dtype == torch.bfloat16:       # numpy has none ("unsupported ScalarType")
            a = a.float()
        return a.cpu().numpy()
    return np.asarray(a)


def _graph_arrays(edge_index: Any, x: Any, y: Any, where: str) -> tuple:
    """The three as numpy arrays; a meta tensor (no values) is a ValueError naming it."""
    return (_np(edge_index, f"{where}: 'edge_index'"), _np(x, f"{where}: 'x'"),
            _np(y, f"{where}: 'y'"))


def _check_arrays(edge_index: np.ndarray, x: np.ndarray, y: np.ndarray, where: str) -> None:
    """Raise ValueError naming ``where`` (a file name) and the problem."""
    check_label_array(y, f"{where}: 'y'", not_integer=ValueError)
    n = y.shape[0]
    if n == 0:
        raise ValueError(f"{where}: the graph has no nodes ('y' is empty)")
    if edge_index.ndim != 2 or edge_index.shape[0] != 2 or not is_integer_array(edge_index):
        raise ValueError(
            f"{where}: 'edge_index' must be an integer array of shape [2, E], "
            f"got {edge_index.dtype} {edge_index.shape}"
        )
    if edge_index.size:
        lo, hi = int(edge_index.min()), int(edge_index.max())
        if lo < 0:
            raise ValueError(f"{where}: 'edge_index' has negative node indices")
        if hi >= n:
            raise ValueError(f"{where}: 'edge_index' refers to node {hi} but there are {n} nodes")
    if x.ndim != 2:
        raise ValueError(f"{where}: 'x' must be 2-D [n, F], got shape {x.shape}")
    if x.shape[0] != n:
        raise ValueError(f"{where}: 'x' has {x.shape[0]} rows but 'y' has {n} labels")
    if x.shape[1] == 0:
        raise ValueError(f"{where}: 'x' has no feature columns (shape {x.shape}): the model "
                         "needs at least one node attribute")
    if not (np.issubdtype(x.dtype, np.floating) or is_integer_array(x)):
        raise ValueError(f"{where}: 'x' must be numeric, got {x.dtype}")
    if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
        raise ValueError(f"{where}: 'x' contains NaN or Inf")


def _float32_features(x: np.ndarray, where: str) -> np.ndarray:
    """``x`` as contiguous float32, checked AFTER the cast: finite float64 values beyond
    float32's range (e.g. 1e300) would otherwise become inf."""
    with np.errstate(over="ignore"):            # reported below, naming the file
        x32 = np.ascontiguousarray(x, dtype=np.float32)
    over = (np.isfinite(x) & ~np.isfinite(x32)) if x.dtype != np.float32 and x32.size else None
    if over is not None and over.any():     # (NaN / Inf inputs: the finiteness check's error)
        big = float(np.abs(x[over]).max())
        raise ValueError(f"{where}: 'x' has values beyond float32's range (|x| up to {big:.3g} "
                         f"> {_FP32_MAX:.4g}), which would become inf: rescale the features")
    return x32


def check_graph_arrays(edge_index: Any, x: Any, y: Any, where: str) -> None:
    """The checks of :func:`load_npz` / :func:`save_npz` on arrays or tensors (ValueError
    naming ``where`` and the problem), float32's range of ``x`` included."""
    ei, xx, yy = _graph_arrays(edge_index, x, y, where)
    _check_arrays(ei, xx, yy, where)
    _float32_features(xx, where)


def open_npz(path: PathLike, what: str = "an .npz graph file") -> Any:
    """``np.load(path)`` of an ``.npz`` archive, never unpickling: ValueError naming the file
    for anything else (corrupt, not a zip archive, pickled data, a bare ``.npy`` array)."""
    where = str(path)
    try:
        z = np.load(path, allow_pickle=False)  # never unpickle: a data file must not run code
    except Exception as exc:
        # numpy's own message may suggest allow_pickle=True: neither repeated nor chained
        # (loading pickles from an untrusted file runs arbitrary code)
        raise ValueError(f"{where}: not a readable .npz file (corrupt, not a zip archive of "
                         f".npy arrays, or pickled data, which is never loaded; "
                         f"{type(exc).__name__})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ValueError(f"{where}: holds a single .npy array, not {what} (an .npz archive of "
                         "named arrays, as np.savez writes)")
    return z


def _csr_to_dense(z: Any, where: str) -> np.ndarray:
    """Densify the CSR parts x_data/x_indices/x_indptr/x_shape (duplicates are summed)."""
    data, indices = np.asarray(z["x_data"]), np.asarray(z["x_indices"])
    indptr, shape = np.asarray(z["x_indptr"]), np.asarray(z["x_shape"])
    if shape.shape != (2,) or not is_integer_array(shape) or shape.min() < 0:
        raise ValueError(f"{where}: 'x_shape' must be two non-negative integers, got {shape}")
    rows, cols = int(shape[0]), int(shape[1])
    if indptr.ndim != 1 or indptr.shape[0] != rows + 1 or not is_integer_array(indptr):
        raise ValueError(f"{where}: 'x_indptr' must be an integer array of length {rows + 1}")
    if indptr.size and int(indptr.max()) > INT64_MAX:
        raise ValueError(f"{where}: 'x_indptr' has entries above int64's range")
    # (uint64 parts are valid: their differences wrapped in unsigned arithmetic and np.repeat
    # failed, reported as "a corrupt member"; a data audit)
    indptr = indptr.astype(np.int64, copy=False)
    if indptr[0] != 0 or np.any(np.diff(indptr) < 0):
        raise ValueError(f"{where}: 'x_indptr' must start at 0 and be non-decreasing")
    nnz = int(indptr[-1])
    if data.shape != (nnz,) or indices.shape != (nnz,) or not is_integer_array(indices):
        raise ValueError(
            f"{where}: 'x_data' and 'x_indices' must be 1-D of length x_indptr[-1] = {nnz}"
        )
    if nnz and (indices.min() < 0 or indices.max() >= cols):
        raise ValueError(f"{where}: 'x_indices' out of range [0, {cols})")
    if not (np.issubdtype(data.dtype, np.floating) or is_integer_array(data)):   # as a dense 'x'
        raise ValueError(f"{where}: 'x_data' must be numeric (integer or float), got "
                         f"{data.dtype}")
    # the range check before densifying (1e300 became inf there and was reported as "NaN or
    # Inf"; an extremes audit)
    data = _float32_features(data, where)
    row = np.repeat(np.arange(rows, dtype=np.int64), np.diff(indptr))
    try:
        dense = np.zeros((rows, cols), dtype=np.float32)
    except (MemoryError, ValueError):   # was "cannot decode arrays (a corrupt member ...)";
        # (numpy raises ValueError "array is too big" past the address space: 3 x 2**62)
        raise ValueError(f"{where}: the sparse features 'x_shape' {rows} x {cols} densify to "
                         f"{rows * cols * 4 / 1e9:.3g} GB of float32, more than this machine "
                         f"can allocate") from None
    col = indices.astype(np.int64)
    flat = row * cols + col
    if np.unique(flat).shape[0] == nnz:
        dense[row, col] = data
    else:  # duplicate entries: CSR semantics sum them
        np.add.at(dense, (row, col), data.astype(np.float32))
    return dense


def _label_array(y: Any) -> np.ndarray:
    """``y`` as a numpy array of labels (``check_label_array``: float labels were truncated,
    a 2-D y flattened, a -1 or a uint64 label >= 2**63 failed inside numpy; relabel_by_size
    is public: a data audit; a meta y failed inside torch: an API audit)."""
    return check_label_array(_np(y, "y"))


def size_order(y: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(new_y, original_labels)``: the labels relabelled by descending class size (class 0
    largest, ties in ascending original label) and ``original_labels[new]`` = the original
    label of class ``new``. Only the labels present count; memory O(n) whatever the largest
    label (np.unique, no table indexed by label)."""
    y = _label_array(y).astype(np.int64, copy=False)
    present, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    order = np.argsort(-counts, kind="stable")   # order[new] = index into present (ascending)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    return rank[inverse.reshape(-1)], present[order]


def _dense_label_map(original_labels: np.ndarray, num_labels: int) -> np.ndarray:
    """The dense old -> new table over labels 0..num_labels-1: a present label gets its new
    index, an absent one the indices after them, in ascending label order (stable bincount
    order: empty classes are the smallest)."""
    label_map = np.empty(num_labels, dtype=np.int64)
    c = original_labels.shape[0]
    label_map[original_labels] = np.arange(c)
    absent = np.ones(num_labels, dtype=bool)
    absent[original_labels] = False
    label_map[absent] = np.arange(c, num_labels)
    return label_map


def relabel_classes(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(new_y, original_labels, label_map)``: classes relabelled by descending size
    (`size_order`, O(n) memory whatever the largest label), the original label of each new
    class, and the dense old -> new table only where the largest label is small enough for
    one (else None: one label of 10^9 made it 7.45 GiB; ``original_labels`` has the map)."""
    new_y, original_labels = size_order(y)
    top = int(original_labels.max()) + 1 if original_labels.size else 0
    dense = top <= max(DENSE_LABEL_MAP_MIN, 4 * y.shape[0])
    return new_y, original_labels, _dense_label_map(original_labels, top) if dense else None


def relabel_by_size(y: np.ndarray, num_classes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Relabel classes by descending size: class 0 largest, class C-1 smallest.

    Returns ``(new_y, label_map)`` with ``new_y = label_map[y]``: a dense int64 table over the
    labels 0..num_classes-1 (default: max label + 1; absent labels after the present ones).
    TypeError for a ``num_classes`` that is no int, ValueError for one at or below a label. Ties
    keep the original label order (stable sort). The official HierTail harness uses a
    non-stable ``argsort`` reversed, so its tie-break is arbitrary (in practice the larger
    original label first); results that depend on which of two equal-size classes is "last"
    can differ from it. The relabelling itself takes O(n) memory (`size_order`); only the
    returned table grows with the largest label (8 bytes per label value): `size_order` gives
    the inverse map without it.
    """
    new_y, original_labels = size_order(y)
    top = int(original_labels.max()) + 1 if original_labels.size else 0
    if num_classes is not None:     # (any int was taken: 2.5, -1, True, a count below the labels)
        num_classes = check_num_classes(num_classes, top - 1)
    return new_y, _dense_label_map(original_labels, max(num_classes or 0, top))


def load_npz(
    path: PathLike, *, relabel_by_size: bool = False, name: str | None = None
) -> GraphData:
    """Load and validate a graph in the uniform ``.npz`` format from any path.

    Args:
        path: file path (str or Path).
        relabel_by_size: relabel classes by descending size as the official harness does
            (stable tie-break, see :func:`relabel_by_size`); ``original_labels`` (new -> old)
            and ``label_map`` (old -> new, None for labels too sparse for a dense table) record
            the mapping. O(n) memory whatever the largest label.
        name: dataset name (default: the file stem).
    Raises:
        FileNotFoundError if the file does not exist; ValueError naming the file and the problem
        for unreadable files, missing arrays, shape/dtype mismatches, negative labels, edge
        indices out of range, NaN/Inf attributes (or float64 ones beyond float32's range), no
        feature columns or malformed CSR parts.
    """
    relabel_by_size = check_flag(relabel_by_size, "relabel_by_size")
    p = check_path(path, "path")
    if p.is_dir():              # was "not found"
        raise IsADirectoryError(f"{p} is a directory, not an .npz graph file")
    if not p.is_file():
        raise FileNotFoundError(f"graph file not found: {p}")
    where = str(p)
    z = open_npz(p)
    with z:
        keys = set(z.files)
        missing = [k for k in ("edge_index", "y") if k not in keys]
        csr = ("x_data", "x_indices", "x_indptr", "x_shape")
        if "x" not in keys and not all(k in keys for k in csr):
            missing.append("x (or x_data/x_indices/x_indptr/x_shape)")
        if missing and any(k == "data.pkl" or k.endswith("/data.pkl") for k in keys):
            # torch.save's zip (a .pt file) opens as an npz of its members: the list of those
            # said nothing useful (a fresh-user audit)
            # (convert picks its reader by the suffix: a .pt source is unpickled)
            source = p if p.suffix == ".pt" else p.with_suffix(".pt")
            rename = "" if source == p else f"rename it to {source.name}, then "
            raise ValueError(f"{where} is a torch.save file (a .pt), not the uniform .npz "
                             f"format; {rename}convert a saved PyG Data with `python -m "
                             f"hiertail_fast.data convert {source} OUT.npz` (it unpickles the "
                             f"file: only one you trust)")
        if missing:
            raise ValueError(f"{where}: missing array(s) {', '.join(missing)}; has {sorted(keys)}")
        both = sorted(keys & set(csr)) if "x" in keys else []
        if both:    # which one is meant? x was read and the CSR parts ignored, unsaid
            raise ValueError(f"{where}: holds both 'x' and the CSR attribute part(s) "
                             f"{', '.join(both)}; keep one form of the attributes")
        extra = sorted(keys - {"edge_index", "y", "x", *csr})
        if extra:   # (edge weights there were dropped without a word; an interop audit)
            warnings.warn(f"{where}: array(s) {', '.join(extra)} are not part of the uniform "
                          f"format (edge_index, x or its CSR parts, y) and are ignored: the "
                          f"graph is read unweighted, and a split is given separately "
                          f"(--split, user_split)", stacklevel=2)
        try:
            edge_index, y = z["edge_index"], z["y"]
            x = z["x"] if "x" in keys else _csr_to_dense(z, where)
        except Exception as exc:
            if isinstance(exc, ValueError) and str(exc).startswith(where):
                raise
            raise ValueError(f"{where}: cannot decode arrays (a corrupt member, or an object "
                             f"array, which would need unsafe unpickling and is never loaded; "
                             f"{type(exc).__name__})") from None
    _check_arrays(edge_index, x, y, where)
    x = _float32_features(x, where)
    y = y.astype(np.int64, copy=False)
    label_map = original_labels = None
    if relabel_by_size:
        y, original_labels, label_map = relabel_classes(y)
    return GraphData(
        edge_index=torch.from_numpy(np.ascontiguousarray(edge_index, dtype=np.int64)),
        x=torch.from_numpy(x),
        y=torch.from_numpy(np.ascontiguousarray(y)),
        num_classes=int(y.max()) + 1,
        name=name if name is not None else p.stem,
        label_map=label_map,
        original_labels=original_labels,
    )


def save_npz(
    path: PathLike, edge_index: Any, x: Any, y: Any, *, sparse_x: bool = False,
    force: bool = False,
) -> Path:
    """Write a graph in the uniform ``.npz`` format (compressed) exactly at ``path``, atomically
    (a temporary file beside it, renamed when complete: a failed write leaves no partial file).
    Returns the path.

    Args:
        edge_index: int [2, E]; x: float [n, F]; y: int [n] (numpy arrays or torch tensors).
        sparse_x: store x as CSR parts (x_data float32, x_indices int32, x_indptr int64,
            x_shape int64) instead of a dense ``x``.
        force: replace an existing file (without it, FileExistsError: the writer opened the
            path in place and replaced any file there, a user's text file included, and a
            write that failed midway left the old graph unreadable; a mutation audit).
    Raises:
        ValueError on the same problems :func:`load_npz` rejects; FileExistsError (above);
        FileNotFoundError when the directory does not exist.
    """
    force = check_flag(force, "force")
    path = check_path(path, "path")
    where = f"save_npz({path})"
    ei, xx, yy = _graph_arrays(edge_index, x, y, where)
    _check_arrays(ei, xx, yy, where)
    arrays = {"edge_index": ei.astype(np.int64), "y": yy.astype(np.int64)}
    xx = _float32_features(xx, where)
    if sparse_x:
        nz_row, nz_col = np.nonzero(xx)  # row-major order = CSR order
        arrays["x_data"] = xx[nz_row, nz_col]
        arrays["x_indices"] = nz_col.astype(np.int32)
        arrays["x_indptr"] = np.concatenate(
            [[0], np.cumsum(np.bincount(nz_row, minlength=xx.shape[0]))]
        ).astype(np.int64)
        arrays["x_shape"] = np.array(xx.shape, dtype=np.int64)
    else:
        arrays["x"] = xx

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:  # a file handle: numpy would otherwise append ".npz"
            np.savez_compressed(fh, **arrays)
    return write_atomic(path, write, force=force)
