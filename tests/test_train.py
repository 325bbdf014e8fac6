"""Training loop: end-to-end learning (synthetic graph, Email), protocol model selection and early
stopping, eval under no_grad, seeds summary, the CLI and its JSON, bad arguments."""
from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import pytest
import torch

from hiertail_fast._train_cli import main, parse_seeds
from hiertail_fast.data.io import load_npz
from hiertail_fast.data.splits import natural_split
from hiertail_fast.data.synthetic import make_synthetic_graph
from hiertail_fast.nn.hiertail import HierTail, HierTailConfig
from hiertail_fast.train import load_split, run_seeds, train_hiertail

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def syn():
    return make_synthetic_graph(500, num_classes=10, avg_degree=10, homophily=0.8,
                                num_features=32, seed=0)


@pytest.fixture(scope="module")
def small():
    return make_synthetic_graph(120, num_classes=5, avg_degree=6, num_features=8, seed=1)


# Measured (2-core CPU): paper, 80 epochs: bAcc 0.57 / 0.67 (seeds 0 / 1); official with lr 0.01,
# 50 epochs: 0.53 / 0.56. The majority-class predictor has bAcc 1/C = 0.10: the bound asks for
# 3x that, with a real margin below every measured run.
@pytest.mark.parametrize("config, epochs", [(HierTailConfig.paper(hidden=32), 80),
                                            (HierTailConfig.official(hidden=32, lr=0.01), 50)],
                         ids=["paper", "official-lr0.01"])
def test_synthetic_end_to_end_beats_majority(syn, config, epochs):
    res = train_hiertail(syn, natural_split(syn.y, 0), config, epochs=epochs, seed=0,
                         progress=False)
    assert res["test"]["bacc"] >= 3.0 / syn.num_classes
    assert res["config_name"] == config.name and res["epochs_run"] == epochs


# Measured (paper, hidden 64, 60 epochs, seeds 123/124/125): bAcc 0.40 / 0.45 / 0.35, Macro-F1
# 0.39 / 0.40 / 0.31 (the paper's full-protocol figures: 0.505 / 0.466). Majority predictor:
# bAcc 1/42 = 0.024; the bound 0.2 is 8x that.
def test_email_beats_majority(data_dir):
    data = load_npz(data_dir / "email.npz", relabel_by_size=True)
    res = train_hiertail(data, natural_split(data.y, 123), HierTailConfig.paper(hidden=64),
                         epochs=60, seed=123, progress=False)
    assert res["test"]["bacc"] >= 0.2
    assert res["test"]["macro_f1"] >= 0.15


def test_early_stopping_and_tie_rule(small):
    """lr ~ 0: val-F1 constant -> max_idx = 0 (first max), best = last tie, stop after
    patience + 1 epochs without strict improvement."""
    cfg = HierTailConfig.paper(hidden=8, lr=1e-12)
    res = train_hiertail(small, natural_split(small.y, 0), cfg, epochs=500, patience=3, seed=0,
                         progress=False)
    assert res["stopped_early"] and res["epochs_run"] == 5       # epochs 0..4, 4 - 0 > 3
    assert res["max_idx"] == 0 and res["best_epoch"] == 4


def test_eval_runs_under_no_grad(small, monkeypatch):
    calls = []
    forward = HierTail.forward

    def spy(self, x, graph):
        calls.append((self.training, torch.is_grad_enabled()))
        return forward(self, x, graph)

    monkeypatch.setattr(HierTail, "forward", spy)
    train_hiertail(small, natural_split(small.y, 0), HierTailConfig.paper(hidden=8), epochs=3,
                   seed=0, progress=False)
    train_calls = [g for t, g in calls if t]
    eval_calls = [g for t, g in calls if not t]
    assert len(train_calls) == 3 and all(train_calls)
    assert len(eval_calls) == 4 and not any(eval_calls)   # 3 per-epoch + the final test pass


