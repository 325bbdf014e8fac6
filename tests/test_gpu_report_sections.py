"""bench/gpu_report.py's section bodies on CPU (a mutation audit, s42: each of these rules could
be broken without a test noticing): what each section measures, skips and writes, with the
timing itself stubbed where it would need CUDA or minutes."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from tests.conftest import load_bench


@pytest.fixture
def report():
    return load_bench("bench_gpu_report_sections", "gpu_report.py")


def _no_timing(*args, **kwargs):
    return dict(median_s=1.0, reps=1, peak_extra_bytes=None)


def test_autotuned_modes_are_timed_at_the_first_size_only(report, monkeypatch):
    """loss_section's docstring: "the autotuned ones only at the first size" (their first call
    compiles every candidate tile, AUTOTUNE_NEED_S of budget)."""
    gc = report.gc
    monkeypatch.setattr(gc, "loss_labels", lambda dev: ["torch", "triton[autotune]"])
    monkeypatch.setattr(gc, "auto_engine", lambda *a, **k: "torch")
    monkeypatch.setattr(report, "_anchor_steps", lambda *a, **k: {})
    monkeypatch.setattr(report, "_loss_step", lambda *a, **k: (dict(median_s=1.0), 0.0))
    sizes = dict(report.SIZES["cpu"], loss_n=[30, 40], loss_d=[4])
    rows = report.loss_section("cpu", sizes, report.Budget(60, reps=1))
    tuned = {(r["n"], r["variant"]) for r in rows if r["what"] == "ours (triton[autotune])"}
    assert tuned == {(30, "exact"), (30, "official")}


def test_the_key_splits_are_timed_against_their_absence(report, monkeypatch):
    """Where the automatic engine is triton with fp32 rows and its kernels split their keys,
    the A/B rows time the same launches without splits (triton[nosplit]), right after
    the auto row it is compared with; not for bf16 rows, other engines, or unsplit sizes."""
    gc = report.gc
    steps = []
    monkeypatch.setattr(gc, "loss_labels", lambda dev: [])
    monkeypatch.setattr(gc, "auto_engine",
                        lambda z, p, variant, levels, dtype: "triton" if variant == "exact"
                        else "torch")
    monkeypatch.setattr(gc, "auto_key_splits", lambda n, d, dev: 4 if n < 100 else 1)
    monkeypatch.setattr(report, "_anchor_steps", lambda *a, **k: {})

    def step(dev, label, *a, **k):
        steps.append(label)
        return dict(median_s=1.0), 0.0

    monkeypatch.setattr(report, "_loss_step", step)
    sizes = dict(report.SIZES["cpu"], loss_n=[30, 200], loss_d=[4])
    rows = report.loss_section("cpu", sizes, report.Budget(60, reps=1))
    off = [(r["n"], r["variant"], r["levels"], r["dtype"]) for r in rows
           if r["what"] == "ours (triton, key splits off)"]
    assert off == [(30, "exact", 1, "fp32"), (30, "exact", 3, "fp32")]
    whats = [r["what"] for r in rows if r["n"] == 30 and r.get("ab")]
    assert whats[1] == "ours (triton, key splits off)" and whats[0].startswith("ours (auto")
    assert steps.count("triton[nosplit]") == 2
    # after every automatic row of every size: issue 9's rows keep their budget
    autos = [i for i, r in enumerate(rows)
             if r["what"].startswith("ours (auto") and not r.get("ab")]
    assert len(autos) == 2 * 8 and max(autos) < min(i for i, r in enumerate(rows) if r.get("ab"))
    assert gc.auto_key_splits(20_000, 64, "cpu") == 1          # no splits off CUDA


def _stub_cuda_loss_rows(report, monkeypatch, auto_engine):
    """loss_section's CUDA branches without a GPU: stand-in inputs (4 prototypes), the
    automatic engine `auto_engine(z, protos, variant, levels, dtype)`, no key splits, no
    8-warp A/B, no anchors, every step returning a row that names its engine label."""
    gc = report.gc
    monkeypatch.setattr(gc, "loss_labels", lambda dev: [])
    monkeypatch.setattr(gc, "loss_inputs", lambda n, d: (torch.zeros(n, d),
                                                         torch.zeros(n, dtype=torch.long),
                                                         torch.zeros(4, d)))
    monkeypatch.setattr(gc, "auto_engine", auto_engine)
    monkeypatch.setattr(gc, "auto_key_splits", lambda n, d, dev: 1)
    monkeypatch.setattr(gc, "warps_decide", lambda n, d, dev, dtype: False)
    monkeypatch.setattr(report, "_anchor_steps", lambda *a, **k: {})
    monkeypatch.setattr(report, "_time_group", lambda dev, group, budget, add: [
        add(dict(**fields, **step)) for fields, step, _ in group])
    monkeypatch.setattr(report, "_loss_step",
                        lambda dev, label, *a, **k: (dict(median_s=1.0, label=label), 0.0))
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: self)


def test_the_triton_rows_beside_the_automatic_ones(report, monkeypatch):
    """On CUDA, where the automatic choice does not run the Triton kernels, the A/B rows time
    them beside it: the official variant at d <= TRITON_MAX_DIM, fp32 and bf16 (the
    A/B of TRITON_MIN_ROWS['official'] / TRITON_MIN_ROWS_BF16), and the exact one wider than
    that below 50k rows in fp32 (of TRITON_MAX_DIM) and in bf16 at every size (of the bf16
    exact rule: the attention kernels); not on CPU, not where auto already picks them."""
    _stub_cuda_loss_rows(report, monkeypatch,
                         lambda z, p, variant, levels, dtype: "triton" if z.shape[0] == 200
                         else "torch")
    wide = report.TRITON_MAX_DIM * 2
    sizes = dict(report.SIZES["cpu"], loss_n=[30, 200, 60_000], loss_d=[4, wide])
    rows = report.loss_section("cuda", sizes, report.Budget(60, reps=1))
    extra = {(r["n"], r["d"], r["variant"], r["levels"], r["dtype"], r["label"]) for r in rows
             if r["what"] == report.NOT_CHOSEN}
    want = {(n, 4, "official", lv, dt, "triton") for n in (30, 60_000) for lv in (1, 3)
            for dt in ("fp32", "bf16")}
    want |= {(30, wide, "exact", lv, "fp32", "triton") for lv in (1, 3)}
    want |= {(n, d, "exact", lv, "bf16", "triton") for n in (30, 60_000) for d in (4, wide)
             for lv in (1, 3)}
    assert extra == want
    assert not [r for r in report.loss_section("cpu", sizes, report.Budget(60, reps=1))
                if r["what"] == report.NOT_CHOSEN]


@pytest.mark.parametrize("serves", [True, False])
def test_the_attention_rows_beside_the_automatic_torch_ones(report, monkeypatch, serves):
    """On CUDA, where the automatic fp32 choice runs our torch engine in the attention
    kernels' place by a rule set before the host-sync cuts, the A/B rows time the kernels
    beside it: the official single level below ATTENTION_OFFICIAL_MIN_ROWS rows (prototypes
    counted) and the exact variant at several levels; never in bf16, not beside another
    engine, not on CPU, and not where the kernels' guard would hand the call back to our
    engine (the row would time torch under the attention label)."""
    _stub_cuda_loss_rows(report, monkeypatch,
                         lambda z, p, variant, levels, dtype: "triton" if z.shape[0] == 200
                         else "torch")
    asked = []

    def serves_it(z, protos, variant, dtype):
        asked.append((z.shape[0], variant, dtype))
        return serves
    monkeypatch.setattr(report.gc, "attention_serves", serves_it)
    limit = report.ATTENTION_OFFICIAL_MIN_ROWS
    # (4 stand-in prototypes: limit - 4 rows of z make the threshold's count)
    sizes = dict(report.SIZES["cpu"], loss_n=[30, 200, limit - 5, limit - 4], loss_d=[4])
    rows = report.loss_section("cuda", sizes, report.Budget(60, reps=1))
    extra = {(r["n"], r["variant"], r["levels"], r["dtype"], r["label"]) for r in rows
             if r["what"] == report.ATTENTION_NOT_CHOSEN}
    want = {(n, "official", 1, "fp32", "attention") for n in (30, limit - 5)}
    want |= {(n, "exact", 3, "fp32", "attention") for n in (30, limit - 5, limit - 4)}
    assert extra == (want if serves else set())
    assert len(asked) == len(want) and {dt for _, _, dt in asked} == {torch.float32}
    assert not [r for r in report.loss_section("cpu", sizes, report.Budget(60, reps=1))
                if r["what"] == report.ATTENTION_NOT_CHOSEN]


def test_attention_serves_follows_the_kernels_guard(report):
    """gc.attention_serves: True for the report's own inputs (their logits inside the
    kernels' guard), False where the guard sends the call to our engine (logits ~1e6)."""
    gc = report.gc
    z, _, protos = gc.loss_inputs(64, 8)
    assert gc.attention_serves(z, protos, "exact", torch.float32)
    assert gc.attention_serves(z, protos, "official", torch.float32)
    assert not gc.attention_serves(z * 300.0, protos, "exact", torch.float32)


