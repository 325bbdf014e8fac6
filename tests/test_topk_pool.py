"""Top-k pooling / unpooling: reference (hand-computed, gradcheck, PyG) and every backend."""
from __future__ import annotations

import math

import pytest
import torch

from hiertail_fast.reference.topk_pool import pool_size, topk_pool_ref, topk_unpool_ref
from tests.conftest import tol

try:
    from torch_geometric.nn import TopKPooling
except ImportError:  # pragma: no cover - torch_geometric is in the [test] extra
    TopKPooling = None

requires_pyg = pytest.mark.skipif(TopKPooling is None, reason="torch_geometric not installed")


def random_graph(n, num_edges, *, seed=0, weighted=True, isolated=3, dtype=torch.float64):
    """Non-symmetric graph with duplicate edges, self-loops and `isolated` nodes with no edge."""
    g = torch.Generator().manual_seed(seed)
    active = max(1, n - isolated)
    ei = torch.randint(0, active, (2, num_edges), generator=g)
    if num_edges >= 4:
        ei[:, 1] = ei[:, 0]  # a duplicate edge
        ei[1, 2] = ei[0, 2]  # a self-loop
    w = torch.rand(num_edges, generator=g, dtype=dtype) + 0.5 if weighted else None
    return ei, w


def canonical_edges(edge_index, edge_weight):
    """Edges as a sorted multiset (source, target, weight): order-free comparison."""
    w = torch.zeros(edge_index.shape[1], dtype=torch.float64) if edge_weight is None else \
        edge_weight.detach().double().cpu()
    rows = sorted(zip(edge_index[0].tolist(), edge_index[1].tolist(), w.tolist(), strict=True))
    return rows


# ---------------------------------------------------------------- reference, hand-computed
def _tiny():
    # p = (3, 4), ‖p‖ = 5: x·p/‖p‖ = 0.6, 0.8, 1.2, -0.8, 1.4 -> order 4, 2, 1, 0, 3.
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, -1.0], [1.0, 1.0]],
                     dtype=torch.float64)
    p = torch.tensor([3.0, 4.0], dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 2, 4, 3, 1, 4], [1, 2, 1, 4, 4, 4, 2, 2]])
    w = torch.arange(1.0, 9.0, dtype=torch.float64)
    return x, p, ei, w


def test_reference_hand_computed():
    x, p, ei, w = _tiny()
    xp, pei, pw, perm, score = topk_pool_ref(x, ei, p, 0.5, w)
    assert perm.tolist() == [4, 2, 1]  # k = ceil(0.5 * 5) = 3
    s = torch.tanh(torch.tensor([1.4, 1.2, 0.8], dtype=torch.float64))
    torch.testing.assert_close(score, s)
    torch.testing.assert_close(xp, torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.0, 1.0]],
                                                dtype=torch.float64) * s[:, None])
    # kept edges in input order: (1,2) (2,1) (2,4) (4,4) (1,2) (4,2) -> relabel 4->0 2->1 1->2
    assert pei.tolist() == [[2, 1, 1, 0, 2, 0], [1, 2, 0, 0, 1, 1]]
    assert pw.tolist() == [2.0, 3.0, 4.0, 5.0, 7.0, 8.0]
    _, pei2, pw2, _, _ = topk_pool_ref(x, ei, p, 0.5)
    assert pw2 is None and torch.equal(pei2, pei)


def test_reference_sizes_ratio_one_int_and_k_ge_n():
    x, p, ei, w = _tiny()
    for ratio, k in [(1.0, 5), (1, 1), (2, 2), (5, 5), (50, 5), (0.2, 1), (0.01, 1)]:
        xp, pei, _, perm, _ = topk_pool_ref(x, ei, p, ratio, w)
        assert perm.numel() == k and xp.shape == (k, 2)
    _, pei, pw, perm, _ = topk_pool_ref(x, ei, p, 50, w)
    assert perm.tolist() == [4, 2, 1, 0, 3]  # all kept: every edge survives, relabelled
    new = {4: 0, 2: 1, 1: 2, 0: 3, 3: 4}
    assert pei.tolist() == [[new[v] for v in ei[0].tolist()], [new[v] for v in ei[1].tolist()]]
    assert torch.equal(pw, w)


def test_pool_size_rules():
    assert pool_size(100, 0.3, torch.float32) == 31  # PyG rounds 0.3f * 100 = 30.000002 up
    assert pool_size(100, 0.3, torch.float64) == 30
    assert pool_size(100, 0.5) == 50 and pool_size(101, 0.5) == 51
    assert pool_size(7, 1.0) == 7 and pool_size(7, 3) == 3 and pool_size(7, 70) == 7
    assert pool_size(0, 0.5) == 0
    for bad in [0.0, -0.5, 1.5, float("nan"), 0, -3]:
        with pytest.raises(ValueError):
            pool_size(10, bad)
    for bad in [True, "0.5", None]:
        with pytest.raises(TypeError):
            pool_size(10, bad)


