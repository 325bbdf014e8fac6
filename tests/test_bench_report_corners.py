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


def test_official_prototype_copy_case_is_the_node_and_its_copy():
    """case(): 30 unit rows but node 1, of norm --norm and in class 0 of level 0, whose
    prototype of class 0 is a bit-for-bit copy of it (copy=False: a random prototype, the rest
    the same draws); level 1 the classes halved."""
    bench = load_bench("bench_official_prototype_copy", "official_prototype_copy.py")
    z, (y0, y1), p0 = bench.case(3, 50.0, True)
    norms = z.double().norm(dim=1)
    assert norms[1].item() == pytest.approx(50.0, rel=1e-6)
    torch.testing.assert_close(norms[torch.arange(30) != 1], torch.ones(29, dtype=torch.float64))
    assert y0[1] == 0 and torch.equal(y1, y0 // 2) and p0.shape == (4, 64)
    assert torch.equal(p0[0], z[1])
    z2, labels2, q0 = bench.case(3, 50.0, False)
    assert torch.equal(z2, z) and torch.equal(labels2[0], y0) and torch.equal(q0[1:], p0[1:])
    assert not torch.equal(q0[0], z[1])


def test_official_prototype_copy_run_is_the_official_loss_and_its_gradients():
    """run(): [loss, dL/dz, dL/dprototypes] of the official hierarchical loss of the case."""
    from hiertail_fast import hierarchical_contrastive_loss

    bench = load_bench("bench_official_prototype_copy", "official_prototype_copy.py")
    z, labels, p0 = bench.case(0, 5.0, True)
    got = bench.run(z.double(), labels, p0.double(), "reference", 0.5, "cpu")
    zz, pp = z.double().requires_grad_(), p0.double().requires_grad_()
    loss = hierarchical_contrastive_loss(zz, labels, [pp, None], temperature=0.5,
                                         variant="official", backend="reference")
    want = [loss.detach(), *torch.autograd.grad(loss, [zz, pp])]
    assert [t.shape for t in got] == [t.shape for t in want]
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e)


def test_official_prototype_copy_reports_the_engines_worst_seed(monkeypatch):
    """worst_ratios runs the engine on --seeds distinct cases and reports, per output, the worst
    error against the float64 reference / the rule (2 x the fp32 reference's error + 1e-5 +
    1e-4 max|float64|) over them: an engine that returns the float64 answer is at 0, one whose
    prototype gradient is off by 3 x the rule on the first seed alone at 3."""
    bench = load_bench("bench_official_prototype_copy", "official_prototype_copy.py")
    real, seen = bench.run, []

    def float64_first_seed_off(z, labels, p0, backend, tau, device):
        if backend == "reference":
            return real(z, labels, p0, backend, tau, device)
        seen.append(z)
        out = real(z.double(), labels, p0.double(), "reference", tau, "cpu")
        if len(seen) == 1:
            low = real(z, labels, p0, "reference", tau, "cpu")[2]
            rule = (2 * (low - out[2]).abs().max().item() + 1e-5
                    + 1e-4 * out[2].abs().max().item())
            out[2] = out[2].clone()
            out[2][0, 0] += 3 * rule
        return out

    monkeypatch.setattr(bench, "run", float64_first_seed_off)
    worst = bench.worst_ratios("torch", 1.0, 10.0, True, 3, "cpu")
    assert worst[:2] == [0.0, 0.0] and worst[2] == pytest.approx(3.0, rel=1e-9), worst
    assert len(seen) == 3
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])


def test_official_prototype_copy_main_passes_its_options_and_prints_each_output(monkeypatch,
                                                                                capsys):
    """main(): one worst_ratios call per --taus entry with the options as given (--no-copy: a
    random prototype), a row per temperature: tau, norm^2 / tau, value, dz, dprototypes."""
    bench = load_bench("bench_official_prototype_copy", "official_prototype_copy.py")
    calls = []

    def fake(*args):
        calls.append(args)
        return [0.25, 0.5, 0.75]

    monkeypatch.setattr(bench, "worst_ratios", fake)
    for extra, copy in (([], True), (["--no-copy"], False)):
        calls.clear()
        assert bench.main(["--norm", "10", "--taus", "1", "0.01", "--seeds", "3", *extra]) == 0
        assert calls == [("torch", 1.0, 10.0, copy, 3, "cpu"), ("torch", 0.01, 10.0, copy, 3,
                                                                 "cpu")]
        rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
        assert rows == [["1", "1e+02", "0.25", "0.5", "0.75"],
                        ["0.01", "1e+04", "0.25", "0.5", "0.75"]]
