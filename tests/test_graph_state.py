"""CSRGraph's caches across copies, modes and in-place updates (hiertail_fast/graph.py and
_graph_cache.py).

Each case gave a silently wrong result or a crash before (an audit of 2026-11-28): a pickled
graph kept cache entries keyed by version counters that restart on load, an operator built by
the backward from the saved weights was cached under the weights' new version, a symmetry
inherited from a parent outlived an in-place update of the child's weights, and caches filled
under ``torch.inference_mode()`` broke every later training step."""
from __future__ import annotations

import copy
import io
import os
import pickle
from pathlib import Path

import pytest
import torch

from hiertail_fast import CSRGraph, HierTail, gcn_propagate, make_synthetic_graph
from hiertail_fast.nn.hiertail import HierTailConfig, prepare_graph
from tests.conftest import backend_device, requires_triton


def _torch_round_trip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


COPIES = {"pickle": lambda g: pickle.loads(pickle.dumps(g, protocol=5)),
          "torch.save": _torch_round_trip, "copy.copy": copy.copy}


def _graph(n=40, seed=0, symmetrize=False, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    s = CSRGraph.from_edge_index(torch.randint(0, n, (2, 6 * n), generator=gen), num_nodes=n,
                                 symmetrize=symmetrize)
    return s, torch.rand(s.num_edges, generator=gen, dtype=dtype) + 0.5


def _fresh(g: CSRGraph) -> CSRGraph:
    return CSRGraph(g.indptr.clone(), g.indices.clone(),
                    None if g.weight is None else g.weight.detach().clone(), g.num_nodes)


@pytest.mark.parametrize("how", list(COPIES))
def test_a_copy_serves_the_weights_it_holds(how):
    """Weights updated in place after the caches were filled, then the graph copied: the copy
    computes with its weights (its counters restart, so an old entry could match again)."""
    s, w = _graph()
    g = CSRGraph(s.indptr, s.indices, torch.nn.Parameter(w), s.num_nodes)
    x = torch.randn(s.num_nodes, 4)
    with torch.no_grad():
        g.weight.mul_(1.3)                           # version 1 (a first optimizer step)
        gcn_propagate(x, g)                          # caches at version 1
        g.weight.mul_(1.7)                           # version 2: caches stale; a loaded
    copied = COPIES[how](g)                          # tensor's counter starts at 1
    with torch.no_grad():
        assert torch.equal(gcn_propagate(x, copied), gcn_propagate(x, _fresh(g)))
        copied.weight.mul_(0.5)                      # and an update of the copy is seen
        assert torch.equal(gcn_propagate(x, copied), gcn_propagate(x, _fresh(copied)))


@pytest.mark.parametrize("how", list(COPIES))
def test_a_copy_of_non_finite_weights_still_raises(how):
    s, w = _graph()
    w.mul_(1.0)                                      # version 1: checked finite there
    g = CSRGraph(s.indptr, s.indices, w, s.num_nodes)
    gcn_propagate(torch.randn(s.num_nodes, 4), g)
    w[3] = float("nan")                              # version 2; the copy's counter: 1
    with pytest.raises(ValueError, match="NaN or Inf"):
        gcn_propagate(torch.randn(s.num_nodes, 4), COPIES[how](g))


@pytest.mark.parametrize("how", list(COPIES))
def test_a_copy_of_arrays_modified_in_place_still_raises(how):
    s, _ = _graph()
    indptr, indices = s.indptr.clone(), s.indices.clone()
    g = CSRGraph(indptr, indices)
    x = torch.randn(s.num_nodes, 4)
    gcn_propagate(x, g)
    indices.copy_((indices + 1) % s.num_nodes)
    with pytest.raises(ValueError, match="modified in place"):
        gcn_propagate(x, COPIES[how](g))


@pytest.mark.parametrize("how", list(COPIES))
def test_a_copy_keeps_the_valid_caches(how):
    """What is valid when copied comes back (no recomputation after a checkpoint load): the
    structural entries, the weight-keyed ones of the current weights, a declared symmetry."""
    s, w = _graph(symmetrize=True)
    g = CSRGraph(s.indptr, s.indices, w, s.num_nodes).assume_symmetric()
    x = torch.randn(s.num_nodes, 4)
    before = gcn_propagate(x, g)
    copied = COPIES[how](g)
    assert copied._cache.keys() == g._cache.keys() and copied.known_symmetric
    assert copied._cache is not g._cache             # copy.copy shared the dict
    assert torch.equal(gcn_propagate(x, copied), before)


@pytest.mark.parametrize("weight_dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("symmetrize", [False, True])
def test_weights_changed_between_forward_and_backward(weight_dtype, symmetrize):
    """autograd sees no change when it saved a dtype-cast copy of the weights: the backward
    gives the gradient of the forward's operator, and the operator cached afterwards is the
    new weights' (it was the old one, under the new version: later steps silently wrong)."""
    s, w = _graph(symmetrize=symmetrize, dtype=weight_dtype)
    if symmetrize:
        w = torch.full_like(w, 1.5)
    x_dtype = torch.float32 if weight_dtype == torch.float64 else torch.float64
    g = CSRGraph(s.indptr, s.indices, w, s.num_nodes)
    old = _fresh(g)
    gout = torch.randn(s.num_nodes, 4, dtype=x_dtype)
    x = torch.randn(s.num_nodes, 4, dtype=x_dtype, requires_grad=True)
    out = gcn_propagate(x, g)
    w.mul_(torch.rand(w.shape, dtype=w.dtype, generator=torch.Generator().manual_seed(1)) + .5)
    out.backward(gout)
    x_old = x.detach().clone().requires_grad_()
    gcn_propagate(x_old, old).backward(gout)
    torch.testing.assert_close(x.grad, x_old.grad)
    new = _fresh(g)
    x2, x_new = (x.detach().clone().requires_grad_() for _ in range(2))
    gcn_propagate(x2, g).backward(gout)
    gcn_propagate(x_new, new).backward(gout)
    torch.testing.assert_close(x2.grad, x_new.grad)
    with torch.no_grad():
        torch.testing.assert_close(gcn_propagate(x, g), gcn_propagate(x, new))


def test_an_inherited_symmetry_follows_the_childs_weights():
    """prepare_graph's output (a symmetric parent's self-loop graph) inherits its symmetry; an
    in-place update of its weights that breaks it is seen, as for a checked symmetry."""
    ei = torch.randint(0, 60, (2, 300), generator=torch.Generator().manual_seed(0))
    g = prepare_graph(ei, 60, torch.ones(300))
    assert g.known_symmetric
    g.weight.mul_(torch.rand(g.num_edges, generator=torch.Generator().manual_seed(1)) + 0.5)
    assert g.known_symmetric is None and not g.is_symmetric()
    x = torch.randn(60, 4, requires_grad=True)
    gcn_propagate(x, g).square().sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    gcn_propagate(x_ref, g, backend="reference").square().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    declared = CSRGraph(g.indptr, g.indices, g.weight.clone(), 60).assume_symmetric()
    declared.weight.mul_(2.0)                 # a declaration is the user's: it stays
    assert declared.known_symmetric


def test_caches_filled_in_inference_mode_serve_training():
    """Scoring a model under torch.inference_mode() before training it filled the graph's
    caches with inference tensors; the first training step then failed ('Inference tensors
    cannot be saved for backward')."""
    data = make_synthetic_graph(300, num_classes=6, avg_degree=6, seed=0)
    graph = prepare_graph(data.edge_index, data.num_nodes)
    x, y, train = data.x.float(), data.y.long(), torch.arange(0, 300, 2)
    torch.manual_seed(0)
    model = HierTail(data.num_features, 6, HierTailConfig.paper(hidden=16))
    model.eval()
    with torch.inference_mode():
        scored = model(x, graph).logits
    model.train()
    model.loss(model(x, graph), y, train).total.backward()
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x, graph).logits, scored)


