"""How steady is this machine? Single-shot timings of the loss and its GEMM anchor, sample by
sample, with a memory-copy probe: the noise a benchmark on a shared host has to see through.

Every sample: the best of three 64 MB copies (GB/s), then one forward + backward of the exact
and the official loss (torch engine, relu(randn)/sqrt(d), tau 0.1, one level) and one
floor + exp anchor (``loss_grid.floor_step``), each timed once; then a pause. On this project's
2-core VM, idle by its load average, the exact loss swung 146-271 ms and the anchor 138-186 ms
at N = 6,000 within 100 s (2026-11-26, docs/results/vm_noise.json), more than any engine
change being measured: hence round-robin medians over many rounds, and the best-of-rounds
ratios ``loss_grid`` reports.

    python bench/vm_noise.py --n 6000 --samples 20 --pause 4
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from hiertail_fast._argparse import positive

sys.path.insert(0, str(Path(__file__).parent))
from _results import check_targets, write_result  # noqa: E402
from loss_grid import floor_step, load_average, loss_step, make_case  # noqa: E402


def copy_gbs(src: torch.Tensor, dst: torch.Tensor) -> float:
    start = time.perf_counter()
    dst.copy_(src)
    return 2 * src.numel() * src.element_size() / (time.perf_counter() - start) / 1e9


def sample_all(n: int, d: int, samples: int, pause: float, copy_mb: int) -> list[dict]:
    z, ys, ps = make_case("relu", n, d, 1)
    steps = {"exact": loss_step("torch", z, ys, ps, 0.1, "exact"),
             "official": loss_step("torch", z, ys, ps, 0.1, "official"),
             "floor+exp": floor_step(z, ps, with_exp=True)}
    src = torch.rand(copy_mb << 18)                                 # copy_mb MB of fp32
    dst = torch.empty_like(src)
    for step in steps.values():
        step()                                                      # warm-up
    copy_gbs(src, dst)
    rows = []
    for i in range(samples):
        row = {"t": time.strftime("%H:%M:%S"), "copy_gbs": max(copy_gbs(src, dst)
                                                               for _ in range(3))}
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            row[name] = time.perf_counter() - start
        rows.append(row)
        print(f"{row['t']} copy {row['copy_gbs']:5.1f} GB/s  " + "  ".join(
            f"{k} {row[k] * 1e3:6.1f} ms" for k in steps)
            + f"  exact/floor+exp {row['exact'] / row['floor+exp']:.2f}", flush=True)
        if i + 1 < samples:
            time.sleep(pause)
    return rows


def spread(rows: list[dict], key: str) -> dict:
    v = [r[key] for r in rows]
    return {"min": min(v), "median": statistics.median(v), "max": max(v)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--n", type=int, default=6000)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--pause", type=float, default=4.0, help="seconds between samples")
    parser.add_argument("--copy-mb", type=int, default=64)
    parser.add_argument("--threads", type=positive(int), help="torch threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results"
                        / "vm_noise.json")
    args = parser.parse_args(argv)
    check_targets(parser, "--out", args.out)    # before the run, not after it
    if min(args.n, args.d, args.samples, args.copy_mb) < 1 or args.pause < 0:
        parser.error("--n, --d, --samples, --copy-mb must be positive and --pause >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    before = load_average()
    rows = sample_all(args.n, args.d, args.samples, args.pause, args.copy_mb)
    after = load_average()
    report = dict(n=args.n, d=args.d, threads=torch.get_num_threads(), torch=torch.__version__,
                  load_average_before=before, load_average_after=after, samples=rows,
                  spread={k: spread(rows, k) for k in ("copy_gbs", "exact", "official",
                                                       "floor+exp")})
    write_result(args.out, json.dumps(report, indent=1))
    for k, s in report["spread"].items():
        print(f"{k:10s} min {s['min']:.4g}  median {s['median']:.4g}  max {s['max']:.4g}")
    print(f"load average {before} -> {after}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
