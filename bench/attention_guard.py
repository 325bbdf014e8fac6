"""Error of the attention path against float64 as the logits grow: where its guard belongs.

The attention kernels return the LSE in fp32 and recompute every logit in each call, so the
error of the attention path grows with the logits' size (``ops/_attention_lse.py``, the
comment above ``MAX_LOGIT``). The library sends a call to its own engine when the bound
B = scale * max_i |z_i|^2 (>= every |s_ik|, and attained: s_ii) is above ``MAX_LOGIT`` (per
variant). This script switches the guard off and measures, for bounds B from 64 up, the
relative error of the loss value and the max-norm relative error of the gradient (as
bench/loss_accuracy.py) of the attention path and of the ``torch`` engine, both variants, one
level, relu(randn) and randn embeddings rescaled to the bound, against the dense reference in
float64 on the same inputs. Where every official positive is clamped (randn at large bounds)
the true gradient is ~0 and only the absolute error (also reported) means anything.

    python bench/attention_guard.py                          # N = 2,000, d = 64, this device
    python bench/attention_guard.py --bounds 256 1024 4096 --out bench/results/guard.json
    python bench/attention_guard.py --dtype bfloat16          # bf16 inputs (their own limits)
    python bench/attention_guard.py --engines attention triton[tf32x3]   # CUDA: 3xTF32 dots

``--dtype bfloat16`` rounds the inputs to bf16 and compares with float64 on those rounded
inputs (the bf16 path's own error; on CUDA flash attention with the folded bias).
``triton[tf32x3]`` forces the Triton kernels' 3xTF32 dots ($HIERTAIL_TRITON_FP32_DOT), whose
limit is ``ops/_triton_loss.TF32X3_MAX_LOGIT``. ``triton`` runs the Triton kernels with their
own dot (on a machine without CUDA through the interpreter: numpy fp32 dots, so keep --n small;
their LSE has no guard since its relative mode, ``ops/_triton_loss``):

    python bench/attention_guard.py --engines triton torch --dtype float16 --n 300 --d 16 \
        --bounds 1024 16384 131072 1048576
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():       # the triton engine here: the interpreter, set before
    os.environ.setdefault("TRITON_INTERPRET", "1")                   # triton is first imported

sys.path.insert(0, str(Path(__file__).parent))
import _gpu_checks as gc  # noqa: E402
from _device import DEVICE, device_name  # noqa: E402
from _results import check_targets, write_result  # noqa: E402
from loss_accuracy import errors, loss_and_grad  # noqa: E402
from loss_golden import rows_rules_off  # noqa: E402

import hiertail_fast.ops._attention_lse as attn  # noqa: E402
from hiertail_fast.ops import _triton_loss  # noqa: E402

TAU = 0.1
ENGINES = ("attention", "torch", "triton", "triton[tf32x3]")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def make_inputs(regime: str, n: int, d: int, bound: float, seed: int = 0):
    """z [n, d], labels, 40 prototypes; all rows rescaled so that scale * max |row|^2 = bound."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n + 40, d, generator=gen)
    if regime == "relu":
        z = z.relu()
    z = z * (bound * TAU / float(z.pow(2).sum(1).max())) ** 0.5
    y = torch.randint(0, 40, (n,), generator=gen)
    return z[:n].to(DEVICE), y.to(DEVICE), z[n:].to(DEVICE)


def errors_vs_float64(engine: str, variant: str, z, y, p) -> dict:
    """bench/loss_accuracy.py's errors of `engine` against the float64 reference on the same
    (possibly bf16-rounded) inputs; "triton[tf32x3]" forces 3xTF32 dots."""
    with gc.backend_mode(engine) as backend:          # (a Triton mode sets its knob)
        got = loss_and_grad(z, y, p, TAU, variant, backend)
    return errors(got, loss_and_grad(z.double(), y, p.double(), TAU, variant, "reference"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--bounds", type=float, nargs="+",
                        default=[64, 256, 512, 1024, 2048, 4096, 16384])
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=["attention", "torch"])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "attention_guard.json")
    args = parser.parse_args(argv)
    check_targets(parser, "--out", args.out)    # before the run, not after it
    if args.n < 2 or args.d < 1 or min(args.bounds) <= 0:
        parser.error("--n >= 2, --d >= 1 and positive --bounds")
    if "triton[tf32x3]" in args.engines and DEVICE != "cuda":
        parser.error("triton[tf32x3] needs CUDA (the interpreter's dots are numpy fp32)")
    dtype = DTYPES[args.dtype]
    real_guard, real_bf16 = attn.MAX_LOGIT, attn.MAX_LOGIT_BF16
    attn.MAX_LOGIT = dict.fromkeys(real_guard, float("inf"))   # every call on the kernels
    attn.MAX_LOGIT_BF16 = dict.fromkeys(real_bf16, float("inf"))
    rows = []
    load_start = gc.load_average()
    try:
        with rows_rules_off():                      # the rows rules too
            for bound in args.bounds:
                for regime in ("relu", "randn"):
                    z, y, p = make_inputs(regime, args.n, args.d, bound)
                    z, p = z.to(dtype), p.to(dtype)
                    for variant in ("exact", "official"):
                        for backend in args.engines:
                            err = errors_vs_float64(backend, variant, z, y, p)
                            rows.append(dict(bound=bound, regime=regime, variant=variant,
                                             backend=backend, dtype=args.dtype, **err))
                            r = rows[-1]
                            print(f"B {bound:8.0f} {regime:5s} {variant:8s} {backend:14s} value "
                                  f"{r['value_rel_err']:.2e} grad {r['grad_rel_err']:.2e} (abs "
                                  f"{r['grad_abs_err']:.1e} of max {r['grad_max']:.1e})",
                                  flush=True)
    finally:
        attn.MAX_LOGIT, attn.MAX_LOGIT_BF16 = real_guard, real_bf16
    meta = dict(device=device_name(), torch=torch.__version__, n=args.n, d=args.d, tau=TAU,
                dtype=args.dtype, guard_in_library=real_guard, guard_bf16=real_bf16,
                load_average_start=load_start, load_average_end=gc.load_average(),
                tf32x3_limit=_triton_loss.TF32X3_MAX_LOGIT,
                official_logit_per_row=attn.OFFICIAL_LOGIT_PER_ROW,   # (restored: the library's)
                exact_logit_per_row=attn.EXACT_LOGIT_PER_ROW)
    write_result(args.out, json.dumps(dict(meta=meta, rows=rows), indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
