"""``sensitivity``: the hyper-parameter figures (paper ``fig:hyperparameter``: bAcc over weight γ ×
temperature τ; appendix ``fig:hyperappendix``: activation, hidden size, dropout, run with γ = 0.01,
τ = 0.01 as the appendix says). The paper's figures carry no numbers in its source, so only ours
are drawn (a heatmap and line plots per dataset); its claim to check: bAcc varies by < 5 points
over the grid, slightly lower when both γ and τ are large."""
from __future__ import annotations

import math

from hiertail_fast.experiments.common import Context, check_distinct, hiertail_config
from hiertail_fast.experiments.paper_numbers import SENSITIVITY_GRID
from hiertail_fast.experiments.runner import RunSpec, fmt, summarize

TITLE = "Hyper-parameter sensitivity (γ × τ; activation, hidden size, dropout)"
OPTIONS = ("config", "parts", "gammas", "taus", "activations", "hiddens", "dropouts")
RUNS_BASELINES = False      # HierTail only: --adj-norm (baselines') is refused
PARTS = ("grid", "activation", "hidden", "dropout")


def _items(text: str, option: str) -> list[str]:
    items = [v.strip() for v in text.split(",") if v.strip()]
    if not items:
        raise ValueError(f"{option} {text!r} gives no value")
    return items


def _floats(text: str, option: str = "the sweep") -> list[float]:
    """Comma-separated finite numbers, each once."""
    out = []
    for v in _items(text, option):
        try:
            x = float(v)
        except ValueError:
            raise ValueError(f"{option}: expected comma-separated numbers, got {v!r}") from None
        if not math.isfinite(x):
            raise ValueError(f"{option}: {v!r} is not a finite number")
        out.append(x)
    check_distinct(option, out)
    labels: dict[str, float] = {}
    for x in out:                                          # the rows' labels (and run keys)
        if f"{x:g}" in labels:
            raise ValueError(f"{option}: {labels[f'{x:g}']!r} and {x!r} share the row label "
                             f"{x:g} (6 significant digits): give values that differ there")
        labels[f"{x:g}"] = x
    return out


def _ints(text: str, option: str) -> list[int]:
    """Comma-separated integers >= 1, each once (16.7 or inf is refused, not truncated)."""
    out = []
    for v in _items(text, option):
        try:
            x = int(v)
        except ValueError:
            raise ValueError(f"{option}: {v!r} is not an integer") from None
        if x < 1:
            raise ValueError(f"{option}: {v!r} must be >= 1")
        out.append(x)
    check_distinct(option, out)
    return out


# each sweep's options and their defaults
PART_OPTIONS = {"grid": {"gammas": "0.001,0.01,0.1,1.0", "taus": "0.01,0.1,1.0"},
                "activation": {"activations": "relu,leaky_relu,elu,tanh"},
                "hidden": {"hiddens": "16,32,64,128,256"},
                "dropout": {"dropouts": "0.0,0.1,0.3,0.5"}}


def add_arguments(parser) -> None:
    parser.add_argument("--parts", default=",".join(PARTS), help="sensitivity: which sweeps "
                        f"({','.join(PARTS)})")
    d = {k: v for options in PART_OPTIONS.values() for k, v in options.items()}
    parser.add_argument("--gammas", default=d["gammas"], help="sensitivity: γ values")
    parser.add_argument("--taus", default=d["taus"], help="sensitivity: τ values")
    parser.add_argument("--activations", default=d["activations"],
                        help="sensitivity: activations")
    parser.add_argument("--hiddens", default=d["hiddens"], help="sensitivity: hidden "
                        "sizes, integers >= 1 (every list: comma-separated, each value once)")
    parser.add_argument("--dropouts", default=d["dropouts"],
                        help="sensitivity: dropout rates in [0, 1)")


def sweeps(ctx: Context) -> dict[str, list[tuple[str, dict]]]:
    """part -> [(row key, config overrides)]."""
    a = ctx.args
    parts = _items(a.parts, "--parts")
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise ValueError(f"--parts: unknown {', '.join(bad)}; known: {', '.join(PARTS)}")
    check_distinct("--parts", parts)
    # a sweep's options given without its part: their values went unchecked into the
    # summary's args (--parts grid --hiddens abc; an experiments audit)
    for part, options in PART_OPTIONS.items():
        for dest, default in options.items():
            if part not in parts and getattr(a, dest) != default:
                raise ValueError(f"--{dest} applies to the {part} sweep, which --parts "
                                 f"{a.parts!r} leaves out")
    base = {"gamma": SENSITIVITY_GRID["appendix_figure_gamma"],
            "tau": SENSITIVITY_GRID["appendix_figure_tau"]}
    out: dict[str, list[tuple[str, dict]]] = {}
    if "grid" in parts:
        gammas, taus = _floats(a.gammas, "--gammas"), _floats(a.taus, "--taus")
        out["grid"] = [(f"gamma={g:g},tau={t:g}", {"gamma": g, "tau": t})
                       for g in gammas for t in taus]
    if "activation" in parts:
        activations = _items(a.activations, "--activations")
        check_distinct("--activations", activations)
        out["activation"] = [(f"activation={v}", {**base, "activation": v})
                             for v in activations]
    if "hidden" in parts:
        out["hidden"] = [(f"hidden={v}", {**base, "hidden": v})
                         for v in _ints(a.hiddens, "--hiddens")]
    if "dropout" in parts:
        out["dropout"] = [(f"dropout={v:g}", {**base, "dropout": v})
                          for v in _floats(a.dropouts, "--dropouts")]
    return out


