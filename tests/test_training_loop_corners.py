"""Corners of the training loop that a mutation audit found untested: which epoch's weights the
loop keeps on a tie, the lr given to `train_hiertail`, and further protocol details (each
test says the mutant it kills). Tiny graphs, a few epochs: the file runs in seconds."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from hiertail_fast.data.splits import natural_split
from hiertail_fast.data.synthetic import make_synthetic_graph
from hiertail_fast.nn.hiertail import HierTail, HierTailConfig
from hiertail_fast.train import fit_early_stopping, train_hiertail

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def small():
    return make_synthetic_graph(120, num_classes=5, avg_degree=6, num_features=8, seed=1)


def _counting_fit(curve, patience=10):
    """`fit_early_stopping` on a one-weight model whose weight is e + 1 after epoch e (each SGD
    step adds 1), with the validation Macro-F1 of epoch e = curve[e]."""
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    scores = iter(curve)

    def step():
        loss = -model.weight.sum()
        return loss, loss

    return fit_early_stopping(model, opt, step, lambda: next(scores), epochs=len(curve),
                              patience=patience, progress=False, desc="t",
                              device=torch.device("cpu"))


def test_the_kept_weights_are_the_last_epoch_at_the_max():
    """On a tie at the maximum validation Macro-F1 (epochs 1 and 3) the loop keeps the weights
    of the LAST such epoch (the official ``>=``), the patience anchor being the first: a loop
    that saved the weights with the first maximum but reported ``best_epoch`` = the last passed
    every test (a mutation audit). Expected weights by the rule: epoch 3 ends with 4."""
    fit = _counting_fit([0.1, 0.5, 0.3, 0.5, 0.2])
    assert (fit.max_idx, fit.best_epoch, fit.epochs_run) == (1, 3, 5)
    assert float(fit.best_state["weight"]) == 4.0


def test_the_lr_argument_reaches_the_optimizer(small, monkeypatch):
    """``train_hiertail(lr=...)`` overrides the config's lr in Adam and in the result; a loop that
    kept the config's lr (reporting it too) passed every test (a mutation audit)."""
    got = []
    real = torch.optim.Adam

    def adam(params, lr, **kw):
        got.append(lr)
        return real(params, lr=lr, **kw)

    monkeypatch.setattr(torch.optim, "Adam", adam)
    cfg = HierTailConfig.paper(hidden=8)
    res = train_hiertail(small, natural_split(small.y, 0), cfg, epochs=1, seed=0, lr=0.37,
                         progress=False)
    assert cfg.lr != 0.37 and got == [0.37] and res["lr"] == 0.37


def test_test_per_class_is_the_recall_on_the_test_nodes(small):
    """``test_per_class`` holds the per-class recall on the TEST nodes: its mean over the classes
    with test nodes is the reported test bAcc, and weighted by the classes' test counts it is
    the test accuracy. Computed on the validation nodes it passed every test (a mutation
    audit)."""
    split = natural_split(small.y, 0)
    res = train_hiertail(small, split, HierTailConfig.paper(hidden=8, lr=0.05), epochs=15,
                         seed=0, progress=False)
    per_class = res["test_per_class"]
    t_c = np.bincount(small.y[split[2]].numpy(), minlength=small.num_classes)
    assert len(per_class) == small.num_classes
    assert [v is None for v in per_class] == list(t_c == 0)
    recalls = np.array([0.0 if v is None else v for v in per_class])
    assert recalls[t_c > 0].mean() == pytest.approx(res["test"]["bacc"], abs=1e-12)
    assert recalls @ t_c / t_c.sum() == pytest.approx(res["test"]["acc"], abs=1e-12)


def test_per_class_recall_has_one_entry_per_class():
    """`per_class_recall` returns ``num_classes`` entries, None for the classes without test
    nodes, also the last ones never predicted: without num_classes the list stopped at the
    largest label seen and passed every test (a mutation audit)."""
    from hiertail_fast.train import per_class_recall

    got = per_class_recall(torch.tensor([0, 1, 0, 1]), torch.tensor([0, 0, 0, 1]), 4)
    assert got == [1.0, 0.5, None, None]


