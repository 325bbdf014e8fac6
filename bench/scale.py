#!/usr/bin/env python
"""The paper's scalability study: seconds and peak memory per training epoch against graph size.

    python bench/scale.py --nodes 100000

Sweeps synthetic long-tail graphs of 100, 1k, 10k, ... nodes up to --nodes and trains, for each
method, a few epochs (forward + backward + Adam step):

    hiertail            HierTail with the fast backends (blocked CPU path / Triton on CUDA)
    hiertail-reference  the same model with loss_backend="reference" (dense N x N losses, as the
                        official code computes them)
    gcn                 a 2-layer GCN (GCNConv, improved=True) on the same graph and loop
    any harness baseline (``python -m hiertail_fast.train --method NAME``: lte4g, graphsmote_t,
                        origin, ...; every name in hiertail_fast.baselines.METHODS, so methods
                        added there later work here unchanged), default config, --hidden; its
                        epoch is one step on the method's train_loss. Stages after the loop
                        (LTE4G's prototypes, 4 experts and 2 students) run once after the timed
                        epochs with one epoch per stage loop: their seconds are the CSV's
                        once_seconds, their memory counts in peak_memory_bytes.

The default --methods are the first three; e.g. the paper's comparison with LTE4G and the
heaviest common baseline: --methods hiertail gcn lte4g graphsmote_t.

Every (method, size) runs in a FRESH subprocess (`--worker`), so that no run's memory leaks
into or hides another's. peak_memory_bytes is:
  cpu, --cpu-memory rss (default): peak resident set size (VmHWM) during the training epochs minus
      the worker's resident size after imports and one priming epoch on a tiny graph (code pages,
      thread pools): data + model + optimiser + the step's working memory, not the interpreter.
  cpu, --cpu-memory tracked: peak bytes live in torch's CPU allocator during one extra profiled
      epoch above those live at its start: the step's working memory only (deterministic; the
      profiler reports no free of a block allocated before it started, so the old gradients
      that the epoch's zero_grad drops count as still live: at most the parameters' size over).
  cuda: torch.cuda.max_memory_allocated() over the training epochs (everything on the card).
Runs whose predicted memory (time) exceeds --memory-budget (--time-budget) are reported as
`skipped: would need ~X GB` (`skipped: would take ~X s`) instead of being started. The time budget
is also a hard limit: a run (its whole subprocess: imports, graph, model, epochs) still going
after --time-budget seconds is killed and reported as `timed out after N s`; the sweep goes on,
skipping that method's larger sizes. Epochs: --warmup untimed, then up to --epochs timed
(median), fewer once RUN_SECONDS are spent; the warm-up is dropped when an epoch is predicted to
take over LONG_EPOCH_SECONDS (one-time costs are noise then), and a warm-up epoch that itself
took longer counts as the first timed epoch. --loss-dtype casts the contrastive losses' inputs
(HierTailConfig.loss_dtype; the loss accumulates in fp32).

Writes <out>/scale.csv, <out>/scale.png (log-log time and memory), <out>/scale.json (metadata),
each through a temporary file + os.replace once all three are ready. Results already in <out>
are not lost: they are moved to scale.prev.csv / .json / .png first (one generation; stdout says
so), so a partial run (--methods gcn) never silently replaces a full sweep. --out is checked
before any run. Exit code 1 when a run failed (status `error: ...`); when every run failed,
or none was measured (all skipped or timed out) while --out holds results, nothing is written
and --out keeps what it had. The worker is bench/_scale_worker.py, the
CSV / table / plot / metadata bench/_scale_report.py.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# The worker and the reporting live beside this file (bench/ is not a package). `x as x`:
# re-exported, as tests and bench/test_epoch.py use them as scale.<name>.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _scale_report import (
    CSV_COLUMNS,
    OUTPUT_NAMES,
    format_row,
    machine_info,
    table,
    write_outputs,
)
from _scale_worker import OWN_METHODS, RUN_SECONDS, run_worker
from _scale_worker import _setup as _setup
from _scale_worker import _tracked_peak as _tracked_peak
from _scale_worker import build_model as build_model

from hiertail_fast._argparse import ArgumentParser, dir_arg, exact_int, positive, threads_arg
from hiertail_fast._files import unwritable_dir_reason, unwritable_file_reason
from hiertail_fast._validation import SEED_MAX

METHODS = OWN_METHODS   # the default --methods; any harness baseline is accepted too
RESULT_TAG = "SCALE_RESULT "
GB = 1e9
DEFAULT_CPU_BUDGET = 4 * GB  # the default run must stay within 4 GB on the 2-core CI machine

LONG_EPOCH_SECONDS = 60.0  # predicted epoch time above which the warm-up epoch is dropped

# Memory model for the budget check, bytes. The dense reference keeps about REF_BYTES_PER_PAIR
# bytes per (n + k)^2 key pair alive through backward (DESIGN.md §3: ~33 B per N^2 element in the
# official code; our reference measured 20.6 B at 10k nodes, paper config, in this script's
# worker: 2,089 MB; the 33 B used before predicted 3.5 GB there and ~332 GB at 100k, not ~206;
# a memory audit, 2026-12-02). Linear terms: ~8 float32 n x (features + hidden) activations and
# gradients (HierTail measured ~28 B per node channel at 10k-100k, the GCN 12-15), the CSR graph
# (index + value per directed edge), and the blocked loss's 48 MB row block.
REF_BYTES_PER_PAIR = 21.0
BYTES_PER_NODE_CHANNEL = 4 * 8
BYTES_PER_EDGE = 48
FIXED_BYTES = 64e6
# Baselines whose time or memory is not linear + fixed: (time exponent for the one-point
# extrapolation, extra fixed bytes). GraphSMOTE's L_rec is O(n²·h) time over 16 MB row blocks
# (P, its gradient and temporaries); LTE4G's similar-node search forms 16 MB cosine blocks.
# Any other baseline: linear time, the linear memory model (measured runs raise both).
BASELINE_SCALING = {"graphsmote_t": (2.0, 3 * 16e6), "graphsmote_o": (2.0, 3 * 16e6),
                    "lte4g": (1.0, 3 * 16e6)}


def baseline_methods() -> tuple[str, ...]:
    """The harness's baseline names (imports torch: only called to check --methods)."""
    from hiertail_fast.baselines import METHODS as registry
    return tuple(sorted(registry))


