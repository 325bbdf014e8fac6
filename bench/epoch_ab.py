"""In-process A/B of a whole HierTail training epoch against another git revision, ROUND-ROBIN
(defaults: bench/scale.py's graph and model).

``version_ab.py`` times the loss alone; a change to the code around it (input checks, caches,
the precision adapter every public op passes through, the models) shows only in the epoch.
The package at ``--rev`` is unpacked beside this checkout's (``version_ab.unpack_revision``),
both build the same model (same seed, same synthetic graph, ``prepare_graph`` of each package)
and their epochs (zero_grad, forward, loss, backward, Adam step) run in turn, round by round,
so the machine's drift hits them alike. Before timing, the two models' first-epoch losses are
compared: a speed-up that changed the numbers shows.

    python bench/epoch_ab.py --rev 0d0fdf7 --nodes 1000 100000 --rounds 7

Run it on an idle machine (``bench/idle_window.sh``); the load average is printed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from version_ab import revision_package  # noqa: E402

import hiertail_fast  # noqa: E402
from hiertail_fast._argparse import positive  # noqa: E402


def epoch_step(pkg, nodes: int, args):
    """The epoch function (it returns the loss) of HierTail from package ``pkg``, on a
    synthetic graph."""
    from importlib import import_module

    synthetic = import_module(f"{pkg.__name__}.data.synthetic")
    splits = import_module(f"{pkg.__name__}.data.splits")
    hiertail = import_module(f"{pkg.__name__}.nn.hiertail")
    with warnings.catch_warnings():       # small graphs fall short of the degree asked for
        warnings.simplefilter("ignore", UserWarning)
        data = synthetic.make_synthetic_graph(nodes, args.classes, avg_degree=args.avg_degree,
                                              num_features=args.features, seed=args.seed)
    train_idx = splits.natural_split(data.y, args.seed)[0]
    graph = hiertail.prepare_graph(data.edge_index, nodes)
    torch.manual_seed(args.seed)
    config = hiertail.HierTailConfig.named(args.config, hidden=args.hidden)
    model = hiertail.HierTail(data.x.shape[1], int(data.num_classes), config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def epoch() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = model.loss(model(data.x, graph), data.y, train_idx).total
        loss.backward()
        optimizer.step()
        return loss.item()

    return epoch


def add_epoch_arguments(p: argparse.ArgumentParser) -> None:
    """The epoch's graph and model (bench/scale.py's); shared with ``heap_ab.py``."""
    p.add_argument("--config", choices=("paper", "official"), default="paper")
    p.add_argument("--classes", type=positive(int), default=70)
    p.add_argument("--avg-degree", type=positive(float), default=10.0)
    p.add_argument("--features", type=positive(int), default=128)
    p.add_argument("--hidden", type=positive(int), default=128)
    p.add_argument("--seed", type=int, default=0)


def epoch_defaults(**given) -> argparse.Namespace:
    """``add_epoch_arguments``' defaults, with ``given`` values in their place."""
    p = argparse.ArgumentParser()
    add_epoch_arguments(p)
    return argparse.Namespace(**{**vars(p.parse_args([])), **given})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--rev", required=True, help="the git revision to compare with (old)")
    p.add_argument("--nodes", type=positive(int), nargs="+", default=[1000, 100_000])
    p.add_argument("--rounds", type=positive(int), default=7,
                   help="rounds per size (the first dropped)")
    add_epoch_arguments(p)
    args = p.parse_args(argv)
    if args.rounds < 2 or min(args.nodes) < 4 * args.classes:
        p.error("--rounds must be at least 2 and every size at least 4 x --classes")
    if args.avg_degree >= min(args.nodes) - 1:     # (the generator's traceback before)
        p.error(f"--avg-degree must be below the smallest size - 1, got {args.avg_degree:g} "
                f"for {min(args.nodes)} nodes")
    header = (f"HierTail {args.config}, {args.classes} classes, degree {args.avg_degree:g}, "
              f"features {args.features}, hidden {args.hidden}, {args.rounds} rounds (first "
              "dropped)")
    with revision_package(args.rev, header) as old_pkg:
        for nodes in args.nodes:
            steps = {"old": epoch_step(old_pkg, nodes, args),
                     "new": epoch_step(hiertail_fast, nodes, args)}
            times: dict[str, list[float]] = {name: [] for name in steps}
            losses: dict[str, list[float]] = {name: [] for name in steps}
            for r in range(args.rounds):
                for name, step in steps.items():
                    start = time.perf_counter()
                    losses[name].append(step())
                    if r:
                        times[name].append(time.perf_counter() - start)
            med = {k: statistics.median(v) for k, v in times.items()}
            diff = max(abs(a - b) / max(abs(a), 1e-30)
                       for a, b in zip(losses["old"], losses["new"], strict=True))
            print(f"{nodes:>9,d} nodes  old {med['old']:.4f} s  new {med['new']:.4f} s  "
                  f"new/old {med['new'] / med['old']:.3f}  (best {min(times['old']):.4f} / "
                  f"{min(times['new']):.4f} s)  max loss rel diff {diff:.1e}", flush=True)
    print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
