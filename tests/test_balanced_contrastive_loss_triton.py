"""Triton LSE launchers of the balanced contrastive loss vs a dense float64 computation.

Runs on CUDA when present, else on CPU under TRITON_INTERPRET=1 (conftest's triton_device).
Tolerance rule (STYLE.md, flash-attention style): the kernel's error against the float64
computation on the SAME (rounded) inputs is at most 2× the error of a dense torch fp32
computation on those inputs, plus tol(dtype) (rtol relative to the tensor's magnitude). For
fp16/bf16 inputs this is stricter than comparing with a computation in the low dtype (whose
error at |s| ~ 1000 is several units): the kernel multiplies low-precision values exactly and
accumulates in fp32, so only its output rounding (dz in z's dtype) may exceed fp32 error.
"""
from __future__ import annotations

import pytest
import torch

from hiertail_fast import hierarchical_contrastive_loss
from hiertail_fast.reference import balanced_contrastive_loss_ref as contrastive_ref
from tests.conftest import requires_triton, tol

pytestmark = requires_triton
INF = float("inf")


def _kernels():
    from hiertail_fast.kernels import balanced_contrastive_loss as k
    return k


def record_launches(monkeypatch, k, entry) -> list:
    """The list of entry(which, n, axis1, axis2, args, meta) for every launch through
    ``k._launch`` from now on (each launch still runs): what the launchers hand the kernels."""
    seen = []

    def spy(which, n, axis1, tiles, tune, args, meta, axis2=1, real=k._launch):
        seen.append(entry(which, n, axis1, axis2, args, meta))
        return real(which, n, axis1, tiles, tune, args, meta, axis2)

    monkeypatch.setattr(k, "_launch", spy)
    return seen


def make_case(n, d, levels, norm, seed=0, hide=0.3):
    """Clustered embeddings with norms in [norm/2, norm] (so |scale·s| reaches the thousands
    while many keys share the softmax mass), log-weights with hidden keys, grads with zeros."""
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(4, d, generator=gen)
    labels = torch.randint(0, 4, (n,), generator=gen)
    z = centers[labels] + 0.3 * torch.randn(n, d, generator=gen)
    z = z / z.norm(dim=1, keepdim=True) * norm * (0.5 + 0.5 * torch.rand(n, 1, generator=gen))
    log_w = -torch.rand(levels, n, generator=gen) * 3
    log_w[torch.rand(levels, n, generator=gen) < hide] = -INF
    log_w[:, 0] = 0.0  # every level sees at least one key
    grad = torch.randn(levels, n, generator=gen)
    grad[torch.rand(levels, n, generator=gen) < 0.2] = 0.0
    return z, log_w, grad


def dense(z, log_w, scale, grad, dtype):
    """lse, rowmax, first argmax, dz of Σ g·lse, all-pairs in `dtype` (levels with no visible
    key: lse = rowmax = −inf, argmax 0, no gradient)."""
    zz = z.to(dtype).detach().requires_grad_()
    s = scale * zz @ zz.T
    n = z.shape[0]
    lses, maxes, args, total = [], [], [], 0.0
    for lw, g in zip(log_w.to(dtype), grad.to(dtype), strict=True):
        visible = lw > -INF
        if visible.any():
            lse = torch.logsumexp(s + lw[None, :], dim=1)
            total = total + (g * lse).sum()
        else:
            lse = torch.full((n,), -INF, dtype=dtype)
        sv = torch.where(visible[None, :], s, -INF).detach()
        mx = sv.max(dim=1).values
        first = torch.where(sv == mx[:, None], torch.arange(n), n).min(dim=1).values
        lses.append(lse.detach())
        maxes.append(mx)
        args.append(first)
    dz = torch.autograd.grad(total, zz)[0] if torch.is_tensor(total) else torch.zeros_like(zz)
    return torch.stack(lses), torch.stack(maxes), torch.stack(args), dz, s.detach()


def assert_rule(out, ref, low, dtype, what, slack: float = 0.0):
    """out within 2x the dense `low`-precision computation's error + tol(dtype) + slack."""
    out, ref, low = out.double().cpu(), ref.double(), low.double()
    assert torch.equal(torch.isinf(out), torch.isinf(ref)), f"{what}: -inf pattern differs"
    fin = torch.isfinite(ref)
    assert torch.isfinite(out[fin]).all(), f"{what}: NaN/inf where the reference is finite"
    if not fin.any():
        return
    t = tol(dtype)
    err = (out[fin] - ref[fin]).abs().max().item()
    bound = 2 * (low[fin] - ref[fin]).abs().max().item() + t["atol"]
    bound += t["rtol"] * ref[fin].abs().max().item() + slack
    assert err <= bound, f"{what}: error {err:.3e} > bound {bound:.3e}"


CASES = [  # n, d, levels, scale, norm
    (1, 8, 1, 1.0, 1.0),
    (5, 16, 2, 10.0, 3.0),
    (33, 40, 5, 100.0, 3.0),
    (130, 64, 2, 1.0, 30.0),
    (130, 8, 1, 100.0, 30.0),
    (300, 24, 2, 10.0, 10.0),
    (70, 130, 3, 10.0, 10.0),
]


@pytest.mark.parametrize("n,d,levels,scale,norm", CASES)
def test_forward_backward_fp32(n, d, levels, scale, norm, triton_device):
    k = _kernels()
    z, log_w, grad = make_case(n, d, levels, norm)
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    lse, rowmax, argmax = k.lse_forward(zd, lwd, scale, True)
    assert lse.dtype == rowmax.dtype == torch.float32 and argmax.dtype == torch.int64
    assert_rule(lse, ref[0], low[0], torch.float32, "lse")
    assert_rule(rowmax, ref[1], low[1], torch.float32, "rowmax")
    # arg-max: a visible key whose score is the max (exact index only matters on ties,
    # tested separately); the fp32 kernel may pick another key within rounding of the max
    s64, argmax = ref[4], argmax.cpu()
    picked = s64.gather(1, argmax.T).T
    assert_rule(picked, ref[1], low[1], torch.float32, "score at argmax")
    assert (log_w.gather(1, argmax) > -INF).all()
    dz = k.lse_backward(zd, lwd, lse, gd, scale)
    assert dz.dtype == z.dtype and dz.shape == z.shape
    assert_rule(dz, ref[3], low[3], torch.float32, "dz")
    # determinism: bitwise-identical gradient on a second run
    assert torch.equal(dz, k.lse_backward(zd, lwd, lse, gd, scale))