def test_the_8_warps_are_timed_against_4(report, monkeypatch):
    """Beside every automatic Triton row whose tile comes from the table (gc.warps_decide), fp32
    and bf16, the A/B rows time the same launches with 4 warps (triton[warps4], the
    default before 2026-12-05), right after the rows of that case; not beside other engines,
    nor where the table does not decide the tile."""
    gc = report.gc
    monkeypatch.setattr(gc, "loss_labels", lambda dev: [])
    monkeypatch.setattr(gc, "auto_engine",
                        lambda z, p, variant, levels, dtype: "triton" if variant == "exact"
                        else "torch")
    monkeypatch.setattr(gc, "auto_key_splits", lambda n, d, dev: 1)
    decided = []

    def decide(n, d, dev, dtype):
        decided.append((n, d, dev, dtype))
        return dtype == torch.bfloat16 or n < 100
    monkeypatch.setattr(gc, "warps_decide", decide)
    monkeypatch.setattr(report, "_anchor_steps", lambda *a, **k: {})
    monkeypatch.setattr(report, "_time_group", lambda dev, group, budget, add: [
        add(dict(**fields, **step)) for fields, step, _ in group])
    monkeypatch.setattr(report, "_loss_step",
                        lambda dev, label, *a, **k: (dict(median_s=1.0, label=label), 0.0))
    sizes = dict(report.SIZES["cpu"], loss_n=[30, 200], loss_d=[4])
    rows = report.loss_section("cpu", sizes, report.Budget(60, reps=1))
    four = [(r["n"], r["variant"], r["levels"], r["dtype"]) for r in rows
            if r["what"] == report.WARPS4]
    assert four == [(30, "exact", 1, "fp32"), (30, "exact", 1, "bf16"),
                    (30, "exact", 3, "fp32"), (30, "exact", 3, "bf16"),
                    (200, "exact", 1, "bf16"), (200, "exact", 3, "bf16")]
    assert all(r["label"] == "triton[warps4]" for r in rows if r["what"] == report.WARPS4)
    whats = [r["what"] for r in rows if r["n"] == 30 and r["variant"] == "exact" and r.get("ab")]
    assert whats[:2] == ["ours (auto: triton)", report.WARPS4]
    # asked with the loss's rows (the prototypes counted) and only for Triton rows
    assert {n for n, *_ in decided} == {30 + 40, 200 + 40} and len(decided) == 8


