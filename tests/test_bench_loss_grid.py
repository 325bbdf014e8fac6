"""bench/loss_grid.py (the loss over input regimes vs the GEMM floor, round-robin): runs end to
end on a tiny grid, records every cell and provider, and its anchors compute what they claim."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests._preloaded_cli import run_script

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPT = BENCH / "loss_grid.py"


@pytest.mark.parametrize("order", ["interleaved", "cells"])
def test_grid_records_every_cell_and_provider(tmp_path, order):
    out = tmp_path / "grid.json"
    res = run_script(SCRIPT, [
        "--sizes", "120", "--dims", "8", "--taus", "0.1", "10", "--regimes", "relu", "randn30",
        "--levels", "1", "3", "--variants", "exact", "--rounds", "2", "--threads", "1",
        "--order", order, "--out", out], timeout=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert len(data["records"]) == 2 * 2 * 2
    assert data["threads"] == 1 and len(data["load_average_before"]) == 3
    assert data["gemm_gflops_before"] > 0 and data["gemm_gflops_after"] > 0
    assert data["order"] == order and data["rounds"] == 2
    cells = {(r["levels"], r["regime"], r["tau"]) for r in data["records"]}
    assert cells == {(lv, rg, t) for lv in (1, 3) for rg in ("relu", "randn30")
                     for t in (0.1, 10.0)}
    for r in data["records"]:
        assert set(r["median_s"]) == {"torch", "attention", "floor", "floor+exp"}
        assert all(t > 0 for t in r["median_s"].values())
        for b in ("torch", "attention"):
            assert abs(r["ratio_to_floor_exp"][b]
                       - r["median_s"][b] / r["median_s"]["floor+exp"]) < 1e-12
            assert abs(r["min_ratio_to_floor_exp"][b]
                       - r["min_s"][b] / r["min_s"]["floor+exp"]) < 1e-12
            assert r["min_s"][b] <= r["median_s"][b]
    md = out.with_suffix(".md").read_text()
    assert md.count("\n| 120 | 8 |") == 8 and "load average" in md and "GEMM probe" in md
    # whether the engine ran with its C kernels is recorded and named in the header
    assert isinstance(data["native_kernels"], bool) and isinstance(data["native_threads"], bool)
    if not data["native_kernels"]:
        assert "C kernels off" in md
    else:
        assert ("C kernels on (on torch's OpenMP threads)," if data["native_threads"]
                else "C kernels on (serial build),") in md
    # the summary: one row per (N, levels, variant), 4 cells each
    assert md.count("\n| 120 | 1 | exact | 4 |") == 1 and md.count("\n| 120 | 3 | exact | 4 |") == 1


def test_grid_takes_16_bit_inputs_and_the_automatic_choice(tmp_path):
    """--dtype feeds the loss bf16 rows (anchors in float32); "auto" times the library's own
    choice (no backend=); both recorded."""
    out = tmp_path / "grid.json"
    res = run_script(SCRIPT, [
        "--sizes", "90", "--dims", "8", "--taus", "0.5", "--regimes", "relu", "--levels", "1",
        "--variants", "exact", "--dtype", "bfloat16", "--backends", "auto", "torch",
        "--rounds", "1", "--threads", "1", "--out", out], timeout=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert data["dtype"] == "bfloat16" and len(data["records"]) == 1
    assert set(data["records"][0]["median_s"]) == {"auto", "torch", "floor", "floor+exp"}
    assert "bfloat16 inputs" in out.with_suffix(".md").read_text()


def test_summary_ranges_and_counts_over_the_best_engine():
    sys.path.insert(0, str(BENCH))
    try:
        from loss_grid import summary
    finally:
        sys.path.remove(str(BENCH))

    def rec(levels, med, mins):
        return dict(n=6, d=4, levels=levels, variant="official", regime="relu", tau=0.1,
                    ratio_to_floor_exp=dict(zip(("torch", "attention"), med, strict=True)),
                    min_ratio_to_floor_exp=dict(zip(("torch", "attention"), mins, strict=True)))

    rows = [rec(1, (1.6, 1.7), (1.2, 1.4)), rec(1, (1.4, 1.2), (1.3, 1.1)),
            rec(1, (2.0, 1.55), (1.6, 1.45))]
    md = summary(rows, ("torch", "attention"))
    # best engine per cell: medians 1.6, 1.2, 1.55 -> 2 above 1.5; mins 1.2, 1.1, 1.45 -> 0
    assert ("| 6 | 1 | official | 3 | 1.20-1.60 (median 1.55) | 2 "
            "| 1.10-1.45 (median 1.20) | 0 |") in md


def test_interleaved_rounds_visit_every_case_each_round(monkeypatch):
    """Round r times every case once (rotated start), every provider of a case back to back,
    official right after exact on each engine; the anchors are timed once per case and shared
    by its two variants' records."""
    sys.path.insert(0, str(BENCH))
    try:
        import loss_grid
    finally:
        sys.path.remove(str(BENCH))
    log = []

    def fake_steps(case, variants, backends, dtype):
        names = [f"{v}:{b}" for b in backends for v in variants] + ["floor", "floor+exp"]
        return {nm: (lambda c=case, nm=nm: log.append((c[4], nm))) for nm in names}

    monkeypatch.setattr(loss_grid, "_case_steps", fake_steps)
    args = SimpleNamespace(sizes=[10], dims=[4], levels=[1], variants=["exact", "official"],
                           regimes=["relu"], taus=[0.1, 1.0, 10.0], backends=("torch",),
                           rounds=3, order="interleaved", dtype="float32")
    records = loss_grid.run_grid(args)
    assert [(r["variant"], r["tau"]) for r in records] == [
        (v, t) for v in ("exact", "official") for t in (0.1, 1.0, 10.0)]
    for r in records:
        assert set(r["times_s"]) == {"torch", "floor", "floor+exp"}
        assert all(len(v) == 3 for v in r["times_s"].values())
    assert records[0]["times_s"]["floor"] == records[3]["times_s"]["floor"]    # shared
    timed = log[3 * 4:]                                     # after one warm-up call each
    assert len(timed) == 3 * 3 * 4                          # rounds x cases x providers
    for r in range(3):
        one_round = timed[r * 12:(r + 1) * 12]
        assert sorted({t for t, _ in one_round}) == [0.1, 1.0, 10.0]
        for k in range(3):                                  # a case's providers together
            chunk = one_round[4 * k:4 * k + 4]
            assert len({t for t, _ in chunk}) == 1
            assert [nm for _, nm in chunk] == ["exact:torch", "official:torch", "floor",
                                               "floor+exp"]
    firsts = [timed[r * 12][0] for r in range(3)]
    assert len(set(firsts)) == 3                            # the start rotates


