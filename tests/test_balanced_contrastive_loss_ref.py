"""The dense reference of the balanced contrastive loss: hand-computed values, gradcheck,
exact vs official, degenerate rows, input checks."""
from __future__ import annotations

import math

import pytest
import torch

from hiertail_fast.reference import balanced_contrastive_loss_ref as ref

EPS = 1e-7
E = math.e



pytestmark = pytest.mark.usefixtures("one_thread")

def _tiny():
    # s = z z^T = [[1,0,1],[0,1,1],[1,1,2]] (tau = 1); labels 0,0,1 -> w = [1/2, 1/2, 1]
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    return z, torch.tensor([0, 0, 1])


def test_tiny_exact_hand_computed():
    z, y = _tiny()
    # rows 0 and 1: LSE = log(e/2 + 1/2 + e), positive mean (1 + 0)/2; row 2: log(e + e^2) - 2
    lse01 = math.log(1.5 * E + 0.5)
    expected = [lse01 - 0.5, lse01 - 0.5, math.log(E + E * E) - 2.0]
    out = ref(z, y, temperature=1.0, reduction="none")
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64))
    assert ref(z, y, temperature=1.0).item() == pytest.approx(sum(expected) / 3, rel=1e-12)
    assert ref(z, y, temperature=1.0, reduction="sum").item() == pytest.approx(sum(expected))
    # paper Eq. 7 (include_self=False): row 0 and 1 have one positive with s = 0; row 2 none
    out = ref(z, y, temperature=1.0, include_self=False, reduction="none")
    torch.testing.assert_close(out, torch.tensor([lse01, lse01, 0.0], dtype=torch.float64))
    assert ref(z, y, temperature=1.0, include_self=False).item() == pytest.approx(lse01)


def test_tiny_official_hand_computed():
    z, y = _tiny()
    # row 0: M = 1, S^ = [1+eps, 1/e+eps, 1+eps], D = (1+eps)/2 + (1/e+eps)/2 + (1+eps)
    d0 = 1.5 + 0.5 / E + 2 * EPS
    row0 = -0.5 * (math.log((1 + EPS) / d0) + math.log((1 / E + EPS) / d0))
    # row 2: M = 2, S^ = [1/e+eps, 1/e+eps, 1+eps], D = (1/e+eps)/2 * 2 + (1+eps)
    d2 = 1 / E + 1 + 2 * EPS
    row2 = -math.log((1 + EPS) / d2)
    out = ref(z, y, temperature=1.0, reduction="none", variant="official")
    torch.testing.assert_close(out, torch.tensor([row0, row0, row2], dtype=torch.float64))
    # temperature scales s: tau = 0.5 doubles every similarity
    out2 = ref(z * math.sqrt(2.0), y, temperature=1.0, reduction="none", variant="official")
    torch.testing.assert_close(ref(z, y, temperature=0.5, reduction="none", variant="official"),
                               out2)


def test_prototypes_are_rows_with_labels_0_to_m():
    torch.manual_seed(1)
    z, p = torch.randn(9, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 2, 1, 0, 5, 5, 7])
    for variant in ("exact", "official"):
        a = ref(z, y, prototypes=p, variant=variant, reduction="none")
        b = ref(torch.cat([z, p]), torch.cat([y, torch.arange(3)]), variant=variant,
                reduction="none")
        assert a.shape == (12,)
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("include_self", [True, False])
def test_gradcheck_float64(variant, include_self):
    torch.manual_seed(2)
    z = torch.randn(10, 3, dtype=torch.float64, requires_grad=True)
    p = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 0, 1, 1, 1, 2, 4, 4, 4, 9])       # 9 is a singleton class

    def fn(z_, p_):
        return ref(z_, y, prototypes=p_, temperature=0.5, include_self=include_self,
                   variant=variant)

    assert torch.autograd.gradcheck(fn, (z, p))
    none = lambda z_, p_: ref(z_, y, prototypes=p_, temperature=0.5,  # noqa: E731
                              include_self=include_self, variant=variant, reduction="none")
    assert torch.autograd.gradcheck(none, (z, p))


