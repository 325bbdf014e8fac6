"""bench/_gpu_checks.py's PASS/FAIL checks fed a deliberately wrong backend (a mutation audit):
each check must FAIL exactly the row of the tensor that is wrong and PASS the others, and the
report must count and show every FAIL. On CPU with the torch backend; tests/test_gpu_report.py
only runs correct backends, so a check that compared the wrong tensor, the reference against
itself or never looked at a gradient went unnoticed there."""
from __future__ import annotations

import argparse
import os

import pytest
import torch

from tests.conftest import load_bench


@pytest.fixture(scope="module")
def gc():
    return load_bench("bench_gpu_checks_faults", "_gpu_checks.py")


class _IgnoreGradOutput(torch.autograd.Function):
    """Identity whose backward returns ones: a backend that drops grad_output."""

    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        return torch.ones_like(grad)


def _scale_grad(t: torch.Tensor, factor: float = 1.01) -> None:
    t.register_hook(lambda g: g * factor)


def _faulty(monkeypatch, gc, name: str, fault) -> None:
    """gc.<name> runs `fault(real, *args, **kwargs)` for the torch backend (the reference, and
    so the float64 oracle, stays correct)."""
    real = getattr(gc, name)

    def call(*args, backend=None, **kwargs):
        if backend == "torch":
            return fault(real, *args, backend=backend, **kwargs)
        return real(*args, backend=backend, **kwargs)

    monkeypatch.setattr(gc, name, call)


def _results(rows: list[dict]) -> dict[str, str]:
    return {r["check"]: r["result"] for r in rows}


PROPAGATION_FAULTS = {  # fault -> the rows it must FAIL
    "value": ({"value"}, lambda real, x, g, **kw: (lambda y: y + 5e-4 * y.detach())(
        real(x, g, **kw))),
    "grad x": ({"grad x"}, lambda real, x, g, **kw: (_scale_grad(x), real(x, g, **kw))[1]),
    "grad edge weight": ({"grad edge weight"}, lambda real, x, g, **kw: (
        _scale_grad(g.weight), real(x, g, **kw))[1]),
    "grad_output dropped": ({"grad x", "grad edge weight"}, lambda real, x, g, **kw:
                            _IgnoreGradOutput.apply(real(x, g, **kw))),
}


@pytest.mark.parametrize("fault", list(PROPAGATION_FAULTS))
def test_propagation_check_fails_the_wrong_tensor_only(gc, monkeypatch, fault):
    """check_propagation against a torch backend with one wrong output (a mutation audit): a
    value 5e-4 off (over VALUE_TOL, under GRAD_TOL), a gradient of x or of the edge weights
    1 % off, or a backward that ignores grad_output (the check's upstream gradient is not all
    ones). That row, and only that row, is a FAIL."""
    bad, fn = PROPAGATION_FAULTS[fault]
    assert _results(gc.check_propagation("torch", "cpu", 60, 8)) == dict.fromkeys(
        ["value", "grad x", "grad edge weight"], "PASS")          # correct: all pass
    _faulty(monkeypatch, gc, "gcn_propagate", fn)
    got = _results(gc.check_propagation("torch", "cpu", 60, 8))
    assert got == {c: "FAIL" if c in bad else "PASS" for c in got}, got


def _swap_first_two(r):
    perm = r.perm.clone()
    perm[[0, 1]] = perm[[1, 0]]
    return r._replace(perm=perm)


POOLING_FAULTS = {
    "perm order": ({"kept nodes (0 = same)", "value x"}, lambda real, *a, **kw:
                   _swap_first_two(real(*a, **kw))),
    "edges": ({"pooled edges (0 = same count)"}, lambda real, *a, **kw: (
        lambda r: r._replace(edge_index=r.edge_index[:, 1:]))(real(*a, **kw))),
    "value x": ({"value x"}, lambda real, *a, **kw: (
        lambda r: r._replace(x=r.x + 5e-4 * r.x.detach()))(real(*a, **kw))),
    "grad x": ({"grad x"}, lambda real, x, *a, **kw: (_scale_grad(x), real(x, *a, **kw))[1]),
    "grad p": ({"grad p"}, lambda real, x, ei, p, *a, **kw: (
        _scale_grad(p), real(x, ei, p, *a, **kw))[1]),
    "grad_output dropped": ({"grad x", "grad p"}, lambda real, *a, **kw: (
        lambda r: r._replace(x=_IgnoreGradOutput.apply(r.x)))(real(*a, **kw))),
}


