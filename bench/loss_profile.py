"""Where the loss's time goes on a GPU: per-engine fwd+bwd times and a profiler breakdown.

    python bench/loss_profile.py --out DIR                 # CUDA: 20k x 64, 100k x 64, 20k x 128
    python bench/loss_profile.py --sizes 20000:64 --profile-only

bench/gpu_report.py answers "is it right and how fast, against the anchors"; this script answers
"why": for each (N, d) it times the anchors (SDPA fp32 / bf16 fwd+bwd, the cuBLAS 3-GEMM floor),
then every engine of --engines (the automatic choice, attention, torch, the Triton modes; plus
the official positives' two torch plans, band and slices: $HIERTAIL_POSITIVES) on both variants
at 1 and 3 levels, and the automatic engine on bf16 inputs. Then, at the first size, one
torch.profiler step of the automatic engine per (variant, levels, dtype): the top kernels by
device time, the top host ops by self time, the number of host<->device synchronisations and
the share of the step's wall time the device was busy (a low share: launch / sync overhead, the
thing to cut at N = 20k; a high one: the kernels themselves). Writes DIR/loss_profile.json and
.md (atomically, after every row: a run stopped by a device call's limit keeps what it got).

Rows use bench/gpu_report.py's inputs and timing (CUDA events, a warm-up each, the engines of one
(variant, levels, dtype) timed round-robin, median of --reps).
``--device cpu`` runs the same code at a tiny size (its test in CI).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _gpu_checks as gc  # noqa: E402
import gpu_report  # noqa: E402

from hiertail_fast._files import unwritable_dir_reason  # noqa: E402

# engine label -> (backend, environment) of the official positives' plans ($HIERTAIL_POSITIVES)
POSITIVE_PLANS = {"torch+band": ("torch", {"HIERTAIL_POSITIVES": "band"}),
                  "torch+slices": ("torch", {"HIERTAIL_POSITIVES": "slices"}),
                  "torch+triton": ("torch", {"HIERTAIL_POSITIVES": "triton"}),
                  "attention+triton": ("attention", {"HIERTAIL_POSITIVES": "triton"})}
# the attention engine's opt-in bf16 kernel (cuDNN on the folded operands, flash the default):
# label -> (backend, environment); bf16 rows only (fp32 runs the memory-efficient kernel)
ATTENTION_MODES = {"attention[cudnn]": ("attention", {"HIERTAIL_ATTENTION_BF16": "cudnn"})}
ENGINES = ("auto", "attention", "attention[cudnn]", "torch", "torch+slices", "torch+triton",
           "attention+triton",
           "triton", "triton[tf32x3]",
           "triton[lean]", "triton[shared]", "triton[shared+lean]", "triton[nosplit]",
           "triton[warps4]", "triton[autotune]", "triton[tf32x3+autotune]")
DEFAULT_ENGINES = ("auto", "attention", "torch", "torch+slices", "triton")
BF16_ENGINES = ("auto", "attention", "attention[cudnn]", "torch", "triton",  # (no fp32-dot
                "triton[lean]", "triton[shared]", "triton[shared+lean]",  # modes)
                "triton[nosplit]", "triton[warps4]")
DEFAULT_SIZES = {"cuda": ["20000:64", "100000:64", "20000:128"], "cpu": ["200:16"]}


@contextlib.contextmanager
def engine_mode(label: str):
    """Yields the `backend=` argument of engine `label` with its environment set: "auto" ->
    None, a positives plan -> its engine with $HIERTAIL_POSITIVES, else gpu_report's labels."""
    if label == "auto":
        yield None
    elif label in POSITIVE_PLANS:
        backend, env = POSITIVE_PLANS[label]
        with gc.environment(env):
            yield backend
    elif label in ATTENTION_MODES:
        backend, env = ATTENTION_MODES[label]
        with gc.environment(env), _refusals_raise():
            yield backend
    else:
        with gc.backend_mode(label) as bk:
            yield bk