def test_no_product_swaps_the_warning_filters(monkeypatch):
    """catch_warnings() around every sparse product swapped the process-wide filter list;
    concurrent calls left an "ignore" filter behind that silenced every later warning. torch's
    one-time sparse notices are now drawn once (_csr.sparse_notices_seen): no product enters
    catch_warnings any more."""
    import warnings

    from hiertail_fast import topk_pool
    from hiertail_fast.baselines.layers import adjacency_operator

    s, w = _graph(symmetrize=True)
    x = torch.randn(s.num_nodes, 4)
    gcn_propagate(x, s)                              # the notices, once

    entered = []

    class Counted(warnings.catch_warnings):
        def __enter__(self):
            entered.append(self)
            return super().__enter__()
    monkeypatch.setattr(warnings, "catch_warnings", Counted)
    learnable = CSRGraph(s.indptr, s.indices, torch.nn.Parameter(w), s.num_nodes)
    gcn_propagate(x, learnable).sum().backward()     # operator built per call
    topk_pool(x, learnable, torch.randn(4), 0.5).graph.augment_a2()
    adjacency_operator(s, "row") @ x
    monkeypatch.undo()
    assert not entered


def test_a_cached_conv_shared_by_threads_serves_each_call_its_graph():
    """GCNConv(cached=True) stored the converted graph, then read the attribute again: a
    thread caching another input in between made this call propagate on that graph."""
    import threading

    from hiertail_fast import GCNConv

    stored, other_done = threading.Event(), threading.Event()

    class Interleaved(GCNConv):                      # thread A pauses right after storing
        def __setattr__(self, name, value):
            super().__setattr__(name, value)
            if name == "_cached_graph" and value is not None and \
                    threading.current_thread().name == "A":
                stored.set()
                other_done.wait(10)

    torch.manual_seed(0)
    conv = Interleaved(4, 3, cached=True)
    x = torch.randn(30, 4)
    ei_a, ei_b = (torch.randint(0, 30, (2, 90), generator=torch.Generator().manual_seed(k))
                  for k in (1, 2))
    plain = GCNConv(4, 3)
    plain.load_state_dict(conv.state_dict())
    out = {}
    a = threading.Thread(target=lambda: out.setdefault("a", conv(x, ei_a)), name="A")
    a.start()
    stored.wait(10)
    conv(x, ei_b)                                    # B caches its graph meanwhile
    other_done.set()
    a.join(10)
    torch.testing.assert_close(out["a"], plain(x, ei_a))


