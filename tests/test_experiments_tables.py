"""The table writers put the paper's numbers in the right cells (one test per table), compute
Δ in units of the paper's std and the verdicts; records are made up, the paper's values come
from hiertail_fast.experiments.paper_numbers."""
from __future__ import annotations

import argparse

import pytest
import torch

from hiertail_fast.experiments import (
    ablation,
    datasets_table,
    main_table,
    semi_synthetic,
    tasks,
)
from hiertail_fast.experiments.common import Context
from hiertail_fast.experiments.paper_numbers import TABLE2_MAIN, Cell
from hiertail_fast.experiments.report import compare, row_verdict
from hiertail_fast.experiments.runner import Budget, RunSpec

METRIC_ORDER = ("bacc", "macro_f1", "g_means", "acc")


class FakeSource:
    """Each dataset with the paper's Table 1 shape (nodes, features, classes), or ``shapes``'."""

    def __init__(self, classes=70, shapes=None):
        self.classes = classes
        self.shapes = shapes or {}

    def data_key(self, name):
        return {"classes": self.classes}

    def load(self, name):
        from hiertail_fast.experiments.paper_numbers import TABLE1_DATASETS

        paper = TABLE1_DATASETS.get(name, dict(nodes=10, features=3, classes=self.classes))
        nodes, features, classes = self.shapes.get(
            name, (paper["nodes"], paper["features"], paper["classes"]))
        return argparse.Namespace(x=torch.empty(nodes, features), num_classes=classes)


def _ctx(datasets, **args) -> Context:
    values = dict(methods=None, config="paper", task_counts=None, hidden=None, lr=None,
                  adj_norm=None, alpha=0.8, val_per_class=25, test_per_class=55,
                  alignment_bug=False)
    ns = argparse.Namespace(**{**values, **args})
    return Context(ns, Budget((1, 2)), FakeSource(), None, list(datasets))


def _records(dataset, row, metrics_x100, seeds=(1, 2)):
    """Two seeds at the same values (std 0) so the mean is exactly ``metrics_x100``."""
    spec = RunSpec(dataset, row, "x", None)
    return [{"spec": spec, "identity": {"seed": s}, "wall_s": 1.0,
             "result": {"test": {m: v / 100 for m, v in metrics_x100.items()},
                        "epochs_run": 10}} for s in seeds]


def _cells(markdown: str, label: str) -> list[str]:
    """The cells of the table line whose first cell is ``label``."""
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == label:
            return cells
    raise AssertionError(f"no row {label!r} in\n{markdown}")


def _paper_cell(cells, metric) -> str:
    return cells[2 + 3 * METRIC_ORDER.index(metric) + 1]


def _delta_cell(cells, metric) -> str:
    return cells[2 + 3 * METRIC_ORDER.index(metric) + 2]


def test_table2_cells_hold_the_papers_numbers():
    ours = {"bacc": 48.9 + 2 * 4.5, "macro_f1": 45.2, "g_means": 69.5 - 1.5 * 3.2, "acc": 66.7}
    records = (_records("email", "origin", ours)
               + _records("wiki", "hiertail_official", {m: 50.0 for m in METRIC_ORDER}))
    ctx = _ctx(["email", "wiki"], methods="origin,hiertail_official")
    md, payload, _ = main_table.report(ctx, records)
    email = md.split("### wiki")[0]
    origin = _cells(email, "Origin")
    assert [_paper_cell(origin, m) for m in METRIC_ORDER] == [
        "48.9 ± 4.5", "45.2 ± 4.3", "69.5 ± 3.2", "66.7 ± 2.1"]
    assert origin[2] == "57.9 ± 0.0"
    assert [_delta_cell(origin, m) for m in METRIC_ORDER] == ["+2.0σ", "+0.0σ", "-1.5σ", "+0.0σ"]
    assert origin[-1] == "mixed"
    official = _cells(md.split("### wiki")[1], "HierTail (official config)")
    assert [_paper_cell(official, m) for m in METRIC_ORDER] == [
        "52.8 ± 2.0", "54.1 ± 2.3", "71.9 ± 1.4", "67.2 ± 1.1"]   # the paper's 'Ours', Wiki
    assert official[-1] == "below"
    rows = {(r["dataset"], r["row"]): r for r in payload["rows"]}
    assert rows[("email", "origin")]["metrics"]["bacc"]["paper"] == {"mean": 48.9, "std": 4.5}


