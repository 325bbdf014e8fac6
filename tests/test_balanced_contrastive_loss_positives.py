"""Triton kernel of the official variant's positive-pair pass vs a dense float64 computation.

Runs on CUDA when present, else on CPU under TRITON_INTERPRET=1 (conftest's triton_device). The
row max M and its arg-max come from the LSE kernel's NEED_MAX pass, as in the loss engine; the
dense reference uses the float64 max of the same rows (the kernel must reproduce its exact 0 for
the pair (i, arg-max) and for bitwise duplicates of the arg-max row). Tolerance rule as in
test_balanced_contrastive_loss_triton.py: the kernel's error against float64 is at most 2x that
of the same dense computation in the input's dtype, plus tol(dtype).
"""
from __future__ import annotations

import pytest
import torch

from hiertail_fast import hierarchical_contrastive_loss
from hiertail_fast.ops import _loss_passes, _triton_loss
from hiertail_fast.ops._contrastive_pairs import _tie_bound
from hiertail_fast.reference import balanced_contrastive_loss_ref as ref
from tests.conftest import requires_triton, tol

pytestmark = requires_triton
EPS = 1e-7
INF = float("inf")


def _kernels():
    from hiertail_fast.kernels import balanced_contrastive_loss as lse_k
    from hiertail_fast.kernels import balanced_contrastive_loss_positives as pos_k
    return lse_k, pos_k


