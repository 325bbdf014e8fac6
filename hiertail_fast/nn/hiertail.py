"""The HierTail model (KDD'24): hierarchical task grouping + long-tail balanced contrastive loss.

Architecture (a Graph U-Net, DESIGN.md §6, PROTOCOL_AND_BASELINES.md §3)::

    x⁰ = act(GCN₀(X, A₀))                                   embedding, [n, h]
    for l = 1..L:   (A² augmentation of the level's graph, optional)
        x̃ˡ, Aˡ, permˡ = TopK(xˡ⁻¹, Aˡ⁻¹, pˡ, kˡ)             task grouping, [kˡ, h]
        xˡ = act(GCN↓ₗ(x̃ˡ, Aˡ))                             prototype embeddings
    u = xᴸ
    for l = L-1..0:
        u = GCN↑ₗ(xˡ + unpool(u, permˡ⁺¹, nₗ), Aˡ)           skip addition, act except the last
    paper:    logits = Linear(u)        (u = final hidden embedding, [n, h])
    official: logits = u                (the last up conv maps h -> C, no activation)

Loss: L = CE(logits[train], y[train]) + γ·(L_SCL + Σ_l L_BCL,l).

Two named configurations (``HierTailConfig.paper()`` default, ``HierTailConfig.official()``):

=================  ========================================  ====================================
                   paper (Eqs. 6-10, appendix)               official (wanghh7/HierTail code)
=================  ========================================  ====================================
levels L           2: T⁽²⁾ = C, T⁽³⁾ = ceil(C/2) prototypes  3: ratios [1.0, 0.5, 0.5], first ×n/C
                                                             once -> k₁ = floor(n/C), ceil(k/2)…
convs              separate per level, Linear classifier     shared down conv (3 levels), shared
                                                             up conv (2 levels), last up conv h→C
A² augmentation    off (option)                              on (augment_adj before every pool)
SCL                final hidden embeddings of train nodes    logits of train nodes
BCL level l        (Zˡ, prototypes Zˡ⁺¹): node label =       (x⁰ of ALL nodes, xˡ⁺¹) for l = 0, 1;
                   index t of its nearest prototype,         node label = permˡ[nearest] (the code's
                   prototype t has label t                   slip), prototype t has label t
loss variant       "exact", include_self=False (Eq. 7/8)     "official" (+1e-7), include_self=True
γ, τ, hidden, lr   0.01, 0.1, 128, 0.01                      0.01, 1.0, 128, 0.001
=================  ========================================  ====================================

τ for ``paper``: the appendix searches τ ∈ {0.01, 0.1, 1.0}; 0.1 is the middle of that grid and
the default of the official ``arg.py``. Hidden: 128 here; the paper uses 64 on Email, Wiki and
BlogCatalog (``hiertail_fast.train`` picks it per dataset).

Costs: every op is sparse or linear in n (GCN propagation O(E·h), top-k O(n log n), nearest
prototype O(n·k·h) in blocks); the contrastive losses are the fused O(n·h)-memory kernels. The
official BCL of both levels shares the all-node block x⁰, so it is ONE
``hierarchical_contrastive_loss`` call carrying two label vectors and two prototype sets.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hiertail_fast._validation import (
    all_finite,
    blame_inner_non_finite,
    check_no_edge_weight,
    check_num_nodes,
    check_tensor,
)
from hiertail_fast.data.pyg import graph_inputs, is_pyg_data
from hiertail_fast.graph import CSRGraph, is_sparse_adjacency
from hiertail_fast.losses import balanced_contrastive_loss, hierarchical_contrastive_loss
from hiertail_fast.nn._train_labels import checked_train_labels
from hiertail_fast.nn.conv import GCNConv
from hiertail_fast.nn.hiertail_config import _LOSS_DTYPES, HierTailConfig
from hiertail_fast.nn.pool import TopKPool
from hiertail_fast.ops.nearest_prototype import nearest_prototype
from hiertail_fast.ops.topk_pool import topk_unpool

__all__ = ["HierTail", "HierTailConfig", "HierTailOutput", "HierTailLoss", "prepare_graph"]

_ACTIVATIONS = {"relu": F.relu, "leaky_relu": F.leaky_relu, "elu": F.elu, "tanh": torch.tanh}


def _cast(t: torch.Tensor, dtype: torch.dtype, name: str) -> torch.Tensor:
    """``t.to(dtype)`` for ``loss_dtype``; where dtype's exponent range is narrower than t's
    (float16 from float32, 16-bit from float64; not bfloat16 from float32) a finite value beyond
    it is a ValueError naming loss_dtype: the cast made it inf and the loss blamed 'z contains
    NaN or Inf', a non-finite error the training loop reports as divergence. Not that error
    (the embeddings are finite): a plain ValueError. Eager only (it reads the values): in
    compiled code the loss's own finiteness check stays."""
    if (t.is_floating_point() and t.numel() and not torch.compiler.is_compiling()
            and math.frexp(torch.finfo(dtype).max)[1] < math.frexp(torch.finfo(t.dtype).max)[1]):
        lo, hi = torch.aminmax(t.detach())
        largest, limit = max(-float(lo), float(hi)), float(torch.finfo(dtype).max)
        if math.isfinite(largest) and largest > limit:   # NaN / inf: the loss's own check
            raise ValueError(
                f"loss_dtype={name!r} cannot hold the contrastive inputs: they reach "
                f"|v| = {largest:.4g}, beyond {name}'s range (|v| <= {limit:g}); use "
                f"loss_dtype='bfloat16' (float32's range) or None, or scale the embeddings down")
    return t.to(dtype)

