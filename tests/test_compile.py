"""The losses under torch.compile (hiertail_fast/ops/_custom_ops.py): one opaque custom op.

Compiled with ``fullgraph=True`` (a graph break fails the test) through AOTAutograd
(``aot_eager``: the custom op's fake tensors and registered backward, without Inductor's C++
build; one test runs Inductor). The op's implementation is the eager loss, so the compiled
call gives the eager call's values and gradients: bit for bit on CPU, within the dtype's
tolerance on CUDA (atomics there). Also: torch.library's own consistency check of the op
(``opcheck``), autocast, the input errors, the environment switch read at run time."""
from __future__ import annotations

import inspect

import pytest
import torch

from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss
from hiertail_fast.ops import _custom_ops
from hiertail_fast.ops import balanced_contrastive_loss as loss_ops
from tests.conftest import DEVICES, tol


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Every test traces from scratch (TorchDynamo caches per code object and gives up after
    a few recompiles: tests sharing a local function would otherwise run eagerly)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled(fn, graphs: list | None = None):
    """fn compiled whole (fullgraph) through AOTAutograd; each traced graph is appended to
    ``graphs``."""
    def backend(gm, example_inputs):
        if graphs is not None:
            graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)
    return torch.compile(fn, backend=backend, fullgraph=True)


def _custom_op_calls(gm) -> int:
    return sum("hiertail_fast.contrastive_loss" in str(node.target) for node in gm.graph.nodes)


def _same(a, b, dev):
    """Compiled == eager: bit-equal on CPU and for integer outputs (indices: nearest_prototype)
    on any device; within the dtype's tolerance for CUDA floats."""
    if torch.device(dev).type == "cpu" or not b.is_floating_point():
        assert torch.equal(a, b), (a - b).abs().max()
    else:
        torch.testing.assert_close(a, b, **tol(b.dtype))


def _data(dev, n=300, d=12, classes=5, m=0, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    z = torch.nn.functional.normalize(torch.randn(n, d, generator=gen, dtype=dtype), dim=1)
    y = torch.randint(0, classes, (n,), generator=gen)
    p = torch.nn.functional.normalize(torch.randn(m, d, generator=gen, dtype=dtype), dim=1)
    return (z.to(dev).requires_grad_(), y.to(dev),
            p.to(dev).requires_grad_() if m else None)


def _grads(out, inputs, seed=1):
    """Gradients of out (a vector: weighted by a random cotangent) w.r.t. the inputs."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.rand(out.shape, generator=gen, dtype=out.dtype).to(out.device)
    return torch.autograd.grad(out, inputs, g if out.dim() else None)


def _close_to_eager(got, want, params):
    """A compiled loss and its gradients w.r.t. params within float32's tolerance of eager's
    (the compiled code around the op rounds differently)."""
    got_grads = torch.autograd.grad(got, params)
    want_grads = torch.autograd.grad(want, params)
    torch.testing.assert_close(got, want, **tol(torch.float32))
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, **tol(torch.float32))


def _check_one_op(f, args, inputs, dev):
    """f compiled whole is one graph with one loss op, and gives f's value (dtype and shape
    too) and gradients w.r.t. ``inputs``."""
    graphs: list = []
    got = _compiled(f, graphs)(*args)
    got_grads = _grads(got, inputs)
    want = f(*args)
    want_grads = _grads(want, inputs)
    assert len(graphs) == 1 and _custom_op_calls(graphs[0]) == 1
    assert got.dtype == want.dtype and got.shape == want.shape
    _same(got, want, dev)
    for a, b in zip(got_grads, want_grads, strict=True):
        _same(a, b, dev)


CASES = {
    "mean": dict(reduction="mean"),
    "sum-official": dict(reduction="sum", variant="official"),
    "mean-official-no-self": dict(variant="official", include_self=False),
    "none": dict(reduction="none"),
    "none-official-prototypes": dict(reduction="none", variant="official", m=5),
    "none-no-self": dict(reduction="none", include_self=False),
    "none-official-prototypes-no-self": dict(reduction="none", variant="official",
                                             include_self=False, m=5),
    "mean-prototypes-tau": dict(m=5, temperature=0.05),
    "float64-none": dict(reduction="none", dtype=torch.float64),
}


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_compiled_loss_is_the_eager_loss(case, dev):
    kw = dict(CASES[case])
    m, dtype = kw.pop("m", 0), kw.pop("dtype", torch.float32)
    z, y, p = _data(dev, m=m, dtype=dtype)
    inputs = [z] + ([p] if p is not None else [])

    def f(z, y, p):
        return balanced_contrastive_loss(z, y, prototypes=p, **kw)

    _check_one_op(f, (z, y, p), inputs, dev)


@pytest.mark.parametrize("dev", DEVICES)
def test_compiled_hierarchical_loss_with_a_learnable_temperature(dev):
    # a level without prototypes (None: a [0, d] tensor inside the op), a learnable tau
    z, y, p = _data(dev, m=5)
    y2 = torch.div(y, 2, rounding_mode="floor")
    tau = torch.tensor(0.1, device=dev, requires_grad=True)
    inputs = [z, p, tau]

    def f(z, p, tau):
        return hierarchical_contrastive_loss(z, [y, y2], [p, None], temperature=tau,
                                             variant="official")

    _check_one_op(f, (z, p, tau), inputs, dev)


@pytest.mark.parametrize("dev", DEVICES)
def test_compiled_loss_in_a_model_step(dev):
    """A linear encoder, the loss and an optimizer step, compiled as one graph: the weights'
    gradient flows through the op's registered backward (a graph without gradients for the
    loss's own inputs, which are activations here)."""
    z, y, _ = _data(dev)
    lin = torch.nn.Linear(z.shape[1], 8, device=dev)
    x = z.detach()

    def f(x):
        return balanced_contrastive_loss(torch.nn.functional.normalize(lin(x), dim=1), y,
                                         variant="official")

    _close_to_eager(_compiled(f)(x), f(x), list(lin.parameters()))


