"""Fast backends (torch row blocks, Triton under TRITON_INTERPRET=1) of the balanced
contrastive loss against the float64 reference: values and gradients w.r.t. z and prototypes."""
from __future__ import annotations

import importlib.util

import pytest
import torch

import hiertail_fast.ops._contrastive_pairs as pairs_mod
import hiertail_fast.ops.balanced_contrastive_loss as ops_mod
from hiertail_fast import (
    BalancedContrastiveLoss,
    balanced_contrastive_loss,
    hierarchical_contrastive_loss,
)
from hiertail_fast.reference import balanced_contrastive_loss_ref as ref
from tests.conftest import (
    CUDA_PRESENT,
    backend_device,
    tol,
    triton_importable,
    ulp,
    with_cuda_forms,
)

_HAS_TRITON_OP = triton_importable() and (
    importlib.util.find_spec("hiertail_fast.kernels.balanced_contrastive_loss") is not None
)
TRITON = pytest.param(
    "triton", marks=pytest.mark.skipif(
        not _HAS_TRITON_OP, reason="kernels/balanced_contrastive_loss.py (helper B) or triton "
        "is not available"),
)
BACKENDS = ["torch", "attention", TRITON]



pytestmark = pytest.mark.usefixtures("one_thread")

def _data(n, d, *, n_classes=6, norm=3.0, m=0, dtype=torch.float32, seed=0, singletons=2):
    """Long-tailed labels (Zipf sizes + singleton classes), embeddings of norm ~ `norm`."""
    g = torch.Generator().manual_seed(seed)
    probs = 1.0 / torch.arange(1, n_classes + 1, dtype=torch.float64) ** 1.5
    y = torch.multinomial(probs, n, replacement=True, generator=g)
    k = min(singletons, n)
    y[:k] = n_classes + torch.arange(k)                                  # singleton classes
    z = torch.randn(n, d, generator=g, dtype=torch.float64) * norm / d ** 0.5
    p = torch.randn(m, d, generator=g, dtype=torch.float64) * norm / d ** 0.5 if m else None
    return z.to(dtype), y, (p.to(dtype) if m else None)


def _loss_and_grads(fn, z, y, p, kw, weights=None, device="cpu"):
    """Loss and gradients of `fn` run on `device`, returned on CPU."""
    z = z.detach().to(device, copy=True).requires_grad_()
    p = p.detach().to(device, copy=True).requires_grad_() if p is not None else None
    loss = fn(z, y.to(device), prototypes=p, **kw)
    if weights is None:
        (loss * 2).backward()                                            # grad_output = 2
    else:
        (loss * weights.to(loss.device, loss.dtype)).sum().backward()
    return [t.cpu() for t in [loss.detach(), z.grad] + ([p.grad] if p is not None else [])]


def _fast(backend):
    return lambda *a, **k: balanced_contrastive_loss(*a, backend=backend, **k)


def _check(backend, z, y, p=None, weights=None, low_ref=True, **kw):
    """Backend vs float64 reference. Each tensor's max error must be at most twice that of the
    reference run in the input's dtype plus tol(dtype) scaled by the tensor's magnitude.

    Gradients get 32 ulp of the size of the terms that cancel in them, scale * |z|max * g
    (the backend adds the LSE, positive-pair and row-max parts of ds_ij after multiplying by z;
    the dense reference sums them at the level of s): with the official clamp the true gradient
    can be ~1e-9 while each term is ~30."""
    fast = _loss_and_grads(_fast(backend), z, y, p, kw, weights, backend_device(backend))
    exp = _loss_and_grads(ref, z.double(), y, p.double() if p is not None else None, kw, weights)
    low = _loss_and_grads(ref, z, y, p, kw, weights) if low_ref else None
    t = tol(z.dtype)
    g_max = 2.0 if weights is None else weights.abs().max().item()
    if kw.get("reduction", "mean") == "mean":
        g_max /= z.shape[0]
    zmax = max(z.abs().max().item(), p.abs().max().item() if p is not None else 0.0)
    terms = g_max * zmax * (z.shape[1] ** 0.5) / kw.get("temperature", 0.1)
    for i, (a, e) in enumerate(zip(fast, exp, strict=True)):
        want = torch.float32 if i == 0 and z.dtype in (torch.float16, torch.bfloat16) else z.dtype
        assert a.dtype == want and a.shape == e.shape
        assert torch.isfinite(a).all()
        err = (a.double() - e).abs().max().item()
        ref_err = (low[i].double() - e).abs().max().item() if low_ref else 0.0
        bound = 2 * ref_err + t["atol"] + t["rtol"] * e.abs().max().item()
        if i > 0:
            bound += 32 * torch.finfo(z.dtype).eps * terms
        assert err <= bound, f"tensor {i}: error {err:.3g} > bound {bound:.3g}"
    return fast