def test_exact_equals_official_where_epsilon_cannot_bind():
    # normalised embeddings, tau = 1: exp(s - M) >= e^-2 >> 1e-7, so the variants agree to
    # ~eps / e^-2 relative
    torch.manual_seed(3)
    z = torch.nn.functional.normalize(torch.randn(300, 16, dtype=torch.float64), dim=1)
    p = torch.nn.functional.normalize(torch.randn(10, 16, dtype=torch.float64), dim=1)
    y = torch.randint(0, 10, (300,))
    a = ref(z, y, prototypes=p, temperature=1.0)
    b = ref(z, y, prototypes=p, temperature=1.0, variant="official")
    assert abs(a.item() - b.item()) / abs(a.item()) < 1e-5
    assert a.item() != b.item()


def test_exact_and_official_differ_where_epsilon_binds():
    # the example: 300 rows, d = 16, N(0, 9), 10 labels + 10 prototypes. The official
    # positive terms clamp at log(1e-7) ~ -16.1, so official ~ 12 while exact is huge.
    torch.manual_seed(0)
    z = torch.randn(300, 16, dtype=torch.float64) * 3
    y = torch.randint(0, 10, (300,))
    p = torch.randn(10, 16, dtype=torch.float64) * 3
    for tau, exact_min in ((1.0, 100.0), (0.1, 1000.0)):
        off = ref(z, y, prototypes=p, temperature=tau, variant="official").item()
        ex = ref(z, y, prototypes=p, temperature=tau).item()
        assert 10.0 < off < 15.0
        assert ex > exact_min
    # per-term clamp: no official row loss exceeds -log(eps) + log(D) with D <= #labels * (1+eps)
    rows = ref(z, y, prototypes=p, temperature=0.1, variant="official", reduction="none")
    assert float(rows.max()) <= -math.log(EPS) + math.log(10 * (1 + EPS)) + 1e-9


def test_singleton_class_without_self_contributes_nothing():
    z = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 0, 1, 2, 2])                     # class 1 has one member
    for variant in ("exact", "official"):
        rows = ref(z, y, include_self=False, reduction="none", variant=variant)
        assert rows[2].item() == 0.0 and torch.isfinite(rows).all()
        mean = ref(z, y, include_self=False, variant=variant)
        torch.testing.assert_close(mean, rows.sum() / 4)
        (g,) = torch.autograd.grad(mean, z)
        assert torch.isfinite(g).all()
    # only singletons: nothing contributes -> 0, finite zero gradient
    loss = ref(z, torch.arange(5), include_self=False)
    (g,) = torch.autograd.grad(loss, z)
    assert loss.item() == 0.0 and torch.count_nonzero(g) == 0


def test_inputs_not_mutated():
    z, y = torch.randn(6, 3), torch.tensor([0, 1, 0, 1, 2, 2])
    p = torch.randn(3, 3)
    zc, yc, pc = z.clone(), y.clone(), p.clone()
    ref(z, y, prototypes=p, variant="official")
    assert torch.equal(z, zc) and torch.equal(y, yc) and torch.equal(p, pc)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("scale", [0.5, 1.5])
def test_16bit_inputs_computed_in_float32(dtype, variant, scale):
    # 16-bit rows are computed in float32, as every fast backend accumulates them: in fp16 the
    # official variant's 1e-7 is subnormal and the backward's 1/(e^(s-M) + 1e-7) ~ 8e6
    # overflowed, inf * 0 = NaN in 32 of 48 gradient entries (an API audit's find)
    g = torch.Generator().manual_seed(0)
    z = (torch.randn(12, 4, generator=g) * scale).to(dtype).requires_grad_()
    y, p = torch.arange(12) % 3, (torch.randn(3, 4, generator=g) * scale).to(dtype)
    gout = torch.randn(15, generator=g, dtype=torch.float64)
    out = ref(z, y, prototypes=p, temperature=0.1, variant=variant, reduction="none")
    out.backward(gout.float())
    z64 = z.detach().double().requires_grad_()
    want = ref(z64, y, prototypes=p.double(), temperature=0.1, variant=variant,
               reduction="none")
    want.backward(gout)
    assert out.dtype == torch.float32 and z.grad.dtype == dtype
    assert torch.isfinite(z.grad).all()
    torch.testing.assert_close(out.double(), want.detach(), rtol=1e-5, atol=1e-5)
    # the float64 gradient rounded to the 16-bit dtype, give or take float32's arithmetic
    ulp = torch.finfo(dtype).eps
    assert ((z.grad.double() - z64.grad).abs() <= ulp * z64.grad.abs() + 1e-5).all()


