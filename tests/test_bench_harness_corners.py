"""The measuring harnesses' arithmetic and bookkeeping, checked against hand-computed figures (a
mutation audit found these corners untested): which cells and engines bench/loss_profile.py
times, its profile summary and table; bench/next_defaults.py's rules; bench/_roofline.py's card
peaks and units; the medians, warm-ups, ratios and A/B labels of bench/interleaved.py,
bench/loss_grid.py, bench/engine_ab.py, bench/version_ab.py and bench/epoch_ab.py. Every timer is
replaced by a fake clock: nothing here depends on the machine's speed."""
from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import _roofline  # noqa: E402
import engine_ab  # noqa: E402
import epoch_ab  # noqa: E402
import loss_grid  # noqa: E402
import loss_profile  # noqa: E402
import version_ab  # noqa: E402

import hiertail_fast  # noqa: E402
from tests.conftest import FakeClock  # noqa: E402
from tests.test_bench_next_defaults import _derived, _rows  # noqa: E402


def _costed_steps(clock: FakeClock, costs: dict) -> tuple[dict, list]:
    """Steps that each take costs[name][k] seconds on their k-th call (and log the call)."""
    calls: list = []

    def make(name):
        def step():
            clock.spend(costs[name][sum(c == name for c in calls)])
            calls.append(name)
        return step
    return {name: make(name) for name in costs}, calls


# ------------------------------------------------------------------------- next_defaults.py
def _derive(tmp_path, *tables):
    """next_defaults' (text, derived) for loss_profile JSON files holding `tables`
    ({(dtype, variant, levels, d, n): {engine: seconds}} each, one file per table)."""
    paths = [tmp_path / f"p{i}.json" for i in range(len(tables))]
    for path, cells in zip(paths, tables, strict=True):
        path.write_text(json.dumps({"rows": _rows(cells)}))
    return _derived(*paths)


def test_next_defaults_a_later_file_replaces_an_earlier_row(tmp_path):
    """The module's docstring: a later file's row replaces an earlier one's for the same cell
    and engine (a re-measured cell must win, a mutation audit found this unchecked)."""
    key = ("fp32", "exact", 1, 64, 20_000)
    _, got = _derive(tmp_path, {key: {"torch": 2.0, "triton": 1.0}}, {key: {"triton": 3.0}})
    assert got["TRITON_MIN_ROWS['exact']"] is None          # torch 2.0 beats triton's 3.0


def test_next_defaults_min_rows_needs_every_larger_n(tmp_path):
    """TRITON_MIN_ROWS is the smallest N from which Triton wins at EVERY larger N: a loss at 50k
    between wins at 20k and 100k puts it at 100k (a mutation audit)."""
    cells = {("fp32", "exact", 1, 64, n): {"torch": 1.0, "triton": t}
             for n, t in ((20_000, 0.5), (50_000, 1.5), (100_000, 0.5))}
    # a cell past the time budget (no Triton row) says nothing, it does not count as a loss
    cells["fp32", "exact", 1, 64, 200_000] = {"torch": 1.0}
    _, got = _derive(tmp_path, cells)
    assert got["TRITON_MIN_ROWS['exact']"] == 100_000


def test_next_defaults_max_dim_is_the_widest_win_at_the_largest_n(tmp_path):
    """TRITON_MAX_DIM: the widest d at which Triton is the fastest exact one-level fp32 engine
    at the LARGEST N measured for that d (a mutation audit): d 32 wins everywhere, d 64 only at
    100k, d 128 only at 20k -> 64."""
    cells = {}
    for d, (small, large) in {32: (0.5, 0.5), 64: (1.5, 0.5), 128: (0.5, 1.5)}.items():
        cells["fp32", "exact", 1, d, 20_000] = {"attention": 1.0, "triton": small}
        cells["fp32", "exact", 1, d, 100_000] = {"attention": 1.0, "triton": large}
    _, got = _derive(tmp_path, cells)
    assert got["TRITON_MAX_DIM"] == 64


def test_next_defaults_faster_means_under_97_percent_and_geomean(tmp_path):
    """A mode counts as faster only under 97 % of its base's time (FASTER), the table's ratio is
    the GEOMETRIC mean, and one win in three cells is 'mixed' (a mutation audit): ratios 0.98
    (not faster), 0.5 and 2.0 -> 1 of 3, geomean (0.98 * 0.5 * 2) ** (1/3) = 0.99."""
    cells = {("fp32", "exact", 1, 64, n): {"triton": 1.0, "triton[lean]": r}
             for n, r in ((1_000, 0.98), (2_000, 0.5), (3_000, 2.0))}
    text, got = _derive(tmp_path, cells)
    assert "| `triton[lean]` | `triton` | 1 of 3 | 0.99 | mixed" in text
    assert got["triton[lean]"] == "mixed: keep it off, or choose by size"
    _, got = _derive(tmp_path, {("fp32", "exact", 1, 64, 1_000):
                                {"triton": 1.0, "triton[lean]": 0.98}})
    assert got["triton[lean]"] == "keep it off"


def test_next_defaults_margins_are_over_the_fastest(tmp_path):
    """The table's 'next best' and 'auto' columns are times over the fastest engine's (>= 1),
    with the auto row's engine named (a mutation audit)."""
    key = ("fp32", "exact", 1, 64, 20_000)
    text, _ = _derive(tmp_path, {key: {"triton": 0.001, "torch": 0.002, "auto": 0.0015}})
    assert "| fp32 | exact | 1 | 64 | 20,000 | triton | 1.0 | torch (2.00x) | torch (1.50x) |" \
        in text


def test_next_defaults_attention_rule_needs_a_strict_win(tmp_path):
    """ATTENTION_OFFICIAL_MIN_ROWS: from the official ONE-level fp32 cells only (a 3-level cell
    where attention loses does not count), and attention must be faster than torch: a tie is
    no win (a mutation audit)."""
    cells = {("fp32", "official", 1, 64, 50_000): {"torch": 1.0, "attention": 0.5},
             ("fp32", "official", 3, 64, 50_000): {"torch": 1.0, "attention": 2.0}}
    _, got = _derive(tmp_path, cells)
    assert got["ATTENTION_OFFICIAL_MIN_ROWS"] == 50_000
    cells = {("fp32", "official", 1, 64, 50_000): {"torch": 1.0, "attention": 1.0}}
    _, got = _derive(tmp_path, cells)
    assert got["ATTENTION_OFFICIAL_MIN_ROWS"] is None


@pytest.mark.parametrize("order", [("torch", "triton"), ("triton", "torch")])
def test_next_defaults_a_tie_is_no_triton_win_in_either_row_order(tmp_path, order):
    """A Triton mode timed equal to torch does not win its cell, whichever row comes first in
    the JSON: the thresholds never depend on the rows' order (a tie once went to the first
    row, giving TRITON_MIN_ROWS 20,000 and TRITON_MAX_DIM 64 with Triton listed first)."""
    key = ("fp32", "exact", 1, 64, 20_000)
    text, got = _derive(tmp_path, {key: dict.fromkeys(order, 1.0)})
    assert got["TRITON_MIN_ROWS['exact']"] is None and got["TRITON_MAX_DIM"] is None
    assert "| fp32 | exact | 1 | 64 | 20,000 | torch |" in text