def test_seed_summary_is_float64_exact():
    """The mean and population std over the seeds are float64 (numpy's on the reported values,
    to the last bit): accumulated in float32 they were off by ~1e-8 and passed every test
    (a mutation audit)."""
    from hiertail_fast.train import METRICS, run_each_seed

    g = make_synthetic_graph(60, num_classes=3, avg_degree=4, num_features=4, seed=0)
    vals = {1: 0.123456789012, 2: 0.3456789012345, 3: 0.7890123456789}

    def train_one(s_idx, seed, data, split, graph):
        return {"test": dict.fromkeys(METRICS, vals[seed]), "time_per_epoch_s": 0.0,
                "best_epoch": 0, "epochs_run": 1}

    res = run_each_seed(g, None, [1, 2, 3], train_one)
    v = np.array(list(vals.values()), dtype=np.float64)
    for m in METRICS:
        assert res["summary"][m] == {"mean": float(v.mean()), "std": float(v.std(ddof=0))}


def test_train_and_eval_seconds_are_counted_apart(monkeypatch):
    """Under a fake clock (every perf_counter call advances 1 s: a 1 s step and a 1 s
    evaluation per epoch) the loop counts 1 s of training and 1 s of evaluation per epoch, so
    2 s per epoch; a train time that also held the evaluation (3 s per epoch) passed every test
    (a mutation audit)."""
    import itertools
    import types

    import hiertail_fast._fit as fit_mod  # (the loop's module, whose clock is patched)
    import hiertail_fast.train as train_mod

    clock = itertools.count()
    monkeypatch.setattr(fit_mod, "time",
                        types.SimpleNamespace(perf_counter=lambda: float(next(clock))))
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        loss = model.weight.sum() * 0.0
        return loss, loss

    fit = fit_early_stopping(model, opt, step, lambda: 0.5, epochs=4, patience=10,
                             progress=False, desc="t", device=torch.device("cpu"))
    assert (fit.train_time, fit.eval_time) == (4.0, 4.0)
    assert train_mod.fit_record(fit)["time_per_epoch_s"] == 2.0


def test_table_shows_mean_and_std_times_100():
    """`format_table` prints mean ± std both ×100 with two decimals (the paper's tables); the
    std printed as a fraction passed every test (a mutation audit)."""
    from hiertail_fast.train import METRIC_NAMES, METRICS, format_table

    summary = {m: {"mean": 0.5 + i / 100, "std": 0.0123 + i / 1000}
               for i, m in enumerate(METRICS)}
    summary["time_per_epoch_s"] = 0.002
    table = format_table({"config_name": "paper", "seeds": [1, 2], "summary": summary})
    for i, m in enumerate(METRICS):
        want = f"{50 + i:.2f} ± {1.23 + i / 10:.2f}"
        line = next(ln for ln in table.splitlines() if ln.startswith(METRIC_NAMES[m]))
        assert " ".join(line.split()[1:]) == want, (line, want)


@pytest.mark.parametrize("part", ["val", "test"])
def test_an_empty_val_or_test_set_is_refused_before_training(small, part):
    """`train_hiertail` refuses an empty validation or test set up front, naming it (the model is
    selected on val and reported on test); without that check an empty test set trained every
    epoch and then failed with 'y_true and y_pred are empty', and no test noticed (a mutation
    audit)."""
    tr, va, te = natural_split(small.y, 0)
    split = {"train": tr, "val": va, "test": te, part: torch.zeros(0, dtype=torch.long)}
    with pytest.raises(ValueError, match=rf"split\['{part}'\] is empty"):
        train_hiertail(small, split, HierTailConfig.paper(hidden=8), epochs=2, seed=0,
                       progress=False)


