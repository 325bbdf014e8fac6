"""bench/scale.py and bench/_scale_worker.py: corners the s43 mutation audit found unpinned
(each test failed on one of its mutants). In-process, fake epochs, no timing
beyond sleeps that only overshoot.
"""
from __future__ import annotations

import csv
import sys

import pytest

from tests.conftest import recorded_plot_lines
from tests.test_scale import scale
from tests.test_scale_tracked_and_imgagn_rng import _sweep_specs

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


def test_a_size_of_exactly_classes_nodes_is_accepted(capsys):
    """Every class needs a node: a size of exactly --classes nodes (one node a class) is a
    valid sweep size; one node fewer is refused before any run, naming the size."""
    argv = ["--classes", "5", "--avg-degree", "2", "--device", "cpu", "--sizes"]
    assert scale.parse_args(argv + ["5", "100"]).sizes == [5, 100]
    with pytest.raises(SystemExit) as exc:
        scale.parse_args(argv + ["4", "100"])
    assert exc.value.code == 2
    assert "sizes [4] are smaller than --classes 5" in capsys.readouterr().err


def test_a_failed_worker_reads_its_last_stderr_line(monkeypatch):
    """run_one: a worker that dies without a result is 'error: ' and the last non-blank line
    of its stderr (a traceback's exception, not its 'Traceback' header), or its exit code
    when it printed nothing."""
    stderr = ("Traceback (most recent call last):\n  File \"w.py\", line 1, in <module>\n"
              "ValueError: avg_degree too large\n\n")
    results = iter([(1, stderr), (3, "")])

    def fake_run(cmd, **kwargs):
        code, err = next(results)
        return scale.subprocess.CompletedProcess(cmd, code, stdout="progress\n", stderr=err)

    monkeypatch.setattr(scale.subprocess, "run", fake_run)
    assert scale.run_one({"nodes": 1}, None) == {"status": "error: ValueError: avg_degree too "
                                                           "large"}
    assert scale.run_one({"nodes": 1}, None) == {"status": "error: exit code 3"}


