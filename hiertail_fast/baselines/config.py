"""`BaselineConfig`: the long-tail baselines' hyper-parameters (PROTOCOL_AND_BASELINES.md §1.6, §2).

Defaults are the official harness's (the HierTail copy of the LTE4G baselines; LTE4G's own code for
``lte4g``, §2.11) except the learning rate, which follows the paper's appendix (0.01; the released
code's default is 0.001, §1.4) as the HierTail ``paper`` configuration does. Every choice where the
official code and the recommended fix differ is a field, recorded by `BaselineConfig.to_dict` with
whether it is the faithful one (the official value can depend on the method: LTE4G's code
row-normalises Â, the HierTail copy of the other baselines does not).
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from hiertail_fast._validation import MIN_TEMPERATURE

# method name -> the fields that method uses (to_dict records only those).
_COMMON = ("hidden", "dropout", "lr", "weight_decay", "adj_norm")
_SMOTE = ("classifier", "im_class_num", "up_scale", "smote_lambda")
METHOD_FIELDS: dict[str, tuple[str, ...]] = {
    "origin": _COMMON + ("classifier",),
    "reweight": _COMMON + ("classifier", "im_class_num", "up_scale"),
    "oversampling": _COMMON + ("classifier", "im_class_num", "up_scale"),
    "smote": _COMMON + ("classifier", "im_class_num", "up_scale", "smote_lambda"),
    "embed_smote": _COMMON + ("classifier", "im_class_num", "up_scale", "smote_lambda"),
    "graphsmote_t": _COMMON + _SMOTE + ("rec_weight", "ep_pre"),
    "graphsmote_o": _COMMON + _SMOTE + ("rec_weight", "ep_pre", "edge_grad"),
    "lte4g": _COMMON + ("classifier", "sep_class", "sep_degree", "class_weight", "focal_gamma",
                        "focal_alpha", "focal", "criterion", "prototype_fill", "lr_expert",
                        "expert_ep", "expert_patience", "curriculum_ep", "kd_temperature",
                        "kd_reduction"),
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
    "focal": ("batch", "batch: (1 − p_t)^γ with p_t = exp(−mean CE), one scalar for the batch "
                       "(LTE4G code, §2.11); sample: per-node p_t (the paper's focal loss)"),
    "kd_reduction": ("mean", "mean: KL averaged over every (node, class) element (LTE4G code); "
                             "batchmean: summed over classes, averaged over nodes (the KL)"),
    "prototype_fill": ("official", "official: the similar-node fill runs while len(resources) "
                                   "< gap, resources counting the class's own training nodes "
                                   "(§2.11 (b) quirk); gap: fill what the neighbours left"),
}
# (method, field) -> the official value where it differs from FAITHFUL's.
METHOD_OFFICIAL = {("lte4g", "adj_norm"): "row"}   # LTE4G's embedder: adj_norm_1 = D^-1(A+I)
_CHOICES = {"adj_norm": ("none", "row"), "smote_lambda": ("class", "node"),
            "classifier": ("gnn", "mlp"), "focal": ("batch", "sample"),
            "kd_reduction": ("mean", "batchmean"), "prototype_fill": ("official", "gap"),
            "criterion": ("mean", "median", "max"), "edge_mode": ("continuous", "discrete"),
            "mixup_neighbour": ("local", "global")}
_SEP_CLASS = re.compile(r"pareto_[1-9][1-9]")
# every real-valued field enters float32 tensors (Adam's lr / weight decay, loss weights, class
# weights): beyond float32's range torch raised "value cannot be converted to type float without
# overflow" deep inside the first step
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# temperatures divide float32 logits (GraphENS's τ) or scale the KD loss by T² (LTE4G's T):
# below MIN_TEMPERATURE logits / τ overflow to inf and the softmax to NaN (GraphENS then sampled
# neighbours and saliency masks from NaN silently); T above 1 / MIN_TEMPERATURE leaves KD terms
# that float32 cannot resolve (T = 1e300: T² = inf, a NaN loss)
_MAX_KD_TEMPERATURE = 1.0 / MIN_TEMPERATURE


def _is_default(value: Any, default: Any) -> bool:
    """``value`` is the field's default (a value of a wrong type, a tensor say, is not: its
    own check names it)."""
    if isinstance(value, bool) or isinstance(default, bool):
        return value is default
    if isinstance(value, (int, float)) and isinstance(default, (int, float)):
        return value == default
    return type(value) is type(default) and value == default


@dataclass(frozen=True)
class BaselineConfig:
    """One baseline run's configuration.

    method: one of `METHOD_FIELDS`. hidden: embedding size h (None: 64, the paper's Email / Wiki /
    BlogCatalog size; graphens 256 and imgagn 128, their official codes' sizes).
    dropout: after every ReLU (0.5). lr, weight_decay: Adam (0.01, 5e-4).
    im_class_num: the tail classes are the last ``im_class_num`` labels (3).
    up_scale: synthetic-node rule (§1.5; 1: one per tail training node; 0: up to the average
    class size); re-weighting's tail weight is 1 + up_scale.
    adj_norm: "none" or "row" (D^-1(A+I)); None: the method's official one (row for lte4g, none
    otherwise). smote_lambda: "class" (faithful) or "node".
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
    ep_pre: GraphSMOTE: epochs of edge-generator pre-training (L_rec only, encoder + decoder)
    before the loop (0: HierTail copy / HeroLT; LTE4G's copy: 50, §1.6).

    LTE4G (§2.11; LTE4G ``arg.py`` defaults): sep_class "pareto_XY" (head ≈ X/(X+Y) of the
    classes; "pareto_73"), sep_degree (5: degree ≥ 6 is high), class_weight (True: CE weighted
    1/n_c), focal_gamma γ (1), focal_alpha α (0.6, only without class_weight), focal ("batch"
    official / "sample"), criterion of the prototype fill ("mean"), prototype_fill ("official" /
    "gap"), lr_expert (0.01), expert_ep (1000; also capped at the loop's epochs, as the official
    ``epoch + 1 == args.ep`` test does), expert_patience (300: stop once 300 epochs passed the
    first max), curriculum_ep (500 student epochs, no early stop), kd_temperature T (1),
    kd_reduction ("mean" official / "batchmean").

    GraphMixup (`hiertail_fast.baselines.graphmixup`): dis_nclass (6: hop classes 1..5 and
    'far'), clu_nclass (15 parts), k_num (5000 pairs per hop class), dis_weight / clu_weight
    (1, 1), delta_k (0.05: the Q-agent's stopping range), edge_mode ("continuous": P ⊙ M not
    detached; "discrete": 1[P ≥ 0.5], detached), pretrain_epochs (None: min(2010, epochs // 2)
    of the harness's run; selection and patience over the fine-tune epochs only),
    q_start_epoch (50: fine-tune epoch where the Q-agent starts), mixup_neighbour ("local":
    official bug; "global"), self_loops (False: raw A).
    hidden / dropout / lr / up_scale / self_loops left at None take the method's official
    default (`METHOD_DEFAULTS`; GraphMixup 128 / 0.1 / 1e-3 / 0 / False), else 64 / 0.5 / 0.01
    / 1 / True.
    """

    method: str = "origin"
    hidden: int | None = None           # None: METHOD_DEFAULTS, else 64
    dropout: float | None = None        # None: METHOD_DEFAULTS, else 0.5
    lr: float | None = None             # None: METHOD_DEFAULTS, else 0.01
    weight_decay: float = 5e-4
    im_class_num: int = 3
    up_scale: float | None = None       # None: METHOD_DEFAULTS, else 1
    adj_norm: str | None = None
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
    self_loops: bool | None = None      # None: METHOD_DEFAULTS, else True
    keep_prob: float = 0.01
    pred_temp: float = 2.0
    warmup_epochs: int = 1
    disc_steps: int = 100
    gen_ratio: float = 1.0
    gen_adv_grad: bool = False
    ep_pre: int = 0
    sep_class: str = "pareto_73"
    sep_degree: int = 5
    class_weight: bool = True
    focal_gamma: float = 1.0
    focal_alpha: float = 0.6
    focal: str = "batch"
    criterion: str = "mean"
    prototype_fill: str = "official"
    lr_expert: float = 0.01
    expert_ep: int = 1000
    expert_patience: int = 300
    curriculum_ep: int = 500
    kd_temperature: float = 1.0
    kd_reduction: str = "mean"

    def __post_init__(self) -> None:
        for f in fields(self):                  # numpy scalars as the Python value they hold
            v = getattr(self, f.name)
            if isinstance(v, np.generic):
                object.__setattr__(self, f.name, v.item())
        if not isinstance(self.method, str):
            raise TypeError(f"method must be a str, got {type(self.method).__name__}")
        if self.method not in METHOD_FIELDS:
            raise ValueError(f"unknown baseline method {self.method!r}; "
                             f"choose from {sorted(METHOD_FIELDS)}")
        # another method's option (its raw value, before the defaults resolve): refused, not
        # dropped, once the values themselves are checked (below)
        used = METHOD_FIELDS[self.method]
        own = {**_GLOBAL_DEFAULTS, **METHOD_DEFAULTS.get(self.method, {})}
        unused = [f.name for f in fields(self) if f.name != "method" and f.name not in used
                  and not _is_default(getattr(self, f.name), f.default)
                  # (a resolved default given back, as dataclasses.replace does)
                  and not (f.name in own and _is_default(getattr(self, f.name), own[f.name]))]
        defaulted = []
        for name, default in _GLOBAL_DEFAULTS.items():      # frozen: resolve the None defaults
            if getattr(self, name) is None:
                defaulted.append(name)
                object.__setattr__(self, name,
                                   METHOD_DEFAULTS.get(self.method, {}).get(name, default))
        # which of them were left to the method (not a field: not compared, not recorded);
        # `replace` with another method resolves those again for it
        object.__setattr__(self, "_defaulted", frozenset(defaulted))
        for name, low in (("hidden", 1), ("im_class_num", 1), ("ep_pre", 0), ("sep_degree", 0),
                          ("expert_ep", 1), ("expert_patience", 1), ("curriculum_ep", 1),
                          ("warmup_epochs", 1), ("disc_steps", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an int, got {type(v).__name__}")
            if v < low:
                raise ValueError(f"{name} must be >= {low}, got {v}")
        for name in ("dropout", "lr", "weight_decay", "up_scale", "rec_weight", "focal_gamma",
                     "focal_alpha", "lr_expert", "kd_temperature", "keep_prob", "pred_temp",
                     "gen_ratio"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"{name} must be a number, got {type(v).__name__}")
            if not math.isfinite(v):
                raise ValueError(f"{name} must be finite, got {v}")
            if abs(v) > _FLOAT32_MAX:
                raise ValueError(f"{name}={v} lies outside float32's range (|v| <= "
                                 f"{_FLOAT32_MAX:.4g}), which the training tensors use")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")
        for name in ("lr", "lr_expert", "kd_temperature"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("weight_decay", "up_scale", "rec_weight", "focal_gamma", "focal_alpha"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name, allowed in _CHOICES.items():
            v = getattr(self, name)
            if v is None and name in ("classifier", "adj_norm"):
                continue
            if v not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {v!r}")
        if self.method == "embed_smote" and self.classifier == "gnn":
            raise ValueError("embed_smote's classifier is a Linear layer on the SMOTE-augmented "
                             "embeddings (§2.5); classifier='gnn' does not apply")
        for name in ("edge_grad", "class_weight"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        if not isinstance(self.sep_class, str) or not _SEP_CLASS.fullmatch(self.sep_class):
            raise ValueError("sep_class must be 'pareto_XY' with digits X, Y in 1..9 (head ≈ "
                             f"X/(X+Y) of the classes, LTE4G's 'pareto_73'), got "
                             f"{self.sep_class!r}")
        if self.ep_pre and not self.method.startswith("graphsmote"):
            raise ValueError("ep_pre (edge-generator pre-training) only applies to graphsmote_t "
                             "/ graphsmote_o")
        if self.edge_grad and self.method != "graphsmote_o":
            raise ValueError("edge_grad only applies to graphsmote_o (continuous edge weights)")
        if not 0.0 < self.keep_prob <= 1.0:
            raise ValueError(f"keep_prob must lie in (0, 1], got {self.keep_prob}")
        for name in ("pred_temp", "gen_ratio"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.pred_temp < MIN_TEMPERATURE:
            raise ValueError(f"pred_temp must be >= {MIN_TEMPERATURE:g} (below, logits / τ "
                             f"overflow float32 and the softmax is NaN), got {self.pred_temp}")
        if not MIN_TEMPERATURE <= self.kd_temperature <= _MAX_KD_TEMPERATURE:
            raise ValueError(f"kd_temperature must lie in [{MIN_TEMPERATURE:g}, "
                             f"{_MAX_KD_TEMPERATURE:g}] (outside, logits / T or T² overflow "
                             f"float32), got {self.kd_temperature}")
        if not isinstance(self.gen_adv_grad, bool):
            raise TypeError(f"gen_adv_grad must be a bool, got {type(self.gen_adv_grad).__name__}")
        if self.gen_adv_grad and self.method != "imgagn":
            raise ValueError("gen_adv_grad only applies to imgagn (its generator)")
        if self.method.startswith("graphsmote") and self.classifier == "mlp":
            raise ValueError("GraphSMOTE's classifier is always the GNN classifier (§2.6); "
                             "classifier='mlp' does not apply")
        _check_graphmixup(self)
        # the run would not be the variant asked for, and to_dict leaves the option out of its
        # record (`method="imgagn", adj_norm="none"` ran row-normalised; the CLI refused these
        # already; a baselines audit)
        if unused:
            users = sorted({m for m, fs in METHOD_FIELDS.items() if set(unused) & set(fs)})
            raise ValueError(
                f"{', '.join(f'{k}={getattr(self, k)!r}' for k in unused)}: not an option of "
                f"method {self.method!r} (used by {', '.join(users)})")

    @property
    def name(self) -> str:
        return self.method

    @property
    def resolved_classifier(self) -> str:
        return self.classifier or DEFAULT_CLASSIFIER.get(self.method, "gnn")

    @property
    def resolved_adj_norm(self) -> str:
        return self.adj_norm or official_value(self.method, "adj_norm")

    def replace(self, **changes: Any) -> BaselineConfig:
        """A copy with ``changes``. With another ``method``, the fields this config left to its
        method's default (hidden, dropout, lr, up_scale, self_loops) take the new method's:
        ``BaselineConfig().replace(method="graphmixup")`` is ``BaselineConfig(method=
        "graphmixup")`` (it kept origin's 64 / 0.5 / 0.01 / 1 / True; a baselines audit).
        ``dataclasses.replace`` copies the resolved values as they are."""
        defaulted = getattr(self, "_defaulted", frozenset())
        if changes.get("method", self.method) != self.method:
            for name in defaulted:
                changes.setdefault(name, None)
            return replace(self, **changes)
        # the same method: the copy is built from resolved values; it keeps the record of
        # which were left to the method, less those changed now (a chain of replace calls,
        # .replace(lr=...).replace(method=...), kept the first method's; a review)
        out = replace(self, **changes)
        object.__setattr__(out, "_defaulted", (defaulted - set(changes)) | out._defaulted)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The fields the method uses, plus ``faithful``: for every official-vs-fix choice the
        method has, whether this run uses the official code's behaviour, and what each means."""
        d = asdict(self)
        d["classifier"], d["adj_norm"] = self.resolved_classifier, self.resolved_adj_norm
        out: dict[str, Any] = {"method": self.method}
        for k in METHOD_FIELDS[self.method]:
            out[k] = d[k]
        out["tail_classes"] = f"the last {self.im_class_num} labels (classes sorted by size)" \
            if "im_class_num" in METHOD_FIELDS[self.method] else None
        if self.method == "graphmixup":     # recorded (and part of a run's cache key) since
            out["model_selection"] = "fine-tune epochs only"   # the harness changed on 11-26
        out["faithful"] = {}
        for k, (_, choices) in FAITHFUL.items():
            if k in METHOD_FIELDS[self.method]:
                official = official_value(self.method, k)
                out["faithful"][k] = {"value": d[k], "official": official,
                                      "is_official": d[k] == official, "choices": choices}
        return out


def official_value(method: str, field: str) -> Any:
    """The official code's value of an official-vs-fix field for ``method``."""
    return METHOD_OFFICIAL.get((method, field), FAITHFUL[field][0])


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
        if name != "delta_k" and v > _FLOAT32_MAX:      # loss weights: float32 tensors
            raise ValueError(f"{name}={v} lies outside float32's range (|v| <= "
                             f"{_FLOAT32_MAX:.4g}), which the training tensors use")
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
