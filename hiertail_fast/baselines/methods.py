"""The baselines behind one interface (PROTOCOL_AND_BASELINES.md §2).

A method is an ``nn.Module`` built from a `MethodContext` (the graph, features, labels and the
training nodes of one run, with its seeded generator) and a `BaselineConfig`; the harness
(`hiertail_fast.baselines.harness`) optimises ``parameters()`` with one Adam — the official
one-Adam-per-module with equal settings is the same update — and calls

- ``train_loss()``: the training forward in train mode (synthetic nodes included), a scalar;
- ``predict()``: the eval-mode logits [n, C] of the n ORIGINAL nodes;

and two stage hooks, no-ops by default: ``pretrain(opt)`` before the loop (GraphSMOTE's
``ep_pre`` edge-generator epochs, on the loop's optimiser, no evaluation) and
``after_fit(val_idx, epochs=..., progress=...)`` once the loop's best state is loaded (LTE4G's
prototypes, experts and students, which select on the validation nodes themselves).

Every method keeps O(n·F + n·h + |E|) memory (sparse Â; over-sampling / SMOTE add s nodes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from hiertail_fast._validation import (
    check_dense_tensor,
    check_float_matrix,
    check_index_vector,
    check_labels_below,
    check_node_ids,
    check_positive_int,
)
from hiertail_fast.baselines.config import BaselineConfig
from hiertail_fast.baselines.layers import Classifier, Encoder, adjacency_operator
from hiertail_fast.baselines.sampling import (
    augment_adjacency,
    same_class_nearest_neighbour,
    smote_interpolate,
    tail_classes,
    upsample_rounds,
)
from hiertail_fast.graph import CSRGraph


@dataclass
class MethodContext:
    """One run's inputs. graph: A+I as `prepare_graph` builds it (symmetric, one unit
    self-loop per node), on x's device; train_idx int64 on that device; generator: the CPU
    generator of every random draw of the method (λ), seeded from the run seed. Optional, for
    the methods that need them (GraphMixup's Q-agent and phases): val_idx, the harness's epoch
    cap and patience."""

    x: torch.Tensor
    y: torch.Tensor
    graph: CSRGraph
    train_idx: torch.Tensor
    num_classes: int
    generator: torch.Generator
    val_idx: torch.Tensor | None = None
    epochs: int | None = None
    patience: int | None = None

    def __post_init__(self) -> None:
        # (an API audit, session 68: an int, 1-D or NaN x, an edge_index for the graph, a str
        # num_classes failed deep inside torch or gave NaN logits; an empty train_idx a NaN
        # loss, a repeated one counted its nodes twice, as HierTail's loss refuses)
        self.x = check_float_matrix(self.x, "x")
        if not isinstance(self.graph, CSRGraph):
            raise TypeError(f"graph must be a CSRGraph (prepare_graph builds it), got "
                            f"{type(self.graph).__name__}")
        self.num_classes = check_positive_int(self.num_classes, "num_classes")
        if self.graph.device != self.x.device:
            raise ValueError(f"the graph is on {self.graph.device} but x is on {self.x.device}")
        n = self.x.shape[0]
        check_dense_tensor(self.y, "y")  # (a list's .shape raised AttributeError; session 69)
        if self.y.shape != (n,) or self.graph.num_nodes != n:
            raise ValueError(f"x [{n}, F], y {tuple(self.y.shape)} and the graph "
                             f"({self.graph.num_nodes} nodes) disagree")
        if self.num_classes < 2:
            raise ValueError(f"need at least 2 classes, got {self.num_classes}")
        check_index_vector(self.y, "y", length=n)
        if n:
            check_labels_below(int(self.y.max()), self.num_classes)
        for name in ("train_idx", "val_idx"):
            idx = getattr(self, name)
            if idx is None:
                continue
            # (a boolean mask: the up-sampling methods read node ids 0 and 1, no synthetic
            # nodes and a loss on two nodes; a baselines audit)
            check_node_ids(idx, name, n, self.x.device, "the graph",
                           nonempty=name == "train_idx", distinct=True)


class BaselineMethod(nn.Module):
    """Base: an encoder and a classifier on Â (``cfg.adj_norm``), as Origin (§2.1)."""

    name: ClassVar[str] = ""
    uses_tail: ClassVar[bool] = False   # uses the tail classes (im_class_num)
    head_first: ClassVar[bool] = False  # its head classes are the first labels (LTE4G)

    def __init__(self, ctx: MethodContext, cfg: BaselineConfig) -> None:
        super().__init__()
        self._bind(ctx, cfg)
        self.adj = adjacency_operator(ctx.graph, cfg.resolved_adj_norm)
        self.encoder = Encoder(ctx.x.shape[1], cfg.hidden, cfg.dropout)
        self.classifier = Classifier(cfg.hidden, ctx.num_classes, cfg.dropout,
                                     cfg.resolved_classifier)

    def _bind(self, ctx: MethodContext, cfg: BaselineConfig) -> None:
        """The checks and state every method shares: the config is this method's, the tail
        classes exist (a clear message), ``cfg`` and ``ctx`` kept."""
        if cfg.method != self.name:
            raise ValueError(f"config is for {cfg.method!r}, method is {self.name!r}")
        if self.uses_tail:
            tail_classes(ctx.num_classes, cfg.im_class_num)   # range check, clear message
        self.cfg, self.ctx = cfg, ctx

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        """Logits [n, C] of features x over the adjacency ``adj`` (encoder, then classifier)."""
        return self.classifier(self.encoder(x, adj), adj)

    def train_loss(self) -> torch.Tensor:
        """The method's training objective for one step of the shared loop (here Origin's
        cross-entropy on the training nodes; each method overrides it with its own)."""
        c = self.ctx
        return F.cross_entropy(self(c.x, self.adj)[c.train_idx], c.y[c.train_idx])

    def predict(self) -> torch.Tensor:
        """Logits [n, C] of every node, for model selection and the test metrics."""
        return self(self.ctx.x, self.adj)

    def pretrain(self, opt: torch.optim.Optimizer) -> int:
        """Steps to take with the loop's optimiser before the loop; returns how many ran."""
        return 0

    def selection_start(self) -> int:
        """First epoch of the loop that may be selected (and starts the patience): 0, or the
        end of a pre-training phase run inside the loop's epochs."""
        return 0

    def after_fit(self, val_idx: torch.Tensor, *, epochs: int, progress: bool = False) -> None:
        """Stages after the loop (its best state loaded); the loop's ``epochs`` for reference."""

    def info(self) -> dict:
        """Per-run facts for the results (e.g. the number of synthetic nodes)."""
        return {}

    def param_groups(self) -> list[dict]:
        """Adam's parameter groups; a group may set its own ``weight_decay`` (GraphENS decays
        only its convolutions). Default: one group, the config's settings."""
        return [{"params": list(self.parameters())}]