@pytest.mark.parametrize("n,d,levels,scale,norm", [CASES[2], CASES[5]])
def test_alternative_schedules(n, d, levels, scale, norm, triton_device):
    """Grid-over-levels forward and FlashAttention-2 two-pass backward give the same numbers
    as the shipped fused forward and one-pass backward."""
    k = _kernels()
    z, log_w, grad = make_case(n, d, levels, norm, seed=3)
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    lse, rowmax, argmax = k.lse_forward(zd, lwd, scale, True)
    lse_grid, rowmax_grid, argmax_grid = k.lse_forward(zd, lwd, scale, True, fuse_levels=False)
    assert_rule(lse_grid, ref[0], low[0], torch.float32, "lse (grid over levels)")
    torch.testing.assert_close(lse_grid, lse, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rowmax_grid, rowmax, rtol=1e-6, atol=1e-6)
    assert torch.equal(argmax_grid, argmax)
    dz = k.lse_backward(zd, lwd, lse, gd, scale)
    dz2 = k.lse_backward(zd, lwd, lse, gd, scale, two_pass=True)
    assert_rule(dz2, ref[3], low[3], torch.float32, "dz (two-pass)")
    torch.testing.assert_close(dz2, dz, rtol=1e-5, atol=1e-5 * dz.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,d,levels,scale,norm", [CASES[2], CASES[3]])
def test_low_precision(n, d, levels, scale, norm, dtype, triton_device):
    k = _kernels()
    z, log_w, grad = make_case(n, d, levels, norm, seed=1)
    z = z.to(dtype)  # the reference sees the same rounded inputs
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    lse, rowmax, _ = k.lse_forward(zd, lwd, scale, True)
    assert_rule(lse, ref[0], low[0], torch.float32, "lse")
    assert_rule(rowmax, ref[1], low[1], torch.float32, "rowmax")
    dz = k.lse_backward(zd, lwd, lse, gd, scale)
    assert dz.dtype == dtype
    assert_rule(dz, ref[3], low[3].to(dtype), dtype, "dz")


def test_hidden_level_zero_grads_and_ties(triton_device):
    """A level with no visible key gives lse = rowmax = −inf, argmax 0 and no gradient (no NaN);
    zero grads contribute nothing; equal scores across key tiles pick the lowest index."""
    k = _kernels()
    n, d, scale = 150, 16, 0.5
    _, log_w, grad = make_case(n, d, 3, 3.0, seed=2)
    # small integers: every dot is exact in fp32, so equal scores are exact ties
    z = torch.randint(-2, 3, (n, d), generator=torch.Generator().manual_seed(2)).float()
    z[:, 0] = 3.0
    z[[10, 70, 140]] = torch.full((d,), 3.0)  # the key most rows prefer, in 3 different tiles
    log_w[2] = -INF
    log_w[0, [70, 140]] = 0.0
    log_w[0, 10] = -INF  # level 0 cannot see the first copy: its ties resolve to 70
    log_w[1, [10, 70, 140]] = 0.0
    grad[1] = 0.0
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    lse, rowmax, argmax = k.lse_forward(zd, lwd, scale, True)
    lse, rowmax, argmax = lse.cpu(), rowmax.cpu(), argmax.cpu()
    assert torch.isneginf(lse[2]).all() and torch.isneginf(rowmax[2]).all()
    assert (argmax[2] == 0).all()
    assert_rule(lse, ref[0], low[0], torch.float32, "lse")
    # exact ties: the lowest index, as the float64 reference picks it
    assert torch.equal(argmax, ref[2])
    tied = (ref[4][:, 70] == ref[1][0]) & (ref[4][:, 140] == ref[1][0])
    assert tied.sum() > 10, "test setup: the duplicated key should tie across tiles"
    assert (argmax[0][tied] <= 70).all()  # never the later copy
    dz = k.lse_backward(zd, lwd, lse.to(triton_device), gd, scale).cpu()
    assert torch.isfinite(dz).all()
    assert_rule(dz, ref[3], low[3], torch.float32, "dz")
    # levels 1 (zero grad) and 2 (hidden) add nothing: same as backward over level 0 alone
    dz0 = k.lse_backward(zd, lwd[:1], lse[:1].to(triton_device), gd[:1], scale).cpu()
    torch.testing.assert_close(dz, dz0, rtol=1e-5, atol=1e-4)


def test_bad_input(triton_device):
    k = _kernels()

    def zeros(*shape):
        return torch.zeros(*shape, device=triton_device)

    z = torch.randn(6, 4, device=triton_device)
    with pytest.raises(TypeError, match="float32"):
        k.lse_forward(z.double(), zeros(1, 6), 1.0, False)
    with pytest.raises(ValueError, match="d <= 256"):
        k.lse_forward(zeros(6, 300), zeros(1, 6), 1.0, False)
    with pytest.raises(ValueError, match="log_w"):
        k.lse_forward(z, zeros(1, 5), 1.0, False)
    with pytest.raises(ValueError, match="grad_lse"):
        k.lse_backward(z, zeros(2, 6), zeros(2, 6), zeros(1, 6), 1.0)
    # log_w on another device than z: named, not a failure inside the launch (a meta
    # tensor stands in for a second device)
    meta = torch.zeros(1, 6, device="meta")
    with pytest.raises(ValueError, match="log_w is on meta"):
        k.lse_forward(z, meta, 1.0, False)
    with pytest.raises(ValueError, match="log_w is on meta"):
        k.lse_backward(z, meta, zeros(1, 6), torch.ones(1, 6, device=triton_device), 1.0)
    # an lse of another shape (a transposed one, an extra column) is refused, not read with
    # the wrong layout; no level at all; z not 2-D (the s72 audit: n18, m27, m28)
    for lse in (zeros(6, 2), zeros(2, 7)):
        with pytest.raises(ValueError, match="lse must have shape"):
            k.lse_backward(z, zeros(2, 6), lse, zeros(2, 6), 1.0)
    with pytest.raises(ValueError, match="L >= 1"):
        k.lse_forward(z, zeros(0, 6), 1.0, False)
    with pytest.raises(ValueError, match="L >= 1"):
        k.lse_backward(z, zeros(0, 6), zeros(0, 6), zeros(0, 6), 1.0)
    for bad in (zeros(6), zeros(6, 4, 1)):
        with pytest.raises(TypeError, match="2-D"):
            k.lse_forward(bad, zeros(1, 6), 1.0, False)
        with pytest.raises(TypeError, match="2-D"):
            k.lse_backward(bad, zeros(1, 6), zeros(1, 6), zeros(1, 6), 1.0)


def test_16bit_rows_keep_fp32_partials_and_any_sign_of_scale(triton_device):
    """fp16 rows with out_dtype=float32 (what the loss asks for): the key splits' planes and
    the two-pass kernel's query-side partial are fp32, so both give the one-pass unsplit dz to
    fp32 rounding (the s72 audit, m67/m68: partials in z's dtype were 2-5e-4 off, fp16's
    rounding). And the kernels take any sign of scale (a multiplier of z_i.z_k; the loss's is
    1/τ > 0): at scale -3 the gradient is float64 autograd's (s72, m66: |scale| gave 1e19)."""
    k = _kernels()
    gen = torch.Generator().manual_seed(0)
    n, d, levels = 128, 16, 2
    z = torch.randn(n, d, generator=gen).half().to(triton_device)
    log_w = torch.log(torch.rand(levels, n, generator=gen) + 0.1).to(triton_device)
    grad = torch.randn(levels, n, generator=gen).to(triton_device)
    lse, _, _ = k.lse_forward(z, log_w, 4.0, False, key_splits=1)
    base = k.lse_backward(z, log_w, lse, grad, 4.0, out_dtype=torch.float32, key_splits=1)
    for kw in (dict(key_splits=2), dict(key_splits=4), dict(two_pass=True)):
        other = k.lse_backward(z, log_w, lse, grad, 4.0, out_dtype=torch.float32, **kw)
        assert other.dtype == torch.float32
        err = float((other - base).abs().max() / base.abs().max())
        assert err < 2e-6, (kw, err)
    zf = torch.randn(40, 8, generator=gen)
    lw, g = log_w[:, :40].cpu(), grad[:, :40].cpu()
    zr = zf.double().requires_grad_()
    ref = torch.logsumexp(-3.0 * (zr @ zr.T)[None] + lw.double()[:, None, :], dim=2)
    (ref * g.double()).sum().backward()
    lse, _, _ = k.lse_forward(zf.to(triton_device), lw.to(triton_device), -3.0, False)
    torch.testing.assert_close(lse.double().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    dz = k.lse_backward(zf.to(triton_device), lw.to(triton_device), lse, g.to(triton_device),
                        -3.0)
    torch.testing.assert_close(dz.double().cpu(), zr.grad, rtol=1e-4,
                               atol=1e-5 * float(zr.grad.abs().max()))


def test_key_splits_merge_in_float64():
    """_merge_splits: the splits' partial (δ_s, R_s) merge to log Σ_s e^(δ_s + R_s) in float64
    (its promise; an fp32 sum of the exponentials was 2.2e-7 off, under the kernels' own fp32
    error, so the loss tests could not see it)."""
    k = _kernels()
    gen = torch.Generator().manual_seed(0)
    delta = (torch.rand(8, 2, 1000, generator=gen, dtype=torch.float64) * 5).float()
    ref = (torch.randn(8, 2, 1000, generator=gen, dtype=torch.float64) * 3).float()
    got = k._merge_splits(delta, ref)
    assert got.dtype == torch.float64
    want = torch.logsumexp(delta.double() + ref.double(), dim=0)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-13)


# ------------------------------------------------------------------ precision and tile knobs
@pytest.fixture
def two_tiles(monkeypatch, triton_device):
    """On CUDA the real autotuner runs, over two candidate tiles and with a fresh tuner cache
    (the full TUNE_TILES compile eleven tiles per kernel variant: minutes of a short GPU
    session); on CPU nothing changes (no autotuner under the interpreter)."""
    if triton_device == "cuda":
        import triton

        k = _kernels()
        monkeypatch.setattr(k, "tune_configs", lambda: [
            triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=2),
            triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=4, num_stages=3)])
        monkeypatch.setattr(k, "_TUNED", {})


@pytest.mark.parametrize("n,d,levels,scale,norm", [CASES[2], CASES[4], CASES[5]])
def test_tf32x3_and_autotuned_tiles(n, d, levels, scale, norm, triton_device, two_tiles):
    """fp32_dot="tf32x3" with autotuned tiles against float64, under the same rule as the
    default path. On CUDA this is the accuracy test of 3xTF32 tensor-core dots and of every
    tile the autotuner may pick; under the CPU interpreter (a numpy fp32 dot whatever the
    precision; no autotuner) it checks that the options reach the kernels and change nothing
    there."""
    k = _kernels()
    z, log_w, grad = make_case(n, d, levels, norm, seed=4)
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    opts = dict(fp32_dot="tf32x3", autotune=True)
    lse, rowmax, argmax = k.lse_forward(zd, lwd, scale, True, **opts)
    assert_rule(lse, ref[0], low[0], torch.float32, "lse (tf32x3)")
    assert_rule(rowmax, ref[1], low[1], torch.float32, "rowmax (tf32x3)")
    picked = ref[4].gather(1, argmax.cpu().T).T
    assert_rule(picked, ref[1], low[1], torch.float32, "score at argmax (tf32x3)")
    for two_pass in (False, True):
        dz = k.lse_backward(zd, lwd, lse, gd, scale, two_pass=two_pass, **opts)
        assert_rule(dz, ref[3], low[3], torch.float32, f"dz (tf32x3, two_pass={two_pass})")
    if triton_device == "cpu":
        # the interpreter computes the same numbers for both precisions, with fixed tiles
        assert torch.equal(lse, k.lse_forward(zd, lwd, scale, True)[0])
        assert not k._TUNED, "no autotuner is built under the interpreter"


def test_precision_table():
    """_precisions: fp32 follows fp32_dot; 16-bit inputs keep native dots (TF32 for W·Z) on
    CUDA and fp32 upcasting of bf16 under the interpreter, whatever fp32_dot says."""
    k = _kernels()
    for dot in ("ieee", "tf32x3"):
        for cuda in (False, True):
            assert k._precisions(torch.float32, cuda, dot) == (dot, dot, False)
            assert k._precisions(torch.float16, cuda, dot) == ("tf32", "tf32", False)
        assert k._precisions(torch.bfloat16, True, dot) == ("tf32", "tf32", False)
        assert k._precisions(torch.bfloat16, False, dot) == ("ieee", "ieee", True)


def test_knobs_from_the_environment(monkeypatch, triton_device):
    """$HIERTAIL_TRITON_FP32_DOT / $HIERTAIL_TRITON_AUTOTUNE: defaults, accepted spellings, an
    argument wins over the variable, and a bad value is a ValueError naming the variable
    before any kernel runs."""
    from hiertail_fast.kernels import _utils as u

    from hiertail_fast.ops import _triton_loss

    # the loss engine reads the same variable without importing triton (its own copy of the name)
    assert _triton_loss.FP32_DOT_ENV == u.FP32_DOT_ENV
    monkeypatch.delenv(u.FP32_DOT_ENV, raising=False)
    monkeypatch.delenv(u.AUTOTUNE_ENV, raising=False)
    assert u.fp32_dot() == "ieee" and u.autotune_requested() is False
    monkeypatch.setenv(u.FP32_DOT_ENV, " TF32x3 ")
    assert u.fp32_dot() == "tf32x3" and u.fp32_dot("ieee") == "ieee"
    # every documented spelling, for both on/off variables (s72, u05/u06: one dropped from
    # the lists passed every test)
    spellings = [(raw, True) for raw in ("1", "true", "yes", "on", " TRUE ", "Yes")] + [
        (raw, False) for raw in ("0", "false", "no", "off", "", " OFF ")]
    for raw, want in spellings:
        monkeypatch.setenv(u.AUTOTUNE_ENV, raw)
        monkeypatch.setenv(u.SHARED_LEVELS_ENV, raw)
        assert u.autotune_requested() is want, raw
        assert u.shared_levels_requested() is want, raw
    monkeypatch.delenv(u.SHARED_LEVELS_ENV)
    # the argument wins over the variable either way (s72, u11: False fell through to it)
    monkeypatch.setenv(u.AUTOTUNE_ENV, "1")
    assert u.autotune_requested(False) is False
    monkeypatch.setenv(u.AUTOTUNE_ENV, "0")
    assert u.autotune_requested(False) is False and u.autotune_requested(True) is True
    with pytest.raises(TypeError, match="autotune"):
        u.autotune_requested(1)
    with pytest.raises(ValueError, match="fp32_dot='tf32'"):
        u.fp32_dot("tf32")
    z = torch.randn(6, 4, device=triton_device)
    lw = torch.zeros(1, 6, device=triton_device)
    k = _kernels()
    monkeypatch.setenv(u.FP32_DOT_ENV, "fast")
    with pytest.raises(ValueError, match=u.FP32_DOT_ENV):
        k.lse_forward(z, lw, 1.0, False)
    monkeypatch.setenv(u.FP32_DOT_ENV, "ieee")
    monkeypatch.setenv(u.AUTOTUNE_ENV, "maybe")
    with pytest.raises(ValueError, match=u.AUTOTUNE_ENV):
        k.lse_backward(z, lw, lw, lw, 1.0)
    # autotuning is a CUDA-only choice: never on a CPU tensor (the interpreter's fixed tiles)
    monkeypatch.setenv(u.AUTOTUNE_ENV, "1")
    assert k._use_autotune(z.cpu(), None) is False
    assert k._use_autotune(z.cpu(), True) is False