def test_a_dense_reference_that_does_not_fit_is_not_run(report, monkeypatch):
    """The module docstring: the dense backend="reference" is timed "when it fits in memory"
    (36 bytes a pair; 4 GB assumed free on CPU): 15,040 rows need ~8 GB."""
    z, protos = torch.zeros(15_000, 2), torch.zeros(40, 2)
    y = torch.zeros(15_000, dtype=torch.long)
    res, _ = report._loss_step("cpu", "reference", "exact", z, y, protos)
    assert res["error"].startswith("does not fit (~8 GB)"), res
    # the margin: 10,000 rows need 3.6 GB, under the 4 GB assumed free but over its 80 %
    z, y = torch.zeros(9_960, 2), torch.zeros(9_960, dtype=torch.long)
    res, _ = report._loss_step("cpu", "reference", "exact", z, y, protos)
    assert res["error"].startswith("does not fit (~4 GB)"), res
    rows = []
    report._time_group("cpu", [(dict(what="ref"), res, 0.0)], report.Budget(100), rows.append)
    assert rows == [dict(what="ref", **res)]


def test_an_autotuned_row_needs_its_budget(report):
    """An autotuned engine's row needs AUTOTUNE_NEED_S seconds of budget (its first call
    compiles every tile): with 60 s left it is skipped, not started; with enough, timed."""
    z, y, protos = report.gc.loss_inputs(30, 4)
    _, need = report._loss_step("cuda", "triton[autotune]", "exact", z, y, protos)
    assert need == report.AUTOTUNE_NEED_S
    assert report._loss_step("cpu", "torch", "exact", z, y, protos)[1] < need
    timed, rows = [], []
    group = [(dict(what="tuned"), lambda: timed.append(1), need)]
    report._time_group("cpu", group, report.Budget(60, reps=1), rows.append)
    assert rows == [dict(what="tuned", error="skipped: time budget")] and not timed
    report._time_group("cpu", group, report.Budget(need + 30, reps=1), rows.append)
    assert rows[1]["reps"] == 1 and timed == [1, 1]          # its warm-up and one round