class OwnArchitectureMethod(BaselineMethod):
    """Base of the methods with their own official modules and aggregation (GraphENS, ImGAGN):
    no shared encoder / classifier; ``struct`` is the unit-weight A+I (their official convs
    ignore edge weights) and ``adj`` its mean operator D^-1(A+I)."""

    def __init__(self, ctx: MethodContext, cfg: BaselineConfig) -> None:
        nn.Module.__init__(self)     # not BaselineMethod's: no shared encoder / classifier
        self._bind(ctx, cfg)
        self.struct = CSRGraph(ctx.graph.indptr, ctx.graph.indices, None, ctx.x.shape[0],
                               validate=False).with_self_loops()
        self.adj = adjacency_operator(self.struct, "row")


class Origin(BaselineMethod):
    """§2.1: a GCN (1-layer encoder + GNN classifier) trained with CE on the imbalanced labels."""

    name = "origin"


class Reweight(BaselineMethod):
    """§2.3: CE with class weight 1 + up_scale on the tail classes (1 elsewhere), PyTorch's
    weighted mean Σ w_{y_i} CE_i / Σ w_{y_i}."""

    name = "reweight"
    uses_tail = True

    def __init__(self, ctx: MethodContext, cfg: BaselineConfig) -> None:
        super().__init__(ctx, cfg)
        self.register_buffer("class_weight", reweight_class_weights(
            ctx.num_classes, cfg.im_class_num, cfg.up_scale).to(ctx.x.device))

    def train_loss(self) -> torch.Tensor:
        c = self.ctx
        return F.cross_entropy(self(c.x, self.adj)[c.train_idx], c.y[c.train_idx],
                               weight=self.class_weight)


def reweight_class_weights(num_classes: int, im_class_num: int, up_scale: float) -> torch.Tensor:
    """float32 [C]: 1 + up_scale for the last ``im_class_num`` classes, 1 for the others."""
    w = torch.ones(num_classes)
    w[tail_classes(num_classes, im_class_num)] = 1.0 + float(up_scale)
    return w