def test_table2_transcription_spot_checks():
    # a few cells read off the .tex by hand, one per block of the table
    assert TABLE2_MAIN["cora_full"]["embed_smote"]["g_means"] == Cell(73.9, 0.4)
    assert TABLE2_MAIN["blogcatalog"]["hiertail"]["acc"] == Cell(23.2, 0.6)
    assert TABLE2_MAIN["email"]["graphens"]["g_means"] == Cell(71.1, 2.2)
    assert TABLE2_MAIN["wiki"]["imgagn"]["macro_f1"] == Cell(42.3, 6.4)
    assert all(len(rows) == 12 for rows in TABLE2_MAIN.values())


def test_table3_cells_hold_the_papers_numbers(monkeypatch):
    monkeypatch.setattr(semi_synthetic, "setting", lambda ctx, d: {
        "kept_classes": 77, "dropped_classes": [], "num_nodes": 1, "num_edges": 2,
        "train_ratio_lt_0.8": 0.25})
    records = _records("amazon_electronics", "hiertail_paper", {m: 23.6 for m in METRIC_ORDER})
    md, _, _ = semi_synthetic.report(_ctx(["amazon_electronics"], methods="hiertail_paper"),
                                     records)
    row = _cells(md, "HierTail (paper config)")
    assert [_paper_cell(row, m) for m in METRIC_ORDER] == [
        "23.6 ± 0.9", "21.0 ± 1.3", "48.5 ± 1.0", "23.6 ± 0.9"]
    assert _delta_cell(row, "bacc") == "+0.0σ" and _delta_cell(row, "g_means") == "-24.9σ"


def test_a_graph_that_is_not_the_papers_gets_no_paper_cells():
    # a user's own graph saved under a paper name (a 266-node, 3-class email.npz) was compared
    # with the paper's row: "+3.0σ above" (an experiments audit, session 67)
    def report(shapes):
        ctx = _ctx(["email", "wiki"])
        ctx.source = FakeSource(shapes=shapes)
        records = []
        for d in ("email", "wiki"):
            records += _records(d, "origin", {m: 50.0 for m in METRIC_ORDER})
        md, payload, _ = main_table.report(ctx, records)
        return md, payload, ctx.notes

    md, payload, notes = report({"email": (266, 128, 3)})
    by = {r["dataset"]: r for r in payload["rows"]}
    assert all(v["paper"] is None for v in by["email"]["metrics"].values())
    assert all(v["paper"] is not None for v in by["wiki"]["metrics"].values())
    assert notes == ["- email: not the paper's graph (nodes 266 vs 1,005, classes 3 vs 42): "
                     "not compared with the paper"]
    md, payload, notes = report({})
    assert notes == [] and all(v["paper"] is not None for r in payload["rows"]
                               for v in r["metrics"].values())


@pytest.mark.parametrize("table, rows", [
    ("ablation", ["m1_m2_ce", "m1_ce", "ce", "origin"]),
    ("tasks", ["tasks=15,5", "tasks=5,3", "tasks=2,1"]),
])
def test_tables_4_and_5_give_a_graph_that_is_not_the_papers_no_paper_cells(table, rows):
    # the same rule in the ablation and task-count tables: a 500-node, 5-class cora_full got
    # the paper's Cora-Full cells (16 of 16 and 4 of 12), silently (a fix-test check, session
    # 68: the fix had a test of the main table only)
    module = {"ablation": ablation, "tasks": tasks}[table]
    ctx = _ctx(["cora_full"])
    ctx.source = FakeSource(classes=5, shapes={"cora_full": (500, 8710, 5)})
    records = []
    for row in rows:
        records += _records("cora_full", row, {m: 50.0 for m in METRIC_ORDER})
    _, payload, _ = module.report(ctx, records)
    cells = [v["paper"] for r in payload["rows"] for v in r["metrics"].values()]
    assert cells and all(c is None for c in cells)
    assert ctx.notes == ["- cora_full: not the paper's graph (nodes 500 vs 19,793, classes 5 vs "
                         "70): not compared with the paper"]
    ctx = _ctx(["cora_full"])                      # the paper's shape: its cells come back
    _, payload, _ = module.report(ctx, records)
    assert any(v["paper"] is not None for r in payload["rows"] for v in r["metrics"].values())