@pytest.mark.parametrize("how", list(COPIES))
def test_a_copy_drops_cached_entries_tied_to_learnable_weights(how):
    """A transpose cached for learnable weights holds them gathered with autograd; copied, it
    was a leaf cut off from the copy's weights, and gradients through it stopped there."""
    s, w = _graph()
    g = CSRGraph(s.indptr, s.indices, torch.nn.Parameter(w), s.num_nodes)
    g.transpose()
    copied = COPIES[how](g)
    copied.transpose().weight.sum().backward()
    assert copied.weight.grad is not None and bool((copied.weight.grad == 1).all())


def test_a_used_graph_loads_with_weights_only():
    """torch.load(weights_only=True) with CSRGraph allowed: a used graph's pickled cache held
    a private class of the module, which torch then asked to be allowed too."""
    s, w = _graph(symmetrize=True)
    g = CSRGraph(s.indptr, s.indices, w, s.num_nodes)
    x = torch.randn(s.num_nodes, 4)
    before = gcn_propagate(x, g)
    g.transpose(), g.is_symmetric(), g.augment_a2()
    buf = io.BytesIO()
    torch.save(g, buf)
    buf.seek(0)
    with torch.serialization.safe_globals([CSRGraph]):
        h = torch.load(buf, weights_only=True)
    assert torch.equal(gcn_propagate(x, h), before)
    assert h.known_symmetric is g.known_symmetric is False      # checked, and kept


def test_graphs_saved_by_an_earlier_release_still_load():
    """tests/data/graphs_pickled_7d4f089.pt: two used graphs (unweighted and symmetric;
    weighted and not) with their caches, saved by revision 7d4f089, before the caches moved
    to the base class `GraphCaches`. A user's saved graphs must keep loading (weights_only)
    with the caches valid: propagation bit for bit as a fresh graph of the same arrays, and
    as saved to fp32 rounding (another CPU's sparse product may round differently: one ulp
    on an AMD EPYC against the Intel Xeon that saved it), the symmetry as checked then, and a
    transpose that is the graph's own."""
    path = Path(__file__).parent / "data" / "graphs_pickled_7d4f089.pt"
    with torch.serialization.safe_globals([CSRGraph]):
        saved = torch.load(path, weights_only=True)
    for name, symmetric in (("unweighted", True), ("weighted", False)):
        g, x, y = saved[name]["graph"], saved[name]["x"], saved[name]["y"]
        assert type(g) is CSRGraph and g._cache            # the caches came with it
        assert g.known_symmetric is symmetric
        fresh = CSRGraph(g.indptr.clone(), g.indices.clone(),
                         None if g.weight is None else g.weight.clone(), g.num_nodes)
        out = gcn_propagate(x, g)
        assert torch.equal(out, gcn_propagate(x, fresh))
        torch.testing.assert_close(out, y, rtol=4 * 2.0 ** -24, atol=4 * 2.0 ** -24)
        assert torch.equal(g.transpose().indices, fresh.transpose().indices)
        assert g.transpose() is g if symmetric else g.transpose() is not g


