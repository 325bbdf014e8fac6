"""Module-level helpers of `hiertail_fast.graph.CSRGraph`: input checks, the COO -> CSR build
(sort / dedupe), the GCN degree normalisation and the reading of a sparse adjacency (torch
sparse tensors, ``torch_sparse.SparseTensor``). Same orientation and duplicate rules as the
`hiertail_fast.graph` docstring; nothing here mutates a caller's tensor."""
from __future__ import annotations

import threading
import warnings

import numpy as np
import torch

from hiertail_fast._threads import in_forked_child
from hiertail_fast._validation import (
    all_finite,
    check_dense_tensor,
    check_edge_weight,
    check_gcn_degrees,
    check_index_dtype,
    check_num_nodes,
    check_sparse_parts,
    duplicate_sum_overflow,
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


@in_forked_child
def _fresh_notices_lock_after_fork() -> None:
    """In a forked child: the lock as new (held by a parent thread at the fork, it would stay
    held in the child, where that thread does not exist)."""
    global _NOTICES
    _NOTICES = threading.Lock()



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


def square_values(indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, n: int,
                  row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """(M·M)[row, col] = Σ_k M[row, k] M[k, col] for the CSR matrix M, differentiable in
    ``values`` (``csr_square`` gives the entries, through scipy: no gradient). Every product
    path u -> k -> v is enumerated — one entry (u, k) of M times each entry of row k —, its
    term added to its (u, v) entry: O(Σ_k in-entries_k · entries of row k) time and memory,
    what the product itself costs; paths to an entry not in (row, col) are left out. Sums in
    float32 for 16-bit values, as ``csr_square``."""
    lengths = indptr.diff()
    outer_row = torch.repeat_interleave(torch.arange(n, device=indices.device), lengths)
    per_entry = lengths[indices]                       # entries of row k, for each (u, k)
    total = int(per_entry.sum())
    first = torch.repeat_interleave(torch.arange(indices.numel(), device=indices.device),
                                    per_entry, output_size=total)
    starts = torch.cumsum(per_entry, 0) - per_entry
    second = (indptr[indices][first] + torch.arange(total, device=indices.device)
              - torch.repeat_interleave(starts, per_entry, output_size=total))
    work = values if values.dtype in (torch.float32, torch.float64) else values.float()
    terms = work[first] * work[second]
    wanted = row * n + col
    order = torch.argsort(wanted)
    keys = wanted[order]
    path = outer_row[first] * n + indices[second]
    pos = torch.searchsorted(keys, path).clamp_max(max(keys.numel() - 1, 0))
    hit = keys[pos] == path if keys.numel() else torch.zeros_like(path, dtype=torch.bool)
    out = torch.zeros(row.numel(), dtype=work.dtype, device=values.device)
    return out.index_add(0, order[pos[hit]], terms[hit]).to(values.dtype)


def deg_inv_sqrt(wide: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """deg^-1/2 in `dtype` of a degree `wide` summed in a wider dtype (float64), with 0 where
    deg == 0 (PyG's gcn_norm), written with `where` on safe inputs so the gradient at isolated
    nodes is 0 instead of NaN (0 * inf). Negative, NaN or float64-overflowing degrees raise a
    ValueError naming the node (PyG gives NaN rows; see `check_gcn_degrees`).

    The degree is rounded once to `dtype` and deg^-1/2 taken there (as PyG's gcn_norm, bit for
    bit), except where that rounding overflows: a weighted degree beyond float32's ~3.4e38 has
    deg^-1/2 ~1e-19, well inside float32, but the rounded degree +inf gave dinv = 0 and a zero
    row (an extremes audit); there deg^-1/2 is taken in the wide dtype and rounded. (Learnable
    weights ask for float64 dinv: ``gcn_propagate``.)"""
    check_gcn_degrees(wide)
    deg = wide.to(dtype)
    zero = deg == 0
    dinv = torch.where(zero, torch.zeros_like(deg), torch.where(zero, 1.0, deg).pow(-0.5))
    over = torch.isinf(deg)
    return torch.where(over, torch.where(over, wide, 1.0).pow(-0.5).to(dtype), dinv)


def _is_torch_sparse_tensor(obj: object) -> bool:
    """A ``torch_sparse.SparseTensor`` (told by its class, without importing the package)."""
    cls = type(obj)
    return cls.__name__ == "SparseTensor" and cls.__module__.startswith("torch_sparse")


def is_sparse_adjacency(obj: object) -> bool:
    """Whether ``obj`` is a sparse adjacency that ``CSRGraph.from_sparse`` takes."""
    return _is_torch_sparse_tensor(obj) or (isinstance(obj, torch.Tensor) and not obj.is_nested
                                            and obj.layout != torch.strided)


def sparse_to_coo(adj: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    """(row, col, weights or None, n) of a sparse adjacency in PyG's ``adj_t`` orientation
    (row = target): a torch sparse tensor (COO, CSR, CSC; its values are the weights, read
    differentiably; COO / CSC coalesced, duplicates summed) or a ``torch_sparse.SparseTensor``
    (without values: None). ValueError / TypeError naming the problem."""
    if _is_torch_sparse_tensor(adj):
        n, m = adj.sparse_sizes()
        _check_square(n, m)
        storage = adj.storage
        if storage.has_row():     # coo() returns the stored rows: those are checked (building
            # rowptr from rows outside [0, n) wrote out of bounds in torch_sparse; a review)
            check_sparse_parts(None, torch.stack([storage.row(), storage.col()]), n,
                                "indices")
        else:                     # coo() reads the rows from the pointers
            check_sparse_parts(storage.rowptr(), storage.col(), n, "rowptr")
        row, col, w = adj.coo()
    elif isinstance(adj, torch.Tensor) and adj.layout != torch.strided:
        if adj.dim() != 2:
            raise ValueError(f"a sparse adjacency must be 2-D, got shape {tuple(adj.shape)}")
        if adj.layout in (torch.sparse_bsr, torch.sparse_bsc):
            raise TypeError(f"a sparse adjacency in the {adj.layout} layout is not supported: "
                            f"its blocks store zeros that would count as edges (and as "
                            f"self-loops on the diagonal); pass COO, CSR or CSC")
        if adj.dense_dim() != 0:   # (a hybrid tensor: an unpacking error deep in here)
            raise ValueError(f"a sparse adjacency must have scalar entries, got a hybrid sparse "
                             f"tensor with {adj.dense_dim()} dense dimension(s) (shape "
                             f"{tuple(adj.shape)}, sparse_dim {adj.sparse_dim()})")
        n, m = adj.shape
        _check_square(n, m)
        if adj.layout == torch.sparse_csr:
            check_sparse_parts(adj.crow_indices(), adj.col_indices(), n, "crow_indices")
            row = torch.repeat_interleave(torch.arange(n, device=adj.device),
                                          adj.crow_indices().diff())
            col, w = adj.col_indices(), adj.values()
        else:
            if adj.layout == torch.sparse_csc:   # (malformed pointers: to_sparse_coo crashed)
                check_sparse_parts(adj.ccol_indices(), adj.row_indices(), n, "ccol_indices")
                raw = adj.to_sparse_coo()
            else:
                # the raw entries, before coalesce() keys them by row * n + col: one outside
                # [0, n) merged into a valid entry there ([[1, 0], [0, 3]] of 3 nodes became
                # one edge 0 -> 1 of weight 12; a review)
                raw = adj
                check_sparse_parts(None, raw._indices(), n, "indices")
            # coalesced (duplicates summed) and read with values(): differentiable
            coo = raw.coalesce()
            (row, col), w = coo.indices(), coo.values()
            if (w.is_floating_point() and not raw.is_coalesced() and not all_finite(w.detach())
                    and all_finite(raw._values().detach())):
                raise duplicate_sum_overflow(w.dtype)     # finite entries, overflowing sums
    else:
        raise TypeError(f"adj must be a torch sparse tensor or a torch_sparse.SparseTensor, "
                        f"got {type(adj).__name__}"
                        + ("" if not isinstance(adj, torch.Tensor) else " (dense)"))
    w = check_edge_weight(w, row.numel(), "the sparse adjacency's value tensor (its edge weights)",
                          "; for an unweighted graph pass adj.float() (or its edge_index)")
    return row.long(), col.long(), w, check_num_nodes(n)


def _check_square(n: int, m: int) -> None:
    if n != m:
        raise ValueError(f"a sparse adjacency must be square, got {n} x {m}")


HUB_ROW_ENTRIES = 1 << 12  # rows longer than this are summed in pieces (`split_long_rows`)
HUB_ROW_PIECE = 1 << 8     # entries of one piece


def split_long_rows(indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor,
                    longer_than: int | None = None, piece: int | None = None):
    """The CSR [n, m] with every row longer than ``longer_than`` entries (default
    HUB_ROW_ENTRIES) cut into pieces of at most ``piece`` (default HUB_ROW_PIECE), as
    ``(indptr', indices', values', owner)``: rows 0..n-1 keep their first piece, the other
    pieces follow as rows n, n+1, ... (``owner[k]``: the row piece n+k belongs to,
    non-decreasing); None when no row is that long. Its rows 0..n-1 times x, plus the other
    rows' products added to their owners (``add_row_pieces`` with ``row_pieces_plan(owner)``),
    is the product with the CSR (`ops/_csr_product.CSROperator`).

    Why: a CPU CSR product (MKL's, torch_sparse's; as torch.sparse.mm and PyG) sums a row's
    entries one after the other in float32, so its rounding grows with the row's length: one
    hub row of equal, positive terms came out 8.6e-5 relative off at 65k entries, 3.1e-3 at 1M
    and 6.6e-2 at 16.8M (an overflow audit). Summed in pieces of 256 whose sums are added in
    float64, a star of 2^20 leaves is 1.5e-6 off (pieces of 4096 added in float32: 1.3e-5)."""
    longer_than = HUB_ROW_ENTRIES if longer_than is None else longer_than
    piece = HUB_ROW_PIECE if piece is None else piece
    n = indptr.numel() - 1
    lengths = indptr.diff()
    if n == 0 or int(lengths.max()) <= longer_than:
        return None
    dev = indptr.device
    first_len = torch.where(lengths > longer_than, lengths.clamp(max=piece), lengths)
    extra_len = lengths - first_len
    first_ptr = torch.zeros(n + 1, dtype=torch.long, device=dev)
    torch.cumsum(first_len, 0, out=first_ptr[1:])
    extra_start = first_ptr[-1] + torch.cumsum(extra_len, 0) - extra_len   # [n]
    row = torch.repeat_interleave(torch.arange(n, device=dev), lengths)
    offset = torch.arange(indices.numel(), device=dev) - indptr[:-1].index_select(0, row)
    first = offset < first_len.index_select(0, row)
    pos = torch.where(first, first_ptr[:-1].index_select(0, row) + offset,
                      extra_start.index_select(0, row) + offset - piece)
    new_indices, new_values = torch.empty_like(indices), torch.empty_like(values)
    new_indices[pos], new_values[pos] = indices, values      # pos is a permutation
    pieces = (extra_len + piece - 1) // piece                # extra pieces of each row
    owner = torch.repeat_interleave(torch.arange(n, device=dev), pieces)
    k = torch.arange(owner.numel(), device=dev) - (torch.cumsum(pieces, 0) - pieces)[owner]
    ends = extra_start[owner] + torch.minimum((k + 1) * piece, extra_len[owner])
    return torch.cat([first_ptr, ends]), new_indices, new_values, owner


def row_pieces_plan(owner: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, slot)`` of `split_long_rows`' ``owner``: the long rows, and for each extra
    piece its row's position in ``rows`` (what `add_row_pieces` needs; made once per
    operator)."""
    rows, counts = torch.unique_consecutive(owner, return_counts=True)
    return rows, torch.repeat_interleave(torch.arange(rows.numel(), device=owner.device), counts)


def add_row_pieces(out: torch.Tensor, pieces: torch.Tensor,
                   plan: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``out`` [n, d] (the product's rows 0..n-1, each long row's first piece) with the long
    rows' later pieces ``pieces`` [k, d] added, in float64 and rounded once (`row_pieces_plan`
    says whose they are); in place, returns ``out``."""
    rows, slot = plan
    wide = torch.promote_types(out.dtype, torch.float64)
    acc = out.index_select(0, rows).to(wide).index_add_(0, slot, pieces.to(wide))
    return out.index_copy_(0, rows, acc.to(out.dtype))
