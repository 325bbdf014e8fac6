"""What a GPU run's loss tables say the automatic loss choice should be: the thresholds of
``ops/_dispatch.refine_loss_backend`` and the defaults of the Triton switches, derived from
``bench/loss_profile.py``'s JSON (one or more files; a later file's row replaces an earlier
one's for the same cell and engine; an ``auto`` row's time counts for the engine it picked
where its file has no row of that engine). It prints a markdown report and changes nothing: the
constants are edited by hand, with the report beside them.

    python bench/next_defaults.py docs/results/gpu_h200_2026-11-27/loss_profile_s15_call2.json
    python bench/next_defaults.py A.json B.json --md report.md

Report: per (dtype, variant, levels, d), the fastest engine at each N with its margin over the
next and how far the automatic choice of that run was from it; then the derived values:

* ``TRITON_MIN_ROWS[variant]`` (fp32): the smallest N from which a Triton engine (``triton`` or
  one of its modes) is the fastest at every larger N measured, every level count, d <=
  ``TRITON_MAX_DIM``, among the cells where a Triton engine was timed (a row past the time
  budget says nothing) — "never" where it is not the fastest at the largest such N (the
  constant may sit anywhere between the last N it loses and this one: nothing was measured
  between);
* ``TRITON_MIN_ROWS_BF16['official']``: the same for bf16 inputs (the attention kernels are
  barred there: ``IMPRECISE``);
* ``TRITON_MAX_DIM``: the widest d at which a Triton engine is the fastest exact single-level
  fp32 engine at the largest N measured for that d;
* ``ATTENTION_OFFICIAL_MIN_ROWS``: the same rule for the attention kernels against our torch
  engine, official single level, fp32;
* each Triton mode (``triton[lean]``, ``[shared]`` (several levels of the exact variant only),
  ``[shared+lean]``, ``[tf32x3+autotune]``) and the positives kernel (``torch+triton``,
  ``attention+triton``) against its base engine: in how many cells faster, the geometric mean
  of the time ratio, and a verdict ("make it the default" only where it is faster in every
  cell measured);
* ``triton[nosplit]`` (the LSE kernels without their automatic key splits) against ``triton``
  in the cells where the ``triton`` row split its keys (its ``key_splits`` > 1, recorded by
  loss_profile.py; ``kernels/_utils.KEY_SPLITS_ENV``): the inverse switch, so its verdicts say
  whether to keep the splits;
* ``triton[warps4]`` (the table's tiles with 4 warps, the default until 2026-12-05) against
  ``triton`` in the cells where the ``triton`` row's tile came from the table (its
  ``warps_decide``, recorded by loss_profile.py; ``kernels/_utils.TABLE_WARPS``): whether to
  keep 8 warps.

Exit status 2 (one line) for a file that is not loss_profile JSON, and for a ``--md`` that
is one of the input files or cannot be written (checked before reading; written atomically).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

from hiertail_fast._files import atomic_write_text, overwritten_input, unwritable_file_reason

TRITON_MODES = ("triton[lean]", "triton[shared]", "triton[shared+lean]",
                "triton[tf32x3+autotune]")
POSITIVES = {"torch+triton": "torch", "attention+triton": "attention"}
# verdicts where a switch wins every cell / none / some
VERDICTS = ("make it the default", "keep it off", "mixed: keep it off, or choose by size")
# the key splits' inverse switch, compared where the triton row split (`split_counts`)
NO_SPLIT = "triton[nosplit]"
NO_SPLIT_VERDICTS = ("turn the key splits off (HIERTAIL_TRITON_KEY_SPLITS' default to 1)",
                     "keep the key splits", "mixed: revisit KEY_SPLIT_MIN_FILL")
# the 8-warp table's inverse switch, compared where the triton row's tile came from the table
# (`table_cells`: 4 warps were the default until 2026-12-05)
WARPS4 = "triton[warps4]"
WARPS4_VERDICTS = ("go back to 4 warps (kernels/_utils.TABLE_WARPS = 4)", "keep 8 warps",
                   "mixed: choose the table's warps by dtype / size")
# the attention engine's opt-in bf16 kernel (loss_profile.ATTENTION_MODES): a switch of the
# "attention" engine, compared with it below, not an engine the automatic choice can name
CUDNN = "attention[cudnn]"
CUDNN_VERDICTS = ("run the bf16 branch on cuDNN (_attention_lse.bf16_kernel's default)",
                  "keep flash", "mixed: choose the bf16 kernel by size")
NOT_ENGINES = ("auto", CUDNN)
FASTER = 0.97      # a mode counts as faster where it takes < 97 % of its base's time
# engines the library never picks for a (dtype, variant), whatever their time: bf16 inputs'
# official variant on the attention kernels is 3.6e-2 off (flash's bf16 output against the
# official gradient's cancellation; docs/GPU_MEASUREMENTS.md)
IMPRECISE = {("bf16", "official"): ("attention",)}


def is_triton(engine: str) -> bool:
    return engine == "triton" or engine.startswith("triton[")


def load(paths: list[Path]) -> dict:
    """{(dtype, variant, levels, d, n): {engine: seconds}} and the auto rows' picks."""
    cells: dict = defaultdict(dict)
    picked: dict = {}
    for path in paths:
        here: dict = defaultdict(dict)      # this file's cells
        try:
            rows = json.loads(path.read_text())["rows"]
            for r in rows:
                if r.get("variant") in (None, "–") or r.get("median_s") is None:
                    continue
                if not all(isinstance(r.get(k), str) for k in ("what", "variant", "dtype")):
                    raise TypeError(f"a row's what / variant / dtype are not strings: {r}")
                if r["what"].startswith("profile"):
                    continue
                key = (r["dtype"], r["variant"], int(r["levels"]), int(r["d"]), int(r["n"]))
                here[key][r["what"]] = float(r["median_s"])
                if r["what"] == "auto" and "engine" in r:
                    picked[key] = r["engine"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # (AttributeError: a row that is null, or a "what" that is; an audit's find)
            raise SystemExit(
                f"next_defaults.py: {path} is not loss_profile.py JSON ({exc!r})") from None
        for key, times in here.items():
            # the "auto" row timed the engine it picked: that engine's time in this file
            # where it has no row of its own (a run timing only auto and the Triton modes
            # would otherwise leave a Triton engine alone in the cell, "fastest" whatever its
            # time; an audit of the prepared GPU run)
            engine = picked.get(key) if "auto" in times else None
            if engine is not None and engine not in NOT_ENGINES and engine not in times:
                times[engine] = times["auto"]
            cells[key].update(times)
    return cells, picked


def fastest(times: dict, key: tuple) -> tuple[str, float] | None:
    """(engine, seconds) of the fastest engine the library may pick in cell ``key``. A tie
    is no win for a Triton mode (as everywhere in this tool): on equal times a non-Triton
    engine is the fastest, then the first by name, so the answer never depends on the order
    of the JSON rows."""
    barred = NOT_ENGINES + IMPRECISE.get(key[:2], ())
    engines = {e: t for e, t in times.items() if e not in barred}
    if not engines:
        return None
    best = min(engines, key=lambda e: (engines[e], is_triton(e), e))
    return best, engines[best]


def min_rows(cells: dict, wins, select) -> int | None:
    """Smallest N from which ``wins(times)`` holds at every larger N of the selected cells
    (``select(key)``); None when it does not hold at the largest N."""
    by_n: dict = defaultdict(list)
    for key, times in cells.items():
        if select(key):
            by_n[key[4]].append((key, times))
    answer = None
    for n in sorted(by_n, reverse=True):
        if all(wins(key, t) for key, t in by_n[n]):
            answer = n
        else:
            break
    return answer


def triton_wins(key: tuple, times: dict) -> bool:
    best = fastest(times, key)
    return best is not None and is_triton(best[0])


def compare(cells: dict, mode: str, base: str, only=lambda key: True) -> tuple[int, int, float]:
    """(cells where mode is faster, cells with both, geometric mean of mode / base)."""
    ratios = [t[mode] / t[base] for key, t in cells.items()
              if only(key) and mode in t and base in t and t[base] > 0]
    if not ratios:
        return 0, 0, float("nan")
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return sum(r < FASTER for r in ratios), len(ratios), geo


def _triton_field(paths: list[Path], field: str) -> dict:
    """{(dtype, variant, levels, d, n): the cell's "triton" row's `field`}, for the rows that
    recorded it (a later file wins)."""
    found: dict = {}
    for path in paths:
        for r in json.loads(path.read_text())["rows"]:
            if r.get("what") == "triton" and field in r:
                found[r["dtype"], r["variant"], int(r["levels"]), int(r["d"]),
                      int(r["n"])] = r[field]
    return found


def split_counts(paths: list[Path]) -> dict:
    """{(dtype, variant, levels, d, n): the key splits the cell's "triton" row ran with}, for
    the rows that recorded them (loss_profile.py since 2026-12-05)."""
    return {key: int(v) for key, v in _triton_field(paths, "key_splits").items()}


def table_cells(paths: list[Path]) -> set:
    """The cells whose "triton" row took the table's tile (loss_profile.py's `warps_decide`,
    since 2026-12-05): where triton[warps4] launches differently."""
    return {key for key, v in _triton_field(paths, "warps_decide").items() if v}


def report(cells: dict, picked: dict, max_dim_now: int = 64,
           splits: dict | None = None, table: set | None = None) -> tuple[str, dict]:
    lines = ["# Loss engine choices from the measured tables", ""]
    groups: dict = defaultdict(list)
    for key in cells:
        groups[key[:4]].append(key)
    lines += ["| dtype | variant | levels | d | N | fastest | ms | next best | auto |",
              "|---|---|---|---|---|---|---|---|---|"]
    for group in sorted(groups):
        for key in sorted(groups[group], key=lambda k: k[4]):
            times = cells[key]
            best = fastest(times, key)
            if best is None:
                continue
            barred = NOT_ENGINES + IMPRECISE.get(key[:2], ())
            others = sorted((t, e) for e, t in times.items() if e not in barred and e != best[0])
            nxt = f"{others[0][1]} ({others[0][0] / best[1]:.2f}x)" if others else "–"
            auto = times.get("auto")
            auto_txt = ("–" if auto is None else
                        f"{picked.get(key, '?')} ({auto / best[1]:.2f}x)")
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]:,} | "
                         f"{best[0]} | {best[1] * 1e3:.1f} | {nxt} | {auto_txt} |")
    derived: dict = {}
    dims = sorted({k[3] for k in cells if k[0] == "fp32" and k[1] == "exact" and k[2] == 1})
    largest = {d: max((k for k in cells if k[:4] == ("fp32", "exact", 1, d)),
                      key=lambda k: k[4]) for d in dims}
    wide = [d for d in dims if triton_wins(largest[d], cells[largest[d]])]
    derived["TRITON_MAX_DIM"] = max(wide) if wide else None
    max_dim = derived["TRITON_MAX_DIM"] or max_dim_now
    def timed(key):        # a cell where some Triton engine was timed (not past a budget)
        return any(is_triton(e) for e in cells[key])

    for variant in ("exact", "official"):
        derived[f"TRITON_MIN_ROWS[{variant!r}]"] = min_rows(
            cells, triton_wins,
            lambda k, v=variant: k[0] == "fp32" and k[1] == v and k[3] <= max_dim and timed(k))
    derived["TRITON_MIN_ROWS_BF16['official']"] = min_rows(
        cells, triton_wins,
        lambda k: k[0] == "bf16" and k[1] == "official" and k[3] <= max_dim and timed(k))

    def attention_beats_torch(key, times):
        return "attention" in times and "torch" in times and times["attention"] < times["torch"]

    derived["ATTENTION_OFFICIAL_MIN_ROWS"] = min_rows(
        cells, attention_beats_torch,
        lambda k: k[:3] == ("fp32", "official", 1))
    lines += ["", "| constant | from these tables |", "|---|---|"]
    for name, value in derived.items():
        lines.append(f"| `{name}` | {'never' if value is None else f'{value:,}'} |")
    lines += ["", "| switch | against | faster in | geomean time ratio | verdict |",
              "|---|---|---|---|---|"]
    verdicts: dict = {}
    # the shared-keys modes: several levels of the exact variant (the official variant runs the
    # kernels' relative mode, which has no shared-keys form: its [shared] cells are plain ones)
    tests = [(m, "triton", (lambda k: k[2] > 1 and k[1] == "exact") if "shared" in m
              else (lambda k: True)) for m in TRITON_MODES]
    tests += [(m, base, lambda k: k[1] == "official") for m, base in POSITIVES.items()]
    tests += [(NO_SPLIT, "triton", lambda k: (splits or {}).get(k, 1) > 1)]
    tests += [(WARPS4, "triton", lambda k: k in (table or set()))]
    tests += [(CUDNN, "attention", lambda k: k[:2] == ("bf16", "exact"))]
    for mode, base, only in tests:
        won, total, geo = compare(cells, mode, base, only)
        words = {NO_SPLIT: NO_SPLIT_VERDICTS, WARPS4: WARPS4_VERDICTS,
                 CUDNN: CUDNN_VERDICTS}.get(mode, VERDICTS)
        if total == 0:
            verdict = "not measured"
        elif won == total:
            verdict = words[0]
        elif won == 0:
            verdict = words[1]
        else:
            verdict = words[2]
        verdicts[mode] = verdict
        lines.append(f"| `{mode}` | `{base}` | {won} of {total} | "
                     f"{'–' if total == 0 else f'{geo:.2f}'} | {verdict} |")
    return "\n".join(lines) + "\n", {**derived, **verdicts}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profiles", nargs="+", type=Path, help="loss_profile.py JSON files")
    p.add_argument("--md", type=Path, help="also write the report here")
    args = p.parse_args(argv)
    if args.md is not None:
        clash = overwritten_input(args.md, args.profiles)
        problem = (f"{args.md} is the input {clash}" if clash is not None
                   else unwritable_file_reason(args.md))
        if problem:
            p.error(f"--md: {problem}")
    try:
        cells, picked = load(args.profiles)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    if not cells:
        print("next_defaults.py: no loss rows in these files", file=sys.stderr)
        return 2
    text, _ = report(cells, picked, splits=split_counts(args.profiles),
                     table=table_cells(args.profiles))
    print(text, end="")
    if args.md:
        atomic_write_text(args.md, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