def test_table4_cells_hold_the_papers_numbers():
    records = []
    for row, v in (("m1_m2_ce", 55.8), ("m1_ce", 54.5), ("ce", 52.8), ("origin", 52.8)):
        records += _records("cora_full", row, {m: v for m in METRIC_ORDER})
    md, _, _ = ablation.report(_ctx(["cora_full"]), records)
    full, m1 = _cells(md, "M1 + M2 + L_CE (HierTail)"), _cells(md, "M1 + L_CE")
    ce = _cells(md, "L_CE only")
    origin = _cells(md, "Origin (GCN baseline; paper row = L_CE only)")
    assert [_paper_cell(full, m) for m in METRIC_ORDER] == [
        "55.8 ± 0.5", "57.1 ± 0.5", "74.5 ± 0.3", "64.7 ± 0.7"]
    assert [_paper_cell(m1, m) for m in METRIC_ORDER] == [
        "54.5 ± 0.5", "56.2 ± 0.4", "73.6 ± 0.3", "64.5 ± 0.4"]
    assert [_paper_cell(ce, m) for m in METRIC_ORDER] == [_paper_cell(origin, m)
                                                          for m in METRIC_ORDER] == [
        "52.8 ± 0.6", "54.5 ± 0.7", "72.5 ± 0.4", "62.7 ± 0.5"]


def test_table5_cells_hold_the_papers_numbers_without_std():
    assert tasks.task_counts(70, None) == [(198, 70), (70, 35), (2, 1)]
    # on two classes the second default row is (2, 1) too: one row, not a refusal of the
    # command's own sweep as "given twice" (an experiments audit, session 67)
    assert tasks.task_counts(2, None) == [(6, 2), (2, 1)]
    assert tasks.task_counts(3, None) == [(9, 3), (3, 2), (2, 1)]
    # a pair must hold 1 <= B <= A: 3:4 was taken (the row labelled [3, 4], its second level
    # clamped) with b > a + 1 and every test passing; mutation audit, session 69
    with pytest.raises(ValueError, match="B > A"):
        tasks.task_counts(6, "3:4", 240)
    assert tasks.task_counts(6, "3:3", 240) == [(3, 3)]
    records = []
    for counts, v in (((198, 70), 55.5), ((70, 35), 56.0), ((2, 1), 50.0)):
        records += _records("cora_full", f"tasks={counts[0]},{counts[1]}",
                            {m: v for m in METRIC_ORDER})
    md, _, _ = tasks.report(_ctx(["cora_full"]), records)
    rows = {k: _cells(md, k) for k in ("[198, 70]", "[70, 35]", "[2, 1]")}
    assert [_paper_cell(rows["[198, 70]"], m) for m in METRIC_ORDER] == [
        "55.5", "56.7", "74.2", "64.6"]
    assert _paper_cell(rows["[2, 1]"], "acc") == "65.5"
    assert _delta_cell(rows["[70, 35]"], "bacc") == "+0.2 pt"
    assert rows["[2, 1]"][-1] == "below"


