"""Keys tied with a row's max in classes of unequal size, exact variant: each engine's relative
gradient error against a float64 truth that multiplies the class weights, by logit size. An
accuracy check, not a timing.

The exact variant's LSE is log sum_k w_k e^(s_ik). Formed as logsumexp(s + log w) (the dense
reference; the Triton and attention engines' per-key bias), log w is rounded at the size of s,
and keys that tie the row max (duplicate rows) share its softmax by the rounded weights, equally
once |s| dwarfs the gap in log w; formed as m + log sum_k w_k e^(s_ik - m) (the truth here, the
torch engine) the weights keep their ratio. Five rows, rows 0 and 1 equal, classes of 3 and 2.

    TRITON_INTERPRET=1 python bench/tied_weights.py        # the Triton column on CPU too
    python bench/tied_weights.py --sizes 1e4 1e17 --tau 0.1
"""
from __future__ import annotations

import argparse

import torch

from hiertail_fast import balanced_contrastive_loss
from hiertail_fast._argparse import positive, temperature_arg
from hiertail_fast.ops._dispatch import triton_unavailable_reason

ROWS = ((1.0, 0.02), (1.0, 0.02), (0.02, 1.0), (0.6, 0.3), (0.45, 0.1))
LABELS = (1, 0, 1, 0, 1)
# (column, backend, dtype of the rows)
ENGINES = (("reference float64", "reference", torch.float64),
           ("reference fp32", "reference", torch.float32),
           ("torch fp32", "torch", torch.float32),
           ("Triton fp32", "triton", torch.float32))


def problem(size: float, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(z float64 of fp32 values, labels): rows scaled so that max |s| = |z_0|^2 / tau ~ size."""
    z = torch.tensor(ROWS, dtype=torch.float64) * (size * tau) ** 0.5
    return z.float().double(), torch.tensor(LABELS)


def truth(z: torch.Tensor, labels: torch.Tensor, tau: float) -> torch.Tensor:
    """d/dz of the exact variant's mean loss (include_self), in float64, the class weights
    multiplied: m + log sum_k w_k e^(s_ik - m), m the row max (a constant to autograd)."""
    z = z.clone().requires_grad_()
    s = (z @ z.t()) * (1.0 / tau)
    _, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    w = 1.0 / counts[inverse].double()
    m = s.detach().amax(dim=1, keepdim=True)
    lse = (m + torch.log((torch.exp(s - m) * w).sum(dim=1, keepdim=True)))[:, 0]
    pos = (labels[:, None] == labels[None, :]).double()
    (lse - (s * pos).sum(dim=1) / pos.sum(dim=1)).mean().backward()
    return z.grad


def engine_grad(z, labels, tau, backend, dtype, device="cpu") -> torch.Tensor:
    """The engine's dz on `device` (rows in `dtype`), as float64 on the CPU."""
    z = z.detach().to(device=device, dtype=dtype).clone().requires_grad_()
    balanced_contrastive_loss(z, labels.to(device), temperature=tau, include_self=True,
                              variant="exact", backend=backend).backward()
    return z.grad.double().cpu()


def errors(size: float, tau: float) -> dict[str, float | None]:
    """Each engine's max |dz - truth| / max |truth| (None: Triton unavailable here: no GPU
    and no TRITON_INTERPRET=1)."""
    z, labels = problem(size, tau)
    want = truth(z, labels, tau)
    out: dict[str, float | None] = {}
    for name, backend, dtype in ENGINES:
        # Triton on the GPU where there is one, else on the CPU under the interpreter
        device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
        if backend == "triton" and triton_unavailable_reason(torch.device(device)) is not None:
            out[name] = None
            continue
        got = engine_grad(z, labels, tau, backend, dtype, device)
        out[name] = ((got - want).abs().max() / want.abs().max()).item()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--sizes", type=positive(float), nargs="+",
                   default=[1e2, 1e4, 1e6, 1e8, 1e12, 1e17], help="max |s| of each case")
    p.add_argument("--tau", type=temperature_arg, default=0.5)
    args = p.parse_args(argv)
    print("| max \\|s\\| | " + " | ".join(name for name, _, _ in ENGINES) + " |")
    print("|---" * (len(ENGINES) + 1) + "|")
    for size in args.sizes:
        row = errors(size, args.tau)
        print(f"| {size:.0e} | " + " | ".join("-" if v is None else f"{v:.1e}"
                                              for v in row.values()) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