@pytest.mark.parametrize("dev", DEVICES)
def test_compiled_loss_without_gradients(dev):
    z, y, p = _data(dev, m=3)

    def f(z, y, p):
        return balanced_contrastive_loss(z, y, prototypes=p, variant="official")

    with torch.no_grad():
        got = _compiled(f)(z, y, p)
        want = f(z, y, p)
    assert not got.requires_grad
    _same(got, want, dev)


@pytest.mark.parametrize("dev", DEVICES)
def test_compiled_loss_under_autocast(dev):
    # the eager rule (the loss runs on autocast's dtype) although the compiled graph calls the
    # op outside any autocast context: the op re-enters autocast with the traced dtype
    z, y, p = _data(dev, m=4)
    amp = torch.autocast(torch.device(dev).type, dtype=torch.bfloat16)

    def f(z, y, p):
        return balanced_contrastive_loss(z, y, prototypes=p)

    with amp:
        got = _compiled(f)(z, y, p)
        got_grads = _grads(got, [z, p])
        want = f(z, y, p)
        want_grads = _grads(want, [z, p])
    with torch.no_grad():
        fp32 = f(z, y, p)
    assert got.dtype == torch.float32 and got_grads[0].dtype == torch.float32
    assert not torch.equal(want, fp32)           # autocast did change the engine's dtype
    _same(got, want, dev)
    for a, b in zip(got_grads, want_grads, strict=True):
        _same(a, b, dev)


@pytest.mark.parametrize("dev", DEVICES)
def test_compiled_loss_backward_after_autocast_keeps_the_traced_dtype(dev):
    """reduction="none" traced under autocast of the device's non-default 16-bit dtype,
    backward() after the autocast block (as training loops do): the backward op reruns the
    loss on the traced autocast dtype, so the gradient is eager's, not that of the loss on
    the device's default autocast dtype."""
    z, y, _ = _data(dev, n=60)
    amp_dtype = torch.float16 if torch.device(dev).type == "cpu" else torch.bfloat16

    def f(z):
        return balanced_contrastive_loss(z, y, reduction="none")

    with torch.autocast(torch.device(dev).type, dtype=amp_dtype):
        got = _compiled(f)(z)
        want = f(z)
    _same(got, want, dev)
    for a, b in zip(_grads(got, [z]), _grads(want, [z]), strict=True):
        _same(a, b, dev)


def test_compiled_reference_backend_returns_the_fast_backends_dtype():
    """A 16-bit input's loss on backend="reference" comes back in float32, eager and compiled
    (the fast backends' rule; eager returned the input dtype until the reference computed
    16-bit rows in float32), with the same value and gradient."""
    z, y, _ = _data("cpu")
    zb = z.detach().bfloat16().requires_grad_()

    def f(z):
        return balanced_contrastive_loss(z, y, backend="reference")

    got = _compiled(f)(zb)
    want = f(zb)
    assert want.dtype == got.dtype == torch.float32
    assert torch.equal(got, want)
    assert torch.equal(torch.autograd.grad(got, zb)[0], torch.autograd.grad(want, zb)[0])


