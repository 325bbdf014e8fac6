"""The attention adapter (hiertail_fast/ops/_attention_lse.py) on CPU: PyTorch's flash-attention
kernel as the loss's LSE engine. Its math (bias as a stride-0 view, the forward-only gradient
identity, levels as heads, the row max pass), its guard and its fallbacks, against dense float64.
On a CUDA machine the same tests also run the memory-efficient kernel (device fixture)."""
from __future__ import annotations

import pytest
import torch

import hiertail_fast.ops._attention_lse as attn
import hiertail_fast.ops.balanced_contrastive_loss as ops_mod
from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss
from hiertail_fast.reference import balanced_contrastive_loss_ref as ref
from tests.conftest import recorded_first_arg_shapes

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not attn.available("cpu"), reason="no CPU flash-attention op in torch"),
]
INF = float("inf")


def _case(n, d, levels, seed=0, norm=2.0, hide=0.3):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d, generator=gen) * norm / d ** 0.5
    log_w = -torch.rand(levels, n, generator=gen) * 3
    log_w[torch.rand(levels, n, generator=gen) < hide] = -INF
    log_w[:, 0] = 0.0
    g = torch.randn(levels, n, generator=gen)
    g[torch.rand(levels, n, generator=gen) < 0.2] = 0.0                # zero coefficients
    return z, log_w, g


def _dense(z, log_w, scale, g):
    """lse [L, N] and dz of sum g * lse in float64 autograd (all-hidden level: lse -inf)."""
    zz = z.double().requires_grad_()
    s = scale * zz @ zz.T
    lses, total = [], 0.0
    for lw, gl in zip(log_w.double(), g.double(), strict=True):
        if torch.isfinite(lw).any():
            lse = torch.logsumexp(s + lw[None, :], dim=1)
            total = total + (gl * lse).sum()
        else:
            lse = torch.full((z.shape[0],), -INF, dtype=torch.float64)
        lses.append(lse.detach())
    total.backward()
    return torch.stack(lses), zz.grad


@pytest.mark.parametrize("n, d, levels", [(1, 3, 1), (37, 8, 1), (130, 20, 3), (77, 64, 2)])
def test_lse_and_gradient_match_dense_float64(device, n, d, levels):
    z, log_w, g = _case(n, d, levels)
    lse_e, dz_e = _dense(z, log_w, 1.7, g)
    z, log_w, g = z.to(device), log_w.to(device), g.to(device)
    lse, rowmax, argmax = attn.lse_forward(z, log_w, 1.7, need_max=False)
    assert rowmax is None and argmax is None and lse.dtype == torch.float64
    torch.testing.assert_close(lse.cpu(), lse_e, rtol=1e-5, atol=1e-5)
    dz = attn.lse_backward(z, log_w, lse, g, 1.7)
    torch.testing.assert_close(dz.cpu().double(), dz_e, rtol=1e-4, atol=1e-5)
    lse2, _, _, dz2 = attn.lse_fused(z, log_w, 1.7, False, lambda rows, lse_b, mx: g[:, rows])
    torch.testing.assert_close(lse2, lse)
    torch.testing.assert_close(dz2, dz)


def test_level_with_no_visible_key_and_head_groups(monkeypatch):
    """A level whose keys are all hidden: lse -inf, no gradient, no NaN; more levels than
    MAX_HEADS run in head groups with the same result."""
    z, log_w, g = _case(50, 6, 5, seed=3)
    log_w[2] = -INF
    lse_e, dz_e = _dense(z, log_w, 0.9, g)
    lse, _, _ = attn.lse_forward(z, log_w, 0.9, need_max=False)
    assert torch.isneginf(lse[2]).all()
    torch.testing.assert_close(lse, lse_e, rtol=1e-5, atol=1e-5)
    dz = attn.lse_backward(z, log_w, lse, g, 0.9)
    monkeypatch.setattr(attn, "MAX_HEADS", 2)
    dz_grouped = attn.lse_backward(z, log_w, lse, g, 0.9)
    assert torch.isfinite(dz).all()
    torch.testing.assert_close(dz.double(), dz_e, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dz_grouped, dz, rtol=1e-5, atol=1e-6)


def test_row_max_visible_keys_first_index_on_ties():
    z = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    log_w = torch.zeros(2, 4)
    log_w[1, 0] = -INF                                   # level 1 hides key 0
    rowmax, argmax = attn._row_max(z, log_w, 2.0)
    assert argmax[0].tolist() == [0, 0, 2, 0]            # rows 0, 1, 3 tie on keys 0, 1, 3
    assert argmax[1].tolist() == [1, 1, 2, 1]
    torch.testing.assert_close(rowmax[0], torch.tensor([2.0, 2.0, 2.0, 2.0]))