def test_a_deep_copy_keeps_a_declared_symmetry_declared():
    """deepcopy (and .to() another device, the same code) turned assume_symmetric()'s
    declaration into an inherited one, lost at the copy's first in-place weight update."""
    s, w = _graph(symmetrize=True)
    g = CSRGraph(s.indptr, s.indices, w.clone(), s.num_nodes).assume_symmetric()
    copied = copy.deepcopy(g)
    copied.weight.mul_(1.5)
    assert copied.known_symmetric


def test_a2_of_learnable_weights_under_torch_func():
    """A² is not differentiable: under torch.func.grad / vjp with learnable weights it failed
    ("Cannot access data pointer of Tensor that doesn't have storage"); it is now formed
    from the plain weights, and the rest of the function differentiates as with autograd."""
    from torch.func import grad

    s, w = _graph(symmetrize=True)
    x = torch.randn(s.num_nodes, 4)

    def f(weight):
        g = CSRGraph(s.indptr, s.indices, weight, s.num_nodes)
        return gcn_propagate(x, g).sum() * g.augment_a2().num_edges
    w_leaf = w.clone().requires_grad_()
    f(w_leaf).backward()
    torch.testing.assert_close(grad(f)(w.clone()), w_leaf.grad)


def test_a2_without_scipy_takes_torchs_product(monkeypatch):
    """scipy is a dependency, but an image installed with --no-deps may lack it: A² then
    comes from torch's CSR product, the same graph."""
    from hiertail_fast import _csr

    s, w = _graph(symmetrize=True)
    expected = CSRGraph(s.indptr, s.indices, w, s.num_nodes).augment_a2()
    monkeypatch.setattr(_csr, "_scipy_sparse", lambda: None)
    got = CSRGraph(s.indptr, s.indices, w, s.num_nodes).augment_a2()
    assert torch.equal(got.indptr, expected.indptr) and torch.equal(got.indices,
                                                                      expected.indices)
    torch.testing.assert_close(got.weight, expected.weight)


def _propagate_ref(x, g):
    from hiertail_fast.reference.gcn_propagate import gcn_propagate_ref

    return gcn_propagate_ref(x, g.edge_index(), None if g.weight is None else g.weight.detach())


@pytest.mark.parametrize("kind", ["leaf", "view"])
@pytest.mark.parametrize("optimizer", ["SGD", "Adam", "AdamW"])
def test_a_fused_optimizer_step_is_seen(optimizer, kind):
    """torch's fused optimizers step a parameter without bumping its version counter: the
    graph served the old operator under no_grad, and the old symmetry flag in the backward
    (Â for Âᵀ after a step broke the symmetry; a mutation audit). Weights that are a view of
    the parameter (p[:, 0]) share its counter: the same (the review of session 30)."""
    s, _ = _graph(symmetrize=True)
    p = torch.nn.Parameter(torch.ones(s.num_edges, 2))      # symmetric weights, learnable
    w = p[:, 0] if kind == "view" else torch.nn.Parameter(torch.ones(s.num_edges))
    g = CSRGraph(s.indptr, s.indices, w, s.num_nodes)       # symmetry checked, not declared
    opt = getattr(torch.optim, optimizer)([p if kind == "view" else w], lr=0.5, fused=True)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(s.num_nodes, 3, generator=gen)
    for _ in range(2):
        xx = x.clone().requires_grad_()
        y = gcn_propagate(xx, g)
        (y * torch.randn(y.shape, generator=gen)).sum().backward()   # asymmetric grad on w
        assert g.is_symmetric() is (_ == 0)      # (the first step breaks the symmetry)
        with torch.no_grad():
            gcn_propagate(x, g)                              # caches the operator
        version = w._version
        opt.step()
        opt.zero_grad()
        assert w._version == version                        # what made the caches stale
        with torch.no_grad():
            torch.testing.assert_close(gcn_propagate(x, g), _propagate_ref(x, g))
        assert not g.is_symmetric()
        xx, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        cot = torch.randn(x.shape, generator=gen)
        gcn_propagate(xx, g).backward(cot)
        _propagate_ref(xr, g).backward(cot)
        torch.testing.assert_close(xx.grad, xr.grad)


def test_arrays_made_in_inference_mode_are_the_graphs_own():
    """Inference tensors have no version counter, so an in-place edit could not be refused:
    the graph served the operator of their old contents (a mutation audit). It copies them."""
    s, _ = _graph()
    x = torch.randn(s.num_nodes, 3)
    with torch.inference_mode():
        indptr, indices = s.indptr.clone(), s.indices.clone()
        g = CSRGraph(indptr, indices, None, s.num_nodes)
        want = gcn_propagate(x, g)
        indices[0] = (indices[0] + 1) % s.num_nodes
        assert g.indices.data_ptr() != indices.data_ptr()
        assert torch.equal(g.indices, s.indices) and torch.equal(gcn_propagate(x, g), want)
    torch.testing.assert_close(gcn_propagate(x, g), _propagate_ref(x, s))