def prepare_graph(edge_index, num_nodes: int | None = None, edge_weight=None) -> CSRGraph:
    """The input graph as the official loader leaves it (``add_sl=True``): symmetrised, without
    duplicates, every old self-loop removed and exactly one unit self-loop per node. Build it
    ONCE per dataset; its GCN normalisation is cached by ``CSRGraph``.

    ``edge_index`` may be a PyG ``Data`` (its edge_index, num_nodes and edge_weight) or a sparse
    adjacency (``CSRGraph.from_sparse``: PyG's adj_t orientation, its values the weights). A
    weighted graph already symmetric (weights included) is kept as is; otherwise it becomes
    A + Aᵀ, as the official ``if not is_undirected: to_undirected``."""
    if is_pyg_data(edge_index):
        edge_index, num_nodes, edge_weight = graph_inputs(edge_index, num_nodes, edge_weight)
    elif is_sparse_adjacency(edge_index):
        check_no_edge_weight(edge_weight)
        adj = CSRGraph.from_sparse(edge_index)
        if num_nodes is not None and check_num_nodes(num_nodes) != adj.num_nodes:
            raise ValueError(f"num_nodes={num_nodes} but the adjacency has {adj.num_nodes} "
                             f"nodes")
        edge_index, num_nodes, edge_weight = adj.edge_index(), adj.num_nodes, adj.weight
    graph = CSRGraph.from_edge_index(edge_index, edge_weight, num_nodes=num_nodes,
                                     symmetrize=edge_weight is None)
    if edge_weight is not None and not graph.is_symmetric():
        graph = CSRGraph.from_edge_index(edge_index, edge_weight, num_nodes=num_nodes,
                                         symmetrize=True)
    return graph.remove_self_loops().with_self_loops(1.0)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and entries, NaN equal to NaN (a diverged run's checkpoint holds
    one shared tensor under several keys: torch.equal called it different from itself)."""
    if a is b or (a.shape == b.shape and a.dtype == b.dtype and a.data_ptr() == b.data_ptr()
                  and a.stride() == b.stride()):
        return True
    return a.shape == b.shape and a.dtype == b.dtype and bool(
        ((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


@dataclass
class HierTailOutput:
    """Forward results.

    logits [n, C]; embedding = x⁰ [n, h] (first-layer, post-activation); pooled[l] = xˡ⁺¹
    [k_{l+1}, h] for every level (the deepest included); perms[l] [k_{l+1}] indices into level
    l; hidden [n, h]: the final node embedding (paper: input of the Linear classifier; official:
    input of the last up conv, after the skip addition).
    """

    logits: torch.Tensor
    embedding: torch.Tensor
    pooled: list[torch.Tensor]
    perms: list[torch.Tensor]
    hidden: torch.Tensor


@dataclass
class HierTailLoss:
    """total = ce + gamma·(scl + bcl), bcl = Σ_l BCL_l. Scalar tensors (total carries the graph).

    ``bcl_levels``: the per-level terms where they are computed separately (``paper``); empty
    for the fused multi-level call of ``official`` (only the sum is computed there).
    """

    total: torch.Tensor
    ce: torch.Tensor
    scl: torch.Tensor
    bcl: torch.Tensor
    bcl_levels: list[torch.Tensor]

    def as_floats(self) -> dict[str, float]:
        out = {k: float(getattr(self, k).detach()) for k in ("total", "ce", "scl", "bcl")}
        out.update({f"bcl_{i}": float(v.detach()) for i, v in enumerate(self.bcl_levels)})
        return out


class HierTail(nn.Module):
    """HierTail for node classification on one graph.

    Args:
        in_channels: F, input feature width.
        num_classes: C.
        config: ``HierTailConfig`` (default ``HierTailConfig.paper()``).

    ``forward(x [n, F], graph)`` -> ``HierTailOutput``; ``graph`` is a ``CSRGraph`` (prepare it
    once with ``prepare_graph``), an ``edge_index`` [2, E] or a PyG ``Data`` (prepared on every
    call); ``forward(data)`` takes x from a PyG ``Data`` too.
    ``loss(output, y [n], train_idx)`` -> ``HierTailLoss``.
    """

    def __init__(self, in_channels: int, num_classes: int,
                 config: HierTailConfig | None = None) -> None:
        super().__init__()
        # ints (numpy's too): 3.5 / True / "4" failed deep inside torch or in a comparison
        in_channels = check_num_nodes(in_channels, "in_channels")
        num_classes = check_num_nodes(num_classes, "num_classes")
        if in_channels < 1 or num_classes < 1:
            raise ValueError(f"need in_channels >= 1 and num_classes >= 1, got {in_channels}, "
                             f"{num_classes}")
        cfg = config if config is not None else HierTailConfig.paper()
        if not isinstance(cfg, HierTailConfig):
            raise TypeError(f"config must be a HierTailConfig, got {type(cfg).__name__}")
        self.config, self.in_channels, self.num_classes = cfg, in_channels, num_classes
        h, levels, imp = cfg.hidden, cfg.num_levels, cfg.improved
        self.embed = GCNConv(in_channels, h, improved=imp)
        # k depends on n and C: forward passes each level's size to its pool (ratio=).
        self.pools = nn.ModuleList(TopKPool(h, 0.5) for _ in range(levels))
        if cfg.share_convs:  # the same module object at every level, as layers.GraphUNet does
            down = GCNConv(h, h, improved=imp)
            self.down = nn.ModuleList([down] * levels)
        else:
            self.down = nn.ModuleList(GCNConv(h, h, improved=imp) for _ in range(levels))
        # without task grouping (ablation M1 off) one GCN follows the embedding, as in Origin
        n_up_hidden = max(levels, 1) if cfg.linear_classifier else max(levels - 1, 0)
        if cfg.share_convs:
            up = GCNConv(h, h, improved=imp)
            ups = [up] * n_up_hidden
        else:
            ups = [GCNConv(h, h, improved=imp) for _ in range(n_up_hidden)]
        if not cfg.linear_classifier:
            ups.append(GCNConv(h, num_classes, improved=imp))
        self.up = nn.ModuleList(ups)     # up[i] runs at level L-1-i (deepest skip first)
        self.classifier = nn.Linear(h, num_classes) if cfg.linear_classifier else None
        self.reset_parameters()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        """As nn.Module's, plus: with ``share_convs`` one conv sits under several keys
        (down.0 / down.1 ...), and a state_dict holding different tensors there comes from a
        model that does not share its convs; loading it kept the last level's weights and
        dropped the others with "All keys matched"."""
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        aliases: dict[int, list[str]] = {}
        for name, t in [*self.named_parameters(remove_duplicate=False),
                        *self.named_buffers(remove_duplicate=False)]:
            aliases.setdefault(id(t), []).append(prefix + name)
        for keys in aliases.values():
            given = [k for k in keys if k in state_dict]
            differ = [k for k in given[1:] if not _same_values(state_dict[k],
                                                                state_dict[given[0]])]
            if differ:
                error_msgs.append(
                    f"{given[0]} and {differ[0]} hold different tensors, but they are one "
                    "shared conv here (share_convs=True): the state_dict comes from a model "
                    "whose convs are not shared (build the model with its config)")

    def reset_parameters(self) -> None:
        # The official GraphUNet's order (down convs, pools, up convs; a shared conv is reset
        # once per use), so a given seed draws the same random stream.
        for module in [self.embed, *self.down, *self.pools, *self.up]:
            module.reset_parameters()
        if self.classifier is not None:  # the official code's MLP head: N(0, 0.05²), bias 0
            nn.init.normal_(self.classifier.weight, std=0.05)
            nn.init.zeros_(self.classifier.bias)

    def extra_repr(self) -> str:
        return f"config={self.config.name!r}, levels={self.config.num_levels}"

    # ---------------------------------------------------------------------------------------
    def _act(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(_ACTIVATIONS[self.config.activation](x), p=self.config.dropout,
                         training=self.training)

    def forward(self, x: torch.Tensor, graph: CSRGraph | torch.Tensor | None = None
                ) -> HierTailOutput:
        """x [n, in_channels] over a graph (a `CSRGraph` from `prepare_graph`, built once and
        reused; an edge_index, sparse adjacency or PyG Data is prepared on every call), or
        ``model(data)`` with a PyG Data -> `HierTailOutput` (logits, embedding, pooled levels,
        perms, hidden); `loss` turns it into the training objective."""
        if graph is None:  # model(data): a PyG Data carries x and the graph
            if not is_pyg_data(x):
                raise TypeError("graph is required unless x is a PyG Data")
            x, graph = x.x, x
        check_tensor(x, "x")
        if x.dim() != 2:
            raise ValueError(f"x must be a 2-D tensor [n, F], got shape {tuple(x.shape)}")
        if x.shape[1] != self.in_channels:
            raise ValueError(f"x has {x.shape[1]} features, the model expects {self.in_channels}")
        if isinstance(graph, torch.Tensor) or is_pyg_data(graph) or is_sparse_adjacency(graph):
            graph = prepare_graph(graph, x.shape[0])   # edge_index, Data, adj_t: every call
        if not isinstance(graph, CSRGraph):
            raise TypeError(f"graph must be a CSRGraph, an edge_index tensor, a sparse adjacency "
                            f"or a PyG Data, got {type(graph).__name__}")
        if graph.num_nodes != x.shape[0]:
            raise ValueError(f"graph has {graph.num_nodes} nodes but x has {x.shape[0]} rows")
        with blame_inner_non_finite(x, self._non_finite_hidden):
            return self._forward_on(x, graph)

    def _non_finite_hidden(self, exc: ValueError) -> str:
        bad = [name for name, p in self.named_parameters() if not all_finite(p.detach())]
        return ("HierTail: a hidden representation became NaN or Inf although x is finite ("
                + (f"parameters holding NaN / Inf: {', '.join(bad)}" if bad else
                   "an overflow inside the model") + f"); the inner check said: {exc}")

    def _forward_on(self, x: torch.Tensor, graph: CSRGraph) -> HierTailOutput:
        cfg = self.config
        sizes = cfg.pool_sizes(x.shape[0], self.num_classes)

        h = self._act(self.embed(x, graph))
        xs, graphs, perms = [h], [graph], []
        for level in range(cfg.num_levels):
            g = graphs[-1].augment_a2() if cfg.augment_a2 else graphs[-1]
            # the module itself (its hooks fire, a replaced pool is used; calling topk_pool on
            # its weight skipped both: an nn-module audit), with this level's size
            res = self.pools[level](h, g, ratio=sizes[level])
            h = self._act(self.down[level](res.x, res.graph))
            xs.append(h)
            graphs.append(res.graph)
            perms.append(res.perm)
        if cfg.num_levels == 0:          # ablation without task grouping (M1 off)
            u = self.up[0](h, graph)
            if cfg.linear_classifier:
                u = self._act(u)
                return HierTailOutput(logits=self.classifier(u), embedding=h, pooled=[],
                                      perms=[], hidden=u)
            return HierTailOutput(logits=u, embedding=h, pooled=[], perms=[], hidden=h)
        # Unpooling with sum skips: up[i] runs on level j = L-1-i's graph.
        u = xs[-1]
        for i, j in enumerate(range(cfg.num_levels - 1, -1, -1)):
            u = xs[j] + topk_unpool(u, perms[j], xs[j].shape[0])
            hidden = u
            u = self.up[i](u, graphs[j])
            if i < cfg.num_levels - 1 or cfg.linear_classifier:
                u = self._act(u)
        if cfg.linear_classifier:
            hidden, logits = u, self.classifier(u)
        else:
            logits = u
        return HierTailOutput(logits=logits, embedding=xs[0], pooled=xs[1:], perms=perms,
                              hidden=hidden)

    # ---------------------------------------------------------------------------------------
    def cluster_labels(self, output: HierTailOutput) -> list[torch.Tensor]:
        """BCL node labels per level (assignment by nearest prototype, detached)."""
        cfg = self.config
        labels = []
        with torch.no_grad():
            if cfg.bcl_mode == "official":
                z = output.embedding.detach()
                for i in range(cfg.num_levels - 1):
                    nearest = nearest_prototype(z, output.pooled[i].detach())
                    # The official slip: perm[i][nearest] is a node id of the previous level,
                    # while prototype t is labelled t (fix_cluster_labels uses nearest itself).
                    labels.append(nearest if cfg.fix_cluster_labels
                                  else output.perms[i][nearest])
            else:
                blocks = [output.embedding, *output.pooled]
                for i in range(cfg.num_levels):
                    labels.append(nearest_prototype(blocks[i].detach(), blocks[i + 1].detach()))
        return labels

    def loss(self, output: HierTailOutput, y: torch.Tensor,
             train_idx: torch.Tensor) -> HierTailLoss:
        """L = CE(logits[train], y[train]) + γ·(SCL + Σ_l BCL_l); see the module docstring."""
        cfg = self.config
        n = output.logits.shape[0]
        if output.logits.dim() != 2 or output.logits.shape[1] != self.num_classes:
            raise ValueError(f"output has logits of shape {tuple(output.logits.shape)}, this "
                             f"model has {self.num_classes} classes (another model's output?)")
        # checked here, not deep inside torch's indexing / cross_entropy (IndexError, or a
        # device-side assert on CUDA): labels in [0, C), indices in [0, n), same device
        # (``_train_labels``: one custom op in compiled code)
        y_train, train_idx = checked_train_labels(y, train_idx, n, self.num_classes,
                                                  output.logits.device)
        kw = dict(temperature=cfg.tau, include_self=cfg.include_self, variant=cfg.loss_variant,
                  backend=cfg.loss_backend)
        # loss_dtype: embeddings and prototypes cast right before the contrastive losses (they
        # accumulate in fp32; the cast is differentiable); None keeps the embeddings' dtype.
        dtype = _LOSS_DTYPES.get(cfg.loss_dtype)
        cast = (lambda t: t) if dtype is None else (lambda t: _cast(t, dtype, cfg.loss_dtype))
        ce = F.cross_entropy(output.logits[train_idx], y_train)
        if not cfg.contrastive:          # ablation without M2: L = CE
            zero = ce.new_zeros(())
            return HierTailLoss(total=ce, ce=ce, scl=zero, bcl=zero, bcl_levels=[])
        scl_input = output.logits if cfg.scl_on == "logits" else output.hidden
        scl = balanced_contrastive_loss(cast(scl_input[train_idx]), y_train, **kw)

        labels = self.cluster_labels(output)
        if cfg.bcl_mode == "official":
            # Both levels share the all-node block x⁰: one fused pass, two label/prototype sets.
            fused = hierarchical_contrastive_loss(
                cast(output.embedding), labels,
                [cast(p) for p in output.pooled[: cfg.num_levels - 1]], **kw)
            # The fused call returns Σ_l BCL_l (a scalar); per-level values are not split out.
            bcl_levels = [] if fused.dim() == 0 else list(fused)
            bcl = fused.sum()
        else:
            blocks = [cast(output.embedding), *map(cast, output.pooled)]
            bcl_levels = [
                balanced_contrastive_loss(blocks[i], labels[i], prototypes=blocks[i + 1], **kw)
                for i in range(cfg.num_levels)
            ]
            bcl = torch.stack(bcl_levels).sum()
        total = ce + cfg.gamma * (scl + bcl)
        return HierTailLoss(total=total, ce=ce, scl=scl, bcl=bcl, bcl_levels=bcl_levels)
