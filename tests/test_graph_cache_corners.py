"""CSRGraph's caches, weight versions, copies and pickles (``graph.py``): corners a mutation
audit of 2026-12-03 found unchecked (each test failed on the mutant it describes, passes on
main). docs/GUARANTEES.md: "Cached operators, degrees, transposes and A² follow in-place
updates of the edge weights" and "changing [the arrays] in place afterwards makes every later
call raise ... The same holds for a copy".

- a pickled / torch.save'd copy records its loaded arrays' versions: an edit after the load
  raises (it was served silently).
- A² follows an in-place update of plain weights and an optimizer step under no_grad (an A²
  cached by structure alone was served).
- weights made in inference mode have no version counter: never served a stale operator,
  degrees or A² after an in-place edit there.
- a fused optimizer step (no version bump): the symmetry flag asked right after it, and a
  pickled copy made after it and frozen, follow the new weights.
- the differentiable A² of bfloat16 weights sums in float32 and comes back in bfloat16, equal
  to the cached one (a bfloat16 running sum stalls at 256).
- a deep copy of a graph with a DECLARED symmetry whose arrays were edited raises.
- ``gcn_norm_values`` of learnable weights is recomputed each call (a cached one failed the
  second backward).
- (a mutation pass, session 73) a loaded copy's own learnable weights stepped by a fused
  optimizer are compared before an entry is served; structural entries first cached in
  inference mode are ordinary tensors.
"""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

from hiertail_fast import CSRGraph, gcn_propagate
from tests.test_graph_state import COPIES, _fresh


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_a_loaded_copy_refuses_its_arrays_edited_after_the_load(how):
    indptr = torch.tensor([0, 1, 3, 5, 6])
    indices = torch.tensor([1, 0, 2, 1, 3, 2])        # symmetric path 0-1-2-3
    g = CSRGraph(indptr, indices, num_nodes=4)
    assert g.is_symmetric()
    c = COPIES[how](g)
    x = torch.randn(4, 3, dtype=torch.float64)
    gcn_propagate(x, c)                                # caches filled on the copy
    c.indices[0] = 2                                   # valid CSR, no longer symmetric
    with pytest.raises(ValueError, match="modified in place"):
        gcn_propagate(x, c)
    with pytest.raises(ValueError, match="modified in place"):
        _ = c.known_symmetric


def _pattern():
    gen = torch.Generator().manual_seed(0)
    s = CSRGraph.from_edge_index(torch.randint(0, 25, (2, 100), generator=gen), num_nodes=25)
    return s, torch.rand(s.num_edges, generator=gen) + 0.5


def _same(a, b):
    assert torch.equal(a.indptr, b.indptr) and torch.equal(a.indices, b.indices)
    torch.testing.assert_close(a.weight, b.weight)


def test_a2_follows_an_in_place_update_of_plain_weights():
    s, w = _pattern()
    g = CSRGraph(s.indptr, s.indices, w, s.num_nodes)
    g.augment_a2()
    w.mul_(3.0).add_(torch.arange(w.numel()) % 3)
    _same(g.augment_a2(), CSRGraph(s.indptr, s.indices, w.clone(), s.num_nodes).augment_a2())


def test_a2_follows_an_optimizer_step_under_no_grad():
    s, w = _pattern()
    p = torch.nn.Parameter(w.clone())
    g = CSRGraph(s.indptr, s.indices, p, s.num_nodes)
    with torch.no_grad():
        g.augment_a2()
    opt = torch.optim.SGD([p], lr=0.5)
    (p * torch.arange(p.numel())).sum().backward()
    opt.step()
    with torch.no_grad():
        got = g.augment_a2()
    _same(got, CSRGraph(s.indptr, s.indices, p.detach().clone(), s.num_nodes).augment_a2())


def test_inference_weights_edited_in_place_are_not_served_stale():
    gen = torch.Generator().manual_seed(3)
    ei = torch.randint(0, 20, (2, 70), generator=gen)
    x = torch.randn(20, 3, generator=gen)
    with torch.inference_mode():
        g = CSRGraph.from_edge_index(ei, torch.rand(70, generator=gen) + 0.5, num_nodes=20)
        assert g.weight.is_inference()
        gcn_propagate(x, g, backend="torch")
        g.augment_a2()
        g.weight.mul_(torch.rand(g.num_edges, generator=gen) + 2.0)
        plain = _fresh(g)
        torch.testing.assert_close(gcn_propagate(x, g, backend="torch"),
                                   gcn_propagate(x, plain, backend="torch"))
        torch.testing.assert_close(g.gcn_deg_inv_sqrt()[0], plain.gcn_deg_inv_sqrt()[0])
        torch.testing.assert_close(g.augment_a2().weight, plain.augment_a2().weight)


