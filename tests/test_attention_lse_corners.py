"""Corners of the attention adapter (hiertail_fast/ops/_attention_lse.py) that a mutation audit
found unguarded: the version check's boundary, the official variant's row max and tied arg-max
under levels that hide keys (hierarchical loss with prototypes), the bias folding at a tiny
scale, and the official guard's rows rule. Each against float64 or the documented rule."""
from __future__ import annotations

import pytest
import torch

import hiertail_fast.ops._attention_lse as attn
from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss
from hiertail_fast.reference import balanced_contrastive_loss_ref as ref
from tests.test_attention_lse import _spy
from tests.test_contrastive_numerics import (
    UPSTREAM_CASES,
    UPSTREAM_REGIMES,
    assert_upstream_within_rule,
)

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not attn.available("cpu"), reason="no CPU flash-attention op in torch"),
]


def _rel_err(a: torch.Tensor, e: torch.Tensor) -> float:
    """Max error relative to the largest entry of the expected tensor."""
    return float((a.double() - e.double()).abs().max() / e.double().abs().max())


def _hierarchical_grads(z, ys, ps, **kw):
    """(loss, dz, [dP_l]) of hierarchical_contrastive_loss on the attention backend."""
    zz = z.clone().requires_grad_()
    pp = [None if p is None else p.clone().requires_grad_() for p in ps]
    loss = hierarchical_contrastive_loss(zz, ys, pp, backend="attention", **kw)
    (loss * 3).backward()
    return loss.detach(), zz.grad, [None if p is None else p.grad for p in pp]


def _sum_of_levels(z, ys, ps, **kw):
    """The same in float64: the sum over levels of the reference loss on cat(z, P_l)."""
    zz = z.double().requires_grad_()
    pp = [None if p is None else p.double().requires_grad_() for p in ps]
    loss = sum(ref(zz, y, prototypes=p, **kw) for y, p in zip(ys, pp, strict=True))
    (loss * 3).backward()
    return loss.detach(), zz.grad, [None if p is None else p.grad for p in pp]


def test_min_torch_release_itself_is_supported():
    """docs/LOSS.md: the adapter's version check is ">= 2.4" (MIN_TORCH), so the oldest
    supported release itself and its patch releases pass, the one before does not (a mutation
    audit: ">" in place of ">=" refused torch 2.4 unnoticed)."""
    assert attn.MIN_TORCH == (2, 4)
    assert attn.supported(attn.MIN_TORCH)
    assert attn.supported((2, 4)) and attn.supported((2, 5))
    assert not attn.supported((2, 3)) and not attn.supported((1, 13))


def test_official_row_max_ignores_keys_hidden_at_the_level(monkeypatch):
    """Official hierarchical loss on the attention kernels: level 2 hides level 1's prototypes,
    which are every row's largest logit (~40 against ~20 for the visible keys, a gap past the
    official eps of 1e-7). The row max M_i of level 2 must come from its visible keys only: the
    loss and every gradient as the float64 sum of per-level reference losses, and the loss of
    the forward-only pass (no gradient asked: lse_forward) too (a mutation audit: a row max over
    all keys, log_w's -inf ignored, passed every other test in either pass)."""
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(8, generator=gen)
    u = u / u.norm()
    # (200 rows: a logit bound of ~80 inside the official guard's rows rule, 0.5 per row)
    z = 3.2 * u + 0.3 * torch.randn(200, 8, generator=gen)
    p1 = 6.3 * u + 0.05 * torch.randn(3, 8, generator=gen)
    ys = [torch.randint(0, 3, (200,), generator=gen), torch.randint(0, 2, (200,), generator=gen)]
    kw = dict(temperature=0.5, variant="official")
    assert attn.within_precision(torch.cat([z, p1]), 2.0, "official")     # runs the kernels
    calls = _spy(monkeypatch)
    loss, dz, (dp1, _) = _hierarchical_grads(z, ys, [p1, None], **kw)
    assert calls, "the attention kernels were not used"
    e_loss, e_dz, (e_dp1, _) = _sum_of_levels(z, ys, [p1, None], **kw)
    assert abs(loss.item() - e_loss.item()) <= 1e-5 * abs(e_loss.item())
    assert _rel_err(dz, e_dz) <= 1e-4
    assert _rel_err(dp1, e_dp1) <= 1e-4
    calls.clear()
    with torch.no_grad():
        fwd = hierarchical_contrastive_loss(z, ys, [p1, None], backend="attention", **kw)
    assert calls, "the attention kernels were not used"
    assert abs(fwd.item() - e_loss.item()) <= 1e-5 * abs(e_loss.item())