def test_a_one_seed_list_is_a_list_not_a_count():
    """``--seeds 42,`` (a comma: a list) runs seed 42 alone, ``--seeds 3`` three seeds from
    --seed-base; reading "42," as the count 42 passed every test (a mutation audit)."""
    from hiertail_fast._train_cli import parse_seeds

    assert parse_seeds(["42,"]) == [42]
    assert parse_seeds(["3"], base=7) == [7, 8, 9]
    assert parse_seeds(["3,"], base=7) == [3]


def test_cli_seed_base_and_recorded_fields(monkeypatch, capsys):
    """``--seeds 2 --seed-base 7`` trains seeds 7 and 8, and the JSON records the run's epochs,
    patience and the graph's sizes as given; an ignored --seed-base, a patience recorded as
    the epochs or the node count recorded as the feature count passed every test (a mutation
    audit). The training itself is faked."""
    import hiertail_fast._train_cli as cli

    got = {}
    monkeypatch.setattr(cli, "run_seeds", lambda data, cfg, seeds, **kw: got.update(
        seeds=seeds, **kw) or {"seeds": seeds, "split": "natural", "runs": [], "summary": {}})
    monkeypatch.setattr(cli, "format_table", lambda result: "")
    res = cli.main(["--synthetic", "--nodes", "60", "--classes", "3", "--features", "4",
                    "--seeds", "2", "--seed-base", "7", "--patience", "5", "--epochs", "9",
                    "--no-progress"])
    assert got["seeds"] == [7, 8] and (got["epochs"], got["patience"]) == (9, 5)
    assert (res["training"]["epochs"], res["training"]["patience"]) == (9, 5)
    assert [res["data"][k] for k in ("num_nodes", "num_features", "num_classes")] == [60, 4, 3]


@pytest.mark.parametrize("method", ["hiertail", "origin"])
def test_logits_broken_by_the_last_step_are_divergence_not_metrics(small, monkeypatch, method):
    """A step can leave finite weights whose logits overflow (lr 1e8): when that step was the
    run's last, argmax of the NaN / Inf logits was reported as the run's metrics (a training
    loop audit). The validation pass now raises TrainingDivergedError naming the epoch, for
    HierTail and the baselines' shared harness alike."""
    from hiertail_fast.baselines import BaselineConfig, train_baseline
    from hiertail_fast.baselines.methods import Origin
    from hiertail_fast.nn.hiertail import HierTail
    from hiertail_fast.train import TrainingDivergedError

    def broken_in_eval(forward):
        def wrapped(self, *args, **kwargs):
            out = forward(self, *args, **kwargs)
            logits = out if isinstance(out, torch.Tensor) else out.logits
            if not self.training:
                logits.view(-1)[::7] = float("inf")     # finite weights, overflowing logits
            return out
        return wrapped
    split = natural_split(small.y, 0)
    if method == "hiertail":
        monkeypatch.setattr(HierTail, "forward", broken_in_eval(HierTail.forward))
        run = lambda: train_hiertail(small, split, HierTailConfig.paper(hidden=8),  # noqa: E731
                                     epochs=1, seed=0, progress=False)
    else:
        monkeypatch.setattr(Origin, "forward", broken_in_eval(Origin.forward))
        run = lambda: train_baseline(small, split, BaselineConfig(method="origin"),  # noqa: E731
                                     epochs=1, seed=0, progress=False)
    with pytest.raises(TrainingDivergedError, match="diverged at epoch 0: the validation "
                                                    "forward pass failed .*logits contain NaN"):
        run()


def test_numpy_or_tensor_hyper_parameters_are_recorded_as_floats(small):
    """lr / weight_decay given as a NumPy scalar or 0-d tensor passed the checks but went into
    the result (and Adam) as given: json.dumps of the result failed (a training loop audit)."""
    import json

    split = natural_split(small.y, 0)
    res = train_hiertail(small, split, HierTailConfig.paper(hidden=8), epochs=1, seed=0,
                         progress=False, lr=np.float32(0.01), weight_decay=torch.tensor(5e-4))
    assert type(res["lr"]) is float and type(res["weight_decay"]) is float
    assert res["lr"] == float(np.float32(0.01))
    json.dumps({k: res[k] for k in ("lr", "weight_decay", "test")})


