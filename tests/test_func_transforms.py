"""The ops under ``torch.func`` transforms (``hiertail_fast/ops/_functorch.py``).

``torch.func.grad`` / ``grad_and_value`` / ``vjp`` failed on every fast backend before (autograd
Functions in the old ``ctx`` style; backward passes handing functorch's storage-less wrapper
tensors to C / Triton kernels; graphs built inside a transform keeping wrapped arrays). They
now give the eager backward's gradients bit for bit; what is not supported (vmap, jvp and
the transforms built on them, second derivatives) raises a RuntimeError naming the op."""
from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, grad, grad_and_value, hessian, jacrev, jvp, vjp, vmap

from hiertail_fast import (
    CSRGraph,
    balanced_contrastive_loss,
    gcn_propagate,
    hierarchical_contrastive_loss,
    nearest_prototype,
    topk_pool,
    topk_unpool,
)
from hiertail_fast.ops import _functorch
from tests.conftest import backend_device, requires_triton

pytestmark = pytest.mark.usefixtures("one_thread")

_UNSUPPORTED = "torch.func.vmap, jvp and the transforms built on them"
_SECOND = "cannot be differentiated again"
_TRITON = pytest.param("triton", marks=requires_triton)


def _same(a, b):
    """Bit for bit on CPU; on CUDA within fp32 rounding (index_add_ there uses atomics: two runs
    of the same call may round differently, docs/GUARANTEES.md: determinism)."""
    if a.device.type == "cpu":
        assert torch.equal(a, b), (a - b).abs().max()
    else:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _eager_grads(f, *args):
    """The gradients of f(*args) w.r.t. every arg by autograd's ``backward``."""
    leaves = [a.detach().clone().requires_grad_() for a in args]
    f(*leaves).backward()
    return [t.grad for t in leaves]


def _graph_inputs(dev, n=40, e=120, d=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen).to(dev)
    ei = torch.randint(0, n, (2, e), generator=gen).to(dev)
    w = (torch.rand(e, generator=gen) + 0.5).to(dev)
    p = torch.randn(d, generator=gen).to(dev)
    return x, ei, w, p


