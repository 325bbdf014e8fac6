"""The baselines' command-line options for ``python -m hiertail_fast.train --method NAME``.

`add_method_arguments` adds ``--method`` and the baseline options to the trainer's parser;
`method_config_from_args` checks that no option of the other kind was given and builds the
`BaselineConfig` (the shared --hidden, --dropout, --lr, --weight-decay override its defaults).
"""
from __future__ import annotations

import argparse
from typing import Any

from hiertail_fast._argparse import exact_int
from hiertail_fast.baselines.config import METHOD_FIELDS, BaselineConfig
from hiertail_fast.baselines.methods import METHODS

# HierTail-only options (argparse dest -> flag) and their "not given" values.
_HIERTAIL_ONLY = {"gamma": ("--gamma", None), "tau": ("--tau", None),
                  "augment_a2": ("--augment-a2", None),
                  "fix_cluster_labels": ("--fix-cluster-labels", False),
                  "compound_pool_bug": ("--compound-pool-bug", False),
                  "loss_backend": ("--loss-backend", None), "config": ("--config", None)}
_BASELINE_ONLY = {"im_class_num": "--im-class-num", "up_scale": "--up-scale",
                  "adj_norm": "--adj-norm", "smote_lambda": "--smote-lambda",
                  "classifier": "--classifier", "rec_weight": "--rec-weight",
                  "edge_grad": "--edge-grad",
                  "keep_prob": "--keep-prob", "pred_temp": "--pred-temp",
                  "warmup_epochs": "--warmup-epochs",
                  "disc_steps": "--disc-steps", "gen_ratio": "--gen-ratio",
                  "gen_adv_grad": "--gen-adv-grad",
                  "ep_pre": "--ep-pre",
                  "sep_class": "--sep-class", "sep_degree": "--sep-degree",
                  "class_weight": "--class-weight", "focal_gamma": "--focal-gamma",
                  "focal_alpha": "--focal-alpha", "focal": "--focal",
                  "criterion": "--criterion", "prototype_fill": "--prototype-fill",
                  "lr_expert": "--lr-expert", "expert_ep": "--expert-ep",
                  "expert_patience": "--expert-patience", "curriculum_ep": "--curriculum-ep",
                  "kd_temperature": "--kd-temperature", "kd_reduction": "--kd-reduction",
                  # graphmixup (§2.8)
                  "dis_nclass": "--dis-nclass", "clu_nclass": "--clu-nclass",
                  "k_num": "--k-num", "dis_weight": "--dis-weight",
                  "clu_weight": "--clu-weight", "delta_k": "--delta-k",
                  "edge_mode": "--edge-mode", "pretrain_epochs": "--pretrain-epochs",
                  "q_start_epoch": "--q-start-epoch", "mixup_neighbour": "--mixup-neighbour",
                  "self_loops": "--self-loops"}


def add_method_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("method (baselines: PROTOCOL_AND_BASELINES.md §2)")
    g.add_argument("--method", choices=("hiertail", *METHODS), default="hiertail",
                   help="hiertail (default) or a baseline on the same loop")
    g.add_argument("--im-class-num", type=exact_int, help="baselines: tail = the last N labels (3)")
    g.add_argument("--up-scale", type=float, help="baselines: synthetic-node rule (1, "
                   "graphmixup 0; 0 = up to the average class size; embed_smote / graphsmote_t "
                   "/ _o make one round at most, so values above 1 act as 1, as in the official "
                   "code); reweight: the tail classes' loss weight is 1 + up_scale (0: no "
                   "re-weighting)")
    g.add_argument("--adj-norm", choices=("none", "row"), help="baselines: none = unnormalised "
                   "A+I (official HierTail copy, default; lte4g: row, its official code; "
                   "graphmixup: its raw A, without self-loops unless --self-loops), row = "
                   "D^-1(A+I) (recommended fix; graphmixup: D^-1 A); graphens and imgagn "
                   "aggregate with their own D^-1(A+I)")
    g.add_argument("--smote-lambda", choices=("class", "node"), help="smote / embed_smote / "
                   "graphsmote_t / _o: one λ per class per round (official, default) or per "
                   "synthetic node")
    g.add_argument("--classifier", choices=("gnn", "mlp"), help="baselines: GraphConv + Linear "
                   "(gnn, default) or Linear (mlp; embed_smote's only choice)")
    g.add_argument("--rec-weight", type=float, help="graphsmote_t / _o: weight of the edge "
                   "reconstruction loss (1e-6)")
    g.add_argument("--edge-grad", action="store_const", const=True, help="graphsmote_o: the "
                   "node loss reaches the edge generator (paper; the HierTail copy detaches)")
    g.add_argument("--keep-prob", type=float, help="graphens: share of the features the "
                   "saliency mask takes from the source (0.01)")
    g.add_argument("--pred-temp", type=float, help="graphens: prediction temperature (2)")
    g.add_argument("--warmup-epochs", type=exact_int, help="graphens: epochs of plain mixup "
                   "with the source's neighbours before neighbour sampling (1)")
    g.add_argument("--disc-steps", type=exact_int, help="imgagn: discriminator epochs per "
                   "generator epoch (100)")
    g.add_argument("--gen-ratio", type=float, help="imgagn: generated nodes per tail class = "
                   "floor(ratio * largest training class) - n_c (1)")
    g.add_argument("--gen-adv-grad", action="store_const", const=True, help="imgagn: the "
                   "adversarial terms reach the generator (fix; the official code detaches)")
    g.add_argument("--ep-pre", type=exact_int, help="graphsmote_t / _o: edge-generator "
                   "pre-training epochs before the loop (0: HierTail copy; LTE4G's copy: 50)")
    t = parser.add_argument_group("lte4g (PROTOCOL_AND_BASELINES.md §2.11; LTE4G's defaults)")
    t.add_argument("--sep-class", help="head/tail classes: pareto_XY (pareto_73)")
    t.add_argument("--sep-degree", type=exact_int, help="degree >= this + 1 is high (5)")
    t.add_argument("--class-weight", choices=("on", "off"), help="1/n_c class weights in the "
                   "encoder's CE (on)")
    t.add_argument("--focal-gamma", type=float, help="focal γ (1)")
    t.add_argument("--focal-alpha", type=float, help="focal α without class weights (0.6)")
    t.add_argument("--focal", choices=("batch", "sample"), help="batch-level p_t (official, "
                   "default) or per-node p_t (the paper's focal loss)")
    t.add_argument("--criterion", choices=("mean", "median", "max"), help="prototype fill "
                   "target (mean)")
    t.add_argument("--prototype-fill", choices=("official", "gap"), help="similar-node fill: "
                   "official quirk (default) or the gap the neighbours left")
    t.add_argument("--lr-expert", type=float, help="experts' and students' lr (0.01)")
    t.add_argument("--expert-ep", type=exact_int, help="expert epochs (1000; capped at --epochs)")
    t.add_argument("--expert-patience", type=exact_int, help="expert early stop (300)")
    t.add_argument("--curriculum-ep", type=exact_int, help="student epochs (500)")
    t.add_argument("--kd-temperature", type=float, help="distillation temperature T (1)")
    t.add_argument("--kd-reduction", choices=("mean", "batchmean"), help="KL over elements "
                   "(official, default) or over nodes")

    add_graphmixup_arguments(g)


