"""GCN propagation Â·x with the normalisation fused in: autograd Function, dispatch, public API.

    Â = D^-1/2 (A + L) D^-1/2   (PyG gcn_norm; L = fill·I on nodes without a self-loop, fill = 2
                                 if improved; see `hiertail_fast.reference.gcn_propagate`)

Backends (``backend=`` argument, else `choose_backend`'s measured table: torch on CPU and
CUDA):
* ``torch``: one MKL CSR product (``addmm`` with beta = 0 into an uninitialised output, see
  `_csr_product`) on the normalised operator Â — values ``dinv_i w_e dinv_j`` with the added
  self-loops ``loop_i dinv_i²`` inserted on the diagonal — built ONCE per (graph, options,
  dtype) and cached on the `CSRGraph`. This CPU path does materialise Â, on purpose: it is the
  cheapest correct thing (one sparse product per call over nnz + n entries; the cache costs
  nnz + n values and int32 indices once). When the edge weights require grad the values are
  rebuilt per call instead and the self-loop is a separate diagonal term ``loop_i dinv_i² x_i``.
* ``triton``: `kernels/gcn_propagate.py`, CSR row-split SpMM scaling by ``dinv[row]·dinv[col]`` on
  the fly, no atomics (deterministic). Opt-in (``backend="triton"``): on an H200 at 1M nodes / 10M
  edges it measured 1.9-2.2x slower than the ``torch`` backend's cuSPARSE product (fwd d=64/128
  2.3/4.0 vs 1.2/1.8 ms), so automatic dispatch uses ``torch`` on CUDA (`_dispatch.AUTO_BACKEND`);
  ``python bench/interleaved.py propagation`` reports its achieved bandwidth.
* ``torch_sparse`` (only through this op's ``backend=`` argument, when the optional package
  imports; HIERTAIL_BACKEND does not know it): ``torch_sparse.SparseTensor`` matmul on the same
  cached operator.
* ``reference``: `gcn_propagate_ref` (plain autograd).

Backward (hand-written, no PyTorch sparse backward — it transposes on every call):
* grad_x = Âᵀ·G: the forward CSR itself when the graph is symmetric (checked once, cached), else
  the cached transposed CSR.
* Edge weights (only when ``graph.weight`` requires grad): with ``a_e = <g_i, x_j>`` for entry
  e = (j -> i) — an SDDMM, `kernels/gcn_propagate.gcn_edge_dots` on the triton backend, torch
  gathers in edge chunks otherwise — and row / column sums as segment reductions (deterministic
  on every device),
      dL/dw_e|direct = dinv_i dinv_j a_e
      dL/ddinv_k     = Σ_{e in row k} w_e dinv_j a_e + Σ_{e with col k} w_e dinv_i a_e
                       + 2 loop_k dinv_k <g_k, x_k>
  and the degree path dinv = (Σ w + loop)^-1/2 -> w is plain torch autograd (outside the
  Function), so the total weight gradient includes both terms.
"""
from __future__ import annotations

import torch

from hiertail_fast._validation import (
    check_flag,
    check_float_matrix,
    check_no_edge_weight,
    check_num_nodes,
    check_tensor,
    check_weights_fit,
)
from hiertail_fast.graph import CSRGraph, is_sparse_adjacency
from hiertail_fast.ops import _custom_graph_ops
from hiertail_fast.ops._autograd import eager_twin, first_order_backward, saveable
from hiertail_fast.ops._csr_product import CSROperator
from hiertail_fast.ops._dispatch import BACKENDS, choose_backend, public_op

_SDDMM_CHUNK_ELEMS = 1 << 22  # entries·d per chunk of the edge-gradient dot products (16 MB fp32)


def _torch_sparse_problem() -> str | None:
    """Why the optional torch_sparse package cannot be used here, or None when it can. A
    torch_sparse built against another torch release is installed but fails to load its
    compiled ops with an OSError (an undefined C++ symbol): that is "not usable", never an
    error raised from a mere availability check."""
    try:
        import torch_sparse  # noqa: F401
    except ImportError:
        return "needs the optional torch_sparse package"
    except OSError as exc:
        return (f"found torch_sparse but it cannot be loaded with torch {torch.__version__} "
                f"(built against another torch release? rebuild it: pip install "
                f"--no-build-isolation --force-reinstall torch-sparse): {exc}")
    return None


def torch_sparse_available() -> bool:
    """Whether ``backend="torch_sparse"`` can run: the package imports and loads its ops."""
    return _torch_sparse_problem() is None


