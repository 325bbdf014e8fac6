"""``per-class``: the per-class bAcc figure (paper ``fig:resultPerClass``): test recall of every
class for GCN (Origin) and HierTail (``paper`` config), classes sorted by frequency (largest
first), with the labelled (train) and unlabelled node counts of the natural split as bars. The
paper's figure has no numbers in its source (Cora-Full); its claim: HierTail beats GCN,
especially on the tail classes. Runs are the same as ``main``'s rows (share ``--runs-dir``)."""
from __future__ import annotations

import numpy as np

from hiertail_fast.experiments.common import Context, baseline_config, hiertail_config
from hiertail_fast.experiments.runner import RunSpec

TITLE = "Per-class bAcc: GCN (Origin) vs HierTail, classes by frequency"
OPTIONS = ()
ROWS = {"origin": "GCN (Origin)", "hiertail_paper": "HierTail (paper config)"}


def specs(ctx: Context) -> list[RunSpec]:
    out = []
    for d in ctx.datasets:
        out.append(RunSpec(d, "origin", "origin", baseline_config("origin", d, ctx.args)))
        out.append(RunSpec(d, "hiertail_paper", "hiertail", hiertail_config("paper", d, ctx.args)))
    return out


def class_counts(y) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(class order largest first, train count, unlabelled count) of the natural split."""
    from hiertail_fast.data.splits import natural_split_sizes

    sizes = np.bincount(np.asarray(y))
    order = np.argsort(-sizes, kind="stable")
    train = natural_split_sizes(sizes)[:, 1]
    return order, train[order], (sizes - train)[order]


def per_class_means(records: list[dict], dataset: str, row: str, order: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, int]:
    """Mean and std over seeds of each class's test recall (×100), classes in ``order``."""
    rs = [r for r in records if r["spec"].dataset == dataset and r["spec"].row == row]
    if not rs:
        return np.full(order.shape, np.nan), np.full(order.shape, np.nan), 0
    m = np.array([[np.nan if v is None else 100 * v for v in r["result"]["test_per_class"]]
                  for r in rs], dtype=float)[:, order]
    return np.nanmean(m, axis=0), np.nanstd(m, axis=0), len(rs)


def _figure(dataset: str, train, unlabelled, curves: dict):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    x = np.arange(train.shape[0])
    fig, ax = plt.subplots(figsize=(max(6.0, 0.16 * x.shape[0] + 3), 3.8))
    ax.bar(x, unlabelled, color="tab:blue", alpha=0.35, label="unlabelled nodes")
    ax.bar(x, train, bottom=unlabelled, color="gold", alpha=0.7, label="labelled (train) nodes")
    ax.set_yscale("log")
    ax.set_xlabel("class (sorted by frequency)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # class ranks
    ax.set_ylabel("nodes")
    ax2 = ax.twinx()
    for (label, mean), color in zip(curves.items(), ("tab:green", "tab:red"), strict=False):
        ax2.plot(x, mean, marker=".", color=color, label=label)
    ax2.set_ylabel("bAcc (%) per class")
    ax2.set_ylim(-2, 102)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper right")
    ax.set_title(dataset)
    fig.tight_layout()
    return fig


def _json_values(values: np.ndarray) -> list:
    """A class's mean / std as JSON: null where no seed has a value (bare NaN, which strict
    JSON readers refuse, was written; an experiments audit)."""
    return [None if np.isnan(v) else float(v) for v in values]


def _mean_cell(values: np.ndarray) -> str:
    """The mean of the classes that have a value, or "—" where none has (no tail class, a
    row without runs: "nan" and a RuntimeWarning before)."""
    values = values[~np.isnan(values)]
    return f"{values.mean():.1f}" if values.size else "—"


def report(ctx: Context, records: list[dict]):
    lines = ["Test recall per class (= per-class bAcc, ×100), mean over seeds; classes sorted "
             "by size, largest first. Head / tail: the classes holding the first 80 % of the "
             "nodes vs the rest.", ""]
    payload, figs = [], {}
    for d in ctx.datasets:
        order, train, unlabelled = class_counts(ctx.source.load(d).y)
        curves, entry = {}, {"dataset": d, "classes_by_size": order.tolist(),
                             "train_count": train.tolist(), "unlabelled_count":
                             unlabelled.tolist(), "methods": {}}
        sizes = train + unlabelled
        head = np.cumsum(sizes) - sizes < 0.8 * sizes.sum()
        lines += [f"### {d}", "", "| method | seeds | head classes | tail classes | all |",
                  "|---|---|---|---|---|"]
        for row, label in ROWS.items():
            mean, std, n = per_class_means(records, d, row, order)
            curves[label] = mean
            entry["methods"][row] = {"seeds": n, "mean": _json_values(mean),
                                     "std": _json_values(std)}
            lines.append(f"| {label} | {n} | {_mean_cell(mean[head])} | "
                         f"{_mean_cell(mean[~head])} | {_mean_cell(mean)} |")
        lines.append("")
        payload.append(entry)
        figs[d] = _figure(d, train, unlabelled, curves)
    return "\n".join(lines), {"datasets": payload}, figs
