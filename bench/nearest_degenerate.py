"""nearest_prototype on degenerate input, where every (row, prototype) pair is a near-tie: all-zero
embeddings and prototypes (dead ReLUs). Prints the growth of the process's peak RSS and the
seconds of one call; the answer must be prototype 0 (the lowest index among exact ties).

    python bench/nearest_degenerate.py --rows 10000 --prototypes 400

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
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=positive(int), default=10_000)
    p.add_argument("--prototypes", type=int, default=400)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    z, protos = torch.zeros(args.rows, args.dim), torch.zeros(args.prototypes, args.dim)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    out = nearest_prototype(z, protos)
    seconds = time.perf_counter() - start
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert int(out.max()) == 0, "exact ties must go to the lowest index"
    print(f"{args.rows} x {args.prototypes} zeros (d {args.dim}): peak RSS +{grown:.0f} MB, "
          f"{seconds:.3f} s")


if __name__ == "__main__":
    main()