def test_next_defaults_max_dim_reads_single_level_cells_only(tmp_path):
    """TRITON_MAX_DIM comes from the exact ONE-level fp32 cells: a width timed only at three
    levels (where Triton wins) neither widens it nor stops the report."""
    cells = {("fp32", "exact", 1, 64, 20_000): {"torch": 1.0, "triton": 0.5},
             ("fp32", "exact", 3, 128, 20_000): {"torch": 1.0, "triton": 0.5}}
    text, got = _derive(tmp_path, cells)
    assert got["TRITON_MAX_DIM"] == 64
    assert "| `TRITON_MAX_DIM` | 64 |" in text


def test_next_defaults_min_rows_uses_the_derived_max_dim(tmp_path):
    """TRITON_MIN_ROWS counts the cells up to the TRITON_MAX_DIM these tables derive (here 128,
    wider than the shipped 64): d 128 losing at 20k puts the exact threshold at 100k."""
    cells = {}
    for d, small in ((64, 0.5), (128, 1.5)):
        cells["fp32", "exact", 1, d, 20_000] = {"torch": 1.0, "triton": small}
        cells["fp32", "exact", 1, d, 100_000] = {"torch": 1.0, "triton": 0.5}
    _, got = _derive(tmp_path, cells)
    assert got["TRITON_MAX_DIM"] == 128
    assert got["TRITON_MIN_ROWS['exact']"] == 100_000


# ------------------------------------------------------------------------- loss_profile.py
def _stub_gpu(monkeypatch, timed: list):
    """loss_profile's GPU rows without a GPU: inputs, anchors and timing stubbed; every timed
    (variant, levels, dtype, engine) goes to `timed`."""
    gc = loss_profile.gc
    fake = SimpleNamespace(to=lambda dev: fake, shape=(40, 8))
    monkeypatch.setattr(gc, "loss_inputs", lambda n, d: (fake, fake, fake))
    monkeypatch.setattr(loss_profile.gpu_report, "_anchor_steps", lambda *a: {})
    monkeypatch.setattr(gc, "auto_engine", lambda *a: "torch")
    monkeypatch.setattr(gc, "auto_key_splits", lambda n, d, dev, dtype: 4 if n == 140 else 0)
    monkeypatch.setattr(gc, "warps_decide", lambda n, d, dev, dtype: n == 140 and d == 8)
    monkeypatch.setattr(gc, "tuned_tiles", lambda: {"fwd": ["tile"]})
    monkeypatch.setattr(loss_profile, "make_step", lambda z, y, p, v, lv, dt, label: (
        lambda: timed.append((v, lv, dt, label))))
    monkeypatch.setattr(gc, "sync", lambda dev: None)          # the real round-robin timing,
    monkeypatch.setattr(gc, "_timed_once", lambda step, dev: (step(), (1e-3, None))[1])  # no GPU
    monkeypatch.setattr(gc, "time_call", lambda step, dev, reps: step() or {"median_s": 1e-3})


ENGINES = ["auto", "torch", "torch+slices", "triton", "triton[shared]", "triton[tf32x3]",
           "triton[tf32x3+autotune]"]


def test_loss_profile_times_each_engine_in_its_cells(monkeypatch):
    """On CUDA (stubbed), the rows follow the module's rules (a mutation audit): positives plans
    on the official variant only, shared-keys modes at 3 levels of the exact variant only, bf16
    without the fp32-dot (tf32x3) modes and plans, the autotuned mode not among them but in
    tuned_rows at 1 and 3 levels."""
    timed: list = []
    _stub_gpu(monkeypatch, timed)
    rows: list = []
    far = loss_profile.time.perf_counter() + 1e6
    loss_profile.time_rows("cuda", 100, 8, ENGINES, 1, far, rows.append)
    got = {(r["dtype"], r["variant"], r["levels"], r["what"]) for r in rows}
    want = set()
    for v in ("exact", "official"):
        for lv in (1, 3):
            fp32 = ["auto", "torch", "triton", "triton[tf32x3]"]
            bf16 = ["auto", "torch", "triton"]
            if v == "official":
                fp32.append("torch+slices")
            if lv == 3 and v == "exact":     # the official variant has no shared-keys form
                fp32.append("triton[shared]")
                bf16.append("triton[shared]")
            want |= {("fp32", v, lv, e) for e in fp32} | {("bf16", v, lv, e) for e in bf16}
    # each step called twice (its warm-up, one round); the engines of one cell round-robin
    assert got == want and len(rows) == len(want) and len(timed) == 2 * len(want)
    cell = [t for t in timed if t[:3] == ("exact", 1, torch.float32)]
    engines = ["auto", "torch", "triton", "triton[tf32x3]"]
    assert [t[3] for t in cell] == engines + engines
    assert all(r["median_s"] == 1e-3 for r in rows)
    assert {(r["levels"], r["what"]) for r in rows if "engine" in r} == {
        (lv, "auto") for lv in (1, 3)}
    # the "triton" rows record the key splits of their kernels there (100 rows + 40 prototypes)
    assert {(r["what"], r.get("key_splits")) for r in rows if "key_splits" in r} == {
        ("triton", 4)}
    assert all("key_splits" in r for r in rows if r["what"] == "triton")
    # ... and whether triton[warps4] launches them differently (asked the same way)
    assert {(r["what"], r.get("warps_decide")) for r in rows if "warps_decide" in r} == {
        ("triton", True)}
    assert all("warps_decide" in r for r in rows if r["what"] == "triton")
    rows.clear()
    loss_profile.tuned_rows("cuda", 100, 8, ENGINES, 1, far, rows.append)
    assert [(r["levels"], r["what"], r["tiles"]) for r in rows] == [
        (1, "triton[tf32x3+autotune]", {"fwd": ["tile"]}),
        (3, "triton[tf32x3+autotune]", {"fwd": ["tile"]})]


def test_loss_profile_budget_skips_rows_instead_of_timing_them(monkeypatch):
    """Under 5 s left, a row is 'skipped: time budget' and not timed; an autotuned row needs
    AUTOTUNE_NEED_S / 2 (a mutation audit)."""
    timed: list = []
    _stub_gpu(monkeypatch, timed)
    rows: list = []
    now = loss_profile.time.perf_counter()
    loss_profile.time_rows("cuda", 100, 8, ["torch"], 1, now + 3, rows.append)
    need = loss_profile.gpu_report.AUTOTUNE_NEED_S
    loss_profile.tuned_rows("cuda", 100, 8, ENGINES, 1, now + need / 2 - 10, rows.append)
    assert len(rows) == 2 * 2 * 2 + 2 and not timed        # torch: 2 variants x 2 levels x 2 dtypes
    assert all(r["error"] == "skipped: time budget" for r in rows)