def test_paired_ratio_takes_each_rounds_own_pair():
    """Official / exact round by round (each on its best engine by median), then the median:
    a slow round slows both of its times and cancels; the ratio of the medians does not."""
    sys.path.insert(0, str(BENCH))
    try:
        import loss_grid
    finally:
        sys.path.remove(str(BENCH))
    ex = dict(median_s={"torch": 1.0, "attention": 2.0},
              times_s={"torch": [1.0, 2.0, 1.0, 2.0, 0.5], "attention": [2.0] * 5})
    off = dict(median_s={"torch": 1.9, "attention": 3.0},
               times_s={"torch": [1.1, 2.2, 1.9, 2.3, 0.6], "attention": [3.0] * 5})
    # rounds: 1.1, 1.1, 1.9, 1.15, 1.2 -> median 1.15 (medians: 1.9 / 1.0)
    assert abs(loss_grid.paired_ratio(off, ex, ("torch", "attention")) - 1.15) < 1e-12
    assert loss_grid.paired_ratio({"median_s": off["median_s"]}, ex, ("torch",)) is None
    # the summary gains the paired columns when every pair has its rounds
    recs = [dict(n=6, d=4, levels=1, variant=v, regime="relu", tau=0.1, min_s=r["median_s"],
                 **r) for v, r in (("exact", ex), ("official", off))]
    lines = loss_grid._official_over_exact(recs, ("torch", "attention"))
    assert "paired by round" in lines[1]
    assert lines[3] == ("| 6 | 1 | 1 | 1.90-1.90 (median 1.90) | 1 | 1.90-1.90 (median 1.90) "
                        "| 1 | 1.15-1.15 (median 1.15) | 0 |")


