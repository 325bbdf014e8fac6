"""Sparse adjacency inputs (``CSRGraph.from_sparse``): torch sparse COO / CSR / CSC tensors and
``torch_sparse.SparseTensor`` in PyG's ``adj_t`` orientation (row = target) go wherever an
edge_index does — gcn_propagate, GCNConv, topk_pool — with the numbers of the equivalent
edge_index (duplicates summed); PyG's GCNConv on the same adj_t agrees; gradients reach the
sparse tensor's values."""
from __future__ import annotations

import pytest
import torch

from hiertail_fast import gcn_propagate, topk_pool
from hiertail_fast.graph import CSRGraph
from hiertail_fast.nn import GCNConv
from tests.conftest import tol, torch_sparse_or_none, torch_sparse_or_skip


def _edges(n=30, e=120, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=gen)
    ei[:, :5] = ei[:, 5:10]                        # duplicate edges: summed
    w = torch.rand(e, generator=gen) + 0.1
    return ei, w


def _coo(ei, w, n):
    """adj_t: entry (target, source) = weight of the edge source -> target (uncoalesced)."""
    return torch.sparse_coo_tensor(ei.flip(0), w, (n, n))


LAYOUTS = {
    "coo": lambda a: a,
    "csr": lambda a: a.coalesce().to_sparse_csr(),
    "csc": lambda a: a.coalesce().to_sparse_csc(),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_from_sparse_is_the_coalesced_edge_index(layout):
    n = 30
    ei, w = _edges(n)
    g = CSRGraph.from_sparse(LAYOUTS[layout](_coo(ei, w, n)))
    want = CSRGraph.from_edge_index(ei, w, n, dedupe=True)
    assert g.num_nodes == n
    assert torch.equal(g.indptr, want.indptr) and torch.equal(g.indices, want.indices)
    torch.testing.assert_close(g.weight, want.weight, rtol=1e-6, atol=0)


def test_from_torch_sparse_tensor():
    torch_sparse = torch_sparse_or_skip()
    n = 30
    ei, w = _edges(n)
    adj_t = torch_sparse.SparseTensor(row=ei[1], col=ei[0], value=w, sparse_sizes=(n, n))
    g = CSRGraph.from_sparse(adj_t)
    want = CSRGraph.from_edge_index(ei, w, n, dedupe=True)
    assert torch.equal(g.indptr, want.indptr) and torch.equal(g.indices, want.indices)
    torch.testing.assert_close(g.weight, want.weight, rtol=1e-6, atol=0)
    unweighted = CSRGraph.from_sparse(torch_sparse.SparseTensor(row=ei[1], col=ei[0],
                                                                sparse_sizes=(n, n)))
    assert unweighted.weight is None
    # without values a duplicate entry stays a unit entry of its own (it counts twice, as in
    # torch_sparse's product and PyG); unweighted deduplication kept one (a fuzzing find)
    kept = CSRGraph.from_edge_index(ei, None, n, dedupe=False)
    assert torch.equal(unweighted.indptr, kept.indptr)
    assert torch.equal(unweighted.indices, kept.indices)


def test_valueless_sparse_tensor_counts_duplicate_edges_as_pyg_does():
    torch_sparse = torch_sparse_or_skip()
    n = 4
    ei = torch.tensor([[0, 0, 1, 2], [1, 1, 2, 3]])             # 0 -> 1 twice (a multigraph)
    adj_t = torch_sparse.SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(n, n))
    x = torch.randn(n, 3)
    ones = torch.sparse_coo_tensor(ei.flip(0), torch.ones(4), (n, n))
    for improved in (False, True):
        want = gcn_propagate(x, ones, improved=improved)       # duplicates summed: weight 2
        torch.testing.assert_close(gcn_propagate(x, adj_t, improved=improved), want)
        torch.testing.assert_close(gcn_propagate(x, ei, improved=improved), want)
    torch.testing.assert_close(CSRGraph.from_sparse(adj_t).degree(), (adj_t @ torch.ones(n, 1))
                               .view(-1))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gcn_propagate_on_a_sparse_adjacency(layout):
    n = 30
    ei, w = _edges(n)
    x = torch.randn(n, 5, requires_grad=True)
    got = gcn_propagate(x, LAYOUTS[layout](_coo(ei, w, n)))
    want = gcn_propagate(x, ei, w)                  # duplicates kept, summed by the product
    torch.testing.assert_close(got, want, **tol(torch.float32))


