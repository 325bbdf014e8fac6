"""Module-level helpers of `hiertail_fast.graph.CSRGraph`: input checks, the COO -> CSR build
(sort / dedupe), the GCN degree normalisation and the reading of a sparse adjacency (torch
sparse tensors, ``torch_sparse.SparseTensor``). Same orientation and duplicate rules as the
`hiertail_fast.graph` docstring; nothing here mutates a caller's tensor."""
from __future__ import annotations

import threading
import warnings

import numpy as np
import torch

from hiertail_fast._validation import (
    check_dense_tensor,
    check_edge_weight,
    check_gcn_degrees,
    check_index_dtype,
    check_num_nodes,
)


def check_csr(
    indptr: torch.Tensor, indices: torch.Tensor, weight: torch.Tensor | None,
    num_nodes: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    """Checked CSR arrays ``(indptr int64 [n + 1], indices int64 [nnz], weight [nnz] or None,
    n)``: 1-D integer index tensors, indptr from 0 to nnz and non-decreasing, indices in
    [0, n) and sorted inside every row. ValueError/TypeError naming the problem."""
    indptr = check_dense_tensor(indptr, "indptr")
    indices = check_dense_tensor(indices, "indices")
    for t, name in ((indptr, "indptr"), (indices, "indices")):
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
        check_index_dtype(t, name)
    if indptr.numel() < 1:
        raise ValueError("indptr must have num_nodes + 1 >= 1 entries")
    # (the node count told by indptr is held to the same limit as a given one: the sort key
    # rows * n + indices below overflows int64 beyond it)
    n = check_num_nodes(indptr.numel() - 1 if num_nodes is None else num_nodes)
    if indptr.numel() != n + 1:
        raise ValueError(f"indptr has {indptr.numel()} entries, expected {n + 1}")
    indptr, indices = indptr.long(), indices.long()
    if int(indptr[0]) != 0 or int(indptr[-1]) != indices.numel():
        raise ValueError("indptr must start at 0 and end at len(indices)")
    if n and bool((indptr.diff() < 0).any()):
        raise ValueError("indptr must be non-decreasing")
    if indices.numel():
        if int(indices.min()) < 0 or int(indices.max()) >= n:
            raise ValueError(f"indices must lie in [0, {n}) (num_nodes)")
        rows = torch.repeat_interleave(torch.arange(n, device=indptr.device), indptr.diff())
        if bool(((rows * n + indices).diff() < 0).any()):
            raise ValueError("indices must be sorted inside every row")
    weight = check_edge_weight(weight, indices.numel())
    return indptr, indices, weight, n


def coo_to_csr(
    row: torch.Tensor, col: torch.Tensor, w: torch.Tensor | None, n: int, *, dedupe: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(indptr [n + 1], indices [nnz], weight [nnz] or None)`` from unsorted (row = target,
    col = source) entries, sorted by (row, col) through one int64 key ``row * n + col``.
    ``dedupe``: duplicate entries merge (weights summed; unweighted: kept once); otherwise
    they stay, in their input order (stable sort). Inputs are not modified."""
    device = row.device
    if n == 0 or row.numel() == 0:
        indptr = torch.zeros(n + 1, dtype=torch.long, device=device)
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return indptr, empty, None if w is None else w[:0]
    key = row * n + col
    if dedupe:
        if w is None:
            key = torch.unique(key)
        else:
            key, inverse = torch.unique(key, return_inverse=True)
            # out-of-place index_add keeps autograd to the caller's weights
            w = torch.zeros(key.numel(), dtype=w.dtype, device=device).index_add(0, inverse, w)
    else:
        key, perm = torch.sort(key, stable=True)
        w = None if w is None else w[perm]
    row, col = torch.div(key, n, rounding_mode="floor"), key % n
    indptr = torch.zeros(n + 1, dtype=torch.long, device=device)
    torch.cumsum(torch.bincount(row, minlength=n), 0, out=indptr[1:])
    return indptr, col, w


_NOTICES = threading.Lock()
_notices_seen = False


def sparse_notices_seen() -> None:
    """torch warns once per process that its sparse CSR support is beta and that sparse
    invariant checks are off. Both are drawn here, once, under ``catch_warnings`` and a lock,
    so no product needs ``catch_warnings`` around it: that context swaps the process-wide
    filter list and is not thread-safe (around every product, concurrent calls left an
    "ignore" filter behind that silenced every later warning of the process)."""
    global _notices_seen
    if _notices_seen:
        return
    with _NOTICES:
        if not _notices_seen:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m = torch.sparse_csr_tensor(torch.tensor([0, 1]), torch.tensor([0]),
                                            torch.ones(1), (1, 1))
                m @ m
                m @ torch.ones(1, 1)
            _notices_seen = True


def _scipy_sparse():
    """scipy.sparse, or None where it is missing (a dependency, but an image installed with
    --no-deps may lack it): then torch's CSR product serves on CPU too."""
    try:
        import scipy.sparse
    except ImportError:
        return None
    return scipy.sparse


def csr_square(indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, n: int,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """COO ``(row, col, value)`` of M·M for the CSR matrix M (int64 indices; value in
    values' dtype; entries that sum to exactly 0 left out). On CPU through scipy: torch's
    CPU products could not serve, CSR x CSR leaked its result's memory (torch 2.13: +0.75 MB
    a product at 1,500 nodes / 12k entries; the official configuration squares every pooled
    graph each forward) and COO x COO returned an EMPTY product inside a torch.library custom
    op (what compiled code runs). scipy (single-threaded) takes 3.7-5.2x torch's time:
    ``python bench/a2_product.py --sizes 1500 100000 --rounds 5`` in an idle window (2-core
    Xeon VM, torch 2.13, load 0.10 -> 0.61), medians: 6.9 vs 1.9 ms at 1,500 nodes (16k
    entries), 3.1 vs 0.60 s at 100k (1.1M entries), while torch's kept 2.9 GB of RSS over
    its 10 products there (scipy's: 0). Other devices: torch's CSR x CSR (cuSPARSE)."""
    sparse = _scipy_sparse() if indices.device.type == "cpu" else None
    if sparse is not None:
        work = values if values.dtype in (torch.float32, torch.float64) else values.float()
        m = sparse.csr_matrix((work.numpy(), indices.numpy(), indptr.numpy()), shape=(n, n))
        sq = (m @ m).tocoo()
        row, col = torch.from_numpy(sq.row.astype(np.int64)), torch.from_numpy(
            sq.col.astype(np.int64))
        value = torch.from_numpy(sq.data).to(values.dtype)
    else:
        sparse_notices_seen()
        m = torch.sparse_csr_tensor(indptr, indices, values, (n, n))
        sq = m @ m
        crow, col = sq.crow_indices().long(), sq.col_indices().long()
        row = torch.repeat_interleave(torch.arange(n, device=indices.device), crow.diff())
        value = sq.values()
    # entries that sum to exactly 0 are no entries, on every device (scipy drops them,
    # torch's CUDA product kept them: the pooled edge_index depended on the device; the
    # official code's torch_sparse spspmm drops them too)
    nonzero = value != 0
    return row[nonzero], col[nonzero], value[nonzero]


def deg_inv_sqrt(deg: torch.Tensor) -> torch.Tensor:
    """deg^-1/2 with 0 where deg == 0 (PyG's gcn_norm), written with `where` on a safe input so
    the gradient at isolated nodes is 0 instead of NaN (0 * inf). Negative degrees raise a
    ValueError naming the node (PyG gives NaN rows; see `check_gcn_degrees`)."""
    check_gcn_degrees(deg)
    zero = deg == 0
    return torch.where(zero, torch.zeros_like(deg), torch.where(zero, 1.0, deg).pow(-0.5))


def _is_torch_sparse_tensor(obj: object) -> bool:
    """A ``torch_sparse.SparseTensor`` (told by its class, without importing the package)."""
    cls = type(obj)
    return cls.__name__ == "SparseTensor" and cls.__module__.startswith("torch_sparse")


def is_sparse_adjacency(obj: object) -> bool:
    """Whether ``obj`` is a sparse adjacency that ``CSRGraph.from_sparse`` takes."""
    return _is_torch_sparse_tensor(obj) or (isinstance(obj, torch.Tensor)
                                            and obj.layout != torch.strided)


def sparse_to_coo(adj: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    """(row, col, weights or None, n) of a sparse adjacency in PyG's ``adj_t`` orientation
    (row = target): a torch sparse tensor (COO, CSR, CSC; its values are the weights, read
    differentiably; COO / CSC coalesced, duplicates summed) or a ``torch_sparse.SparseTensor``
    (without values: None). ValueError / TypeError naming the problem."""
    if _is_torch_sparse_tensor(adj):
        row, col, w = adj.coo()
        n, m = adj.sparse_sizes()
    elif isinstance(adj, torch.Tensor) and adj.layout != torch.strided:
        if adj.dim() != 2:
            raise ValueError(f"a sparse adjacency must be 2-D, got shape {tuple(adj.shape)}")
        if adj.layout in (torch.sparse_bsr, torch.sparse_bsc):
            raise TypeError(f"a sparse adjacency in the {adj.layout} layout is not supported: "
                            f"its blocks store zeros that would count as edges (and as "
                            f"self-loops on the diagonal); pass COO, CSR or CSC")
        n, m = adj.shape
        if adj.layout == torch.sparse_csr:
            row = torch.repeat_interleave(
                torch.arange(n, device=adj.device), adj.crow_indices().diff())
            col, w = adj.col_indices(), adj.values()
        else:
            # coalesced (duplicates summed) and read with values(): differentiable
            coo = (adj if adj.layout == torch.sparse_coo else adj.to_sparse_coo()).coalesce()
            (row, col), w = coo.indices(), coo.values()
    else:
        raise TypeError(f"adj must be a torch sparse tensor or a torch_sparse.SparseTensor, "
                        f"got {type(adj).__name__}"
                        + ("" if not isinstance(adj, torch.Tensor) else " (dense)"))
    if n != m:
        raise ValueError(f"a sparse adjacency must be square, got {n} x {m}")
    w = check_edge_weight(w, row.numel())
    return row.long(), col.long(), w, check_num_nodes(n)
