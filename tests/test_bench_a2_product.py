"""bench/a2_product.py (A²'s sparse square: scipy against torch's CSR product, round-robin):
runs end to end on a small graph and prints its table (an untimed smoke run)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.conftest import load_bench


def _a2_product():
    return load_bench("bench_a2_product", "a2_product.py")


def test_a2_product_runs(capsys):
    module = _a2_product()
    module.main(["--sizes", "200", "--rounds", "1", "--reps", "1"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| 200 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 6 and float(cells[4]) > 0 and "load average after" in out


def test_a2_product_row_is_per_call_medians_bests_ratio_and_kept_rss(monkeypatch, capsys):
    """A size's row: the product's entries, each side's median (best) round in ms per call
    (--reps calls a round, after a warm-up), scipy / torch, and the RSS each kept in MB; the
    matrix squared has unit self-loops."""
    module = _a2_product()
    now, rss, seen = [0.0], [0], {}
    ms = 1e-3
    durations = {"torch": iter([t * ms for t in (50, 2, 2, 3, 3, 10, 10)]),
                 "scipy": iter([t * ms for t in (50, 1, 1, 1.5, 1.5, 0.5, 0.5)])}

    def fake(name):
        def call(g, *args):
            seen.setdefault(name, []).append(g)
            now[0] += next(durations[name])
            rss[0] += 2**20 if name == "torch" else 0          # the torch side leaks 1 MB
        return call

    monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(module, "psutil", SimpleNamespace(Process=lambda: SimpleNamespace(
        memory_info=lambda: SimpleNamespace(rss=rss[0]))))
    monkeypatch.setattr(module, "_torch_square", fake("torch"))
    monkeypatch.setattr(module, "csr_square", fake("scipy"))
    module.main(["--sizes", "200", "--rounds", "3", "--reps", "2"])
    out = capsys.readouterr().out
    g = seen["torch"][0]
    row = next(line for line in out.splitlines() if line.startswith("| 200 |"))
    assert row == f"| 200 | {g.num_edges:,} | 3.00 (2.00) | 1.00 (0.50) | 0.33 | 6 / 0 |"
    assert len(seen["torch"]) == len(seen["scipy"]) == 7
    matrix = torch.zeros(200, 200)
    matrix[torch.arange(200).repeat_interleave(g.indptr.diff()), g.indices] = \
        g.weight_or_ones(torch.float32)
    assert torch.equal(matrix.diagonal(), torch.ones(200))


def test_a2_product_refuses_bad_sizes_and_a_missing_scipy(monkeypatch, capsys):
    """Every size is checked (not only the first), and without scipy the tool says so."""
    module = _a2_product()
    with pytest.raises(SystemExit) as exit_:
        module.main(["--sizes", "200", "10"])
    assert exit_.value.code == 2 and "--sizes must be >= 12" in capsys.readouterr().err
    monkeypatch.setattr(module, "_scipy_sparse", lambda: None)
    with pytest.raises(SystemExit, match="a2_product: scipy is not installed"):
        module.main(["--sizes", "200", "--rounds", "1", "--reps", "1"])