@pytest.mark.parametrize("backend", ["reference", "torch", "attention", _TRITON])
@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.usefixtures("exact_rows_rule_off")
def test_func_grad_of_the_loss_is_the_eager_gradient(backend, variant, reduction):
    dev = backend_device(backend)
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(70, 8, generator=gen).to(dev)
    protos = torch.randn(4, 8, generator=gen).to(dev)
    y = torch.randint(0, 4, (70,), generator=gen).to(dev)
    weights = torch.rand(70 + 4, generator=gen).to(dev)      # "none": a weighted sum of rows

    def f(z, protos):
        out = balanced_contrastive_loss(z, y, prototypes=protos, temperature=0.2,
                                        variant=variant, reduction=reduction, backend=backend)
        return (out * weights).sum() if reduction == "none" else out

    (gz, gp), value = grad_and_value(f, argnums=(0, 1))(z, protos)
    ez, ep = _eager_grads(f, z, protos)
    _same(value, f(z, protos))
    if backend == "reference":        # plain autograd: functorch's and autograd's kernels
        torch.testing.assert_close(gz, ez, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(gp, ep, rtol=1e-6, atol=1e-7)
    else:                             # the hand-written backward, the same call: bit for bit
        _same(gz, ez)
        _same(gp, ep)


@pytest.mark.parametrize("backend", ["torch", "attention", _TRITON])
@pytest.mark.usefixtures("exact_rows_rule_off")
def test_func_grad_of_the_hierarchical_loss(backend):
    dev = backend_device(backend)
    gen = torch.Generator().manual_seed(2)
    z = torch.randn(60, 8, generator=gen).to(dev)
    y = torch.randint(0, 6, (60,), generator=gen).to(dev)
    protos = [torch.randn(6, 8, generator=gen).to(dev), torch.randn(3, 8, generator=gen).to(dev)]

    def f(z, p0, p1):
        return hierarchical_contrastive_loss(z, [y, y // 2], [p0, p1], temperature=0.3,
                                             backend=backend)

    got = grad(f, argnums=(0, 1, 2))(z, *protos)
    for g, e in zip(got, _eager_grads(f, z, *protos), strict=True):
        _same(g, e)


@pytest.mark.parametrize("backend", ["reference", "torch", _TRITON])
@pytest.mark.parametrize("case", ["gcn", "weighted gcn: x and weights", "pool: x and p",
                                  "unpool", "pool then gcn on the pooled graph"])
def test_func_grad_of_the_graph_ops_is_the_eager_gradient(backend, case):
    dev = backend_device(backend)
    x, ei, w, p = _graph_inputs(dev)
    graph = CSRGraph.from_edge_index(ei, w, num_nodes=x.shape[0])
    f, args = {
        "gcn": (lambda x: gcn_propagate(x, graph, backend=backend).pow(2).sum(), (x,)),
        "weighted gcn: x and weights": (
            lambda x, w: gcn_propagate(x, ei, w, backend=backend).pow(2).sum(), (x, w)),
        "pool: x and p": (
            lambda x, p: topk_pool(x, graph, p, 0.5, backend=backend).x.pow(2).sum(), (x, p)),
        "unpool": (lambda x: topk_unpool(x[:10] * 2, torch.arange(10, device=dev) * 3, 40,
                                         backend=backend).pow(2).sum(), (x,)),
        # the pooled graph is built inside the transform, its weights a differentiable gather
        "pool then gcn on the pooled graph": (
            lambda x, w: gcn_propagate(topk_pool(x, ei, p, 0.5, w, backend=backend).x,
                                       topk_pool(x, ei, p, 0.5, w, backend=backend).graph,
                                       backend=backend).pow(2).sum(), (x, w)),
    }[case]
    got = grad(f, argnums=tuple(range(len(args))))(*args)
    for g, e in zip(got, _eager_grads(f, *args), strict=True):
        if backend == "reference":
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
        else:
            _same(g, e)


@pytest.mark.parametrize("backend", ["torch", _TRITON])
def test_func_vjp_takes_the_cotangent(backend):
    dev = backend_device(backend)
    x, ei, _, p = _graph_inputs(dev, seed=3)
    graph = CSRGraph.from_edge_index(ei, num_nodes=x.shape[0])
    for f in (lambda x: gcn_propagate(x, graph, backend=backend),
              lambda x: topk_pool(x, graph, p, 0.5, backend=backend).x):
        out, pullback = vjp(f, x)
        cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(dev)
        (got,) = pullback(cot)
        leaf = x.clone().requires_grad_()
        f(leaf).backward(cot)
        _same(got, leaf.grad)


@pytest.mark.parametrize("config", ["paper", "official"])
def test_func_trains_the_hiertail_model(config):
    # functional training (functional_call + grad_and_value over the parameters): the
    # model's gradients equal its eager backward's, bit for bit
    from hiertail_fast import make_synthetic_graph
    from hiertail_fast.nn.hiertail import HierTail, HierTailConfig, prepare_graph

    g = make_synthetic_graph(240, num_classes=6, avg_degree=4, seed=0)
    graph = prepare_graph(g.edge_index, g.num_nodes)
    train = torch.arange(0, g.num_nodes, 2)
    torch.manual_seed(0)
    model = HierTail(g.num_features, g.num_classes, getattr(HierTailConfig, config)())
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(params):
        torch.manual_seed(5)                                   # dropout, the same masks
        return model.loss(functional_call(model, params, (g.x, graph)), g.y, train).total

    grads, value = grad_and_value(loss)(params)
    torch.manual_seed(5)
    eager = model.loss(model(g.x, graph), g.y, train).total
    eager.backward()
    assert torch.equal(value, eager.detach())
    reached = [k for k, prm in model.named_parameters() if prm.grad is not None]
    assert reached
    for k in reached:
        assert torch.equal(grads[k], dict(model.named_parameters())[k].grad), k


def test_graph_used_in_a_transform_holds_plain_tensors_after_it():
    # its caches filled inside the transform, and a pooled graph built there and handed out:
    # plain tensors (a kept wrapper has no storage once the transform is over, and the C and
    # Triton kernels read storage), usable eagerly with the same numbers as fresh graphs
    x, ei, w, p = _graph_inputs("cpu", seed=5)
    graph = CSRGraph.from_edge_index(ei, w, num_nodes=x.shape[0])

    kept = []

    def f(x):
        pooled = topk_pool(x, graph, p, 0.5)
        kept.append(pooled.graph)
        return gcn_propagate(pooled.x, pooled.graph).sum()

    grad(f)(x)
    (pooled_graph,) = kept
    for g in (graph, pooled_graph):
        tensors = [g.indptr, g.indices, g.weight, *(
            t for v in g._cache.values() for t in (v if isinstance(v, tuple) else (v,))
            if isinstance(t, torch.Tensor))]
        assert not any(_functorch.wrapped(t) for t in tensors if t is not None)
    fresh = CSRGraph.from_edge_index(ei, w, num_nodes=x.shape[0])
    assert torch.equal(gcn_propagate(x, graph), gcn_propagate(x, fresh))
    eager_pooled = topk_pool(x, fresh, p, 0.5).graph
    y = torch.randn(pooled_graph.num_nodes, 3)
    assert torch.equal(gcn_propagate(y, pooled_graph), gcn_propagate(y, eager_pooled))


@pytest.mark.parametrize("op", ["loss", "hierarchical", "gcn", "pool"])
def test_func_second_derivative_raises(op):
    x, ei, _, p = _graph_inputs("cpu", seed=6)
    y = torch.randint(0, 3, (x.shape[0],))
    f, name = {
        "loss": (lambda x: balanced_contrastive_loss(x, y), "balanced_contrastive_loss"),
        "hierarchical": (lambda x: hierarchical_contrastive_loss(x, [y], [None]),
                         "balanced_contrastive_loss"),
        "gcn": (lambda x: gcn_propagate(x, ei).pow(2).sum(), "gcn_propagate"),
        "pool": (lambda x: topk_pool(x, ei, p, 0.5).x.pow(2).sum(), "topk_pool"),
    }[op]
    with pytest.raises(RuntimeError, match=f"^{name}: .*{_SECOND}"):
        grad(lambda x: grad(f)(x).pow(2).sum())(x)


def test_a_create_graph_gradient_is_a_tensor_of_its_own():
    # the op's gradient under create_graph=True passes through a Function whose backward raises
    # the op's message; it must return a new tensor, not a view of its input: a view made in a
    # custom Function made a plain in-place edit of the gradient fail deep inside autograd
    # (mutation audit, session 69)
    z = torch.randn(8, 3, requires_grad=True)
    y = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    (g,) = torch.autograd.grad(balanced_contrastive_loss(z, y, backend="torch"), z,
                               create_graph=True)
    assert g._base is None
    before = g.detach().clone()
    g.mul_(0.5)
    assert torch.equal(g.detach(), before * 0.5)


def test_vmap_over_a_list_of_prototypes_raises_naming_the_op():
    # the transform check looks inside the lists a loss takes: a batched tensor in
    # level_prototypes raised torch's "Cannot access data pointer" deep inside (mutation
    # audit, session 69)
    z = torch.randn(8, 3)
    labels = [torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])]
    batch = torch.randn(5, 2, 3)
    with pytest.raises(RuntimeError, match=f"^hierarchical_contrastive_loss: {_UNSUPPORTED}"):
        vmap(lambda p: hierarchical_contrastive_loss(z, labels, [p], backend="torch"))(batch)


