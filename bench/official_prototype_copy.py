"""Official hierarchical loss where a level's prototype copies a node row bit for bit.

The case of the 2026-12-03 fix (``_tied_keys.common_twins``, ``_lse_torch._engine``): 30 unit
rows, node 1 scaled to --norm, level 0's prototype of class 0 an exact copy of it (with
--no-copy: a random prototype instead), two levels. Prints, per temperature, the worst over
--seeds of |engine - float64 reference| / rule, for the value and for the gradients of z and
the prototypes, where rule = 2 x the fp32 reference's own error + 1e-5 + 1e-4 max|float64|
(the suite's rule, tests/test_contrastive_numerics.py). Above 1.0 the engine misses the rule.

    python bench/official_prototype_copy.py                   # torch engine, CPU
    python bench/official_prototype_copy.py --backend triton --device cuda
"""
from __future__ import annotations

import argparse

import torch

from hiertail_fast import hierarchical_contrastive_loss
from hiertail_fast._argparse import positive, temperature_arg


def case(seed: int, norm: float, copy: bool):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(30, 64, generator=gen)
    z = z / z.norm(dim=1, keepdim=True)
    z[1] *= norm
    y0 = torch.randint(0, 4, (30,), generator=gen)
    y0[1] = 0
    p0 = torch.randn(4, 64, generator=gen)
    if copy:
        p0[0] = z[1]
    return z, [y0, y0 // 2], p0


def run(z, labels, p0, backend, tau, device):
    z = z.to(device).clone().requires_grad_()
    p0 = p0.to(device).clone().requires_grad_()
    loss = hierarchical_contrastive_loss(z, [y.to(device) for y in labels], [p0, None],
                                         temperature=tau, variant="official", backend=backend)
    loss.backward()
    return [t.double().cpu() for t in (loss.detach(), z.grad, p0.grad)]


def worst_ratios(backend, tau, norm, copy, seeds, device):
    worst = [0.0, 0.0, 0.0]
    for seed in range(seeds):
        z, labels, p0 = case(seed, norm, copy)
        exp = run(z.double(), labels, p0.double(), "reference", tau, "cpu")
        low = run(z, labels, p0, "reference", tau, "cpu")
        got = run(z, labels, p0, backend, tau, device)
        for k, (a, lo, e) in enumerate(zip(got, low, exp, strict=True)):
            rule = 2 * (lo - e).abs().max().item() + 1e-5 + 1e-4 * e.abs().max().item()
            worst[k] = max(worst[k], (a - e).abs().max().item() / rule)
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--backend", default="torch", choices=["torch", "attention", "triton"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--norm", type=positive(float), default=1000.0)
    ap.add_argument("--taus", type=temperature_arg, nargs="+", default=[1.0, 0.1, 0.01, 1e-3, 1e-4])
    ap.add_argument("--seeds", type=positive(int), default=8)
    ap.add_argument("--no-copy", action="store_true", help="a random prototype instead")
    args = ap.parse_args(argv)
    print(f"backend {args.backend}, device {args.device}, node norm {args.norm:g}, "
          f"{'random prototype' if args.no_copy else 'prototype = copy of the node'}, "
          f"worst of {args.seeds} seeds, error / rule")
    print(f"{'tau':>8} {'max |s|':>9} {'value':>9} {'dz':>9} {'dprototypes':>12}")
    for tau in args.taus:
        r = worst_ratios(args.backend, tau, args.norm, not args.no_copy, args.seeds,
                         args.device)
        print(f"{tau:8g} {args.norm ** 2 / tau:9.0e} {r[0]:9.3g} {r[1]:9.3g} {r[2]:12.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
