"""Building blocks of the LTE4G / HierTail baselines (PROTOCOL_AND_BASELINES.md §1.5), sparse.

- `adjacency_operator`: the baselines' Â as a sparse CSR tensor — the unnormalised A+I of the
  HierTail copy (``norm="none"``, faithful: sum aggregation) or D^-1(A+I) (``norm="row"``).
- `AugmentedAdjacency`: the graph augmented with synthetic nodes (GraphSMOTE, GraphMixup) as an
  operator, its synthetic edge weights differentiable in O(|cand|·h).
- `GraphConv`: H' = Â (H W) + b, W [in, out] and b initialised U(±1/√out).
- `Encoder` (GraphConv, ReLU, Dropout) and `Classifier` (GraphConv, ReLU, Dropout, Linear with
  weight N(0, 0.05²); or the Linear alone, ``cls_og='MLP'``).

Memory: O(|E| + n·h); no dense n×n matrix anywhere.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hiertail_fast.graph import CSRGraph
from hiertail_fast.ops._csr_product import sparse_csr

NORMS = ("none", "row")


def adjacency_operator(graph: CSRGraph, norm: str = "none") -> torch.Tensor:
    """Sparse CSR [n, n] of ``graph``'s matrix (its weights, 1 where unweighted): as is
    (``"none"``) or divided by its row sums (``"row"``: D^-1 A; rows summing to 0 stay 0)."""
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    w = graph.weight_or_ones(torch.float32)
    if norm == "row":
        deg = graph.degree(w.dtype)                     # the row sums (float64-summed)
        inv = torch.where(deg > 0, 1.0 / deg.clamp_min(1e-30), torch.zeros_like(deg))
        w = w * inv[graph.row_index()]
    return sparse_csr(graph.indptr, graph.indices, w.contiguous(), graph.num_nodes)


class AugmentedAdjacency:
    """B [n+s, n+s] as an operator ``B @ XW``: the original block (``graph`` binarised, its
    entries at weight 1; constant: a sparse CSR product) plus the synthetic rows n+k and
    columns n+k at the candidates j with weight w_kj (carrying gradient where ``w`` does),
    applied by gather + index_add; no synthetic–synthetic entry. torch's backward of a sparse
    matrix product with respect to its VALUES forms the dense (n+s)² matrix grad·(XW)ᵀ before
    masking it; here the weights' gradient costs O(|cand|·h). ``norm="row"``: D⁻¹B, the
    degrees including the synthetic weights (differentiable)."""

    def __init__(self, graph: CSRGraph, s: int, cand_k: torch.Tensor, cand_j: torch.Tensor,
                 w: torch.Tensor, norm: str = "none") -> None:
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        n = graph.num_nodes
        pad = graph.indptr[-1:].expand(s)                   # s empty rows for the synthetic
        base = CSRGraph(torch.cat([graph.indptr, pad]), graph.indices, None, n + s,
                        validate=False)
        self.const = adjacency_operator(base, "none")
        self.rows = torch.cat([n + cand_k, cand_j])
        self.cols = torch.cat([cand_j, n + cand_k])
        self.w = torch.cat([w, w])
        self.inv_deg = None
        if norm == "row":
            deg = base.degree(self.w.dtype).index_add(0, self.rows, self.w)
            self.inv_deg = torch.where(deg > 0, 1.0 / deg.clamp_min(1e-30), torch.zeros_like(deg))

    def __matmul__(self, xw: torch.Tensor) -> torch.Tensor:
        # index_select: cols repeat (reproducible backward on CPU threads, unlike xw[cols])
        out = (self.const @ xw).index_add(0, self.rows,
                                          self.w[:, None] * xw.index_select(0, self.cols))
        return out if self.inv_deg is None else out * self.inv_deg[:, None]


class GraphConv(nn.Module):
    """H' = Â (H W) + b (LTE4G ``GraphConv``); Â is a sparse CSR tensor or a dense matrix."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        s = 1.0 / math.sqrt(self.out_features)
        nn.init.uniform_(self.weight, -s, s)
        nn.init.uniform_(self.bias, -s, s)

    def forward(self, h: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return adj @ (h @ self.weight) + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}"


class Encoder(nn.Module):
    """GNN_Encoder: GraphConv(F→h), ReLU, Dropout(p) — the 'embedding'."""

    def __init__(self, in_features: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.conv = GraphConv(in_features, hidden)
        self.dropout = float(dropout)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return F.dropout(F.relu(self.conv(x, adj)), self.dropout, self.training)


class Classifier(nn.Module):
    """GNN_Classifier (``kind="gnn"``): GraphConv(h→h), ReLU, Dropout, Linear(h→C); or the
    Linear alone (``kind="mlp"``). The Linear weight is N(0, 0.05²), its bias torch's default."""

    def __init__(self, hidden: int, num_classes: int, dropout: float, kind: str = "gnn") -> None:
        super().__init__()
        if kind not in ("gnn", "mlp"):
            raise ValueError(f"kind must be 'gnn' or 'mlp', got {kind!r}")
        self.kind, self.dropout = kind, float(dropout)
        self.conv = GraphConv(hidden, hidden) if kind == "gnn" else None
        self.linear = nn.Linear(hidden, num_classes)
        nn.init.normal_(self.linear.weight, std=0.05)

    def forward(self, h: torch.Tensor, adj: torch.Tensor | None = None) -> torch.Tensor:
        if self.conv is not None:
            if adj is None:
                raise ValueError("the GNN classifier needs the adjacency")
            h = F.dropout(F.relu(self.conv(h, adj)), self.dropout, self.training)
        return self.linear(h)