def test_func_batching_transforms_raise_naming_the_op():
    x, ei, _, p = _graph_inputs("cpu", seed=7)
    y = torch.randint(0, 3, (x.shape[0],))
    batch = torch.stack([x, x + 1])
    cases = [
        ("gcn_propagate", lambda: vmap(lambda x: gcn_propagate(x, ei))(batch)),
        ("topk_pool", lambda: vmap(lambda x: topk_pool(x, ei, p, 0.5).x)(batch)),
        ("nearest_prototype", lambda: vmap(lambda x: nearest_prototype(x, x[:3]))(batch)),
        # the batched tensor passed by keyword is checked too
        ("nearest_prototype", lambda: vmap(lambda q: nearest_prototype(x, prototypes=q))(
            batch[:, :3])),
        ("balanced_contrastive_loss", lambda: vmap(lambda z: balanced_contrastive_loss(z, y))(
            batch)),
        ("hierarchical_contrastive_loss", lambda: vmap(
            lambda z: hierarchical_contrastive_loss(z, [y], [None]))(batch)),
        # jacrev vmaps the backward over a basis: caught there
        ("gcn_propagate", lambda: jacrev(lambda x: gcn_propagate(x, ei).sum(0))(x)),
        # jvp / hessian (jacfwd over jacrev): a jvp level at the loss's entry
        ("balanced_contrastive_loss", lambda: jvp(lambda z: balanced_contrastive_loss(z, y),
                                                  (x,), (x,))),
        ("balanced_contrastive_loss", lambda: hessian(
            lambda z: balanced_contrastive_loss(z, y))(x)),
    ]
    for name, call in cases:
        with pytest.raises(RuntimeError, match=f"^{name}: {_UNSUPPORTED}"):
            call()


