"""``ablation``: Table 4 — HierTail with both modules (M1 task grouping + M2 balanced contrastive
learning + L_CE), without M2 (M1 + L_CE) and with L_CE only (no task grouping: embedding GCN ->
GCN -> classifier), on every dataset given. The paper's numbers exist for Cora-Full only; its
L_CE-only row equals its Origin (GCN) row of Table 2, so Origin is run beside it."""
from __future__ import annotations

from hiertail_fast.experiments.common import Context, baseline_config, hiertail_config
from hiertail_fast.experiments.paper_numbers import TABLE4_ABLATION, paper_cell
from hiertail_fast.experiments.report import comparison_report
from hiertail_fast.experiments.runner import RunSpec

TITLE = "Table 4: ablation of HierTail's components"
# the experiment-specific options this table reads (cli refuses the others')
OPTIONS = ("config",)
# row key -> (label, config switches)
ROWS = {
    "m1_m2_ce": ("M1 + M2 + L_CE (HierTail)", {}),
    "m1_ce": ("M1 + L_CE", {"contrastive": False}),
    "ce": ("L_CE only", {"contrastive": False, "task_grouping": False}),
}
ORIGIN_ROW = "origin"


def add_arguments(parser) -> None:
    # default None, "paper" once the CLI has checked that it applies (cli.given_defaults):
    # an explicit `--config paper` is refused where it does not apply, as any other value
    parser.add_argument("--config", choices=("paper", "official"),
                        help="ablation / tasks / sensitivity: the HierTail preset (paper)")


def specs(ctx: Context) -> list[RunSpec]:
    preset = ctx.args.config
    out = []
    for dataset in ctx.datasets:
        for row, (_, switches) in ROWS.items():
            out.append(RunSpec(dataset, row, "hiertail",
                               hiertail_config(preset, dataset, ctx.args, **switches)))
        out.append(RunSpec(dataset, ORIGIN_ROW, "origin",
                           baseline_config("origin", dataset, ctx.args)))
    return out


def paper_lookup(dataset: str, row: str, metric: str):
    return paper_cell(TABLE4_ABLATION, dataset, "ce" if row == ORIGIN_ROW else row, metric)


def report(ctx: Context, records: list[dict]):
    labels = {r: label for r, (label, _) in ROWS.items()}
    labels[ORIGIN_ROW] = "Origin (GCN baseline; paper row = L_CE only)"
    rows = [(d, r, labels[r]) for d in ctx.datasets for r in labels]
    return comparison_report(
        records, rows, ctx.paper_lookup(paper_lookup),
        f"HierTail preset: `{ctx.args.config}`. M1 = hierarchical task grouping (pooling levels), "
        "M2 = the balanced contrastive losses (SCL + BCL). The paper's numbers (Table 4) are for "
        "Cora-Full only; other datasets show ours alone.", len(ctx.budget.seeds))
