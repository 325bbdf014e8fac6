"""The symmetric CPU engine (``ops/_lse_symmetric.py`` + ``_symmetric_lse.c``): each pair once.

At test size the engine is forced on small problems (``MIN_ROWS`` = 1) and cut into many
ragged tiles (row blocks of 16 or 64 rows, so the wide tiles span several C chunks and, above
32k entries, several threads). Every case is checked against the float64 reference (values
and gradients, both variants, the hard regimes of tests/test_contrastive_numerics.py) and
against the row-block engine, and a spy asserts that the symmetric kernels really ran.
"""
from __future__ import annotations

import pytest
import torch

import hiertail_fast.ops._lse_symmetric as sym
from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss
from hiertail_fast.ops import _dispatch, _lse_torch, _onednn_gemm
from hiertail_fast.ops import _host_reads as host_reads
from hiertail_fast.reference import balanced_contrastive_loss_ref as ref
from tests.test_contrastive_numerics import (
    UPSTREAM_CASES,
    UPSTREAM_REGIMES,
    _regime,
    assert_upstream_within_rule,
    assert_within_reference_error,
)

pytestmark = pytest.mark.skipif(not sym.available(), reason="no C compiler: the engine is off")


@pytest.fixture(params=["blas", "onednn"])
def forced(request, monkeypatch):
    """The engine on every fp32 CPU single-level call, row blocks of 16, its GEMMs on torch's
    BLAS and (a second run) on oneDNN (``HIERTAIL_CPU_GEMM``; skipped where the adapter says
    no); returns the spy's call counter ({'fused': n}). Skips where the engine cannot run (no
    C compiler), so the files that borrow this fixture need no check of their own."""
    if not sym.available():
        pytest.skip("no C compiler: the engine is off")
    if request.param == "onednn" and (why := _onednn_gemm._unavailable()) is not None:
        pytest.skip(why)
    monkeypatch.setenv(_onednn_gemm.ENV_VAR, request.param)
    monkeypatch.setenv(sym.ENV_VAR, "1")
    monkeypatch.setattr(sym, "MIN_ROWS", 1)
    monkeypatch.setattr(sym, "MAX_BLOCK_ROWS", 16)
    calls = {"fused": 0}
    real = sym.lse_fused

    def spy(*args, **kwargs):
        calls["fused"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(sym, "lse_fused", spy)
    return calls


def _loss_and_grads(z, y, p, *, variant, tau=0.1, include_self=True, reduction="mean",
                    backend="torch"):
    zz = z.clone().requires_grad_()
    pp = None if p is None else p.clone().requires_grad_()
    fn = ref if backend is None else (
        lambda *a, **k: balanced_contrastive_loss(*a, backend=backend, **k))
    loss = fn(zz, y, prototypes=pp, temperature=tau, variant=variant,
              include_self=include_self, reduction=reduction)
    (loss.sum() * 2).backward()
    return [loss.detach(), zz.grad] + ([] if pp is None else [pp.grad])


def _assert_like_reference(fast, z, y, p, **kw):
    """Within 2x the fp32 reference's own error + fp32 tolerance (test_contrastive_numerics'
    rule, with its 32-ulp allowance for the gradient terms that cancel: scale |z|^2 per row,
    over N for the mean reduction)."""
    exp = _loss_and_grads(z.double(), y, None if p is None else p.double(), backend=None, **kw)
    low = _loss_and_grads(z, y, p, backend=None, **kw)
    zmax = max(z.abs().max().item(), 0.0 if p is None else p.abs().max().item())
    rows = z.shape[0] if kw.get("reduction", "mean") == "mean" else 1
    terms = 2.0 * zmax * z.shape[1] ** 0.5 / kw.get("tau", 0.1) / rows
    assert_within_reference_error(fast, exp, low, terms)


@pytest.mark.parametrize("regime", ["normalised", "relu", "randn", "randn30"])
@pytest.mark.parametrize("tau", [0.01, 1.0])
@pytest.mark.parametrize("variant", ["exact", "official"])
def test_regimes_match_reference(forced, regime, tau, variant):
    gen = torch.Generator().manual_seed(7)
    z = _regime(regime, 83, 16, gen)                  # 83 + 5 rows: ragged blocks of 16
    y = torch.randint(0, 5, (83,), generator=gen)
    p = _regime(regime, 5, 16, gen)
    fast = _loss_and_grads(z, y, p, variant=variant, tau=tau)
    assert forced["fused"] == 1
    _assert_like_reference(fast, z, y, p, variant=variant, tau=tau)


@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_options_match_reference_and_row_block_engine(forced, monkeypatch, variant,
                                                       include_self, reduction):
    """include_self, every reduction (``none``: the engine's forward-only pass, and its fused
    pass again in the backward, see test_reduction_none_gradient_is_one_consistent_pass), no
    prototypes; the row-block engine agrees within fp32 rounding."""
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(101, 8, generator=gen)
    y = torch.randint(0, 4, (101,), generator=gen)
    kw = dict(variant=variant, tau=0.5, include_self=include_self, reduction=reduction)
    fast = _loss_and_grads(z, y, None, **kw)
    calls = 2 if reduction == "none" else 1     # "none": forward pass 1, the backward's pass
    assert forced["fused"] == calls
    _assert_like_reference(fast, z, y, None, **kw)
    monkeypatch.setenv(sym.ENV_VAR, "0")
    rows = _loss_and_grads(z, y, None, **kw)
    assert forced["fused"] == calls                       # switched off: not called again
    for a, b in zip(fast, rows, strict=True):     # fp32 rounding, relative to the tensor
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4 * b.abs().max().item() + 1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant", ["exact", "official"])
def test_low_precision_inputs_run_the_engine_in_float32(forced, monkeypatch, dtype, variant):
    """bf16 / fp16 rows, automatic choice: the engine runs on their float32 copy (the loss in
    float32, the gradients in the input dtype) and agrees with the row-block engine on the same
    rows to fp32 rounding, hence with the reference as test_low_precision_inputs checks it."""
    monkeypatch.delenv("HIERTAIL_BACKEND", raising=False)
    gen = torch.Generator().manual_seed(11)
    z = torch.randn(97, 16, generator=gen).to(dtype)
    y = torch.randint(0, 6, (97,), generator=gen)
    p = torch.randn(6, 16, generator=gen).to(dtype)
    kw = dict(variant=variant, tau=0.5)
    zz, pp = z.clone().requires_grad_(), p.clone().requires_grad_()
    loss = balanced_contrastive_loss(zz, y, prototypes=pp, temperature=0.5, variant=variant)
    loss.backward()
    assert forced["fused"] == 1                                 # the automatic choice took it
    assert loss.dtype == torch.float32 and zz.grad.dtype == pp.grad.dtype == dtype
    monkeypatch.setenv(sym.ENV_VAR, "0")
    rows = _loss_and_grads(z.float(), y, p.float(), **kw)
    assert forced["fused"] == 1
    torch.testing.assert_close(loss.detach(), rows[0], rtol=1e-6, atol=1e-6)
    for a, b in zip((zz.grad, pp.grad), rows[1:], strict=True):  # + one rounding to the dtype
        b = b / 2                                               # (_loss_and_grads: 2 x loss)
        torch.testing.assert_close(a.float(), b, rtol=torch.finfo(dtype).eps,
                                   atol=1e-4 * b.abs().max().item() + 1e-6)


@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("engine", ["symmetric", "rowblock"])
def test_reduction_none_gradient_is_one_consistent_pass(forced, monkeypatch, variant, engine):
    """reduction "none": the gradient of sum_i g_i loss_i (g = grad_out) comes from one fused
    pass of the backward, every term from the same logits. Before, the backward recomputed the
    logits in other GEMMs than the forward's LSE and row max came from (the symmetric engine's
    tiles, or the row-block engine's label-sorted keys), rounded differently by ulps of |s|:
    gradients 30x the fp32 reference's error at |s| ~ 1e5, and for the official variant, whose
    arg-max term cancels p_argmax ~ 1, 0.1 % of the terms at |s| ~ 1e4 (fuzzing finds)."""
    if engine == "rowblock":
        monkeypatch.setenv(sym.ENV_VAR, "0")
    gen = torch.Generator().manual_seed(134)
    z = torch.randn(300, 5, generator=gen) * 30                  # |s| to ~1e5 at tau 0.1
    y = torch.randint(0, 3, (300,), generator=gen)
    p = torch.randn(3, 5, generator=gen) * 30
    kw = dict(variant=variant, tau=0.1, reduction="none")
    fast = _loss_and_grads(z, y, p, **kw)
    _assert_like_reference(fast, z, y, p, **kw)    # was 24.9 > 1.46 (exact), > 0.017 (official)
    assert forced["fused"] == (2 if engine == "symmetric" else 0)


def test_reduction_none_official_big_logits_rowblock(monkeypatch):
    """The row-block engine alone: fuzz case 151 (|s| ~ 4e4, tau 1, the official variant), the
    gradient of one row's loss, which the reference gives as exactly 0 (every term saturated):
    0.086 before, from a backward whose logits (natural key order) were rounded otherwise than
    the forward's row max (keys sorted by label)."""
    monkeypatch.setenv(sym.ENV_VAR, "0")
    gen = torch.Generator().manual_seed(3151)
    z = torch.randn(513, 16, generator=gen, dtype=torch.float64) * 30
    y = torch.randint(0, 40, (513,), generator=gen)
    go = torch.zeros(513, dtype=torch.float64)
    go[512] = 1.0
    grads = []
    for t, fn in ((z.float(), lambda *a, **k: balanced_contrastive_loss(*a, backend="torch",
                                                                         **k)), (z, ref)):
        zz = t.clone().requires_grad_()
        out = fn(zz, y, temperature=1.0, include_self=False, reduction="none",
                 variant="official")
        out.backward(go.to(t.dtype))
        grads.append(zz.grad.double())
    assert grads[1].abs().max() == 0
    assert grads[0].abs().max() < 1e-3


def test_threads_and_chunks_agree(forced, monkeypatch):
    """Row blocks of 64 rows: the wide tiles span several 256-column chunks, split over two
    threads; one thread gives the same loss and gradient (to fp32 rounding: the threads' row
    sums are merged in another order)."""
    monkeypatch.setattr(sym, "MAX_BLOCK_ROWS", 64)
    gen = torch.Generator().manual_seed(11)
    z = torch.randn(1100, 16, generator=gen)
    y = torch.randint(0, 6, (1100,), generator=gen)
    before = torch.get_num_threads()
    try:
        out = {}
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out[threads] = _loss_and_grads(z, y, None, variant="official", tau=0.5)
    finally:
        torch.set_num_threads(before)
    assert forced["fused"] == 2
    for a, b in zip(out[1], out[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    _assert_like_reference(out[2], z, y, None, variant="official", tau=0.5)


def test_statistics_and_first_argmax_on_ties(forced):
    """lse, row max and arg-max against a dense float64 computation, on data full of ties
    (integer embeddings, duplicate rows): the arg-max is the FIRST index holding the max in
    the caller's order (torch.max's rule), although the engine visits rows sorted by label."""
    gen = torch.Generator().manual_seed(2)
    z = torch.randint(-1, 2, (77, 6), generator=gen).float()
    z[40:60] = z[0:20]
    y = torch.randint(0, 4, (77,), generator=gen)
    log_w = -torch.log(torch.bincount(y)[y].float())[None]
    pos = sym.Positives(y, True, torch.full((77,), -0.01))
    coef = lambda rows, lse, rmax: torch.full_like(lse, 0.01)       # noqa: E731
    lse, rmax, amax, dz = sym.lse_fused(z, log_w, 0.5, True, coef, positives=pos)
    s = (z.double() @ z.double().t()) * 0.5        # exact in fp32 too: ties stay ties
    torch.testing.assert_close(lse[0], torch.logsumexp(s + log_w[0].double(), dim=1))
    assert torch.equal(rmax[0].double(), s.max(dim=1).values)
    first = torch.tensor([int((row == row.max()).nonzero()[0]) for row in s])
    assert torch.equal(amax[0], first)
    # T, Q: the positives' sums with x = exp(s_ij - M_i)
    same = y[:, None] == y[None, :]
    x = torch.exp(s - s.max(dim=1, keepdim=True).values)
    eps = 1e-7
    big_t = torch.where(same, torch.log(x + eps), torch.zeros_like(x)).sum(1)
    big_q = torch.where(same, x / (x + eps), torch.zeros_like(x)).sum(1)
    torch.testing.assert_close(pos.T[0], big_t, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(pos.Q[0], big_q, rtol=1e-6, atol=1e-5)
    assert pos.handled == [True]
    # the gradient: d/dz of sum_i 0.01 lse_i - 0.01 sum_{j in P(i)} log(x_ij + eps) at fixed M
    zd = z.double().requires_grad_()
    sd = (zd @ zd.t()) * 0.5
    m = sd.max(dim=1, keepdim=True).values.detach()
    val = 0.01 * torch.logsumexp(sd + log_w[0].double(), dim=1).sum() - 0.01 * torch.where(
        same, torch.log(torch.exp(sd - m) + eps), torch.zeros_like(sd)).sum()
    val.backward()
    torch.testing.assert_close(dz.double(), zd.grad, rtol=1e-5, atol=1e-6)


def test_wide_logits_stay_finite_and_exact(forced):
    """|s| ~ 1e5 (randn x 30, tau = 0.01): exp arguments split as (s - M) + small part."""
    gen = torch.Generator().manual_seed(9)
    z = torch.randn(90, 12, generator=gen) * 30
    y = torch.randint(0, 3, (90,), generator=gen)
    for variant in ("exact", "official"):
        fast = _loss_and_grads(z, y, None, variant=variant, tau=0.01)
        _assert_like_reference(fast, z, y, None, variant=variant, tau=0.01)


def test_huge_logits_keep_the_gradient_exact(forced):
    """max|z|^2/tau = 1e14 (inside the validated bound): the gradient's lse - M was formed as
    (M + log s) - M in float64, which loses 2^-53 |M| ~ 0.01 of an O(1) quantity: the exact
    loss's gradient was 0.7 % off (~100 % at 1e16) while the value and the row-block engine
    were right (an extremes audit). It is log s itself now. (The official variant's value
    carries the documented 2^-53 |M| of its denominator, docs/LOSS.md, on both engines; its
    float64 reference gradient is NaN at this size.)"""
    gen = torch.Generator().manual_seed(11)
    z0 = torch.randn(120, 8, generator=gen, dtype=torch.float64)
    z = (z0 / z0.norm(dim=1, keepdim=True) * (1e14 * 0.1) ** 0.5).float()
    y = torch.randint(0, 5, (120,), generator=gen)
    fast = _loss_and_grads(z, y, None, variant="exact")
    exp = _loss_and_grads(z.double(), y, None, variant="exact", backend=None)
    assert forced["fused"] > 0
    torch.testing.assert_close(fast[0].double(), exp[0], rtol=1e-6, atol=0)
    err = (fast[1].double() - exp[1]).abs().max() / exp[1].abs().max()
    assert err < 1e-6, err        # (the float32 reference: 2.3e-7)


def test_applicable_only_where_it_is_built_for(monkeypatch):
    monkeypatch.setenv(sym.ENV_VAR, "1")
    z = torch.randn(sym.MIN_ROWS, 4)
    lw = torch.zeros(1, sym.MIN_ROWS)
    assert sym.applicable(z, lw)
    assert not sym.applicable(z.double(), lw.double())                 # float64: row blocks
    assert not sym.applicable(z[:-1], lw[:, :-1])                      # too few rows
    assert not sym.applicable(z, torch.zeros(2, sym.MIN_ROWS))         # several levels
    hidden = lw.clone()
    hidden[0, 3] = float("-inf")
    assert not sym.applicable(z, hidden)                               # a hidden key
    monkeypatch.setenv(sym.ENV_VAR, "0")
    assert not sym.applicable(z, lw)


def test_automatic_choice_on_cpu(monkeypatch):
    """The exact single-level loss goes to our torch backend at every size and input dtype:
    the symmetric engine from MIN_ROWS rows, the row-block engine's single block below (both
    measured faster than the CPU attention kernel); switched off, the attention kernel."""
    monkeypatch.delenv("HIERTAIL_BACKEND", raising=False)
    monkeypatch.setenv(sym.ENV_VAR, "1")
    big, small = torch.randn(sym.MIN_ROWS, 4), torch.randn(sym.MIN_ROWS - 1, 4)
    for z in (big, small, torch.randn(3, 4)):
        assert _dispatch.choose_loss_backend(z, None, "official") == "torch"
        for dtype in (torch.float32, torch.bfloat16, torch.float16):   # 16-bit: in float32
            assert _dispatch.choose_loss_backend(z.to(dtype), None, "exact") == "torch"
    if _dispatch._attention_available(big.device):
        monkeypatch.setenv(sym.ENV_VAR, "0")
        for z in (big, small, big.bfloat16()):
            assert _dispatch.choose_loss_backend(z, None, "exact") == "attention"
        assert _dispatch.choose_loss_backend(big, None, "official") == "torch"


def test_several_levels_keep_the_row_block_engine(forced):
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(50, 8, generator=gen, requires_grad=True)
    ys = [torch.randint(0, 4, (50,), generator=gen), torch.randint(0, 2, (50,), generator=gen)]
    ps = [torch.randn(4, 8, generator=gen), torch.randn(2, 8, generator=gen)]
    hierarchical_contrastive_loss(z, ys, ps, temperature=0.5, backend="torch").backward()
    assert forced["fused"] == 0
    assert _lse_torch.MAX_BLOCK_ROWS == 256            # the row-block engine's own blocks


def test_no_denormal_reaches_a_gemm(forced, monkeypatch):
    """Wide logits (randn x 30, tau 0.5: most terms far below e^-87 of their row's largest):
    the gradient tiles W that go into the GEMMs hold exact zeros where a term is cut, and no
    nonzero below e^-50 of the largest (whose products with z would turn subnormal: x86
    multiplies those 20-30x slower)."""
    tiles = []
    real = _onednn_gemm.add_mm_

    def spy(acc, mat1, mat2, **kwargs):
        tiles.append(mat1.detach().flatten().clone())
        return real(acc, mat1, mat2, **kwargs)

    monkeypatch.setattr(_onednn_gemm, "add_mm_", spy)
    gen = torch.Generator().manual_seed(12)
    z = torch.randn(300, 32, generator=gen)
    y = torch.randint(0, 3, (300,), generator=gen)
    for variant in ("exact", "official"):
        zz = z.clone().requires_grad_()
        balanced_contrastive_loss(zz, y, temperature=0.5, variant=variant,
                                  backend="torch").backward()
    assert forced["fused"] == 2
    w = torch.cat(tiles).abs()
    assert (w == 0).float().mean() > 0.5                # the regime does cut most terms
    nonzero = w[w > 0]
    assert nonzero.min() >= 1e-22 * nonzero.max()       # e^-50 = 1.9e-22


@pytest.mark.parametrize("use,n", [("blas", 103), ("onednn", 103), ("onednn", 400)])
def test_tiles_cover_each_pair_once_within_the_buffer_budget(monkeypatch, use, n):
    """The tile list: each unordered pair of rows of different blocks in exactly one tile (as
    (earlier row, later row)), each ordered pair inside a block in its diagonal tile; wide
    ranges cut into pieces within HIERTAIL_CPU_BLOCK_BYTES, and the buffer holds any tile
    torch.mm computes. For oneDNN: pieces of 32, 16 or < 16 columns, and only the full-block
    ones of 32 and 16 on oneDNN (3 shapes at any n)."""
    monkeypatch.setattr(sym, "MAX_BLOCK_ROWS", 16)
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(4 * 16 * 40))  # blas: 40-column pieces
    width = 40 if use == "blas" else 32
    tiles, size = sym._tiles(n, use)
    cover = torch.zeros(n, n, dtype=torch.long)
    shapes = set()
    for r0, r1, c0, c1 in tiles:
        assert c1 - c0 <= max(width, r1 - r0)
        if sym._gemm_use(use, r1 - r0, c1 - c0) == "onednn":
            shapes.add((r1 - r0, c1 - c0))
        else:
            assert (r1 - r0) * (c1 - c0) <= size
        cover[r0:r1, c0:c1] += 1
    assert shapes == (set() if use == "blas" else {(16, 16), (16, 32)})
    block = torch.arange(n) // 16
    same = block[:, None] == block[None, :]
    assert (cover[same] == 1).all()
    later = block[:, None] < block[None, :]
    assert (cover[later] == 1).all() and (cover[~same & ~later] == 0).all()


@pytest.mark.parametrize("variant", ["exact", "official"])
def test_wide_ranges_cut_into_pieces_give_the_same_loss(forced, monkeypatch, variant):
    gen = torch.Generator().manual_seed(21)
    z = torch.randn(150, 8, generator=gen)
    y = torch.randint(0, 5, (150,), generator=gen)
    whole = _loss_and_grads(z, y, None, variant=variant, tau=0.5)
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(4 * 16 * 40))
    pieces = _loss_and_grads(z, y, None, variant=variant, tau=0.5)
    assert forced["fused"] == 2
    for a, b in zip(whole, pieces, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5 * b.abs().max().item() + 1e-7)
    _assert_like_reference(pieces, z, y, None, variant=variant, tau=0.5)


def test_same_result_bit_for_bit_run_to_run(forced, monkeypatch):
    """A given thread count gives the same loss and gradient every run (static chunk schedule,
    per-thread row sums merged in thread order)."""
    monkeypatch.setattr(sym, "MAX_BLOCK_ROWS", 64)
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(900, 16, generator=gen)
    y = torch.randint(0, 6, (900,), generator=gen)
    first = _loss_and_grads(z, y, None, variant="official", tau=0.5)
    second = _loss_and_grads(z, y, None, variant="official", tau=0.5)
    assert forced["fused"] == 2
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_zero_upstream_gradient_gives_zero_not_nan(forced, variant, reduction):
    """The engine divides the upstream coefficients by their largest magnitude; an all-zero
    upstream gradient (a loss term weighted 0, a masked batch) gives exactly zero, not 0/0 =
    NaN in every parameter it reaches. No test had one (a mutation audit)."""
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(40, 8, generator=gen).requires_grad_()
    y = torch.randint(0, 4, (40,), generator=gen)
    loss = balanced_contrastive_loss(z, y, temperature=0.1, variant=variant,
                                     reduction=reduction, backend="torch")
    (loss.sum() * 0.0).backward()
    assert forced["fused"] > 0, "the symmetric engine did not run"
    assert torch.isfinite(z.grad).all() and bool((z.grad == 0).all())


@pytest.mark.parametrize("variant,regime,kind", UPSTREAM_CASES)
@pytest.mark.parametrize("prototypes", [False, True])
@pytest.mark.parametrize("engine", ["symmetric", "rowblock", "rowblock-slices",
                                    "rowblock-band", "rowblock-cuda"])
def test_extreme_upstream_gradients_of_reduction_none(forced, monkeypatch, engine, variant,
                                                      regime, kind, prototypes):
    """The backward of reduction "none" with extreme upstream gradients
    (test_contrastive_numerics.UPSTREAM_REGIMES: ~1e-39, also on rows of ~3e-4 at tau 1e-6;
    1e-310 on float64 rows; 1e37), one such entry among -1 or all of them: within the
    same-dtype reference's own error of the float64 gradients. Before (2026-12-06): NaN on the
    row-block engine's official variant (its positives' coefficients went through 1 / the
    block's normaliser, inf in float32 at 1e-39 and in float64 at 1e-310), 9-1,000x the rule
    on every engine with the small rows (products subnormal before the 1/tau), inf at 1e37 (the
    key side's sums overflowed where the gradient fits); now the backward runs on grad_out /
    2^k and scales back. The row-block engine with each of its official positives' paths: the
    C kernel, the torch ones, and CUDA's forms (no host read: the block's normaliser a 0-dim
    tensor, ``_host_reads.FORCE_SYNC_FREE``)."""
    if engine.startswith("rowblock"):
        monkeypatch.setenv(sym.ENV_VAR, "0")
    if engine == "rowblock-cuda":
        monkeypatch.setattr(host_reads, "FORCE_SYNC_FREE", True)
        for name, value in host_reads.CUDA_PATH_ENV.items():
            monkeypatch.setenv(name, value)
    elif engine in ("rowblock-slices", "rowblock-band"):
        monkeypatch.setenv("HIERTAIL_POSITIVES", engine.split("-")[1])
    assert_upstream_within_rule("torch", variant, prototypes, kind, regime)
    fp32 = UPSTREAM_REGIMES[regime][1] == torch.float32        # (the symmetric engine's rows)
    assert (forced["fused"] > 0) == (engine == "symmetric" and fp32)


@pytest.mark.parametrize("tiles", ["forced", "default"])
def test_large_logits_cancel_before_the_class_weight_is_added(forced, monkeypatch, tiles):
    """The gradient kernel's exponent is (s - M) + (log w - b): the large logit cancels against
    the row max first, then the class weight's log joins. Integer rows (fp32 dots exact),
    |s| ~ 1.6e5 with neighbours a few units apart, imbalanced classes (log w != 0): the
    gradient within 1e-4 of the float64 reference's (3.6e-6 here). A second mutation audit's
    (s + log w) - (M + b), on the diagonal tiles or the others, was 4e-3 and 7e-3 off."""
    if tiles == "default":
        monkeypatch.setattr(sym, "MAX_BLOCK_ROWS", 256)
    g = torch.Generator().manual_seed(0)
    n = 600
    z = 200.0 + torch.randint(0, 2, (n, 4), generator=g).float()   # s_ij = z_i.z_j exact
    y = torch.randint(0, 7, (n,), generator=g) ** 2 % 7             # imbalanced classes
    zz = z.clone().requires_grad_()
    balanced_contrastive_loss(zz, y, temperature=1.0, backend="torch").backward()
    assert forced["fused"] == 1
    zd = z.double().requires_grad_()
    ref(zd, y, temperature=1.0).backward()
    err = (zz.grad.double() - zd.grad).abs().max() / zd.grad.abs().max()
    assert err.item() <= 1e-4, err.item()


def test_row_sums_of_pass_one_are_float64():
    """Pass 1 sums each row's chunk in float64: rows whose own term (e^0 = 1) dominates and
    whose 511 others are each e^-17 ~ 4e-8, under half a float32 ulp of the running sum. Rows
    of +-1 and scale 17 / 512 make every logit exact in fp32, so the float64 logsumexp of the
    same logits is the answer: within 1e-9 (1e-11 here). Summed in float, 5e-7 off (a second
    mutation audit)."""
    gen = torch.Generator().manual_seed(0)
    n = d = 512
    z = torch.randint(0, 2, (n, d), generator=gen).float() * 2 - 1
    scale = 17.0 / 512
    lse, _, _, _ = sym.lse_fused(z, torch.zeros(1, n), scale, False)
    s = (z.double() @ z.double().t()) * scale
    want = torch.logsumexp(s, dim=1)
    assert (s.diagonal()[:, None] - s).fill_diagonal_(float("inf")).min() > 8   # (the setup)
    assert (lse[0].double() - want).abs().max().item() <= 1e-9


def test_fold_share_is_exactly_zero_where_the_max_holds_the_whole_row(forced, monkeypatch):
    """The symmetric engine's fold (``_max_fold.TileFold``): a row whose every other term
    underflowed in pass 1 has o = row sum - t = 0 exactly, so its arg-max share u is exactly 0,
    as the reference's p - 1 = 1 - 1 (the module's promise): t is formed as pass 1's fp32
    product. Formed in float64 (a second mutation audit), 24 of those rows got |u| ~ 1e-10."""
    from hiertail_fast.ops import _loss_passes
    from hiertail_fast.ops._lse_torch import exp_cutoff

    shares = []
    real = _loss_passes.ArgmaxShare

    class Spy(real):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            shares.append(self)

    monkeypatch.setattr(_loss_passes, "ArgmaxShare", Spy)
    gen = torch.Generator().manual_seed(0)
    z = (torch.randn(60, 6, generator=gen, dtype=torch.float64) * 4).float()
    y = torch.randint(0, 7, (60,), generator=gen)
    balanced_contrastive_loss(z.clone().requires_grad_(), y, temperature=0.05,
                              variant="official", backend="torch").backward()
    assert forced["fused"] == 1 and shares
    s = (z.double() @ z.double().t()) * 20.0
    gap = s - s.max(dim=1, keepdim=True).values
    gap[torch.arange(60), s.argmax(dim=1)] = float("-inf")
    alone = gap.max(dim=1).values < -(exp_cutoff(torch.float32) + 10)   # the rest underflow
    assert int(alone.sum()) >= 20                                        # (the setup)
    assert bool((shares[-1].u[0, alone] == 0).all())


_FEWER_THREADS_SCRIPT = r"""
import json, sys, torch
import hiertail_fast.ops._lse_symmetric as sym
from hiertail_fast import balanced_contrastive_loss
sym.MIN_ROWS = 1
torch.set_num_threads(int(sys.argv[1]))
calls = [0]
real = sym.lse_fused
def spy(*a, **k):
    calls[0] += 1
    return real(*a, **k)
sym.lse_fused = spy
out = []
for seed in range(3):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(1500, 8, generator=g).requires_grad_()
    y = torch.randint(0, 5, (1500,), generator=g)
    loss = balanced_contrastive_loss(z, y, temperature=0.1, variant="official", backend="torch")
    loss.backward()
    out.append([float(loss), float(z.grad.abs().sum())])
print(json.dumps({"calls": calls[0], "out": out}))
"""


def test_fewer_openmp_threads_than_asked_give_the_same_loss():
    """OpenMP may start fewer threads than torch asks for (OMP_THREAD_LIMIT, OMP_DYNAMIC): the
    engine merges the row statistics of the threads that RAN. Merging all the slots it asked
    for read uninitialised ones (NaN losses, garbage arg-max indices) and no test ran with fewer
    threads (a mutation audit). A fresh process (the limit is read when OpenMP starts): four
    torch threads under OMP_THREAD_LIMIT=1 against one thread."""
    import json
    import os
    import subprocess
    import sys

    def run(threads, limit=None):
        env = {**os.environ, sym.ENV_VAR: "1"}
        if limit is not None:
            env["OMP_THREAD_LIMIT"] = str(limit)
        proc = subprocess.run([sys.executable, "-c", _FEWER_THREADS_SCRIPT, str(threads)],
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    one, limited = run(1), run(4, limit=1)
    assert one["calls"] > 0 and limited["calls"] > 0, "the symmetric engine did not run"
    for (loss1, grad1), (loss4, grad4) in zip(one["out"], limited["out"], strict=True):
        assert loss4 == pytest.approx(loss1, rel=1e-5)
        assert grad4 == pytest.approx(grad1, rel=1e-4)
