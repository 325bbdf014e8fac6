"""`GCNConv`: graph convolution ``out = Â (X Wᵀ) + b`` on top of `gcn_propagate`."""
from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from hiertail_fast._validation import (
    all_finite,
    blame_inner_non_finite,
    check_flag,
    check_positive_int,
    check_tensor,
)
from hiertail_fast.graph import CSRGraph, outside_inference_mode
from hiertail_fast.ops.gcn_propagate import PROPAGATION_BACKENDS, as_graph, gcn_propagate


class GCNConv(nn.Module):
    """PyG-compatible ``GCNConv`` (Kipf & Welling), default ``improved=True`` as HierTail uses it.

        out = D^-1/2 (A + fill·I) D^-1/2 · X · Wᵀ + b,   fill = 2 if improved else 1

    Parameters are laid out as PyG's (``weight`` [out_channels, in_channels], glorot init;
    ``bias`` [out_channels], zeros), so weights copy over from ``torch_geometric.nn.GCNConv``
    (``lin.weight``, ``bias``). Â is applied on the narrower side: (ÂX)Wᵀ when
    in_channels < out_channels, else Â(XWᵀ) — the same result, fewer sparse flops.
    Two differences from PyG 2.8 (reference/gcn_propagate.py): ``improved=True`` uses fill 2
    also without edge weights (PyG's gcn_norm then silently uses 1), and several stored
    self-loops of a node all count (PyG keeps one).

    Args:
        in_channels, out_channels: feature sizes.
        improved: self-loop weight 2 instead of 1 (added only where a node has none).
        bias: learnable additive bias.
        add_self_loops: add the self-loops at all.
        backend: forwarded to `gcn_propagate` (None = automatic).
        cached: convert an edge_index / sparse adjacency input once and reuse it while the
            same tensors come back unchanged (PyG's ``cached``, but a different or modified
            input is converted again instead of silently served the first graph).

    forward(x [n, in], graph_or_edge_index (CSRGraph, [2, E] or a sparse adjacency in PyG's
    ``adj_t`` orientation), edge_weight [E] or None) -> [n, out]. Pass a `CSRGraph` to reuse
    its cached degrees/normalisation across epochs.
    """

    def __init__(self, in_channels: int, out_channels: int, improved: bool = True,
                 bias: bool = True, add_self_loops: bool = True,
                 backend: str | None = None, *, cached: bool = False) -> None:
        super().__init__()
        # a wrong type is a TypeError (docs/GUARANTEES.md), a size below 1 a ValueError
        self.in_channels = check_positive_int(in_channels, "in_channels")
        self.out_channels = check_positive_int(out_channels, "out_channels")
        in_channels, out_channels = self.in_channels, self.out_channels
        self.improved = check_flag(improved, "improved")
        self.add_self_loops = check_flag(add_self_loops, "add_self_loops")
        if backend is not None and backend not in PROPAGATION_BACKENDS:
            raise ValueError(f"backend={backend!r} is not one of {PROPAGATION_BACKENDS} (or "
                             f"None: automatic)")
        self.backend = backend
        self.cached = check_flag(cached, "cached")
        self._cached_graph: tuple | None = None      # (the input's identity, its CSRGraph)
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels))
        self.bias = nn.Parameter(torch.empty(out_channels)) if check_flag(bias, "bias") else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        a = math.sqrt(6.0 / (self.in_channels + self.out_channels))  # glorot, as PyG
        nn.init.uniform_(self.weight, -a, a)
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        self._cached_graph = None                     # as PyG's reset_parameters

    def __getstate__(self) -> dict:
        """Pickled (``torch.save(module)``, deepcopy) without the cached graph, whose weak
        references cannot be pickled; the copy converts again on its first call."""
        state = super().__getstate__() if hasattr(super(), "__getstate__") else dict(
            self.__dict__)
        return {**state, "_cached_graph": None}

    def _graph(self, graph_or_edge_index, edge_weight, n: int) -> CSRGraph:
        """The input as a CSRGraph. With ``cached``, an edge_index / sparse adjacency is
        converted once and reused while the same tensors, unchanged (their version counters),
        come back; another input is converted again (PyG's ``cached`` would keep serving the
        first graph). Weights that require grad are converted per call (a cached graph would
        hold their autograd history from the first call)."""
        if isinstance(graph_or_edge_index, CSRGraph):
            return as_graph(graph_or_edge_index, edge_weight)
        identity = _identity(graph_or_edge_index, edge_weight) if self.cached else None
        if identity is None:
            return as_graph(graph_or_edge_index, edge_weight, n)
        cached = self._cached_graph          # (identity, the node count, the graph)
        if cached is None or cached[1] != n or not _same_identity(cached[0], identity):
            # built outside inference mode: a graph cached during a scoring pass under
            # torch.inference_mode() held inference tensors, and every later training call
            # failed ("Inference tensors cannot be saved for backward")
            with outside_inference_mode():
                cached = (identity, n, as_graph(graph_or_edge_index, edge_weight, n))
            self._cached_graph = cached
        return cached[2]        # this call's (read again, another thread's could come back)

    def _propagate(self, h, graph, edge_weight=None):
        return gcn_propagate(h, graph, edge_weight, improved=self.improved,
                             add_self_loops=self.add_self_loops, backend=self.backend)

    def forward(self, x: torch.Tensor, graph_or_edge_index: CSRGraph | torch.Tensor,
                edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        """x [n, in_channels] over a `CSRGraph`, an edge_index [2, E] (with edge_weight [E]
        or None) or a sparse adjacency in PyG's adj_t orientation -> [n, out_channels]."""
        self._check_input(x)
        if torch.compiler.is_compiling() and not isinstance(graph_or_edge_index, CSRGraph):
            # traced: the edge_index goes into gcn_propagate's custom op as it is (converted
            # when the op runs; a conversion here would depend on the data: no graph)
            graph, weight = graph_or_edge_index, edge_weight
        else:
            graph, weight = self._graph(graph_or_edge_index, edge_weight, x.shape[0]), None
        if self.in_channels < self.out_channels:
            out = F.linear(self._propagate(x, graph, weight), self.weight)
        elif torch.compiler.is_compiling():
            out = self._propagate(F.linear(x, self.weight), graph, weight)
        else:
            out = self._propagate_product(x, graph, weight)
        return out if self.bias is None else out + self.bias

    def _propagate_product(self, x, graph, weight):
        """Â (X Wᵀ), where gcn_propagate's check of its input names the layer's product, not
        the user's finite x, when X Wᵀ holds NaN / Inf (an overflow, or NaN weights): the
        check said "x contains NaN or Inf" of an x that held neither (an overflow audit)."""
        h = F.linear(x, self.weight)
        with blame_inner_non_finite(x, self._non_finite_product):
            return self._propagate(h, graph, weight)

    def _non_finite_product(self, exc: ValueError) -> str:
        why = ("the weight holds NaN / Inf" if not all_finite(self.weight.detach())
               else "the product overflows its dtype")
        return (f"GCNConv: x·Wᵀ holds NaN or Inf although x is finite ({why}); scale x or "
                f"the weights down")

    def _check_input(self, x) -> None:
        """x [n, in_channels] in the parameters' dtype (any dtype under autocast): a wrong
        width or dtype is named here, not left to a RuntimeError inside the product."""
        check_tensor(x, "x")
        if x.dim() != 2 or x.shape[1] != self.in_channels:
            raise ValueError(f"x must be [num_nodes, in_channels={self.in_channels}], got shape "
                             f"{tuple(x.shape)}")
        if x.dtype != self.weight.dtype and not torch.is_autocast_enabled(x.device.type):
            # (integer or boolean features: module.to(x.dtype) is refused by torch, so the
            # features are what to convert; an API audit)
            fix = (f"e.g. x.to({self.weight.dtype})" if not x.is_floating_point()
                   else "e.g. module.to(x.dtype)")
            raise TypeError(f"x is {x.dtype} but the layer's parameters are "
                            f"{self.weight.dtype}: convert one of them ({fix})")

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, improved={self.improved}, "
                f"bias={self.bias is not None}, add_self_loops={self.add_self_loops}"
                + (", cached=True" if self.cached else ""))


def _identity(*inputs) -> tuple | None:
    """What ``cached`` compares: a weak reference to each input and the version counter of its
    values (None when the input cannot be cached: values that require grad, inference tensors
    (made under ``torch.inference_mode``: no version counter, reading it raised), or an object
    without weak references). A ``torch_sparse.SparseTensor`` is its storage's arrays: values,
    rows / row pointers and columns (only the values were versioned: an in-place edit of its
    columns was served the old graph; a mutation audit)."""
    out = []
    for t in inputs:
        if t is None:
            out.append(None)
            continue
        if isinstance(t, torch.Tensor):
            arrays = [t]
        else:
            st = t.storage
            arrays = [st._value, st._row, st._rowptr, st._col]
        arrays = [a for a in arrays if a is not None]
        if any(a.requires_grad or a.is_inference() for a in arrays):
            return None
        try:
            ref = weakref.ref(t)
        except TypeError:
            return None
        out.append((ref, tuple(a._version for a in arrays)))
    return tuple(out)


def _same_identity(a: tuple, b: tuple) -> bool:
    return all((x is None and y is None) or (x is not None and y is not None
                                             and x[0]() is not None and x[0]() is y[0]()
                                             and x[1] == y[1])
               for x, y in zip(a, b, strict=True))
