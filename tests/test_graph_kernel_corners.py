"""Corners of the graph ops' fast paths that no test reached (a mutation audit, session 33):
each test here failed on one plausible bug that every other test passed. The expected values
are independent computations: the float64 reference GCN operator (gcn_propagate_ref; applied
to the identity where the dense Â is needed), a float64 argmin of direct distances."""
from __future__ import annotations

import pytest
import torch

from hiertail_fast import CSRGraph, gcn_propagate, nearest_prototype
from hiertail_fast.reference.gcn_propagate import gcn_propagate_ref
from tests.conftest import backend_device, requires_triton

BACKENDS = ["torch", pytest.param("triton", marks=requires_triton)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_after_an_update_that_makes_the_weights_symmetric(backend):
    """Weights updated in place between the forward and the backward (float64 weights under
    float32 features: autograd saved a cast copy and sees nothing) from an ASYMMETRIC graph to
    a symmetric one: grad_x is still Âᵀ·g of the forward's weights. The existing test updates
    a symmetric graph to an asymmetric one only, so a backward that asked the NEW weights
    whether Â is symmetric (and applied Â for Âᵀ), or a Triton Âᵀ gathered from the graph's
    new weights instead of the saved ones, passed (a mutation audit). Against Âᵀ·g of the old
    weights, Â from the float64 reference."""
    dev = backend_device(backend)
    gen = torch.Generator().manual_seed(3)
    n = 7
    src = torch.tensor([0, 1, 1, 2, 3, 4, 5, 6, 2, 5])
    dst = torch.tensor([1, 0, 2, 1, 4, 3, 6, 5, 5, 2])
    w = torch.rand(src.numel(), dtype=torch.float64, generator=gen) + 0.5
    graph = CSRGraph.from_edge_index(torch.stack([src, dst]).to(dev), w.to(dev), n,
                                     dedupe=False)
    assert not graph.is_symmetric()
    old = graph.weight.detach().clone()
    a_hat = gcn_propagate_ref(torch.eye(n, dtype=torch.float64), graph.edge_index().cpu(),
                              old.cpu())                  # Â of the old weights, as Â·I
    x = torch.randn(n, 3, generator=gen).to(dev).requires_grad_()
    gout = torch.randn(n, 3, generator=gen)
    out = gcn_propagate(x, graph, backend=backend)
    with torch.no_grad():
        graph.weight.fill_(1.25)                   # every pair now has equal weights
    assert graph.is_symmetric()
    out.backward(gout.to(dev))
    torch.testing.assert_close(x.grad.cpu().double(), a_hat.t() @ gout.double(),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_near_tie_whose_exact_winner_is_in_a_later_tile(monkeypatch, backend):
    """A near-tie across prototype tiles whose exact winner is the LATER tile's prototype
    (p[0] = z + δ, p[64] = z − 0.999·δ, |z| ~ 1e3: their gap is far below the expanded form's
    rounding, so the expanded argmin is either): the merge must take the later tile's value as
    the second-best when it is not better, else the gap looks wide and an expanded win of p[0]
    stands (a mutation audit: the existing reflection test's exact winner was the EARLIER one).
    torch: tiles of 8; Triton: its 64-wide tiles. Against the float64 argmin (always 64)."""
    import hiertail_fast.ops.nearest_prototype as npmod

    monkeypatch.setattr(npmod, "_M_TILE", 8)
    dev = backend_device(backend)
    gen = torch.Generator().manual_seed(21)
    for _ in range(40):
        z = torch.randn(1, 4, generator=gen) * 1000
        delta = torch.randn(4, generator=gen)
        p = torch.randn(65, 4, generator=gen) * 1e4 + 1e5
        p[0], p[64] = z[0] + delta, z[0] - 0.999 * delta
        assert int(torch.cdist(z.double(), p.double()).argmin()) == 64
        assert int(nearest_prototype(z.to(dev), p.to(dev), backend=backend)) == 64


@requires_triton
def test_edge_weight_gradient_with_zero_feature_columns_on_triton():
    """x with zero columns and learnable edge weights on the Triton backend: the output is
    empty, so the weight gradient is exactly zero (the SDDMM's output buffer must be zeroed
    when there is nothing to sum; a mutation audit: left uninitialised, the gradient was
    whatever the memory held and no test looked). Memory is dirtied before each call."""
    dev = backend_device("triton")
    ei = torch.tensor([[0, 1, 2, 3, 1], [1, 2, 3, 0, 3]], device=dev)
    for trial in range(10):
        junk = torch.full((5,), 123.0 + trial, device=dev)
        del junk
        w = (torch.rand(5, generator=torch.Generator().manual_seed(trial)) + 0.5).to(dev)
        w.requires_grad_()
        x = torch.zeros(4, 0, device=dev, requires_grad=True)
        gcn_propagate(x, ei, w, backend="triton").sum().backward()
        assert torch.equal(w.grad.cpu(), torch.zeros(5))


@requires_triton
def test_triton_gcn_on_a_graph_of_strided_index_views():
    """A CSRGraph built from strided views of indptr / indices (step 2) propagates on the Triton
    backend as the contiguous graph does on the torch backend: the kernel reads the indices at
    stride 1, so the launcher must make them contiguous, and no Triton test had a strided
    graph (a mutation audit; topk_pool's rows had the same slip)."""
    dev = backend_device("triton")
    indptr = torch.tensor([0, 2, 3, 5, 5, 7, 8, 10, 11, 12], device=dev)
    indices = torch.tensor([1, 4, 0, 3, 8, 2, 6, 5, 0, 7, 8, 1], device=dev)
    wide_p = torch.stack([indptr, torch.zeros_like(indptr)], 1).reshape(-1)[::2]
    wide_i = torch.stack([indices, torch.zeros_like(indices)], 1).reshape(-1)[::2]
    assert wide_p.stride(0) == 2 and torch.equal(wide_p, indptr)
    x = torch.randn(9, 5, generator=torch.Generator().manual_seed(0)).to(dev)
    want = gcn_propagate(x, CSRGraph(indptr, indices, num_nodes=9), backend="torch")
    got = gcn_propagate(x, CSRGraph(wide_p, wide_i, num_nodes=9), backend="triton")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@requires_triton
def test_triton_gcn_on_column_major_features_and_strided_edge_weights():
    """Column-major features (x.t() of a row-major tensor, as a transposed projection gives)
    and a CSRGraph whose weights are a strided view, on the Triton backend: the kernels read x
    and the weights at stride 1 along a row, so the launchers must make them contiguous (the
    s72 mutation audit: dropping either .contiguous() gave outputs 1.1-2.8 off and an edge-weight
    gradient 2.0 off, and every test passed). Against the float64 reference."""
    dev = backend_device("triton")
    gen = torch.Generator().manual_seed(0)
    n, d, m = 30, 5, 90
    ei = torch.randint(0, n, (2, m), generator=gen)
    w0 = torch.rand(m, generator=gen) + 0.5
    rows = torch.randn(n, d, generator=gen)
    gout = torch.randn(n, d, generator=gen)
    w_ref = w0.double().requires_grad_()
    want = gcn_propagate_ref(rows.double(), ei, w_ref)
    want.backward(gout.double())
    x = rows.to(dev).t().contiguous().t()            # column-major, on the kernels' device
    assert not x.is_contiguous() and torch.equal(x.cpu(), rows)
    w = w0.to(dev).requires_grad_()
    out = gcn_propagate(x, ei.to(dev), w, backend="triton")
    torch.testing.assert_close(out.cpu().double(), want.detach(), rtol=1e-5, atol=1e-5)
    out.backward(gout.to(dev))
    torch.testing.assert_close(w.grad.cpu().double(), w_ref.grad, rtol=1e-4, atol=1e-5)
    graph = CSRGraph.from_edge_index(ei, w0, num_nodes=n, dedupe=False)
    wide = torch.zeros(2 * m)
    wide[::2] = graph.weight
    strided = CSRGraph(graph.indptr.to(dev), graph.indices.to(dev), wide.to(dev)[::2], n)
    assert strided.weight.stride() == (2,)
    torch.testing.assert_close(gcn_propagate(rows.to(dev), strided, backend="triton").cpu(),
                               want.detach().float(), rtol=1e-5, atol=1e-5)


def test_one_graph_propagated_in_float32_then_float64():
    """One CSRGraph used in float32 and then in float64 (torch backend): the float64 call gets
    float64 degrees and its own float64 operator, not the ones cached by the float32 call
    (caches keyed without the dtype passed every test, which use one dtype per graph: a
    mutation audit). Against the float64 reference's Â·x, at float64 precision."""
    gen = torch.Generator().manual_seed(4)
    n = 9
    ei = torch.randint(0, n, (2, 30), generator=gen)
    w = torch.rand(30, dtype=torch.float64, generator=gen) + 0.25
    graph = CSRGraph.from_edge_index(ei, w, n, dedupe=False)
    x = torch.randn(n, 3, dtype=torch.float64, generator=gen)
    want = gcn_propagate_ref(x, ei, w)
    gcn_propagate(x.float(), graph, backend="torch")      # fills the float32 caches
    got = gcn_propagate(x, graph, backend="torch")
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_near_ties_re_decided_in_several_row_chunks(monkeypatch):
    """The near-tie re-decision runs in chunks of distinct suspect rows (524288 / m rows by
    default; one row here, ``_BLOCK_ELEMENTS`` = 8·m), each with its own rows' rounding bound:
    the first suspect row (the lexicographically smallest, z = (-1, 0)) has a tiny bound, the
    others (|z| ~ 1e4, prototypes ~ 1) pairs a, a + t with t ⟂ z − a, equal distances up to
    ‖t‖² = 1e-4, far below the expanded form's rounding. A chunk that used the first chunk's
    bound kept only the expanded winner as candidate (a mutation audit: no test had rows of
    different bounds in different chunks). Against the reference (direct distances, lowest
    index on ties), as the module docstring promises."""
    import hiertail_fast.ops.nearest_prototype as npmod
    from hiertail_fast.reference.nearest_prototype import nearest_prototype_ref

    gen = torch.Generator().manual_seed(0)
    rows = 300
    q = torch.tensor([[0.0, 0.5], [0.0, -0.5]])              # equidistant from (-1, 0)
    zb = torch.randn(rows, 2, generator=gen) * 1e4
    zb[:, 0] = zb[:, 0].abs() + 10.0                         # after (-1, 0) in sorted order
    a = torch.randn(rows, 2, generator=gen)
    r = zb - a
    t = torch.stack([-r[:, 1], r[:, 0]], 1) / r.norm(dim=1, keepdim=True) * 1e-2
    p = torch.cat([q, torch.stack([a, a + t], 1).reshape(-1, 2)])
    z = torch.cat([torch.tensor([[-1.0, 0.0]]), zb])
    monkeypatch.setattr(npmod, "_BLOCK_ELEMENTS", 8 * p.shape[0])
    assert torch.equal(nearest_prototype(z, p, backend="torch"), nearest_prototype_ref(z, p))


@pytest.mark.parametrize("backend", BACKENDS)
def test_16bit_scores_that_tie_after_rounding_keep_the_lower_index(backend):
    """bf16 rows 3.0 and 3.015625: their float32 scores tanh(x) differ (0.99505 < 0.99519) but
    both round to the same bf16 score (0.99609375), so the tie goes to the lower node index, as
    the reference (the scores in x's dtype, stable order) does. Selecting on the unrounded
    float32 scores kept node 1 and passed every test (a mutation audit)."""
    from hiertail_fast import topk_pool
    from hiertail_fast.reference.topk_pool import topk_pool_ref

    dev = backend_device(backend)
    x = torch.tensor([[3.0], [3.015625]], dtype=torch.bfloat16)
    p = torch.tensor([1.0], dtype=torch.bfloat16)
    ei = torch.tensor([[0, 1], [1, 0]])
    assert torch.tanh(x.float()).view(-1).unique().numel() == 2      # distinct in float32
    assert torch.tanh(x.float()).bfloat16().view(-1).unique().numel() == 1   # tied in bf16
    assert topk_pool_ref(x, ei, p, 1)[3].tolist() == [0]
    got = topk_pool(x.to(dev), ei.to(dev), p.to(dev), 1, backend=backend)
    assert got.perm.tolist() == [0]


@pytest.mark.parametrize("add_self_loops", [False, True])
def test_a_graph_without_edges(add_self_loops):
    """No edges: Â·x is 0 without added self-loops and (improved fill 2, degree 2) x itself
    with them, on the torch backend's cached operator (an empty operator must give zeros, not
    x: a mutation audit found that no test had an edgeless graph without self-loops)."""
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    graph = CSRGraph.from_edge_index(torch.zeros(2, 0, dtype=torch.long), num_nodes=4)
    out = gcn_propagate(x, graph, add_self_loops=add_self_loops, backend="torch")
    torch.testing.assert_close(out, x if add_self_loops else torch.zeros_like(x))