def test_tune_configs_cover_the_fixed_tiles():
    """Every fixed GPU tile of pair_blocks is among the autotuner's candidates (autotuning can
    only match or beat the default), with distinct, power-of-two tiles."""
    from hiertail_fast.kernels import _utils as u

    configs = u.tune_configs()
    seen = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps) for c in configs}
    assert len(configs) == len(u.TUNE_TILES) == len(set(u.TUNE_TILES))
    for d_pad in (16, 64, 128, 256):
        for arch in (None, (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)):
            for dot in (None, "ieee", "tf32x3"):
                assert u.pair_blocks(10_000, d_pad, True, arch=arch, fp32_dot=dot) in seen
    for m, n, w, s in u.TUNE_TILES:
        assert m & (m - 1) == 0 and n & (n - 1) == 0 and w in (2, 4, 8) and s >= 1


SHARED_CASES = [  # n, d, levels, scale, norm, n_common
    (130, 24, 3, 10.0, 3.0, 100),      # prefix not a multiple of the tile
    (300, 24, 2, 10.0, 10.0, 290),
    (70, 16, 3, 100.0, 30.0, 64),      # |s| up to ~9e4
    (130, 64, 2, 1.0, 30.0, 130),      # every key common
    (40, 8, 2, 10.0, 3.0, 20),         # no full common tile: the ordinary loop only
]


def test_launches_follow_the_schedule_and_dot_arguments(monkeypatch, triton_device):
    """What the launchers hand the kernels, recorded at ``_launch`` (the s72 mutation audit):
    fuse_levels=False launches a grid axis over the L levels with one level per program (the
    schedule the cross-checks above compare against: launched fused, they compared the fused
    kernel with itself); an explicit fp32_dot wins over $HIERTAIL_TRITON_FP32_DOT in the
    forward and the backward alike (the one-pass backward recomputes the forward's scores:
    the forward took the variable's value while the backward took the argument)."""
    k = _kernels()
    seen = record_launches(monkeypatch, k, lambda which, n, axis1, axis2, args, meta: (
        which, axis1, meta["NUM_LEVELS"], meta["DOT_PRECISION"]))
    monkeypatch.delenv("HIERTAIL_TRITON_FP32_DOT", raising=False)
    z, log_w, grad = make_case(70, 8, 3, 2.0, seed=5)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    for fuse, axis1, per_program in ((True, 1, 3), (False, 3, 1)):
        seen.clear()
        k.lse_forward(zd, lwd, 2.0, False, fuse_levels=fuse, key_splits=1)
        assert seen == [("fwd", axis1, per_program, "ieee")], (fuse, seen)
    for env in (None, "tf32x3", "ieee"):
        if env is None:
            monkeypatch.delenv("HIERTAIL_TRITON_FP32_DOT", raising=False)
        else:
            monkeypatch.setenv("HIERTAIL_TRITON_FP32_DOT", env)
        for dot in ("ieee", "tf32x3"):
            seen.clear()
            lse, _, _ = k.lse_forward(zd, lwd, 2.0, False, fp32_dot=dot, key_splits=1)
            k.lse_backward(zd, lwd, lse, gd, 2.0, fp32_dot=dot, key_splits=1)
            assert [entry[3] for entry in seen] == [dot, dot], (env, dot, seen)


def test_the_shared_keys_mode_takes_one_exp_per_common_entry(monkeypatch, triton_device):
    """The shared-keys mode's promise (module docstring: exps per entry at L levels L + 2L ->
    1 + 2): its common keys' tiles take one exp per entry for all levels. Counted under the
    interpreter at L = 4, 192 rows, 128 common keys: fewer elements exponentiated than the
    plain mode's (the s72 audit, t03: with the common-key loop skipped, every key went through
    the per-level loop, 151,296 elements against 77,952, the values still right)."""
    if torch.device(triton_device).type != "cpu":
        pytest.skip("counts the CPU interpreter's operations")
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if not hasattr(builder, "create_exp"):
        pytest.skip("this Triton's interpreter has no create_exp to count")
    k = _kernels()
    count = [0]

    def counting(self, arg, real=builder.create_exp):
        count[0] += arg.data.size
        return real(self, arg)

    def exps(fn, *args, **kwargs) -> int:
        """Elements the interpreter exponentiates in fn(*args, **kwargs)."""
        count[0] = 0
        fn(*args, **kwargs)
        return count[0]

    monkeypatch.setattr(builder, "create_exp", counting)
    gen = torch.Generator().manual_seed(0)
    n, levels, n_common = 192, 4, 128
    z = torch.randn(n, 16, generator=gen)
    log_w = -torch.rand(levels, n, generator=gen)
    plain, shared = (exps(k.lse_forward, z, log_w, 1.0, True, n_common=common, key_splits=1)
                     for common in (0, n_common))
    # the common keys' entries once, the rest once per level (+ O(L·N) for the row updates)
    assert shared < 0.6 * plain, (plain, shared)
    assert shared <= n * n_common + levels * n * (n - n_common) + 64 * levels * n, shared
    # the backward: a row block whose rows all lie in the prefix (here rows 0-63 of 128, the
    # interpreter's 64-row blocks, exactly at the prefix's end) takes the common tiles once
    # for all levels too (s72, m06/m07: with `<` for `<=`, or the common tiles skipped, it
    # took L exps per entry: 98,816 elements against the plain mode's 98,304; 82,624 here)
    n, half = 128, 64
    z, log_w = z[:n], log_w[:, :n]
    grad = torch.randn(levels, n, generator=gen)
    counts = {}
    for common in (0, half):
        lse, _, _ = k.lse_forward(z, log_w, 1.0, False, n_common=common, key_splits=1)
        counts[common] = exps(k.lse_backward, z, log_w, lse, grad, 1.0, n_common=common,
                              key_splits=1)
    assert counts[half] < counts[0] - (levels - 1) * half * half, counts


def test_the_autotuners_keys_tell_every_launched_kernel_apart(monkeypatch, triton_device):
    """triton.autotune keeps one config per value of its keys (and the tensors' dtypes): two
    launches whose keys agree but whose compile-time modes differ would share a config timed
    for the other kernel. Every launch of a set of calls (each mode, split and schedule) is
    recorded at ``_launch``; launches that agree on the keys (_TUNE_KEYS, N, D, the splits)
    compile the same kernel (the s72 audit, m30: FOLD_ARGMAX dropped from the backward's keys
    passed every test, autotuning running on a GPU only)."""
    k = _kernels()
    seen = record_launches(monkeypatch, k, lambda which, n, axis1, axis2, args, meta: (
        which, n, axis1, axis2, args[0].dtype, dict(meta)))
    z, log_w, grad = make_case(70, 8, 2, 2.0, seed=7, hide=0.0)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    coef = torch.randn(2, 70, generator=torch.Generator().manual_seed(8)).to(triton_device)
    for splits in (1, 2):
        lse, _, _ = k.lse_forward(zd, lwd, 2.0, False, key_splits=splits)
        k.lse_forward(zd, lwd, 2.0, True, key_splits=splits)
        k.lse_backward(zd, lwd, lse, gd, 2.0, key_splits=splits)
        k.lse_backward(zd, lwd, lse, gd, 2.0, two_pass=True)
        lse, rowmax, argmax = k.lse_forward(zd, lwd, 2.0, True, relative=True, key_splits=splits)
        k.lse_backward(zd, lwd, lse, gd, 2.0, rowmax=rowmax, key_splits=splits)
        k.lse_backward(zd, lwd, lse, gd, 2.0, rowmax=rowmax, argmax=argmax, key_splits=splits)
        k.lse_backward(zd, lwd, lse, gd, 2.0, rowmax=rowmax, argmax=argmax, argmax_coef=coef,
                       key_splits=splits)
        k.lse_forward(zd, lwd, 2.0, True, key_splits=splits, fuse_levels=False)
        lse, _, _ = k.lse_forward(zd, lwd, 2.0, True, n_common=70, key_splits=splits)
        k.lse_backward(zd, lwd, lse, gd, 2.0, n_common=70, key_splits=splits)
    kernels = {}
    for which, n, axis1, axis2, dtype, meta in seen:
        key = (which, n, axis1, axis2, dtype,
               *(meta.get(name) for name in k._TUNE_KEYS[which] if name not in ("N", "D")))
        kernels.setdefault(key, []).append(meta)
    assert len(kernels) >= 10, len(kernels)
    for key, metas in kernels.items():
        assert all(m == metas[0] for m in metas), (key, metas)


@pytest.mark.parametrize("n,d,levels,scale,norm,n_common", SHARED_CASES)
def test_shared_keys_mode(n, d, levels, scale, norm, n_common, triton_device):
    """n_common: the keys visible in every level take one exp per entry for all levels. Same
    rule against float64 as the ordinary mode, forward (lse returned in float64 as R + δ, row
    max, first arg-max) and both backward schedules, with the grid-over-levels forward too."""
    k = _kernels()
    z, log_w, grad = make_case(n, d, levels, norm, seed=11)
    gen = torch.Generator().manual_seed(12)
    log_w[:, :n_common] = -torch.rand(levels, n_common, generator=gen) * 3
    z[n_common - 1] = z[1]            # a tie in the common max across tiles: first index wins
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    for fuse in (True, False):
        lse, rowmax, argmax = k.lse_forward(zd, lwd, scale, True, fuse_levels=fuse,
                                            n_common=n_common)
        assert lse.dtype == torch.float64
        assert_rule(lse, ref[0], low[0], torch.float32, f"lse (shared, fuse={fuse})")
        assert_rule(rowmax, ref[1], low[1], torch.float32, "rowmax (shared)")
        plain = k.lse_forward(zd, lwd, scale, True, fuse_levels=fuse)
        assert torch.equal(argmax, plain[2])
    for two_pass in (False, True):
        dz = k.lse_backward(zd, lwd, lse, gd, scale, two_pass=two_pass, n_common=n_common)
        assert_rule(dz, ref[3], low[3], torch.float32, f"dz (shared, two_pass={two_pass})")