def test_loss_profile_positive_plans_set_their_own_plan():
    """Each positives engine label runs the plan its name says ($HIERTAIL_POSITIVES = the part
    after '+'), and the variable is put back afterwards (a mutation audit)."""
    before = os.environ.get("HIERTAIL_POSITIVES")
    for label in loss_profile.POSITIVE_PLANS:
        with loss_profile.engine_mode(label) as backend:
            assert backend == label.split("+")[0]
            assert os.environ["HIERTAIL_POSITIVES"] == label.split("+")[1]
        assert os.environ.get("HIERTAIL_POSITIVES") == before


def test_loss_profile_summary_of_a_profiled_step():
    """profile_summary (fake profiler): device busy = the device-side entries' time (host ops
    repeat the time of the kernels they launch: aten ops, and the autograd Function that
    launches a Triton kernel, whose time was counted twice before 2026-12-05; GPU user
    annotations span kernels) in seconds, kernels by device time, host ops by self time, both
    descending, in ms; host waits by name (a read's cudaMemcpyAsync is not a second wait),
    kernel launches of torch and Triton counted (a mutation audit)."""
    from torch.autograd import DeviceType

    def ev(key, count, dev_us, cpu_us, device=DeviceType.CPU, annotation=False):
        return SimpleNamespace(key=key, count=count, self_device_time_total=dev_us,
                               self_cpu_time_total=cpu_us, device_type=device,
                               is_user_annotation=annotation)

    cuda = DeviceType.CUDA
    events = [ev("aten::mm", 2, 300.0, 50.0), ev("gemm_kernel", 2, 300.0, 0.0, cuda),
              ev("exp_kernel", 1, 100.0, 0.0, cuda), ev("aten::exp", 1, 100.0, 400.0),
              ev("BalancedContrastiveFunction", 1, 50.0, 30.0),
              ev("_lse_fwd_kernel", 1, 50.0, 0.0, cuda), ev("loss", 1, 450.0, 0.0, cuda, True),
              ev("cudaStreamSynchronize", 3, 0.0, 10.0), ev("cudaMemcpyAsync", 3, 0.0, 2.0),
              ev("cudaLaunchKernel", 3, 0.0, 6.0), ev("cuLaunchKernelEx", 2, 0.0, 5.0)]
    got = loss_profile.gc.profile_summary(SimpleNamespace(key_averages=lambda: events), 0.002,
                                          "cuda")
    assert got["device_busy_s"] == pytest.approx(450e-6)
    assert got["top_kernels"] == [("gemm_kernel", 2, 0.3), ("exp_kernel", 1, 0.1),
                                  ("_lse_fwd_kernel", 1, 0.05)]
    assert [k for k, _, _ in got["top_host"]][:4] == ["aten::exp", "aten::mm",
                                                      "BalancedContrastiveFunction",
                                                      "cudaStreamSynchronize"]
    assert got["top_host"][0][2] == pytest.approx(0.4)
    assert got["syncs"] == {"cudaStreamSynchronize": 3} and got["ops"] == 3
    assert got["launches"] == 5 and got["seconds"] == 0.002


def test_profile_step_leaves_out_its_own_device_syncs(monkeypatch):
    """profile_step on CUDA: the host waits an empty step shows under the same harness (its
    own sync ending the timed call, the profiler's on exit: two cudaDeviceSynchronize in the
    2026-11-27 H200 profiles) are not the step's and are taken away by name, the empty step
    profiled once, not once a step; on the CPU nothing is (the profiler faked: no GPU here)."""
    import torch.profiler

    gc = loss_profile.gc
    monkeypatch.setattr(torch.profiler, "profile", lambda **kw: contextlib.nullcontext())
    monkeypatch.setattr(gc, "sync", lambda dev: None)
    monkeypatch.setattr(gc, "_OWN_SYNCS", {})
    own = {"cudaDeviceSynchronize": 2}
    queue = {}                                  # the summaries the fake profiler returns
    monkeypatch.setattr(gc, "profile_summary", lambda prof, wall, dev: dict(
        seconds=wall, syncs=next(queue["summaries"])))
    for step_syncs, left in (({"cudaDeviceSynchronize": 2, "cudaStreamSynchronize": 4},
                              {"cudaStreamSynchronize": 4}),
                             ({"cudaDeviceSynchronize": 5}, {"cudaDeviceSynchronize": 3})):
        queue["summaries"] = iter([step_syncs, own])   # the step's profile, the empty step's
        assert gc.profile_step(lambda: None, "cuda")["syncs"] == left
        queue["summaries"] = iter([step_syncs])        # again: the empty step's is known
        assert gc.profile_step(lambda: None, "cuda")["syncs"] == left
        queue["summaries"] = iter([step_syncs])
        assert gc.profile_step(lambda: None, "cpu")["syncs"] == step_syncs


def test_loss_profile_table_in_ms_over_same_dtype_anchors():
    """render: ms, then the time over the SDPA anchor of the ROW's dtype and over the floor
    (a mutation audit): bf16 8 ms / SDPA bf16 4 ms = 2.00, / floor 5 ms = 1.60."""
    anchor = lambda what, s: dict(n=10, d=4, variant="–", levels="–",  # noqa: E731
                                  dtype="–", what=what, median_s=s)
    report = dict(device="x", when="now", torch="t", load_average_start=None,
                  load_average_end=None, rows=[
                      anchor("SDPA fp32 fwd+bwd", 0.010), anchor("SDPA bf16 fwd+bwd", 0.004),
                      anchor(loss_profile.gpu_report.FLOOR, 0.005),
                      dict(n=10, d=4, variant="exact", levels=1, dtype="bf16", what="torch",
                           median_s=0.008)])
    md = loss_profile.render(report)
    assert "| 10 | 4 | exact | 1 | bf16 | torch | 8.00 | 2.00 | 1.60 |" in md


def test_loss_profile_cells_time_apart_and_autotuned_rows_in_fp32_on_cuda_only(monkeypatch):
    """time_rows: each (variant, levels, dtype) is its own round-robin (its warm-ups and round
    before the next cell's: fp32 and bf16 are not mixed); tuned_rows: the exact variant in
    fp32 (its row says fp32 and the step runs fp32), timed with AUTOTUNE_NEED_S / 2 left (not
    NEED), and nothing without CUDA."""
    timed: list = []
    _stub_gpu(monkeypatch, timed)
    far = loss_profile.time.perf_counter() + 1e6
    loss_profile.time_rows("cuda", 100, 8, ["auto", "torch"], 1, far, lambda row: None)
    exact1 = [(t[2], t[3]) for t in timed if t[:2] == ("exact", 1)]
    fp32, bf16 = [(torch.float32, e) for e in ("auto", "torch")], \
        [(torch.bfloat16, e) for e in ("auto", "torch")]
    assert exact1 == fp32 + fp32 + bf16 + bf16
    timed.clear()
    rows: list = []
    need = loss_profile.gpu_report.AUTOTUNE_NEED_S
    soon = loss_profile.time.perf_counter() + 0.75 * need
    loss_profile.tuned_rows("cuda", 100, 8, ["triton[autotune]"], 1, soon, rows.append)
    assert [(r["variant"], r["levels"], r["dtype"], r["median_s"]) for r in rows] == [
        ("exact", 1, "fp32", 1e-3), ("exact", 3, "fp32", 1e-3)]
    assert timed == [("exact", lv, torch.float32, "triton[autotune]") for lv in (1, 3)]
    rows.clear()
    loss_profile.tuned_rows("cpu", 100, 8, ["triton[autotune]"], 1, far, rows.append)
    assert rows == [] and len(timed) == 2


