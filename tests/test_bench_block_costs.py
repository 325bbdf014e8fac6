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
            "exact loss / block", "attention loss / block"} <= pieces
    for r in data["rows"]:
        assert 0 < r["best_ms"] <= r["median_ms"] and (r["n"], r["d"]) == (300, 8)
        if "GEMM" in r["piece"]:   # 2 * B * rows * d flops per call
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