@pytest.mark.parametrize("fault", list(POOLING_FAULTS))
def test_pooling_check_fails_the_wrong_tensor_only(gc, monkeypatch, fault):
    """check_pooling against a torch backend with one wrong output (a mutation audit): two kept
    nodes in swapped order (same set: the order must be compared too), one pooled edge
    missing, pooled features 5e-4 off, the gradient of x or of p 1 % off, or a backward
    that ignores the pooled features' grad_output."""
    bad, fn = POOLING_FAULTS[fault]
    rows = _results(gc.check_pooling("torch", "cpu", 60, 8))
    assert set(rows.values()) == {"PASS"}, rows
    _faulty(monkeypatch, gc, "topk_pool", fn)
    got = _results(gc.check_pooling("torch", "cpu", 60, 8))
    assert got.keys() == rows.keys()
    assert got == {c: "FAIL" if c in bad else "PASS" for c in got}, got


def test_prototype_check_fails_one_near_miss_among_many_rows(gc, monkeypatch):
    """check_prototype (a mutation audit): a backend that picks the second-nearest prototype
    for one row out of 400, the row where the two are closest, is a FAIL whose error is that
    row's relative distance excess (computed here in float64): the worst row counts, not an
    average over rows, and the distance is measured to the nearest prototype."""
    n, m, d = 400, 70, 64
    gen = torch.Generator().manual_seed(2)                 # the check's own inputs
    z, protos = torch.randn(n, d, generator=gen), torch.randn(m, d, generator=gen)
    dist = torch.cdist(z.double(), protos.double())
    two = dist.topk(2, dim=1, largest=False)
    gap = (two.values[:, 1] - two.values[:, 0]) / two.values[:, 0]
    row = int(gap.argmin())
    excess = gap[row].item()
    assert gc.DIST_TOL < excess < n * gc.DIST_TOL    # an average over rows would hide it

    def second_nearest_once(real, *args, **kwargs):
        pick = real(*args, **kwargs).clone()
        pick[row] = two.indices[row, 1]
        return pick

    ok = gc.check_prototype("torch", "cpu", n, m, d)
    assert [r["result"] for r in ok] == ["PASS"] and ok[0]["error"] == 0.0
    _faulty(monkeypatch, gc, "nearest_prototype", second_nearest_once)
    (bad,) = gc.check_prototype("torch", "cpu", n, m, d)
    assert bad["result"] == "FAIL" and bad["error"] == pytest.approx(excess, rel=1e-9)


def _loss_fault(real, z, y, *, prototypes, temperature, which: str, **kw):
    if which in {"grad z", "grad prototypes", "grad temperature"}:
        _scale_grad({"grad z": z, "grad prototypes": prototypes,
                     "grad temperature": temperature}[which])
    loss = real(z, y, prototypes=prototypes, temperature=temperature, **kw)
    if which == "value":
        return loss + 5e-4 * loss.detach()
    return _IgnoreGradOutput.apply(loss) if which == "grad_output dropped" else loss


LOSS_FAULTS = {"value": {"value"}, "grad z": {"grad z"}, "grad prototypes": {"grad prototypes"},
               "grad temperature": {"grad temperature"},
               "grad_output dropped": {"grad z", "grad prototypes", "grad temperature"}}


@pytest.mark.parametrize("fault", list(LOSS_FAULTS))
def test_loss_check_fails_the_wrong_tensor_only(gc, monkeypatch, fault):
    """check_loss against a torch backend with one wrong output (a mutation audit): the loss
    5e-4 off (over VALUE_TOL, under GRAD_TOL), the gradient of z, of the prototypes or of the
    learnable temperature 1 % off, or a backward that ignores grad_output (the check
    backpropagates loss * 2). That row, and only that row, is a FAIL."""
    ok = _results(gc.check_loss("torch", "cpu", 50, 8, "exact"))
    assert set(ok.values()) == {"PASS"} and len(ok) == 4, ok
    _faulty(monkeypatch, gc, "balanced_contrastive_loss",
            lambda real, *a, **kw: _loss_fault(real, *a, which=fault, **kw))
    got = _results(gc.check_loss("torch", "cpu", 50, 8, "exact"))
    assert got == {c: "FAIL" if c in LOSS_FAULTS[fault] else "PASS" for c in got}, got