def test_the_anchors_time_sdpa_in_their_dtype_and_the_floor_without_tf32(report, monkeypatch):
    """_anchor_steps: the bf16 SDPA step runs bf16 inputs, the cuBLAS floor runs with TF32 off
    ("the cuBLAS fp32 3-GEMM floor (3 x z@z.T, row blocks, TF32 off)"), and the caller's TF32
    setting comes back after each call."""
    seen = []

    def sdpa(q, k, v):
        seen.append(q.dtype)
        return q * 1.0

    def mm(a, b):
        seen.append(("tf32", torch.backends.cuda.matmul.allow_tf32))
        return a @ b

    monkeypatch.setattr(report.F, "scaled_dot_product_attention", sdpa)
    monkeypatch.setattr(report.torch, "mm", mm)
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        steps = report._anchor_steps(20, torch.randn(20, 4))
        for step in steps.values():
            step()
        after = torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert list(steps) == ["SDPA fp32 fwd+bwd", "SDPA bf16 fwd+bwd", report.FLOOR]
    assert seen == [torch.float32, torch.bfloat16] + [("tf32", False)] * 3
    assert after is True


def test_graph_section_rows(report):
    """graph_section on CPU: propagation fwd and fwd+bwd for each provider (no triton: it is
    CUDA's), each timed propagation row's GB/s from the byte model of ITS mode
    (bench/_roofline.bandwidth_figures), pooling and prototype rows."""
    from _roofline import bandwidth_figures

    n, d = 400, 8
    rows = report.graph_section("cpu", n, [d], report.Budget(120, reps=1))
    prop = [r for r in rows if r["op"] == "gcn_propagate"]
    assert all("error" not in r for r in rows), [r for r in rows if "error" in r]
    providers = {r["provider"] for r in prop}
    assert "triton" not in providers and {"torch", "peer_sparse_mm"} <= providers
    assert {(r["provider"], r["mode"]) for r in prop} == {
        (p, m) for p in providers for m in ("fwd", "fwd+bwd")}
    for r in prop:
        want = bandwidth_figures(n, r["edges"], d, r["median_s"], r["mode"], None)
        assert r["achieved_GBps"] == pytest.approx(want["achieved_GBps"]), r
    assert {r["op"] for r in rows} == {"gcn_propagate", "topk_pool", "nearest_prototype m=282"}
    assert "triton" not in {r["provider"] for r in rows}


class _Runs:
    def __init__(self, outcome):
        self.outcome, self.calls = outcome, []

    def __call__(self, cmd, **kwargs):
        self.calls.append(cmd)
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return subprocess.CompletedProcess(cmd, self.outcome, stdout="", stderr="Killed")


@pytest.mark.parametrize("outcome, error", [
    (-9, "Killed"),                                                 # the sweep killed (OOM)
    (1, "Killed"),
    (subprocess.TimeoutExpired("scale.py", 30), "timed out (time budget)")])
def test_a_failed_scale_sweep_is_an_error_row_not_a_crash(report, monkeypatch, tmp_path,
                                                          outcome, error):
    """The report's failure paths: a sweep that fails, is killed by a signal (negative return
    code) or runs out of time is reported in the scale section; the report is still written."""
    runs = _Runs(outcome)
    monkeypatch.setattr(report.subprocess, "run", runs)
    res = report.scale_section("cpu", ["100"], tmp_path, report.Budget(100))
    assert res["error"] == error and "bench/scale.py --device cpu" in res["command"], res
    assert len(runs.calls) == 1