def test_compiled_loss_raises_the_eager_errors():
    z, y, _ = _data("cpu")
    with pytest.raises(ValueError, match="labels"):
        _compiled(lambda z, y: balanced_contrastive_loss(z, y))(z, y[:-1])   # at run time
    torch._dynamo.reset()
    bad = z.detach().clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="z"):
        _compiled(lambda z, y: balanced_contrastive_loss(z, y))(bad, y)
    torch._dynamo.reset()
    # while tracing: the eager TypeError (under fullgraph=True TorchDynamo reports any
    # exception raised while tracing as its own Unsupported error, quoting it)
    def bad_flag(z, y):
        return balanced_contrastive_loss(z, y, include_self="no")

    with pytest.raises(TypeError, match="include_self"):
        torch.compile(bad_flag, backend="aot_eager")(z, y)
    # empty prototypes of another width or dtype: the eager errors (the traced op took any
    # 0-row tensor for "no prototypes" and returned a loss)
    for protos, exc, msg in [(z.new_zeros(0, z.shape[1] + 1), ValueError, "width"),
                             (z.new_zeros(0, z.shape[1], dtype=torch.float64), TypeError,
                              "prototypes are torch.float64")]:
        for f in (lambda z, y, p: balanced_contrastive_loss(z, y, prototypes=p),
                  lambda z, y, p: hierarchical_contrastive_loss(z, [y], [p])):
            torch._dynamo.reset()
            with pytest.raises(exc, match=msg):
                f(z, y, protos)
            with pytest.raises(exc, match=msg):
                torch.compile(f, backend="aot_eager")(z, y, protos)


@pytest.mark.parametrize("hierarchical", [False, True], ids=["balanced", "hierarchical"])
def test_compiled_loss_names_labels_that_are_not_a_tensor(hierarchical):
    """As eager: labels given as a list (one level's, for the hierarchical loss) raise the
    TypeError naming them while the call is traced, not a TorchRuntimeError from the op."""
    z, y, _ = _data("cpu", n=20)
    y2 = torch.div(y, 2, rounding_mode="floor").tolist()

    def f(z):
        if hierarchical:
            return hierarchical_contrastive_loss(z, [y, y2], [None, None])
        return balanced_contrastive_loss(z, y.tolist())

    with pytest.raises(TypeError, match="labels must be a torch.Tensor, got list"):
        f(z)
    with pytest.raises(TypeError, match="labels must be a torch.Tensor, got list"):
        torch.compile(f, backend="aot_eager")(z)


def test_compiled_loss_reads_the_backend_switch_when_it_runs(monkeypatch):
    """$HIERTAIL_BACKEND is read by the op when the compiled code runs, not frozen at
    tracing: the dense reference runs after the switch is set, without a new trace."""
    z, y, _ = _data("cpu")
    calls = []
    ref = loss_ops.balanced_contrastive_loss_ref
    monkeypatch.setattr(loss_ops, "balanced_contrastive_loss_ref",
                        lambda *a, **k: calls.append(1) or ref(*a, **k))
    graphs: list = []
    f = _compiled(lambda z, y: balanced_contrastive_loss(z, y), graphs)
    f(z, y)
    assert calls == []
    monkeypatch.setenv("HIERTAIL_BACKEND", "reference")
    f(z, y)
    assert calls == [1] and len(graphs) == 1


