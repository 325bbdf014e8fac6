"""Reporting of bench/scale.py: the CSV columns, the progress rows and final table, scale.csv,
the log-log scale.png (time and memory against nodes) and the machine facts of scale.json."""
from __future__ import annotations

import csv
import os
import platform
import re
from pathlib import Path

CSV_COLUMNS = ("method", "nodes", "edges", "epoch_seconds", "peak_memory_bytes", "device", "status")


def format_row(row: dict) -> str:
    secs, mem = row["epoch_seconds"], row["peak_memory_bytes"]
    secs = f"{float(secs):10.4f}" if secs != "" else f"{'-':>10}"
    mem = f"{float(mem) / 1e6:12.1f}" if mem != "" else f"{'-':>12}"
    return (f"{row['method']:<19}{row['nodes']:>9}{str(row['edges']):>11}{secs}{mem}  "
            f"{row['device']:<8} {row['status']}")


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
    for method in dict.fromkeys(r["method"] for r in rows):
        ok = [r for r in rows if r["method"] == method and str(r["status"]).startswith("ok")]
        nodes = [int(r["nodes"]) for r in ok]
        ax_t.plot(nodes, [float(r["epoch_seconds"]) for r in ok], "o-", label=method)
        line = ax_m.plot(nodes, [float(r["peak_memory_bytes"]) / 1e6 for r in ok], "o-",
                         label=method)[0]
        over = [r for r in rows if r["method"] == method and "would need" in str(r["status"])]
        if over:  # skipped runs: their predicted memory, dashed from the last measured point
            xs = nodes[-1:] + [int(r["nodes"]) for r in over]
            ys = [float(r["peak_memory_bytes"]) / 1e6 for r in ok][-1:] + [
                float(r["predicted_memory_bytes"]) / 1e6 for r in over]
            ax_m.plot(xs, ys, "x--", color=line.get_color(), label=f"{method} (predicted)")
    for ax, label in ((ax_t, "seconds per training epoch"), (ax_m, "peak memory (MB)")):
        if ax.has_data():
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.legend()
        else:
            ax.text(0.5, 0.5, "no completed runs", ha="center", transform=ax.transAxes)
        ax.set_xlabel("nodes")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"HierTail scalability ({rows[0]['device'] if rows else ''})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine_info() -> dict:
    import psutil
    import torch
    with open("/proc/cpuinfo") as fh:
        cpu = (re.findall(r"model name\s*:\s*(.*)", fh.read()) or [platform.processor()])[0]
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "memory_total_bytes": psutil.virtual_memory().total, "torch": torch.__version__,
            "python": platform.python_version(), "load_average": list(os.getloadavg())}
