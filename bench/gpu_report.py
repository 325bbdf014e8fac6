"""Validate and time hiertail_fast on this machine's GPU: one command, about 5 minutes.

    python bench/gpu_report.py            # full sizes (budget --budget seconds, default 270)
    python bench/gpu_report.py --quick    # smaller sizes, ~1-2 minutes

1. Correctness: every fast backend of every op (`hiertail_fast.ops._dispatch.BACKENDS`, so a
   backend added later is picked up) against the float64 reference, values and gradients,
   PASS/FAIL (rules in bench/_gpu_checks.py). A backend that raises is a FAIL with its error.
2. Loss fwd+bwd (both variants, N in {20k, 100k}, d in {64, 128}): the automatic engine with 1
   and 3 levels and fp32 and bf16 inputs (issue 9's targets); then, on CUDA, the defaults' A/B
   rows, each automatic row of a case timed again beside them (``_ab_steps``: the Triton
   kernels without their key splits where the automatic fp32 rows split; the same tiles with
   4 warps, the launches before 2026-12-05, where the automatic Triton row's tile comes from
   the table; the Triton kernels where the automatic choice skips them,
   ``_triton_not_chosen``; the attention kernels where it runs our torch engine in their
   place by a rule set before the host-sync cuts, ``_attention_not_chosen``; the shared-keys
   mode beside the three-level exact Triton rows; the
   markdown lists each A/B row's time over its automatic row's, ``ab_comparisons``); then
   every loss
   backend at fp32 with 1 and 3 levels (and, on CUDA, the opt-in Triton modes of
   bench/_gpu_checks.TRITON_MODES: 3xTF32 dots, autotuned tiles; validated in section 1 too),
   with ratios to the anchors on the same z:
   F.scaled_dot_product_attention(q=k=v=z) fp32 and bf16 fwd+bwd, the cuBLAS fp32 3-GEMM floor
   (3 x z@z.T, row blocks, TF32 off) and the dense backend="reference" when it fits in memory.
3. Propagation (ours torch / triton vs torch.sparse.mm on the un-normalised CSR and PyG GCNConv
   propagation when installed; achieved bandwidth, bench/_roofline.py), top-k pooling (vs PyG
   TopKPooling when installed), nearest prototype (vs torch.cdist().argmin), 1M nodes.
4. A short `bench/scale.py --device cuda` sweep in a subprocess.
CUDA events, one warm-up each, then the rows compared with each other (the providers of one graph
op and shape; the anchors and automatic rows of one loss shape; the engines of one loss shape and
variant) timed ROUND-ROBIN, median of 3 (1 when a call takes over 5 s), so that the machine's
drift hits them alike (bench/_gpu_checks.time_round_robin). Writes
bench/results/gpu_report.md and .json (or --out DIR), atomically, and prints the markdown.
Sections that would overrun the time budget are reported as skipped.

Without CUDA it prints one line and exits with status 2 (nothing was validated; the exit status
says so to scripts); a correctness check that is not PASS makes the status 1 (after the report
is written), so scripts notice a card that fails its checks. ``--device cpu`` (hidden) runs the
same code at tiny sizes on CPU: the CI test of this script.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _gpu_checks as gc  # noqa: E402
from _roofline import bandwidth_figures  # noqa: E402

from hiertail_fast._argparse import dir_arg  # noqa: E402
from hiertail_fast._files import (  # noqa: E402
    prev_path,
    unwritable_dir_reason,
    unwritable_file_reason,
)
from hiertail_fast.ops._dispatch import (  # noqa: E402
    ATTENTION_OFFICIAL_MIN_ROWS,
    TRITON_MAX_DIM,
)

REPORT_NAMES = ("gpu_report.md", "gpu_report.json")

NO_CUDA_EXIT = 2
FAILED_CHECKS_EXIT = 1     # a correctness row that is not PASS (the reports are written)
SIZES = {  # loss N, loss d, graph n (propagation / pooling / prototypes), scale sweep, checks
    "full": dict(loss_n=[20_000, 100_000], loss_d=[64, 128], graph_n=1_000_000,
                 graph_d=[64, 128], scale=["10000", "100000"], check_graph=20_000,
                 check_loss=3_000, reps=3, scale_reserve=90),
    "quick": dict(loss_n=[5_000, 20_000], loss_d=[64], graph_n=100_000, graph_d=[64, 128],
                  scale=["1000", "10000"], check_graph=5_000, check_loss=1_500, reps=3,
                  scale_reserve=45),
    "cpu": dict(loss_n=[200], loss_d=[16], graph_n=1_000, graph_d=[16], scale=["100"],
                check_graph=300, check_loss=120, reps=1, scale_reserve=20),
}
FLOOR = "cuBLAS fp32 3 x z@z.T (floor)"
SECTIONS = ("correctness", "graph", "loss", "scale")
AUTOTUNE_NEED_S = 120  # budget an autotuned row needs: its first call compiles every tile
REFERENCE_BYTES_PER_PAIR = 36  # dense loss reference, fwd+bwd (10.7 GB at N = 20k, official)


class Budget:
    """Seconds left until the deadline; sections get shares of it (`share`), so a slow section
    cannot starve the later ones."""

    def __init__(self, seconds: float, deadline: float | None = None, reps: int = 3) -> None:
        self.total, self.reps = seconds, reps  # reps: timed calls per measurement
        self.deadline = time.perf_counter() + seconds if deadline is None else deadline

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def share(self, fraction: float, reserve: float = 0.0) -> Budget:
        """A section's budget: `fraction` of what is left after keeping `reserve` seconds."""
        end = time.perf_counter() + fraction * max(0.0, self.left() - reserve)
        return Budget(self.total, min(self.deadline, end), self.reps)


