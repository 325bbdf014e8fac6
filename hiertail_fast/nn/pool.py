"""``TopKPool``: the top-k (gPool) pooling layer as an ``nn.Module`` over ``topk_pool``."""
from __future__ import annotations

import math

import torch
from torch import nn

from hiertail_fast._validation import check_positive_int, is_non_finite_error, non_finite_error
from hiertail_fast.graph import CSRGraph
from hiertail_fast.ops.topk_pool import TopKPoolResult, topk_pool
from hiertail_fast.reference.topk_pool import pool_size

__all__ = ["TopKPool"]


class TopKPool(nn.Module):
    """Top-k pooling with a learnable projection p (PyG ``TopKPooling(channels, ratio)``).

    score = tanh(X·p/‖p‖); keeps k nodes (``ratio`` float in (0, 1]: k = ceil(ratio·n) with
    PyG's rounding; int: k = min(ratio, n)); returns X[perm]·score[perm] and the induced graph.
    Unlike PyG, a float is always a ratio: ``ratio=1.0`` keeps every node (PyG reads floats
    >= 1 as counts and keeps one; ``reference.topk_pool.pyg_pool_size`` gives its k).

    Args:
        channels: d, the feature size.
        ratio: pooling ratio or node count (checked at construction).
    Parameters:
        weight: [channels], initialised like PyG: uniform(−1/√channels, 1/√channels).
    """

    def __init__(self, channels: int, ratio: float | int = 0.5, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        # any integer but bool, numpy's included (as GCNConv: HierTailConfig(hidden=np.int64(8))
        # built its GCNConvs, then failed here)
        # (a wrong type is a TypeError, docs/GUARANTEES.md; a size below 1 a ValueError)
        self.channels = check_positive_int(channels, "channels")
        pool_size(1, ratio)  # validates ratio (type and range) now, not at the first forward
        self.ratio = ratio
        self.weight = nn.Parameter(torch.empty(self.channels, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.channels)  # torch_geometric.nn.inits.uniform
        nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: torch.Tensor, graph_or_edge_index: CSRGraph | torch.Tensor,
                edge_weight: torch.Tensor | None = None, *, backend: str | None = None,
                ratio: float | int | None = None) -> TopKPoolResult:
        """x [n, channels], a CSRGraph, edge_index [2, E] (+ weights) or a sparse adjacency
        (PyG's adj_t) -> TopKPoolResult. ``ratio`` overrides the module's for this call
        (HierTail passes each level's size, which depends on n and the class count)."""
        if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[1] != self.channels:
            # (topk_pool would blame its score_weight, the module's own parameter)
            raise ValueError(f"x has {x.shape[1]} features, TopKPool({self.channels}) expects "
                             f"{self.channels}")
        try:
            return topk_pool(x, graph_or_edge_index, self.weight,
                             self.ratio if ratio is None else ratio, edge_weight,
                             backend=backend)
        except (ValueError, TypeError) as exc:
            # the op's check of its score_weight is of this module's weight: named as such
            # ("score_weight is all zeros" after nn.init.zeros_; an nn-module audit)
            if not str(exc).startswith("score_weight"):
                raise
            text = "TopKPool.weight" + str(exc)[len("score_weight"):]
            raise (non_finite_error(text) if is_non_finite_error(exc)
                   else type(exc)(text)) from exc

    def extra_repr(self) -> str:
        return f"{self.channels}, ratio={self.ratio}"