def _stepped():
    s = CSRGraph.from_edge_index(torch.randint(0, 20, (2, 70), generator=torch.Generator()
                                               .manual_seed(0)), num_nodes=20, symmetrize=True)
    w = torch.nn.Parameter(torch.ones(s.num_edges))        # symmetric weights, learnable
    g = CSRGraph(s.indptr, s.indices, w, s.num_nodes)
    assert g.is_symmetric()
    x = torch.randn(20, 3, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        gcn_propagate(x, g)                                # caches the operator
    opt = torch.optim.Adam([w], lr=0.5, fused=True)
    (w * torch.arange(w.numel())).sum().backward()         # an asymmetric step
    version = w._version
    opt.step()
    assert w._version == version                           # the counter was not bumped
    return g, x


def test_symmetry_seen_broken_right_after_a_fused_step():
    g, _ = _stepped()
    assert g.is_symmetric() is False
    t = g.transpose()
    assert t is not g
    assert torch.equal(t.weight, _fresh(g).transpose().weight)


def test_a_copy_after_a_fused_step_and_freeze_serves_the_new_weights():
    g, x = _stepped()
    g.weight.requires_grad_(False)
    c = pickle.loads(pickle.dumps(g))
    with torch.no_grad():
        torch.testing.assert_close(gcn_propagate(x, c), gcn_propagate(x, _fresh(g)))
    assert c.is_symmetric() is False


def test_a_loaded_copy_follows_a_fused_step_of_its_own_learnable_weights():
    """A copy keeps its cached entries but not the weights' snapshot; its weights, learnable,
    stepped by a fused optimizer (no version bump) must be compared before an entry is served
    (skipped where no snapshot travelled, the copy served the old operator: a mutation pass,
    session 73)."""
    s = CSRGraph.from_edge_index(torch.randint(0, 20, (2, 70), generator=torch.Generator()
                                               .manual_seed(0)), num_nodes=20, symmetrize=True)
    g = CSRGraph(s.indptr, s.indices, torch.nn.Parameter(torch.ones(s.num_edges)), s.num_nodes)
    x = torch.randn(20, 3, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        gcn_propagate(x, g)                                # caches the operator
    c = pickle.loads(pickle.dumps(g))
    assert c.weight.requires_grad
    opt = torch.optim.Adam([c.weight], lr=0.5, fused=True)
    (c.weight * torch.arange(c.num_edges)).sum().backward()
    version = c.weight._version
    opt.step()
    assert c.weight._version == version                    # the counter was not bumped
    with torch.no_grad():
        torch.testing.assert_close(gcn_propagate(x, c), gcn_propagate(x, _fresh(c)))


def test_structural_entries_cached_in_inference_mode_serve_a_later_training_step():
    """docs/GUARANTEES.md: caches filled under torch.inference_mode() hold ordinary tensors.
    A row index first cached in an evaluation pass was an inference tensor (made without the
    guard), and every later training step on learnable weights failed: "Inference tensors
    cannot be saved for backward" (a mutation pass, session 73)."""
    w = torch.nn.Parameter(torch.ones(4))
    g = CSRGraph(torch.tensor([0, 1, 3, 4]), torch.tensor([1, 0, 2, 1]), w, 3)
    with torch.inference_mode():
        assert not g.row_index().is_inference()
    values, _ = g.gcn_norm_values()
    values.sum().backward()
    assert w.grad is not None and torch.isfinite(w.grad).all()


def test_a2_of_learnable_bfloat16_weights_sums_in_float32():
    k = 300                                   # 300 two-hop paths 0 -> hub_i -> 1
    hubs = torch.arange(2, 2 + k)
    src = torch.cat([torch.zeros(k, dtype=torch.long), hubs])
    dst = torch.cat([hubs, torch.ones(k, dtype=torch.long)])
    s = CSRGraph.from_edge_index(torch.stack([src, dst]), num_nodes=2 + k)
    w = torch.ones(s.num_edges, dtype=torch.bfloat16)
    fixed = CSRGraph(s.indptr, s.indices, w, s.num_nodes).augment_a2()
    p = torch.nn.Parameter(w.clone())
    learn = CSRGraph(s.indptr, s.indices, p, s.num_nodes).augment_a2()
    assert learn.weight.requires_grad and learn.weight.dtype == torch.bfloat16
    assert torch.equal(learn.indptr, fixed.indptr) and torch.equal(learn.indices, fixed.indices)
    assert torch.equal(learn.weight.detach(), fixed.weight)
    assert 300.0 in fixed.weight.float().tolist()


def test_a_deep_copy_of_a_declared_graph_with_edited_arrays_raises():
    indptr = torch.tensor([0, 1, 3, 5, 6])
    indices = torch.tensor([1, 0, 2, 1, 3, 2])          # symmetric path 0-1-2-3
    g = CSRGraph(indptr, indices, num_nodes=4).assume_symmetric()
    indices[0] = 2                                      # valid CSR, no longer symmetric
    c = copy.deepcopy(g)
    x = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="modified in place"):
        gcn_propagate(x, c)
    with pytest.raises(ValueError, match="modified in place"):
        _ = c.known_symmetric


def test_norm_values_of_learnable_weights_differentiate_every_step():
    s = CSRGraph.from_edge_index(torch.randint(0, 15, (2, 50), generator=torch.Generator()
                                               .manual_seed(0)), num_nodes=15)
    p = torch.nn.Parameter(torch.rand(s.num_edges, generator=torch.Generator().manual_seed(1))
                           + 0.5)
    g = CSRGraph(s.indptr, s.indices, p, s.num_nodes)
    grads = []
    for _ in range(2):
        values, diag = g.gcn_norm_values()
        assert values.requires_grad
        (values.sum() + diag.sum()).backward()
        grads.append(p.grad.clone())
        p.grad = None
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_a_copy_of_inference_weights_edited_in_place_serves_its_weights(how):
    """Entries made for inference-mode weights (no version counter: "checked each time") do not
    travel in a copy as current: the loaded weights get a real counter, and the operator of the
    weights' old contents was served (s42 audit, mutant P02)."""
    gen = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 30, (2, 120), generator=gen)
    x = torch.randn(30, 4, generator=gen)
    with torch.inference_mode():
        g = CSRGraph.from_edge_index(ei, torch.rand(120, generator=gen) + 0.5, num_nodes=30)
        gcn_propagate(x, g)                               # caches filled (no version counter)
        g.weight.mul_(torch.rand(g.num_edges, generator=gen) * 3 + 0.1)   # edited in place
    copied = COPIES[how](g)
    fresh = CSRGraph(g.indptr.clone(), g.indices.clone(), g.weight.clone(), 30)
    torch.testing.assert_close(gcn_propagate(x, copied), gcn_propagate(x, fresh))

