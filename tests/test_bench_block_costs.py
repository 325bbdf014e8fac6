"""bench/block_costs.py (one engine block's pieces, timed round-robin): runs end to end on a
small case, records every piece with consistent statistics, and rejects bad arguments."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "block_costs.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=300)


def test_every_piece_is_timed(tmp_path):
    out = tmp_path / "bc.json"
    res = _run("--sizes", "300", "--dims", "8", "--rounds", "2", "--reps", "2", "--tile", "128",
               "--out", str(out))
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    pieces = {r["piece"] for r in data["rows"]}
    assert {"logits GEMM", "logits GEMM, 128-column tiles", "query-side GEMM", "key-side GEMM",
            "exact loss / block", "attention loss / block", "3-GEMM floor / block",
            "symmetric floor / block"} <= pieces
    for r in data["rows"]:
        assert 0 < r["best_ms"] <= r["median_ms"] and (r["n"], r["d"]) == (300, 8)
        if r["piece"].startswith(("logits", "query-side", "key-side")):  # 2 B rows d flop
            flop = 2 * 256 * (300 + 40) * 8
            assert abs(r["gflops_best"] - flop / (r["best_ms"] * 1e6)) < 1e-6 * r["gflops_best"]
        else:
            assert r["gflops_median"] is None
    assert data["meta"]["rounds"] == 2 and data["meta"]["load_before"] is not None
    assert out.with_suffix(".md").read_text() in res.stdout


def test_bad_arguments(tmp_path):
    res = _run("--sizes", "100", "--out", str(tmp_path / "x.json"))
    assert res.returncode == 2 and "--sizes must be >= 256" in res.stderr
    assert not (tmp_path / "x.json").exists()


def test_symmetric_scheme_matches_the_engine():
    """The symmetric scheme timed as a candidate (upper-triangle blocks, row and column
    statistics) computes the engine's log-sum-exp and gradient: ragged last block, float64."""
    import importlib.util

    import torch

    from hiertail_fast.ops import _lse_torch

    spec = importlib.util.spec_from_file_location("bench_block_costs", SCRIPT)
    bc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bc)
    gen = torch.Generator().manual_seed(0)
    n, d, scale = 3 * bc.BLOCK + 37, 12, 4.0
    z = torch.randn(n, d, generator=gen, dtype=torch.float64)
    w = torch.rand(n, generator=gen, dtype=torch.float64) + 0.1
    g = torch.randn(n, generator=gen, dtype=torch.float64)
    lse, dz = bc.symmetric_lse_grad(z, w, scale, g, cutoff=200.0)
    ref_lse, _, _, ref_dz = _lse_torch.lse_fused(z, w.log()[None], scale, False,
                                                 lambda rows, lse_b, max_b: g[None, rows])
    torch.testing.assert_close(lse, ref_lse[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dz, ref_dz, rtol=1e-10, atol=1e-10 * ref_dz.abs().max().item())