def test_no_scale_sweep_without_30_s_left(report, monkeypatch, tmp_path):
    runs = _Runs(0)
    monkeypatch.setattr(report.subprocess, "run", runs)
    assert report.scale_section("cpu", ["100"], tmp_path, report.Budget(20)) == dict(
        error="skipped: time budget")
    assert not runs.calls


@pytest.mark.skipif(torch.cuda.is_available(), reason="--device cpu is the no-CUDA test mode")
def test_the_report_is_saved_after_the_graph_section_and_gets_the_whole_budget(
        report, monkeypatch, tmp_path):
    """main(): "written after every section" (a run stopped during the loss keeps the graph
    rows), and without the scale section nothing is reserved for it (the graph section alone
    gets the whole --budget)."""
    written, budgets = [], []
    real = report.gc.write_json

    def spy(path, data):
        written.append(json.loads(json.dumps(data, default=str)))
        return real(path, data)

    def graph_section(dev, n, dims, budget):
        budgets.append(budget.left())
        return [dict(op="gcn_propagate", n=n, d=dims[0], mode="fwd", provider="torch",
                     median_s=1.0)]

    monkeypatch.setattr(report.gc, "write_json", spy)
    monkeypatch.setattr(report, "graph_section", graph_section)
    assert report.main(["--device", "cpu", "--sections", "graph", "--budget", "100",
                        "--out", str(tmp_path)]) == 0
    assert [w["complete"] for w in written] == [False, False, True]
    assert written[1]["graph"] and written[1]["graph"][0]["provider"] == "torch"
    assert budgets[0] == pytest.approx(100.0, abs=3.0)


def test_warps_decide_follows_the_table(report, monkeypatch):
    """gc.warps_decide: True where the automatic Triton tile is the table's (sm_90 / sm_100 at
    d <= 128 in fp32 and bf16; 8.x / 12.x in bf16 only, their fp32 tile being the Ampere one),
    False wider than 128, off CUDA, and where the environment already asks for 4 warps; it
    leaves the environment as it found it."""
    gc = report.gc
    from hiertail_fast.kernels import _utils as u
    monkeypatch.delenv(u.TILES_ENV, raising=False)
    for arch in ((9, 0), (10, 0), (8, 0), (12, 0)):
        for d in (64, 128, 256):
            for dtype in (torch.float32, torch.bfloat16):
                want = d <= 128 and (dtype == torch.bfloat16 or arch[0] in (9, 10))
                assert gc.warps_decide(20_000, d, "cuda", dtype, arch) == want, (arch, d, dtype)
    assert u.TILES_ENV not in os.environ
    assert not gc.warps_decide(20_000, 64, "cpu", torch.float32, (9, 0))
    monkeypatch.setenv(u.TILES_ENV, "warps4")
    assert not gc.warps_decide(20_000, 64, "cuda", torch.float32, (9, 0))
    assert os.environ[u.TILES_ENV] == "warps4"


