"""Count the torch operator calls (aten dispatches) of one loss forward + backward, and where
in the library they come from: the per-call overhead of the CPU engine is paid per dispatch,
so this is the count behind README's "small torch calls per loss". A count, not a timing.

    python bench/dispatch_count.py --levels 3 --variant official --top 15
    python bench/dispatch_count.py --n 20000 --levels 1 --as-cuda      # CUDA's engine paths

``--as-cuda`` counts, on this CPU, the calls the torch engine makes for CUDA tensors, where
every call is a kernel launch: no C kernels, no symmetric engine, CUDA's block budget with no
row cap, the whole-band positives (``HIERTAIL_POSITIVES``; ``--positives slices`` for the
per-group plan CUDA ran before).
"""
from __future__ import annotations

import argparse
import collections
import sys
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
from loss_grid import REGIMES, loss_step, make_case  # noqa: E402


class _Counter(TorchDispatchMode):
    """Counts every dispatched operator by (name, the innermost library source line)."""

    def __init__(self):
        super().__init__()
        self.calls: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        frames = [f for f in traceback.extract_stack() if "hiertail_fast" in f.filename]
        where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "-"
        self.calls[(func.overloadpacket.__name__, where)] += 1
        return func(*args, **(kwargs or {}))


def count(n: int, d: int, levels: int, variant: str, regime: str, tau: float, backend: str):
    z, ys, ps = make_case(regime, n, d, levels)
    step = loss_step(backend, z, ys, ps, tau, variant)
    step()                                            # warm-up: caches, lazy imports
    counter = _Counter()
    with counter:
        step()
    return counter.calls


def _as_cuda(positives: str) -> None:
    """This process's engine configured as for CUDA tensors (before the first loss call)."""
    import os

    import hiertail_fast.ops._lse_torch as lse_torch

    os.environ.update({"HIERTAIL_NATIVE": "0", "HIERTAIL_SYMMETRIC": "0",
                       "HIERTAIL_POSITIVES": positives,
                       "HIERTAIL_CPU_BLOCK_BYTES": str(lse_torch.CUDA_BLOCK_BYTES)})
    lse_torch.MAX_BLOCK_ROWS = 1 << 62           # CUDA: the byte budget alone bounds a block


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=6000)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--levels", type=int, choices=[1, 3], default=3)
    parser.add_argument("--variant", choices=["exact", "official", "both"], default="both")
    parser.add_argument("--regime", choices=REGIMES, default="relu")
    parser.add_argument("--tau", type=float, default=0.1)
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--top", type=int, default=0, help="also list the N busiest call sites")
    parser.add_argument("--as-cuda", action="store_true",
                        help="the torch engine's CUDA configuration, counted on the CPU")
    parser.add_argument("--positives", choices=["band", "slices"], default="band",
                        help="--as-cuda: the official positives' path (default band)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.as_cuda:
        _as_cuda(args.positives)
    variants = ["exact", "official"] if args.variant == "both" else [args.variant]
    for v in variants:
        calls = count(args.n, args.d, args.levels, v, args.regime, args.tau, args.backend)
        print(f"N={args.n} d={args.d} levels={args.levels} {v} {args.regime} tau={args.tau:g} "
              f"backend={args.backend}: {sum(calls.values())} operator calls per loss")
        for (name, where), k in calls.most_common(args.top):
            print(f"  {k:6d}  {name:24s} {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
