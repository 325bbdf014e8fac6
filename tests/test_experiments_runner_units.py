"""The experiments' runner, ablation and datasets-table pieces a mutation audit (session 70)
found unguarded: what a run's identity holds, what reaches the trainer, the budget's checks
and texts, the summaries' totals and the tables' cells."""
from __future__ import annotations

import math
import types

import pytest
import torch

from hiertail_fast._protocol import METRICS
from hiertail_fast.baselines import BaselineConfig
from hiertail_fast.experiments import ablation, runner
from hiertail_fast.experiments.datasets_table import markdown, statistics
from hiertail_fast.experiments.runner import FULL_SEEDS, Budget, RunCache, RunSpec


def _result():
    return {"test": {m: 0.5 for m in METRICS}, "epochs_run": 3}


def test_every_part_of_the_split_is_in_the_run_identity(tmp_path):
    # two semi-synthetic splits that differ only in their val / test counts build the same
    # graph (the same data fingerprint): only the identity keeps their runs apart
    cfg = BaselineConfig(method="origin")
    a = RunSpec("cora_full", "r", "origin", cfg, ("semi_lt", 0.5, 0.1, 0.2, False))
    b = RunSpec("cora_full", "r", "origin", cfg, ("semi_lt", 0.5, 0.2, 0.3, False))
    budget = Budget(seeds=(1,), epochs=5, patience=2)
    ia, ib = (s.identity(1, budget, "cpu", {"nodes": 10}) for s in (a, b))
    assert ia != ib
    cache = RunCache(tmp_path)
    assert cache.path(a, ia) != cache.path(b, ib)


@pytest.mark.parametrize("method", ["hiertail", "origin"])
def test_the_trainer_gets_the_budgets_epochs_and_patience(monkeypatch, method):
    import hiertail_fast.baselines.harness as harness
    import hiertail_fast.train as train

    seen = {}
    monkeypatch.setattr(train, "train_hiertail", lambda *a, **kw: seen.update(kw) or {})
    monkeypatch.setattr(harness, "train_baseline", lambda *a, **kw: seen.update(kw) or {})
    spec = RunSpec("d", "r", method, None)
    runner._train(spec, None, None, None, 1, Budget(seeds=(1,), epochs=500, patience=20), "cpu")
    assert (seen["epochs"], seen["patience"], seen["seed"]) == (500, 20, 1)


def test_the_ablation_runs_the_requested_preset():
    args = types.SimpleNamespace(config="official", hidden=None, lr=None)
    ctx = types.SimpleNamespace(args=args, datasets=["cora_full"])
    rows = [s for s in ablation.specs(ctx) if s.method == "hiertail"]
    assert rows
    for s in rows:
        switches = ablation.ROWS[s.row][1]
        assert s.config == ablation.hiertail_config("official", "cora_full", args, **switches)
        assert s.config != ablation.hiertail_config("paper", "cora_full", args, **switches)


def test_an_ablation_row_short_of_seeds_says_so():
    args = types.SimpleNamespace(config="paper", hidden=None, lr=None)
    ctx = types.SimpleNamespace(args=args, datasets=["toy"], budget=Budget(seeds=(1, 2, 3)),
                                paper_lookup=lambda f: (lambda d, r, m: None))
    recs = [{"spec": RunSpec("toy", "m1_m2_ce", "hiertail", None), "identity": {"seed": s},
             "result": _result(), "wall_s": 1.0} for s in (1, 2)]
    line = next(ln for ln in ablation.report(ctx, recs)[0].splitlines() if "M1 + M2" in ln)
    assert "| 2 of 3 |" in line


def test_the_summary_wall_time_is_the_runs_total():
    recs = [{"spec": RunSpec("toy", "r", "origin", None), "identity": {"seed": s},
             "result": _result(), "wall_s": w} for s, w in ((1, 2.0), (2, 3.0))]
    assert runner.summarize(recs)[("toy", "r")]["wall_s"] == 5.0


