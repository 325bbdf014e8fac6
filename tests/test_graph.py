"""CSRGraph: hand-computed tiny graphs, dense cross-checks on random graphs, bad inputs."""
from __future__ import annotations

import pytest
import torch

from hiertail_fast.graph import CSRGraph


def dense(g: CSRGraph, dtype=torch.float64) -> torch.Tensor:
    """M[i, j] = summed weight of the stored entries (target i, source j)."""
    m = torch.zeros(g.num_nodes, g.num_nodes, dtype=dtype)
    m.index_put_((g.row_index(), g.indices), g.weight_or_ones(dtype).detach(), accumulate=True)
    return m


def random_graph(n: int, e: int, *, weighted: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=gen)
    w = torch.rand(e, generator=gen, dtype=torch.float64) + 0.1 if weighted else None
    return ei, w


def dense_from_edges(ei, w, n, dtype=torch.float64) -> torch.Tensor:
    m = torch.zeros(n, n, dtype=dtype)
    vals = torch.ones(ei.shape[1], dtype=dtype) if w is None else w.to(dtype)
    m.index_put_((ei[1], ei[0]), vals, accumulate=True)
    return m


def test_orientation_and_dedupe_unweighted():
    ei = torch.tensor([[0, 1, 1, 2, 2], [1, 0, 2, 1, 1]])  # 2->1 twice
    g = CSRGraph.from_edge_index(ei, num_nodes=4)
    assert g.num_nodes == 4 and g.num_edges == 4 and g.weight is None
    assert g.indptr.tolist() == [0, 1, 3, 4, 4]  # node 3 isolated
    assert g.indices.tolist() == [1, 0, 2, 1]  # sources, sorted inside each target row
    assert g.edge_index().tolist() == [[1, 0, 2, 1], [0, 1, 1, 2]]


def test_dedupe_sums_weights_and_no_dedupe_keeps_entries():
    ei = torch.tensor([[2, 0, 2], [1, 1, 1]])
    w = torch.tensor([0.5, 1.0, 0.25])
    g = CSRGraph.from_edge_index(ei, w)
    assert g.edge_index().tolist() == [[0, 2], [1, 1]]
    assert g.weight.tolist() == [1.0, 0.75]
    g2 = CSRGraph.from_edge_index(ei, w, dedupe=False)
    assert g2.edge_index().tolist() == [[0, 2, 2], [1, 1, 1]]
    assert g2.weight.tolist() == [1.0, 0.5, 0.25]  # stable order among duplicates
    # past the few thousand entries where torch's sort stops being stable by luck: 5,000
    # duplicates of two edges, interleaved, keep their input order (an unstable sort passed;
    # mutation audit, session 69)
    many = torch.zeros(2, 5000, dtype=torch.long)
    many[0, ::2] = 1
    g3 = CSRGraph.from_edge_index(many, torch.arange(5000.0), num_nodes=3, dedupe=False)
    assert g3.weight[:2500].tolist() == list(range(1, 5000, 2))
    assert g3.weight[2500:].tolist() == list(range(0, 5000, 2))


def test_symmetrize():
    ei = torch.tensor([[0, 1, 2], [1, 0, 3]])
    g = CSRGraph.from_edge_index(ei, symmetrize=True)
    assert g.edge_index().tolist() == [[1, 0, 3, 2], [0, 1, 2, 3]]
    assert g.is_symmetric()
    gw = CSRGraph.from_edge_index(ei, torch.tensor([1.0, 2.0, 3.0]), symmetrize=True)
    assert gw.weight.tolist() == [3.0, 3.0, 3.0, 3.0]  # A + Aᵀ: 1 + 2 on the 0-1 pair


def test_self_loop_methods():
    ei = torch.tensor([[0, 1, 1, 2], [1, 0, 1, 1]])  # node 1 has a loop
    w = torch.tensor([1.0, 1.0, 5.0, 1.0])
    g = CSRGraph.from_edge_index(ei, w, num_nodes=4)
    assert g.has_self_loop().tolist() == [False, True, False, False]
    r = g.with_self_loops(2.0)
    assert torch.equal(dense(r).diagonal(), torch.tensor([2.0, 5.0, 2.0, 2.0], dtype=torch.float64))
    a = g.with_self_loops(2.0, remaining=False)
    assert torch.equal(dense(a).diagonal(), torch.tensor([2.0, 7.0, 2.0, 2.0], dtype=torch.float64))
    nl = g.remove_self_loops()
    assert nl.edge_index().tolist() == [[1, 0, 2], [0, 1, 1]]
    assert nl.weight.tolist() == [1.0, 1.0, 1.0]
    assert CSRGraph.from_edge_index(ei, remove_self_loops=True).num_edges == 3
    assert g.with_self_loops(1.0).weight is not None
    u = CSRGraph.from_edge_index(ei).with_self_loops(1.0)  # unit loops stay unweighted
    assert u.weight is None and u.num_edges == 3 + 3
    # an unweighted graph with another fill gets weighted loops of that fill (unit loops for
    # every unweighted graph passed; mutation audit, session 69)
    for remaining, diagonal in ((True, [2.0, 1.0, 2.0, 2.0]), (False, [2.0, 3.0, 2.0, 2.0])):
        uw = CSRGraph.from_edge_index(ei, num_nodes=4).with_self_loops(2.0, remaining=remaining)
        assert uw.weight is not None
        assert dense(uw).diagonal().tolist() == diagonal


