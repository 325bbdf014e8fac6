"""Top-k pooling (gPool / PyG ``TopKPooling``) and unpooling: autograd Functions and dispatch.

Same semantics as ``hiertail_fast.reference.topk_pool`` (read its module docstring for the pool
size rules, the PyG float32 ceil quirk, ratio == 1.0 and the tie rule):

    score = tanh(X·p̂), p̂ = p/‖p‖;  perm = top-k of score (stable: ties -> lower node index first)
    X' = X[perm] ⊙ score[perm];  A' = A[perm, perm] relabelled 0..k−1, edge weights kept

Backends (``choose_backend``):
- torch: a row-wise ``(x * p̂).sum(1)`` for the score (identical rows -> identical scores),
  ``_select`` for the top-k (``torch.topk`` + a stable sort
  of the kept scores: torch.topk alone has no defined tie order), index ops, and a
  ``CSRGraph.subgraph`` for the induced graph (row-segment gather + filter + sort,
  O(Σ deg of kept rows) instead of O(E)).
- triton (``kernels/topk_pool.py``): score kernel, gather·scale kernel, fused backward, edge
  filter + block prefix-sum relabel + compaction, unpool scatter. The top-k selection itself
  is ``_select`` (torch.topk / stable torch.sort) on the device, and the compacted entries
  are put in CSR order (sorted (row, col) inside the pooled graph) by one ``torch.sort`` of
  their keys.

Gradients flow to X (directly and through the score) and to p through the score, via
``TopKPoolFunction`` whose backward saves only X, p, perm and score[perm] (no k×d copy); edge
weights of the pooled graph are a gather of the input weights (differentiable by autograd).
Edge order: the pooled graph is a ``CSRGraph`` (entries sorted by (target, source)); PyG's
``filter_adj`` keeps the input order instead — same multiset of edges and weights.
"""
from __future__ import annotations

import numbers
from typing import NamedTuple

import torch

from hiertail_fast._validation import (
    check_float_matrix,
    check_no_edge_weight,
    check_score_weight,
    check_unpool_args,
)
from hiertail_fast.graph import CSRGraph, is_sparse_adjacency
from hiertail_fast.ops import _custom_graph_ops
from hiertail_fast.ops._autograd import eager_twin, first_order_backward, saveable
from hiertail_fast.ops._dispatch import choose_backend, public_op
from hiertail_fast.ops._functorch import outside_transforms, plain
from hiertail_fast.reference.topk_pool import (
    pool_size,
    rescale_overflowed_dots,
    score_direction,
    topk_pool_ref,
    topk_unpool_ref,
)

__all__ = ["TopKPoolResult", "TopKPoolFunction", "TopKUnpoolFunction", "pool_with_entries",
           "topk_pool", "topk_unpool"]


class TopKPoolResult(NamedTuple):
    """Output of ``topk_pool``.

    x: [k, d] pooled features X[perm]·score[perm]; graph: pooled ``CSRGraph`` (k nodes);
    edge_index: [2, E'] (= ``graph.edge_index()``, row 0 source, row 1 target, CSR order);
    edge_weight: [E'] or None (= ``graph.weight``); perm: int64 [k] kept node ids by descending
    score; score: [k] = tanh(X·p/‖p‖)[perm] (as PyG's TopKPooling returns it).
    """

    x: torch.Tensor
    graph: CSRGraph
    edge_index: torch.Tensor
    edge_weight: torch.Tensor | None
    perm: torch.Tensor
    score: torch.Tensor


