"""Corners of the balanced contrastive losses as users call them, found by a mutation audit
(each test kills a mutant the other test files let through): every level of the hierarchical
loss validated, the symmetric CPU engine's tiles covering every pair at every size, and the
official variant's positive pairs across chunk boundaries (its forward without a fused
gradient). Values against the float64 reference."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import hiertail_fast.ops._lse_symmetric as sym
from hiertail_fast import (
    BalancedContrastiveLoss,
    balanced_contrastive_loss,
    hierarchical_contrastive_loss,
)
from hiertail_fast.reference import balanced_contrastive_loss_ref as ref
from tests import test_lse_symmetric
from tests.conftest import tol

pytestmark = pytest.mark.usefixtures("one_thread")
forced = test_lse_symmetric.forced     # the symmetric engine forced on, 16-row blocks, a spy

_PIECE_BYTES = str(4 * 16 * 40)          # HIERTAIL_CPU_BLOCK_BYTES: 40-column pieces at 16 rows


def _bad_second_levels():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(12, 4, generator=g)
    y = torch.randint(0, 3, (12,), generator=g)
    return z, y, [
        ([y, y[:11]], [None, None], ValueError, "11 entries"),
        ([y, y - 5], [None, None], ValueError, "negative"),
        ([y, y.float()], [None, None], TypeError, "integer"),
        ([y, y], [None, torch.randn(3, 5)], ValueError, "width"),
        ([y, y], [None, torch.randn(3, 4, dtype=torch.float64)], TypeError,
         "float64"),
        ([y, y], [None, torch.full((3, 4), float("nan"))], ValueError, "NaN"),
    ]


def test_hierarchical_validates_every_level():
    """A mutation audit: each level's labels and prototypes are checked, not only the first
    level's. A bad second level (labels of the wrong length, negative or float labels,
    prototypes of the wrong width or dtype, NaN prototypes) must raise a ValueError/TypeError
    naming the problem; validating level 0 alone returned a loss for negative or float labels
    and float64 prototypes, NaN for NaN prototypes, and crashed deep in torch otherwise."""
    z, y, cases = _bad_second_levels()
    assert torch.isfinite(hierarchical_contrastive_loss(z, [y, y // 2], [None, None]))
    for labs, pros, err, words in cases:
        with pytest.raises(err, match=words):
            hierarchical_contrastive_loss(z, labs, pros, temperature=0.5)
        # the same input at level 0 gives the same error (one rule for every level)
        with pytest.raises(err, match=words):
            hierarchical_contrastive_loss(z, labs[::-1], pros[::-1], temperature=0.5)


def test_the_documented_argument_forms_are_taken():
    """Forms the docstrings and docs/GUARANTEES.md accept, each refused or broken by a mutant
    that passed every test (a mutation pass, session 73): levels as any iterable (generators:
    "no len()"), a numpy integer temperature (a TypeError), a tensor temperature up to float32's
    largest (3e38 refused at half of it), and 16-bit rows whose norms pass float16's range (the
    logits are float32: norms taken in float16 overflowed and the call was refused)."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(6, 3, generator=g)
    y1, y2 = torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([0, 0, 0, 1, 1, 1])
    p1, p2 = torch.randn(3, 3, generator=g), torch.randn(2, 3, generator=g)
    as_lists = hierarchical_contrastive_loss(z, [y1, y2], [p1, p2], temperature=0.5)
    as_generators = hierarchical_contrastive_loss(z, (t for t in (y1, y2)),
                                                  (p for p in (p1, p2)), temperature=0.5)
    assert torch.equal(as_generators, as_lists)
    for numpy_tau, tau in ((np.int64(1), 1.0), (np.int32(2), 2.0), (np.float32(0.5), 0.5)):
        want = balanced_contrastive_loss(z, y1, temperature=tau)
        assert torch.equal(balanced_contrastive_loss(z, y1, temperature=numpy_tau), want)
        assert torch.equal(BalancedContrastiveLoss(temperature=numpy_tau)(z, y1), want)
    big = torch.tensor(3e38)
    torch.testing.assert_close(balanced_contrastive_loss(z, y1, temperature=big),
                               balanced_contrastive_loss(z, y1, temperature=3e38))
    wide = torch.tensor([[60000., 60000.], [1., 2.], [3., -1.], [-2., 5.]], dtype=torch.float16)
    labels = torch.tensor([0, 0, 1, 1])
    for backend in ("reference", None):
        got = balanced_contrastive_loss(wide, labels, temperature=1e3, backend=backend)
        want = balanced_contrastive_loss(wide.double(), labels, temperature=1e3,
                                         backend="reference")
        torch.testing.assert_close(got.double(), want, **tol(torch.float16))


