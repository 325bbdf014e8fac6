"""The graph ops under torch.compile (hiertail_fast/ops/_custom_graph_ops.py): gcn_propagate,
topk_pool, topk_unpool and nearest_prototype are one opaque custom op each, compiled whole
(``fullgraph=True``) through AOTAutograd; the eager values and gradients, bit for bit on CPU.
gcn_propagate finds the live CSRGraph again from its arrays and reuses its caches."""
from __future__ import annotations

import pytest
import torch

from hiertail_fast import gcn_propagate, nearest_prototype, topk_pool, topk_unpool
from hiertail_fast.graph import CSRGraph
from tests.conftest import DEVICES, tol
from tests.test_compile import _compiled, _fresh_dynamo, _same  # noqa: F401  (autouse fixture)


def _graph_data(dev, n=120, e=500, weighted=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=gen)
    w = torch.rand(e, generator=gen) + 0.1 if weighted else None
    x = torch.randn(n, 6, generator=gen)
    return x.to(dev).requires_grad_(), ei.to(dev), None if w is None else w.to(dev)


def _ops_in(gm) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if "hiertail_fast" in str(n.target)]


def _check(f, args, grad_of, dev, op):
    """f compiled whole equals f eager: value, and the gradients w.r.t. grad_of (a random
    cotangent); the traced graph holds the op once."""
    graphs: list = []
    got = _compiled(f, graphs)(*args)
    want = f(*args)
    assert len(graphs) == 1 and _ops_in(graphs[0]) == [f"hiertail_fast.{op}.default"]
    _same(got, want, dev)
    if grad_of:
        cot = torch.rand(got.shape, generator=torch.Generator().manual_seed(3)).to(dev)
        # retain_graph: a graph's learnable weights are one gather of w shared by both calls
        for a, b in zip(torch.autograd.grad(got, grad_of, cot, retain_graph=True),
                        torch.autograd.grad(want, grad_of, cot), strict=True):
            _same(a, b, dev)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("graph_kind", ["symmetric", "directed", "weighted", "edge_index"])
@pytest.mark.parametrize("backend", [None, "reference"])
def test_compiled_gcn_propagate(graph_kind, backend, dev):
    x, ei, w = _graph_data(dev, weighted=graph_kind == "weighted")
    if graph_kind == "edge_index":
        def f(x):
            return gcn_propagate(x, ei, backend=backend)
    else:
        g = CSRGraph.from_edge_index(ei, w, num_nodes=x.shape[0],
                                     symmetrize=graph_kind == "symmetric")

        def f(x):
            return gcn_propagate(x, g, improved=False, backend=backend)
    _check(f, (x,), [x], dev, "gcn_propagate")


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("as_graph", [True, False])
def test_compiled_gcn_propagate_with_learnable_edge_weights(as_graph, dev):
    # the backward op reruns the eager op with autograd on leaves of x and the weights
    x, ei, w = _graph_data(dev, weighted=True)
    w.requires_grad_()
    if as_graph:
        g = CSRGraph.from_edge_index(ei, w, num_nodes=x.shape[0], dedupe=False)
        weight = g.weight                               # differentiable gather of w

        def f(x):
            return gcn_propagate(x, g)
    else:
        weight = w

        def f(x):
            return gcn_propagate(x, ei, w)
    _check(f, (x,), [x, w], dev, "gcn_propagate")
    assert weight.requires_grad


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("as_graph", [True, False])
def test_compiled_gcn_propagate_under_no_grad_with_learnable_edge_weights(as_graph, dev):
    """Under torch.no_grad, edge weights that require grad are plain values, as in the eager
    op: the compiled value is the eager one (bit for bit on CPU) and records nothing."""
    x, ei, w = _graph_data(dev, weighted=True)
    x = x.detach()
    w.requires_grad_()
    g = CSRGraph.from_edge_index(ei, w, num_nodes=x.shape[0], dedupe=False)

    def f(x):
        with torch.no_grad():
            return gcn_propagate(x, g) if as_graph else gcn_propagate(x, ei, w)
    got = _compiled(f)(x)
    want = f(x)
    _same(got, want, dev)
    assert not got.requires_grad


def test_compiled_gcn_propagate_reuses_the_graphs_caches(monkeypatch):
    """No CSRGraph is built per compiled call: the op finds the user's graph again from its
    arrays (CSRGraph._live) and its cached operator serves forward and backward."""
    x, ei, _ = _graph_data("cpu")
    g = CSRGraph.from_edge_index(ei, num_nodes=x.shape[0], symmetrize=True)
    f = _compiled(lambda x: gcn_propagate(x, g))
    f(x).sum().backward()                                # builds g's operator once
    built = []
    init = CSRGraph.__init__
    monkeypatch.setattr(CSRGraph, "__init__",
                        lambda self, *a, **k: built.append(1) or init(self, *a, **k))
    cached = dict(g._cache)
    for _ in range(3):
        f(x).sum().backward()
    assert built == []
    assert g._cache.keys() == cached.keys()
    assert any(isinstance(k, tuple) and k[0] == "gcn_operator" for k in g._cache)


