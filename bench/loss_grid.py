"""The fused loss over a grid of input regimes, against the GEMM floor, timed ROUND-ROBIN.

Cells: N x d x tau x embedding regime x levels x variant. Per cell, forward + backward of
``balanced_contrastive_loss`` (1 level: N nodes + 40 prototypes, Zipf labels over 40 classes)
or ``hierarchical_contrastive_loss`` (3 levels: 40 / 20 / 10 prototypes, labels y, y // 2,
y // 4) for each loss backend, and two anchors computed the way the library could at best
do it (row blocks of ~48 MB into one reused buffer, so no first-touch page faults):

    floor      3 x Z Z^T (the GEMMs any exact fused loss needs: forward + two gradient sides)
    floor+exp  the same plus one exp pass over every block (the minimum element-wise work; the
               products are clamped into [-C, 0] first (C = the library's exp cut-off, 50 in
               fp32), the range a max-shifted exp needs: exp of the raw huge products would
               overflow, and exp far below -87 takes exp's slow path; either would slow the
               anchor down and flatter the ratio)

Regimes: ``normalised`` (unit rows), ``relu`` (relu(randn) / sqrt(d)), ``randn`` (wide:
most keys ~100 below the row max at tau <= 0.5), ``randn30`` (|s| to ~1e4 and beyond).
Providers (``--backends``): ``torch``, ``attention``, ``rowblock`` (below) and ``auto`` (no
backend=: what a user gets). ``--dtype bfloat16|float16`` feeds the loss 16-bit rows (the
anchors stay float32: the engines compute in float32).
Every round calls each provider once in turn, so machine drift hits all alike. Reports the
median per provider and ``ratio`` = backend median / floor+exp median, and the best-of-rounds
ratio (best backend time / best floor+exp time: contention on a shared host only adds time,
so this one estimates the code's own cost; ``bench/vm_noise.py`` shows how much it adds); the
issue's target is <= 1.5. A summary per (N, levels, variant), and official / exact per cell
when both variants ran: of the medians, of the best rounds, and paired round by round (the two
variants of an engine run back to back in every round, so the VM's drift, which moves the
GEMM speed by up to 2x within seconds, cancels in each round's ratio). JSON (+ markdown, with
every round's times) to bench/results/loss_grid.{json,md}, with the load average before and
after (figures from a loaded machine are not figures of the library); ``--report JSON``
re-renders an earlier run in this format.

    python bench/loss_grid.py --sizes 6000 --dims 64 128 --rounds 3
    python bench/loss_grid.py --sizes 20000 --taus 0.1 1 --regimes relu randn30 --rounds 2
    python bench/loss_grid.py --dtype bfloat16 --levels 1 --variants exact --backends auto attention
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _device import DEVICE, device_name  # noqa: E402
from _gpu_checks import environment, nested_levels  # noqa: E402
from _results import check_targets, write_result  # noqa: E402

import hiertail_fast.ops._native as native_mod  # noqa: E402
from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss  # noqa: E402
from hiertail_fast._argparse import positive, temperature_arg  # noqa: E402
from hiertail_fast.ops._lse_symmetric import ENV_VAR as SYMMETRIC_ENV  # noqa: E402
from hiertail_fast.ops._lse_torch import exp_cutoff  # noqa: E402

REGIMES = ("normalised", "relu", "randn", "randn30")
# "rowblock": the torch backend with the symmetric engine switched off (HIERTAIL_SYMMETRIC=0),
# i.e. the row-block engine, for A/Bs of the two on one-level cells (on 3 levels they are one);
# "auto": no backend= (the library's automatic choice for the call's device, dtype and size)
BACKENDS = ("torch", "attention", "rowblock", "auto")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_BACKENDS = ("torch", "attention")
N_CLASSES = 40


def on_device(device: str):
    """Decorator: while the decorated function runs, this module's cases and anchors go to
    `device` (default: CUDA when present). The tools that A/B the CPU engines' internals
    (engine_ab, block_costs, version_ab) pin "cpu" on their main, so that on a GPU machine they
    still measure what they are about."""
    def wrap(fn):
        @functools.wraps(fn)
        def pinned(*args, **kwargs):
            global DEVICE
            before, DEVICE = DEVICE, device
            try:
                return fn(*args, **kwargs)
            finally:
                DEVICE = before
        return pinned
    return wrap


def embeddings(regime: str, n: int, d: int, gen: torch.Generator) -> torch.Tensor:
    z = torch.randn(n, d, generator=gen)
    if regime == "normalised":
        return z / z.norm(dim=1, keepdim=True)
    if regime == "relu":
        return torch.relu(z) / d ** 0.5
    if regime == "randn":
        return z
    if regime == "randn30":
        return z * 30.0
    raise ValueError(f"regime={regime!r} is not one of {REGIMES}")


def make_case(regime: str, n: int, d: int, levels: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    probs = 1.0 / torch.arange(1, N_CLASSES + 1, dtype=torch.float64)
    y = torch.multinomial(probs, n, replacement=True, generator=gen)
    z = embeddings(regime, n, d, gen)
    protos = embeddings(regime, N_CLASSES, d, gen)
    ys, ps = nested_levels(y, protos, levels)
    return z.to(DEVICE), [t.to(DEVICE) for t in ys], [p.to(DEVICE) for p in ps]


def loss_step(backend: str, z, ys, ps, tau: float, variant: str):
    switch = {SYMMETRIC_ENV: "0"} if backend == "rowblock" else {}
    engine = {"rowblock": "torch", "auto": None}.get(backend, backend)

    def step():
        with environment(switch):
            zz = z.detach().requires_grad_()
            if len(ys) == 1:
                loss = balanced_contrastive_loss(zz, ys[0], prototypes=ps[0], temperature=tau,
                                                 variant=variant, backend=engine)
            else:
                loss = hierarchical_contrastive_loss(zz, ys, ps, temperature=tau,
                                                     variant=variant, backend=engine)
            loss.backward()
        _sync()
    return step


_FLOOR_BUFFERS: dict = {}


def _floor_buffer(rows: int, n: int, like: torch.Tensor) -> torch.Tensor:
    """One reused [rows, n] buffer per shape: every cell's anchors share it (a grid whose cells
    all stay alive, ``--order interleaved``, would otherwise hold 48 MB per anchor)."""
    key = (rows, n, like.dtype, str(like.device))
    if key not in _FLOOR_BUFFERS:
        _FLOOR_BUFFERS[key] = torch.empty(rows, n, dtype=like.dtype, device=like.device)
    return _FLOOR_BUFFERS[key]


def floor_step(z, ps, with_exp: bool):
    """3 x (row blocks of Z_all Z_all^T into one reused buffer) [+ one in-place exp]."""
    z_all = torch.cat([z] + list(ps)).contiguous()
    n = z_all.shape[0]
    rows = max(8, min(n, (48 << 20) // (4 * n)))
    buf = _floor_buffer(rows, n, z_all)
    zt = z_all.t()
    cutoff = exp_cutoff(z_all.dtype)

    def step():
        for k in range(3):
            for r0 in range(0, n, rows):
                r1 = min(n, r0 + rows)
                out = torch.mm(z_all[r0:r1], zt, out=buf[: r1 - r0])
                if with_exp and k == 0:
                    # exp of values in [-C, 0], as a shifted LSE with the cut-off needs
                    out.clamp_(min=-cutoff, max=0.0).exp_()
        _sync()
    return step


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def gemm_probe(rows: int = 256, n: int = 20000, d: int = 64, reps: int = 50) -> float:
    """GFLOP/s of a [rows, d] x [d, n] product (median of reps): the VM's speed at the time
    of a run (this project's VMs swing between ~60 and ~170 GFLOP/s on it), recorded before
    and after every grid so runs from different spells can be told apart."""
    a = torch.randn(rows, d, device=DEVICE)
    b = torch.randn(n, d, device=DEVICE)
    out = torch.empty(rows, n, device=DEVICE)
    for _ in range(3):
        torch.mm(a, b.t(), out=out)
    times = []
    for _ in range(reps):
        _sync()
        start = time.perf_counter()
        torch.mm(a, b.t(), out=out)
        _sync()
        times.append(time.perf_counter() - start)
    return round(2 * rows * n * d / statistics.median(times) / 1e9, 1)


def _case_steps(case, variants, backends, dtype=torch.float32):
    """The steps of one case (N, d, L, regime, tau): every variant on every engine, the
    variants of an engine back to back (official right after exact: a per-round ratio of the
    two compares like with like on a VM whose speed drifts within seconds), then the anchors,
    which every variant's record shares (the same data, so the same floor). `dtype`: the
    loss's inputs (``--dtype``; the anchors stay float32, the precision the engines compute in)."""
    n, d, levels, regime, tau = case
    z, ys, ps = make_case(regime, n, d, levels)
    zl, pl = z.to(dtype), [p.to(dtype) for p in ps]
    steps = {f"{v}:{b}": loss_step(b, zl, ys, pl, tau, v) for b in backends for v in variants}
    steps["floor"] = floor_step(z, ps, with_exp=False)
    steps["floor+exp"] = floor_step(z, ps, with_exp=True)
    return steps


def _case_records(case, times, variants, backends) -> list[dict]:
    n, d, levels, regime, tau = case
    out = []
    for v in variants:
        t = {b: times[f"{v}:{b}"] for b in backends}
        t["floor"], t["floor+exp"] = times["floor"], times["floor+exp"]
        out.append(_record((n, d, levels, v, regime, tau), t, backends))
    return out


def _time_once(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def _record(cell, times, backends):
    n, d, levels, variant, regime, tau = cell
    med = {name: statistics.median(ts) for name, ts in times.items()}
    best = {k: min(v) for k, v in times.items()}
    return dict(n=n, d=d, levels=levels, variant=variant, regime=regime, tau=tau,
                median_s=med, min_s=best, ratio_to_floor_exp=_ratios(med, backends),
                # best of rounds over best of rounds: contention on a shared host only ever
                # adds time, so the minimum is the estimate of the uncontended cost
                min_ratio_to_floor_exp=_ratios(best, backends),
                times_s={k: list(v) for k, v in times.items()})      # per round, in order


def _ratios(seconds: dict, backends) -> dict:
    return {b: seconds[b] / seconds["floor+exp"] for b in backends}


def _print_record(i, total, rec, backends):
    med = rec["median_s"]
    best = _best(rec, backends)
    print(f"[{i}/{total}] n={rec['n']} d={rec['d']} L={rec['levels']} {rec['variant']:8s} "
          f"{rec['regime']:10s} tau={rec['tau']:<5g} "
          + "  ".join(f"{k} {v:.3f}s" for k, v in med.items())
          + f"  best {best} {med[best] / med['floor+exp']:.2f}x floor+exp", flush=True)


def _timed_rounds(step_sets: list[dict], rounds: int, progress: bool = False) -> list[dict]:
    """Warm every step up once, then ``rounds`` rounds that each visit every set once (the
    start rotating round by round), a set's providers back to back. -> per set, name -> [s]."""
    for steps in step_sets:
        for step in steps.values():
            step()                                                  # warm-up
    times = [{name: [] for name in steps} for steps in step_sets]
    for r in range(rounds):
        shift = (r * len(step_sets)) // rounds                      # rotate the visiting order
        for k in range(len(step_sets)):
            c = (k + shift) % len(step_sets)
            for name, step in step_sets[c].items():
                times[c][name].append(_time_once(step))
        if progress:
            print(f"round {r + 1}/{rounds} done", flush=True)
    return times


def run_grid(args) -> list[dict]:
    """Time every cell. A case (N, d, L, regime, tau) holds every variant's cell and their
    shared anchors (``_case_steps``). ``--order cells``: one case at a time (all its rounds,
    then the next). ``--order interleaved`` (default): every round visits every case (in a
    rotated order), so a slow spell of the machine (minutes of drift, seen on this project's
    VMs) spreads over all cells instead of sinking the few that happen to run during it;
    within a case the providers always alternate, so the ratios compare like with like either
    way. Records come in the order N, d, L, variant, regime, tau."""
    dtype = DTYPES[args.dtype]
    cases = [(n, d, levels, regime, tau)
             for n in args.sizes for d in args.dims for levels in args.levels
             for regime in args.regimes for tau in args.taus]
    if args.order == "cells":                   # one case's data alive at a time
        all_times = [_timed_rounds([_case_steps(case, args.variants, args.backends, dtype)],
                                   args.rounds)[0] for case in cases]
    else:
        all_times = _timed_rounds([_case_steps(case, args.variants, args.backends, dtype)
                                   for case in cases], args.rounds, progress=True)
    by_cell = {(r["n"], r["d"], r["levels"], r["variant"], r["regime"], r["tau"]): r
               for case, times in zip(cases, all_times, strict=True)
               for r in _case_records(case, times, args.variants, args.backends)}
    records = [by_cell[(n, d, levels, v, regime, tau)]
               for n in args.sizes for d in args.dims for levels in args.levels
               for v in args.variants for regime in args.regimes for tau in args.taus]
    for i, rec in enumerate(records, 1):
        _print_record(i, len(records), rec, args.backends)
    return records


def markdown(records: list[dict], backends) -> str:
    head = ("| N | d | L | variant | regime | tau | " + " | ".join(backends)
            + " | floor | floor+exp | " + " | ".join(f"{b} / floor+exp" for b in backends)
            + " | " + " | ".join(f"{b} / floor+exp (min)" for b in backends) + " |")
    lines = [head, "|" + "---|" * (8 + 3 * len(backends))]
    for r in records:
        m = r["median_s"]
        lines.append(
            f"| {r['n']} | {r['d']} | {r['levels']} | {r['variant']} | {r['regime']} | "
            f"{r['tau']:g} | " + " | ".join(f"{m[b]:.3f}" for b in backends)
            + f" | {m['floor']:.3f} | {m['floor+exp']:.3f} | "
            + " | ".join(f"{r['ratio_to_floor_exp'][b]:.2f}" for b in backends) + " | "
            + " | ".join(f"{r['min_ratio_to_floor_exp'][b]:.2f}" for b in backends) + " |")
    return "\n".join(lines)


def summary(records: list[dict], backends, limit: float = 1.5) -> str:
    """Per (N, levels, variant): the best engine's ratio to floor + exp over the cells, from
    the medians and from the best-of-rounds times, with the count of cells above ``limit``."""
    groups: dict = {}
    for r in records:
        groups.setdefault((r["n"], r["levels"], r["variant"]), []).append(r)
    lines = ["| N | L | variant | cells | best engine / floor+exp, medians | cells > "
             f"{limit:g} | same, best of rounds | cells > {limit:g} |", "|---" * 8 + "|"]
    for (n, levels, variant), rs in sorted(groups.items()):
        cols = [_spread_cols([min(r[key][b] for b in backends) for r in rs], limit)
                for key in ("ratio_to_floor_exp", "min_ratio_to_floor_exp")]
        lines.append(f"| {n} | {levels} | {variant} | {len(rs)} | " + " | ".join(cols) + " |")
    return "\n".join(lines + _official_over_exact(records, backends))


def _best(rec: dict, backends) -> str:
    return min(backends, key=lambda b: rec["median_s"][b])


def paired_ratio(official: dict, exact: dict, backends) -> float | None:
    """Median over the rounds of official / exact, each round's two times taken back to back
    (``_case_steps``), each variant on its best engine by median; None for runs from before
    the per-round times were recorded (or whose variants were timed apart)."""
    if "times_s" not in official or "times_s" not in exact:
        return None
    a = official["times_s"][_best(official, backends)]
    b = exact["times_s"][_best(exact, backends)]
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def _official_over_exact(records: list[dict], backends, limit: float = 1.3) -> list[str]:
    """Official / exact per cell (the best engine of each, same N, d, L, regime, tau), from
    the medians, from the best-of-rounds times and, where recorded, paired round by round
    (``paired_ratio``); [] when the grid lacks either variant."""
    by_cell = {(r["n"], r["d"], r["levels"], r["regime"], r["tau"], r["variant"]): r
               for r in records}
    groups: dict = {}
    for (n, d, levels, regime, tau, variant), r in by_cell.items():
        exact = by_cell.get((n, d, levels, regime, tau, "exact"))
        if variant != "official" or exact is None:
            continue
        groups.setdefault((n, levels), []).append(
            [min(r[k][b] for b in backends) / min(exact[k][b] for b in backends)
             for k in ("median_s", "min_s")] + [paired_ratio(r, exact, backends)])
    if not groups:
        return []
    paired = all(p[2] is not None for ps in groups.values() for p in ps)
    head = (f"| N | L | cells | official / exact, medians | cells > {limit:g} | same, best "
            f"of rounds | cells > {limit:g} |")
    if paired:
        head += f" same, paired by round (median) | cells > {limit:g} |"
    lines = ["", head, "|---" * (9 if paired else 7) + "|"]
    for (n, levels), pairs in sorted(groups.items()):
        cols = [_spread_cols([p[k] for p in pairs], limit) for k in ((0, 1, 2) if paired
                                                                     else (0, 1))]
        lines.append(f"| {n} | {levels} | {len(pairs)} | " + " | ".join(cols) + " |")
    return lines


def _spread_cols(values: list[float], limit: float) -> str:
    """Two table cells: 'min-max (median m)' and the count of values above ``limit``."""
    return (f"{min(values):.2f}-{max(values):.2f} (median {statistics.median(values):.2f}) | "
            f"{sum(x > limit for x in values)}")


def _native_words(meta: dict) -> str:
    """Whether the CPU engine ran with its C kernels (runs before they existed: nothing)."""
    if "native_kernels" not in meta:
        return ""
    if not meta["native_kernels"]:
        return "C kernels off (torch path), "
    threaded = meta.get("native_threads")          # runs before the OpenMP builds: nothing
    return "C kernels on" + ("" if threaded is None else " (on torch's OpenMP threads)"
                             if threaded else " (serial build)") + ", "


def write_report(out: Path, meta: dict, records: list[dict], backends) -> str:
    """JSON + markdown (summary, then every cell) next to it; returns the markdown."""
    md = summary(records, backends) + "\n\n" + markdown(records, backends)
    write_result(out, json.dumps(dict(meta, records=records), indent=1))
    probe = (f"GEMM probe {meta['gemm_gflops_before']} -> {meta['gemm_gflops_after']} "
             "GFLOP/s ([256, 64] x [64, 20000]), " if "gemm_gflops_before" in meta else "")
    write_result(out.with_suffix(".md"),
                      f"Loss grid on {meta['device']}, torch {meta['torch']}, {meta['threads']} "
                      f"threads, {_native_words(meta)}{meta.get('dtype', 'float32')} inputs, "
                      f"load average "
                      f"{meta['load_average_before']} -> {meta['load_average_after']}, {probe}"
                      f"medians of {meta['rounds']} rounds "
                      f"({meta.get('order', 'cells')} order; seconds; \"(min)\": best of the "
                      f"rounds over the best of the rounds)\n\n{md}\n")
    return md


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--sizes", type=int, nargs="+", default=[6000])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--taus", type=temperature_arg, nargs="+", default=[0.01, 0.1, 1.0, 10.0])
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=list(REGIMES))
    parser.add_argument("--levels", type=int, nargs="+", choices=[1, 3], default=[1, 3])
    parser.add_argument("--variants", nargs="+", choices=["exact", "official"],
                        default=["exact", "official"])
    parser.add_argument("--backends", nargs="+", choices=BACKENDS,
                        default=list(DEFAULT_BACKENDS))
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="the loss's input dtype (the anchors stay float32)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--order", choices=["interleaved", "cells"], default="interleaved",
                        help="interleaved: every round visits every cell (drift spreads over "
                        "all cells); cells: one cell's rounds after another")
    parser.add_argument("--threads", type=positive(int), help="torch threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results"
                        / "loss_grid.json")
    parser.add_argument("--report", type=Path, metavar="JSON",
                        help="only rewrite the markdown of an earlier run's JSON (and the JSON "
                        "itself, with the records' derived ratios) in this version's format")
    args = parser.parse_args(argv)
    if args.report is not None:
        try:
            return _rewrite(args.report)
        except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
            parser.error(f"--report {args.report}: not a loss_grid JSON ({err!r})")
    if min(args.sizes) < 1 or min(args.dims) < 1 or args.rounds < 1:
        parser.error("--sizes, --dims and --rounds must be positive")
    check_targets(parser, "--out", args.out, args.out.with_suffix(".md"))
    if args.threads:
        torch.set_num_threads(args.threads)
    before = load_average()
    probe_before = gemm_probe()
    print(f"loss grid on {device_name()}, torch {torch.__version__}, load average {before}, "
          f"GEMM probe {probe_before} GFLOP/s")
    start = time.perf_counter()
    records = run_grid(args)
    wall = time.perf_counter() - start
    after = load_average()
    probe_after = gemm_probe()
    kernels = [native_mod.load(name, openmp=True) for name in ("_positive_blocks", "_block_exp")]
    meta = dict(device=device_name(), torch=torch.__version__, threads=torch.get_num_threads(),
                native_kernels=all(lib is not None for lib in kernels),
                native_threads=all(lib is not None and lib.threaded for lib in kernels),
                rounds=args.rounds, order=args.order, dtype=args.dtype,
                load_average_before=before,
                load_average_after=after, gemm_gflops_before=probe_before,
                gemm_gflops_after=probe_after, wall_s=wall,
                argv=sys.argv[1:] if argv is None else argv)
    md = write_report(args.out, meta, records, args.backends)
    print(md)
    print(f"load average {before} -> {after}, GEMM probe {probe_before} -> {probe_after} "
          f"GFLOP/s; wrote {args.out} and .md")
    return 0


def _rewrite(path: Path) -> int:
    data = json.loads(path.read_text())
    records = data.pop("records")
    backends = [b for b in BACKENDS if b in records[0]["median_s"]]
    for r in records:               # runs from before the best-of-rounds ratios lack them
        r["min_ratio_to_floor_exp"] = _ratios(r["min_s"], backends)
    print(write_report(path, data, records, backends))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
