"""``main``: Table 2 (natural split) — HierTail (``paper`` and ``official``) and every baseline the
harness registers, per dataset, mean ± std over seeds beside the paper's numbers."""
from __future__ import annotations

from hiertail_fast.experiments.common import (
    HIERTAIL_ROWS,
    Context,
    baseline_config,
    baseline_names,
    check_distinct,
    hiertail_config,
)
from hiertail_fast.experiments.paper_numbers import PAPER_METHOD_NAMES, TABLE2_MAIN, paper_cell
from hiertail_fast.experiments.report import comparison_rows, markdown_table
from hiertail_fast.experiments.runner import RunSpec, summarize

TITLE = "Table 2: node classification on the natural long-tail datasets"
OPTIONS = ("methods",)   # the experiment-specific options it reads (cli)
PAPER_TABLE = TABLE2_MAIN


def add_arguments(parser) -> None:
    parser.add_argument("--methods", help="main / semi-synthetic: comma-separated rows to run "
                        "(hiertail_paper, hiertail_official and the baselines' names; default: "
                        "all of them)")


def row_labels() -> dict[str, str]:
    """Row key -> label, in table order: HierTail's two configurations, then the registry."""
    labels = {"hiertail_paper": "HierTail (paper config)",
              "hiertail_official": "HierTail (official config)"}
    for m in baseline_names():
        labels[m] = PAPER_METHOD_NAMES.get(m, m)
    return labels


def paper_row_key(row: str) -> str:
    return "hiertail" if row in HIERTAIL_ROWS else row


def selected_rows(ctx: Context) -> list[str]:
    labels = row_labels()
    wanted = getattr(ctx.args, "methods", None)
    if wanted is None:              # not given ("" is given: refused below, not "every row")
        return list(labels)
    rows = [w.strip() for w in wanted.split(",") if w.strip()]
    if not rows:
        raise ValueError(f"--methods {wanted!r} names no method")
    unknown = [r for r in rows if r not in labels]
    if unknown:
        raise ValueError(f"--methods: unknown {', '.join(unknown)}; known: {', '.join(labels)}")
    check_distinct("--methods", rows)
    return rows


def method_specs(ctx: Context, split: tuple = ("natural",)) -> list[RunSpec]:
    """One spec per (dataset, selected row); a baseline whose default config cannot be built is
    skipped with a note (e.g. a registry entry without a BaselineConfig field set yet)."""
    specs = []
    for dataset in ctx.datasets:
        for row in selected_rows(ctx):
            try:
                if row in HIERTAIL_ROWS:
                    cfg, method = hiertail_config(HIERTAIL_ROWS[row], dataset, ctx.args), "hiertail"
                else:
                    cfg, method = baseline_config(row, dataset, ctx.args), row
            except (ValueError, TypeError) as exc:
                ctx.notes.append(f"- {dataset} / {row}: skipped, its config cannot be built "
                                 f"({exc})")
                continue
            specs.append(RunSpec(dataset, row, method, cfg, split))
    return specs


def specs(ctx: Context) -> list[RunSpec]:
    return method_specs(ctx)


def build_rows(ctx: Context, records: list[dict], paper_table: dict) -> list[dict]:
    labels = row_labels()
    rows = [(d, r, labels[r]) for d in ctx.datasets for r in selected_rows(ctx)]
    return comparison_rows(summarize(records), rows, ctx.paper_lookup(
        lambda d, r, m: paper_cell(paper_table, d, paper_row_key(r), m)))


def report(ctx: Context, records: list[dict]):
    rows = build_rows(ctx, records, PAPER_TABLE)
    body = [
        "Ours: mean ± population std over seeds (×100, test nodes, best-validation-Macro-F1 "
        "epoch). Paper: Table 2. Δ: (ours − paper) in units of the paper's std. Both HierTail "
        "configurations are compared with the paper's 'Ours' row.",
        "",
        markdown_table(rows, len(ctx.budget.seeds)),
    ]
    return "\n".join(body), {"rows": rows}, {}
