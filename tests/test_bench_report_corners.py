"""bench/gpu_report.py, bench/_gpu_checks.py, bench/scale.py and bench/_scale_report.py: the
CPU-testable corners the mutation audit of 2026-12-03 found unchecked (each test failed on the
mutant it describes, passes on main).

- ``_keep_previous`` keeps ONE generation: a stale .prev from two runs ago goes.
- ``Budget.share`` gives a section its fraction of what is left after the reserve.
- the reports main() saves part-way say ``complete`` False; the last says True.
- the correctness checks' oracle runs in float64.
- a worker killed by SIGKILL (-9 from subprocess, 137 through a shell) reads "out of memory?".
- scale.png plots rows measured with fewer epochs ("ok (... long epochs)").
And bench/official_prototype_copy.py (the official prototype-copies-a-node case) prints the
torch engine within the suite's rule.
"""
from __future__ import annotations

import json
import subprocess

import pytest
import torch

from tests.conftest import load_bench, recorded_plot_lines


def test_keep_previous_moves_the_current_report_and_drops_an_older_one(tmp_path):
    report = load_bench("bench_gpu_report_keep_previous", "gpu_report.py")
    # run 1 wrote md + json; run 2 moved them to .prev and wrote only the json (stopped early)
    (tmp_path / "gpu_report.prev.md").write_text("two runs ago")
    (tmp_path / "gpu_report.prev.json").write_text("{}")
    (tmp_path / "gpu_report.json").write_text('{"run": 2}')
    kept = report._keep_previous(tmp_path)
    assert [p.name for p in kept] == ["gpu_report.prev.json"]
    assert (tmp_path / "gpu_report.prev.json").read_text() == '{"run": 2}'
    assert not (tmp_path / "gpu_report.prev.md").exists()   # not the last run's
    assert not (tmp_path / "gpu_report.md").exists()
    assert not (tmp_path / "gpu_report.json").exists()


def test_share_is_a_fraction_of_what_the_reserve_leaves():
    report = load_bench("bench_gpu_report_budget", "gpu_report.py")
    budget = report.Budget(100.0)
    assert budget.share(1.0, reserve=40.0).left() == pytest.approx(60.0, abs=1.0)
    assert budget.share(0.5, reserve=40.0).left() == pytest.approx(30.0, abs=1.0)
    assert budget.share(1.0, reserve=500.0).left() <= 0.0       # nothing left for the section
    assert budget.share(1.0).left() == pytest.approx(100.0, abs=1.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="--device cpu is the no-CUDA test mode")
def test_reports_saved_part_way_are_marked_partial(tmp_path, monkeypatch):
    report = load_bench("bench_gpu_report_partial", "gpu_report.py")
    written = []
    real = report.gc.write_json

    def spy(path, data):
        written.append(json.loads(json.dumps(data, default=str)))
        return real(path, data)

    monkeypatch.setattr(report.gc, "write_json", spy)
    monkeypatch.setattr(report.gc, "correctness", lambda *a, **k: [])   # no device work
    assert report.main(["--device", "cpu", "--sections", "correctness", "--out",
                        str(tmp_path)]) == 0
    assert [w["complete"] for w in written] == [False, True]
    assert json.loads((tmp_path / "gpu_report.json").read_text())["complete"] is True


@pytest.mark.parametrize("check,op", [("check_propagation", "gcn_propagate"),
                                      ("check_pooling", "topk_pool")])
def test_the_checks_reference_side_runs_in_float64(monkeypatch, check, op):
    gc = load_bench("bench_gpu_checks_oracle", "_gpu_checks.py")
    seen = {}
    real = getattr(gc, op)

    def spy(x, *args, backend=None, **kwargs):
        seen[backend] = x.dtype
        return real(x, *args, backend=backend, **kwargs)

    monkeypatch.setattr(gc, op, spy)
    rows = getattr(gc, check)("torch", "cpu", 40, 4)
    assert seen == {"torch": torch.float32, "reference": torch.float64}
    assert all(r["result"] == "PASS" for r in rows)


@pytest.mark.parametrize("code", [-9, 137])
def test_a_killed_scale_worker_reads_out_of_memory(monkeypatch, code):
    scale = load_bench("bench_scale_killed_worker", "scale.py")
    monkeypatch.setattr(scale.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, code, stdout="", stderr=""))
    assert scale.run_one({"method": "gcn", "nodes": 100}, timeout=10) == {
        "status": "error: killed (out of memory?)"}


def test_long_epoch_rows_are_plotted(tmp_path, monkeypatch):
    report = load_bench("bench_scale_report_plot", "_scale_report.py")
    drawn = recorded_plot_lines(monkeypatch)
    rows = [dict(method="hiertail", nodes=n, edges=10 * n, epoch_seconds=s, peak_memory_bytes=m,
                 device="cpu", status=st, predicted_memory_bytes="", once_seconds="")
            for n, s, m, st in [(100, 0.01, 1e6, "ok"), (1000, 0.1, 1e7, "ok"),
                                (10000, 90.0, 1e8,
                                 "ok (0 warm-up + 1 timed epochs: long epochs)")]]
    report.plot(rows, tmp_path / "scale.png")
    assert (tmp_path / "scale.png").exists()
    lines = [(xs, ys) for xs, ys, label in drawn if label == "hiertail"]
    assert len(lines) == 2                        # time and memory panels
    for xs, _ in lines:
        assert xs == [100, 1000, 10000]
    assert lines[0][1] == [0.01, 0.1, 90.0]


def test_official_prototype_copy_prints_the_torch_engine_within_the_rule(capsys):
    bench = load_bench("bench_official_prototype_copy", "official_prototype_copy.py")
    assert bench.main(["--norm", "10", "--taus", "1", "0.01", "--seeds", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [float(r[0]) for r in rows] == [1.0, 0.01]
    assert all(0.0 <= float(x) <= 1.0 for r in rows for x in r[2:]), rows