@pytest.mark.parametrize("backend", ["torch", _TRITON])
def test_func_forward_mode_over_the_graph_ops_raises_naming_the_op(backend):
    """jvp, jacfwd, hessian and forward-AD dual features raised torch's own errors naming the
    autograd Function (NotImplementedError "You must implement the jvp function", "You tried
    to vmap over GCNPropagateFunction"), where README promises a RuntimeError naming the op."""
    import torch.autograd.forward_ad as fwad
    from torch.func import jacfwd

    dev = backend_device(backend)
    x, ei, _, p = _graph_inputs(dev, seed=9)
    perm = torch.arange(10, device=dev) * 3

    def gcn(x):
        return gcn_propagate(x, ei, backend=backend)

    def pool(x):
        return topk_pool(x, ei, p, 0.5, backend=backend).x

    def unpool(a):
        return topk_unpool(a, perm, 40, backend=backend)

    def dual(f, t):
        with fwad.dual_level():
            return f(fwad.make_dual(t, torch.ones_like(t)))

    cases = [
        ("gcn_propagate", lambda: jvp(gcn, (x,), (x,))),
        ("topk_pool", lambda: jvp(pool, (x,), (x,))),
        ("gcn_propagate", lambda: jacfwd(gcn)(x)),
        ("topk_pool", lambda: hessian(lambda x: pool(x).sum())(x)),
        ("gcn_propagate", lambda: dual(gcn, x)),
        ("topk_pool", lambda: dual(pool, x)),
    ]
    # forward over reverse (a Hessian-vector product): the tangent hides under the grad
    # wrapper; the loss raised torch's own NotImplementedError once a jvp level alone passed
    y = torch.randint(0, 3, (x.shape[0],), device=dev)
    cases += [("gcn_propagate", lambda: jvp(grad(lambda x: gcn(x).pow(2).sum()), (x,), (x,))),
              ("balanced_contrastive_loss", lambda: jvp(grad(
                  lambda z: balanced_contrastive_loss(z, y, backend=backend)), (x,), (x,)))]
    if backend == "triton":             # the torch backend's unpool is plain autograd
        cases += [("topk_unpool", lambda: jvp(unpool, (x[:10],), (x[:10],))),
                  ("topk_unpool", lambda: dual(unpool, x[:10]))]
    for name, call in cases:
        with pytest.raises(RuntimeError, match=f"^{name}: {_UNSUPPORTED}"):
            call()


