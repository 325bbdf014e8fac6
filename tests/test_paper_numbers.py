"""hiertail_fast.experiments.paper_numbers against the paper's source: every cell of Tables 1,
2, 3 and 5 read from ../shared/paper/hiertail_kdd24.tex by a parser written here, compared with the
transcription. A mutation audit found single-digit transcription errors (a std 1.7 -> 1.6, a
mean 15.5 -> 15.3) that the spot checks of tests/test_experiments_tables.py cannot see."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hiertail_fast.experiments.paper_numbers import (
    METRICS,
    PAPER_METHOD_NAMES,
    SENSITIVITY_GRID,
    TABLE1_DATASETS,
    TABLE2_MAIN,
    TABLE3_SEMI_SYNTHETIC,
    TABLE5_TASKS,
    Cell,
)

# located as tests/conftest.py locates the shared data
TEX = Path(__file__).resolve().parents[1].parent / "shared" / "paper" / "hiertail_kdd24.tex"

# the .tex's dataset headers and row labels -> the names paper_numbers uses
DATASETS = {"Cora-Full": "cora_full", "BlogCatalog": "blogcatalog", "Email": "email",
            "Wiki": "wiki", "Amazon-Clothing": "amazon_clothing",
            "Amazon-Electronics": "amazon_electronics"}
METHODS = {"Origin": "origin", "Over-sampling": "oversampling", "Re-weight": "reweight",
           "SMOTE": "smote", "Embed-SMOTE": "embed_smote",
           r"$\text{GraphSMOTE}_{T}$": "graphsmote_t", r"$\text{GraphSMOTE}_{O}$": "graphsmote_o",
           "GraphMixup": "graphmixup", "ImGAGN": "imgagn", "GraphENS": "graphens",
           "LTE4G": "lte4g", "Ours": "hiertail"}
CELL = re.compile(r"^\$(?:\\textbf\{)?(\d+\.\d)\}?\\pm(\d+\.\d)\$$")
HEADER = re.compile(r"\\multicolumn\{4\}\{[^}]*\}\{([^}]*)\}")


def _tabular(tex: str, label: str) -> list[str]:
    """The lines of the tabular that ends right before ``\\label{label}``."""
    end = tex.index(f"\\label{{{label}}}")
    start = tex.rindex("\\begin{tabular}", 0, end)
    return tex[start:end].splitlines()


def _parse(lines: list[str]) -> dict[str, dict[str, dict[str, Cell]]]:
    """dataset -> method -> metric -> Cell. A header line names the two datasets of the rows
    below it (four metric columns each, in METRICS order); a data row is
    ``group & Method & 8 cells \\\\``."""
    out: dict[str, dict[str, dict[str, Cell]]] = {}
    pair: list[str] = []
    for line in lines:
        names = HEADER.findall(line)
        if names:
            pair = [DATASETS[n] for n in names]
            assert len(pair) == 2, line
            continue
        cols = [c.strip() for c in line.split("\\\\")[0].split("&")]
        if len(cols) != 10 or not CELL.match(cols[2]):
            continue
        method = METHODS[cols[1]]
        cells = [CELL.match(c) for c in cols[2:]]
        assert all(cells), line
        for j, dataset in enumerate(pair):
            row = out.setdefault(dataset, {}).setdefault(method, {})
            assert not row, f"{dataset} / {method} appears twice"
            for metric, m in zip(METRICS, cells[4 * j:4 * j + 4], strict=True):
                row[metric] = Cell(float(m.group(1)), float(m.group(2)))
    return out


@pytest.fixture(scope="module")
def tex() -> str:
    if not TEX.is_file():
        pytest.skip(f"the paper's source is not at {TEX} (shared/paper/hiertail_kdd24.tex)")
    return TEX.read_text()


@pytest.mark.parametrize("label, table, datasets", [
    ("tab:result", TABLE2_MAIN, ["cora_full", "blogcatalog", "email", "wiki"]),
    ("tab:resultSyn", TABLE3_SEMI_SYNTHETIC, ["amazon_clothing", "amazon_electronics"]),
])
def test_every_cell_matches_the_tex(tex, label, table, datasets):
    """Every (dataset, method, metric) cell of Table 2 (``tab:result``) and Table 3
    (``tab:resultSyn``): mean and std as printed (bold marks stripped), 12 methods × 4 metrics
    per dataset, the same set of cells on both sides."""
    parsed = _parse(_tabular(tex, label))
    assert sorted(parsed) == sorted(datasets)
    assert all(len(rows) == 12 for rows in parsed.values())
    mismatches = [(d, r, m, parsed[d][r].get(m), table.get(d, {}).get(r, {}).get(m))
                  for d in parsed for r in parsed[d] for m in METRICS
                  if parsed[d][r].get(m) != table.get(d, {}).get(r, {}).get(m)]
    assert mismatches == []              # (dataset, method, metric, tex, paper_numbers)
    assert {(d, r) for d, rows in table.items() for r in rows} == {
        (d, r) for d, rows in parsed.items() for r in rows}


TABLE1_COLUMNS = ("nodes", "edges", "features", "classes", "imbalance", "ratio_lt")


def test_table1_every_cell_matches_the_tex(tex):
    """Table 1 (``tab:datasets``): the six statistics of each of the six datasets. (A mutation
    audit: a Cora-Full Ratio_LT mistyped 1.09 -> 1.90 passed the suite, which read Table 1 only
    through Email's statistics.)"""
    parsed = {}
    for line in _tabular(tex, "tab:datasets"):
        cells = [c.strip() for c in line.split("\\\\")[0].split("&")]
        if cells[0] in DATASETS:
            values = [float(c.replace(",", "")) for c in cells[1:]]
            parsed[DATASETS[cells[0]]] = dict(zip(TABLE1_COLUMNS, values, strict=True))
    assert sorted(parsed) == sorted(TABLE1_DATASETS) == sorted(DATASETS.values())
    for name, row in parsed.items():
        assert {k: float(v) for k, v in TABLE1_DATASETS[name].items()} == row, name


def test_table5_every_cell_matches_the_tex(tex):
    """Table 5 (``tab:overcluster``, Cora-Full at three task counts): every mean, no stds. (A
    mutation audit: the [2, 1] row's Macro-F1 mistyped 56.8 -> 56.3 passed the suite, and would
    flip that row's verdict in the tasks report.)"""
    rows = re.findall(r"\$\[(\d+),(\d+)\]\$((?:\s*&\s*\$\d+\.\d\$)+)",
                      "\n".join(_tabular(tex, "tab:overcluster")))
    assert len(rows) == 3
    parsed = {(int(a), int(b)): [float(v) for v in re.findall(r"\d+\.\d", cells)]
              for a, b, cells in rows}
    ours = TABLE5_TASKS["cora_full"]
    assert {k: [ours[k][m].mean for m in METRICS] for k in ours} == parsed
    assert all(ours[k][m].std is None for k in ours for m in METRICS)


def test_paper_method_names_are_the_tables_row_labels():
    """PAPER_METHOD_NAMES: each method's row label as Tables 2 and 3 print it (a LaTeX
    subscript written ``_T`` / ``_O``, "Ours" as "Ours (HierTail)"), so no two of the main
    table's rows carry the same label."""
    def plain(label: str) -> str:
        return re.sub(r"^\$\\text\{(\w+)\}_\{(\w)\}\$$", r"\1_\2", label)

    expected = {name: "Ours (HierTail)" if name == "hiertail" else plain(label)
                for label, name in METHODS.items()}
    assert PAPER_METHOD_NAMES == expected
    assert len(set(PAPER_METHOD_NAMES.values())) == len(PAPER_METHOD_NAMES)


def test_sensitivity_grid_matches_the_tex(tex):
    """SENSITIVITY_GRID: the values the appendix says γ and τ were selected in (γ in
    $\\{0.01, 0.1\\}$, τ in $\\{0.01, 0.1, 1.0\\}$), and the γ, τ its remaining-hyperparameter
    figures were run with."""
    def selected(name: str) -> tuple[float, ...]:
        m = re.search(rf"{name}\$[^$]*?is selected in \$\\{{([^$]*)\\}}\$", tex)
        assert m, name
        return tuple(float(v) for v in m.group(1).split(","))

    assert SENSITIVITY_GRID["gamma_searched"] == selected(r"\\gamma")
    assert SENSITIVITY_GRID["tau_searched"] == selected(r"\\tau")
    m = re.search(r"weight \$\\gamma=([\d.]+)\$ and temperature \$\\tau=([\d.]+)\$", tex)
    assert m
    assert (SENSITIVITY_GRID["appendix_figure_gamma"], SENSITIVITY_GRID["appendix_figure_tau"]) \
        == (float(m.group(1)), float(m.group(2)))
