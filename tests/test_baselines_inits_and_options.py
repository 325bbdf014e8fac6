"""The baselines' initialisations and command-line options, as PROTOCOL_AND_BASELINES.md §1.5
and the CLI's help state them (a mutation audit, s42: each of these could change without a
test noticing; the section comments say which mutant each test kills)."""
from __future__ import annotations

import math

import pytest
import torch

from hiertail_fast._train_cli import build_parser
from hiertail_fast.baselines.cli import method_config_from_args
from hiertail_fast.baselines.config import BaselineConfig
from hiertail_fast.baselines.graphsmote import Decoder
from hiertail_fast.baselines.layers import Classifier


# ------------------------------------------------------------
# (s42 audit, mutant D03) the baselines' classifier head is initialised as §1.5 says.
#
# PROTOCOL_AND_BASELINES.md §1.5 and `layers.Classifier`'s docstring: "The Linear weight is
# N(0, 0.05²), its bias torch's default". Dropping the ``nn.init.normal_`` line (torch's default
# kaiming-uniform, std 1/√(3·in) ≈ 0.072 for in = 64) left the suite green.
@pytest.mark.parametrize("kind", ["gnn", "mlp"])
@pytest.mark.parametrize("hidden", [16, 64, 256])
def test_classifier_linear_weight_is_normal_with_std_0_05(kind, hidden):
    """6,400+ weights: the sample std within 0.05 ± 0.003 (its standard error is 0.05/√(2·m) ≤
    0.00045: > 6 of them) and the mean within ±0.005; torch's default gives std 1/√(3·hidden)
    (0.144 / 0.072 / 0.036 here), far outside."""
    torch.manual_seed(0)
    clf = Classifier(hidden, 100, 0.5, kind)
    w = clf.linear.weight.detach().double().flatten()
    assert w.numel() == 100 * hidden
    assert abs(float(w.std()) - 0.05) < 0.003
    assert abs(float(w.mean())) < 0.005


# ------------------------------------------------------------
# (s42 audit, mutant D78) the edge generator's W is initialised U(±1/√h).
#
# PROTOCOL_AND_BASELINES.md §1.5: "Decoder (edge generator): a parameter W ∈ ℝ^{h×h},
# initialised U(±1/√h)"; `graphsmote.Decoder`: "W [h, h] initialised U(±1/√h)". A bound of 1/h
# (8x too small at h = 64: P = σ(zzᵀ) starts at ≈ 0.5 everywhere) passed the suite.
@pytest.mark.parametrize("hidden", [16, 64, 128])
def test_decoder_weight_is_uniform_within_one_over_sqrt_h(hidden):
    """h² ≥ 256 weights: all within s = 1/√h, the largest above 0.9 s, the mean square s²/3
    within ±0.1 s² (its standard error is ≤ s²·√(4/45/256) = 0.019 s²), and symmetric about
    0: the smallest below −0.9 s, the mean within ±0.2 s (its standard error is ≤ s/√768 =
    0.036 s; U(0, s) would give 0.5 s)."""
    torch.manual_seed(0)
    w = Decoder(hidden).weight.detach().double().flatten()
    s = 1.0 / math.sqrt(hidden)
    assert w.numel() == hidden * hidden
    assert 0.9 * s < float(w.abs().max()) <= s
    assert abs(float((w * w).mean()) - s * s / 3) < 0.1 * s * s
    assert float(w.min()) < -0.9 * s
    assert abs(float(w.mean())) < 0.2 * s


# ------------------------------------------------------------
# (s42 audit, mutant D57 / D59) every LTE4G command-line option reaches its
# `BaselineConfig` field with the value given.
#
# `hiertail_fast.baselines.cli`: "`method_config_from_args` ... builds the `BaselineConfig`";
# ``--class-weight {on,off}`` is "1/n_c class weights in the encoder's CE (on)", ``--focal
# {batch,sample}`` the focal form. The suite stayed green with ``--class-weight`` inverted (``off``
# ran WITH class weights and vice versa) and with ``--focal`` silently dropped from the options
# forwarded to the config (``--focal sample`` ran the batch focal loss, recorded as batch).
# flag, text, field, value: every value differs from BaselineConfig's default
LTE4G_OPTIONS = [
    ("--sep-class", "pareto_64", "sep_class", "pareto_64"),
    ("--sep-degree", "3", "sep_degree", 3),
    ("--class-weight", "off", "class_weight", False),
    ("--focal-gamma", "2.5", "focal_gamma", 2.5),
    ("--focal-alpha", "0.25", "focal_alpha", 0.25),
    ("--focal", "sample", "focal", "sample"),
    ("--criterion", "median", "criterion", "median"),
    ("--prototype-fill", "gap", "prototype_fill", "gap"),
    ("--lr-expert", "0.02", "lr_expert", 0.02),
    ("--expert-ep", "7", "expert_ep", 7),
    ("--expert-patience", "3", "expert_patience", 3),
    ("--curriculum-ep", "9", "curriculum_ep", 9),
    ("--kd-temperature", "2.0", "kd_temperature", 2.0),
    ("--kd-reduction", "batchmean", "kd_reduction", "batchmean"),
    ("--weight-decay", "0.125", "weight_decay", 0.125),
]