def _select(score: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores, descending; equal scores in ascending index order.

    ``torch.topk`` and unstable sorts give no defined order among ties, so: for k >= n/4 one
    stable descending sort; for smaller k (HierTail's k = n/#classes) ``torch.topk`` finds the
    k-th largest value t in O(n), the entries > t are stable-sorted (fewer than k of them) and
    the remaining slots go to the lowest-indexed entries equal to t. Same result either way.
    """
    n = score.numel()
    if 4 * k >= n:
        return torch.sort(score, descending=True, stable=True).indices[:k]
    if k == 0:
        return torch.zeros(0, dtype=torch.long, device=score.device)
    t = torch.topk(score, k, sorted=False).values.min()
    above = torch.nonzero(score > t).view(-1)  # ascending index
    above = above[torch.sort(score[above], descending=True, stable=True).indices]
    ties = torch.nonzero(score == t).view(-1)[: k - above.numel()]
    return torch.cat([above, ties])


_ROW_DOT_CHUNK = 1 << 18  # elements of one [rows, d] product chunk of `_row_dot` (1 MB fp32)


def _row_dot(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """x·v [n] as row-wise (x * v).sum(1), in row chunks (bounded temporary). Unlike torch.mv
    (whose BLAS blocking rounds the trailing n mod 4 rows differently) each row's sum depends
    only on the row, so identical rows give bit-identical results, equal to the reference's.
    Each chunk is made row-major first: on a column-major x (a transposed view) the product
    keeps x's layout and the sum runs across rows, rounding by the row's position (identical
    rows were an ulp apart and the lowest-index tie rule failed)."""
    n, d = x.shape
    out = torch.empty(n, dtype=torch.result_type(x, v), device=x.device)
    step = max(1, _ROW_DOT_CHUNK // max(1, d))
    for s in range(0, n, step):
        torch.sum(x[s:s + step].contiguous() * v, dim=1, out=out[s:s + step])
    return out


def _scaled_rows(x: torch.Tensor, perm: torch.Tensor, score_acc: torch.Tensor) -> torch.Tensor:
    """x[perm] · score_acc[perm][:, None] in x's dtype: in place on the gathered rows when the
    score has x's dtype, else the product in the score's (float32 for 16-bit rows) rounded
    once, as the reference and the Triton gather do."""
    rows = x.index_select(0, perm)
    scale = score_acc[perm].unsqueeze(1)
    if score_acc.dtype == x.dtype:
        return rows.mul_(scale)
    return rows.to(score_acc.dtype).mul_(scale).to(x.dtype)


@eager_twin
class TopKPoolFunction(torch.autograd.Function):
    """(x [n, d], p [d], k, backend) -> (x[perm]·s[perm] [k, d], perm [k], s[perm] [k], and
    for the backward: p̂ [d], qn, m, s[perm] unrounded [k]; ``apply(...)[:3]`` is the op's
    result)."""

    op = "topk_pool"           # run(): no forward-mode derivative, refused naming the op

    @staticmethod
    def forward(x, p, k, backend):
        phat, qn, m = score_direction(p)  # p̂ = p/‖p‖ without under/overflow of ‖p‖
        if backend == "triton":
            from hiertail_fast.kernels import topk_pool as kern

            x = x.contiguous()
            # kernel: t_i = x_i·p̂ (one fixed-order row reduction, in the accumulation dtype);
            # tanh is torch's, the same function as on the other backends, so saturated ties
            # break the same way
            t = kern.topk_score(x, phat.contiguous())
        else:
            t = _row_dot(x, phat)   # p̂ float32 for 16-bit x
        # rows whose sum overflowed on the way (entries near the dtype's largest value, mixed
        # signs) summed again with a power-of-two row scaling, as the reference does
        score_acc = torch.tanh(rescale_overflowed_dots(x, phat, t))
        # the scores rounded by torch on every backend (to nearest; the Triton interpreter's
        # float32 -> bfloat16 casts truncate, which a random fuzz caught), the rows scaled by
        # the unrounded score and rounded once
        score = score_acc.to(x.dtype)
        perm = _select(score, k)
        if backend == "triton":
            x_pooled = kern.gather_rows(x, perm, score_acc)
        else:
            x_pooled = _scaled_rows(x, perm, score_acc)
        # the backward's tanh'(t) = 1 − s² takes the unrounded score: from a 16-bit one a
        # saturated score (|x·p̂| ≳ 3.5 in bf16, 4.5 in fp16) rounds to ±1 and its gradient
        # through p was exactly 0 (a differential fuzz found it)
        return x_pooled, perm, score[perm], phat, qn, m, score_acc[perm]

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, p, _, ctx.backend = inputs
        _, perm, _, phat, qn, m, score_acc_sel = output
        ctx.save_for_backward(*map(saveable, (x, p, perm, score_acc_sel, phat, qn, m)))
        ctx.mark_non_differentiable(perm, phat, qn, m, score_acc_sel)

    @staticmethod
    @first_order_backward("topk_pool")
    def backward(ctx, grad_x, grad_perm, grad_score, *_):   # none for p̂, qn, m, s
        x, p, perm, s, phat, qn, m = ctx.saved_tensors
        if grad_x is None:
            grad_x = x.new_zeros(perm.numel(), x.shape[1])
        if ctx.backend == "triton":
            from hiertail_fast.kernels import topk_pool as kern

            gs = None if grad_score is None else grad_score.contiguous()
            # x as the caller gave it (setup_context saves the input): the kernel reads rows
            dx, dp = kern.topk_pool_bwd(x.contiguous(), phat, qn, m, perm, s,
                                        grad_x.contiguous(), gs)
            dp = dp.to(p.dtype)
        else:
            # every step in the accumulation dtype (qn's: float32 for 16-bit rows, which are
            # upcast here, as the Triton kernel does in registers), dx rounded once: done in
            # 16 bits, dx was 3.6 ulps of its terms off in fp16, the kernel's 1.0.
            # Peak extra memory: dx [n, d] (the result) + two [k, d] buffers (16-bit rows:
            # three, in float32)
            acc = qn.dtype
            xs = x.index_select(0, perm).to(acc)  # [k, d]
            g, s = grad_x.to(acc), s.to(acc)
            # ∂L/∂s_r through X' = X[perm]·s: row dots as a batched [1,d]·[d,1] (no k×d temp)
            ds = torch.bmm(g.unsqueeze(1), xs.unsqueeze(2)).view(-1)
            if grad_score is not None:
                ds = ds + grad_score.to(acc)
            dt = ds * (1 - s * s)  # through tanh
            dxk = (g * s.unsqueeze(1)).addr_(dt, phat)  # g·s + dt p̂
            dx = torch.zeros_like(x).index_copy_(0, perm, dxk.to(x.dtype))
            del dxk, g
            # Σ_r dt_r x_perm_r (the projection below cancels: in 16 bits, 3.5 % of an entry
            # in fp16 at d = 2)
            v = torch.mv(xs.t(), dt)
            # (I − p̂p̂ᵀ) v / ‖p‖ with ‖p‖ = m·‖q‖ divided in two steps (no overflow of ‖p‖)
            dp = ((v - torch.dot(v, phat) * phat) / qn / m).to(p.dtype)
        # k and backend are Python values: no gradient
        return (dx if ctx.needs_input_grad[0] else None,
                dp if ctx.needs_input_grad[1] else None, None, None)


@eager_twin
class TopKUnpoolFunction(torch.autograd.Function):
    """Triton unpool: out = zeros(n, d), out[perm] = x_pooled; backward = gather of rows."""

    op = "topk_unpool"         # run(): no forward-mode derivative, refused naming the op

    @staticmethod
    def forward(x_pooled, perm, num_nodes):
        from hiertail_fast.kernels import topk_pool as kern

        return kern.unpool_scatter(x_pooled.contiguous(), perm, num_nodes)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[1])

    @staticmethod
    def backward(ctx, grad_out):
        from hiertail_fast.kernels import topk_pool as kern

        (perm,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: the same gather, differentiable
            return grad_out.index_select(0, perm), None, None
        grad = kern.gather_rows(grad_out.contiguous(), perm)
        return grad, None, None  # perm: integer indices; num_nodes: a Python int


def _as_graph(graph_or_edge_index, edge_weight, n: int, device: torch.device) -> CSRGraph:
    if isinstance(graph_or_edge_index, CSRGraph) or is_sparse_adjacency(graph_or_edge_index):
        graph = graph_or_edge_index
        check_no_edge_weight(edge_weight)
        if not isinstance(graph, CSRGraph):
            graph = CSRGraph.from_sparse(graph)
        if graph.num_nodes != n:
            raise ValueError(f"the graph has {graph.num_nodes} nodes but x has {n} rows")
    else:
        # keep the graph as given: no symmetrisation, duplicates and self-loops stay
        graph = CSRGraph.from_edge_index(graph_or_edge_index, edge_weight, num_nodes=n,
                                         dedupe=False)
    if graph.device != device:
        raise ValueError(f"the graph is on {graph.device} but x is on {device}")
    return graph


def _subgraph_triton(graph: CSRGraph, perm: torch.Tensor) -> tuple[CSRGraph, torch.Tensor]:
    """Induced subgraph on perm (relabelled in perm order) with the Triton filter/compaction,
    and the index of its entries into the graph's."""
    from hiertail_fast.kernels import topk_pool as kern

    n, k = graph.num_nodes, perm.numel()
    # integer work: inside a torch.func transform, on plain tensors outside it (_functorch)
    with outside_transforms():
        perm = plain(perm, "topk_pool")
        relabel = torch.full((n,), -1, dtype=torch.long, device=perm.device)
        relabel[perm] = torch.arange(k, device=perm.device)
        new_row, new_col, eid = kern.filter_edges(graph.row_index(), graph.indices, relabel)
    return graph._induced_from_entries(eid, new_row, new_col, k)


@public_op
def topk_pool(
    x: torch.Tensor,
    graph_or_edge_index: CSRGraph | torch.Tensor,
    score_weight: torch.Tensor,
    ratio: float | int,
    edge_weight: torch.Tensor | None = None,
    *,
    backend: str | None = None,
) -> TopKPoolResult:
    """Top-k pooling of one graph (PyG ``TopKPooling`` semantics, see the module docstring).

    Args:
        x: [n, d] node features (floating point, finite).
        graph_or_edge_index: a ``CSRGraph`` with n nodes (reused as is: pass one to avoid the
            O(E log E) CSR build per call), an ``edge_index`` [2, E] (source, target), which
            is stored without symmetrisation or deduplication, or a sparse adjacency in PyG's
            ``adj_t`` orientation (``CSRGraph.from_sparse``).
        score_weight: projection p, [d] or [1, d], same dtype as x, nonzero.
        ratio: float in (0, 1] (k = ceil(ratio·n), PyG rounding) or int >= 1 (k = min(ratio, n)).
        edge_weight: [E] weights for an ``edge_index`` input (None: unweighted).
        backend: "reference" | "torch" | "triton" | None.
    Returns:
        ``TopKPoolResult(x, graph, edge_index, edge_weight, perm, score)``.
    """
    if (torch.compiler.is_compiling() and _custom_graph_ops.READY
            and isinstance(graph_or_edge_index, CSRGraph)                  # one custom op,
            and (isinstance(ratio, numbers.Integral) or not _symbolic(x))):
        # unless a float ratio meets a dynamic node count: k is PyG's float32 rounding of
        # ratio * n, which needs n's value (traced as before then: a graph break)
        return _custom_graph_ops.traced_topk_pool(x, graph_or_edge_index, score_weight, ratio,
                                                  edge_weight, backend)
    return pool_with_entries(x, graph_or_edge_index, score_weight, ratio, edge_weight,
                             backend)[0]


def _symbolic(x) -> bool:
    """Whether x's row count is a symbol of the traced graph (dynamic shapes)."""
    return isinstance(x, torch.Tensor) and x.dim() > 0 and not isinstance(x.shape[0], int)


def pool_with_entries(x, graph_or_edge_index, score_weight, ratio, edge_weight=None,
                      backend=None) -> tuple[TopKPoolResult, torch.Tensor | None]:
    """``topk_pool``'s result and the index of the pooled graph's entries into the input
    graph's (its weights are a gather of them); None on the reference backend, whose pooled
    graph is built from the reference's edge list."""
    x = check_float_matrix(x, "x")
    n, d = x.shape
    p = check_score_weight(score_weight, d, x.dtype)
    if p.device != x.device:
        raise ValueError(f"score_weight is on {p.device} but x is on {x.device}")
    graph = _as_graph(graph_or_edge_index, edge_weight, n, x.device)
    k = pool_size(n, ratio, x.dtype)
    choice = choose_backend(x, backend, op="topk_pool")
    if choice == "reference":
        x_pooled, ei, ew, perm, score = topk_pool_ref(x, graph.edge_index(), p, ratio,
                                                      graph.weight)
        pooled = graph._inherit_symmetry(CSRGraph.from_edge_index(ei, ew, num_nodes=k,
                                                                  dedupe=False))
        entry = None
    else:
        x_pooled, perm, score = TopKPoolFunction.run(x, p, k, choice)[:3]
        pooled, entry = (_subgraph_triton(graph, perm) if choice == "triton" else
                         graph.subgraph(perm, return_entry_index=True))
    return (TopKPoolResult(x_pooled, pooled, pooled.edge_index(), pooled.weight, perm, score),
            entry)


@public_op
def topk_unpool(
    x_pooled: torch.Tensor, perm: torch.Tensor, num_nodes: int, *, backend: str | None = None
) -> torch.Tensor:
    """Unpooling: ``zeros(num_nodes, d)`` with rows ``perm`` <- ``x_pooled`` (differentiable).

    Args:
        x_pooled: [k, d]; perm: [k] distinct ids in [0, num_nodes); num_nodes: n.
    Returns:
        [num_nodes, d] in x_pooled's dtype/device.
    """
    if torch.compiler.is_compiling() and _custom_graph_ops.READY:     # one custom op
        return _custom_graph_ops.traced_topk_unpool(x_pooled, perm, num_nodes, backend)
    choice = choose_backend(x_pooled if isinstance(x_pooled, torch.Tensor) else torch.empty(0),
                            backend, op="topk_pool")
    if choice == "reference":
        return topk_unpool_ref(x_pooled, perm, num_nodes)
    x_pooled = check_float_matrix(x_pooled, "x_pooled", finite=False)
    perm = check_unpool_args(perm, num_nodes, x_pooled.shape[0]).long()
    if perm.device != x_pooled.device:
        raise ValueError(f"perm is on {perm.device} but x_pooled is on {x_pooled.device}")
    if choice == "triton":
        return TopKUnpoolFunction.run(x_pooled, perm, int(num_nodes))
    # in place into the new zeros: index_copy (out of place) allocated a second n × d buffer,
    # a peak of twice the output (a memory audit)
    return x_pooled.new_zeros(int(num_nodes), x_pooled.shape[1]).index_copy_(0, perm, x_pooled)