EDITS = {
    "row_index": lambda g: g.row_index().add_(1).remainder_(g.num_nodes),
    "gcn_deg_inv_sqrt": lambda g: g.gcn_deg_inv_sqrt()[0].mul_(2),
    "gcn_norm_values": lambda g: g.gcn_norm_values()[0].mul_(3),
    "has_self_loop": lambda g: g.has_self_loop().fill_(True),
    "column_counts": lambda g: g.column_counts().zero_(),
    "transpose_perm": lambda g: g.transpose_perm().copy_(g.transpose_perm().flip(0)),
    "transpose": lambda g: g.transpose().weight.mul_(5),
    "augment_a2": lambda g: g.augment_a2().weight.zero_(),
}


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=requires_triton)])
@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edited_cache_entry_is_rebuilt(edit, backend):
    """What the graph hands out is its cache entry: ``row = g.row_index(); row += offset``
    corrupted every later call (a mutation audit); an entry whose tensors changed is rebuilt."""
    dev = backend_device(backend)
    s, w = _graph(n=24)
    g = CSRGraph(s.indptr.to(dev), s.indices.to(dev), w.to(dev), s.num_nodes)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(s.num_nodes, 3, generator=gen).to(dev)
    cot = torch.randn(s.num_nodes, 3, generator=gen).to(dev)
    a2 = _fresh(g).augment_a2()
    for _ in range(2):   # edited before the first use (the operator is built from the
        EDITS[edit](g)   # entries), then again once every cache is filled
        xx, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        y = gcn_propagate(xx, g, backend=backend)
        y.backward(cot)
        _propagate_ref(xr, g).backward(cot)
        torch.testing.assert_close(y, _propagate_ref(x, g))
        torch.testing.assert_close(xx.grad, xr.grad)
        assert torch.equal(g.augment_a2().weight, a2.weight)
        assert torch.equal(g.row_index(), _fresh(g).row_index())
        assert torch.equal(g.gcn_norm_values()[0], _fresh(g).gcn_norm_values()[0])


def test_weights_frozen_after_a_fused_step_are_seen():
    """A last fused step, then requires_grad_(False): the copy was compared only while the
    weights required grad, so the operator cached before the step was served (the review of
    session 30)."""
    s, _ = _graph()
    x = torch.randn(s.num_nodes, 3, generator=torch.Generator().manual_seed(6))
    w = torch.nn.Parameter(torch.ones(s.num_edges))
    g = CSRGraph(s.indptr, s.indices, w, s.num_nodes)
    opt = torch.optim.Adam([w], lr=0.3, fused=True)
    gcn_propagate(x, g).pow(2).sum().backward()
    with torch.no_grad():
        gcn_propagate(x, g)                      # evaluation between steps: caches the operator
    opt.step()
    w.requires_grad_(False)
    assert not torch.equal(w, torch.ones_like(w))
    torch.testing.assert_close(gcn_propagate(x, g), _propagate_ref(x, g))


def test_a_thread_using_the_graph_while_another_drops_its_stale_entries():
    """Two threads on one graph after a fused optimizer step: thread A, dropping the entries
    of the old weights (`_weights_current`), had removed the "weights checked finite" marker
    when thread B checked the weights, set the marker again and was served the operator of
    the OLD weights (a thread audit). The interleaving is forced: A pauses (at most 1 s) right
    after the marker is gone; every dict operation is the plain dict's."""
    import threading

    from hiertail_fast import _graph_cache as graph_cache

    s, w0 = _graph()
    w = torch.nn.Parameter(w0)
    g = CSRGraph(s.indptr, s.indices, w, s.num_nodes)
    x = torch.randn(s.num_nodes, 3, generator=torch.Generator().manual_seed(8))
    opt = torch.optim.Adam([w], lr=0.3, fused=True)
    with torch.no_grad():
        before = gcn_propagate(x, g)                 # caches the operator
    w.grad = torch.randn(w.shape, generator=torch.Generator().manual_seed(9))
    opt.step()                                       # new weights, same version counter
    expected = _propagate_ref(x, g)
    assert not torch.allclose(expected, before)
    a_paused, b_done = threading.Event(), threading.Event()

    class PausingDict(dict):
        def _pause(self, key):
            if key == graph_cache.FINITE_WEIGHTS and threading.current_thread().name == "A":
                a_paused.set()
                b_done.wait(1.0)

        def __delitem__(self, key):
            super().__delitem__(key)
            self._pause(key)

        def pop(self, key, *default):
            out = super().pop(key, *default)
            self._pause(key)
            return out

    g._cache = PausingDict(g._cache)
    results = {}

    def run(name):
        with torch.no_grad():
            results[name] = gcn_propagate(x, g)
        b_done.set()

    a = threading.Thread(target=run, args=("A",), name="A")
    a.start()
    assert a_paused.wait(10)
    b = threading.Thread(target=run, args=("B",), name="B")
    b.start()
    b.join(10)
    a.join(10)
    torch.testing.assert_close(results["A"], expected)
    torch.testing.assert_close(results["B"], expected)