def test_official_tied_arg_max_stays_on_a_visible_key(monkeypatch):
    """Official hierarchical loss on the attention kernels with a level-2 prototype equal bit for
    bit to a level-1 prototype (the smaller row id, hidden at level 2), which is every row's
    largest logit at both levels. Level 2's arg-max moves to the first EQUAL row visible at
    that level: its row-max gradient reaches P2, not P1 (a mutation audit: first_tied_key
    without the visibility mask sent it to P1, ~10x the gradient's size off)."""
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(8, generator=gen)
    u = u / u.norm()
    # (200 rows: a logit bound of ~80 inside the official guard's rows rule, 0.5 per row)
    z = 3.2 * u + 0.3 * torch.randn(200, 8, generator=gen)
    p1 = torch.randn(2, 8, generator=gen)
    p1[0] = 6.3 * u
    p2 = torch.randn(2, 8, generator=gen) * 0.3
    p2[0] = p1[0]
    ys = [torch.randint(0, 2, (200,), generator=gen), torch.randint(0, 2, (200,), generator=gen)]
    kw = dict(temperature=0.5, variant="official")
    assert attn.within_precision(torch.cat([z, p1, p2]), 2.0, "official")
    calls = _spy(monkeypatch)
    loss, dz, dps = _hierarchical_grads(z, ys, [p1, p2], **kw)
    assert calls, "the attention kernels were not used"
    e_loss, e_dz, e_dps = _sum_of_levels(z, ys, [p1, p2], **kw)
    assert abs(loss.item() - e_loss.item()) <= 1e-5 * abs(e_loss.item())
    assert _rel_err(dz, e_dz) <= 1e-4
    for got, exp in zip(dps, e_dps, strict=True):
        assert _rel_err(got, exp) <= 1e-4