class _InputUpsampling(BaselineMethod):
    """Over-sampling / SMOTE: s synthetic nodes made ONCE (at build) and appended at the end,
    each linked as a copy of its source (`augment_adjacency`); training AND evaluation run on
    the augmented graph (as the official code), the loss over training + synthetic nodes."""

    uses_tail = True
    rule: ClassVar[str] = "src"

    def __init__(self, ctx: MethodContext, cfg: BaselineConfig) -> None:
        super().__init__(ctx, cfg)
        rounds = upsample_rounds(ctx.y, ctx.train_idx, ctx.num_classes, cfg.im_class_num,
                                 cfg.up_scale, self.rule)
        n = ctx.x.shape[0]
        dev = ctx.x.device
        sources = (torch.cat([r for _, r in rounds]) if rounds
                   else torch.zeros(0, dtype=torch.long, device=dev))
        feats = [self.synthetic_features(ctx.x[r]) for _, r in rounds]
        self.num_synthetic = int(sources.numel())
        self.x_aug = torch.cat([ctx.x] + feats) if feats else ctx.x
        self.y_aug = torch.cat([ctx.y, ctx.y[sources]])
        self.train_aug = torch.cat([ctx.train_idx, n + torch.arange(
            self.num_synthetic, device=dev)])
        self.sources = sources
        self.graph_aug = augment_adjacency(ctx.graph, sources)
        self.adj = adjacency_operator(self.graph_aug, cfg.resolved_adj_norm)

    def synthetic_features(self, x_round: torch.Tensor) -> torch.Tensor:
        return x_round

    def train_loss(self) -> torch.Tensor:
        out = self(self.x_aug, self.adj)
        return F.cross_entropy(out[self.train_aug], self.y_aug[self.train_aug])

    def predict(self) -> torch.Tensor:
        return self(self.x_aug, self.adj)[: self.ctx.x.shape[0]]

    def info(self) -> dict:
        return {"num_synthetic": self.num_synthetic}


class OverSampling(_InputUpsampling):
    """§2.2: duplicate the tail classes' training nodes with their edges."""

    name = "oversampling"


class Smote(_InputUpsampling):
    """§2.4: synthetic tail nodes interpolating raw features with the nearest same-class
    training node; edges copied from the source only."""

    name = "smote"
    rule = "smote"

    def synthetic_features(self, x_round: torch.Tensor) -> torch.Tensor:
        nn_idx = same_class_nearest_neighbour(x_round)
        return smote_interpolate(x_round, nn_idx, self.ctx.generator,
                                 per_node=self.cfg.smote_lambda == "node")


class EmbedSmote(BaselineMethod):
    """§2.5: SMOTE on the encoder's embeddings every epoch (neighbours from the detached
    embeddings, interpolation differentiable), a Linear classifier on [H; H_new]; the synthetic
    embeddings never pass through the graph."""

    name = "embed_smote"
    uses_tail = True

    def __init__(self, ctx: MethodContext, cfg: BaselineConfig) -> None:
        super().__init__(ctx, cfg)
        self.rounds = upsample_rounds(ctx.y, ctx.train_idx, ctx.num_classes, cfg.im_class_num,
                                      cfg.up_scale, "recon")
        self.num_synthetic = sum(int(r.numel()) for _, r in self.rounds)

    def train_loss(self) -> torch.Tensor:
        c = self.ctx
        h = self.encoder(c.x, self.adj)
        parts, labels = [h[c.train_idx]], [c.y[c.train_idx]]
        for cls, r in self.rounds:
            h_r = h[r]
            parts.append(smote_interpolate(h_r, same_class_nearest_neighbour(h_r), c.generator,
                                           per_node=self.cfg.smote_lambda == "node"))
            labels.append(torch.full((r.numel(),), cls, dtype=torch.long, device=h.device))
        return F.cross_entropy(self.classifier(torch.cat(parts)), torch.cat(labels))

    def info(self) -> dict:
        return {"num_synthetic": self.num_synthetic}


METHODS: dict[str, type[BaselineMethod]] = {
    m.name: m for m in (Origin, Reweight, OverSampling, Smote, EmbedSmote)}


def build_method(ctx: MethodContext, cfg: BaselineConfig) -> BaselineMethod:
    """The baseline ``cfg.method`` (a key of `METHODS`) built for the prepared graph and
    split in ``ctx``; TypeError when ``cfg`` is not a `BaselineConfig`."""
    if not isinstance(cfg, BaselineConfig):
        raise TypeError(f"cfg must be a BaselineConfig, got {type(cfg).__name__}")
    return METHODS[cfg.method](ctx, cfg)
