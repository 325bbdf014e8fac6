"""Per-call cost of the two ways an op's autograd Function can be applied, ROUND-ROBIN in one
process: ``Function.apply`` of the setup_context-style class (what torch.func needs; torch binds
its arguments with ``inspect.signature`` on every call) against ``Function.run`` (the ctx-style
twin of ``ops/_autograd.eager_twin``, what eager calls take). Small inputs, so the per-call cost
is what shows; the whole public op is timed too, for scale.

    python bench/apply_overhead.py [--rounds 7] [--number 2000]

Run it on an idle machine (``bench/idle_window.sh``); the load average is printed.
"""
from __future__ import annotations

import argparse
import os
import timeit

import torch

from hiertail_fast import CSRGraph, gcn_propagate
from hiertail_fast._argparse import positive
from hiertail_fast.ops.gcn_propagate import GCNPropagateFunction


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=positive(int), default=7)
    p.add_argument("--number", type=positive(int), default=2000, help="calls per timing")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 8, generator=gen, requires_grad=True)
    ei = torch.randint(0, 50, (2, 200), generator=gen)
    graph = CSRGraph.from_edge_index(ei, num_nodes=50)
    dinv, loop = graph.gcn_deg_inv_sqrt(True, True, torch.float32)
    key = (True, True, torch.float32)
    calls = {
        "Function.apply (setup_context style)":
            lambda: GCNPropagateFunction.apply(x, None, dinv, loop, graph, key, "torch"),
        "Function.run (ctx-style twin)":
            lambda: GCNPropagateFunction.run(x, None, dinv, loop, graph, key, "torch"),
        "gcn_propagate (the public op)": lambda: gcn_propagate(x, graph),
    }
    for f in calls.values():
        f()
    times: dict = {name: [] for name in calls}
    for _ in range(args.rounds):                  # round-robin: drift hits every variant
        for name, f in calls.items():
            times[name].append(timeit.timeit(f, number=args.number) / args.number)
    print(f"load average {os.getloadavg()}; torch {torch.__version__}, 1 thread; "
          f"median of {args.rounds} rounds x {args.number} calls, 50 nodes x 8 features")
    base = sorted(times["Function.run (ctx-style twin)"])[args.rounds // 2]
    for name, ts in times.items():
        med = sorted(ts)[args.rounds // 2]
        print(f"{name:40s} {med * 1e6:8.1f} us  ({med / base:.2f}x the twin)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