@pytest.mark.parametrize("pattern", ["all", "prefix", "none_common", "gap", "empty_level"])
@pytest.mark.parametrize("n,seed", [(37, 0), (37, 1), (37, 2), (300, 3)])
def test_row_max_shared_over_common_keys_equals_a_masked_max_per_level(pattern, n, seed,
                                                                      monkeypatch):
    """The common keys' max is taken once for all levels, the rest keys per level: the values
    and FIRST arg-max of a masked max per level, bit for bit, whatever the visibility (a
    common prefix, none, a hidden key inside the prefix, a level that sees no rest key),
    with ties between common and rest keys (integer rows: many equal dots), across blocks
    (n 300: the CPU's chunked arg-max over a column view of the block)."""
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(4 * n * 5))    # 5-row blocks
    g = torch.Generator().manual_seed(seed)
    n_levels, cut = 3, n * 2 // 3
    z = torch.randint(-2, 3, (n, 4), generator=g).float()
    copies = torch.randint(0, cut, (n - cut - 5,), generator=g)
    z[cut + 5:] = z[copies]                                   # rest keys tying common ones
    log_w = torch.zeros(n_levels, n)
    if pattern != "all":
        vis = torch.rand(n_levels, n, generator=g) < 0.5
        vis[:, :cut] = True
        if pattern == "none_common":
            vis[1, 0] = False
        if pattern == "gap":
            vis[2, cut // 2] = False
        if pattern == "empty_level":
            vis[0, cut:] = False
        log_w[~vis] = -INF
    rowmax, argmax = attn._row_max(z, log_w, 0.5)
    s = 0.5 * (z @ z.t())
    for lev in range(n_levels):
        want = s.masked_fill(~torch.isfinite(log_w[lev])[None, :], -INF).max(dim=1)
        assert torch.equal(rowmax[lev], want.values)
        assert torch.equal(argmax[lev], want.indices), (lev, argmax[lev], want.indices)


def test_bias_is_an_aligned_stride0_view():
    rows = torch.randn(3, 21)
    b = attn._bias(rows, 21)
    assert b.shape == (1, 3, 21, 21)
    assert b.stride(2) == 0 and b.stride(3) == 1 and b.stride(1) % attn.BIAS_ALIGN == 0
    torch.testing.assert_close(b[0, :, 5, :], rows)
    # the memory-efficient kernel reads the bias 16 bytes at a time: the constant itself
    # (the stride check above moves with it; a second mutation audit set it to 8)
    assert attn.BIAS_ALIGN == 16


def test_version_check_and_missing_op(monkeypatch):
    assert attn.supported((2, 11)) and attn.supported((3, 0))
    assert not attn.supported((2, 3))
    attn._op.cache_clear()
    monkeypatch.setattr(attn, "MIN_TORCH", (99, 0))
    try:
        assert not attn.available("cpu")
        z = torch.randn(10, 4)
        with pytest.raises(ValueError, match="attention backend needs torch"):
            balanced_contrastive_loss(z, torch.zeros(10, dtype=torch.long), backend="attention")
    finally:
        monkeypatch.undo()
        attn._op.cache_clear()
    assert attn.available("cpu")


def _close(a, e, rtol=1e-4, atol=1e-5):
    """Max error within atol + rtol * max|e| (fp32 tolerance relative to the tensor's size, as
    tests/test_balanced_contrastive_loss.py's _check: entries near 0 are sums of cancelling
    terms the size of the largest entries)."""
    err = (a.double() - e.double()).abs().max().item()
    assert err <= atol + rtol * e.abs().max().item(), f"error {err:.3g}"


def _spy(monkeypatch):
    return recorded_first_arg_shapes(monkeypatch, attn, "_call")


def _loss_grads(z, y, p, **kw):
    z = z.clone().requires_grad_()
    p = p.clone().requires_grad_() if p is not None else None
    loss = balanced_contrastive_loss(z, y, prototypes=p, **kw)
    (loss * 3).backward()
    return loss.detach(), z.grad, p.grad if p is not None else None


@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_public_loss_runs_on_attention_and_matches_reference(monkeypatch, variant, include_self,
                                                             reduction):
    gen = torch.Generator().manual_seed(1)
    # (a logit bound of ~40, inside the official guard's rows rule: 127 rows x 0.5)
    z = torch.randn(120, 16, generator=gen) * 0.75
    p = torch.randn(7, 16, generator=gen) * 0.75
    y = torch.randint(0, 7, (120,), generator=gen)
    y[:2] = torch.tensor([50, 51])                                   # singleton classes
    calls = _spy(monkeypatch)
    kw = dict(temperature=0.5, variant=variant, include_self=include_self, reduction=reduction)
    got = _loss_grads(z, y, p, backend="attention", **kw) if reduction == "mean" else None
    if reduction == "none":
        zz = z.clone().requires_grad_()
        loss = balanced_contrastive_loss(zz, y, prototypes=p, backend="attention", **kw)
        (loss * torch.linspace(-1, 2, loss.numel())).sum().backward()
        zr = z.double().requires_grad_()
        lr = ref(zr, y, prototypes=p.double(), **kw)
        (lr * torch.linspace(-1, 2, lr.numel()).double()).sum().backward()
        _close(loss.detach(), lr.detach())
        _close(zz.grad, zr.grad)
    else:
        exp = _loss_grads(z.double(), y, p.double(), backend="reference", **kw)
        for a, e in zip(got, exp, strict=True):
            _close(a, e)
    assert calls, "the attention kernels were not used"


def test_hierarchical_on_attention_equals_sum_of_levels(monkeypatch):
    gen = torch.Generator().manual_seed(2)
    z = torch.randn(90, 12, generator=gen)
    ys = [torch.randint(0, 5, (90,), generator=gen), torch.randint(0, 3, (90,), generator=gen)]
    ps = [torch.randn(5, 12, generator=gen), None]
    calls = _spy(monkeypatch)
    zz = z.clone().requires_grad_()
    hierarchical_contrastive_loss(zz, ys, ps, temperature=0.7, backend="attention").backward()
    assert calls
    zr = z.double().requires_grad_()
    total = sum(ref(zr, y, prototypes=None if p is None else p.double(), temperature=0.7)
                for y, p in zip(ys, ps, strict=True))
    total.backward()
    torch.testing.assert_close(zz.grad.double(), zr.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("variant", ["exact", "official"])
def test_large_logits_go_to_the_exact_engine(monkeypatch, variant):
    """Above _attention_lse.MAX_LOGIT[variant] the fp32 LSE of the kernels is not precise
    enough: the call runs on our engine (still correct), and the kernels are not called."""
    z = torch.randn(60, 8)
    z = z / z.norm(dim=1, keepdim=True) * 40.0                  # |s| up to 1600 / 0.5 = 3200
    y = torch.randint(0, 4, (60,))
    calls = _spy(monkeypatch)
    got = _loss_grads(z, y, None, temperature=0.5, backend="attention", variant=variant)
    exp = _loss_grads(z.double(), y, None, temperature=0.5, backend="reference",
                      variant=variant)
    assert not calls
    for a, e in zip(got[:2], exp[:2], strict=True):
        torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-4)


def test_guard_depends_on_the_variant(monkeypatch):
    """A bound between the two limits (here 800): the exact variant stays on the kernels (its
    error there is measured ~1e-5, bench/attention_guard.py), the official one goes to our
    engine; both match the float64 reference. (820 rows: the exact variant's rows rule,
    max(64, N), lets 800 through from 800 rows.)"""
    assert attn.MAX_LOGIT["official"] < 800 <= attn.MAX_LOGIT["exact"]
    z = torch.randn(820, 8)
    z = z / z.norm(dim=1, keepdim=True) * 20.0                  # bound 400 / 0.5 = 800
    y = torch.randint(0, 4, (820,))
    for variant, runs_kernels in (("exact", True), ("official", False)):
        calls = _spy(monkeypatch)
        got = _loss_grads(z, y, None, temperature=0.5, backend="attention", variant=variant)
        exp = _loss_grads(z.double(), y, None, temperature=0.5, backend="reference",
                          variant=variant)
        assert bool(calls) == runs_kernels, variant
        for a, e in zip(got[:2], exp[:2], strict=True):
            torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-4)