def test_rel_error_is_relative_to_the_reference(gc):
    """rel_error divides by the reference's magnitude, never by ours (a mutation audit): a
    backend returning zeros for a tiny gradient is 100 % off, and a result ten times too large
    is 900 % off."""
    assert gc.rel_error(torch.zeros(3), torch.full((3,), 1e-5)) == pytest.approx(1.0)
    assert gc.rel_error(torch.tensor([10.0, 0.0]), torch.tensor([1.0, 0.0])) == pytest.approx(9)
    rows = gc._rows("op", "b", {"a": (2e-4, 1e-4), "b": (1e-4, 1e-4), "c": (0.0, 1e-4)})
    assert [r["result"] for r in rows] == ["FAIL", "PASS", "PASS"]


def test_time_call_reports_the_median_of_its_reps(gc, monkeypatch):
    """time_call (a mutation audit), on a scripted clock: the median of the timed calls (not
    the minimum or the warm-up), and one rep when the warm-up is slower than slow_seconds."""
    now, steps = [0.0], []

    def call():
        now[0] += steps.pop(0)

    monkeypatch.setattr(gc.time, "perf_counter", lambda: now[0])
    steps[:] = [100.0, 1.0, 6.0, 2.0]                  # warm-up, then three reps
    res = gc.time_call(call, "cpu", reps=3, warmup=1, slow_seconds=1e3)
    assert res == dict(median_s=2.0, reps=3, peak_extra_bytes=None) and not steps
    steps[:] = [10.0, 3.0]                             # a slow warm-up: one rep
    assert gc.time_call(call, "cpu", reps=3, warmup=1, slow_seconds=5.0)["reps"] == 1
    assert not steps


def test_report_counts_and_shows_every_fail():
    """gpu_report.render (a mutation audit): the summary line counts the FAIL rows (a raising
    backend's row included) and the table lists every row, FAILs with their note."""
    report = load_bench("bench_gpu_report_faults", "gpu_report.py")
    checks = [dict(op="gcn_propagate", backend="torch", check="value", error=0.0, tol=1e-4,
                   result="PASS"),
              dict(op="gcn_propagate", backend="torch", check="grad x", error=0.5, tol=1e-3,
                   result="FAIL"),
              dict(op="topk_pool", backend="new", check="runs", error=float("nan"), tol=0.0,
                   result="FAIL", note="ValueError: unknown backend")]
    md = report.render(dict(device="dev", when="now", torch="t", triton="tr", mode="cpu",
                            wall_s=1.0, correctness=checks))
    assert "Correctness: 1 PASS, 2 FAIL." in md
    table = [ln for ln in md.splitlines() if ln.startswith("| gcn_propagate")
             or ln.startswith("| topk_pool")]
    assert len(table) == 3 and table[1].endswith("| FAIL |")
    assert table[2].endswith("| FAIL (ValueError: unknown backend) |")


def test_a_failed_check_makes_the_exit_status_1(tmp_path, monkeypatch):
    """A report with a FAIL row is written and exits with status 1 (it returned 0, so the GPU
    session's log read "gpu_report rc 0" for a card that failed its checks: a mutation audit);
    all PASS: 0."""
    report = load_bench("bench_gpu_report_exit", "gpu_report.py")
    row = dict(op="gcn_propagate", backend="torch", check="value", error=0.0, tol=1e-4,
               result="PASS")
    dev = "cuda" if torch.cuda.is_available() else "cpu"   # (--device cpu: CPU machines only)
    for rows, status in (([row], 0), ([row, dict(row, check="grad x", result="FAIL")], 1)):
        monkeypatch.setattr(report.gc, "correctness", lambda *a, rows=rows: rows)
        out = tmp_path / str(status)
        assert report.main(["--device", dev, "--sections", "correctness",
                            "--out", str(out)]) == status
        assert "Correctness: " in (out / "gpu_report.md").read_text()


