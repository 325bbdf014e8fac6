"""GCN propagation on a graph with hubs: this checkout (long rows summed in pieces,
``_csr.split_long_rows``) against another git revision, ROUND-ROBIN in one process, with each
side's error on the hubs' rows against float64.

The graph: ``--nodes`` nodes of a few random in-edges each plus ``--hubs`` hubs, hub k with
``--hub-degree`` / 2^k in-edges from random sources (a star's worth of one equal term is the
worst case of a running float32 sum; here the terms are random positive features). Each step
is one forward + backward of ``gcn_propagate`` (backend torch, the cached operator) on x
[nodes, d] >= 0 (as after a ReLU).

    python bench/hub_rows.py --rev 12e63cd --nodes 200000 --hub-degree 1000000 --rounds 7

Run it on an idle machine (``bench/idle_window.sh``); the load average is printed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from version_ab import revision_package  # noqa: E402

import hiertail_fast  # noqa: E402
from hiertail_fast._argparse import positive  # noqa: E402


def hub_graph(nodes: int, hubs: int, hub_degree: int, per_node: int, seed: int):
    """edge_index [2, E] (row 0 source, row 1 target): ``per_node`` random in-edges a node,
    and hub k (node k) with hub_degree / 2^k in-edges from random sources."""
    gen = torch.Generator().manual_seed(seed)
    dst = torch.arange(nodes).repeat_interleave(per_node)
    src = torch.randint(0, nodes, (dst.numel(),), generator=gen)
    parts_src, parts_dst = [src], [dst]
    for k in range(hubs):
        m = max(1, hub_degree >> k)
        parts_src.append(torch.randint(0, nodes, (m,), generator=gen))
        parts_dst.append(torch.full((m,), k))
    return torch.stack([torch.cat(parts_src), torch.cat(parts_dst)])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--rev", required=True, help="the git revision to compare with (old)")
    p.add_argument("--nodes", type=positive(int), default=200_000)
    p.add_argument("--hubs", type=int, default=4)
    p.add_argument("--hub-degree", type=positive(int), default=1_000_000)
    p.add_argument("--per-node", type=int, default=5)
    p.add_argument("--d", type=positive(int), default=64)
    p.add_argument("--rounds", type=positive(int), default=7, help="rounds (the first dropped)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.rounds < 2 or args.nodes < args.hubs or args.hubs < 1 or args.per_node < 0:
        # (--hubs 0 was allowed, then failed on an empty max: a traceback)
        p.error("--rounds >= 2, --nodes >= --hubs >= 1, --per-node >= 0")
    ei = hub_graph(args.nodes, args.hubs, args.hub_degree, args.per_node, args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    x0 = torch.rand(args.nodes, args.d, generator=gen)            # >= 0, as after a ReLU
    cot = torch.rand(args.nodes, args.d, generator=gen)
    # float64 truth of the hubs' rows (forward) and of the hubs' x gradient (backward: their
    # out-edges are random, so the long rows of the backward are the hubs' in-edges' sources)
    g64 = hiertail_fast.CSRGraph.from_edge_index(ei, num_nodes=args.nodes, dedupe=False)
    x64 = x0.double().requires_grad_()
    out64 = hiertail_fast.gcn_propagate(x64, g64, backend="torch")
    out64.backward(cot.double())
    out64 = out64.detach()
    hubs = torch.arange(args.hubs)
    header = (f"{args.nodes:,} nodes, {ei.shape[1]:,} entries, hubs of {args.hub_degree:,} / "
              f"2^k in-edges (k < {args.hubs}), d {args.d}, {args.rounds} rounds (first dropped)")
    with revision_package(args.rev, header) as old_pkg:
        steps, errors = {}, {}
        for name, pkg in (("old", old_pkg), ("new", hiertail_fast)):
            graph = pkg.CSRGraph.from_edge_index(ei, num_nodes=args.nodes, dedupe=False)

            def step(pkg=pkg, graph=graph):
                x = x0.clone().requires_grad_()
                out = pkg.gcn_propagate(x, graph, backend="torch")
                out.backward(cot)
                return out.detach(), x.grad
            out, grad = step()
            errors[name] = (
                float(((out[hubs].double() - out64[hubs]).abs().max()
                       / out64[hubs].abs().max())),
                float(((grad.double() - x64.grad).abs().max() / x64.grad.abs().max())))
            steps[name] = step
        times: dict[str, list[float]] = {name: [] for name in steps}
        for r in range(args.rounds):
            for name, step in steps.items():
                start = time.perf_counter()
                step()
                if r:
                    times[name].append(time.perf_counter() - start)
        med = {k: statistics.median(v) for k, v in times.items()}
        for name in steps:
            print(f"{name}: fwd+bwd {med[name]:.4f} s (best {min(times[name]):.4f})  hub rows' "
                  f"max rel error {errors[name][0]:.1e}, x grad {errors[name][1]:.1e}")
        print(f"new/old {med['new'] / med['old']:.3f}")
    print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