def make_case(n, d, n_groups, norm, seed=0, outside=0.2, big=0):
    """Clustered rows (norms in [norm/2, norm]: positives near the max, others clamped), group
    ids with some rows outside the level (-1), the first `big` rows in group 0 (a group that
    spans several row blocks), duplicated rows inside and across groups, coefficients with
    zeros."""
    gen = torch.Generator().manual_seed(seed)
    gid = torch.randint(0, n_groups, (n,), generator=gen)
    gid[torch.rand(n, generator=gen) < outside] = -1
    gid[:big] = 0
    centers = torch.randn(n_groups + 1, d, generator=gen)
    z = centers[gid + 1] + 0.3 * torch.randn(n, d, generator=gen)
    z = z / z.norm(dim=1, keepdim=True) * norm * (0.5 + 0.5 * torch.rand(n, 1, generator=gen))
    if n > 12:
        z[n // 2] = z[3]                   # duplicates: a tie in the max at huge logits
        z[n - 1] = z[3]
        gid[n // 2] = gid[3] = max(int(gid[3]), 0)
    coef = torch.randn(n, generator=gen)
    coef[torch.rand(n, generator=gen) < 0.2] = 0.0
    return z, gid, coef


def dense(z, gid, scale, include_self, coef, dtype):
    """T, Q, dz (M held fixed) of the level's positive pairs, all pairs in `dtype`; M is the
    max over the level's rows of the same s (x = 0 exactly at the arg-max and its duplicates)."""
    zz = z.to(dtype)
    s = scale * zz @ zz.T
    inside = gid >= 0
    m = s.masked_fill(~inside[None, :], -INF).max(dim=1).values
    same = (gid[:, None] == gid[None, :]) & inside[:, None]
    if not include_self:
        same.fill_diagonal_(False)
    x = (s - m[:, None]).clamp(max=0.0)
    e = torch.exp(x)
    t = torch.where(same, torch.log(e + EPS), 0.0).sum(1)
    q = torch.where(same, e / (e + EPS), torch.zeros_like(e))
    w = coef.to(dtype)[:, None] * q
    dz = scale * (w + w.T) @ zz
    return t, q.sum(1), dz


def assert_rule(out, exp, low, dtype, what):
    out, exp, low = out.double().cpu(), exp.double(), low.double()
    assert torch.isfinite(out).all(), f"{what}: NaN/inf"
    t = tol(dtype)
    err = (out - exp).abs().max().item()
    bound = 2 * (low - exp).abs().max().item() + t["atol"] + t["rtol"] * exp.abs().max().item()
    assert err <= bound, f"{what}: error {err:.3e} > bound {bound:.3e}"


def run(z, gid, scale, include_self, coef, device, **kw):
    """The kernel on `device` with the row max of the LSE kernel (as the loss engine does)."""
    lse_k, pos_k = _kernels()
    zd, gd = z.to(device), gid.to(device)
    log_w = torch.where(gd >= 0, 0.0, -INF)[None]
    _, rmax, amax = lse_k.lse_forward(zd, log_w, scale, True)
    return pos_k.positive_pairs(zd, gd, int(gid.max()) + 1, rmax[0], amax[0], scale,
                                include_self, None if coef is None else coef.to(device), **kw)


CASES = [  # n, d, groups, scale, norm, big
    (150, 24, 5, 3.0, 2.0, 0),
    (150, 33, 3, 10.0, 5.0, 100),
    (90, 12, 4, 100.0, 30.0, 0),       # |s| up to ~9e4 (tau = 0.01, norms 30)
    (7, 8, 2, 1.0, 1.0, 0),
    # one group over 65 columns: a row block's last column tile holds ONE column on the
    # interpreter's 64 and the GPU's 32 columns (the s72 audit, t02: a loop that stopped one
    # short skipped it, Q 1.0 off)
    (65, 16, 1, 2.0, 1.0, 65),
]


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("n,d,groups,scale,norm,big", CASES)
def test_sums_and_gradient_fp32(n, d, groups, scale, norm, big, include_self, triton_device):
    z, gid, coef = make_case(n, d, groups, norm, big=big)
    exp = dense(z.double(), gid, scale, include_self, coef, torch.float64)
    low = dense(z, gid, scale, include_self, coef, torch.float32)
    big_t, big_q, dz = run(z, gid, scale, include_self, coef, triton_device)
    assert big_t.dtype == big_q.dtype == dz.dtype == torch.float32 and dz.shape == z.shape
    for out, e, lo, what in zip((big_t, big_q, dz), exp, low, ("T", "Q", "dz"), strict=True):
        assert_rule(out, e, lo, torch.float32, what)
    assert (big_t.cpu()[gid < 0] == 0).all() and (dz.cpu()[gid < 0] == 0).all()
    # deterministic (each dz row written by one program), and the backward's call (no sums)
    again = run(z, gid, scale, include_self, coef, triton_device, need_sums=False)
    assert again[0] is None and again[1] is None and torch.equal(again[2], dz)


def test_ties_with_duplicates_are_exact_zeros(triton_device):
    """At |s| ~ 1e4 the pair (i, arg-max) and pairs with bitwise duplicates of the arg-max row
    contribute log(1 + eps) exactly, as in the dense reference (a recomputed s would be off by
    ulps of 1e4, i.e. e off by ~1e-3)."""
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(40, 16, generator=gen)
    z = z / z.norm(dim=1, keepdim=True) * 10.0
    z[20:] = z[0]                                         # 21 copies of one row, one group
    gid = torch.zeros(40, dtype=torch.long)
    gid[1:20] = 1
    big_t, big_q, _ = run(z, gid, 100.0, True, None, triton_device)
    dup = torch.cat([torch.tensor([0]), torch.arange(20, 40)])
    # every duplicate's max is s with a copy: 21 positives at x = 0 exactly, each adding
    # log(1 + eps) in fp32 (1 + 1e-7 rounds to 1 + 2^-23); one x off by an ulp of 1e4 (~1e-3)
    # would add ~-1e-3 instead
    one = torch.log(torch.tensor(1.0, dtype=torch.float32) + EPS).double()
    torch.testing.assert_close(big_t.cpu()[dup].double(), (21 * one).expand(21), rtol=1e-5,
                               atol=1e-9)
    torch.testing.assert_close(big_q.cpu()[dup].double(),
                               torch.full((21,), 21 / (1 + EPS), dtype=torch.float64),
                               rtol=1e-6, atol=0)


def test_consistency_with_a_max_from_another_product(triton_device):
    """M from another product differs from the recomputed scores by rounding. Simulated with an
    M nudged by +-3 ulps of |s| ~ 1e4: pairs with (duplicates of) the arg-max row still get
    x = 0 exactly, a near-duplicate within the rounding bound keeps its own x ~ -0.1 on both
    sides of the gradient, and no x exceeds 0. Expected values: the same rules in float64."""
    _, pos_k = _kernels()
    gen = torch.Generator().manual_seed(6)
    d, scale = 64, 100.0
    a = torch.randn(d, generator=gen)
    a = a / a.norm() * 10.0                                  # s_aa = 1e4
    z = torch.randn(20, d, generator=gen)                    # rows 7..19: group 1, small s
    z[:6] = a                                                # the arg-max row and 5 copies
    z[6] = a * (1 - 1e-5)                                    # near-duplicate: x ~ -0.1
    gid = torch.tensor([0] * 7 + [1] * 13)
    zd, gd = z.to(triton_device), gid.to(triton_device)
    s64 = scale * z.double() @ z.double().T
    same = gid[:, None] == gid[None, :]
    m64, amax = s64.masked_fill(~same, -INF).max(dim=1)      # (the group's max is its max)
    ulp = 2.0 ** -10                                         # of 1e4 in fp32
    nudge = torch.tensor([3, -3] * 10, dtype=torch.float64) * ulp
    m_in = (m64 + nudge).float()
    coef = torch.linspace(-1.0, 1.0, 20)
    big_t, big_q, dz = pos_k.positive_pairs(zd, gd, 2, m_in.to(triton_device),
                                            amax.to(triton_device), scale, True,
                                            coef.to(triton_device))
    # the rules in float64: x = s - M; duplicate of the arg-max within the bound -> 0; x <= 0
    tie = _tie_bound(z, m_in, scale).double()
    x = s64 - m_in.double()[:, None]
    dup = (z[None, :, :] == z[amax][:, None, :]).all(-1)                  # z_j == z_amax_i
    x = torch.where((x > -tie[:, None]) & dup, 0.0, x).clamp(max=0.0)
    e = torch.where(same, torch.exp(x), 0.0)
    q = e / (e + EPS)
    w = coef.double()[:, None] * torch.where(same, q, 0.0)
    exp_dz = scale * (w + w.T) @ z.double()
    assert (x[:6, :6] == 0).all() and (x[:7, 6] < -0.05).all()       # the case is what it says
    torch.testing.assert_close(big_q.cpu().double(), torch.where(same, q, 0.0).sum(1),
                               rtol=0, atol=2e-3)
    torch.testing.assert_close(big_t.cpu().double(),
                               torch.where(same, torch.log(e + EPS), 0.0).sum(1),
                               rtol=0, atol=2e-3)
    err = (dz.cpu().double() - exp_dz).abs().max() / exp_dz.abs().max()
    assert err < 2e-3, f"dz relative error {err:.2e}"


def test_near_duplicates_keep_their_own_scores(triton_device):
    """At |s| ~ 1e6 (d 256, norms 100, tau 0.01) the rounding bound is ~60, so a near-duplicate
    of the arg-max row at x ~ -20 is within it: it keeps its own x (q ~ 0.02) on the row side
    and on the key side of the gradient; only bitwise copies get x = 0 (q ~ 1). An M below
    every score (an exaggerated inconsistency) clamps every x to 0: finite, e = 1."""
    _, pos_k = _kernels()
    gen = torch.Generator().manual_seed(8)
    d, scale = 256, 100.0
    a = torch.randn(d, generator=gen)
    a = a / a.norm() * 100.0                                 # s_aa = 1e6
    z = torch.randn(12, d, generator=gen)
    z[:3] = a
    z[3] = a * (1 - 2e-5)                                    # x = -20 against a
    gid = torch.tensor([0] * 4 + [1] * 8)
    s64 = scale * z.double() @ z.double().T
    same = gid[:, None] == gid[None, :]
    m64, amax = s64.masked_fill(~same, -INF).max(dim=1)
    coef = torch.linspace(0.5, 1.5, 12)
    dev = triton_device
    args = (z.to(dev), gid.to(dev), 2)
    big_t, big_q, dz = pos_k.positive_pairs(*args, m64.float().to(dev), amax.to(dev), scale,
                                            True, coef.to(dev))
    x = (s64 - m64[:, None]).clamp(max=0.0)                  # dups: exactly 0 in float64
    assert (x[:3, :3] == 0).all() and (-21 < x[:4, 3]).all() and (x[:4, 3] < -19).all()
    e = torch.where(same, torch.exp(x), 0.0)
    q = e / (e + EPS)
    # Bitwise copies give bitwise-equal dots (x exactly 0); a near duplicate's x carries the
    # float32 dot's rounding: ~sqrt(d) ulps of |s| = 1e6 (ulp 1/16), so allow |dx| <= 1 (16
    # ulps; the interpreter of triton 3.9 was within 1 ulp, 3.6's 4 ulps off). T and Q grow
    # with x, so each row lies between its sums at x - 1 and x + 1 (a near duplicate given
    # x = 0 moves T by ~16 and Q by ~1 per entry: far outside).
    near = same & (x < 0)

    def sums(dx):
        ex = torch.where(same, torch.exp((x + torch.where(near, dx, 0.0)).clamp(max=0.0)), 0.0)
        return (torch.where(same, torch.log(ex + EPS), 0.0).sum(1),
                (ex / (ex + EPS)).sum(1))
    (t_lo, q_lo), (t_hi, q_hi) = sums(-1.0), sums(1.0)
    got_t, got_q = big_t.cpu().double(), big_q.cpu().double()
    # plus the float32 summation's own rounding: 12 terms, n·u·Σ|term| (Σ|T terms| <= 7·16.2)
    slack_t, slack_q = 12 * 2.0**-24 * t_lo.abs(), 12 * 2.0**-24 * 12
    assert ((t_lo - slack_t <= got_t) & (got_t <= t_hi + slack_t)).all(), (got_t, t_lo, t_hi)
    assert ((q_lo - slack_q <= got_q) & (got_q <= q_hi + slack_q)).all(), (got_q, q_lo, q_hi)
    assert (t_hi - t_lo).max() < 0.2 and (q_hi - q_lo).max() < 0.2   # the band stays narrow
    w = coef.double()[:, None] * q
    exp_dz = scale * (w + w.T) @ z.double()
    err = (dz.cpu().double() - exp_dz).abs().max() / exp_dz.abs().max()
    assert err < 1e-2, f"dz relative error {err:.2e}"
    # an M 100 below the scores: x would be +100 (exp overflows fp32); clamped to 0
    low_m = (m64 - 100.0).float().to(dev)
    big_t, big_q, dz = pos_k.positive_pairs(*args, low_m, amax.to(dev), scale, True,
                                            coef.to(dev))
    assert torch.isfinite(dz).all()
    x = (s64 - m64[:, None] + 100.0).clamp(max=0.0)
    assert (x[:4, :4] == 0).all()                            # group 0: every pair clamped
    e = torch.where(same, torch.exp(x), 0.0)
    torch.testing.assert_close(big_q.cpu().double(), (e / (e + EPS)).sum(1), rtol=0, atol=5e-3)
    one = float(torch.log(torch.tensor(1.0, dtype=torch.float32) + EPS))
    torch.testing.assert_close(big_t.cpu().double()[:4], torch.full((4,), 4 * one,
                                                                    dtype=torch.float64),
                               rtol=1e-5, atol=1e-9)


def _record_dots(monkeypatch, pos_k) -> list:
    """The (DOT_PRECISION, GRAD_DOT_PRECISION) of every positives launch from now on (the
    interpreter ignores the precision, so the launch's constants are what a CPU can check)."""
    launched = []
    real_launch = pos_k.launch_fitting

    def spy(run_, tiles, what, z_, meta):
        launched.append((meta["DOT_PRECISION"], meta["GRAD_DOT_PRECISION"]))
        return real_launch(run_, tiles, what, z_, meta)

    monkeypatch.setattr(pos_k, "launch_fitting", spy)
    return launched


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs(dtype, triton_device, monkeypatch):
    """16-bit rows: the sums and gradient to fp32's rule against the float64 sums of the same
    rounded inputs. The gradient's dots (fp32 weights times the rows) stay IEEE even when fp32
    dots are asked to be 3xTF32 (TF32 would round the weights to 10 bits on a GPU; the
    interpreter ignores the precision, so the launch's constant is what is checked here)."""
    _, pos_k = _kernels()
    launched = _record_dots(monkeypatch, pos_k)
    z, gid, coef = make_case(130, 40, 4, 8.0)
    zl = z.to(dtype)
    exp = dense(zl.double(), gid, 10.0, True, coef, torch.float64)     # same rounded inputs
    low = dense(zl.float(), gid, 10.0, True, coef, torch.float32)
    outs = run(zl, gid, 10.0, True, coef, triton_device, fp32_dot="tf32x3")
    assert launched and {grad_dot for _, grad_dot in launched} == {"ieee"}
    for out, e, lo, what in zip(outs, exp, low, ("T", "Q", "dz"), strict=True):
        assert out.dtype == torch.float32
        assert_rule(out, e, lo, torch.float32, what)


def test_no_row_in_the_level_and_empty(triton_device):
    _, pos_k = _kernels()
    z = torch.randn(9, 8).to(triton_device)
    gid = torch.full((9,), -1, dtype=torch.long, device=triton_device)
    rmax = torch.full((9,), -INF, device=triton_device)
    amax = torch.zeros(9, dtype=torch.long, device=triton_device)
    big_t, big_q, dz = pos_k.positive_pairs(z, gid, 0, rmax, amax, 2.0, True,
                                            torch.ones(9, device=triton_device))
    assert not big_t.any() and not big_q.any() and not dz.any()
    e = torch.empty(0, 8, device=triton_device)
    idx = torch.empty(0, dtype=torch.long, device=triton_device)
    out = pos_k.positive_pairs(e, idx, 0, idx.float(), idx, 2.0, True)
    assert out[0].shape == (0,) and out[2] is None


def test_bad_input(triton_device):
    _, pos_k = _kernels()
    z = torch.randn(6, 4).to(triton_device)
    gid = torch.zeros(6, dtype=torch.long, device=triton_device)
    m = torch.zeros(6, device=triton_device)
    with pytest.raises(TypeError, match="float32/float16/bfloat16"):
        pos_k.positive_pairs(z.double(), gid, 1, m, gid, 1.0, True)
    with pytest.raises(ValueError, match="row_max must have shape"):
        pos_k.positive_pairs(z, gid, 1, m[:5], gid, 1.0, True)
    with pytest.raises(ValueError, match="fp32_dot"):
        pos_k.positive_pairs(z, gid, 1, m, gid, 1.0, True, fp32_dot="tf32")
    with pytest.raises(ValueError, match="d <= 256"):
        pos_k.positive_pairs(torch.zeros(6, 257, device=triton_device), gid, 1, m, gid, 1.0,
                             True)
    with pytest.raises(TypeError, match="2-D"):
        pos_k.positive_pairs(z[0], gid, 1, m, gid, 1.0, True)
    # an input on another device than z (meta stands in for one): named, not an error from
    # inside torch or none at all (the s72 audit, t15: arg_max on another device ran)
    for name, args in (("gid", (gid.to("meta"), 1, m, gid)),
                       ("row_max", (gid, 1, m.to("meta"), gid)),
                       ("arg_max", (gid, 1, m, gid.to("meta")))):
        with pytest.raises(ValueError, match=f"{name} is on meta"):
            pos_k.positive_pairs(z, *args, 1.0, True, torch.ones(6, device=triton_device))


def test_views_and_the_dots_asked_for(triton_device, monkeypatch):
    """z as a strided view gives what its contiguous copy gives (the kernel reads rows at
    stride 1; s72, t10: without the launcher's .contiguous() T, Q, dz were 5-36 off), and fp32
    rows are multiplied with the dots asked for, the scores' and the gradient's alike (s72,
    t13/t14: either left IEEE passed; the interpreter ignores the precision, so the launch's
    constants are what is checked)."""
    _, pos_k = _kernels()
    launched = _record_dots(monkeypatch, pos_k)
    z, gid, coef = make_case(40, 32, 3, 2.0)
    view = z.to(triton_device)[:, ::2]                 # a view on the kernels' device
    assert not view.is_contiguous()
    want = run(view.contiguous(), gid, 2.0, True, coef, triton_device)
    got = run(view, gid, 2.0, True, coef, triton_device)
    for out, exp, what in zip(got, want, ("T", "Q", "dz"), strict=True):
        assert torch.equal(out, exp), what
    for dot in ("ieee", "tf32x3"):
        launched.clear()
        run(z, gid, 2.0, True, coef, triton_device, fp32_dot=dot)
        assert launched == [(dot, dot)], (dot, launched)


def test_row_ids():
    _, pos_k = _kernels()
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(500, 64, generator=gen)
    z[7] = z[3]
    z[9] = 0.0
    z[10] = -0.0                            # equal values, different bits: the same id
    ids = pos_k.row_ids(z)
    assert ids[7] == ids[3] and ids[9] == ids[10]
    assert torch.unique(ids).numel() == 500 - 2
    assert torch.equal(pos_k.row_ids(z.to(torch.bfloat16)), pos_k.row_ids(z.to(torch.bfloat16)))


@pytest.mark.parametrize("include_self", [True, False])
def test_the_triton_engine_runs_its_own_positives(monkeypatch, triton_device, include_self):
    """The official loss on the Triton engine takes its positives from this kernel (the torch
    pass is never called), forward and backward, over nested levels; values and gradients
    against the float64 reference."""
    calls = []
    real = _triton_loss.positive_pairs

    def spy(*args, **kw):
        calls.append(kw["need_sums"])
        return real(*args, **kw)

    def torch_pass(*args, **kw):
        raise AssertionError("the torch positive pass ran on the Triton engine")

    monkeypatch.setattr(_triton_loss, "positive_pairs", spy)
    monkeypatch.setattr(_loss_passes, "positive_pairs", torch_pass)
    gen = torch.Generator().manual_seed(4)
    z = torch.randn(80, 16, generator=gen) * 0.8
    y = torch.randint(0, 6, (80,), generator=gen)
    labels, protos = [y, y // 2], [torch.randn(6, 16, generator=gen), None]
    zf = z.to(triton_device, copy=True).requires_grad_()
    pf = [p.to(triton_device, copy=True).requires_grad_() if p is not None else None
          for p in protos]
    loss = hierarchical_contrastive_loss(zf, [lab.to(triton_device) for lab in labels], pf,
                                         temperature=0.2, variant="official",
                                         include_self=include_self, backend="triton")
    (loss * 2).backward()
    assert calls == [True, True, False, False]       # two levels: forward sums, backward dz
    zr = z.double().requires_grad_()
    pr = [p.double().requires_grad_() if p is not None else None for p in protos]
    total = sum(ref(zr, lab, prototypes=p, temperature=0.2, variant="official",
                    include_self=include_self) for lab, p in zip(labels, pr, strict=True))
    (total * 2).backward()
    t = tol(torch.float32)
    torch.testing.assert_close(loss.double().cpu(), total.detach(), **t)
    torch.testing.assert_close(zf.grad.double().cpu(), zr.grad, **t)
    torch.testing.assert_close(pf[0].grad.double().cpu(), pr[0].grad, **t)



@pytest.mark.parametrize("backend", ["torch", "attention"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_other_engines_on_request(monkeypatch, triton_device, backend, reduction):
    """$HIERTAIL_POSITIVES=triton: the torch and attention engines take their official
    positives from this kernel too (forward with the gradient for scalar reductions, forward
    sums + backward dz for "none"), fp32 rows only: float64 keeps the torch pass."""
    from hiertail_fast import balanced_contrastive_loss
    from hiertail_fast.ops import _positive_blocks

    calls, torch_calls = [], []
    real, real_torch = _triton_loss.positive_pairs, _loss_passes.positive_pairs

    def spy(*args, **kw):
        calls.append(kw["need_sums"])
        return real(*args, **kw)

    def torch_spy(*args, **kw):
        torch_calls.append(1)
        return real_torch(*args, **kw)

    monkeypatch.setattr(_triton_loss, "positive_pairs", spy)
    monkeypatch.setattr(_loss_passes, "positive_pairs", torch_spy)
    gen = torch.Generator().manual_seed(9)
    z = torch.randn(90, 12, generator=gen)
    y = torch.randint(0, 5, (90,), generator=gen)
    p = torch.randn(5, 12, generator=gen)
    w = torch.linspace(-1.0, 2.0, 95) if reduction == "none" else torch.tensor(2.0)

    def run(dtype, plan):
        monkeypatch.setenv(_positive_blocks.POSITIVES_ENV, plan)
        zf = z.to(triton_device, dtype, copy=True).requires_grad_()
        pf = p.to(triton_device, dtype, copy=True).requires_grad_()
        loss = balanced_contrastive_loss(zf, y.to(triton_device), prototypes=pf,
                                         temperature=0.2, variant="official",
                                         reduction=reduction, backend=backend)
        (loss * w.to(loss.device, loss.dtype)).sum().backward()
        return [t.detach().double().cpu() for t in (loss, zf.grad, pf.grad)]

    zr, pr = z.double().requires_grad_(), p.double().requires_grad_()
    want = ref(zr, y, prototypes=pr, temperature=0.2, variant="official", reduction=reduction)
    (want * w.double()).sum().backward()
    for dtype in (torch.float32, torch.float64):
        calls.clear()
        torch_calls.clear()
        got = run(dtype, "triton")
        if dtype == torch.float32:
            # "none": the forward's sums, then the backward's fused pass (sums and dz at once)
            assert calls == ([True, True] if reduction == "none" else [True])
            assert not torch_calls
        else:
            assert not calls
        # the engine's own error (the attention kernels' fp32 LSE is the larger part) with
        # its default positives, doubled, plus tol: the kernel's positives add nothing above it
        default = run(dtype, "")
        t = tol(dtype)
        for a, b, e in zip(got, default, (want.detach(), zr.grad, pr.grad), strict=True):
            bound = 2 * (b - e).abs().max() + t["atol"] + t["rtol"] * e.abs().max()
            assert (a - e).abs().max() <= bound
    monkeypatch.setenv(_positive_blocks.POSITIVES_ENV, "quick")
    with pytest.raises(ValueError, match="'triton'"):
        balanced_contrastive_loss(z.to(triton_device), y.to(triton_device), temperature=0.2,
                                  variant="official", backend=backend)


def test_the_request_without_a_triton_device_is_a_clear_error(monkeypatch):
    """$HIERTAIL_POSITIVES=triton on CPU tensors outside the interpreter: a ValueError naming
    the variable, not a driver error from inside triton."""
    from hiertail_fast import balanced_contrastive_loss
    from hiertail_fast.ops import _positive_blocks

    monkeypatch.setenv(_positive_blocks.POSITIVES_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    z, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    with pytest.raises(ValueError, match="HIERTAIL_POSITIVES=triton cannot run here: the triton "
                                         "backend needs CUDA"):
        balanced_contrastive_loss(z, y, variant="official", backend="torch")
    # the exact variant has no positive pairs to compute: unaffected, its gradient too (the
    # fused pass asked for the Triton positives of any variant: a mutation pass, session 73)
    z.requires_grad_(True)
    balanced_contrastive_loss(z, y, variant="exact", backend="torch").backward()
    assert torch.isfinite(z.grad).all()
