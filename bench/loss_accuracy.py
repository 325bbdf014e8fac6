"""Measured error of each precision path of the fused loss against float64.

For every loss backend that runs on the device (``torch``: our blocked engine; ``attention``:
PyTorch's attention kernels through ops/_attention_lse.py; ``triton`` on CUDA) and each input
dtype (float32, and bfloat16 where the path takes it), forward + backward of
``balanced_contrastive_loss`` on the regimes of bench/loss_grid.py, against the dense reference
run in float64 on the same (rounded) inputs. Reports the relative error of the value and the
max-norm relative error of the gradient (max |g - g64| / max |g64|; where every official
positive is clamped the true gradient is ~0 and only the absolute error, also reported, means
anything), plus which engine actually ran (the attention backend hands logits above its
precision guard to our engine).

    python bench/loss_accuracy.py                    # N = 2,000, d = 64
    python bench/loss_accuracy.py --n 4000 --out bench/results/loss_accuracy.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _device import DEVICE, device_name  # noqa: E402
from _results import check_targets, write_result  # noqa: E402
from loss_grid import REGIMES, make_case  # noqa: E402

import hiertail_fast.ops._attention_lse as attn  # noqa: E402
from hiertail_fast import balanced_contrastive_loss  # noqa: E402
from hiertail_fast._argparse import positive, temperature_arg  # noqa: E402


def _engine_used(fn) -> str:
    """Run fn; 'attention kernels' if the adapter's kernels were called, else 'own engine'."""
    calls = []
    real = attn._call

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)

    attn._call = spy
    try:
        fn()
    finally:
        attn._call = real
    return "attention kernels" if calls else "own engine"


def loss_and_grad(z, y, p, tau: float, variant: str, backend: str):
    """(value, d value / dz) of the one-level loss on copies of z and p, both in float64."""
    zz, pp = z.detach().clone().requires_grad_(), p.detach().clone().requires_grad_()
    loss = balanced_contrastive_loss(zz, y, prototypes=pp, temperature=tau, variant=variant,
                                     backend=backend)
    loss.backward()
    return loss.detach().double(), zz.grad.double()


def errors(got: tuple, want: tuple) -> dict:
    """Relative error of the value, max-norm relative and absolute error of the gradient, and
    the true gradient's size: (value, grad) against the float64 (value, grad)."""
    (v, g), (v64, g64) = got, want
    return dict(value_rel_err=float((v - v64).abs() / v64.abs().clamp(min=1e-30)),
                grad_rel_err=float((g - g64).abs().max() / g64.abs().max()),
                grad_abs_err=float((g - g64).abs().max()), grad_max=float(g64.abs().max()))


def measure(backend: str, dtype: torch.dtype, regime: str, tau: float, variant: str, n: int,
            d: int) -> dict:
    z, ys, ps = make_case(regime, n, d, 1)
    z, p = z.to(dtype), ps[0].to(dtype)
    got = []
    engine = _engine_used(lambda: got.append(loss_and_grad(z, ys[0], p, tau, variant, backend)))
    want = loss_and_grad(z.double(), ys[0], p.double(), tau, variant, "reference")
    return dict(backend=backend, dtype=str(dtype).replace("torch.", ""), regime=regime,
                tau=tau, variant=variant, engine=engine, **errors(got[0], want))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--n", type=positive(int), default=2000)
    parser.add_argument("--d", type=positive(int), default=64)
    parser.add_argument("--taus", type=temperature_arg, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=list(REGIMES))
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "loss_accuracy.json")
    args = parser.parse_args(argv)
    check_targets(parser, "--out", args.out)    # before the run, not after it
    backends = ["torch", "attention"] + (["triton"] if DEVICE == "cuda" else [])
    dtypes = [torch.float32, torch.bfloat16]
    rows = []
    for b in backends:
        for dt in dtypes:
            for variant in ("exact", "official"):
                for regime in args.regimes:
                    for tau in args.taus:
                        rows.append(measure(b, dt, regime, tau, variant, args.n, args.d))
                        r = rows[-1]
                        print(f"{b:9s} {r['dtype']:8s} {variant:8s} {regime:10s} tau={tau:<4g} "
                              f"{r['engine']:17s} value {r['value_rel_err']:.2e} "
                              f"grad {r['grad_rel_err']:.2e} (abs {r['grad_abs_err']:.1e} of "
                              f"max {r['grad_max']:.1e})", flush=True)
    write_result(args.out, json.dumps(dict(device=device_name(), torch=torch.__version__,
                                           n=args.n, d=args.d, rows=rows), indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