def test_the_ab_rows_are_compared_with_their_automatic_row(report):
    """gpu_report.ab_comparisons / render: every A/B row (key splits off, 4 warps, the Triton
    kernels where auto skips them, shared keys) against the automatic row of the SAME case
    (N, d, variant, levels, input), ratio = its time / the automatic time, read with a 3 %
    margin; rows without a time or without an automatic row of their case are left out."""
    def row(what, t, n=20_000, levels=1, dtype="fp32", variant="exact"):
        r = dict(n=n, d=64, variant=variant, levels=levels, dtype=dtype, what=what)
        return r if t is None else dict(r, median_s=t)
    rows = [dict(n=20_000, d=64, variant="–", what="SDPA fp32 fwd+bwd", median_s=1.0),
            row("ours (auto: triton)", 0.010), row(report.SPLITS_OFF, 0.013),
            row(report.WARPS4, 0.0099),
            row("ours (auto: triton)", 0.020, levels=3), row(report.WARPS4, 0.018, levels=3),
            row("ours (auto: attention)", 0.005, dtype="bf16"),
            row(report.NOT_CHOSEN, 0.004, dtype="bf16"),
            row(report.NOT_CHOSEN, None, variant="official"),      # no time: skipped
            row("ours (auto: torch)", 0.030, variant="official"),
            row(report.ATTENTION_NOT_CHOSEN, 0.024, variant="official"),
            row(report.WARPS4, 0.5, n=100_000)]                  # no auto row there
    got = report.ab_comparisons(rows)
    assert [(c["levels"], c["dtype"], c["against"], round(c["ratio"], 3), c["reading"])
            for c in got] == [
        (1, "fp32", report.SPLITS_OFF, 1.3, "the default is faster"),
        (1, "fp32", report.WARPS4, 0.99, "within 3 %"),
        (3, "fp32", report.WARPS4, 0.9, "the alternative is faster"),
        (1, "bf16", report.NOT_CHOSEN, 0.8, "the alternative is faster"),
        (1, "fp32", report.ATTENTION_NOT_CHOSEN, 0.8, "the alternative is faster")]
    assert got[0]["auto"] == "ours (auto: triton)" and "key splits" in got[0]["question"]
    # a ratio of exactly 1 ± AB_MARGIN is "within 3 %": only beyond it decides
    for t in (1.0 + report.AB_MARGIN, 1.0 - report.AB_MARGIN):
        edge = [row("ours (auto: triton)", 1.0, n=7), row(report.SPLITS_OFF, t, n=7)]
        assert report.ab_comparisons(edge)[0]["reading"] == "within 3 %", t
    assert got[3]["auto"] == "ours (auto: attention)"
    assert got[4]["auto"] == "ours (auto: torch)" and "attention" in got[4]["question"]
    # the automatic row timed in the A/B rows' own group wins over the first group's (listed
    # after it, as the report times them)
    regrouped = report.ab_comparisons(rows + [dict(row("ours (auto: triton)", 0.026), ab=True)])
    assert round(regrouped[0]["ratio"], 3) == 0.5 and regrouped[0]["against"] == report.SPLITS_OFF
    md = report.render(dict(device="dev", when="now", torch="t", triton="tr", mode="cpu",
                            wall_s=1.0, correctness=[], loss=rows))
    section = md.split("## The defaults' A/B rows")[1].split("## Graph ops")[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("| 20000")]
    assert len(lines) == 5 and lines[0].endswith("| 1.300 | the default is faster |")


def test_the_shared_keys_mode_beside_the_three_level_triton_rows(report, monkeypatch):
    """On CUDA, for several levels of the exact variant, wherever the report runs the Triton
    kernels (the automatic row, or the row beside an automatic choice that skips them),
    it also times the shared-keys mode (triton[shared]); not at one level, not for the official
    variant (no shared-keys form), not where no Triton row runs, not on CPU."""
    # fp32: triton at 200 rows, torch elsewhere; bf16: attention (auto skips Triton there)
    _stub_cuda_loss_rows(report, monkeypatch,
                         lambda z, p, variant, levels, dtype: "attention"
                         if dtype == torch.bfloat16 else "triton" if z.shape[0] == 200
                         else "torch")
    sizes = dict(report.SIZES["cpu"], loss_n=[30, 200, 60_000], loss_d=[4])
    rows = report.loss_section("cuda", sizes, report.Budget(60, reps=1))
    shared = {(r["n"], r["variant"], r["levels"], r["dtype"], r["label"]) for r in rows
              if r["what"] == report.SHARED}
    # fp32 at 30 / 60k: torch, d 4 <= TRITON_MAX_DIM and exact: no Triton row, no shared row
    assert shared == {(200, "exact", 3, "fp32", "triton[shared]")} | {
        (n, "exact", 3, "bf16", "triton[shared]") for n in (30, 200, 60_000)}
    assert not [r for r in report.loss_section("cpu", sizes, report.Budget(60, reps=1))
                if r["what"] == report.SHARED]
    assert report.SHARED in report.AB_QUESTIONS