def test_official_limit_scales_with_the_rows(monkeypatch):
    """Official variant: the limit is also OFFICIAL_LOGIT_PER_ROW x the rows (prototypes
    included), so a small problem inside MAX_LOGIT runs our engine where its bound is over that
    (bench/official_small_n.py: 31 rows at 256 were 2.8x the tests' rule on the kernels) and
    the kernels where it is under; the exact variant's own rows rule (max(64, N)) lets these
    bounds (at most 17) through."""
    per_row = attn.OFFICIAL_LOGIT_PER_ROW
    gen = torch.Generator().manual_seed(6)
    z = torch.randn(25, 8, generator=gen)
    z = z / z.norm(dim=1, keepdim=True)
    p = torch.randn(6, 8, generator=gen)
    p = p / p.norm(dim=1, keepdim=True) * 0.5
    y = torch.randint(0, 6, (25,), generator=gen)
    rows = 31
    for bound, runs_kernels in ((0.9 * per_row * rows, True), (1.1 * per_row * rows, False)):
        assert bound < attn.MAX_LOGIT["official"]
        zb = z * (bound * 0.5) ** 0.5                               # temperature 0.5: scale 2
        assert attn.within_precision(torch.cat([zb, p]), 2.0, "official") == runs_kernels
        assert attn.within_precision(torch.cat([zb, p]), 2.0, "exact")
        calls = _spy(monkeypatch)
        got = _loss_grads(zb, y, p, temperature=0.5, backend="attention", variant="official")
        assert bool(calls) == runs_kernels, bound
        exp = _loss_grads(zb.double(), y, p.double(), temperature=0.5, backend="reference",
                          variant="official")
        for a, e in zip(got, exp, strict=True):
            torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-5)