@pytest.mark.parametrize("layout", ["coo", "csr", "csc"])
def test_gradients_reach_the_sparse_values(layout):
    """The values of a sparse adjacency that require grad get the gradient of the edge_index
    path's weights (CSR / CSC were untested: detaching their values went unnoticed, a
    mutation audit)."""
    n = 30
    ei, w = _edges(n)
    x = torch.randn(n, 4)
    coo = _coo(ei, w, n).coalesce()
    w1 = coo.values().detach().clone().requires_grad_()
    adj = torch.sparse_coo_tensor(coo.indices(), w1, (n, n))
    if layout != "coo":
        adj = adj.to_sparse_csr() if layout == "csr" else adj.to_sparse_csc()
    gcn_propagate(x, adj).square().sum().backward()
    w2 = coo.values().detach().clone().requires_grad_()
    gcn_propagate(x, coo.indices().flip(0), w2).square().sum().backward()
    assert w1.grad is not None
    torch.testing.assert_close(w1.grad, w2.grad, **tol(torch.float32))


def test_gcnconv_on_adj_t_matches_pyg():
    """Without self-loops in the graph: PyG's sparse paths add a self-loop even where one
    exists (torch.sparse) or overwrite it (SparseTensor), unlike its own edge_index path; ours
    follows the edge_index rule (add the remaining ones) for every input."""
    pyg = pytest.importorskip("torch_geometric.nn")
    n = 30
    ei, w = _edges(n)
    ei, w = ei[:, ei[0] != ei[1]], w[ei[0] != ei[1]]
    adj_t = _coo(ei, w, n).coalesce()
    ours = GCNConv(5, 7)
    theirs = pyg.GCNConv(5, 7, improved=True)
    with torch.no_grad():
        ours.weight.copy_(theirs.lin.weight)
        theirs.bias.copy_(ours.bias)
    x = torch.randn(n, 5)
    torch.testing.assert_close(ours(x, adj_t), theirs(x, adj_t), **tol(torch.float32))


def test_topk_pool_on_a_sparse_adjacency():
    n = 30
    ei, w = _edges(n)
    x = torch.randn(n, 6)
    p = torch.randn(6)
    got = topk_pool(x, _coo(ei, w, n), p, 0.5)
    want = topk_pool(x, CSRGraph.from_edge_index(ei, w, n, dedupe=True), p, 0.5)
    assert torch.equal(got.perm, want.perm) and torch.equal(got.x, want.x)
    assert torch.equal(got.edge_index, want.edge_index)
    assert torch.equal(got.edge_weight, want.edge_weight)


def test_bad_sparse_adjacencies():
    n = 5
    ei = torch.tensor([[0, 1], [1, 2]])
    x = torch.randn(n, 2)
    with pytest.raises(ValueError, match="square"):
        CSRGraph.from_sparse(torch.sparse_coo_tensor(ei, torch.ones(2), (5, 4)))
    torch_sparse = torch_sparse_or_none()  # (the optional pyg extra)
    if torch_sparse is not None:        # a 3 x 4 SparseTensor, its columns in range or not
        for last in (0, 3):
            adj = torch_sparse.SparseTensor(row=torch.tensor([0, 1, 2]),
                                            col=torch.tensor([1, 2, last]), sparse_sizes=(3, 4))
            with pytest.raises(ValueError, match="square"):
                CSRGraph.from_sparse(adj)
    with pytest.raises(ValueError, match="2-D"):
        CSRGraph.from_sparse(torch.sparse_coo_tensor(torch.zeros(3, 1, dtype=torch.long),
                                                     torch.ones(1), (2, 2, 2)))
    with pytest.raises(TypeError, match="dense"):
        CSRGraph.from_sparse(torch.eye(3))
    with pytest.raises(TypeError, match="sparse"):
        CSRGraph.from_sparse([[0, 1], [1, 0]])
    # the values are named as such, not as an edge_weight the call never passed (a fresh-user
    # audit, session 66), for every entry point and both integer and bool values
    for values in (torch.ones(2, dtype=torch.long), torch.ones(2, dtype=torch.bool)):
        int_adj = torch.sparse_coo_tensor(ei, values, (n, n))
        for call in (lambda a=int_adj: CSRGraph.from_sparse(a),
                     lambda a=int_adj: gcn_propagate(x, a),
                     lambda a=int_adj: gcn_propagate(x, a.to_sparse_csr())):
            with pytest.raises(TypeError, match=r"the sparse adjacency's value tensor \(its "
                               r"edge weights\) must be a floating-point tensor .*got "
                               rf"{values.dtype}; for an unweighted graph pass adj.float\(\)"):
                call()
    with pytest.raises(ValueError, match=r"the sparse adjacency's value tensor \(its edge "
                       r"weights\) contains NaN"):
        CSRGraph.from_sparse(torch.sparse_coo_tensor(ei, torch.tensor([1.0, float("nan")]),
                                                     (n, n)))
    adj = torch.sparse_coo_tensor(ei, torch.ones(2), (n, n))
    with pytest.raises(ValueError, match="edge_weight must be None"):
        gcn_propagate(x, adj, torch.ones(2))
    with pytest.raises(ValueError, match="nodes"):
        gcn_propagate(torch.randn(4, 2), adj)


