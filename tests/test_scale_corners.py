"""bench/scale.py and bench/_scale_worker.py: corners the s43 mutation audit found unpinned
(each test failed on one of its mutants). In-process, fake epochs, no timing
beyond sleeps that only overshoot.
"""
from __future__ import annotations

import sys

import pytest

from tests.conftest import recorded_plot_lines
from tests.test_scale import scale

worker = sys.modules["_scale_worker"]

SPEC = dict(method="gcn", nodes=100, classes=4, avg_degree=4.0, features=8, hidden=8,
            config="paper", epochs=3, warmup=0, device="cpu", seed=0, cpu_memory="rss",
            threads=None, loss_dtype=None)


def _setup_with_losses(losses_seq):
    def setup(spec, nodes):
        it, losses = iter(losses_seq + [1.0] * 10), []

        def epoch():
            losses.append(next(it))
        return epoch, 10, losses, None
    return setup


def test_rss_peak_without_a_hwm_reset_is_the_whole_process_peak(monkeypatch):
    """Where /proc/self/clear_refs cannot be written, VmHWM is the whole process's peak (it may
    predate the baseline): documented as reported as such. Subtracting the baseline anyway
    would understate it, down to a negative 'peak'. With the reset, the baseline
    comes off."""
    fake = {"VmRSS": 300, "VmHWM": 1000}
    monkeypatch.setattr(worker, "_proc_status_bytes", lambda field: fake[field])
    monkeypatch.setattr(worker, "_setup", _setup_with_losses([1.0]))
    monkeypatch.setattr(worker, "_reset_peak_rss", lambda: False)
    assert worker.run_worker(dict(SPEC))["peak_memory_bytes"] == 1000
    monkeypatch.setattr(worker, "_reset_peak_rss", lambda: True)
    assert worker.run_worker(dict(SPEC))["peak_memory_bytes"] == 700


def test_a_nan_loss_in_any_timed_epoch_is_flagged(monkeypatch):
    """A run whose loss went NaN in an early epoch and back to finite values must still read
    'ok (non-finite loss)': checking only the last loss reported a diverged run as plain 'ok'
   ."""
    monkeypatch.setattr(worker, "_setup", _setup_with_losses([float("nan"), 1.0, 1.0]))
    res = worker.run_worker(dict(SPEC, cpu_memory="tracked"))
    assert res["status"] == "ok (non-finite loss)"
    assert res["timed_epochs"] == 3


def test_timed_epochs_stop_once_run_seconds_are_spent(monkeypatch):
    """The worker stops timing epochs once RUN_SECONDS are spent (at least one epoch): without
    it a run of slow epochs takes --epochs times as long and overruns the time budget the
    sweep planned."""
    monkeypatch.setattr(worker, "RUN_SECONDS", 0.0)
    monkeypatch.setattr(worker, "_setup", _setup_with_losses([1.0]))
    res = worker.run_worker(dict(SPEC, cpu_memory="tracked", epochs=5))
    assert res["timed_epochs"] == 1
    monkeypatch.setattr(worker, "RUN_SECONDS", 1e9)
    assert worker.run_worker(dict(SPEC, cpu_memory="tracked", epochs=5))["timed_epochs"] == 5



class _Bar:
    def __init__(self):
        self.updates, self.lines = 0, []

    def update(self, n):
        self.updates += n

    def write(self, line):
        self.lines.append(line)


def test_progress_counts_and_prints_every_run_skipped_or_not(monkeypatch):
    """The tqdm bar of a sweep advances once per (size, method) and prints each row as it
    finishes, skipped rows included: a bar stuck short of its total (or silent skips) makes an
    hour-long sweep look hung."""
    monkeypatch.setattr(scale, "run_one", lambda spec, timeout: {
        "edges": 10, "epoch_seconds": 0.5, "peak_memory_bytes": 1e6, "device": "cpu",
        "status": "ok", "warmup_epochs": 1, "timed_epochs": 3})
    args = scale.parse_args(["--sizes", "1000", "2000", "--methods", "gcn", "hiertail-reference",
                             "--device", "cpu"])
    bar = _Bar()
    budget = scale.predict_memory("gcn", 2000, classes=70, features=128, hidden=128,
                                  avg_degree=10.0) + 1
    rows = scale.sweep(args, budget, bar)
    assert [r["status"].split(":")[0] for r in rows] == ["ok", "skipped", "ok", "skipped"]
    assert bar.updates == 4
    assert bar.lines == [scale.format_row(r) for r in rows]