def test_exact_limit_scales_with_the_rows(monkeypatch):
    """Exact variant: below 1,024 rows the limit is also max(EXACT_MIN_LOGIT,
    EXACT_LOGIT_PER_ROW x the rows) (prototypes included), so a small problem inside MAX_LOGIT
    runs our engine where its bound is over that, the kernels where it is under; the bf16
    kernels keep their own limit (their gradient comes back rounded to bf16)."""
    floor, per_row = attn.EXACT_MIN_LOGIT, attn.EXACT_LOGIT_PER_ROW
    assert attn.rows_limit("exact", torch.float32, 10) == floor
    assert attn.rows_limit("exact", torch.float32, 300) == 300 * per_row
    assert attn.rows_limit("exact", torch.float32, 5000) == attn.MAX_LOGIT["exact"]
    assert attn.rows_limit("exact", torch.float16, 300) == 300 * per_row
    assert attn.rows_limit("exact", torch.bfloat16, 300) == attn.MAX_LOGIT_BF16["exact"]
    assert attn.rows_limit("official", torch.float32, 300) == min(
        attn.MAX_LOGIT["official"], attn.OFFICIAL_LOGIT_PER_ROW * 300)
    gen = torch.Generator().manual_seed(7)
    for n_z, m in ((20, 0), (170, 30)):
        rows = n_z + m
        limit = max(floor, per_row * rows)
        z = torch.randn(n_z, 8, generator=gen)
        z = z / z.norm(dim=1, keepdim=True)
        p = torch.randn(m, 8, generator=gen) * 0.1 if m else None
        y = torch.randint(0, max(m, 4), (n_z,), generator=gen)
        for bound, runs_kernels in ((0.9 * limit, True), (1.1 * limit, False)):
            zb = z * (bound * 0.5) ** 0.5                           # temperature 0.5: scale 2
            rows_all = zb if p is None else torch.cat([zb, p])
            assert attn.within_precision(rows_all, 2.0, "exact") == runs_kernels, (rows, bound)
            calls = _spy(monkeypatch)
            got = _loss_grads(zb, y, p, temperature=0.5, backend="attention", variant="exact")
            assert bool(calls) == runs_kernels, (rows, bound)
            exp = _loss_grads(zb.double(), y, None if p is None else p.double(),
                              temperature=0.5, backend="reference", variant="exact")
            for a, e in zip(got, exp, strict=True):
                if e is not None:
                    torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-5)


def test_bf16_kernels_have_their_own_limits(monkeypatch):
    """Exact variant, a bound between the fp32 and the bf16 limits: on the bf16 kernels (CUDA
    flash, emulated here) bf16 inputs stay on the kernels (their gradient comes back rounded to
    bf16, 2^-9, above the kernels' error there: bench/attention_guard.py --dtype bfloat16),
    fp32 and float16 inputs go to our engine; the bf16 result matches the float64 reference on
    the same bf16 inputs to that rounding. The official variant never runs the bf16 kernels
    (limit 0: flash's bf16 output O is amplified by the official gradient's cancellation), even
    at a small bound."""
    f32, b16 = attn.max_logit("exact", torch.float32), attn.max_logit("exact", torch.bfloat16)
    assert f32 < b16 and attn.max_logit("exact", torch.float16) == f32
    assert attn.max_logit("official", torch.bfloat16) == 0.0
    _emulate_cuda(monkeypatch, attn._FLASH_OP, _fake_flash([]))
    gen = torch.Generator().manual_seed(4)
    z = torch.randn(60, 8, generator=gen).relu() + 0.05
    z = z / z.norm(dim=1, keepdim=True) * (0.5 * (f32 + b16) * 0.5) ** 0.5   # temperature 0.5
    y = torch.randint(0, 4, (60,), generator=gen)
    zb = z.bfloat16()
    assert attn.kernel_dtype(zb) == torch.bfloat16
    assert attn.within_precision(zb, 2.0, "exact") and not attn.within_precision(z, 2.0, "exact")
    for dtype, runs_kernels in ((torch.float32, False), (torch.float16, False),
                                (torch.bfloat16, True)):
        calls = _spy(monkeypatch)
        got = _loss_grads(zb.to(dtype), y, None, temperature=0.5, backend="attention")
        assert bool(calls) == runs_kernels, dtype
    exp = _loss_grads(zb.double(), y, None, temperature=0.5, backend="reference")
    torch.testing.assert_close(got[0].double(), exp[0], rtol=1e-4, atol=1e-4)
    assert float((got[1].double() - exp[1]).abs().max() / exp[1].abs().max()) < 4e-3
    calls = _spy(monkeypatch)
    small = (zb.float() / 8).bfloat16()
    got = _loss_grads(small, y, None, temperature=0.5, backend="attention", variant="official")
    exp = _loss_grads(small.double(), y, None, temperature=0.5, backend="reference",
                      variant="official")
    assert not calls
    assert float((got[1].double() - exp[1]).abs().max() / exp[1].abs().max()) < 4e-3