def test_reference_ties_lower_index_first():
    x = torch.tensor([[1.0], [2.0], [1.0], [2.0], [0.5]], dtype=torch.float64)
    p = torch.tensor([1.0], dtype=torch.float64)
    _, _, _, perm, _ = topk_pool_ref(x, torch.zeros(2, 0, dtype=torch.long), p, 3)
    assert perm.tolist() == [1, 3, 0]


def test_reference_isolated_and_empty_edges():
    x = torch.randn(6, 3, dtype=torch.float64)
    p = torch.randn(3, dtype=torch.float64)
    xp, pei, pw, perm, _ = topk_pool_ref(x, torch.zeros(2, 0, dtype=torch.long), p, 0.5)
    assert pei.shape == (2, 0) and pw is None and perm.numel() == 3
    # every kept node isolated: no edges survive
    score = torch.tanh(x @ p / p.norm())
    lowest = torch.argsort(score)[:2]
    ei = lowest.view(2, 1)
    _, pei, pw, _, _ = topk_pool_ref(x, ei, p, 4, torch.ones(1, dtype=torch.float64))
    assert pei.shape == (2, 0) and pw.shape == (0,)


def test_reference_gradcheck():
    ei, w = random_graph(9, 20, seed=1)
    x = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    p = torch.randn(4, dtype=torch.float64, requires_grad=True)
    wr = w.clone().requires_grad_(True)

    def f(x, p, wr):
        xp, _, pw, _, s = topk_pool_ref(x, ei, p, 0.6, wr)
        return xp, pw, s

    assert torch.autograd.gradcheck(f, (x, p, wr))
    xp = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    perm = torch.tensor([5, 0, 7, 2])
    assert torch.autograd.gradcheck(lambda a: topk_unpool_ref(a, perm, 9), (xp,))


def test_unpool_ref_values():
    xp = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    out = topk_unpool_ref(xp, torch.tensor([2, 0]), 4)
    assert out.tolist() == [[3.0, 4.0], [0.0, 0.0], [1.0, 2.0], [0.0, 0.0]]


@pytest.mark.parametrize("bad", ["ratio0", "ratio2", "k0", "shape", "nan", "pnorm", "dtype",
                                 "ei_range", "w_len", "perm_dup", "perm_range"])
def test_reference_bad_inputs(bad):
    x, p, ei, w = _tiny()
    args = dict(x=x, edge_index=ei, score_weight=p, ratio=0.5, edge_weight=w)
    if bad == "ratio0":
        args["ratio"] = 0.0
    elif bad == "ratio2":
        args["ratio"] = 2.5
    elif bad == "k0":
        args["ratio"] = 0
    elif bad == "shape":
        args["score_weight"] = torch.ones(3, dtype=torch.float64)
    elif bad == "nan":
        args["x"] = x.clone().index_fill_(0, torch.tensor([1]), float("nan"))
    elif bad == "pnorm":
        args["score_weight"] = torch.zeros(2, dtype=torch.float64)
    elif bad == "dtype":
        args["x"] = x.long()
    elif bad == "ei_range":
        args["edge_index"] = ei.clone().fill_(7)
    elif bad == "w_len":
        args["edge_weight"] = w[:3]
    if bad in ("perm_dup", "perm_range"):
        perm = torch.tensor([1, 1]) if bad == "perm_dup" else torch.tensor([0, 9])
        with pytest.raises(ValueError):
            topk_unpool_ref(torch.ones(2, 2), perm, 5)
        return
    with pytest.raises((ValueError, TypeError)):
        topk_pool_ref(**args)


# ---------------------------------------------------------------- PyG equivalence
@requires_pyg
@pytest.mark.parametrize("n,e,ratio,weighted", [(40, 120, 0.5, True), (57, 30, 0.3, False),
                                                 (100, 400, 0.3, True), (33, 90, 7, True),
                                                 (25, 60, 100, False)])
def test_reference_equals_pyg(n, e, ratio, weighted):
    ei, w = random_graph(n, e, seed=n, weighted=weighted, dtype=torch.float32)
    x = torch.randn(n, 8)
    pool = TopKPooling(8, ratio=ratio)
    ours = topk_pool_ref(x, ei, pool.select.weight.detach().view(-1), ratio, w)
    theirs = pool(x, ei, w)
    xp, pei, pw, perm, score = ours
    torch.testing.assert_close(perm, theirs[4], rtol=0, atol=0)
    torch.testing.assert_close(xp, theirs[0].detach(), **tol(torch.float32))
    torch.testing.assert_close(score, theirs[5].detach(), **tol(torch.float32))
    assert torch.equal(pei, theirs[1])  # filter_adj keeps input edge order
    if weighted:
        assert torch.equal(pw, theirs[2])
    else:
        assert pw is None and theirs[2] is None


def test_ceil_matches_pyg_in_float32():
    x = torch.randn(100, 3)
    p = torch.randn(3)
    assert topk_pool_ref(x, torch.zeros(2, 0, dtype=torch.long), p, 0.3)[3].numel() == 31
    assert math.ceil(0.3 * 100) == 30  # the float64 value, for the record
