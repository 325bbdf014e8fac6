"""The reproduction harness's bookkeeping: which rows a table shows under which dataset, what a
row's mean and seeds are made of, which runs share a cache file, which arguments name a
summary, and the provenance lines that say where the numbers come from. Each test was written
for a mutant that survived the other tests (a mutation audit); records are made up, every
expected value is computed here from the module's documented rule."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from hiertail_fast.experiments import report, runner
from hiertail_fast.experiments.common import Context
from hiertail_fast.experiments.runner import Budget, RunSpec

pytestmark = pytest.mark.usefixtures("one_thread")

METRICS = ("bacc", "macro_f1", "g_means", "acc")


def _record(dataset, row, seed, values, **extra):
    """A finished run: test metrics ``values`` (metric -> fraction, or one fraction for all)."""
    test = values if isinstance(values, dict) else dict.fromkeys(METRICS, values)
    return {"spec": RunSpec(dataset, row, "x", None), "identity": {"seed": seed}, "wall_s": 1.0,
            "result": {"test": test, "epochs_run": 1}, **extra}


def _table_row(dataset, label):
    return {"dataset": dataset, "label": label, "n": 1, "verdict": "x",
            "metrics": {m: {"ours": {"mean": 1.0, "std": 0.0}, "paper": None,
                            "comparison": None} for m in METRICS}}


# ------------------------------------------------------------------ tables and provenance
def test_markdown_table_lists_under_each_dataset_only_its_rows():
    """markdown_table writes one table per dataset (its docstring): a row of Wiki must not
    appear under Email's heading, where it would read as an Email result. A mutation audit
    found every row printed under every heading unnoticed (the table tests look rows up by
    label, the first match)."""
    md = report.markdown_table([_table_row("email", "Origin"), _table_row("wiki", "Re-weight"),
                                _table_row("email", "SMOTE")], 1)
    email, wiki = md.split("### wiki")
    assert email.startswith("### email")
    labels = {name: [line.split("|")[1].strip() for line in part.splitlines()
                     if line.startswith("| ") and not line.startswith("| Method")]
              for name, part in (("email", email), ("wiki", wiki))}
    assert labels == {"email": ["Origin", "SMOTE"], "wiki": ["Re-weight"]}


def test_markdown_table_keeps_the_datasets_in_the_order_of_the_rows():
    """markdown_table's tables follow the order of the rows it is given (the paper's column
    order: Cora-Full, BlogCatalog, Email, Wiki), not the datasets' names in alphabetical order:
    wiki's rows first -> wiki's table first."""
    md = report.markdown_table([_table_row("wiki", "Origin"), _table_row("email", "Origin"),
                                _table_row("cora_full", "Origin")], 1)
    headings = [line for line in md.splitlines() if line.startswith("### ")]
    assert headings == ["### wiki", "### email", "### cora_full"]


def test_runs_code_lists_most_runs_first_and_the_warning_counts_the_other_runs():
    """runs_code: the code versions of the reported runs, most runs first (its docstring); the
    provenance warning says how many runs were trained at ANOTHER version than the command's.
    With 3 runs at the command's commit and 1 elsewhere: [b 3, a 1] and '1 of 4'. A mutation
    audit found the order reversed, and the warning counting the runs at this commit (3 of 4),
    unnoticed (the existing test has 1 run each way, so both counts are 1)."""
    records = [{"git_commit": "a", "git_dirty": False}] + [
        {"git_commit": "b", "git_dirty": False}] * 3
    versions = report.runs_code(records)
    assert [(v["git_commit"], v["runs"]) for v in versions] == [("b", 3), ("a", 1)]
    (line,) = report._runs_code_lines({"git_commit": "b", "git_dirty": False,
                                       "runs_code": versions})
    assert line.startswith("- **1 of 4 runs were trained at another code version")


def test_runs_of_installed_copies_are_told_apart_by_package_version():
    """An installed copy has no commit of its own (None): its runs are keyed by the package
    version, so an upgrade between cached runs is reported (a packaging audit: with only the
    commit, every installed run read None == None and the warning could not fire)."""
    records = [{"git_commit": None, "git_dirty": None, "package_version": "0.1.0"}] + [
        {"git_commit": None, "git_dirty": None, "package_version": "0.2.0"}] * 2
    versions = report.runs_code(records)
    assert [(v["package_version"], v["runs"]) for v in versions] == [("0.2.0", 2), ("0.1.0", 1)]
    here = {"git_commit": None, "git_dirty": None, "package_version": "0.2.0",
            "runs_code": versions}
    (line,) = report._runs_code_lines(here)
    assert "1 of 3 runs were trained at another code version" in line
    assert "version `0.1.0` (no git checkout) 1" in line
    # a record of a checkout keeps its commit as its identity, whatever its version field says
    assert runner.code_key({"git_commit": "c", "git_dirty": False, "package_version": "9"}) == (
        runner.code_key({"git_commit": "c", "git_dirty": False}))


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_code_version_of_a_copy_inside_another_repository_has_no_commit(tmp_path):
    """A wheel installed in a venv inside the user's own git project: code_version named the
    user's HEAD as this code's commit (a packaging audit). Only a checkout that tracks this
    package gives a commit; the copy gives None and the package version."""
    import hiertail_fast

    user = tmp_path / "project"
    site = user / ".venv" / "site"
    shutil.copytree(Path(hiertail_fast.__file__).parent, site / "hiertail_fast",
                    ignore=shutil.ignore_patterns("__pycache__", "kernels"))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(user)]
    subprocess.run(["git", "init", "-q", str(user)], check=True)
    (user / "main.py").write_text("print(1)\n")
    subprocess.run([*git, "add", "main.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "user's own"], check=True)
    code = ("import json; from hiertail_fast.experiments.runner import code_version; "
            "print(json.dumps(code_version()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(site)}, check=True)
    got = json.loads(out.stdout)
    assert got == {"git_commit": None, "git_dirty": None,
                   "package_version": hiertail_fast.__version__}
    # and this checkout, which tracks the package, still names its commit
    if runner.git("ls-files", "--error-unmatch", "--", "__init__.py") is not None:
        assert runner.code_version()["git_commit"] == runner.git("rev-parse", "HEAD")


def test_threads_text_marks_a_dataset_whose_runs_used_two_thread_counts():
    """A dataset whose runs trained at different torch thread counts is marked mixed (the
    count changes the float sums, so the numbers): email 1 and 2 -> '(**mixed**', wiki 2 alone
    -> no mark. A mutation audit found the mark could be lost for two counts unnoticed."""
    text = report._threads_text({"runs_threads": {"email": [1, 2], "wiki": [2]}, "threads": 1})
    email, wiki = text.split("; torch threads of the runs: ")[1].split(", ")
    assert email.startswith("email 1 and 2 (**mixed**") and wiki == "wiki 2"
    # no run reported (all diverged): not the command's count, which named 2 threads for runs
    # at 1 (an experiments audit, session 67); a summary from before runs_threads: the command's
    assert report._threads_text({"runs_threads": {}, "threads": 2}) == (
        "; no run reported, so no runs' torch threads to name")
    assert report._threads_text({"threads": 2}) == ", 2 torch thread(s)"


def test_summary_runs_of_a_legacy_summary_counts_the_seeds_of_its_rows():
    """A summary written before its ``runs`` entry existed holds the seeds of its rows
    (summary_runs docstring): rows of 3 and 2 seeds are 5 runs, per-class methods likewise, so
    --report-only over fewer runs cannot replace it. A mutation audit found each row counted
    as one run unnoticed."""
    assert report.summary_runs({"rows": [{"n": 3}, {"n": 2}]}) == 3 + 2
    assert report.summary_runs({"datasets": [{"methods": {"a": {"seeds": 4},
                                                          "b": {"seeds": 2}}}]}) == 4 + 2
    assert report.summary_runs({"runs": 7, "rows": [{"n": 3}]}) == 7


def test_a_written_summary_records_how_many_runs_it_holds(tmp_path):
    """A summary written now carries its ``runs`` entry (summary_runs: only summaries written
    before it existed lack one): a payload given without it is written with the seeds of its
    rows, 3 + 2; one that has it keeps its own."""
    report.write_outputs(tmp_path, "main", "t\n", {"args": {"name": "main"},
                                                   "rows": [{"n": 3}, {"n": 2}]},
                         log=lambda line: None)
    assert json.loads((tmp_path / "main.json").read_text())["runs"] == 5
    report.write_outputs(tmp_path / "b", "main", "t\n", {"args": {}, "runs": 7, "rows": []},
                         log=lambda line: None)
    assert json.loads((tmp_path / "b" / "main.json").read_text())["runs"] == 7


def test_new_numbers_with_the_same_run_count_replace_the_summary(tmp_path):
    """write_outputs leaves a summary alone only when it holds the same results; the same
    arguments and as many runs but other numbers (e.g. runs retrained on other data) must
    replace it, the old one kept as .prev. A mutation audit found the rows left out of the
    comparison unnoticed: the stale table was kept and the log said 'already holds these
    results'."""
    base = {"args": {"name": "main"}, "runs": 2, "provenance": {"runs_code": []}}
    log = []
    report.write_outputs(tmp_path, "main", "bAcc 50.0\n", {**base, "rows": [{"bacc": 50.0}]},
                         log=log.append)
    report.write_outputs(tmp_path, "main", "bAcc 60.0\n", {**base, "rows": [{"bacc": 60.0}]},
                         log=log.append)
    assert (tmp_path / "main.md").read_text() == "bAcc 60.0\n"
    assert json.loads((tmp_path / "main.json").read_text())["rows"] == [{"bacc": 60.0}]
    assert (tmp_path / "main.prev.md").read_text() == "bAcc 50.0\n"
    assert not any("already holds" in line for line in log)