def test_gcn_norm_path_graph_hand_computed():
    # path 0-1-2 + isolated 3, improved: deg = (1+2, 2+2, 1+2, 0+2)
    g = CSRGraph.from_edge_index(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), num_nodes=4)
    dinv, loop = g.gcn_deg_inv_sqrt(improved=True, dtype=torch.float64)
    exp = torch.tensor([3.0, 4.0, 3.0, 2.0], dtype=torch.float64).rsqrt()
    torch.testing.assert_close(dinv, exp)
    assert loop.tolist() == [2.0, 2.0, 2.0, 2.0]
    values, diag = g.gcn_norm_values(improved=True, dtype=torch.float64)
    torch.testing.assert_close(values, torch.full((4,), 12.0, dtype=torch.float64).rsqrt())
    torch.testing.assert_close(diag, torch.tensor([2 / 3, 0.5, 2 / 3, 1.0], dtype=torch.float64))
    _, loop1 = g.gcn_deg_inv_sqrt(improved=False)
    assert loop1.tolist() == [1.0] * 4
    dinv0, loop0 = g.gcn_deg_inv_sqrt(add_self_loops=False)
    assert loop0.tolist() == [0.0] * 4 and dinv0[3] == 0  # deg 0 -> 0, not inf
    assert g.gcn_norm_values() is g.gcn_norm_values()  # cached per options


def test_gcn_norm_matches_pyg():
    gcn_norm = pytest.importorskip("torch_geometric.nn.conv.gcn_conv").gcn_norm
    ei, w = random_graph(30, 120, weighted=True, seed=3)
    g = CSRGraph.from_edge_index(ei, w, num_nodes=33)
    for improved in (True, False):
        values, diag = g.gcn_norm_values(improved=improved, dtype=torch.float64)
        full = dense(CSRGraph(g.indptr, g.indices, values, 33)) + torch.diag(diag)
        pei, pw = gcn_norm(g.edge_index(), g.weight, 33, improved=improved)
        torch.testing.assert_close(full, dense_from_edges(pei, pw, 33))


def test_subgraph_relabel_in_given_order():
    ei = torch.tensor([[0, 1, 1, 2, 3, 0], [1, 0, 2, 1, 0, 3]])
    w = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    g = CSRGraph.from_edge_index(ei, w)
    sub, entry = g.subgraph(torch.tensor([2, 0, 1]), return_entry_index=True)
    # old -> new: 2 -> 0, 0 -> 1, 1 -> 2; kept edges 0->1, 1->0, 1->2, 2->1
    assert sub.num_nodes == 3
    assert sub.edge_index().tolist() == [[2, 2, 0, 1], [0, 1, 2, 2]]
    assert sub.weight.tolist() == [3.0, 2.0, 4.0, 1.0]
    assert torch.equal(g.weight[entry], sub.weight)
    assert g.subgraph(torch.tensor([3])).num_edges == 0
    assert g.subgraph(torch.zeros(0, dtype=torch.long)).num_nodes == 0


def test_subgraph_refuses_ids_out_of_range_and_repeated():
    """The ids' checks (two host reads in all: their range, then their distinct count with the
    subgraph's size): each bad id named, at either end; an empty list on an empty graph."""
    g = CSRGraph.from_edge_index(torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=4)
    for bad in ([0, 4], [-1, 2], [3, 7, 1]):
        with pytest.raises(ValueError, match=r"nodes must lie in \[0, 4\)"):
            g.subgraph(torch.tensor(bad))
    for bad in ([1, 1], [0, 2, 3, 2]):
        with pytest.raises(ValueError, match="nodes contains duplicate ids"):
            g.subgraph(torch.tensor(bad))
    assert g.subgraph(torch.tensor([3, 0])).num_nodes == 2
    empty = CSRGraph.from_edge_index(torch.zeros(2, 0, dtype=torch.long), num_nodes=0)
    assert empty.subgraph(torch.zeros(0, dtype=torch.long)).num_nodes == 0
    with pytest.raises(ValueError, match=r"nodes must lie in \[0, 0\)"):
        empty.subgraph(torch.tensor([0]))


