"""Which of PyTorch's attention kernels gives the loss's log-sum-exp fastest, and how exactly.

    python bench/attention_kernels.py                      # CUDA: 20k x 64 and 100k x 64
    python bench/attention_kernels.py --sizes 20000:64 --reps 5 --out DIR

The attention engine's quadratic core (docs/LOSS.md, DESIGN.md §3.1) is one attention call per
side with q = k = v = z and a per-key bias b_k = log w_k:
lse_i = log sum_k exp(scale * z_i.z_k + b_k), O_i = softmax_i . Z. It makes two such calls per
level and direction (the query side's O, the key side's second call), so this one call's time
and error decide what a kernel would give the loss. Issue 9 names three kernel families;
the engine uses two today:

    efficient fp32 + bias         memory-efficient attention, the bias as its own argument
                                  (stride-0 view): the engine's fp32 path
    flash bf16, folded bias       flash attention has no bias argument: b / scale folded into
                                  3 extra bf16 key columns (hi + mid + lo, ``fold_bias``), the
                                  head dim d + 3 padded to a multiple of 8 (flash's kernels
                                  then run their next template: 96 for d = 64): the bf16 path
    cudnn bf16, folded bias       the same operands on cuDNN attention (which takes head dims
                                  in steps of 8, 72 here: whether it runs them faster than
                                  flash's 96 is what the row measures)
    cudnn bf16 + bias             cuDNN with the bias as its own argument, in bf16 (head dim d;
                                  the bias rounded to bf16: |b| >= 8 is off by up to 2^-5)
    efficient bf16 + bias         memory-efficient attention in bf16, the same bf16 bias

each timed round-robin with SDPA's bf16 forward and forward + backward (the issue's bf16
anchor) and fp32 forward + backward, and each call's LSE and O against float64 on the same
(rounded) inputs: max |lse - lse64| over sampled rows (every p_ik of that row is off by that
much, relatively) and the largest row's |O - O64| / |O64|. A kernel the card refuses (cuDNN
needs sm80+ and its own build; a bias layout it does not take) is a row with its error, not the
end of the run. Timing: the kernel call only, its operands built beforehand (the engine builds
the fold once per loss call and rewrites the 3 bias columns per call).

``--device cpu`` runs the CPU flash kernel (the CPU engine's, with and without the fold) at a
small size: the test mode of this script (tests/test_bench_attention_kernels.py). Without
CUDA and without ``--device cpu``: one line, exit status 2.
Writes DIR/attention_kernels.md and .json after every size (default bench/results; files
already there kept as .prev).
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _gpu_checks as gc  # noqa: E402
from _results import check_targets, write_result  # noqa: E402

from hiertail_fast._argparse import temperature_arg  # noqa: E402
from hiertail_fast._files import atomic_write_text  # noqa: E402
from hiertail_fast.ops import _attention_lse as al  # noqa: E402

ORACLE_ROWS = 256


def _efficient(q, k, v, bias, scale):
    op = torch.ops.aten._scaled_dot_product_efficient_attention.default
    return op(q, k, v, bias, True, 0.0, False, scale=scale)[:2]


def _flash(q, k, v, bias, scale):
    op = torch.ops.aten._scaled_dot_product_flash_attention.default
    return op(q, k, v, 0.0, False, False, scale=scale)[:2]


def _cudnn(q, k, v, bias, scale):
    op = torch.ops.aten._scaled_dot_product_cudnn_attention.default
    return op(q, k, v, bias, True, 0.0, False, False, scale=scale)[:2]


def _cpu_flash(q, k, v, bias, scale):
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    return op(q, k, v, 0.0, False, attn_mask=bias, scale=scale)[:2]


# label -> (kernel, input dtype, bias: "arg" (its own argument) or "fold" (feature columns))
CASES = {
    "cuda": {"efficient fp32 + bias": (_efficient, torch.float32, "arg"),
             "flash bf16, folded bias": (_flash, torch.bfloat16, "fold"),
             "cudnn bf16, folded bias": (_cudnn, torch.bfloat16, "fold"),
             "cudnn bf16 + bias": (_cudnn, torch.bfloat16, "arg"),
             "efficient bf16 + bias": (_efficient, torch.bfloat16, "arg")},
    "cpu": {"cpu flash fp32 + bias": (_cpu_flash, torch.float32, "arg"),
            "cpu flash fp32, folded bias": (_cpu_flash, torch.float32, "fold")},
}


def inputs(n: int, d: int, seed: int = 0):
    """gpu_report's loss rows (relu(randn)/sqrt(d), Zipf labels over 70 classes) and the
    class-balanced bias b_k = -log |class of k|."""
    z, y, _ = gc.loss_inputs(n, d, seed=seed)
    counts = torch.bincount(y)
    return z, -torch.log(counts[y].double()).float()


def operands(z, b, dtype, bias_mode: str, scale: float):
    """(q, k, v, bias, d'): one call's operands, [1, 1, N, d'] each (bias: [1, 1, N, N] stride-0
    view, or None when folded), and d', the head dim the kernel gets."""
    zc = z.to(dtype).contiguous()
    n, d = zc.shape
    if bias_mode == "fold":
        qf, kf, vf = al.fold_bias(zc, b[None], scale)
        return qf[None, None], kf[None], vf[None, None], None, qf.shape[1]
    qh = al._pad_head_dim(zc, al.HEAD_ALIGN)[None, None]
    return qh, qh, qh, al._bias(b[None].to(dtype), n), qh.shape[-1]


def oracle(z, b, dtype, scale: float, rows: torch.Tensor):
    """float64 lse and O of `rows` on the inputs as the kernel sees them (z rounded to dtype,
    the bias exact)."""
    z64 = z.to(dtype).double()
    s = torch.mm(z64[rows], z64.t()).mul_(scale).add_(b.double())
    return torch.logsumexp(s, dim=1), torch.softmax(s, dim=1) @ z64


def errors(call, n: int, d: int, want, rows) -> dict:
    """Max |lse - lse64| over `rows` and the largest row's |O - O64| / |O64| of one call."""
    out, lse = call()
    lse = lse.reshape(lse.shape[0], lse.shape[1], -1)[0, 0, :n].double()  # cuDNN: [.., N, 1]
    out = out[0, 0, :, :d].double()
    lse_err = (lse[rows] - want[0]).abs().max().item()
    o_err = ((out[rows] - want[1]).norm(dim=1) / want[1].norm(dim=1).clamp(min=1e-300)).max()
    return dict(lse_abs_error=lse_err, out_rel_error=o_err.item())


def anchors(z, dev: str) -> dict:
    """SDPA on q = k = v = z (its default scale): bf16 forward, bf16 and fp32 forward +
    backward (issue 9's anchors)."""
    steps = {}
    qb = z.to(torch.bfloat16)[None, None].contiguous()

    def bf16_fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(qb, qb, qb)
    steps["SDPA bf16 fwd"] = bf16_fwd
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        q = z.to(dtype)[None, None].clone().requires_grad_(True)

        def fwd_bwd(q=q):
            q.grad = None
            F.scaled_dot_product_attention(q, q, q).sum().backward()
        steps[f"SDPA {name} fwd+bwd"] = fwd_bwd
    return steps


def rows_at(n: int, d: int, dev: str, reps: int, tau: float) -> list[dict]:
    z, b = (t.to(dev) for t in inputs(n, d))
    scale = 1.0 / tau
    sample = torch.linspace(0, n - 1, min(n, ORACLE_ROWS), device=dev).long()
    steps, info = anchors(z, dev), {}
    for label, (kernel, dtype, mode) in CASES[dev].items():
        try:
            q, k, v, bias, head_dim = operands(z, b, dtype, mode, scale)
            call = functools.partial(kernel, q, k, v, bias, scale)
            info[label] = dict(head_dim=head_dim, **errors(
                call, n, d, oracle(z, b, dtype, scale, sample), sample))
        except Exception as exc:  # noqa: BLE001 - a kernel the card refuses is a finding
            info[label] = gc.error_row(exc)
            continue
        steps[label] = call
    timed = gc.time_round_robin(steps, dev, reps=reps)
    out = []
    for label in [*steps, *(k for k in info if k not in steps)]:
        row = dict(n=n, d=d, what=label, **info.get(label, {}), **timed.get(label, {}))
        out.append(row)
    fwd = timed.get("SDPA bf16 fwd", {}).get("median_s")
    fwd_bwd = timed.get("SDPA bf16 fwd+bwd", {}).get("median_s")
    for row in out:
        t = row.get("median_s")
        row["over_sdpa_bf16_fwd"] = t / fwd if t and fwd else None
        row["over_sdpa_bf16_fwd_bwd"] = t / fwd_bwd if t and fwd_bwd else None
    return out


def render(report: dict) -> str:
    head = (f"# Attention kernels for the loss's LSE ({report['device']}, torch "
            f"{report['torch']}, cuDNN {report['cudnn']}, tau {report['tau']:g}; "
            f"{gc.load_note(report)})\n\n")
    table = gc.markdown_table(
        ["N", "d", "call", "head dim", "median", "÷ SDPA bf16 fwd", "÷ SDPA bf16 fwd+bwd",
         "max abs LSE error", "max rel O error", "error"],
        [[r["n"], r["d"], r["what"], r.get("head_dim", "–"), gc.fmt(r.get("median_s"), "s"),
          gc.fmt(r.get("over_sdpa_bf16_fwd")), gc.fmt(r.get("over_sdpa_bf16_fwd_bwd")),
          gc.fmt(r.get("lse_abs_error")), gc.fmt(r.get("out_rel_error")),
          r.get("error", "")] for r in report["rows"]])
    return head + table + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--sizes", type=gc.size_arg, nargs="+", default=None,
                   help="N:d (default: 20000:64 100000:64 on CUDA, 300:16 on CPU)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--tau", type=temperature_arg, default=0.1)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("attention_kernels: no CUDA device (the test mode is --device cpu)")
        return 2
    md, js = args.out / "attention_kernels.md", args.out / "attention_kernels.json"
    check_targets(p, "--out", md, js)
    sizes = args.sizes or ([(20000, 64), (100000, 64)] if args.device == "cuda" else [(300, 16)])
    report = dict(device=(torch.cuda.get_device_name() if args.device == "cuda" else "cpu"),
                  torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
                  tau=args.tau, load_average_start=gc.load_average(), rows=[])
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    for i, (n, d) in enumerate(sizes):
        report["rows"] += rows_at(n, d, args.device, args.reps, args.tau)
        report["load_average_end"] = gc.load_average()
        report["seconds"] = time.perf_counter() - t0
        text = render(report)
        # written after every size (a device call's limit keeps what was measured); files
        # already there are kept as .prev by the first write only, not replaced by this run's
        write = write_result if i == 0 else atomic_write_text
        write(md, text)
        write(js, json.dumps(report, indent=1, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