def loss_section(dev: str, sizes: dict, budget: Budget, rows: list[dict] | None = None,
                 checkpoint=None) -> list[dict]:
    """First, for every (N, d): the anchors and the automatic engine (what a user gets) for both
    variants, 1 and 3 levels, fp32 and bf16 inputs (issue 9's targets); then one profiled
    step of each automatic row of the first (N, d) (``_profile_rows``: a few seconds in all);
    then, for every (N, d), the defaults' A/B rows (``_ab_steps``), each case's automatic row
    timed again beside them; then, for every (N, d): each backend at fp32 with 1 and 3 levels,
    the dense reference (1 level) and (CUDA) the opt-in Triton modes (1 level). The time
    budget skips rows from the end, so this order is also their priority (the A/B rows, with
    the kernel variants they compile, come after every automatic row; the profile before them
    since 2026-12-05: on 2026-12-04 the automatic rows took the whole loss budget, and behind
    the A/B rows the profile would get none). Rows compared with each other are timed
    round-robin (``_time_group``): the anchors and automatic rows of one (N, d), the A/B rows
    of one (N, d) with their automatic rows, the engines of one (N, d, variant)."""
    cases = [(n, d) for n in sizes["loss_n"] for d in sizes["loss_d"]]
    rows = [] if rows is None else rows       # (the caller's list: filled as rows are timed)

    def add(row: dict) -> None:
        rows.append(row)
        if checkpoint is not None:
            checkpoint()

    inputs = {}
    for n, d in cases:
        z, y, protos = gc.loss_inputs(n, d)
        inputs[n, d] = z.to(dev), y.to(dev), protos.to(dev)
    engines = {}                # (n, d, variant, levels, dtype) -> the automatic engine
    for n, d in cases:
        z, y, protos = inputs[n, d]
        group = [(dict(n=n, d=d, variant="–", what=what), step, 5.0)
                 for what, step in _anchor_steps(n, z).items()]
        for variant in ("exact", "official"):
            for levels in (1, 3):
                for dtype, name in DTYPES.items():
                    engine = _engine_or_error(z, protos, variant, levels, dtype)
                    engines[n, d, variant, levels, dtype] = engine
                    group.append((dict(n=n, d=d, variant=variant, levels=levels, dtype=name,
                                       what=f"ours (auto: {engine})"), *_loss_step(
                                           dev, None, variant, z, y, protos, levels, dtype)))
        _time_group(dev, group, budget, add)
    _profile_rows(dev, cases[0], inputs[cases[0]], engines, budget, add)
    # the defaults' A/B rows, after every automatic row and the profile: they compile kernel
    # variants of their own (seconds each on a cold cache), and issue 9's rows come first
    for n, d in cases:
        z, y, protos = inputs[n, d]
        group = []
        for variant in ("exact", "official"):
            for levels in (1, 3):
                for dtype, name in DTYPES.items():
                    engine = engines[n, d, variant, levels, dtype]
                    if engine.startswith("error:"):  # its automatic rows report the error
                        continue
                    fields = dict(n=n, d=d, variant=variant, levels=levels, dtype=name)
                    try:        # a card-only fault of one A/B question: a row, not the end
                        steps = _ab_steps(dev, engine, n, d, variant, levels, dtype,
                                          (z, y, protos))
                    except Exception as exc:  # noqa: BLE001 - reported as the row's error
                        add(dict(**fields, what=f"A/B rows of auto: {engine}",
                                 **gc.error_row(exc)))
                        continue
                    if steps:
                        group.append((dict(**fields, what=f"ours (auto: {engine})", ab=True),
                                      *_loss_step(dev, None, variant, z, y, protos, levels,
                                                  dtype)))
                        group += steps
        _time_group(dev, group, budget, add)
    # every engine at 1 and 3 levels (several levels: our fused one-pass engines against the
    # attention kernels' one head per level), the reference, then the opt-in Triton modes: the
    # time budget skips those first; the autotuned ones only at the first size (tuning compiles
    # every candidate tile: AUTOTUNE_NEED_S of budget)
    runs = [(label, levels) for levels in (1, 3) for label in gc.LOSS_FAST_BACKENDS]
    runs += [("reference", 1)] + [(m, 3 if m in gc.MULTI_LEVEL_MODES else 1)
                                  for m in gc.loss_labels(dev) if m not in gc.LOSS_FAST_BACKENDS]
    for n, d in cases:
        z, y, protos = inputs[n, d]
        for variant in ("exact", "official"):
            _time_group(dev, [
                (dict(n=n, d=d, variant=variant, levels=levels, dtype="fp32",
                      what=f"ours ({label})"),
                 *_loss_step(dev, label, variant, z, y, protos, levels))
                for label, levels in runs if not (gc.autotuned(label) and (n, d) != cases[0])],
                budget, add)
    return rows