def test_threads_stepping_and_reading_one_graph_never_crash():
    """A fused step in one thread while others read the caches: the purge iterated the cache
    dict while another thread filled it ("dictionary changed size during iteration") or
    deleted a key another thread had deleted (KeyError)."""
    import threading

    s, _ = _graph(symmetrize=True)
    w = torch.nn.Parameter(torch.ones(s.num_edges))
    g = CSRGraph(s.indptr, s.indices, w, s.num_nodes)
    x = torch.randn(s.num_nodes, 3, generator=torch.Generator().manual_seed(10))
    opt = torch.optim.SGD([w], lr=1e-3, fused=True)
    errors, stop = [], threading.Event()

    def read():
        try:
            while not stop.is_set():
                with torch.no_grad():
                    gcn_propagate(x, g)
                g.is_symmetric()
                g.transpose()
        except Exception as exc:     # noqa: BLE001  (the failure under test, reported below)
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    w.grad = torch.full_like(w, -1.0)
    for _ in range(200):   # weights that only grow: a read torn by a step (the step is not
        opt.step()         # ours to lock) is never matched again by a later copy (ABA)
    stop.set()
    for t in readers:
        t.join(30)
    assert not errors, errors
    with torch.no_grad():
        torch.testing.assert_close(gcn_propagate(x, g), _propagate_ref(x, g))


@pytest.mark.parametrize("how", [*COPIES, "deepcopy"])
def test_a_copy_has_a_lock_of_its_own(how):
    """The cache lock is not pickled (it cannot be) and not shared with the copy."""
    s, w = _graph()
    g = CSRGraph(s.indptr, s.indices, w, s.num_nodes)
    g.gcn_norm_values()
    copied = copy.deepcopy(g) if how == "deepcopy" else COPIES[how](g)
    torch.testing.assert_close(copied.gcn_norm_values()[0], g.gcn_norm_values()[0])
    assert copied._lock is not None and copied._lock is not g._lock


@pytest.mark.parametrize("how", list(COPIES))
def test_a_copy_leaves_an_edited_cache_entry_behind(how):
    """A copy took the caches as they were, an edited entry included, and trusted it (the
    original rebuilt it; the review of session 30)."""
    s, w = _graph()
    g = CSRGraph(s.indptr, s.indices, w, s.num_nodes)
    x = torch.randn(s.num_nodes, 3, generator=torch.Generator().manual_seed(7))
    gcn_propagate(x, g)
    g.row_index().add_(1).remainder_(s.num_nodes)
    copied = COPIES[how](g)
    assert torch.equal(copied.row_index(), s.row_index())
    torch.testing.assert_close(gcn_propagate(x, copied), _propagate_ref(x, _fresh(copied)))


def test_an_entry_made_while_compiling_is_stamped_when_used():
    """Entries first made while TorchDynamo traced kept a None stamp and were trusted forever:
    a later eager edit was served (the review of session 30)."""
    s, _ = _graph()
    g = CSRGraph(s.indptr.clone(), s.indices.clone(), None, s.num_nodes)
    torch.compile(lambda g: g.edge_index().float().sum(), backend="eager")(g)
    assert "row" in g._cache
    g.row_index().add_(1).remainder_(s.num_nodes)            # the caller's edit
    assert torch.equal(g.row_index(), s.row_index())
    x = torch.randn(s.num_nodes, 3, generator=torch.Generator().manual_seed(8))
    torch.testing.assert_close(gcn_propagate(x, g), _propagate_ref(x, s))


def _stale_symmetric_path():
    """A symmetric path graph 0-1-2-3 whose indices were then edited in place to a valid,
    non-symmetric CSR (entry 0: 0->1 becomes 0->2), after its symmetry was checked."""
    indptr = torch.tensor([0, 1, 3, 5, 6])
    indices = torch.tensor([1, 0, 2, 1, 3, 2])
    g = CSRGraph(indptr, indices, num_nodes=4)
    assert g.is_symmetric()
    indices[0] = 2
    return g


