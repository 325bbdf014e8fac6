"""In-process A/B of the torch loss engine's alternative code paths, timed ROUND-ROBIN.

This VM's speed moves by up to +-25 % between runs (the engines stream [256, N] blocks through a
shared L3), so a before/after comparison from two separate runs is not evidence; this script
alternates the two paths round by round in one process and reports medians. Each switch picks
between a path the library takes and one it keeps (or reproduces) for comparison:

    fold        one-level official variant: key weights folded into the GEMM operands (new)
                vs the unfolded [B, N] gradient matrix (the path for weights that vary per group)
    weights     several levels: sum_l a_l w_l^T by broadcast + addcmul passes (new) vs the K = L
                GEMM ``torch.mm(a.t(), w)`` it replaced
    rest        level-specific positives: one vectorised lookup per block for all levels (new)
                vs the general per-level mask path (kept for other key layouts)
    all         the three together (old = all three old paths: the engine as it was before them)

    python bench/engine_ab.py --switch weights --levels 3 --variant official --rounds 15
    python bench/engine_ab.py --switch fold --levels 1 --variant official --regimes relu randn

Run it on an idle machine (record the load average; it is printed).
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
from loss_grid import REGIMES, floor_step, loss_step, make_case  # noqa: E402

import hiertail_fast.ops._lse_torch as lse_mod  # noqa: E402
import hiertail_fast.ops._positive_blocks as blocks_mod  # noqa: E402


def _mm_level_weights(a, w, out):
    return torch.mm(a.t(), w, out=out)


def _switches():
    real_weights = lse_mod.level_weights
    real_const = blocks_mod._constant_per_group
    real_rest = blocks_mod.BlockPositives._rest_columns

    def set_weights(new: bool):
        lse_mod.level_weights = real_weights if new else _mm_level_weights

    def set_fold(new: bool):
        blocks_mod._constant_per_group = real_const if new else (lambda *a: False)

    def set_rest(new: bool):
        blocks_mod.BlockPositives._rest_columns = real_rest if new else (lambda self, r: None)

    def set_all(new: bool):
        for setter in (set_weights, set_fold, set_rest):
            setter(new)

    return {"weights": set_weights, "fold": set_fold, "rest": set_rest, "all": set_all}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--switch", choices=("fold", "weights", "rest", "all"), required=True)
    p.add_argument("--n", type=int, default=6000)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--levels", type=int, choices=(1, 3), default=3)
    p.add_argument("--variant", choices=("exact", "official"), default="official")
    p.add_argument("--tau", type=float, default=0.1)
    p.add_argument("--regimes", nargs="+", choices=REGIMES, default=["relu", "randn"])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int)
    args = p.parse_args(argv)
    if args.n < 1 or args.d < 1 or args.rounds < 2:
        p.error("--n and --d must be positive and --rounds at least 2")
    if args.threads:
        torch.set_num_threads(args.threads)
    set_path = _switches()[args.switch]
    print(f"load average {os.getloadavg()}, {torch.get_num_threads()} threads, "
          f"switch {args.switch}, N {args.n}, d {args.d}, L {args.levels}, {args.variant}, "
          f"tau {args.tau:g}, {args.rounds} rounds (first dropped)")
    try:
        for regime in args.regimes:
            z, ys, ps = make_case(regime, args.n, args.d, args.levels)
            step = loss_step("torch", z, ys, ps, args.tau, args.variant)
            anchor = floor_step(z, ps, with_exp=True)
            times = {"old": [], "new": [], "floor+exp": []}
            for r in range(args.rounds):
                for name in times:
                    if name != "floor+exp":
                        set_path(name == "new")
                    fn = anchor if name == "floor+exp" else step
                    start = time.perf_counter()
                    fn()
                    if r:                                   # the first round warms up
                        times[name].append(time.perf_counter() - start)
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"{regime:10s} old {med['old']:.4f} s  new {med['new']:.4f} s  "
                  f"floor+exp {med['floor+exp']:.4f} s  new/old {med['new'] / med['old']:.3f}",
                  flush=True)
    finally:
        set_path(True)
    print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