def test_sparse_indices_outside_the_graph_are_refused():
    # torch builds sparse tensors without checking their indices; the (row, col) key folded an
    # index outside [0, n) into another edge: a source 4 of a 3-node graph became the edge
    # 1 -> 1, a CSR column -1 another real edge, a target row 5 a RuntimeError from inside
    # coo_to_csr (a data audit, session 67); COO entries were checked after coalesce(), which
    # merged [[1, 0], [0, 3]] into one valid edge of weight 12, and CSC / SparseTensor
    # pointers not at all (out-of-bounds reads, a crash in to_sparse_coo; a review)
    x = torch.randn(3, 2)
    coo, csr, csc = torch.sparse_coo_tensor, torch.sparse_csr_tensor, torch.sparse_csc_tensor
    i32 = dict(dtype=torch.int32)
    outside = r"indices must lie in \[0, 3\), got "
    bad = [(coo(torch.tensor([[0], [4]]), torch.ones(1), (3, 3)), outside + "4"),
           (coo(torch.tensor([[5], [0]]), torch.ones(1), (3, 3)), outside + "5"),
           (coo(torch.tensor([[1, 0], [0, 3]]), torch.tensor([5.0, 7.0]), (3, 3)), outside + "3"),
           (csr(torch.tensor([0, 1, 2, 2]), torch.tensor([0, -1]), torch.ones(2), (3, 3)),
            outside + "-1"),
           (csr(torch.tensor([0, 1, 2, 2], **i32), torch.tensor([1, 3], **i32), torch.ones(2),
                (3, 3)), outside + "3"),
           (csc(torch.tensor([0, 1, 2, 2]), torch.tensor([0, 7]), torch.ones(2), (3, 3)),
            outside + "7"),
           (csr(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1]), torch.ones(2), (3, 3)),
            "crow_indices must start at 0, not decrease and end at its 2 entries"),
           (csc(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1]), torch.ones(2), (3, 3)),
            "ccol_indices must start at 0, not decrease"),
           (csc(torch.tensor([1, 1, 2, 2]), torch.tensor([0, 1]), torch.ones(2), (3, 3)),
            "ccol_indices must start at 0"),
           (csc(torch.tensor([0, 1, 1, 1]), torch.tensor([0, 1]), torch.ones(2), (3, 3)),
            "ccol_indices must start at 0, not decrease and end at its 2 entries")]
    # pointers of the wrong length (torch builds them unchecked too): one entry short or two
    # long crashed in repeat_interleave (a mutation pass, session 73)
    bad += [(csr(torch.tensor(crow), torch.tensor([0, 1]), torch.ones(2), (3, 3)),
             r"crow_indices must hold 4 entries, got \(%d,\)" % len(crow))
            for crow in ([0, 1, 2], [0, 1, 2, 2, 2])]
    bad += [(csc(torch.tensor([0, 1, 2]), torch.tensor([0, 1]), torch.ones(2), (3, 3)),
             r"ccol_indices must hold 4 entries, got \(3,\)")]
    for adj, message in bad:
        for call in (lambda a=adj: CSRGraph.from_sparse(a), lambda a=adj: gcn_propagate(x, a)):
            with pytest.raises(ValueError, match=message):
                call()
    ok = csr(torch.tensor([0, 1, 2, 2], **i32), torch.tensor([1, 2], **i32), torch.ones(2),
             (3, 3))
    assert CSRGraph.from_sparse(ok).num_edges == 2         # int32 parts in range: taken
    torch_sparse = torch_sparse_or_none()  # (the optional pyg extra)
    if torch_sparse is None:
        return
    st = torch_sparse.SparseTensor(rowptr=torch.tensor([0, 2, 1, 3]),
                                   col=torch.tensor([0, 1, 2]), sparse_sizes=(3, 3),
                                   is_sorted=True, trust_data=True)
    with pytest.raises(ValueError, match="rowptr must start at 0, not decrease"):
        CSRGraph.from_sparse(st)
    # built from rows outside [0, n): checked before torch_sparse builds its row pointers from
    # them (which wrote out of bounds: a crash; a fuzzing review)
    for bad_row in (5, -1):
        st = torch_sparse.SparseTensor(row=torch.tensor([0, bad_row]), col=torch.tensor([1, 0]),
                                       sparse_sizes=(3, 3), is_sorted=True, trust_data=True)
        with pytest.raises(ValueError, match=outside + str(bad_row)):
            CSRGraph.from_sparse(st)


