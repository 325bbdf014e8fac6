"""The official variant's row max, its arg-max and the positives' tie rule where the engines
take a path the rest of the suite never reached: corners the mutation audit of the loss's
Python modules (2026-12-03) found unchecked (each test failed on the mutant it describes,
passes on main). CPU engines, float32 against the float64 reference.

- the tie bound of ``_contrastive_pairs._tie_bound`` scales with |z_i| max|z|, not |z_i|²: a
  short row (norm 1) whose max is a long row (norm 1000) and that row's exact copy.
- ``_positive_blocks``: a row whose level max is its own prototype only a rounding above its
  best node key goes to the pair lists with the tie rule, not (also) through the C kernel;
  at a level the blocks leave to the separate pair pass (levels that do not nest), not
  through the block's pair lists either (2026-12-06: its gradient was counted twice).
- the row-block engine's level-specific keys: a prototype that ties a node key exactly
  (different rows, equal logits) gets no share of the max; the first index (the node) does.
- ``_loss_passes.official_sums`` moves the arg-max to the FIRST bitwise-equal key row even
  when an engine reports a later one (a GEMM that rounds equal columns apart: this CPU's does
  not, so the test makes the attention engine's row max report the last duplicate).
"""
from __future__ import annotations

import pytest
import torch

from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss
from hiertail_fast.ops import _attention_lse, _positive_blocks
from hiertail_fast.reference import balanced_contrastive_loss_ref as ref

TOL32 = dict(rtol=1e-4, atol=1e-5)      # tests/conftest.py's float32 tolerance
TOL = {torch.float32: TOL32, torch.float64: dict(rtol=1e-7, atol=1e-9)}


def _short_row_pointing_at_a_long_row_and_its_copy(seed: int):
    g = torch.Generator().manual_seed(seed)
    n, d = 30, 64
    z = torch.randn(n, d, generator=g)
    z = z / z.norm(dim=1, keepdim=True)
    big = z[1] * 1000.0
    z[0] = z[1] + 0.05 * z[0]
    z[0] = z[0] / z[0].norm()                 # row 0: norm 1, its max is the big row
    z[1] = big
    z[2] = big                                # ... and that row's exact copy
    # two levels that do not nest: one of them goes through the pair pass
    ys = [torch.randint(0, 3, (n,), generator=g), torch.randint(0, 3, (n,), generator=g)]
    for y in ys:
        y[:3] = 0                             # rows 0, 1, 2 positives of each other
    return z, ys


@pytest.mark.parametrize("seed", [0, 2, 5])
def test_copy_of_the_argmax_row_ties_for_a_short_row(seed):
    """Logits ~1e8 (inside the validated bound): the copy's recomputed logit rounds apart from
    M_i by more than a |z_i|² bound. The dense reference uses one s for both, so its fp32
    error is 0 there; the rule of tests/test_contrastive_numerics.py applies."""
    z, ys = _short_row_pointing_at_a_long_row_and_its_copy(seed)
    tau = 1e-5
    want = sum(ref(z.double(), y, temperature=tau, variant="official") for y in ys)
    low = sum(ref(z, y, temperature=tau, variant="official") for y in ys).double()
    got = hierarchical_contrastive_loss(z.clone().requires_grad_(True), ys, [None, None],
                                        temperature=tau, variant="official", backend="torch")
    err = abs(float(got.detach().double() - want))
    bound = 2 * abs(float(low - want)) + 1e-5 + 1e-4 * abs(float(want))
    assert err <= bound, f"error {err:.3g} > {bound:.3g}"


def _hierarchical_grads(z, labels, p0, backend, dtype, tau):
    z = z.clone().to(dtype).requires_grad_(True)
    p = p0.clone().to(dtype).requires_grad_(True)
    loss = hierarchical_contrastive_loss(z, labels, [p, None], temperature=tau,
                                         variant="official", backend=backend)
    loss.backward()
    return loss.detach().double(), z.grad.double(), p.grad.double()


