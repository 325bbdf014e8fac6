"""hiertail_fast.experiments.paper_numbers against the paper's source: every cell of Tables 2
and 3 read from ../shared/paper/hiertail_kdd24.tex by a parser written here, compared with the
transcription. A mutation audit found single-digit transcription errors (a std 1.7 -> 1.6, a
mean 15.5 -> 15.3) that the spot checks of tests/test_experiments_tables.py cannot see."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hiertail_fast.experiments.paper_numbers import (
    METRICS,
    TABLE2_MAIN,
    TABLE3_SEMI_SYNTHETIC,
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