def test_table1_our_statistics_match_the_papers_on_email(data_dir):
    from hiertail_fast.experiments.runner import DataSource

    ctx = _ctx(["email"])
    ctx.source = DataSource(data_dir)
    (row,) = datasets_table.rows(ctx)
    assert row["paper"]["edges"] == 25571 and row["paper"]["ratio_lt"] == 0.79
    assert {k for k, ok in row["matches_paper"].items() if not ok} == {"edges"}
    line = _cells(datasets_table.markdown([row]), "email")
    assert line[1:] == ["1,005 / 1,005", "16,064 / 25,571 ≠", "128 / 128", "42 / 42",
                        "0.009 / 0.009", "0.79 / 0.79"]


@pytest.mark.parametrize("ours, paper, verdict", [
    (50.0, Cell(50.5, 3.0), "reproduced"), (46.0, Cell(50.5, 3.0), "below"),
    (54.0, Cell(50.5, 3.0), "above"), (11.2, Cell(11.0, 0.0), "reproduced"),
    (12.0, Cell(11.0, 0.0), "above"), (55.0, Cell(55.5, None), "reproduced"),
])
def test_verdicts(ours, paper, verdict):
    assert compare(ours, paper)["verdict"] == verdict
    assert compare(ours, None) is None


def test_row_verdicts():
    r, b, a = ({"verdict": v} for v in ("reproduced", "below", "above"))
    assert row_verdict([r, r]) == "reproduced" and row_verdict([r, b]) == "below"
    assert row_verdict([a, b]) == "mixed" and row_verdict([None]) == "no paper value"


# ------------------------------------------------------ boundaries (a mutation audit)
@pytest.mark.parametrize("ours, paper, verdict", [
    (53.5, Cell(50.5, 3.0), "reproduced"), (47.5, Cell(50.5, 3.0), "reproduced"),
    (10.5, Cell(10.0, 0.5), "reproduced"), (53.75, Cell(50.5, 3.0), "above"),
    # decimal boundaries that binary floats miss by an ulp: 53.4 - 52.8 = 0.6000000000000014
    # ("above" before; an experiments audit), one std and a 0.1 point past it
    (53.4, Cell(52.8, 0.6), "reproduced"), (7.5, Cell(7.1, 0.4), "reproduced"),
    (53.5, Cell(52.8, 0.6), "above"), (52.7, Cell(52.2, None), "reproduced"),
    (52.8, Cell(52.2, None), "above"),
    # no paper std: 0.5 points exactly, where 1.1 - 0.6 = 0.5000000000000001 in floats
    (1.1, Cell(0.6, None), "reproduced"), (0.6, Cell(1.1, None), "reproduced"),
])
def test_verdict_at_exactly_one_paper_std_is_reproduced(ours, paper, verdict):
    """|ours − paper| ≤ one paper std is 'reproduced' (report module doc), so exactly one std
    off still counts (values exact in binary floats, so z is exactly ±1.0). A mutation audit
    found '≤' could become '<' unnoticed (the verdict cases were all clear of the boundary)."""
    c = compare(ours, paper)
    assert c["verdict"] == verdict
    if verdict == "reproduced" and paper.std:
        assert abs(c["diff_in_std"]) == pytest.approx(1.0, abs=1e-12)


def test_markdown_table_flags_rows_with_missing_seeds():
    """A row with fewer finished seeds than the budget's shows 'n of N' in the seeds column
    (a full row just 'N'), so a partial mean is never read as the protocol's. A mutation audit
    found the flag could be dropped unnoticed."""
    from hiertail_fast.experiments.report import markdown_table

    def row(label, n):
        return {"dataset": "email", "label": label, "n": n, "verdict": "x",
                "metrics": {m: {"ours": {"mean": 1.0, "std": 0.0}, "paper": None,
                                "comparison": None} for m in METRIC_ORDER}}
    md = markdown_table([row("Origin", 2), row("Re-weight", 3)], 3)
    assert _cells(md, "Origin")[1] == "2 of 3"
    assert _cells(md, "Re-weight")[1] == "3"