def test_a_summary_whose_arguments_include_one_this_command_lacks_is_kept(tmp_path):
    # "other arguments" both ways: an old summary with an option the new command does not
    # have (another version's) is kept, the new one written under a hashed name (compared one
    # way only, it was replaced and demoted to .prev; mutation audit, session 69)
    old = {"args": {"seeds": 3, "foo": "bar"}, "runs": 1}
    report.write_outputs(tmp_path, "main", "# old\n", old, log=lambda line: None)
    log = []
    paths = report.write_outputs(tmp_path, "main", "# new\n", {"args": {"seeds": 3}, "runs": 1},
                                 log=log.append)
    assert (tmp_path / "main.md").read_text() == "# old\n"
    assert not (tmp_path / "main.prev.md").exists()
    assert any(p.name.startswith("main-") and p.read_text() == "# new\n" for p in paths)


def test_a_summary_of_other_data_is_kept_not_replaced(tmp_path):
    """The same arguments on other data (another --data-dir, an edited file: other
    fingerprints) replaced the summary in place, and a third run lost it (a README audit:
    REPRODUCTION says a summary made by other arguments is never overwritten). Each data set
    gets its own file; the same data replaces its own; a summary written before fingerprints
    were recorded counts as the same data."""
    base = {"args": {"name": "main"}, "runs": 1, "provenance": {"runs_code": []}}
    log = []

    def write(text, fps):
        payload = {**base, "rows": [{"bacc": text}], "data_fingerprints": fps}
        report.write_outputs(tmp_path, "main", f"{text}\n", payload, log=log.append)

    write("A1", {"email": "sha256:a"})
    write("B1", {"email": "sha256:b"})
    assert (tmp_path / "main.md").read_text() == "A1\n"
    assert "comes from other data; kept" in log[-1]
    (other,) = [p for p in tmp_path.glob("main-*.md")]
    assert other.read_text() == "B1\n"
    write("A2", {"email": "sha256:a"})
    write("B2", {"email": "sha256:b"})
    assert (tmp_path / "main.md").read_text() == "A2\n" and other.read_text() == "B2\n"
    assert (tmp_path / "main.prev.md").read_text() == "A1\n"
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    report.write_outputs(legacy, "main", "old\n", {**base, "rows": [1]}, log=log.append)
    report.write_outputs(legacy, "main", "new\n", {**base, "rows": [2],
                                                    "data_fingerprints": {"email": "x"}},
                         log=log.append)
    assert (legacy / "main.md").read_text() == "new\n"


def test_summaries_of_two_commands_on_a_third_data_set_each_keep_their_own(tmp_path):
    """The third name is hashed by the arguments *and* the data (write_outputs docstring): two
    commands of other arguments, each run on data A, B and C, keep six summaries; C's of the
    first command is not replaced by C's of the second (a name hashed by the data alone is the
    same for both, and the second took the first's file, leaving it only as .prev)."""
    log = []
    for args in ("X", "Y"):
        for data in "ABC":
            payload = {"args": {"name": args}, "runs": 1, "rows": [{"bacc": args + data}],
                       "data_fingerprints": {"email": f"sha256:{data}"}}
            report.write_outputs(tmp_path, "main", f"{args}{data}\n", payload, log=log.append)
    summaries = sorted(p.read_text() for p in tmp_path.glob("*.md") if ".prev" not in p.name)
    assert summaries == [f"{a}{d}\n" for a in "XY" for d in "ABC"]
    assert not list(tmp_path.glob("*.prev.*"))