def test_bias_folding_at_a_tiny_scale_stays_finite():
    """fold_bias splits b / scale into three bf16 parts: at temperature 1e9 (scale 1e-9, a
    value validation accepts) a hidden key's -1e30 / scale overflows fp32, and without the
    clamp the parts were -inf, NaN, NaN (a mutation audit). Folded scores: finite, the hidden
    key still hidden, the visible keys scale * z.z + b to fp32 precision of b."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(9, 6, generator=gen).to(torch.bfloat16)
    scale = 1e-9
    bias = -torch.rand(2, 9, generator=gen).double() * 3
    bias[0, 4] = attn.HIDDEN
    qf, kf, vf = attn.fold_bias(q, bias, scale)
    assert torch.isfinite(qf.float()).all() and torch.isfinite(kf.float()).all()
    folded = scale * torch.einsum("nd,hkd->hnk", qf.double(), kf.double())
    want = scale * (q.double() @ q.double().T)[None] + bias[:, None, :]
    vis = bias[:, None, :].expand_as(want) > -1e20
    assert (folded[0, :, 4] < -1e20).all()
    assert (folded - want)[vis].abs().max().item() <= 1e-5 * want[vis].abs().max().item()


def test_official_small_problem_at_four_logits_per_row_stays_within_the_rule():
    """The official guard's rows rule (OFFICIAL_LOGIT_PER_ROW, 0.5 since 2026-12-05, 2
    before; docs in _attention_lse): 40 near-singleton rows at a logit bound of ~156 (~4 per
    row, inside MAX_LOGIT) must meet the tests' rule of bench/official_small_n.py, error <=
    2 x the dense fp32 reference's + 1e-4 max|ref| + 1e-5 against float64 (a mutation audit:
    4 per row put this case on the fp32-LSE kernels, 1.25 x the rule)."""
    n, tau = 40, 0.1
    gen = torch.Generator().manual_seed(12)
    z = torch.randn(n, 8, generator=gen, dtype=torch.float64)
    sc = 0.5 + 0.5 * torch.rand(n, 1, generator=gen, dtype=torch.float64)
    z = (z / z.norm(dim=1, keepdim=True) * (160.0 * tau) ** 0.5 * sc).float()
    y = torch.randint(0, n, (n,), generator=gen)
    assert 3 * n < attn.logit_bound(z, 1 / tau) <= attn.MAX_LOGIT["official"]

    def grad(x, backend):
        x = x.clone().requires_grad_()
        balanced_contrastive_loss(x, y, temperature=tau, include_self=False,
                                  variant="official", backend=backend).backward()
        return x.grad.double()

    exp = grad(z.double(), "reference")
    rule = (2 * (grad(z, "reference") - exp).abs().max().item()
            + 1e-4 * exp.abs().max().item() + 1e-5)
    assert (grad(z, "attention") - exp).abs().max().item() <= rule


def test_a_calls_folded_operands_serve_every_call_as_fresh_ones():
    """The bf16 flash branch builds q', v' and the k' buffer once per loss call (``_Fold``) and
    rewrites only k's bias columns per attention call: each call's operands equal a fresh
    ``fold_bias`` of its own bias rows, bit for bit, whichever head count comes first (the
    buffer grows for more heads, a slice serves fewer), and the fill columns stay as built."""
    gen = torch.Generator().manual_seed(8)
    for d in (13, 16):                                  # zero padding after the fold, or none
        q = torch.randn(21, d, generator=gen).to(torch.bfloat16)
        fold = attn._Fold(q)
        for heads in (1, 3, 2, 3):
            bias = -torch.rand(heads, 21, generator=gen) * 9
            bias[0, 2] = attn.HIDDEN
            k = fold.keys(bias, 2.5)
            q_new, k_new, v_new = attn.fold_bias(q, bias, 2.5)
            assert torch.equal(fold.q, q_new) and torch.equal(fold.v, v_new)
            assert k.shape == k_new.shape and torch.equal(k, k_new)


@pytest.mark.parametrize("variant,regime,kind", UPSTREAM_CASES)
@pytest.mark.parametrize("prototypes", [False, True])
def test_extreme_upstream_gradients_of_reduction_none(monkeypatch, variant, regime, kind,
                                                      prototypes):
    """tests/test_lse_symmetric.py's extreme upstream gradients on the attention engine. Before
    (2026-12-06): the key side's log|g| clamped |g| at 1e-38, so with every entry at 1e-39 the
    gradient came out 4-28x the reference's; its small-rows case 350x the rule. float64 rows
    take our engine (the kernels are fp32 / 16-bit): no kernel call there."""
    calls = _spy(monkeypatch)
    assert_upstream_within_rule("attention", variant, prototypes, kind, regime)
    assert bool(calls) == (UPSTREAM_REGIMES[regime][1] == torch.float32)


def test_a_hidden_key_at_large_logits_stays_out_of_its_level(monkeypatch):
    """Hierarchical exact loss on the kernels (1,100 rows, bound 1,000 under the guard's 1,024):
    level 1's prototype 10 e1 is hidden from level 0, where its logit (~300) tops every visible
    one (<= 90). The hidden key's bias must keep it out of level 0's LSE whatever the logit:
    a bias of -200 (a second mutation audit) let it dominate, the gradient 0.6 off."""
    calls = _spy(monkeypatch)
    g = torch.Generator().manual_seed(0)
    n, d, tau = 1100, 8, 0.1
    e1 = torch.zeros(d)
    e1[0] = 1
    z = e1 + 0.3 * torch.randn(n, d, generator=g)
    z = z / z.norm(dim=1, keepdim=True) * 3.0
    ps = [0.5 * torch.randn(3, d, generator=g), torch.stack([10 * e1, -e1])]
    ys = [torch.randint(0, 3, (n,), generator=g), torch.randint(0, 2, (n,), generator=g)]
    loss, dz, _ = _hierarchical_grads(z, ys, ps, temperature=tau, variant="exact")
    assert calls                                      # the kernels ran (no fallback)
    want, want_dz, _ = _sum_of_levels(z, ys, ps, temperature=tau, variant="exact")
    assert abs(loss.double() - want).item() <= 1e-5 * abs(want).item()
    assert _rel_err(dz, want_dz) <= 1e-4


def test_a_large_row_without_upstream_gradient_stays_out_of_the_key_side():
    """reduction "none" on the kernels with the upstream gradient 0 on a row of norm 10 (its own
    logit 1,000; the others' norm 1): the key side's call hides rows of g = 0, so their exp
    never joins its normaliser. A finite bias there (-200 or 0: two mutation audits) let that
    row swamp the others' weights, which underflowed: a NaN gradient."""
    g = torch.Generator().manual_seed(0)
    n, d, tau = 1100, 8, 0.1
    z = torch.randn(n, d, generator=g)
    z = z / z.norm(dim=1, keepdim=True)
    z[0] *= 10.0
    y = torch.randint(0, 5, (n,), generator=g)
    go = torch.ones(n)
    go[0] = 0.0
    zz = z.clone().requires_grad_()
    balanced_contrastive_loss(zz, y, temperature=tau, backend="attention",
                              reduction="none").backward(go)
    zr = z.double().requires_grad_()
    ref(zr, y, temperature=tau, reduction="none").backward(go.double())
    assert torch.isfinite(zz.grad).all()
    assert _rel_err(zz.grad, zr.grad) <= 1e-4


def test_the_adapter_calls_an_op_unavailable_unless_its_schema_fits(monkeypatch):
    """``_op`` / ``available``: a private op without a default overload, or whose schema lacks
    an argument the adapter passes (a torch release that renamed one), is unavailable (the
    loss then runs our own engine), not an AttributeError or a call that fails deep; a device
    other than CPU and CUDA has no kernels. All three unguarded before a second mutation
    audit."""
    attn._op.cache_clear()                             # (and at the end: no answer kept)
    assert attn._op("pow", ("self",)) is None          # aten.pow: overloads, no .default
    assert attn._op(attn._CPU_OP, (*attn._CPU_ARGS, "an_argument_no_release_has")) is None
    monkeypatch.setattr(attn, "_CPU_OP", "pow")
    assert not attn.available("cpu")
    assert not attn.available("meta")
    attn._op.cache_clear()


def test_the_row_max_takes_one_row_a_block_under_a_tiny_budget(monkeypatch):
    """A block budget under one row of keys (a user's $HIERTAIL_CPU_BLOCK_BYTES, or ~12.6M
    keys at the default) still gives one row a block: 0 rows made range() fail in ``_row_max``
    (a second mutation audit). The official loss on the kernels then equals the reference."""
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", "64")          # 16 fp32 columns
    assert attn._max_block_rows(40, torch.device("cpu")) == 1
    g = torch.Generator().manual_seed(0)
    z, y = torch.randn(40, 4, generator=g) * 0.3, torch.arange(40) % 3
    got = balanced_contrastive_loss(z, y, temperature=0.5, variant="official",
                                    backend="attention")
    want = ref(z.double(), y, temperature=0.5, variant="official")
    assert abs(got.double() - want).item() <= 1e-5 * abs(want).item()


def test_the_guards_limits_are_the_documented_ones():
    """docs/LOSS.md's precision guard, as numbers (the guard's tests read the module's
    constants, so a changed constant moved their expectations with it: a second mutation
    audit doubled the exact rows rule, raised the official one to 0.6 and the exact bf16 limit
    to 16,384, and turned within_precision's default variant to the exact one, unnoticed):
    fp32 kernels: exact <= 1,024 and <= max(64, rows), official <= 256 and <= 0.5 x rows; bf16
    kernels: exact <= 8,192, official never."""
    f32, bf16 = torch.float32, torch.bfloat16
    assert attn.rows_limit("exact", f32, 300) == 300
    assert attn.rows_limit("exact", f32, 10) == 64
    assert attn.rows_limit("exact", f32, 5000) == 1024
    assert attn.rows_limit("official", f32, 300) == 150
    assert attn.rows_limit("official", f32, 5000) == 256
    assert attn.rows_limit("exact", bf16, 300) == 8192
    assert attn.rows_limit("official", bf16, 5000) == 0
    z = torch.randn(1000, 8, generator=torch.Generator().manual_seed(0))
    scale = 900 / float(z.norm(dim=1).max() ** 2)           # bound 900: exact yes, official no
    assert attn.within_precision(z, scale, "exact")
    assert not attn.within_precision(z, scale) and not attn.within_precision(z, scale,
                                                                              "official")