@pytest.mark.parametrize("levels,splits", [(2, 1), (3, 1), (2, 3)])
def test_shared_keys_mode_rows_led_by_a_key_after_the_common_tiles(levels, splits,
                                                                    triton_device, monkeypatch):
    """Every row's largest term is its own key, so for the rows past the last full common
    tile (keys 64.. on 64-key tiles) it is a key of the loop after the common tiles, and
    their largest common score (~5e3) lies one binade below it (~1.2e4). Their lse and the
    backward's p = e^0 of that key must come from the same numbers: before the fix (a fuzzing
    find, 2026-12-05) that loop's lse was an fp32 m + log l of |s|'s size, merged against the
    common max in fp32 (one bit lost: a tie, rounded to even half the time), and dz of those
    rows was off by ~1e-3 relative (3.9x the rule in the fuzz case). Same rule as the plain
    mode, which the kernels must also meet here, with and without key splits. On a card the
    tiles are 64 keys wide as under the interpreter: fp32 rows with IEEE dots take LEAN_TILES
    there, 32 keys wide, which would leave only rows 96.. past the common tiles."""
    k = _kernels()
    if triton_device != "cpu":
        from hiertail_fast.kernels import _utils as u

        monkeypatch.setenv(u.TILES_ENV, "64x64x8")
    n, d, scale = 100, 128, 1.0
    gen = torch.Generator().manual_seed(5)
    z = torch.zeros(n, d)
    head = 75.0 + 10.0 * torch.rand(n, generator=gen)
    z[torch.arange(n), torch.arange(n)] = head                   # s_jj ~ 5.6e3-7.2e3
    rows = torch.arange(64, n)
    z[rows, rows] = 85.0 + 10.0 * torch.rand(rows.numel(), generator=gen)
    z[rows, rows - 64] = 5000.0 / head[rows - 64]               # s_{i, i-64} ~ 5e3
    log_w = -3.0 * torch.rand(levels, n, generator=gen)
    grad = torch.randn(levels, n, generator=gen)
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    lse, _, _ = k.lse_forward(zd, lwd, scale, False, n_common=n, key_splits=splits)
    assert_rule(lse, ref[0], low[0], torch.float32, "lse (shared)")
    dz = k.lse_backward(zd, lwd, lse, gd, scale, n_common=n, key_splits=splits)
    assert_rule(dz, ref[3], low[3], torch.float32, "dz (shared)")
    plain_lse, _, _ = k.lse_forward(zd, lwd, scale, False, key_splits=splits)
    plain = k.lse_backward(zd, lwd, plain_lse, gd, scale, key_splits=splits)
    assert_rule(plain, ref[3], low[3], torch.float32, "dz (plain)")


def test_shared_keys_mode_shifts_by_the_largest_log_weight_over_all_keys(triton_device):
    """The shared-keys mode's shift c_l is the level's largest finite log-weight over ALL keys:
    the keys after the common tiles run the relative loop e^{(s - r) + (log w - c)}, which must
    stay <= 1. With c taken over the common keys only, a later key whose log-weight leads them
    by more than 88 overflowed fp32's exp: lse +inf / NaN and dz off by ~12 where float64 is
    finite (ecde8f1's shift, unguarded: the tests drew log-weights in [-3, 0], where either
    shift works; a fix-test check, session 68). The losses keep the spread within log N; the
    kernel API takes any finite log-weights."""
    k = _kernels()
    n, d, n_common, scale = 100, 16, 64, 1.0
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(n, d, generator=gen)
    log_w = torch.zeros(2, n)
    log_w[:, :n_common] = -95.0            # the common keys, far below the later ones
    log_w[0, 80:] = -INF                   # keys after them, some hidden per level
    log_w[1, n_common:] = -INF
    grad = torch.randn(2, n, generator=gen)
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    lse, _, _ = k.lse_forward(zd, lwd, scale, False, n_common=n_common)
    assert_rule(lse, ref[0], low[0], torch.float32, "lse (shared, spread log-weights)")
    dz = k.lse_backward(zd, lwd, lse, gd, scale, n_common=n_common)
    assert_rule(dz, ref[3], low[3], torch.float32, "dz (shared, spread log-weights)")


def test_shared_keys_mode_ties(triton_device):
    """Exact ties across common key tiles (integer embeddings: every dot exact) resolve to the
    lowest index in the shared-keys mode too; a level-specific key after the prefix that ties
    the common max does not take it (the rest of the keys win only if strictly greater)."""
    k = _kernels()
    n, d, scale = 150, 16, 0.5
    z = torch.randint(-2, 3, (n, d), generator=torch.Generator().manual_seed(2)).float()
    z[:, 0] = 3.0
    z[[10, 70, 140]] = torch.full((d,), 3.0)   # the key most rows prefer, in 3 different tiles
    log_w = -torch.rand(2, n, generator=torch.Generator().manual_seed(3))
    log_w[1, 140:] = -INF                        # keys 140.. only in level 0: after the prefix
    grad = torch.randn(2, n, generator=torch.Generator().manual_seed(4))
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    lse, rowmax, argmax = k.lse_forward(zd, lwd, scale, True, n_common=140)
    assert torch.equal(argmax.cpu(), ref[2])
    tied = (ref[4][:, 10] == ref[1][0]) & (ref[4][:, 70] == ref[1][0])
    assert tied.sum() > 10, "test setup: the duplicated key should tie across tiles"
    assert_rule(lse, ref[0], low[0], torch.float32, "lse (shared, ties)")
    dz = k.lse_backward(zd, lwd, lse, gd, scale, n_common=140)
    assert_rule(dz, ref[3], low[3], torch.float32, "dz (shared, ties)")


def test_shared_keys_mode_refuses_a_wrong_prefix(triton_device):
    k = _kernels()
    z, log_w, grad = make_case(50, 8, 2, 3.0)
    log_w[:, :30] = 0.0
    log_w[1, 10] = -INF                          # a key of the prefix hidden from level 1
    zd, lwd = z.to(triton_device), log_w.to(triton_device)
    with pytest.raises(ValueError, match="visible"):
        k.lse_forward(zd, lwd, 1.0, False, n_common=30)
    for bad in (-1, 51, True, 2.0):
        with pytest.raises(ValueError, match="n_common"):
            k.lse_forward(zd, lwd, 1.0, False, n_common=bad)
    lse, _, _ = k.lse_forward(zd, lwd, 1.0, False, n_common=10)      # keys 0..9: fine
    with pytest.raises(ValueError, match="visible"):
        k.lse_backward(zd, lwd, lse, grad.to(triton_device), 1.0, n_common=11)


def test_tile_override_knob(monkeypatch):
    """$HIERTAIL_TRITON_TILES: "fixed" / unset -> the table, "lean" -> LEAN_TILES (one of the
    autotuner's candidates), "MxNxW" -> that tile, on a GPU only (the interpreter keeps its
    square tiles); a bad value is a ValueError naming the variable, under the interpreter too
    (it was ignored there, so a typo passed every CPU run and failed first on a GPU)."""
    from hiertail_fast.kernels import _utils as u

    monkeypatch.delenv(u.TILES_ENV, raising=False)
    table = u.pair_blocks(10_000, 64, True)
    for raw, want in (("", table), (" Fixed ", table), ("lean", u.LEAN_TILES),
                      ("128x64x8", (128, 64, 8))):
        monkeypatch.setenv(u.TILES_ENV, raw)
        assert u.pair_blocks(10_000, 64, True) == want
        assert u.pair_blocks(100, 64, False) == (64, 64, 4)
    assert (*u.LEAN_TILES, 3) in u.TUNE_TILES
    monkeypatch.setenv(u.TILES_ENV, "lean")          # the knob also overrides the arch table
    assert u.pair_blocks(10_000, 64, True, arch=(8, 0), fp32_dot="tf32x3") == u.LEAN_TILES
    monkeypatch.setenv(u.TILES_ENV, "128x64x4")
    assert u.pair_blocks(10_000, 64, True, fp32_dot="ieee") == (128, 64, 4)
    for bad in ("big", "128x64", "100x64x4", "128x64x3", "512x64x4", "8x64x4", "warps8",
                # BLOCK_N and the warps checked as BLOCK_M is (s72: u09, u10, u20)
                "128x64x32", "128x48x4", "64x8x4", "64x512x4"):
        monkeypatch.setenv(u.TILES_ENV, bad)
        for on_gpu in (True, False):
            with pytest.raises(ValueError, match=u.TILES_ENV):
                u.pair_blocks(10_000, 64, on_gpu)


def test_table_tiles_take_8_warps_and_warps4_restores_the_timed_launches(monkeypatch):
    """The GPU table (fp32 with 3xTF32 dots on sm_90 / sm_100, 16-bit inputs everywhere):
    128 x 64 at d_pad <= 64 and 64 x 64 at <= 128 with 8 warps (4 until 2026-12-05), 64 x 32 x 8
    wider. $HIERTAIL_TRITON_TILES=warps4 gives the table's tiles with 4 warps -- the launches of
    the H200 figures -- and leaves what the table never decided alone: the Ampere fp32 tile,
    IEEE dots' lean tile, the interpreter's square tiles. The same tile shapes either way (so
    the same key splits)."""
    from hiertail_fast.kernels import _utils as u

    monkeypatch.delenv(u.TILES_ENV, raising=False)
    cases = {64: (128, 64), 128: (64, 64), 256: (64, 32)}
    for raw, warps in (("", 8), ("fixed", 8), ("warps4", 4), (" Warps4 ", 4)):
        monkeypatch.setenv(u.TILES_ENV, raw)
        for d_pad, tile in cases.items():
            want = (*tile, warps if d_pad <= 128 else 8)
            for arch, dot in (((9, 0), "tf32x3"), ((10, 0), "tf32x3"), ((8, 0), None),
                              ((12, 0), None), (None, None)):
                assert u.pair_blocks(20_000, d_pad, True, arch=arch, fp32_dot=dot) == want
        assert u.pair_blocks(20_000, 64, True, arch=(8, 0), fp32_dot="tf32x3") == \
            u.AMPERE_FP32_TILES
        assert u.pair_blocks(20_000, 64, True, arch=(9, 0), fp32_dot="ieee") == u.LEAN_TILES
        assert u.pair_blocks(100, 64, False) == (64, 64, 4)


