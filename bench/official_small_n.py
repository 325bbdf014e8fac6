"""The official loss variant's gradient on the fp32-LSE engines (Triton, attention) at SMALL N,
against the tests' rule: error <= 2 x the dense fp32 reference's + 1e-4 max|ref| + 1e-5 (float64
reference on the same inputs). Rows of near-singleton classes (labels drawn from N values), mean
reduction, include_self=False, rows rescaled so that the logit bound B = max|z|^2 / tau is the
given one (each row's norm a random 50-100 % of sqrt(B tau)). Prints, per bound, the worst
error / rule over seeds x dims (> 1: the rule fails).

    python bench/official_small_n.py --engine triton --n 31 --tau 0.1 --bounds 128 256 1024
    python bench/official_small_n.py --engine attention --n 8 --bounds 64 128

Without CUDA the Triton engine runs under the interpreter (numpy fp32 dots; set before triton is
imported). A fuzzing find of 2026-11-27 (docs/LOSS.md): the engines keep the LSE in fp32, so
LSE - M carries ~B 2^-24, which the official gradient's arg-max cancellation exposes when few
rows share the mean."""
from __future__ import annotations

import argparse
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import hiertail_fast.ops._attention_lse as attn  # noqa: E402
from hiertail_fast import balanced_contrastive_loss  # noqa: E402
from hiertail_fast._argparse import positive, temperature_arg  # noqa: E402


def _grad(z, labels, tau, backend):
    z = z.clone().requires_grad_()
    balanced_contrastive_loss(z, labels, temperature=tau, include_self=False, reduction="mean",
                              variant="official", backend=backend).backward()
    return z.grad.double().cpu()


def main() -> None:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--engine", choices=("triton", "attention", "torch"), default="triton")
    p.add_argument("--n", type=positive(int), default=31)
    p.add_argument("--tau", type=temperature_arg, default=0.1)
    p.add_argument("--dims", type=positive(int), nargs="+", default=[1, 3, 8])
    p.add_argument("--seeds", type=positive(int), default=12)
    p.add_argument("--bounds", type=positive(float), nargs="+", default=[64, 128, 256, 1024])
    args = p.parse_args()
    # the engine itself: the attention engine's guard sends official calls with B over
    # OFFICIAL_LOGIT_PER_ROW x N (chosen from this script's figures) to the torch engine
    attn.OFFICIAL_LOGIT_PER_ROW = float("inf")
    torch.set_num_threads(1)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for bound in args.bounds:
        worst = 0.0
        for seed in range(args.seeds):
            for d in args.dims:
                g = torch.Generator().manual_seed(seed)
                z = torch.randn(args.n, d, generator=g, dtype=torch.float64)
                scale = 0.5 + 0.5 * torch.rand(args.n, 1, generator=g, dtype=torch.float64)
                z = (z / z.norm(dim=1, keepdim=True) * (bound * args.tau) ** 0.5 * scale).float()
                labels = torch.randint(0, args.n, (args.n,), generator=g)
                ref = _grad(z.double(), labels, args.tau, "reference")
                dense32 = _grad(z, labels, args.tau, "reference")
                got = _grad(z.to(dev), labels.to(dev), args.tau, args.engine)
                rule = (2 * (dense32 - ref).abs().max().item() + 1e-4 * ref.abs().max().item()
                        + 1e-5)
                worst = max(worst, (got - ref).abs().max().item() / rule)
        print(f"{args.engine} n={args.n} tau={args.tau:g} B<={bound:g}: worst error / rule "
              f"{worst:.2f}")


if __name__ == "__main__":
    main()
