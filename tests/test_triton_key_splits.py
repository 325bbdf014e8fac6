"""Key splits of the loss's Triton LSE kernels (``key_splits`` / $HIERTAIL_TRITON_KEY_SPLITS):
each split sums its own key tiles and the launcher merges the partials. Checked against the
dense float64 computation (the rule of test_balanced_contrastive_loss_triton.py) and against
the unsplit kernels: the same row max and first arg-max bit for bit (also when the tied keys
sit in different splits), the lse to fp32 rounding, dz deterministic; and the automatic
choice of the number of splits (CUDA only, from the SM count).

Runs on CUDA when present, else on CPU under TRITON_INTERPRET=1 (conftest's triton_device).
"""
from __future__ import annotations

import pytest
import torch

from hiertail_fast import hierarchical_contrastive_loss
from hiertail_fast.reference import balanced_contrastive_loss_ref as contrastive_ref
from tests.conftest import requires_triton, tol
from tests.test_balanced_contrastive_loss_triton import (
    _argmax_grad,
    _official_like,
    assert_rule,
    dense,
    make_case,
    record_launches,
)

pytestmark = requires_triton
INF = float("inf")


def _kernels():
    from hiertail_fast.kernels import balanced_contrastive_loss as k
    return k


def _utils():
    from hiertail_fast.kernels import _utils as u
    return u