def test_compiled_gcn_propagate_backward_follows_the_backend_switch(monkeypatch):
    """$HIERTAIL_BACKEND=reference set after tracing: forward and backward both run the
    reference (the backward op resolves the switch as the eager op does), bit for bit."""
    x, ei, _ = _graph_data("cpu")
    g = CSRGraph.from_edge_index(ei, num_nodes=x.shape[0])       # directed: Âᵀ differs
    f = _compiled(lambda x: gcn_propagate(x, g))
    f(x)
    monkeypatch.setenv("HIERTAIL_BACKEND", "reference")
    got = f(x)
    want = gcn_propagate(x, g)
    cot = torch.rand(got.shape, generator=torch.Generator().manual_seed(3))
    assert torch.equal(got, want)
    assert torch.equal(torch.autograd.grad(got, x, cot)[0], torch.autograd.grad(want, x, cot)[0])


def test_compiled_learnable_weights_keep_a_declared_symmetry():
    """A symmetrised multigraph with learnable weights: symmetric by declaration, not by the
    check (duplicate entries with different weights). The backward op's graph for the weight
    leaf inherits the declaration from the user's graph, so x's gradient takes the eager path
    (the forward CSR) bit for bit. Before, that graph displaced the user's in the registry and
    the lookup failed: the transposed CSR ran, 6e-8 off (a fuzzing find)."""
    x, ei, w = _graph_data("cpu", n=60, e=200, weighted=True, seed=181)
    w.requires_grad_()
    g = CSRGraph.from_edge_index(ei, w, num_nodes=x.shape[0], symmetrize=True, dedupe=False)
    assert g.known_symmetric
    _check(lambda x: gcn_propagate(x, g, improved=False), (x,), [x, w], "cpu",
           "gcn_propagate")
    assert CSRGraph._live(g.indptr, g.indices, g.weight, g.num_nodes) is g


def test_live_graph_lookup_needs_the_same_arrays():
    x, ei, w = _graph_data("cpu", weighted=True)
    g = CSRGraph.from_edge_index(ei, w, num_nodes=x.shape[0])
    assert CSRGraph._live(g.indptr, g.indices, g.weight, g.num_nodes) is g
    twin = CSRGraph(g.indptr, g.indices, g.weight, g.num_nodes)      # the first keeps the entry
    assert CSRGraph._live(g.indptr, g.indices, g.weight, g.num_nodes) is g and twin is not g
    assert CSRGraph._live(g.indptr.clone(), g.indices, g.weight, g.num_nodes) is None
    assert CSRGraph._live(g.indptr, g.indices, None, g.num_nodes) is None
    assert CSRGraph._live(g.indptr, g.indices, g.weight.double(), g.num_nodes) is None
    # weights at the same address with the same shape, other strides (base[:n] / base[::2]):
    # the compiled op was served the other graph's operator (a mutation audit)
    base = torch.cat([g.weight, g.weight.flip(0)]).contiguous()
    head, every_other = base[:g.num_edges], base[::2]
    assert head.data_ptr() == every_other.data_ptr() and head.shape == every_other.shape
    gh = CSRGraph(g.indptr, g.indices, head, g.num_nodes)
    assert CSRGraph._live(g.indptr, g.indices, every_other, g.num_nodes) is None
    assert CSRGraph._live(g.indptr, g.indices, head, g.num_nodes) is gh
    key = (g.indptr, g.indices, g.weight, g.num_nodes)
    del g, twin
    import gc

    gc.collect()
    assert CSRGraph._live(*key) is None                  # weak: a dead graph is not found


def test_compiled_ops_find_no_graph_on_arrays_edited_since():
    """Arrays edited in place, then a new graph built on them while the old one is alive (as
    the old one's error says): the compiled op found the old graph by address and raised its
    error for the new one (a mutation audit)."""
    from hiertail_fast.reference.gcn_propagate import gcn_propagate_ref

    x, ei, _ = _graph_data("cpu")
    x = x.detach()
    g0 = CSRGraph.from_edge_index(ei, num_nodes=x.shape[0])
    indptr, indices = g0.indptr.clone(), g0.indices.clone()
    old = CSRGraph(indptr, indices, None, g0.num_nodes)
    step = _compiled(lambda x, g: gcn_propagate(x, g))
    step(x, old)
    indices[0] = (indices[0] + 1) % g0.num_nodes           # edited in place: the compiled
    with pytest.raises(ValueError, match="modified in place"):   # call refuses it as eager
        step(x, old)                                        # does (the review of session 30)
    new = CSRGraph(indptr, indices, None, g0.num_nodes)     # ...and a new graph on them
    assert CSRGraph._live(indptr, indices, None, g0.num_nodes) is new
    torch.testing.assert_close(step(x, new), gcn_propagate_ref(x, new.edge_index(), None))
    with pytest.raises(ValueError, match="modified in place"):
        gcn_propagate(x, old)


@pytest.mark.parametrize("dev", DEVICES)
def test_compiled_topk_unpool(dev):
    x, _, _ = _graph_data(dev)
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(1))[:40].to(dev)

    def f(x):
        return topk_unpool(x[:40] * 2.0, perm, x.shape[0])
    _check(f, (x,), [x], dev, "topk_unpool")