def test_round_robin_interleaves_the_steps_and_reports_each_median(gc, monkeypatch):
    """time_round_robin: one warm-up each in order, then rounds that call every step once in
    turn (a drift of the machine hits all alike); each step's median of its own timed calls
    (not its warm-up); a step that raises (in its warm-up or later) is reported with its error
    and the others go on; a slow warm-up is timed once."""
    now, order = [0.0], []
    cost = {"a": [5.0, 1.0, 9.0, 2.0], "b": [7.0, 4.0, 5.0, 6.0], "slow": [8.0, 3.0],
            "bad": [], "late": [1.0, 1.0]}

    def make(key):
        def step():
            order.append(key)
            if key == "bad" or not cost[key]:
                raise RuntimeError(f"{key} broke")
            now[0] += cost[key].pop(0)
        return step

    monkeypatch.setattr(gc.time, "perf_counter", lambda: now[0])
    res = gc.time_round_robin({k: make(k) for k in cost}, "cpu", reps=3, slow_seconds=7.5)
    assert order == ["a", "b", "slow", "bad", "late",          # warm-ups
                     "a", "b", "slow", "late", "a", "b", "late", "a", "b"]
    assert res["a"] == dict(median_s=2.0, reps=3, peak_extra_bytes=None, timing="round-robin")
    assert res["b"]["median_s"] == 5.0 and res["slow"] == dict(
        median_s=3.0, reps=1, peak_extra_bytes=None, timing="round-robin")
    assert res["bad"]["error"].startswith("RuntimeError: bad broke")
    assert res["late"]["error"].startswith("RuntimeError: late broke")   # raised in round 2
    assert list(res) == list(cost) and not any(cost[k] for k in ("a", "b", "slow"))


def test_round_robin_keeps_to_the_budget(gc, monkeypatch):
    """Steps whose need exceeds the seconds left are skipped before their warm-up; rounds after
    the first stop when the last round's time no longer fits (fewer reps, recorded)."""
    now = [0.0]
    monkeypatch.setattr(gc.time, "perf_counter", lambda: now[0])

    def step():
        now[0] += 10.0

    left = lambda: 45.0 - now[0]  # noqa: E731
    res = gc.time_round_robin({"x": step, "y": step, "z": step}, "cpu", reps=3,
                              seconds_left=left, need=lambda k: 30.0 if k == "z" else 1.0)
    assert res["z"] == dict(error="skipped: time budget")        # 25 s left at its turn
    assert res["x"]["reps"] == res["y"]["reps"] == 1              # round 2 needs 20, 5 left
    with pytest.raises(ValueError, match="reps"):
        gc.time_round_robin({"x": step}, "cpu", reps=0)


def test_time_call_cuts_reps_on_one_slow_warm_up_call_not_their_sum(gc, monkeypatch):
    """time_call: the reps drop to one when a warm-up CALL (their mean) is slower than
    slow_seconds; two 3 s warm-ups against a 5 s limit keep all three reps."""
    now, steps = [0.0], []

    def call():
        now[0] += steps.pop(0)

    monkeypatch.setattr(gc.time, "perf_counter", lambda: now[0])
    steps[:] = [3.0, 3.0, 1.0, 4.0, 2.0]               # two warm-ups, then three reps
    res = gc.time_call(call, "cpu", reps=3, warmup=2, slow_seconds=5.0)
    assert res == dict(median_s=2.0, reps=3, peak_extra_bytes=None) and not steps
    steps[:] = [6.0, 6.0, 1.0]                         # each warm-up call over the limit
    assert gc.time_call(call, "cpu", reps=3, warmup=2, slow_seconds=5.0)["reps"] == 1
    assert not steps


def test_size_arg_needs_two_rows_and_one_column(gc):
    """size_arg (the N:d sizes of loss_profile.py and attention_kernels.py): N >= 2 rows and
    d >= 1 columns; one row or no column is refused with the rule in the message."""
    assert gc.size_arg("2:1") == (2, 1) and gc.size_arg("20000:64") == (20_000, 64)
    for text in ("1:64", "0:64", "20000:0"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"need N >= 2 and d >= 1"):
            gc.size_arg(text)
    with pytest.raises(argparse.ArgumentTypeError, match="a size is N:d"):
        gc.size_arg("20000")