def test_loss_profile_table_engines_errors_anchors_and_profiles():
    """render: an automatic row names the engine it chose; a row without a time shows its
    error; the anchors line lists every anchor in ms; a profile row reads wall and device-busy
    time in ms, and a profile row with an error shows it."""
    anchor = lambda what, s: dict(n=10, d=4, variant="–", levels="–",  # noqa: E731
                                  dtype="–", what=what, median_s=s)
    prof = dict(n=10, d=4, variant="exact", levels=1, dtype="fp32", what="profile",
                engine="torch", seconds=0.002, device_busy_s=0.00045, ops=3,
                syncs={"cudaStreamSynchronize": 1}, top_kernels=[("gemm", 2, 0.3)],
                top_host=[("aten::mm", 2, 0.05)])
    report = dict(device="x", when="now", torch="t", load_average_start=None,
                  load_average_end=None, rows=[
                      anchor("SDPA fp32 fwd+bwd", 0.010), anchor("SDPA bf16 fwd+bwd", 0.004),
                      dict(n=10, d=4, variant="exact", levels=1, dtype="fp32", what="auto",
                           engine="attention", median_s=0.02),
                      dict(n=10, d=4, variant="exact", levels=3, dtype="fp32", what="torch",
                           error="skipped: time budget"),
                      prof, dict(prof, levels=3, error="RuntimeError: out of memory")])
    md = loss_profile.render(report)
    assert "| 10 | 4 | exact | 1 | fp32 | auto → attention | 20.00 | 2.00 | – |" in md
    assert "| 10 | 4 | exact | 3 | fp32 | torch | skipped: time budget | |" in md
    assert "Anchors: 10×4 SDPA fp32 fwd+bwd 10.00 ms; 10×4 SDPA bf16 fwd+bwd 4.00 ms" in md
    assert "wall 2.00 ms (profiled), device busy 0.45 ms, aten ops 3" in md
    assert "| `gemm` | 2 | 0.300 |" in md
    assert "## Profile: exact, 3 level(s), fp32, N 10, d 4, engine torch\nerror: " \
           "RuntimeError: out of memory" in md


# ------------------------------------------------------------------------- _roofline.py
def test_roofline_card_peaks_units_and_modes():
    """Every listed card resolves to its own peak (a shorter name listed first would shadow it),
    the peak is reported in GB/s, fwd+bwd figures count twice the bytes, negative sizes are
    refused (a mutation audit)."""
    for name, peak in (("NVIDIA H100 NVL", 3.9e12), ("NVIDIA A100-SXM4-80GB", 2.039e12),
                       ("NVIDIA A100 80GB PCIe", 1.935e12), ("NVIDIA A100-SXM4-40GB", 1.555e12),
                       ("NVIDIA L40S", 0.864e12)):
        assert _roofline.peak_bandwidth(name) == peak, name
    fig = _roofline.bandwidth_figures(2, 3, 4, 1e-6, "fwd+bwd", "NVIDIA H200")
    assert fig["bytes_model"] == 200 and fig["achieved_GBps"] == pytest.approx(0.2)
    assert fig["peak_GBps"] == pytest.approx(4800.0)
    with pytest.raises(ValueError, match="non-negative"):
        _roofline.spmm_bytes(-1, 3, 4)


def test_roofline_zero_sizes_count_and_card_names_match_in_any_case():
    """Zero is a size, not an error ("non-negative"): an empty graph still moves its row
    pointers and output rows; a card's name matches its entry whatever its case."""
    assert _roofline.spmm_bytes(0, 0, 0) == 0
    assert _roofline.spmm_bytes(5, 0, 4) == 5 * (4 + 16)
    assert _roofline.spmm_bytes(2, 3, 0) == 5 * 4
    assert _roofline.peak_bandwidth("nvidia h200") == 4.8e12
    assert _roofline.peak_bandwidth("NVIDIA L40S".lower()) == 0.864e12


# ------------------------------------------------------------------------- interleaved.py
def test_interleaved_round_robin_drops_the_warm_up(monkeypatch):
    """time_round_robin: one untimed warm-up call per step, then `rounds` timed calls each in
    turn (a mutation audit): the warm-ups' 100 s never show."""
    import interleaved

    clock = FakeClock()
    monkeypatch.setattr(interleaved, "time", clock)
    steps, calls = _costed_steps(clock, {"a": [100, 1, 2, 3], "b": [100, 4, 5, 6]})
    assert interleaved.time_round_robin(steps, 3) == {"a": [1, 2, 3], "b": [4, 5, 6]}
    assert calls == ["a", "b"] * 4


def test_interleaved_records_medians_ratios_and_bytes(monkeypatch, tmp_path, capsys):
    """main (timings stubbed): median and min per provider, the ratio = provider median / torch
    median, and the fwd+bwd byte model = twice the forward's (a mutation audit)."""
    import interleaved

    other = next(p for p in interleaved.OPS["propagation"]["providers"] if p != "torch")
    monkeypatch.setattr(interleaved, "propagation_step", lambda p, n, d, mode: (None, 30))
    fake = {"torch": [0.003, 0.001, 0.002, 0.010], other: [0.006, 0.002, 0.004, 0.020]}
    monkeypatch.setattr(interleaved, "time_round_robin", lambda steps, rounds: fake)
    out = tmp_path / "r.json"
    assert interleaved.main(["propagation", "--nodes", "70", "--dims", "4", "--modes",
                             "fwd+bwd", "--providers", "torch", other, "--rounds", "4",
                             "--out", str(out)]) == 0
    rec = {r["provider"]: r for r in json.loads(out.read_text())["records"]}
    assert rec["torch"]["median_s"] == pytest.approx(0.0025)
    assert rec[other]["median_s"] == pytest.approx(0.005) and rec[other]["min_s"] == 0.002
    assert re.search(rf"{re.escape(other)} .* 2\.00x torch", capsys.readouterr().out)
    # 2 x (30 entries x (4 + 4 x 4) + 70 rows x (4 + 4 x 4)) bytes (70 nodes: the least the
    # benchmark graphs' 70 classes take, checked by main)
    assert rec["torch"]["bytes_model"] == 2 * (30 * 20 + 70 * 20)


def test_interleaved_times_only_the_chosen_providers_and_records_the_run(monkeypatch, tmp_path):
    """--providers picks whose steps are made and timed, --rounds is recorded, a propagation
    record names no prototype count, and --out's missing folder is created."""
    import interleaved

    others = [p for p in interleaved.OPS["propagation"]["providers"] if p != "torch"]
    made = []
    monkeypatch.setattr(interleaved, "propagation_step",
                        lambda p, n, d, mode: made.append(p) or (None, 30))
    monkeypatch.setattr(interleaved, "time_round_robin",
                        lambda steps, rounds: {p: [0.001] * rounds for p in steps})
    out = tmp_path / "new_folder" / "r.json"
    assert interleaved.main(["propagation", "--nodes", "70", "--dims", "4", "--modes", "fwd",
                             "--providers", "torch", others[0], "--rounds", "3",
                             "--out", str(out)]) == 0
    assert made == ["torch", others[0]]
    data = json.loads(out.read_text())
    assert data["rounds"] == 3 and data["op"] == "propagation"
    assert [r["provider"] for r in data["records"]] == ["torch", others[0]]
    assert all(r["prototypes"] is None and r["mode"] == "fwd" for r in data["records"])