def test_bf16_rows_on_the_fp32_kernel_take_the_fp32_limits(monkeypatch):
    """bf16 rows on CPU run the fp32 kernel (``kernel_dtype``), whose fp32 LSE is the fp32
    engine's: the guard gives them the fp32 limits and rows rules, not the bf16 kernels'. A
    fuzzing find (2026-12-05, ``bench/official_fuzz.py --dtype bfloat16 --variant exact
    --engines attention``, seed 62): keyed on the rows' dtype, 2 rows in classes of their own
    (include_self: each row's own key takes its softmax, p_ii - 1 cancels) at B 1e3-1e4 stayed
    on the kernel, whose p_ii carries ~B 2^-24 of the cancelling terms: up to 55x the tests'
    rule; this case on the kernel is 6.1x the 32 fp32 ulp of the terms below, where our
    engine, the fp32 rows' engine at that bound, is exact. On CUDA bf16 rows take the flash
    branch and its own limits (the test above)."""
    gen = torch.Generator().manual_seed(7)
    n, d, tau, bound = 2, 16, 0.1, 2000.0
    z = torch.randn(n, d, generator=gen, dtype=torch.float64)
    zb = (z / z.norm(dim=1, keepdim=True) * (bound * tau) ** 0.5).bfloat16()
    y = torch.arange(n)
    assert attn.kernel_dtype(zb) == torch.float32
    assert not attn.within_precision(zb, 1 / tau, "exact")
    assert attn.within_precision(zb, 1 / tau, "exact") == attn.within_precision(
        zb.float(), 1 / tau, "exact")
    calls = _spy(monkeypatch)
    got = _loss_grads(zb, y, None, temperature=tau, include_self=True, backend="attention")
    assert not calls                                    # our engine, as for the fp32 rows
    exp = _loss_grads(zb.double(), y, None, temperature=tau, include_self=True,
                      backend="reference")
    terms = (3 * 2 / n) * zb.double().abs().max() * d ** 0.5 / tau   # (loss * 3), mean
    assert float((got[1].double() - exp[1]).abs().max() / terms) <= 32 * 2 ** -24
    small = (zb.float() * (50.0 / bound) ** 0.5).bfloat16()           # B 50: the kernel
    calls = _spy(monkeypatch)
    _loss_grads(small, y, None, temperature=tau, include_self=True, backend="attention")
    assert calls


def test_kernel_refusal_falls_back(monkeypatch):
    def refuse(*a, **k):
        raise attn.AttentionUnavailable("test: refused")

    monkeypatch.setattr(attn, "_call", refuse)
    z, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    got = _loss_grads(z, y, None, temperature=0.3, backend="attention")
    exp = _loss_grads(z.double(), y, None, temperature=0.3, backend="reference")
    for a, e in zip(got[:2], exp[:2], strict=True):
        torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-6)


def test_float64_never_downgraded(monkeypatch):
    """float64 requests on the fp32 kernels run our float64 engine instead (no silent fp32)."""
    calls = _spy(monkeypatch)
    z, y = torch.randn(30, 5, dtype=torch.float64), torch.randint(0, 3, (30,))
    assert ops_mod.choose_loss_backend(z, "attention", "exact") == "torch"
    got = balanced_contrastive_loss(z, y, temperature=0.2, backend="attention")
    exp = ref(z, y, temperature=0.2)
    assert not calls and got.dtype == torch.float64
    torch.testing.assert_close(got, exp, rtol=1e-12, atol=1e-12)


def test_unknown_loss_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="backend='flash' is not one of"):
        balanced_contrastive_loss(torch.randn(4, 2), torch.zeros(4, dtype=torch.long),
                                  backend="flash")


def _emulate_cuda(monkeypatch, op_name, fake):
    """Route the adapter's CUDA branch to `fake` in place of the aten op `op_name` (CPU tensors;
    every other op stays the real one)."""
    monkeypatch.setattr(attn, "_kernel_kind", lambda device: "cuda")
    real_op = attn._op
    monkeypatch.setattr(attn, "_op", lambda name, args: fake
                        if name == op_name else real_op(name, args))


def _fake_flash(seen):
    """Flash attention emulated by a dense fp32 softmax over the 16-bit operands; records the
    dtype it was given and checks its contract (bf16, equal aligned head dims)."""
    def flash(q, k, v, dropout_p, is_causal, return_debug_mask, *, scale):
        seen.append(q.dtype)
        assert q.dtype == k.dtype == v.dtype == torch.bfloat16
        assert q.shape[-1] % attn.HEAD_ALIGN == 0 and q.shape == k.shape == v.shape
        s = scale * q.float() @ k.float().transpose(-1, -2)
        return torch.softmax(s, -1).to(q.dtype) @ v, torch.logsumexp(s, -1)
    return flash


