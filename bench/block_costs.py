"""Where one row block of the CPU loss engine spends its time: each piece timed on its own.

The torch engine (``ops/_lse_torch._engine``) visits the N rows in blocks of B = 256; per
block of the exact single-level loss it runs the logits GEMM s = (scale z_B) Z^T into a
reused [B, N] buffer (K = d), the C step (row max, exp, weighted sums; ``_block_exp.c``) and
two gradient GEMMs, e Z (K = N) and Z^T-side e^T z_B (K = B). This script times, round-robin
in one process (median of ``--reps`` calls per piece per round, then median / best over
``--rounds``):

    logits GEMM              torch.mm(z_B, Z^T, out=[B, N] buffer)
    logits GEMM, tiles       the same into a reused [B, TILE] buffer, TILE columns at a time:
                             an output that stays in L2 (what a cache-tiled engine would do)
    exp step (C)             the block kernel on the [B, N] block
    query-side GEMM          torch.mm(e, Z)
    key-side GEMM            key.addmm_(e^T, z_B)
    exact loss / block       the whole exact loss fwd+bwd on the torch engine / ceil(N / B)
    attention loss / block   the same loss on PyTorch's attention kernel / ceil(N / B)
    3-GEMM floor / block     the engine scheme's GEMMs over all blocks / ceil(N / B)
    symmetric floor / block  the GEMMs of a scheme using s_ij = s_ji (upper-triangle blocks, two
                             passes: 2 N^2 d multiply-adds instead of 3) / ceil(N / B)

and GFLOP/s for the GEMMs. What it answers: whether the engine's blocks run at BLAS speed for
their shapes, whether cache-sized output tiles would make the K = d GEMM faster (the
question behind moving the block loop into C), and what the symmetric scheme's GEMMs would
cost against the engine's. Run it on an idle machine
(bench/idle_window.sh); the load average is recorded before and after.

    python bench/block_costs.py --sizes 6000 20000 --dims 64 128 --rounds 7
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import loss_grid  # noqa: E402
from _results import check_targets, write_result  # noqa: E402
from loss_grid import device_name, load_average, loss_step, make_case  # noqa: E402

from hiertail_fast.ops import _block_exp  # noqa: E402

BLOCK = 256


def _pieces(n: int, d: int, tile: int) -> dict:
    """name -> (callable, GFLOP per call or None, calls per block); every piece on one block."""
    z, ys, ps = make_case("relu", n, d, 1)
    z = torch.cat([z, ps[0]])                      # the loss's keys: nodes and prototypes
    rows = z.shape[0]
    zb = (z[:BLOCK] * 10.0).contiguous()
    e = torch.empty(BLOCK, rows)
    small = torch.empty(BLOCK, tile)
    out = torch.empty(BLOCK, d)
    key = torch.zeros(rows, d)
    w = torch.full((1, rows), 1.0 / rows)
    fn = _block_exp.kernel()
    torch.mm(zb, z.t(), out=e)
    blocks = math.ceil(rows / BLOCK)
    gflop = 2 * BLOCK * rows * d / 1e9

    def tiles():
        for c0 in range(0, rows, tile):
            c1 = min(rows, c0 + tile)
            torch.mm(zb, z[c0:c1].t(), out=small[:, : c1 - c0])

    pieces = {
        "logits GEMM": (lambda: torch.mm(zb, z.t(), out=e), gflop, 1),
        f"logits GEMM, {tile}-column tiles": (tiles, gflop, 1),
        "query-side GEMM": (lambda: torch.mm(e, z, out=out), gflop, 1),
        "key-side GEMM": (lambda: key.addmm_(e.t(), zb), gflop, 1),
    }
    if fn is not None:       # values in (0, 1] after the first call: the kernel is branch-free
        pieces["exp step (C)"] = (lambda: _block_exp.native_step(fn, e, w, False), None, 1)
    for backend in ("torch", "attention"):
        step = loss_step(backend, z[:n], ys, ps, 0.1, "exact")
        pieces[f"{'exact' if backend == 'torch' else 'attention'} loss / block"] = (
            step, None, blocks)
    pieces["3-GEMM floor / block"] = (lambda: three_gemm_floor(z, e), None, blocks)
    pieces["symmetric floor / block"] = (lambda: symmetric_floor(z, e), None, blocks)
    return pieces


def symmetric_lse_grad(z: torch.Tensor, w: torch.Tensor, scale: float, g: torch.Tensor,
                       cutoff: float = 50.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The symmetric scheme in plain torch (one level, every key visible): lse_i = log sum_k
    w_k exp(scale z_i.z_k) and dz = d/dz sum_i g_i lse_i, from upper-triangle row blocks only.

    Pass 1, block B = rows [r0, r1) against keys [r0, N): its rows get the block's row
    statistics (keys >= r0) and the rows r1.. get its column statistics (keys in B: s_ji =
    s_ij), both merged online into running (max, sum) pairs, so every pair counts once per
    direction. Pass 2: W_ij = g_i w_j e^(s_ij - lse_i) on the block, plus g_j w_i e^(s_ij -
    lse_j) off its diagonal part; then dz_B += W Z_[r0:] and dz_[r0:] += W^T z_B. A tested
    model of the candidate scheme timed by `symmetric_floor` (docs/LOSS.md), not the engine."""
    n = z.shape[0]
    zs = z * scale
    m = torch.full((n,), float("-inf"), dtype=z.dtype)
    total = torch.zeros(n, dtype=z.dtype)

    def merge(sl: slice, s: torch.Tensor, weights: torch.Tensor) -> None:
        # rows of s are the queries sl; running (max, sum of weights * exp(s - max)) pairs
        new = torch.maximum(m[sl], s.amax(1))
        total[sl] = total[sl] * torch.exp(m[sl] - new) \
            + torch.exp((s - new[:, None]).clamp(min=-cutoff)) @ weights
        m[sl] = new

    for r0 in range(0, n, BLOCK):
        r1 = min(n, r0 + BLOCK)
        s = zs[r0:r1] @ z[r0:].t()
        merge(slice(r0, r1), s, w[r0:])                       # rows of B, keys >= r0
        if r1 < n:
            merge(slice(r1, n), s[:, r1 - r0:].t(), w[r0:r1])  # rows after B, keys in B
    lse = m + total.log()
    dz = torch.zeros_like(z)
    for r0 in range(0, n, BLOCK):
        r1 = min(n, r0 + BLOCK)
        s = zs[r0:r1] @ z[r0:].t()
        big_w = torch.exp((s - lse[r0:r1, None]).clamp(min=-cutoff)) * w[None, r0:] \
            * g[r0:r1, None]
        if r1 < n:
            big_w[:, r1 - r0:] += torch.exp((s[:, r1 - r0:] - lse[None, r1:]).clamp(
                min=-cutoff)) * w[r0:r1, None] * g[None, r1:]
        dz[r0:r1] += big_w @ z[r0:]
        dz[r0:] += big_w.t() @ z[r0:r1]
    return lse, dz * scale