PROFILE_NEED_S = 5.0   # a profiled step: its warm-up call, the profiled call, the trace's summary


def _profile_rows(dev: str, case: tuple, inputs: tuple, engines: dict, budget: Budget,
                  add) -> None:
    """Where the first size's time goes (20k rows: those issue 9 misses by the most): one
    profiled step (``gc.profile_step``) of each automatic row of the first (N, d), after the
    automatic rows and before the A/B rows. Its kernels' device time against the row's timed
    median says how much of the row is kernels and how much launches and host waits (a 20k
    row's fixed part, ~3 ms for one level on the 2026-11-27 tables). Rows past the budget are
    marked skipped.
    (bench/loss_profile.py profiles its first size through this too.)"""
    n, d = case
    z, y, protos = inputs
    for variant in ("exact", "official"):
        for levels in (1, 3):
            for dtype, name in DTYPES.items():
                engine = engines[n, d, variant, levels, dtype]
                fields = dict(n=n, d=d, variant=variant, levels=levels, dtype=name,
                              what=f"profile (auto: {engine})", engine=engine, profile=True)
                step, _ = _loss_step(dev, None, variant, z, y, protos, levels, dtype)
                if engine.startswith("error:"):
                    add(dict(**fields, error=engine))
                elif not callable(step):
                    add(dict(**fields, **step))
                elif budget.left() < PROFILE_NEED_S:
                    add(dict(**fields, error="skipped: time budget"))
                else:
                    add(dict(**fields, **gc.guarded(lambda s=step: gc.profile_step(s, dev))))


def _case(row: dict) -> tuple:
    """A loss row's case: (N, d, variant, levels, input dtype)."""
    return row["n"], row["d"], row["variant"], row.get("levels"), row.get("dtype")


def profile_table(loss_rows: list[dict]) -> list[list]:
    """The profile rows against their automatic row's timed median (the first group's):
    [variant, levels, input, engine, median ms, kernels ms, kernels / median, host waits,
    launches, aten ops]."""
    timed = {_case(r): r.get("median_s") for r in loss_rows
             if str(r["what"]).startswith("ours (auto") and not r.get("ab")}
    out = []
    for r in loss_rows:
        if not r.get("profile"):
            continue
        median = timed.get(_case(r))
        busy = r.get("device_busy_s")
        share = f"{busy / median:.2f}" if busy is not None and median else "–"
        out.append([r["variant"], r["levels"], r["dtype"], r["what"][len("profile "):],
                    gc.fmt(median, "s"), gc.fmt(busy, "s"), share,
                    sum(r["syncs"].values()) if "syncs" in r else r.get("error", "–"),
                    r.get("launches", "–"), r.get("ops", "–")])
    return out


def _engine_or_error(z, protos, variant: str, levels: int, dtype: torch.dtype) -> str:
    """``gc.auto_engine``, or "error: ..." where the choice itself raises (on a card only, say):
    the rows of that case then report the loss call's own error, and the report goes on."""
    try:
        return gc.auto_engine(z, protos, variant, levels, dtype)
    except Exception as exc:  # noqa: BLE001 - reported in the rows' names
        return f"error: {gc.error_row(exc)['error']}"