def test_a_second_derivative_through_a_compiled_topk_unpool_raises():
    """Eagerly the unpool's second derivative is exact; compiled, a gradient penalty through
    it came back without its second-order term (the gather's backward saved no input, so the
    compiled gradient's graph reached none). It raises torch.compile's error now."""
    perm = torch.randperm(30, generator=torch.Generator().manual_seed(2))[:12]
    x = torch.randn(12, 4, dtype=torch.float64, requires_grad=True)
    f = torch.compile(lambda x: topk_unpool(x, perm, 30).pow(3).sum(), backend="aot_eager",
                      fullgraph=True)
    loss = f(x)
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(RuntimeError, match="does not currently support double backward"):
        torch.autograd.grad(loss + g.pow(2).sum(), x)
    # eager: the exact second derivative (d/dx [Σx³ + Σ(3x²)²] = 3x² + 36x³)
    (g,) = torch.autograd.grad(topk_unpool(x, perm, 30).pow(3).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.pow(2).sum() + x.pow(3).sum(), x)
    torch.testing.assert_close(h, 3 * x.detach() ** 2 + 36 * x.detach() ** 3)


def test_an_exported_topk_unpool_keeps_its_exact_second_derivative():
    """The tie of the unpool's gradient to its input (compiled: a second derivative raises)
    made an exported unpool's exact second derivative raise too (the review of session 36):
    the tie's derivative is the identity for this linear op."""
    perm = torch.randperm(30, generator=torch.Generator().manual_seed(2))[:12]

    class Unpool(torch.nn.Module):
        def forward(self, x):
            return topk_unpool(x, perm, 30)

    x0 = torch.randn(12, 4, dtype=torch.float64)
    module = torch.export.export(Unpool(), (x0.clone().requires_grad_(),)).module()
    x = x0.clone().requires_grad_()
    (g,) = torch.autograd.grad(module(x).pow(3).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.pow(2).sum() + x.pow(3).sum(), x)
    torch.testing.assert_close(h, 3 * x0 ** 2 + 36 * x0 ** 3)


def test_a_second_derivative_through_a_compiled_topk_pool_names_the_limit():
    """It raised torch.library's 'no autograd formula was registered' for the op's backward
    op, which reads as an internal bug; the backward ops now say what is unsupported."""
    x = torch.randn(20, 4, dtype=torch.float64, requires_grad=True)
    ei = torch.randint(0, 20, (2, 60), generator=torch.Generator().manual_seed(3))
    graph = CSRGraph.from_edge_index(ei, num_nodes=20)
    p = torch.randn(4, dtype=torch.float64)
    f = torch.compile(lambda x: topk_pool(x, graph, p, 0.5, backend="torch").x.pow(2).sum(),
                      backend="aot_eager")
    loss = f(x)
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(RuntimeError, match="cannot be differentiated again"):
        torch.autograd.grad(loss + g.pow(2).sum(), x)


@pytest.mark.parametrize("dev", DEVICES)
def test_compiled_nearest_prototype(dev):
    x, _, _ = _graph_data(dev)
    protos = torch.randn(7, x.shape[1], generator=torch.Generator().manual_seed(2)).to(dev)
    _check(lambda x: nearest_prototype(x, protos), (x,), [], dev, "nearest_prototype")


def test_compiled_graph_ops_raise_the_eager_errors():
    x, ei, _ = _graph_data("cpu")
    g = CSRGraph.from_edge_index(ei, num_nodes=x.shape[0])
    with pytest.raises(ValueError, match="rows"):                    # at run time
        _compiled(lambda x: gcn_propagate(x, g))(x[:-1])
    torch._dynamo.reset()
    with pytest.raises(ValueError, match="repeated"):
        _compiled(lambda x: topk_unpool(x[:2], torch.tensor([3, 3]), 10))(x)
    torch._dynamo.reset()
    with pytest.raises(ValueError, match="prototypes"):
        _compiled(lambda x: nearest_prototype(x, x.new_empty(0, x.shape[1])))(x)
    torch._dynamo.reset()

    # a 1-D x under a whole-graph compile: the eager message (Dynamo quotes it in its
    # Unsupported), not an IndexError from the traced op's shape logic (the s72 audit, x41)
    with pytest.raises((ValueError, torch._dynamo.exc.TorchDynamoException),
                       match="x must be 2-D"):
        torch.compile(lambda x: topk_pool(x, g, x, 0.5).x, backend="aot_eager",
                      fullgraph=True)(x[:, 0].contiguous())
    torch._dynamo.reset()

    def bad_flag(x):
        return gcn_propagate(x, g, improved="yes")

    with pytest.raises(TypeError, match="improved"):                  # while tracing
        torch.compile(bad_flag, backend="aot_eager")(x)
    torch._dynamo.reset()

    def float_count(x):
        return topk_unpool(x[:2], torch.tensor([3, 4]), 10.0)

    # torch < 2.13 (the GPU image's 2.11, checked in a venv here): TorchDynamo, tracing the
    # eager fallback's check_num_nodes, wraps the TypeError its try/except raises in an
    # InternalTorchDynamoError that quotes it
    old = tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 13)
    with pytest.raises((TypeError, torch._dynamo.exc.TorchDynamoException) if old
                       else TypeError, match="num_nodes" if not old else "num_nodes|integer"):
        torch.compile(float_count, backend="aot_eager")(x)