@pytest.mark.parametrize("n", [*range(1, 130), 200])
def test_symmetric_tiles_cover_every_pair_at_every_size(monkeypatch, n):
    """A mutation audit: ``_lse_symmetric._tiles`` covers each unordered pair of rows exactly
    once at EVERY size, including sizes whose last off-diagonal piece is one column wide
    (n = 57: block [0, 16) has pieces [16, 56) and [56, 57)); a piece loop that stopped one
    column early dropped that piece, and the loss lost those pairs."""
    monkeypatch.setattr(sym, "MAX_BLOCK_ROWS", 16)
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", _PIECE_BYTES)
    tiles, size = sym._tiles(n)
    cover = torch.zeros(n, n, dtype=torch.long)
    for r0, r1, c0, c1 in tiles:
        assert 0 <= r0 < r1 <= n and 0 <= c0 < c1 <= n
        assert (r1 - r0) * (c1 - c0) <= size
        cover[r0:r1, c0:c1] += 1
    block = torch.arange(n) // 16
    same = block[:, None] == block[None, :]
    later = block[:, None] < block[None, :]
    assert (cover[same] == 1).all()
    assert (cover[later] == 1).all()
    assert (cover[~same & ~later] == 0).all()


@pytest.mark.parametrize("variant", ["exact", "official"])
def test_symmetric_engine_with_a_one_column_last_piece(monkeypatch, forced, variant):
    """A mutation audit: the symmetric engine (forced on, 16-row blocks, 40-column pieces) at
    n = 57, whose first block's last piece is the single column 56: loss and gradient within
    fp32 noise of the float64 reference (a dropped one-column piece put the loss 2.8e-3 and
    the gradient 8e-3 off in the exact variant)."""
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", _PIECE_BYTES)
    g = torch.Generator().manual_seed(0)
    z = torch.randn(57, 8, generator=g)
    y = torch.randint(0, 4, (57,), generator=g)
    zz = z.clone().requires_grad_()
    loss = balanced_contrastive_loss(zz, y, temperature=0.5, variant=variant, backend="torch")
    loss.backward()
    assert forced["fused"] == 1                             # the symmetric engine ran
    z64 = z.double().requires_grad_()
    exp = ref(z64, y, temperature=0.5, variant=variant)
    exp.backward()
    assert abs(loss.item() - exp.item()) <= 1e-5 * abs(exp.item())
    torch.testing.assert_close(zz.grad.double(), z64.grad, rtol=0, atol=1e-6)


@pytest.mark.parametrize("grad", [False, True])
def test_official_forward_rows_across_pair_chunks(monkeypatch, forced, grad):
    """A mutation audit: the official variant's forward without a fused gradient
    (reduction="none"; a scalar loss under no_grad) on the symmetric engine takes its positive
    terms from ``_contrastive_pairs.positive_pairs``, whose small groups go in chunks of
    PAIR_CHUNK // SMALL_GROUP rows (here 5, so 120 rows make 24 chunks). Every row's loss must
    match the float64 reference: a chunk slice one row short dropped each chunk's last row's
    positives (at the default sizes, N = 1,500: a row 14.5 off, the mean 1e-2 off)."""
    import hiertail_fast.ops._contrastive_pairs as pairs_mod

    monkeypatch.setattr(pairs_mod, "PAIR_CHUNK", 5 * pairs_mod.SMALL_GROUP)
    g = torch.Generator().manual_seed(1)
    z = torch.randn(120, 8, generator=g)
    y = torch.randint(0, 12, (120,), generator=g)                      # groups of ~10
    exp = ref(z.double(), y, temperature=0.5, variant="official", reduction="none")
    zz = z.clone().requires_grad_(grad)
    rows = balanced_contrastive_loss(zz, y, temperature=0.5, variant="official",
                                     reduction="none", backend="torch")
    torch.testing.assert_close(rows.detach().double(), exp, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        mean = balanced_contrastive_loss(z, y, temperature=0.5, variant="official",
                                         backend="torch")
    assert abs(mean.item() - exp.mean().item()) <= 1e-5 * abs(exp.mean().item())