def _ab_steps(dev: str, engine: str, n: int, d: int, variant: str, levels: int,
              dtype: torch.dtype, inputs: tuple) -> list[tuple]:
    """The defaults' A/B rows of one case, each a default's alternative, timed round-robin with
    the case's automatic row (its `engine`) in their own group (``ab_comparisons`` reads them):
    the Triton launches without key splits where the automatic fp32 Triton row splits; with 4
    warps where its tile is the table's (8 from 2026-12-05); the Triton kernels where the
    automatic choice skips them (``_triton_not_chosen``); the attention kernels where it runs
    our torch engine in their place (``_attention_not_chosen``); and, for several levels of
    the exact variant wherever a Triton row runs, the shared-keys mode (one exp per entry for
    all levels, opt-in until timed: the candidate for issue 9's three-level rows)."""
    z, y, protos = inputs
    rows = n + protos.shape[0]
    alternatives = []
    if engine == "triton" and dtype == torch.float32 and gc.auto_key_splits(rows, d, dev) > 1:
        alternatives.append((SPLITS_OFF, "triton[nosplit]"))
    if engine == "triton" and gc.warps_decide(rows, d, dev, dtype):
        alternatives.append((WARPS4, "triton[warps4]"))
    not_chosen = _triton_not_chosen(dev, engine, variant, n, d, dtype)
    if not_chosen:
        alternatives.append((NOT_CHOSEN, "triton"))
    if (_attention_not_chosen(dev, engine, variant, rows, levels, dtype)
            and gc.attention_serves(z, protos, variant, dtype)):
        alternatives.append((ATTENTION_NOT_CHOSEN, "attention"))
    if (variant == "exact" and levels > 1 and dev == "cuda"
            and (engine == "triton" or not_chosen)):
        alternatives.append((SHARED, "triton[shared]"))
    name = DTYPES[dtype]
    return [(dict(n=n, d=d, variant=variant, levels=levels, dtype=name, what=what, ab=True),
             *_loss_step(dev, label, variant, z, y, protos, levels, dtype))
            for what, label in alternatives]


DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16"}
NOT_CHOSEN = "ours (triton, not chosen here)"
WARPS4 = "ours (triton, 4 warps)"
SPLITS_OFF = "ours (triton, key splits off)"
SHARED = "ours (triton, shared keys)"
ATTENTION_NOT_CHOSEN = "ours (attention, not chosen here)"


def _triton_not_chosen(dev: str, engine: str, variant: str, n: int, d: int,
                       dtype: torch.dtype = torch.float32) -> bool:
    """Whether the A/B rows time the Triton kernels beside an automatic row that does not
    run them, as the A/B of a threshold the per-engine rows (last, skipped by the budget on
    2026-12-04) would re-decide: the official variant at d <= TRITON_MAX_DIM, fp32 and bf16
    (TRITON_MIN_ROWS['official'] = 75k and TRITON_MIN_ROWS_BF16['official'] = 50k were set
    while their positives ran a torch pass with hundreds of host syncs; the Triton positives
    kernel since), and the exact variant wider than TRITON_MAX_DIM below 50k rows in fp32
    (d 128 was never timed on them; the key splits are for 20k rows), and the exact variant in
    bf16 at every size (the automatic choice sends it to the attention kernels, 3.5x SDPA bf16
    at 20k on 2026-12-04; the Triton kernels were within 1 % of them there on 2026-11-27,
    before their key splits and 8 warps). CUDA only."""
    if dev != "cuda" or engine == "triton":
        return False
    if variant == "official":
        return d <= TRITON_MAX_DIM
    if dtype == torch.bfloat16:
        return True
    return dtype == torch.float32 and d > TRITON_MAX_DIM and n < 50_000


def _attention_not_chosen(dev: str, engine: str, variant: str, rows: int, levels: int,
                          dtype: torch.dtype) -> bool:
    """Whether the A/B rows time the attention kernels beside an automatic fp32 row that runs
    our torch engine in their place by a rule measured on 2026-11-27, before the attention
    engine's official pass lost ~220 of its ~230 host syncs a loss (sessions 52-53) and every
    engine a sixth of its launches (57): the official single level below
    ATTENTION_OFFICIAL_MIN_ROWS rows (then 62 against 35 ms for torch at 20k x 64), and the
    exact variant at several levels (``_dispatch._automatic_engine``: 30 against 24 ms there).
    `rows`: the loss's rows, prototypes included (the threshold's count). CUDA only."""
    if dev != "cuda" or engine != "torch" or dtype != torch.float32:
        return False
    if variant == "official":
        return levels == 1 and rows < ATTENTION_OFFICIAL_MIN_ROWS
    return levels > 1


def _time_group(dev: str, group: list[tuple], budget: Budget, add) -> None:
    """Times the group's steps round-robin (``gc.time_round_robin``: the rows compared with each
    other share the machine's drift) and adds one row each, in the group's order. `group`:
    (row fields, step or an error dict, seconds of budget the step needs)."""
    steps = {i: step for i, (_, step, _) in enumerate(group) if callable(step)}
    timed = gc.time_round_robin(steps, dev, budget.reps, budget.left,
                                lambda i: group[i][2])
    for i, (fields, step, _) in enumerate(group):
        add(dict(**fields, **(timed[i] if callable(step) else step)))