def test_hiertail_model_on_a_sparse_adjacency():
    """prepare_graph (and so HierTail(x, adj_t)) takes a sparse adjacency: its values as edge
    weights; a symmetric 0/1 adjacency gives the edge_index's logits."""
    from hiertail_fast.nn.hiertail import HierTail, prepare_graph

    n = 40
    ei, _ = _edges(n, e=150, seed=3)
    sym = torch.cat([ei, ei.flip(0)], dim=1)
    adj = torch.sparse_coo_tensor(sym.flip(0), torch.ones(sym.shape[1]), (n, n)).coalesce()
    adj = torch.sparse_coo_tensor(adj.indices(), torch.ones(adj.values().numel()), (n, n))
    g_adj, g_ei = prepare_graph(adj), prepare_graph(sym, n)
    assert torch.equal(g_adj.indptr, g_ei.indptr) and torch.equal(g_adj.indices, g_ei.indices)
    torch.manual_seed(0)
    model = HierTail(6, 4)
    x = torch.randn(n, 6)
    torch.testing.assert_close(model(x, adj).logits, model(x, sym).logits,
                               **tol(torch.float32))
    with pytest.raises(ValueError, match="edge_weight must be None"):
        prepare_graph(adj, n, torch.ones(3))
    with pytest.raises(ValueError, match="num_nodes"):
        prepare_graph(adj, n + 1)


def test_gcnconv_cached_on_a_sparse_adjacency(monkeypatch):
    n = 30
    ei, w = _edges(n)
    adj = _coo(ei, w, n).coalesce()
    conv = GCNConv(5, 4, cached=True)
    built = []
    real = CSRGraph.from_sparse
    monkeypatch.setattr(CSRGraph, "from_sparse", lambda a: built.append(1) or real(a))
    x = torch.randn(n, 5)
    assert torch.equal(conv(x, adj), conv(x, adj)) and len(built) == 1
    conv(x, _coo(ei, w * 2, n))                           # another adjacency: converted again
    assert len(built) == 2


@pytest.mark.parametrize("valued", [True, False])
def test_gcnconv_cached_sees_an_edit_of_a_sparse_tensors_indices(valued):
    """cached=True versioned only a SparseTensor's values: an in-place edit of its columns (or
    of a SparseTensor without values) was served the graph of the old ones (a mutation
    audit)."""
    torch_sparse = torch_sparse_or_skip()
    n = 30
    ei, w = _edges(n)
    adj = torch_sparse.SparseTensor(row=ei[1], col=ei[0], value=w if valued else None,
                                    sparse_sizes=(n, n))
    col = adj.storage.col()
    conv, plain = GCNConv(5, 4, cached=True), GCNConv(5, 4)
    plain.load_state_dict(conv.state_dict())
    x = torch.randn(n, 5, generator=torch.Generator().manual_seed(4))
    assert torch.equal(conv(x, adj), plain(x, adj))
    col.copy_((col + 1) % n)              # the SparseTensor's own columns, edited in place
    torch.testing.assert_close(conv(x, adj), plain(x, adj))
