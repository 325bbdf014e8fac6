"""The graph ops as ``torch.library`` custom ops: what ``torch.compile`` sees of them.

As for the losses (``_custom_ops``, whose docstring gives the reasons): eager calls never come
here; while TorchDynamo traces, ``gcn_propagate``, ``topk_pool`` (on a CSRGraph),
``topk_unpool`` and ``nearest_prototype`` call one opaque op each, whose implementation is the
eager op (the input checks raise their ValueError / TypeError when the compiled code runs).
Without this, ``fullgraph=True`` failed on each of them (the data-dependent finiteness checks)
and the rest traced through graph breaks.

``gcn_propagate`` takes a ``CSRGraph``, a Python object the op schema cannot carry: the traced
call passes the graph's arrays, and the implementation finds the live graph holding exactly
those arrays (``CSRGraph._live``: same memory, shape, dtype, device), with its cached
normalised operator, transpose and symmetry flag; where there is none (the compiled code
copied the arrays, or an ``edge_index`` was given) it builds the graph as an eager call would.
Its backward is ``Âᵀ·g`` on the same cached operator, as the eager backward computes it
(``gcn_propagate.propagate_transposed``); for learnable edge weights (or the reference backend)
the backward op reruns the eager op with autograd instead (one propagation more than eager).

``topk_pool``'s pooled graph has a number of entries only the data decides: its fake
implementation gives that size as a new symbol, the traced code builds the pooled CSRGraph
from the op's arrays (its weights a differentiable gather of the input's, its declared
symmetry inherited), and a ``gcn_propagate`` on it passes that declaration to its op, which
finds no live graph for those arrays when it runs. On an ``edge_index`` topk_pool is traced
as before (the conversion depends on the data: a graph break). ``CSRGraph.augment_a2`` (the
official configuration's A² of every pooled graph, also of data-dependent size) is one op too.
"""
from __future__ import annotations

import torch
from torch import Tensor

from hiertail_fast._validation import check_flag, check_no_edge_weight, check_tensor
from hiertail_fast.graph import CSRGraph
from hiertail_fast.ops._custom_ops import (
    OP_OPTIONS,
    READY,
    _autograd_dispatch,
    _own_tensors,
    no_second_derivative,
    tied_gradients,
    unshared,
)
from hiertail_fast.ops._dispatch import on_input_device

__all__ = ["READY", "traced_augment_a2", "traced_gcn_propagate", "traced_nearest_prototype",
           "traced_topk_pool", "traced_topk_unpool"]


# ------------------------------------------------------------------ nearest_prototype
@torch.library.custom_op("hiertail_fast::nearest_prototype", **OP_OPTIONS)
def nearest_prototype(z: Tensor, prototypes: Tensor, backend: str | None) -> Tensor:
    from hiertail_fast.ops.nearest_prototype import nearest_prototype as eager

    return eager(z, prototypes, backend=backend)


@nearest_prototype.register_fake
def _(z, prototypes, backend):
    return z.new_empty(z.shape[:1], dtype=torch.int64)


def traced_nearest_prototype(z, prototypes, backend) -> Tensor:
    _tensors(z=z, prototypes=prototypes)
    return nearest_prototype(z, prototypes, backend)


# ------------------------------------------------------------------ topk_unpool
@torch.library.custom_op("hiertail_fast::topk_unpool", **OP_OPTIONS)
def topk_unpool(x_pooled: Tensor, perm: Tensor, num_nodes: int, backend: str | None) -> Tensor:
    from hiertail_fast.ops.topk_pool import topk_unpool as eager

    with torch.no_grad():
        return eager(x_pooled.detach(), perm, num_nodes, backend=backend)


@topk_unpool.register_fake
def _(x_pooled, perm, num_nodes, backend):
    return x_pooled.new_empty(num_nodes, x_pooled.shape[-1] if x_pooled.dim() else 0)


def _unpool_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1], inputs[0])