def test_custom_op_registration_passes_opcheck():
    """torch.library's own check of the op: schema, fake tensors against the real outputs,
    the autograd registration, AOTAutograd with dynamic shapes."""
    z, y, p = _data("cpu", n=40, m=3)
    y2 = torch.div(y, 2, rounding_mode="floor")
    none = z.new_empty(0, z.shape[1])
    tau = torch.tensor(0.2, requires_grad=True)
    op = torch.ops.hiertail_fast.contrastive_loss.default
    for args in [
        (z, [y], [p], 0.1, None, False, True, "mean", "exact", None, None, [True, True, False]),
        (z, [y], [p], 0.0, tau, False, False, "none", "official", None, None,
         [True, True, True]),
        (z, [y, y2], [p, none], 0.1, None, True, True, "mean", "official", None, None,
         [True, True, False, False]),
    ]:
        torch.library.opcheck(op, args)
    # 16-bit z: the fake's loss is float32 as every backend's (Inductor plans its buffers from
    # the fake; aot_eager never compares the two dtypes)
    for dtype in (torch.bfloat16, torch.float16):
        z16 = z.detach().to(dtype).requires_grad_()
        for reduction in ("mean", "none"):
            torch.library.opcheck(op, (z16, [y], [none.to(dtype)], 0.1, None, False, True,
                                       reduction, "exact", None, None, [True, False, False]),
                                  test_utils=("test_schema", "test_faketensor"))


def test_eager_calls_do_not_go_through_the_custom_op(monkeypatch):
    z, y, _ = _data("cpu")
    monkeypatch.setattr(_custom_ops, "contrastive_loss",
                        lambda *a: pytest.fail("an eager call reached the custom op"))
    balanced_contrastive_loss(z, y).backward()


@pytest.mark.skipif(not hasattr(torch._C, "_AutoDispatchBelowADInplaceOrView"),
                    reason="this torch lacks the guard compiled code runs ops under")
def test_autograd_dispatch_restores_view_tracking_below_it():
    """Compiled code runs an op's implementation below autograd AND below the view tracking
    (ADInplaceOrView). ``_autograd_dispatch`` must re-include both: with autograd alone, an
    in-place edit of a view records no CopySlices on its base, and the base's gradient silently
    misses the edit (here 6 and 24 instead of 18 and 72)."""
    leaf = torch.arange(1.0, 7.0).reshape(2, 3).requires_grad_()
    with torch._C._AutoDispatchBelowADInplaceOrView(), _custom_ops._autograd_dispatch():
        base = leaf * 1
        base[:, 0].mul_(3)          # an in-place edit of a view of base
        (grad,) = torch.autograd.grad((base * base).sum(), leaf)
    # d/dx of (3x)^2 = 18x in column 0, of x^2 = 2x elsewhere
    want = torch.tensor([[18.0, 4.0, 6.0], [72.0, 10.0, 12.0]])
    torch.testing.assert_close(grad, want, rtol=0, atol=0)


def test_compiled_with_inductor():
    """The default backend (Inductor: generated C++ around the op), a normalisation fused
    before it: the loss within float32's tolerance of eager (the fused normalisation rounds
    differently)."""
    z, y, _ = _data("cpu", n=200)
    x = z.detach().clone().requires_grad_()

    def f(x, y):
        return balanced_contrastive_loss(torch.nn.functional.normalize(x * 2.0, dim=1), y)

    got = torch.compile(f, fullgraph=True)(x, y)
    (g_got,) = torch.autograd.grad(got, x)
    want = f(x, y)
    (g_want,) = torch.autograd.grad(want, x)
    torch.testing.assert_close(got, want, **tol(torch.float32))
    torch.testing.assert_close(g_got, g_want, **tol(torch.float32))


def test_without_the_private_guard_the_losses_are_traced_as_before(monkeypatch):
    """The fallback when torch._C lacks the dispatch-key API the op's implementation needs
    (``_custom_ops.READY`` False): TorchDynamo traces the eager loss (graph breaks, no custom
    op), with the same numbers."""
    monkeypatch.setattr(_custom_ops, "READY", False)
    z, y, _ = _data("cpu", n=60)
    graphs: list = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    def f(z, y):
        return balanced_contrastive_loss(z, y, variant="official")

    got = torch.compile(f, backend=backend)(z, y)
    torch.testing.assert_close(got, f(z, y), **tol(torch.float32))
    assert graphs and not any(_custom_op_calls(gm) for gm in graphs)


@pytest.mark.parametrize("strict", [False, True])
def test_exported_loss_is_one_custom_op(strict):
    """torch.export (both tracers): the loss is one ``hiertail_fast.contrastive_loss`` node and
    the exported program gives the eager value."""
    z, y, p = _data("cpu", m=3)
    z, p = z.detach(), p.detach()

    class Loss(torch.nn.Module):
        def forward(self, z, y, p):
            return balanced_contrastive_loss(z, y, prototypes=p, variant="official")

    program = torch.export.export(Loss(), (z, y, p), strict=strict)
    calls = [n for n in program.graph.nodes
             if "hiertail_fast.contrastive_loss" in str(n.target)]
    assert len(calls) == 1
    assert torch.equal(program.module()(z, y, p), Loss()(z, y, p))


