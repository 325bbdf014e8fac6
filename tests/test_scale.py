"""bench/scale.py: argument handling, budget skips, CSV/plot output, and memory scaling.

The scaling test measures memory with the tracked allocator figure (`--cpu-memory tracked`:
peak bytes live in torch's CPU allocator during one epoch above those live at its start), which
is deterministic for a given process, unlike resident-set figures.
"""
from __future__ import annotations

import csv
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests._preloaded_cli import run_script
from tests.conftest import ctrl_c_line

SCALE_PY = Path(__file__).resolve().parents[1] / "bench" / "scale.py"


def _load_scale():
    name = "hiertail_bench_scale"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCALE_PY)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


scale = _load_scale()


# ----------------------------------------------------------------------------- arguments
def test_default_sizes_log_scale():
    assert scale.default_sizes(100_000) == [100, 1_000, 10_000, 100_000]
    assert scale.default_sizes(5_000) == [100, 1_000, 5_000]
    assert scale.default_sizes(100) == [100]


def test_sizes_sorted_deduplicated_and_scientific_notation():
    args = scale.parse_args(["--sizes", "1e3", "200", "200", "--device", "cpu"])
    assert args.sizes == [200, 1000]
    assert scale.parse_args(["--nodes", "1e4", "--device", "cpu"]).sizes == [100, 1000, 10000]


def test_seed_takes_what_torch_manual_seed_takes():
    """2**64 - 1 is torch.manual_seed's largest seed: accepted, where 2**64 is refused above."""
    assert scale.parse_args(["--seed", str(2**64 - 1), "--device", "cpu"]).seed == 2**64 - 1


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "0"], "must be an integer > 0"),
    (["--sizes", "abc"], "is not an integer"),
    (["--sizes", "1.5"], "is not an integer"),
    (["--nodes", "-5"], "must be an integer > 0"),
    (["--sizes", "50"], "smaller than --classes 70"),
    (["--classes", "1"], "--classes must be >= 2"),
    (["--methods", "gat"], "invalid choice: 'gat'"),
    (["--device", "tpu"], "invalid choice: 'tpu'"),
    (["--memory-budget", "-1"], "must be a finite number > 0"),
    (["--time-budget", "nan"], "must be a finite number > 0"),
    (["--epochs", "0"], "must be an integer > 0"),
    (["--warmup", "-1"], "--warmup must be >= 0"),
    (["--loss-dtype", "float64"], "invalid choice: 'float64'"),
    (["--seed", "-1"], "must be >= 0"),
    (["--seed", str(2**64)], f"is too large (at most {2**64 - 1})"),   # every run overflowed
    (["--warmup", "0.5"], "'0.5' is not an integer"),
    (["--sizes", "100", "--avg-degree", "1000"], "--avg-degree 1000 must be below"),
])
def test_bad_arguments_exit_2_with_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        scale.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_device_is_an_error(capsys):
    with pytest.raises(SystemExit) as exc:
        scale.parse_args(["--device", "cuda"])
    assert exc.value.code == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_cli_bad_method_exit_code():
    proc = run_script(SCALE_PY, ["--methods", "hiertail", "gat"], timeout=120)
    assert proc.returncode == 2
    assert "invalid choice: 'gat'" in proc.stderr
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------- budgets
def test_memory_model_quadratic_for_reference_linear_otherwise():
    kw = dict(classes=70, features=128, hidden=128, avg_degree=10.0)
    ref = [scale.predict_memory("hiertail-reference", n, **kw) for n in (20_000, 40_000)]
    fast = [scale.predict_memory("hiertail", n, **kw) for n in (200_000, 400_000)]
    assert 3.8 < ref[1] / ref[0] <= 4.0
    assert 1.9 < fast[1] / fast[0] <= 2.0
    # ~21 B per (n + C)^2 pair (measured 20.6 at 10k): ~210 GB for the dense reference at
    # 100k nodes
    assert 190e9 < scale.predict_memory("hiertail-reference", 100_000, **kw) < 230e9
    # a measured smaller run only raises the prediction, scaled by the pairs for the reference
    raised = scale.predict_memory("hiertail-reference", 2000, history=[(1000, 1e9)], **kw)
    assert raised == pytest.approx(1e9 * (2070 / 1070) ** 2)
    assert scale.predict_memory("gcn", 2000, history=[(1000, 1.0)], **kw) > 1e6


def test_memory_extrapolation_keeps_fixed_costs_fixed():
    """Two measured runs: c + a·n through them (c + per_node·n + b·pairs(n) for the
    reference). A fit through the origin took the fixed costs for per-node bytes: the audit's
    reference runs at 4k / 10k nodes (378 / 2,089 MB) gave 332 GB at 100k, ~204 GB by this
    fit (a memory audit)."""
    sq = lambda n: float(n) ** 2   # noqa: E731
    ref = scale.extrapolate_memory([(4000, 378e6), (10_000, 2089e6)], 100_000, pairs=sq)
    assert ref == pytest.approx(2089e6 + (2089e6 - 378e6) / (1e8 - 1.6e7) * (1e10 - 1e8))
    assert 200e9 < ref < 210e9
    lin = scale.extrapolate_memory([(1000, 100e6), (10_000, 400e6)], 100_000)
    assert lin == pytest.approx(400e6 + 300e6 / 9000 * 90_000)          # 3.4 GB, not 4.0
    assert scale.extrapolate_memory([(1000, 5e8), (10_000, 4e8)],
                                    100_000) == pytest.approx(4e9)   # falling: scaled
    # flat: scaled as well (slope <= 0; with < 0 it predicted 5 GB, no growth at all), and a
    # prediction below the last size keeps that size's measurement (mutation audit, s69)
    assert scale.extrapolate_memory([(1000, 5e9), (10_000, 5e9)],
                                    100_000) == pytest.approx(5e10)
    assert scale.extrapolate_memory([(1000, 100e6), (10_000, 400e6)], 5000) == 400e6
    assert scale.extrapolate_memory([], 10, pairs=sq) is None


