"""Reference GCN propagation Â·x, exactly PyG's ``gcn_norm`` + sum aggregation (flow
source_to_target). Plain torch (index_add), float64-safe, differentiable w.r.t. x and edge_weight.

    Â = D^-1/2 (A + L) D^-1/2,    A[i, j] = Σ w_e over edges e = (j -> i)
    L = diag(loop),  loop_i = fill (2 if improved else 1) when node i has NO self-loop and
                     add_self_loops, else 0 (PyG add_remaining_self_loops: existing loops keep
                     their own weight)
    deg_i = Σ_{e: target(e) = i} w_e + loop_i           (summed over the TARGET index)
    out_i = Σ_{e = (j -> i)} dinv_j w_e dinv_i x_j + loop_i dinv_i² x_i,   dinv = deg^-1/2 (0 if 0)

Negative degrees (negative edge weights that outweigh the rest) raise a ValueError naming the
node: deg^-1/2 is undefined there (PyG returns NaN rows); so do degrees whose float64 sum
overflows. A degree beyond the features' dtype (float32 weights near its largest value) takes
its deg^-1/2 from the float64 sum. Every backend applies the same rules.
16-bit features propagate in float32 (weights, degrees, products), rounded once to their dtype,
as on the fast backends; weights of a wider dtype that overflow the propagation's raise.

Deliberate differences from PyG 2.8.1, both documented in the tests:
* ``improved=True`` always uses fill 2. PyG 2.8's ``gcn_norm`` with ``edge_weight=None`` adds its
  self-loops before creating the unit weights and so silently uses fill 1; pass explicit unit
  weights to PyG (as its own GraphUNet/TopKPooling pipelines do) to get the documented fill 2.
* A node with SEVERAL stored self-loops keeps all of them (they sum, like any duplicate edge);
  PyG keeps one of them (the last one written by an indexed assignment).
"""
from __future__ import annotations

import torch

from hiertail_fast._csr import deg_inv_sqrt
from hiertail_fast._validation import (
    check_edge_index,
    check_edge_weight,
    check_flag,
    check_float_matrix,
    check_num_nodes,
    check_weights_fit,
)


def gcn_propagate_ref(
    x: torch.Tensor,
    edge_index: torch.Tensor,
    edge_weight: torch.Tensor | None = None,
    *,
    num_nodes: int | None = None,
    improved: bool = True,
    add_self_loops: bool = True,
) -> torch.Tensor:
    """Â·x for x [n, d], edge_index [2, E] (row 0 = source, row 1 = target), edge_weight [E].

    Returns [n, d] in x's dtype. `num_nodes`, when given, must equal ``x.shape[0]``.
    """
    x = check_float_matrix(x, "x")
    improved = check_flag(improved, "improved")
    add_self_loops = check_flag(add_self_loops, "add_self_loops")
    n = x.shape[0]
    if num_nodes is not None and check_num_nodes(num_nodes) != n:
        raise ValueError(f"num_nodes={num_nodes} but x has {n} rows")
    edge_index = check_edge_index(edge_index, n)
    w = check_edge_weight(edge_weight, edge_index.shape[1])
    # 16-bit features propagate in float32, rounded once at the end, as the fast backends do
    # (in float16 an in-degree of 65,520 became inf and its row 0; an extremes audit)
    x_in, x = x, x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    check_weights_fit(w, x.dtype)
    src, dst = edge_index[0].long(), edge_index[1].long()
    w = torch.ones(src.numel(), dtype=x.dtype, device=x.device) if w is None else w.to(x.dtype)

    loop = torch.zeros(n, dtype=x.dtype, device=x.device)
    if add_self_loops:
        has_loop = torch.zeros(n, dtype=torch.bool, device=x.device)
        has_loop[src[src == dst]] = True
        loop = (~has_loop).to(x.dtype) * (2.0 if improved else 1.0)

    # the degree summed in float64 and rounded once (a float32 sum stops at 2^24 in-edges)
    wide = torch.promote_types(x.dtype, torch.float64)
    wdeg = torch.zeros(n, dtype=wide, device=x.device).index_add(0, dst, w.to(wide)) + loop
    # deg^-1/2 (negative / NaN / beyond float64: ValueError; PyG: NaN rows) in PyG's
    # rounding, the degree rounded to x.dtype and deg^-1/2 taken there (a degree beyond its
    # range, weights near float32's largest value, from the wide sum: `deg_inv_sqrt`); for
    # learnable weights deg^-1/2, its derivative and the normalised values in the wide dtype,
    # rounded once (in float32, -deg^-3/2 / 2 and dL/d dinv ~ w·dinv·<g, x> under- or
    # overflowed for weights of 1e30 or 1e-30: NaN, -inf or wrong-sign gradients)
    dinv = deg_inv_sqrt(wdeg, wide if w.requires_grad else x.dtype)
    norm = (dinv.index_select(0, src) * w.to(dinv.dtype) * dinv.index_select(0, dst)).to(x.dtype)
    diag = (loop * dinv * dinv).to(x.dtype)
    # gathers by index_select: its CPU backward adds repeated indices in a fixed order
    # (advanced indexing's, index_put_, runs them in parallel: not reproducible run to run)
    out = torch.zeros_like(x).index_add(0, dst, norm.unsqueeze(1) * x.index_select(0, src))
    return (out + diag.unsqueeze(1) * x).to(x_in.dtype)
