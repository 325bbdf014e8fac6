"""`BaselineConfig`: the long-tail baselines' hyper-parameters (PROTOCOL_AND_BASELINES.md §1.6, §2).

Defaults are the official harness's (the HierTail copy of the LTE4G baselines) except the learning
rate, which follows the paper's appendix (0.01; the released code's default is 0.001, §1.4) as the
HierTail ``paper`` configuration does. Every choice where the official code and the recommended
fix differ is a field, recorded by `BaselineConfig.to_dict` with whether it is the faithful one.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

# method name -> the fields that method uses (to_dict records only those).
_COMMON = ("hidden", "dropout", "lr", "weight_decay", "adj_norm")
_SMOTE = ("classifier", "im_class_num", "up_scale", "smote_lambda")
METHOD_FIELDS: dict[str, tuple[str, ...]] = {
    "origin": _COMMON + ("classifier",),
    "reweight": _COMMON + ("classifier", "im_class_num", "up_scale"),
    "oversampling": _COMMON + ("classifier", "im_class_num", "up_scale"),
    "smote": _COMMON + ("classifier", "im_class_num", "up_scale", "smote_lambda"),
    "embed_smote": _COMMON + ("classifier", "im_class_num", "up_scale", "smote_lambda"),
    "graphsmote_t": _COMMON + _SMOTE + ("rec_weight",),
    "graphsmote_o": _COMMON + _SMOTE + ("rec_weight", "edge_grad"),
    "graphmixup": _COMMON + ("im_class_num", "up_scale", "dis_nclass", "clu_nclass", "k_num",
                             "dis_weight", "clu_weight", "delta_k", "edge_mode",
                             "pretrain_epochs", "q_start_epoch", "mixup_neighbour",
                             "self_loops"),
    # own official aggregation D^-1(A+I) (no adj_norm), own architecture (no classifier)
    "graphens": ("hidden", "dropout", "lr", "weight_decay", "keep_prob", "pred_temp",
                 "warmup_epochs"),
    "imgagn": ("hidden", "dropout", "lr", "weight_decay", "im_class_num", "disc_steps",
               "gen_ratio", "gen_adv_grad"),
}
# method -> its official defaults where they differ from the dataclass's (§2.8: GraphMixup's
# main.py); a field left at None takes the method's default, else the dataclass's.
METHOD_DEFAULTS: dict[str, dict[str, Any]] = {
    "graphmixup": {"hidden": 128, "dropout": 0.1, "lr": 1e-3, "up_scale": 0.0,
                   "self_loops": False},
    "graphens": {"hidden": 256},      # §2.10
    "imgagn": {"hidden": 128},        # §2.9
}
_GLOBAL_DEFAULTS = {"hidden": 64, "dropout": 0.5, "lr": 0.01, "up_scale": 1.0,
                    "self_loops": True}
DEFAULT_CLASSIFIER = {"embed_smote": "mlp"}   # §2.5: a Linear layer on the embeddings
# hidden size where the method's official code differs from the harness's 64 (§2.8-§2.10)
DEFAULT_HIDDEN = {m: d["hidden"] for m, d in METHOD_DEFAULTS.items() if "hidden" in d}
# field -> (faithful value, what the other values are)
FAITHFUL = {
    "adj_norm": ("none", "none: unnormalised A+I, sum aggregation (the HierTail copy, §1.1); "
                         "row: D^-1(A+I) (LTE4G / HeroLT, recommended)"),
    "edge_grad": (False, "False: the augmented adjacency is detached (HierTail copy, §2.7 (a)); "
                         "True: the node loss reaches the edge generator (paper, --opt_new_G)"),
    "smote_lambda": ("class", "class: one λ ~ U(0,1) per tail class per round (official, §1.5); "
                              "node: one λ per synthetic node (SMOTE / GraphSMOTE papers)"),
    "mixup_neighbour": ("local", "local: the neighbour's index inside the class used as a node "
                                 "id, for its embedding and its edges (GraphMixup's bug, §2.8); "
                                 "global: the neighbour itself (recommended)"),
    "self_loops": (False, "GraphMixup: False: raw A without self-loops (official); "
                          "True: A+I as the other baselines"),
    "gen_adv_grad": (False, "False: the generator's adversarial terms see detached features, "
                            "so only the feature distance trains it (official, §2.9 [BUG]); "
                            "True: they reach the generator (recommended)"),
}
_CHOICES = {"adj_norm": ("none", "row"), "smote_lambda": ("class", "node"),
            "classifier": ("gnn", "mlp"), "edge_mode": ("continuous", "discrete"),
            "mixup_neighbour": ("local", "global")}


@dataclass(frozen=True)
class BaselineConfig:
    """One baseline run's configuration.

    method: one of `METHOD_FIELDS`. hidden: embedding size h (None: 64, the paper's Email / Wiki /
    BlogCatalog size; graphens 256 and imgagn 128, their official codes' sizes).
    dropout: after every ReLU (0.5). lr, weight_decay: Adam (0.01, 5e-4).
    im_class_num: the tail classes are the last ``im_class_num`` labels (3).
    up_scale: synthetic-node rule (§1.5; 1: one per tail training node; 0: up to the average
    class size); re-weighting's tail weight is 1 + up_scale.
    adj_norm: "none" (faithful) or "row" (D^-1(A+I)). smote_lambda: "class" (faithful) or "node".
    classifier: "gnn" (GraphConv + ReLU + dropout + Linear) or "mlp" (Linear); None: the
    method's own (mlp for embed_smote, gnn otherwise; GraphSMOTE: gnn only).
    rec_weight: GraphSMOTE's weight rw of the edge-reconstruction loss (1e-6).
    edge_grad: GraphSMOTE_O only: keep the gradient of the synthetic edge weights (False).
    keep_prob, pred_temp, warmup_epochs: GraphENS (§2.10): the saliency mask keeps
    ⌊F·keep_prob⌋ features (0.01), the prediction temperature τ (2), the epochs of plain mixup
    with copied neighbours before neighbour sampling starts (1).
    disc_steps, gen_ratio, gen_adv_grad: ImGAGN (§2.9): discriminator epochs per generator epoch
    (100, official ``epochs``), generated nodes per tail class = ⌊gen_ratio·max_c n_c⌋ − n_c (1,
    official ``ratio_generated``), adversarial gradient to the generator (False, faithful).
    GraphMixup (`hiertail_fast.baselines.graphmixup`): dis_nclass (6: hop classes 1..5 and
    'far'), clu_nclass (15 parts), k_num (5000 pairs per hop class), dis_weight / clu_weight
    (1, 1), delta_k (0.05: the Q-agent's stopping range), edge_mode ("continuous": P ⊙ M not
    detached; "discrete": 1[P ≥ 0.5], detached), pretrain_epochs (None: min(2010, epochs // 2,
    patience) of the harness's run), q_start_epoch (50: fine-tune epoch where the Q-agent
    starts), mixup_neighbour ("local": official bug; "global"), self_loops (False: raw A).
    hidden / dropout / lr / up_scale / self_loops left at None take the method's official
    default (`METHOD_DEFAULTS`; GraphMixup 128 / 0.1 / 1e-3 / 0 / False), else 64 / 0.5 / 0.01
    / 1 / True.
    """

    method: str = "origin"
    hidden: int = None          # type: ignore[assignment]  # None: METHOD_DEFAULTS, else 64
    dropout: float = None       # type: ignore[assignment]  # None: METHOD_DEFAULTS, else 0.5
    lr: float = None            # type: ignore[assignment]  # None: METHOD_DEFAULTS, else 0.01
    weight_decay: float = 5e-4
    im_class_num: int = 3
    up_scale: float = None      # type: ignore[assignment]  # None: METHOD_DEFAULTS, else 1
    adj_norm: str = "none"
    smote_lambda: str = "class"
    classifier: str | None = None
    rec_weight: float = 1e-6
    edge_grad: bool = False
    # GraphMixup (§2.8; checked in `_check_graphmixup`)
    dis_nclass: int = 6
    clu_nclass: int = 15
    k_num: int = 5000
    dis_weight: float = 1.0
    clu_weight: float = 1.0
    delta_k: float = 0.05
    edge_mode: str = "continuous"
    pretrain_epochs: int | None = None
    q_start_epoch: int = 50
    mixup_neighbour: str = "local"
    self_loops: bool = None     # type: ignore[assignment]  # None: METHOD_DEFAULTS, else True
    keep_prob: float = 0.01
    pred_temp: float = 2.0
    warmup_epochs: int = 1
    disc_steps: int = 100
    gen_ratio: float = 1.0
    gen_adv_grad: bool = False

    def __post_init__(self) -> None:
        if self.method not in METHOD_FIELDS:
            raise ValueError(f"unknown baseline method {self.method!r}; "
                             f"choose from {sorted(METHOD_FIELDS)}")
        for name, default in _GLOBAL_DEFAULTS.items():      # frozen: resolve the None defaults
            if getattr(self, name) is None:
                object.__setattr__(self, name,
                                   METHOD_DEFAULTS.get(self.method, {}).get(name, default))
        for name in ("hidden", "im_class_num", "warmup_epochs", "disc_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an int, got {type(v).__name__}")
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        for name in ("dropout", "lr", "weight_decay", "up_scale", "rec_weight", "keep_prob",
                     "pred_temp", "gen_ratio"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"{name} must be a number, got {type(v).__name__}")
            if not math.isfinite(v):
                raise ValueError(f"{name} must be finite, got {v}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        for name in ("weight_decay", "up_scale", "rec_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name, allowed in _CHOICES.items():
            v = getattr(self, name)
            if v is None and name == "classifier":
                continue
            if v not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {v!r}")
        if self.method == "embed_smote" and self.classifier == "gnn":
            raise ValueError("embed_smote's classifier is a Linear layer on the SMOTE-augmented "
                             "embeddings (§2.5); classifier='gnn' does not apply")
        if not isinstance(self.edge_grad, bool):
            raise TypeError(f"edge_grad must be a bool, got {type(self.edge_grad).__name__}")
        if self.edge_grad and self.method != "graphsmote_o":
            raise ValueError("edge_grad only applies to graphsmote_o (continuous edge weights)")
        if not 0.0 < self.keep_prob <= 1.0:
            raise ValueError(f"keep_prob must lie in (0, 1], got {self.keep_prob}")
        for name in ("pred_temp", "gen_ratio"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not isinstance(self.gen_adv_grad, bool):
            raise TypeError(f"gen_adv_grad must be a bool, got {type(self.gen_adv_grad).__name__}")
        if self.gen_adv_grad and self.method != "imgagn":
            raise ValueError("gen_adv_grad only applies to imgagn (its generator)")
        if self.method.startswith("graphsmote") and self.classifier == "mlp":
            raise ValueError("GraphSMOTE's classifier is always the GNN classifier (§2.6); "
                             "classifier='mlp' does not apply")
        _check_graphmixup(self)

    @property
    def name(self) -> str:
        return self.method

    @property
    def resolved_classifier(self) -> str:
        return self.classifier or DEFAULT_CLASSIFIER.get(self.method, "gnn")

    def replace(self, **changes: Any) -> BaselineConfig:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields the method uses, plus ``faithful``: for every official-vs-fix choice the
        method has, whether this run uses the official code's behaviour, and what each means."""
        d = asdict(self)
        out: dict[str, Any] = {"method": self.method}
        for k in METHOD_FIELDS[self.method]:
            out[k] = self.resolved_classifier if k == "classifier" else d[k]
        out["tail_classes"] = f"the last {self.im_class_num} labels (classes sorted by size)" \
            if "im_class_num" in METHOD_FIELDS[self.method] else None
        out["faithful"] = {k: {"value": d[k], "official": v[0], "is_official": d[k] == v[0],
                               "choices": v[1]}
                           for k, v in FAITHFUL.items() if k in METHOD_FIELDS[self.method]}
        return out


def _check_graphmixup(cfg: BaselineConfig) -> None:
    """GraphMixup's fields (§2.8): types and ranges; its classifier is the GNN classifier."""
    for name in ("dis_nclass", "clu_nclass", "k_num", "q_start_epoch"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if cfg.dis_nclass < 2 or cfg.clu_nclass < 1 or cfg.k_num < 1 or cfg.q_start_epoch < 0:
        raise ValueError("need dis_nclass >= 2 (hop classes 1..dis_nclass-1 and 'far'), "
                         f"clu_nclass >= 1, k_num >= 1, q_start_epoch >= 0; got {cfg.dis_nclass},"
                         f" {cfg.clu_nclass}, {cfg.k_num}, {cfg.q_start_epoch}")
    for name in ("dis_weight", "clu_weight", "delta_k"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name} must be a number, got {type(v).__name__}")
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be finite and >= 0, got {v}")
    p = cfg.pretrain_epochs
    if p is not None and (isinstance(p, bool) or not isinstance(p, int)):
        raise TypeError(f"pretrain_epochs must be an int or None, got {type(p).__name__}")
    if p is not None and p < 0:
        raise ValueError(f"pretrain_epochs must be >= 0, got {p}")
    if not isinstance(cfg.self_loops, bool):
        raise TypeError(f"self_loops must be a bool, got {type(cfg.self_loops).__name__}")
    if cfg.method == "graphmixup" and cfg.classifier == "mlp":
        raise ValueError("GraphMixup's classifier is the GNN classifier (§2.8); "
                         "classifier='mlp' does not apply")