@pytest.mark.parametrize("nested", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prototype_a_rounding_above_the_node_max(seed, nested, monkeypatch):
    """Nested levels: both levels' positives come from the blocks. Levels that do not nest:
    the prototypes' level has groups that are not contiguous in the key order, so the blocks
    leave it to the separate pair pass, and its near-tie row must not go through the block's
    pair lists as well (its gradient coefficients would be added twice: 3e-2 off; the loss
    value, whose T of that level is never read, stays right)."""
    handled = []
    real_init = _positive_blocks.BlockPositives.__init__

    def spy(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        handled.append(list(self.handled))

    monkeypatch.setattr(_positive_blocks.BlockPositives, "__init__", spy)
    g = torch.Generator().manual_seed(seed)
    n, d = 40, 8
    z = torch.randn(n, d, generator=g) * 0.5
    z[0] *= 2.5                          # row 0's best node key is itself
    y0 = torch.randint(0, 4, (n,), generator=g)
    y1 = y0 // 2 if nested else torch.randint(0, 2, (n,), generator=g)
    labels = [y0, y1]
    p0 = torch.randn(4, d, generator=g) * 0.5
    p0[y0[0]] = z[0] * (1 + 1e-6)        # row 0's level-0 max: its own prototype, by ~1 ulp
    s = z[0] @ torch.cat([z, p0]).t()
    assert s.argmax() == n + y0[0]       # the precondition: a rest-key max
    want = _hierarchical_grads(z, labels, p0, "reference", torch.float64, 0.5)
    got = _hierarchical_grads(z, labels, p0, "torch", torch.float32, 0.5)
    assert handled and handled[-1][0] is nested     # the path the case is for
    for w, a in zip(want, got, strict=True):
        torch.testing.assert_close(a, w, **TOL32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_prototype_tying_a_node_key_gets_no_row_max_gradient(dtype):
    """Integer rows make the tie exact on every engine; tau = 0.05 puts the row's other
    positives far below its max, so the max's share of the gradient is large (at tau = 0.5 it
    nearly cancels and the routing does not show)."""
    # row 0 = e1; prototype 0 = e1 + e2: z_0 . P_0 = 1 = z_0 . z_0, the row's max (every other
    # node has z_0 . z_k <= 0 or is not e1); the first index is node 0
    z = torch.tensor([[1., 0, 0], [0, 1, 0], [0, 0, 1], [-1, 0, 0], [0, -1, 1], [0, 1, -1]])
    p0 = torch.tensor([[1., 1, 0], [0, 0, -1]])
    labels = [torch.tensor([0, 1, 0, 1, 0, 1]), torch.tensor([0, 0, 1, 1, 2, 2])]
    want = _hierarchical_grads(z, labels, p0, "reference", torch.float64, 0.05)
    got = _hierarchical_grads(z, labels, p0, "torch", dtype, 0.05)
    for w, a in zip(want, got, strict=True):
        torch.testing.assert_close(a, w, **TOL[dtype])


def _last_equal_row(z: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    eq = (z[idx][..., None, :] == z).all(-1)                               # [..., N]
    return torch.where(eq, torch.arange(z.shape[0]), -1).amax(-1)


def test_official_gradient_follows_the_first_duplicate_whatever_the_engine_reports(
        monkeypatch):
    g = torch.Generator().manual_seed(0)
    n, d = 160, 8              # (a bound of ~68: inside the guard's rows rule, 0.5 per row)
    z = torch.randn(n, d, generator=g) * 0.3
    z[0] = z[0] / z[0].norm() * 1.85                # row 0's max: itself (|z_0|^2 ~ 3.4)
    z[7] = z[0]                                     # and its exact duplicate, row 7
    y = torch.randint(0, 4, (n,), generator=g)
    tau = 0.05                                      # positives far below the max: dM matters
    assert _attention_lse.within_precision(z, 1 / tau, "official")   # attention serves it
    real = _attention_lse._row_max

    def later_duplicate(zz, *args):
        rowmax, argmax = real(zz, *args)
        return rowmax, _last_equal_row(zz.float(), argmax)

    monkeypatch.setattr(_attention_lse, "_row_max", later_duplicate)
    zr = z.double().requires_grad_(True)
    want = balanced_contrastive_loss(zr, y, temperature=tau, variant="official",
                                     backend="reference")
    want.backward()
    za = z.clone().requires_grad_(True)
    got = balanced_contrastive_loss(za, y, temperature=tau, variant="official",
                                    backend="attention")
    got.backward()
    torch.testing.assert_close(got.double(), want.detach(), **TOL32)
    torch.testing.assert_close(za.grad.double(), zr.grad, **TOL32)
