"""GCN propagation: our providers against the peers, timed ROUND-ROBIN.

pytest-benchmark times one provider after another; on a shared or virtual machine the speed
drifts between those windows by more than the differences being measured (the 2-core CPU
here: torch.sparse.mm at 100k×64 measured anywhere from 47 to 78 ms median in back-to-back
runs). Here every round calls each provider once, in turn, so drift hits all of them alike,
and the table reports median and min per provider plus each one's median ratio to ``torch``.

    python bench/propagation_interleaved.py --nodes 100000 1000000 --dims 64 128 --rounds 15

Graphs, providers and the timed step are those of bench/test_propagation.py (same graph
generator, graph container built once outside the timing, warm-up call first). JSON to
bench/results/propagation_interleaved.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import test_propagation as tp  # noqa: E402  (graphs and providers shared with the benchmarks)
from conftest import device_name  # noqa: E402


def time_round_robin(steps: dict, rounds: int) -> dict[str, list[float]]:
    for step in steps.values():
        step()  # warm-up: caches on the graph, Triton compilation
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return times


def make_step(fn, x, grad_out, mode):
    def step():
        if mode == "fwd":
            with torch.no_grad():
                fn(x)
        else:
            x.grad = None
            fn(x).backward(grad_out)
        if tp.DEVICE == "cuda":
            torch.cuda.synchronize()
    return step


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100_000])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"],
                        choices=["fwd", "fwd+bwd"])
    parser.add_argument("--providers", nargs="+",
                        default=[p for p in tp.PROVIDERS if p != "reference"])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "propagation_interleaved.json")
    args = parser.parse_args(argv)
    unknown = set(args.providers) - set(tp.PROVIDERS)
    if unknown:
        parser.error(f"unknown or unavailable providers {sorted(unknown)}; have {tp.PROVIDERS}")

    records = []
    print(f"device: {device_name()}, torch threads {torch.get_num_threads()}, rounds {args.rounds}")
    for n in args.nodes:
        ei, graph = tp._graph(n)
        for d in args.dims:
            gen = torch.Generator().manual_seed(1)
            x = torch.randn(n, d, generator=gen).to(tp.DEVICE)
            grad_out = torch.randn(n, d, generator=gen).to(tp.DEVICE)
            for mode in args.modes:
                xm = x.detach().requires_grad_(mode == "fwd+bwd")
                steps = {p: make_step(tp._propagator(p, ei, graph), xm, grad_out, mode)
                         for p in args.providers}
                times = time_round_robin(steps, args.rounds)
                base = statistics.median(times["torch"]) if "torch" in times else None
                print(f"\nn={n} d={d} {mode} (nnz {graph.num_edges})")
                for p, ts in times.items():
                    med = statistics.median(ts)
                    ratio = f"{med / base:5.2f}x torch" if base else ""
                    print(f"  {p:18s} median {med * 1e3:9.1f} ms   min {min(ts) * 1e3:9.1f} ms"
                          f"   {ratio}")
                    records.append(dict(n=n, d=d, mode=mode, provider=p, nnz=graph.num_edges,
                                        median_s=med, min_s=min(ts), times_s=ts))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(device=device_name(), threads=torch.get_num_threads(),
                                        rounds=args.rounds, records=records), indent=1))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
