"""Our providers against the peers, timed ROUND-ROBIN (propagation, pooling, prototypes).

pytest-benchmark times one provider after another; on a shared or virtual machine the speed
drifts between those windows by more than the differences being measured (the 2-core CPU
here: torch.sparse.mm at 100k×64 measured anywhere from 47 to 78 ms median in back-to-back
runs). Here every round calls each provider once, in turn, so drift hits all of them alike,
and the table reports median and min per provider plus each one's median ratio to ``torch``.

    python bench/interleaved.py propagation --nodes 100000 1000000 --dims 64 128 --rounds 15
    python bench/interleaved.py pooling --nodes 100000 1000000 --dims 64 128 --rounds 7
    python bench/interleaved.py prototype --nodes 100000 --dims 128 --prototypes 282 --rounds 7

Graphs, providers and the timed steps are those of bench/test_propagation.py and
bench/test_pooling.py (same graph generator, graph containers built once outside the timing,
one warm-up call first). JSON to bench/results/interleaved_<op>.json (or ``--out``).

Propagation records also carry the achieved bandwidth under the byte model of
bench/_roofline.py (per entry one int32 index + one feature row, per row one pointer + the
output row; fwd+bwd twice that) and, on a CUDA card of known peak, its fraction of the peak.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
try:            # (steps shared with the pytest-benchmark suites, which import pytest)
    import test_pooling as tpool  # noqa: E402
    import test_propagation as tprop  # noqa: E402
except ImportError as exc:
    if getattr(exc, "name", None) != "pytest":
        raise
    raise SystemExit("bench/interleaved.py times the pytest-benchmark suites' steps: it needs "
                     "the test extra (pip install -e \".[test]\")") from None
from _device import DEVICE, device_name  # noqa: E402
from _results import check_targets, write_result  # noqa: E402
from _roofline import bandwidth_figures  # noqa: E402

from hiertail_fast._argparse import path_arg, positive

OPS = {
    "propagation": dict(providers=[p for p in tprop.PROVIDERS if p != "reference"],
                        modes=["fwd", "fwd+bwd"]),
    "pooling": dict(providers=[p for p in tpool.PROVIDERS if p != "reference" and (
        p != "pyg" or importlib.util.find_spec("torch_geometric") is not None)],
                    modes=["fwd+bwd"]),
    # --dims is the feature width d, --prototypes the number m of prototypes
    "prototype": dict(providers=["torch"] + (["triton"] if DEVICE == "cuda" else [
        "torch_topk"]) + (
        ["sklearn"] if importlib.util.find_spec("sklearn") is not None else []),
                      modes=["fwd"]),
}


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


def propagation_step(provider: str, n: int, d: int, mode: str):
    return tprop.make_propagation_step(provider, n, d, mode)


def pooling_step(provider: str, n: int, d: int, mode: str):
    return tpool.make_pool_step(provider, n, d)


def prototype_step(provider: str, n: int, d: int, mode: str, m: int):
    return tpool.make_prototype_step(provider, n, m, d), 0


def _bandwidth_text(bw: dict) -> str:
    if not bw:
        return ""
    peak = "peak unknown" if bw["peak_fraction"] is None else \
        f"{100 * bw['peak_fraction']:.0f}% of peak"
    return f"   {bw['achieved_GBps']:8.1f} GB/s ({peak})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("op", choices=sorted(OPS))
    parser.add_argument("--nodes", type=positive(int), nargs="+", default=[100_000])
    parser.add_argument("--dims", type=positive(int), nargs="+", default=[64, 128])
    parser.add_argument("--modes", nargs="+", choices=["fwd", "fwd+bwd"])
    parser.add_argument("--providers", nargs="+")
    parser.add_argument("--prototypes", type=positive(int), default=282, help="m (prototype op)")
    parser.add_argument("--rounds", type=positive(int), default=15)
    parser.add_argument("--out", type=path_arg)
    args = parser.parse_args(argv)
    spec = OPS[args.op]
    providers = args.providers or spec["providers"]
    modes = args.modes or spec["modes"]
    unknown = set(providers) - set(spec["providers"])
    if unknown:
        parser.error(f"unknown or unavailable providers {sorted(unknown)} for {args.op}; "
                     f"have {spec['providers']}")
    if set(modes) - set(spec["modes"]):
        parser.error(f"{args.op} is timed in modes {spec['modes']}")
    make = {"propagation": propagation_step, "pooling": pooling_step,
            "prototype": functools.partial(prototype_step, m=args.prototypes)}[args.op]
    out = args.out or Path(__file__).parent / "results" / f"interleaved_{args.op}.json"
    if args.op != "prototype" and min(args.nodes) < 70:   # (the generator's traceback before)
        parser.error(f"--nodes must be >= 70 for {args.op} (its benchmark graphs have 70 "
                     f"classes), got {min(args.nodes)}")
    check_targets(parser, "--out", out)      # before minutes of timing, not after

    records = []
    print(f"{args.op} on {device_name()}, rounds {args.rounds}")
    for n in args.nodes:
        for d in args.dims:
            for mode in modes:
                steps, num_edges = {}, 0
                for p in providers:
                    steps[p], num_edges = make(p, n, d, mode)
                times = time_round_robin(steps, args.rounds)
                base = statistics.median(times["torch"]) if "torch" in times else None
                what = f"m={args.prototypes}" if args.op == "prototype" else f"edges {num_edges}"
                print(f"\nn={n} d={d} {mode} ({what})")
                for p, ts in times.items():
                    med = statistics.median(ts)
                    ratio = f"{med / base:5.2f}x torch" if base else ""
                    bw = (bandwidth_figures(n, num_edges, d, med, mode, device_name()
                                            if DEVICE == "cuda" else None)
                          if args.op == "propagation" else {})
                    print(f"  {p:18s} median {med * 1e3:9.1f} ms   min {min(ts) * 1e3:9.1f} ms"
                          f"   {ratio}{_bandwidth_text(bw)}", flush=True)
                    records.append(dict(n=n, d=d, mode=mode, provider=p, edges=num_edges,
                                        prototypes=args.prototypes if args.op == "prototype"
                                        else None,
                                        median_s=med, min_s=min(ts), times_s=ts, **bw))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out, json.dumps(dict(op=args.op, device=device_name(), rounds=args.rounds,
                                           torch=torch.__version__, records=records), indent=1))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
