"""The exact loss variant on the attention kernels where each row's own key takes its softmax:
worst error / the tests' rule by rows and logit bound, the guard's rows rule switched off.

Rows of equal norm, each in a class of its own, include_self=True, mean reduction, rescaled so
that the logit bound B = max|z|^2 / tau is the given one: every row's own key leads its others
by ~B (1 - cos), so p_ii ~ 1 and the exact gradient p_ii - 1 cancels. The rule is
bench/official_fuzz.py's (``case_ratios``: the suite's, error <= 2 x the dense fp32
reference's + 1e-5 + 1e-4 max|ref|, + 32 ulp of the terms that cancel). Prints a markdown table:
a row per N, a column per bound (``--per-row``: per multiple of N), each cell the worst ratio
over seeds x dims (> 1: the rule fails; "-": a bound at or over MAX_LOGIT, which runs our
engine whatever the rows).

    python bench/exact_small_n.py                                   # N 2-1,000, B 64-1,000
    python bench/exact_small_n.py --n 64 128 256 512 --per-row 1 2
    python bench/exact_small_n.py --engine torch                    # our engine, for contrast
    python bench/exact_small_n.py --device cpu       # the CPU kernel on a GPU machine

A fuzzing find of 2026-12-05 (``python bench/official_fuzz.py --variant exact``): the kernels'
key side forms p_ii from the first call's fp32 lse (rounded at |s|'s size) and the second
call's s_ii, so ~B 2^-24 of the cancelled term stays; its figures set the attention guard's
rows rule for the exact variant (``ops/_attention_lse.EXACT_LOGIT_PER_ROW``, ``EXACT_MIN_LOGIT``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import official_fuzz  # noqa: E402  (sets TRITON_INTERPRET without CUDA, before triton loads)
from _device import asked_device  # noqa: E402
from loss_golden import rows_rules_off  # noqa: E402

import hiertail_fast.ops._attention_lse as attn  # noqa: E402
from hiertail_fast._argparse import positive, temperature_arg  # noqa: E402


def worst_ratio(engine: str, n: int, bound: float, dims, seeds: int, tau: float,
                dev: str = "cpu") -> float:
    """The worst error / rule of `engine` over seeds x dims, n rows of norm sqrt(bound tau) in
    classes of their own."""
    worst = 0.0
    kw = dict(temperature=tau, include_self=True, variant="exact", reduction="mean")
    for seed in range(seeds):
        for d in dims:
            g = torch.Generator().manual_seed(seed)
            z = torch.randn(n, d, generator=g, dtype=torch.float64)
            z = (z / z.norm(dim=1, keepdim=True) * (bound * tau) ** 0.5).float()
            y = torch.arange(n)
            worst = max(worst, official_fuzz.case_ratios(z, y, None, kw, [engine], dev)[engine])
    return worst


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--engine", choices=("attention", "torch"), default="attention")
    p.add_argument("--n", type=positive(int), nargs="+", default=[2, 8, 64, 256, 1000])
    p.add_argument("--bounds", type=positive(float), nargs="+",
                   default=[64, 128, 256, 512, 1000])
    p.add_argument("--per-row", type=positive(float), nargs="+", default=None,
                   help="bounds as multiples of N instead of --bounds")
    p.add_argument("--dims", type=positive(int), nargs="+", default=[2, 16, 64])
    p.add_argument("--seeds", type=positive(int), default=4)
    p.add_argument("--tau", type=temperature_arg, default=0.1)
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="where the attention engine runs (default: cuda where available); "
                        "cpu: the CPU flash kernel, the one the guard's rows rule was set on")
    args = p.parse_args(argv)
    if min(args.n) < 2:
        p.error("--n >= 2")
    dev = asked_device(p, args.device)
    # the kernels themselves: the guard's rows rule off (MAX_LOGIT stays: a bound over it
    # runs our engine; one at MAX_LOGIT itself may round just over it: such cells print "-")
    limit = attn.MAX_LOGIT["exact"]
    torch.set_num_threads(1)
    cols = args.per_row or args.bounds
    name = "B / N" if args.per_row else "B"
    print(f"{args.engine}, exact, tau {args.tau:g}, dims {args.dims}, {args.seeds} seeds: worst "
          f"error / rule (MAX_LOGIT {limit:g})")
    print(f"| N \\ {name} | " + " | ".join(f"{c:g}" for c in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    with rows_rules_off():
        for n in args.n:
            bounds = [c * n if args.per_row else c for c in cols]
            cells = ["-" if args.engine == "attention" and b >= limit else
                     f"{worst_ratio(args.engine, n, b, args.dims, args.seeds, args.tau, dev):.2f}"
                     for b in bounds]
            print(f"| {n} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