@pytest.mark.parametrize("backend", [*BACKENDS, "torch/cuda-forms"])
@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("tau", [0.01, 0.1, 1.0])
@pytest.mark.parametrize("m", [0, 5])
@pytest.mark.usefixtures("exact_rows_rule_off")
def test_matches_reference(request, backend, variant, include_self, tau, m):
    backend = with_cuda_forms(request, backend)
    n = 57 if backend == "triton" else 203
    z, y, p = _data(n, 24, m=m, norm=2.0, seed=int(tau * 100) + m)
    _check(backend, z, y, p, temperature=tau, include_self=include_self, variant=variant)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.usefixtures("exact_rows_rule_off")
def test_reductions_and_grad_output(backend, variant, reduction):
    z, y, p = _data(71, 16, m=4, seed=3)
    w = torch.linspace(-1.0, 2.0, 75) if reduction == "none" else None
    for include_self in (True, False):
        _check(backend, z, y, p, weights=w, reduction=reduction, variant=variant,
               include_self=include_self, temperature=0.1)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_float64_rows_take_the_upstream_gradient_in_float64(reduction):
    """A scalar loss times a weight not representable in fp32 (1/3), float64 rows: the fast
    engines' gradient is the reference's to float64 precision (the s72 mutation audit: the
    upstream gradient cast to float32 gave 3e-8, fp32's rounding, and every test passed)."""
    z, y, p = _data(50, 8, m=3, seed=5)
    z, p = z.double(), p.double()
    c = torch.tensor(1 / 3, dtype=torch.float64)
    grads = {}
    for backend in ("torch", "reference"):
        zz, pp = z.clone().requires_grad_(), p.clone().requires_grad_()
        loss = balanced_contrastive_loss(zz, y, prototypes=pp, reduction=reduction,
                                         backend=backend)
        grads[backend] = torch.autograd.grad(loss * c, (zz, pp))
    for fast, want in zip(grads["torch"], grads["reference"], strict=True):
        assert float((fast - want).abs().max() / want.abs().max()) < 1e-12


def test_16bit_rows_sum_their_levels_gradients_before_rounding():
    """The reference backend of the hierarchical loss widens bf16 rows once, so the levels'
    gradients are added in float32 and rounded to bf16 once: within one bf16 ulp of the float64
    gradient of the same rows (s72: without the widening each level's gradient was rounded
    first, 160 ulps off)."""
    worst = 0.0
    for seed in range(4):
        gen = torch.Generator().manual_seed(seed)
        z = torch.randn(40, 8, dtype=torch.float64, generator=gen).bfloat16()
        ys = [torch.randint(0, k, (40,), generator=gen) for k in (6, 3, 2)]
        grads = []
        for rows in (z, z.double()):
            rows = rows.clone().requires_grad_()
            loss = hierarchical_contrastive_loss(rows, ys, [None] * 3, temperature=0.1,
                                                 backend="reference")
            grads.append(torch.autograd.grad(loss, rows)[0].double())
        got, want = grads
        spacing = ulp(want.abs().clamp(min=1e-30), torch.bfloat16)
        worst = max(worst, float(((got - want).abs() / spacing).max()))
    assert worst <= 1.0, worst


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", ["exact", "official"])
def test_reduction_none_at_large_logits(backend, variant):
    """reduction "none" with signed grad_output at |s| ~ 1e4 (tau 0.01): the backward must use
    logits rounded as the forward's LSE and row max were (a backward that recomputed them in
    other products left ulps of |s| in the official gradient's cancellation: 0.1 % of its terms
    on the CPU engines before; on a GPU, the Triton engine's forward and backward kernels)."""
    z, y, p = _data(200, 8, norm=10.0, m=3, seed=151)
    w = torch.linspace(-1.0, 2.0, 203)
    _check(backend, z, y, p, weights=w, reduction="none", variant=variant, temperature=0.01)