def test_the_runs_options_reach_every_worker_and_the_loss_dtype_column(monkeypatch, tmp_path):
    """sweep: --threads, --seed and --loss-dtype reach every worker's spec, and the CSV's
    loss_dtype column names the dtype for both HierTail methods (the dense reference casts
    its loss inputs too) and 'n/a' for the others."""
    specs, _ = _sweep_specs(monkeypatch, tmp_path, [
        "--sizes", "100", "--methods", "hiertail", "hiertail-reference", "gcn", "--threads",
        "1", "--seed", "7", "--loss-dtype", "bfloat16", "--device", "cpu"])
    assert [(s["method"], s["threads"], s["seed"], s["loss_dtype"]) for s in specs] == [
        ("hiertail", 1, 7, "bfloat16"), ("hiertail-reference", 1, 7, "bfloat16"),
        ("gcn", 1, 7, "bfloat16")]
    with (tmp_path / "scale.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["loss_dtype"] for r in rows] == ["bfloat16", "bfloat16", "n/a"]


def test_a_run_without_its_warm_up_is_not_plain_ok(monkeypatch):
    """sweep: a run that dropped its warm-up (a long epoch) reads 'ok (0 warm-up + N timed
    epochs: long epochs)' even when all --epochs were timed, so the table says which runs
    were timed cold."""
    monkeypatch.setattr(scale, "run_one", lambda spec, timeout: {
        "edges": 10, "epoch_seconds": 0.1, "peak_memory_bytes": 1e6, "status": "ok",
        "warmup_epochs": 0, "timed_epochs": 3})
    args = scale.parse_args(["--sizes", "100", "--methods", "gcn", "--warmup", "1",
                             "--epochs", "3", "--device", "cpu"])
    assert scale.sweep(args, budget=1e12)[0]["status"] == (
        "ok (0 warm-up + 3 timed epochs: long epochs)")


def test_progress_rows_show_seconds_and_megabytes():
    """format_row (the progress lines and the final table): epoch seconds to 4 decimals and
    the peak in MB of 10**6 bytes, as the 'peak MB' header says, '-' for a run not measured."""
    row = {**dict.fromkeys(scale.CSV_COLUMNS, ""), "method": "gcn", "nodes": 100, "edges": 10,
           "epoch_seconds": 0.25, "peak_memory_bytes": 2_500_000, "device": "cpu",
           "status": "ok"}
    assert scale.format_row(row).split() == ["gcn", "100", "10", "0.2500", "2.5", "cpu", "ok"]
    skipped = dict(row, epoch_seconds="", peak_memory_bytes="", status="skipped")
    assert scale.format_row(skipped).split() == ["gcn", "100", "10", "-", "-", "cpu", "skipped"]


def test_plot_predicts_memory_only_for_runs_skipped_over_memory(tmp_path, monkeypatch):
    """The dashed predicted-memory line follows the runs skipped for memory ('would need');
    sizes skipped after a timeout have no memory figure to draw."""
    report = sys.modules["_scale_report"]
    drawn = recorded_plot_lines(monkeypatch)
    base = dict(method="gcn", edges=10, device="cpu", once_seconds="", epoch_seconds="",
                peak_memory_bytes="")
    rows = [dict(base, nodes=100, epoch_seconds=0.1, peak_memory_bytes=2e6, status="ok",
                 predicted_memory_bytes=1e6),
            dict(base, nodes=1000, status="timed out after 40 s", predicted_memory_bytes=5e6),
            dict(base, nodes=10_000, status="skipped: 1000 nodes timed out (time budget 40 s)",
                 predicted_memory_bytes=7e7)]
    report.plot(rows, tmp_path / "scale.png")
    assert [label for _, _, label in drawn] == ["gcn", "gcn"]


def test_timed_epochs_stop_when_exactly_run_seconds_are_spent(monkeypatch):
    """The worker times no further epoch once the timed ones have taken RUN_SECONDS (on a
    scripted clock: two 60 s epochs of a 120 s allowance, not a third)."""
    now = [0.0]

    def setup(spec, nodes):
        losses = []

        def epoch():
            now[0] += 60.0
            losses.append(1.0)
        return epoch, 10, losses, None

    monkeypatch.setattr(worker, "_setup", setup)
    monkeypatch.setattr(worker.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(worker, "RUN_SECONDS", 120.0)
    monkeypatch.setattr(worker, "_tracked_peak", lambda step: 0)
    res = worker.run_worker(dict(SPEC, cpu_memory="tracked", epochs=5))
    assert res["timed_epochs"] == 2 and res["epoch_seconds"] == 60.0


def test_the_run_seed_draws_the_split_and_the_initial_weights(monkeypatch):
    """_setup: --seed ('graph, split and model seed') reaches natural_split and seeds the
    model's initial weights: with the graph and the split held fixed, two seeds give two
    first losses, one seed the same loss again."""
    import hiertail_fast.data.splits as splits
    import hiertail_fast.data.synthetic as synthetic

    seeds: list[int] = []
    real_split, real_graph = splits.natural_split, synthetic.make_synthetic_graph

    def split(y, seed=0, **kwargs):
        seeds.append(seed)
        return real_split(y, 0, **kwargs)

    monkeypatch.setattr(splits, "natural_split", split)
    monkeypatch.setattr(synthetic, "make_synthetic_graph",
                        lambda *args, seed=0, **kwargs: real_graph(*args, seed=0, **kwargs))

    def first_loss(seed: int) -> float:
        epoch, _, losses, _ = worker._setup(dict(SPEC, seed=seed), SPEC["nodes"])
        epoch()
        return losses[0]

    a, b, again = first_loss(5), first_loss(6), first_loss(5)
    assert seeds == [5, 6, 5]
    assert a == again and a != b


def test_after_loop_stages_run_one_epoch_per_loop(monkeypatch):
    """A baseline's after-loop stages run once with one epoch per stage loop (ONCE_SCHEDULE:
    LTE4G's experts and students), not their training defaults (1000 and 500 epochs), which
    would make once_seconds the stages' full training; a method without those loops takes its
    default config."""
    import hiertail_fast.baselines as baselines

    seen = []
    real = baselines.build_method
    monkeypatch.setattr(baselines, "build_method",
                        lambda ctx, cfg: seen.append(cfg) or real(ctx, cfg))
    worker._setup(dict(SPEC, method="lte4g"), SPEC["nodes"])
    worker._setup(dict(SPEC, method="graphsmote_t"), SPEC["nodes"])
    assert (seen[0].method, seen[0].expert_ep, seen[0].curriculum_ep) == ("lte4g", 1, 1)
    assert seen[1].method == "graphsmote_t" and seen[1].hidden == SPEC["hidden"]


def test_nothing_measured_keeps_a_set_written_without_a_plot(tmp_path, capsys):
    """A sweep that measures nothing writes nothing while --out holds ANY results: a set
    written with --no-plot (scale.csv and scale.json, no scale.png) stays in place too, not
    moved to scale.prev.* for an empty table."""
    out = tmp_path / "res"
    out.mkdir()
    for name in ("scale.csv", "scale.json"):
        (out / name).write_text(f"old {name}")
    argv = ["--sizes", "100", "--methods", "gcn", "--memory-budget", "1e-6", "--device", "cpu",
            "--out", str(out)]
    assert scale.main(argv) == 0
    assert "nothing was measured" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["scale.csv", "scale.json"]
    assert [(out / n).read_text() for n in ("scale.csv", "scale.json")] == [
        "old scale.csv", "old scale.json"]
