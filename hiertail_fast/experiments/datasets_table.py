"""``datasets``: Table 1 — nodes, edges, attributes, classes, class-imbalance ratio and
Ratio_LT(0.8) of every dataset present, beside the paper's values. No training."""
from __future__ import annotations

from hiertail_fast.experiments.common import Context
from hiertail_fast.experiments.paper_numbers import TABLE1_DATASETS

TITLE = "Table 1: dataset statistics"
TRAINS = False
OPTIONS = ()
COLUMNS = ("nodes", "edges", "features", "classes", "imbalance", "ratio_lt")


def specs(ctx: Context) -> list:
    return []


def statistics(data) -> dict:
    """Our Table 1 values of a graph in the uniform format (no self-loops, both directions)."""
    from hiertail_fast.metrics import class_imbalance_ratio, long_tailedness_ratio

    directed = int(data.edge_index.shape[1])
    return {"nodes": int(data.y.shape[0]), "edges": directed // 2,
            "edges_directed_plus_self_loops": directed + int(data.y.shape[0]),
            "features": int(data.x.shape[1]), "classes": int(data.num_classes),
            "imbalance": class_imbalance_ratio(data.y), "ratio_lt": long_tailedness_ratio(data.y)}


def _cell(key: str, value) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" if key == "imbalance" else (f"{value:.2f}" if key == "ratio_lt"
                                                      else f"{int(value):,}")


def rows(ctx: Context) -> list[dict]:
    out = []
    for name in ctx.datasets:
        ours = statistics(ctx.source.load(name))
        paper = TABLE1_DATASETS.get(name)
        same = None if paper is None else {
            k: (round(ours[k], 3 if k == "imbalance" else 2) == paper[k]) for k in COLUMNS}
        out.append({"dataset": name, "ours": ours, "paper": paper, "matches_paper": same})
    return out


def markdown(table: list[dict]) -> str:
    head = ["Dataset"] + [f"{c} ours / paper" for c in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        cells = [r["dataset"]]
        for c in COLUMNS:
            paper = None if r["paper"] is None else r["paper"][c]
            mark = "" if r["matches_paper"] is None or r["matches_paper"][c] else " ≠"
            cells.append(f"{_cell(c, r['ours'][c])} / {_cell(c, paper)}{mark}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(ctx: Context, records: list[dict]):
    table = rows(ctx)
    body = "\n".join([
        "Edges: ours = undirected edges without self-loops; the paper counts edges differently "
        "per dataset (Email: lines of the raw SNAP list incl. self-loops; Wiki: directed entries "
        "+ one self-loop per node, our `edges_directed_plus_self_loops` in the JSON; "
        "BlogCatalog: undirected edges), see shared/data/README.md. Imbalance: smallest / "
        "largest class; Ratio_LT(0.8) with the midpoint quantile (hiertail_fast.metrics). "
        "'≠' marks a value that differs from the paper's at its printed precision.",
        "",
        markdown(table),
    ])
    return body, {"rows": table}, {}
