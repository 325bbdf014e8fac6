"""Reporting of bench/scale.py: the CSV columns, the progress rows and final table, scale.csv,
the log-log scale.png (time and memory against nodes), the machine facts of scale.json, and
`write_outputs`, which replaces the three files together (the old ones kept as scale.prev.*)."""
from __future__ import annotations

import csv
import json
import os
import platform
import re
from pathlib import Path

from hiertail_fast._files import replace_file_set

CSV_COLUMNS = ("method", "nodes", "edges", "epoch_seconds", "peak_memory_bytes", "device",
               "loss_dtype", "status", "once_seconds", "memory_measure")
# memory_measure, what peak_memory_bytes is (scale.json says it in words): "cuda-allocator"
# (torch.cuda.max_memory_allocated), "rss" (peak RSS above the primed post-import baseline),
# "tracked" (torch's CPU allocator peak of one step above its start; --cpu-memory tracked)
OUTPUT_NAMES = ("scale.csv", "scale.json", "scale.png")


def format_row(row: dict) -> str:
    secs, mem = row["epoch_seconds"], row["peak_memory_bytes"]
    secs = f"{float(secs):10.4f}" if secs != "" else f"{'-':>10}"
    mem = f"{float(mem) / 1e6:12.1f}" if mem != "" else f"{'-':>12}"
    once = row.get("once_seconds", "")
    once = f" (+ after-loop stages once: {float(once):.3f} s)" if once != "" else ""
    return (f"{row['method']:<19}{row['nodes']:>9}{str(row['edges']):>11}{secs}{mem}  "
            f"{row['device']:<8} {row['status']}{once}")


def table(rows: list[dict]) -> str:
    head = f"{'method':<19}{'nodes':>9}{'edges':>11}{'epoch s':>10}{'peak MB':>12}  device   status"
    return "\n".join([head, "-" * len(head)] + [format_row(r) for r in rows])


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: list[dict], path: Path) -> None:
    """Log-log epoch seconds and peak memory against nodes, one line per method."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    points = {ax_t: 0, ax_m: 0}  # data points drawn: empty lines count as data for has_data()
    for method in dict.fromkeys(r["method"] for r in rows):
        ok = [r for r in rows if r["method"] == method and str(r["status"]).startswith("ok")]
        nodes = [int(r["nodes"]) for r in ok]
        points[ax_t] += len(ok)
        points[ax_m] += len(ok)
        label = method if ok else f"_{method}"  # a leading underscore: not in the legend
        ax_t.plot(nodes, [float(r["epoch_seconds"]) for r in ok], "o-", label=label)
        line = ax_m.plot(nodes, [float(r["peak_memory_bytes"]) / 1e6 for r in ok], "o-",
                         label=label)[0]
        over = [r for r in rows if r["method"] == method and "would need" in str(r["status"])]
        if over:  # skipped runs: their predicted memory, dashed from the last measured point
            xs = nodes[-1:] + [int(r["nodes"]) for r in over]
            ys = [float(r["peak_memory_bytes"]) / 1e6 for r in ok][-1:] + [
                float(r["predicted_memory_bytes"]) / 1e6 for r in over]
            ax_m.plot(xs, ys, "x--", color=line.get_color(), label=f"{method} (predicted)")
            points[ax_m] += len(xs)
    for ax, label in ((ax_t, "seconds per training epoch"), (ax_m, "peak memory (MB)")):
        if points[ax]:
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.legend()
        else:
            ax.text(0.5, 0.5, "nothing was measured\n(every run skipped, failed or timed out)",
                    ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
        ax.set_xlabel("nodes")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"HierTail scalability ({rows[0]['device'] if rows else ''})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(rows: list[dict], info: dict, out: Path, *, with_plot: bool = True,
                  keep: str = "scale.prev") -> tuple[list[Path], list[Path]]:
    """Write scale.csv, scale.json and (with_plot) scale.png into `out` as one set.

    All files are first written to temporary files in `out`; only when every one is complete
    are the existing results moved to ``<keep>.csv/.json/.png`` (an older ``<keep>.*`` set is
    replaced whole, so it never mixes generations) and the new files renamed into place. A
    failure (plot error, full disk) leaves the old results untouched. Without the plot, an old
    scale.png is moved aside with the rest, so it never sits beside newer tables.
    Returns (written paths, kept previous paths)."""
    writers = {"scale.csv": lambda p: write_csv(rows, p),
               "scale.json": lambda p: p.write_text(json.dumps(info, indent=1, default=str))}
    if with_plot:
        writers["scale.png"] = lambda p: plot(rows, p)

    def prev_of(name: str) -> str:
        return f"{keep}{Path(name).suffix}"
    return replace_file_set(out, writers, list(OUTPUT_NAMES), prev_of,
                            older=[prev_of(name) for name in OUTPUT_NAMES])


def machine_info() -> dict:
    import psutil
    import torch
    with open("/proc/cpuinfo") as fh:
        cpu = (re.findall(r"model name\s*:\s*(.*)", fh.read()) or [platform.processor()])[0]
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "memory_total_bytes": psutil.virtual_memory().total, "torch": torch.__version__,
            "python": platform.python_version(), "load_average": list(os.getloadavg())}