# 300 keys are 5 key tiles of 64 under the interpreter (10 of 32 on a GPU's tile for IEEE fp32
# dots, the launchers' default): 2 and 3 splits leave a short last split, and 7 are more splits
# than the interpreter's tiles (clipped to 5) or leave two empty on a GPU.
@pytest.mark.parametrize("need_max,relative", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("levels", [1, 3])
def test_split_forward_and_backward(need_max, relative, levels, triton_device):
    k = _kernels()
    n, d, scale = 300, 24, 10.0
    z, log_w, grad = make_case(n, d, levels, 10.0, seed=3)
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    base = k.lse_forward(zd, lwd, scale, need_max, relative=relative, key_splits=1)
    dz1 = k.lse_backward(zd, lwd, base[0], gd, scale, rowmax=base[1] if relative else None,
                         key_splits=1)
    for splits in (2, 3, 7):
        lse, rowmax, argmax = k.lse_forward(zd, lwd, scale, need_max, relative=relative,
                                            key_splits=splits)
        what = f"{splits} splits"
        assert lse.dtype == base[0].dtype and lse.shape == (levels, n)
        assert_rule(lse, ref[0], low[0], torch.float32, f"lse, {what}")
        # the same sums up to the merge's rounding: within two ulps of |lse| (fp32)
        spread = 2 * torch.finfo(torch.float32).eps * base[0].abs().max().item()
        torch.testing.assert_close(lse, base[0], rtol=0, atol=spread)
        if need_max:
            assert torch.equal(rowmax, base[1]), what
            assert torch.equal(argmax, base[2]), what
        else:
            assert rowmax is None and argmax is None
        dz = k.lse_backward(zd, lwd, lse, gd, scale, rowmax=rowmax if relative else None,
                            key_splits=splits)
        assert dz.dtype == z.dtype and dz.shape == z.shape
        assert_rule(dz, ref[3], low[3], torch.float32, f"dz, {what}")
        # the same terms summed in another order: within a few ulps of the largest entry
        torch.testing.assert_close(dz, dz1, rtol=0, atol=2e-6 * dz1.abs().max().item())
        again = k.lse_backward(zd, lwd, lse, gd, scale, rowmax=rowmax if relative else None,
                               key_splits=splits)
        assert torch.equal(dz, again), f"dz not deterministic, {what}"


def test_split_grid_over_levels(triton_device):
    """fuse_levels=False (a grid axis over levels) with splits: each level's plane lands in
    its own place of the partial buffers."""
    k = _kernels()
    z, log_w, grad = make_case(300, 16, 3, 5.0, seed=8)
    zd, lwd = z.to(triton_device), log_w.to(triton_device)
    for relative in (False, True):
        fused = k.lse_forward(zd, lwd, 4.0, True, relative=relative, key_splits=1)
        grid = k.lse_forward(zd, lwd, 4.0, True, relative=relative, fuse_levels=False,
                             key_splits=3)
        spread = 2 * torch.finfo(torch.float32).eps * fused[0].abs().max().item()
        torch.testing.assert_close(grid[0], fused[0], rtol=0, atol=spread)
        assert torch.equal(grid[1], fused[1]) and torch.equal(grid[2], fused[2])


@pytest.mark.parametrize("scale,bound", [(10.0, 4096.0), (100.0, 2.0 ** 36)])
def test_split_relative_mode_official_cancellation(scale, bound, triton_device):
    """The official variant's relative mode, split: δ = lse - rowmax to fp32 precision of δ
    (the merge keeps each split's δ against its own max, not an fp32 lse of |s|'s size), so
    F = Σ g (lse - rowmax), whose gradient cancels p at the arg-max against 1, stays within the
    rule at a bound where one fp32 lse missed it; the folded arg-max key side too. At 2^36
    float64 rowmax + δ keeps too few of δ's bits: δ merged against the whole rowmax
    (return_delta) and given to the backward (delta=); the rule's slack is the unsplit test's
    (8 ulp of the cancelling terms; from lse - rowmax: 17x them here)."""
    k = _kernels()
    n, d, levels = 300, 8, 2
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(n, d, generator=gen)
    z = z / z.norm(dim=1, keepdim=True) * (bound / scale) ** 0.5 * (
        0.5 + 0.5 * torch.rand(n, 1, generator=gen))
    log_w = -torch.log(torch.randint(1, 4, (levels, n), generator=gen).float())
    log_w[1:, ::3] = -INF
    grad = torch.rand(levels, n, generator=gen) / n
    ref_delta, ref_dz = _official_like(z, log_w, scale, grad, torch.float64)
    low_delta, low_dz = _official_like(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    lse, rowmax, argmax, delta = k.lse_forward(zd, lwd, scale, True, relative=True,
                                               key_splits=3, return_delta=True)
    assert lse.dtype == torch.float64 and delta.dtype == torch.float64
    assert torch.equal(k.lse_forward(zd, lwd, scale, True, relative=True, key_splits=3)[0], lse)
    unsplit = k.lse_forward(zd, lwd, scale, True, relative=True, key_splits=1,
                            return_delta=True)[3]
    torch.testing.assert_close(delta, unsplit, rtol=0, atol=4 * torch.finfo(torch.float32).eps)
    assert_rule(delta, ref_delta, low_delta, torch.float32, "delta")
    slack = 8 * torch.finfo(torch.float32).eps * grad.max().item() * (bound / scale) ** 0.5 * (
        d ** 0.5 * scale)
    dz = k.lse_backward(zd, lwd, lse, gd, scale, rowmax=rowmax, key_splits=3, delta=delta)
    dz = dz.cpu().double() - _argmax_grad(z.double(), argmax.cpu(), grad.double(), scale)
    assert_rule(dz, ref_dz, low_dz, torch.float32, "d/dz (lse - rowmax), 3 splits", slack)
    folded = k.lse_backward(zd, lwd, lse, gd, scale, rowmax=rowmax, argmax=argmax,
                            key_splits=3, delta=delta)
    folded = folded.cpu().double() - _argmax_grad(z.double(), argmax.cpu(), grad.double(),
                                                  scale, key_side=False)
    assert_rule(folded, ref_dz, low_dz, torch.float32, "folded, 3 splits", slack)


def test_split_delta_of_a_row_on_one_key_is_its_log_weight(triton_device):
    """The hub case of test_balanced_contrastive_loss_triton (every row's softmax on one key of
    weight 1/15, the level's largest 1), split in 3: each split forms its δ against its own
    arg-max's term and the float64 merge keeps the one that holds the row, so δ is log w_a
    exactly, as unsplit."""
    from tests.test_balanced_contrastive_loss_triton import _hub_case

    k = _kernels()
    z, y = _hub_case()
    log_w = -torch.log(torch.bincount(y)[y].float())[None]
    zd, lwd = z.to(triton_device), log_w.to(triton_device)
    _, _, argmax, delta = k.lse_forward(zd, lwd, 2.0, True, relative=True, key_splits=3,
                                        return_delta=True)
    assert set(argmax.cpu().unique().tolist()) == {0, 1}
    assert torch.equal(delta.cpu().float(), log_w.gather(1, argmax.cpu()))


@pytest.mark.parametrize("n_common", [290, 100, 20, 300])
def test_split_shared_keys_mode(n_common, triton_device):
    """The shared-keys mode split: each split takes its share of the common tiles (one exp per
    entry for all levels), then of the rest; its (m_s, δ_s) merge gives the float64 lse, row
    max and first arg-max of the unsplit mode, and dz, within the rule. n_common 290 / 100 /
    20 / 300: splits that are all common, mixed, all rest; a common prefix of no full tile."""
    k = _kernels()
    n, d, levels, scale = 300, 24, 3, 10.0
    z, log_w, grad = make_case(n, d, levels, 3.0, seed=11)
    gen = torch.Generator().manual_seed(12)
    log_w[:, :n_common] = -torch.rand(levels, n_common, generator=gen) * 3
    z[n_common - 1] = z[1]           # a tie in the common max across tiles and splits
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    one = k.lse_forward(zd, lwd, scale, True, n_common=n_common, key_splits=1)
    dz1 = k.lse_backward(zd, lwd, one[0], gd, scale, n_common=n_common, key_splits=1)
    for splits in (2, 3):
        lse, rowmax, argmax = k.lse_forward(zd, lwd, scale, True, n_common=n_common,
                                            key_splits=splits)
        assert lse.dtype == torch.float64
        assert_rule(lse, ref[0], low[0], torch.float32, f"lse (shared, {splits} splits)")
        torch.testing.assert_close(lse, one[0], rtol=0,
                                   atol=4 * torch.finfo(torch.float32).eps
                                   * one[0].abs().max().item())
        assert torch.equal(rowmax, one[1]) and torch.equal(argmax, one[2])
        grid = k.lse_forward(zd, lwd, scale, True, n_common=n_common, fuse_levels=False,
                             key_splits=splits)          # the grid over levels, split
        torch.testing.assert_close(grid[0], lse, rtol=0, atol=4e-7 * lse.abs().max().item())
        assert torch.equal(grid[2], argmax)
        dz = k.lse_backward(zd, lwd, lse, gd, scale, n_common=n_common, key_splits=splits)
        assert_rule(dz, ref[3], low[3], torch.float32, f"dz (shared, {splits} splits)")
        # the shared factoring e^{s - R} Σ a w' rounds more than the plain terms (both are
        # held to the rule above): split and unsplit within 1e-5 of the largest entry
        torch.testing.assert_close(dz, dz1, rtol=0, atol=1e-5 * dz1.abs().max().item())


def test_split_ties_take_the_first_key_across_splits(triton_device):
    """Rows 10 and 250 are equal (keys in splits 0 and 1 of 3): every row whose max they tie
    gets arg-max 10, torch.max's first index, as unsplit; a level that hides key 10 gets 250.
    The entries are multiples of 1/64, so every dot is exact in fp32 whatever order it sums
    in: with plain fp32 entries the interpreter's numpy matmul rounded z_2.z_10 and z_2.z_250
    apart on an AMD EPYC (not on an Intel Xeon), and row 2 took 250 by rounding, not by a tie."""
    k = _kernels()
    n, d = 300, 8
    z, log_w, _ = make_case(n, d, 2, 1.0, seed=4, hide=0.0)
    dyadic = lambda t: (t * 64).round() / 64            # |z| <= 5, d 8: sums < 2^24 / 64^2
    z = dyadic(z)
    z[250] = z[10] = dyadic(5.0 * z[10] / z[10].norm())  # the largest norm: both rows' max
    log_w[1, 10] = -INF
    zd, lwd = z.to(triton_device), log_w.to(triton_device)
    ref = dense(z, log_w, 2.0, torch.zeros(2, n), torch.float64)
    for relative in (False, True):
        _, _, argmax = k.lse_forward(zd, lwd, 2.0, True, relative=relative, key_splits=3)
        assert argmax[0, 10].item() == argmax[0, 250].item() == 10
        assert argmax[1, 10].item() == argmax[1, 250].item() == 250
        assert torch.equal(argmax.cpu(), ref[2])


def test_split_rows_without_visible_keys(triton_device):
    """A level with no visible key, and a split whose keys are all hidden from a level: lse =
    rowmax = -inf, argmax 0, no gradient (no NaN), as unsplit."""
    k = _kernels()
    n, d = 300, 8
    z, log_w, grad = make_case(n, d, 3, 3.0, seed=6, hide=0.0)
    log_w[1] = -INF
    log_w[2, 128:] = -INF                   # splits 1 and 2 of 3 see no key of level 2
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    ref = dense(z, log_w, 2.0, grad, torch.float64)
    low = dense(z, log_w, 2.0, grad, torch.float32)
    for relative in (False, True):
        lse, rowmax, argmax = k.lse_forward(zd, lwd, 2.0, True, relative=relative,
                                            key_splits=3)
        assert torch.isneginf(lse[1]).all() and torch.isneginf(rowmax[1]).all()
        assert (argmax[1] == 0).all()
        assert_rule(lse, ref[0], low[0], torch.float32, "lse")
        dz = k.lse_backward(zd, lwd, lse, gd, 2.0, rowmax=rowmax if relative else None,
                            key_splits=3)
        assert torch.isfinite(dz).all()
        assert_rule(dz, ref[3], low[3], torch.float32, "dz")


def test_unsplit_launches_compile_the_unsplit_code(monkeypatch, triton_device):
    """One split launches with SPLIT off (the kernels' code before splits existed: the same
    registers and spills, bench/kernel_resources.py) over a grid of one split; more launch
    SPLIT over a split axis (the forward's third, the backward's second)."""
    k = _kernels()
    seen = record_launches(monkeypatch, k, lambda which, n, axis1, axis2, args, meta: (
        which, axis1, axis2, meta["SPLIT"]))
    z, log_w, grad = make_case(300, 8, 2, 2.0, seed=2)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    for splits in (1, 3):
        seen.clear()
        lse, rowmax, _ = k.lse_forward(zd, lwd, 2.0, True, relative=True, key_splits=splits)
        k.lse_backward(zd, lwd, lse, gd, 2.0, rowmax=rowmax, key_splits=splits)
        assert seen == [("fwd", 1, splits, splits > 1), ("bwd", splits, 1, splits > 1)]
    seen.clear()
    k.lse_backward(zd, lwd, lse, gd, 2.0, rowmax=rowmax, two_pass=True)
    assert seen == [("bwd", 1, 1, False), ("bwd", 1, 1, False)]


def test_split_merge_with_large_log_weights(triton_device):
    """Log-weights far above 0 (the kernels shift them by the level's largest; the merge by the
    largest partial): +800 would overflow float64 in a merge shifted by the row max alone. The
    split lse equals the unsplit one to fp32 rounding in both modes; a -800 level too."""
    k = _kernels()
    z, log_w, _ = make_case(300, 8, 3, 2.0, seed=9, hide=0.0)
    log_w[1] += 800.0
    log_w[2] -= 800.0
    zd, lwd = z.to(triton_device), log_w.to(triton_device)
    for relative in (False, True):
        one = k.lse_forward(zd, lwd, 2.0, True, relative=relative, key_splits=1)
        three = k.lse_forward(zd, lwd, 2.0, True, relative=relative, key_splits=3)
        assert torch.isfinite(three[0]).all()
        spread = 2 * torch.finfo(torch.float32).eps * one[0].abs().max().item()
        torch.testing.assert_close(three[0].double(), one[0].double(), rtol=0, atol=spread)
        assert torch.equal(three[2], one[2])


def test_split_refusals(triton_device):
    k = _kernels()
    z = torch.randn(40, 4, device=triton_device)
    lw = torch.zeros(2, 40, device=triton_device)
    lse, _, _ = k.lse_forward(z, lw, 1.0, False, key_splits=2)
    with pytest.raises(ValueError, match="key_splits > 1 needs the one-pass backward"):
        k.lse_backward(z, lw, lse, lw, 1.0, two_pass=True, key_splits=2)
    # the value's own refusal, not "needs the one-pass backward", which also names key_splits
    # (the match was too loose to tell them apart, and the backward at N = 0 was not called:
    # a fix-test check, session 68)
    own = r"key_splits(=.*is not 'auto' or a positive int| must be 'auto' or a positive int)"
    for bad in (0, -1, "two", 2.0, True):
        with pytest.raises((ValueError, TypeError), match=own):
            k.lse_forward(z, lw, 1.0, False, key_splits=bad)
        # checked whatever runs: with the shared-keys mode, the two-pass backward, no rows
        with pytest.raises((ValueError, TypeError), match=own):
            k.lse_forward(z, lw, 1.0, False, n_common=20, key_splits=bad)
        with pytest.raises((ValueError, TypeError), match=own):
            k.lse_backward(z, lw, lse, lw, 1.0, two_pass=True, key_splits=bad)
        with pytest.raises((ValueError, TypeError), match=own):
            k.lse_forward(z[:0], lw[:, :0], 1.0, False, key_splits=bad)
        with pytest.raises((ValueError, TypeError), match=own):
            k.lse_backward(z[:0], lw[:, :0], lse[:, :0], lw[:, :0], 1.0, key_splits=bad)
    with pytest.raises(TypeError, match="key_splits"):
        k.lse_forward(z, lw, 1.0, False, key_splits=True)
    # "auto" and 1 are fine with the two-pass backward (it runs unsplit)
    k.lse_backward(z, lw, lse, lw, 1.0, two_pass=True, key_splits="auto")
    k.lse_backward(z, lw, lse, lw, 1.0, two_pass=True, key_splits=1)


class _CudaStandIn:
    """What ``key_splits`` reads of a tensor: is_cuda and device."""
    is_cuda = True
    device = "cuda:0"


@pytest.mark.parametrize("n,block_m,sms,want", [
    (20_000, 128, 132, 4),      # the H200 at 20k x 64: 157 row blocks (59 % of 2 waves) -> 628
    (50_000, 128, 132, 1),      # 391 row blocks fill 99 % of 3 waves
    (100_000, 128, 132, 1),     # 782 row blocks, 99 % of 6 waves (the 100k figures stand)
    (75_000, 128, 132, 2),      # 586 row blocks: 5 waves, the last 44 % full (89 %) -> 99 %
    (1_000_000, 128, 132, 1),
    (10_000, 128, 132, 5),      # 79 row blocks: 3 splits fill 89.8 %, 4 80 %, 5 99.7 %
    (20_000, 64, 132, 2),       # d 128's 64-row tile: 313 row blocks (79 %) -> 626 (95 %)
    (20_000, 128, 108, 2),      # A100: 157 of 216 slots (73 %) -> 314 of 324 (97 %)
    (4_000, 128, 132, 3),       # 32 row blocks, at most 63 tiles // 16 = 3 splits: the fullest
    (900, 128, 132, 1),         # 15 key tiles: under the 16 a split must keep
    (45 * 128, 128, 10, 1),     # 45 row blocks on 10 SMs fill exactly 90 %: enough (2
                                # splits would fill 100 %), unsplit
    (132 * 128, 128, 132, 1),   # exactly one full wave (s72, u01: counted as 2 waves, 9 splits)
    (128_000, 128_000, 132, 16),  # one row block, 2,000 key tiles: no count fills 90 %, the
                                  # fullest within KEY_SPLIT_MAX (s72, u04: 119 uncapped)
])
def test_automatic_split_count(monkeypatch, n, block_m, sms, want):
    u = _utils()
    monkeypatch.delenv(u.KEY_SPLITS_ENV, raising=False)
    monkeypatch.setattr(u, "_sm_count", lambda device: sms)
    monkeypatch.setattr(u, "interpreting", lambda: False)
    assert u.key_splits(n, block_m, 64, _CudaStandIn()) == want
    assert u.key_splits(n, block_m, 64, _CudaStandIn(), "auto") == want
    assert u.key_splits(n, block_m, 64, torch.zeros(1)) == 1           # CPU tensors: off
    assert u.wave_fill(157, 132) == pytest.approx(157 / 264)
    assert u.wave_fill(264, 132) == 1.0 and u.wave_fill(132, 132) == 1.0
    # from 9 programs per SM any count fills >= 90 %: never split there
    assert all(u.key_splits(rows, 128, 64, _CudaStandIn()) == 1
               for rows in range(9 * 132 * 128, 12 * 132 * 128, 997))
    monkeypatch.setattr(u, "interpreting", lambda: True)
    assert u.key_splits(n, block_m, 64, _CudaStandIn()) == 1           # interpreter: off


def test_split_count_requests(monkeypatch):
    """An int asks for that many splits (clipped to the key tiles), the variable likewise, an
    argument wins over it, and a bad value is an error naming where it came from."""
    u = _utils()
    cpu = torch.zeros(1)
    monkeypatch.delenv(u.KEY_SPLITS_ENV, raising=False)
    assert u.key_splits(300, 64, 64, cpu, 3) == 3
    assert u.key_splits(300, 64, 64, cpu, 9) == 5               # 5 key tiles
    assert u.key_splits(300, 64, 64, cpu, "4") == 4
    monkeypatch.setenv(u.KEY_SPLITS_ENV, " 2 ")
    assert u.key_splits(300, 64, 64, cpu) == 2
    assert u.key_splits(300, 64, 64, cpu, 1) == 1
    monkeypatch.setenv(u.KEY_SPLITS_ENV, "AUTO")
    assert u.key_splits(300, 64, 64, cpu) == 1
    # the argument is read as the variable is: any case, spaces around (s72, u02)
    assert u.split_request(" Auto ") == "auto" and u.key_splits(300, 64, 64, cpu, "AUTO") == 1
    monkeypatch.setenv(u.KEY_SPLITS_ENV, "many")
    with pytest.raises(ValueError, match=u.KEY_SPLITS_ENV):
        u.key_splits(300, 64, 64, cpu)
    monkeypatch.setenv(u.KEY_SPLITS_ENV, "0")
    with pytest.raises(ValueError, match=u.KEY_SPLITS_ENV):
        u.key_splits(300, 64, 64, cpu)


@pytest.mark.parametrize("variant,shared", [("exact", False), ("official", False),
                                            ("exact", True)])
def test_the_loss_with_split_kernels(monkeypatch, variant, shared, triton_device):
    """The loss on the Triton engine with $HIERTAIL_TRITON_KEY_SPLITS=3 (the automatic count
    is 1 off CUDA) runs both kernels split, and its value and gradients match the float64
    reference: three levels, two with their own prototypes; also in the shared-keys mode
    ($HIERTAIL_TRITON_SHARED_LEVELS=1, the exact variant's)."""
    u, k = _utils(), _kernels()
    monkeypatch.setenv(u.SHARED_LEVELS_ENV, "1" if shared else "0")
    counts = []

    def spy(*args, real=k.split_count):
        counts.append(real(*args))
        return counts[-1]

    monkeypatch.setattr(k, "split_count", spy)
    commons = []

    def forward(*args, real=k.lse_forward, **kw):
        commons.append(kw.get("n_common", 0))
        return real(*args, **kw)

    monkeypatch.setattr(k, "lse_forward", forward)
    monkeypatch.setenv(u.KEY_SPLITS_ENV, "3")
    gen = torch.Generator().manual_seed(21)
    n, d = 260, 8
    z = torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1) * 2.0
    y = torch.randint(0, 6, (n,), generator=gen)
    labels = [y, y % 3, y % 2]
    protos = [torch.randn(6, d, generator=gen), None, torch.randn(2, d, generator=gen)]
    zf = z.to(triton_device, copy=True).requires_grad_()
    pf = [p.to(triton_device, copy=True).requires_grad_() if p is not None else None
          for p in protos]
    loss = hierarchical_contrastive_loss(zf, [lab.to(triton_device) for lab in labels], pf,
                                         temperature=0.5, variant=variant, backend="triton")
    loss.backward()
    assert counts == [3, 3]                    # forward and backward, 268 keys in 5 tiles
    assert commons == [260 if shared else 0]   # the embedding rows: every level's keys
    zr = z.double().requires_grad_()
    pr = [p.double().requires_grad_() if p is not None else None for p in protos]
    total = sum(contrastive_ref(zr, lab, prototypes=p, temperature=0.5, variant=variant)
                for lab, p in zip(labels, pr, strict=True))
    total.backward()
    t = tol(torch.float32)
    torch.testing.assert_close(loss.double().cpu(), total.detach(), **t)
    torch.testing.assert_close(zf.grad.double().cpu(), zr.grad, **t)
    for a, b in ((pf[0], pr[0]), (pf[2], pr[2])):
        torch.testing.assert_close(a.grad.double().cpu(), b.grad, **t)