def test_avg_degree_must_stay_below_the_smallest_size_minus_one(capsys):
    """The generator needs avg_degree < n - 1 (a simple graph has at most n - 1 neighbours a
    node): 99 on 100 nodes must be refused before any run, not fail inside every worker an
    hour into the sweep."""
    argv = ["--sizes", "100", "--classes", "2", "--device", "cpu", "--avg-degree"]
    with pytest.raises(SystemExit) as exc:
        scale.parse_args(argv + ["99"])
    assert exc.value.code == 2
    assert "--avg-degree 99 must be below the smallest size minus one (99)" in (
        capsys.readouterr().err)
    assert scale.parse_args(argv + ["98.5"]).avg_degree == 98.5


def test_a_second_sweep_says_where_the_first_results_went(tmp_path, monkeypatch, capsys):
    """The first sweep's results move to scale.prev.*; the user must be told so on stdout, or
    the earlier (perhaps full) sweep looks lost."""
    monkeypatch.setattr(scale, "run_one", lambda spec, timeout: {
        "edges": 10, "epoch_seconds": 0.1, "peak_memory_bytes": 1e6, "status": "ok"})
    argv = ["--sizes", "100", "--methods", "gcn", "--warmup", "0", "--epochs", "1",
            "--device", "cpu", "--out", str(tmp_path), "--no-plot"]
    assert scale.main(argv) == 0
    assert "previous results" not in capsys.readouterr().out
    assert scale.main(argv) == 0
    out = capsys.readouterr().out
    assert "the previous results are kept as " in out
    assert str(tmp_path / "scale.prev.csv") in out and str(tmp_path / "scale.prev.json") in out


def test_plot_legend_leaves_out_methods_with_nothing_measured(tmp_path, monkeypatch):
    """A method every run of which was skipped draws no points: its legend entry (a colour
    with no line) would suggest data that does not exist; its predicted-memory line is
    labelled as such."""
    report = sys.modules["_scale_report"]
    drawn = recorded_plot_lines(monkeypatch)
    base = dict(edges=10, device="cpu", once_seconds="")
    rows = [dict(base, method="gcn", nodes=100, epoch_seconds=0.1, peak_memory_bytes=2e6,
                 status="ok", predicted_memory_bytes=1e6),
            dict(base, method="gcn", nodes=1000, epoch_seconds="", peak_memory_bytes="",
                 status="skipped: would need ~9.0 GB (budget 4.0 GB)",
                 predicted_memory_bytes=9e9),
            dict(base, method="hiertail", nodes=100, epoch_seconds="", peak_memory_bytes="",
                 status="skipped: would need ~9.0 GB (budget 4.0 GB)",
                 predicted_memory_bytes=9e9)]
    report.plot(rows, tmp_path / "scale.png")
    labels = [label for _, _, label in drawn]
    assert labels.count("gcn") == 2 and labels.count("_hiertail") == 2
    assert "hiertail" not in labels
    assert ([100, 1000], [2.0, 9000.0], "gcn (predicted)") in drawn


def test_a_dense_graph_the_cli_accepts_runs_in_the_default_rss_mode():
    """A degree parse_args accepts runs: --avg-degree is checked against the smallest size,
    but in the default --cpu-memory rss mode the worker first primes on a
    max(2·classes, 200)-node graph, which had the SAME avg_degree: any --avg-degree >= 199
    (dense graphs, which the memory model covers) made every run fail ('avg_degree must be in
    [0, num_nodes - 1)'), and the sweep wrote nothing and exited 1 (an s43 audit)."""
    args = scale.parse_args(["--sizes", "300", "--classes", "4", "--avg-degree", "250",
                             "--device", "cpu"])
    spec = dict(method="gcn", nodes=300, classes=4, avg_degree=args.avg_degree, features=8,
                hidden=8, config="paper", epochs=1, warmup=0, device="cpu", seed=0,
                cpu_memory="rss", threads=1, loss_dtype=None)
    res = worker.run_worker(spec)
    assert res["status"] == "ok" and res["edges"] > 300 * 100     # the asked, dense degree