# ------------------------------------------------------------------ aggregation over seeds
def test_summarize_keeps_datasets_apart_and_names_each_rows_own_seeds():
    """summarize groups by (dataset, row): a row's mean pools only its dataset's seeds, and
    ``seeds`` lists the seeds those runs were trained with. Email seeds 5, 9 (bAcc 50, 60)
    and Wiki seed 5 (bAcc 10) -> Email n 2, mean 55, seeds [5, 9]. A mutation audit found a
    row pooling every dataset's runs (n 3, mean 40), and seeds counted up from the first
    ([5, 6]), unnoticed: the tests use one dataset and consecutive seeds."""
    out = runner.summarize([_record("email", "origin", 5, 0.5), _record("email", "origin", 9, 0.6),
                            _record("wiki", "origin", 5, 0.1)])
    email = out[("email", "origin")]
    assert (email["n"], email["seeds"]) == (2, [5, 9])
    assert email["bacc"]["mean"] == pytest.approx(statistics.fmean([50.0, 60.0]))
    assert out[("wiki", "origin")]["bacc"]["mean"] == pytest.approx(10.0)


def test_per_class_seeds_column_counts_the_seeds_not_the_classes():
    """The per-class table's seeds column (and the JSON's ``seeds``) is the number of runs
    averaged: 2 seeds on a 3-class graph -> 2. A mutation audit found the class count
    printed there unnoticed."""
    import matplotlib.pyplot as plt
    import numpy as np
    import torch

    from hiertail_fast.experiments import per_class

    y = torch.from_numpy(np.repeat([0, 1, 2], [10, 50, 40]))

    class Source:
        def load(self, name):
            return type("G", (), {"y": y})()

    records = [{"spec": RunSpec("toy", row, "x", None), "identity": {"seed": s},
                "result": {"test_per_class": [0.1, 0.2, 0.3]}}
               for row in per_class.ROWS for s in (1, 2)]
    ctx = Context(argparse.Namespace(), Budget((1, 2)), Source(), None, ["toy"])
    md, payload, figs = per_class.report(ctx, records)
    for fig in figs.values():
        plt.close(fig)
    for label in per_class.ROWS.values():
        line = next(x for x in md.splitlines() if x.startswith(f"| {label} |"))
        assert line.split("|")[2].strip() == "2"
    assert [m["seeds"] for m in payload["datasets"][0]["methods"].values()] == [2, 2]


def _sensitivity(values):
    """sensitivity.report over a γ × τ grid with bAcc ``values[(g, t)]`` and Macro-F1 half
    of it."""
    import matplotlib.pyplot as plt

    from hiertail_fast.experiments import sensitivity

    gammas = sorted({g for g, _ in values})
    taus = sorted({t for _, t in values})
    from hiertail_fast.experiments.sensitivity import PART_OPTIONS

    ns = argparse.Namespace(config="paper", parts="grid", gammas=",".join(map(str, gammas)),
                            taus=",".join(map(str, taus)), **{
                                k: v for part in ("activation", "hidden", "dropout")
                                for k, v in PART_OPTIONS[part].items()})
    records = [_record("toy", f"gamma={g:g},tau={t:g}", 1,
                       {"bacc": v / 100, "macro_f1": v / 200, "g_means": 0.0, "acc": 0.0})
               for (g, t), v in values.items()]
    md, _, figs = sensitivity.report(Context(ns, Budget((1,)), None, None, ["toy"]), records)
    z = figs["toy-gamma-tau"].axes[0].images[0].get_array()
    for fig in figs.values():
        plt.close(fig)
    return md, z, gammas, taus


def test_sensitivity_table_range_and_heatmap_follow_the_grid():
    """The paper's claim checked by the sensitivity table: bAcc varies by < 5 points over the
    γ × τ grid; the table prints 'bAcc range' = max − min of the grid's bAcc means, each row's
    bAcc then Macro-F1, and the heatmap has a row per γ and a column per τ. Here the range is
    54 − 45 = 9 (not within the claim). A mutation audit found the range taken from the first
    cell (4.0) or over Macro-F1 (4.5) — both would report the claim met — the two columns
    swapped, and the heatmap transposed, all unnoticed (the end-to-end test reads no
    number)."""
    values = {(0.01, 0.01): 50.0, (0.01, 0.1): 52.0, (0.01, 1.0): 54.0,
              (0.1, 0.01): 51.0, (0.1, 0.1): 45.0, (0.1, 1.0): 53.0}
    md, z, gammas, taus = _sensitivity(values)
    spread = max(values.values()) - min(values.values())
    assert f"γ × τ grid: bAcc range {spread:.1f} points (paper: < 5)." in md
    line = next(x for x in md.splitlines() if "| gamma=0.01,tau=0.01 |" in x)
    assert [c.strip() for c in line.split("|")[4:6]] == ["50.0 ± 0.0", "25.0 ± 0.0"]
    assert z.tolist() == [[values[(g, t)] for t in taus] for g in gammas]


# ------------------------------------------------------------------ the per-run cache
@pytest.mark.parametrize("change", ["epochs", "config", "device"])
def test_runs_that_differ_in_epochs_config_or_device_get_their_own_cache_files(tmp_path,
                                                                              change):
    """A run is one (dataset, split, method, configuration, seed) under one budget (epochs,
    patience) on one device type (runner module doc), and a cached file is reused without
    retraining: runs differing in the epoch limit, in the configuration (here the lr) or in
    the device type must not share a file, or the other run's numbers are served. A mutation
    audit found each of the three could be dropped from the identity unnoticed (only the
    patience had a test; the CLI tests vary the method, which names the file)."""
    from hiertail_fast.nn.hiertail import HierTailConfig

    cache = runner.RunCache(tmp_path)
    key = {"nodes": 10, "edges": 20, "features": 3, "classes": 2}
    spec = RunSpec("email", "hiertail_paper", "hiertail", HierTailConfig.paper())
    other = {"config": RunSpec("email", "hiertail_paper", "hiertail",
                               HierTailConfig.paper(lr=0.5))}.get(change, spec)
    budget = Budget(epochs=300, patience=100)
    a = spec.identity(123, budget, "cpu", key)
    b = other.identity(123, Budget(epochs=500, patience=100) if change == "epochs" else budget,
                       "cuda" if change == "device" else "cpu", key)
    assert cache.path(spec, a) != cache.path(other, b)


def test_only_the_official_seeds_are_the_full_protocol():
    """The full protocol is the official seeds 123..132 (runner.FULL_SEEDS) with 10,000 epochs
    and patience 1,000: ten other seeds (a --seed-base run) are a reduced budget, labelled so
    and given a file tag. A mutation audit found any ten seeds accepted as the protocol's
    unnoticed (the header then said 'the full protocol')."""
    b = Budget(tuple(range(10)))
    assert not b.is_full and b.tag() == "-s10-e10000-p1000"
    assert b.header().startswith("**REDUCED BUDGET: 10 seeds (0..9)")
    assert Budget((127,)).header().startswith("**REDUCED BUDGET: 1 seed (127) × ≤ 10,000")
    assert Budget((1, 2, 5)).describe().startswith("3 seeds (1, 2, 5) × ")
    assert Budget((126, 125, 124)).describe().startswith("3 seeds (126, 125, 124) × ")
    assert Budget(tuple(range(20, 0, -2))).describe().startswith(
        "10 seeds (20, 18, 16, 14, 12, 10, 8, 6, …) × ")
    assert Budget(runner.FULL_SEEDS).is_full