@pytest.mark.parametrize("use", ["deepcopy", "subgraph", "topk_pool", "known_symmetric",
                                 "transpose"])
def test_arrays_edited_in_place_are_refused_by_every_path(use):
    """README: editing indptr / indices in place makes every later call raise. deepcopy,
    subgraph and topk_pool read the edited arrays and passed the old symmetry on (the
    backward then applied Â for Âᵀ: grad off by 0.3-1.2), and known_symmetric / transpose()
    answered for the old contents (a cache audit)."""
    from hiertail_fast import topk_pool

    g = _stale_symmetric_path()
    x = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="modified in place"):
        if use == "deepcopy":
            gcn_propagate(x, copy.deepcopy(g))
        elif use == "subgraph":
            g.subgraph(torch.tensor([0, 1, 2]))
        elif use == "topk_pool":
            topk_pool(x, g, torch.randn(3, dtype=torch.float64), 3, backend="torch")
        elif use == "known_symmetric":
            _ = g.known_symmetric
        else:
            g.transpose()


def test_a_symmetrized_graphs_symmetry_follows_its_weights():
    """from_edge_index(symmetrize=True) declared the symmetry for good: after an in-place
    update that broke it (SGD on the graph's weights) gcn's backward kept applying Â for Âᵀ
    and grad x was off by 0.5-0.7 from the second step on (a cache audit). It is recorded for
    the weights as they are, as an inherited symmetry is."""
    gen = torch.Generator().manual_seed(4)
    ei = torch.randint(0, 30, (2, 90), generator=gen)
    g = CSRGraph.from_edge_index(ei, torch.rand(90, generator=gen, dtype=torch.float64) + 0.5,
                                 num_nodes=30, symmetrize=True)
    assert g.known_symmetric
    g.weight.requires_grad_()
    x = torch.randn(30, 4, dtype=torch.float64, generator=gen)
    opt = torch.optim.SGD([g.weight], lr=0.3)
    for _ in range(3):
        xs = x.clone().requires_grad_()
        opt.zero_grad()
        gcn_propagate(xs, g).pow(2).sum().backward()
        want = x.clone().requires_grad_()
        dense = CSRGraph(g.indptr, g.indices, g.weight.detach().clone(), 30)
        gcn_propagate(want, dense, backend="reference").pow(2).sum().backward()
        torch.testing.assert_close(xs.grad, want.grad)
        opt.step()
    assert not g.is_symmetric()
    # unweighted: symmetric by construction for good
    assert CSRGraph.from_edge_index(ei, num_nodes=30, symmetrize=True).known_symmetric


def test_weights_made_in_inference_mode_serve_training():
    """A weighted graph (or a pool's score weight) built under torch.inference_mode() and
    used for training after it: the fast backends saved the inference tensor for backward
    and failed ('Inference tensors cannot be saved for backward'); the reference ran (an
    autograd and a cache audit)."""
    from hiertail_fast import topk_pool

    gen = torch.Generator().manual_seed(6)
    ei = torch.randint(0, 25, (2, 80), generator=gen)
    with torch.inference_mode():
        g = CSRGraph.from_edge_index(ei, torch.rand(80, generator=gen) + 0.5, num_nodes=25)
        score_weight = torch.randn(4, generator=gen)
    assert g.weight.is_inference()
    for backend in ("torch", "reference"):
        x = torch.randn(25, 4, generator=torch.Generator().manual_seed(7), requires_grad=True)
        gcn_propagate(x, g, backend=backend).pow(2).sum().backward()
        if backend == "torch":
            got = x.grad
    torch.testing.assert_close(got, x.grad)
    x = torch.randn(25, 4, generator=gen, requires_grad=True)
    topk_pool(x, g, score_weight, 0.5, backend="torch").x.sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    plain = CSRGraph(g.indptr.clone(), g.indices.clone(), g.weight.clone(), 25)
    topk_pool(x_ref, plain, score_weight.clone(), 0.5, backend="torch").x.sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=0)


def test_an_inherited_symmetry_of_inference_weights_is_not_trusted():
    """Weights made in inference mode have no version counter: a child's inherited symmetry
    held forever, so after an in-place edit of its weights (in inference mode) transpose()
    returned the graph itself (a cache audit). It is checked on the live weights instead."""
    gen = torch.Generator().manual_seed(8)
    ei = torch.randint(0, 20, (2, 60), generator=gen)
    with torch.inference_mode():
        parent = CSRGraph.from_edge_index(ei, torch.ones(60), num_nodes=20, symmetrize=True)
        assert parent.is_symmetric()
        child = parent.subgraph(torch.arange(12))
        child.weight.mul_(torch.rand(child.num_edges, generator=gen) + 0.5)
        assert not child.is_symmetric()
        t = child.transpose()
        assert t is not child
        dense = torch.zeros(12, 12)
        dense[child.row_index(), child.indices] = child.weight
        dense_t = torch.zeros(12, 12)
        dense_t[t.row_index(), t.indices] = t.weight
        assert torch.equal(dense_t, dense.t())