def test_subgraph_random_matches_dense():
    ei, w = random_graph(40, 200, weighted=True, seed=5)
    g = CSRGraph.from_edge_index(ei, w, num_nodes=40)
    nodes = torch.randperm(40)[:17]
    sub = g.subgraph(nodes)
    torch.testing.assert_close(dense(sub), dense(g)[nodes][:, nodes])
    CSRGraph(sub.indptr, sub.indices, sub.weight, 17)  # passes full validation (sorted rows)


def test_augment_a2_path_graph_exact():
    # path 0-1-2-3 with weights w01 = 2, w12 = 3, w23 = 1 (both directions)
    ei = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    w = torch.tensor([2.0, 2.0, 3.0, 3.0, 1.0, 1.0], dtype=torch.float64)
    a = CSRGraph.from_edge_index(ei, w).augment_a2()
    expected = torch.tensor([  # 2 w_uv + Σ_k w_uk w_kv, zero diagonal
        [0, 4, 6, 0],
        [4, 0, 6, 3],
        [6, 6, 0, 2],
        [0, 3, 2, 0]], dtype=torch.float64)
    torch.testing.assert_close(dense(a), expected)
    assert not bool(a.has_self_loop().any())


def test_augment_a2_random_nonsymmetric_matches_dense():
    ei, w = random_graph(25, 80, weighted=True, seed=7)
    g = CSRGraph.from_edge_index(ei, w, num_nodes=27)
    m = dense(g.remove_self_loops()) + torch.eye(27, dtype=torch.float64)
    sq = m @ m
    sq.fill_diagonal_(0)
    torch.testing.assert_close(dense(g.augment_a2()), sq)


@pytest.mark.parametrize("dedupe", [True, False])
def test_augment_a2_matches_pygs_graph_unet_augment_adj(dedupe):
    """Against the peer the official code calls, PyG's ``GraphUNet.augment_adj``, on directed
    weighted graphs with duplicate edges and (duplicate) self-loops."""
    pyg = pytest.importorskip("torch_geometric.nn")
    unet = pyg.GraphUNet(2, 2, 2, depth=1)
    for seed in range(6):
        ei, w = random_graph(20, 70, weighted=True, seed=seed)
        ei = torch.cat([ei, ei[:, :4], torch.tensor([[3, 3, 5], [3, 3, 5]])], 1)   # + dup loops
        w = torch.cat([w, w[:4], torch.tensor([0.5, 2.0, 1.5])]).double()
        n = 22
        theirs_ei, theirs_w = unet.augment_adj(ei, w, n)      # (source, target) entries
        ours = CSRGraph.from_edge_index(ei, w, num_nodes=n, dedupe=dedupe).augment_a2()
        torch.testing.assert_close(dense(ours), dense_from_edges(theirs_ei, theirs_w, n))


def test_augment_a2_differentiates_through_learnable_weights():
    """A² was formed from detached weights: a learnable graph's gradient silently lacked every
    path through it (the official preset squares each pooled graph; an nn-module audit found
    its edge-weight gradient off by 2e-4 of 1.2e-2). Now the A² weights carry the gradient:
    gradcheck of the dense A² against the weights; the same values as the cached, detached
    path; made anew per call, so a second step's backward works."""
    ei, w = random_graph(14, 40, weighted=True, seed=3)
    ei = torch.cat([ei, torch.tensor([[2, 5, 5], [2, 5, 6]])], 1)       # self-loops, a repeat
    w = torch.cat([w, torch.tensor([0.7, 1.3, 0.4], dtype=torch.float64)])

    def a2_dense(w):
        return dense_with_grad(CSRGraph.from_edge_index(ei, w, num_nodes=16).augment_a2())

    def dense_with_grad(g):
        m = torch.zeros(g.num_nodes, g.num_nodes, dtype=torch.float64)
        return m.index_put((g.row_index(), g.indices), g.weight, accumulate=True)

    leaf = w.clone().requires_grad_()
    assert torch.autograd.gradcheck(a2_dense, (leaf,))
    fixed = CSRGraph.from_edge_index(ei, w, num_nodes=16)
    learnable = CSRGraph(fixed.indptr, fixed.indices, torch.nn.Parameter(fixed.weight.clone()),
                         16)                            # its weights a leaf, as a parameter
    a = learnable.augment_a2()
    b = fixed.augment_a2()
    assert a.weight.requires_grad and torch.equal(a.indices, b.indices)
    torch.testing.assert_close(a.weight, b.weight, rtol=1e-15, atol=0)
    a.weight.sum().backward()
    learnable.augment_a2().weight.sum().backward()     # a fresh graph: no freed history
    with torch.no_grad():                               # no gradient asked: the cached path
        assert not learnable.augment_a2().weight.requires_grad
    # a weight at exactly 0 (a zero initialisation): its A² entries were dropped as zeros,
    # and their gradient with them (a review of the change); the dense (A + I)² has it
    cycle = torch.tensor([[0, 1, 2], [1, 2, 0]])
    w0 = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    CSRGraph.from_edge_index(cycle, w0, num_nodes=3).augment_a2().weight.sum().backward()
    leaf = w0.detach().clone().requires_grad_()
    m = torch.zeros(3, 3, dtype=torch.float64).index_put((cycle[1], cycle[0]), leaf) \
        + torch.eye(3, dtype=torch.float64)
    sq = m @ m
    (sq.sum() - sq.diagonal().sum()).backward()
    torch.testing.assert_close(w0.grad, leaf.grad)


