"""Corners of the Triton loss kernels that a mutation audit found untested (2026-12-02): each
test here failed on a small plausible bug (a mutant) that the rest of the suite let through.

Runs on CUDA when present, else on CPU under TRITON_INTERPRET=1 (conftest's triton_device).
Every check is against an independent computation: the dense float64 oracle of
tests/test_balanced_contrastive_loss_triton.py (`dense`, under its tolerance rule
`assert_rule`) or a formula written out here.
"""
from __future__ import annotations

import pytest
import torch

from tests.conftest import requires_triton
from tests.test_balanced_contrastive_loss_triton import assert_rule, dense, make_case

pytestmark = requires_triton
INF = float("inf")


def _kernels():
    from hiertail_fast.kernels import balanced_contrastive_loss as k
    return k


def _tied_case(n=150, d=16):
    """Integer embeddings (every dot exact in fp32, so equal scores are exact ties) whose
    favourite key is duplicated at rows 10, 70 and 140: three different 64-key tiles."""
    z = torch.randint(-2, 3, (n, d), generator=torch.Generator().manual_seed(2)).float()
    z[:, 0] = 3.0
    z[[10, 70, 140]] = torch.full((d,), 3.0)
    return z


def test_relative_mode_ties_across_tiles_pick_the_first_index(triton_device):
    """The relative mode (the official variant's forward) keeps lse_forward's documented
    arg-max rule, the lowest index among exactly tied visible keys, when the tied keys lie in
    different key tiles (a mutation audit: a `>=` for `>` in the relative mode's cross-tile
    update moved the arg-max to the LAST copy and no test noticed). Level 1 hides the first
    copy, so its ties never resolve past the second one."""
    k = _kernels()
    n, scale = 150, 0.5
    z = _tied_case(n)
    log_w = -torch.rand(2, n, generator=torch.Generator().manual_seed(3))
    log_w[1, 10] = -INF
    grad = torch.zeros(2, n)
    ref = dense(z, log_w, scale, grad, torch.float64)
    tied = (ref[4][:, 70] == ref[1][0]) & (ref[4][:, 140] == ref[1][0])
    assert tied.sum() > 10, "test setup: the duplicated key should tie across tiles"
    _, rowmax, argmax = k.lse_forward(z.to(triton_device), log_w.to(triton_device), scale,
                                      True, relative=True)
    assert torch.equal(rowmax.cpu().double(), ref[1])          # exact: integer scores
    assert torch.equal(argmax.cpu(), ref[2])
    tied1 = (ref[4][:, 70] == ref[1][1]) & (ref[4][:, 140] == ref[1][1])
    assert (argmax[1].cpu()[tied1] <= 70).all()          # never a later copy


@pytest.mark.parametrize("relative", [False, True])
def test_non_contiguous_inputs(relative, triton_device):
    """lse_forward / lse_backward on views: z a transposed [N, d] view (stride (1, N)) and
    log_w / grad column slices of [N, L] tensors. The launchers promise to make them
    contiguous (a mutation audit: dropping either `.contiguous()` in lse_forward gave lse off
    by ~20 and no test noticed); same rule against float64 as the contiguous case."""
    k = _kernels()
    n, d, levels, scale = 40, 16, 2, 2.0
    z, log_w, grad = make_case(n, d, levels, 3.0, seed=21)
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zv = z.T.contiguous().to(triton_device).T
    lwv = log_w.T.contiguous().to(triton_device).T
    gv = grad.T.contiguous().to(triton_device).T
    assert not (zv.is_contiguous() or lwv.is_contiguous() or gv.is_contiguous())
    lse, rowmax, argmax = k.lse_forward(zv, lwv, scale, True, relative=relative)
    assert_rule(lse, ref[0], low[0], torch.float32, "lse (views)")
    assert_rule(rowmax, ref[1], low[1], torch.float32, "rowmax (views)")
    dz = k.lse_backward(zv, lwv, lse, gv, scale, rowmax=rowmax if relative else None)
    assert_rule(dz, ref[3], low[3], torch.float32, "dz (views)")
    # the forward's outputs handed back as views: lse, and in the relative mode the folded
    # arg-max and its coefficients (the s72 audit: without their .contiguous() dz was 15-15,748
    # off; m18, m19, m52). The same dz as the contiguous call's.
    def view(t):
        return t.T.contiguous().T

    extra = {}
    if relative:
        coef = torch.randn(levels, n, generator=torch.Generator().manual_seed(1))
        extra = dict(rowmax=rowmax, argmax=argmax, argmax_coef=coef.to(triton_device))
    want = k.lse_backward(zv, lwv, lse, gv, scale, **extra)
    views = [("lse", view(lse), extra)]
    if relative:
        views += [(name, lse, {**extra, name: view(extra[name])})
                  for name in ("argmax", "argmax_coef")]
    for name, lse_in, kw in views:
        assert not (lse_in if name == "lse" else kw[name]).is_contiguous()
        got = k.lse_backward(zv, lwv, lse_in, gv, scale, **kw)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * float(want.abs().max()),
                                   msg=f"dz with {name} a view")