@pytest.mark.parametrize("backend", ["reference", *BACKENDS])
@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.usefixtures("exact_rows_rule_off")
def test_learnable_temperature(backend, variant):
    """temperature as a 0-d tensor that requires grad: dL/dtau against the float64 reference
    (balanced with prototypes and "none" + signed weights, hierarchical), z's gradient as
    usual, and the value bit for bit that of the float temperature (the rows are multiplied by
    exactly 1). A tensor that does not require grad is just its value."""
    dev = backend_device(backend)
    z0, y, p0 = _data(90, 8, m=3, seed=21)
    w = torch.linspace(-1.0, 2.0, 93)

    def run(dtype, device, call, b):
        z = z0.to(device, dtype, copy=True).requires_grad_()
        p = p0.to(device, dtype, copy=True).requires_grad_()
        tau = torch.tensor(0.3, dtype=dtype, device=device, requires_grad=True)
        out = call(z, p, tau, b)
        out.backward()
        return out.detach().cpu(), tau.grad.cpu(), z.grad.cpu()

    calls = {
        "balanced": lambda z, p, tau, b: (balanced_contrastive_loss(
            z, y.to(z.device), prototypes=p, temperature=tau, variant=variant, backend=b,
            reduction="none") * w.to(z.device, z.dtype)).sum(),
        "hierarchical": lambda z, p, tau, b: hierarchical_contrastive_loss(
            z, [y.to(z.device), y.to(z.device) // 2], [p, None], temperature=tau,
            variant=variant, backend=b),
        # prototypes of each level (seen by that level only) holding rows' maxima: the
        # official dL/dtau's per-level row max must leave the other level's keys out (a
        # mutation audit: dropping that mask left every test green, dtau 3 % off)
        "hierarchical, prototypes hold the maxima": lambda z, p, tau, b:
            hierarchical_contrastive_loss(
                z, [y.to(z.device), y.to(z.device) // 2], [p * 3, p[:2] * 3],
                temperature=tau, variant=variant, backend=b),
    }
    for name, call in calls.items():
        got = run(torch.float32, dev, call, backend)
        exp = run(torch.float64, "cpu", call, "reference")
        low = run(torch.float32, "cpu", call, "reference")
        for a, e, lo, what in zip(got, exp, low, ("value", "dtau", "dz"), strict=True):
            err = (a.double() - e).abs().max().item()
            bound = 2 * (lo.double() - e).abs().max().item() + 1e-5 + 1e-4 * e.abs().max().item()
            assert err <= bound, (name, what, err, bound)
        z = z0.to(dev, copy=True).requires_grad_()
        plain = call(z, p0.to(dev), 0.3, backend)
        as_tensor = call(z, p0.to(dev), torch.tensor(0.3, device=dev, requires_grad=True),
                         backend)
        fixed = call(z, p0.to(dev), torch.tensor(0.3, device=dev), backend)
        if dev == "cpu":                          # CUDA's class sums use atomics: run to run
            assert torch.equal(as_tensor, plain) and torch.equal(fixed, plain), name
        else:
            torch.testing.assert_close(as_tensor, plain, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(fixed, plain, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, "autocast"])
@pytest.mark.parametrize("variant", ["exact", "official"])
def test_learnable_temperature_with_16_bit_rows(backend, dtype, variant):
    """A float32 learnable temperature with 16-bit embeddings (or float32 ones under bf16
    autocast): dL/dtau to float32 accuracy against the float64 reference on the same 16-bit
    values. The exact variant's link ran in the rows' dtype and summed a gradient rounded to
    16 bits: 2.7e-3 to 7e-2 off in bf16 (a fuzzing find)."""
    dev = backend_device(backend)
    gen = torch.Generator().manual_seed(5)
    n = 300
    y = torch.randint(0, 4, (n,), generator=gen)
    z32 = torch.randn(n, 8, generator=gen) * 0.4
    z16 = z32.bfloat16() if dtype == "autocast" else z32.to(dtype)
    for call in ("balanced", "hierarchical"):
        t64 = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
        if call == "balanced":
            want = ref(z16.double(), y, temperature=t64, variant=variant)
        else:
            want = (ref(z16.double(), y, temperature=t64, variant=variant)
                    + ref(z16.double(), y // 2, temperature=t64, variant=variant))
        want.backward()
        tau = torch.tensor(0.2, device=dev, requires_grad=True)
        z = (z32 if dtype == "autocast" else z16).to(dev).requires_grad_()
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dtype == "autocast"):
            if call == "balanced":
                got = balanced_contrastive_loss(z, y.to(dev), temperature=tau, variant=variant,
                                                backend=backend)
            else:
                got = hierarchical_contrastive_loss(z, [y.to(dev), y.to(dev) // 2], [None, None],
                                                    temperature=tau, variant=variant,
                                                    backend=backend)
        got.backward()
        assert z.grad.dtype == z.dtype
        rel = abs(tau.grad.item() / t64.grad.item() - 1)
        assert rel <= 2e-5, (call, rel)
        assert abs(got.item() / want.item() - 1) <= 2e-5


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("include_self", [True, False])
def test_official_learnable_temperature_where_its_gradient_nearly_vanishes(backend,
                                                                          include_self):
    """The official variant at tau 0.05 with |s| ~ 10^3: dL/dtau is often ~1e-4 while the
    terms of -<Z, dL/dZ>/(2 tau) (the generic link) are the logits' size; it came out up to
    2e-3 off. Summed at the logits' level with the row max taken out (_temperature_grad) it is
    within twice the dense fp32 reference's error of float64, for the balanced loss ("mean",
    "sum", "none" with signed weights, z learnable or not) and the hierarchical one; the value
    and dL/dz stay those of the float temperature, bit for bit on CPU."""
    dev = backend_device(backend)
    gen = torch.Generator().manual_seed(0)

    def call(z, y, t, reduction, loss):
        out = loss(z, y.to(z.device), temperature=t, variant="official",
                   include_self=include_self, reduction=reduction)
        if reduction == "none":                                    # signed row weights
            out = out * torch.linspace(-1.0, 2.0, out.numel(), dtype=out.dtype,
                                       device=out.device)
        return out.sum()

    def fast(*args, **kw):
        return balanced_contrastive_loss(*args, backend=backend, **kw)

    # six random cases; three under the Triton interpreter (~2 s a case on CPU), all six where
    # the kernels are compiled
    cases = 3 if backend == "triton" and not CUDA_PRESENT else 6
    for case in range(cases):
        z0 = torch.randn(150, 16, generator=gen) * 2
        y = torch.randint(0, 5, (150,), generator=gen)
        for reduction in ("mean", "sum", "none"):
            t64 = torch.tensor(0.05, dtype=torch.float64, requires_grad=True)
            call(z0.double(), y, t64, reduction, ref).backward()
            t32 = torch.tensor(0.05, requires_grad=True)
            call(z0, y, t32, reduction, ref).backward()
            # the dense fp32 reference's own error, twice, as test_learnable_temperature
            bound = 2 * abs(t32.grad.item() - t64.grad.item()) + 1e-5 \
                + 1e-4 * abs(t64.grad.item())
            for z_learns in (True, False):
                z = z0.to(dev, copy=True).requires_grad_(z_learns)
                tau = torch.tensor(0.05, device=dev, requires_grad=True)
                value = call(z, y, tau, reduction, fast)
                value.backward()
                err = abs(tau.grad.item() - t64.grad.item())
                assert err <= bound, (case, reduction, err, bound)
                zf = z0.to(dev, copy=True).requires_grad_(z_learns)
                plain = call(zf, y, tau.item(), reduction, fast)   # the same fp32 tau value
                if dev == "cpu":
                    assert torch.equal(value.detach(), plain.detach()), (case, reduction)
                    if z_learns:
                        plain.backward()
                        assert torch.equal(z.grad, zf.grad), (case, reduction)
    # the hierarchical loss (two levels, prototypes on one)
    z0 = torch.randn(120, 16, generator=gen) * 2
    y = torch.randint(0, 6, (120,), generator=gen)
    p0 = torch.randn(6, 16, generator=gen) * 2
    t64 = torch.tensor(0.05, dtype=torch.float64, requires_grad=True)
    total = 0
    for lab, pro in ((y, p0.double()), (y // 2, None)):
        total = total + ref(z0.double(), lab, prototypes=pro, temperature=t64,
                            variant="official", include_self=include_self)
    total.backward()
    tau = torch.tensor(0.05, device=dev, requires_grad=True)
    hierarchical_contrastive_loss(z0.to(dev).requires_grad_(), [y.to(dev), y.to(dev) // 2],
                                  [p0.to(dev), None], temperature=tau, variant="official",
                                  include_self=include_self, backend=backend).backward()
    err = abs(tau.grad.item() - t64.grad.item())
    assert err <= 2e-5 + 1e-4 * abs(t64.grad.item()), err


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", ["exact", "official"])
def test_learnable_temperature_where_each_row_holds_its_own_lse(backend, variant):
    """Three rows in classes of their own with include_self at tau 0.01 (the seed-61 case 7807
    of ``bench/official_fuzz.py --variant exact --levels 3 --learnable-temperature``): each
    row's own logit (40-190) holds its LSE, the others e^-100 behind, so the loss and dL/dtau
    are ~1e-17. dL/dtau taken as -<Z, dL/dZ>/(2 tau) carried dL/dZ's rounding (1.5e-5, within
    its own rule) times |z|: 1e-3 off in the exact variant (100x the rule), where the dense
    fp32 reference is within 1e-22. Summed at the logits' level (_temperature_grad), both
    variants meet the suite's rule, with "mean", "sum" and "none" (signed weights), and the
    hierarchical loss (the rows' classes, then all in one)."""
    dev = backend_device(backend)
    z0 = torch.tensor([[0.0937136858701706, -0.6326814293861389],
                       [-1.004937767982483, 0.009074294939637184],
                       [1.3763585090637207, 0.23747052252292633]])
    y = torch.tensor([0, 1, 2])
    w = torch.tensor([-1.0, 0.5, 2.0])

    def dtau(dtype, device, b, reduction):
        z = z0.to(device, dtype).requires_grad_()
        tau = torch.tensor(0.01, dtype=dtype, device=device, requires_grad=True)
        if reduction == "hierarchical":
            out = hierarchical_contrastive_loss(
                z, [y.to(device), torch.zeros_like(y, device=device)], [None, None],
                temperature=tau, variant=variant, backend=b)
        else:
            out = balanced_contrastive_loss(z, y.to(device), temperature=tau, variant=variant,
                                            reduction=reduction, backend=b)
            if reduction == "none":
                out = out * w.to(device, dtype)
        out.sum().backward()
        return tau.grad.item()

    for reduction in ("mean", "sum", "none", "hierarchical"):
        want = dtau(torch.float64, "cpu", "reference", reduction)
        low = dtau(torch.float32, "cpu", "reference", reduction)
        got = dtau(torch.float32, dev, backend, reduction)
        bound = 2 * abs(low - want) + 1e-5 + 1e-4 * abs(want)
        assert abs(got - want) <= bound, (reduction, got, want, bound)


def test_learnable_temperature_in_the_module():
    tau = torch.nn.Parameter(torch.tensor(0.5))
    loss_fn = BalancedContrastiveLoss(temperature=tau, variant="official")
    assert any(p is tau for p in loss_fn.parameters())
    z, y, _ = _data(40, 6, seed=2)
    loss_fn(z.requires_grad_(), y).backward()
    assert tau.grad is not None and torch.isfinite(tau.grad) and tau.grad != 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_official_16bit_rows_at_large_logits(backend, dtype):
    """The official loss of 16-bit rows at B = scale * max|z|^2 ~ 1e6: every engine computes
    on the rows' exact values and keeps the loss to fp32 precision (the Triton kernels' fp32
    LSE is not enough there; their guard hands the call over: before it, the value was 0.3 %
    off here and 3.6 % at B ~ 1e7 -- a fuzzing find)."""
    z, y, p = _data(100, 8, norm=10.0, m=3, seed=5)
    z, p = (z * 10).to(dtype), (p * 10).to(dtype)
    kw = dict(temperature=0.01, variant="official", include_self=False)
    assert float(torch.cat([z, p]).float().pow(2).sum(1).max()) / 0.01 > 5e5
    fast = _loss_and_grads(_fast(backend), z, y, p, kw, device=backend_device(backend))
    exp = _loss_and_grads(ref, z.double(), y, p.double(), kw)
    assert abs(fast[0].item() - exp[0].item()) <= 1e-5 * abs(exp[0].item())
    # gradients: _check's bound without its 16-bit dense run (float16 overflows there)
    terms = 2.0 / z.shape[0] * float(torch.cat([z, p]).abs().max()) * 8 ** 0.5 / 0.01
    for a, e in zip(fast[1:], exp[1:], strict=True):
        assert a.dtype == dtype and torch.isfinite(a).all()
        bound = tol(dtype)["atol"] + 32 * torch.finfo(dtype).eps * terms
        assert (a.double() - e).abs().max() <= bound


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1, 7, 129, 300])
def test_ragged_sizes(backend, n):
    d = 33 if n < 300 else 16
    z, y, p = _data(n, d, m=3 if n > 1 else 0, seed=n)
    for variant in ("exact", "official"):
        _check(backend, z, y, p, variant=variant, temperature=0.5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", ["exact", "official"])
def test_unnormalised_large_similarities(backend, variant):
    # norms up to ~30, tau = 0.01: |s| up to ~9e4
    z, y, p = _data(90, 12, m=4, norm=1.0, seed=7)
    z = z * torch.linspace(0.5, 30.0, 90)[:, None] / z.norm(dim=1, keepdim=True)
    assert (z @ z.t()).abs().max() / 0.01 > 1e4
    _check(backend, z, y, p, variant=variant, temperature=0.01)
    _check(backend, z, y, p, variant=variant, temperature=0.01, include_self=False)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.usefixtures("exact_rows_rule_off")
def test_official_clamp_binds_for_some_positives_only(backend):
    # class members near their centre (exp(s - M) >> 1e-7, no clamp) and far ones (clamped)
    g = torch.Generator().manual_seed(11)
    centres = torch.randn(4, 8, generator=g) * 2
    y = torch.arange(80) % 4
    z = centres[y] + 0.05 * torch.randn(80, 8, generator=g)
    z[::3] = torch.randn(27, 8, generator=g) * 2                          # far members
    tau = 0.1
    s = (z.double() @ z.double().t()) / tau
    e = torch.exp(s - s.max(1, keepdim=True).values)
    same = y[:, None] == y[None, :]
    assert (e[same] < 1e-9).any() and (e[same] > 1e-3).any()              # both regimes
    out = _check(backend, z, y, None, variant="official", temperature=tau)
    dev = backend_device(backend)
    ex = balanced_contrastive_loss(z.to(dev), y.to(dev), temperature=tau, backend=backend)
    assert ex.item() > out[0].item() + 1.0                                # the clamp matters


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs(backend, dtype):
    z, y, p = _data(64, 16, m=3, seed=5, dtype=dtype)
    for variant in ("exact", "official"):
        fast = _loss_and_grads(_fast(backend), z, y, p, dict(variant=variant, temperature=0.5),
                               None, backend_device(backend))
        exp = _loss_and_grads(ref, z.float(), y, p.float(), dict(variant=variant,
                                                                 temperature=0.5))
        low = _loss_and_grads(ref, z, y, p, dict(variant=variant, temperature=0.5))
        for i, (a, e, lo) in enumerate(zip(fast, exp, low, strict=True)):
            assert a.dtype == (torch.float32 if i == 0 else dtype)  # the loss value in fp32
            assert torch.isfinite(a.float()).all()
            err = (a.float() - e).abs().max().item()
            low_err = (lo.float() - e).abs().max().item()
            assert err <= 2 * low_err + tol(dtype)["atol"] * max(1.0, e.abs().max().item())


@pytest.mark.parametrize("variant", ["exact", "official"])
def test_torch_many_blocks_and_big_groups(monkeypatch, variant):
    # several row blocks, several GEMM blocks per big class, pair chunks: N = 3000
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(4 * 3010 * 128))
    monkeypatch.setattr(pairs_mod, "BLOCK_ELEMS", 1 << 16)
    monkeypatch.setattr(pairs_mod, "PAIR_CHUNK", 1 << 10)
    z, y, p = _data(3000, 32, n_classes=40, m=10, seed=9)
    _check("torch", z, y, p, low_ref=False, variant=variant, temperature=0.2,
           include_self=variant == "exact")


@pytest.mark.parametrize("backend", [*BACKENDS, "torch/cuda-forms"])
@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("include_self", [True, False])
def test_hierarchical_equals_sum_of_levels(request, backend, variant, include_self, monkeypatch):
    backend = with_cuda_forms(request, backend)
    if backend == "torch":
        monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(4 * 100 * 16))   # several blocks
    z, y0, _ = _data(70, 12, n_classes=5, seed=1, dtype=torch.float64)
    g = torch.Generator().manual_seed(2)
    labels = [y0 % 5, torch.randint(0, 3, (70,), generator=g), torch.randint(0, 2, (70,),
                                                                           generator=g)]
    protos = [torch.randn(5, 12, generator=g, dtype=torch.float64),
              torch.randn(3, 12, generator=g, dtype=torch.float64) * 3, None]
    if backend == "triton":
        z = z.float()
        protos = [q.float() if q is not None else None for q in protos]
    dev = backend_device(backend)
    zf = z.to(dev, copy=True).requires_grad_()
    pf = [q.to(dev, copy=True).requires_grad_() if q is not None else None for q in protos]
    fused = hierarchical_contrastive_loss(zf, [lab.to(dev) for lab in labels], pf,
                                          temperature=0.3, variant=variant,
                                          include_self=include_self, backend=backend)
    fused.backward()
    zr = z.double().clone().requires_grad_()
    pr = [q.double().clone().requires_grad_() if q is not None else None for q in protos]
    total = sum(ref(zr, lab, prototypes=q, temperature=0.3, variant=variant,
                    include_self=include_self) for lab, q in zip(labels, pr, strict=True))
    total.backward()
    t = tol(z.dtype)
    torch.testing.assert_close(fused.double().cpu(), total.detach(), **t)
    torch.testing.assert_close(zf.grad.double().cpu(), zr.grad, **t)
    for a, b in zip(pf[:2], pr[:2], strict=True):
        torch.testing.assert_close(a.grad.double().cpu(), b.grad, **t)


@pytest.mark.parametrize("n_cols_common", [80, 0])
def test_torch_lse_contract_multilevel(monkeypatch, n_cols_common):
    """_lse_torch.lse_forward / lse_backward / lse_fused vs dense formulas: hidden keys, 3 levels,
    several row blocks, first arg-max on ties (duplicate rows), no key visible to every level."""
    from hiertail_fast.ops import _lse_torch

    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(4 * 101 * 9))
    g = torch.Generator().manual_seed(3)
    # multiples of 1/64: every logit exact, so rows 10 and 50 tie whatever order a GEMM sums
    # in (the engine's 5-row blocks against the dense z z^T here; see the Triton split-ties test)
    z = (torch.randn(101, 7, generator=g, dtype=torch.float64) * 3 * 64).round() / 64
    z[50] = z[10]                                                        # ties in the max
    log_w = -torch.rand(3, 101, generator=g, dtype=torch.float64) * 3
    log_w[0, 90:] = float("-inf")
    log_w[1, 80:90] = float("-inf")
    if n_cols_common == 0:                      # every key hidden from some level:
        log_w[2, :] = float("-inf")
        log_w[2, 80:90] = 0.0                     # level 2 only sees keys 80..89
        assert not bool(torch.isfinite(log_w).all(dim=0).any())
    s = z @ z.t() * 0.7
    visible = torch.isfinite(log_w)
    lse_d = torch.logsumexp(s[None] + log_w[:, None, :], dim=2)
    max_d, arg_d = s[None].masked_fill(~visible[:, None, :], float("-inf")).max(dim=2)
    lse, rmax, amax = _lse_torch.lse_forward(z, log_w, 0.7, True)
    torch.testing.assert_close(lse, lse_d)
    torch.testing.assert_close(rmax, max_d)
    assert torch.equal(amax, arg_d)
    assert bool((amax[:2, 10] == 10).all() and (amax[:2, 50] == 10).all())   # first index
    grad = torch.randn(3, 101, generator=g, dtype=torch.float64)
    zz = z.clone().requires_grad_()
    (torch.logsumexp((zz @ zz.t() * 0.7)[None] + log_w[:, None, :], dim=2) * grad).sum().backward()
    torch.testing.assert_close(_lse_torch.lse_backward(z, log_w, lse, grad, 0.7), zz.grad)
    fused = _lse_torch.lse_fused(z, log_w, 0.7, False, lambda rows, lb, mb: grad[:, rows])
    torch.testing.assert_close(fused[3], zz.grad)


def test_torch_lse_contract_corners():
    """Two corners of the contract above that the public losses never reach (every node row is
    visible at every level, prototypes come after the nodes), found unguarded by a second
    mutation audit: a level that sees no key at all while no key is common gets lse = -inf
    (an empty sum; NaN before), and a level-specific key tying a common key exactly wins the
    arg-max when its index is smaller (torch.max's first index)."""
    from hiertail_fast.ops import _lse_torch

    g = torch.Generator().manual_seed(0)
    z = torch.randn(12, 4, generator=g, dtype=torch.float64)
    log_w = torch.zeros(3, 12, dtype=torch.float64)
    log_w[0, 6:] = log_w[1, :6] = log_w[2, :] = float("-inf")   # no common key; level 2 none
    lse = _lse_torch.lse_forward(z, log_w, 0.5, True)[0]
    assert torch.equal(lse[2], torch.full((12,), float("-inf"), dtype=torch.float64))
    dense = torch.logsumexp((z @ z.t() * 0.5)[None] + log_w[:2, None, :], dim=2)
    torch.testing.assert_close(lse[:2], dense)
    # its gradient: the blind level's coefficient 0 masks exp(-inf - (-inf)) = NaN (dz NaN
    # without the mask: a third corner of the same audit)
    coef = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)[:, None].expand(3, 12)
    dz = _lse_torch.lse_fused(z, log_w, 0.5, False, lambda rows, lb, mb: coef[:, rows])[3]
    zz = z.clone().requires_grad_()
    (torch.logsumexp((zz @ zz.t() * 0.5)[None] + log_w[:2, None, :], dim=2)
     * coef[:2]).sum().backward()
    torch.testing.assert_close(dz, zz.grad)
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [1.0, 0.0], [-1.0, 0.0]],
                     dtype=torch.float64)
    log_w = torch.zeros(2, 5, dtype=torch.float64)
    log_w[1, 0] = float("-inf")        # key 0 level-specific (hidden from level 1); key 3 its copy
    amax = _lse_torch.lse_forward(z, log_w, 1.0, True)[2]
    assert torch.equal(amax[0], (z @ z.t()).max(dim=1).indices)       # [0, 1, 0, 0, 4]
    assert amax[0].tolist() == [0, 1, 0, 0, 4]