def test_transpose_and_symmetry():
    ei, w = random_graph(20, 70, weighted=True, seed=1)
    g = CSRGraph.from_edge_index(ei, w)
    t = g.transpose()
    torch.testing.assert_close(dense(t), dense(g).T)
    assert g.transpose() is t and not g.is_symmetric()
    s = CSRGraph.from_edge_index(ei, symmetrize=True)
    assert s.is_symmetric()


def test_symmetry_is_inherited_and_correct():
    ei, w = random_graph(30, 90, weighted=True, seed=8)
    s = CSRGraph.from_edge_index(ei, w, symmetrize=True)
    assert s.known_symmetric  # by construction, before any check
    derived = [s.subgraph(torch.randperm(30)[:11]), s.augment_a2(), s.remove_self_loops(),
               s.with_self_loops(2.0), s.to("cpu")]
    for g in derived:
        assert g.known_symmetric and g.transpose() is g
        torch.testing.assert_close(dense(g), dense(g).T)  # the flag is true of the matrix
    assert s.augment_a2() is derived[1]  # cached
    ns = CSRGraph.from_edge_index(ei, w)
    assert ns.known_symmetric is None and ns.subgraph(torch.arange(5)).known_symmetric is None
    assert not ns.is_symmetric() and ns.known_symmetric is False


def test_round_trip_and_isolated_nodes():
    ei, w = random_graph(15, 50, weighted=True, seed=2)
    g = CSRGraph.from_edge_index(ei, w, num_nodes=20)  # nodes >= 15 isolated
    g2 = CSRGraph.from_edge_index(g.edge_index(), g.edge_weight(), num_nodes=20)
    assert torch.equal(g2.indptr, g.indptr) and torch.equal(g2.indices, g.indices)
    assert torch.equal(g2.weight, g.weight)
    torch.testing.assert_close(dense(g), dense_from_edges(ei, w, 20))
    assert bool((g.indptr[15:] == g.num_edges).all())  # no entries in isolated rows


def test_empty_graph():
    g = CSRGraph.from_edge_index(torch.zeros(2, 0, dtype=torch.long), num_nodes=5)
    assert g.num_edges == 0 and g.indptr.tolist() == [0] * 6
    assert g.transpose().num_edges == 0 and g.is_symmetric()
    assert g.augment_a2().num_edges == 0
    dinv, _ = g.gcn_deg_inv_sqrt()
    torch.testing.assert_close(dinv, torch.full((5,), 2.0).rsqrt())
    z = CSRGraph.from_edge_index(torch.zeros(2, 0, dtype=torch.long))
    assert z.num_nodes == 0 and "num_nodes=0" in repr(z)


def test_inputs_not_mutated_and_weight_grad_flows():
    ei = torch.tensor([[3, 0, 1, 1], [0, 1, 0, 0]], dtype=torch.int32)
    w = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    ei0, w0 = ei.clone(), w.detach().clone()
    g = CSRGraph.from_edge_index(ei, w, symmetrize=True, remove_self_loops=True)
    g.with_self_loops(2.0).subgraph(torch.tensor([1, 0])).augment_a2()
    assert torch.equal(ei, ei0) and torch.equal(w.detach(), w0) and ei.dtype == torch.int32
    g.weight.sum().backward()
    assert w.grad.tolist() == [2.0, 2.0, 2.0, 2.0]


