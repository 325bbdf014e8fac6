"""A/B of glibc's heap padding while the CPU loss runs on oneDNN (``ops/_roomy_heap.py``):
``HIERTAIL_CPU_HEAP=keep`` (glibc as it was) against ``auto`` (padded), each run in a FRESH
process, the two alternated round by round (keep, auto, auto, keep, ...).

Why fresh processes: the heap's state is the process's, and what ``mallopt`` set outlives the
call (the mmap threshold, glibc's dynamic threshold off), so two settings timed in one process
would each inherit the other's heap. Each child builds the workload, runs it ``--calls`` times
and prints seconds, minor page faults and peak RSS per call; the first call of each child is
a warm-up (the C kernels' load, oneDNN's kernels) and is dropped from the medians.

    loss    the exact balanced contrastive loss, forward + backward, N normalised rows, d 128,
            70 classes (the symmetric engine's case: bench/cpu_gemm.py --loss)
    epoch   a HierTail training epoch on bench/scale.py's synthetic graph (bench/epoch_ab.py's
            epoch_step, this checkout's package)

    python bench/heap_ab.py --workload epoch --nodes 100000 --rounds 3 --calls 3

Run it on an idle machine (``bench/idle_window.sh``); the load average is printed before and
after.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).parent))
from hiertail_fast._argparse import positive  # noqa: E402
from hiertail_fast.ops import _roomy_heap  # noqa: E402

SETTINGS = ("keep", "auto")


def _workload(kind: str, nodes: int, seed: int):
    """A no-argument callable running one call of the workload."""
    import torch

    if kind == "loss":
        from hiertail_fast import balanced_contrastive_loss

        gen = torch.Generator().manual_seed(seed)
        z0 = torch.nn.functional.normalize(torch.randn(nodes, 128, generator=gen), dim=1)
        y = torch.randint(0, 70, (nodes,), generator=gen)

        def call():
            z = z0.clone().requires_grad_()
            balanced_contrastive_loss(z, y, temperature=0.1).backward()
        return call
    from epoch_ab import epoch_defaults, epoch_step

    import hiertail_fast

    return epoch_step(hiertail_fast, nodes, epoch_defaults(seed=seed))


def child(kind: str, nodes: int, calls: int, seed: int) -> int:
    """Runs the workload ``calls`` times in this process; one JSON line per call."""
    call = _workload(kind, nodes, seed)
    for _ in range(calls):
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        call()
        seconds = time.perf_counter() - start
        usage = resource.getrusage(resource.RUSAGE_SELF)
        print(json.dumps({"seconds": seconds, "faults": usage.ru_minflt - faults,
                          "maxrss_mb": usage.ru_maxrss / 1024, "heap": _roomy_heap.choice()}),
              flush=True)
    return 0


def run_child(setting: str, args) -> list[dict]:
    env = dict(os.environ, **{_roomy_heap.ENV_VAR: setting})
    cmd = [sys.executable, __file__, "--child", "--workload", args.workload,
           "--nodes", str(args.nodes), "--calls", str(args.calls), "--seed", str(args.seed)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the {setting} child failed:\n{out.stderr[-3000:]}")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if len(rows) != args.calls or any(row["heap"] != setting for row in rows):
        raise SystemExit(f"the {setting} child ran {[row['heap'] for row in rows]}")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--workload", choices=("loss", "epoch"), default="loss")
    p.add_argument("--nodes", type=positive(int), default=100_000)
    p.add_argument("--rounds", type=positive(int), default=2,
                   help="children per setting, alternated")
    p.add_argument("--calls", type=positive(int), default=3,
                   help="calls per child (the first dropped)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.calls < 2:
        p.error("--calls must be at least 2 (each child's first is dropped)")
    if args.workload == "epoch" and args.nodes < 280:
        p.error("--workload epoch needs at least 280 nodes (4 x 70 classes)")
    if args.child:
        return child(args.workload, args.nodes, args.calls, args.seed)
    if (why := _roomy_heap.why_not()) is not None and why != f"{_roomy_heap.ENV_VAR}=keep":
        print(f"note: the heap is left alone here ({why}): both settings run the same code")
    print(f"load average {os.getloadavg()}, workload {args.workload}, N {args.nodes}, "
          f"{args.rounds} rounds x {args.calls} calls (first of each child dropped)", flush=True)
    kept: dict[str, list[dict]] = {s: [] for s in SETTINGS}
    for r in range(args.rounds):
        order = SETTINGS if r % 2 == 0 else SETTINGS[::-1]
        for setting in order:
            rows = run_child(setting, args)
            for i, row in enumerate(rows):
                print(f"round {r} {setting:4s} call {i}  {row['seconds']:8.3f} s  "
                      f"{row['faults']:>10,d} minor faults  peak RSS {row['maxrss_mb']:,.0f} MB",
                      flush=True)
            kept[setting] += rows[1:]
    med = {s: statistics.median(r["seconds"] for r in kept[s]) for s in SETTINGS}
    faults = {s: statistics.median(r["faults"] for r in kept[s]) for s in SETTINGS}
    peak = {s: max(r["maxrss_mb"] for r in kept[s]) for s in SETTINGS}
    for s in SETTINGS:
        print(f"{s:4s} median {med[s]:.3f} s  median faults {faults[s]:,.0f}  "
              f"peak RSS {peak[s]:,.0f} MB")
    print(f"auto/keep {med['auto'] / med['keep']:.3f}")
    print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
