"""``tasks``: Table 5 — the number of tasks in the second and third layer (over-clustering).

Default sweep for a dataset with C classes: [⌈198·C/70⌉, C], [C, ⌈C/2⌉] (the paper's setting)
and [2, 1] — on Cora-Full (C = 70) exactly the paper's [198, 70], [70, 35], [2, 1].
``--task-counts 198:70,70:35,2:1`` gives the counts explicitly."""
from __future__ import annotations

import math

from hiertail_fast.experiments.common import Context, check_distinct, hiertail_config
from hiertail_fast.experiments.paper_numbers import TABLE5_TASKS, paper_cell
from hiertail_fast.experiments.report import comparison_report
from hiertail_fast.experiments.runner import RunSpec

TITLE = "Table 5: number of tasks in the second (and third) layer"
OPTIONS = ("config", "task_counts")
RUNS_BASELINES = False      # HierTail only: --adj-norm (baselines') is refused


def add_arguments(parser) -> None:
    parser.add_argument("--task-counts", help="tasks: comma-separated A:B task counts of the "
                        "two levels, each pair once, 1 <= B <= A <= the graph's nodes "
                        "(default: the paper's sweep scaled to each dataset)")


def task_counts(num_classes: int, spec: str | None, num_nodes: int | None = None,
                dataset: str = "the graph") -> list[tuple[int, int]]:
    """The (A, B) pairs of the sweep: ``spec`` (``--task-counts``) or the default. Each pair must
    satisfy 1 <= B <= A <= num_nodes (when given): a level keeps at most the nodes of the one
    before it, so a larger count would be clamped while its row kept the requested label."""
    if spec is not None:            # given ("" too: refused below, not the default sweep)
        out = []
        items = [v.strip() for v in spec.split(",") if v.strip()]
        if not items:
            raise ValueError(f"--task-counts {spec!r} gives no A:B pair")
        for item in items:
            try:
                a, b = (int(v) for v in item.split(":"))
            except ValueError:
                raise ValueError(f"--task-counts: {item!r} is not A:B with integers") from None
            if a < 1 or b < 1:
                raise ValueError(f"--task-counts: {item!r} needs counts >= 1")
            if b > a:
                raise ValueError(f"--task-counts: {item!r} has B > A; the second level keeps "
                                 "at most the first level's tasks (need 1 <= B <= A)")
            out.append((a, b))
        check_distinct("--task-counts", [f"{a}:{b}" for a, b in out])
    else:
        c = num_classes
        # (without repeats: on two classes the second row is (2, 1) too, and the table
        # refused its own default sweep as "tasks=2,1 is given twice"; an experiments audit)
        out = list(dict.fromkeys([(math.ceil(198 * c / 70), c), (c, math.ceil(c / 2)),
                                  (2, 1)]))
    if num_nodes is not None:
        big = [f"{a}:{b}" for a, b in out if a > num_nodes]
        if big:
            raise ValueError(f"{'--task-counts' if spec else 'default task counts'}: "
                             f"{', '.join(big)} on {dataset} ({num_nodes:,} "
                             f"nodes): need 1 <= B <= A <= {num_nodes:,}")
    return out


def _row(counts: tuple[int, int]) -> str:
    return f"tasks={counts[0]},{counts[1]}"


def specs(ctx: Context) -> list[RunSpec]:
    out = []
    for dataset in ctx.datasets:
        key = ctx.source.data_key(dataset)
        for counts in task_counts(key["classes"], ctx.args.task_counts, key["nodes"], dataset):
            cfg = hiertail_config(ctx.args.config, dataset, ctx.args, pool_counts=counts)
            out.append(RunSpec(dataset, _row(counts), "hiertail", cfg))
    return out


def paper_lookup(dataset: str, row: str, metric: str):
    counts = tuple(int(v) for v in row.split("=")[1].split(","))
    return paper_cell(TABLE5_TASKS, dataset, counts, metric)


def report(ctx: Context, records: list[dict]):
    rows = []
    for d in ctx.datasets:
        for counts in task_counts(ctx.source.data_key(d)["classes"], ctx.args.task_counts):
            rows.append((d, _row(counts), f"[{counts[0]}, {counts[1]}]"))
    return comparison_report(
        records, rows, ctx.paper_lookup(paper_lookup),
        f"HierTail preset: `{ctx.args.config}`, the two task-grouping levels keeping [A, B] "
        "nodes (`pool_counts`). The paper's Table 5 is Cora-Full only and has no std: Δ is in "
        "points there (reproduced within 0.5).", len(ctx.budget.seeds))