def test_cuda_branch_contract_with_an_emulated_kernel(monkeypatch):
    """The memory-efficient kernel's contract, emulated on CPU: the bias it gets is a stride-0
    view with 16-aligned rows, compute_log_sumexp is asked for, and the LSE it returns is padded
    to a multiple of 32 (garbage after N) — the adapter must keep only the first N."""
    seen = []

    def fake_efficient(q, k, v, bias, compute_lse, dropout_p, is_causal, *, scale):
        assert compute_lse and dropout_p == 0.0 and not is_causal
        assert (bias.shape[2] == 1 or bias.stride(2) == 0) and bias.stride(3) == 1
        assert bias.stride(1) % attn.BIAS_ALIGN == 0 and bias.dtype == q.dtype
        assert q.shape[-1] % attn.HEAD_ALIGN == 0          # 16-byte rows (zero-padded head dim)
        s = scale * q @ k.transpose(-1, -2) + bias
        lse = torch.logsumexp(s, dim=-1)
        out = torch.softmax(s, dim=-1) @ v
        n = q.shape[2]
        padded = torch.full((*lse.shape[:2], -(-n // 32) * 32), float("nan"))
        padded[..., :n] = lse
        seen.append(n)
        return out, padded, None, None

    _emulate_cuda(monkeypatch, attn._CUDA_OP, fake_efficient)
    for n, d in ((45, 8), (1, 3), (33, 13)):              # aligned and padded head dims
        z, log_w, g = _case(n, d, 2, seed=9)
        lse_e, dz_e = _dense(z, log_w, 1.3, g)
        lse, _, _, dz = attn.lse_fused(z, log_w, 1.3, False,
                                       lambda rows, lse_b, mx, g=g: g[:, rows])
        assert seen and torch.isfinite(lse).all() and dz.shape == (n, d)
        torch.testing.assert_close(lse, lse_e, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(dz.double(), dz_e, rtol=1e-4, atol=1e-5)

    def refusing(*a, **k):
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(attn, "_op", lambda name, args: refusing)
    with pytest.raises(attn.AttentionUnavailable, match="No available kernel"):
        attn.lse_forward(z, log_w, 1.3, need_max=False)


def test_bias_folding_reproduces_the_bias_to_fp32_precision():
    """bf16 flash attention has no bias: q' = [z, 1, 1, 1], k' = [z, hi, mid, lo of b / scale].
    scale * q'.k' (exact products, fp32-or-better sums) must equal scale * z.z + b."""
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(33, 12, generator=gen).to(torch.bfloat16)
    bias = -torch.rand(2, 33, generator=gen).double() * 12 - 0.123456789
    bias[1, 3] = attn.HIDDEN
    qf, kf, vf = attn.fold_bias(q, bias, 7.3)
    assert qf.shape[1] % attn.HEAD_ALIGN == 0 and qf.dtype == torch.bfloat16
    folded = 7.3 * torch.einsum("nd,hkd->hnk", qf.double(), kf.double())
    want = 7.3 * (q.double() @ q.double().T)[None] + bias[:, None, :]
    vis = bias[:, None, :].expand_as(want) > -1e20
    err = (folded - want)[vis].abs().max().item()
    assert err <= 1e-5 * want[vis].abs().max().item()
    assert folded[1, :, 3].max() < -1e20                     # hidden key stays hidden
    torch.testing.assert_close(vf[:, :12], q)
    assert (vf[:, 12:] == 0).all()


def test_bf16_flash_branch_with_an_emulated_kernel(monkeypatch):
    """The bf16 CUDA branch (flash attention on folded inputs), emulated on CPU by a dense fp32
    softmax over the 16-bit operands: lse and gradient as a dense float64 computation on the
    bf16-rounded embeddings, to bf16-path accuracy."""
    seen = []
    _emulate_cuda(monkeypatch, attn._FLASH_OP, _fake_flash(seen))
    z, log_w, g = _case(64, 16, 2, seed=11)
    zb = z.to(torch.bfloat16)
    assert attn._input(zb).dtype == torch.bfloat16
    lse_e, dz_e = _dense(zb.float(), log_w, 0.8, g)
    lse, _, _, dz = attn.lse_fused(zb, log_w, 0.8, False, lambda rows, lse_b, mx: g[:, rows])
    assert seen
    torch.testing.assert_close(lse, lse_e, rtol=1e-5, atol=1e-4)
    _close(dz, dz_e, rtol=2e-2, atol=1e-3)                  # O through bf16 softmax weights


def _fake_cudnn(seen):
    """cuDNN attention emulated as _fake_flash, with its own signature and its LSE's shape
    [B, H, N, 1]; checks the folded call's contract (no bias, the LSE asked for)."""
    flash = _fake_flash(seen)

    def cudnn(q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal, return_debug_mask,
              *, scale):
        assert attn_bias is None and compute_log_sumexp and dropout_p == 0.0
        assert not is_causal and not return_debug_mask
        out, lse = flash(q, k, v, dropout_p, is_causal, return_debug_mask, scale=scale)
        return out, lse[..., None], None, None, 0, 0, None, None, None
    return cudnn


def test_bf16_branch_on_cudnn_when_asked(monkeypatch):
    """HIERTAIL_ATTENTION_BF16=cudnn runs the folded operands on cuDNN attention (emulated here:
    its signature and [B, H, N, 1] LSE), flash never called: lse and gradient as the flash
    branch's test against float64; unset or "flash": flash; another value: a ValueError
    naming the variable."""
    seen, flash_seen = [], []
    _emulate_cuda(monkeypatch, attn._CUDNN_OP, _fake_cudnn(seen))
    real_op = attn._op
    monkeypatch.setattr(attn, "_op", lambda name, args: _fake_flash(flash_seen)
                        if name == attn._FLASH_OP else real_op(name, args))
    z, log_w, g = _case(64, 16, 2, seed=11)
    zb = z.to(torch.bfloat16)
    lse_e, dz_e = _dense(zb.float(), log_w, 0.8, g)
    monkeypatch.setenv(attn.BF16_KERNEL_ENV, "cudnn")
    lse, _, _, dz = attn.lse_fused(zb, log_w, 0.8, False, lambda rows, lse_b, mx: g[:, rows])
    assert seen and all(dt == torch.bfloat16 for dt in seen) and not flash_seen
    assert lse.shape == lse_e.shape
    torch.testing.assert_close(lse, lse_e, rtol=1e-5, atol=1e-4)
    _close(dz, dz_e, rtol=2e-2, atol=1e-3)
    for value in ("flash", ""):
        monkeypatch.setenv(attn.BF16_KERNEL_ENV, value)
        seen.clear()
        attn.lse_forward(zb, log_w, 0.8, need_max=False)
        assert flash_seen and not seen
    monkeypatch.setenv(attn.BF16_KERNEL_ENV, "cuDNN")
    with pytest.raises(ValueError, match="HIERTAIL_ATTENTION_BF16='cuDNN' is not one of flash, "
                                         "cudnn"):
        attn.lse_forward(zb, log_w, 0.8, need_max=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN attention needs a GPU")
def test_bf16_cudnn_kernel_on_the_card(monkeypatch):
    """The real cuDNN kernel with the folded operands against float64 on the bf16 rows, as
    the flash branch's card tests. A card or build whose cuDNN refuses the call falls back to
    our engine (AttentionUnavailable): reported as a skip, not a pass."""
    monkeypatch.setenv(attn.BF16_KERNEL_ENV, "cudnn")
    asked, real_op = [], attn._op
    monkeypatch.setattr(attn, "_op", lambda name, args: asked.append(name) or real_op(name, args))
    z, log_w, g = _case(200, 64, 2, seed=12)
    zb = z.to("cuda", torch.bfloat16)
    lse_e, dz_e = _dense(zb.float().cpu(), log_w, 0.8, g)
    try:
        lse, _, _, dz = attn.lse_fused(zb, log_w.cuda(), 0.8, False,
                                       lambda rows, lse_b, mx: g.cuda()[:, rows])
    except attn.AttentionUnavailable as exc:
        pytest.skip(f"cuDNN attention refused the call on this card: {exc}")
    assert attn._CUDNN_OP in asked and attn._FLASH_OP not in asked      # cuDNN ran, not flash
    torch.testing.assert_close(lse.cpu(), lse_e, rtol=1e-5, atol=1e-4)
    _close(dz.cpu(), dz_e, rtol=2e-2, atol=1e-3)


def test_public_bf16_loss_reaches_the_flash_branch(monkeypatch):
    """A bf16 loss call on the attention backend (fused forward + gradient, the training path)
    must hand bf16 tensors to the flash kernel on CUDA, not an fp32 copy."""
    seen = []
    _emulate_cuda(monkeypatch, attn._FLASH_OP, _fake_flash(seen))
    gen = torch.Generator().manual_seed(12)
    z = torch.randn(50, 16, generator=gen).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, 4, (50,), generator=gen)
    loss = balanced_contrastive_loss(z, y, temperature=0.5, backend="attention")
    loss.backward()
    assert seen and all(dt == torch.bfloat16 for dt in seen)
    zr = z.detach().double().requires_grad_()
    exp = ref(zr, y, temperature=0.5)
    exp.backward()
    assert abs(loss.item() - exp.item()) <= 2e-2 * abs(exp.item())
    _close(z.grad, zr.grad, rtol=3e-2, atol=1e-3)


def test_the_logits_bound_comes_from_the_input_checks(monkeypatch):
    """The logits' bound (the automatic CUDA choice, the attention guard and the Triton dots
    all read it) is the input checks' largest row norm, squared times the scale: no reduction
    and no host sync of its own, where it was one per call. Under autocast the loss runs on
    16-bit copies of the rows, not the rows checked: one reduction then, on those copies, and
    none on an engine no guard applies to. The same bound to a few ulps either way."""
    from hiertail_fast import hierarchical_contrastive_loss

    calls = []
    real = attn.logit_bound

    def counting(z, scale):
        calls.append((z.shape, z.dtype))
        return real(z, scale)

    monkeypatch.setattr(attn, "logit_bound", counting)
    seen = []
    real_init = attn.LogitBound.__init__

    def init(self, z, scale, max_row_norm=None):
        real_init(self, z, scale, max_row_norm)
        seen.append(self)

    monkeypatch.setattr(attn.LogitBound, "__init__", init)
    z, y = torch.randn(50, 6) * 3, torch.randint(0, 3, (50,))
    protos = torch.randn(3, 6) * 5
    for backend in ("attention", "torch"):
        calls.clear()
        seen.clear()
        _loss_grads(z, y, protos, temperature=0.5, backend=backend)
        assert calls == [] and len(seen) == 1, backend
        want = real(torch.cat([z, protos]), 2.0)
        assert seen[0].value == pytest.approx(want, rel=1e-6)
    seen.clear()
    hierarchical_contrastive_loss(z, [y, y % 2], [protos[:2], protos], temperature=0.5,
                                  backend="attention")
    assert calls == [] and seen[0].value == pytest.approx(
        real(torch.cat([z, protos[:2], protos]), 2.0), rel=1e-6)
    for backend, want in (("attention", 1), ("torch", 0)):
        calls.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _loss_grads(z, y, protos, temperature=0.5, backend=backend)
        assert len(calls) == want, backend
        assert all(call == ((53, 6), torch.bfloat16) for call in calls)    # the 16-bit copies
    calls.clear()
    bound = attn.LogitBound(z, 2.0)                   # no norm given: computed once, on use
    assert bound.value == bound.value == real(z, 2.0) and len(calls) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("signs", ["mixed", "negative", "zero"])
def test_key_side_takes_both_signs_of_the_coefficients_in_one_call(monkeypatch, device, dtype,
                                                                   signs):
    """The key side carries sign(g) on the values and log|g| in the bias: one kernel call per
    head group whatever the signs (no host read of which occur; negative coefficients took a
    second call), values and gradient as float64 autograd on the same (rounded) inputs. g = 0
    everywhere: the call's rows are all hidden and dz is the query side's (0). On CUDA the
    real kernels: memory-efficient attention (fp32), flash on folded inputs (bf16)."""
    z, log_w, g = _case(90, 16, 3, seed=21)
    if signs == "negative":
        g = -g.abs()
    elif signs == "zero":
        g = torch.zeros_like(g)
    z = z.to(dtype)
    lse_e, dz_e = _dense(z.float(), log_w, 1.1, g)
    z, log_w, g = z.to(device), log_w.to(device), g.to(device)
    calls = []
    real = attn._call

    def spy(q, bias_rows, scale, v_sign=None, fold=None):
        calls.append(v_sign is not None)
        if v_sign is not None:
            assert set(v_sign.unique().tolist()) <= {-1.0, 0.0, 1.0}
        return real(q, bias_rows, scale, v_sign, fold)

    monkeypatch.setattr(attn, "_call", spy)
    lse, _, _, dz = attn.lse_fused(z, log_w, 1.1, False, lambda rows, lse_b, mx: g[:, rows])
    assert calls == [False, True]               # the forward (with O), then one key-side call
    torch.testing.assert_close(lse.cpu(), lse_e, rtol=1e-5, atol=1e-4)
    if signs == "zero":
        assert not dz.any()
    elif dtype == torch.float32 or device == "cpu":   # (bf16 runs in fp32 on CPU)
        _close(dz.cpu(), dz_e)
    else:
        _close(dz.cpu(), dz_e, rtol=2e-2, atol=1e-3)  # O through bf16 softmax weights


@pytest.mark.parametrize("fused", [False, True])
def test_the_row_max_reads_the_host_before_the_attention_calls(fused):
    """With need_max (the official variant) the row max runs first: its host read (are all
    keys visible) comes before this call's attention kernels are queued, so on CUDA the host
    does not wait for them there; the numbers are the same in either order."""
    from torch.utils._python_dispatch import TorchDispatchMode

    order = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            order.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    z, log_w, g = _case(60, 8, 2, seed=5)
    with Record():
        if fused:
            got = attn.lse_fused(z, log_w, 1.3, True, lambda rows, lse_b, mx: g[:, rows])
        else:
            got = attn.lse_forward(z, log_w, 1.3, need_max=True)
    read = order.index("_local_scalar_dense")
    kernel = next(i for i, name in enumerate(order) if "attention" in name)
    assert read < kernel, order[:read + 1]
    s = 1.3 * z.double() @ z.double().T
    for lev in range(2):
        vis = torch.isfinite(log_w[lev])
        want = s.masked_fill(~vis[None, :], -INF).max(dim=1)
        torch.testing.assert_close(got[1][lev].double(), want.values, rtol=1e-6, atol=1e-6)
        assert torch.equal(got[2][lev], want.indices)


def test_the_precision_guard_admits_a_bound_equal_to_its_limit():
    # "bound <= rows_limit": a strict < refused the kernels at the limit itself (mutation
    # audit, session 69). scale * max|z|^2 = 64 = the small-problem floor, exactly.
    z = torch.zeros(8, 2)
    z[0, 0] = 8.0
    limit = attn.rows_limit("exact", torch.float32, 8)
    assert attn.logit_bound(z, 1.0) == limit == attn.EXACT_MIN_LOGIT
    assert attn.within_precision(z, 1.0, "exact")
    z[0, 0] = 8.0 * (1 + 2**-20)
    assert not attn.within_precision(z, 1.0, "exact")


def test_the_adapter_refuses_float64_rather_than_computing_it_in_fp32():
    # float64 stays on the exact engine; the adapter's own refusal (not only the dispatch's)
    # keeps a direct call from being computed in fp32 silently (mutation audit, session 69)
    z = torch.randn(6, 3, dtype=torch.float64)
    log_w = torch.zeros(1, 6, dtype=torch.float64)
    with pytest.raises(attn.AttentionUnavailable, match="float64"):
        attn.lse_forward(z, log_w, 1.0, False)
    lse = torch.zeros(1, 6, dtype=torch.float64)
    with pytest.raises(attn.AttentionUnavailable, match="float64"):
        attn.lse_backward(z, log_w, lse, torch.ones(1, 6, dtype=torch.float64), 1.0)