def test_the_first_size_is_profiled_after_the_automatic_rows(report, monkeypatch):
    """loss_section: after every size's automatic rows and before any A/B row (which compile
    kernel variants and came first until 2026-12-05, when the automatic rows alone could take
    the whole budget), one profiled step (gc.profile_step) of each automatic row of the FIRST
    (N, d) only (8: both variants, 1 and 3 levels, fp32 and bf16), marked profile=True and
    named by their engine; none of another size; past the budget, marked skipped instead of
    profiled."""
    gc = report.gc
    profiled = []
    monkeypatch.setattr(gc, "loss_labels", lambda dev: [])
    monkeypatch.setattr(gc, "auto_engine", lambda z, p, variant, levels, dtype:
                        "triton" if variant == "exact" else "torch")
    monkeypatch.setattr(gc, "auto_key_splits", lambda n, d, dev: 4)
    monkeypatch.setattr(report, "_anchor_steps", lambda *a, **k: {})
    monkeypatch.setattr(report, "_loss_step", lambda *a, **k: (lambda: None, 0.0))

    def profile(step, dev):
        profiled.append(dev)
        return dict(seconds=0.01, device_busy_s=None, syncs={}, launches=0, ops=7)

    monkeypatch.setattr(gc, "profile_step", profile)
    sizes = dict(report.SIZES["cpu"], loss_n=[30, 200], loss_d=[4])
    rows = report.loss_section("cpu", sizes, report.Budget(60, reps=1))
    prof = [i for i, r in enumerate(rows) if r.get("profile")]
    assert len(prof) == len(profiled) == 8
    assert all(rows[i]["n"] == 30 and rows[i]["ops"] == 7 for i in prof)
    automatic = [i for i, r in enumerate(rows) if r["what"].startswith("ours (auto")
                 and not r.get("ab")]
    assert any(rows[i]["n"] == 200 for i in automatic)        # the second size's too
    assert max(automatic) < min(prof) and max(prof) < min(
        i for i, r in enumerate(rows) if r.get("ab"))
    engine = {"exact": "triton", "official": "torch"}
    assert {(rows[i]["variant"], rows[i]["levels"], rows[i]["dtype"], rows[i]["what"])
            for i in prof} == {(v, lv, dt, f"profile (auto: {engine[v]})")
                               for v in ("exact", "official") for lv in (1, 3)
                               for dt in ("fp32", "bf16")}
    monkeypatch.setattr(report, "PROFILE_NEED_S", 1e9)
    rows = report.loss_section("cpu", sizes, report.Budget(60, reps=1))
    skipped = [r for r in rows if r.get("profile")]
    assert len(skipped) == 8 and all(r["error"] == "skipped: time budget" for r in skipped)
    assert len(profiled) == 8


def test_a_failing_ab_question_or_engine_choice_is_a_row_not_the_end(report, monkeypatch):
    """loss_section: where building one case's A/B rows raises (a card-only fault, say), that
    case gets an error row and the other cases' A/B rows and the per-engine rows still come;
    where the automatic choice itself raises, its rows are named by the error; the report
    renders either."""
    gc = report.gc
    monkeypatch.setattr(gc, "loss_labels", lambda dev: [])
    monkeypatch.setattr(report, "_anchor_steps", lambda *a, **k: {})
    monkeypatch.setattr(report, "_loss_step", lambda *a, **k: (lambda: None, 0.0))
    monkeypatch.setattr(gc, "profile_step", lambda step, dev: dict(seconds=0.01, syncs={}))
    real = report._ab_steps

    def ab_steps(dev, engine, n, d, variant, levels, dtype, inputs):
        if (n, variant, levels) == (30, "exact", 3):
            raise RuntimeError("no kernel image for this card")
        return [(dict(n=n, d=d, variant=variant, levels=levels, what="ours (triton[x])"),
                 lambda: None, 0.0)]

    monkeypatch.setattr(report, "_ab_steps", ab_steps)
    sizes = dict(report.SIZES["cpu"], loss_n=[30, 200], loss_d=[4])
    rows = report.loss_section("cpu", sizes, report.Budget(60, reps=1))
    failed = [r for r in rows if r["what"].startswith("A/B rows of auto")]
    assert len(failed) == 2 and all("no kernel image" in r["error"] for r in failed)  # 2 dtypes
    assert any(r.get("ab") and r["n"] == 200 for r in rows)
    assert any(r["what"] == "ours (triton[x])" and r["n"] == 30 for r in rows)
    md = report.render(dict(device="dev", when="now", torch="t", triton="tr", mode="cpu",
                            wall_s=1.0, correctness=[], loss=rows))
    assert "no kernel image" in md
    monkeypatch.setattr(report, "_ab_steps", real)
    monkeypatch.setattr(gc, "auto_engine", lambda *a, **k: 1 / 0)
    rows = report.loss_section("cpu", sizes, report.Budget(60, reps=1))
    assert rows and all("ZeroDivisionError" in r["what"] for r in rows
                        if r["what"].startswith("ours (auto"))
    assert not any(r.get("ab") for r in rows)            # no A/B rows beside a failed choice
    prof = [r for r in rows if r.get("profile")]
    assert len(prof) == 8 and all(r["error"].startswith("error: ZeroDivisionError")
                                  for r in prof)
    report.render(dict(device="dev", when="now", torch="t", triton="tr", mode="cpu",
                       wall_s=1.0, correctness=[], loss=rows))