def _normalised(graph: CSRGraph, weight, dinv, transposed: bool):
    """(indptr, indices, normalised values dinv_i w_e dinv_j) of Â without the added
    self-loops, or of Âᵀ (the transposed CSR is cached on the graph)."""
    w = weight if weight is not None else 1.0
    values = dinv[graph.row_index()] * w * dinv[graph.indices]
    if not transposed:
        return graph.indptr, graph.indices, values
    t = graph.transpose()
    return t.indptr, t.indices, values[graph.transpose_perm()]


def _merge_diagonal(indptr, indices, values, diag, insert=None):
    """Insert the entries (i, i, diag_i) for every i with ``insert_i`` (nodes that get an added
    self-loop; default ``diag != 0``) into a row-sorted CSR, keeping columns sorted: O(nnz + n),
    no sort. Used once per graph for the cached operator (torch / torch_sparse backends, any
    device), so a call is ONE sparse product
    (no extra pass of x·diag over the features).

    Which rows get an entry is decided from the STRUCTURE (``insert`` and the stored diagonal),
    never from the values: a row that already stores (i, i) never gets a second one, so the
    target slots are a bijection onto the output and every slot of the (uninitialised) output
    arrays is written exactly once. (Deciding by ``diag != 0`` once let a NaN diagonal insert
    a colliding entry and leave a slot of garbage for MKL to read.)"""
    n = indptr.numel() - 1
    row = torch.repeat_interleave(torch.arange(n, device=indptr.device), indptr.diff())
    stored = torch.zeros(n, dtype=torch.bool, device=indptr.device)
    stored.index_fill_(0, row[indices == row], True)   # (no Python value lifted to a tensor)
    ins = (diag != 0 if insert is None else insert) & ~stored
    before = torch.cumsum(ins, 0) - ins.long()  # inserted entries in earlier rows
    new_indptr = indptr.clone()
    new_indptr[:-1] += before
    new_indptr[-1] += int(ins.sum())
    pos = torch.arange(indices.numel(), device=indptr.device) + before[row]
    pos += (ins[row] & (indices > row)).long()  # after the new diagonal entry of its row
    nodes = torch.nonzero(ins).squeeze(1)
    n_left = torch.bincount(row[indices < row], minlength=n)  # entries left of the diagonal
    pos_diag = indptr[nodes] + before[nodes] + n_left[nodes]
    total = int(new_indptr[-1])
    new_indices = torch.empty(total, dtype=indices.dtype, device=indices.device)
    new_values = torch.empty(total, dtype=values.dtype, device=values.device)
    new_indices[pos], new_values[pos] = indices, values
    new_indices[pos_diag], new_values[pos_diag] = nodes, diag[nodes]
    return new_indptr, new_indices, new_values


def _cached_operator(backend, graph, key, transposed) -> CSROperator:
    """The normalised operator with the self-loop diagonal merged in, built once per (graph,
    options, dtype, orientation) and cached on the graph (`_csr_product.CSROperator`)."""
    def build():
        # dinv, loop and the weights read again from the graph, inside its lock (`_cached_w`
        # holds it): the caller's could be one fused optimizer step older when another thread
        # stepped the weights in between, and that operator was cached for the new weights
        # (a thread audit). The same values in one thread: dinv is the graph's cache entry.
        improved, add_self_loops, cdtype = key
        dinv, loop = graph.gcn_deg_inv_sqrt(improved, add_self_loops, cdtype)
        loop = loop if add_self_loops else None
        weight = None if graph.weight is None else graph.weight.detach().to(cdtype)
        indptr, indices, values = _normalised(graph, weight, dinv, transposed)
        if loop is not None:
            indptr, indices, values = _merge_diagonal(indptr, indices, values,
                                                      loop * dinv * dinv, loop != 0)
        # cached as a plain tuple: a graph's caches travel with it (pickle, torch.save) and
        # torch.load(weights_only=True) takes no class of ours
        return tuple(CSROperator.build(indptr, indices, values, graph.num_nodes, backend))
    # keyed by the weights' version too: an in-place update of learnable weights rebuilds it
    return CSROperator(*graph._cached_w(
        ("gcn_operator", backend, transposed) + key, build))