def test_a_data_source_keeps_each_splits_graph_and_fingerprint():
    """DataSource.run_inputs gives each run the prepared graph of the data it trains on, and
    run_fingerprint the fingerprint of that data (runner docs): a natural and a semi-synthetic
    run of one dataset, or two semi-synthetic α, must not share them. A mutation audit found
    both cached per dataset unnoticed (the semi-synthetic graph then trained on the natural
    graph's adjacency; α = 0.5's runs stamped with α = 0.8's fingerprint)."""
    from hiertail_fast.nn.hiertail import HierTailConfig

    src = runner.DataSource(None, synthetic={"nodes": 300, "classes": 8, "features": 4})
    cfg = HierTailConfig.paper()
    natural = RunSpec("synthetic", "r", "hiertail", cfg)
    semi = {a: RunSpec("synthetic", "r", "hiertail", cfg, ("semi_lt", a, 1, 2, False))
            for a in (0.8, 0.5)}
    _, _, g_natural = src.run_inputs(natural, 1)
    data, _, g_semi = src.run_inputs(semi[0.8], 1)
    assert g_natural.num_nodes == 300 and g_semi.num_nodes == int(data.y.shape[0]) < 300
    for a, spec in semi.items():
        assert src.run_fingerprint(spec) == runner.data_fingerprint(src._semi(spec, 0).data), a
    assert src.run_fingerprint(semi[0.8]) != src.run_fingerprint(semi[0.5])


def test_the_synthetic_graph_takes_its_seed_degree_and_feature_norm():
    """DataSource's --synthetic graph is make_synthetic_graph(nodes, classes, average degree
    SYNTHETIC_DEGREE = 6, features, seed) with the command's seed, normalised by feature_norm;
    data_key holds its node, (directed) edge, feature and class counts."""
    import torch

    from hiertail_fast.data.datasets import normalize_features
    from hiertail_fast.data.synthetic import make_synthetic_graph

    spec = {"nodes": 300, "classes": 8, "features": 4, "seed": 3}
    got = runner.DataSource(None, synthetic=spec).load("synthetic")
    want = make_synthetic_graph(300, num_classes=8, avg_degree=6.0, num_features=4, seed=3)
    assert torch.equal(got.x, want.x) and torch.equal(got.edge_index, want.edge_index)
    assert torch.equal(got.y, want.y)
    src = runner.DataSource(None, synthetic=spec, feature_norm="row")
    assert torch.equal(src.load("synthetic").x, normalize_features(want, "row").x)
    assert not torch.equal(want.x, normalize_features(want, "row").x)
    assert src.data_key("synthetic") == {"nodes": 300, "edges": int(want.edge_index.shape[1]),
                                         "features": 4, "classes": 8, "feature_norm": "row"}


def test_run_classes_counts_the_classes_a_semi_synthetic_run_keeps():
    """DataSource.run_classes: the class count of the graph the run trains on; a semi-synthetic
    split keeps only the classes large enough for it (5 of the synthetic graph's 8 here)."""
    from hiertail_fast.nn.hiertail import HierTailConfig

    src = runner.DataSource(None, synthetic={"nodes": 300, "classes": 8, "features": 4})
    cfg = HierTailConfig.paper()
    semi = RunSpec("synthetic", "r", "hiertail", cfg, ("semi_lt", 0.5, 3, 5, False))
    assert src.run_classes(RunSpec("synthetic", "r", "hiertail", cfg)) == 8
    assert src.run_classes(semi) == src._semi(semi, 0).info["kept_classes"] == 5


def test_data_fingerprint_covers_the_edges():
    """data_fingerprint hashes x, edge_index AND y (its docstring): a rewired graph of the
    same shape (same x, labels and edge count) must not reuse the cached runs of the original.
    A mutation audit found edge_index could be left out of the hash unnoticed (the cache
    tests change the features, one test the labels)."""
    import torch

    from hiertail_fast.data.io import GraphData

    x, y = torch.ones(3, 1), torch.tensor([0, 1, 1])
    g = GraphData(torch.tensor([[0, 1], [1, 0]]), x, y, 2)
    rewired = GraphData(torch.tensor([[1, 2], [2, 1]]), x, y, 2)
    assert runner.data_fingerprint(g) != runner.data_fingerprint(rewired)
    assert runner.data_fingerprint(g) == runner.data_fingerprint(
        GraphData(g.edge_index.clone(), x.clone(), y.clone(), 2))

# ------------------------------------------------------------------ command line
def test_budget_options_reach_the_budget():
    """--epochs and --patience override the budget's (cli help): `main --patience 7` trains
    with patience 7 (and names its files -p7). A mutation audit found --patience ignored
    unnoticed (the tests only pass --epochs)."""
    from hiertail_fast.experiments.cli import budget_from_args, build_parser

    parse = build_parser().parse_args
    b = budget_from_args(parse(["main", "--patience", "7", "--epochs", "40"]))
    assert (b.seeds, b.epochs, b.patience) == (runner.FULL_SEEDS, 40, 7)
    assert budget_from_args(parse(["main", "--quick", "--patience", "0"])).patience == 0


@pytest.mark.parametrize("option", [["--lr", "0.5"], ["--hidden", "16"],
                                    ["--adj-norm", "row"], ["--feature-norm", "row"]])
def test_options_that_change_the_numbers_name_their_own_summary(option):
    """A summary made with other arguments is never replaced (cli --out help); only options
    that change where / how fast results are written are left out of the comparison
    (_NOT_RESULT_ARGS). A mutation audit found --lr could be listed there unnoticed: `main
    --lr 0.5` then replaced the default-lr summary as if it were the same table."""
    from hiertail_fast.experiments.cli import _result_args, build_parser

    parse = build_parser().parse_args
    assert _result_args(parse(["main"])) != _result_args(parse(["main", *option]))


@pytest.mark.parametrize("option", [["--threads", "1"], ["--no-progress"], ["--out", "elsewhere"],
                                    ["--runs-dir", "runs2"], ["--report-only"]])
def test_options_that_only_change_where_or_how_fast_share_the_summary(option):
    # the other side of the rule: a rerun with --threads 1 (etc.) is the same table and
    # replaces / keeps its own summary (--threads counted as a result argument wrote a second,
    # hashed summary with every test passing; mutation audit, session 69)
    from hiertail_fast.experiments.cli import _result_args, build_parser

    parse = build_parser().parse_args
    assert _result_args(parse(["main"])) == _result_args(parse(["main", *option]))