@contextlib.contextmanager
def _refusals_raise():
    """An opt-in kernel that refuses a call must not be timed as itself: the library then falls
    back to its own engine (by design, unsaid), so here a refusal ends the step with an error,
    which the timing reports as the row's (a review's find: a cuDNN refusal timed the torch
    engine as attention[cudnn], and next_defaults would have judged cuDNN by it)."""
    from hiertail_fast.ops import _attention_lse as al

    real = al._call_folded

    def strict(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        except al.AttentionUnavailable as exc:
            raise RuntimeError(f"the opt-in kernel refused the call: {exc}") from exc
    al._call_folded = strict
    try:
        yield
    finally:
        al._call_folded = real


def make_step(z, y, protos, variant: str, levels: int, dtype: torch.dtype, label: str):
    """One fwd+bwd of the loss on engine `label` (fresh leaves in `dtype`)."""
    return gc.loss_step(z, y, protos, variant, levels, dtype, lambda: engine_mode(label))


def timed_cases(engines, dev: str) -> list[tuple[str, int, torch.dtype, str]]:
    """(variant, levels, dtype, engine label) of the rows ``time_rows`` times at each size:
    every engine on both variants at 1 and 3 levels in fp32, the bf16 engines in bf16, less
    the rows that would time nothing new."""
    cases = [(v, lv, torch.float32, e) for v in ("exact", "official") for lv in (1, 3)
             for e in engines]
    cases += [(v, lv, torch.bfloat16, e) for v in ("exact", "official") for lv in (1, 3)
              for e in engines if e in BF16_ENGINES]
    kept = []
    for variant, levels, dtype, label in cases:
        if label.startswith("triton") and dev != "cuda":
            continue
        if label in gc.MULTI_LEVEL_MODES and (levels == 1 or variant == "official"):
            # the mode serves several levels of the exact variant only: one level, or the
            # official variant (its relative mode has no shared-keys form, ops/
            # balanced_contrastive_loss), would time plain "triton" / "triton[lean]" again
            continue
        if gc.autotuned(label):
            continue    # tuning compiles every tile: last, at the first size (tuned_rows)
        if label in POSITIVE_PLANS and variant != "official":
            continue
        if label in ATTENTION_MODES and (dtype != torch.bfloat16 or variant != "exact"):
            # the fp32 rows run the memory-efficient kernel either way, and the official
            # variant's bf16 rows never run the bf16 kernels (their precision guard)
            continue
        kept.append((variant, levels, dtype, label))
    return kept


def tuned_reserve(engines, dev: str) -> float:
    """Seconds of the budget kept back from the timed rows for ``tuned_rows``: enough to start
    one autotuned row (it starts with half of gpu_report.AUTOTUNE_NEED_S left); they run after
    every size, and without a reserve the sizes before spent the whole budget (the 2026-11-27
    GPU run skipped them)."""
    if dev != "cuda" or not any(gc.autotuned(e) for e in engines):
        return 0.0
    return gpu_report.AUTOTUNE_NEED_S / 2


def time_rows(dev, n, d, engines, reps, deadline, add) -> None:
    """The anchors, timed round-robin with each other, then the engines of each (variant,
    levels, dtype) round-robin with each other (gpu_report._time_group: the rows a choice
    between engines compares share the machine's drift)."""
    z, y, protos = (t.to(dev) for t in gc.loss_inputs(n, d))
    budget = gpu_report.Budget(max(1.0, deadline - time.perf_counter()), deadline, reps)
    gpu_report._time_group(dev, [(dict(n=n, d=d, variant="–", what=what), step, 5.0)
                                 for what, step in gpu_report._anchor_steps(n, z).items()],
                           budget, add)
    groups: dict[tuple, list] = {}
    for variant, levels, dtype, label in timed_cases(engines, dev):
        row = dict(n=n, d=d, variant=variant, levels=levels,
                   dtype=gpu_report.DTYPES[dtype], what=label)
        if label == "auto":
            row["engine"] = gc.auto_engine(z, protos, variant, levels, dtype)
        if label == "triton":     # the key splits its kernels take here, and whether their
            # tile comes from the table whose warps triton[warps4] changes (next_defaults.py)
            row["key_splits"] = gc.auto_key_splits(n + protos.shape[0], d, dev, dtype)
            row["warps_decide"] = gc.warps_decide(n + protos.shape[0], d, dev, dtype)
        groups.setdefault((variant, levels, dtype), []).append((row, make_step(
            z, y, protos, variant, levels, dtype, label), 5.0))
    for group in groups.values():
        gpu_report._time_group(dev, group, budget, add)


def tuned_rows(dev, n, d, engines, reps, deadline, add) -> None:
    """The autotuned Triton modes on the exact loss at (n, d), after every other row: the first
    call compiles and times every candidate tile (gpu_report.AUTOTUNE_NEED_S of budget)."""
    z, y, protos = (t.to(dev) for t in gc.loss_inputs(n, d))
    for label in [e for e in engines if gc.autotuned(e)]:
        for levels in (1, 3):
            row = dict(n=n, d=d, variant="exact", levels=levels, dtype="fp32", what=label)
            if dev != "cuda":
                continue
            if deadline - time.perf_counter() < gpu_report.AUTOTUNE_NEED_S / 2:
                row["error"] = "skipped: time budget"
            else:
                step = make_step(z, y, protos, "exact", levels, torch.float32, label)
                row.update(gc.guarded(lambda s=step: gc.time_call(s, dev, reps)))
                row["tiles"] = gc.tuned_tiles()     # which tiles the tuning picked
            add(row)


def profile_rows(dev, n, d, add) -> None:
    """One profiled step of the automatic engine per (variant, levels, dtype): gpu_report's
    profile rows (``_profile_rows``), without its time budget."""
    z, y, protos = (t.to(dev) for t in gc.loss_inputs(n, d))
    engines = {(n, d, variant, levels, dtype): gc.auto_engine(z, protos, variant, levels, dtype)
               for variant in ("exact", "official") for levels in (1, 3)
               for dtype in gpu_report.DTYPES}
    gpu_report._profile_rows(dev, (n, d), (z, y, protos), engines,
                             gpu_report.Budget(float("inf")), add)


def _ratio(seconds: float, anchor: float | None) -> str:
    return f"{seconds / anchor:.2f}" if anchor else "–"


def render(report: dict) -> str:
    lines = [f"# Loss profile on {report['device']} ({report['when']}, torch {report['torch']}, "
             f"{gc.load_note(report)})",
             "", "| N | d | variant | levels | dtype | engine | ms | ÷ SDPA (same dtype) "
             "| ÷ floor |",
             "|---|---|---|---|---|---|---|---|---|"]
    anchors = {}
    for r in report["rows"]:
        if r.get("variant") == "–" and "median_s" in r:
            anchors[r["n"], r["d"], r["what"]] = r["median_s"]
    for r in report["rows"]:
        if r.get("variant") == "–" or r["what"].startswith("profile"):
            continue
        sdpa = anchors.get((r["n"], r["d"], f"SDPA {r['dtype']} fwd+bwd"))
        floor = anchors.get((r["n"], r["d"], gpu_report.FLOOR))
        what = r["what"] + (f" → {r['engine']}" if "engine" in r else "")
        if "median_s" in r:
            s = r["median_s"]
            cells = f"{s * 1e3:.2f} | {_ratio(s, sdpa)} | {_ratio(s, floor)}"
        else:
            cells = f"{r.get('error', '?')} | | "
        lines.append(f"| {r['n']} | {r['d']} | {r['variant']} | {r['levels']} | {r['dtype']} | "
                     f"{what} | {cells} |")
    lines += ["", "Anchors: " + "; ".join(f"{k[0]}×{k[1]} {k[2]} {v * 1e3:.2f} ms"
                                          for k, v in anchors.items())]
    for r in report["rows"]:
        if r.get("tiles"):
            lines += ["", f"Tiles autotuned by the {r['what']} row ({r['levels']} level(s), "
                          f"N {r['n']}, d {r['d']}; all tuned so far):"]
            lines += [f"- {which}: `{line}`" for which, got in r["tiles"].items() for line in got]
    for r in report["rows"]:
        if not r["what"].startswith("profile"):
            continue
        lines += ["", f"## Profile: {r['variant']}, {r['levels']} level(s), {r['dtype']}, "
                      f"N {r['n']}, d {r['d']}, engine {r.get('engine')}"]
        if "error" in r:
            lines.append(f"error: {r['error']}")
            continue
        busy = r["device_busy_s"]
        lines.append(f"wall {r['seconds'] * 1e3:.2f} ms (profiled), device busy "
                     f"{'–' if busy is None else f'{busy * 1e3:.2f} ms'}, aten ops {r['ops']}, "
                     f"syncs {r['syncs']}")
        lines += ["", "| kernel | calls | device ms |", "|---|---|---|"]
        lines += [f"| `{k}` | {c} | {t:.3f} |" for k, c, t in r["top_kernels"]]
        lines += ["", "| host op | calls | self ms |", "|---|---|---|"]
        lines += [f"| `{k}` | {c} | {t:.3f} |" for k, c, t in r["top_host"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--sizes", nargs="+", type=gc.size_arg, help="N:d pairs (default per device)")
    p.add_argument("--engines", nargs="+", choices=ENGINES, default=list(DEFAULT_ENGINES))
    p.add_argument("--budget", type=float, default=150.0, help="seconds for the timed rows")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--profile-only", action="store_true")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("loss_profile: no CUDA device (use --device cpu for the CPU test mode)")
        return 2
    sizes = args.sizes or [gc.size_arg(s) for s in DEFAULT_SIZES[args.device]]
    reason = unwritable_dir_reason(args.out)
    if reason:
        p.error(f"--out: {reason}")
    args.out.mkdir(parents=True, exist_ok=True)
    report = dict(device=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                  when=time.strftime("%Y-%m-%d %H:%M"), torch=torch.__version__,
                  argv=sys.argv[1:] if argv is None else argv, rows=[],
                  load_average_start=gc.load_average(), load_average_end=None)

    def add(row: dict) -> None:
        report["rows"].append(row)
        gc.write_json(args.out / "loss_profile.json", report)
        gc.atomic_write_text(args.out / "loss_profile.md", render(report))

    if not args.profile_only:
        deadline = time.perf_counter() + args.budget
        rows_deadline = deadline - tuned_reserve(args.engines, args.device)
        for n, d in sizes:
            time_rows(args.device, n, d, args.engines, args.reps, rows_deadline, add)
        tuned_rows(args.device, *sizes[0], args.engines, args.reps, deadline, add)
    if not args.no_profile:
        profile_rows(args.device, *sizes[0], add)
    report["load_average_end"] = gc.load_average()
    gc.write_json(args.out / "loss_profile.json", report)
    gc.atomic_write_text(args.out / "loss_profile.md", render(report))
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
