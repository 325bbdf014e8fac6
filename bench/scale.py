#!/usr/bin/env python
"""The paper's scalability study: seconds and peak memory per training epoch against graph size.

    python bench/scale.py --nodes 100000

Sweeps synthetic long-tail graphs of 100, 1k, 10k, ... nodes up to --nodes and trains, for each
method, a few epochs (forward + backward + Adam step):

    hiertail            HierTail with the fast backends (blocked CPU path / Triton on CUDA)
    hiertail-reference  the same model with loss_backend="reference" (dense N x N losses, as the
                        official code computes them)
    gcn                 a 2-layer GCN (GCNConv, improved=True) on the same graph and loop

Every (method, size) runs in a FRESH subprocess (`--worker`), so that no run's memory leaks
into or hides another's. peak_memory_bytes is:
  cpu, --cpu-memory rss (default): peak resident set size (VmHWM) during the training epochs minus
      the worker's resident size after imports and one priming epoch on a tiny graph (code pages,
      thread pools): data + model + optimiser + the step's working memory, not the interpreter.
  cpu, --cpu-memory tracked: peak bytes live in torch's CPU allocator during one extra profiled
      epoch above those live at its start: the step's working memory only (deterministic).
  cuda: torch.cuda.max_memory_allocated() over the training epochs (everything on the card).
Runs whose predicted memory (time) exceeds --memory-budget (--time-budget) are reported as
`skipped: would need ~X GB` (`skipped: would take ~X s`) instead of being started. Epochs: --warmup
untimed, then up to --epochs timed (median), fewer once RUN_SECONDS are spent; the warm-up is
dropped when an epoch is predicted to take over LONG_EPOCH_SECONDS (one-time costs are noise then).
Writes <out>/scale.csv, <out>/scale.png (log-log time and memory), <out>/scale.json (metadata).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

METHODS = ("hiertail", "hiertail-reference", "gcn")
CSV_COLUMNS = ("method", "nodes", "edges", "epoch_seconds", "peak_memory_bytes", "device", "status")
RESULT_TAG = "SCALE_RESULT "
GB = 1e9
DEFAULT_CPU_BUDGET = 4 * GB  # the default run must stay within 4 GB on the 2-core CI machine

LONG_EPOCH_SECONDS = 60.0  # predicted epoch time above which the warm-up epoch is dropped
RUN_SECONDS = 120.0  # timed epochs stop once this much is spent (at least one)

# Memory model for the budget check, bytes. The dense reference keeps about REF_BYTES_PER_PAIR
# bytes per (n + k)^2 key pair alive through backward (DESIGN.md §3: ~33 B per N^2 element in the
# official code; our reference measured ~21 B with --cpu-memory tracked at 4000 nodes, paper
# config). Linear terms: ~a dozen float32 n x (features + hidden) activations and gradients, the
# CSR graph (index + value per directed edge), and the blocked loss's 48 MB row block.
REF_BYTES_PER_PAIR = 33.0
BYTES_PER_NODE_CHANNEL = 4 * 12
BYTES_PER_EDGE = 48
FIXED_BYTES = 64e6


# ----------------------------------------------------------------------------- arguments
def _positive(kind: type):
    """argparse type: a positive int ("100000" or "1e5") or a positive finite float."""
    def convert(text: str):
        try:
            number = float(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if kind is int and (not math.isfinite(number) or number != int(number)):
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
        if not (number > 0 and math.isfinite(number)):
            raise argparse.ArgumentTypeError(f"{text!r} must be a positive "
                                             + ("integer" if kind is int else "number"))
        return kind(number)
    return convert


_positive_int, _positive_float = _positive(int), _positive(float)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=_positive_int, default=100_000,
                   help="largest graph; sizes 100, 1k, 10k, ... up to it (default 100000)")
    p.add_argument("--sizes", type=_positive_int, nargs="+", help="explicit sizes (override)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), metavar="M",
                   help=f"any of {', '.join(METHODS)} (default: all)")
    p.add_argument("--classes", type=_positive_int, default=70)
    p.add_argument("--avg-degree", type=_positive_float, default=10.0)
    p.add_argument("--features", type=_positive_int, default=128)
    p.add_argument("--hidden", type=_positive_int, default=128)
    p.add_argument("--config", choices=("paper", "official"), default="paper",
                   help="HierTail configuration (default paper)")
    p.add_argument("--epochs", type=_positive_int, default=3, help="timed epochs (median)")
    p.add_argument("--warmup", type=int, default=1, help="untimed epochs first (default 1)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-budget", type=_positive_float, metavar="GB",
                   help="skip runs predicted to need more (default: available memory, "
                        "capped at 4 GB on CPU; free GPU memory on CUDA)")
    p.add_argument("--time-budget", type=_positive_float, default=1200.0, metavar="S",
                   help="skip runs predicted (from smaller sizes) to take longer (default 1200)")
    p.add_argument("--threads", type=_positive_int, help="torch threads (default: torch's)")
    p.add_argument("--cpu-memory", choices=("rss", "tracked"), default="rss",
                   help="CPU memory figure: peak RSS (default) or torch-allocator peak")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
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
    args.sizes = sizes
    args.methods = list(dict.fromkeys(args.methods))
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

    hiertail / gcn: FIXED + n·(features + hidden)·BYTES_PER_NODE_CHANNEL + E·BYTES_PER_EDGE.
    hiertail-reference: plus REF_BYTES_PER_PAIR·(n + k)^2 per contrastive level over all nodes
    (paper: one level, k = C prototypes; official: two levels, k <= n/C pooled nodes). The
    measured smaller runs, extrapolated (quadratically for the reference), can only raise it.
    """
    predicted = (FIXED_BYTES + nodes * (features + hidden) * BYTES_PER_NODE_CHANNEL
                 + nodes * avg_degree * BYTES_PER_EDGE)
    if method == "hiertail-reference":
        levels, keys = (1, nodes + classes) if config == "paper" else (2, nodes + nodes // classes)
        predicted += levels * REF_BYTES_PER_PAIR * keys**2
    measured = extrapolate(list(history), nodes, 2.0 if method == "hiertail-reference" else 1.0)
    return max(predicted, measured or 0.0)


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


# ----------------------------------------------------------------------------- worker
def _proc_status_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        return int(re.search(rf"{field}:\s+(\d+) kB", fh.read()).group(1)) * 1024


def _reset_peak_rss() -> bool:
    """Reset the kernel's resident high-water mark (VmHWM) to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _tracked_peak(step) -> int:
    """Peak live bytes of torch's CPU allocator during `step()` above those live at its start."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    sizes: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            sizes.append((node.start_time_ns, node.extra_fields.alloc_size))  # < 0: a free
        stack.extend(node.children)
    live = peak = 0
    for _, nbytes in sorted(sizes):
        live += nbytes
        peak = max(peak, live)
    return peak


def build_model(method: str, in_channels: int, num_classes: int, spec: dict):
    """(model, loss(model output, y, train_idx) -> scalar tensor) for one method."""
    import torch
    import torch.nn.functional as F

    if method == "gcn":
        from hiertail_fast.nn.conv import GCNConv

        class GCN(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.conv1 = GCNConv(in_channels, spec["hidden"], improved=True)
                self.conv2 = GCNConv(spec["hidden"], num_classes, improved=True)

            def forward(self, x, graph):
                return self.conv2(torch.relu(self.conv1(x, graph)), graph)

        return GCN(), lambda out, y, idx: F.cross_entropy(out[idx], y[idx])

    from hiertail_fast.nn.hiertail import HierTail, HierTailConfig

    backend = "reference" if method == "hiertail-reference" else None
    config = HierTailConfig.named(spec["config"], hidden=spec["hidden"], loss_backend=backend)
    model = HierTail(in_channels, num_classes, config)
    return model, lambda out, y, idx: model.loss(out, y, idx).total


def _malloc_trim() -> None:
    """Hand freed heap pages back to the OS (glibc), so the baseline RSS holds live data only."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _setup(spec: dict, nodes: int):
    """Graph, model and optimiser of one run; returns (epoch function, edges, losses list)."""
    import torch

    from hiertail_fast.data.splits import natural_split
    from hiertail_fast.data.synthetic import make_synthetic_graph
    from hiertail_fast.nn.hiertail import prepare_graph

    device = torch.device(spec["device"])
    torch.manual_seed(spec["seed"])
    data = make_synthetic_graph(nodes, spec["classes"], avg_degree=spec["avg_degree"],
                                num_features=spec["features"], seed=spec["seed"])
    train_idx = natural_split(data.y, spec["seed"])[0].to(device)
    # as the official loader leaves it: symmetric, deduplicated, one unit self-loop a node
    graph = prepare_graph(data.edge_index, nodes).to(device)
    x, y = data.x.to(device), data.y.to(device)
    model, loss_fn = build_model(spec["method"], x.shape[1], int(data.num_classes), spec)
    model = model.to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses: list[float] = []

    def epoch() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x, graph), y, train_idx)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # .item() synchronises: the time includes the kernels

    return epoch, graph.num_edges - nodes, losses


def run_worker(spec: dict) -> dict:
    """One (method, size) run in this (fresh) process; returns the CSV row fields."""
    import gc

    import torch

    device = torch.device(spec["device"])
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    if device.type == "cpu" and spec["cpu_memory"] == "rss":
        # Prime: one epoch on a tiny graph faults in code pages, thread pools and lazily loaded
        # libraries (~170 MB of RSS on first use), so that the baseline below holds them.
        _setup(spec, max(2 * spec["classes"], 200))[0]()
    gc.collect()
    _malloc_trim()
    baseline_rss = _proc_status_bytes("VmRSS")
    epoch, edges, losses = _setup(spec, spec["nodes"])
    gc.collect()
    _malloc_trim()  # drop the generator's freed temporaries from the resident set
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    hwm_reset = _reset_peak_rss()
    for _ in range(spec["warmup"]):
        epoch()
    times: list[float] = []
    while len(times) < spec["epochs"] and (not times or sum(times) < RUN_SECONDS):
        sync()
        start = time.perf_counter()
        epoch()
        sync()
        times.append(time.perf_counter() - start)
    name = "cpu"
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        name = f"cuda ({torch.cuda.get_device_name(device)})"
    elif spec["cpu_memory"] == "tracked":
        peak = _tracked_peak(epoch)
    else:  # without the reset, VmHWM is the whole process's peak: report it as such
        peak = _proc_status_bytes("VmHWM") - (baseline_rss if hwm_reset else 0)
    return {"edges": edges, "epoch_seconds": statistics.median(times),
            "peak_memory_bytes": int(peak), "device": name, "timed_epochs": len(times),
            "status": "ok" if all(map(math.isfinite, losses)) else "ok (non-finite loss)"}


# ----------------------------------------------------------------------------- driver
def _gb(nbytes: float) -> str:
    return f"{nbytes / GB:.1f} GB" if nbytes >= 0.1 * GB else f"{nbytes / 1e6:.0f} MB"


def run_one(spec: dict, timeout: float | None) -> dict:
    """Run one (method, size) in a fresh interpreter; never raises for a failed run."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    # Passive OpenMP waiting: spinning threads collapse throughput 10x+ on a shared machine.
    env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": f"timeout: over {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    if proc.returncode in (-9, 137):
        return {"status": "error: killed (out of memory?)"}
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return {"status": f"error: {lines[-1] if lines else f'exit code {proc.returncode}'}"[:300]}


def sweep(args: argparse.Namespace, budget: float, progress=None) -> list[dict]:
    """All (size, method) runs, smallest size first; runs over the budgets are skipped."""
    rows: list[dict] = []
    mem_hist: dict[str, list] = {m: [] for m in args.methods}  # method -> [(nodes, bytes)]
    time_hist: dict[str, list] = {m: [] for m in args.methods}  # method -> [(nodes, seconds)]
    for nodes in args.sizes:
        for method in args.methods:
            need = predict_memory(method, nodes, classes=args.classes, features=args.features,
                                  hidden=args.hidden, avg_degree=args.avg_degree,
                                  config=args.config, history=mem_hist[method])
            row = {**dict.fromkeys(CSV_COLUMNS, ""), "method": method, "nodes": nodes,
                   "device": args.device, "predicted_memory_bytes": need}
            secs = extrapolate(time_hist[method], nodes, 1.0)
            warmup, epochs = planned_epochs(secs, args.warmup, args.epochs)
            if need > budget:
                row["status"] = f"skipped: would need ~{_gb(need)} (budget {_gb(budget)})"
            elif secs is not None and secs * (warmup + epochs) > args.time_budget:
                row["status"] = (f"skipped: would take ~{secs * (warmup + epochs):.0f} s "
                                 f"(time budget {args.time_budget:.0f} s)")
            else:
                spec = {k: getattr(args, k) for k in (
                    "classes", "avg_degree", "features", "hidden", "config", "device", "seed",
                    "cpu_memory", "threads")}
                spec.update(method=method, nodes=nodes, warmup=warmup, epochs=args.epochs)
                # hard stop far past any prediction: a wedged run must not hang the sweep
                row.update(run_one(spec, timeout=max(3 * args.time_budget, 600)))
                timed = row.get("timed_epochs", args.epochs)
                if row["status"] == "ok" and (warmup, timed) != (args.warmup, args.epochs):
                    row["status"] = f"ok ({warmup} warm-up + {timed} timed epochs: long epochs)"
                if str(row["status"]).startswith("ok"):
                    mem_hist[method].append((nodes, float(row["peak_memory_bytes"])))
                    time_hist[method].append((nodes, float(row["epoch_seconds"])))
            rows.append(row)
            if progress is not None:
                progress.update(1)
                progress.write(format_row(row))
    return rows


def format_row(row: dict) -> str:
    secs, mem = row["epoch_seconds"], row["peak_memory_bytes"]
    secs = f"{float(secs):10.4f}" if secs != "" else f"{'-':>10}"
    mem = f"{float(mem) / 1e6:12.1f}" if mem != "" else f"{'-':>12}"
    return (f"{row['method']:<19}{row['nodes']:>9}{str(row['edges']):>11}{secs}{mem}  "
            f"{row['device']:<8} {row['status']}")


def table(rows: list[dict]) -> str:
    head = f"{'method':<19}{'nodes':>9}{'edges':>11}{'epoch s':>10}{'peak MB':>12}  device   status"
    return "\n".join([head, "-" * len(head)] + [format_row(r) for r in rows])


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: list[dict], path: Path) -> None:
    """Log-log epoch seconds and peak memory against nodes, one line per method."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for method in dict.fromkeys(r["method"] for r in rows):
        ok = [r for r in rows if r["method"] == method and str(r["status"]).startswith("ok")]
        nodes = [int(r["nodes"]) for r in ok]
        ax_t.plot(nodes, [float(r["epoch_seconds"]) for r in ok], "o-", label=method)
        line = ax_m.plot(nodes, [float(r["peak_memory_bytes"]) / 1e6 for r in ok], "o-",
                         label=method)[0]
        over = [r for r in rows if r["method"] == method and "would need" in str(r["status"])]
        if over:  # skipped runs: their predicted memory, dashed from the last measured point
            xs = nodes[-1:] + [int(r["nodes"]) for r in over]
            ys = [float(r["peak_memory_bytes"]) / 1e6 for r in ok][-1:] + [
                float(r["predicted_memory_bytes"]) / 1e6 for r in over]
            ax_m.plot(xs, ys, "x--", color=line.get_color(), label=f"{method} (predicted)")
    for ax, label in ((ax_t, "seconds per training epoch"), (ax_m, "peak memory (MB)")):
        if ax.has_data():
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.legend()
        else:
            ax.text(0.5, 0.5, "no completed runs", ha="center", transform=ax.transAxes)
        ax.set_xlabel("nodes")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"HierTail scalability ({rows[0]['device'] if rows else ''})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine_info() -> dict:
    import psutil
    import torch
    with open("/proc/cpuinfo") as fh:
        cpu = (re.findall(r"model name\s*:\s*(.*)", fh.read()) or [platform.processor()])[0]
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "memory_total_bytes": psutil.virtual_memory().total, "torch": torch.__version__,
            "python": platform.python_version(), "load_average": list(os.getloadavg())}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(RESULT_TAG + json.dumps(run_worker(json.loads(args.worker))), flush=True)
        return 0
    from tqdm import tqdm

    budget = args.memory_budget * GB if args.memory_budget else default_memory_budget(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    measure = ("torch.cuda.max_memory_allocated" if args.device == "cuda" else
               "peak RSS above the primed post-import baseline" if args.cpu_memory == "rss" else
               "torch CPU allocator peak of one step above its start")
    info = {"argv": sys.argv[1:] if argv is None else argv, "args": vars(args),
            "memory_budget_bytes": budget, "memory_measure": measure, **machine_info()}
    print(f"sizes {args.sizes}, methods {args.methods}, device {args.device}, memory budget "
          f"{_gb(budget)}, time budget {args.time_budget:.0f} s/run, memory = {measure}, "
          f"load average {info['load_average'][0]:.1f} on {info['cores']} cores")
    started = time.perf_counter()
    with tqdm(total=len(args.sizes) * len(args.methods), unit="run", desc="scale") as bar:
        bar.write(table([]))
        rows = sweep(args, budget, bar)
    info.update(wall_seconds=time.perf_counter() - started,
                load_average_end=list(os.getloadavg()), rows=rows)
    write_csv(rows, args.out / "scale.csv")
    (args.out / "scale.json").write_text(json.dumps(info, indent=1, default=str))
    if not args.no_plot:
        plot(rows, args.out / "scale.png")
    print("\n" + table(rows) + f"\n\n{info['wall_seconds']:.0f} s; load average at the end "
          f"{info['load_average_end'][0]:.1f}; wrote {args.out}/scale.csv, scale.json"
          + ("" if args.no_plot else ", scale.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