def test_fp32_tiles_by_dot_and_arch(monkeypatch):
    """fp32 inputs where the compiled code asks for another tile than the table (d_pad <= 128):
    3xTF32 dots on compute capability 8.x / 12.x (A100, RTX 30xx / 40xx / 50xx) take
    AMPERE_FP32_TILES (the table's backward spills 19-30 KB per thread on sm_80), IEEE dots on
    any card LEAN_TILES (the table's backward spills 21-38 KB on sm_90). 16-bit inputs, 3xTF32
    on other cards, wider rows and the interpreter keep theirs; the positives kernel follows
    the same rule over its own GPU_TILES."""
    from hiertail_fast.kernels import _utils as u
    from hiertail_fast.kernels import balanced_contrastive_loss_positives as pos

    monkeypatch.delenv(u.TILES_ENV, raising=False)
    archs = (None, (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0))
    for d_pad in (16, 64, 128, 256):
        table = u.pair_blocks(10_000, d_pad, True)
        for arch in archs:
            ampere = arch is not None and arch[0] in (8, 12)
            for dot, want in ((None, None), ("ieee", u.LEAN_TILES),
                              ("tf32x3", u.AMPERE_FP32_TILES if ampere else None)):
                if d_pad > 128:
                    want = None
                assert u.pair_blocks(10_000, d_pad, True, arch=arch, fp32_dot=dot) == (
                    want or table), (d_pad, arch, dot)
                assert pos.gpu_tiles(d_pad, arch, dot) == (want or pos.GPU_TILES)
                assert u.pair_blocks(100, d_pad, False, arch=arch, fp32_dot=dot) == (
                    u.pair_blocks(100, d_pad, False))
    assert u.cuda_arch(torch.zeros(1)) is None
    if torch.cuda.is_available():
        assert u.cuda_arch(torch.zeros(1, device="cuda")) == torch.cuda.get_device_capability()


@pytest.mark.parametrize("knob", ["lean", "32x64x4", "warps4"])
def test_lean_tiles(knob, monkeypatch, triton_device):
    """The LSE kernels on LEAN_TILES (64 x 32, 8 warps), on AMPERE_FP32_TILES (32 x 64, 4
    warps; an H200 runs it only when asked, so this is its CUDA check there) and on the table's
    tile with 4 warps (the launches before 2026-12-05, now only gpu_report's A/B rows):
    forward (both variants' outputs) and, on CUDA, the one-pass backward (exact, and official:
    relative mode with the arg-max fold) against the dense rule. Under the interpreter only the
    forward runs them (its backward re-dots transposed tiles, which needs square ones)."""
    from hiertail_fast.kernels import _utils as u

    k = _kernels()
    tile = {"lean": u.LEAN_TILES, "32x64x4": u.AMPERE_FP32_TILES,
            "warps4": u.table_tiles(32, 4)}[knob]
    monkeypatch.setenv(u.TILES_ENV, knob)
    n, d, levels, scale, norm = CASES[5]          # 300 rows: several 64-row blocks
    z, log_w, grad = make_case(n, d, levels, norm, seed=9)
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    # On a card the dots are 3xTF32 (the rule holds at this bound, test_tf32x3_and_autotuned_
    # tiles): with the launchers' default IEEE dots fp32 rows take LEAN_TILES whatever "warps4"
    # and "fixed" say (fp32_dot_tiles), so the 4-warp case and the comparison with the table's
    # tile below would both have run the lean tile.
    dot = None
    if triton_device == "cpu":
        monkeypatch.setattr(k, "pair_blocks", lambda n, d_pad, on_gpu, **kw: tile)
    else:
        dot = "tf32x3"
        taken = u.pair_blocks(n, 32, True, arch=u.cuda_arch(zd), fp32_dot=dot)
        if taken != tile:    # "warps4" on 8.x / 12.x cards: 3xTF32 takes AMPERE_FP32_TILES
            pytest.skip(f"this card runs {taken} for fp32 rows with 3xTF32 dots, not {tile}")
    lse, rowmax, _ = k.lse_forward(zd, lwd, scale, True, fp32_dot=dot)
    assert_rule(lse, ref[0], low[0], torch.float32, f"lse ({knob} tiles)")
    assert_rule(rowmax, ref[1], low[1], torch.float32, f"rowmax ({knob} tiles)")
    if triton_device != "cpu":
        dz = k.lse_backward(zd, lwd, lse, gd, scale, fp32_dot=dot)
        assert_rule(dz, ref[3], low[3], torch.float32, f"dz ({knob} tiles)")
        # official: relative mode, with and without the arg-max fold, against the table's tile
        outs = {}
        for env in (knob, "fixed"):
            monkeypatch.setenv(u.TILES_ENV, env)
            rel, rmax, amax = k.lse_forward(zd, lwd, scale, True, relative=True, fp32_dot=dot)
            outs[env] = (rel, k.lse_backward(zd, lwd, rel, gd, scale, rowmax=rmax, fp32_dot=dot),
                         k.lse_backward(zd, lwd, rel, gd, scale, rowmax=rmax, argmax=amax,
                                        fp32_dot=dot))
        assert_rule(outs[knob][0], ref[0], low[0], torch.float32, f"lse (relative, {knob})")
        assert_rule(outs[knob][1], ref[3], low[3], torch.float32, f"dz (relative, {knob})")
        # the fold (no dense twin here): within twice a dense fp32 gradient's error of the
        # default tile's (measured under the interpreter, 32 x 32 vs 64 x 64: 0.5x that bound)
        fp32_err = (low[3] - ref[3]).abs().max().item()
        torch.testing.assert_close(outs[knob][2], outs["fixed"][2], rtol=0, atol=2 * fp32_err)


class _OneConfigTuner:
    """Stands in for triton's autotuner where none can run (the interpreter has no GPU to time
    on): 'tunes' to one given config, then launches exactly as the autotuner does (the grid
    function called with the config's meta-parameters, the config's tiles and warps added)."""

    def __init__(self, kernel, config):
        self.kernel, self.config, self.launches = kernel, config, 0

    def __getitem__(self, grid):
        def run(*args, **meta):
            assert not {"BLOCK_M", "BLOCK_N", "num_warps"} & set(meta), "tiles come from config"
            self.launches += 1
            self.kernel[grid(self.config.kwargs)](*args, **meta, **self.config.kwargs,
                                                  num_warps=self.config.num_warps)
        return run