def test_the_profile_table_reads_the_kernels_against_the_timed_row(report):
    """profile_table / render: a profile row's kernels (device busy) over the timed median of
    the first group's automatic row of its case (not an A/B group's), its host waits summed
    over their kinds, launches and aten ops; '–' where a time is missing; the profile rows stay
    out of the loss table."""
    def row(what, **kw):
        return dict(n=20_000, d=64, variant="exact", levels=1, dtype="fp32", what=what, **kw)
    rows = [row("ours (auto: triton)", median_s=0.010),
            row("ours (auto: triton)", median_s=0.020, ab=True),
            row("profile (auto: triton)", profile=True, device_busy_s=0.004, launches=120,
                ops=300, syncs={"cudaStreamSynchronize": 2, "cudaMemcpy": 1}),
            dict(row("profile (auto: attention)", profile=True, device_busy_s=None,
                     launches=0, ops=5, syncs={}), dtype="bf16"),
            dict(row("profile (auto: torch)", profile=True, error="skipped: time budget"),
                 levels=3),
            # the automatic row failed (no median): its profile's kernels time, no share
            dict(row("ours (auto: torch)", error="out of memory"), variant="official"),
            dict(row("profile (auto: torch)", profile=True, device_busy_s=0.01, launches=4,
                     ops=9, syncs={}), variant="official")]
    got = report.profile_table(rows)
    assert got[3][:7] == ["official", 1, "fp32", "(auto: torch)", "–", "10.00 ms", "–"]
    assert got[0] == ["exact", 1, "fp32", "(auto: triton)", "10.00 ms", "4.00 ms", "0.40", 3,
                      120, 300]
    assert got[1][4:7] == ["–", "–", "–"] and got[1][7] == 0
    assert got[2][7] == "skipped: time budget" and got[2][8] == "–"
    md = report.render(dict(device="dev", when="now", torch="t", triton="tr", mode="cpu",
                            wall_s=1.0, correctness=[], loss=rows))
    loss_table = md.split("## Loss forward")[1].split("## The defaults'")[0]
    assert "profile (auto" not in loss_table and "ours (auto: triton)" in loss_table
    section = md.split("## Where the first size's time goes")[1].split("## Graph ops")[0]
    assert "| exact | 1 | fp32 | (auto: triton) | 10.00 ms | 4.00 ms | 0.40 | 3 | 120 | 300 |" \
        in section


def test_the_not_chosen_rules_are_strict_at_their_thresholds(report):
    """The A/B rows for kernels the automatic choice skips: the exact fp32 variant wider than
    TRITON_MAX_DIM below 50k rows (at 50k the automatic choice runs the Triton kernels), the
    attention kernels for the official single level below ATTENTION_OFFICIAL_MIN_ROWS."""
    wide = report.TRITON_MAX_DIM * 2
    assert report._triton_not_chosen("cuda", "torch", "exact", 49_999, wide)
    assert not report._triton_not_chosen("cuda", "torch", "exact", 50_000, wide)
    assert not report._triton_not_chosen("cuda", "torch", "exact", 49_999, report.TRITON_MAX_DIM)
    rows = report.ATTENTION_OFFICIAL_MIN_ROWS
    assert report._attention_not_chosen("cuda", "torch", "official", rows - 1, 1, torch.float32)
    assert not report._attention_not_chosen("cuda", "torch", "official", rows, 1, torch.float32)