def test_clear_cache_frees_the_caches_and_keeps_a_declared_symmetry():
    """``clear_cache`` (the caches of a used graph, A² among them, can be ~100x the graph and
    there was no public way to free them; a memory audit): every entry dropped and rebuilt
    on demand to the same values, a declared symmetry kept (it cannot be rebuilt)."""
    import gc
    import weakref

    s, w = _graph(symmetrize=True)
    g = CSRGraph(s.indptr, s.indices, w, s.num_nodes).assume_symmetric()
    x = torch.randn(s.num_nodes, 3, generator=torch.Generator().manual_seed(12))
    y = gcn_propagate(x, g)
    a2 = weakref.ref(g.augment_a2())
    gc.collect()
    assert a2() is not None and len(g._cache) > 3
    assert g.clear_cache() is g
    gc.collect()
    assert a2() is None
    assert set(g._cache) == {"assumed_symmetric"} and g.known_symmetric
    torch.testing.assert_close(gcn_propagate(x, g), y, rtol=0, atol=0)
    torch.testing.assert_close(g.augment_a2().weight, _fresh(g).augment_a2().weight)
    plain = CSRGraph(s.indptr, s.indices, w, s.num_nodes)
    plain.is_symmetric()
    plain.clear_cache()
    assert not plain._cache and plain.known_symmetric is None


def _propagate_in_a_worker(x, g):
    """A forked worker's call, on one thread as a DataLoader worker runs (torch's OpenMP team
    does not survive a fork: any parallel op hangs in the child otherwise, ours or not)."""
    torch.set_num_threads(1)
    gcn_propagate(x, g)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork (not on Windows)")
def test_a_fork_while_another_thread_holds_the_graphs_lock_does_not_hang_the_child():
    """A DataLoader worker forked while another thread was inside a graph method: the child
    inherited the lock held, by a thread it does not have, and hung at its first use of the
    graph. Forked children get the graphs' locks new."""
    from tests.conftest import fork_while_held

    s, w = _graph()
    g = CSRGraph(s.indptr, s.indices, w, s.num_nodes)
    x = torch.randn(s.num_nodes, 3, generator=torch.Generator().manual_seed(13))
    gcn_propagate(x, g)                               # the lock exists
    hung, code = fork_while_held(lambda: g._lock, _propagate_in_a_worker, (x, g))
    assert not hung and code == 0


def test_clear_cache_keeps_no_inherited_symmetry_a_fused_step_has_broken():
    """clear_cache kept an inherited symmetry but dropped the copy of the learnable weights
    that guards it: after a fused (counter-free) step broke the symmetry, the next call took
    a copy of the NEW weights and trusted the old symmetry, the backward applying Â for Âᵀ
    (0.13 off; a review). Only a symmetry that still holds is kept, with its copy."""
    from hiertail_fast.reference.gcn_propagate import gcn_propagate_ref

    s, _ = _graph(n=12, symmetrize=True)
    g0 = CSRGraph(s.indptr, s.indices, torch.nn.Parameter(torch.ones(s.num_edges)),
                  s.num_nodes)
    assert g0.is_symmetric()
    x = torch.randn(s.num_nodes, 3, generator=torch.Generator().manual_seed(14))
    gy = torch.randn(s.num_nodes, 3, generator=torch.Generator().manual_seed(15))
    for step in (False, True):
        g = copy.deepcopy(g0)                # a copy: its symmetry is inherited
        w = g.weight
        gcn_propagate(x, g)
        if step:                             # asymmetric, no version bump
            w.grad = -torch.arange(s.num_edges, dtype=torch.float32)
            torch.optim.SGD([w], lr=0.1, fused=True).step()
        g.clear_cache()
        assert g.known_symmetric is (None if step else True)
        xx = x.clone().requires_grad_()
        gcn_propagate(xx, g).backward(gy)
        xr = x.double().requires_grad_()
        gcn_propagate_ref(xr, g.edge_index(), w.detach().double()).backward(gy.double())
        torch.testing.assert_close(xx.grad.double(), xr.grad, rtol=1e-5, atol=1e-6)
