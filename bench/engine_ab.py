"""In-process A/B of the torch loss engine's alternative code paths, timed ROUND-ROBIN.

This VM's speed moves by up to +-25 % between runs (the engines stream [256, N] blocks through a
shared L3), so a before/after comparison from two separate runs is not evidence; this script
alternates the two paths round by round in one process and reports medians. Each switch picks
between a path the library takes and one it keeps (or reproduces) for comparison:

    fold        one-level official variant: key weights folded into the GEMM operands (new)
                vs the unfolded [B, N] gradient matrix (the path for weights that vary per group)
    weights     several levels: sum_l a_l w_l^T by broadcast + addcmul passes (new) vs the K = L
                GEMM ``torch.mm(a.t(), w)`` it replaced
    rest        level-specific positives, one per group: their logits gathered per block and
                the rest computed once after the pass for all levels (new) vs the general
                per-level mask path of every block (kept for other key layouts)
    all         the three together (old = all three old paths: the engine as it was before them)
    native      official positives through the fused C kernel (``_positive_blocks.c``, new)
                vs the torch path it replaces where no C compiler is found
    blockexp    every block's row max / exp / level sums in one C pass on torch's OpenMP
                threads (``_block_exp.c``, new) vs the six torch passes it replaces
    posthreads  the positives kernel's rows on torch's OpenMP threads for blocks with at least
                PARALLEL_MIN_ENTRIES entries (new) vs one thread per call
    gemm        the CPU engines' GEMMs on oneDNN (``HIERTAIL_CPU_GEMM=onednn``, new) vs
                torch.mm on torch's BLAS (``blas``, MKL in the x86 wheels): --levels 1 at the
                sizes the symmetric engine serves (>= 512 rows), --levels 3 the row-block
                engine's (``ops/_block_gemms.py``: oneDNN pieces from 256 keys)

    python bench/engine_ab.py --switch weights --levels 3 --variant official --rounds 15
    python bench/engine_ab.py --switch fold --levels 1 --variant official --regimes relu randn
    python bench/engine_ab.py --switch native --levels 3 --exact     (+ the exact variant's time)
    python bench/engine_ab.py --switch gemm --levels 1 --variant exact --n 20000 --d 128 \
        --regimes normalised --rounds 4
    python bench/engine_ab.py --switch gemm --levels 3 --variant official --n 30000 --d 128 \
        --regimes normalised --rounds 5

A change that leaves no old path to switch to is measured against the package at an earlier git
revision, with that revision's own C kernels: ``bench/version_ab.py``.

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
import loss_grid  # noqa: E402
from _gpu_checks import environment  # noqa: E402
from loss_grid import REGIMES, floor_step, loss_step, make_case  # noqa: E402

import hiertail_fast.ops._block_exp as block_mod  # noqa: E402
import hiertail_fast.ops._lse_torch as lse_mod  # noqa: E402
import hiertail_fast.ops._onednn_gemm as gemm_mod  # noqa: E402
import hiertail_fast.ops._positive_blocks as blocks_mod  # noqa: E402
import hiertail_fast.ops._positive_keys as keys_mod  # noqa: E402
from hiertail_fast._argparse import positive, temperature_arg  # noqa: E402


def _mm_level_weights(a, w, out):
    return torch.mm(a.t(), w, out=out)


def _switches():
    real_weights = lse_mod.level_weights
    real_const = keys_mod.constant_per_group
    real_rest = blocks_mod.BlockPositives._rest_columns

    def set_weights(new: bool):
        lse_mod.level_weights = real_weights if new else _mm_level_weights

    def set_fold(new: bool):
        keys_mod.constant_per_group = real_const if new else (
            lambda values, *a: torch.zeros((), dtype=torch.bool, device=values.device))

    def set_rest(new: bool):
        blocks_mod.BlockPositives._rest_columns = real_rest if new else (lambda self, r: None)

    def set_all(new: bool):
        for setter in (set_weights, set_fold, set_rest):
            setter(new)

    real_native = blocks_mod.native_kernel

    def set_native(new: bool):
        blocks_mod.native_kernel = real_native if new else (lambda dtype: None)

    real_block = block_mod.kernel

    def set_block(new: bool):
        block_mod.kernel = real_block if new else (lambda: None)

    real_min_entries = blocks_mod.PARALLEL_MIN_ENTRIES

    def set_posthreads(new: bool):
        blocks_mod.PARALLEL_MIN_ENTRIES = real_min_entries if new else 1 << 62

    def set_gemm(new: bool):      # (main puts the user's setting back after the run)
        os.environ[gemm_mod.ENV_VAR] = "onednn" if new else "blas"

    return {"weights": set_weights, "fold": set_fold, "rest": set_rest, "all": set_all,
            "native": set_native, "blockexp": set_block, "posthreads": set_posthreads,
            "gemm": set_gemm}


def add_case_arguments(p: argparse.ArgumentParser, levels: int, rounds: int) -> None:
    """The loss case and the rounds (shared with ``version_ab.py``)."""
    p.add_argument("--n", type=positive(int), default=6000)
    p.add_argument("--d", type=positive(int), default=64)
    p.add_argument("--levels", type=int, choices=(1, 3), default=levels)
    p.add_argument("--variant", choices=("exact", "official"), default="official")
    p.add_argument("--tau", type=temperature_arg, default=0.1)
    p.add_argument("--regimes", nargs="+", choices=REGIMES, default=["relu", "randn"])
    p.add_argument("--rounds", type=positive(int), default=rounds)


def round_robin_medians(steps: dict, rounds: int, before=None) -> dict:
    """Median seconds per step over ``rounds`` rounds, each round calling every step once in
    turn (the first round warms up and is dropped); ``before(name)`` runs untimed before each
    step (e.g. a path switch). Shared with ``version_ab.py``."""
    times = {name: [] for name in steps}
    for r in range(rounds):
        for name, fn in steps.items():
            if before is not None:
                before(name)
            start = time.perf_counter()
            fn()
            if r:
                times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


@loss_grid.on_device("cpu")     # the CPU engines' internals, also on a GPU machine
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--switch", choices=("fold", "weights", "rest", "all", "native", "blockexp",
                                        "posthreads", "gemm"), required=True)
    add_case_arguments(p, levels=3, rounds=15)
    p.add_argument("--threads", type=positive(int))
    p.add_argument("--exact", action="store_true",
                   help="also time the exact variant (official / exact ratios; --variant "
                        "official)")
    p.add_argument("--exact-backend", choices=("torch", "attention"), default="torch",
                   help="--exact: the exact variant's backend (attention: PyTorch's CPU flash "
                        "kernel, what the automatic choice picks for one level)")
    args = p.parse_args(argv)
    if args.n < 1 or args.d < 1 or args.rounds < 2:
        p.error("--n and --d must be positive and --rounds at least 2")
    if args.exact and args.variant != "official":
        p.error("--exact compares the official variant with the exact one: --variant official")
    if args.threads:
        torch.set_num_threads(args.threads)
    set_path = _switches()[args.switch]
    if args.switch == "gemm" and (why := gemm_mod._unavailable()) is not None:
        p.error(f"--switch gemm: {why}")

    def switch_for(name: str) -> None:            # the old / new path before its step
        if name in ("old", "new"):
            set_path(name == "new")

    print(f"load average {os.getloadavg()}, {torch.get_num_threads()} threads, "
          f"switch {args.switch}, N {args.n}, d {args.d}, L {args.levels}, {args.variant}, "
          f"tau {args.tau:g}, {args.rounds} rounds (first dropped)"
          + (f", exact variant on {args.exact_backend}" if args.exact else ""))
    # the gemm switch sets HIERTAIL_CPU_GEMM: put back as the user had it after the run (its
    # own value; unset: "" for the run, which reads as unset, then removed again)
    with environment({gemm_mod.ENV_VAR: os.environ.get(gemm_mod.ENV_VAR, "")}):
        try:
            for regime in args.regimes:
                z, ys, ps = make_case(regime, args.n, args.d, args.levels)
                step = loss_step("torch", z, ys, ps, args.tau, args.variant)
                steps = {"old": step, "new": step, "floor+exp": floor_step(z, ps, with_exp=True)}
                if args.exact:
                    steps["exact"] = loss_step(args.exact_backend, z, ys, ps, args.tau, "exact")
                med = round_robin_medians(steps, args.rounds, before=switch_for)
                line = (f"{regime:10s} old {med['old']:.4f} s  new {med['new']:.4f} s  "
                        f"floor+exp {med['floor+exp']:.4f} s  "
                        f"new/old {med['new'] / med['old']:.3f}")
                if args.exact:
                    line += (f"  exact {med['exact']:.4f} s  old/exact "
                             f"{med['old'] / med['exact']:.3f}  new/exact "
                             f"{med['new'] / med['exact']:.3f}")
                print(line, flush=True)
        finally:
            set_path(True)
    print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