def test_budget_refusals_and_texts():
    with pytest.raises(ValueError, match="at least one seed"):
        Budget(seeds=())
    for bad in (dict(patience=-1), dict(epochs=0)):
        with pytest.raises(ValueError, match="epochs >= 1 and patience >= 0"):
            Budget(seeds=(1,), **{"epochs": 5, "patience": 2, **bad})
    Budget(seeds=(1,), epochs=1, patience=0)                   # the edges are allowed
    # the official seeds in another order: the same runs, not the protocol's record
    shuffled = Budget(seeds=tuple(reversed(FULL_SEEDS)))
    assert not shuffled.is_full and shuffled.tag() != "" and Budget(FULL_SEEDS).tag() == ""
    assert Budget(seeds=(1, 3, 5, 7, 9, 11, 13, 15)).seed_text() == \
        "8 seeds (1, 3, 5, 7, 9, 11, 13, 15)"
    assert Budget(seeds=tuple(range(1, 19, 2))).seed_text().endswith(", …)")
    assert runner.fmt(math.nan, math.nan) == "–" and runner.fmt(math.nan, None) == "–"


def test_datasets_table_counts_and_missing_paper_cells():
    ei = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])            # 2 undirected edges, 3 nodes
    d = types.SimpleNamespace(x=torch.zeros(3, 4), edge_index=ei, y=torch.tensor([0, 0, 1]),
                              num_classes=2)
    s = statistics(d)
    assert s["edges_directed_plus_self_loops"] == 4 + 3
    ours = {"nodes": 3, "edges": 2, "features": 4, "classes": 2, "imbalance": 0.5,
            "ratio_lt": 1.0}
    row = markdown([{"dataset": "mine", "ours": ours, "paper": None,
                     "matches_paper": None}]).splitlines()[-1]
    assert row.startswith("| mine | 3 / – | 2 / – |") and "/ 0" not in row


def test_report_only_lists_six_missing_runs_then_dots():
    """--report-only: the runs neither cached nor trained are named, six of them, then "...":
    seven missing runs show six and the dots, six show six and none."""
    class Cfg:
        def to_dict(self):
            return {}

    class Source:
        def data_key(self, dataset):
            return {}

        def run_fingerprint(self, spec):
            return "fp"

    class Empty:
        def lookup(self, spec, identity, fingerprint=None):
            return None, None

    for count, dots in ((7, True), (6, False)):
        log = []
        specs = [RunSpec("toy", f"r{i}", "origin", Cfg()) for i in range(count)]
        runner.run_specs(specs, Budget(seeds=(1,)), Source(), Empty(), progress=False,
                         log=log.append, notice=lambda _line: None, train=False)
        last = log[-1]
        assert last.startswith(f"{count} of {count} runs are not cached and were not trained")
        assert last.count("toy r") == 6 and last.endswith(" ...") is dots, last


def test_summary_rows_keep_each_seeds_epochs_and_the_runs_total_wall_time():
    """A row's ``epochs_run`` lists each seed's count in the order of its ``seeds``, and the
    comparison row's ``train_wall_s`` is the row's total training time (the runs' sum)."""
    from hiertail_fast.experiments.report import comparison_rows

    recs = [{"spec": RunSpec("toy", "r", "origin", None), "identity": {"seed": s},
             "result": {**_result(), "epochs_run": e}, "wall_s": w}
            for s, e, w in ((7, 40, 2.0), (3, 10, 3.0), (5, 25, 4.0))]
    summary = runner.summarize(recs)
    assert summary[("toy", "r")]["seeds"] == [7, 3, 5]
    assert summary[("toy", "r")]["epochs_run"] == [40, 10, 25]
    (row,) = comparison_rows(summary, [("toy", "r", "R")], lambda d, r, m: None)
    assert (row["seeds"], row["epochs_run"], row["train_wall_s"]) == ([7, 3, 5], [40, 10, 25],
                                                                      9.0)