def test_report_only_notes_a_row_missing_on_one_of_two_datasets(tmp_path):
    """--report-only notes every (dataset, row) with no finished run. Origin cached on Email
    only: the Wiki row is absent from the table and named in the notes. A mutation audit
    found the check matching rows by name alone unnoticed (Email's run hid Wiki's gap)."""
    from hiertail_fast.data.io import GraphData
    from hiertail_fast.data.synthetic import make_synthetic_graph
    from hiertail_fast.experiments.cli import main

    data = tmp_path / "data"
    data.mkdir()
    for name, seed in (("email", 0), ("wiki", 1)):
        g = make_synthetic_graph(120, num_classes=6, avg_degree=6.0, num_features=8, seed=seed)
        GraphData(edge_index=g.edge_index, x=g.x, y=g.y, num_classes=g.num_classes).to_npz(
            data / f"{name}.npz")
    base = ["main", "--seeds", "1", "--epochs", "2", "--hidden", "8", "--no-progress",
            "--device", "cpu", "--methods", "origin", "--data-dir", str(data), "--runs-dir",
            str(tmp_path / "runs")]
    main([*base, "--datasets", "email", "--out", str(tmp_path / "a")])
    res = main([*base, "--datasets", "email,wiki", "--report-only", "--out", str(tmp_path / "b")])
    assert [(r["dataset"], r["row"]) for r in res["rows"]] == [("email", "origin")]
    assert "- wiki / origin: no finished run yet (--report-only)" in res["notes"]
    assert not any(n.startswith("- email / origin") for n in res["notes"])


def test_a_row_the_paper_does_not_have_gets_no_paper_cell():
    """paper_cell gives None where the paper has no such dataset / row (its docstring), so a
    baseline added to the registry later shows '–' and 'no paper value', never another row's
    numbers. A mutation audit found a fallback to the dataset's HierTail row unnoticed."""
    from hiertail_fast.experiments.paper_numbers import TABLE2_MAIN, TABLE5_TASKS, paper_cell

    assert paper_cell(TABLE2_MAIN, "email", "brand_new", "bacc") is None
    assert paper_cell(TABLE2_MAIN, "synthetic", "origin", "bacc") is None
    assert paper_cell(TABLE5_TASKS, "cora_full", (3, 1), "acc") is None
    assert paper_cell(TABLE2_MAIN, "email", "origin", "acc") == (66.7, 2.1)


class _SlowFigure:
    """A figure whose saving takes a while: the window between a command choosing its
    summary's name and replacing the files there."""

    def savefig(self, path, **kwargs):
        import time

        time.sleep(0.4)
        Path(path).write_bytes(b"png")


def _write_summary(out: str, lr: float) -> None:
    payload = {"args": {"name": "per-class", "lr": lr}, "runs": 1,
               "provenance": {"runs_code": []}, "rows": [{"lr": lr}]}
    report.write_outputs(Path(out), "per-class", f"lr {lr}\n", payload,
                         {"synthetic": _SlowFigure()}, log=lambda line: None)


