"""The paper's numbers, transcribed once from ../shared/paper/hiertail_kdd24.tex (the only place
they live in this package; every table writer reads them from here).

Values are the paper's, ×100 as printed: ``Cell(mean, std)``; ``std`` is None where the paper gives
none (Table 5). Source of each constant:

- ``TABLE1_DATASETS``: Table 1 ``tab:datasets`` (Dataset statistics).
- ``TABLE2_MAIN``: Table 2 ``tab:result`` (natural datasets), rows by our method names.
- ``TABLE3_SEMI_SYNTHETIC``: Table 3 ``tab:resultSyn`` (Amazon, Ratio_LT(0.8) ≈ 0.25).
- ``TABLE4_ABLATION``: Table 4 ``tab:ablation`` (Cora-Full only).
- ``TABLE5_TASKS``: Table 5 ``tab:overcluster`` (Cora-Full only; no std).
- ``SENSITIVITY_GRID``: the appendix text (γ ∈ {0.01, 0.1}, τ ∈ {0.01, 0.1, 1.0} searched;
  ``fig:hyperappendix`` run with γ = 0.01, τ = 0.01). The figures themselves
  (``fig:hyperparameter``, ``fig:hyperappendix``, ``fig:resultPerClass``) have no image and no
  numbers in the source.
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["Cell", "METRICS", "TABLE1_DATASETS", "TABLE2_MAIN", "TABLE3_SEMI_SYNTHETIC",
           "TABLE4_ABLATION", "TABLE5_TASKS", "PAPER_METHOD_NAMES", "SENSITIVITY_GRID",
           "paper_cell"]

METRICS = ("bacc", "macro_f1", "g_means", "acc")     # the column order of Tables 2-5


class Cell(NamedTuple):
    mean: float
    std: float | None


def _row(*cells: tuple[float, float | None]) -> dict[str, Cell]:
    return {m: Cell(*c) for m, c in zip(METRICS, cells, strict=True)}


# Table 1: nodes, edges (the paper's count, see shared/data/README.md), attributes, classes,
# class-imbalance ratio (min/max), Ratio_LT(0.8)
TABLE1_DATASETS: dict[str, dict[str, float]] = {
    "cora_full": dict(nodes=19793, edges=146635, features=8710, classes=70, imbalance=0.016,
                      ratio_lt=1.09),
    "blogcatalog": dict(nodes=10312, edges=333983, features=64, classes=38, imbalance=0.002,
                        ratio_lt=0.77),
    "email": dict(nodes=1005, edges=25571, features=128, classes=42, imbalance=0.009,
                  ratio_lt=0.79),
    "wiki": dict(nodes=2405, edges=25597, features=4973, classes=17, imbalance=0.022,
                 ratio_lt=1.00),
    "amazon_clothing": dict(nodes=24919, edges=91680, features=9034, classes=77,
                            imbalance=0.097, ratio_lt=1.23),
    "amazon_electronics": dict(nodes=42318, edges=43556, features=8669, classes=167,
                               imbalance=0.107, ratio_lt=1.67),
}

# The paper's row labels for our method names (Tables 2 and 3).
PAPER_METHOD_NAMES = {
    "origin": "Origin", "oversampling": "Over-sampling", "reweight": "Re-weight",
    "smote": "SMOTE", "embed_smote": "Embed-SMOTE", "graphsmote_t": "GraphSMOTE_T",
    "graphsmote_o": "GraphSMOTE_O", "graphmixup": "GraphMixup", "imgagn": "ImGAGN",
    "graphens": "GraphENS", "lte4g": "LTE4G", "hiertail": "Ours (HierTail)",
}

TABLE2_MAIN: dict[str, dict[str, dict[str, Cell]]] = {
    "cora_full": {
        "origin": _row((52.8, 0.6), (54.5, 0.7), (72.5, 0.4), (62.7, 0.5)),
        "oversampling": _row((52.7, 0.7), (54.4, 0.6), (72.4, 0.5), (62.7, 0.4)),
        "reweight": _row((52.9, 0.5), (54.4, 0.5), (72.5, 0.3), (62.6, 0.4)),
        "smote": _row((52.7, 0.6), (54.4, 0.5), (72.4, 0.4), (62.7, 0.4)),
        "embed_smote": _row((52.9, 0.5), (54.4, 0.5), (73.9, 0.4), (62.6, 0.4)),
        "graphsmote_t": _row((54.2, 0.8), (54.7, 0.8), (73.4, 0.6), (62.1, 0.6)),
        "graphsmote_o": _row((54.1, 0.8), (54.5, 0.7), (73.3, 0.5), (62.0, 0.6)),
        "graphmixup": _row((53.9, 1.3), (53.9, 1.3), (73.2, 0.9), (61.4, 1.2)),
        "imgagn": _row((9.3, 1.1), (6.6, 1.0), (30.2, 1.9), (20.9, 2.1)),
        "graphens": _row((55.0, 0.6), (54.2, 0.5), (73.9, 0.4), (62.1, 0.4)),
        "lte4g": _row((55.8, 0.6), (54.5, 0.4), (74.5, 0.4), (61.6, 0.4)),
        "hiertail": _row((55.8, 0.5), (57.1, 0.5), (74.5, 0.3), (64.7, 0.7)),
    },
    "blogcatalog": {
        "origin": _row((7.1, 0.4), (7.3, 0.4), (26.4, 0.7), (15.1, 1.0)),
        "oversampling": _row((7.1, 0.3), (7.2, 0.3), (26.3, 0.6), (15.1, 1.2)),
        "reweight": _row((7.2, 0.4), (7.3, 0.5), (26.4, 0.8), (15.1, 0.8)),
        "smote": _row((7.1, 0.4), (7.2, 0.5), (26.3, 0.8), (15.3, 1.2)),
        "embed_smote": _row((7.1, 0.5), (7.3, 0.5), (26.3, 0.9), (14.8, 0.8)),
        "graphsmote_t": _row((8.6, 0.4), (8.5, 0.5), (28.9, 0.7), (18.3, 1.1)),
        "graphsmote_o": _row((8.6, 0.4), (8.5, 0.4), (28.9, 0.6), (18.3, 0.9)),
        "graphmixup": _row((8.0, 0.6), (7.9, 0.8), (27.9, 1.2), (18.8, 0.8)),
        "imgagn": _row((6.2, 0.6), (4.9, 0.5), (24.6, 1.3), (20.5, 1.3)),
        "graphens": _row((9.0, 0.6), (8.9, 0.5), (30.8, 0.9), (12.8, 1.1)),
        "lte4g": _row((6.9, 0.5), (6.7, 0.6), (26.0, 0.9), (11.7, 1.3)),
        "hiertail": _row((9.8, 0.2), (9.6, 0.1), (30.9, 0.4), (23.2, 0.6)),
    },
    "email": {
        "origin": _row((48.9, 4.5), (45.2, 4.3), (69.5, 3.2), (66.7, 2.1)),
        "oversampling": _row((48.4, 4.2), (45.4, 3.7), (69.2, 3.1), (66.4, 2.0)),
        "reweight": _row((47.9, 4.6), (44.2, 4.2), (68.8, 3.4), (66.3, 1.7)),
        "smote": _row((48.4, 4.2), (45.4, 3.7), (69.2, 3.1), (66.4, 2.0)),
        "embed_smote": _row((47.9, 4.6), (44.2, 4.2), (68.8, 3.3), (66.2, 1.7)),
        "graphsmote_t": _row((43.4, 2.9), (39.1, 2.8), (65.5, 2.2), (60.4, 1.5)),
        "graphsmote_o": _row((42.3, 3.1), (38.3, 2.9), (64.7, 2.4), (60.1, 2.3)),
        "graphmixup": _row((43.2, 2.3), (38.1, 2.3), (65.4, 1.7), (60.1, 1.7)),
        "imgagn": _row((27.6, 3.4), (26.8, 2.9), (52.0, 3.2), (46.5, 3.5)),
        "graphens": _row((50.5, 3.1), (43.7, 3.3), (71.1, 2.2), (62.0, 2.7)),
        "lte4g": _row((46.4, 2.5), (39.3, 2.4), (67.8, 1.8), (57.8, 3.1)),
        "hiertail": _row((50.5, 3.0), (46.6, 3.0), (70.7, 2.1), (65.4, 1.7)),
    },
    "wiki": {
        "origin": _row((48.2, 1.5), (49.9, 1.9), (68.6, 1.1), (64.2, 0.9)),
        "oversampling": _row((47.3, 2.1), (48.7, 2.2), (67.9, 1.5), (63.6, 1.4)),
        "reweight": _row((48.1, 2.1), (49.7, 2.5), (68.5, 1.6), (64.0, 1.4)),
        "smote": _row((47.3, 2.1), (48.7, 2.2), (67.9, 1.5), (63.6, 1.4)),
        "embed_smote": _row((48.1, 2.1), (49.7, 2.5), (68.5, 1.6), (63.9, 1.4)),
        "graphsmote_t": _row((50.3, 1.7), (51.8, 2.2), (70.1, 1.2), (65.8, 0.9)),
        "graphsmote_o": _row((49.6, 2.3), (51.1, 2.7), (69.6, 1.7), (65.5, 1.2)),
        "graphmixup": _row((50.3, 2.9), (51.2, 2.9), (70.0, 2.1), (65.1, 1.3)),
        "imgagn": _row((41.2, 5.7), (42.3, 6.4), (63.2, 4.9), (65.5, 5.8)),
        "graphens": _row((50.8, 3.3), (50.1, 3.4), (70.3, 2.4), (61.7, 4.4)),
        "lte4g": _row((51.0, 2.9), (49.7, 1.9), (70.5, 2.1), (60.4, 2.1)),
        "hiertail": _row((52.8, 2.0), (54.1, 2.3), (71.9, 1.4), (67.2, 1.1)),
    },
}

TABLE3_SEMI_SYNTHETIC: dict[str, dict[str, dict[str, Cell]]] = {
    "amazon_clothing": {
        "origin": _row((9.9, 0.2), (9.5, 0.2), (31.3, 0.3), (9.9, 0.2)),
        "oversampling": _row((9.9, 0.2), (9.5, 0.2), (31.3, 0.3), (9.9, 0.2)),
        "reweight": _row((10.0, 0.2), (9.6, 0.2), (31.4, 0.3), (10.0, 0.2)),
        "smote": _row((10.0, 0.1), (9.5, 0.2), (31.4, 0.2), (10.0, 0.1)),
        "embed_smote": _row((9.9, 0.2), (9.5, 0.2), (31.3, 0.3), (9.9, 0.2)),
        "graphsmote_t": _row((11.7, 0.2), (10.4, 0.3), (34.0, 0.3), (11.7, 0.2)),
        "graphsmote_o": _row((11.7, 0.2), (10.4, 0.3), (34.0, 0.3), (11.7, 0.2)),
        "graphmixup": _row((10.9, 0.5), (9.3, 0.7), (32.8, 0.7), (10.9, 0.5)),
        "imgagn": _row((12.9, 0.2), (9.2, 0.1), (35.7, 0.2), (12.9, 0.2)),
        "graphens": _row((11.6, 2.7), (10.9, 2.7), (33.6, 4.3), (11.6, 2.7)),
        "lte4g": _row((15.5, 0.3), (16.0, 0.5), (39.1, 0.3), (15.5, 0.3)),
        "hiertail": _row((17.1, 0.5), (16.8, 0.6), (41.1, 0.6), (17.1, 0.5)),
    },
    "amazon_electronics": {
        "origin": _row((16.9, 0.2), (15.2, 0.2), (41.0, 0.3), (16.9, 0.2)),
        "oversampling": _row((16.8, 0.1), (15.1, 0.1), (40.9, 0.2), (16.8, 0.1)),
        "reweight": _row((17.0, 0.2), (15.2, 0.2), (41.1, 0.3), (17.0, 0.2)),
        "smote": _row((16.9, 0.2), (15.1, 0.2), (41.0, 0.3), (16.9, 0.2)),
        "embed_smote": _row((17.0, 0.2), (15.2, 0.2), (41.1, 0.3), (17.0, 0.2)),
        "graphsmote_t": _row((18.2, 0.2), (15.6, 0.2), (42.5, 0.2), (18.2, 0.2)),
        "graphsmote_o": _row((18.2, 0.2), (15.5, 0.2), (42.5, 0.2), (18.2, 0.2)),
        "graphmixup": _row((18.1, 0.4), (15.5, 0.5), (42.5, 0.5), (18.1, 0.4)),
        "imgagn": _row((13.7, 0.2), (11.0, 0.0), (36.9, 0.2), (13.7, 0.2)),
        "graphens": _row((19.2, 3.8), (17.2, 3.6), (43.5, 4.4), (19.2, 3.8)),
        "lte4g": _row((20.9, 0.3), (19.9, 0.3), (45.7, 0.3), (20.9, 0.3)),
        "hiertail": _row((23.6, 0.9), (21.0, 1.3), (48.5, 1.0), (23.6, 0.9)),
    },
}

# Table 4: (a) M1 + M2 + L_CE, (b) M1 + L_CE, (c) L_CE only.
TABLE4_ABLATION: dict[str, dict[str, dict[str, Cell]]] = {
    "cora_full": {
        "m1_m2_ce": _row((55.8, 0.5), (57.1, 0.5), (74.5, 0.3), (64.7, 0.7)),
        "m1_ce": _row((54.5, 0.5), (56.2, 0.4), (73.6, 0.3), (64.5, 0.4)),
        "ce": _row((52.8, 0.6), (54.5, 0.7), (72.5, 0.4), (62.7, 0.5)),
    },
}

# Table 5: number of tasks in the second and third layer, "[198,70]" etc. (Cora-Full, 70 classes)
TABLE5_TASKS: dict[str, dict[tuple[int, int], dict[str, Cell]]] = {
    "cora_full": {
        (198, 70): _row((55.5, None), (56.7, None), (74.2, None), (64.6, None)),
        (70, 35): _row((55.8, None), (57.1, None), (74.5, None), (64.7, None)),
        (2, 1): _row((54.9, None), (56.8, None), (73.9, None), (65.5, None)),
    },
}

SENSITIVITY_GRID = {"gamma_searched": (0.01, 0.1), "tau_searched": (0.01, 0.1, 1.0),
                    "appendix_figure_gamma": 0.01, "appendix_figure_tau": 0.01}


def paper_cell(table: dict, dataset: str, row, metric: str) -> Cell | None:
    """The paper's cell, or None where the paper has no such dataset / row."""
    return table.get(dataset, {}).get(row, {}).get(metric)