def test_per_class_head_holds_the_class_that_crosses_80_percent():
    """per-class: head = the classes holding the first 80 % of the nodes, largest first (module
    text), so the class during which the cumulative share passes 80 % is head; a class is head
    when the nodes of the larger classes before it are < 80 %. Classes 0/1/2 of sizes 10/50/40
    (by size: 1, 2, 0; before class 2: 50 % -> head, before class 0: 90 % -> tail), test
    recall 0 / 100 / 50 % -> head mean 75.0, tail 0.0, all 50.0. A mutation audit found the
    crossing class could be counted as tail unnoticed."""
    import matplotlib.pyplot as plt
    import numpy as np
    import torch

    from hiertail_fast.experiments import per_class

    sizes = {0: 10, 1: 50, 2: 40}
    recall = {0: 0.0, 1: 1.0, 2: 0.5}
    y = torch.from_numpy(np.random.default_rng(0).permutation(
        np.repeat(list(sizes), list(sizes.values()))))

    class Source:
        def load(self, name):
            return type("G", (), {"y": y})()

    # the oracle: walk the classes largest first, head while the nodes before are < 80 %
    head, before = [], 0
    for c in sorted(sizes, key=lambda c: -sizes[c]):
        if before < 0.8 * sum(sizes.values()):
            head.append(c)
        before += sizes[c]
    assert head == [1, 2]
    tail = [c for c in sizes if c not in head]
    ctx = Context(argparse.Namespace(), Budget((1,)), Source(), None, ["toy"])
    records = [{"spec": RunSpec("toy", row, "x", None), "identity": {"seed": 1},
                "result": {"test_per_class": [recall[c] for c in range(3)]}}
               for row in per_class.ROWS]
    md, _, figs = per_class.report(ctx, records)
    for fig in figs.values():
        plt.close(fig)
    for label in per_class.ROWS.values():
        cells = _cells(md, label)
        head_mean = 100 * sum(recall[c] for c in head) / len(head)
        tail_mean = 100 * sum(recall[c] for c in tail) / len(tail)
        assert cells[2:5] == [f"{head_mean:.1f}", f"{tail_mean:.1f}", "50.0"]


def test_per_class_counts_follow_the_class_order():
    """class_counts: "(class order largest first, train count, unlabelled count)": the counts
    in that order, as the figure draws their bars under the recall curve (left in label
    order, one class's bars stood under another's: a mutation audit, s42)."""
    import numpy as np

    from hiertail_fast.data.splits import natural_split_sizes
    from hiertail_fast.experiments.per_class import class_counts

    sizes = np.array([3, 40, 12, 25])                 # labels not in size order
    order, train, unlabelled = class_counts(np.repeat(np.arange(4), sizes))
    assert order.tolist() == [1, 3, 2, 0]
    assert train.tolist() == natural_split_sizes(sizes)[:, 1][order].tolist()
    assert (train + unlabelled).tolist() == sizes[order].tolist()


def test_per_class_figure_has_integer_class_ranks():
    """The figure's x axis is the class rank: integer ticks only (matplotlib put ticks at 2.5,
    7.5, ... for 17 classes; an old fix without a test, 0aa4a89)."""
    import matplotlib.pyplot as plt
    import numpy as np

    from hiertail_fast.experiments.per_class import _figure

    train = np.linspace(40, 2, 17).round()
    fig = _figure("demo", train, 5 * train, {"A": np.linspace(90, 10, 17)})
    try:
        fig.canvas.draw()
        ticks = fig.axes[0].get_xticks()
        assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks), ticks
    finally:
        plt.close(fig)


def test_per_class_equal_size_classes_keep_label_order():
    """Ties in label order (the library's rule: lowest index first): numpy's SIMD quicksort
    orders ties by the CPU's instruction set, so the figure's x axis, classes_by_size and which
    of two equal classes at the 80 % boundary is head would differ between machines (s42
    audit, mutant E43)."""
    import numpy as np

    from hiertail_fast.experiments.per_class import class_counts

    rng = np.random.default_rng(0)
    sizes = rng.integers(20, 24, 40)          # 40 classes, 4 distinct sizes: many ties
    y = np.repeat(np.arange(40), sizes)
    order, train, unlabelled = class_counts(y)
    assert sorted(order.tolist()) == list(range(40))
    s = sizes[order]
    assert (np.diff(s) <= 0).all()                          # largest first
    for a, b in zip(order[:-1], order[1:], strict=True):
        if sizes[a] == sizes[b]:
            assert a < b, (a, b)                            # ties: label order
    assert ((train + unlabelled) == s).all()


