"""bench/tied_weights.py: keys tied with a row's max in classes of unequal size, the exact
variant's gradient against a float64 truth that multiplies the class weights."""
from __future__ import annotations

import re

import torch

from tests.conftest import backend_device, load_bench


def test_truth_is_the_exact_loss_and_the_torch_engine_keeps_the_weights_at_any_size():
    """The truth is the dense reference's loss where |s| is small (float64, 1e-12); the torch
    engine, which multiplies the weights, matches it on the tie at |s| = 1e4 and 1e17 alike."""
    tied = load_bench("bench_tied_weights", "tied_weights.py")
    z, labels = tied.problem(1e2, 0.5)
    assert torch.equal(z[0], z[1]) and torch.bincount(labels).tolist() == [2, 3]
    reference = tied.engine_grad(z, labels, 0.5, "reference", torch.float64)
    want = tied.truth(z, labels, 0.5)
    assert ((reference - want).abs().max() / want.abs().max()).item() < 1e-12
    for size in (1e4, 1e17):
        z, labels = tied.problem(size, 0.5)
        want = tied.truth(z, labels, 0.5)
        got = tied.engine_grad(z, labels, 0.5, "torch", torch.float32)
        assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5, size


def test_the_reference_loses_the_weights_of_tied_keys_at_1e17():
    """The dense reference's logsumexp(s + log w) rounds log w at the size of s: at |s| ~ 1e17
    its float64 gradient is off by O(1) on the tie (why bench/official_fuzz.py caps its bound
    at 2^37; a reference that multiplies the weights changes both)."""
    tied = load_bench("bench_tied_weights", "tied_weights.py")
    backend_device("triton")            # the Triton column runs on the Triton device
    errors = tied.errors(1e17, 0.5)
    assert errors["reference float64"] > 1.0 and errors["torch fp32"] < 1e-5, errors


def test_main_prints_a_row_per_size(capsys):
    from hiertail_fast.ops._dispatch import triton_unavailable_reason

    tied = load_bench("bench_tied_weights", "tied_weights.py")
    device = torch.device(backend_device("triton"))
    assert tied.main(["--sizes", "100", "1e6", "--tau", "0.1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("| max \\|s\\| | reference float64 | reference fp32 | torch fp32 | "
                        "Triton fp32 |")
    rows = [line.split(" | ") for line in lines[2:]]
    assert [r[0] for r in rows] == ["| 1e+02", "| 1e+06"]
    triton = triton_unavailable_reason(device) is None
    for r in rows:
        assert all(re.fullmatch(r"\d\.\de[-+]\d\d", cell) for cell in r[1:4]), r
        assert (r[4] != "- |") == triton, r