@pytest.mark.skipif(sys.platform == "win32", reason="the folder lock is fcntl's")
def test_commands_writing_one_folder_at_once_keep_every_summary(tmp_path):
    """Three commands of other arguments writing their summaries into one --out at once:
    each chose the plain name (none there yet) and rotated what the others had written by
    then, so one summary was demoted to .prev and another lost (6 of 12 tries; a concurrency
    audit). The choice and the replacement hold the folder's lock now: three summaries, one
    under the plain name and two under hashed ones, as run one after the other."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_summary, args=(str(tmp_path), lr))
             for lr in (0.01, 0.02, 0.03)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    kept = sorted(json.loads(f.read_text())["args"]["lr"]
                  for f in tmp_path.glob("per-class*.json") if ".prev" not in f.name)
    assert kept == [0.01, 0.02, 0.03]
    assert not list(tmp_path.glob("*.prev.*")) and not list(tmp_path.glob(".*tmp*"))


@pytest.mark.skipif(sys.platform == "win32", reason="the folder lock is fcntl's")
def test_threads_writing_one_folder_at_once_keep_every_summary(tmp_path):
    """The same from three threads of one process (a notebook's or a sweep's threads): the
    lock's count of holds was per process, so the second thread took it as re-entry and
    walked in unlocked: a summary demoted or lost (a thread audit). Each thread holds the
    lock on a descriptor of its own now."""
    import threading

    errors = []

    def write(lr):
        try:
            _write_summary(str(tmp_path), lr)
        except Exception as exc:     # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(lr,)) for lr in (0.01, 0.02, 0.03)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    kept = sorted(json.loads(f.read_text())["args"]["lr"]
                  for f in tmp_path.glob("per-class*.json") if ".prev" not in f.name)
    assert kept == [0.01, 0.02, 0.03]
    assert not list(tmp_path.glob("*.prev.*")) and not list(tmp_path.glob(".*tmp*"))


def test_the_folder_lock_is_reentrant_in_a_thread_and_exclusive_across_threads(tmp_path):
    """Re-entry in one thread does not deadlock; a second thread waits for the first. Both
    run in daemon threads joined with a timeout: a lock that stops being re-entrant fails the
    test instead of hanging the suite (an audit's mutant hung it for minutes)."""
    import threading
    import time

    from hiertail_fast._files import folder_lock

    order = []

    def second():
        with folder_lock(tmp_path):
            order.append("second")

    def first():
        with folder_lock(tmp_path), folder_lock(tmp_path):      # re-entrant
            t = threading.Thread(target=second, daemon=True)
            t.start()
            time.sleep(0.3)
            order.append("first")
        t.join(10)

    runner = threading.Thread(target=first, daemon=True)
    runner.start()
    runner.join(30)
    assert not runner.is_alive(), "folder_lock deadlocked on re-entry in one thread"
    assert order == ["first", "second"]


def test_a_cache_put_waits_for_the_runs_folders_lock(tmp_path):
    """`put` reads, moves aside and writes a run file as one step under the folder lock: two
    commands sharing --runs-dir that retrained one run on other data at once each moved the
    file the other had just moved (a crash after all training). Here a put started while
    another holder has the lock writes nothing until it is released, then both runs are
    there (B's in place, A's kept beside it)."""
    import threading

    from hiertail_fast._files import folder_lock

    cache, spec, identity = runner.RunCache(tmp_path), _origin_spec(), _run_identity(123)
    run_a = {**_run_record(identity, 0.25), "data_fingerprint": "sha256:" + "a" * 64}
    run_b = {**_run_record(identity, 0.75), "data_fingerprint": "sha256:" + "b" * 64}
    cache.put(spec, identity, run_a)
    p = cache.path(spec, identity)
    with folder_lock(p.parent):
        t = threading.Thread(target=cache.put, args=(spec, identity, run_b))
        t.start()
        t.join(0.5)
        assert t.is_alive(), "put did not wait for the folder lock"
        assert json.loads(p.read_text()) == run_a and len(list(p.parent.iterdir())) == 1
    t.join(10)
    assert not t.is_alive()
    assert cache.lookup(spec, identity, run_b["data_fingerprint"]) == (run_b, None)
    assert cache.lookup(spec, identity, run_a["data_fingerprint"]) == (run_a, None)


def test_run_specs_trains_each_run_with_its_own_seed(tmp_path, monkeypatch):
    """Run (spec, seed) trains WITH that seed (model init, dropout, a baseline's synthesis), not
    only on that seed's split: a runner passing the budget's first seed to every trainer kept
    each record's own identity seed and split, and passed the suite (a mutation audit)."""
    import hiertail_fast.baselines.harness as harness
    import hiertail_fast.train as train
    from hiertail_fast.baselines import BaselineConfig
    from hiertail_fast.nn.hiertail_config import HierTailConfig

    seen = []

    def fake(data, split, cfg, *, seed, **kw):
        seen.append(seed)
        m = {k: 0.5 for k in runner.METRICS}
        return {"test": m, "val": m, "epochs_run": 1, "test_per_class": []}

    monkeypatch.setattr(train, "train_hiertail", fake)
    monkeypatch.setattr(harness, "train_baseline", fake)
    src = runner.DataSource(None, synthetic={"nodes": 200, "classes": 4, "features": 8})
    specs = [RunSpec("synthetic", "hiertail_paper", "hiertail", HierTailConfig.paper()),
             RunSpec("synthetic", "origin", "origin", BaselineConfig(method="origin"))]
    recs = runner.run_specs(specs, Budget(seeds=(5, 6, 7), epochs=2, patience=1), src,
                            runner.RunCache(tmp_path / "runs"), progress=False,
                            log=lambda _line: None, notice=lambda _line: None)
    assert seen == [5, 6, 7, 5, 6, 7]
    assert [r["identity"]["seed"] for r in recs] == [5, 6, 7, 5, 6, 7]


def test_a_run_record_names_the_thread_count_it_trained_with(tmp_path, monkeypatch):
    """Without a per-dataset ``threads`` rule a run still records the torch thread count it
    trained with (the summaries' provenance names it; None there means a run recorded before
    the count was), and such an older record is reused without a notice of another count."""
    import torch

    import hiertail_fast.baselines.harness as harness
    from hiertail_fast.baselines import BaselineConfig

    def fake(data, split, cfg, *, seed, **kw):
        m = {k: 0.5 for k in runner.METRICS}
        return {"test": m, "val": m, "epochs_run": 1, "test_per_class": []}

    monkeypatch.setattr(harness, "train_baseline", fake)
    src = runner.DataSource(None, synthetic={"nodes": 200, "classes": 4, "features": 8})
    spec = RunSpec("synthetic", "origin", "origin", BaselineConfig(method="origin"))
    cache = runner.RunCache(tmp_path / "runs")
    (rec,) = runner.run_specs([spec], Budget(seeds=(1,), epochs=2, patience=1), src, cache,
                              progress=False, log=lambda _line: None,
                              notice=lambda _line: None)
    assert rec["threads"] == torch.get_num_threads()
    (path,) = (tmp_path / "runs" / "synthetic").glob("origin-*.json")
    assert json.loads(path.read_text())["threads"] == torch.get_num_threads()
    # a record from before the count was recorded is reused without a thread-count notice
    legacy = {k: v for k, v in json.loads(path.read_text()).items() if k != "threads"}
    path.write_text(json.dumps(legacy))
    notices = []
    (again,) = runner.run_specs([spec], Budget(seeds=(1,), epochs=2, patience=1), src, cache,
                                progress=False, log=lambda _line: None, notice=notices.append,
                                threads=lambda _dataset: 1)
    assert "threads" not in again and notices == []


def test_run_records_name_the_commit_the_process_started_with(tmp_path, monkeypatch):
    """A commit or checkout while a long experiment trains must not relabel its runs: every
    record names the code the process started with (run_specs reads code_version before the
    first run; read lazily, the first record named the commit checked out during its
    training; an old fix without a test, found in session 70)."""
    import hiertail_fast.experiments.run_cache as run_cache
    import hiertail_fast.train as train
    from hiertail_fast.nn.hiertail_config import HierTailConfig

    head = {"now": "a" * 40}
    monkeypatch.setattr(run_cache, "git", lambda *a: {"ls-files": "__init__.py", "status": "",
                                                      "rev-parse": head["now"]}[a[0]])

    def fake(data, split, cfg, *, seed, **kw):
        head["now"] = "b" * 40                  # the checkout moves while the run trains
        m = {k: 0.5 for k in runner.METRICS}
        return {"test": m, "val": m, "epochs_run": 1, "test_per_class": []}

    monkeypatch.setattr(train, "train_hiertail", fake)
    run_cache.code_version.cache_clear()
    try:
        src = runner.DataSource(None, synthetic={"nodes": 200, "classes": 4, "features": 8})
        spec = RunSpec("synthetic", "hiertail_paper", "hiertail", HierTailConfig.paper())
        recs = runner.run_specs([spec], Budget(seeds=(1, 2), epochs=2, patience=1), src,
                                runner.RunCache(tmp_path / "runs"), progress=False,
                                log=lambda _line: None, notice=lambda _line: None)
    finally:
        run_cache.code_version.cache_clear()
    assert [r["git_commit"] for r in recs] == ["a" * 40] * 2


def test_a_cached_record_missing_one_test_metric_is_a_miss(tmp_path):
    """A cached run whose test metrics lack one of the four is no run record (the summaries read
    all four: such a record crashed them with a KeyError after all the training); accepting a
    record with ANY metric passed the suite (a mutation audit)."""
    from hiertail_fast.baselines import BaselineConfig

    cache = runner.RunCache(tmp_path)
    spec = RunSpec("synthetic", "origin", "origin", BaselineConfig(method="origin"))
    identity = spec.identity(1, Budget(seeds=(1,)), "cpu", {"nodes": 3})
    test = {m: 0.5 for m in runner.METRICS if m != "g_means"}
    path = cache.path(spec, identity)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"identity": identity, "result": {"test": test, "epochs_run": 3},
                                "wall_s": 1.0}))
    got, why = cache.lookup(spec, identity)
    assert got is None and "not a complete run record" in why
    # all four metrics but no epochs_run: a miss as well (served, summarize raised KeyError
    # 'epochs_run'; mutation audit, session 69)
    path.write_text(json.dumps({"identity": identity, "wall_s": 1.0, "result": {
        "test": {m: 0.5 for m in runner.METRICS}}}))
    got, why = cache.lookup(spec, identity)
    assert got is None and "not a complete run record" in why


