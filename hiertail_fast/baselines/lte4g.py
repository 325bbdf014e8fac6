"""LTE4G (Yun et al., CIKM'22) as its official code runs it (PROTOCOL_AND_BASELINES.md §2.11), on
the harness's one loop, in O(n·d + |E|) memory.

Stages and how they map onto the harness (`hiertail_fast.baselines.harness`):

0. At build: head/tail classes (`head_tail_split`, ``sep_class``), degrees and the training
   nodes of the four class × degree subsets HH, HT, TH, TT (`group_train_nodes`).
1. Encoder pre-training = the harness's loop: ``train_loss`` is the focal, 1/n_c-weighted CE of
   ``classifier_og`` (a GNN classifier, or Linear with ``classifier="mlp"``) on the encoder;
   ``predict`` its logits. The loop's ``--epochs`` / ``--patience`` / val-Macro-F1 selection are
   the official ``ep`` / ``ep_early`` / best-encoder rule (the same rule as every method).
2.–4. ``after_fit`` (the loop's best state loaded; encoder frozen, eval mode):
   2. class prototypes and routing (`class_prototypes`, `route_to_tail`);
   3. experts, each a GNN classifier on the frozen embeddings over its class block (head:
      sep_point outputs; tail: C − sep_point, labels shifted): HH and TH from their init, HT from
      the best HH, TT from the best TH; Adam(lr_expert, weight_decay), up to
      min(expert_ep, loop epochs) epochs (the official loop also stops at ``ep``), selected on
      the val nodes of their subset (true labels), stopped once ``expert_patience`` epochs
      passed the first max;
   4. students H and T (fresh GNN classifiers): exactly ``curriculum_ep`` epochs of CE on the
      group's training nodes + α(e)·KD(head-degree expert) + (1 − α(e))·KD(tail-degree
      expert), each KD on its expert's training nodes, α(e) = cos(eπ / (2·curriculum_ep));
      selected on the group's val nodes. Each term draws its own dropout mask (the official code
      runs the student three times).
   Stages 3–4 use the harness's `fit_early_stopping` (same ties rule: the last epoch at the
   max is kept); ``info()`` records each expert's and student's epochs.
5. ``predict`` afterwards: −999999 everywhere except the routed group's class block, which holds
   that student's logits (the official inference; here for every node, so validation too).

Deviations, all where the official code cannot run as released or breaks: an expert whose
subset has no training node is not trained (official: the mean CE of nothing is NaN, which
poisons its weights, and the copies and students made from them) and a KD term over no node is
0; a class with no resource gets a zero centroid; a "pareto" split with no head class is raised
to one head class. The official code computes the n×n feature-cosine matrix once per class and
dense n×n adjacency copies (degrees, neighbours, D⁻¹A); here degrees and neighbours come from
the CSR entries, D⁻¹(A+I) is sparse, and only the centres' cosine rows are formed, in blocks
(`similar_nodes`). Not offered: LTE4G's optional edge reconstruction (``rec``, off by default)
and its own ``split_natural`` (the harness's split is HierTail's, §1.2).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hiertail_fast.baselines.config import BaselineConfig
from hiertail_fast.baselines.layers import Classifier
from hiertail_fast.baselines.lte4g_steps import (
    GROUPS,
    class_prototypes,
    curriculum_alpha,
    distillation_loss,
    focal_loss,
    group_eval_nodes,
    group_train_nodes,
    head_tail_split,
    node_degrees,
    route_to_tail,
)
from hiertail_fast.baselines.methods import METHODS, BaselineMethod, MethodContext
from hiertail_fast.metrics import macro_f1
from hiertail_fast.train import (  # the loop's own selection rule and prediction
    fit_early_stopping,
    predicted_classes,
)

_MASKED = -999999.0   # official logit outside the routed group's class block


class LTE4G(BaselineMethod):
    """§2.11 LTE4G; see the module docstring for the stages."""

    name = "lte4g"
    head_first = True

    def __init__(self, ctx: MethodContext, cfg: BaselineConfig) -> None:
        super().__init__(ctx, cfg)      # encoder, classifier (= classifier_og), Â
        c = ctx.num_classes
        counts = torch.bincount(ctx.y[ctx.train_idx], minlength=c)
        # w_c = 1/n_c (a class without training nodes weighs nothing instead of inf)
        weight = torch.where(counts > 0, 1.0 / counts.clamp_min(1).float(),
                             torch.zeros(c, device=counts.device))
        self.register_buffer("class_weight", weight)
        self.sep_point = head_tail_split(counts.tolist(), cfg.sep_class, ctx.generator)
        self.degrees = node_degrees(ctx.graph)
        self.train_groups = group_train_nodes(ctx.train_idx, ctx.y, self.sep_point,
                                              self.degrees, cfg.sep_degree, ctx.generator)
        h, p = cfg.hidden, cfg.dropout
        width = {"H": self.sep_point, "T": c - self.sep_point}
        self.experts = nn.ModuleDict({g: Classifier(h, width[g[0]], p) for g in GROUPS})
        self.students = nn.ModuleDict({g: Classifier(h, width[g], p) for g in ("H", "T")})
        self.register_buffer("centroids", torch.zeros(c, h))
        self.register_buffer("routed", torch.zeros((), dtype=torch.bool))
        self.stage_log: dict = {}

    # ------------------------------------------------------------------ stage 1 (the loop)
    def train_loss(self) -> torch.Tensor:
        c, cfg = self.ctx, self.cfg
        logits = self(c.x, self.adj)[c.train_idx]
        return focal_loss(logits, c.y[c.train_idx],
                          self.class_weight if cfg.class_weight else None,
                          cfg.focal_gamma, cfg.focal_alpha, cfg.focal)

    def predict(self) -> torch.Tensor:
        c = self.ctx
        embed = self.encoder(c.x, self.adj)
        if not bool(self.routed):
            return self.classifier(embed, self.adj)
        tail = route_to_tail(embed, self.centroids, self.sep_point)
        out = torch.full((c.x.shape[0], c.num_classes), _MASKED, dtype=embed.dtype,
                         device=embed.device)
        out[~tail, :self.sep_point] = self.students["H"](embed, self.adj)[~tail]
        out[tail, self.sep_point:] = self.students["T"](embed, self.adj)[tail]
        return out

    # ------------------------------------------------------------------ stages 2-4
    def after_fit(self, val_idx: torch.Tensor, *, epochs: int, progress: bool = False) -> None:
        c, cfg = self.ctx, self.cfg
        self.eval()
        with torch.no_grad():
            embed = self.encoder(c.x, self.adj)
            prob = torch.softmax(self.classifier(embed, self.adj), dim=1)
            self.centroids.copy_(class_prototypes(embed, prob, c.x, c.graph, c.y, c.train_idx,
                                                  c.num_classes, cfg.criterion,
                                                  cfg.prototype_fill))
        val_groups = group_eval_nodes(val_idx, c.y, self.sep_point, self.degrees,
                                      cfg.sep_degree)
        log: dict = {"sep_point": self.sep_point, "experts": {}, "students": {}}
        for g in GROUPS:
            expert = self.experts[g]
            if g[1] == "T":      # the low-degree expert starts from the best high-degree one
                expert.load_state_dict(self.experts[g[0] + "H"].state_dict())
            log["experts"][g] = self._fit_expert(g, expert, embed, val_groups[g], epochs,
                                                 progress)
        for g in ("H", "T"):
            log["students"][g] = self._fit_student(g, embed, val_groups, progress)
        with torch.no_grad():
            tail = route_to_tail(embed, self.centroids, self.sep_point)
        log["routed_to_tail"] = int(tail.sum())
        self.routed.fill_(True)
        self.stage_log = log

    def _shift(self, group: str) -> int:
        return self.sep_point if group[0] == "T" else 0

    def _selection(self, module: nn.Module, embed, val_nodes: torch.Tensor, shift: int):
        y_val = (self.ctx.y[val_nodes] - shift).cpu()

        def val_f1() -> float:       # official: 0 when the subset has no val node
            if val_nodes.numel() == 0:
                return 0.0
            module.eval()
            with torch.no_grad():
                pred = predicted_classes(module(embed, self.adj)[val_nodes]).cpu()
            return macro_f1(y_val, pred)
        return val_f1

    def _fit(self, module, step, val_f1, epochs: int, patience: int, progress: bool,
             desc: str) -> dict:
        cfg = self.cfg
        opt = torch.optim.Adam(module.parameters(), lr=cfg.lr_expert,
                               weight_decay=cfg.weight_decay)
        fit = fit_early_stopping(module, opt, step, val_f1, epochs=epochs, patience=patience,
                                 progress=progress, desc=desc, device=self.ctx.x.device)
        module.load_state_dict(fit.best_state)
        return {"epochs_run": fit.epochs_run, "best_epoch": fit.best_epoch}

    def _fit_expert(self, g: str, expert: nn.Module, embed, val_nodes, epochs: int,
                    progress: bool) -> dict:
        nodes = self.train_groups[g]
        shift = self._shift(g)
        rec = {"train_nodes": int(nodes.numel()), "val_nodes": int(val_nodes.numel())}
        if nodes.numel() == 0:       # official: NaN loss; here the expert stays as it starts
            return {**rec, "epochs_run": 0, "best_epoch": None}
        target = self.ctx.y[nodes] - shift

        def step():
            loss = F.cross_entropy(expert(embed, self.adj)[nodes], target)
            return loss, loss
        # official: stop when epoch − max_idx >= expert_patience, i.e. "> expert_patience − 1"
        return {**rec, **self._fit(expert, step, self._selection(expert, embed, val_nodes, shift),
                                   min(self.cfg.expert_ep, epochs), self.cfg.expert_patience - 1,
                                   progress, f"lte4g expert {g}")}

    def distillation_targets(self, g: str, embed: torch.Tensor) -> dict[str, torch.Tensor]:
        """The eval-mode logits of group g's two best experts on their own training nodes
        (the official teachers run in eval mode; their outputs carry no gradient here)."""
        out = {}
        with torch.no_grad():
            for d in ("H", "T"):
                teacher = self.experts[g + d]
                teacher.eval()
                out[d] = teacher(embed, self.adj)[self.train_groups[g + d]]
        return out

    def _fit_student(self, g: str, embed, val_groups, progress: bool) -> dict:
        cfg, student = self.cfg, self.students[g]
        shift = self._shift(g)
        head_deg, tail_deg = self.train_groups[g + "H"], self.train_groups[g + "T"]
        nodes = torch.cat([head_deg, tail_deg])
        target = self.ctx.y[nodes] - shift
        teach = self.distillation_targets(g, embed)
        val_nodes = torch.cat([val_groups[g + "H"], val_groups[g + "T"]])
        epoch = [0]

        def step():
            alpha = curriculum_alpha(epoch[0], cfg.curriculum_ep)
            epoch[0] += 1
            kd_head = distillation_loss(student(embed, self.adj)[head_deg], teach["H"],
                                        cfg.kd_temperature, cfg.kd_reduction)
            kd_tail = distillation_loss(student(embed, self.adj)[tail_deg], teach["T"],
                                        cfg.kd_temperature, cfg.kd_reduction)
            out = student(embed, self.adj)[nodes]
            ce = F.cross_entropy(out, target) if nodes.numel() else out.sum() * 0.0
            loss = ce + alpha * kd_head + (1 - alpha) * kd_tail
            return loss, loss
        return {"train_nodes": int(nodes.numel()), "val_nodes": int(val_nodes.numel()),
                **self._fit(student, step, self._selection(student, embed, val_nodes, shift),
                            cfg.curriculum_ep, cfg.curriculum_ep, progress,
                            f"lte4g student {g}")}

    def info(self) -> dict:
        groups = {g: int(t.numel()) for g, t in self.train_groups.items()}
        return {"sep_point": self.sep_point, "train_groups": groups,
                "stages": {"encoder": "the harness loop (epochs, patience, val Macro-F1)",
                           **self.stage_log}}


METHODS[LTE4G.name] = LTE4G