def test_a_graph_differing_from_the_papers_in_any_shape_gets_no_paper_cells():
    """Context.paper_lookup: a dataset whose nodes, features or classes differ from the paper's
    Table 1 (fewer or more) is not compared with the paper, with a note naming the difference."""
    records = _records("email", "origin", {m: 50.0 for m in METRIC_ORDER})
    for shape, why in (((1005, 64, 42), "features 64 vs 128"),
                       ((2000, 128, 42), "nodes 2,000 vs 1,005"),
                       ((1005, 128, 50), "classes 50 vs 42")):
        ctx = _ctx(["email"])
        ctx.source = FakeSource(shapes={"email": shape})
        _, payload, _ = main_table.report(ctx, records)
        assert all(v["paper"] is None for r in payload["rows"] for v in r["metrics"].values())
        assert ctx.notes == [f"- email: not the paper's graph ({why}): not compared with the "
                             "paper"]


def test_table5_rows_are_the_commands_task_counts():
    """``tasks --task-counts`` reports the pairs given, in their order, each with its runs;
    the default sweep's rows are not shown."""
    records = []
    for counts, v in (((40, 7), 51.0), ((9, 3), 52.0)):
        records += _records("wiki", f"tasks={counts[0]},{counts[1]}",
                            {m: v for m in METRIC_ORDER})
    md, payload, _ = tasks.report(_ctx(["wiki"], task_counts="40:7,9:3"), records)
    assert [r["label"] for r in payload["rows"]] == ["[40, 7]", "[9, 3]"]
    assert _cells(md, "[40, 7]")[1] == "2" and _cells(md, "[9, 3]")[1] == "2"
    assert "[70, 35]" not in md and "[2, 1]" not in md


def test_per_class_means_stds_and_counts_of_a_dataset():
    """per-class report: each class's mean and population std over the seeds of that dataset's
    row (a class without a value in a seed is left out of that class's mean, not counted as
    0); head = the classes before which the larger classes hold < 80 % of the nodes (a class
    starting exactly at 80 % is tail); the JSON's train / unlabelled counts are the natural
    split's, classes by size."""
    import matplotlib.pyplot as plt
    import numpy as np

    from hiertail_fast.data.splits import natural_split_sizes
    from hiertail_fast.experiments import per_class

    sizes = np.array([50, 30, 20])
    y = torch.from_numpy(np.repeat(np.arange(3), sizes))

    class Source:
        def load(self, name):
            return argparse.Namespace(y=y)

    def rec(dataset, seed, recall):
        return {"spec": RunSpec(dataset, "origin", "x", None), "identity": {"seed": seed},
                "result": {"test_per_class": recall}}

    records = [rec("toy", 1, [0.5, 0.4, None]), rec("toy", 2, [0.7, 0.4, 0.3]),
               rec("other", 1, [0.0, 0.0, 0.0])]
    ctx = Context(argparse.Namespace(), Budget((1, 2)), Source(), None, ["toy"])
    md, payload, figs = per_class.report(ctx, records)
    for fig in figs.values():
        plt.close(fig)
    assert _cells(md, per_class.ROWS["origin"])[1:] == ["2", "50.0", "30.0", "43.3"]
    (entry,) = payload["datasets"]
    origin = entry["methods"]["origin"]
    assert origin["seeds"] == 2
    assert origin["mean"] == pytest.approx([60.0, 40.0, 30.0])
    assert origin["std"] == pytest.approx([10.0, 0.0, 0.0])
    train = natural_split_sizes(sizes)[:, 1]
    assert entry["train_count"] == train.tolist()
    assert entry["unlabelled_count"] == (sizes - train).tolist()
    assert entry["train_count"] != entry["unlabelled_count"]
