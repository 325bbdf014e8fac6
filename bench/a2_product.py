"""The sparse square behind ``CSRGraph.augment_a2`` on CPU: scipy (what ``_csr.csr_square`` runs
there) against torch's CSR x CSR product (what it ran before, and still runs on other devices),
ROUND-ROBIN in one process, on the synthetic long-tail graphs of the scale study (self-loops
made unit, as augment_a2 squares them). Per graph size: the median (best) of ``--rounds``
rounds of ``--reps`` calls each, the ratio scipy / torch, and the RSS each kept after its calls
(torch 2.13's CPU CSR x CSR leaks its result: the reason for the switch).

    python bench/a2_product.py --sizes 1500 100000 --rounds 5

Run it on an idle machine (``bench/idle_window.sh``); the load average is printed before and
after.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
import warnings

import psutil
import torch

from hiertail_fast import CSRGraph, make_synthetic_graph
from hiertail_fast._argparse import positive
from hiertail_fast._csr import _scipy_sparse, csr_square


def _torch_square(g: CSRGraph, vals: torch.Tensor):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = torch.sparse_csr_tensor(g.indptr, g.indices, vals, (g.num_nodes, g.num_nodes))
        return m @ m


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--sizes", type=positive(int), nargs="+", default=[1500, 100_000])
    ap.add_argument("--rounds", type=positive(int), default=5)
    ap.add_argument("--reps", type=int, default=0, help="calls per round (0: by size)")
    args = ap.parse_args(argv)
    if min(args.sizes) < 12:    # the graph's degree 10 needs more nodes (a traceback before)
        ap.error(f"--sizes must be >= 12 (the graph's average degree is 10), got {args.sizes}")
    if _scipy_sparse() is None:
        raise SystemExit("a2_product: scipy is not installed")
    proc = psutil.Process()
    print(f"load average before {os.getloadavg()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print("| nodes | entries of M | torch CSR x CSR ms | scipy ms | scipy / torch | RSS kept MB "
          "torch / scipy |")
    print("|--:|--:|--:|--:|--:|--:|")
    for n in args.sizes:
        data = make_synthetic_graph(n, num_classes=70 if n >= 5000 else 10, avg_degree=10,
                                    seed=0, num_features=2)
        g = CSRGraph.from_edge_index(data.edge_index, num_nodes=n).remove_self_loops()
        g = g.with_self_loops(1.0)
        vals = g.weight_or_ones(torch.float32)
        reps = args.reps or (20 if n < 10_000 else 2)
        calls = {"torch": functools.partial(_torch_square, g, vals),
                 "scipy": functools.partial(csr_square, g.indptr, g.indices, vals, n)}
        times = {k: [] for k in calls}
        kept = {k: 0.0 for k in calls}
        for f in calls.values():
            f()                                            # warm-up
        for _ in range(args.rounds):
            for name, f in calls.items():                  # round-robin
                rss = proc.memory_info().rss
                t0 = time.perf_counter()
                for _ in range(reps):
                    f()
                times[name].append((time.perf_counter() - t0) / reps * 1e3)
                kept[name] += (proc.memory_info().rss - rss) / 2**20
        t, s = (statistics.median(times[k]) for k in ("torch", "scipy"))
        print(f"| {n:,} | {g.num_edges:,} | {t:.2f} ({min(times['torch']):.2f}) | "
              f"{s:.2f} ({min(times['scipy']):.2f}) | {s / t:.2f} | "
              f"{kept['torch']:.0f} / {kept['scipy']:.0f} |")
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