def test_to_device_and_repr():
    g = CSRGraph.from_edge_index(torch.tensor([[0], [1]]), torch.tensor([0.5]))
    h = g.to("cpu")
    assert h is g  # immutable: same device -> the same object, caches kept
    assert "weighted" in repr(h) and "num_edges=1" in repr(h)
    # a dtype, or no device at all, is a TypeError saying what `to` takes (it was
    # torch.device()'s "invalid combination of arguments": a fresh-user audit)
    with pytest.raises(TypeError, match="CSRGraph.to takes a device, got the dtype "
                                        "torch.float64"):
        g.to(torch.float64)
    for bad in (1.5, True, None):
        with pytest.raises(TypeError, match=r"CSRGraph.to takes a device \(a str"):
            g.to(bad)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(edge_index=torch.zeros(3, 4, dtype=torch.long)), ValueError, "shape"),
        (dict(edge_index=torch.zeros(2, 4)), TypeError, "integer"),
        (dict(edge_index=torch.tensor([[0, -1], [1, 0]])), ValueError, "negative"),
        (dict(edge_index=torch.tensor([[0, 5], [1, 0]]), num_nodes=3), ValueError, "num_nodes"),
        (dict(edge_index=torch.tensor([[0, 1]]).T, edge_weight=torch.tensor([1.0, 2.0])),
         ValueError, "entries"),
        (dict(edge_index=torch.tensor([[0], [1]]), edge_weight=torch.tensor([float("nan")])),
         ValueError, "NaN"),
        (dict(edge_index=torch.tensor([[0], [1]]), edge_weight=torch.tensor([1])),
         TypeError, "floating"),
        (dict(edge_index=[[0], [1]]), TypeError, "torch.Tensor"),
        (dict(edge_index=torch.tensor([[0], [1]]), num_nodes=-1), ValueError, "num_nodes"),
        (dict(edge_index=torch.tensor([[0], [1]]), num_nodes=2.0), TypeError, "num_nodes"),
    ],
)
def test_bad_inputs(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        CSRGraph.from_edge_index(**kwargs)


def test_bad_csr_and_subgraph():
    ip, ix = torch.tensor([0, 2, 3]), torch.tensor([1, 0, 0])
    with pytest.raises(ValueError, match="sorted"):
        CSRGraph(ip, ix)
    with pytest.raises(ValueError, match="indices"):
        CSRGraph(ip, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="non-decreasing"):
        CSRGraph(torch.tensor([0, 2, 1, 3]), torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match="start at 0"):
        CSRGraph(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1]))
    with pytest.raises(TypeError, match="integer"):
        CSRGraph(ip.float(), ix)
    # each check on its own (a mutation audit: deleting any of these passed every test; the
    # inputs then gave numbers from outside the graph or crashed inside torch)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 2\)"):
        CSRGraph(torch.tensor([0, 1, 2]), torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match="start at 0"):
        CSRGraph(torch.tensor([1, 1, 2]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="indptr has 3 entries, expected 5"):
        CSRGraph(torch.tensor([0, 0, 0]), torch.tensor([], dtype=torch.long), num_nodes=4)
    # 2-D index tensors and an empty indptr (a mutation pass, session 73: without their checks
    # a 2-D indices was taken as a graph, a 2-D indptr failed in a scalar conversion, and an
    # empty one gave "num_nodes must be >= 0, got -1" for a num_nodes the call never passed)
    with pytest.raises(ValueError, match=r"indices must be 1-D, got shape \(2, 1\)"):
        CSRGraph(torch.tensor([0, 1, 2]), torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match=r"indptr must be 1-D, got shape \(1, 4\)"):
        CSRGraph(torch.tensor([[0, 1, 2, 2]]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"indptr must have num_nodes \+ 1 >= 1 entries"):
        CSRGraph(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="is too large"):
        CSRGraph.from_edge_index(torch.tensor([[0, 2**62], [2**62, 0]]))
    g = CSRGraph(torch.tensor([0, 2, 3]), torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match="lie in"):
        g.subgraph(torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match="nodes must be 1-D"):
        g.subgraph(torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="duplicate"):
        g.subgraph(torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="lie in"):
        g.subgraph(torch.tensor([2]))
    with pytest.raises(TypeError, match="integer"):
        g.subgraph(torch.tensor([0.0]))


def test_deepcopy_of_a_used_graph():
    # a graph whose caches hold sparse CSR operators (after a propagation) deep-copies: the
    # arrays are copied (independent weights), the caches rebuilt, a symmetry promise kept
    import copy

    from hiertail_fast import gcn_propagate

    gen = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 30, (2, 90), generator=gen)
    x = torch.randn(30, 4, generator=gen)
    w = torch.rand(90, generator=gen)
    g = CSRGraph.from_edge_index(ei, w, 30, symmetrize=True)
    before = gcn_propagate(x, g, backend="torch")
    dup = copy.deepcopy({"graph": g, "again": g})
    assert dup["graph"] is dup["again"] and dup["graph"] is not g
    assert dup["graph"].known_symmetric
    assert torch.equal(gcn_propagate(x, dup["graph"], backend="torch"), before)
    with torch.no_grad():
        dup["graph"].weight.mul_(2.0)
    assert torch.equal(gcn_propagate(x, g, backend="torch"), before)


def test_an_unpickled_graph_is_found_again_by_its_arrays():
    """torch.save / torch.load of a used graph: the arrays, the caches and the symmetry flag
    come back, and the graph registers itself as a constructed one does (the compiled ops
    find it, and its caches, from its arrays)."""
    import io

    ei = torch.randint(0, 12, (2, 40), generator=torch.Generator().manual_seed(0))
    g = CSRGraph.from_edge_index(ei, torch.rand(40), num_nodes=12, symmetrize=True)
    g.gcn_deg_inv_sqrt()
    buf = io.BytesIO()
    torch.save(g, buf)
    buf.seek(0)
    h = torch.load(buf, weights_only=False)
    assert torch.equal(h.indptr, g.indptr) and torch.equal(h.weight, g.weight)
    assert h.known_symmetric and h._cache.keys() == g._cache.keys()
    assert CSRGraph._live(h.indptr, h.indices, h.weight, h.num_nodes) is h
    assert CSRGraph._live(g.indptr, g.indices, g.weight, g.num_nodes) is g


# ------------------------------------------------------------------ arrays and weights kept safe
def test_arrays_modified_in_place_after_construction_raise():
    """The graph keeps the indptr / indices it is given (no copy): an in-place change of them
    afterwards raises, instead of serving the operator cached from their old contents (or an
    IndexError deep inside for an id now out of range)."""
    from hiertail_fast import gcn_propagate

    indptr, indices = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 0])
    g = CSRGraph(indptr, indices)
    x = torch.eye(3)
    gcn_propagate(x, g)
    indices.copy_(torch.tensor([2, 0, 1]))
    for call in (lambda: gcn_propagate(x, g), lambda: gcn_propagate(x, g, improved=False),
                 lambda: g.row_index(), lambda: g.transpose()):
        with pytest.raises(ValueError, match="modified in place after it was built"):
            call()
    fresh = CSRGraph(indptr, indices)                       # a new graph on the new contents
    torch.testing.assert_close(dense(fresh), dense_from_edges(fresh.edge_index(), None, 3))
    with torch.inference_mode():                            # no version counters: not checked
        g_inf = CSRGraph(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 0]))
        assert g_inf.row_index().tolist() == [0, 1, 2]


