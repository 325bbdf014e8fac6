"""The loss kernels' launches ask Triton for no floating-point contraction (FMA fusion) where a
score must be one rounded number (kernels/_utils.fp_fusion): the official variant's relative
mode, the shared-keys mode and the positives kernel; the exact variant's plain mode keeps it.

On an NVIDIA H200 (2026-12-04) the relative mode's δ = lse - rowmax came out half an ulp of |s|
off (fma(dot, scale, -r) instead of round(dot * scale) - r), failing
test_relative_mode_official_cancellation, test_official_16bit_rows_at_large_logits[triton] and
test_official_prototype_copying_a_node_row_matches_reference[triton]. The interpreter never
contracts, so its numbers cannot show the difference: these tests check the launch options, and
the CUDA run of those three tests checks the numbers.
"""
from __future__ import annotations

import pytest
import torch

from tests.conftest import requires_triton

pytestmark = requires_triton


class _Recorder:
    """Stands in for a JITFunction: records each launch's keyword arguments and launches it."""

    def __init__(self, fn, calls):
        self.fn, self.calls = fn, calls

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append(kwargs)
            return self.fn[grid](*args, **kwargs)
        return launch


def _case(triton_device, levels=2, n=40, d=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d, generator=gen) * 3
    log_w = -torch.rand(levels, n, generator=gen)
    grad = torch.rand(levels, n, generator=gen)
    return (t.to(triton_device) for t in (z, log_w, grad))


@pytest.fixture
def launches(monkeypatch):
    from hiertail_fast.kernels import balanced_contrastive_loss as k
    calls: dict[str, list] = {"fwd": [], "bwd": []}
    recorded = {w: _Recorder(fn, calls[w]) for w, fn in k._KERNELS.items()}
    monkeypatch.setattr(k, "_KERNELS", recorded)
    return k, calls


@pytest.mark.parametrize("relative", [True, False])
def test_relative_mode_launches_without_fp_fusion(launches, triton_device, relative):
    k, calls = launches
    z, log_w, grad = _case(triton_device)
    lse, rowmax, argmax = k.lse_forward(z, log_w, 0.5, True, relative=relative)
    k.lse_backward(z, log_w, lse, grad, 0.5, rowmax=rowmax if relative else None,
                   argmax=argmax if relative else None)
    assert calls["fwd"] and calls["bwd"]
    for kw in calls["fwd"] + calls["bwd"]:
        assert kw["RELATIVE"] is relative
        if relative:
            assert kw.get("enable_fp_fusion") is False, kw
        else:       # the exact variant's plain mode: Triton's default (fused) stays
            assert "enable_fp_fusion" not in kw, kw


def test_shared_keys_mode_launches_without_fp_fusion(launches, triton_device):
    k, calls = launches
    z, log_w, grad = _case(triton_device, n=64)
    lse, _, _ = k.lse_forward(z, log_w, 0.5, False, n_common=32)
    k.lse_backward(z, log_w, lse, grad, 0.5, n_common=32)
    assert calls["fwd"] and calls["bwd"]
    assert all(kw["SHARED"] and kw.get("enable_fp_fusion") is False
               for kw in calls["fwd"] + calls["bwd"])


def test_positives_kernel_launches_without_fp_fusion(monkeypatch, triton_device):
    from hiertail_fast.kernels import balanced_contrastive_loss as k
    from hiertail_fast.kernels import balanced_contrastive_loss_positives as pos
    calls: list = []
    monkeypatch.setattr(pos, "_positive_pairs_kernel",
                        _Recorder(pos._positive_pairs_kernel, calls))
    z, log_w, _ = _case(triton_device, levels=1)
    _, rowmax, argmax = k.lse_forward(z, log_w, 0.5, True, relative=True)
    gid = (torch.arange(z.shape[0]) % 3).to(triton_device)
    pos.positive_pairs(z, gid, 3, rowmax[0], argmax[0], 0.5, False,
                       torch.ones(z.shape[0], device=triton_device))
    assert calls and all(kw.get("enable_fp_fusion") is False for kw in calls)


class _Stop(Exception):
    pass


def test_the_autotuned_launches_are_unfused_too(monkeypatch, triton_device):
    """The autotuned branch of the launchers (HIERTAIL_TRITON_AUTOTUNE=1 on CUDA) launches the
    official variant's relative mode and the shared-keys mode without FMA fusion too (a fused
    launch gives delta = lse - rowmax half an ulp of |s| off). The tests above record the
    fixed-tile launches only; dropping the option from the tuned call passed them (c95545a, a
    fix-test check, session 68). Here a stand-in autotuner records each launch's options."""
    from hiertail_fast.kernels import balanced_contrastive_loss as k

    z, log_w, grad = _case(triton_device)
    lse, rowmax, argmax = k.lse_forward(z, log_w, 0.5, True, relative=True)
    shared_lse, _, _ = k.lse_forward(z, log_w, 0.5, False, n_common=20)
    seen: list = []

    class Tuner:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append(kwargs)
                raise _Stop
            return launch

    monkeypatch.setattr(k, "_use_autotune", lambda z, autotune: True)
    monkeypatch.setattr(k, "_tuned", lambda which: Tuner())
    for call in (lambda: k.lse_forward(z, log_w, 0.5, True, relative=True),
                 lambda: k.lse_backward(z, log_w, lse, grad, 0.5, rowmax=rowmax,
                                        argmax=argmax),
                 lambda: k.lse_forward(z, log_w, 0.5, False, n_common=20),
                 lambda: k.lse_backward(z, log_w, shared_lse, grad, 0.5, n_common=20)):
        with pytest.raises(_Stop):
            call()
    assert len(seen) == 4
    assert all(kw.get("enable_fp_fusion") is False for kw in seen), seen