def test_interleaved_prototype_step_gets_m_prototypes_of_d_features(monkeypatch, tmp_path):
    """prototype op: --prototypes is the number m of prototypes and --dims their width d, in
    the step and in the records."""
    import interleaved

    seen = []
    monkeypatch.setattr(interleaved.tpool, "make_prototype_step",
                        lambda provider, n, m, d=128: seen.append((provider, n, m, d)) or None)
    monkeypatch.setattr(interleaved, "time_round_robin",
                        lambda steps, rounds: {p: [0.001] * rounds for p in steps})
    out = tmp_path / "p.json"
    assert interleaved.main(["prototype", "--nodes", "50", "--dims", "4", "--prototypes", "3",
                             "--providers", "torch", "--rounds", "2", "--out", str(out)]) == 0
    assert seen == [("torch", 50, 3, 4)]
    (rec,) = json.loads(out.read_text())["records"]
    assert rec["prototypes"] == 3 and rec["d"] == 4 and rec["n"] == 50


# ------------------------------------------------------------------------- loss_grid.py
def test_loss_grid_record_medians_and_best_rounds():
    """_record: the median (not the mean) of the rounds, the best round (not the first), the
    ratios over floor+exp of each; _case_records keeps the two anchors apart; the markdown's
    columns: median ratios, then best-of-rounds ratios (a mutation audit)."""
    times = {"torch": [2.0, 1.0, 12.0], "floor": [1.0, 1.0, 1.0],
             "floor+exp": [0.5, 0.25, 0.75]}
    case = (10, 4, 1, "relu", 0.1)
    (rec,) = loss_grid._case_records(case, {"exact:torch": times["torch"], **times},
                                     ["exact"], ["torch"])
    assert rec["median_s"] == {"torch": 2.0, "floor": 1.0, "floor+exp": 0.5}
    assert rec["min_s"] == {"torch": 1.0, "floor": 1.0, "floor+exp": 0.25}
    assert rec["ratio_to_floor_exp"] == {"torch": 4.0}
    assert rec["min_ratio_to_floor_exp"] == {"torch": 4.0}
    rec["min_ratio_to_floor_exp"] = {"torch": 3.0}
    assert loss_grid.markdown([rec], ["torch"]).splitlines()[2].endswith(
        "| 2.000 | 1.000 | 0.500 | 4.00 | 3.00 |")


def test_loss_grid_floor_exp_anchor_exps_one_pass_only(monkeypatch):
    """floor+exp = the three GEMM passes plus ONE exp pass (its docstring; a mutation audit):
    one row block here, so one in-place exp."""
    z, _, ps = loss_grid.make_case("relu", 30, 4, 1)
    exps = []
    real = torch.Tensor.exp_
    monkeypatch.setattr(torch.Tensor, "exp_", lambda self: exps.append(1) or real(self))
    loss_grid.floor_step(z, ps, with_exp=True)()
    assert len(exps) == 1


def test_loss_grid_gemm_probe_counts_two_flops_per_multiply_add(monkeypatch):
    """gemm_probe: 2 rows n d flops over the MEDIAN call time, in GFLOP/s (a mutation audit):
    calls of 1, 2 and 4 ns on [8, 4] x [4, 16] -> 1024 / 2 ns = 512 GFLOP/s."""
    clock = FakeClock()
    monkeypatch.setattr(loss_grid, "time", clock)
    costs = iter([0.0] * 3 + [1e-9, 2e-9, 4e-9])
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda *a, **k: clock.spend(next(costs)) or real_mm(*a, **k))
    assert loss_grid.gemm_probe(rows=8, n=16, d=4, reps=3) == 512.0


def test_loss_grid_spread_counts_cells_strictly_above_the_limit():
    """'cells > 1.5' counts values above the limit, not at it (a mutation audit)."""
    assert loss_grid._spread_cols([1.5, 1.6], 1.5).endswith("| 1")