def test_anchor_and_cases_compute_what_they_claim():
    sys.path.insert(0, str(BENCH))
    try:
        import loss_grid
    finally:
        sys.path.remove(str(BENCH))
    z, ys, ps = loss_grid.make_case("normalised", 50, 6, 3)
    torch.testing.assert_close(z.norm(dim=1), torch.ones(50, device=z.device))
    assert [p.shape[0] for p in ps] == [40, 20, 10]
    assert (ys[1] == ys[0] // 2).all() and (ys[2] == ys[0] // 4).all()
    calls = []
    real_mm = torch.mm

    def counting_mm(*a, **k):
        calls.append(a[0].shape[0])
        return real_mm(*a, **k)

    torch.mm = counting_mm
    try:
        loss_grid.floor_step(z, ps, with_exp=False)()
    finally:
        torch.mm = real_mm
    assert sum(calls) == 3 * (50 + 70)            # three full passes of rows of Z_all Z_all^T


def test_accuracy_report_runs_and_names_the_engine(tmp_path):
    out = tmp_path / "acc.json"
    res = run_script(BENCH / "loss_accuracy.py", [
        "--n", "80", "--d", "8", "--taus", "1", "--regimes", "relu", "randn30", "--out", out],
        timeout=300)
    assert res.returncode == 0, res.stderr
    rows = json.loads(out.read_text())["rows"]
    n_backends = 3 if torch.cuda.is_available() else 2      # torch, attention (+ triton)
    assert len(rows) == n_backends * 2 * 2 * 2      # backends x dtypes x variants x regimes
    engines = {(r["backend"], r["regime"], r["variant"], r["dtype"]): r["engine"] for r in rows}
    for variant in ("exact", "official"):
        assert engines[("attention", "relu", variant, "float32")] == "attention kernels"
        # over the precision guard
        assert engines[("attention", "randn30", variant, "float32")] == "own engine"
    # bf16, official: never on the bf16 kernels (CUDA flash; ops/_attention_lse.MAX_LOGIT_BF16);
    # on CPU bf16 rows run the fp32 kernel under the fp32 rows' limits (kernel_dtype)
    bf16_official = engines[("attention", "relu", "official", "bfloat16")]
    if torch.cuda.is_available():
        assert bf16_official == "own engine"
    else:
        assert bf16_official == engines[("attention", "relu", "official", "float32")]
    for r in rows:
        if r["dtype"] == "float32" and r["regime"] == "relu":
            assert r["value_rel_err"] < 1e-5 and r["grad_rel_err"] < 1e-4


def test_busy_machine_script_runs_on_an_idle_machine(data_dir):
    res = run_script(BENCH / "busy_machine.py",
                     ["--data", data_dir / "email.npz", "--epochs", "2", "--busy", "0"],
                     timeout=600)
    assert res.returncode == 0, res.stderr
    times = [line.split()[1] for line in res.stdout.splitlines()[1:]]
    assert len(times) == 3 and all(float(t) > 0 for t in times)


def _dispatch_count():
    """bench/dispatch_count.py as the module it imports as (its siblings from bench/)."""
    sys.path.insert(0, str(BENCH))
    try:
        import dispatch_count
    finally:
        sys.path.remove(str(BENCH))
    return dispatch_count


def test_dispatch_count_counts_the_loss_calls():
    """bench/dispatch_count.py: counts every operator of one loss step, by call site; the
    official variant's positive-pair pass adds calls on top of the exact variant's; --syncs
    counts the host-syncing ones."""
    dispatch_count = _dispatch_count()
    exact = dispatch_count.count(300, 8, 3, "exact", "relu", 0.1, "torch")
    official = dispatch_count.count(300, 8, 3, "official", "relu", 0.1, "torch")
    assert sum(exact.values()) > 50
    assert sum(official.values()) > sum(exact.values())
    assert any(where.startswith("_positive_blocks.py:") for _, where in official)
    assert not any(where.startswith("_positive_blocks.py:") for _, where in exact)
    mm = sum(k for (name, _), k in exact.items() if name in ("mm", "addmm_", "addmm"))
    assert mm >= 3                       # forward + the two gradient sides, at least one block
    # views (no kernel on CUDA) told apart: torch's own is_view, never a GEMM
    views = dispatch_count.views_of(exact)
    assert 0 < views < sum(exact.values())
    packet = lambda name: getattr(torch.ops.aten, name)                   # noqa: E731
    assert "mm" not in exact.views and all(
        any(getattr(packet(name), o).is_view for o in packet(name).overloads())
        for name in exact.views)
    # --syncs: only the host-syncing calls (their result's value or size is read), a subset
    syncs = dispatch_count.count(300, 8, 3, "official", "relu", 0.1, "torch", syncs=True)
    assert 0 < sum(syncs.values()) < sum(official.values())
    assert any(name == "_unique2" for name, _ in syncs)     # label grouping reads its size
    assert all(name in dispatch_count.SYNC_OPS or name.endswith("[bool]") or name == "tolist"
               for name, _ in syncs)
    # tolist() runs no operator on CPU but is a device read on CUDA: counted too (the input
    # checks read every level's values in one tolist)
    real_tolist = torch.Tensor.tolist
    att = dispatch_count.count(120, 8, 1, "exact", "relu", 0.1, "attention", syncs=True)
    assert any(name == "tolist" and where.startswith("_validation/losses.py:")
               for name, where in att)
    assert torch.Tensor.tolist is real_tolist                              # put back
    mask = torch.tensor([True, False])
    assert dispatch_count._syncs("index", (torch.zeros(2), [mask])) == "index[bool]"
    assert dispatch_count._syncs("index", (torch.zeros(2), [torch.tensor([0])])) is None
    assert dispatch_count._syncs("mm", ()) is None


def test_dispatch_count_counts_a_hiertail_epoch(capsys):
    """bench/dispatch_count.py --epoch: one training epoch of scale.py's model, counted by call
    site (the model's losses, graph ops and checks), its syncs a subset; the loss checks of
    each loss call read the device once (``validate_contrastive_levels``)."""
    dispatch_count = _dispatch_count()
    calls = dispatch_count.count_step(dispatch_count.epoch_step(400))
    files = {where.split(":")[0] for _, where in calls}
    assert {"gcn_propagate.py", "topk_pool.py", "balanced_contrastive_loss.py"} <= files
    syncs = dispatch_count.count_step(dispatch_count.epoch_step(400), syncs=True)
    assert 0 < sum(syncs.values()) < sum(calls.values())
    checks = [k for (name, where), k in syncs.items()
              if name == "tolist" and where.startswith("_validation/losses.py:")]
    assert checks                        # the loss checks' one read per loss call
    assert dispatch_count.main(["--epoch", "400", "--syncs", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "HierTail epoch, 400 nodes" in out and "host-syncing calls per epoch" in out
    assert len(out.strip().splitlines()) == 4


def test_dispatch_count_names_each_host_waiting_call():
    """--syncs counts each call that makes a CUDA host wait under its name: a scalar read,
    nonzero, unique, bincount, repeat_interleave, masked_select, indexing and item assignment
    with a boolean mask (beside an index tensor too); arithmetic and integer indexing are
    not counted."""
    dispatch_count = _dispatch_count()
    x = torch.tensor([3.0, 0.0, 2.0])
    mask, idx = x > 1, torch.tensor([0, 2])
    counter = dispatch_count._Counter(syncs=True)
    with counter:
        x.sum().item()
        x.nonzero()
        torch.unique(x)
        torch.bincount(idx)
        torch.repeat_interleave(idx)
        torch.masked_select(x, mask)
        x[mask]
        torch.ones(2, 3)[torch.tensor([1]), mask]
        y = x.clone()
        y[mask] = 0.0
        y[idx] = 1.0
        x[idx] + 1
    assert dict(counter.calls) == {
        ("_local_scalar_dense", "-"): 1, ("nonzero", "-"): 1, ("_unique2", "-"): 1,
        ("bincount", "-"): 1, ("repeat_interleave", "-"): 1, ("masked_select", "-"): 1,
        ("index[bool]", "-"): 2, ("index_put_[bool]", "-"): 1}


def test_dispatch_count_names_the_innermost_library_line(tmp_path):
    """A call is counted at the innermost library line that made it (``file.py:line``, the
    file named with its private folder)."""
    import importlib.util

    probe = tmp_path / "hiertail_fast" / "_probe" / "calls.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("import torch\n\n\ndef inner(t):\n    return t.nonzero()\n\n\n"
                     "def outer(t):\n    return inner(t)\n")
    spec = importlib.util.spec_from_file_location("hiertail_fast_probe_calls", probe)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    counter = _dispatch_count()._Counter(syncs=True)
    with counter:
        mod.outer(torch.tensor([1.0, 0.0]))
    assert dict(counter.calls) == {("nonzero", "_probe/calls.py:5"): 1}


def _loss_line(out: str):
    """The numbers of a loss line: total, and (not views, launches) or None with --syncs."""
    (line,) = [ln for ln in out.splitlines() if ln.startswith("N=")]
    total, rest = line.split(": ", 1)[1].split(" ", 1)
    if rest.startswith("host-syncing"):
        return int(total), None
    inner = rest.split("(", 1)[1]
    return int(total), (int(inner.split()[0]), int(inner.split(", ")[1].split()[0]))


def test_dispatch_count_report_line_adds_up(capsys):
    """A loss line's total, calls that are not views and kernel launches are those of
    ``count`` (one line a variant without --top); --syncs reports the host-syncing calls."""
    dispatch_count = _dispatch_count()
    case = ["--n", "120", "--d", "8", "--levels", "1", "--variant", "exact"]
    assert dispatch_count.main(case) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1
    calls = dispatch_count.count(120, 8, 1, "exact", "relu", 0.1, "torch")
    total = sum(calls.values())
    assert _loss_line(out) == (total, (total - dispatch_count.views_of(calls),
                                       dispatch_count.launches_of(calls)))
    assert dispatch_count.main(case + ["--syncs"]) == 0
    out = capsys.readouterr().out
    syncs = dispatch_count.count(120, 8, 1, "exact", "relu", 0.1, "torch", syncs=True)
    assert "host-syncing calls per loss" in out
    assert _loss_line(out) == (sum(syncs.values()), None) and 0 < sum(syncs.values()) < total


def test_dispatch_count_runs_the_rows_asked_for(monkeypatch, capsys):
    """--n, --d and --dtype reach the loss that is counted (rows and prototypes in that
    dtype)."""
    dispatch_count = _dispatch_count()
    seen = []
    real = dispatch_count.loss_step

    def spy(backend, z, ys, ps, tau, variant):
        seen.append((tuple(z.shape), z.dtype, {p.dtype for p in ps}))
        return real(backend, z, ys, ps, tau, variant)

    monkeypatch.setattr(dispatch_count, "loss_step", spy)
    assert dispatch_count.main(["--n", "120", "--d", "8", "--levels", "1", "--variant",
                                "exact", "--dtype", "bfloat16"]) == 0
    assert seen == [((120, 8), torch.bfloat16, {torch.bfloat16})]
    assert "float32" not in capsys.readouterr().out


def test_dispatch_count_as_cuda_takes_the_band_unless_asked(capsys):
    """--as-cuda without --positives counts the band plan (CUDA's), not the slices; no line
    says attention kernels were emulated unless --emulate-attention is given."""
    dispatch_count = _dispatch_count()
    outs = {}
    for extra in ([], ["--positives", "band"], ["--positives", "slices"]):
        assert dispatch_count.main(["--n", "300", "--d", "8", "--levels", "1", "--variant",
                                    "official", "--as-cuda", "--top", "400", *extra]) == 0
        outs[tuple(extra)] = capsys.readouterr().out
    assert outs[()] == outs[("--positives", "band")] != outs[("--positives", "slices")]
    assert "emulated" not in outs[()]


def test_dispatch_count_as_cuda_block_budget_and_no_row_cap():
    """``_as_cuda(block_bytes=...)``: the torch engine in blocks of that budget (more blocks,
    more launches) and no row cap; the row cap is put back after."""
    import hiertail_fast.ops._lse_torch as lse_torch

    dispatch_count = _dispatch_count()
    rows = lse_torch.MAX_BLOCK_ROWS
    launches = {}
    for budget in (1 << 30, 4 * 620 * 75):
        with dispatch_count._as_cuda(block_bytes=budget):
            assert lse_torch.MAX_BLOCK_ROWS > 1 << 40
            launches[budget] = dispatch_count.launches_of(
                dispatch_count.count(600, 8, 1, "exact", "relu", 0.1, "torch"))
        assert lse_torch.MAX_BLOCK_ROWS == rows
    assert launches[4 * 620 * 75] > launches[1 << 30]


def test_dispatch_count_epoch_of_the_smallest_graph(capsys):
    """--epoch 70 (the graph's 70 classes, a node each) runs; --as-cuda says "(CUDA forms)";
    --syncs counts the host-syncing calls only, fewer than all calls."""
    dispatch_count = _dispatch_count()
    totals = {}
    for extra in ([], ["--syncs"]):
        assert dispatch_count.main(["--epoch", "70", "--as-cuda", *extra]) == 0
        out = capsys.readouterr().out
        assert out.startswith("HierTail epoch, 70 nodes (CUDA forms): ")
        totals[bool(extra)] = int(out.split(": ", 1)[1].split()[0])
    assert 0 < totals[True] < totals[False]


def test_dispatch_count_counts_every_call_after_a_warm_up():
    """``count_step`` counts the second call of a step (the first fills caches), every call of
    a view or an allocation, repeated ones too: ``empty_like`` is an allocation, no launch."""
    dispatch_count = _dispatch_count()
    runs = []

    def step():
        if not runs:                        # a cache filled on the first call only
            torch.zeros(5).add_(1.0)
        runs.append(1)
        t = torch.ones(2, 3)                # one launch (a fill)
        for _ in range(3):
            t.t()                           # three views
        torch.empty_like(t)                 # an allocation

    calls = dispatch_count.count_step(step)
    assert len(runs) == 2
    assert dispatch_count.views_of(calls) == 3 and dispatch_count.launches_of(calls) == 1, calls


def test_vm_noise_samples_every_provider(tmp_path):
    out = tmp_path / "noise.json"
    res = run_script(BENCH / "vm_noise.py", [
        "--n", "90", "--d", "8", "--samples", "3", "--pause", "0", "--copy-mb", "1",
        "--threads", "1", "--out", out], timeout=300)
    assert res.returncode == 0, res.stderr
    rep = json.loads(out.read_text())
    assert len(rep["samples"]) == 3 and rep["threads"] == 1
    for row in rep["samples"]:
        assert row["copy_gbs"] > 0 and min(row[k] for k in ("exact", "official",
                                                            "floor+exp")) > 0
    for key, s in rep["spread"].items():
        vals = [row[key] for row in rep["samples"]]
        assert s["min"] == min(vals) and s["max"] == max(vals) and s["min"] <= s["median"]
    bad = run_script(BENCH / "vm_noise.py", ["--samples", "0"], timeout=120)
    assert bad.returncode == 2 and "--samples" in bad.stderr


def _vm_noise():
    from tests.conftest import load_bench

    return load_bench("bench_vm_noise_units", "vm_noise.py")


def test_vm_noise_report_loads_before_and_after_and_median_spread(tmp_path, monkeypatch,
                                                                   capsys):
    """vm_noise main (sampling stubbed): the load average read before the samples is
    load_average_before and the one read after them load_average_after; a spread's median is
    the median (not the mean); --copy-mb 0 is refused before any sampling."""
    vm = _vm_noise()
    loads, order = iter([[1.0, 1.0, 1.0], [3.0, 2.0, 1.0]]), []
    rows = [{"t": "x", "copy_gbs": g, "exact": g, "official": 1.0, "floor+exp": 1.0}
            for g in (1.0, 2.0, 9.0)]
    monkeypatch.setattr(vm, "load_average", lambda: order.append("load") or next(loads))
    monkeypatch.setattr(vm, "sample_all", lambda *a: order.append("samples") or rows)
    out = tmp_path / "noise.json"
    assert vm.main(["--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert order == ["load", "samples", "load"]
    assert rep["load_average_before"] == [1.0, 1.0, 1.0]
    assert rep["load_average_after"] == [3.0, 2.0, 1.0]
    assert rep["spread"]["copy_gbs"] == {"min": 1.0, "median": 2.0, "max": 9.0}
    capsys.readouterr()
    monkeypatch.setattr(vm, "load_average", lambda: [])
    monkeypatch.setattr(vm, "sample_all", lambda *a: pytest.fail("sampled"))
    with pytest.raises(SystemExit) as exc:
        vm.main(["--copy-mb", "0", "--out", str(out)])
    assert exc.value.code == 2 and "--copy-mb must be positive" in capsys.readouterr().err


def test_vm_noise_samples_take_the_best_copy_and_pause_only_between(monkeypatch):
    """sample_all: a sample's copy figure is the best of its three copies, every step is timed
    once per sample, the pause comes between samples (none after the last); copy_gbs counts a
    copy's bytes twice (read + write)."""
    vm = _vm_noise()
    speeds = iter([50.0, 1.0, 7.0, 3.0, 2.0, 8.0, 4.0])       # the warm-up, 3 per sample
    ticks, pauses, real_copy = iter(range(1000)), [], vm.copy_gbs
    monkeypatch.setattr(vm, "copy_gbs", lambda src, dst: next(speeds))
    monkeypatch.setattr(vm, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks)),
                                                    strftime=lambda fmt: "12:00:00",
                                                    sleep=pauses.append))
    rows = vm.sample_all(90, 8, 2, 0.5, 1)
    assert [r["copy_gbs"] for r in rows] == [7.0, 8.0] and pauses == [0.5]
    assert all(r[k] == 1.0 for r in rows for k in ("exact", "official", "floor+exp"))
    clock = iter([1.0, 1.5])
    monkeypatch.setattr(vm, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    src = torch.zeros(1 << 18)                                    # 1 MiB of fp32
    assert real_copy(src, torch.empty_like(src)) == pytest.approx(2 * (1 << 20) / 0.5 / 1e9)


def test_report_rewrites_an_earlier_json_with_official_over_exact(tmp_path):
    def rec(variant, torch_s, attn_s, fe_s):
        return dict(n=6, d=4, levels=1, variant=variant, regime="relu", tau=0.1,
                    median_s={"torch": torch_s, "attention": attn_s, "floor": 0.5,
                              "floor+exp": fe_s},
                    min_s={"torch": torch_s / 2, "attention": attn_s, "floor": 0.4,
                           "floor+exp": fe_s / 2},
                    ratio_to_floor_exp={"torch": torch_s / fe_s, "attention": attn_s / fe_s})
    old = dict(device="cpu", torch="x", threads=2, rounds=3, load_average_before=[0, 0, 0],
               load_average_after=[0, 0, 0],           # no "order": a run from before it
               records=[rec("exact", 1.0, 2.0, 1.0), rec("official", 1.5, 1.4, 1.0)])
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    res = run_script(SCRIPT, ["--report", str(path)], timeout=120)
    assert res.returncode == 0, res.stderr
    md = path.with_suffix(".md").read_text()
    assert "(cells order;" in md and "C kernels" not in md        # not recorded then
    # medians: best official 1.4 / best exact 1.0; best of rounds: min(0.75, 1.4) / min(0.5, 2.0)
    assert "| 6 | 1 | 1 | 1.40-1.40 (median 1.40) | 1 | 1.50-1.50 (median 1.50) | 1 |" in md
    data = json.loads(path.read_text())
    assert data["records"][1]["min_ratio_to_floor_exp"]["torch"] == 0.75 / 0.5
    bad = tmp_path / "bad.json"
    bad.write_text('{"records": [{"n": 1}]}')
    res = run_script(SCRIPT, ["--report", str(bad)], timeout=120)
    assert res.returncode == 2 and "not a loss_grid JSON" in res.stderr
    assert bad.read_text() == '{"records": [{"n": 1}]}'            # left as it was


def test_rowblock_provider_switches_the_symmetric_engine_off_for_its_call(monkeypatch):
    """``rowblock`` = the torch backend with HIERTAIL_SYMMETRIC=0 during its step only (the
    environment is put back after it), ``torch`` leaves the switch alone."""
    sys.path.insert(0, str(BENCH))
    try:
        import loss_grid
    finally:
        sys.path.remove(str(BENCH))
    import hiertail_fast.ops._lse_symmetric as sym

    monkeypatch.delenv(sym.ENV_VAR, raising=False)
    monkeypatch.setattr(sym, "MIN_ROWS", 1)
    seen = []
    real = sym.applicable

    def spy(z, log_w):
        seen.append(sym.enabled())
        return real(z, log_w)

    monkeypatch.setattr(sym, "applicable", spy)
    z, ys, ps = loss_grid.make_case("relu", 60, 8, 1)
    loss_grid.loss_step("rowblock", z, ys, ps, 0.1, "exact")()
    assert seen == [False] and sym.ENV_VAR not in os.environ
    loss_grid.loss_step("torch", z, ys, ps, 0.1, "exact")()
    assert seen == [False, True]


def test_dispatch_count_as_cuda_counts_the_band_and_the_slices():
    """--as-cuda (a subprocess: it configures the engine through the environment): the
    official positives' band path makes fewer calls than the per-group slice plan, through
    _band and not _slice, and the exact variant's count does not depend on the path."""
    def run(*extra):
        res = run_script(BENCH / "dispatch_count.py", [
            "--n", "900", "--d", "8", "--levels", "1", "--as-cuda", "--top", "400", *extra],
            timeout=300)
        assert res.returncode == 0, res.stderr
        totals = [int(line.split(": ")[1].split()[0]) for line in res.stdout.splitlines()
                  if "operator calls per loss" in line]
        return totals, res.stdout

    import inspect

    from hiertail_fast.ops._positive_blocks import BlockPositives

    def lines_of(method):
        src, first = inspect.getsourcelines(method)
        return set(range(first, first + len(src)))

    def sites(out, module):
        return {int(line.split(":")[-1]) for line in out.splitlines()
                if f"{module}.py:" in line}

    (exact_b, official_b), out_b = run("--positives", "band")
    (exact_s, official_s), out_s = run("--positives", "slices")
    assert exact_b == exact_s and official_b < official_s
    band, slices = lines_of(BlockPositives._band), lines_of(BlockPositives._slice)
    in_band, in_slices = "_positive_blocks", "_positive_slices"   # the methods' modules
    assert sites(out_b, in_band) & band and not sites(out_b, in_slices) & slices
    assert sites(out_s, in_slices) & slices and not sites(out_s, in_band) & band


def test_attention_guard_sweep_runs_with_the_guard_off(tmp_path):
    """bench/attention_guard.py: every (bound, regime, variant, backend) row, the attention
    kernels really used above the library's limit (the guard off), errors small at a small
    bound, and the library's limits recorded."""
    out = tmp_path / "guard.json"
    res = run_script(BENCH / "attention_guard.py",
                     ["--n", "200", "--d", "8", "--bounds", "64", "4096", "--out", out],
                     timeout=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert len(rows) == 2 * 2 * 2 * 2                   # bounds x regimes x variants x backends
    assert data["meta"]["guard_in_library"] == {"exact": 1024.0, "official": 256.0}
    for r in rows:
        if r["bound"] == 64 and r["regime"] == "relu":
            assert r["value_rel_err"] < 1e-5 and r["grad_rel_err"] < 1e-4, r
    big = [r for r in rows if r["bound"] == 4096 and r["backend"] == "attention"
           and r["variant"] == "exact" and r["regime"] == "relu"]
    torch_big = [r for r in rows if r["bound"] == 4096 and r["backend"] == "torch"
                 and r["variant"] == "exact" and r["regime"] == "relu"]
    # past the exact limit the kernels ran (guard off): their error is above the torch engine's
    assert big[0]["grad_rel_err"] > torch_big[0]["grad_rel_err"]


def test_attention_guard_sweep_in_bf16_and_its_engine_choices(tmp_path):
    """--dtype bfloat16: rows say so and the bf16 limits are recorded (errors then include
    bf16's rounding of the returned gradient, ~2^-9: both engines alike for the exact
    variant); triton[tf32x3] is refused without CUDA (the interpreter's dots are not the
    GPU's)."""
    out = tmp_path / "guard.json"
    guard = BENCH / "attention_guard.py"
    cmd = ["--n", "150", "--d", "8", "--bounds", "4096", "--dtype", "bfloat16", "--engines",
           "attention", "torch", "--out", out]
    res = run_script(guard, cmd, timeout=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert data["meta"]["dtype"] == "bfloat16" and data["meta"]["guard_bf16"]["exact"] > 1024
    assert len(data["meta"]["load_average_start"]) == len(data["meta"]["load_average_end"]) == 3
    assert {r["dtype"] for r in data["rows"]} == {"bfloat16"} and len(data["rows"]) == 8
    for r in data["rows"]:
        # bf16 rounding, not a wrong answer; the official variant on the bf16 kernels is
        # imprecise on CUDA (flash returns O in bf16, the gradient cancels: 3.6e-2 on an H200)
        # and the library never sends it there (its bf16 limit is 0)
        if r["variant"] == "exact" or r["backend"] == "torch" or not torch.cuda.is_available():
            assert r["grad_rel_err"] < 1e-2, r
    assert data["meta"]["guard_bf16"]["official"] == 0.0
    if not torch.cuda.is_available():
        res = run_script(guard, cmd[:-5] + ["--engines", "triton[tf32x3]", "--out", out],
                         timeout=300)
        assert res.returncode == 2 and "needs CUDA" in res.stderr


def test_bench_results_are_checked_first_and_the_previous_is_kept(tmp_path):
    """bench/_results (loss_grid, attention_guard, loss_accuracy, block_costs, vm_noise,
    interleaved): an unwritable --out was found after the whole run (a traceback, the results
    lost) and a second run replaced the first silently (a docs audit). Now: exit 2 and one
    line before any timing; the earlier result kept as NAME.prev.EXT."""
    grid = ["--sizes", "60", "--dims", "4", "--taus", "1", "--regimes", "relu", "--levels", "1",
            "--variants", "exact", "--rounds", "1", "--threads", "1"]
    (tmp_path / "dir.json").mkdir()
    res = run_script(SCRIPT, grid + ["--out", tmp_path / "dir.json"], timeout=120)
    assert res.returncode == 2 and "loss grid on" not in res.stdout          # nothing timed
    assert f"--out {tmp_path / 'dir.json'} cannot be written: " in res.stderr
    res = run_script(SCRIPT, grid + ["--taus", "-1", "--out", tmp_path / "g.json"], timeout=120)
    assert res.returncode == 2 and "--taus: must be a finite number >= 1e-06, got -1" in res.stderr
    out = tmp_path / "g.json"
    for _ in range(2):
        res = run_script(SCRIPT, grid + ["--out", out], timeout=300)
        assert res.returncode == 0, res.stderr
    assert "the previous g.json is kept as" in res.stdout
    assert json.loads((tmp_path / "g.prev.json").read_text())["records"]
    assert (tmp_path / "g.prev.md").exists()


def test_dispatch_count_emulates_the_attention_engines_cuda_branches(capsys, monkeypatch):
    """--emulate-attention (with --as-cuda): the attention engine takes its CUDA branches on CPU
    tensors (bf16: flash attention on the folded operands), its kernels emulated and not
    counted, on a GPU machine too (the cases' device, CUDA there, is pinned to the CPU: here
    it is set to "cuda" as a GPU machine has it); without --as-cuda it is refused."""
    dispatch_count = _dispatch_count()
    import hiertail_fast.ops._attention_lse as attn

    monkeypatch.setattr(dispatch_count.loss_grid, "DEVICE", "cuda")
    seen = []
    real = attn._call_folded
    try:
        attn._call_folded = lambda *a, **k: seen.append(dispatch_count.loss_grid.DEVICE) or \
            real(*a, **k)
        assert dispatch_count.main(["--n", "120", "--d", "8", "--levels", "1", "--variant",
                                    "exact", "--backend", "attention", "--as-cuda",
                                    "--emulate-attention", "--dtype", "bfloat16", "--top",
                                    "400"]) == 0
    finally:
        attn._call_folded = real
    out = capsys.readouterr().out
    assert seen and set(seen) == {"cpu"}
    assert "bfloat16 backend=attention (attention kernels emulated" in out
    assert dispatch_count.loss_grid.DEVICE == "cuda"                   # put back
    assert "attention" not in out.split("\n", 1)[1].replace("_attention_lse.py", "")
    assert attn._kernel_kind(torch.device("cpu")) == "cpu"           # put back
    with pytest.raises(SystemExit):
        dispatch_count.main(["--emulate-attention"])
