"""Pieces of bench/gpu_report.py that do not need a GPU: timing, PASS/FAIL checks of every
backend against the reference (values and gradients), markdown tables, atomic writes.

Correctness rule: the relative error max|ours - reference| / max|reference| of each output and
gradient (reference in float64, inputs in float32) is at most `VALUE_TOL` (values) or
`GRAD_TOL` (gradients; the loss gradients are sums of terms that cancel); nearest prototype:
the distance to our pick exceeds the distance to the reference's pick by at most `DIST_TOL`
relative (a tie within rounding may pick either); pooling: the same kept nodes in the same order.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from torch.autograd import DeviceType

from hiertail_fast import (
    CSRGraph,
    balanced_contrastive_loss,
    gcn_propagate,
    hierarchical_contrastive_loss,
    nearest_prototype,
)
from hiertail_fast._files import atomic_write_text
from hiertail_fast.ops._dispatch import BACKENDS, choose_loss_backend
from hiertail_fast.ops.balanced_contrastive_loss import LOSS_BACKENDS, settle_engine
from hiertail_fast.ops.topk_pool import topk_pool

VALUE_TOL, GRAD_TOL, DIST_TOL = 1e-4, 1e-3, 1e-5
FAST_BACKENDS = tuple(b for b in BACKENDS if b != "reference")  # new names are picked up
# the loss has one more engine than the graph ops: "attention" (PyTorch's attention kernels)
LOSS_FAST_BACKENDS = tuple(b for b in LOSS_BACKENDS if b != "reference")

# Opt-in Triton modes (the knobs of kernels/_utils.py), validated and timed beside the defaults
# on CUDA so that a GPU run says whether one should become the default: label -> environment.
TRITON_MODES = {
    "triton[tf32x3]": {"HIERTAIL_TRITON_FP32_DOT": "tf32x3"},
    "triton[autotune]": {"HIERTAIL_TRITON_AUTOTUNE": "1"},
    "triton[tf32x3+autotune]": {"HIERTAIL_TRITON_FP32_DOT": "tf32x3",
                                "HIERTAIL_TRITON_AUTOTUNE": "1"},
    # the LSE kernels on kernels/_utils.LEAN_TILES (the spill-free tile of kernel_resources.py),
    # dots as the engine picks them (3xTF32 for fp32 where precise, native for 16-bit)
    "triton[lean]": {"HIERTAIL_TRITON_TILES": "lean"},
    # several levels in the kernels' shared-keys mode (one exp per entry for all levels)
    "triton[shared]": {"HIERTAIL_TRITON_SHARED_LEVELS": "1"},
    # ... on the lean tile (its backward spills ~2.7 KB per thread on the fixed one, 84 B here)
    "triton[shared+lean]": {"HIERTAIL_TRITON_SHARED_LEVELS": "1",
                            "HIERTAIL_TRITON_TILES": "lean"},
    # the LSE kernels without key splits (kernels/_utils.KEY_SPLITS_ENV): the launches of the
    # 2026-12-04 figures, against which the automatic splits (on from 2026-12-05) are timed
    "triton[nosplit]": {"HIERTAIL_TRITON_KEY_SPLITS": "1"},
    # the table's tiles with 4 warps (kernels/_utils.TABLE_WARPS): the launches of the 2026-12-04
    # figures, against which the 8-warp default (from 2026-12-05) is timed
    "triton[warps4]": {"HIERTAIL_TRITON_TILES": "warps4"},
}
MULTI_LEVEL_MODES = {"triton[shared]", "triton[shared+lean]"}   # the same as others at 1 level
# modes that bring back launches an earlier default made, only to time today's default against
# them: validated on the card that timed them (2026-12-04's report, 74 PASS), so the checks
# skip them (each would compile its own kernel variants at the checks' size)
AB_ONLY_MODES = {"triton[nosplit]", "triton[warps4]"}


def backend_of(label: str) -> str:
    """The backend a label names: itself, or the backend of a TRITON_MODES entry."""
    return label.split("[")[0]


@contextlib.contextmanager
def environment(values: dict):
    """The environment variables `values` set for the block, then put back as they were (also
    on error)."""
    old = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def backend_mode(label: str):
    """Yields the backend name of `label` (a backend, or a TRITON_MODES entry, whose
    environment is set for the duration and restored after, also on error)."""
    with environment(TRITON_MODES.get(label, {})):
        yield backend_of(label)


def loss_labels(device: str) -> list[str]:
    """The loss engines to time on `device`: its fast backends, plus the opt-in Triton modes on
    CUDA."""
    return backends_for(device, loss=True) + (list(TRITON_MODES) if device == "cuda" else [])


def loss_check_labels(device: str) -> list[str]:
    """The loss engines to validate here: `loss_labels` less the autotuned modes, whose first
    call compiles and times every candidate tile (minutes for the checks' kernel variants); the
    CUDA test suite validates the autotuned path (tests/test_balanced_contrastive_loss_triton.py,
    on a reduced tile set); and less AB_ONLY_MODES (the CUDA test suite runs their launches
    too: the unsplit ones in tests/test_triton_key_splits.py, the 4-warp ones in
    test_lean_tiles[warps4] of tests/test_balanced_contrastive_loss_triton.py)."""
    return [label for label in loss_labels(device)
            if not autotuned(label) and label not in AB_ONLY_MODES]


def _auto_tiles(n: int, d: int, dtype: torch.dtype, arch) -> tuple[int, int, int]:
    """The fixed tile the Triton LSE kernels take on CUDA for `n` rows of `d` columns in
    `dtype` (fp32 with 3xTF32 dots) on a card of compute capability `arch`, as the environment
    now asks."""
    from hiertail_fast.kernels import _utils as u
    return u.pair_blocks(n, u.feature_block(d), True, arch=arch,
                         fp32_dot="tf32x3" if dtype == torch.float32 else None)


def auto_key_splits(n: int, d: int, dev: str, dtype: torch.dtype = torch.float32) -> int:
    """The key splits the Triton LSE kernels take by themselves for `n` rows of `d` columns in
    `dtype` on `dev` ("auto", the fixed tiles; fp32 with 3xTF32 dots; 1 off CUDA)."""
    if dev != "cuda":
        return 1
    from hiertail_fast.kernels import _utils as u
    z = torch.empty(1, d, device=dev)             # (only its device is read)
    block_m, block_n, _ = _auto_tiles(n, d, dtype, u.cuda_arch(z))
    return u.key_splits(n, block_m, block_n, z, "auto")


def warps_decide(n: int, d: int, dev: str, dtype: torch.dtype = torch.float32,
                 arch: tuple[int, int] | None = None) -> bool:
    """Whether "triton[warps4]" launches the Triton LSE kernels differently from the default
    for these inputs on `dev` (a card of compute capability `arch`, default the current one):
    on CUDA where their tile comes from the table (kernels/_utils.TABLE_WARPS: 8 warps from
    2026-12-05), not from the Ampere fp32 or IEEE-dot tiles, unless the environment asks for
    another tile (which triton[warps4] replaces)."""
    if dev != "cuda":
        return False
    arch = tuple(torch.cuda.get_device_capability()) if arch is None else arch
    default = _auto_tiles(n, d, dtype, arch)
    with backend_mode("triton[warps4]"):
        return _auto_tiles(n, d, dtype, arch) != default


def autotuned(label: str | None) -> bool:
    """Whether engine `label` autotunes its tiles (a TRITON_MODES entry that turns it on)."""
    return TRITON_MODES.get(label or "", {}).get("HIERTAIL_TRITON_AUTOTUNE") == "1"


# ----------------------------------------------------------------------------- timing
def tuned_tiles() -> dict[str, list[str]]:
    """The tiles triton.autotune chose so far for the loss kernels ("fwd" / "bwd" of
    kernels/balanced_contrastive_loss.py): one "key -> config" line per tuned shape and mode
    (empty before any autotuned call, or where the kernels were never imported)."""
    mod = sys.modules.get("hiertail_fast.kernels.balanced_contrastive_loss")
    return {which: [f"{key} -> {cfg}" for key, cfg in getattr(tuner, "cache", {}).items()]
            for which, tuner in getattr(mod, "_TUNED", {}).items()}


def size_arg(text: str) -> tuple[int, int]:
    """``type=`` of an N:d size (bench/loss_profile.py, bench/attention_kernels.py): N >= 2
    rows, d >= 1 columns."""
    try:
        n, d = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is N:d (e.g. 20000:64), got {text!r}") from None
    if n < 2 or d < 1:
        raise argparse.ArgumentTypeError(f"need N >= 2 and d >= 1, got {text!r}")
    return n, d


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# host calls that wait for the device (a stream drained by a read; cudaMemcpy: a blocking
# copy), and those that launch a kernel (torch's and Triton's launchers). Not cudaMemcpyAsync:
# a value read to the host is a cudaMemcpyAsync AND the cudaStreamSynchronize after it (one
# wait, counted twice until 2026-12-05; the 2026-11-27 profile's 13 / 9), and host-to-device
# or device-to-device copies with it wait for nothing
SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
               "cudaMemcpy")
LAUNCH_EVENTS = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                 "cudaLaunchKernelExC")


# the host waits of an empty step under profile_step's harness, per device (profiled once)
_OWN_SYNCS: dict[str, dict[str, int]] = {}


def profile_step(step: Callable[[], object], dev: str) -> dict:
    """One call of `step` (after a warm-up call) under torch.profiler: ``profile_summary``. On
    CUDA its host waits leave out the harness's own: an empty step profiled the same way has
    some (the sync that ends the timed call, and the profiler's own on exit: two on the
    2026-11-27 H200 profiles), taken away by name (the empty step is profiled once a device,
    not once a row: a profiler start and stop cost the report's budget)."""
    got = _profiled(step, dev)
    if dev == "cuda":
        if dev not in _OWN_SYNCS:
            _OWN_SYNCS[dev] = _profiled(lambda: None, dev)["syncs"]
        own = _OWN_SYNCS[dev]
        got["syncs"] = {k: v - own.get(k, 0) for k, v in got["syncs"].items()
                        if v > own.get(k, 0)}
    return got


def _profiled(step: Callable[[], object], dev: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    step()
    sync(dev)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        step()
        sync(dev)
        wall = time.perf_counter() - t0
    return profile_summary(prof, wall, dev)


def profile_summary(prof, wall: float, dev: str) -> dict:
    """A profiled step: its wall seconds (profiled), the seconds its kernels kept the device
    busy (CUDA; the sum of the device-side entries' time: every host op that launched a kernel
    repeats that kernel's time as its own self device time, the aten ops and the autograd
    Functions that launch our Triton kernels alike, so only entries whose device_type is CUDA
    count, not GPU user annotations), host waits (SYNC_EVENTS) and kernel launches
    (LAUNCH_EVENTS) by name, aten ops, the top kernels by device time and host ops by self
    time (ms)."""
    events = prof.key_averages()
    device_us = lambda e: getattr(e, "self_device_time_total",  # noqa: E731
                                  getattr(e, "self_cuda_time_total", 0.0))
    kernels = sorted((e for e in events if getattr(e, "device_type", None) == DeviceType.CUDA
                      and not getattr(e, "is_user_annotation", False) and device_us(e) > 0),
                     key=device_us, reverse=True)
    busy = sum(device_us(e) for e in kernels) / 1e6
    host = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    return dict(
        seconds=wall, device_busy_s=busy if dev == "cuda" else None,
        syncs={e.key: e.count for e in events if e.key in SYNC_EVENTS},
        launches=sum(e.count for e in events if e.key in LAUNCH_EVENTS),
        ops=sum(e.count for e in events if e.key.startswith("aten::")),
        top_kernels=[(e.key[:90], e.count, device_us(e) / 1e3) for e in kernels[:15]],
        top_host=[(e.key[:60], e.count, e.self_cpu_time_total / 1e3) for e in host[:12]])


def time_call(fn: Callable[[], object], device: str, reps: int = 3, warmup: int = 1,
              slow_seconds: float = 5.0) -> dict:
    """Median seconds of `reps` calls after `warmup` calls (CUDA events on CUDA), plus the peak
    extra memory of one call on CUDA. A warm-up slower than `slow_seconds` cuts reps to 1."""
    if reps < 1 or warmup < 0:
        raise ValueError("reps must be >= 1 and warmup >= 0")
    start = time.perf_counter()
    for _ in range(warmup):
        fn()
    sync(device)
    if warmup and (time.perf_counter() - start) / warmup > slow_seconds:
        reps = 1
    timed = [_timed_once(fn, device) for _ in range(reps)]
    peak = max(p for _, p in timed) if device == "cuda" else None
    return dict(median_s=statistics.median(t for t, _ in timed), reps=reps,
                peak_extra_bytes=peak)


def _timed_once(fn: Callable[[], object], device: str) -> tuple[float, int | None]:
    """Seconds of one call (CUDA events on CUDA) and, on CUDA, the peak memory it added."""
    if device != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0, None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3, torch.cuda.max_memory_allocated() - base


def time_round_robin(steps: dict, device: str, reps: int = 3, seconds_left=None,
                     need=None, slow_seconds: float = 5.0) -> dict:
    """Times several competing calls ROUND-ROBIN: one warm-up call each, in order, then `reps`
    rounds that call each once in turn, so that a drift of the machine's speed (clocks, another
    job, a neighbour on a shared host) hits them all alike instead of whichever ran in its
    window. Returns key -> ``time_call``'s dict (median_s, reps, peak_extra_bytes: the largest
    extra memory of one timed call on CUDA, None elsewhere) plus ``timing="round-robin"``, or
    {"error": ...} for a step that raised (``guarded``) or was skipped.

    ``seconds_left()`` (the caller's budget) and ``need(key)`` (seconds a step needs left before
    its warm-up, default 10) skip the steps that would overrun, from the end; rounds after the
    first stop early when the next one would not fit (fewer reps, recorded). A step whose
    warm-up took over `slow_seconds` is timed once (as ``time_call``)."""
    if reps < 1:
        raise ValueError("reps must be >= 1")
    seconds_left = seconds_left or (lambda: float("inf"))
    need = need or (lambda key: 10.0)
    out, live, warm_s = {}, [], {}
    for key, step in steps.items():
        if seconds_left() < need(key):
            out[key] = dict(error="skipped: time budget")
            continue
        t0 = time.perf_counter()
        try:
            step()
            sync(device)
        except Exception as exc:  # noqa: BLE001 - a backend that raises is a finding
            out[key] = error_row(exc)
            continue
        warm_s[key] = time.perf_counter() - t0
        live.append(key)
    times = {key: [] for key in live}
    peaks = {key: None for key in live}
    for rnd in range(reps):
        due = [k for k in live if rnd == 0 or warm_s[k] <= slow_seconds]
        if rnd and seconds_left() < sum(times[k][-1] for k in due):  # (the last round's time)
            break
        for key in due:
            try:
                seconds, peak = _timed_once(steps[key], device)
            except Exception as exc:  # noqa: BLE001 - reported, as in its warm-up
                out[key] = error_row(exc)
                live.remove(key)
                continue
            times[key].append(seconds)
            if peak is not None:
                peaks[key] = max(peak, peaks[key] or 0)
    for key in live:
        out[key] = dict(median_s=statistics.median(times[key]), reps=len(times[key]),
                        peak_extra_bytes=peaks[key], timing="round-robin")
    return {key: out[key] for key in steps}


def guarded(fn: Callable[[], dict]) -> dict:
    """Run one measurement; an exception becomes a reported error, never a crash of the report
    (a backend that raises is a finding)."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - reported, with the last frame for debugging
        return error_row(exc)


def error_row(exc: Exception) -> dict:
    """{"error": ...}: the exception's type, message and last frame (out of memory: just that,
    after giving the cache back)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()
        return dict(error="out of memory")
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return dict(error=f"{type(exc).__name__}: {exc} ({Path(frame.filename).name}:"
                      f"{frame.lineno})"[:300])


# ----------------------------------------------------------------------------- PASS / FAIL
def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max|got - want| / max|want| (absolute when want is all zeros), computed in float64."""
    if got.shape != want.shape:
        raise ValueError(f"shape {tuple(got.shape)} != reference {tuple(want.shape)}")
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    if got.numel() == 0:
        return 0.0
    if not torch.isfinite(got).all():
        return float("inf")
    scale = want.abs().max().item()
    return (got - want).abs().max().item() / (scale if scale > 0 else 1.0)


def verdict(error: float, tol: float) -> str:
    if tol <= 0:
        raise ValueError(f"tol must be positive, got {tol}")
    return "PASS" if error <= tol else "FAIL"  # NaN compares False: FAIL


def _rows(op: str, backend: str, pairs: dict) -> list[dict]:
    """One row per checked tensor: pairs = {what: (error, tol)}."""
    return [dict(op=op, backend=backend, check=what, error=err, tol=tol,
                 result=verdict(err, tol)) for what, (err, tol) in pairs.items()]


def _leaf(t: torch.Tensor, device: str, dtype=torch.float32) -> torch.Tensor:
    return t.detach().to(device, dtype).requires_grad_(True)


def check_propagation(backend: str, device: str, n: int, d: int) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    ei = torch.randint(0, n, (2, 8 * n), generator=gen)
    w, x, g = torch.rand(8 * n, generator=gen) + 0.1, torch.randn(n, d, generator=gen), \
        torch.randn(n, d, generator=gen)
    out = {}
    for name, dev, dt, bk in (("ours", device, torch.float32, backend),
                              ("ref", "cpu", torch.float64, "reference")):
        xl, wl = _leaf(x, dev, dt), _leaf(w, dev, dt)
        graph = CSRGraph.from_edge_index(ei.to(dev), wl, num_nodes=n, dedupe=False)
        y = gcn_propagate(xl, graph, backend=bk)
        (y * g.to(dev, dt)).sum().backward()
        out[name] = (y, xl.grad, wl.grad)
    (y, gx, gw), (yr, gxr, gwr) = out["ours"], out["ref"]
    return _rows("gcn_propagate", backend, {"value": (rel_error(y, yr), VALUE_TOL),
                                            "grad x": (rel_error(gx, gxr), GRAD_TOL),
                                            "grad edge weight": (rel_error(gw, gwr), GRAD_TOL)})


def check_pooling(backend: str, device: str, n: int, d: int) -> list[dict]:
    gen = torch.Generator().manual_seed(1)
    ei = torch.randint(0, n, (2, 8 * n), generator=gen)
    x = torch.randn(n, d, generator=gen)
    # distinct, well separated scores (spacing ~2/n >> fp32 rounding): one kept set and order
    x[:, 0] = (torch.randperm(n, generator=gen).double() / n - 0.5).float()
    p = torch.zeros(d)
    p[0] = 1.0
    g = torch.randn((n + 1) // 2, d, generator=gen)
    out = {}
    for name, dev, dt, bk in (("ours", device, torch.float32, backend),
                              ("ref", "cpu", torch.float64, "reference")):
        xl, pl = _leaf(x, dev, dt), _leaf(p, dev, dt)
        r = topk_pool(xl, ei.to(dev), pl, 0.5, backend=bk)
        ((r.x * g.to(dev, dt)).sum() + r.score.sum()).backward()
        out[name] = (r, xl.grad, pl.grad)
    (r, gx, gp), (rr, gxr, gpr) = out["ours"], out["ref"]
    same_perm = torch.equal(r.perm.cpu(), rr.perm.cpu())
    same_edges = r.edge_index.shape == rr.edge_index.shape
    return _rows("topk_pool", backend, {
        "kept nodes (0 = same)": (0.0 if same_perm else float("inf"), VALUE_TOL),
        "pooled edges (0 = same count)": (0.0 if same_edges else float("inf"), VALUE_TOL),
        "value x": (rel_error(r.x, rr.x) if same_perm else float("inf"), VALUE_TOL),
        "grad x": (rel_error(gx, gxr), GRAD_TOL), "grad p": (rel_error(gp, gpr), GRAD_TOL)})


def check_prototype(backend: str, device: str, n: int, m: int, d: int) -> list[dict]:
    gen = torch.Generator().manual_seed(2)
    z, protos = torch.randn(n, d, generator=gen), torch.randn(m, d, generator=gen)
    ours = nearest_prototype(z.to(device), protos.to(device), backend=backend).cpu()
    dist = torch.cdist(z.double(), protos.double())
    best = dist.min(dim=1).values
    excess = ((dist.gather(1, ours[:, None]).squeeze(1) - best) / best.clamp_min(1e-30)).max()
    return _rows("nearest_prototype", backend, {
        "distance of the pick vs the nearest": (excess.item(), DIST_TOL)})


def loss_inputs(n: int, d: int, m: int = 40, seed: int = 0) -> tuple:
    """Zipf labels over 70 classes, relu(randn)/sqrt(d) features, m prototypes (as the H200 run)."""
    gen = torch.Generator().manual_seed(seed)
    probs = 1.0 / torch.arange(1, 71, dtype=torch.float64)
    y = torch.multinomial(probs, n, replacement=True, generator=gen)
    z = torch.relu(torch.randn(n, d, generator=gen)) / d ** 0.5
    protos = torch.relu(torch.randn(m, d, generator=gen)) / d ** 0.5
    return z, y % m, protos


def auto_engine(z, protos, variant: str, levels: int, dtype: torch.dtype,
                temperature: float = 0.1) -> str:
    """The engine the loss ops' automatic choice runs for z with the prototypes: the library's
    own ``choose_loss_backend`` then ``settle_engine`` (CUDA refinement, precision guard) on
    all the rows."""
    zl = z.to(dtype)
    choice = choose_loss_backend(zl, None, variant, levels)
    if choice == "reference":
        return choice
    return settle_engine(torch.cat([zl, protos.to(dtype)]), 1.0 / temperature, variant, levels,
                         choice, automatic=True)[0]


def attention_serves(z, protos, variant: str, dtype: torch.dtype,
                     temperature: float = 0.1) -> bool:
    """Whether ``backend="attention"`` runs the attention kernels for z with the prototypes
    (their adapter is available on z's device and their precision guard lets these logits
    through), not our own engine in their place: an A/B row labelled "attention" must time
    them."""
    from hiertail_fast.ops import _attention_lse

    zl = torch.cat([z.to(dtype), protos.to(dtype)])
    return _attention_lse.available(zl.device) and settle_engine(
        zl, 1.0 / temperature, variant, 1, "attention", automatic=False)[0] == "attention"


def loss_step(z, y, protos, variant: str, levels: int, dtype: torch.dtype, mode):
    """One fwd+bwd of the loss (τ 0.1) on fresh leaves of z and the prototypes in `dtype`, over
    `levels` nested levels (``nested_levels``); `mode()` is a context manager that yields the
    call's ``backend=`` argument (and sets any environment its engine needs)."""
    zl = z.to(dtype).clone().requires_grad_(True)
    pl = protos.to(dtype).clone().requires_grad_(True)
    ys, ps = nested_levels(y, pl, levels)

    def step():
        zl.grad = pl.grad = None
        with mode() as bk:
            if levels == 1:
                loss = balanced_contrastive_loss(zl, y, prototypes=pl, temperature=0.1,
                                                 variant=variant, backend=bk)
            else:
                loss = hierarchical_contrastive_loss(zl, ys, ps, temperature=0.1,
                                                     variant=variant, backend=bk)
            loss.backward()
    return step


def nested_levels(y: torch.Tensor, protos: torch.Tensor, levels: int) -> tuple[list, list]:
    """Labels and prototypes of `levels` nested task-grouping levels: y, y // 2, y // 4 with
    the first m, m / 2, m / 4 of the m prototypes (bench/gpu_report.py, bench/loss_grid.py)."""
    m = protos.shape[0]
    return ([y // 2 ** k for k in range(levels)],
            [protos[: max(1, m // 2 ** k)] for k in range(levels)])


def check_loss(backend: str, device: str, n: int, d: int, variant: str) -> list[dict]:
    z, y, protos = loss_inputs(n, d)
    out = {}
    for name, dev, dt, label in (("ours", device, torch.float32, backend),
                                 ("ref", "cpu", torch.float64, "reference")):
        zl, pl = _leaf(z, dev, dt), _leaf(protos, dev, dt)
        tau = torch.tensor(0.1, dtype=dt, device=dev, requires_grad=True)   # learnable
        with backend_mode(label) as bk:
            loss = balanced_contrastive_loss(zl, y.to(dev), prototypes=pl, temperature=tau,
                                             variant=variant, backend=bk)
            (loss * 2).backward()  # grad_output != 1
        out[name] = (loss, zl.grad, pl.grad, tau.grad)
    (v, gz, gp, gt), (vr, gzr, gpr, gtr) = out["ours"], out["ref"]
    return _rows(f"balanced_contrastive_loss ({variant})", backend, {
        "value": (rel_error(v, vr), VALUE_TOL), "grad z": (rel_error(gz, gzr), GRAD_TOL),
        "grad prototypes": (rel_error(gp, gpr), GRAD_TOL),
        "grad temperature": (rel_error(gt, gtr), GRAD_TOL)})


def backends_for(device: str, loss: bool = False) -> list[str]:
    """The fast backends to validate on `device` (the loss's own list with ``loss``): triton only
    on CUDA (on CPU it is the test interpreter, not a product path)."""
    names = LOSS_FAST_BACKENDS if loss else FAST_BACKENDS
    return [b for b in names if b != "triton" or device == "cuda"]


def correctness(device: str, n_graph: int, n_loss: int) -> list[dict]:
    rows = []
    checks = [(backend, name, run) for backend in backends_for(device) for name, run in (
        ("gcn_propagate", lambda b=backend: check_propagation(b, device, n_graph, 48)),
        ("topk_pool", lambda b=backend: check_pooling(b, device, n_graph, 48)),
        ("nearest_prototype", lambda b=backend: check_prototype(b, device, n_graph, 70, 64)))]
    checks += [(backend, f"balanced_contrastive_loss ({v})",
                lambda v=v, b=backend: check_loss(b, device, n_loss, 64, v))
               for backend in loss_check_labels(device) for v in ("exact", "official")]
    for backend, name, run in checks:
        res = guarded(lambda run=run: dict(rows=run()))
        rows += res.get("rows") or [dict(op=name, backend=backend, check="runs",
                                         error=float("nan"), tol=0.0, result="FAIL",
                                         note=res.get("error", ""))]
    return rows


# ----------------------------------------------------------------------------- output
def fmt(value, unit: str = "") -> str:
    if value is None or value == "":
        return "–"
    if isinstance(value, float):
        if unit == "s":
            return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.3f} s"
        if unit == "MB":
            return f"{value / 1e6:,.0f} MB"
        return f"{value:.2e}" if value and (abs(value) < 1e-2 or abs(value) >= 1e4) else \
            f"{value:.3g}"
    return str(value)


def markdown_table(header: list[str], rows: list[list]) -> str:
    if any(len(r) != len(header) for r in rows):
        raise ValueError("every row needs one cell per column")
    cells = [[str(c).replace("|", "\\|") for c in r] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in cells])


def load_average() -> list[float] | None:
    """The machine's 1 / 5 / 15-minute load averages (None where the OS has none): recorded
    at a run's start and end, so its figures say whether the machine was idle."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def load_note(report: dict) -> str:
    """'load average A -> B on N cores' from a report's load_average_start / _end."""
    start, end = report.get("load_average_start"), report.get("load_average_end")
    if start is None:
        return "load average not recorded"
    tail = "(still running)" if end is None else f"{end[0]:g}"
    return f"load average {start[0]:g} -> {tail} on {os.cpu_count()} cores"


def write_json(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=1, default=str, allow_nan=True))