def test_the_data_fingerprint_reads_shapes_and_dtypes():
    # "name, dtype, shape and bytes": the same bytes reshaped, or as another dtype, are other
    # data (either dropped from the header passed every test; mutation audit, session 69)
    import types

    import numpy as np

    from hiertail_fast.experiments.run_cache import data_fingerprint

    ei, y = np.array([[0, 1], [1, 0]]), np.array([0, 1, 1, 0, 1, 0])

    def fp(x):
        return data_fingerprint(types.SimpleNamespace(x=x, edge_index=ei, y=y))

    x = np.arange(12, dtype=np.float32)
    assert fp(x.reshape(6, 2)) != fp(x.reshape(2, 6))
    assert fp(np.zeros((6, 2), np.int32)) != fp(np.zeros((6, 2), np.float32))
    assert fp(x.reshape(6, 2)) == fp(x.reshape(6, 2).copy())


# ---- RunCache's identity and fingerprint rules, migrate's dry run (a mutation audit, s42)
def _origin_spec():
    from hiertail_fast.baselines import BaselineConfig

    return RunSpec("email", "origin", "origin", BaselineConfig(method="origin"))


def _run_identity(seed):
    return _origin_spec().identity(seed, Budget(seeds=(seed,)), "cpu", {"nodes": 10})


def _run_record(identity, bacc):
    return {"identity": identity, "row": "origin", "wall_s": 1.0,
            "result": {"test": dict.fromkeys(runner.METRICS, bacc), "epochs_run": 3}}


def test_a_file_holding_another_runs_identity_is_not_served(tmp_path):
    """A run's file name carries a hash of its identity and lookup compares the stored one: a
    file at the path that holds another run (copied into place, a 12-hex digest collision)
    would put another seed's result into a table."""
    cache, spec = runner.RunCache(tmp_path), _origin_spec()
    mine, other = _run_identity(123), _run_identity(124)
    p = cache.path(spec, mine)
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps(_run_record(other, 0.9)))
    record, _ = cache.lookup(spec, mine, None)
    assert record is None
    p.write_text(json.dumps(_run_record(mine, 0.5)))        # its own record is served
    assert cache.get(spec, mine)["result"]["test"]["bacc"] == 0.5


def test_a_record_without_a_fingerprint_is_reused(tmp_path):
    """runner's docstring: records written before the fingerprint existed "are still reused on
    their shape alone" (counted as other data, the committed cache would be retrained)."""
    cache, spec = runner.RunCache(tmp_path), _origin_spec()
    identity = _run_identity(123)
    legacy = _run_record(identity, 0.5)
    p = cache.path(spec, identity)
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps(legacy))
    record, problem = cache.lookup(spec, identity, "sha256:" + "ab" * 32)
    assert problem is None and record == legacy


def _legacy_identity(source, dataset: str) -> dict:
    """The identity of a seed-1 Origin run on ``dataset`` of ``source`` (a runner.DataSource),
    as the records written before the data fingerprint existed hold it."""
    return {"dataset": dataset, "data": source.data_key(dataset), "split": ["natural"],
            "method": "origin", "seed": 1}


def test_migrate_fingerprints_dry_run_counts_and_writes_nothing(tmp_path):
    """--dry-run: "count, write nothing"; the real run then adds the runner's fingerprint."""
    from hiertail_fast.experiments.migrate_fingerprints import migrate
    from hiertail_fast.experiments.runner import DataSource

    source = DataSource(None, {"nodes": 120, "classes": 6, "features": 16})
    identity = _legacy_identity(source, "synthetic")
    p = tmp_path / "runs" / "synthetic" / "origin-abc-s1.json"
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps(_run_record(identity, 0.5), indent=1) + "\n")
    before = p.read_bytes()
    stats = migrate(tmp_path / "runs", tmp_path, dry_run=True, log=lambda line: None)
    assert stats["migrated"] == 1 and p.read_bytes() == before
    stats = migrate(tmp_path / "runs", tmp_path, log=lambda line: None)
    assert stats["migrated"] == 1
    assert json.loads(p.read_text())["data_fingerprint"] == source.fingerprint("synthetic")



def test_migrate_fingerprints_gives_each_record_its_own_datas_fingerprint(tmp_path, capsys):
    """Each legacy record gets the fingerprint of the data of its own identity (a synthetic
    graph under each --feature-norm), written right after ``identity``; an unreadable file
    leaves the command's exit status at 1."""
    from hiertail_fast.experiments import migrate_fingerprints
    from hiertail_fast.experiments.runner import DataSource

    syn = {"nodes": 120, "classes": 6, "features": 16}
    runs = tmp_path / "runs"
    (runs / "synthetic").mkdir(parents=True)
    expected = {}
    for norm in ("none", "row"):
        source = DataSource(None, syn, norm)
        identity = _legacy_identity(source, "synthetic")
        p = runs / "synthetic" / f"origin-{norm}-s1.json"
        p.write_text(json.dumps(_run_record(identity, 0.5)))
        expected[p] = source.fingerprint("synthetic")
    assert len(set(expected.values())) == 2
    assert migrate_fingerprints.main([str(runs), "--data-dir", str(tmp_path)]) == 0
    for p, fingerprint in expected.items():
        record = json.loads(p.read_text())
        assert record["data_fingerprint"] == fingerprint, p.name
        keys = list(record)
        assert keys[keys.index("identity") + 1] == "data_fingerprint"
    assert "added a fingerprint to 2 record(s); 0 had one; 0 left without one" in \
        capsys.readouterr().out
    (runs / "synthetic" / "truncated.json").write_text('{"identity": ')
    assert migrate_fingerprints.main([str(runs), "--data-dir", str(tmp_path)]) == 1
    assert "added a fingerprint to 0 record(s); 2 had one; 1 left without one" in \
        capsys.readouterr().out


def test_migrate_fingerprints_replaces_an_empty_fingerprint(tmp_path, capsys):
    """A record whose ``data_fingerprint`` is present but empty (null or "", a hand-edited or
    foreign record) is migrated like one without it: the file then holds the data's fingerprint,
    once, right after ``identity`` (the copy of the old empty value must not overwrite it)."""
    from hiertail_fast.experiments import migrate_fingerprints
    from hiertail_fast.experiments.runner import DataSource

    source = DataSource(None, {"nodes": 120, "classes": 6, "features": 16})
    identity = _legacy_identity(source, "synthetic")
    runs = tmp_path / "runs"
    (runs / "synthetic").mkdir(parents=True)
    paths = []
    for i, empty in enumerate((None, "")):
        p = runs / "synthetic" / f"origin-empty{i}-s1.json"
        p.write_text(json.dumps({**_run_record(identity, 0.5), "data_fingerprint": empty}))
        paths.append(p)
    assert migrate_fingerprints.main([str(runs), "--data-dir", str(tmp_path)]) == 0
    assert "added a fingerprint to 2 record(s); 0 had one" in capsys.readouterr().out
    for p in paths:
        record = json.loads(p.read_text())
        assert record["data_fingerprint"] == source.fingerprint("synthetic"), p.name
        keys = list(record)
        assert keys[keys.index("identity") + 1] == "data_fingerprint"
        assert keys.count("data_fingerprint") == 1 and record["result"]["epochs_run"] == 3