def test_compiled_graph_ops_check_their_options_as_eager():
    """The traced calls' own checks: a separate edge_weight beside a CSRGraph (which carries
    its weights) is the eager ValueError for gcn_propagate and topk_pool, not silently
    ignored; a non-bool add_self_loops is the eager TypeError, not read by its truthiness."""
    x = torch.randn(12, 3, generator=torch.Generator().manual_seed(0))
    g = CSRGraph.from_edge_index(torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]), None, 12)
    w, p = torch.rand(4), torch.ones(3)
    for call, exc, msg in [
        (lambda x: gcn_propagate(x, g, w), ValueError, "edge_weight must be None"),
        (lambda x: topk_pool(x, g, p, 0.5, edge_weight=w).x, ValueError,
         "edge_weight must be None"),
        (lambda x: gcn_propagate(x, g, add_self_loops="no"), TypeError,
         "add_self_loops must be a bool"),
    ]:
        with pytest.raises(exc, match=msg):
            call(x)
        torch._dynamo.reset()
        with pytest.raises(exc, match=msg):
            torch.compile(call, backend="aot_eager")(x)


def test_compiled_topk_pool_refuses_x_of_another_node_count():
    """As eager: x with fewer or more rows than the CSRGraph has nodes raises the eager
    ValueError when the compiled pooling runs, not an IndexError from inside the op."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(12, 3, generator=gen)
    g = CSRGraph.from_edge_index(torch.randint(0, 12, (2, 30), generator=gen), None, 12)
    p = torch.randn(3, generator=gen)
    pool = torch.compile(lambda x: topk_pool(x, g, p, 0.5).x, backend="aot_eager")
    for rows in (11, 14):
        bad = torch.cat([x, x])[:rows]
        with pytest.raises(ValueError, match=f"the graph has 12 nodes but x has {rows} rows"):
            topk_pool(bad, g, p, 0.5)
        with pytest.raises(ValueError, match=f"the graph has 12 nodes but x has {rows} rows"):
            pool(bad)


@pytest.mark.parametrize("backend", [None, "reference"])
@pytest.mark.parametrize("weighted", [False, True])
def test_a_pooling_step_compiles_whole(weighted, backend):
    """GCN, top-k pooling, GCN on the pooled graph, unpooling: ONE graph (fullgraph). topk_pool
    is a custom op whose pooled graph (data-dependent size) is built in the traced code; the
    values and the gradients w.r.t. x and the score weight are eager's bit for bit; learnable
    edge weights' gradients within float32 rounding (AOTAutograd sums the gathers'
    duplicate-index gradients in its own order)."""
    x, ei, w = _graph_data("cpu", weighted=weighted)
    if weighted:
        w.requires_grad_()
    # declared: symmetrize=True records the symmetry for the weights as they are, which
    # traced code does not take (no counters; README), so the pooled graph would not inherit it
    g = CSRGraph.from_edge_index(ei, w, num_nodes=x.shape[0], symmetrize=True).assume_symmetric()
    p = torch.randn(x.shape[1], generator=torch.Generator().manual_seed(4), requires_grad=True)

    def step(x, p):
        h = gcn_propagate(x, g).relu()
        pooled = topk_pool(h, g, p, 0.5, backend=backend)
        assert pooled.graph.known_symmetric                 # inherited, as in eager
        return topk_unpool(gcn_propagate(pooled.x, pooled.graph), pooled.perm, x.shape[0])

    graphs: list = []
    got = _compiled(step, graphs)(x, p)
    want = step(x, p)
    assert len(graphs) == 1
    _same(got, want, "cpu")
    ins = [x, p] + ([w] if weighted else [])
    cot = torch.rand(got.shape, generator=torch.Generator().manual_seed(5))
    want_grads = torch.autograd.grad(want, ins, cot, retain_graph=True)
    got_grads = torch.autograd.grad(got, ins, cot)        # (compiled: no retain_graph)
    for a, b in zip(got_grads[:2], want_grads[:2], strict=True):
        _same(a, b, "cpu")
    if weighted:
        torch.testing.assert_close(got_grads[2], want_grads[2], **tol(torch.float32))


def test_exported_pooling_layer():
    """torch.export of a pooling layer on a CSRGraph: the pooled graph's size is a symbol of
    the program (data-dependent); the exported program gives the eager values."""
    x, ei, _ = _graph_data("cpu")
    x = x.detach()
    g = CSRGraph.from_edge_index(ei, num_nodes=x.shape[0], symmetrize=True)
    p = torch.randn(x.shape[1], generator=torch.Generator().manual_seed(6))

    class Pool(torch.nn.Module):
        def forward(self, x):
            pooled = topk_pool(x, g, p, 0.5)
            return gcn_propagate(pooled.x, pooled.graph), pooled.edge_index

    program = torch.export.export(Pool(), (x,), strict=False)
    for a, b in zip(program.module()(x), Pool()(x), strict=True):
        assert torch.equal(a, b)


def test_graph_custom_ops_pass_opcheck():
    """torch.library's own check of each op: schema, fake tensors against the real outputs,
    the autograd registration, AOTAutograd with dynamic shapes."""
    import hiertail_fast.nn._train_labels  # noqa: F401  (registers train_labels)

    x, ei, w = _graph_data("cpu", weighted=True)
    g = CSRGraph.from_edge_index(ei, w, num_nodes=x.shape[0])
    w_leaf = g.weight.detach().requires_grad_()
    ops = torch.ops.hiertail_fast
    n = x.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(5))[:30]
    for op, args in [
        (ops.gcn_propagate, (x, g.indptr, g.indices, g.weight, n, True, True, None, False,
                             False)),
        (ops.gcn_propagate, (x, g.indptr, g.indices, w_leaf, n, False, True, None, False,
                             True)),
        (ops.gcn_propagate, (x, None, ei, None, n, True, False, None, False, False)),
        (ops.topk_unpool, (x[:30].detach().requires_grad_(), perm, n, None)),
        (ops.nearest_prototype, (x.detach(), x[:5].detach(), None)),
        (ops.topk_pool, (x, g.indptr, g.indices, g.weight,
                         torch.randn(x.shape[1], requires_grad=True), 40, None)),
        (ops.augment_a2, (g.indptr, g.indices, g.weight, n)),
        (ops.augment_a2, (g.indptr, g.indices, None, n)),
        (ops.train_labels, (torch.randint(0, 4, (n,)), perm, n, 4, x.device)),
        (ops.train_labels, (torch.randint(0, 4, (n,), dtype=torch.int32), perm.int(), n, 4,
                            x.device)),
    ]:
        torch.library.opcheck(op.default, args)
    # A²'s weights keep the input weights' dtype, not the default one (float32 above)
    for dtype in (torch.float64, torch.bfloat16):
        g_d = CSRGraph.from_edge_index(ei, w.to(dtype), num_nodes=n, symmetrize=True)
        assert g_d.augment_a2().weight.dtype == dtype
        torch.library.opcheck(ops.augment_a2.default, (g_d.indptr, g_d.indices, g_d.weight, n),
                              test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("strict", [False, True])
def test_gcnconv_exports_and_compiles_on_an_edge_index(strict):
    """GCNConv on an edge_index while traced hands the edge_index to gcn_propagate's op (its
    own conversion depends on the data and failed torch.export): exported and compiled whole,
    the eager values."""
    from hiertail_fast.nn import GCNConv

    x, ei, w = _graph_data("cpu", weighted=True)
    x = x.detach()
    conv = GCNConv(x.shape[1], 3)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x, ei, w):
            return self.conv(x, ei, w)

    program = torch.export.export(Layer(), (x, ei, w), strict=strict)
    assert torch.equal(program.module()(x, ei, w), conv(x, ei, w))
    torch._dynamo.reset()
    assert torch.equal(_compiled(conv)(x, ei, w), conv(x, ei, w))


def test_compiled_topk_pool_on_an_edge_index_is_traced_as_before():
    """An edge_index input is converted by the eager op (data-dependent): the graph breaks
    there (no fullgraph), with the eager numbers."""
    x, ei, _ = _graph_data("cpu")
    x = x.detach()
    p = torch.randn(x.shape[1], generator=torch.Generator().manual_seed(7))

    def f(x):
        return topk_pool(x, ei, p, 0.3).x

    assert torch.equal(torch.compile(f, backend="aot_eager")(x), f(x))


@pytest.mark.parametrize("ratio", [7, 0.5])
def test_pooling_under_dynamic_shapes(ratio):
    """dynamic=True over graphs of two sizes. An int ratio (a node count): k is a symbol,
    fullgraph holds. A float ratio: k is PyG's float32 rounding of ratio * n, which needs n's
    value, so topk_pool is traced as before (graph breaks, no fullgraph). Eager values both."""
    fullgraph = isinstance(ratio, int)
    p = torch.randn(5, generator=torch.Generator().manual_seed(8))

    def step(x, g):
        r = topk_pool(x, g, p, ratio)
        return topk_unpool(gcn_propagate(r.x, r.graph), r.perm, x.shape[0])

    f = torch.compile(step, backend="aot_eager", fullgraph=fullgraph, dynamic=True)
    for n in (60, 90):
        gen = torch.Generator().manual_seed(n)
        ei = torch.randint(0, n, (2, 4 * n), generator=gen)
        g = CSRGraph.from_edge_index(ei, num_nodes=n, symmetrize=True)
        x = torch.randn(n, 5, generator=gen)
        assert torch.equal(f(x, g), step(x, g))



def test_the_paper_forward_compiles_whole_on_a_second_graph_size():
    """docs/GUARANTEES.md: the paper model's forward compiles into one graph also once the
    node count is symbolic (the second size recompiles with dynamic shapes). pool_sizes' input
    check on x.shape[0], a SymInt there, made that second compile fail with fullgraph (a
    review, session 68)."""
    from hiertail_fast import make_synthetic_graph
    from hiertail_fast.nn.hiertail import HierTail, HierTailConfig, prepare_graph

    torch.manual_seed(0)
    model = HierTail(8, 6, HierTailConfig.paper()).eval()
    graphs: list = []
    forward = _compiled(lambda x, graph: model(x, graph).logits, graphs)
    for n in (240, 300):
        g = make_synthetic_graph(n, num_classes=6, avg_degree=4, num_features=8, seed=0)
        graph = prepare_graph(g.edge_index, g.num_nodes)
        assert torch.equal(forward(g.x, graph), model(g.x, graph).logits)
    assert len(graphs) == 2          # one per size: the second with a symbolic node count

@pytest.mark.parametrize("config", ["paper", "official"])
def test_hiertail_training_step_compiles_whole(config):
    """The model's forward (GCN, three pooling levels, unpooling, classifier; the official
    configuration also the A² augmentation of every pooled graph, a custom op of
    data-dependent size too) and a whole training step (forward, the label checks, the losses,
    backward) each compile into ONE graph with fullgraph=True (TorchDynamo captures the ops'
    data-dependent sizes there; without fullgraph its default breaks the graph at each such
    op unless ``capture_dynamic_output_shape_ops`` is set), with the eager logits, loss and
    gradients bit for bit (CPU). The label checks are one custom op: a bad label raises the
    eager ValueError when the compiled step runs."""
    from hiertail_fast import make_synthetic_graph
    from hiertail_fast.nn.hiertail import HierTail, HierTailConfig, prepare_graph

    g = make_synthetic_graph(240, num_classes=6, avg_degree=4, seed=0)
    graph = prepare_graph(g.edge_index, g.num_nodes)
    torch.manual_seed(0)
    model = HierTail(g.num_features, g.num_classes, getattr(HierTailConfig, config)()).eval()
    graphs: list = []
    logits = _compiled(lambda x: model(x, graph).logits, graphs)(g.x)
    assert len(graphs) == 1
    assert torch.equal(logits, model(g.x, graph).logits)

    model.train()
    train = torch.arange(0, g.num_nodes, 2)

    def step(x, y):
        return model.loss(model(x, graph), y, train).total

    def grads(f, y=g.y):
        model.zero_grad()
        torch.manual_seed(5)                       # the same dropout masks
        loss = f(g.x, y)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    graphs.clear()
    compiled = _compiled(step, graphs)
    (want, want_g), (got, got_g) = grads(step), grads(compiled)
    assert len(graphs) == 1
    assert torch.equal(got, want)
    assert len(got_g) == len(want_g) > 0
    for a, b in zip(got_g, want_g, strict=True):
        assert torch.equal(a, b), (a - b).abs().max()
    with pytest.raises(ValueError, match="the labels go up to 6 but the model's num_classes is 6"):
        compiled(g.x, torch.full_like(g.y, 6))


def test_compiled_augment_a2_is_the_eager_graph():
    """CSRGraph.augment_a2 in compiled code (one custom op): the eager A² graph's arrays and
    its inherited symmetry, on the input graph (its cached A²) and on a pooled graph built in
    the compiled code."""
    x, ei, w = _graph_data("cpu", weighted=True)
    g = CSRGraph.from_edge_index(ei, w, num_nodes=x.shape[0], symmetrize=True).assume_symmetric()
    p = torch.randn(x.shape[1], generator=torch.Generator().manual_seed(7))

    def arrays(x):
        a2 = g.augment_a2()
        pooled_a2 = topk_pool(x, g, p, 0.5).graph.augment_a2()
        assert a2.known_symmetric and pooled_a2.known_symmetric     # inherited, as eager
        return a2.indptr, a2.indices, a2.weight, pooled_a2.indices, pooled_a2.weight

    for got, want in zip(_compiled(arrays)(x), arrays(x), strict=True):
        assert torch.equal(got, want)


def test_compiled_augment_a2_of_learnable_weights_has_their_gradient():
    """The traced A² op has no gradient for the weights: compiled, a learnable graph's A² gave
    weights without one (as eager did before, from detached weights). Weights that need
    gradients now run the eager, differentiable method (a graph break): eager's gradient."""
    x, ei, w = _graph_data("cpu", n=30, e=90, weighted=True)
    fixed = CSRGraph.from_edge_index(ei, w, num_nodes=30)

    def f(x, g):
        a2 = g.augment_a2()
        return gcn_propagate(x, a2).pow(2).sum() + a2.weight.pow(2).sum()

    grads = []
    for run in (f, torch.compile(f, backend="aot_eager")):
        weight = torch.nn.Parameter(fixed.weight.clone())
        run(x.detach(), CSRGraph(fixed.indptr, fixed.indices, weight, 30)).backward()
        grads.append(weight.grad)
    assert grads[0] is not None and grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[1], grads[0])