def test_copies_of_a_graph_have_their_own_array_versions():
    import copy
    import io
    import pickle

    indptr, indices = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 0])
    indices.add_(0)                                         # a version counter that is not 0
    g = CSRGraph(indptr, indices)
    buf = io.BytesIO()
    torch.save(g, buf)
    buf.seek(0)
    for copied in (pickle.loads(pickle.dumps(g)), copy.deepcopy(g), copy.copy(g),
                   torch.load(buf, weights_only=False)):
        assert copied.row_index().tolist() == [0, 1, 2]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_weights_made_non_finite_in_place_raise_on_every_path(bad):
    """Weights checked at construction and again after an in-place update (a diverged step on
    learnable weights): the fast backends raise as the reference does (they returned NaN rows,
    or a misleading negative-degree error), and top-k pooling does not carry them over."""
    from hiertail_fast import gcn_propagate, topk_pool

    base = CSRGraph.from_edge_index(torch.tensor([[0, 1, 2, 3, 1], [1, 2, 3, 0, 0]]),
                                    torch.ones(5))
    w = torch.nn.Parameter(base.weight.clone())
    g = CSRGraph(base.indptr, base.indices, w)
    x = torch.randn(4, 3)
    gcn_propagate(x, g)
    with torch.no_grad():
        w[0] = bad
    for call in (lambda: gcn_propagate(x, g), lambda: gcn_propagate(x.detach(), g),
                 lambda: topk_pool(x, g, torch.ones(3), 1.0), lambda: g.augment_a2()):
        with pytest.raises(ValueError, match="edge weights contain NaN or Inf"):
            call()
    with torch.no_grad(), pytest.raises(ValueError, match="edge weights contain NaN or Inf"):
        gcn_propagate(x, g)
    with torch.no_grad():
        w[0] = 2.0                                          # repaired: works again
    torch.testing.assert_close(gcn_propagate(x, g), gcn_propagate(x, g, backend="reference"))


def test_with_self_loops_fill_is_checked():
    g = CSRGraph.from_edge_index(torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]),
                                 torch.tensor([1.0, 2, 3, 4]))
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="fill must be finite"):
            g.with_self_loops(bad)
    for bad in ("2", True, None, torch.ones(2)):
        with pytest.raises(TypeError, match="fill must be a real number"):
            g.with_self_loops(bad)
    assert dense(g.with_self_loops(torch.tensor(3.0))).diagonal().tolist() == [3.0] * 4
    assert dense(g.with_self_loops(2)).diagonal().tolist() == [2.0] * 4


@pytest.mark.parametrize("layout", ["bsr", "bsc"])
def test_block_sparse_adjacency_is_rejected(layout):
    """BSR / BSC store the zeros inside every block: read as entries they became edges of
    weight 0 (and self-loops on the diagonal, which then kept GCN's self-loop out)."""
    from hiertail_fast import gcn_propagate

    ei = torch.tensor([[1, 2, 0], [0, 1, 3]])
    adj = torch.sparse_coo_tensor(ei.flip(0), torch.ones(3), (4, 4)).coalesce()
    block = adj.to_sparse_bsr((2, 2)) if layout == "bsr" else adj.to_sparse_bsc((2, 2))
    for call in (lambda: CSRGraph.from_sparse(block), lambda: gcn_propagate(torch.eye(4), block)):
        with pytest.raises(TypeError, match="layout is not supported"):
            call()