def test_a_meta_tensor_in_the_data_is_named(small):
    with pytest.raises(ValueError, match="'y' is on the meta device"):
        train_hiertail(dataclasses.replace(small, y=small.y.to("meta")), None,
                       HierTailConfig.paper(hidden=8), epochs=1, seed=0, progress=False)


def test_the_patience_counts_from_select_from_when_the_val_f1_is_zero():
    """A run whose validation Macro-F1 is exactly 0.0 (nothing right yet: the first fine-tuning
    epochs after a method's pre-training) still anchors the patience at ``select_from``: the
    first validated epoch is a max. Starting the best/max at 0.0 instead of below any score
    anchored it at epoch 0 and stopped at ``select_from`` itself (a mutation audit)."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)

    def step():
        loss = model(torch.ones(1, 2)).sum()
        return loss, loss

    fit = fit_early_stopping(model, opt, step, lambda: 0.0, epochs=10, patience=2,
                             progress=False, desc="t", device=torch.device("cpu"),
                             select_from=3)
    assert (fit.max_idx, fit.best_epoch, fit.epochs_run, fit.stopped_early) == (3, 6, 7, True)


def test_the_training_loss_sees_the_train_labels_only(small, monkeypatch):
    """Train on train, select on val, report test: every optimiser step's loss gets exactly the
    train nodes, and relabelling every other node leaves the training trajectory unchanged. A
    loss fed the test (or train + val) nodes, a leak that inflates every reported number, passed
    the end-to-end tests, which ask for accuracy above a bound (a mutation audit)."""
    split = natural_split(small.y, 0)
    cfg = HierTailConfig.paper(hidden=8)
    seen = []
    real = HierTail.loss

    def spy(self, out, y, idx):
        seen.append(torch.as_tensor(idx).cpu().sort().values)
        return real(self, out, y, idx)

    with monkeypatch.context() as m:
        m.setattr(HierTail, "loss", spy)
        first = train_hiertail(small, split, cfg, epochs=3, seed=0, progress=False)
    train = torch.as_tensor(split[0]).sort().values
    assert len(seen) == 3 and all(torch.equal(s, train) for s in seen)
    others = torch.ones(small.y.numel(), dtype=torch.bool)
    others[train] = False
    relabelled = small.y.clone()
    relabelled[others] = (relabelled[others] + 1) % int(small.num_classes)
    assert not torch.equal(relabelled, small.y)
    again = train_hiertail(dataclasses.replace(small, y=relabelled), split, cfg, epochs=3,
                           seed=0, progress=False)
    assert again["final_loss"] == first["final_loss"]


def test_seed_everything_checks_its_seed_before_touching_a_generator():
    # "3", 1.5, None and 2**64 failed inside numpy / torch after Python's generator had been
    # reseeded (an API audit, session 68)
    import random

    from hiertail_fast.train import seed_everything

    for bad, exc in (("3", TypeError), (1.5, TypeError), (None, TypeError),
                     (2**64, ValueError), (-1, ValueError)):
        state = random.getstate()
        with pytest.raises(exc, match="seed must"):
            seed_everything(bad)
        assert random.getstate() == state
    seed_everything(np.int64(7))
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    seed_everything(7)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == first


def test_a_kept_state_with_inf_weights_is_divergence():
    # a parameter the validation does not read (a decoder, say) overflows to -inf in the last
    # step: the loss and the val score stay finite, so only the kept state's own check can see
    # it ("a kept state with NaN/Inf weights raises"; mutation audit, session 69)
    from hiertail_fast.train import TrainingDivergedError

    model = torch.nn.Module()
    model.a = torch.nn.Parameter(torch.ones(2))       # read by the validation
    model.b = torch.nn.Parameter(torch.ones(2))       # training-only
    opt = torch.optim.SGD([model.b], lr=1e38)         # one step: b = 1 - 1e39 = -inf (fp32)

    def step():
        loss = (10 * model.b).sum()
        return loss, loss

    with pytest.raises(TrainingDivergedError, match="selected model's weights are NaN or Inf"):
        fit_early_stopping(model, opt, step, lambda: float(model.a.detach().sum()) / 4, epochs=1,
                           patience=5, progress=False, desc="t", device=torch.device("cpu"))


def test_seed_everything_seeds_numpy_with_the_seed_mod_2_to_the_32():
    # the documented rule (seed mod 2**32): mod 2**31 gave seeds 5 and 2**31 + 5 one stream
    # (mutation audit, session 69)
    from hiertail_fast.train import seed_everything

    for seed in (5, 2**31 + 5, 2**32 + 5, 2**64 - 1):
        seed_everything(seed)
        got = np.random.rand(3)
        np.random.seed(seed % 2**32)
        assert np.array_equal(got, np.random.rand(3)), seed
        # torch takes the seed itself (seeded mod 2**31, 5 and 2**31 + 5 were one stream:
        # a mutation pass, session 73)
        assert torch.initial_seed() == seed


# ---------------------------------------------------------------- a mutation pass, session 73
def _linear_fit(step, val_f1=lambda: 0.5, **kw):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    args = dict(epochs=5, patience=10, progress=False, desc="run", device=torch.device("cpu"))
    args.update(kw)
    return fit_early_stopping(model, opt, lambda: step(model), val_f1, **args)


def _plain_step(model):
    loss = model(torch.ones(1, 2)).sum()
    return loss, loss


def test_tied_logits_predict_the_lowest_class():
    # torch's argmax and the official output.max(1)[1]: a dead model (all logits equal)
    # predicts class 0 (the last class taken, its metrics changed with no error)
    from hiertail_fast._fit import predicted_classes

    logits = torch.tensor([[0., 0., 0., 0.], [1., 3., 3., 0.], [2., 2., 0., 0.]])
    assert predicted_classes(logits).tolist() == [0, 1, 0]


def test_a_plain_value_error_during_training_is_raised_as_itself():
    """Only the non-finite errors (overflowing values) after a step are divergence, a run's
    outcome; any other ValueError of the training step or the validation pass, at any epoch,
    is raised as itself (reported as TrainingDivergedError it looked like the run's result)."""
    from hiertail_fast.train import TrainingDivergedError

    calls = {"n": 0}

    def failing_at_epoch_2(model):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ValueError("a bad input found at epoch 2")
        return _plain_step(model)

    def bad_val():
        raise ValueError("a bad input found in the validation pass")

    for kw in (dict(step=failing_at_epoch_2), dict(step=_plain_step, val_f1=bad_val)):
        with pytest.raises(ValueError, match="a bad input found") as caught:
            _linear_fit(**kw)
        assert not isinstance(caught.value, TrainingDivergedError)


def test_divergence_names_its_epoch_and_warm_up_epochs_count_as_training_time():
    import time

    from hiertail_fast.train import TrainingDivergedError

    calls = {"n": 0}

    def nan_at_epoch_3(model):
        calls["n"] += 1
        loss, _ = _plain_step(model)
        loss = loss * (float("nan") if calls["n"] == 4 else 1.0)
        return loss, loss

    with pytest.raises(TrainingDivergedError, match="diverged at epoch 3") as caught:
        _linear_fit(nan_at_epoch_3, epochs=9)
    assert caught.value.epoch == 3

    def slow(model):
        time.sleep(0.02)
        return _plain_step(model)

    # epochs before select_from are trained too: their steps count in train_time (dropped,
    # 10 steps of 20 ms came to ~0.04 s)
    fit = _linear_fit(slow, epochs=10, patience=100, select_from=8)
    assert fit.train_time >= 10 * 0.02