def _pool_then_propagate(g, p):
    """x -> gcn_propagate over the top-10 pooled graph of g (scored by p)."""
    def step(x):
        pooled = topk_pool(x, g, p, 10)
        return gcn_propagate(pooled.x, pooled.graph)
    return step


def _grad_at(f, x0, cot):
    """The gradient of <f(x), cot> at x = x0."""
    x = x0.clone().requires_grad_()
    return torch.autograd.grad(f(x), x, cot)[0]


@pytest.mark.parametrize("updated_before_tracing", [False, True])
def test_compiled_pooling_sees_an_update_that_breaks_an_inherited_symmetry(
        updated_before_tracing):
    """``prepare_graph``'s output inherits its symmetry for its weights as they are; an
    in-place update that breaks it is seen in eager. Compiled, the inherited flag was taken as
    declared: the pooled graph came out symmetric and gcn's backward on it applied Â for Âᵀ
    (grad off by 0.7 of 1.4). Traced code now leaves such a flag undeclared (the ops check the
    live weights when they run), whether the update came before the trace or after it."""
    from hiertail_fast.nn.hiertail import prepare_graph

    gen = torch.Generator().manual_seed(1)
    n, d = 16, 3
    ei = torch.randint(0, n, (2, 40), generator=gen)
    g = prepare_graph(ei, n, torch.rand(40, generator=gen) + 0.5)
    assert g.known_symmetric
    p, x0 = torch.randn(d, generator=gen), torch.randn(n, d, generator=gen)
    cot = torch.randn(10, d, generator=gen)
    scale = torch.rand(g.num_edges, generator=gen) * 4 + 0.1

    step = _pool_then_propagate(g, p)

    def grad(f):
        return _grad_at(f, x0, cot)

    compiled = _compiled(step)
    if updated_before_tracing:
        with torch.no_grad():
            g.weight.mul_(scale)
        got = grad(compiled)
    else:
        grad(compiled)                                  # traced while still symmetric
        with torch.no_grad():
            g.weight.mul_(scale)
        got = grad(compiled)
    assert not g.is_symmetric()
    def reference(x):
        pooled = topk_pool(x, g, p, 10, backend="reference")
        return gcn_propagate(pooled.x, pooled.graph, backend="reference")

    want = grad(reference)
    torch.testing.assert_close(got, grad(step), **tol(torch.float32))
    torch.testing.assert_close(got, want, **tol(torch.float32))


