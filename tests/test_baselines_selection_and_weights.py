"""Baselines: train / validation / test separation, loss weights, documented defaults and LTE4G's
stage schedule (PROTOCOL_AND_BASELINES.md §1.6, §2). Every method trains on the split's training
nodes only (its training never sees a validation or test label, its selection never a test
label); the re-weighted losses equal independent float64 formulas; the defaults are the
documented ones; LTE4G's experts and students are selected on the validation nodes, stopped,
weighted and distilled as §2.11 states. Written after a mutation audit: a bug in any of these
left the suite green."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

import hiertail_fast.train as train_mod
from hiertail_fast.baselines import METHODS, BaselineConfig, MethodContext, build_method, harness
from hiertail_fast.baselines import lte4g as lte4g_mod
from hiertail_fast.baselines.config import METHOD_FIELDS
from hiertail_fast.baselines.layers import GraphConv
from hiertail_fast.baselines.lte4g_steps import GROUPS
from hiertail_fast.baselines.sampling import upsample_rounds
from hiertail_fast.data.synthetic import make_synthetic_graph
from hiertail_fast.nn.hiertail import prepare_graph

pytestmark = pytest.mark.usefixtures("one_thread")

TRAIN = (10, 7, 5, 4, 3)     # training nodes per class (labels sorted by size)
VAL = (6, 4, 3, 3, 3)        # |train| 29, |val| 19, |test| 102: three different sizes
SEP_POINT = 3                # pareto_73 on TRAIN: ⌊5·0.7⌋ = 3, cut 4; "≥ 4" 4/1, "> 4" 3/2 wins


@pytest.fixture(scope="module")
def graph_data():
    g = make_synthetic_graph(150, num_classes=5, avg_degree=6, num_features=8,
                             head_fraction=0.4, head_mass=0.6, seed=0)   # sizes 57 33 24 19 17
    split = []
    for c, (t, v) in enumerate(zip(TRAIN, VAL, strict=True)):
        nodes = torch.nonzero(g.y == c).flatten()
        split.append((nodes[:t], nodes[t:t + v], nodes[t + v:]))
    train, val, test = (torch.cat(p) for p in zip(*split, strict=True))
    return g, prepare_graph(g.edge_index, g.num_nodes), (train, val, test)


def _ctx(g, graph, train, val, seed=0):
    return MethodContext(g.x, g.y, graph, train, g.num_classes,
                         torch.Generator().manual_seed(seed), val_idx=val)


def _ce64(logits, y, weight=None) -> float:
    """Σ w_{y_i}·(−log softmax(z_i)[y_i]) / Σ w_{y_i} in float64 (w = 1: the mean)."""
    nll = -torch.log_softmax(logits.detach().double(), 1)[torch.arange(y.numel()), y]
    w = torch.ones_like(nll) if weight is None else torch.as_tensor(weight).double()[y]
    return float((w * nll).sum() / w.sum())


def _permuted(y, nodes, seed):
    """y with the labels of ``nodes`` shuffled among them (a third of them at least move)."""
    perm = torch.randperm(nodes.numel(), generator=torch.Generator().manual_seed(seed))
    out = y.clone()
    out[nodes] = y[nodes[perm]]
    assert int((out != y).sum()) >= nodes.numel() // 3
    return out


# ----------------------------------------------------------------------------- separation
_TINY = {"lte4g": dict(curriculum_ep=3), "imgagn": dict(disc_steps=1)}
_TIMES = ("time_per_epoch_s", "train_step_s", "eval_s")


def _recorded_run(monkeypatch, data, split, method):
    """train_baseline (3 epochs) with the method's MethodContext and the loop's per-epoch
    training losses recorded."""
    contexts, losses = [], []

    def context(*args, **kwargs):
        contexts.append(MethodContext(*args, **kwargs))
        return contexts[-1]

    def fit(model, opt, step, val_f1, **kwargs):
        def recorded():
            loss, scalar = step()
            losses.append(float(scalar.detach()))
            return loss, scalar
        return train_mod.fit_early_stopping(model, opt, recorded, val_f1, **kwargs)

    monkeypatch.setattr(harness, "MethodContext", context)
    monkeypatch.setattr(harness, "fit_early_stopping", fit)
    cfg = BaselineConfig(method=method, hidden=8, **_TINY.get(method, {}))
    res = harness.train_baseline(data, split, cfg, epochs=3, seed=0, progress=False)
    return res, contexts, losses


@pytest.mark.parametrize("method", sorted(METHODS))
def test_training_and_selection_see_no_label_outside_their_nodes(graph_data, monkeypatch,
                                                                 method):
    """The method gets exactly the split's training nodes (and its validation nodes as such);
    shuffling the TEST labels among the test nodes changes nothing but the test metrics
    (losses, selected epochs, validation metrics, LTE4G's stage logs); shuffling the
    VALIDATION labels leaves every training step's loss unchanged (they only select). A
    mutation audit: training on train + val, a base loss over train + val, or LTE4G's
    after-fit stages selecting on the test nodes all passed the suite."""
    g, _, (train, val, test) = graph_data
    base, contexts, losses = _recorded_run(monkeypatch, g, (train, val, test), method)
    assert len(contexts) == 1 and len(losses) == 3
    assert torch.equal(contexts[0].train_idx, train) and torch.equal(contexts[0].val_idx, val)

    def selection(res):
        return {k: v for k, v in res.items() if k not in _TIMES + ("test", "test_per_class")}
    moved, _, losses_test = _recorded_run(
        monkeypatch, replace(g, y=_permuted(g.y, test, 1)), (train, val, test), method)
    assert losses_test == losses
    assert selection(moved) == selection(base)
    _, _, losses_val = _recorded_run(
        monkeypatch, replace(g, y=_permuted(g.y, val, 2)), (train, val, test), method)
    assert losses_val == losses


def test_lte4g_experts_and_students_count_the_validation_nodes(graph_data):
    """The experts and students are selected on the validation nodes of their subset (true
    class group × degree, the official ``separate_eval``): per subset the count of validation
    nodes with label < sep_point (head) or not and degree ≥ sep_degree + 1 = 6 (high) or not,
    the degree being the column sum of the binarised A + I; they add up to |val| (19, not
    |train| 29 or |test| 102). A mutation audit: selecting on the test or training nodes
    passed the suite."""
    g, _, (train, val, test) = graph_data
    cfg = BaselineConfig(method="lte4g", hidden=8, curriculum_ep=3)
    res = harness.train_baseline(g, (train, val, test), cfg, epochs=3, seed=0, progress=False)
    n = g.num_nodes
    a = torch.zeros(n, n)
    a[g.edge_index[0], g.edge_index[1]] = 1.0
    deg = (a + torch.eye(n) != 0).sum(0)[val]
    tail, high = g.y[val] >= SEP_POINT, deg >= 6
    want = {"HH": ~tail & high, "HT": ~tail & ~high, "TH": tail & high, "TT": tail & ~high}
    want = {k: int(v.sum()) for k, v in want.items()}
    assert res["sep_point"] == SEP_POINT and min(want.values()) > 0
    stages = res["stages"]
    assert {k: e["val_nodes"] for k, e in stages["experts"].items()} == want
    assert sum(want.values()) == val.numel()
    assert stages["students"]["H"]["val_nodes"] == want["HH"] + want["HT"]
    assert stages["students"]["T"]["val_nodes"] == want["TH"] + want["TT"]


# ----------------------------------------------------------------------------- loss weights
def test_origin_and_reweight_losses_are_the_documented_cross_entropies(graph_data):
    """Origin: the mean CE over the training nodes (§2.1), not over training + validation;
    re-weighting: CE weighted 1 + up_scale on the last im_class_num labels, 1 elsewhere
    (§2.3, PyTorch's weighted mean), here 2.5 on classes 3 and 4. Float64 recomputations from
    the models' own logits (dropout 0). A mutation audit: both mutants passed the suite."""
    g, graph, (train, val, _) = graph_data
    ctx = _ctx(g, graph, train, val)
    origin = build_method(ctx, BaselineConfig(method="origin", hidden=8, dropout=0.0))
    z = origin(g.x, origin.adj)
    want = _ce64(z[train], g.y[train])
    assert float(origin.train_loss().detach()) == pytest.approx(want, rel=1e-5)
    both = torch.cat([train, val])
    assert abs(_ce64(z[both], g.y[both]) - want) > 1e-3 * want      # the check can tell
    rw = build_method(ctx, BaselineConfig(method="reweight", hidden=8, dropout=0.0,
                                          im_class_num=2, up_scale=1.5))
    z = rw(g.x, rw.adj)[train]
    want = _ce64(z, g.y[train], [1.0, 1.0, 1.0, 2.5, 2.5])
    assert float(rw.train_loss().detach()) == pytest.approx(want, rel=1e-5)
    assert abs(_ce64(z, g.y[train]) - want) > 1e-3 * want


@pytest.mark.parametrize("method", ["oversampling", "smote"])
def test_upsampling_loss_covers_training_and_synthetic_nodes(graph_data, method):
    """Over-sampling / SMOTE: the CE runs over the training nodes AND the synthetic ones
    (rows n.., labelled as their sources, the up_scale-rule rounds of §1.5: one per tail
    training node at up_scale 1, 4 + 3 here). A mutation audit: leaving the synthetic nodes
    out of the loss passed the suite."""
    g, graph, (train, val, _) = graph_data
    m = build_method(_ctx(g, graph, train, val),
                     BaselineConfig(method=method, hidden=8, dropout=0.0, im_class_num=2))
    rounds = upsample_rounds(g.y, train, 5, 2, 1.0, METHODS[method].rule)
    sources = torch.cat([r for _, r in rounds])
    n, s = g.num_nodes, sources.numel()
    assert s == TRAIN[3] + TRAIN[4] == m.num_synthetic
    z = m(m.x_aug, m.adj)
    rows = torch.cat([train, n + torch.arange(s)])
    want = _ce64(z[rows], torch.cat([g.y[train], g.y[sources]]))
    assert float(m.train_loss().detach()) == pytest.approx(want, rel=1e-5)
    assert abs(_ce64(z[train], g.y[train]) - want) > 1e-3 * want


def test_lte4g_encoder_loss_weights_classes_by_one_over_their_training_count(graph_data):
    """LTE4G's encoder loss (class_weight=True, focal "batch", γ = 1): w_c = 1/n_c with n_c
    the class's training count, L = (1 − exp(−CE))^γ · Σ w CE_i / Σ w (§2.11), recomputed in
    float64. A mutation audit: w_c = 1/√n_c passed the suite."""
    g, graph, (train, val, _) = graph_data
    m = build_method(_ctx(g, graph, train, val),
                     BaselineConfig(method="lte4g", hidden=8, dropout=0.0))
    w = 1.0 / torch.tensor(TRAIN, dtype=torch.float64)
    torch.testing.assert_close(m.class_weight.double(), w)
    z, y = m(g.x, m.adj)[train], g.y[train]
    ce = _ce64(z, y)
    want = (1.0 - math.exp(-ce)) ** m.cfg.focal_gamma * _ce64(z, y, w)
    assert float(m.train_loss().detach()) == pytest.approx(want, rel=1e-5)
    assert abs(_ce64(z, y, w.sqrt()) - _ce64(z, y, w)) > 1e-3 * ce     # the check can tell


def test_imgagn_generator_loss_is_the_documented_sum(graph_data):
    """ImGAGN's L_G = Σ_c CE(D_rf(x_gen) → real 0) + CE(D_cls(x_gen) → c) + mean ‖x_i −
    x_gen_j‖ over class c's training nodes i (imgagn module docstring), D seeing each generated
    node alone (Â row [1]: relu(x W1 + b1) W + b), recomputed in float64 from the cycle's z. A
    mutation audit: the class target 0 instead of c passed the suite."""
    g, graph, (train, val, _) = graph_data
    m = build_method(_ctx(g, graph, train, val),
                     BaselineConfig(method="imgagn", hidden=8, dropout=0.0, im_class_num=2,
                                    disc_steps=1)).train()
    m.train_loss()                                   # cycle start: z drawn, nodes generated
    got = float(m.generator_loss().detach())
    p = {k: v.detach().double() for k, v in m.disc.named_parameters()}
    x = g.x.double()
    want, gap = 0.0, 0.0
    assert [(c, s) for c, _, s in m.blocks] == [(4, 10 - 3), (3, 10 - 4)]
    for (c, nodes, s), gen, z in zip(m.blocks, m.generators, m._z, strict=True):
        with torch.no_grad():
            x_gen = torch.softmax(gen(z).double(), 1) @ x[nodes]
        h = torch.relu(x_gen @ p["gc1.weight"] + p["gc1.bias"])
        cls, rf = h @ p["gc2.weight"] + p["gc2.bias"], h @ p["gc3.weight"] + p["gc3.bias"]
        zeros = torch.zeros(s, dtype=torch.long)
        want += (_ce64(rf, zeros) + _ce64(cls, zeros + c)
                 + float(torch.cdist(x[nodes], x_gen).mean()))
        gap += abs(_ce64(cls, zeros + c) - _ce64(cls, zeros))
    assert got == pytest.approx(want, rel=1e-4)
    assert gap > 1e-2 * want                                           # the check can tell


# ----------------------------------------------------------------------------- defaults
def test_documented_defaults():
    """§1.5 / §1.6: the tail is the last im_class_num = 3 labels in every method that has one (the
    re-weighting weights of a default run: 2 on classes 2, 3, 4); §2.11: the experts stop 300
    epochs after their first best. A mutation audit: defaults 2 and 200 passed the suite."""
    tail_methods = [m for m, f in METHOD_FIELDS.items() if "im_class_num" in f]
    assert len(tail_methods) >= 8
    assert all(BaselineConfig(method=m).im_class_num == 3 for m in tail_methods)
    g = make_synthetic_graph(40, num_classes=5, avg_degree=4, num_features=4, seed=0)
    ctx = _ctx(g, prepare_graph(g.edge_index, 40), torch.arange(20), None)
    rw = build_method(ctx, BaselineConfig(method="reweight", hidden=4))
    assert rw.class_weight.tolist() == [1.0, 1.0, 2.0, 2.0, 2.0]
    assert BaselineConfig(method="lte4g").expert_patience == 300


@pytest.mark.parametrize("fan_in, fan_out", [(400, 4), (4, 400)])
def test_graphconv_initialisation_is_uniform_within_one_over_sqrt_out(fan_in, fan_out):
    """§1.5: GraphConv(in, out)'s W and b are U(±1/√out). 1,600 weights: all within s = 1/√out,
    the largest above 0.9 s (P(fail) = 0.9^1600), the mean square s²/3 within ±0.05 s² (its
    standard error is s²·√(4/45/1600) = 0.0075 s²: 6.7 of them). A mutation audit: the bound
    1/√in (here 10x off either way) passed the suite."""
    torch.manual_seed(0)
    conv = GraphConv(fan_in, fan_out)
    s = 1.0 / math.sqrt(fan_out)
    w = conv.weight.detach().double().flatten()
    assert 0.9 * s < float(w.abs().max()) <= s
    assert abs(float((w * w).mean()) - s * s / 3) < 0.05 * s * s
    assert float(conv.bias.detach().abs().max()) <= s


# ----------------------------------------------------------------------------- LTE4G stages
def _lte4g(g, graph, train, val, **cfg):
    return build_method(_ctx(g, graph, train, val),
                        BaselineConfig(method="lte4g", hidden=8, **cfg))


def _official_expert_stop(f1s, patience, cap):
    """(epochs run, best epoch) of the official expert loop on its validation F1 sequence:
    max_idx = the first epoch at the running maximum, stop after epoch e once e − max_idx ≥
    patience, at most ``cap`` epochs; the best epoch is the last one at the maximum."""
    top, max_idx, run = -1.0, 0, cap
    for e, v in enumerate(f1s[:cap]):
        if v > top:
            top, max_idx = v, e
        if e - max_idx >= patience:
            run = e + 1
            break
    seen = f1s[:run]
    return run, max(i for i, v in enumerate(seen) if v == max(seen))


def test_lte4g_experts_stop_expert_patience_epochs_after_the_first_max(graph_data, monkeypatch):
    """Each expert's validation F1 sequence is recorded and the official rule replayed on it
    (§2.11: stop once expert_patience epochs passed the first max; the best is the last epoch
    at the max): epochs run and best epoch match, and at least one expert stops early. A
    mutation audit: a patience one epoch longer passed the suite."""
    g, graph, (train, val, _) = graph_data
    seqs = []
    real = lte4g_mod.LTE4G._selection

    def selection(self, module, embed, val_nodes, shift):
        f, seq = real(self, module, embed, val_nodes, shift), []
        seqs.append(seq)
        return lambda: seq.append(f()) or seq[-1]
    monkeypatch.setattr(lte4g_mod.LTE4G, "_selection", selection)
    m = _lte4g(g, graph, train, val, expert_patience=3, curriculum_ep=2)
    m.after_fit(val, epochs=20)
    log = m.stage_log["experts"]
    trained = [k for k in GROUPS if log[k]["train_nodes"]]     # _selection only for these
    assert len(trained) >= 3 and len(seqs) == len(trained) + 2
    for k, seq in zip(trained, seqs, strict=False):
        run, best = _official_expert_stop(seq, 3, 20)
        assert (log[k]["epochs_run"], log[k]["best_epoch"], len(seq)) == (run, best, run), k
    assert any(log[k]["epochs_run"] < 20 for k in trained)


def test_lte4g_student_loss_follows_the_curriculum(graph_data, monkeypatch):
    """Student loss at epoch e = CE + α(e)·KD(head-degree expert) + (1 − α(e))·KD(tail-degree
    expert), α(e) = cos(eπ / (2·curriculum_ep)) (§2.11). The KD terms are stubbed to 3 and
    0.25; CE is recomputed in float64 from the student's logits on its training nodes
    (dropout 0). A mutation audit: swapped curriculum weights passed the suite."""
    g, graph, (train, val, _) = graph_data
    e_max, kd_head, kd_tail = 4, 3.0, 0.25
    calls, losses = [], []

    def kd(student, teacher, temperature, reduction):   # per step: head-degree, tail-degree
        calls.append(student.detach().clone())
        return student.sum() * 0 + (kd_head if len(calls) % 2 else kd_tail)

    def fit(module, opt, step, val_f1, **kw):
        def recorded():
            loss, scalar = step()
            if "student" in kw["desc"]:
                losses.append(float(scalar.detach()))
            return loss, scalar
        return train_mod.fit_early_stopping(module, opt, recorded, val_f1, **kw)
    monkeypatch.setattr(lte4g_mod, "distillation_loss", kd)
    monkeypatch.setattr(lte4g_mod, "fit_early_stopping", fit)
    m = _lte4g(g, graph, train, val, dropout=0.0, curriculum_ep=e_max)
    m.after_fit(val, epochs=3)
    assert len(losses) == 2 * e_max and len(calls) == 4 * e_max
    for i, loss in enumerate(losses):
        grp, e = "HT"[i // e_max], i % e_max
        nodes = torch.cat([m.train_groups[grp + "H"], m.train_groups[grp + "T"]])
        shift = 0 if grp == "H" else SEP_POINT
        ce = _ce64(torch.cat(calls[2 * i:2 * i + 2]), g.y[nodes] - shift)
        alpha = math.cos(e * math.pi / (2 * e_max))
        assert loss == pytest.approx(ce + alpha * kd_head + (1 - alpha) * kd_tail, rel=1e-5)


def test_lte4g_distillation_targets_are_the_experts_eval_mode_logits(graph_data, monkeypatch):
    """KD targets = each best expert's EVAL-mode logits on its own training nodes, per node
    (§2.11 step 4; `LTE4G.distillation_targets`: the official teachers run in eval mode). The
    validation nodes are all of head classes, so the tail experts' selection never switches
    them to eval mode (an expert without validation node scores 0 without a forward pass);
    dropout 0.5 makes train mode differ. A mutation audit: the tail-degree target replaced by
    the teacher's mean logit, or the teachers left in train mode, passed the suite."""
    g, graph, (train, val, _) = graph_data
    targets = []
    real = lte4g_mod.distillation_loss

    def kd(student, teacher, temperature, reduction):
        targets.append(teacher.detach().clone())
        return real(student, teacher, temperature, reduction)
    monkeypatch.setattr(lte4g_mod, "distillation_loss", kd)
    m = _lte4g(g, graph, train, val, dropout=0.5, curriculum_ep=2)
    m.after_fit(val[g.y[val] < SEP_POINT], epochs=4)
    log = m.stage_log["experts"]
    assert m.sep_point == SEP_POINT
    assert log["TH"]["val_nodes"] == log["TT"]["val_nodes"] == 0
    assert all(log[k]["train_nodes"] >= 2 for k in GROUPS)
    assert len(targets) == 4 * 2                       # 2 students x 2 epochs x 2 teachers
    m.eval()
    with torch.no_grad():
        embed = m.encoder(g.x, m.adj)
        for i, t in enumerate(targets):
            k = "HT"[i // 4] + "HT"[i % 2]
            expert, nodes = m.experts[k], m.train_groups[k]
            want = expert.eval()(embed, m.adj)[nodes]
            torch.testing.assert_close(t, want, rtol=1e-5, atol=1e-6)
            assert float((want - want.mean(0)).abs().max()) > 1e-3      # the checks can tell
            assert float((expert.train()(embed, m.adj)[nodes] - want).abs().max()) > 1e-3
