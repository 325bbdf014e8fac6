"""Sparse CSR operators and their products with dense matrices, for the GCN propagation's
``torch`` and ``torch_sparse`` backends (and the baselines' sparse layers).

Three things a plain ``torch.sparse.mm`` does not do:
* the product goes into an uninitialised output (`csr_matmul`: no zero fill, no copy);
* on CPU, rows longer than ``_csr.HUB_ROW_ENTRIES`` entries are summed in pieces
  (`CSROperator`: a second operator holds the long rows' later pieces, whose sums are added
  in float64; a running float32 sum over a hub row of 1M equal terms was 3.1e-3 off);
* on CPU, a product with 2^31 - 1 or more entries runs in blocks of rows, each within the
  int32 indices of MKL's LP64 CSR routines.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from hiertail_fast._csr import add_row_pieces, row_pieces_plan, sparse_notices_seen, split_long_rows
from hiertail_fast._validation import check_openmp_team

MKL_MAX_ENTRIES = 2**31 - 1     # entries a CPU CSR product takes at once (`csr_matmul`)


def fits_int32(num_nodes: int, nnz: int) -> bool:
    """Whether a CSR operator's arrays may be int32: its column ids (< num_nodes) and its
    offsets (<= nnz) below 2^31 - 1. (Casting on nnz alone wrapped the column ids of a graph
    of 2^31 or more nodes to negative numbers.)"""
    return num_nodes < 2**31 - 1 and nnz < 2**31 - 1


def sparse_csr(indptr, indices, values, n, rows: int | None = None) -> torch.Tensor:
    """[rows (default n), n] sparse CSR tensor of the arrays."""
    if values.device.type == "cpu":
        check_openmp_team()         # torch's CSR products skip rows otherwise (_validation)
    sparse_notices_seen()           # ("sparse CSR support is in beta", once: see there)
    return torch.sparse_csr_tensor(indptr, indices, values, (n if rows is None else rows, n))


def csr_matmul(op: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """op @ x for a sparse CSR ``op`` into a fresh, uninitialised output.

    ``torch.sparse.mm`` (and ``torch.mm``/``@``) on CSR first allocate a ZERO-FILLED result and
    then ``addmm`` copies it into the output before the MKL product: two extra passes over the
    n×d output (at 100k×64 on the 2-core CPU: ~21 of ~70 ms, measured with torch.profiler).
    ``addmm(out, op, x, beta=0, out=out)`` never reads ``out`` (BLAS beta = 0 semantics: NaN/inf
    in the uninitialised memory are not propagated; tested), so neither pass is needed."""
    out = torch.empty(op.shape[0], x.shape[1], dtype=x.dtype, device=x.device)
    if x.device.type != "cpu":
        return torch.addmm(out, op, x, beta=0, out=out)
    check_openmp_team()             # (a cached operator: the thread count may have changed)
    if op.col_indices().numel() < MKL_MAX_ENTRIES:
        return torch.addmm(out, op, x, beta=0, out=out)
    # More entries than MKL's LP64 CSR routines can index (int32; torch hands them its
    # indices converted to int32): the product in blocks of rows, each block's offsets
    # rebased to 0 and fewer than MKL_MAX_ENTRIES.
    crow, col, values = op.crow_indices().long(), op.col_indices(), op.values()
    start, rows = 0, op.shape[0]
    while start < rows:
        base = int(crow[start])
        stop = int(torch.searchsorted(crow, base + MKL_MAX_ENTRIES - 1, right=True)) - 1
        if stop <= start:        # (rows are cut to HUB_ROW_PIECE entries before this)
            raise ValueError(f"row {start} of the operator has {int(crow[start + 1]) - base} "
                             f"entries: more than MKL's CSR product indexes ({MKL_MAX_ENTRIES})")
        end = int(crow[stop])
        block = torch.sparse_csr_tensor(crow[start:stop + 1] - base, col[base:end],
                                        values[base:end], (stop - start, op.shape[1]))
        torch.addmm(out[start:stop], block, x, beta=0, out=out[start:stop])
        start = stop
    return out


class CSROperator(NamedTuple):
    """An [n, n] CSR matrix ready for products: ``head`` [n, n] (a sparse CSR tensor or a
    ``torch_sparse.SparseTensor``) and, where rows were cut (`split_long_rows`), ``pieces``
    [k, n] holding the long rows' later pieces and ``plan`` (`row_pieces_plan`); None, None
    otherwise."""

    head: object
    pieces: object | None
    plan: tuple | None

    @staticmethod
    def build(indptr, indices, values, n: int, backend: str = "torch") -> CSROperator:
        """The operator of the CSR arrays (rows sorted; int64 indices), for ``backend`` torch
        (int32 arrays where they fit: MKL's LP64 CSR routines take int32, and torch would
        otherwise convert int64 ones on every call) or torch_sparse. Rows are cut on CPU only
        (cuSPARSE schedules its own rows; the pieces' index_add_ there would use atomics)."""
        split = split_long_rows(indptr, indices, values) if values.device.type == "cpu" else None
        if split is None:
            return CSROperator(_operator(indptr, indices, values, n, n, backend), None, None)
        indptr, indices, values, owner = split
        first = int(indptr[n])                   # rows 0..n-1 end there; the pieces follow
        head = _operator(indptr[:n + 1], indices[:first], values[:first], n, n, backend)
        pieces = _operator(indptr[n:] - first, indices[first:], values[first:], owner.numel(),
                           n, backend)
        return CSROperator(head, pieces, row_pieces_plan(owner))

    def nnz(self) -> int:
        return _nnz(self.head) + (0 if self.pieces is None else _nnz(self.pieces))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """operator @ x into a fresh [n, d] tensor (never a view of a larger buffer: callers
        may modify it in place)."""
        if x.shape[1] == 0:      # (torch_sparse's product of zero columns dies of SIGFPE)
            return x.new_empty(x.shape[0], 0)
        out = _product(self.head, x)
        if self.pieces is None:
            return out
        return add_row_pieces(out, _product(self.pieces, x), self.plan)


def _operator(indptr, indices, values, rows: int, n: int, backend: str):
    if backend == "torch_sparse":
        import torch_sparse

        return torch_sparse.SparseTensor(rowptr=indptr, col=indices, value=values,
                                         sparse_sizes=(rows, n), is_sorted=True,
                                         trust_data=True)
    if fits_int32(n, indices.numel()):
        indptr, indices = indptr.int(), indices.int()
    return sparse_csr(indptr, indices, values, n, rows)


def _product(op, x: torch.Tensor) -> torch.Tensor:
    return csr_matmul(op, x) if isinstance(op, torch.Tensor) else op.matmul(x)


def _nnz(op) -> int:
    return op._nnz() if isinstance(op, torch.Tensor) else op.nnz()