def test_hybrid_sparse_adjacency_is_rejected():
    """A COO tensor with a dense dimension (sparse_dim 1, dense_dim 1) is 2-D too: it failed
    with 'not enough values to unpack' inside the conversion (an interop audit)."""
    from hiertail_fast import gcn_propagate

    hybrid = torch.sparse_coo_tensor(torch.arange(4)[None], torch.ones(4, 4), (4, 4))
    for call in (lambda: CSRGraph.from_sparse(hybrid),
                 lambda: gcn_propagate(torch.eye(4), hybrid)):
        with pytest.raises(ValueError, match="hybrid sparse tensor with 1 dense dimension"):
            call()


@pytest.mark.parametrize("dtype, big", [(torch.float32, 3e38), (torch.float16, 4e4)])
def test_duplicate_weights_summing_past_their_dtype_are_refused_where_they_merge(dtype, big):
    """Finite weights of duplicate edges merged into one entry (dedupe, symmetrize, a sparse
    adjacency's coalesce, prepare_graph's symmetrisation) whose sum overflows their dtype: the
    graph held inf, and the op using it later blamed an in-place edit that never happened."""
    from hiertail_fast.nn.hiertail import prepare_graph

    twice = torch.tensor([[0, 0], [1, 1]])            # the edge 0 -> 1 twice
    pair = torch.tensor([[0, 1], [1, 0]])             # 0 -> 1 and 1 -> 0
    w = torch.tensor([big, big], dtype=dtype)
    overflow = f"duplicate edges sum past {dtype}'s range"
    calls = {
        "dedupe": lambda: CSRGraph.from_edge_index(twice, w, num_nodes=2),
        "symmetrize": lambda: CSRGraph.from_edge_index(pair, w, num_nodes=2, symmetrize=True),
        "coalesce": lambda: CSRGraph.from_sparse(torch.sparse_coo_tensor(twice.flip(0), w,
                                                                          (2, 2))),
        "prepare_graph": lambda: prepare_graph(pair, 2, torch.tensor([big, big * 0.9],
                                                                     dtype=dtype)),
    }
    for call in calls.values():
        with pytest.raises(ValueError, match=overflow):
            call()
    # kept apart, the same weights are a valid graph; a sum just inside the range stays
    apart = CSRGraph.from_edge_index(twice, w, num_nodes=2, dedupe=False)
    assert torch.equal(apart.weight, w)
    half = torch.finfo(dtype).max / 2
    merged = CSRGraph.from_edge_index(twice, torch.tensor([half, half], dtype=dtype),
                                      num_nodes=2)
    assert merged.weight.tolist() == [torch.finfo(dtype).max]
    # a weight that is itself non-finite keeps its own message
    bad = torch.sparse_coo_tensor(twice.flip(0), torch.tensor([1.0, float("inf")]), (2, 2))
    with pytest.raises(ValueError, match=r"the sparse adjacency's value tensor \(its edge "
                       r"weights\) contains NaN or Inf"):
        CSRGraph.from_sparse(bad)


def test_node_arrays_past_the_machines_memory_are_refused(monkeypatch):
    # one edge to a raw id of 3,000,000,000 made n = id + 1 and a ~24 GB row-pointer array:
    # the process was killed by the OS (a data audit, session 67). Graphs under 1 GB of node
    # arrays never ask the OS (nor while TorchDynamo traces)
    from hiertail_fast._validation import graphs as _validation  # (where the check reads it)

    monkeypatch.setattr(_validation, "physical_memory", lambda: 1_000_000_000)   # 1 GB
    ei = torch.tensor([[0], [50_000_000]])
    with pytest.raises(ValueError, match=r"num_nodes was taken as the largest node id \+ 1 = "
                       r"50,000,001: the graph's node arrays alone would need ~1.2 GB, more "
                       r"than this machine's 1 GB; pass num_nodes"):
        CSRGraph.from_edge_index(ei)
    with pytest.raises(ValueError, match=r"^num_nodes = 60,000,000: .* number the nodes"):
        CSRGraph.from_edge_index(ei, num_nodes=60_000_000)
    monkeypatch.setattr(_validation, "physical_memory", lambda: 1000)   # < 1 GB: not asked
    assert CSRGraph.from_edge_index(torch.tensor([[0], [1000]])).num_nodes == 1001
    monkeypatch.setattr(_validation, "physical_memory", lambda: None)   # the OS does not say
    _validation.check_node_arrays_fit(50_000_001, torch.device("cpu"), inferred=True)


def test_degree_names_a_dtype_that_is_not_one():
    # degree("float32") failed inside torch.promote_types (an API audit, session 68)
    g = CSRGraph.from_edge_index(torch.tensor([[0, 1], [1, 0]]))
    for bad in ("float32", None, float):
        with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
            g.degree(bad)
    assert g.degree(torch.float64).tolist() == [1.0, 1.0]
    assert g.degree(torch.int64).tolist() == [1, 1]          # integer counts, as before