def test_exported_loss_trains_or_says_why():
    """An exported loss keeps which inputs get a gradient as they were at export: trained on
    the inputs it was exported with (requiring grad), the gradient is eager's; where it was
    exported without, backward() raises naming the input (z.grad stayed None, silently); a
    gradient penalty through it raises like the eager loss (it came back as first-order only,
    off by 0.03)."""
    z, y, p = _data("cpu", m=3)
    z, p = z.detach(), p.detach()

    class Loss(torch.nn.Module):
        def forward(self, z, p):
            return hierarchical_contrastive_loss(z, [y, y // 2], [p, None], temperature=0.5)

    eager_z, eager_p = z.clone().requires_grad_(), p.clone().requires_grad_()
    Loss()(eager_z, eager_p).backward()
    trained = torch.export.export(Loss(), (z.clone().requires_grad_(), p.clone().requires_grad_()))
    zz, pp = z.clone().requires_grad_(), p.clone().requires_grad_()
    trained.module()(zz, pp).backward()
    torch.testing.assert_close(zz.grad, eager_z.grad, **tol(torch.float32))
    torch.testing.assert_close(pp.grad, eager_p.grad, **tol(torch.float32))

    frozen = torch.export.export(Loss(), (z, p.clone().requires_grad_()))
    zz = z.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="traced .* with z not requiring grad"):
        frozen.module()(zz, p.clone().requires_grad_()).backward()

    # a tensor temperature exported without grad, then learned (the s72 audit, C23: the check
    # read the float temperature's slot, and tau.grad stayed None)
    class TauLoss(torch.nn.Module):
        def forward(self, z, tau):
            return balanced_contrastive_loss(z, y, temperature=tau)

    frozen_tau = torch.export.export(TauLoss(), (z.clone().requires_grad_(), torch.tensor(0.5)))
    with pytest.raises(RuntimeError, match="traced .* with temperature not requiring grad"):
        frozen_tau.module()(z.clone().requires_grad_(),
                            torch.tensor(0.5, requires_grad=True)).backward()

    zz = z.clone().requires_grad_()
    (g,) = torch.autograd.grad(trained.module()(zz, p), zz, create_graph=True)
    with pytest.raises(RuntimeError, match="cannot be differentiated again"):
        g.pow(2).sum().backward()
    # the prototypes' gradient too (the op returns it in a list: it went unguarded and a
    # penalty on it was dropped silently)
    pp = p.clone().requires_grad_()
    (gp,) = torch.autograd.grad(trained.module()(z.clone().requires_grad_(), pp), pp,
                                create_graph=True)
    with pytest.raises(RuntimeError, match="cannot be differentiated again"):
        gp.pow(2).sum().backward()


@pytest.mark.parametrize("case", ["mean", "official_prototypes_sum", "hierarchical",
                                  "prototypes_only", "temperature_only"])
def test_a_second_derivative_through_a_compiled_loss_raises(case):
    """A gradient penalty d/dx [L + |dL/dx|²] through a compiled loss raises torch.compile's
    double-backward error (README). It came back as dL/dx alone, silently: AOTAutograd saves
    tensors detached and the fused backward saved only the gradients, so the gradient's graph
    reached no input (an autograd audit; tied_gradients ties them)."""
    z, y, p = _data("cpu", n=40, d=5, m=3, dtype=torch.float64)
    z, p = z.detach(), p.detach()
    tau = torch.tensor(0.3, dtype=torch.float64)
    wrt = {"prototypes_only": "p", "temperature_only": "tau"}.get(case, "z")
    leaf = {"z": z, "p": p, "tau": tau}[wrt].clone().requires_grad_()
    args = {"z": z, "p": p, "tau": tau, wrt: leaf}

    def f(z, p, tau):
        if case == "hierarchical":
            return hierarchical_contrastive_loss(z, [y, y // 2], [None, None])
        if case == "mean":
            return balanced_contrastive_loss(z, y)
        return balanced_contrastive_loss(z, y, prototypes=p, temperature=tau,
                                         variant="official", reduction="sum")

    loss = _compiled(f)(args["z"], args["p"], args["tau"])
    (g,) = torch.autograd.grad(loss, leaf, create_graph=True)
    with pytest.raises(RuntimeError, match="does not currently support double backward"):
        torch.autograd.grad(loss + g.pow(2).sum(), leaf)


def test_a_compiled_loss_refuses_inputs_changed_before_its_backward():
    """The price of the tie (tied_gradients): the compiled loss saves its inputs, so an
    in-place change of the prototypes between the loss and backward() raises autograd's
    in-place error, as torch's own ops that save an input do (README); the eager loss saves
    none and takes the gradient of the values it saw."""
    z, y, p = _data("cpu", n=40, d=6, m=4)
    protos = torch.nn.Parameter(p.detach().clone())
    loss = _compiled(lambda z, p: balanced_contrastive_loss(z, y, prototypes=p))(z, protos)
    with torch.no_grad():
        protos.mul_(0.9)                          # an EMA-style update before backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    protos = torch.nn.Parameter(p.detach().clone())
    loss = balanced_contrastive_loss(z, y, prototypes=protos)
    with torch.no_grad():
        protos.mul_(0.9)
    loss.backward()                               # eager: no saved input
    assert protos.grad is not None


def test_tied_gradients_op_passes_opcheck_and_differentiates_as_declared():
    """The tie's own derivative, where a traced backward runs eagerly (torch.export): the
    identity for a linear op (topk_unpool's gather: its exported second derivative stayed
    exact), an error naming the limit otherwise (the losses)."""
    op = torch.ops.hiertail_fast.tied_gradients.default
    g = [torch.randn(4, 3), torch.randn(3)]
    for linear in (False, True):
        torch.library.opcheck(op, (g, [torch.randn(4, 3)], linear))
    x = torch.randn(4, 3, requires_grad=True)
    (out,) = op([x * 2], [x], False)
    torch.testing.assert_close(out, x.detach() * 2)
    with pytest.raises(RuntimeError, match="cannot be differentiated again"):
        out.sum().backward()
    (out,) = op([x * 2], [x], True)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((4, 3), 2.0))


def test_every_custom_op_is_kept_out_of_cuda_graphs():
    """Each op reads values on the host: tagged cudagraph_unsafe, so that
    torch.compile(mode="reduce-overhead") leaves it out of its CUDA graphs."""
    import hiertail_fast.ops.gcn_propagate  # noqa: F401  (registers the graph ops)

    # whether this torch can tag, read from torch itself (not from OP_OPTIONS, which a lost
    # tag would empty and so skip the very check that should fail)
    if not (hasattr(torch.Tag, "cudagraph_unsafe")
            and "tags" in inspect.signature(torch.library.custom_op).parameters):
        pytest.skip("this torch has no cudagraph_unsafe tag, or custom_op takes no tags")
    assert _custom_ops.OP_OPTIONS["tags"] == (torch.Tag.cudagraph_unsafe,)
    ns = torch.ops.hiertail_fast
    names = [n for n in dir(ns) if isinstance(getattr(ns, n), torch._ops.OpOverloadPacket)]
    assert {"contrastive_loss", "contrastive_loss_backward", "gcn_propagate",
            "gcn_propagate_backward", "nearest_prototype", "topk_unpool"} <= set(names)
    for name in names:
        assert torch.Tag.cudagraph_unsafe in getattr(ns, name).default.tags


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_reduce_overhead_mode_on_cuda():
    """torch.compile's CUDA-graph mode around the ops (kept out of the graphs by their tag):
    a GCN layer and the loss, values and gradients within float32's tolerance of eager."""
    from hiertail_fast import gcn_propagate
    from hiertail_fast.graph import CSRGraph

    z, y, _ = _data("cuda")
    gen = torch.Generator().manual_seed(7)
    ei = torch.randint(0, z.shape[0], (2, 1500), generator=gen).cuda()
    g = CSRGraph.from_edge_index(ei, num_nodes=z.shape[0], symmetrize=True)
    lin = torch.nn.Linear(z.shape[1], 16, device="cuda")
    x = z.detach()

    def step(x):
        h = torch.nn.functional.normalize(gcn_propagate(lin(x), g).relu(), dim=1)
        return balanced_contrastive_loss(h, y, variant="official")

    compiled = torch.compile(step, mode="reduce-overhead")
    for _ in range(2):                       # warm-up, record; the replay is compared
        torch.autograd.grad(compiled(x), list(lin.parameters()))
    _close_to_eager(compiled(x), step(x), list(lin.parameters()))