def test_seeds_summary_and_compound_pool_bug(small):
    res = run_seeds(small, HierTailConfig.official(hidden=8), [5, 6], epochs=2,
                    compound_pool_bug=True, progress=False)
    n, c = small.num_nodes, small.num_classes
    assert [r["seed"] for r in res["runs"]] == [5, 6]
    assert res["runs"][0]["pool_sizes"][0] == math.floor(n / c)
    assert res["runs"][1]["pool_sizes"][0] == min(math.floor((n / c) ** 2), n)
    bacc = [r["test"]["bacc"] for r in res["runs"]]
    assert res["summary"]["bacc"]["mean"] == pytest.approx(np.mean(bacc))
    assert res["summary"]["bacc"]["std"] == pytest.approx(np.std(bacc))    # population std


def test_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "res.json"
    main(["--synthetic", "--nodes", "150", "--classes", "5", "--features", "8", "--hidden", "8",
          "--epochs", "3", "--seeds", "2", "--no-progress", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["config_name"] == "paper"
    fields = {f.name for f in dataclasses.fields(HierTailConfig)}
    assert fields <= set(result["config"]) and result["config"]["hidden"] == 8
    assert result["seeds"] == [123, 124] and len(result["runs"]) == 2
    for key in ("bacc", "macro_f1", "g_means", "acc"):
        assert set(result["summary"][key]) == {"mean", "std"}
        assert set(result["runs"][0]["test"]) >= {key}
    assert result["data"]["synthetic"] and result["data"]["num_nodes"] == 150
    assert result["training"]["epochs"] == 3 and result["training"]["lr"] == 0.01
    assert "bAcc" in capsys.readouterr().out


def test_cli_user_split(tmp_path, small):
    split = natural_split(small.y, 0)
    path = tmp_path / "split.npz"
    np.savez(path, train=split[0].numpy(), val=split[1].numpy(), test=split[2].numpy())
    data_path = tmp_path / "small.npz"
    small.to_npz(data_path)
    result = main(["--data", str(data_path), "--split", str(path), "--config", "official",
                   "--epochs", "2", "--seeds", "3,4", "--no-progress", "--hidden", "8"])
    assert result["split"] == "user" and result["seeds"] == [3, 4]
    assert result["config"]["tau"] == 1.0 and result["config"]["augment_a2"]


ONE_SHORT_RUN = ("--epochs", "1", "--seeds", "1", "--no-progress")


@pytest.mark.parametrize("argv, message", [
    ([], "exactly one of"),
    (["--synthetic", "--data", "x.npz"], "exactly one of"),
    (["--synthetic", "--epochs", "0"], "must be an integer > 0"),
    (["--data", "/nonexistent/graph.npz"], "not found"),
    (["--synthetic", "--seeds", "x"], "integers"),
    (["--synthetic", "--config", "fast"], "invalid choice"),
    # (one short seed each: a check that stopped refusing fails here in seconds, not after a
    # 10-seed, 10,000-epoch run, as a mutation audit's mutant did)
    (["--synthetic", "--compound-pool-bug", *ONE_SHORT_RUN], "only applies"),
    (["--synthetic", "--dropout", "1.5", *ONE_SHORT_RUN], "dropout"),
    (["--synthetic", "--split", "/nonexistent/split.npz"], "not found"),
])
def test_cli_bad_args(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_parse_seeds():
    assert parse_seeds(["3"]) == [123, 124, 125]
    assert parse_seeds(["1,2,5"]) == [1, 2, 5]
    assert parse_seeds(["7", "9"]) == [7, 9]
    assert parse_seeds(["2"], base=10) == [10, 11]
    with pytest.raises(ValueError):
        parse_seeds(["0"])
    # a list is checked seed by seed, not by its ends only (a seed out of range in the middle
    # passed; mutation audit, session 69)
    with pytest.raises(ValueError, match=r"--seeds: seed -4 is out of range"):
        parse_seeds(["1,-4,5"])
    with pytest.raises(ValueError, match=r"--seeds: seed 18446744073709551616 is out of range"):
        parse_seeds(["1", str(2**64), "5"])
    # (a mutation pass, session 73) values that hold no seed: refused by name, not [] or an
    # IndexError; a base out of range named as --seed-base, not as a seed it would make
    for empty in ([","], [" , "], [""]):
        with pytest.raises(ValueError, match="--seeds is empty"):
            parse_seeds(empty)
    for base in (-5, 2**64):
        with pytest.raises(ValueError, match=rf"--seed-base must lie in \[0, {2**64 - 1}\], "
                           rf"got {base}"):
            parse_seeds(["3"], base=base)


def test_reported_pool_sizes_are_the_models_with_classes_that_hold_no_node():
    """The run's pool_sizes are those the model was built with, from data.num_classes (its C),
    also where the top classes hold no node (from max(y) + 1 they were [3, 2] for a model
    pooled to [6, 3]; a mutation pass, session 73)."""
    from hiertail_fast.data.io import GraphData
    from hiertail_fast.nn.hiertail import HierTailConfig

    gen = torch.Generator().manual_seed(0)
    n = 60
    data = GraphData(edge_index=torch.randint(0, n, (2, 200), generator=gen),
                     x=torch.randn(n, 4, generator=gen), y=torch.arange(n) % 3, num_classes=6)
    split = (torch.arange(0, 30), torch.arange(30, 45), torch.arange(45, 60))
    run = train_hiertail(data, split, epochs=2, patience=5, seed=0, progress=False)
    assert run["pool_sizes"] == HierTailConfig.paper().pool_sizes(n, 6) != \
        HierTailConfig.paper().pool_sizes(n, 3)


def test_train_api_bad_inputs(small):
    split = natural_split(small.y, 0)
    with pytest.raises(ValueError, match="epochs"):
        train_hiertail(small, split, epochs=0, progress=False)
    bad = (split[0], split[1], torch.tensor([0, small.num_nodes]))
    with pytest.raises(ValueError, match="outside"):
        train_hiertail(small, bad, epochs=1, progress=False)
    with pytest.raises(ValueError, match="train, val and test"):
        train_hiertail(small, {"train": split[0], "val": split[1]}, epochs=1, progress=False)


@pytest.mark.parametrize("kwargs, exc, msg", [
    (dict(config={"hidden": 8}), TypeError, "config must be a HierTailConfig, got dict"),
    (dict(config="paper"), TypeError, "config must be a HierTailConfig, got str"),
    (dict(epochs=2.5), TypeError, "epochs must be an int"),
    (dict(epochs=True), TypeError, "epochs must be an int"),
    (dict(patience=float("nan")), TypeError, "patience must be an int"),
    (dict(patience=-1), ValueError, "patience >= 0"),
    (dict(seed=1.5), TypeError, "seed must be an int"),
    (dict(seed=True), TypeError, "seed must be an int"),
    (dict(seed=-1), ValueError, "seed must lie in"),
    (dict(seed=2**64), ValueError, "seed must lie in"),
    (dict(device="nope"), ValueError, "device='nope' is not a device"),
    (dict(progress="no"), TypeError, "progress must be a bool"),
    (dict(lr=True), TypeError, "lr must be a real number"),
    (dict(lr=float("nan")), ValueError, "lr must be finite"),
    (dict(lr=0.0), ValueError, "lr must be finite and > 0"),   # (>= 0 passed; s69)
    (dict(weight_decay=-1.0), ValueError, "weight_decay must be finite and >= 0"),
])
def test_train_hiertail_argument_types(small, kwargs, exc, msg):
    """A dict / str config ended in AttributeError, epochs=2.5 in a raw TypeError, epochs=True
    ran one epoch, patience=NaN disabled early stopping, seed 1.5 / -1 failed inside numpy:
    each a ValueError / TypeError naming the argument, checked before any work."""
    kw = {"config": HierTailConfig.paper(hidden=4), "epochs": 1, "progress": False, **kwargs}
    with pytest.raises(exc, match=msg) as info:
        train_hiertail(small, natural_split(small.y, 0), **kw)
    assert type(info.value) is exc


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a build / machine without CUDA")
def test_train_on_missing_cuda_is_a_named_error(small):
    """device='cuda' on a CPU build raised AssertionError('Torch not compiled with CUDA')."""
    with pytest.raises(ValueError, match="device='cuda': CUDA is not available"):
        train_hiertail(small, None, HierTailConfig.paper(hidden=4), epochs=1, device="cuda",
                       progress=False)


def test_run_seeds_checks_the_seeds(small):
    """run_seeds([1, 1]) ran seed 1 twice (the CLI refuses duplicates), [1.7] ran seed 1 and
    ["3"] seed 3."""
    cfg = HierTailConfig.paper(hidden=4)
    for seeds, exc, msg in (([1, 1], ValueError, "seeds lists 1 more than once"),
                            ([5, 1.7], TypeError, r"seeds\[1\] must be an int, got float"),
                            (["3"], TypeError, r"seeds\[0\] must be an int, got str"),
                            ([-1], ValueError, r"seeds\[0\] must lie in"),
                            (3, TypeError, "seeds must be a sequence of ints"),
                            ([], ValueError, "seeds is empty")):
        with pytest.raises(exc, match=msg):
            run_seeds(small, cfg, seeds, epochs=1, progress=False)
    for kwargs, exc, msg in ((dict(config={"hidden": 4}), TypeError, "config must be a "
                              "HierTailConfig"),
                             (dict(compound_pool_bug="yes"), TypeError,
                              "compound_pool_bug must be a bool")):
        with pytest.raises(exc, match=msg):
            run_seeds(small, **{"config": cfg, "seeds": [1], "epochs": 1, "progress": False,
                                **kwargs})
    r = run_seeds(small, cfg, (np.int64(4), 2), epochs=1, progress=False)
    assert r["seeds"] == [4, 2] and all(type(s) is int for s in r["seeds"])


def test_train_hiertail_refuses_duplicate_train_nodes(small):
    """Every train node twice in the split trained silently on re-weighted losses."""
    tr, va, te = natural_split(small.y, 0)
    with pytest.raises(ValueError, match="split: train has duplicate node ids") as info:
        train_hiertail(small, (torch.cat([tr, tr]), va, te), HierTailConfig.paper(hidden=4),
                       epochs=2, seed=0, progress=False)
    assert type(info.value) is ValueError


@pytest.mark.parametrize("part", [1, 2])
def test_duplicate_val_or_test_nodes_are_refused_and_masks_accepted(small, part):
    # a repeated test node was counted twice in the metrics (test Acc 0.83 -> 0.97 on a
    # synthetic graph), a repeated val node in model selection (a metrics / API audit)
    split = list(natural_split(small.y, 0))
    split[part] = torch.cat([split[part], split[part][:5]])
    name = ("val", "test")[part - 1]
    with pytest.raises(ValueError, match=f"split: {name} has duplicate node ids"):
        train_hiertail(small, tuple(split), HierTailConfig.paper(hidden=4), epochs=1, seed=0,
                       progress=False)
    # boolean masks, as user_split and PyG take them, give the index split's result
    tr, va, te = natural_split(small.y, 0)
    masks = []
    for idx in (tr, va, te):
        m = torch.zeros(small.num_nodes, dtype=torch.bool)
        m[idx] = True
        masks.append(m)
    cfg = HierTailConfig.paper(hidden=4)
    by_mask = train_hiertail(small, tuple(masks), cfg, epochs=2, seed=0, progress=False)
    by_index = train_hiertail(small, (tr.sort().values, va, te), cfg, epochs=2, seed=0,
                              progress=False)
    assert by_mask["test"] == by_index["test"]


def test_a_dict_split_takes_the_split_files_names_once_each(small):
    """A dict split reads each part as ``train``, ``train_idx`` or ``train_mask`` (the names a
    split file may use); two names for one part are refused (``train`` was taken unsaid)."""
    tr, va, te = natural_split(small.y, 0)
    masks = {}
    for name, idx in zip(("train", "val", "test"), (tr, va, te), strict=True):
        masks[f"{name}_mask"] = torch.zeros(small.num_nodes, dtype=torch.bool)
        masks[f"{name}_mask"][idx] = True
    cfg = HierTailConfig.paper(hidden=4)
    by_mask = train_hiertail(small, masks, cfg, epochs=2, seed=0, progress=False)
    by_index = train_hiertail(small, {"train_idx": tr.sort().values, "val": va, "test": te},
                              cfg, epochs=2, seed=0, progress=False)
    assert by_mask["test"] == by_index["test"]
    with pytest.raises(ValueError, match="split holds 'val' and 'val_mask': one array per part"):
        train_hiertail(small, {**masks, "val": va}, cfg, epochs=1, seed=0, progress=False)
    # an object with fields (a PyG Data, a namespace) is read by the same rule: it took the
    # first name found, unsaid (00c5108's dict path only was tested: a fix-test check, s68)
    from types import SimpleNamespace

    by_fields = train_hiertail(small, SimpleNamespace(**masks), cfg, epochs=2, seed=0,
                               progress=False)
    assert by_fields["test"] == by_mask["test"]
    with pytest.raises(ValueError, match="split holds 'train' and 'train_mask'"):
        train_hiertail(small, SimpleNamespace(**masks, train=tr[:5]), cfg, epochs=1, seed=0,
                       progress=False)


def test_a_split_file_missing_a_part_names_each_name_it_may_have(tmp_path):
    # PyG's mask name included (84ad464's message, which no test asserted: a fix-test check,
    # session 68)
    path = tmp_path / "s.npz"
    np.savez(path, val=np.arange(3), test=np.arange(3, 6))
    with pytest.raises(ValueError, match=r"missing array 'train' \(or train_idx, train_mask\)"):
        load_split(path)


def test_inputs_that_require_grad_are_left_alone(small):
    # x requiring grad got .grad written by training; learnable edge weights failed in epoch 2
    # ("backward through the graph a second time": the graph is built once; an nn audit)
    from dataclasses import replace
    x = small.x.clone().requires_grad_()
    w = torch.ones(small.num_edges, requires_grad=True)
    data = replace(small, x=x, edge_weight=w)
    cfg = HierTailConfig.paper(hidden=4)
    got = train_hiertail(data, None, cfg, epochs=3, seed=0, progress=False)
    want = train_hiertail(replace(small, edge_weight=torch.ones(small.num_edges)), None, cfg,
                          epochs=3, seed=0, progress=False)
    assert x.grad is None and w.grad is None
    assert got["test"] == want["test"]
    # the seed loops build their graph once too: run_seeds failed the same way (its graph was
    # not detached; a mutation audit), and the baselines' loop shares it
    from hiertail_fast.baselines.harness import run_baseline_seeds
    res = run_seeds(data, cfg, [0, 1], epochs=2, progress=False)
    from hiertail_fast.baselines.config import BaselineConfig
    base = run_baseline_seeds(data, BaselineConfig(method="origin", hidden=4), seeds=[0],
                              epochs=2, progress=False)
    assert x.grad is None and w.grad is None
    assert len(res["runs"]) == 2 and len(base["runs"]) == 1


def test_hand_built_graph_data_is_checked(small):
    # the PyG path checked these, a hand-built GraphData did not (a metrics / API audit)
    from dataclasses import replace
    cfg = HierTailConfig.paper(hidden=4)
    y_frac = small.y.double()
    y_frac[0] = 0.5
    for data, exc, msg in (
            (replace(small, y=y_frac), ValueError, "'y' must be an integer array of labels"),
            (replace(small, num_classes=5.7), TypeError, "data.num_classes must be an int"),
            (replace(small, num_classes="5"), TypeError, "data.num_classes must be an int"),
            (replace(small, num_classes=2), ValueError,
             "the labels go up to 4 but data.num_classes is 2"),
            (replace(small, x=small.x[:, 0]), ValueError, "'x' must be 2-D"),
            (replace(small, x=small.x.double() * 1e39), ValueError,
             "'x' has values beyond float32's range")):
        with pytest.raises(exc, match=msg):
            train_hiertail(data, None, cfg, epochs=1, seed=0, progress=False)


def test_fit_early_stopping_select_from_skips_validation_and_selection():
    """Epochs before select_from are trained only (no val_f1 call, never selected); the
    patience counts from select_from at the earliest; a bad select_from is refused."""
    from hiertail_fast.train import fit_early_stopping

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    curve = [0.9, 0.9, 0.1, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1]   # val F1 by epoch
    calls = []

    def step():
        loss = model.weight.sum() * 0.0
        return loss, loss

    def val_f1():
        calls.append(len(calls))
        return curve[len(calls) + 1]                     # call k (from 1) is epoch k + 1

    fit = fit_early_stopping(model, opt, step, val_f1, epochs=10, patience=2, progress=False,
                             desc="t", device=torch.device("cpu"), select_from=2)
    # epochs 0, 1 (F1 0.9) are not validated; the max from epoch 2 on is 0.2 at epoch 3 (first)
    # and 4 (last: the model kept); patience 2 from epoch 3 stops at epoch 6 (6 - 3 > 2)
    assert (fit.max_idx, fit.best_epoch, fit.epochs_run, fit.stopped_early) == (3, 4, 7, True)
    assert len(calls) == 5                               # epochs 2..6 validated
    for bad in (-1, 10):
        with pytest.raises(ValueError, match="select_from"):
            fit_early_stopping(model, opt, step, val_f1, epochs=10, patience=2,
                               progress=False, desc="t", device=torch.device("cpu"),
                               select_from=bad)


# ----------------------------------------------------------------- fuzz finds (s21 cli_fuzz)
def test_divergence_is_a_named_error_for_hiertail_and_the_baselines(small):
    """lr 1e30 ended HierTail in 'x contains NaN or Inf' deep in gcn_propagate and let the
    baselines report constant predictions (final_loss NaN). The shared loop now raises
    TrainingDivergedError naming the run, the epoch and the lr."""
    from hiertail_fast.baselines.config import BaselineConfig
    from hiertail_fast.baselines.harness import train_baseline
    from hiertail_fast.train import TrainingDivergedError

    split = natural_split(small.y, 0)
    runs = [lambda lr: train_hiertail(small, split, HierTailConfig.paper(hidden=8, lr=lr),
                                      epochs=4, seed=0, progress=False),
            lambda lr: train_baseline(small, split, BaselineConfig(method="origin", hidden=8,
                                                                   lr=lr),
                                      epochs=4, seed=0, progress=False)]
    for run in runs:
        with pytest.raises(TrainingDivergedError) as exc:
            run(1e30)
        assert re.search(r"seed=0: training diverged at epoch \d+: ", str(exc.value)), exc
        assert "lower the learning rate (lr=1e+30)" in str(exc.value)
    assert issubclass(TrainingDivergedError, FloatingPointError)


def test_fit_early_stopping_stops_at_a_non_finite_loss():
    from hiertail_fast.train import TrainingDivergedError, fit_early_stopping

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = iter([1.0, 2.0, float("inf")])

    def step():
        loss = model.weight.sum() * 0.0 + next(losses)
        return loss, loss

    with pytest.raises(TrainingDivergedError, match=r"t: training diverged at epoch 2: the "
                       r"training loss is inf; lower the learning rate \(lr=0.5\)"):
        fit_early_stopping(model, opt, step, lambda: 0.5, epochs=10, patience=5,
                           progress=False, desc="t", device=torch.device("cpu"))

    # an op refusing non-finite / overflowing values after a step is divergence too; at epoch
    # 0 (before any step) it is the input's problem and propagates unchanged
    from hiertail_fast._validation import is_non_finite_error, non_finite_error

    def failing_step(fail_at):
        calls = iter(range(10))

        def step():
            if next(calls) == fail_at:
                raise non_finite_error("the logits overflow torch.float32")
            loss = model.weight.sum() * 0.0
            return loss, loss
        return step

    with pytest.raises(TrainingDivergedError, match="epoch 1: the forward pass failed .the "
                       "logits overflow") as exc:
        fit_early_stopping(model, opt, failing_step(1), lambda: 0.5, epochs=10, patience=5,
                           progress=False, desc="t", device=torch.device("cpu"))
    assert is_non_finite_error(exc.value.__cause__)
    with pytest.raises(ValueError, match="overflow") as exc:
        fit_early_stopping(model, opt, failing_step(0), lambda: 0.5, epochs=10, patience=5,
                           progress=False, desc="t", device=torch.device("cpu"))
    assert type(exc.value) is ValueError and is_non_finite_error(exc.value)


def test_one_class_graph_is_refused(small):
    """A one-class graph trained and reported bAcc 100."""
    from hiertail_fast.baselines.config import BaselineConfig
    from hiertail_fast.baselines.harness import train_baseline

    one = dataclasses.replace(small, y=torch.zeros_like(small.y), num_classes=1)
    split = natural_split(small.y, 0)
    with pytest.raises(ValueError, match="one class .label 0.: .* at least 2 classes"):
        train_hiertail(one, split, epochs=1, progress=False)
    with pytest.raises(ValueError, match="at least 2 classes"):
        train_baseline(one, split, BaselineConfig(), epochs=1, progress=False)
    two = make_synthetic_graph(20, num_classes=2, num_features=4, seed=0)   # 2 classes train
    assert train_hiertail(two, None, HierTailConfig.paper(hidden=4), epochs=1, seed=0,
                          progress=False)["epochs_run"] == 1


@pytest.mark.parametrize("method", ["hiertail", "origin"])
def test_reported_metrics_are_the_selected_epochs(method, monkeypatch):
    """The reported metrics come from the model of the selected epoch (the last at the max
    validation Macro-F1), not from the last epoch's: without reloading the selected state
    every test passed, for HierTail and for the baselines (a mutation audit). A run whose
    last epoch is worse than its best: the reported val Macro-F1 is the loop's maximum."""
    import hiertail_fast.baselines.harness as harness
    import hiertail_fast.train as train_mod
    from hiertail_fast.baselines.config import BaselineConfig

    mod = train_mod if method == "hiertail" else harness
    seen: list[float] = []
    real = mod.macro_f1
    monkeypatch.setattr(mod, "macro_f1", lambda a, b: seen.append(real(a, b)) or seen[-1])
    g = make_synthetic_graph(300, 6, avg_degree=6.0, num_features=16, seed=0)
    kw = dict(epochs=60, patience=1000, seed=1, progress=False)
    if method == "hiertail":
        res = train_hiertail(g, None, HierTailConfig.paper(hidden=16, lr=0.2), **kw)
    else:
        res = harness.train_baseline(g, None, BaselineConfig(method="origin", hidden=16,
                                                             lr=0.2), **kw)
    assert len(seen) == res["epochs_run"] == 60
    assert seen[-1] < max(seen)                 # the last epoch's model is another one
    assert seen[res["best_epoch"]] == max(seen)
    assert res["val"]["macro_f1"] == pytest.approx(max(seen), abs=1e-12)


def test_a_seed_without_a_split_draws_that_seeds_natural_split(small, monkeypatch):
    """``seed=s`` without a split trains on ``natural_split(y, s)`` (HierTail and the
    baselines share the set-up); a set-up that always drew seed 0's split passed every test
    (a mutation audit). The baselines' random generator is seeded with s too."""
    import hiertail_fast.baselines.harness as harness
    import hiertail_fast.train as train_mod
    from hiertail_fast.baselines.config import BaselineConfig

    drawn, gens = [], []
    real_split, real_ctx = train_mod.natural_split, harness.MethodContext
    monkeypatch.setattr(train_mod, "natural_split",
                        lambda y, s, *a, **k: drawn.append(s) or real_split(y, s, *a, **k))

    def context(*args, **kwargs):
        gens.append(args[5].initial_seed())
        return real_ctx(*args, **kwargs)

    monkeypatch.setattr(harness, "MethodContext", context)
    train_hiertail(small, None, HierTailConfig.paper(hidden=8), epochs=1, seed=5,
                   progress=False)
    harness.train_baseline(small, None, BaselineConfig(hidden=8), epochs=1, seed=7,
                           progress=False)
    assert drawn == [5, 7] and gens == [7]


def test_weight_decay_reaches_the_optimizer(small):
    """``weight_decay`` changes training (Adam's L2 term) and is reported: dropped from the
    optimizer it passed every test (a mutation audit)."""
    runs = [train_hiertail(small, None, HierTailConfig.paper(hidden=8), epochs=3, seed=0,
                           weight_decay=wd, progress=False) for wd in (0.0, 1.0)]
    assert [r["weight_decay"] for r in runs] == [0.0, 1.0]
    assert runs[0]["final_loss"] != runs[1]["final_loss"]


def test_fit_record_times_include_the_evaluation():
    """Seconds per epoch = (train steps + evaluations) / epochs; without the evaluations it
    passed every test (a mutation audit)."""
    from hiertail_fast.train import FitResult, fit_record

    rec = fit_record(FitResult({}, 1, 0, 4, False, train_time=3.0, eval_time=1.0,
                               last_loss=None))
    assert (rec["time_per_epoch_s"], rec["train_step_s"], rec["eval_s"]) == (1.0, 0.75, 0.25)
    assert (rec["best_epoch"], rec["max_idx"], rec["epochs_run"]) == (1, 0, 4)


def test_seed_summary_is_the_mean_over_three_seeds(small):
    """The summary's seconds per epoch is the mean over the seeds (mean and median coincide
    for the suite's 1-2 seeds, so a median passed every test: a mutation audit); the metrics'
    std is the population std."""
    from hiertail_fast.train import METRICS, run_each_seed

    times = {1: 0.01, 2: 0.02, 3: 0.06}

    def train_one(s_idx, seed, data, split, graph):
        return {"test": {m: seed / 10 for m in METRICS}, "time_per_epoch_s": times[seed],
                "best_epoch": 0, "epochs_run": 1}

    res = run_each_seed(small, None, [1, 2, 3], train_one)
    assert res["summary"]["time_per_epoch_s"] == pytest.approx(0.03)
    assert res["summary"][METRICS[0]]["std"] == pytest.approx(np.std([0.1, 0.2, 0.3]))


@pytest.mark.parametrize("entry", ["run_seeds", "run_baseline_seeds", "train_hiertail"])
@pytest.mark.parametrize("kind", ["dict", "tuple", "HeteroData"])
def test_a_wrong_data_container_is_a_type_error(entry, kind):
    """README: a TypeError naming the argument. A dict, a tuple or a PyG HeteroData gave an
    AttributeError from inside the loop ('dict' object has no attribute 'y'; an interop
    audit)."""
    from hiertail_fast.baselines import run_baseline_seeds
    from hiertail_fast.train import run_seeds, train_hiertail

    x, ei, y = torch.randn(6, 2), torch.tensor([[0, 1], [1, 0]]), torch.tensor([0, 0, 0, 1, 1, 1])
    if kind == "HeteroData":
        hetero = pytest.importorskip("torch_geometric.data").HeteroData()
        hetero["n"].x, hetero["n"].y = x, y
        hetero["n", "e", "n"].edge_index = ei
        data = hetero
    else:
        data = {"x": x, "edge_index": ei, "y": y} if kind == "dict" else (ei, x, y)
    call = {"run_seeds": lambda: run_seeds(data, seeds=[0], epochs=1, progress=False),
            "run_baseline_seeds": lambda: run_baseline_seeds(data, seeds=[0], epochs=1,
                                                             progress=False),
            "train_hiertail": lambda: train_hiertail(data, epochs=1, progress=False)}[entry]
    with pytest.raises(TypeError, match=f"data must be a GraphData .* got {kind}"):
        call()


def test_a_graph_object_missing_some_fields_names_them():
    # an object with x, edge_index and y but no num_classes failed inside with an
    # AttributeError; the refusal names what is missing (a5d86ef's field list, unguarded: the
    # containers above lack all four; a fix-test check, session 68)
    from types import SimpleNamespace

    data = SimpleNamespace(x=torch.randn(6, 2), edge_index=torch.tensor([[0, 1], [1, 0]]),
                           y=torch.tensor([0, 0, 0, 1, 1, 1]))
    with pytest.raises(TypeError, match=r"data must be a GraphData .*\(no num_classes\)"):
        run_seeds(data, seeds=[0], epochs=1, progress=False)