def three_gemm_floor(z: torch.Tensor, buf: torch.Tensor) -> None:
    """The GEMMs of the engine's scheme over all row blocks: per block the logits z_B Z^T, the
    query side e Z and the key side e^T z_B (3 N^2 d multiply-adds). Not loss_grid's
    ``floor_step`` (three logits GEMMs): the engine's own shapes, to set against
    `symmetric_floor` like for like."""
    n, d = z.shape
    dz, key = torch.zeros(n, d), torch.zeros(n, d)
    for r0 in range(0, n, BLOCK):
        r1 = min(n, r0 + BLOCK)
        e = buf[: r1 - r0]
        torch.mm(z[r0:r1], z.t(), out=e)
        dz[r0:r1] += e @ z
        key.addmm_(e.t(), z[r0:r1])


def symmetric_floor(z: torch.Tensor, buf: torch.Tensor) -> None:
    """The GEMMs of a scheme that uses s_ij = s_ji (not the engine's; a candidate measured
    here, its math in `symmetric_lse_grad`): block B of rows against the keys from B's first
    row on only (the upper triangle), once for the log-sum-exp with row AND column
    statistics, once more for the gradient block W, whose two products give both sides of
    both orientations: dz_B += W Z_{>=B} and dz_{>=B} += W^T z_B. 2 N^2 d multiply-adds
    instead of 3 (the exp work doubles: each entry serves its row and its column)."""
    n, d = z.shape
    dz = torch.zeros(n, d)
    for r0 in range(0, n, BLOCK):
        r1 = min(n, r0 + BLOCK)
        torch.mm(z[r0:r1], z[r0:].t(), out=buf[: r1 - r0, : n - r0])
    for r0 in range(0, n, BLOCK):
        r1 = min(n, r0 + BLOCK)
        e = buf[: r1 - r0, : n - r0]
        torch.mm(z[r0:r1], z[r0:].t(), out=e)
        dz[r0:r1] += e @ z[r0:]
        dz[r0:].addmm_(e.t(), z[r0:r1])


