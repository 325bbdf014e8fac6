"""bench/loss_golden.py: the bit-for-bit guard for loss refactors records every engine's calls
in both code paths and tells any difference apart, errors included."""
from __future__ import annotations

import torch

from tests.conftest import load_bench, on_backend_device


def test_records_repeat_bit_for_bit_and_any_change_shows(tmp_path):
    on_backend_device("triton")      # its cases are CPU tensors: the interpreter (skip on CUDA)
    golden = load_bench("bench_loss_golden", "loss_golden.py")
    shape = ((33, 5, 2),)                       # the two-level problem: the cheapest
    a, b = golden.record(shape), golden.record(shape)
    assert a and not golden.differences(a, b)
    forms = {k[3] for k in a} | {k[4] for k in a}
    assert {"cpu", "cuda", "torch", "attention", "attention[kernels]", "triton",
            "reference"} <= forms
    # 33 rows, logit bound over max(64, 33): fp32 exact calls under "attention" run the torch
    # engine (the guard's rows rule), "attention[kernels]" the kernels, whose rounding differs
    exact = [k for k in a if k[4] == "torch" and k[5] == "exact" and "float32" in k[6]]
    assert exact
    def on(k, engine):
        return {k: a[(*k[:4], engine, *k[5:])]}

    assert not any(golden.differences({k: a[k]}, on(k, "attention")) for k in exact)
    assert any(golden.differences({k: a[k]}, on(k, "attention[kernels]")) for k in exact)
    assert all(len(v) == 2 for v in a.values()), [v for v in a.values() if len(v) == 1][:3]
    key = next(k for k in a if k[3] == "cuda" and k[4] == "attention" and "bfloat16" in k[6])
    value, grad = b[key]
    nudged = grad.clone()
    nudged.view(-1)[0] = torch.nextafter(nudged.view(-1)[0].float(),
                                         torch.tensor(float("inf"))).to(grad.dtype)
    b[key] = (value, nudged if not torch.equal(nudged, grad) else grad + 1)
    other = next(k for k in a if k != key)
    b[other] = ("RuntimeError: made up",)
    del b[next(k for k in a if k not in (key, other))]
    diff = golden.differences(a, b)
    assert len(diff) == 3 and any("only in one record" in line for line in diff)
    assert any(str(key) in line for line in diff) and any("made up" in line for line in diff)
    path_a, path_b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save(a, path_a)
    torch.save(b, path_b)
    assert golden.main(["compare", str(path_a), str(path_a)]) == 0
    assert golden.main(["compare", str(path_a), str(path_b)]) == 1