@pytest.mark.parametrize("backend", ["torch", "attention", _TRITON])
@pytest.mark.usefixtures("exact_rows_rule_off")
def test_ops_on_constants_inside_a_jvp_work(backend):
    """Inside torch.func.jvp an op whose inputs carry no tangent is a constant (tangent 0): it
    runs, with eager's value. (The losses refused every jvp level before; the graph ops' own
    check must not refuse it either.)"""
    dev = backend_device(backend)
    x, ei, _, p = _graph_inputs(dev, seed=10)
    y = torch.randint(0, 3, (x.shape[0],), device=dev)
    graph_backend = "torch" if backend == "attention" else backend
    ops = {
        "gcn": lambda: gcn_propagate(x, ei, backend=graph_backend).sum(),
        "pool": lambda: topk_pool(x, ei, p, 0.5, backend=graph_backend).x.sum(),
        "loss": lambda: balanced_contrastive_loss(x, y, backend=backend),
        "hierarchical": lambda: hierarchical_contrastive_loss(x, [y, y % 2], [None, None],
                                                              backend=backend),
    }
    b, db = torch.tensor(2.0, device=dev), torch.tensor(1.0, device=dev)
    for op in ops.values():
        value, tangent = jvp(lambda b, op=op: op() * b, (b,), (db,))
        eager = op()
        _same(value, eager * 2)
        _same(tangent, eager)


def test_reference_loss_supports_every_transform():
    # the message's promise: backend="reference" is plain autograd (hessian = jacfwd(jacrev))
    gen = torch.Generator().manual_seed(8)
    z = torch.randn(12, 3, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (12,), generator=gen)

    def f(z):
        return balanced_contrastive_loss(z, y, temperature=0.5, backend="reference")

    torch.testing.assert_close(hessian(f)(z), torch.autograd.functional.hessian(f, z))


def test_without_the_private_api_the_torch_paths_still_work(monkeypatch):
    # _functorch.READY False (a torch without those private functions): nothing is unwrapped.
    # A backward pass made of dense torch operators (the loss's fused CPU gradient) still gives
    # the eager gradient; what reads a wrapper's storage (the C kernels, the pooled graph's
    # registry key, the sparse CSR product of propagation) raises, never a wrong number
    monkeypatch.setattr(_functorch, "READY", False)
    x, ei, _, p = _graph_inputs("cpu", seed=9)
    y = torch.randint(0, 3, (x.shape[0],))
    graph = CSRGraph.from_edge_index(ei, num_nodes=x.shape[0])

    def loss(z):
        return balanced_contrastive_loss(z, y, backend="torch")

    assert torch.equal(grad(loss)(x), _eager_grads(loss, x)[0])
    for f in (lambda z: balanced_contrastive_loss(z, y, backend="torch",
                                                  reduction="none").sum(),
              lambda x: gcn_propagate(x, graph, backend="torch").pow(2).sum(),
              lambda x: topk_pool(x, graph, p, 0.5, backend="torch").x.pow(2).sum()):
        with pytest.raises((RuntimeError, NotImplementedError), match="storage|strides"):
            grad(f)(x)


def test_eager_calls_take_the_ctx_style_twin(monkeypatch):
    # torch's apply of a setup_context-style Function binds its arguments with
    # inspect.signature on every call (tens of microseconds: a tiny graph's whole propagation);
    # eager calls go through the ctx-style twin (_autograd.eager_twin), which does not, and
    # torch.func transforms through the setup_context style they need
    import inspect

    bound = []
    real = inspect.signature

    def spy(fn, *a, **k):
        if getattr(fn, "__qualname__", "").split(".")[0].endswith("Function"):
            bound.append(fn.__qualname__)
        return real(fn, *a, **k)

    monkeypatch.setattr(inspect, "signature", spy)
    x, ei, _, p = _graph_inputs("cpu", seed=10)
    y = torch.randint(0, 3, (x.shape[0],))
    graph = CSRGraph.from_edge_index(ei, num_nodes=x.shape[0])

    def step(x):
        pooled = topk_pool(gcn_propagate(x, graph), graph, p, 0.5)
        return balanced_contrastive_loss(pooled.x, y[pooled.perm])

    x_leaf = x.clone().requires_grad_()
    step(x_leaf).backward()
    assert bound == []
    got = grad(step)(x)
    assert {"GCNPropagateFunction.forward", "TopKPoolFunction.forward",
            "BalancedContrastiveFunction.forward"} <= set(bound)
    assert torch.equal(got, x_leaf.grad)