def test_round_robin_times_a_warm_up_of_exactly_slow_seconds_every_round(gc, monkeypatch):
    """time_round_robin, as time_call: only a warm-up OVER slow_seconds is timed once; one of
    exactly slow_seconds gets every round."""
    now = [0.0]
    costs = {"edge": [5.0, 1.0, 3.0, 2.0], "over": [5.5, 4.0]}

    def make(key):
        def step():
            now[0] += costs[key].pop(0)
        return step

    monkeypatch.setattr(gc.time, "perf_counter", lambda: now[0])
    res = gc.time_round_robin({k: make(k) for k in costs}, "cpu", reps=3, slow_seconds=5.0)
    assert res["edge"] == dict(median_s=2.0, reps=3, peak_extra_bytes=None, timing="round-robin")
    assert res["over"]["reps"] == 1 and not costs["edge"] and not costs["over"]


def test_rel_error_refuses_a_shape_that_only_broadcasts(gc):
    """rel_error compares tensors of the reference's shape: an output of another shape with
    the same number of elements (a loss as a 1-element vector, a column for a vector) is a
    ValueError naming both shapes, not a comparison after broadcasting."""
    with pytest.raises(ValueError, match=r"shape \(1,\) != reference \(\)"):
        gc.rel_error(torch.tensor([2.0]), torch.tensor(2.0))
    with pytest.raises(ValueError, match=r"shape \(3, 1\) != reference \(3,\)"):
        gc.rel_error(torch.ones(3, 1), torch.ones(3))


def test_nested_levels_keep_one_prototype_per_level(gc):
    """nested_levels: labels y // 2**k with the first max(1, m // 2**k) prototypes, so that a
    level never has no prototype, whatever m."""
    y = torch.tensor([0, 1, 1, 0])
    ys, ps = gc.nested_levels(y, torch.arange(4.0).reshape(2, 2), 3)
    assert [p.shape[0] for p in ps] == [2, 1, 1]
    assert [t.tolist() for t in ys] == [[0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert torch.equal(ps[2], torch.tensor([[0.0, 1.0]]))


def test_fmt_seconds_below_one_are_milliseconds_and_load_note_reads_one_minute(gc):
    """fmt(.., "s"): any time under a second in ms (0.5 s is "500.00 ms"), from 1 s in
    seconds; load_note: the 1-minute load averages at the start and the end."""
    assert gc.fmt(0.5, "s") == "500.00 ms" and gc.fmt(0.999, "s") == "999.00 ms"
    assert gc.fmt(1.0, "s") == "1.000 s"
    cores = os.cpu_count()
    assert gc.load_note(dict(load_average_start=[1.5, 2.0, 3.0],
                             load_average_end=[4.25, 5.0, 6.0])) == (
        f"load average 1.5 -> 4.25 on {cores} cores")
    assert gc.load_note(dict(load_average_start=[1.5, 2.0, 3.0], load_average_end=None)) == (
        f"load average 1.5 -> (still running) on {cores} cores")
    assert gc.load_note({}) == "load average not recorded"


def test_the_official_triton_ab_row_includes_the_max_dim_width():
    """_triton_not_chosen, official variant: the Triton kernels are timed beside an automatic
    row that skips them at every d up to AND including TRITON_MAX_DIM (the shipped d 64),
    not wider; never where the automatic row already runs them, never off CUDA."""
    report = load_bench("bench_gpu_report_not_chosen", "gpu_report.py")
    top = report.TRITON_MAX_DIM
    assert report._triton_not_chosen("cuda", "torch", "official", 20_000, top)
    assert report._triton_not_chosen("cuda", "attention", "official", 20_000, top,
                                     torch.bfloat16)
    assert not report._triton_not_chosen("cuda", "torch", "official", 20_000, top + 1)
    assert not report._triton_not_chosen("cuda", "triton", "official", 20_000, top)
    assert not report._triton_not_chosen("cpu", "torch", "official", 20_000, top)