def test_functional_module_agree_and_repr():
    z, y, p = _data(50, 8, m=3, seed=4)
    mod = BalancedContrastiveLoss(temperature=0.2, include_self=False, variant="official")
    assert "variant='official'" in repr(mod) and "temperature=0.2" in repr(mod)
    a = mod(z, y, p)
    b = balanced_contrastive_loss(z, y, prototypes=p, temperature=0.2, include_self=False,
                                  variant="official")
    assert torch.equal(a, b)


def test_caller_tensors_not_mutated_and_deterministic():
    z, y, p = _data(120, 8, m=4, seed=6)
    z.requires_grad_()
    zc, yc, pc = z.detach().clone(), y.clone(), p.clone()
    for variant in ("exact", "official"):
        for reduction in ("mean", "none"):
            l1 = balanced_contrastive_loss(z, y, prototypes=p, variant=variant,
                                           reduction=reduction)
            (g1,) = torch.autograd.grad(l1.sum(), z)
            l2 = balanced_contrastive_loss(z, y, prototypes=p, variant=variant,
                                           reduction=reduction)
            (g2,) = torch.autograd.grad(l2.sum(), z)
            assert torch.equal(l1, l2) and torch.equal(g1, g2)
    assert torch.equal(z.detach(), zc) and torch.equal(y, yc) and torch.equal(p, pc)
    with torch.no_grad():
        torch.testing.assert_close(balanced_contrastive_loss(z, y, prototypes=p), l1.new_tensor(
            balanced_contrastive_loss(z, y, prototypes=p).item()))