def _spmm(backend, graph, weight, dinv, loop, x, key, transposed):
    """(Â or Âᵀ)·x (no autograd), for the torch / torch_sparse / triton backends; dinv and
    loop (float64 for learnable weights: `gcn_propagate`) in the compute dtype."""
    n = graph.num_nodes
    cdtype = _cdtype(x.dtype)
    dinv = dinv.to(cdtype)
    loop = None if loop is None else loop.to(cdtype)
    if backend == "triton":
        from hiertail_fast.kernels.gcn_propagate import gcn_spmm  # lazy: never at import time

        g = graph.transpose() if transposed else graph
        w = weight
        if transposed and w is not None:
            w = graph.transpose().weight if key is not None else w[graph.transpose_perm()]
        return gcn_spmm(g.indptr, g.indices, w, dinv, loop, x)
    x_in, x = x, x.to(dinv.dtype)  # fp16/bf16 run in fp32 (CPU sparse kernels lack them)
    if key is not None:  # cached operator, self-loops merged in: one sparse product
        op = _cached_operator(backend, graph, key, transposed)
        if op.nnz() == 0:
            return torch.zeros_like(x_in)
        return op.matmul(x).to(x_in.dtype)
    # weights require grad: values built per call, the self-loop as a separate diagonal term
    indptr, indices, values = _normalised(graph, weight, dinv, transposed)
    if not indices.numel():
        out = torch.zeros_like(x)
    else:
        out = CSROperator.build(indptr, indices, values, n, backend).matmul(x)
    if loop is not None:
        out.addcmul_((loop * dinv * dinv).unsqueeze(1), x)  # added self-loop: loop_i dinv_i² x_i
    return out.to(x_in.dtype)


