"""bench/interleaved.py (round-robin timing against the peers): runs end to end on a small graph,
records every provider, and rejects unknown providers with a message."""
from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from tests._preloaded_cli import run_script

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "interleaved.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return run_script(SCRIPT, args, timeout=300)


@pytest.mark.parametrize("op,modes", [("propagation", {"fwd", "fwd+bwd"}),
                                      ("pooling", {"fwd+bwd"}), ("prototype", {"fwd"})])
def test_round_robin_records_every_provider(tmp_path, op, modes):
    out = tmp_path / "r.json"
    res = _run(op, "--nodes", "1000", "--dims", "8", "--rounds", "3", "--out", str(out))
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    providers = {r["provider"] for r in data["records"]}
    assert "torch" in providers and len(providers) >= 2  # ours and at least one peer
    assert {r["mode"] for r in data["records"]} == modes
    for r in data["records"]:
        assert len(r["times_s"]) == 3 and all(t > 0 for t in r["times_s"])
        if op == "propagation":  # achieved bandwidth under bench/_roofline.py's byte model
            assert r["achieved_GBps"] == pytest.approx(r["bytes_model"] / r["median_s"] / 1e9)
            assert r["bytes_model"] >= r["edges"] * 8 * 4
        assert r["min_s"] == min(r["times_s"]) and r["n"] == 1000 and r["d"] == 8
    assert "x torch" in res.stdout


def test_an_unwritable_out_is_refused_before_any_timing(tmp_path):
    """--out is checked before the rounds (minutes of timing must not end in a lost write)."""
    folder = tmp_path / "a_folder"
    folder.mkdir()
    res = _run("prototype", "--nodes", "1000000", "--rounds", "50", "--out", str(folder))
    assert res.returncode == 2 and "is a directory" in res.stderr
    assert "median" not in res.stdout          # refused before the first round


def test_unknown_provider_is_an_error():
    res = _run("pooling", "--providers", "torch", "nonexistent", "--rounds", "1")
    assert res.returncode == 2
    assert "nonexistent" in res.stderr


def test_propagation_providers_compute_the_same_product():
    """The benchmark compares like with like: every provider of Â·X (ours, the reference, PyG's
    GCNConv propagation) gives the same result on the benchmark's graph; the un-normalised
    peers give A·X."""
    import torch

    spec = importlib.util.spec_from_file_location(
        "bench_test_propagation", SCRIPT.parent / "test_propagation.py")
    tp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tp)
    ei, graph = tp._graph(2_000)  # on the benchmark's device (CUDA when present)
    x = torch.randn(2_000, 5, dtype=torch.float32, device=ei.device)
    want = tp._propagator("reference", ei, graph)(x)
    adj = torch.zeros(2_000, 2_000, device=ei.device).index_put_(
        (ei[1], ei[0]), torch.ones(ei.shape[1], device=ei.device), accumulate=True)
    for provider in tp.PROVIDERS:
        got = tp._propagator(provider, ei, graph)(x)
        expected = adj @ x if provider in ("peer_sparse_mm", "peer_torch_sparse") else want
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, msg=provider)


def _roofline():
    spec = importlib.util.spec_from_file_location("bench_roofline", SCRIPT.parent / "_roofline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bandwidth_byte_model_and_peaks():
    rl = _roofline()
    # n = 2 rows, 3 entries, d = 4 fp32: 3·(4 + 16) + 2·(4 + 16) = 100 bytes per SpMM
    assert rl.spmm_bytes(2, 3, 4) == 100 and rl.spmm_bytes(2, 3, 4, mode="fwd+bwd") == 200
    assert rl.spmm_bytes(2, 3, 4, elem_bytes=2) == 3 * 12 + 2 * 12
    assert rl.peak_bandwidth("NVIDIA H200") == 4.8e12
    assert rl.peak_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert rl.peak_bandwidth("NVIDIA H100 PCIe") == 2.0e12
    assert rl.peak_bandwidth("AMD EPYC 7B13") is None
    fig = rl.bandwidth_figures(2, 3, 4, 1e-6, "fwd", "NVIDIA H200")
    assert fig["achieved_GBps"] == pytest.approx(0.1)  # 100 B in 1 µs
    assert fig["peak_fraction"] == pytest.approx(1e8 / 4.8e12)
    assert rl.bandwidth_figures(2, 3, 4, 1.0, "fwd", None)["peak_fraction"] is None
    with pytest.raises(ValueError, match="mode"):
        rl.spmm_bytes(2, 3, 4, mode="bwd")
    with pytest.raises(ValueError, match="positive"):
        rl.bandwidth_figures(2, 3, 4, 0.0, "fwd", None)