def test_migrate_fingerprints_reads_the_data_from_hiertail_data_by_default(tmp_path, monkeypatch,
                                                                          capsys):
    """Without --data-dir the records' data is read from $HIERTAIL_DATA (the module's
    docstring: "default, as the experiments"), not from ../shared/data: a legacy email record
    gets the fingerprint of $HIERTAIL_DATA's email graph, and the command exits 0."""
    from hiertail_fast.data.io import GraphData
    from hiertail_fast.data.synthetic import make_synthetic_graph
    from hiertail_fast.experiments import migrate_fingerprints
    from hiertail_fast.experiments.runner import DataSource

    g = make_synthetic_graph(120, num_classes=6, avg_degree=6.0, num_features=16, seed=0)
    data = tmp_path / "d"
    data.mkdir()
    GraphData(edge_index=g.edge_index, x=g.x, y=g.y, num_classes=g.num_classes).to_npz(
        data / "email.npz")
    source = DataSource(data, None)
    identity = _legacy_identity(source, "email")
    p = tmp_path / "work" / "runs" / "email" / "origin-x-s1.json"
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps(_run_record(identity, 0.5)))
    monkeypatch.setenv("HIERTAIL_DATA", str(data))
    monkeypatch.chdir(tmp_path / "work")
    assert migrate_fingerprints.main(["runs"]) == 0
    assert "added a fingerprint to 1 record(s); 0 had one; 0 left without one" in \
        capsys.readouterr().out
    assert json.loads(p.read_text())["data_fingerprint"] == source.fingerprint("email")


# ---- the run of other data kept beside a run's file (a mutation audit, s43)
def test_a_kept_run_is_served_only_whole_and_only_for_its_own_data(tmp_path):
    """`put` moves the run of other data of the same shape to ``<name>.data-<16 hex>.json``
    and `lookup` serves it when that data comes back, but only a whole run record whose full
    fingerprint is that data's: the file name holds 16 hex digits of it (another graph's run
    sharing them, or a half record moved there, would have been served into a table, or crash
    the summary with a KeyError after all training), and only of this run's identity."""
    cache, spec = runner.RunCache(tmp_path), _origin_spec()
    identity = _run_identity(123)
    fp_a, fp_b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    run_a = {**_run_record(identity, 0.25), "data_fingerprint": fp_a}
    run_b = {**_run_record(identity, 0.75), "data_fingerprint": fp_b}
    cache.put(spec, identity, run_a)
    cache.put(spec, identity, run_b)                 # A's run moves beside B's
    kept = cache.path(spec, identity).with_name(
        cache.path(spec, identity).stem + ".data-" + "a" * 16 + ".json")
    assert json.loads(kept.read_text()) == run_a
    assert cache.lookup(spec, identity, fp_a) == (run_a, None)
    assert cache.lookup(spec, identity, fp_b) == (run_b, None)
    other_run = {**run_a, "identity": _run_identity(124)}     # a file copied into place
    assert runner._is_run_record(other_run)
    for planted in ({**run_a, "data_fingerprint": "sha256:" + "a" * 16 + "c" * 48},
                    {**run_a, "result": {}}, other_run):
        kept.write_text(json.dumps(planted))
        record, problem = cache.lookup(spec, identity, fp_a)
        assert record is None and runner.OTHER_DATA in problem, planted


def test_a_put_replaces_the_run_file_whole_and_keeps_numpy_floats(tmp_path):
    """`put` writes the record to a new file that then takes the run's name (a reader that
    opened the old record reads it whole, never a truncated or half-written one), and a
    numpy float of the record (a float32 metric) is stored as that float."""
    import numpy as np

    cache, spec = runner.RunCache(tmp_path), _origin_spec()
    identity = _run_identity(123)
    first = _run_record(identity, 0.5)
    p = cache.put(spec, identity, first)
    with p.open() as reader:
        second = _run_record(identity, 0.25)
        second["result"]["test"]["acc"] = np.float32(0.75)
        cache.put(spec, identity, second)
        assert json.loads(reader.read()) == first
    stored = json.loads(p.read_text())
    assert stored["result"]["test"]["acc"] == 0.75
    assert cache.get(spec, identity)["result"]["test"] == {**dict.fromkeys(runner.METRICS, 0.25),
                                                            "acc": 0.75}


def test_a_put_of_the_same_datas_run_keeps_no_copy_beside_it(tmp_path):
    """`put` moves the file's run beside the new one only when it was made from OTHER data
    (its docstring): a run of the same data rewritten (retrained after a partial record) leaves
    the run's file alone in its folder, holding the new record."""
    cache, spec = runner.RunCache(tmp_path), _origin_spec()
    identity = _run_identity(123)
    fp = "sha256:" + "a" * 64
    p = cache.put(spec, identity, {**_run_record(identity, 0.25), "data_fingerprint": fp})
    cache.put(spec, identity, {**_run_record(identity, 0.75), "data_fingerprint": fp})
    assert sorted(x.name for x in p.parent.iterdir()) == [p.name]
    assert cache.lookup(spec, identity, fp)[0]["result"]["test"]["bacc"] == 0.75


def test_runs_threads_sorts_each_datasets_counts_with_an_unknown_one_last():
    """runs_threads: dataset -> its runs' thread counts, sorted, None (a run recorded before
    its count was) last; the datasets in name order, as the provenance line lists them."""
    records = [_record("wiki", "origin", 1, 0.5, threads=2),
               _record("email", "origin", 1, 0.5, threads=None),
               _record("email", "origin", 2, 0.5, threads=4),
               _record("email", "reweight", 1, 0.5, threads=1),
               _record("email", "reweight", 2, 0.5, threads=4)]
    got = report.runs_threads(records)
    assert list(got.items()) == [("email", [1, 4, None]), ("wiki", [2])]
    assert report._threads_text({"runs_threads": got}) == (
        "; torch threads of the runs: email 1 and 4 and ? (**mixed**: its runs' numbers "
        "depend on it), wiki 2")


def test_a_cached_record_with_a_non_numeric_test_metric_is_a_miss(tmp_path):
    """A whole run record holds a number for each test metric (`_is_run_record`): a metric
    that is null or text (a hand-edited or foreign file) makes the file a miss, retrained,
    not a record served into the summary, whose mean then fails or is garbage."""
    cache, spec = runner.RunCache(tmp_path), _origin_spec()
    identity = _run_identity(123)
    p = cache.path(spec, identity)
    p.parent.mkdir(parents=True)
    for bad in (None, "0.5", [0.5]):
        record = _run_record(identity, 0.5)
        record["result"]["test"]["macro_f1"] = bad
        p.write_text(json.dumps(record))
        got, why = cache.lookup(spec, identity)
        assert got is None and "not a complete run record" in why, bad
