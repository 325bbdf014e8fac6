"""The symmetric CPU engine's three GEMM forms on torch.mm (torch's BLAS: MKL in the x86
wheels) and on oneDNN (``hiertail_fast/ops/_onednn_gemm.py``), timed ROUND-ROBIN per tile
width, and what oneDNN keeps per distinct GEMM shape.

One tile of the engine is 256 rows x W keys, d features:

    logits   S = z_B z_W^T          [256, W]    (twice per tile: pass 1 and pass 2)
    rows     dz_B += W_t z_W        [256, d]    (K = W)
    keys     dz_W += W_t^T z_B      [W, d]      (K = 256, the tile read transposed; on
                                                 oneDNN into the engine's transposed
                                                 [d, W] accumulator, ``add_mm_t_``)

Per width it prints the median milliseconds of each form per provider and their ratio, and the
tile's four GEMMs together (2 x logits + rows + keys). ``--shapes N`` then calls oneDNN on N
distinct widths and prints the process's RSS growth per shape (oneDNN builds and keeps a kernel
per shape: why the engine gives it few shapes, ``_lse_symmetric._next_piece``).

    python bench/cpu_gemm.py --widths 4096 16384 49152 --d 128 --rounds 7 --shapes 100

``--loss N --tile-mib 16 8 4`` then runs the exact loss (forward + backward, N normalised rows,
70 classes) on oneDNN with each tile budget (``HIERTAIL_CPU_BLOCK_BYTES``) in turn, for
``--loss-rounds`` rounds, printing seconds and the process's minor page faults per call: a
fresh tile the allocator maps anew is faulted in page by page (why ``ONEDNN_TILE_BYTES``;
the engine pads glibc's heap against that since 2026-12-07, ``ops/_roomy_heap.py``: run with
``HIERTAIL_CPU_HEAP=keep`` to see glibc as it was, and ``bench/heap_ab.py`` for the A/B).

Run it on an idle machine (``bench/idle_window.sh``); the load average is printed before and
after.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).parent))
from _gpu_checks import environment  # noqa: E402

from hiertail_fast._argparse import positive  # noqa: E402
from hiertail_fast.ops import _onednn_gemm as og  # noqa: E402
from hiertail_fast.ops._matmul_precision import ieee_matmuls  # noqa: E402

ROWS = 256
FORMS = ("logits", "rows", "keys")


def tile_steps(width: int, d: int, use: str, gen: torch.Generator) -> dict:
    """The three forms on one provider for a 256 x width tile (fresh operands)."""
    zb = torch.randn(ROWS, d, generator=gen)
    zw = torch.randn(width, d, generator=gen)
    w = torch.randn(ROWS, width, generator=gen)
    buf = torch.empty(ROWS * width)
    acc_b = torch.zeros(ROWS, d)
    out = buf.view(ROWS, width)
    if use == "onednn":     # as the engine: row by row into a transposed accumulator
        acc_w_t = torch.zeros(d, width)
        keys = lambda: og.add_mm_t_(acc_w_t, w.t(), zb, use=use)  # noqa: E731
    else:
        acc_w = torch.zeros(width, d)
        keys = lambda: og.add_mm_(acc_w, w.t(), zb, use=use)  # noqa: E731
    return {
        "logits": lambda: og.mm_nt(zb, zw, out=out, use=use),
        "rows": lambda: og.add_mm_(acc_b, w, zw, use=use),
        "keys": keys,
    }


def time_width(width: int, d: int, rounds: int, repeat: int) -> dict:
    """{(form, use): median ms} over ``rounds`` rounds (the first dropped), providers and
    forms alternating within each round."""
    gen = torch.Generator().manual_seed(width)
    steps = {(f, u): fn for u in ("blas", "onednn")
             for f, fn in tile_steps(width, d, u, gen).items()}
    times = {k: [] for k in steps}
    for r in range(rounds):
        for key, fn in steps.items():
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            if r:
                times[key].append((time.perf_counter() - start) / repeat * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def shape_growth(shapes: int, d: int) -> float:
    """RSS growth (MB) per distinct oneDNN GEMM shape (logits and rows forms each)."""
    zb = torch.randn(ROWS, d)
    zw = torch.randn(ROWS + shapes, d)
    before = rss_mb()
    for k in range(shapes):
        s = og.mm_nt(zb, zw[:ROWS + k], use="onednn")
        og.add_mm_(torch.zeros(ROWS, d), s, zw[:ROWS + k], use="onednn")
    return (rss_mb() - before) / shapes


def minor_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def loss_faults(n: int, d: int, tiles_mib: list[int], rounds: int) -> list[tuple]:
    """(round, MiB, seconds, minor faults) of the exact loss on oneDNN per tile budget."""
    from hiertail_fast import balanced_contrastive_loss

    gen = torch.Generator().manual_seed(n)
    z0 = torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)
    y = torch.randint(0, 70, (n,), generator=gen)
    rows = []
    for r in range(rounds):
        for mib in tiles_mib:
            with environment({og.ENV_VAR: "onednn", "HIERTAIL_CPU_BLOCK_BYTES": str(mib << 20)}):
                z = z0.clone().requires_grad_()
                f0, start = minor_faults(), time.perf_counter()
                balanced_contrastive_loss(z, y, temperature=0.1).backward()
                rows.append((r, mib, time.perf_counter() - start, minor_faults() - f0))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--widths", type=positive(int), nargs="+", default=[4096, 16384, 49152])
    p.add_argument("--d", type=positive(int), default=128)
    p.add_argument("--rounds", type=positive(int), default=7)
    p.add_argument("--repeat", type=positive(int), default=5, help="calls per timing")
    p.add_argument("--shapes", type=int, default=0,
                   help="also measure the RSS growth over this many distinct shapes (Linux)")
    p.add_argument("--loss", type=positive(int), help="also time the exact loss at N rows")
    p.add_argument("--tile-mib", type=positive(int), nargs="+", default=[16, 8, 4],
                   help="--loss: tile budgets (MiB) to run it with")
    p.add_argument("--loss-rounds", type=positive(int), default=2)
    p.add_argument("--threads", type=positive(int))
    args = p.parse_args(argv)
    if args.rounds < 2:
        p.error("--rounds must be at least 2 (the first is dropped)")
    if args.shapes < 0:
        p.error("--shapes must be >= 0")
    why = og._unavailable()
    if why is not None:
        p.error(f"oneDNN cannot serve the GEMMs here: {why}")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()}, {torch.get_num_threads()} threads, d {args.d}, "
          f"{args.rounds} rounds (first dropped) x {args.repeat} calls, machine's auto "
          f"choice: {og.provider() if og.choice() == 'auto' else 'auto (overridden)'}")
    print(f"{'width':>7} {'form':>7} {'blas ms':>9} {'onednn ms':>10} {'blas/onednn':>12}")
    with ieee_matmuls():
        for width in args.widths:
            med = time_width(width, args.d, args.rounds, args.repeat)
            for form in FORMS:
                b, o = med[(form, "blas")], med[(form, "onednn")]
                print(f"{width:7d} {form:>7} {b:9.2f} {o:10.2f} {b / o:12.2f}")
            tile = {u: 2 * med[("logits", u)] + med[("rows", u)] + med[("keys", u)]
                    for u in ("blas", "onednn")}
            print(f"{width:7d} {'tile':>7} {tile['blas']:9.2f} {tile['onednn']:10.2f} "
                  f"{tile['blas'] / tile['onednn']:12.2f}", flush=True)
        if args.shapes:
            print(f"RSS growth per distinct oneDNN shape: "
                  f"{shape_growth(args.shapes, args.d):.2f} MB ({args.shapes} shapes)")
    if args.loss:
        for r, mib, secs, faults in loss_faults(args.loss, args.d, args.tile_mib,
                                                args.loss_rounds):
            print(f"loss N {args.loss} round {r} tiles {mib:3d} MiB {secs:8.2f} s "
                  f"{faults:9d} minor faults", flush=True)
    print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