def measure(n: int, d: int, rounds: int, reps: int, tile: int) -> list[dict]:
    pieces = _pieces(n, d, tile)
    for f, _, _ in pieces.values():
        f()                                                              # warm-up
    times: dict[str, list[float]] = {name: [] for name in pieces}
    for _ in range(rounds):
        for name, (f, _, per) in pieces.items():
            k = max(1, reps // per)                # a whole loss counts as `per` blocks
            samples = []
            for _ in range(k):
                start = time.perf_counter()
                f()
                samples.append((time.perf_counter() - start) / per)
            times[name].append(statistics.median(samples))
    rows = []
    for name, (_, gflop, _) in pieces.items():
        med, best = statistics.median(times[name]), min(times[name])
        rows.append(dict(n=n, d=d, piece=name, median_ms=med * 1e3, best_ms=best * 1e3,
                         gflops_median=gflop / med if gflop else None,
                         gflops_best=gflop / best if gflop else None))
    return rows


def render(meta: dict, rows: list[dict]) -> str:
    lines = [f"Block costs on {meta['device']}, torch {meta['torch']}, {meta['threads']} "
             f"threads, B = {BLOCK} rows, load average {meta['load_before']} -> "
             f"{meta['load_after']}, medians (best) of {meta['rounds']} rounds", "",
             "| N | d | piece | ms per block | GFLOP/s |", "|---|---|---|---|---|"]
    for r in rows:
        g = (f"{r['gflops_median']:.0f} ({r['gflops_best']:.0f})"
             if r["gflops_median"] else "–")
        lines.append(f"| {r['n']} | {r['d']} | {r['piece']} | {r['median_ms']:.3f} "
                     f"({r['best_ms']:.3f}) | {g} |")
    return "\n".join(lines) + "\n"


@loss_grid.on_device("cpu")     # the CPU engines' internals, also on a GPU machine
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--sizes", type=int, nargs="+", default=[6000])
    p.add_argument("--dims", type=int, nargs="+", default=[64])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=9, help="calls per piece per round")
    p.add_argument("--tile", type=int, default=512, help="columns per cache-sized output tile")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results"
                   / "block_costs.json")
    args = p.parse_args(argv)
    check_targets(p, "--out", args.out, args.out.with_suffix(".md"))    # before the run
    if min(args.sizes) < BLOCK or min(args.dims) < 1 or args.rounds < 1 or args.reps < 1 \
            or args.tile < 1:
        p.error(f"--sizes must be >= {BLOCK}; --dims, --rounds, --reps, --tile positive")
    before = load_average()
    rows = []
    for n in args.sizes:
        for d in args.dims:
            rows += measure(n, d, args.rounds, args.reps, args.tile)
            print(f"N {n} d {d} done", flush=True)
    meta = dict(device=device_name("cpu"), torch=torch.__version__, threads=torch.get_num_threads(),
                rounds=args.rounds, reps=args.reps, tile=args.tile, load_before=before,
                load_after=load_average(), argv=sys.argv[1:] if argv is None else argv)
    md = render(meta, rows)
    write_result(args.out, json.dumps(dict(meta=meta, rows=rows), indent=1))
    write_result(args.out.with_suffix(".md"), md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