def add_graphmixup_arguments(g) -> None:
    """GraphMixup's options (§2.8; defaults in `BaselineConfig`)."""
    g.add_argument("--dis-nclass", type=exact_int, help="graphmixup: local-path classes (6: hops "
                   "1..5 and far)")
    g.add_argument("--clu-nclass", type=exact_int, help="graphmixup: global-path parts (15)")
    g.add_argument("--k-num", type=exact_int, help="graphmixup: pairs per hop class (5000)")
    g.add_argument("--dis-weight", type=float, help="graphmixup: local-path loss weight (1)")
    g.add_argument("--clu-weight", type=float, help="graphmixup: global-path loss weight (1)")
    g.add_argument("--delta-k", type=float, help="graphmixup: Q-agent stops when the last 20 "
                   "k span <= this (0.05)")
    g.add_argument("--edge-mode", choices=("continuous", "discrete"), help="graphmixup: "
                   "synthetic edge weights P (official) or 1[P >= 0.5]")
    g.add_argument("--pretrain-epochs", type=exact_int, help="graphmixup: pre-training epochs "
                   "(default min(2010, epochs // 2); selection over the fine-tune epochs)")
    g.add_argument("--q-start-epoch", type=exact_int, help="graphmixup: fine-tune epoch where the "
                   "Q-agent starts (50)")
    g.add_argument("--mixup-neighbour", choices=("local", "global"), help="graphmixup: the "
                   "official local-index bug (default) or the real neighbour")
    g.add_argument("--self-loops", action="store_const", const=True, help="graphmixup: A+I "
                   "instead of the official raw A")

def method_config_from_args(args: argparse.Namespace) -> BaselineConfig | None:
    """None for ``--method hiertail`` (after checking no baseline option was given), else the
    baseline's config. Raises ValueError naming any option that does not apply."""
    if args.method == "hiertail":
        bad = [flag for dest, flag in _BASELINE_ONLY.items() if getattr(args, dest) is not None]
        if bad:
            raise ValueError(f"{', '.join(bad)}: only for a baseline --method")
        return None
    bad = [flag for dest, (flag, unset) in _HIERTAIL_ONLY.items()
           if getattr(args, dest, unset) != unset]
    if bad:
        raise ValueError(f"{', '.join(bad)}: only for --method hiertail")
    # another baseline's option: refused, not dropped (the run would not be the variant asked
    # for; `--method origin --k-num 5` ran plain origin, recorded without k_num)
    bad = [flag for dest, flag in _BASELINE_ONLY.items()
           if getattr(args, dest) is not None and dest not in METHOD_FIELDS[args.method]]
    if bad:
        users = sorted({m for dest, flag in _BASELINE_ONLY.items() if flag in bad
                        for m, used in METHOD_FIELDS.items() if dest in used})
        raise ValueError(f"{', '.join(bad)}: not an option of --method {args.method} (used by "
                         f"{', '.join(users)})")
    over: dict[str, Any] = {k: getattr(args, k)
                            for k in ("hidden", "dropout", "lr", "weight_decay", *_BASELINE_ONLY)
                            if getattr(args, k) is not None}
    if "class_weight" in over:
        over["class_weight"] = over["class_weight"] == "on"
    return BaselineConfig(method=args.method, **over)
