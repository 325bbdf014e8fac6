"""Shared input checks: the one-pass finiteness test and the error messages built on it."""
from __future__ import annotations

import pytest
import torch

from hiertail_fast._validation import all_finite, check_edge_weight, check_float_matrix


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_all_finite_finds_every_bad_entry(dtype, bad):
    x = torch.randn(37, 5).to(dtype)
    assert all_finite(x)
    for pos in [(0, 0), (36, 4), (17, 2)]:
        y = x.clone()
        y[pos] = bad
        assert not all_finite(y)
        assert not all_finite(y.t())  # non-contiguous view
        with pytest.raises(ValueError, match="x contains NaN or Inf"):
            check_float_matrix(y, "x")
    # an inf and a -inf, or NaN next to inf: no cancellation into a finite sum
    y = x.clone()
    y[1, 1], y[2, 2] = float("inf"), -float("inf")
    assert not all_finite(y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_all_finite_when_the_sum_overflows(dtype):
    big = torch.finfo(dtype).max / 2
    x = torch.full((8, 8), big, dtype=dtype)  # every entry finite, their sum is not
    assert not torch.isfinite(x.sum())
    assert all_finite(x)
    x[3, 3] = float("nan")
    assert not all_finite(x)


def test_all_finite_empty_and_edge_weight():
    assert all_finite(torch.empty(0, 3))
    assert check_edge_weight(torch.ones(4), 4) is not None
    with pytest.raises(ValueError, match="edge_weight contains NaN or Inf"):
        check_edge_weight(torch.tensor([1.0, float("nan"), 2.0]), 3)


def test_shared_training_argument_checks():
    """epochs / patience (train_hiertail and train_baseline), seeds and devices."""
    import numpy as np

    from hiertail_fast._validation import check_device, check_epochs_patience, check_seed

    assert check_epochs_patience(np.int64(3), 0) == (3, 0)
    for bad in ((2.5, 1), (True, 1), (1, float("nan")), (1, "2")):
        with pytest.raises(TypeError, match="must be an int"):
            check_epochs_patience(*bad)
    with pytest.raises(ValueError, match="need epochs >= 1"):
        check_epochs_patience(0, 1)
    assert check_seed(np.uint64(2**64 - 1)) == 2**64 - 1 and check_seed(0) == 0
    with pytest.raises(TypeError, match="seed must be an int"):
        check_seed(1.0)
    with pytest.raises(ValueError, match="seed must lie in"):
        check_seed(-1)
    assert check_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="is not a device"):
        check_device("gpu0")
    with pytest.raises(TypeError, match="device must be a str"):
        check_device(None)
    for other in ("meta", "mps", "xpu", "hpu"):  # failed inside torch (RuntimeError, Assertion-
        with pytest.raises(ValueError, match="only cpu and cuda devices can train"):  # Error...)
            check_device(other)


def test_a_cuda_index_past_the_device_count_is_refused(monkeypatch):
    """check_device refuses a CUDA device this machine does not have: with one GPU, cuda:0 and
    cuda pass, cuda:1 is refused (emulated: no tensor is made)."""
    from hiertail_fast._validation import check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert check_device("cuda:0") == torch.device("cuda:0")
    assert check_device("cuda") == torch.device("cuda")
    for bad in ("cuda:1", "cuda:2", torch.device("cuda", 1)):
        with pytest.raises(ValueError, match="only 1 CUDA device"):
            check_device(bad)


def _loss_args(levels: int, n: int = 40, d: int = 6, dtype=torch.float32):
    g = torch.Generator().manual_seed(levels)
    z = torch.randn(n, d, generator=g).to(dtype)
    labels = [torch.randint(0, 5 - k, (n,), generator=g) for k in range(levels)]
    protos = [torch.randn(5 - k, d, generator=g).to(dtype) for k in range(levels)]
    return z, labels, protos


def test_the_loss_checks_read_the_device_once_for_every_level(monkeypatch):
    """Each value read is a host sync on CUDA (it drains the device's queue): the checks of a
    three-level loss read one small vector, where they read 5 values per level."""
    from hiertail_fast._validation import validate_contrastive_levels
    from tests.conftest import load_bench

    dispatch_count = load_bench("bench_dispatch_count_validation", "dispatch_count.py")
    z, labels, protos = _loss_args(3)
    protos[1] = None                                  # a level without prototypes too
    reads = []
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t) or real_tolist(t))
    counter = dispatch_count._Counter(syncs=True)
    with counter:
        validate_contrastive_levels(z, labels, protos, 0.1, "mean", "exact")
    assert sum(counter.calls.values()) == 0 and len(reads) == 1
    assert reads[0].numel() == 1 + 2 + 3              # z, two prototype tensors, three labels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_merged_loss_checks_name_the_bad_input_of_any_level(dtype):
    from hiertail_fast import hierarchical_contrastive_loss

    def raises(match, z, labels, protos, tau=0.1):
        with pytest.raises(ValueError, match=match) as info:
            hierarchical_contrastive_loss(z, labels, protos, temperature=tau)
        return info.value

    z, labels, protos = _loss_args(3, dtype=dtype)
    ok = hierarchical_contrastive_loss(z, labels, protos, temperature=0.1)
    assert torch.isfinite(ok)
    for bad in (float("nan"), float("inf")):
        zb = z.clone()
        zb[7, 2] = bad
        assert raises("z contains NaN or Inf", zb, labels, protos).non_finite
        pb = [p.clone() for p in protos]
        pb[2][1, 0] = bad                             # the last level's prototypes
        assert raises("prototypes contains NaN or Inf", z, labels, pb).non_finite
    lb = [t.clone() for t in labels]
    lb[2][3] = -1
    raises("labels has negative entries", z, lb, protos)
    # finite but overflowing logits: in z, and in one level's prototypes only
    big = torch.finfo(dtype).max ** 0.5 if dtype != torch.bfloat16 else 1e19
    raises("the logits overflow", z * big, labels, protos)
    pb = [p.clone() for p in protos]
    pb[1] = pb[1] * big
    raises("the logits overflow", z, labels, pb)
    # entries so large that the row norm itself overflows (finite input): the range error
    if dtype == torch.float32:
        huge = torch.full_like(z, 3e38)
        raises("the logits overflow", huge, labels, protos)
    # the order of the per-tensor checks: z's NaN before a later level's negative label
    zb = z.clone()
    zb[0, 0] = float("nan")
    raises("z contains NaN or Inf", zb, lb, protos)


def test_all_finite_reads_a_tensor_that_requires_grad_without_a_warning():
    import warnings

    x = torch.randn(5, 3, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")             # "Converting a tensor with requires_grad"
        assert all_finite(x) and all_finite(x * 2)
        assert not all_finite(x.detach().clone().fill_(float("nan")).requires_grad_())