def test_reference_backend_routes_to_reference(monkeypatch):
    calls = []

    def spy(*a, **k):
        calls.append(1)
        return ref(*a, **k)

    monkeypatch.setattr(ops_mod, "balanced_contrastive_loss_ref", spy)
    z, y, p = _data(20, 4, m=2)
    balanced_contrastive_loss(z, y, prototypes=p, backend="reference")
    hierarchical_contrastive_loss(z, [y, y], [p, None], backend="reference")
    assert len(calls) == 3
    monkeypatch.setenv("HIERTAIL_BACKEND", "reference")
    balanced_contrastive_loss(z, y)
    assert len(calls) == 4
    monkeypatch.setenv("HIERTAIL_BACKEND", "torch")
    balanced_contrastive_loss(z, y)
    assert len(calls) == 4


def test_bad_inputs_public_api():
    z, y, p = _data(10, 4, m=2)
    with pytest.raises(ValueError, match="NaN"):
        balanced_contrastive_loss(torch.full((10, 4), float("nan")), y)
    with pytest.raises(ValueError, match="entries"):
        balanced_contrastive_loss(z, y[:5])
    with pytest.raises(ValueError, match="backend"):
        balanced_contrastive_loss(z, y, backend="cuda")
    with pytest.raises(ValueError, match="temperature"):
        BalancedContrastiveLoss(temperature=0.0)(z, y)
    with pytest.raises(ValueError, match="per level"):
        hierarchical_contrastive_loss(z, [y, y], [p])
    with pytest.raises(TypeError, match="sequences"):
        hierarchical_contrastive_loss(z, y, [p])
    with pytest.raises(ValueError, match="width"):
        hierarchical_contrastive_loss(z, [y], [torch.randn(2, 5)])


@pytest.mark.parametrize("backend", ["reference", *BACKENDS])
@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.usefixtures("exact_rows_rule_off")
def test_mean_over_no_contributing_row_is_zero(backend, variant):
    """Every class a singleton and include_self=False: no row has a positive, so no row
    contributes and the "mean" is 0 with zero gradients (README), not 0/0 = NaN. Only the
    seeded fuzz suite caught a mean without its clamp (a mutation audit); hierarchical too."""
    dev = backend_device(backend)
    z = torch.randn(5, 4, device=dev, requires_grad=True)
    y = torch.arange(5, device=dev)
    loss = balanced_contrastive_loss(z, y, include_self=False, variant=variant, backend=backend)
    total = hierarchical_contrastive_loss(z, [y, y + 7], [None, None], include_self=False,
                                          variant=variant, backend=backend)
    (loss + total).backward()
    assert float(loss) == 0.0 and float(total) == 0.0
    assert torch.equal(z.grad, torch.zeros_like(z))