def test_autotuned_launch_path(monkeypatch, triton_device, two_tiles):
    """The launchers' autotuned branch (grid from the chosen config, no fixed tiles passed)
    gives correct numbers, forward and both backward schedules. On CPU the autotuner itself is
    replaced by one that picks a config (square for the backward, as DOT_CR needs); on CUDA
    the real one runs."""
    import triton

    k = _kernels()
    from hiertail_fast.kernels import _utils as u

    for which, kernel in (("fwd", k._balanced_contrastive_loss_fwd_kernel),
                          ("bwd", k._balanced_contrastive_loss_bwd_kernel)):
        assert set(k._TUNE_KEYS[which]) <= set(kernel.arg_names)  # (3.6 does not check)
    fakes = {}
    if triton_device == "cpu":
        fakes = {  # forward: a tall, narrow tile (a grid taken from BLOCK_N would miss rows)
            "fwd": _OneConfigTuner(k._balanced_contrastive_loss_fwd_kernel, triton.Config(
                {"BLOCK_M": 16, "BLOCK_N": 64}, num_warps=4)),
            "bwd": _OneConfigTuner(k._balanced_contrastive_loss_bwd_kernel, triton.Config(
                {"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4))}
        monkeypatch.setattr(k, "_tuned", fakes.__getitem__)
        monkeypatch.setattr(k, "_use_autotune", lambda z, autotune: u.autotune_requested(autotune))
    n, d, levels, scale, norm = CASES[5]          # 300 rows: several 32-row blocks
    z, log_w, grad = make_case(n, d, levels, norm, seed=5)
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    for fuse in (True, False):
        lse, rowmax, _ = k.lse_forward(zd, lwd, scale, True, fuse_levels=fuse, autotune=True)
        assert_rule(lse, ref[0], low[0], torch.float32, f"lse (autotuned, fuse={fuse})")
        assert_rule(rowmax, ref[1], low[1], torch.float32, "rowmax (autotuned)")
    for two_pass in (False, True):
        dz = k.lse_backward(zd, lwd, lse, gd, scale, two_pass=two_pass, autotune=True)
        assert_rule(dz, ref[3], low[3], torch.float32, f"dz (autotuned, two_pass={two_pass})")
    if fakes:
        assert fakes["fwd"].launches == 2 and fakes["bwd"].launches == 3


def _official_like(z, log_w, scale, grad, dtype):
    """F = Σ_l,i g_li (lse_li - rowmax_li) (the official loss's d/dLSE structure: the row max
    takes the arg-max's gradient, as torch.max does), dense in `dtype`: (δ = lse - rowmax, dF/dz).
    Near-singleton rows make F's gradient nearly cancel: p_ia ~ 1 against the max's 1."""
    zz = z.to(dtype).detach().requires_grad_()
    s = scale * zz @ zz.T
    deltas, total = [], 0.0
    for lw, g in zip(log_w.to(dtype), grad.to(dtype), strict=True):
        sv = torch.where((lw > -INF)[None, :], s, -INF)
        mx = sv.max(dim=1, keepdim=True).values
        delta = torch.logsumexp((s - mx) + lw[None, :], dim=1)   # exact 0 at the arg-max
        total = total + (g * delta).sum()
        deltas.append(delta.detach())
    return torch.stack(deltas), torch.autograd.grad(total, zz)[0]


def _argmax_grad(z, argmax, grad, scale, key_side=True):
    """d/dz of Σ g_li scale z_i.z_{argmax_li} (key_side=False: its query side only)."""
    dz = torch.zeros_like(z)
    for a, g in zip(argmax, grad, strict=True):
        gz = (scale * g)[:, None]
        dz += gz * z[a]
        if key_side:
            dz.index_add_(0, a, gz * z)
    return dz


@pytest.mark.parametrize("n,d,levels,scale,bound,seed", [  # bound: max |s| = scale max |z|^2
    (31, 3, 1, 10.0, 1024.0, 0), (64, 8, 2, 10.0, 4096.0, 1), (130, 8, 1, 100.0, 9e4, 130),
    (31, 2, 1, 100.0, 1e11, 6), (40, 3, 2, 100.0, 2 ** 37, 2)])
def test_relative_mode_official_cancellation(n, d, levels, scale, bound, seed, triton_device):
    """relative=True (the official variant's mode): lse comes back as float64 rowmax + δ with δ
    = lse - rowmax to fp32 precision of δ, and the backward given the rowmax forms p against it,
    so F = Σ g (lse - rowmax), whose gradient cancels p_ia ~ 1 against the max's 1, matches the
    float64 reference within the rule of the dense fp32 computation (which subtracts the max
    first). With one fp32 lse (the plain mode) these cases missed the rule: the gradient by
    4.3x / 3.6x (the first two), δ by 25x (the third; bench/official_small_n.py at the loss
    level: 28x the tests' rule at N = 31). rowmax / argmax are those of the plain mode.
    Past |s| ~ 2^29 (the last two, up to the official engines' 2^37) float64 rowmax + δ keeps
    too few of δ's bits: δ comes apart (return_delta) and the backward takes it (delta=);
    from lse - rowmax the gradient was 66 ulp of its cancelling terms at |s| 1e11, 0.2 from δ
    (bench/official_fuzz.py found it at the loss level)."""
    k = _kernels()
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d, generator=gen)
    norm = (bound / scale) ** 0.5
    z = z / z.norm(dim=1, keepdim=True) * norm * (0.5 + 0.5 * torch.rand(n, 1, generator=gen))
    log_w = -torch.log(torch.randint(1, 4, (levels, n), generator=gen).float())
    log_w[1:, ::3] = -INF                    # other levels hide some keys
    grad = torch.rand(levels, n, generator=gen) / n
    ref_delta, ref_dz = _official_like(z, log_w, scale, grad, torch.float64)
    low_delta, low_dz = _official_like(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    lse, rowmax, argmax, delta = k.lse_forward(zd, lwd, scale, True, relative=True,
                                               return_delta=True)
    plain = k.lse_forward(zd, lwd, scale, True)
    assert lse.dtype == torch.float64 and delta.dtype == torch.float64
    assert torch.equal(rowmax, plain[1]) and torch.equal(argmax, plain[2])
    assert torch.equal(k.lse_forward(zd, lwd, scale, True, relative=True)[0], lse)
    assert_rule(delta, ref_delta, low_delta, torch.float32, "delta")
    # lse is rowmax + δ rounded to float64 (past |s| ~ 2^29 that rounding exceeds δ's ulp)
    assert ((lse - rowmax.double()) - delta).abs().max() <= 2 ** -52 * rowmax.abs().max()
    dz = k.lse_backward(zd, lwd, lse, gd, scale, rowmax=rowmax, delta=delta)
    # the other schedules (grid over levels, FlashAttention-2 pair of passes) agree
    grid = k.lse_forward(zd, lwd, scale, True, relative=True, fuse_levels=False,
                         return_delta=True)
    torch.testing.assert_close(grid[0], lse, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grid[3], delta, rtol=1e-6, atol=1e-6)
    assert torch.equal(grid[1], rowmax) and torch.equal(grid[2], argmax)
    two = k.lse_backward(zd, lwd, lse, gd, scale, rowmax=rowmax, two_pass=True, delta=delta)
    torch.testing.assert_close(two, dz, rtol=1e-5, atol=1e-5 * dz.abs().max().item())
    dz = dz.cpu().double() - _argmax_grad(z.double(), argmax.cpu(), grad.double(), scale)
    # 8 fp32 ulp of the terms that cancel (g |z| sqrt(d) scale), as the loss suite's 32: where
    # every row's p_ia ~ 1 the dense computation cancels exactly (its error 0), the kernel's
    # p = e^{(s - r) + (log w - δ)} is off by an ulp of δ (<= 1.5 ulp of the terms measured;
    # 66x with δ from lse - rowmax at |s| 1e11)
    slack = 8 * torch.finfo(torch.float32).eps * grad.max().item() * norm * d ** 0.5 * scale
    assert_rule(dz, ref_dz, low_dz, torch.float32, "d/dz (lse - rowmax)", slack)
    # the key side of the row max's share folded into the kernel's blocks (argmax=):
    # cancelled per entry; its query side (row i alone) added here
    folded = k.lse_backward(zd, lwd, lse, gd, scale, rowmax=rowmax, argmax=argmax, delta=delta)
    folded = folded.cpu().double() - _argmax_grad(z.double(), argmax.cpu(), grad.double(),
                                                  scale, key_side=False)
    assert_rule(folded, ref_dz, low_dz, torch.float32, "d/dz (lse - rowmax), folded", slack)
    err = lambda t: (t.cpu().double() - ref_dz).abs().max().item()     # noqa: E731
    assert err(folded) <= 1.05 * err(dz) + 1e-12
    # argmax_coef h: h_li added at the same entries, key side only: key a gets h_li z_i
    h = torch.randn(levels, n, generator=gen) / n
    with_h = k.lse_backward(zd, lwd, lse, gd, scale, rowmax=rowmax, argmax=argmax,
                            argmax_coef=h.to(triton_device), delta=delta)
    key_h = torch.zeros(n, d, dtype=torch.float64)
    for lev in range(levels):
        key_h.index_add_(0, argmax[lev].cpu(), h[lev].double()[:, None] * z.double())
    got = with_h.cpu().double() - k.lse_backward(zd, lwd, lse, gd, scale, rowmax=rowmax,
                                                 argmax=argmax, delta=delta).cpu().double()
    torch.testing.assert_close(got, scale * key_h, rtol=1e-4,
                               atol=1e-5 * scale * key_h.abs().max().item())


def _hub_case(n=150):
    """1-D rows whose every softmax sits on one of two hub keys (rows 0 and 1, at -1000 and
    1000; the others within +-300..900): each hub in a class of 15 (w = 1/15), and a
    singleton making the level's largest weight 1, so t_a = e^{log w_a - c} is not 1."""
    gen = torch.Generator().manual_seed(0)
    sign = torch.where(torch.arange(n)[:, None] % 2 == 0, -1.0, 1.0)
    z = (300 + 600 * torch.rand(n, 1, generator=gen)) * sign
    z[0], z[1] = -1000.0, 1000.0
    y = torch.randint(2, 40, (n,), generator=gen)
    y[:30] = torch.arange(30) % 2
    y[n - 1] = 40
    return z, y


def test_relative_mode_delta_of_a_row_on_one_key_is_its_log_weight(triton_device):
    """A row whose softmax sits on one key (every other term underflows) has δ = lse - rowmax
    = log w_a exactly: the kernel forms δ against the arg-max's own term. As c + log l (c the
    level's largest log-weight) it was 2 fp32 ulp off for w = 1/15, the same for every row on
    that key, and the official gradient sums g (p_ia - 1) over the rows sharing it: 91 fp32 ulp
    of the cancelling terms here with the folded key side, 0.2 now (bench/official_fuzz.py
    found it at the loss level: 1.5x the rule, 150 rows, d = 1)."""
    k = _kernels()
    z, y = _hub_case()
    n, scale = z.shape[0], 2.0
    log_w = -torch.log(torch.bincount(y)[y].float())[None]
    grad = torch.full((1, n), 1.0 / n)
    ref_delta, ref_dz = _official_like(z, log_w, scale, grad, torch.float64)
    low_delta, low_dz = _official_like(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    lse, rowmax, argmax, delta = k.lse_forward(zd, lwd, scale, True, relative=True,
                                               return_delta=True)
    argmax, delta = argmax.cpu(), delta.cpu()
    assert set(argmax.unique().tolist()) == {0, 1}
    assert torch.equal(delta.float(), log_w.gather(1, argmax))
    assert torch.equal(delta.float(), ref_delta.float())
    folded = k.lse_backward(zd, lwd, lse, gd, scale, rowmax=rowmax, argmax=argmax.to(zd.device),
                            delta=delta.to(zd.device))
    folded = folded.cpu().double() - _argmax_grad(z.double(), argmax, grad.double(), scale,
                                                  key_side=False)
    slack = 8 * torch.finfo(torch.float32).eps * grad.max().item() * 1000.0 * scale
    assert_rule(folded, ref_dz, low_dz, torch.float32, "d/dz (lse - rowmax), hubs", slack)


def test_relative_mode_argmax_on_a_key_of_tiny_weight(triton_device):
    """Rows whose arg-max key weighs e^-100 of the level's largest: its own term t_a is not a
    normal fp32 number, so δ cannot be formed against it (dividing by it gave ±inf δ) and the
    kernel keeps c + log l there; δ and the official-like gradient within the rule."""
    k = _kernels()
    n, d, scale = 40, 4, 1.0
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(n, d, generator=gen) * 3
    log_w = torch.zeros(1, n)
    log_w[0, ::2] = -100.0
    grad = torch.rand(1, n, generator=gen) / n
    ref_delta, ref_dz = _official_like(z, log_w, scale, grad, torch.float64)
    low_delta, low_dz = _official_like(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    lse, rowmax, argmax, delta = k.lse_forward(zd, lwd, scale, True, relative=True,
                                               return_delta=True)
    assert (log_w.gather(1, argmax.cpu()) < -50).sum() >= 5      # (rows on a light key)
    assert_rule(delta, ref_delta, low_delta, torch.float32, "delta")
    dz = k.lse_backward(zd, lwd, lse, gd, scale, rowmax=rowmax, argmax=argmax, delta=delta)
    dz = dz.cpu().double() - _argmax_grad(z.double(), argmax.cpu(), grad.double(), scale,
                                          key_side=False)
    assert_rule(dz, ref_dz, low_dz, torch.float32, "d/dz (lse - rowmax)")


def test_relative_mode_bad_combinations(triton_device):
    k = _kernels()
    z = torch.randn(20, 4).to(triton_device)
    lw = torch.zeros(2, 20, device=triton_device)
    with pytest.raises(ValueError, match="relative=True needs need_max"):
        k.lse_forward(z, lw, 1.0, False, relative=True)
    with pytest.raises(ValueError, match="relative=True needs need_max"):
        k.lse_forward(z, lw, 1.0, True, relative=True, n_common=10)
    lse, rowmax, _ = k.lse_forward(z, lw, 1.0, True, relative=True)
    with pytest.raises(ValueError, match="rowmax must have shape"):
        k.lse_backward(z, lw, lse, lw, 1.0, rowmax=rowmax[:1])
    with pytest.raises(ValueError, match="cannot be combined with n_common"):
        k.lse_backward(z, lw, lse, lw, 1.0, rowmax=rowmax, n_common=10)
    with pytest.raises(ValueError, match="argmax .int64. needs rowmax"):
        k.lse_backward(z, lw, lse, lw, 1.0, argmax=torch.zeros_like(lw, dtype=torch.int64))
    with pytest.raises(ValueError, match="argmax .int64. needs rowmax"):
        k.lse_backward(z, lw, lse, lw, 1.0, rowmax=rowmax, argmax=lw)
    amax = torch.zeros_like(lw, dtype=torch.int64)
    with pytest.raises(ValueError, match="argmax must have shape"):       # (s72, m34)
        k.lse_backward(z, lw, lse, lw, 1.0, rowmax=rowmax, argmax=amax[:, :-1].contiguous())
    with pytest.raises(ValueError, match="argmax_coef needs argmax"):
        k.lse_backward(z, lw, lse, lw, 1.0, rowmax=rowmax, argmax_coef=lw)
    with pytest.raises(ValueError, match="argmax_coef must have shape"):
        k.lse_backward(z, lw, lse, lw, 1.0, rowmax=rowmax, argmax=amax, argmax_coef=lw[:1])
    with pytest.raises(ValueError, match="return_delta=True needs relative=True"):
        k.lse_forward(z, lw, 1.0, True, return_delta=True)
    with pytest.raises(ValueError, match="delta needs rowmax"):
        k.lse_backward(z, lw, lse, lw, 1.0, delta=lw)
    with pytest.raises(ValueError, match="delta must have shape"):
        k.lse_backward(z, lw, lse, lw, 1.0, rowmax=rowmax, delta=lw[:1])
    # no rows: four empty [L, 0] results, δ float64
    out = k.lse_forward(z[:0], lw[:, :0], 1.0, True, relative=True, return_delta=True)
    assert len(out) == 4 and all(t.shape == (2, 0) for t in out)
    assert out[3].dtype == torch.float64


def test_relative_mode_hidden_level_and_big_weights(triton_device):
    """A level with no visible key: δ = -inf, rowmax = -inf, lse = -inf and no gradient (no NaN);
    log-weights far above 0 (the kernel shifts them by the level's largest) neither overflow."""
    k = _kernels()
    n, d, scale = 50, 8, 2.0
    z, log_w, grad = make_case(n, d, 3, 3.0, seed=5)
    log_w[1] += 200.0                        # e^{200}: overflows fp32 without the shift
    log_w[2] = -INF
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    lse, rowmax, _, delta = k.lse_forward(zd, lwd, scale, True, relative=True,
                                          return_delta=True)
    assert torch.isneginf(lse[2]).all() and torch.isneginf(rowmax[2]).all()
    assert torch.isneginf(delta[2]).all() and torch.isfinite(delta[:2]).all()
    assert_rule(lse, ref[0], low[0], torch.float32, "lse")
    dz = k.lse_backward(zd, lwd, lse, gd, scale, rowmax=rowmax)
    assert torch.isfinite(dz).all()
    assert_rule(dz, ref[3], low[3], torch.float32, "dz")
    # δ given (dead rows -inf there): the same gradient, δ read apart instead of from lse
    given = k.lse_backward(zd, lwd, lse, gd, scale, rowmax=rowmax, delta=delta)
    torch.testing.assert_close(given, dz, rtol=0, atol=1e-6 * dz.abs().max().item())


def test_relative_mode_unfused_levels_keep_their_own_shift(triton_device):
    """The grid-over-levels forward (fuse_levels=False) in relative mode: each level's lse is
    rowmax + δ with that level's own log-weight shift c_l (reading level 0's c_0 in every
    program left levels 1 and 2 off by c_l - c_0: s42 audit)."""
    k = _kernels()
    n, d, scale = 20, 8, 2.0
    z, log_w, grad = make_case(n, d, 3, 2.0, seed=7, hide=0.0)
    log_w[1] -= 2.0                          # each level its own largest log-weight
    log_w[2] += 1.5
    log_w[2, 1::4] = -INF
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd = (t.to(triton_device) for t in (z, log_w))
    for fuse in (True, False):
        lse, rowmax, argmax = k.lse_forward(zd, lwd, scale, True, relative=True,
                                            fuse_levels=fuse)
        assert_rule(lse, ref[0], low[0], torch.float32, f"lse (fuse_levels={fuse})")
        assert torch.equal(argmax.cpu(), ref[2]), f"argmax (fuse_levels={fuse})"


def test_the_documented_largest_d(triton_device):
    """d = 256, the launchers' documented maximum (no padding lanes), runs forward and
    backward within the rule; only d > 256 is refused (test_bad_input)."""
    k = _kernels()
    n, d, levels, scale = 6, 256, 2, 0.5
    z, log_w, grad = make_case(n, d, levels, 2.0, seed=11)
    ref = dense(z, log_w, scale, grad, torch.float64)
    low = dense(z, log_w, scale, grad, torch.float32)
    zd, lwd, gd = (t.to(triton_device) for t in (z, log_w, grad))
    lse, _, _ = k.lse_forward(zd, lwd, scale, True)
    assert_rule(lse, ref[0], low[0], torch.float32, "lse")
    assert_rule(k.lse_backward(zd, lwd, lse, gd, scale), ref[3], low[3], torch.float32, "dz")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_official_large_logits_stay_on_the_kernels(monkeypatch, triton_device, dtype):
    """backend="triton", official variant, logits far past the limits the fp32 LSE needed
    before the relative mode (4,096 fp32 / fp16, 16,384 bf16; those calls ran our torch
    engine): the kernels serve the call and are as accurate as our torch engine (gradient error
    against float64 on the same rounded inputs at most 2x the torch engine's + tol)."""
    from hiertail_fast import balanced_contrastive_loss

    k = _kernels()
    launched = []
    real_fwd = k.lse_forward

    def fwd(*args, **kw):
        launched.append(kw.get("relative"))
        return real_fwd(*args, **kw)

    monkeypatch.setattr(k, "lse_forward", fwd)
    gen = torch.Generator().manual_seed(4)
    y = torch.randint(0, 3, (40,), generator=gen)
    z = torch.randn(40, 8, generator=gen)
    z = z / z.norm(dim=1, keepdim=True) * (0.5 + 0.5 * torch.rand(40, 1, generator=gen))
    bound = 24576.0 if dtype == torch.bfloat16 else 6144.0
    zb = (z * (bound * 0.5) ** 0.5).to(dtype)               # temperature 0.5: scale 2

    def grad(backend, zz, device):
        zz = zz.to(device).detach().requires_grad_()
        loss = balanced_contrastive_loss(zz, y.to(device), temperature=0.5, variant="official",
                                         include_self=False, backend=backend)
        loss.backward()
        return loss.detach().cpu().double(), zz.grad.cpu().double()

    got = grad("triton", zb, triton_device)
    assert launched == [True]
    exp = grad("reference", zb.double(), "cpu")
    ours = grad("torch", zb, "cpu")
    t = tol(dtype)
    for a, o, e in zip(got, ours, exp, strict=True):
        bound_err = 2 * (o - e).abs().max().item() + t["atol"] + t["rtol"] * e.abs().max().item()
        assert (a - e).abs().max().item() <= bound_err


@pytest.mark.parametrize("variant", ["exact", "official"])
def test_the_loss_picks_its_fp32_dot_from_the_logits(monkeypatch, triton_device, variant):
    """ops/_triton_loss: the loss on backend="triton" multiplies fp32 with 3xTF32 while the
    logits' bound is within TF32X3_MAX_LOGIT[variant], with exact IEEE dots above it, and
    $HIERTAIL_TRITON_FP32_DOT overrides both; the backward gets the forward's choice (its
    one-pass kernel recomputes the forward's scores). Both stay within the float64 reference."""
    from hiertail_fast import balanced_contrastive_loss
    from hiertail_fast.ops import _triton_loss

    k = _kernels()
    seen = []
    real_fwd, real_bwd = k.lse_forward, k.lse_backward

    def fwd(*args, fp32_dot=None, **kw):
        seen.append(("fwd", fp32_dot))
        return real_fwd(*args, fp32_dot=fp32_dot, **kw)

    def bwd(*args, fp32_dot=None, **kw):
        seen.append(("bwd", fp32_dot))
        return real_bwd(*args, fp32_dot=fp32_dot, **kw)

    monkeypatch.setattr(k, "lse_forward", fwd)
    monkeypatch.setattr(k, "lse_backward", bwd)
    # the official positives' pass too: its pairs are compared with the forward's row max, so
    # it must multiply as the forward did (the s72 audit, m24: it got None, the env's dots)
    from hiertail_fast.kernels import balanced_contrastive_loss_positives as pos

    def pairs(*args, fp32_dot=None, real=pos.positive_pairs, **kw):
        seen.append(("pos", fp32_dot))
        return real(*args, fp32_dot=fp32_dot, **kw)

    monkeypatch.setattr(pos, "positive_pairs", pairs)
    monkeypatch.delenv(_triton_loss.FP32_DOT_ENV, raising=False)
    limit = _triton_loss.TF32X3_MAX_LOGIT[variant]
    gen = torch.Generator().manual_seed(3)
    y = torch.randint(0, 3, (40,), generator=gen)
    z = torch.randn(40, 8, generator=gen)
    z = z / z.norm(dim=1, keepdim=True)
    cases = [(0.5 * limit, None, "tf32x3"), (2.0 * limit, None, "ieee"),
             (0.5 * limit, "ieee", "ieee"), (2.0 * limit, "tf32x3", "tf32x3")]
    for bound, env, want in cases:
        if env is None:
            monkeypatch.delenv(_triton_loss.FP32_DOT_ENV, raising=False)
        else:
            monkeypatch.setenv(_triton_loss.FP32_DOT_ENV, env)
        zb = z * (bound * 0.5) ** 0.5                      # temperature 0.5: scale 2
        assert _triton_loss.fp32_dot(zb, 2.0, variant) == want
        seen.clear()
        got = zb.to(triton_device).detach().requires_grad_()
        loss = balanced_contrastive_loss(got, y.to(triton_device), temperature=0.5,
                                         variant=variant, backend="triton")
        loss.backward()
        lse_calls = [entry for entry in seen if entry[0] != "pos"]
        assert lse_calls == [("fwd", want), ("bwd", want)]
        positives = [entry for entry in seen if entry[0] == "pos"]
        assert positives == ([("pos", want)] * len(positives) if variant == "official" else [])
        assert variant == "exact" or positives
        ref = zb.double().requires_grad_()
        loss_ref = balanced_contrastive_loss(ref, y, temperature=0.5,
                                             variant=variant, backend="reference")
        loss_ref.backward()
        torch.testing.assert_close(loss.double().cpu(), loss_ref, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.grad.double().cpu(), ref.grad, rtol=1e-4, atol=1e-4)
    # a blank variable is unset: the choice by the logits stands (the s72 audit, m60: read
    # unstripped, "  " forced the slow IEEE dots)
    small = z * (0.5 * limit * 0.5) ** 0.5            # rows within the 3xTF32 limit
    monkeypatch.setenv(_triton_loss.FP32_DOT_ENV, "  ")
    assert _triton_loss.fp32_dot(small, 2.0, variant) == "tf32x3"
    # the call's shared bound decides, not a new reduction of z (s72, m26): a bound past the
    # limit read from the loss's checks gives IEEE dots for rows whose own bound is within it
    from hiertail_fast.ops._attention_lse import LogitBound

    monkeypatch.delenv(_triton_loss.FP32_DOT_ENV)
    past = LogitBound(small, 2.0, max_row_norm=(limit / 2.0) ** 0.5 * 2)
    assert _triton_loss.fp32_dot(small, 2.0, variant) == "tf32x3"
    assert _triton_loss.fp32_dot(small, 2.0, variant, past) == "ieee"
    # 16-bit inputs have native dots: the knob says "ieee" (unused) for them
    monkeypatch.delenv(_triton_loss.FP32_DOT_ENV, raising=False)
    assert _triton_loss.fp32_dot(z.bfloat16(), 2.0, variant) == "ieee"
    # a card without TF32 tensor cores (compute capability < 8.0): exact dots
    assert _triton_loss.fp32_dot(small, 2.0, variant) == "tf32x3"
    monkeypatch.setattr(_triton_loss, "tf32_cores", lambda device: False)
    assert _triton_loss.fp32_dot(small, 2.0, variant) == "ieee"
    monkeypatch.undo()
    if torch.cuda.is_available():
        cap = torch.cuda.get_device_capability()
        assert _triton_loss.tf32_cores(torch.device("cuda")) == (cap >= (8, 0))


@pytest.mark.parametrize("variant, limit", [("exact", 2048.0), ("official", 1024.0)])
def test_the_fp32_dot_limits_hold_at_and_past_their_bounds(monkeypatch, variant, limit):
    """3xTF32 dots up to the measured bound B = scale·max‖z‖² of each variant (the module
    docstring: 2,048 exact, 1,024 official), a bound equal to it included; IEEE dots past it."""
    from hiertail_fast.ops import _triton_loss

    monkeypatch.delenv(_triton_loss.FP32_DOT_ENV, raising=False)
    z = torch.zeros(8, 2)
    z[0, 0] = 32.0                                       # max‖z‖² = 1024
    for b, want in ((limit, "tf32x3"), (1.5 * limit, "ieee")):
        assert _triton_loss.LogitBound(z, b / 1024).value == b
        assert _triton_loss.fp32_dot(z, b / 1024, variant) == want, (b, variant)


@pytest.mark.parametrize("cap, want", [((7, 5), False), ((8, 0), True), ((8, 6), True),
                                       ((9, 0), True), ((12, 0), True)])
def test_tf32_cores_from_ampere_on(monkeypatch, cap, want):
    """TF32 tensor cores from compute capability 8.0 (A100) on, whatever card the suite runs
    on (a strict > sent every A100 call to the IEEE dots, ~20x slower: s42 audit)."""
    from hiertail_fast.ops import _triton_loss

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    assert _triton_loss.tf32_cores(torch.device("cuda")) is want
    assert _triton_loss.tf32_cores(torch.device("cpu")) is True       # the interpreter


@pytest.mark.parametrize("variant", ["exact", "official"])
def test_the_shared_keys_mode_through_the_loss(monkeypatch, triton_device, variant):
    """$HIERTAIL_TRITON_SHARED_LEVELS=1: the hierarchical loss on the Triton engine hands its
    embedding rows (visible in every level) to the kernels as the shared prefix, forward and
    backward, for the exact variant (the official one runs the relative mode instead, which
    the shared-keys mode does not have: _triton_loss); values and gradients against the float64
    reference. A bad value is a ValueError naming the variable; one level never uses the mode."""
    from hiertail_fast.kernels import _utils as u
    from hiertail_fast.kernels import balanced_contrastive_loss as lse_k

    seen = []
    for name in ("lse_forward", "lse_backward"):
        real = getattr(lse_k, name)

        def spy(*args, real=real, name=name, **kw):
            seen.append((name, kw.get("n_common", 0)))
            return real(*args, **kw)

        monkeypatch.setattr(lse_k, name, spy)
    monkeypatch.setenv(u.SHARED_LEVELS_ENV, "1")
    gen = torch.Generator().manual_seed(7)
    z = torch.randn(150, 16, generator=gen) * 0.8
    y = torch.randint(0, 6, (150,), generator=gen)
    labels = [y, y // 2, y // 3]
    protos = [torch.randn(6, 16, generator=gen), torch.randn(3, 16, generator=gen) * 3, None]
    zf = z.to(triton_device, copy=True).requires_grad_()
    pf = [p.to(triton_device, copy=True).requires_grad_() if p is not None else None
          for p in protos]
    loss = hierarchical_contrastive_loss(zf, [lab.to(triton_device) for lab in labels], pf,
                                         temperature=0.2, variant=variant, backend="triton")
    (loss * 2).backward()
    shared = 150 if variant == "exact" else 0
    assert seen == [("lse_forward", shared), ("lse_backward", shared)]
    zr = z.double().requires_grad_()
    pr = [p.double().requires_grad_() if p is not None else None for p in protos]
    total = sum(contrastive_ref(zr, lab, prototypes=p, temperature=0.2, variant=variant)
                for lab, p in zip(labels, pr, strict=True))
    (total * 2).backward()
    t = tol(torch.float32)
    torch.testing.assert_close(loss.double().cpu(), total.detach(), **t)
    torch.testing.assert_close(zf.grad.double().cpu(), zr.grad, **t)
    for a, b in zip(pf[:2], pr[:2], strict=True):
        torch.testing.assert_close(a.grad.double().cpu(), b.grad, **t)
    seen.clear()
    hierarchical_contrastive_loss(zf, [y.to(triton_device)], [pf[0]], temperature=0.2,
                                  variant=variant, backend="triton").backward()
    assert seen == [("lse_forward", 0), ("lse_backward", 0)]
    monkeypatch.setenv(u.SHARED_LEVELS_ENV, "sometimes")
    with pytest.raises(ValueError, match=u.SHARED_LEVELS_ENV):
        hierarchical_contrastive_loss(zf, [lab.to(triton_device) for lab in labels], pf,
                                      temperature=0.2, variant=variant, backend="triton")


def test_tiles_that_compile_to_a_trap_on_blackwell_are_refused_and_pruned(monkeypatch):
    """kernels/_utils.tile_traps (triton 3.6 compiles these fp32 3xTF32 tiles for sm_100 to a
    kernel that only traps, bench/kernel_resources.py): on 10.x with tensor-core fp32 dots,
    BLOCK_M or BLOCK_N of 128 at d_pad 128 and 128 x 128 at d_pad 64; never elsewhere (9.x,
    8.x, bf16, IEEE dots). The fixed tiles avoid them on every arch; an explicit
    $HIERTAIL_TRITON_TILES asking for one there is a ValueError; the autotuner's prune drops
    them and always keeps some config."""
    from types import SimpleNamespace

    from hiertail_fast.kernels import _utils as u

    b200 = (10, 0)
    traps = {(128, 64, 128), (64, 128, 128), (128, 32, 128), (128, 128, 128), (128, 128, 64)}
    fine = {(64, 64, 128), (32, 64, 128), (64, 32, 128), (128, 64, 64), (64, 128, 64),
            (128, 32, 64)}
    for m, n, d_pad in traps:
        assert u.tile_traps(m, n, d_pad, b200, "tf32x3"), (m, n, d_pad)
        for arch, dot in (((9, 0), "tf32x3"), ((12, 0), "tf32x3"), ((11, 0), "tf32x3"),
                          (b200, None), (b200, "ieee"), (None, "tf32x3")):
            assert not u.tile_traps(m, n, d_pad, arch, dot)
    for m, n, d_pad in fine:
        assert not u.tile_traps(m, n, d_pad, b200, "tf32x3"), (m, n, d_pad)
    monkeypatch.delenv(u.TILES_ENV, raising=False)
    for d_pad in (16, 64, 128, 256):
        for arch in ((9, 0), (10, 0), (12, 0), (8, 0)):
            for dot in (None, "ieee", "tf32x3"):
                m, n, _ = u.pair_blocks(10_000, d_pad, True, arch=arch, fp32_dot=dot)
                assert not u.tile_traps(m, n, d_pad, arch, dot), (d_pad, arch, dot)
    monkeypatch.setenv(u.TILES_ENV, "128x64x8")
    with pytest.raises(ValueError, match="only traps"):
        u.pair_blocks(10_000, 128, True, arch=b200, fp32_dot="tf32x3")
    assert u.pair_blocks(10_000, 64, True, arch=b200, fp32_dot="tf32x3") == (128, 64, 8)
    assert u.pair_blocks(10_000, 128, True, arch=(9, 0), fp32_dot="tf32x3") == (128, 64, 8)
    # the autotuner's prune, with a stand-in CUDA tensor of the card
    monkeypatch.setattr(u, "cuda_arch", lambda t: getattr(t, "arch", None))
    configs = u.tune_configs()
    for dtype, dot, d_pad, dropped in (
            (torch.float32, "tf32x3", 128, {(64, 128), (128, 32), (128, 64), (128, 128)}),
            (torch.float32, "tf32x3", 64, {(128, 128)}),
            (torch.float32, "ieee", 128, set()), (torch.bfloat16, "tf32", 128, set())):
        z = SimpleNamespace(dtype=dtype, arch=b200)
        kept = u.prune_trapping(configs, {"Z": z}, D_PAD=d_pad, DOT_PRECISION=dot)
        gone = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in configs if c not in kept}
        assert gone == dropped and kept, (dtype, dot, d_pad)
        z = SimpleNamespace(dtype=dtype, arch=(9, 0))
        assert u.prune_trapping(configs, {"Z": z}, D_PAD=d_pad, DOT_PRECISION=dot) == configs
    # ... and the loss kernels' autotuners use it (built here, never launched on CPU)
    k = _kernels()
    monkeypatch.setattr(k, "_TUNED", {})
    for which in ("fwd", "bwd"):
        assert k._tuned(which).early_config_prune is u.prune_trapping