def test_the_bridge_keeps_its_modes_apart(triton_device):
    """ops/_triton_loss, the loss's bridge to the kernels: need_max with a shared-keys prefix
    runs (the relative mode is for need_max without one; with both the kernels refuse it), and
    the positives' pass with need_sums=False (the backward's call) computes dz only (the s72
    audit, m46 and m23)."""
    from hiertail_fast.ops import _triton_loss

    k = _kernels()
    n, scale = 64, 2.0
    z, log_w, _ = make_case(n, 8, 2, 3.0, seed=4, hide=0.0)
    zd, lwd = z.to(triton_device), log_w.to(triton_device)
    lse, rowmax, argmax = _triton_loss.lse_forward(zd, lwd, scale, True, n_common=n)
    want = k.lse_forward(zd, lwd, scale, True, n_common=n)
    assert torch.equal(lse, want[0]) and torch.equal(rowmax, want[1])
    assert torch.equal(argmax, want[2])
    # need_max without a prefix: the relative mode, whose δ relative_forward also returns
    rel = _triton_loss.relative_forward(zd, lwd, scale)
    plain = _triton_loss.lse_forward(zd, lwd, scale, True)
    want = k.lse_forward(zd, lwd, scale, True, relative=True, return_delta=True)
    assert len(rel) == 4 and len(plain) == 3
    for a, b, c in zip(rel, plain + (want[3],), want, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    gid = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(5)).to(triton_device)
    _, rmax, amax = k.lse_forward(zd, lwd[:1], scale, True, relative=True)
    coef = torch.randn(n, generator=torch.Generator().manual_seed(6)).to(triton_device)
    t, q, dz = _triton_loss.positive_pairs(zd, gid, 3, rmax[0].float(), amax[0], scale, False,
                                           coef, need_sums=False)
    assert t is None and q is None
    full = _triton_loss.positive_pairs(zd, gid, 3, rmax[0].float(), amax[0], scale, False, coef)
    assert full[0] is not None and torch.equal(dz, full[2])


@pytest.mark.parametrize("relative", [False, True])
def test_a_level_whose_first_key_tile_is_hidden(relative, triton_device):
    """A level that hides its first 64 keys (every key of the first tile, on the interpreter's
    and the GPU tables' tiles; e.g. rows outside the level sorted first): the online sum starts
    at a later tile, from the 0 reference a row keeps while it has seen no visible key. Finite
    lse / rowmax / gradient equal to float64's (a mutation audit: without that reference the
    relative mode returned lse = -inf for every row, and no test noticed)."""
    k = _kernels()
    n, d, scale = 100, 16, 2.0
    z, log_w, grad = make_case(n, d, 2, 3.0, seed=22, hide=0.0)
    log_w[0, :64] = -INF
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    lse, rowmax, argmax = k.lse_forward(zd, lwd, scale, True, relative=relative)
    assert torch.isfinite(lse).all()
    assert_rule(lse, ref[0], low[0], torch.float32, "lse")
    assert_rule(rowmax, ref[1], low[1], torch.float32, "rowmax")
    assert (argmax[0].cpu() >= 64).all()
    dz = k.lse_backward(zd, lwd, lse, gd, scale, rowmax=rowmax if relative else None)
    assert_rule(dz, ref[3], low[3], torch.float32, "dz")