def _cfg(*argv):
    return method_config_from_args(build_parser().parse_args(
        ["--synthetic", "--method", "lte4g", *argv]))


@pytest.mark.parametrize("flag, text, field, value", LTE4G_OPTIONS)
def test_each_lte4g_option_reaches_the_config(flag, text, field, value):
    assert getattr(BaselineConfig(method="lte4g"), field) != value     # the check can tell
    assert getattr(_cfg(flag, text), field) == value


def test_all_lte4g_options_together_and_class_weight_on():
    argv = [a for flag, text, _, _ in LTE4G_OPTIONS for a in (flag, text)]
    cfg = _cfg(*argv)
    assert {f: getattr(cfg, f) for _, _, f, _ in LTE4G_OPTIONS} == \
        {f: v for _, _, f, v in LTE4G_OPTIONS}
    assert _cfg("--class-weight", "on").class_weight is True
    assert _cfg().class_weight is True                      # not given: the default (on)


# ------------------------------------------------------------
# (s42 audit, mutant D58) the shared training options reach a baseline's config.
#
# `hiertail_fast.baselines.cli`: "`method_config_from_args` ... builds the `BaselineConfig` (the
# shared --hidden, --dropout, --lr, --weight-decay override its defaults)". With
# ``weight_decay`` dropped from the forwarded keys, ``--method X --weight-decay 0.125`` trained
# with 5e-4 and recorded 5e-4; the suite (which checks --weight-decay for HierTail's own config
# only) stayed green.
SHARED = [("--hidden", "24", "hidden", 24), ("--dropout", "0.25", "dropout", 0.25),
          ("--lr", "0.05", "lr", 0.05), ("--weight-decay", "0.125", "weight_decay", 0.125)]


@pytest.mark.parametrize("method", ["origin", "graphsmote_o", "graphens", "imgagn", "lte4g",
                                    "graphmixup"])
@pytest.mark.parametrize("flag, text, field, value", SHARED)
def test_shared_option_reaches_the_baseline_config(method, flag, text, field, value):
    assert getattr(BaselineConfig(method=method), field) != value
    cfg = method_config_from_args(build_parser().parse_args(
        ["--synthetic", "--method", method, flag, text]))
    assert getattr(cfg, field) == value
    assert cfg.to_dict()[field] == value                   # and recorded with the run


# every other baseline option reaches its `BaselineConfig` field (method, flag, value given,
# field, value); the store_const flags have no value
METHOD_OPTIONS = [
    ("smote", "--im-class-num", "2", "im_class_num", 2),
    ("smote", "--up-scale", "2.5", "up_scale", 2.5),
    ("smote", "--smote-lambda", "node", "smote_lambda", "node"),
    ("origin", "--adj-norm", "row", "adj_norm", "row"),
    ("oversampling", "--classifier", "mlp", "classifier", "mlp"),
    ("graphsmote_t", "--rec-weight", "0.5", "rec_weight", 0.5),
    ("graphsmote_t", "--ep-pre", "3", "ep_pre", 3),
    ("graphsmote_o", "--edge-grad", None, "edge_grad", True),
    ("graphens", "--keep-prob", "0.5", "keep_prob", 0.5),
    ("graphens", "--pred-temp", "3.0", "pred_temp", 3.0),
    ("graphens", "--warmup-epochs", "4", "warmup_epochs", 4),
    ("imgagn", "--disc-steps", "7", "disc_steps", 7),
    ("imgagn", "--gen-ratio", "0.5", "gen_ratio", 0.5),
    ("imgagn", "--gen-adv-grad", None, "gen_adv_grad", True),
    ("graphmixup", "--self-loops", None, "self_loops", True),
]


@pytest.mark.parametrize("method, flag, text, field, value", METHOD_OPTIONS)
def test_each_baseline_option_reaches_the_config(method, flag, text, field, value):
    """``--method M --option V`` builds M's config with the field set to V (a flag: True) and
    records it in ``to_dict``; the option left out keeps the default."""
    assert getattr(BaselineConfig(method=method), field) != value
    argv = ["--synthetic", "--method", method, flag] + ([text] if text is not None else [])
    cfg = method_config_from_args(build_parser().parse_args(argv))
    assert getattr(cfg, field) == value and cfg.to_dict()[field] == value
    plain = method_config_from_args(build_parser().parse_args(["--synthetic", "--method",
                                                               method]))
    assert plain == BaselineConfig(method=method)