def time_exponent(method: str) -> float:
    return BASELINE_SCALING.get(method, (1.0, 0.0))[0]


# ----------------------------------------------------------------------------- arguments
_positive_int, _positive_float = positive(int), positive(float)


def _seed(text: str) -> int:
    """argparse type: a seed in [0, 2**64 - 1], what each run's ``torch.manual_seed`` takes
    (numpy refuses negative seeds inside every run, and above 2**64 - 1 every run failed with
    torch's "Overflow when unpacking long long")."""
    value = exact_int(text, SEED_MAX)       # (its message names the bound above it)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=_positive_int, default=100_000,
                   help="largest graph; sizes 100, 1k, 10k, ... up to it (default 100000)")
    p.add_argument("--sizes", type=_positive_int, nargs="+", help="explicit sizes (override)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), metavar="M",
                   help=f"{', '.join(METHODS)} (the default) or any harness baseline "
                        "(python -m hiertail_fast.train --method NAME: lte4g, graphsmote_t, ...)")
    p.add_argument("--classes", type=_positive_int, default=70)
    p.add_argument("--avg-degree", type=_positive_float, default=10.0)
    p.add_argument("--features", type=_positive_int, default=128)
    p.add_argument("--hidden", type=_positive_int, default=128)
    p.add_argument("--config", choices=("paper", "official"), default="paper",
                   help="HierTail configuration (default paper)")
    p.add_argument("--epochs", type=_positive_int, default=3,
                   help="timed epochs (median; default %(default)s)")
    p.add_argument("--warmup", type=exact_int, default=1, help="untimed epochs first (default 1)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--seed", type=_seed, default=0,
                   help="graph, split and model seed, in [0, 2**64 - 1] (default 0)")
    p.add_argument("--memory-budget", type=_positive_float, metavar="GB",
                   help="skip runs predicted to need more (default: available memory, "
                        "capped at 4 GB on CPU; free GPU memory on CUDA)")
    p.add_argument("--time-budget", type=_positive_float, default=1200.0, metavar="S",
                   help="seconds per run (default 1200): runs predicted from smaller sizes to "
                        "take longer are skipped, a run still going after it is killed and "
                        "reported as 'timed out' (wall clock of the whole run, setup included)")
    p.add_argument("--loss-dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="dtype of the contrastive losses' inputs (HierTail methods; default "
                        "float32; the loss accumulates in fp32)")
    p.add_argument("--threads", type=threads_arg,
                   help="torch threads, at most the CPUs available (default: torch's)")
    p.add_argument("--cpu-memory", choices=("rss", "tracked"), default="rss",
                   help="CPU memory figure: peak RSS (default) or torch-allocator peak")
    p.add_argument("--out", type=dir_arg, default=Path(__file__).resolve().parent / "results",
                   help="directory for scale.csv/.json/.png (default bench/results); results "
                        "already there are kept as scale.prev.* (one generation)")
    p.add_argument("--no-plot", action="store_true", help="skip scale.png")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one run, JSON spec
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        return args
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.classes < 2:
        parser.error(f"--classes must be >= 2, got {args.classes}")
    sizes = sorted(set(args.sizes)) if args.sizes else default_sizes(args.nodes)
    too_small = [n for n in sizes if n < args.classes]
    if too_small:
        parser.error(f"sizes {too_small} are smaller than --classes {args.classes} "
                     "(every class needs a node)")
    if not args.avg_degree < sizes[0] - 1:     # the generator's own rule, before any run
        parser.error(f"--avg-degree {args.avg_degree:g} must be below the smallest size minus "
                     f"one ({sizes[0] - 1})")
    args.sizes = sizes
    args.methods = list(dict.fromkeys(args.methods))
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        allowed = (*METHODS, *baseline_methods())
        bad = [m for m in unknown if m not in allowed]
        if bad:
            parser.error(f"argument --methods: invalid choice: {bad[0]!r} (choose from "
                         f"{', '.join(allowed)})")
    for target in [args.out, *(args.out / name for name in OUTPUT_NAMES)]:
        problem = (unwritable_dir_reason(target) if target == args.out
                   else unwritable_file_reason(target, keeps_prev=True))
        if problem:  # before any run: a sweep can take an hour
            parser.error(f"--out {args.out} cannot be written: {problem}")
    if args.device != "cpu":
        import torch
        if args.device == "cuda" and not torch.cuda.is_available():
            parser.error("--device cuda was asked for but torch sees no CUDA device")
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def default_sizes(max_nodes: int) -> list[int]:
    """100, 1000, 10000, ... (log scale), ending with max_nodes itself."""
    sizes = [10 ** e for e in range(2, 10) if 10 ** e < max_nodes]
    return sizes + [max_nodes]


