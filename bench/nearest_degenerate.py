"""nearest_prototype on degenerate input, where every (row, prototype) pair is a near-tie: all-zero
embeddings and prototypes (dead ReLUs; the answer must be prototype 0, the lowest index among
exact ties), or with ``--case far`` distinct rows ~30·sqrt(d) away from prototypes spread over
1e-6 (every pair re-decided with float64 distances; float32 ones "tied" them all and answered
prototype 0). Prints the growth of the process's peak RSS, the seconds of one call and how many
distinct prototypes were chosen.

    python bench/nearest_degenerate.py --rows 10000 --prototypes 400 [--case far]

Before the near-tie re-decision ran on distinct rows in bounded chunks (2026-11-27), this case
materialised all N·m·d differences (10k x 400 x 128: 6.0 GB)."""
from __future__ import annotations

import argparse
import resource
import time

import torch

from hiertail_fast import nearest_prototype
from hiertail_fast._argparse import positive


def main() -> None:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--rows", type=positive(int), default=10_000)
    p.add_argument("--prototypes", type=positive(int), default=400)
    p.add_argument("--dim", type=positive(int), default=128)
    p.add_argument("--threads", type=positive(int), default=1)
    p.add_argument("--case", choices=("zeros", "far"), default="zeros")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.case == "zeros":
        z, protos = torch.zeros(args.rows, args.dim), torch.zeros(args.prototypes, args.dim)
    else:
        gen = torch.Generator().manual_seed(0)
        z = torch.randn(args.rows, args.dim, generator=gen) * 30
        protos = torch.randn(args.prototypes, args.dim, generator=gen) * 1e-6
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    out = nearest_prototype(z, protos)
    seconds = time.perf_counter() - start
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    if args.case == "zeros":
        assert int(out.max()) == 0, "exact ties must go to the lowest index"
    print(f"{args.rows} x {args.prototypes} {args.case} (d {args.dim}): peak RSS "
          f"+{grown:.0f} MB, {seconds:.3f} s, {out.unique().numel()} distinct prototypes chosen")


if __name__ == "__main__":
    main()