def test_a_directed_cycle_is_not_symmetric_and_propagates_back_through_the_transpose():
    # a 3-cycle has its transpose's row lengths but other columns: comparing the row pointers
    # alone called it symmetric, and gcn_propagate's backward applied Â for Âᵀ (wrong
    # gradients, every test passing; mutation audit, session 69)
    from hiertail_fast.ops.gcn_propagate import gcn_propagate
    from hiertail_fast.reference.gcn_propagate import gcn_propagate_ref

    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    up = torch.tensor([[1.0], [0.0], [0.0]], dtype=torch.float64)
    for w in (None, torch.tensor([1.0, 2.0, 3.0])):
        g = CSRGraph.from_edge_index(ei, w, num_nodes=3)
        assert g.is_symmetric() is False
        x, x_ref = (torch.tensor([[1.0], [2.0], [4.0]], dtype=torch.float64,
                                 requires_grad=True) for _ in range(2))
        gcn_propagate(x, g, backend="torch").backward(up)
        gcn_propagate_ref(x_ref, ei, w).backward(up)          # autograd through the edges
        torch.testing.assert_close(x.grad, x_ref.grad)


def test_edge_weight_casts_and_the_degree_sums_the_weights_as_the_dtype_holds_them():
    # edge_weight(dtype) casts (it returned the stored tensor); degree(float32) of float64
    # weights sums their float32 values, as the float32 operator does (it summed the
    # unrounded ones: 1 ulp off); mutation audit, session 69
    w = torch.full((3,), 1 + 0.49 * 2.0**-23, dtype=torch.float64)
    g = CSRGraph.from_edge_index(torch.tensor([[1, 2, 0], [0, 0, 0]]), w, num_nodes=3)
    assert g.edge_weight() is g.weight and g.edge_weight(torch.float32).dtype == torch.float32
    assert torch.equal(g.edge_weight(torch.float32), w.float())
    assert g.degree(torch.float32)[0].item() == 3.0 == w.float().double().sum().float().item()
    assert g.degree(torch.float64)[0].item() == w.sum().item() != 3.0


def test_default_dtypes_of_weights_and_degrees():
    """weight_or_ones and degree default to float32; the loops added to an unweighted graph
    take torch's default dtype, as do the weights of an empty graph's A²."""
    g = CSRGraph.from_edge_index(torch.tensor([[0, 1], [1, 2]]))
    assert g.weight_or_ones().dtype == torch.float32
    assert g.degree().dtype == torch.float32 and g.degree(torch.float64).dtype == torch.float64
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert g.with_self_loops(2.0).weight.dtype == torch.float64
        assert CSRGraph.from_edge_index(torch.zeros(2, 0, dtype=torch.long), num_nodes=0
                                        ).augment_a2().weight.dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)


def test_gcn_normalisation_refuses_weights_beyond_the_dtype():
    """float64 weights past float32's range are refused by name when the GCN degrees are
    asked for in float32, not returned as inf / 0."""
    g = CSRGraph.from_edge_index(torch.tensor([[0], [1]]),
                                 torch.tensor([1e300], dtype=torch.float64))
    with pytest.raises(ValueError, match="beyond torch.float32's range"):
        g.gcn_deg_inv_sqrt(dtype=torch.float32)
    with pytest.raises(ValueError, match="beyond torch.float32's range"):
        g.gcn_norm_values(dtype=torch.float32)
    assert torch.isfinite(g.gcn_deg_inv_sqrt(dtype=torch.float64)[0]).all()


def test_with_self_loops_refuses_a_remaining_that_is_not_a_bool():
    """``remaining`` must be a bool: a string ("no" is truthy) is a TypeError naming it."""
    g = CSRGraph.from_edge_index(torch.tensor([[0, 1], [1, 2]]))
    with pytest.raises(TypeError, match="remaining must be a bool"):
        g.with_self_loops(remaining="no")
    with pytest.raises(TypeError, match="remaining must be a bool"):
        g.with_self_loops(remaining=None)


def test_symmetrize_without_dedupe_keeps_both_directions_apart():
    """``symmetrize=True, dedupe=False`` keeps every original and reversed entry separate;
    only ``dedupe`` merges them (summing the weights)."""
    ei, w = torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0])
    kept = CSRGraph.from_edge_index(ei, w, symmetrize=True, dedupe=False)
    assert kept.num_edges == 4
    assert sorted(kept.weight.tolist()) == [1.0, 1.0, 2.0, 2.0]
    merged = CSRGraph.from_edge_index(ei, w, symmetrize=True)
    assert merged.num_edges == 2 and merged.weight.tolist() == [3.0, 3.0]