def test_loss_grid_regimes_scale_as_documented():
    """embeddings(): relu = relu(randn) / sqrt(d), randn30 = 30 randn, normalised = unit rows,
    each from the same draws of the generator."""
    def draw(regime):
        return loss_grid.embeddings(regime, 12, 16, torch.Generator().manual_seed(5))
    z = torch.randn(12, 16, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(draw("relu"), torch.relu(z) / 4.0)
    torch.testing.assert_close(draw("randn30"), 30.0 * z)
    torch.testing.assert_close(draw("randn"), z)
    torch.testing.assert_close(draw("normalised"), z / z.norm(dim=1, keepdim=True))
    with pytest.raises(ValueError, match="regime='wide'"):
        draw("wide")


def test_loss_grid_steps_call_the_loss_as_the_cell_says(monkeypatch):
    """loss_step: the cell's temperature and variant, every level (hierarchical on 3), and
    "auto" passes no backend (the library's own choice); _case_steps gives the loss --dtype
    rows and the anchors float32 rows."""
    seen = []

    def spy(name):
        def loss(zz, *args, **kw):
            levels = len(args[0]) if name == "hierarchical" else 1
            seen.append((name, levels, kw["temperature"], kw["variant"], kw["backend"]))
            return zz.sum()
        return loss
    monkeypatch.setattr(loss_grid, "balanced_contrastive_loss", spy("balanced"))
    monkeypatch.setattr(loss_grid, "hierarchical_contrastive_loss", spy("hierarchical"))
    z1, ys1, ps1 = loss_grid.make_case("relu", 30, 4, 1)
    z3, ys3, ps3 = loss_grid.make_case("relu", 30, 4, 3)
    loss_grid.loss_step("auto", z1, ys1, ps1, 0.25, "official")()
    loss_grid.loss_step("attention", z3, ys3, ps3, 2.0, "official")()
    loss_grid.loss_step("rowblock", z1, ys1, ps1, 0.5, "exact")()
    assert seen == [("balanced", 1, 0.25, "official", None),
                    ("hierarchical", 3, 2.0, "official", "attention"),
                    ("balanced", 1, 0.5, "exact", "torch")]
    got = {}
    monkeypatch.setattr(loss_grid, "loss_step", lambda b, z, ys, ps, tau, v: got.setdefault(
        "loss", (z.dtype, {p.dtype for p in ps})))
    monkeypatch.setattr(loss_grid, "floor_step", lambda z, ps, with_exp: got.setdefault(
        with_exp, (z.dtype, {p.dtype for p in ps})))
    loss_grid._case_steps((30, 4, 3, "relu", 0.1), ["exact"], ["torch"], torch.bfloat16)
    assert got == {"loss": (torch.bfloat16, {torch.bfloat16}),
                   False: (torch.float32, {torch.float32}),
                   True: (torch.float32, {torch.float32})}


def test_loss_grid_floor_exp_takes_exp_of_clamped_products(monkeypatch):
    """floor+exp's exp pass sees the products clamped into [-C, 0] (C = the library's exp
    cut-off), even on the randn30 regime whose raw products overflow exp."""
    z, _, ps = loss_grid.make_case("randn30", 30, 4, 1)
    ranges = []
    real = torch.Tensor.exp_
    monkeypatch.setattr(torch.Tensor, "exp_", lambda self: ranges.append(
        (self.min().item(), self.max().item())) or real(self))
    loss_grid.floor_step(z, ps, with_exp=True)()
    cutoff = loss_grid.exp_cutoff(torch.float32)
    assert ranges and all(-cutoff <= lo and hi <= 0.0 for lo, hi in ranges), ranges
    assert min(lo for lo, _ in ranges) == -cutoff


def test_loss_grid_markdown_rule_spans_every_column():
    """The markdown's rule row has one '---' per header column (2 engines: 14 columns), so
    the table renders."""
    times = {"torch": [2.0], "attention": [3.0], "floor": [1.0], "floor+exp": [0.5]}
    (rec,) = loss_grid._case_records((10, 4, 1, "relu", 0.1),
                                     {f"exact:{b}": times[b] for b in ("torch", "attention")}
                                     | times, ["exact"], ["torch", "attention"])
    head, rule = loss_grid.markdown([rec], ["torch", "attention"]).splitlines()[:2]
    assert rule.count("---") == head.count("|") - 1 == 14


def test_loss_grid_refuses_zero_rounds_before_any_timing(capsys, tmp_path):
    """--rounds 0: exit 2 with one line, before the GEMM probe (not a StatisticsError after
    the warm-ups)."""
    with pytest.raises(SystemExit) as exc:
        loss_grid.main(["--sizes", "20", "--dims", "4", "--taus", "1", "--regimes", "relu",
                        "--levels", "1", "--variants", "exact", "--rounds", "0", "--out",
                        str(tmp_path / "g.json")])
    captured = capsys.readouterr()
    assert exc.value.code == 2 and "loss grid on" not in captured.out
    assert "--sizes, --dims and --rounds must be positive" in captured.err


# --------------------------------------------------------- engine_ab / version_ab / epoch_ab
def test_round_robin_medians_drop_the_first_round(monkeypatch):
    """engine_ab.round_robin_medians (version_ab's too): the first round warms up and is
    dropped, the rest give the MEDIAN; `before(name)` runs before each step (a mutation
    audit)."""
    clock = FakeClock()
    monkeypatch.setattr(engine_ab, "time", clock)
    steps, calls = _costed_steps(clock, {"old": [100, 1, 2, 12], "new": [100, 3, 6, 30]})
    seen = []
    med = engine_ab.round_robin_medians(steps, 4, before=seen.append)
    assert med == {"old": 2, "new": 6}
    assert seen == calls == ["old", "new"] * 4


def test_engine_ab_ratios_put_new_over_old(monkeypatch, capsys):
    """engine_ab's line (medians stubbed): new/old, old/exact and new/exact as named (a
    mutation audit)."""
    monkeypatch.setattr(engine_ab, "round_robin_medians", lambda steps, rounds, before: {
        "old": 2.0, "new": 1.0, "floor+exp": 0.5, "exact": 4.0})
    assert engine_ab.main(["--switch", "fold", "--levels", "1", "--n", "40", "--d", "4",
                           "--rounds", "2", "--regimes", "relu", "--exact"]) == 0
    out = capsys.readouterr().out
    assert "new/old 0.500" in out and "old/exact 0.500" in out and "new/exact 0.250" in out


def test_version_ab_old_is_the_revision_and_exact_is_exact(monkeypatch, capsys):
    """version_ab (revision stubbed): "old" runs the other revision's package, "new" and
    "exact" this checkout's, "exact" on the exact variant; new/old is new over old (a
    mutation audit)."""
    rev = SimpleNamespace(__name__="rev")

    @contextlib.contextmanager
    def fake_revision(r, header):
        yield rev

    made = []
    real_step = version_ab.loss_step
    monkeypatch.setattr(version_ab, "revision_package", fake_revision)
    monkeypatch.setattr(version_ab, "loss_step", lambda pkg, z, ys, ps, tau, v, b, learn=False:
                        made.append((pkg, v, b)) or real_step(hiertail_fast, z, ys, ps, tau, v,
                                                              b, learn))
    monkeypatch.setattr(version_ab, "round_robin_medians", lambda steps, rounds: {
        "old": 2.0, "new": 1.0, "floor+exp": 0.5, "exact": 4.0})
    assert version_ab.main(["--rev", "X", "--levels", "1", "--variant", "official", "--n", "40",
                            "--d", "4", "--rounds", "2", "--regimes", "relu", "--exact"]) == 0
    assert made == [(rev, "official", "torch"), (hiertail_fast, "official", "torch"),
                    (hiertail_fast, "exact", "torch")]
    out = capsys.readouterr().out
    assert "new/old 0.500" in out and "new/exact 0.250" in out


def test_epoch_ab_medians_labels_and_ratio(monkeypatch, capsys):
    """epoch_ab (revision, epochs and clock stubbed): the first round dropped, the MEDIAN of
    the rest, "old" = the revision's epoch, new/old = new over old (a mutation audit): old
    rounds 100, 4, 1, 2 -> 2; new 50, 1, 0.5, 3 -> 1."""
    clock = FakeClock()
    monkeypatch.setattr(epoch_ab, "time", clock)

    @contextlib.contextmanager
    def fake_revision(r, header):
        yield "rev"

    costs = {"rev": iter([100, 4, 1, 2]), hiertail_fast: iter([50, 1, 0.5, 3])}

    def fake_epoch(pkg, nodes, args):
        return lambda: clock.spend(next(costs[pkg])) or 1.0

    monkeypatch.setattr(epoch_ab, "revision_package", fake_revision)
    monkeypatch.setattr(epoch_ab, "epoch_step", fake_epoch)
    assert epoch_ab.main(["--rev", "X", "--nodes", "100", "--classes", "5", "--rounds",
                          "4"]) == 0
    out = capsys.readouterr().out
    assert "old 2.0000 s  new 1.0000 s  new/old 0.500  (best 1.0000 / 0.5000 s)" in out


def test_engine_ab_exact_runs_the_librarys_path_and_a_failure_restores_it(monkeypatch):
    """Only the "old" rounds take the old path: --exact times the exact variant on the
    library's own path; and the library's path is back even when a step fails mid-run."""
    import hiertail_fast.ops._lse_torch as lse_mod

    real = lse_mod.level_weights
    clock = FakeClock()
    monkeypatch.setattr(engine_ab, "time", clock)
    seen = []

    def recording(backend, z, ys, ps, tau, variant):
        return lambda: seen.append((variant, lse_mod.level_weights is real)) or clock.spend(1)

    monkeypatch.setattr(engine_ab, "loss_step", recording)
    argv = ["--switch", "weights", "--levels", "3", "--n", "40", "--d", "4", "--rounds", "2",
            "--regimes", "relu", "--exact"]
    assert engine_ab.main(argv) == 0
    assert seen == [("official", False), ("official", True), ("exact", True)] * 2

    def failing(backend, z, ys, ps, tau, variant):
        def step():
            if lse_mod.level_weights is not real:
                raise RuntimeError("the old path failed")
        return step

    monkeypatch.setattr(engine_ab, "loss_step", failing)
    with pytest.raises(RuntimeError, match="the old path failed"):
        engine_ab.main(argv)
    assert lse_mod.level_weights is real


def test_engine_ab_applies_threads_and_prints_the_load_before_and_after(monkeypatch, capsys):
    """--threads sets torch's thread count (said in the header, with the default three
    levels), and the load average is printed before and after the timing."""
    monkeypatch.setattr(engine_ab, "round_robin_medians", lambda steps, rounds, before: {
        "old": 2.0, "new": 1.0, "floor+exp": 0.5})
    threads = torch.get_num_threads()
    try:
        assert engine_ab.main(["--switch", "fold", "--n", "40", "--d", "4", "--rounds", "2",
                               "--regimes", "relu", "--threads", "3"]) == 0
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(threads)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("load average (") and ", 3 threads, " in lines[0]
    assert ", L 3, official," in lines[0]
    assert lines[-1].startswith("load average (") and len(lines) == 3


def test_version_ab_largest_gradient_difference_and_float_tau(monkeypatch, capsys):
    """version_ab (revision stubbed): 'grad diff' is the LARGEST |old - new| over the largest
    |old|; with --learnable-temperature, "float tau" is this checkout with a float tau and
    new/float tau is new over it; the defaults are one level and 11 rounds."""
    headers, made = [], []

    @contextlib.contextmanager
    def fake_revision(r, header):
        headers.append(header)
        yield "rev"

    grads = {"rev": torch.tensor([2.0, 0.0, 0.0, 0.0]),
             hiertail_fast: torch.tensor([2.0, 0.0, 0.0, 1.0])}

    def fake_step(pkg, z, ys, ps, tau, variant, backend="torch", learn_tau=False):
        made.append((pkg, learn_tau))
        return lambda: (grads[pkg], torch.tensor(0.5)) if learn_tau else grads[pkg]

    monkeypatch.setattr(version_ab, "revision_package", fake_revision)
    monkeypatch.setattr(version_ab, "loss_step", fake_step)
    monkeypatch.setattr(version_ab, "round_robin_medians", lambda steps, rounds: {
        "old": 2.0, "new": 1.0, "floor+exp": 0.5, "float tau": 4.0})
    assert version_ab.main(["--rev", "X", "--n", "40", "--d", "4", "--regimes", "relu",
                            "--learnable-temperature"]) == 0
    assert made == [("rev", True), (hiertail_fast, True), (hiertail_fast, False)]
    out = capsys.readouterr().out
    assert "grad diff 5.0e-01" in out and "new/float tau 0.250" in out
    assert ", L 1, " in headers[0] and " 11 rounds " in headers[0]


def test_revision_package_imports_the_fresh_revision_and_leaves_no_trace(monkeypatch, capsys):
    """revision_package: the with block gets the revision just unpacked, not a module of that
    name imported before (another revision's, its folder gone); afterwards neither the module
    nor its folder is left in sys.modules / on sys.path."""
    def fake_unpack(rev, into):
        pkg = into / version_ab.REV_NAME
        pkg.mkdir()
        (pkg / "__init__.py").write_text(f"REV = {rev!r}\n")
        return pkg

    monkeypatch.setattr(version_ab, "unpack_revision", fake_unpack)
    path_before = list(sys.path)
    sys.modules[version_ab.REV_NAME] = SimpleNamespace(REV="stale")
    try:
        with version_ab.revision_package("abc", "header") as pkg:
            assert pkg.REV == "abc"
            folder = Path(pkg.__file__).parent.parent
        assert sys.path == path_before and version_ab.REV_NAME not in sys.modules
    finally:
        sys.modules.pop(version_ab.REV_NAME, None)
    assert not folder.exists()
    assert "old = abc, new = this checkout, header" in capsys.readouterr().out


def test_epoch_ab_reports_the_largest_loss_difference(monkeypatch, capsys):
    """epoch_ab: 'max loss rel diff' is the largest |old - new| / |old| over the rounds'
    losses, so one diverging round shows."""
    clock = FakeClock()
    monkeypatch.setattr(epoch_ab, "time", clock)

    @contextlib.contextmanager
    def fake_revision(r, header):
        yield "rev"

    losses = {"rev": iter([1.0, 2.0, 4.0]), hiertail_fast: iter([1.0, 2.0, 5.0])}
    monkeypatch.setattr(epoch_ab, "revision_package", fake_revision)
    monkeypatch.setattr(epoch_ab, "epoch_step", lambda pkg, nodes, args:
                        lambda: clock.spend(1) or next(losses[pkg]))
    assert epoch_ab.main(["--rev", "X", "--nodes", "100", "--classes", "5", "--rounds",
                          "3"]) == 0
    assert "max loss rel diff 2.5e-01" in capsys.readouterr().out


def test_epoch_ab_epoch_uses_the_seed_the_width_and_fresh_gradients(monkeypatch):
    """epoch_step: the synthetic graph of --seed, a model of --hidden width, and every epoch
    starts from zeroed gradients (zero_grad, forward, loss, backward, Adam step)."""
    import hiertail_fast.data.synthetic as synthetic
    import hiertail_fast.nn.hiertail as hiertail

    seeds, widths, zeroed = [], [], []
    real_graph, real_model = synthetic.make_synthetic_graph, hiertail.HierTail
    real_zero = torch.optim.Adam.zero_grad
    monkeypatch.setattr(synthetic, "make_synthetic_graph",
                        lambda *a, **k: seeds.append(k.get("seed")) or real_graph(*a, **k))
    monkeypatch.setattr(hiertail, "HierTail",
                        lambda *a: widths.append(a[2].hidden) or real_model(*a))
    monkeypatch.setattr(torch.optim.Adam, "zero_grad",
                        lambda self, *a, **k: zeroed.append(1) or real_zero(self, *a, **k))
    args = SimpleNamespace(classes=5, avg_degree=4.0, features=8, hidden=8, seed=3,
                           config="paper")
    epoch = epoch_ab.epoch_step(hiertail_fast, 120, args)
    losses = [epoch(), epoch()]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert seeds == [3] and widths == [8] and len(zeroed) == 2


def test_bench_device_takes_the_asked_device_and_names_it(monkeypatch, capsys):
    """bench/_device.py: DEVICE is cuda where CUDA is available; asked_device returns the asked
    device over the default (--device cpu on a GPU machine), the default where none is asked,
    and argparse's error for cuda without CUDA; device_name names the asked device, the CPU
    with its cores and torch's threads."""
    import argparse

    import _device

    assert _device.DEVICE == ("cuda" if torch.cuda.is_available() else "cpu")
    parser = argparse.ArgumentParser()
    monkeypatch.setattr(_device, "DEVICE", "cuda")
    monkeypatch.setattr(_device.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_device.torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    assert _device.asked_device(parser, "cpu") == "cpu"
    assert _device.asked_device(parser, None) == _device.asked_device(parser, "cuda") == "cuda"
    assert _device.device_name("cuda") == "Fake GPU"
    monkeypatch.setattr(_device.os, "cpu_count", lambda: 3)
    monkeypatch.setattr(_device.torch, "get_num_threads", lambda: 5)
    name = _device.device_name("cpu")
    assert name.startswith("cpu (") and name.endswith(", 3 cores, 5 torch threads)"), name
    monkeypatch.setattr(_device.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        _device.asked_device(parser, "cuda")
    assert exc.value.code == 2 and "--device cuda: no CUDA device here" in capsys.readouterr().err


def test_busy_machine_refuses_bad_values_and_runs_each_mode_in_its_env(monkeypatch, tmp_path,
                                                                       capsys):
    """bench/busy_machine.py: --busy below 0 and a --data that is no file are argparse errors;
    by default one busy loop per core, each killed and reaped after the runs; each mode runs the
    CLI with its own OMP_WAIT_POLICY (the default mode without the caller's) and threads, and
    prints the time per epoch the CLI reported."""
    import busy_machine

    loops, runs = [], []

    class Loop:
        def __init__(self, argv):
            self.killed = self.reaped = False
            loops.append(self)

        def kill(self):
            self.killed = True

        def wait(self):
            self.reaped = True

    def run(argv, env, **kw):
        runs.append((argv, env))
        return SimpleNamespace(stdout=f"seed 0\ntime/epoch {12.5 * len(runs)} ms\n")

    monkeypatch.setattr(busy_machine.subprocess, "Popen", Loop)
    monkeypatch.setattr(busy_machine.subprocess, "run", run)
    monkeypatch.setattr(busy_machine.time, "sleep", lambda s: None)
    monkeypatch.setattr(busy_machine.os, "cpu_count", lambda: 3)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    data = tmp_path / "graph.npz"
    data.write_bytes(b"")
    for argv, message in ((["--data", str(data), "--busy", "-1"], "--busy must be >= 0, got -1"),
                          (["--data", str(tmp_path / "none.npz")], "none.npz is not a file")):
        with pytest.raises(SystemExit) as exc:
            busy_machine.main(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err
    assert not runs and not loops
    assert busy_machine.main(["--data", str(data), "--epochs", "2"]) == 0
    assert len(loops) == 3 and all(p.killed and p.reaped for p in loops)
    assert [env.get("OMP_WAIT_POLICY") for _, env in runs] == [None, "PASSIVE", "ACTIVE"]
    assert [a[a.index("--threads") + 1] if "--threads" in a else None for a, _ in runs] == \
        [None, "2", "2"]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("3 busy-loop processes")
    monkeypatch.setattr(busy_machine.subprocess, "run",
                        lambda argv, env, **kw: SimpleNamespace(stdout="a changed format\n"))
    with pytest.raises(RuntimeError, match="no 'time/epoch' line in the CLI's output"):
        busy_machine.run_cli(data, 2, {}, [])
    assert [line.split() for line in out[1:]] == [
        ["default", "12.5", "ms/epoch"], ["passive-2", "25.0", "ms/epoch"],
        ["active-2", "37.5", "ms/epoch"]]


def test_nearest_degenerate_checks_the_ties_and_runs_seeded_on_its_threads(monkeypatch,
                                                                            capsys):
    """bench/nearest_degenerate.py: --case zeros must answer prototype 0 (a run that answers
    otherwise fails); --case far draws the same rows every run; the call runs on --threads
    threads; the line counts the distinct prototypes chosen."""
    import nearest_degenerate

    real, calls = nearest_degenerate.nearest_prototype, []

    def spy(z, protos):
        calls.append((z, protos, torch.get_num_threads()))
        return real(z, protos)

    def run(case):
        monkeypatch.setattr(sys, "argv", ["x", "--rows", "20", "--prototypes", "5", "--dim",
                                          "4", "--threads", "2", "--case", case])
        nearest_degenerate.main()

    monkeypatch.setattr(nearest_degenerate, "nearest_prototype", spy)
    threads = torch.get_num_threads()
    try:
        for case in ("zeros", "far", "far"):
            run(case)
    finally:
        torch.set_num_threads(threads)
    lines = capsys.readouterr().out.splitlines()
    assert [t for *_, t in calls] == [2, 2, 2]
    assert torch.equal(calls[1][0], calls[2][0]) and torch.equal(calls[1][1], calls[2][1])
    far = real(calls[1][0], calls[1][1]).unique().numel()
    assert lines[0].endswith(", 1 distinct prototypes chosen"), lines
    assert lines[1].endswith(f", {far} distinct prototypes chosen"), lines
    monkeypatch.setattr(nearest_degenerate, "nearest_prototype",
                        lambda z, protos: torch.ones(len(z), dtype=torch.long))
    try:
        with pytest.raises(AssertionError, match="exact ties must go to the lowest index"):
            run("zeros")
    finally:
        torch.set_num_threads(threads)


def test_sanitize_plugin_builds_sanitized_and_fails_a_kernel_that_did_not_load(monkeypatch):
    """bench/_sanitize_plugin.py: the native FLAGS list itself (every module holds it) becomes
    -O1 with the sanitizers and SAN_EXTRA, without -O3; SAN_SERIAL=1 gives no OpenMP runtime;
    a kernel that did not load fails, unless $CC is set; openmp is passed on."""
    import hiertail_fast.ops._native as native
    from tests.conftest import load_bench

    flags, saved = native.FLAGS, list(native.FLAGS)
    for name in ("FLAGS", "load", "openmp_runtime", "enabled", "compiler"):
        monkeypatch.setattr(native, name, getattr(native, name))
    monkeypatch.setenv("SAN_SERIAL", "1")
    monkeypatch.setenv("SAN_EXTRA", "-DSAN_A -DSAN_B")
    monkeypatch.delenv("CC", raising=False)
    try:
        plugin = load_bench("bench_sanitize_plugin", "_sanitize_plugin.py")
        assert native.FLAGS is flags and "-O3" not in flags
        assert flags[:5] == ["-O1", "-g", "-fno-omit-frame-pointer",
                             "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
        assert flags[5:7] == ["-DSAN_A", "-DSAN_B"] and flags[7:] == saved[1:]
        assert native.openmp_runtime() is None
        monkeypatch.setattr(native, "enabled", lambda: True)
        monkeypatch.setattr(native, "compiler", lambda: "cc")
        plugin._load = lambda name, openmp=False: (name, openmp)
        assert native.load("k", openmp=True) == ("k", True)
        plugin._load = lambda name, openmp=False: None
        with pytest.raises(RuntimeError, match="sanitized build of native kernel 'k' did not"):
            native.load("k")
        monkeypatch.setenv("CC", "false")
        assert native.load("k") is None
    finally:
        flags[:] = saved