def specs(ctx: Context) -> list[RunSpec]:
    out = []
    for dataset in ctx.datasets:
        for part, points in sweeps(ctx).items():
            for row, over in points:
                cfg = hiertail_config(ctx.args.config, dataset, ctx.args, **over)
                out.append(RunSpec(dataset, row, "hiertail", cfg, meta={"part": part}))
    return out


def _figures(ctx: Context, summary: dict, parts: dict) -> dict:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figs = {}
    for d in ctx.datasets:
        if "grid" in parts:
            gs, ts = _floats(ctx.args.gammas), _floats(ctx.args.taus)
            z = np.array([[summary.get((d, f"gamma={g:g},tau={t:g}"), {}).get(
                "bacc", {}).get("mean", np.nan) for t in ts] for g in gs])
            fig, ax = plt.subplots(figsize=(4.5, 3.6))
            im = ax.imshow(z, cmap="viridis", origin="lower")
            ax.set_xticks(range(len(ts)), [f"{t:g}" for t in ts])
            ax.set_yticks(range(len(gs)), [f"{g:g}" for g in gs])
            ax.set_xlabel("temperature τ")
            ax.set_ylabel("weight γ")
            for (i, j), v in np.ndenumerate(z):
                ax.text(j, i, fmt(v, None), ha="center", va="center", color="w", fontsize=8)
            fig.colorbar(im, ax=ax, label="bAcc (%)")
            ax.set_title(f"{d}: bAcc over γ × τ")
            figs[f"{d}-gamma-tau"] = fig
        lines = [p for p in ("activation", "hidden", "dropout") if p in parts]
        if lines:
            fig, axes = plt.subplots(1, len(lines), figsize=(4 * len(lines), 3.2), squeeze=False)
            for ax, part in zip(axes[0], lines, strict=True):
                keys = [row for row, _ in parts[part]]
                means = [summary.get((d, k), {}).get("bacc", {}).get("mean", np.nan)
                         for k in keys]
                stds = [summary.get((d, k), {}).get("bacc", {}).get("std", np.nan) for k in keys]
                ax.errorbar(range(len(keys)), means, yerr=stds, marker="o", capsize=3)
                ax.set_xticks(range(len(keys)), [k.split("=")[1] for k in keys])
                ax.set_xlabel(part)
                ax.set_ylabel("bAcc (%)")
            fig.suptitle(f"{d}: γ = τ = 0.01")
            fig.tight_layout()
            figs[f"{d}-appendix"] = fig
    return figs


def report(ctx: Context, records: list[dict]):
    summary = summarize(records)
    parts = sweeps(ctx)
    lines = [f"HierTail preset `{ctx.args.config}`; bAcc / Macro-F1 (×100, mean ± std). The "
             "paper's figures have no numbers in its source; its claim: bAcc varies by less "
             "than 5 points, slightly lower when both γ and τ are large.", ""]
    table = []
    for d in ctx.datasets:
        lines += [f"### {d}", "", "| sweep | setting | seeds | bAcc | Macro-F1 |",
                  "|---|---|---|---|---|"]
        for part, points in parts.items():
            for row, _ in points:
                s = summary.get((d, row))
                if s is None:
                    continue
                lines.append(f"| {part} | {row} | {s['n']} | {fmt(**s['bacc'])} | "
                             f"{fmt(**s['macro_f1'])} |")
                table.append({"dataset": d, "part": part, "row": row, **s})
        grid = [summary[(d, r)]["bacc"]["mean"] for r, _ in parts.get("grid", [])
                if (d, r) in summary]
        if grid:
            lines += ["", f"γ × τ grid: bAcc range {max(grid) - min(grid):.1f} points "
                      f"(paper: < 5)."]
        lines.append("")
    return "\n".join(lines), {"rows": table}, _figures(ctx, summary, parts)