def test_main_jobs_reference_runs_fit_the_default_budget():
    """The main job's own 100- and 1,000-node reference runs (its table of 2026-11-27,
    docs/results/scale_2026-11-27_epyc/scale.csv: 3.5 and 47 MB) put the 10k reference at
    4.4 GB through n² alone (44 B a pair: a third of that
    growth is linear costs) and skipped it under the 4 GB default budget; it takes 2.1 GB (a
    docs audit). The model's per-node bytes are charged first now; the 1k / 10k runs still
    rule out 100k (~200 GB), and pairs twice as costly as the model's are still seen."""
    kw = dict(classes=70, features=128, hidden=128, avg_degree=10.0)
    runs = [(100, 3_534_848.0), (1000, 47_472_640.0), (10_000, 2_120_073_216.0)]
    at_10k = scale.predict_memory("hiertail-reference", 10_000, history=runs[:2], **kw)
    assert 2.1e9 < at_10k < 0.9 * scale.DEFAULT_CPU_BUDGET
    assert 190e9 < scale.predict_memory("hiertail-reference", 100_000, history=runs, **kw)
    doubled = [(n, 2 * v) for n, v in runs[1:]]   # a machine where pairs cost twice as much
    assert scale.predict_memory("hiertail-reference", 100_000, history=doubled, **kw) > 380e9


def test_extrapolate_linear_plus_quadratic_fit():
    assert scale.extrapolate([], 10, 1.0) is None
    assert scale.extrapolate([(100, 1.0)], 1000, 1.0) == pytest.approx(10.0)
    assert scale.extrapolate([(100, 1.0), (1000, 100.0)], 10_000, 1.0) == pytest.approx(1e4)
    assert scale.extrapolate([(100, 1.0), (1000, 1.0)], 10_000, 2.0) == pytest.approx(10.0)
    assert scale.extrapolate([(100, 1.0), (1000, 1e6)], 10_000, 1.0) == pytest.approx(1e8)
    # v = a·n + b·n² through both points: a = b = 1e-3 here
    assert scale.extrapolate([(10, 0.11), (100, 10.1)], 1000, 1.0) == pytest.approx(1001.0)
    # two points of one size: the last one scaled (no fit through one size; > divided by 0)
    assert scale.extrapolate([(1000, 1.0), (1000, 2.0)], 10_000, 1.0) == pytest.approx(20.0)


def test_planned_epochs_shrink_for_long_epochs():
    assert scale.planned_epochs(None, 1, 3) == (1, 3)
    assert scale.planned_epochs(0.5, 1, 3) == (1, 3)
    assert scale.planned_epochs(scale.RUN_SECONDS / 2, 1, 3) == (1, 2)
    assert scale.planned_epochs(10 * scale.RUN_SECONDS, 1, 3) == (0, 1)


def test_tiny_memory_budget_skips_every_run_without_starting_one(tmp_path, monkeypatch, capsys):
    def no_run(*args, **kwargs):
        raise AssertionError("a run was started although it is over the budget")

    monkeypatch.setattr(scale, "run_one", no_run)
    code = scale.main(["--sizes", "100", "1000", "--memory-budget", "1e-6", "--device", "cpu",
                       "--out", str(tmp_path), "--no-plot"])
    assert code == 0
    rows = list(csv.DictReader(open(tmp_path / "scale.csv")))
    assert len(rows) == 6
    for row in rows:
        assert row["status"].startswith("skipped: would need ~"), row
        assert row["status"].split("~")[1].split()[1] in ("MB", "GB")
        assert row["epoch_seconds"] == row["peak_memory_bytes"] == ""
    assert "skipped: would need ~" in capsys.readouterr().out


def test_a_run_whose_predicted_memory_equals_the_budget_runs(monkeypatch):
    """The budget is what a run may take: skipped only when its prediction exceeds it."""
    monkeypatch.setattr(scale, "run_one", lambda spec, timeout: {
        "status": "ok", "peak_memory_bytes": 1.0, "epoch_seconds": 0.1})
    args = scale.parse_args(["--sizes", "200", "--methods", "gcn", "--epochs", "1", "--no-plot"])
    need = scale.predict_memory("gcn", 200, classes=args.classes, features=args.features,
                                hidden=args.hidden, avg_degree=args.avg_degree, config=args.config)
    assert scale.sweep(args, need)[0]["status"] == "ok"
    assert scale.sweep(args, need * 0.999)[0]["status"].startswith("skipped: would need")


def test_sweep_skips_from_measured_smaller_runs(monkeypatch):
    def fake_run(spec, timeout):
        return {"edges": 10, "epoch_seconds": 100.0, "peak_memory_bytes": 1e9, "device": "cpu",
                "status": "ok"}

    monkeypatch.setattr(scale, "run_one", fake_run)
    args = scale.parse_args(["--sizes", "200", "400", "--methods", "hiertail-reference", "gcn",
                             "--time-budget", "150", "--device", "cpu"])
    rows = scale.sweep(args, budget=3e9)
    status = {(r["method"], r["nodes"]): r["status"] for r in rows}
    assert status[("hiertail-reference", 200)] == status[("gcn", 200)] == "ok"
    assert rows[0]["predicted_memory_bytes"] > 0
    # 1 GB at 200 nodes, scaled by the (n + C)² pairs: ~3.03 GB at 400 (C = 70) > 3 GB
    assert status[("hiertail-reference", 400)].startswith("skipped: would need ~3.0 GB")
    # 100 s/epoch at 200 nodes: ~200 s at 400 (one timed epoch, no warm-up) > 150 s
    assert status[("gcn", 400)].startswith("skipped: would take ~200 s")


# ----------------------------------------------------------------------------- measurement
def test_tracked_peak_of_known_allocations():
    def step():
        a = torch.ones(1_000_000)  # 4 MB
        b = torch.ones(500_000)  # 2 MB while a is alive: peak 6 MB
        del a, b
        c = torch.ones(250_000)  # 1 MB after both are freed
        del c

    assert scale._tracked_peak(step) == pytest.approx(6_000_000, rel=0.02)