def _edge_dots(g: torch.Tensor, x: torch.Tensor, row: torch.Tensor | None,
               col: torch.Tensor | None) -> torch.Tensor:
    """a_e = <g[row_e], x[col_e]> for every entry (row = col = None: the diagonal, <g_i, x_i>
    for every node, by slices), in chunks so memory stays O(chunk·d), in the compute dtype
    (float32 for 16-bit rows, each chunk widened as it is read: products and sums in bf16 put
    the weights' gradient ~1e-3 relative off, 3.5 % on a 2-node graph; a fuzzing find,
    2026-12-05), as the Triton launcher returns them."""
    cdtype = _cdtype(g.dtype)
    count = g.shape[0] if row is None else row.numel()
    out = torch.empty(count, dtype=cdtype, device=g.device)
    step = max(1, _SDDMM_CHUNK_ELEMS // max(1, g.shape[1]))
    for s in range(0, count, step):
        rows = slice(s, s + step) if row is None else row[s:s + step]
        cols = slice(s, s + step) if col is None else col[s:s + step]
        out[s:s + step] = (g[rows].to(cdtype) * x[cols].to(cdtype)).sum(1)
    return out


def _segment_sums(v: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Sums of consecutive segments of v: a segment reduction, deterministic on every device
    (index_add_ uses atomics on CUDA), in float64 and rounded once (a running float32 sum over
    a hub's 1M entries was 3.1e-3 off)."""
    if lengths.numel() == 0:
        return v.new_zeros(0)
    wide = torch.promote_types(v.dtype, torch.float64)
    return torch.segment_reduce(v.to(wide), "sum", lengths=lengths).to(v.dtype)


def _row_sums(graph: CSRGraph, v: torch.Tensor) -> torch.Tensor:
    """[n] sums of the per-entry values v over each CSR row (entries are stored row by row)."""
    return _segment_sums(v, graph.indptr.diff())


def _col_sums(graph: CSRGraph, v: torch.Tensor) -> torch.Tensor:
    """[n] sums of v over the entries of each column: the entries in transposed order (the
    graph's cached stable column sort) reduced in segments of the column counts."""
    if graph.num_nodes == 0:
        return v.new_zeros(0)
    return _segment_sums(v[graph.transpose_perm()], graph.column_counts())


@eager_twin
class GCNPropagateFunction(torch.autograd.Function):
    """out = Â·x with Â given by (graph, weight, dinv, loop). Differentiable w.r.t. x, weight and
    dinv (the caller computes dinv from the weights with autograd when they require grad)."""

    op = "gcn_propagate"       # run(): no forward-mode derivative, refused naming the op

    @staticmethod
    def forward(x, weight, dinv, loop, graph, key, backend):
        return _spmm(backend, graph, weight, dinv, loop, x, key, transposed=False)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, dinv, loop, ctx.graph, ctx.key, ctx.backend = inputs
        ctx.weight_version = ctx.graph._weight_version()
        need_edge_grads = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        # x is only needed for the edge-weight gradient: do not keep it alive otherwise
        ctx.save_for_backward(*map(saveable, (x if need_edge_grads else None, weight, dinv,
                                              loop)))

    @staticmethod
    @first_order_backward("gcn_propagate")
    def backward(ctx, grad_out):
        x, weight, dinv, loop = ctx.saved_tensors
        graph, key = ctx.graph, ctx.key
        grad_out = grad_out.contiguous()
        grad_x = grad_w = grad_dinv = None
        if ctx.needs_input_grad[0]:
            if graph._weight_version() == ctx.weight_version:
                grad_x = _spmm(ctx.backend, graph, weight, dinv, loop, grad_out, key,
                               transposed=not graph.is_symmetric())
            else:   # the graph's weights changed in place since the forward (autograd saw no
                # change when what it saved is a dtype-cast copy): Âᵀ from the saved weights,
                # not cached (the cache is keyed by the weights as they are now) and not
                # assumed symmetric (the symmetry known now is of the new weights)
                grad_x = _spmm(ctx.backend, graph, weight, dinv, loop, grad_out, None,
                               transposed=True)
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            row, col = graph.row_index(), graph.indices
            if ctx.backend == "triton":
                from hiertail_fast.kernels.gcn_propagate import gcn_edge_dots

                a = gcn_edge_dots(grad_out, x.to(grad_out.dtype), row, col).to(dinv.dtype)
            else:
                a = _edge_dots(grad_out, x, row, col)
            w = weight if weight is not None else torch.ones_like(a)
            if ctx.needs_input_grad[1]:
                grad_w = dinv[row] * dinv[col] * a
            if ctx.needs_input_grad[2]:
                grad_dinv = (_row_sums(graph, w * dinv[col] * a)
                             + _col_sums(graph, w * dinv[row] * a))
                if loop is not None:      # <g_i, x_i> as the edges' (chunked, compute dtype)
                    grad_dinv += 2.0 * loop * dinv * _edge_dots(grad_out, x, None, None)
        # None for: loop (constant), graph, key, backend (not tensors)
        return grad_x, grad_w, grad_dinv, None, None, None, None


def as_graph(graph_or_edge_index, edge_weight=None, num_nodes: int | None = None) -> CSRGraph:
    """A `CSRGraph` from a prepared graph, a sparse adjacency (``CSRGraph.from_sparse``: PyG's
    ``adj_t`` orientation, a torch sparse tensor or ``torch_sparse.SparseTensor``) or
    ``edge_index`` [2, E] (+ edge_weight). An edge_index is converted with ``dedupe=False`` so
    duplicate edges count as in PyG."""
    if isinstance(graph_or_edge_index, CSRGraph) or is_sparse_adjacency(graph_or_edge_index):
        check_no_edge_weight(edge_weight)
        graph = graph_or_edge_index
        if not isinstance(graph, CSRGraph):
            graph = CSRGraph.from_sparse(graph)
        if num_nodes is not None and check_num_nodes(num_nodes) != graph.num_nodes:
            raise ValueError(f"num_nodes={num_nodes} but the graph has "
                             f"{graph.num_nodes} nodes")
        return graph
    check_tensor(graph_or_edge_index, "graph_or_edge_index")
    return CSRGraph.from_edge_index(graph_or_edge_index, edge_weight, num_nodes, dedupe=False)


PROPAGATION_BACKENDS = (*BACKENDS, "torch_sparse")   # gcn_propagate's backend= values


def _resolve_backend(x: torch.Tensor, backend: str | None) -> str:
    if backend == "torch_sparse":
        problem = _torch_sparse_problem()
        if problem is not None:
            raise ValueError(f"backend='torch_sparse' {problem}")
        return backend
    if backend is not None and backend not in PROPAGATION_BACKENDS:   # (the list named all)
        raise ValueError(f"backend={backend!r} is not one of {PROPAGATION_BACKENDS}")
    return choose_backend(x, backend, op="gcn_propagate")


def _cdtype(dtype: torch.dtype) -> torch.dtype:
    """Degrees and weights in fp32 for fp16/bf16 features (accumulation precision), else the
    features' dtype."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def propagate_transposed(g: torch.Tensor, graph: CSRGraph, improved: bool,
                         add_self_loops: bool, backend: str | None) -> torch.Tensor:
    """Âᵀ·g: ``gcn_propagate``'s gradient w.r.t. x, computed as its backward computes it (the
    forward's cached operator itself for a symmetric graph), for edge weights that need no
    gradient and a backend other than "reference". The compiled path's backward
    (``_custom_graph_ops``) calls it."""
    backend = _resolve_backend(g, backend)
    cdtype = _cdtype(g.dtype)
    with torch.no_grad():
        dinv, loop = graph.gcn_deg_inv_sqrt(improved, add_self_loops, cdtype)
        weight = None if graph.weight is None else graph.weight.to(cdtype)
        return _spmm(backend, graph, weight, dinv, loop if add_self_loops else None,
                     g.contiguous(), (bool(improved), bool(add_self_loops), cdtype),
                     transposed=not graph.is_symmetric())


@public_op
def gcn_propagate(
    x: torch.Tensor,
    graph_or_edge_index: CSRGraph | torch.Tensor,
    edge_weight: torch.Tensor | None = None,
    *,
    num_nodes: int | None = None,
    improved: bool = True,
    add_self_loops: bool = True,
    backend: str | None = None,
) -> torch.Tensor:
    """Â·x, Â = D^-1/2 (A + fill·I) D^-1/2 (PyG GCNConv propagation; fill 2 if improved).

    Args:
        x: [n, d] float features, finite (NaN/Inf: ValueError on every backend).
        graph_or_edge_index: a `CSRGraph` (recommended for repeated calls: its CSR, degrees,
            normalised values and transpose are built once and cached on it), edge_index
            [2, E] (row 0 = source, row 1 = target; converted on every call) or a sparse
            adjacency in PyG's ``adj_t`` orientation (row = target: a torch sparse tensor or
            ``torch_sparse.SparseTensor``, its values the weights; converted on every call).
        edge_weight: [E] weights for an edge_index (None = unit); gradients flow to them.
        num_nodes: optional check, must equal ``x.shape[0]``.
        backend: None (automatic), "reference", "torch", "triton" or "torch_sparse".
    Returns:
        [n, d] in x's dtype.
    Raises:
        ValueError when a node's degree (weighted in-degree + added self-loop) is negative:
        deg^-1/2 is undefined there (PyG returns NaN rows); the message names the node.
    """
    if torch.compiler.is_compiling() and _custom_graph_ops.READY:     # one custom op
        return _custom_graph_ops.traced_gcn_propagate(x, graph_or_edge_index, edge_weight,
                                                      num_nodes, improved, add_self_loops,
                                                      backend)
    x = check_float_matrix(x, "x")  # NaN/Inf rejected on every backend, as the reference does
    improved = check_flag(improved, "improved")
    add_self_loops = check_flag(add_self_loops, "add_self_loops")
    if num_nodes is None and not isinstance(graph_or_edge_index, CSRGraph) \
            and not is_sparse_adjacency(graph_or_edge_index):
        num_nodes = x.shape[0]  # an edge_index gets its node count from x
    graph = as_graph(graph_or_edge_index, edge_weight, num_nodes)
    if graph.num_nodes != x.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows but the graph has {graph.num_nodes} nodes")
    if graph.device != x.device:
        raise ValueError(f"graph is on {graph.device} but x is on {x.device}")
    backend = _resolve_backend(x, backend)
    if backend == "reference":
        from hiertail_fast.reference.gcn_propagate import gcn_propagate_ref

        return gcn_propagate_ref(x, graph.edge_index(), graph.weight, improved=improved,
                                 add_self_loops=add_self_loops)

    weight = graph.weight
    weight_grad = weight is not None and weight.requires_grad and torch.is_grad_enabled()
    # dinv/loop come from the graph's cache unless the weights need gradients (then they are
    # recomputed with autograd so the degree path reaches the weights)
    cdtype = _cdtype(x.dtype)
    if weight_grad:
        # dinv in float64, rounded inside the op: its gradient (~w·dinv·<g, x>: 1e45 for
        # weights of 1e30, an O(1) weight gradient after the degree path) overflowed float32
        # into inf - inf = NaN (an extremes audit)
        dinv, loop = graph.gcn_deg_inv_sqrt(improved, add_self_loops, torch.float64)
        check_weights_fit(graph.weight, cdtype)    # (after the NaN/Inf check of the weights)
    else:
        dinv, loop = graph.gcn_deg_inv_sqrt(improved, add_self_loops, cdtype)
    key = None if weight_grad else (bool(improved), bool(add_self_loops), cdtype)
    if weight is not None:
        weight = weight.to(cdtype)
    return GCNPropagateFunction.run(x, weight, dinv, loop if add_self_loops else None, graph,
                                      key, backend)