def _loss_step(dev, label, variant, z, y, protos, levels: int = 1,
               dtype: torch.dtype = torch.float32) -> tuple:
    """(one fwd+bwd of the loss on engine `label` — a backend, a gc.TRITON_MODES entry, or None:
    the automatic choice — over `levels` levels, inputs cast to `dtype`; the seconds of budget it
    needs), or (an error dict, 0) for a row that cannot run here."""
    n = z.shape[0] + protos.shape[0]
    backend = None if label is None else gc.backend_of(label)
    if backend == "triton" and dev != "cuda":
        return dict(error="skipped: triton needs CUDA"), 0.0
    if backend == "reference":
        need = REFERENCE_BYTES_PER_PAIR * n * n
        free = torch.cuda.mem_get_info()[0] if dev == "cuda" else 4e9
        if need > 0.8 * free:
            return dict(error=f"does not fit (~{need / 1e9:,.0f} GB)"), 0.0
    step = gc.loss_step(z, y, protos, variant, levels, dtype, lambda: (
        gc.backend_mode(label) if label else contextlib.nullcontext()))
    return step, float(AUTOTUNE_NEED_S if gc.autotuned(label) else 10)


def _anchor_steps(n: int, z: torch.Tensor) -> dict:
    """The anchors' fwd+bwd steps on z: SDPA (q = k = v = z) in fp32 and bf16, and the cuBLAS
    fp32 3-GEMM floor (TF32 off for its calls, restored after each)."""
    steps = {}
    for dtype, label in ((torch.float32, "SDPA fp32 fwd+bwd"), (torch.bfloat16,
                                                                "SDPA bf16 fwd+bwd")):
        q = z.to(dtype)[None, None].clone().requires_grad_(True)

        def sdpa(q=q):
            q.grad = None
            F.scaled_dot_product_attention(q, q, q).sum().backward()
        steps[label] = sdpa
    block = max(1, min(n, (1 << 28) // max(n, 1)))  # rows per block: <= 1 GB of fp32 output

    def three_gemms():  # the GEMM work of the loss: z@z.T three times (fwd, two bwd products)
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            for _ in range(3):
                for r0 in range(0, n, block):
                    torch.mm(z[r0:r0 + block], z.T)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
    steps[FLOOR] = three_gemms
    return steps


def graph_section(dev: str, n: int, dims: list[int], budget: Budget) -> list[dict]:
    try:        # the step factories of the pytest-benchmark suites, which import pytest
        import test_pooling as tpool
        import test_propagation as tprop
    except ImportError as exc:
        if getattr(exc, "name", None) != "pytest":
            raise
        raise SystemExit("bench/gpu_report.py's graph section times the pytest-benchmark "
                         "suites' steps: it needs the test extra (pip install -e \".[test]\")"
                         ) from None

    have_pyg = "peer_pyg" in tprop.PROVIDERS
    triton = ["triton"] if dev == "cuda" else []
    rows = []
    for d in dims:       # the providers of one op and shape are timed round-robin (_time_group)
        for mode in ("fwd", "fwd+bwd"):
            group = [_built(dict(op="gcn_propagate", n=n, d=d, mode=mode, provider=p),
                            lambda p=p, d=d, mode=mode: tprop.make_propagation_step(p, n, d, mode))
                     for p in ["torch", *triton, "peer_sparse_mm"] + (["peer_pyg"] if have_pyg
                                                                       else [])]
            _time_group(dev, group, budget, rows.append)
        group = [_built(dict(op="topk_pool", n=n, d=d, mode="fwd+bwd", provider=p),
                        lambda p=p, d=d: tpool.make_pool_step(p, n, d))
                 for p in ["torch", *triton] + (["pyg"] if have_pyg else [])]
        _time_group(dev, group, budget, rows.append)
    m = 282
    group = [_built(dict(op=f"nearest_prototype m={m}", n=n, d=128, mode="fwd", provider=p),
                    lambda p=p: (_cdist_step(n, m, 128, dev) if p == "cdist_argmin" else
                                 tpool.make_prototype_step(p, n, m, 128)))
             for p in ["torch", *triton, "cdist_argmin"]]
    _time_group(dev, group, budget, rows.append)
    for r in rows:
        if r["op"] == "gcn_propagate" and "median_s" in r:
            r.update(bandwidth_figures(n, r["edges"], r["d"], r["median_s"], r["mode"],
                                       torch.cuda.get_device_name() if dev == "cuda" else None))
    return rows


def _built(fields: dict, make) -> tuple:
    """A `_time_group` entry from a step factory (a step, or (step, edges): the edges go into
    the row); a factory that raises gives the row its error."""
    try:
        made = make()
    except Exception as exc:  # noqa: BLE001 - a provider that raises is a finding
        return fields, gc.error_row(exc), 0.0
    step, edges = made if isinstance(made, tuple) else (made, None)
    return dict(fields, edges=edges), step, 5.0


def _cdist_step(n: int, m: int, d: int, dev: str):
    gen = torch.Generator().manual_seed(2)  # the same data as make_prototype_step
    z = torch.randn(n, d, generator=gen).to(dev)
    protos = torch.randn(m, d, generator=gen).to(dev)
    return lambda: torch.cdist(z, protos).argmin(dim=1)


def scale_section(dev: str, sizes: list[str], out: Path, budget: Budget) -> dict:
    if budget.left() < 30:
        return dict(error="skipped: time budget")
    args = ["--device", dev, "--sizes", *sizes, "--epochs", "2", "--time-budget", "40",
            "--no-plot", "--out", str(out)]
    cmd = [sys.executable, str(HERE / "scale.py"), *args]
    shown = "python bench/scale.py " + " ".join(args)
    try:
        res = subprocess.run(cmd, capture_output=True, text=True,
                             timeout=max(30.0, budget.left()))
    except subprocess.TimeoutExpired:
        return dict(command=shown, error="timed out (time budget)")
    if res.returncode != 0:
        return dict(command=shown, error=res.stderr[-500:])
    rows = json.loads((out / "scale.json").read_text())["rows"]
    return dict(command=shown, rows=rows)


def anchor_ratios(loss_rows: list[dict]) -> dict[int, dict]:
    """Row index -> {"sdpa": median / SDPA fwd+bwd in the row's input dtype, "floor": median /
    cuBLAS 3-GEMM floor}, same (N, d); a ratio whose times are missing is left out."""
    anchors = {(r["n"], r["d"], r["what"]): r.get("median_s") for r in loss_rows
               if r["variant"] == "–"}
    out = {}
    for i, r in enumerate(loss_rows):
        t = r.get("median_s")
        if r["variant"] == "–" or not t:
            continue
        sdpa = anchors.get((r["n"], r["d"], f"SDPA {r.get('dtype', 'fp32')} fwd+bwd"))
        floor = anchors.get((r["n"], r["d"], FLOOR))
        out[i] = {k: t / v for k, v in (("sdpa", sdpa), ("floor", floor)) if v}
    return out


# the A/B rows (`_ab_steps`), each an alternative to one default, against the automatic row of its
# case: what the automatic row has that the extra row lacks
AB_QUESTIONS = {SPLITS_OFF: "key splits (kernels/_utils.key_splits)",
                WARPS4: "8 warps (kernels/_utils.TABLE_WARPS)",
                NOT_CHOSEN: "its engine over the Triton kernels (ops/_dispatch thresholds)",
                ATTENTION_NOT_CHOSEN: "its engine over the attention kernels (ops/_dispatch: "
                                      "ATTENTION_OFFICIAL_MIN_ROWS, the several-level rule)",
                SHARED: "its engine and mode over the shared-keys mode "
                        "(HIERTAIL_TRITON_SHARED_LEVELS)"}
AB_MARGIN = 0.03   # a ratio within 3 % of 1 decides nothing


def ab_comparisons(loss_rows: list[dict]) -> list[dict]:
    """The A/B rows (``_ab_steps``) against the automatic row of the same (N, d, variant,
    levels, input) timed in their group (the first group's where none was): {case fields,
    "auto": its engine, "against": the A/B row's what, "question", "ratio": A/B time /
    automatic time, "reading"}; rows without both times are left out."""
    auto: dict = {}
    for r in loss_rows:        # an A/B group's automatic row wins over the first group's
        if str(r["what"]).startswith("ours (auto") and (r.get("ab") or _case(r) not in auto):
            auto[_case(r)] = r
    out = []
    for r in loss_rows:
        a = auto.get(_case(r))
        if r["what"] not in AB_QUESTIONS or a is None or not (r.get("median_s")
                                                               and a.get("median_s")):
            continue
        ratio = r["median_s"] / a["median_s"]
        reading = ("the default is faster" if ratio > 1 + AB_MARGIN else
                   "the alternative is faster" if ratio < 1 - AB_MARGIN else "within 3 %")
        out.append(dict(n=r["n"], d=r["d"], variant=r["variant"], levels=r.get("levels"),
                        dtype=r.get("dtype"), auto=a["what"], against=r["what"],
                        question=AB_QUESTIONS[r["what"]], ratio=ratio, reading=reading))
    return out


def _sections_note(report: dict) -> str:
    """', sections: ...' when --sections left some out, else ''."""
    run = report.get("sections", list(SECTIONS))
    return "" if len(run) == len(SECTIONS) else ", sections: " + " ".join(run)


def failed_checks(checks: list[dict]) -> int:
    """Correctness rows that are not PASS (a FAIL, or a backend that raised)."""
    return sum(r["result"] != "PASS" for r in checks)


def render(report: dict) -> str:
    f = gc.fmt
    report = {"loss": [], "graph": [], "scale": {"error": "not run yet"}, **report}
    ratios = anchor_ratios(report["loss"])
    checks = report["correctness"]
    n_fail = failed_checks(checks)
    parts = [f"# hiertail_fast GPU report: {report['device']}", "",
             f"{report['when']}, torch {report['torch']}, triton {report['triton']}, mode "
             f"{report['mode']}, {report['wall_s']:.0f} s, {gc.load_note(report)}"
             f"{'' if report.get('complete', True) else ' (PARTIAL: stopped or still running)'}"
             f"{_sections_note(report)}"
             f". Correctness: "
             f"{len(checks) - n_fail} PASS, {n_fail} FAIL.", "", "## Correctness (vs float64 "
             "reference)", "", gc.markdown_table(
                 ["op", "backend", "check", "rel. error", "tol", "result"],
                 [[r["op"], r["backend"], r["check"], f(r["error"]), f(r["tol"]),
                   r["result"] + (f" ({r['note']})" if r.get("note") else "")] for r in checks]),
             "", "## Loss forward + backward (40 prototypes, τ 0.1)", "",
             "÷ SDPA: over `F.scaled_dot_product_attention` fwd+bwd on q = k = v = z in the "
             "row's input dtype (issue 9: ≤ 0.6 in fp32, ≤ 1.0 in bf16); ÷ floor: over the "
             "cuBLAS fp32 3-GEMM floor (≤ 2.5). Timed round-robin: the anchors and "
             "automatic rows of one N × d together, the engines of one N × d and variant "
             "together (CUDA events, one warm-up each, median of the rounds).", "",
             gc.markdown_table(
                 ["N", "d", "variant", "levels", "input", "what", "median", "÷ SDPA",
                  "÷ floor", "peak extra", "note"],
                 [[r["n"], r["d"], r["variant"], r.get("levels", "–"), r.get("dtype", "–"),
                   r["what"], f(r.get("median_s"), "s"), f(ratios.get(i, {}).get("sdpa")),
                   f(ratios.get(i, {}).get("floor")),
                   f(r.get("peak_extra_bytes") and float(r["peak_extra_bytes"]), "MB"),
                   r.get("error", "") or ("A/B group" if r.get("ab") else "")]
                  for i, r in enumerate(report["loss"]) if not r.get("profile")]),
             "", "## The defaults' A/B rows", "",
             "Each A/B row against the automatic row of its case, timed again in their group "
             "round-robin with it: ratio = the extra row's time ÷ the automatic row's (> 1: the "
             "automatic row, i.e. the default named, is faster; within 3 % decides nothing).",
             "", gc.markdown_table(
                 ["N", "d", "variant", "levels", "input", "automatic", "against", "tests",
                  "ratio", "reading"],
                 [[c["n"], c["d"], c["variant"], c["levels"], c["dtype"], c["auto"],
                   c["against"], c["question"], f"{c['ratio']:.3f}", c["reading"]]
                  for c in ab_comparisons(report["loss"])]),
             "", "## Where the first size's time goes", "",
             "One profiled step (torch.profiler) of each automatic row of the first N × d: its "
             "kernels' device time against the row's timed median (kernels ÷ median well "
             "under 1: the row is launches and host waits, not kernels), the host waits "
             "(stream, event and device synchronisations and blocking copies, less the "
             "harness's own), kernel launches (torch's "
             "and Triton's) and aten ops of that step.", "",
             gc.markdown_table(
                 ["variant", "levels", "input", "engine", "median", "kernels", "kernels ÷ "
                  "median", "host waits", "launches", "aten ops"],
                 profile_table(report["loss"])),
             "", "## Graph ops", "", gc.markdown_table(
                 ["op", "n", "d", "mode", "provider", "median", "GB/s (byte model)",
                  "of peak", "note"],
                 [[r["op"], r["n"], r["d"], r["mode"], r["provider"], f(r.get("median_s"), "s"),
                   f(r.get("achieved_GBps")), f(r.get("peak_fraction")), r.get("error", "")]
                  for r in report["graph"]])]
    sc = report["scale"]
    parts += ["", "## Scale sweep", "", f"`{sc.get('command', 'bench/scale.py')}`", ""]
    if "rows" in sc:
        parts.append(gc.markdown_table(
            ["method", "nodes", "edges", "s/epoch", "peak MB", "status"],
            [[r["method"], r["nodes"], r["edges"],
              f(float(r["epoch_seconds"]), "s") if r["epoch_seconds"] != "" else "–",
              f(float(r["peak_memory_bytes"]), "MB") if r["peak_memory_bytes"] != "" else "–",
              r["status"]] for r in sc["rows"]]))
    else:
        parts.append(sc.get("error", ""))
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--quick", action="store_true", help="smaller sizes (~1-2 minutes)")
    parser.add_argument("--budget", type=float, default=270.0, help="seconds (default 270)")
    parser.add_argument("--out", type=dir_arg, default=HERE / "results")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                        help="run only these sections (default: all), e.g. a re-check of the "
                             "loss after a change: --sections loss")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help=argparse.SUPPRESS)  # cpu: the CI test of this script, tiny sizes
    args = parser.parse_args(argv)
    if not (args.budget > 0 and math.isfinite(args.budget)):     # (nan switched it off)
        parser.error(f"--budget must be a positive number of seconds, got {args.budget}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_report: no CUDA device here, nothing to validate (run it on a GPU machine)")
        return NO_CUDA_EXIT
    if args.device == "cpu" and torch.cuda.is_available():
        parser.error("--device cpu is the test mode for machines without CUDA")
    for target in (args.out, *(args.out / name for name in REPORT_NAMES)):
        problem = (unwritable_dir_reason(target) if target == args.out
                   else unwritable_file_reason(target, keeps_prev=True))
        if problem:        # before any section: device time is spent otherwise
            parser.error(f"--out {args.out} cannot be written: {problem}")
    kept = _keep_previous(args.out)
    mode = "cpu" if args.device == "cpu" else "quick" if args.quick else "full"
    sizes, dev = SIZES[mode], args.device
    budget = Budget(args.budget, reps=sizes["reps"])
    started = time.perf_counter()
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    report = dict(
        device=torch.cuda.get_device_name() if dev == "cuda" else f"cpu ({platform.machine()})",
        when=time.strftime("%Y-%m-%d %H:%M"), torch=torch.__version__, triton=triton_version,
        mode=mode, backends=list(gc.FAST_BACKENDS),
        loss_backends=list(gc.LOSS_FAST_BACKENDS))
    def save(final: bool = False) -> str:
        # written after every section and every loss row, so that a run stopped from outside
        # (a device call's time limit) still leaves everything measured so far
        report["wall_s"] = time.perf_counter() - started
        report["complete"] = final
        report["load_average_end"] = gc.load_average() if final else None
        text = render(report)
        gc.write_json(args.out / "gpu_report.json", report)
        gc.atomic_write_text(args.out / "gpu_report.md", text)
        return text

    report["sections"] = args.sections
    report["load_average_start"] = gc.load_average()
    report["correctness"] = (gc.correctness(dev, sizes["check_graph"], sizes["check_loss"])
                             if "correctness" in args.sections else [])
    save()
    # graph ops first (short, 1M nodes), then the loss (long at 100k), then the sweep, which
    # keeps `scale_reserve` seconds whatever the sections before it took
    reserve = sizes["scale_reserve"] if "scale" in args.sections else 0.0
    if "graph" in args.sections:
        report["graph"] = graph_section(dev, sizes["graph_n"], sizes["graph_d"],
                                        budget.share(0.3 if "loss" in args.sections else 1.0,
                                                     reserve))
        save()
    report["loss"] = []
    if "loss" in args.sections:
        loss_section(dev, sizes, budget.share(1.0, reserve), rows=report["loss"],
                     checkpoint=save)
    report["scale"] = (scale_section(dev, sizes["scale"], args.out / "gpu_report_scale", budget)
                       if "scale" in args.sections else dict(error="not run (--sections)"))
    text = save(final=True)
    print(text + f"\nwrote {args.out / 'gpu_report.md'} and gpu_report.json"
          + (f"; the previous report is kept as {', '.join(p.name for p in kept)}" if kept
             else ""))
    failed = failed_checks(report["correctness"])
    if failed:
        print(f"gpu_report: {failed} correctness check(s) FAILED", file=sys.stderr)
    return FAILED_CHECKS_EXIT if failed else 0


def _keep_previous(out: Path) -> list[Path]:
    """A report already in ``out`` moves to gpu_report.prev.md / .json (one generation) before
    this run writes its first section: a later run of some ``--sections`` never silently
    replaces a full report."""
    kept = []
    for name in REPORT_NAMES:
        old = out / name
        prev = prev_path(old)          # the name the up-front check (keeps_prev) looked at
        if old.exists():
            os.replace(old, prev)
            kept.append(prev)
        else:
            prev.unlink(missing_ok=True)   # a set from two runs ago must not look like the last
    if kept:
        print(f"gpu_report: the previous report is kept as {', '.join(map(str, kept))}")
    return kept


if __name__ == "__main__":
    sys.exit(main())