def test_shared_keys_mode_partial_row_block_large_logits(triton_device):
    """Shared-keys mode ($HIERTAIL_TRITON_SHARED_LEVELS) with a row block that straddles
    n_common (rows 64..127 against a prefix of 70) at |s| up to ~9e4: only row blocks made of
    common rows may take the factored common-key tiles (`common_rows` in the backward kernel),
    the others run the per-level loop over every key. Finite gradient within the float64 rule
    (a mutation audit: letting the straddling block in gave NaN in dz, and no test noticed)."""
    k = _kernels()
    n, d, levels, scale, norm, n_common = 130, 16, 2, 100.0, 30.0, 70
    z, log_w, grad = make_case(n, d, levels, norm, seed=11)
    log_w[:, :n_common] = -torch.rand(levels, n_common,
                                      generator=torch.Generator().manual_seed(12)) * 3
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    lse, _, _ = k.lse_forward(zd, lwd, scale, True, n_common=n_common)
    assert_rule(lse, ref[0], low[0], torch.float32, "lse (shared)")
    for two_pass in (False, True):
        dz = k.lse_backward(zd, lwd, lse, gd, scale, two_pass=two_pass, n_common=n_common)
        assert torch.isfinite(dz).all(), f"two_pass={two_pass}: NaN/inf in dz"
        assert_rule(dz, ref[3], low[3], torch.float32, f"dz (shared, two_pass={two_pass})")


@pytest.mark.parametrize("relative", [False, True])
def test_rows_with_very_negative_lse_and_padded_key_lanes(relative, triton_device):
    """Rows whose every visible key scores far below 0 (two antipodal clusters, each row sees
    only the other one: lse ~ -180, below fp32's exp range) with N = 20 (padded key lanes in
    the last tile). The padded lanes must stay hidden in the backward: as visible keys their
    zero rows give s = 0 and e^{0 - lse} = inf, and inf * 0 = NaN (a mutation audit: the
    query side's log_w `other=0.0` for `-inf` passed every other test). Gradient against
    float64 under the usual rule."""
    k = _kernels()
    n, d, scale = 20, 16, 20.0
    gen = torch.Generator().manual_seed(23)
    v = torch.randn(d, generator=gen)
    sign = torch.tensor([1.0, -1.0]).repeat(n // 2)
    z = sign[:, None] * (3 * v / v.norm()) + 0.01 * torch.randn(n, d, generator=gen)
    log_w = torch.zeros(2, n)
    log_w[0, sign > 0] = -INF
    log_w[1, sign < 0] = -INF
    grad = torch.rand(2, n, generator=gen)
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    assert ref[0].min() < -150, "test setup: some lse far below fp32's exp range"
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    lse, rowmax, _ = k.lse_forward(zd, lwd, scale, True, relative=relative)
    assert_rule(lse, ref[0], low[0], torch.float32, "lse")
    for two_pass in (False, True):
        dz = k.lse_backward(zd, lwd, lse, gd, scale, two_pass=two_pass,
                            rowmax=rowmax if relative else None)
        assert torch.isfinite(dz).all(), f"two_pass={two_pass}: NaN/inf in dz"
        assert_rule(dz, ref[3], low[3], torch.float32, f"dz (two_pass={two_pass})")


def test_feature_block_is_a_legal_dot_width():
    """_utils.feature_block, the padded head dimension of every loss kernel's tiles: the
    smallest power of two >= d and >= 16 (tl.dot on a GPU rejects a K below 16; the CPU
    interpreter accepts it, so only this rule catches it: a mutation audit lowered the floor to
    8 and every other test passed), capped at 256."""
    from hiertail_fast.kernels import _utils as u

    for d in range(1, 300):
        b = u.feature_block(d)
        assert b & (b - 1) == 0 and 16 <= b <= 256, (d, b)
        assert b >= min(d, 256), (d, b)
        assert b == 16 or b // 2 < d, (d, b)           # the smallest such width


def test_backward_ignores_the_gradient_of_a_level_with_no_visible_key(triton_device):
    # "rows with grad 0 or lse -inf contribute nothing": a level whose keys are all hidden has
    # lse = -inf, and whatever gradient reaches it (inf here) must not reach dz. Without the
    # mask, dz came back NaN (mutation audit, session 69)
    k = _kernels()
    z = torch.randn(20, 8, generator=torch.Generator().manual_seed(0)).to(triton_device)
    log_w = torch.zeros(2, 20, device=triton_device)
    log_w[1] = -INF
    lse, _, _ = k.lse_forward(z, log_w, 2.0, False)
    assert bool(torch.isinf(lse[1]).all())
    live_only = torch.zeros(2, 20, device=triton_device)
    live_only[0] = 1.0
    for dead in (INF, float("nan"), 3.0):
        g = live_only.clone()
        g[1] = dead
        dz = k.lse_backward(z, log_w, lse, g, 2.0)
        assert torch.equal(dz, k.lse_backward(z, log_w, lse, live_only, 2.0)), dead