# ----------------------------------------------------------------------------- budgets
def extrapolate(history: list[tuple[int, float]], nodes: int, nominal: float) -> float | None:
    """Extrapolate measured (n, value) pairs to `nodes`: v = a·n + b·n² with a, b >= 0 through
    the last two points (HierTail's time is linear work plus the all-pairs loss); with one
    point, v·(nodes/n)^nominal. None without measurements."""
    points = [(n, v) for n, v in history if v > 0]
    if not points:
        return None
    n1, v1 = points[-1]
    if len(points) < 2 or points[-2][0] >= n1:
        return v1 * (nodes / n1) ** nominal
    n0, v0 = points[-2]
    b = (v1 / n1 - v0 / n0) / (n1 - n0)
    a = v0 / n0 - b * n0
    if b <= 0:  # sub-linear (fixed costs): linear through the last point
        return v1 * nodes / n1
    if a < 0:  # super-quadratic: quadratic through the last point
        return v1 * (nodes / n1) ** 2
    return a * nodes + b * nodes**2


def predict_memory(method: str, nodes: int, *, classes: int, features: int, hidden: int,
                   avg_degree: float, config: str = "paper",
                   history: list[tuple[int, float]] = ()) -> float:
    """Predicted peak bytes of one run; `history`: (nodes, measured bytes) of smaller runs.

    hiertail / gcn / baselines: FIXED + n·(features + hidden)·BYTES_PER_NODE_CHANNEL +
    E·BYTES_PER_EDGE (+ a baseline's BASELINE_SCALING block bytes).
    hiertail-reference: plus REF_BYTES_PER_PAIR·(n + k)^2 per contrastive level over all nodes
    (paper: one level, k = C prototypes; official: two levels, k <= n/C pooled nodes). The
    measured smaller runs, extrapolated (`extrapolate_memory`: their bytes per pair for the
    reference), can only raise it.
    """
    per_node = (features + hidden) * BYTES_PER_NODE_CHANNEL + avg_degree * BYTES_PER_EDGE
    predicted = FIXED_BYTES + nodes * per_node
    pairs = None
    if method == "hiertail-reference":
        def pairs(n: int) -> float:   # the dense reference's n_keys² entries, all levels
            levels, keys = (1, n + classes) if config == "paper" else (2, n + n // classes)
            return float(levels * keys**2)
        predicted += REF_BYTES_PER_PAIR * pairs(nodes)
    predicted += BASELINE_SCALING.get(method, (1.0, 0.0))[1]
    measured = extrapolate_memory(list(history), nodes, pairs=pairs,
                                  per_node=0.0 if pairs is None else per_node)
    return max(predicted, measured or 0.0)


def extrapolate_memory(history: list[tuple[int, float]], nodes: int, *,
                       pairs: Callable[[int], float] | None = None,
                       per_node: float = 0.0) -> float | None:
    """Measured (n, bytes) pairs extrapolated to `nodes`, through the last two points.

    Linear methods (`pairs` None, `per_node` 0): c + a·n, the intercept c holding the fixed
    costs (a fit through the origin took them for per-node bytes). The dense reference: c +
    per_node·n + b·pairs(n), its linear costs charged at the model's `per_node` bytes first and
    the rest of the growth to its pairs: b through n² alone took the 100 → 1,000-node growth,
    where the linear costs are a third of it, for 44 bytes a pair (20.6 measured at 10k) and
    skipped the main job's 10k reference run as 4.4 GB over its 4 GB budget (it takes 2.1 GB; a
    docs audit). With one point, or a flat / falling pair, the last point scaled by n (or by the
    pairs). None without measurements."""
    points = [(n, v) for n, v in history if v > 0]
    if not points:
        return None
    grow = (lambda n: float(n)) if pairs is None else pairs
    n1, v1 = points[-1]
    if len(points) < 2 or points[-2][0] >= n1:
        return v1 * grow(nodes) / grow(n1)
    n0, v0 = points[-2]
    slope = (v1 - v0 - per_node * (n1 - n0)) / (grow(n1) - grow(n0))
    if slope <= 0:
        return v1 * grow(nodes) / grow(n1)
    return max(v1, v1 + per_node * (nodes - n1) + slope * (grow(nodes) - grow(n1)))


def planned_epochs(seconds: float | None, warmup: int, epochs: int) -> tuple[int, int]:
    """(warm-up, timed) epochs a run will do when an epoch is predicted to take `seconds`."""
    if seconds is None:
        return warmup, epochs
    timed = max(1, min(epochs, math.ceil(RUN_SECONDS / max(seconds, 1e-9))))
    return (0 if seconds > LONG_EPOCH_SECONDS else warmup), timed


def default_memory_budget(device: str) -> float:
    if device == "cuda":
        import torch
        return float(torch.cuda.mem_get_info()[0])
    import psutil
    return float(min(psutil.virtual_memory().available, DEFAULT_CPU_BUDGET))


# ----------------------------------------------------------------------------- driver
def _gb(nbytes: float) -> str:
    return f"{nbytes / GB:.1f} GB" if nbytes >= 0.1 * GB else f"{nbytes / 1e6:.0f} MB"


def worker_wait_policy() -> str:
    """The workers' OMP_WAIT_POLICY: the caller's (an empty one: the OpenMP runtime's own
    default), else PASSIVE. Sleeping OpenMP threads keep a shared machine's throughput (both
    cores busy: a 10k-node HierTail epoch 1.2 s vs 2.4 s under libgomp's default
    spin-then-sleep, GCN 0.07 vs 0.22 s), but on an idle machine every parallel region must
    wake them: HierTail epochs 2.2-2.6x slower at 100 / 1,000 nodes and 1.35x at 10k,
    GCN 2.0-3.0x and 1.2-1.3x (2-core Xeon VM, 2026-12-02;
    docs/results/omp_wait_policy_2026-12-02.txt). On a machine of your own, run with
    OMP_WAIT_POLICY=ACTIVE."""
    policy = os.environ.get("OMP_WAIT_POLICY")
    return "PASSIVE" if policy is None else policy


def run_one(spec: dict, timeout: float | None) -> dict:
    """Run one (method, size) in a fresh interpreter; never raises for a failed run. The
    subprocess is killed after `timeout` seconds of wall clock (its imports and setup count)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    env = {**os.environ, "OMP_WAIT_POLICY": worker_wait_policy(), _DRIVER_ENV: str(os.getpid())}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:  # subprocess.run has killed the worker
        return {"status": f"timed out after {timeout:g} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    if proc.returncode in (-9, 137):
        return {"status": "error: killed (out of memory?)"}
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return {"status": f"error: {lines[-1] if lines else f'exit code {proc.returncode}'}"[:300]}


def sweep(args: argparse.Namespace, budget: float, progress=None,
          rows: list[dict] | None = None) -> list[dict]:
    """All (size, method) runs, smallest size first; runs over the budgets are skipped. The
    rows are appended to ``rows`` as they finish (the caller keeps them if interrupted)."""
    rows = [] if rows is None else rows
    mem_hist: dict[str, list] = {m: [] for m in args.methods}  # method -> [(nodes, bytes)]
    time_hist: dict[str, list] = {m: [] for m in args.methods}  # method -> [(nodes, seconds)]
    timed_out: dict[str, int] = {}  # method -> the size at which it ran out of time
    for nodes in args.sizes:
        for method in args.methods:
            need = predict_memory(method, nodes, classes=args.classes, features=args.features,
                                  hidden=args.hidden, avg_degree=args.avg_degree,
                                  config=args.config, history=mem_hist[method])
            row = {**dict.fromkeys(CSV_COLUMNS, ""), "method": method, "nodes": nodes,
                   "device": args.device, "predicted_memory_bytes": need,
                   "loss_dtype": args.loss_dtype if method.startswith("hiertail") else "n/a",
                   "memory_measure": memory_tag(args)}
            secs = extrapolate(time_hist[method], nodes, time_exponent(method))
            warmup, epochs = planned_epochs(secs, args.warmup, args.epochs)
            if method in timed_out:
                row["status"] = (f"skipped: {timed_out[method]} nodes timed out "
                                 f"(time budget {args.time_budget:g} s)")
            elif need > budget:
                row["status"] = f"skipped: would need ~{_gb(need)} (budget {_gb(budget)})"
            elif secs is not None and secs * (warmup + epochs) > args.time_budget:
                row["status"] = (f"skipped: would take ~{secs * (warmup + epochs):.0f} s "
                                 f"(time budget {args.time_budget:.0f} s)")
            else:
                spec = {k: getattr(args, k) for k in (
                    "classes", "avg_degree", "features", "hidden", "config", "device", "seed",
                    "cpu_memory", "threads", "loss_dtype")}
                spec.update(method=method, nodes=nodes, warmup=warmup, epochs=args.epochs,
                            long_epoch_seconds=LONG_EPOCH_SECONDS)
                row.update(run_one(spec, timeout=args.time_budget))  # the budget is a hard limit
                if row["status"].startswith("timed out"):
                    timed_out[method] = nodes  # larger sizes of this method would too
                done = (row.get("warmup_epochs", warmup), row.get("timed_epochs", args.epochs))
                if row["status"] == "ok" and done != (args.warmup, args.epochs):
                    row["status"] = f"ok ({done[0]} warm-up + {done[1]} timed epochs: long epochs)"
                if str(row["status"]).startswith("ok"):
                    mem_hist[method].append((nodes, float(row["peak_memory_bytes"])))
                    time_hist[method].append((nodes, float(row["epoch_seconds"])))
            rows.append(row)
            if progress is not None:
                progress.update(1)
                progress.write(format_row(row))
    return rows


def memory_tag(args) -> str:
    """The CSV's short name of what peak_memory_bytes measures (CSV_COLUMNS' comment)."""
    return "cuda-allocator" if args.device == "cuda" else args.cpu_memory


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _written_by(out: Path, info: dict) -> bool:
    """Whether ``out``'s scale.json is this sweep's (its wall time, a float that survives the
    JSON round trip exactly): a run stopped while writing tells the user which files they have."""
    try:
        return json.loads((out / "scale.json").read_text()).get("wall_seconds") == info[
            "wall_seconds"]
    except (OSError, ValueError, AttributeError):
        return False


_DRIVER_ENV = "HIERTAIL_SCALE_DRIVER"     # the driver's pid, for its worker


def _die_with_the_driver() -> None:
    """Worker side: be killed when the driver exits, whatever way (Linux PR_SET_PDEATHSIG).
    The driver's SIGTERM handler lets subprocess.run kill a running worker, but a signal taken
    while Popen is still starting the worker (fork done, exec pending) escapes before there is
    a Popen to kill it; and SIGKILL runs no handler. If the driver is already gone, exit."""
    driver = os.environ.get(_DRIVER_ENV)
    if driver is None or not sys.platform.startswith("linux"):
        return
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(driver):        # it died before the call above: no signal comes
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        _die_with_the_driver()
        print(RESULT_TAG + json.dumps(run_worker(json.loads(args.worker))), flush=True)
        return 0
    from tqdm import tqdm

    # SIGTERM as an exception: subprocess.run then kills the running worker on its way out
    # (by default the driver died at once and the worker ran on as an orphan, no time limit)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    budget = args.memory_budget * GB if args.memory_budget else default_memory_budget(args.device)
    measure = ("torch.cuda.max_memory_allocated" if args.device == "cuda" else
               "peak RSS above the primed post-import baseline" if args.cpu_memory == "rss" else
               "torch CPU allocator peak of one step above its start")
    info = {"argv": sys.argv[1:] if argv is None else argv, "args": vars(args),
            "memory_budget_bytes": budget, "memory_measure": measure,
            "omp_wait_policy": worker_wait_policy(), **machine_info()}
    print(f"sizes {args.sizes}, methods {args.methods}, device {args.device}, loss dtype "
          f"{args.loss_dtype}, memory budget {_gb(budget)}, time budget "
          f"{args.time_budget:g} s/run, memory = {measure}, load average "
          f"{info['load_average'][0]:.1f} on {info['cores']} cores")
    started = time.perf_counter()
    with tqdm(total=len(args.sizes) * len(args.methods), unit="run", desc="scale") as bar:
        bar.write(table([]))
        rows: list[dict] = []
        try:
            sweep(args, budget, bar, rows)
        except (KeyboardInterrupt, SystemExit) as exc:   # Ctrl-C, or SIGTERM (above)
            bar.close()
            print("\n" + table(rows) + f"\n\ninterrupted after {len(rows)} run(s) (the rows "
                  f"above); nothing written, {args.out} left as it was", file=sys.stderr)
            return 130 if isinstance(exc, KeyboardInterrupt) else int(exc.code or 1)
    info.update(wall_seconds=time.perf_counter() - started,
                load_average_end=list(os.getloadavg()), rows=rows)
    failed = [r for r in rows if str(r["status"]).startswith("error")]
    if failed and not any(str(r["status"]).startswith("ok") for r in rows):
        # nothing measured: results already in --out stay where they are (a sweep whose
        # every run failed, e.g. on a bad option, moved a good one to scale.prev.*)
        print("\n" + table(rows) + f"\n\nevery run failed ({failed[0]['status']}); nothing "
              f"written, {args.out} left as it was", file=sys.stderr)
        return 1
    if not any(str(r["status"]).startswith("ok") for r in rows) and any(
            (args.out / name).exists() for name in OUTPUT_NAMES):
        # nothing measured (every run skipped or timed out, e.g. on a too small budget): the
        # results in --out stay in place (written, they went to scale.prev.*, and a second
        # such run deleted them)
        print("\n" + table(rows) + "\n\nnothing was measured (every run skipped or timed "
              f"out); nothing written, the results in {args.out} left as they were",
              file=sys.stderr)
        return 1 if failed else 0
    try:
        written, kept = write_outputs(rows, info, args.out, with_plot=not args.no_plot)
    except (KeyboardInterrupt, SystemExit) as exc:
        # Ctrl-C, or SIGTERM (the handler above), while the files are made (the plot: ~1 s);
        # one during their renames is held until all three are in place, then comes here
        verb = "interrupted" if isinstance(exc, KeyboardInterrupt) else "terminated"
        print("\n" + table(rows) + f"\n\n{verb} " + (
            f"after the results were written to {args.out}" if _written_by(args.out, info) else
            f"while the results were written; nothing written, {args.out} left as it was"),
            file=sys.stderr)
        return 130 if isinstance(exc, KeyboardInterrupt) else int(exc.code or 1)
    print("\n" + table(rows) + f"\n\n{info['wall_seconds']:.0f} s; load average at the end "
          f"{info['load_average_end'][0]:.1f}; wrote {', '.join(map(str, written))}")
    if kept:
        print(f"the previous results are kept as {', '.join(map(str, kept))}")
    if failed:
        print(f"{len(failed)} run(s) failed (status 'error: ...' in the table)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
