"""bench/a2_product.py (A²'s sparse square: scipy against torch's CSR product, round-robin):
runs end to end on a small graph and prints its table (an untimed smoke run)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "a2_product.py"


def test_a2_product_runs(capsys):
    spec = importlib.util.spec_from_file_location("bench_a2_product", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--sizes", "200", "--rounds", "1", "--reps", "1"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| 200 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 6 and float(cells[4]) > 0 and "load average after" in out