def _unpool_backward(ctx, grad):
    perm, x_pooled = ctx.saved_tensors
    # out[perm[i]] = x_pooled[i]: the gradient gathers the rows perm (perm was checked distinct
    # and in range when the forward ran). Tied to x_pooled (tied_gradients): compiled, a
    # second derivative through it raises, where it was silently dropped; exported, it is
    # exact (linear), as eager
    (dx,) = tied_gradients([grad.index_select(0, perm.long())], [x_pooled], True)
    return dx, None, None, None


topk_unpool.register_autograd(_unpool_backward, setup_context=_unpool_setup)


def traced_topk_unpool(x_pooled, perm, num_nodes, backend) -> Tensor:
    _tensors(x_pooled=x_pooled, perm=perm)
    return topk_unpool(x_pooled, perm, _count(num_nodes), backend)


# ------------------------------------------------------------------ topk_pool
@torch.library.custom_op("hiertail_fast::topk_pool", **OP_OPTIONS)
def topk_pool(x: Tensor, indptr: Tensor, indices: Tensor, weight: Tensor | None,
              score_weight: Tensor, k: int, backend: str | None
              ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(x_pooled, perm, score, the pooled graph's indptr and indices, the index of its entries
    into the input graph's) of the eager op on the live graph. The reference backend's pooled
    graph is taken from the torch path (the same edges; duplicate entries may come in another
    order)."""
    from hiertail_fast.ops.topk_pool import pool_with_entries

    graph = _graph(indptr, indices, weight, indptr.numel() - 1)
    with torch.no_grad(), on_input_device(x):     # (Triton launches on the current device)
        # k as an integer ratio (a node count, >= 1): min(k, n) = k; k = 0 only where n = 0
        res, entry = pool_with_entries(x.detach(), graph, score_weight.detach(), max(k, 1),
                                       backend=backend)
        pooled = res.graph
        if entry is None:
            pooled, entry = graph.subgraph(res.perm, return_entry_index=True)
    return tuple(unshared([res.x, res.perm, res.score, pooled.indptr, pooled.indices, entry],
                          [x, indptr, indices, weight, score_weight]))


@topk_pool.register_fake
def _(x, indptr, indices, weight, score_weight, k, backend):
    nnz = torch.library.get_ctx().new_dynamic_size()
    index = dict(dtype=torch.int64)
    return (x.new_empty(k, x.shape[1]), x.new_empty(k, **index), x.new_empty(k),
            x.new_empty(k + 1, **index), x.new_empty(nnz, **index), x.new_empty(nnz, **index))


@torch.library.custom_op("hiertail_fast::topk_pool_backward", **OP_OPTIONS)
def topk_pool_backward(grad_x: Tensor, grad_score: Tensor, x: Tensor, score_weight: Tensor,
                       k: int, backend: str | None, grads_of: list[bool]) -> list[Tensor]:
    """Gradients w.r.t. x and the score weight (those ``grads_of`` marks) of the eager
    selection rerun with autograd (the pooled graph does not enter them)."""
    from hiertail_fast._validation import check_score_weight
    from hiertail_fast.ops._dispatch import choose_backend
    from hiertail_fast.ops.topk_pool import TopKPoolFunction, topk_pool_ref

    leaves = [x.detach().requires_grad_(grads_of[0]),
              score_weight.detach().requires_grad_(grads_of[1])]
    with _autograd_dispatch(), on_input_device(x):
        p = check_score_weight(leaves[1], x.shape[1], x.dtype)
        choice = choose_backend(x, backend, op="topk_pool")
        if choice == "reference":
            no_edges = x.new_empty(2, 0, dtype=torch.int64)
            out = topk_pool_ref(leaves[0], no_edges, p, max(k, 1), None)   # (k = 0: n = 0)
            x_pooled, score = out[0], out[4]
        else:
            x_pooled, _, score = TopKPoolFunction.run(leaves[0], p, k, choice)[:3]
        wanted = [t for t, w in zip(leaves, grads_of, strict=True) if w]
        grads = torch.autograd.grad((x_pooled, score), wanted, (grad_x, grad_score),
                                    allow_unused=True)
    return _own_tensors(grads, wanted, others=(grad_x, grad_score))


@topk_pool_backward.register_fake
def _(grad_x, grad_score, x, score_weight, k, backend, grads_of):
    return [torch.empty_like(t) for t, w in zip((x, score_weight), grads_of, strict=True)
            if w]


def _pool_setup(ctx, inputs, output):
    x, indptr, indices, weight, score_weight, k, backend = inputs
    ctx.k, ctx.backend = k, backend
    ctx.save_for_backward(x, score_weight)


def _pool_backward(ctx, grad_x, _perm, grad_score, _indptr, _indices, _entry):
    x, score_weight = ctx.saved_tensors
    grads_of = [ctx.needs_input_grad[0], ctx.needs_input_grad[4]]
    grads = iter([])
    if any(grads_of):
        grad_x = torch.zeros(ctx.k, x.shape[1], dtype=x.dtype, device=x.device) \
            if grad_x is None else grad_x
        grad_score = torch.zeros(ctx.k, dtype=x.dtype, device=x.device) \
            if grad_score is None else grad_score
        grads = iter(topk_pool_backward(grad_x, grad_score, x, score_weight, ctx.k,
                                        ctx.backend, grads_of))
    return (next(grads) if grads_of[0] else None, None, None, None,
            next(grads) if grads_of[1] else None, None, None)


topk_pool.register_autograd(_pool_backward, setup_context=_pool_setup)
topk_pool_backward.register_autograd(no_second_derivative)


def traced_topk_pool(x, graph, score_weight, ratio, edge_weight, backend):
    """The public op's call on a CSRGraph while TorchDynamo traces it: one custom op; the
    pooled graph's weights are a gather of the input's (differentiable, traced), its
    symmetry inherited as in eager."""
    from hiertail_fast.ops.topk_pool import TopKPoolResult, pool_size

    _tensors(x=x, score_weight=score_weight)
    check_no_edge_weight(edge_weight)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [n, d], got shape {tuple(x.shape)}")
    k = pool_size(x.shape[0], ratio, x.dtype)    # a symbol for a dynamic n and an int ratio
    x_pooled, perm, score, indptr, indices, entry = topk_pool(
        x, graph.indptr, graph.indices, graph.weight, score_weight, k, backend)
    weight = None if graph.weight is None else graph.weight[entry]
    pooled = CSRGraph(indptr, indices, weight, k, validate=False)
    if graph._declared_symmetric():         # an induced subgraph of a symmetric graph
        pooled.assume_symmetric()
    return TopKPoolResult(x_pooled, pooled, pooled.edge_index(), pooled.weight, perm, score)


# ------------------------------------------------------------------ augment_a2
@torch.library.custom_op("hiertail_fast::augment_a2", **OP_OPTIONS)
def augment_a2(indptr: Tensor, indices: Tensor, weight: Tensor | None,
               num_nodes: int) -> tuple[Tensor, Tensor, Tensor]:
    """The arrays (indptr, indices, weight) of ``CSRGraph.augment_a2`` of the live graph on
    these arrays (cached on it, as eager calls find it) or of a graph built on them (a pooled
    graph the compiled code made)."""
    a2 = _graph(indptr, indices, weight, num_nodes).augment_a2()
    return tuple(unshared([a2.indptr, a2.indices, a2.weight], [indptr, indices, weight]))


@augment_a2.register_fake
def _(indptr, indices, weight, num_nodes):
    nnz = torch.library.get_ctx().new_dynamic_size()
    dtype = torch.get_default_dtype() if weight is None else weight.dtype
    return (indptr.new_empty(num_nodes + 1), indptr.new_empty(nnz),
            indptr.new_empty(nnz, dtype=dtype))


def traced_augment_a2(graph: CSRGraph) -> CSRGraph:
    """``CSRGraph.augment_a2`` while TorchDynamo traces it (the official configuration runs
    it on every pooled graph): one custom op, the A² graph built in the traced code with the
    symmetry it inherits in eager. The op carries no gradient for the weights: `augment_a2`
    sends weights that need gradients to the eager method instead (a graph break)."""
    weight = None if graph.weight is None else graph.weight.detach()
    indptr, indices, a2_weight = augment_a2(graph.indptr, graph.indices, weight,
                                            graph.num_nodes)
    return graph._inherit_symmetry(CSRGraph(indptr, indices, a2_weight, graph.num_nodes,
                                            validate=False))


# ------------------------------------------------------------------ gcn_propagate
def _graph(indptr, index, weight, num_nodes, weight_leaf: bool = False,
           assumed_symmetric: bool = False) -> CSRGraph | Tensor:
    """The live graph holding these arrays (its caches); a new one (with the live graph's
    symmetry flag) when the weights are an autograd leaf of the backward op, which the live
    graph does not hold; for an ``edge_index`` (indptr None), the edge_index itself (the eager
    op converts it). The arrays come from a CSRGraph the eager op accepted: not re-checked.
    Without a live graph (a graph built inside the compiled code, e.g. topk_pool's), the
    symmetry that graph declared while traced (``assumed_symmetric``) is declared again."""
    if indptr is None:
        return index
    live = CSRGraph._live(indptr, index, weight, num_nodes)
    if live is not None and not weight_leaf:
        return live
    graph = CSRGraph(indptr, index, weight, num_nodes, validate=False)
    if live is not None:
        return live._inherit_symmetry(graph)
    return graph.assume_symmetric() if assumed_symmetric else graph


def _eager(x, indptr, index, weight, num_nodes, improved, add_self_loops, backend,
           symmetric: bool, weight_leaf: bool = False):
    from hiertail_fast.ops.gcn_propagate import gcn_propagate as eager

    graph = _graph(indptr, index, weight, num_nodes, weight_leaf, symmetric)
    if isinstance(graph, CSRGraph):
        return eager(x, graph, improved=improved, add_self_loops=add_self_loops,
                     backend=backend)
    return eager(x, graph, weight, num_nodes=num_nodes, improved=improved,
                 add_self_loops=add_self_loops, backend=backend)


@torch.library.custom_op("hiertail_fast::gcn_propagate", **OP_OPTIONS)
def gcn_propagate(x: Tensor, indptr: Tensor | None, index: Tensor, weight: Tensor | None,
                  num_nodes: int, improved: bool, add_self_loops: bool, backend: str | None,
                  symmetric: bool, weight_grad: bool) -> Tensor:
    """The eager op's value. With ``weight_grad`` (learnable edge weights) the eager op's path
    for weights that require grad (per-call values, the self-loop as its own term), so the
    value is the eager one bit for bit; its small autograd graph is dropped."""
    if not weight_grad:
        with torch.no_grad():
            return _eager(x.detach(), indptr, index, weight, num_nodes, improved,
                          add_self_loops, backend, symmetric)
    with _autograd_dispatch():
        out = _eager(x.detach(), indptr, index, weight.detach().requires_grad_(), num_nodes,
                     improved, add_self_loops, backend, symmetric, weight_leaf=True)
    return out.detach()


@gcn_propagate.register_fake
def _(x, indptr, index, weight, num_nodes, improved, add_self_loops, backend, symmetric,
      weight_grad):
    return torch.empty_like(x)


@torch.library.custom_op("hiertail_fast::gcn_propagate_backward", **OP_OPTIONS)
def gcn_propagate_backward(grad: Tensor, x: Tensor, indptr: Tensor | None, index: Tensor,
                           weight: Tensor | None, num_nodes: int, improved: bool,
                           add_self_loops: bool, backend: str | None, symmetric: bool,
                           grads_of: list[bool]) -> list[Tensor]:
    """[gradient w.r.t. x if grads_of[0]] + [gradient w.r.t. weight if grads_of[1]]."""
    from hiertail_fast.ops.gcn_propagate import _resolve_backend, propagate_transposed

    backend = _resolve_backend(grad, backend)     # $HIERTAIL_BACKEND too, as the eager op
    if not grads_of[1] and backend != "reference":
        with torch.no_grad(), on_input_device(grad):
            graph = _graph(indptr, index, weight, num_nodes, assumed_symmetric=symmetric)
            if not isinstance(graph, CSRGraph):           # as the eager op converts it
                graph = CSRGraph.from_edge_index(graph, weight, num_nodes, dedupe=False)
            return [propagate_transposed(grad, graph, improved, add_self_loops, backend)]
    leaves = [x.detach().requires_grad_(grads_of[0]),
              None if weight is None else weight.detach().requires_grad_(grads_of[1])]
    with _autograd_dispatch():
        out = _eager(leaves[0], indptr, index, leaves[1], num_nodes, improved, add_self_loops,
                     backend, symmetric, weight_leaf=grads_of[1])
        wanted = [t for t, w in zip(leaves, grads_of, strict=True) if w]
        grads = torch.autograd.grad(out, wanted, grad, allow_unused=True)
    return _own_tensors(grads, wanted, others=(grad,))


@gcn_propagate_backward.register_fake
def _(grad, x, indptr, index, weight, num_nodes, improved, add_self_loops, backend, symmetric,
      grads_of):
    return [torch.empty_like(t) for t, w in zip((x, weight), grads_of, strict=True) if w]


def _gcn_setup(ctx, inputs, output):
    x, indptr, index, weight, num_nodes, improved, add_self_loops, backend, symmetric, _ = inputs
    ctx.options = (num_nodes, improved, add_self_loops, backend, symmetric)
    ctx.save_for_backward(x, indptr, index, weight)


def _gcn_backward(ctx, grad):
    x, indptr, index, weight = ctx.saved_tensors
    grads_of = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[3]]
    grads = iter(gcn_propagate_backward(grad, x, indptr, index, weight, *ctx.options,
                                        grads_of) if any(grads_of) else [])
    return (next(grads) if grads_of[0] else None, None, None,
            next(grads) if grads_of[1] else None, None, None, None, None, None, None)


gcn_propagate.register_autograd(_gcn_backward, setup_context=_gcn_setup)
gcn_propagate_backward.register_autograd(no_second_derivative)


def traced_gcn_propagate(x, graph_or_edge_index, edge_weight, num_nodes, improved,
                         add_self_loops, backend) -> Tensor:
    """The public op's call while TorchDynamo traces it: one custom op on the graph's arrays."""
    improved = check_flag(improved, "improved")
    add_self_loops = check_flag(add_self_loops, "add_self_loops")
    _tensors(x=x)
    if isinstance(graph_or_edge_index, CSRGraph):
        check_no_edge_weight(edge_weight)
        graph = graph_or_edge_index
        if num_nodes is not None and num_nodes != graph.num_nodes:
            raise ValueError(f"num_nodes={num_nodes} but the graph has {graph.num_nodes} nodes")
        args = (graph.indptr, graph.indices, graph.weight, graph.num_nodes)
        symmetric = graph._declared_symmetric()
    else:
        _tensors(graph_or_edge_index=graph_or_edge_index)
        n = x.shape[0] if num_nodes is None else _count(num_nodes)
        args = (None, graph_or_edge_index, edge_weight, n)
        symmetric = False
    weight = args[2]
    weight_grad = weight is not None and weight.requires_grad and torch.is_grad_enabled()
    return gcn_propagate(x, *args, improved, add_self_loops, backend, symmetric, weight_grad)


def _count(num_nodes) -> int:
    """num_nodes while tracing: an int, or a traced size (a symbol under dynamic shapes). A
    tensor, which the eager op also accepts, would need its value read from the device, and
    TorchDynamo traces numpy integers as tensors: TypeError for both, and for floats."""
    if isinstance(num_nodes, torch.SymInt):
        return num_nodes
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int):
        raise TypeError(f"num_nodes must be an int when compiled, got "
                        f"{type(num_nodes).__name__}")
    return num_nodes


def _tensors(**named) -> None:
    """TypeError naming an argument that is not a tensor (checked while tracing; the op schema
    would fail less clearly)."""
    for name, t in named.items():
        check_tensor(t, name)