_Z, _Y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(z=_Z[0], labels=_Y), ValueError, "2-D"),
        (dict(z=_Z.long(), labels=_Y), TypeError, "floating"),
        (dict(z=[[1.0]], labels=_Y), TypeError, "torch.Tensor"),
        (dict(z=_Z, labels=_Y.float()), TypeError, "integer"),
        (dict(z=_Z, labels=_Y[:3]), ValueError, "entries"),
        (dict(z=_Z, labels=_Y[None]), ValueError, "1-D"),
        (dict(z=_Z, labels=-_Y - 1), ValueError, "negative"),
        (dict(z=_Z[:0], labels=_Y[:0]), ValueError, "empty"),
        (dict(z=_Z[:, :0], labels=_Y), ValueError, "empty"),
        (dict(z=torch.where(_Z > 0, _Z, float("nan")), labels=_Y),
         ValueError, "NaN"),
        (dict(z=torch.full((4, 3), float("inf")), labels=_Y), ValueError, "Inf"),
        (dict(z=_Z, labels=_Y, prototypes=torch.randn(2, 4)), ValueError, "width"),
        (dict(z=_Z, labels=_Y, prototypes=torch.randn(2, 3).double()), TypeError, "prototypes"),
        (dict(z=_Z, labels=_Y, prototypes=torch.full((2, 3), float("nan"))), ValueError, "NaN"),
        (dict(z=_Z, labels=_Y, temperature=0.0), ValueError, "temperature"),
        (dict(z=_Z, labels=_Y, temperature=-1.0), ValueError, "temperature"),
        (dict(z=_Z, labels=_Y, temperature=float("nan")), ValueError, "temperature"),
        (dict(z=_Z, labels=_Y, temperature="0.1"), TypeError, "temperature"),
        (dict(z=_Z, labels=_Y, reduction="avg"), ValueError, "reduction"),
        (dict(z=_Z, labels=_Y, variant="paper"), ValueError, "variant"),
    ],
)
def test_bad_inputs(kwargs, exc, match):
    z, labels = kwargs.pop("z"), kwargs.pop("labels")
    with pytest.raises(exc, match=match):
        ref(z, labels, **kwargs)


@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("tau_dtype,tau", [(torch.bfloat16, 0.07), (torch.float16, 1e-5),
                                           (torch.float32, 0.3), (torch.float64, 0.3)])
def test_a_tensor_temperature_scales_as_its_value_does(variant, tau_dtype, tau):
    """A tensor temperature of any float dtype gives the loss and gradients of its value as a
    float, bit for bit (1/tau in float64, rounded once, as the engines take it); in its own
    dtype a bf16 0.07 rounded 1/tau to 8 bits (the loss 8e-4 relative off) and an fp16 1e-5
    overflowed to inf (a NaN loss). Its own gradient against float64 central differences."""
    torch.manual_seed(0)
    z = torch.nn.functional.normalize(torch.randn(32, 8), dim=1)
    y = torch.randint(0, 3, (32,))
    t = torch.tensor(tau, dtype=tau_dtype, requires_grad=True)
    za, zb = z.clone().requires_grad_(), z.clone().requires_grad_()
    got = ref(za, y, temperature=t, variant=variant)
    want = ref(zb, y, temperature=float(t.detach()), variant=variant)
    if tau_dtype == torch.float16:                   # a numpy float16: the same numbers
        import numpy as np
        got_np = ref(z, y, temperature=np.float16(tau), variant=variant)
        assert torch.equal(got_np, want.detach())
    assert torch.isfinite(got) and torch.equal(got.detach(), want.detach())
    (got + want).backward()
    assert torch.equal(za.grad, zb.grad)
    value = float(t.detach())
    z64 = z.double()
    step = value * 1e-6
    numeric = float((ref(z64, y, temperature=value + step, variant=variant)
                     - ref(z64, y, temperature=value - step, variant=variant)) / (2 * step))
    if abs(numeric) > torch.finfo(tau_dtype).max:      # tau's gradient has tau's dtype
        assert float(t.grad) == math.copysign(math.inf, numeric)      # (fp16 1e-5: -8.8e9)
    else:
        rel = max(2e-3, torch.finfo(tau_dtype).eps)
        assert float(t.grad) == pytest.approx(numeric, rel=rel, abs=1e-6)
