"""Nearest-prototype assignment: reference vs sklearn, every backend vs the reference."""
from __future__ import annotations

import pytest
import torch

from hiertail_fast.reference.nearest_prototype import nearest_prototype_ref

try:
    from sklearn.metrics import pairwise_distances_argmin
except ImportError:  # pragma: no cover - scikit-learn is in the [test] extra
    pairwise_distances_argmin = None

requires_sklearn = pytest.mark.skipif(pairwise_distances_argmin is None,
                                      reason="scikit-learn not installed")


def test_reference_hand_computed_and_ties():
    z = torch.tensor([[0.0, 0.0], [2.0, 0.0], [1.0, 0.0], [5.0, 5.0]])
    p = torch.tensor([[0.0, 1.0], [0.0, -1.0], [2.0, 0.0]])
    # row 0: equidistant to p0, p1 -> lowest index 0; row 2: ‖·‖² = 2, 2, 1 -> 2
    assert nearest_prototype_ref(z, p).tolist() == [0, 2, 2, 2]
    assert nearest_prototype_ref(z, p[:1]).tolist() == [0, 0, 0, 0]
    assert nearest_prototype_ref(z[:0], p).shape == (0,)


@requires_sklearn
@pytest.mark.parametrize("n,m,d,dtype", [(200, 17, 8, torch.float32), (57, 3, 33, torch.float64),
                                         (300, 120, 64, torch.float32)])
def test_reference_equals_sklearn(n, m, d, dtype):
    z = torch.randn(n, d, dtype=dtype)
    p = torch.randn(m, d, dtype=dtype)
    expected = pairwise_distances_argmin(z.numpy(), p.numpy())
    assert nearest_prototype_ref(z, p).tolist() == expected.tolist()


@pytest.mark.parametrize("bad", ["dim", "d", "dtype", "nan", "empty", "int"])
def test_reference_bad_inputs(bad):
    z, p = torch.randn(5, 3), torch.randn(2, 3)
    if bad == "dim":
        z = z.view(-1)
    elif bad == "d":
        p = torch.randn(2, 4)
    elif bad == "dtype":
        p = p.double()
    elif bad == "nan":
        z[1, 1] = float("nan")
    elif bad == "empty":
        p = p[:0]
    elif bad == "int":
        z = z.long()
    with pytest.raises((ValueError, TypeError)):
        nearest_prototype_ref(z, p)