def test_compiled_pooling_keeps_a_declared_symmetry():
    """A user's ``assume_symmetric()`` is a declaration, kept by the pooled graph (induced
    submatrix) in eager: gcn's backward then takes the forward CSR for Âᵀ. The pooled graph
    built inside compiled code must carry it again when the backward rebuilds it, or compiled
    gradients differ from eager ones on a graph declared symmetric that is not (dropping the
    re-declaration passed every test; mutation audit, session 69)."""
    gen = torch.Generator().manual_seed(2)
    n, d = 16, 3
    ei = torch.randint(0, n, (2, 40), generator=gen)
    g = CSRGraph.from_edge_index(ei, torch.rand(40, generator=gen) + 0.5,
                                 num_nodes=n).assume_symmetric()
    p, x0 = torch.randn(d, generator=gen), torch.randn(n, d, generator=gen)
    cot = torch.randn(10, d, generator=gen)

    step = _pool_then_propagate(g, p)
    torch.testing.assert_close(_grad_at(_compiled(step), x0, cot), _grad_at(step, x0, cot),
                               **tol(torch.float32))


# ---- from the s42 audit of the custom-op layer (each test names its mutant)
def test_nonstrict_export_with_a_dynamic_node_count():
    """_count accepts a traced node count: TorchDynamo shows x.shape[0] as an int, so only a
    non-strict torch.export with a dynamic dimension reaches its SymInt branch (mutant N02)."""
    from torch.export import Dim

    class M(torch.nn.Module):
        def forward(self, x, perm, ei):
            return (topk_unpool(x[:5], perm, x.shape[0]),
                    gcn_propagate(x, ei, num_nodes=x.shape[0]))

    gen = torch.Generator().manual_seed(0)
    x, perm = torch.randn(30, 3, generator=gen), torch.randperm(30, generator=gen)[:5]
    ei = torch.randint(0, 30, (2, 60), generator=gen)
    prog = torch.export.export(M(), (x, perm, ei), strict=False,
                               dynamic_shapes=({0: Dim("n", min=6)}, None, None))
    x2 = torch.randn(45, 3, generator=gen)
    for a, b in zip(prog.module()(x2, perm, ei), M()(x2, perm, ei), strict=True):
        assert torch.equal(a, b)