@pytest.mark.parametrize("backend", ["torch", "attention", _TRITON])
@pytest.mark.usefixtures("exact_rows_rule_off")
def test_batched_grads_are_exact_or_raise(backend):
    # torch.autograd.grad(..., is_grads_batched=True) (and jacobian(vectorize=True)) runs the
    # backward under PyTorch's legacy batching, which _functorch does not see: where the
    # hand-written backward is dense torch operators (the fused loss) it is exact, elsewhere
    # PyTorch raises (a batching rule or a storage it cannot read) -- never a wrong number
    dev = backend_device(backend)
    x, ei, _, p = _graph_inputs(dev, seed=11)
    y = torch.randint(0, 3, (x.shape[0],)).to(dev)
    graph_backend = "torch" if backend == "attention" else backend
    cases = [
        lambda z: balanced_contrastive_loss(z, y, backend=backend),
        lambda z: balanced_contrastive_loss(z, y, backend=backend, variant="official"),
        lambda z: balanced_contrastive_loss(z, y, backend=backend, reduction="none"),
        lambda z: gcn_propagate(z, ei, backend=graph_backend),
        lambda z: topk_pool(z, ei, p, 0.5, backend=graph_backend).x,
    ]
    ran = 0
    for f in cases:
        z = x.clone().requires_grad_()
        out = f(z)
        cots = torch.randn((3, *out.shape), generator=torch.Generator().manual_seed(12)).to(dev)
        try:
            (batched,) = torch.autograd.grad(out, z, cots, is_grads_batched=True)
        except (RuntimeError, NotImplementedError):
            continue
        one_by_one = torch.stack([torch.autograd.grad(f(zz := x.clone().requires_grad_()),
                                                      zz, c)[0] for c in cots])
        torch.testing.assert_close(batched, one_by_one, rtol=1e-5, atol=1e-6)
        ran += 1
    if backend == "torch":
        assert ran >= 2             # the fused CPU loss, both variants


def test_jit_trace_of_every_public_op_raises_naming_it():
    """torch.jit.trace records torch's calls, not the kernels ours make: a traced
    nearest_prototype replayed its uninitialised output buffer (garbage indices, on new
    inputs and on the traced one), the other ops failed inside the tracer with messages naming
    nothing. Each op now refuses the trace by name; HierTail's forward with it."""
    import warnings

    from hiertail_fast import GCNConv, HierTail
    from hiertail_fast.nn.hiertail import HierTailConfig

    gen = torch.Generator().manual_seed(0)
    z, protos = torch.randn(14, 3, generator=gen), torch.randn(4, 3, generator=gen)
    y, ei = torch.randint(0, 3, (14,), generator=gen), torch.randint(0, 14, (2, 40), generator=gen)
    g = CSRGraph.from_edge_index(ei, num_nodes=14)
    conv, p = GCNConv(3, 4), torch.randn(3, generator=gen)
    model = HierTail(3, 3, HierTailConfig.named("paper", hidden=8))
    cases = [
        ("nearest_prototype", lambda a: nearest_prototype(a, protos)),
        ("gcn_propagate", lambda a: gcn_propagate(a, g)),
        ("gcn_propagate", lambda a: conv(a, ei)),
        ("topk_pool", lambda a: topk_pool(a, g, p, 0.5).x),
        ("topk_unpool", lambda a: topk_unpool(a[:7], torch.arange(7), 14)),
        ("balanced_contrastive_loss", lambda a: balanced_contrastive_loss(a, y)),
        ("hierarchical_contrastive_loss",
         lambda a: hierarchical_contrastive_loss(a, [y, y // 2], [None, None])),
        ("gcn_propagate", lambda a: model(a, g).logits),
    ]
    for name, fn in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")                 # torch's TracerWarnings
            with pytest.raises(RuntimeError, match=f"{name}: torch.jit.trace cannot record"):
                torch.jit.trace(fn, (z,))
