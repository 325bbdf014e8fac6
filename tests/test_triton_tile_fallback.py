"""A Triton launch whose tile the GPU cannot hold falls back on a smaller tile (``_utils.
launch_fitting``), instead of failing: Triton raises OutOfResources before the kernel runs when
its compiled shared memory exceeds the device's (fp32 at d = 128: up to 128 KB for sm_86; RTX
30xx / 40xx, A10, L4 give a block 99 KB). No GPU here has too little, so the tests
stand a kernel in that raises the way Triton does for tiles over a limit and otherwise runs the
real kernel (under the interpreter on CPU, compiled on CUDA), and compare the numbers with the
unconstrained launch.
"""
from __future__ import annotations

import pytest
import torch

from tests.conftest import requires_triton

pytestmark = requires_triton
INF = float("inf")


def _utils():
    from hiertail_fast.kernels import _utils as u
    return u


def _oor(area):
    from triton.runtime.errors import OutOfResources
    return OutOfResources(area * 32, 101376, "shared memory")


class _Recorder:
    """launch(tile) that raises OutOfResources for tiles of more than `limit` elements."""

    def __init__(self, limit):
        self.limit, self.tried = limit, []

    def __call__(self, tile):
        self.tried.append(tile)
        if tile[0] * tile[1] > self.limit:
            raise _oor(tile[0] * tile[1])


def test_falls_back_to_the_first_smaller_tile_that_fits(monkeypatch):
    u = _utils()
    monkeypatch.setattr(u, "_FITTED", {})
    launch = _Recorder(limit=2048)
    z, meta = torch.zeros(1), {"D_PAD": 64}
    got = u.launch_fitting(launch, (128, 64, 4), "a kernel", z, meta)
    assert got == (64, 32, 8)
    assert launch.tried == [(128, 64, 4), (64, 64, 4), (64, 32, 8)]
    # remembered per specialisation and asked tile: the next call launches the fitted tile
    launch.tried.clear()
    assert u.launch_fitting(launch, (128, 64, 4), "a kernel", z, dict(meta)) == (64, 32, 8)
    assert launch.tried == [(64, 32, 8)]
    # another specialisation (kernel, dtype, constants) starts from its own asked tile
    for other in (("another kernel", z, meta), ("a kernel", z.double(), meta),
                  ("a kernel", z, {"D_PAD": 128})):
        launch.tried.clear()
        assert u.launch_fitting(launch, (128, 64, 4), *other) == (64, 32, 8)
        assert launch.tried[0] == (128, 64, 4)
    # a tile that fits is launched as asked, nothing else tried
    launch.tried.clear()
    assert u.launch_fitting(launch, (32, 64, 4), "a kernel", z, meta) == (32, 64, 4)
    assert launch.tried == [(32, 64, 4)]


def test_only_smaller_tiles_are_tried_and_none_fitting_is_a_clear_error(monkeypatch):
    u = _utils()
    monkeypatch.setattr(u, "_FITTED", {})
    launch = _Recorder(limit=512)
    with pytest.raises(RuntimeError, match=r"the loss's kernel: no tile fits this GPU "
                                           r"\(tried 64x32x8, 32x32x4: out of resource"):
        u.launch_fitting(launch, (64, 32, 8), "the loss's kernel", torch.zeros(1), {})
    assert launch.tried == [(64, 32, 8), (32, 32, 4)]      # never a larger tile


def test_other_errors_pass_through(monkeypatch):
    u = _utils()
    monkeypatch.setattr(u, "_FITTED", {})
    calls = []

    def launch(tile):
        calls.append(tile)
        raise ValueError("a bad argument")

    with pytest.raises(ValueError, match="a bad argument"):
        u.launch_fitting(launch, (128, 64, 4), "a kernel", torch.zeros(1), {})
    assert calls == [(128, 64, 4)]


class _Limited:
    """Stands in for a @triton.jit kernel: kernel[grid](..., BLOCK_M=, BLOCK_N=, ...) raises
    OutOfResources as Triton does (before running) for tiles over `limit` elements, and
    launches the real kernel otherwise."""

    def __init__(self, kernel, limit):
        self.kernel, self.limit, self.tiles = kernel, limit, []

    def __getitem__(self, grid):
        def run(*args, **meta):
            tile = (meta["BLOCK_M"], meta["BLOCK_N"], meta["num_warps"])
            self.tiles.append(tile)
            if tile[0] * tile[1] > self.limit:
                raise _oor(tile[0] * tile[1])
            self.kernel[grid](*args, **meta)
        return run


def _case(n=200, d=24, levels=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d, generator=gen) * 2.0
    log_w = -torch.rand(levels, n, generator=gen) * 3
    log_w[torch.rand(levels, n, generator=gen) < 0.2] = -INF
    log_w[:, 0] = 0.0
    grad = torch.randn(levels, n, generator=gen)
    return z, log_w, grad


def test_lse_kernels_fall_back_and_give_the_same_numbers(monkeypatch, triton_device):
    """Forward (official relative mode: lse, row max, arg-max) and one-pass backward with the
    arg-max fold, each on a device that holds only 32 x 32 tiles, equal the unconstrained
    launch (the interpreter's backward needs square tiles, which the 32 x 32 fallback is)."""
    from hiertail_fast.kernels import balanced_contrastive_loss as k

    u = _utils()
    z, log_w, grad = (t.to(triton_device) for t in _case())
    scale = 5.0

    def run():
        lse, rowmax, argmax = k.lse_forward(z, log_w, scale, True, relative=True)
        dz = k.lse_backward(z, log_w, lse, grad, scale, rowmax=rowmax, argmax=argmax)
        return lse, rowmax, argmax, dz

    want = run()
    monkeypatch.setattr(u, "_FITTED", {})
    fakes = {w: _Limited(kern, limit=1024) for w, kern in k._KERNELS.items()}
    monkeypatch.setattr(k, "_KERNELS", fakes)
    got = run()
    for which in ("fwd", "bwd"):
        assert fakes[which].tiles[-1] == (32, 32, 4), which
        assert any(t[0] * t[1] > 1024 for t in fakes[which].tiles), "setup: no fallback ran"
    assert torch.equal(got[2], want[2])
    for g, w, what in zip(got, want, ("lse", "rowmax", "argmax", "dz"), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * w.abs().max().item(),
                                   msg=what)


def test_positives_kernel_falls_back_and_gives_the_same_numbers(monkeypatch, triton_device):
    from hiertail_fast.kernels import balanced_contrastive_loss as lse_k
    from hiertail_fast.kernels import balanced_contrastive_loss_positives as pos_k

    u = _utils()
    gen = torch.Generator().manual_seed(3)
    n, d, scale = 150, 16, 3.0
    z = torch.randn(n, d, generator=gen).to(triton_device)
    gid = torch.randint(0, 4, (n,), generator=gen).to(triton_device)
    coef = torch.randn(n, generator=gen).to(triton_device)
    _, rmax, amax = lse_k.lse_forward(z, torch.zeros(1, n, device=triton_device), scale, True)

    def run():
        return pos_k.positive_pairs(z, gid, 4, rmax[0], amax[0], scale, False, coef)

    want = run()
    monkeypatch.setattr(u, "_FITTED", {})
    fake = _Limited(pos_k._positive_pairs_kernel, limit=1024)
    monkeypatch.setattr(pos_k, "_positive_pairs_kernel", fake)
    got = run()
    assert fake.tiles[-1] == (32, 32, 4) and fake.tiles[0][0] * fake.tiles[0][1] > 1024
    for g, w, what in zip(got, want, ("T", "Q", "dz"), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * w.abs().max().item(),
                                   msg=what)