def _x12():
    return torch.randn(12, 3, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("call, name", [
    (lambda x: nearest_prototype(x, x[:2].tolist()), "prototypes"),
    (lambda x: topk_unpool(x[:2].tolist(), torch.tensor([0, 1]), 12), "x_pooled"),
    (lambda x: gcn_propagate(x, [[0, 1], [1, 2]]), "edge_index|graph_or_edge_index"),
], ids=["prototypes", "x_pooled", "edge_index"])
def test_compiled_graph_ops_name_a_non_tensor_argument(call, name):
    """As eager: a TypeError naming the argument, not a TorchRuntimeError from inside the
    trace (mutants N04, N05)."""
    with pytest.raises(TypeError, match=name):
        call(_x12())
    torch._dynamo.reset()
    with pytest.raises(TypeError, match=name):
        torch.compile(call, backend="aot_eager")(_x12())


@pytest.mark.parametrize("num_nodes", [12.0, True], ids=["float", "bool"])
def test_compiled_gcn_propagate_on_an_edge_index_checks_num_nodes(num_nodes):
    """(mutant N06: the edge_index path skipped _count)"""
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    with pytest.raises(TypeError, match="num_nodes"):
        torch.compile(lambda x: gcn_propagate(x, ei, num_nodes=num_nodes),
                      backend="aot_eager")(_x12())


@pytest.mark.parametrize("num_nodes", [13, 11])
def test_compiled_gcn_propagate_on_an_edge_index_refuses_another_node_count(num_nodes):
    """As eager: an int num_nodes other than x's row count is the eager ValueError when the
    compiled call runs, not a propagation over x's own rows."""
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    msg = f"x has 12 rows but the graph has {num_nodes} nodes"
    with pytest.raises(ValueError, match=msg):
        gcn_propagate(_x12(), ei, num_nodes=num_nodes)
    with pytest.raises(ValueError, match=msg):
        torch.compile(lambda x: gcn_propagate(x, ei, num_nodes=num_nodes),
                      backend="aot_eager")(_x12())


def test_label_checks_without_the_private_guard_are_traced_as_before(monkeypatch):
    """README: without torch._C's private dispatch-key guard, "the old tracing path, tested".
    The graph ops and train_labels import READY by name, so patching _custom_ops alone never
    ran their fallback: with READY False everywhere, no hiertail_fast op in the traced graphs,
    the eager values and errors (mutant R02)."""
    from hiertail_fast.nn import _train_labels
    from hiertail_fast.nn._train_labels import checked_train_labels
    from hiertail_fast.ops import _custom_graph_ops, _custom_ops

    for mod in (_custom_ops, _custom_graph_ops, _train_labels):
        monkeypatch.setattr(mod, "READY", False)
    graphs: list = []

    def f(y, idx):
        y_train, idx = checked_train_labels(y, idx, 10, 3, torch.device("cpu"))
        return y_train * 2, idx

    def backend(gm, example_inputs):           # (not fullgraph: the old path breaks the graph
        graphs.append(gm)                      # at its data-dependent checks)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    y, idx = torch.arange(10) % 3, torch.tensor([1, 4, 7])
    compiled = torch.compile(f, backend=backend)
    for a, b in zip(compiled(y, idx), f(y, idx), strict=True):
        assert torch.equal(a, b)
    assert graphs and not [op for gm in graphs for op in _ops_in(gm)]
    with pytest.raises(ValueError, match="the labels go up to 3 but the model's num_classes is 3"):
        compiled(torch.full((10,), 3), idx)


def test_compiled_label_checks_refuse_a_train_idx_that_is_not_1d():
    """The label op's fake (what tracing runs) takes a train_idx of any shape and leaves the
    refusal to the op: a 0-d or 2-D train_idx gets the eager ValueError from a fullgraph
    compiled call (its fake read shape[0] of a 0-d one: an IndexError while tracing; a mutation
    pass, session 73)."""
    from hiertail_fast.nn._train_labels import checked_train_labels

    y = torch.tensor([0, 1, 1, 0])

    def f(y, idx):
        return checked_train_labels(y, idx, 4, 2, y.device)

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    for idx in (torch.tensor(1), torch.tensor([[0, 1]])):
        torch._dynamo.reset()
        with pytest.raises(ValueError, match=r"train_idx must be 1-D, got shape \(" +
                           ", ".join(map(str, idx.shape)) + r"\)"):
            compiled(y, idx)


def test_compiled_a2_of_a_directed_pooled_graph_has_the_eager_gradient():
    """traced_augment_a2: A² inherits the input's symmetry, nothing more (declared symmetric
    for a directed input, the backward applied Â for Âᵀ: mutant Y05). The A² of a pooled
    graph built in the compiled code: no live graph holds its arrays, so the traced
    declaration is what the op uses."""
    gen = torch.Generator().manual_seed(0)
    n = 30
    g = CSRGraph.from_edge_index(torch.randint(0, n, (2, 120), generator=gen), num_nodes=n)
    assert not g.is_symmetric()
    p = torch.randn(3, generator=gen)
    x0 = torch.randn(n, 3, generator=gen)
    cot = torch.randn(15, 3, generator=gen)

    def f(x):
        pooled = topk_pool(x, g, p, 15)
        return gcn_propagate(pooled.x, pooled.graph.augment_a2())

    def grad(fn):
        x = x0.clone().requires_grad_()
        return torch.autograd.grad(fn(x), x, cot)[0]

    torch.testing.assert_close(grad(_compiled(f)), grad(f))