def test_cli_writes_csv_plot_and_metadata(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCALE_PY), "--sizes", "100", "200", "--methods", "gcn",
         "--epochs", "2", "--device", "cpu", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
        env={k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(tmp_path / "scale.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames) == scale.CSV_COLUMNS
        rows = list(reader)
    assert [(r["method"], int(r["nodes"])) for r in rows] == [("gcn", 100), ("gcn", 200)]
    for row in rows:
        assert row["status"] == "ok", row
        assert row["device"] == "cpu"
        assert int(row["edges"]) > 0 and float(row["epoch_seconds"]) > 0
        assert int(row["peak_memory_bytes"]) > 0
        assert row["memory_measure"] == "rss"      # the default --cpu-memory
    assert int(rows[1]["edges"]) > int(rows[0]["edges"])
    png = (tmp_path / "scale.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    info = json.loads((tmp_path / "scale.json").read_text())
    assert "RSS" in info["memory_measure"] and info["cores"] >= 1
    assert info["omp_wait_policy"] == "PASSIVE"     # the workers' (the caller set none)
    assert "gcn" in proc.stdout and "peak MB" in proc.stdout


def test_csv_names_the_memory_measure_of_each_row():
    """scale.csv's peak_memory_bytes means three different things by device and --cpu-memory;
    only scale.json said which, so a CSV read alone mixed them (memory_measure column)."""
    from types import SimpleNamespace

    assert scale.memory_tag(scale.parse_args(["--device", "cpu"])) == "rss"
    assert scale.memory_tag(scale.parse_args(["--device", "cpu", "--cpu-memory", "tracked"])) \
        == "tracked"
    assert scale.memory_tag(SimpleNamespace(device="cuda", cpu_memory="rss")) == "cuda-allocator"
    assert scale.CSV_COLUMNS[-1] == "memory_measure"


def _tracked(method: str, nodes: int) -> int:
    spec = dict(method=method, nodes=nodes, classes=70, avg_degree=10.0, features=64,
                hidden=64, config="paper", epochs=1, warmup=0, device="cpu", seed=0,
                cpu_memory="tracked", threads=None)
    result = scale.run_worker(spec)
    assert result["status"] == "ok", result
    return result["peak_memory_bytes"]


def test_memory_linear_for_hiertail_quadratic_for_reference(monkeypatch):
    """The headline: the dense reference's memory grows ~4x per doubling of n (the N x N loss
    matrices), the fast path's ~linearly. Bounds are generous: fixed-size transients (the
    blocked loss's row block, chunked prototype assignment) make small sizes sub-linear."""
    monkeypatch.delenv("HIERTAIL_BACKEND", raising=False)
    ref = [_tracked("hiertail-reference", n) for n in (2000, 4000)]
    fast = [_tracked("hiertail", n) for n in (2000, 6000)]
    assert ref[1] / ref[0] > 3.0, ref  # quadratic: ~3.8 measured; linear would be 2
    assert fast[1] / fast[0] < 6.0, fast  # 3x the nodes: linear <= 3, quadratic would be 9
    assert ref[1] > 3 * fast[1], (ref, fast)  # the dense reference at 4000 vs fast at 6000


# ----------------------------------------------------------------------------- hard time limit
def test_time_budget_is_a_hard_limit(tmp_path, capsys):
    """A run still going after --time-budget seconds (here 0.5 s: less than the worker needs to
    import torch) is killed; its row says so everywhere and the sweep goes on."""
    out = tmp_path / "out"
    started = time.perf_counter()
    assert scale.main(["--sizes", "100", "200", "--methods", "gcn", "hiertail", "--time-budget",
                       "0.5", "--device", "cpu", "--out", str(out), "--no-plot"]) == 0
    assert time.perf_counter() - started < 60
    rows = list(csv.DictReader(open(out / "scale.csv")))
    assert [r["status"] for r in rows[:2]] == ["timed out after 0.5 s"] * 2
    assert all(r["status"].startswith("skipped: 100 nodes timed out") for r in rows[2:]), rows
    assert [r["status"] for r in json.loads((out / "scale.json").read_text())["rows"]] == [
        r["status"] for r in rows]
    assert "timed out after 0.5 s" in capsys.readouterr().out


def test_sweep_goes_on_after_a_timeout(monkeypatch):
    calls = []

    def fake_run(spec, timeout):
        calls.append((spec["method"], spec["nodes"], timeout))
        if spec["method"] == "hiertail":
            return {"status": f"timed out after {timeout:g} s"}
        return {"edges": 10, "epoch_seconds": 0.1, "peak_memory_bytes": 1e6, "status": "ok"}

    monkeypatch.setattr(scale, "run_one", fake_run)
    args = scale.parse_args(["--sizes", "100", "1000", "--methods", "hiertail", "gcn",
                             "--time-budget", "30", "--device", "cpu"])
    status = [r["status"] for r in scale.sweep(args, budget=1e12)]
    assert calls == [("hiertail", 100, 30.0), ("gcn", 100, 30.0), ("gcn", 1000, 30.0)]
    assert status == ["timed out after 30 s", "ok",
                      "skipped: 100 nodes timed out (time budget 30 s)", "ok"]


def test_long_warmup_epoch_counts_as_timed(monkeypatch):
    """The warm-up epoch took longer than the long-epoch cut-off the sweep predicted it would
    stay under: it is the (only) timed epoch, not thrown away."""
    spec = dict(method="gcn", nodes=100, classes=5, avg_degree=4.0, features=8, hidden=8,
                config="paper", epochs=1, warmup=1, device="cpu", seed=0, cpu_memory="tracked",
                threads=None, long_epoch_seconds=0.0)
    result = scale.run_worker(spec)
    assert (result["warmup_epochs"], result["timed_epochs"]) == (0, 1), result
    monkeypatch.setattr(scale, "run_one", lambda spec, timeout: {**result, "status": "ok"})
    args = scale.parse_args(["--sizes", "100", "--methods", "gcn", "--device", "cpu"])
    assert scale.sweep(args, budget=1e12)[0]["status"] == (
        "ok (0 warm-up + 1 timed epochs: long epochs)")


# ----------------------------------------------------------------------------- output files
def _no_run(*args, **kwargs):
    raise AssertionError("a run was started although the outputs cannot be written")


@pytest.mark.parametrize("layout", ["out-is-file", "parent-is-file", "csv-is-dir"])
def test_unwritable_out_fails_before_any_run(layout, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(scale, "run_one", _no_run)
    (tmp_path / "file").write_text("x")
    out = {"out-is-file": tmp_path / "file", "parent-is-file": tmp_path / "file" / "results",
           "csv-is-dir": tmp_path / "res"}[layout]
    if layout == "csv-is-dir":
        (out / "scale.csv").mkdir(parents=True)
    with pytest.raises(SystemExit) as exc:
        scale.main(["--sizes", "100", "--device", "cpu", "--out", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert f" error: --out {out} cannot be written: " in err[-1], err


def test_unwritable_out_directory(tmp_path, monkeypatch, capsys):
    """A directory where no file can be created (simulated: a chmod'ed one does not stop root)."""
    monkeypatch.setattr(scale, "run_one", _no_run)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr("hiertail_fast._files.tempfile.mkstemp", refuse)
    with pytest.raises(SystemExit) as exc:
        scale.main(["--sizes", "100", "--device", "cpu", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "cannot create files in" in capsys.readouterr().err


def test_cli_unwritable_out_exit_2_without_traceback(tmp_path):
    (tmp_path / "file").write_text("x")
    proc = run_script(SCALE_PY, ["--sizes", "100", "--device", "cpu", "--out", tmp_path / "file"],
                      timeout=120)
    assert proc.returncode == 2 and "is not a directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def _old_results(out: Path) -> None:
    out.mkdir()
    for name in ("scale.csv", "scale.json", "scale.png"):
        (out / name).write_text(f"old {name}")


@pytest.mark.parametrize("argv", [["--sizes", "1000", "--memory-budget", "0.001"],
                                  ["--sizes", "1e15"]], ids=["over-memory", "huge"])
def test_everything_skipped_plots_a_consistent_set_in_an_empty_out(argv, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setattr(scale, "run_one", _no_run)
    out = tmp_path / "res"
    assert scale.main(argv + ["--device", "cpu", "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "scale.csv")))
    assert rows and all(r["status"].startswith("skipped") for r in rows)
    png = (out / "scale.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"          # the figure saying nothing was measured
    assert sorted(p.name for p in out.iterdir()) == ["scale.csv", "scale.json", "scale.png"]


@pytest.mark.parametrize("argv", [["--sizes", "1000", "--memory-budget", "0.001"],
                                  ["--sizes", "1e15"]], ids=["over-memory", "huge"])
def test_nothing_measured_leaves_results_in_out_in_place(argv, tmp_path, capsys, monkeypatch):
    # written, an all-skipped sweep moved the results to scale.prev.*, and a second one deleted
    # them (a CLI audit): now nothing is written while --out holds results
    monkeypatch.setattr(scale, "run_one", _no_run)
    out = tmp_path / "res"
    _old_results(out)
    for _ in range(2):
        assert scale.main(argv + ["--device", "cpu", "--out", str(out)]) == 0
        assert "nothing was measured" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["scale.csv", "scale.json", "scale.png"]
    for name in ("csv", "json", "png"):
        assert (out / f"scale.{name}").read_text() == f"old scale.{name}"


def _measured(spec, timeout):
    return {"edges": 10, "epoch_seconds": 0.1, "peak_memory_bytes": 1e6, "status": "ok"}


def _says_whether_written(err: str, verb: str, out: Path, written: bool) -> None:
    """A sweep stopped while its three files were made: its last line says whether they were
    written, and the folder agrees."""
    last = err.strip().splitlines()[-1]
    if written:
        assert last == f"{verb} after the results were written to {out}"
        assert (out / "scale.csv").exists()
    else:
        assert last == (f"{verb} while the results were written; nothing written, {out} "
                        "left as it was")
        assert not out.exists()


@pytest.mark.parametrize("after_rotation", [False, True])
def test_ctrl_c_while_the_results_are_written_is_one_line(after_rotation, tmp_path, monkeypatch,
                                                         capsys):
    """Ctrl-C while scale.csv / .json / .png were made (the plot takes about a second) ended
    the sweep in a traceback. Now: the table, one line saying whether the files were written
    (a Ctrl-C held by the rotation comes as a DeferredInterrupt, after it) and exit 130."""
    monkeypatch.setattr(scale, "run_one", _measured)
    out = tmp_path / "res"
    err = ctrl_c_line(monkeypatch, capsys, scale, "write_outputs", lambda: sys.exit(scale.main(
        ["--sizes", "100", "--methods", "gcn", "--device", "cpu", "--out", str(out)])),
        held=after_rotation)
    _says_whether_written(err, "interrupted", out, after_rotation)


@pytest.mark.parametrize("after_rotation", [False, True])
def test_sigterm_while_the_results_are_written_is_one_line(after_rotation, tmp_path,
                                                           monkeypatch, capsys):
    """A SIGTERM while the three files are made (scale's handler raises SystemExit(143); one
    during the renames is held until they are done, then raised): the table, one line saying
    whether the files were written, exit 143 (it exited silently, whichever it was)."""
    monkeypatch.setattr(scale, "run_one", _measured)
    real = scale.write_outputs

    def terminated(*args, **kwargs):
        if after_rotation:
            real(*args, **kwargs)
        scale._exit_on_sigterm(signal.SIGTERM, None)

    monkeypatch.setattr(scale, "write_outputs", terminated)
    out = tmp_path / "res"
    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = scale.main(["--sizes", "100", "--methods", "gcn", "--device", "cpu", "--out",
                           str(out)])
    finally:
        signal.signal(signal.SIGTERM, previous)     # (main installs its handler)
    assert code == 143
    _says_whether_written(capsys.readouterr().err, "terminated", out, after_rotation)


def test_partial_run_keeps_the_previous_set_and_drops_a_stale_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(scale, "run_one", _measured)
    out = tmp_path / "res"
    _old_results(out)
    scale.main(["--sizes", "100", "--methods", "gcn", "--warmup", "0", "--epochs", "1",
                "--device", "cpu", "--out", str(out), "--no-plot"])
    assert sorted(p.name for p in out.iterdir()) == [
        "scale.csv", "scale.json", "scale.prev.csv", "scale.prev.json", "scale.prev.png"]
    # a second run replaces the previous generation whole: no png from two runs ago survives
    scale.main(["--sizes", "100", "--methods", "gcn", "--warmup", "0", "--epochs", "1",
                "--device", "cpu", "--out", str(out), "--no-plot"])
    assert sorted(p.name for p in out.iterdir()) == [
        "scale.csv", "scale.json", "scale.prev.csv", "scale.prev.json"]


def test_sigterm_to_the_driver_ends_its_worker(tmp_path):
    # the worker outlived a SIGTERMed driver, reparented to init with no time limit (a CLI
    # audit); the driver now turns SIGTERM into SystemExit and subprocess.run kills the worker
    import signal

    import psutil
    driver = subprocess.Popen([sys.executable, str(SCALE_PY), "--sizes", "30000", "--methods",
                               "hiertail", "--epochs", "3", "--device", "cpu", "--out",
                               str(tmp_path / "res")], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        deadline, workers = time.time() + 60, []
        while not workers and time.time() < deadline and driver.poll() is None:
            time.sleep(0.2)
            workers = psutil.Process(driver.pid).children()
        assert workers, "the driver started no worker"
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=30) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, "the worker outlived its driver"
    finally:
        for p in psutil.Process().children(recursive=True):
            p.kill()
    assert not (tmp_path / "res" / "scale.csv").exists()


def test_failed_plot_leaves_the_old_results_untouched(tmp_path, monkeypatch):
    import _scale_report

    def broken_plot(rows, path):
        raise RuntimeError("plot failed")

    monkeypatch.setattr(scale, "run_one", _measured)
    monkeypatch.setattr(_scale_report, "plot", broken_plot)
    out = tmp_path / "res"
    _old_results(out)
    with pytest.raises(RuntimeError, match="plot failed"):
        scale.main(["--sizes", "100", "--methods", "gcn", "--warmup", "0", "--epochs", "1",
                    "--device", "cpu", "--out", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["scale.csv", "scale.json", "scale.png"]
    assert all((out / n).read_text() == f"old {n}" for n in ("scale.csv", "scale.json"))


# ----------------------------------------------------------------------------- loss dtype
def test_loss_dtype_option_reaches_the_model_and_the_results(tmp_path, monkeypatch):
    assert scale.parse_args(["--device", "cpu"]).loss_dtype == "float32"
    specs = []

    def fake_run(spec, timeout):
        specs.append(spec)
        return {"edges": 10, "epoch_seconds": 0.1, "peak_memory_bytes": 1e6, "status": "ok"}

    monkeypatch.setattr(scale, "run_one", fake_run)
    scale.main(["--sizes", "100", "--methods", "hiertail", "gcn", "--loss-dtype", "bfloat16",
                "--device", "cpu", "--out", str(tmp_path), "--no-plot"])
    assert [s["loss_dtype"] for s in specs] == ["bfloat16", "bfloat16"]
    rows = list(csv.DictReader(open(tmp_path / "scale.csv")))
    assert [(r["method"], r["loss_dtype"]) for r in rows] == [("hiertail", "bfloat16"),
                                                              ("gcn", "n/a")]
    info = json.loads((tmp_path / "scale.json").read_text())
    assert info["args"]["loss_dtype"] == "bfloat16" and info["args"]["device"] == "cpu"
    model, _ = scale.build_model("hiertail", 8, 5, {"hidden": 8, "config": "paper",
                                                    "loss_dtype": "float16"})
    assert model.config.loss_dtype == "float16"


# ----------------------------------------------------------------------------- baselines
def test_any_harness_baseline_is_a_method(monkeypatch):
    args = scale.parse_args(["--methods", "gcn", "lte4g", "graphsmote_t", "--device", "cpu"])
    assert args.methods == ["gcn", "lte4g", "graphsmote_t"]
    assert scale.parse_args(["--device", "cpu"]).methods == list(scale.METHODS)
    # a baseline registered later (graphens, imgagn, ... built elsewhere) needs no edit here
    from hiertail_fast.baselines import METHODS as registry
    monkeypatch.setitem(registry, "newcomer", registry["origin"])
    assert scale.parse_args(["--methods", "newcomer", "--device", "cpu"]).methods == ["newcomer"]


def test_baseline_budgets_and_loss_dtype_column(monkeypatch):
    kw = dict(classes=70, features=128, hidden=128, avg_degree=10.0)
    lin = [scale.predict_memory("lte4g", n, **kw) for n in (200_000, 400_000)]
    assert 1.9 < lin[1] / lin[0] <= 2.0                         # linear memory
    assert scale.predict_memory("graphsmote_t", 1000, **kw) > scale.predict_memory("gcn", 1000,
                                                                                   **kw)
    assert scale.time_exponent("graphsmote_t") == 2.0 and scale.time_exponent("origin") == 1.0

    def fake_run(spec, timeout):
        return {"edges": 10, "epoch_seconds": 10.0, "peak_memory_bytes": 1e6, "status": "ok"}

    monkeypatch.setattr(scale, "run_one", fake_run)
    args = scale.parse_args(["--sizes", "200", "400", "--methods", "graphsmote_t", "lte4g",
                             "--time-budget", "100", "--device", "cpu"])
    rows = scale.sweep(args, budget=1e12)
    status = {(r["method"], r["nodes"]): r["status"] for r in rows}
    # 10 s/epoch at 200 nodes: O(n²) GraphSMOTE ~40 s/epoch at 400, 1 + 3 epochs ~160 s
    # (skipped), linear LTE4G ~20 s/epoch, ~80 s (run)
    assert status[("graphsmote_t", 400)].startswith("skipped: would take ~160 s")
    assert status[("lte4g", 400)] == "ok"
    assert {r["loss_dtype"] for r in rows} == {"n/a"}


@pytest.mark.parametrize("method", ["lte4g", "graphsmote_t"])
def test_worker_runs_baselines_at_tiny_size(method):
    spec = dict(method=method, nodes=120, classes=6, avg_degree=5.0, features=8, hidden=8,
                config="paper", epochs=1, warmup=0, device="cpu", seed=0, cpu_memory="rss",
                threads=None)
    result = scale.run_worker(spec)
    assert result["status"] == "ok" and result["timed_epochs"] == 1, result
    assert result["peak_memory_bytes"] > 0 and result["epoch_seconds"] > 0
    # LTE4G's prototypes / experts / students ran once after the epochs; GraphSMOTE has none
    assert (result["once_seconds"] != "") == (method == "lte4g")
    assert scale.format_row({**dict.fromkeys(scale.CSV_COLUMNS, ""), **result, "method": method,
                             "nodes": 120}).startswith(method)


def test_a_sweep_whose_every_run_fails_keeps_the_previous_results(tmp_path, monkeypatch, capsys):
    """Every run failing (a fuzzing find: a bad option caught only inside each worker) exits 1
    and leaves --out as it was; before, it exited 0, moved the good results to scale.prev.*,
    and a second such sweep deleted them. A sweep with some failures writes, and exits 1."""
    out = tmp_path / "res"
    _old_results(out)
    monkeypatch.setattr(scale, "run_one", lambda spec, timeout: {"status": "error: boom"})
    argv = ["--sizes", "100", "--methods", "gcn", "--device", "cpu", "--out", str(out),
            "--no-plot"]
    for _ in range(2):
        assert scale.main(argv) == 1
        assert "every run failed (error: boom); nothing written" in capsys.readouterr().err
        assert sorted(p.name for p in out.iterdir()) == ["scale.csv", "scale.json", "scale.png"]
        assert (out / "scale.csv").read_text() == "old scale.csv"
    ok = {"status": "ok", "epoch_seconds": 0.01, "peak_memory_bytes": 1e6, "edges": 600,
          "warmup_epochs": 1, "timed_epochs": 3}
    monkeypatch.setattr(scale, "run_one",
                        lambda spec, timeout: ok if spec["method"] == "gcn"
                        else {"status": "error: boom"})
    assert scale.main(argv[:3] + ["gcn", "hiertail"] + argv[4:]) == 1
    assert "1 run(s) failed" in capsys.readouterr().err
    assert "scale.prev.csv" in {p.name for p in out.iterdir()}


def test_ctrl_c_shows_the_finished_rows_and_writes_nothing(tmp_path, capsys, monkeypatch):
    # a traceback before, and the rows measured so far were lost (a CLI audit)
    calls = []

    def run(spec, timeout):
        calls.append(spec["nodes"])
        if len(calls) > 1:
            raise KeyboardInterrupt
        return _measured(spec, timeout)

    monkeypatch.setattr(scale, "run_one", run)
    out = tmp_path / "res"
    _old_results(out)
    code = scale.main(["--sizes", "100", "200", "--methods", "gcn", "--warmup", "0",
                       "--epochs", "1", "--device", "cpu", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 130 and "interrupted after 1 run(s)" in err and "Traceback" not in err
    assert "gcn" in err and "100" in err                       # the finished row is shown
    assert all((out / n).read_text() == f"old {n}" for n in ("scale.csv", "scale.json"))


def test_budget_options_and_method_list(monkeypatch, tmp_path):
    """--memory-budget is in GB, the default CPU budget never exceeds 4 GB, a method given
    twice runs once, and the table prints MB (10^6 bytes): each could change unnoticed (a
    mutation audit)."""
    from bench._scale_report import format_row

    seen = []
    monkeypatch.setattr(scale, "sweep", lambda args, budget, bar, rows: seen.append(budget))
    scale.main(["--sizes", "100", "--methods", "gcn", "--memory-budget", "2", "--device", "cpu",
                "--out", str(tmp_path), "--no-plot"])
    assert seen == [2e9]
    assert 0 < scale.default_memory_budget("cpu") <= scale.DEFAULT_CPU_BUDGET
    args = scale.parse_args(["--methods", "gcn", "hiertail", "gcn", "--device", "cpu"])
    assert args.methods == ["gcn", "hiertail"]
    row = dict(method="gcn", nodes=100, edges=600, epoch_seconds=0.5,
               peak_memory_bytes=2_000_000, device="cpu", status="ok")
    assert format_row(row).split()[4] == "2.0"


def test_epoch_plan_and_time_budget_count_every_epoch(monkeypatch):
    """planned_epochs rounds the timed epochs up (50 s epochs: 3 of them, not 2) and the time
    check counts the warm-up epoch too: a 40 s epoch with 1 warm-up + 3 timed needs 160 s,
    over a 150 s budget (without the warm-up it looked like 120 s and the run overran). Both
    passed every test when changed (a mutation audit)."""
    assert scale.planned_epochs(50.0, 1, 3) == (1, 3)
    assert scale.planned_epochs(None, 1, 3) == (1, 3)

    def fake_run(spec, timeout):
        return {"edges": 10, "epoch_seconds": 10.0 * spec["nodes"] / 100,
                "peak_memory_bytes": 1e6, "device": "cpu", "status": "ok"}

    monkeypatch.setattr(scale, "run_one", fake_run)
    monkeypatch.setattr(scale, "time_exponent", lambda method: 1.0)
    args = scale.parse_args(["--sizes", "100", "400", "--methods", "gcn", "--warmup", "1",
                             "--epochs", "3", "--time-budget", "150", "--device", "cpu"])
    monkeypatch.setattr(scale, "RUN_SECONDS", 1e9)       # keep all 3 timed epochs
    rows = scale.sweep(args, budget=1e12)
    assert rows[1]["status"].startswith("skipped: would take ~160 s")


def test_memory_model_of_the_official_reference_and_of_dense_graphs():
    """The official configuration's dense reference holds two levels of (n + n/C)² pairs, and
    edges cost BYTES_PER_EDGE each: both terms could be dropped unnoticed (a mutation audit).
    """
    kw = dict(classes=70, features=128, hidden=128, avg_degree=10.0)
    paper = scale.predict_memory("hiertail-reference", 10_000, **kw)
    official = scale.predict_memory("hiertail-reference", 10_000, config="official", **kw)
    pairs = scale.REF_BYTES_PER_PAIR
    assert official - paper == pytest.approx(pairs * (2 * 10_142 ** 2 - 10_070 ** 2))
    dense = scale.predict_memory("gcn", 50_000, **{**kw, "avg_degree": 2000.0})
    sparse = scale.predict_memory("gcn", 50_000, **kw)
    assert dense - sparse == pytest.approx(50_000 * 1990 * scale.BYTES_PER_EDGE)


def test_worker_reports_the_median_epoch_and_a_non_finite_loss(monkeypatch):
    """The worker's epoch time is the median of the timed epochs (0.02 / 0.4 / 0.2 s: 0.2),
    a warm-up epoch longer than the cut-off is the first timed one (not run again),
    a NaN training loss reads 'ok (non-finite loss)', and the GCN baseline / fast HierTail
    are built as documented (improved GCN; the automatic loss engine). Each could change
    unnoticed: the tests only asked for values > 0 (a mutation audit)."""
    worker = sys.modules["_scale_worker"]
    calls: list[int] = []

    def fake_setup(durations, nan=False):
        def setup(spec, nodes):
            it, losses = iter(durations + [0.0] * 10), []

            def epoch():
                calls.append(nodes)
                time.sleep(next(it))
                losses.append(float("nan") if nan else 1.0)
            return epoch, 10, losses, None
        return setup

    spec = dict(method="gcn", nodes=100, classes=4, avg_degree=4.0, features=8, hidden=8,
                config="paper", epochs=3, warmup=1, device="cpu", seed=0,
                cpu_memory="tracked", threads=None, loss_dtype=None)
    monkeypatch.setattr(worker, "_setup", fake_setup([0.0, 0.02, 0.4, 0.2]))
    res = worker.run_worker(dict(spec))
    assert (res["warmup_epochs"], res["timed_epochs"], res["status"]) == (1, 3, "ok")
    assert 0.19 <= res["epoch_seconds"] < 0.39     # the median (sleeps only overshoot)
    calls.clear()
    monkeypatch.setattr(worker, "_setup", fake_setup([0.05], nan=True))
    res = worker.run_worker(dict(spec, epochs=1, long_epoch_seconds=0.01))
    assert (res["warmup_epochs"], res["timed_epochs"]) == (0, 1)
    assert len(calls) == 2          # the long warm-up, timed, + the tracked-memory pass
    assert res["status"] == "ok (non-finite loss)"
    gcn, _ = worker.build_model("gcn", 8, 4, spec)
    assert gcn.conv1.improved and gcn.conv2.improved
    fast, _ = worker.build_model("hiertail", 8, 4, spec)
    assert fast.config.loss_backend is None


def test_a_long_epoch_run_feeds_the_memory_history(monkeypatch):
    """A run the worker timed as a long epoch (one timed epoch, no warm-up; its status reads
    'ok (...)') still counts as measured: 3 GB at 1,000 nodes rules out 10k under a 4 GB
    budget (only an exact 'ok' counted unnoticed: a mutation audit)."""
    def fake_run(spec, timeout):
        long = spec["nodes"] == 1000
        return {"edges": 10, "epoch_seconds": 100.0 if long else 0.1,
                "peak_memory_bytes": 3e9 if long else 1e6, "status": "ok",
                "warmup_epochs": 0 if long else 1, "timed_epochs": 1 if long else 3}

    monkeypatch.setattr(scale, "run_one", fake_run)
    args = scale.parse_args(["--sizes", "100", "1000", "10000", "--methods", "gcn",
                             "--device", "cpu"])
    rows = scale.sweep(args, budget=4e9)
    assert rows[1]["status"].startswith("ok") and rows[1]["status"] != "ok"
    assert rows[2]["status"].startswith("skipped: would need")


def _worker_in_a_child(body: str) -> str:
    """The last stdout line of a fresh interpreter that runs `body` (which defines ``setup``;
    may print and exit first) and then the worker on a 1,000-node GCN spec with ``setup`` as
    its graph and model, in 'rss' memory mode: the sweep's own way of running a worker."""
    script = ("import json, re, sys\nsys.path.insert(0, sys.argv[1])\nimport torch\n"
              "import _scale_worker as worker\n" + body + """
worker._setup = setup
spec = dict(method="gcn", nodes=1000, classes=4, avg_degree=4.0, features=8, hidden=8,
            config="paper", epochs=1, warmup=0, device="cpu", seed=0, cpu_memory="rss",
            threads=1)
print(json.dumps(worker.run_worker(spec)))
""")
    bench = str(Path(__file__).resolve().parents[1] / "bench")
    proc = subprocess.run([sys.executable, "-c", script, bench], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


_RSS_CHILD = r"""
kept = []

def setup(spec, nodes):
    if nodes == spec["nodes"]:
        kept.append(torch.ones(50_000_000))          # the run's data and model: 200 MB
    def epoch():
        t = torch.ones(75_000_000)                   # an epoch's temporaries: 300 MB
        t.add_(1)
        del t
    return epoch, 10, [1.0], None
"""


def test_worker_rss_peak_holds_the_runs_data_and_its_epochs_temporaries():
    """The 'rss' memory figure (a fresh process, as the sweep runs it): the peak above the
    baseline taken BEFORE the graph and model are built, so it holds the run's data (200 MB
    here) and an epoch's freed temporaries (300 MB). Reading the resident size at the end
    instead of the peak, or taking the baseline after the set-up, passed every test (a
    mutation audit: the tests asked only for a value > 0)."""
    peak = json.loads(_worker_in_a_child(_RSS_CHILD))["peak_memory_bytes"]
    assert peak >= 0.9 * (200e6 + 300e6), peak


_PRIMED_CHILD = r"""
def hwm():
    with open("/proc/self/status") as fh:
        return int(re.search(r"VmHWM:\s+(\d+) kB", fh.read()).group(1)) * 1024

# can this kernel reset the high-water mark? (Linux >= 4.0, /proc writable)
t = torch.ones(50_000_000); t.add_(1); del t            # 200 MB, freed
before = hwm()
try:
    open("/proc/self/clear_refs", "w").write("5")
except OSError:
    pass
if hwm() > before - 100e6:
    print("NO_RESET"); sys.exit(0)
t = torch.ones(100_000_000); t.add_(1); del t           # 400 MB before the run, freed
cache = []

def setup(spec, nodes):
    def epoch():
        if not cache:                                   # one-time, kept: 200 MB on first use
            cache.append(torch.ones(50_000_000))
        x = torch.ones(2_500_000); x.add_(1); del x     # an epoch's temporaries: 10 MB
    return epoch, 10, [1.0], None
"""


def test_worker_rss_peak_leaves_out_first_use_costs_and_earlier_peaks():
    """The 'rss' figure leaves out what the process held or touched before the run: the
    worker primes one epoch on a tiny graph before its baseline (code pages, thread pools and
    caches filled on first use: 200 MB here, ~170 MB for real) and resets the kernel's
    high-water mark before the epochs (a 400 MB peak of earlier work). Without either, the
    peak read 200 / 400 MB more; no test noticed (a mutation audit)."""
    last = _worker_in_a_child(_PRIMED_CHILD)
    if last == "NO_RESET":
        pytest.skip("this kernel cannot reset VmHWM (/proc/self/clear_refs)")
    peak = json.loads(last)["peak_memory_bytes"]
    assert peak < 100e6, peak


def test_tracked_peak_includes_the_after_loop_stage(monkeypatch):
    """'tracked' memory: the peak of an epoch and of the after-loop stage (LTE4G's experts and
    curriculum), whichever is larger: only the epoch's was tested (a mutation audit)."""
    worker = sys.modules["_scale_worker"]

    def setup(spec, nodes):
        def epoch():
            x = torch.ones(250_000)                       # 1 MB
            del x

        def once():
            x = torch.ones(5_000_000)                     # 20 MB
            del x
        return epoch, 10, [1.0], once

    monkeypatch.setattr(worker, "_setup", setup)
    spec = dict(method="lte4g", nodes=100, classes=4, avg_degree=4.0, features=8, hidden=8,
                config="paper", epochs=1, warmup=0, device="cpu", seed=0,
                cpu_memory="tracked", threads=None, loss_dtype=None)
    assert worker.run_worker(spec)["peak_memory_bytes"] == pytest.approx(20e6, rel=0.05)


def test_workers_wait_passively_unless_the_user_chose(monkeypatch):
    """Workers run with OMP_WAIT_POLICY=PASSIVE (spinning OpenMP threads collapse throughput
    on a shared machine) unless the caller's environment sets a policy (an empty one: the
    OpenMP runtime's default, which bench/omp_wait_ab.sh compares); scale.json records it."""
    envs: list[dict] = []

    def fake_run(cmd, **kwargs):
        envs.append(kwargs["env"])
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="boom")

    monkeypatch.setattr(scale.subprocess, "run", fake_run)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert scale.run_one({"nodes": 1}, None)["status"] == "error: boom"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    scale.run_one({"nodes": 1}, None)
    monkeypatch.setenv("OMP_WAIT_POLICY", "")
    scale.run_one({"nodes": 1}, None)
    assert [e["OMP_WAIT_POLICY"] for e in envs] == ["PASSIVE", "ACTIVE", ""]


def test_worker_graph_edges_training_nodes_and_degree_rule(monkeypatch):
    """The worker's edge count excludes the unit self-loops prepare_graph adds, its loss is
    taken on the natural split's training nodes, and --avg-degree is checked against the
    SMALLEST size (a too-dense small size failed inside its run): each could change
    unnoticed (a mutation audit)."""
    from hiertail_fast.data.splits import natural_split
    from hiertail_fast.data.synthetic import make_synthetic_graph
    from hiertail_fast.nn.hiertail import prepare_graph

    worker = sys.modules["_scale_worker"]
    spec = dict(method="gcn", nodes=300, classes=6, avg_degree=6.0, features=8, hidden=8,
                config="paper", device="cpu", seed=0, loss_dtype=None)
    seen = []
    real_build = worker.build_model

    def build(method, in_channels, num_classes, spec):
        model, loss_fn = real_build(method, in_channels, num_classes, spec)
        return model, lambda out, y, idx: seen.append(idx) or loss_fn(out, y, idx)

    monkeypatch.setattr(worker, "build_model", build)
    epoch, edges, _, _ = worker._setup(dict(spec), 300)
    epoch()
    data = make_synthetic_graph(300, 6, avg_degree=6.0, num_features=8, seed=0)
    g = prepare_graph(data.edge_index, 300)
    assert edges == int((g.row_index() != g.indices).sum())
    assert torch.equal(seen[0], natural_split(data.y, 0)[0])
    with pytest.raises(SystemExit):
        scale.parse_args(["--sizes", "100", "10000", "--avg-degree", "500", "--device", "cpu"])


def test_omp_wait_ab_needs_its_out_folder():
    """bench/omp_wait_ab.sh without OUTDIR ran scale.py with --out /PASSIVE1 ... (folders at
    the file system's root, as root; a docs audit): a usage line and exit 2 now, before any
    run."""
    script = Path(__file__).resolve().parents[1] / "bench" / "omp_wait_ab.sh"
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "usage: bench/omp_wait_ab.sh OUTDIR" in res.stderr
