"""Regression tests of issue 12 ("Hardening"): each test reproduces one defect of the ops and
failed before its fix (checked by stashing the fix)."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from hiertail_fast import (
    CSRGraph,
    balanced_contrastive_loss,
    gcn_propagate,
    hierarchical_contrastive_loss,
    load_npz,
    nearest_prototype,
    topk_pool,
    topk_unpool,
)
from hiertail_fast.nn.hiertail import HierTail, HierTailConfig, prepare_graph
from hiertail_fast.ops.gcn_propagate import _merge_diagonal
from tests.conftest import backend_device, on_backend_device, requires_triton

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ["reference", "torch", pytest.param("triton", marks=requires_triton)]
NO_EDGES = torch.zeros(2, 0, dtype=torch.long)


# ---------------------------------------------------------------- 1. negative degree segfault
def test_negative_degree_rejected_in_subprocess():
    """A self-loop node with a negative degree got a NaN deg^-1/2; `NaN != 0` made the CPU
    operator build insert a second diagonal entry and leave a slot of garbage for MKL
    (segfault). Run in a subprocess so a crash fails this test instead of killing pytest."""
    code = textwrap.dedent("""
        import torch
        from hiertail_fast import CSRGraph, gcn_propagate
        g = CSRGraph.from_edge_index(torch.tensor([[0, 1], [1, 1]]), torch.tensor([-1., -1.]),
                                     num_nodes=2)
        for backend in ("torch", "reference", "triton"):
            try:
                gcn_propagate(torch.randn(2, 4), g, backend=backend)
                print(backend, "no error")
            except ValueError as exc:
                print(backend, "ValueError:", exc)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, (res.returncode, res.stderr[-2000:])
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 3
    for line in lines:
        assert "ValueError: node 1 has GCN degree -2" in line, line


def test_merge_diagonal_never_duplicates_a_stored_diagonal():
    """Whatever the diagonal values (NaN included), a row that stores (i, i) gets no second
    entry and every output slot is written: the merged CSR validates and equals the dense sum."""
    ei = torch.tensor([[0, 1, 2, 1], [1, 1, 1, 2]])  # node 1 has a stored self-loop
    g = CSRGraph.from_edge_index(ei, torch.ones(4, dtype=torch.float64), 3)
    diag = torch.tensor([0.5, float("nan"), 0.25], dtype=torch.float64)
    indptr, indices, values = _merge_diagonal(g.indptr, g.indices, g.weight, diag)
    merged = CSRGraph(indptr, indices, values, 3)  # full validation: sorted, in range
    assert merged.num_edges == g.num_edges + 2  # rows 0 and 2 only
    dense = torch.zeros(3, 3, dtype=torch.float64)
    dense[merged.row_index(), merged.indices] = merged.weight
    assert dense[1, 1] == 1.0 and dense[0, 0] == 0.5 and dense[2, 2] == 0.25


@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_degree_same_error_every_backend(backend):
    on_backend_device(backend)
    g = CSRGraph.from_edge_index(torch.tensor([[0, 1, 2], [1, 2, 2]]),
                                 torch.tensor([1.0, -5.0, 1.0]), num_nodes=3)
    with pytest.raises(ValueError, match="node 2 has GCN degree -4"):
        gcn_propagate(torch.randn(3, 2), g, backend=backend)
    # zero degree stays allowed (isolated node without added loop: dinv = 0, as PyG)
    out = gcn_propagate(torch.randn(3, 2), CSRGraph.from_edge_index(NO_EDGES, num_nodes=3),
                        add_self_loops=False, backend=backend)
    assert torch.equal(out, torch.zeros(3, 2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_degree_with_learnable_weights_is_the_error_alone(backend):
    # weights that require grad: the degree check reads detached degrees, so the refusal
    # comes without torch's "Converting a tensor with requires_grad=True to a scalar"
    # warning (an old fix without a test, 3077139)
    import warnings

    on_backend_device(backend)
    w = torch.tensor([-5.0, -5.0], requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # (improved=True, the default: a self-loop of weight 2; -5 + 2)
        with pytest.raises(ValueError, match="node 0 has GCN degree -3"):
            gcn_propagate(torch.randn(2, 3), torch.tensor([[0, 1], [1, 0]]), edge_weight=w,
                          backend=backend)


# ---------------------------------------------------------------- 3. stale weight caches
def _param_graph():
    base = CSRGraph.from_edge_index(torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]]),
                                    num_nodes=4)
    w = torch.nn.Parameter(torch.tensor([0.5, 1.0, 1.5, 2.0, 2.5, 3.0]))
    return base, w, CSRGraph(base.indptr, base.indices, w)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cache_sees_inplace_update_of_learnable_weights(backend):
    on_backend_device(backend)
    base, w, g = _param_graph()
    x = torch.randn(4, 3)
    with torch.no_grad():
        first = gcn_propagate(x, g, backend=backend)
    w.grad = torch.ones(6)
    torch.optim.SGD([w], lr=0.25).step()  # in place: bumps w._version
    with torch.no_grad():
        second = gcn_propagate(x, g, backend=backend)
        fresh = gcn_propagate(x, CSRGraph(base.indptr, base.indices, w.detach().clone()),
                              backend="reference")
    assert not torch.allclose(first, second)
    torch.testing.assert_close(second, fresh)


def test_graph_weight_caches_follow_the_weights():
    base, w, g = _param_graph()
    with torch.no_grad():
        dinv0, _ = g.gcn_deg_inv_sqrt()
        assert not g.is_symmetric() and g.transpose().weight[0] == w[1]
        w.copy_(torch.tensor([1.0, 1.0, 2.0, 2.0, 3.0, 3.0]))  # now symmetric
    assert g.is_symmetric() and g.transpose() is g  # re-checked for the new weights
    dinv1, _ = g.gcn_deg_inv_sqrt()
    assert not torch.equal(dinv0, dinv1)
    expect = CSRGraph(base.indptr, base.indices, w.detach().clone())
    torch.testing.assert_close(dinv1, expect.gcn_deg_inv_sqrt()[0])
    with torch.no_grad():
        a2 = g.augment_a2().weight.clone()
        w.mul_(2.0)
    assert not torch.equal(a2, g.augment_a2().weight)


# ---------------------------------------------------------------- 6. top-k tie rule
@pytest.mark.parametrize("backend", BACKENDS)
def test_identical_rows_tie_by_lowest_index(backend):
    on_backend_device(backend)
    x = torch.tensor([[-1.0, -1.0, 2.0]] * 5)
    p = torch.tensor([-0.5870481729507446, 2.8191161155700684, -0.08441101014614105])
    r = topk_pool(x, NO_EDGES, p, 2, backend=backend)
    assert r.perm.tolist() == [0, 1]
    assert r.score[0].item() == r.score[1].item()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_duplicate_rows_bit_identical_scores(backend, dtype):
    on_backend_device(backend)
    gen = torch.Generator().manual_seed(3)
    rows = torch.randn(3, 7, generator=gen, dtype=dtype) * 4  # some scores saturate
    x = rows[torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1])]  # n = 11: ragged mod 4
    p = torch.randn(7, generator=gen, dtype=dtype)
    r = topk_pool(x, NO_EDGES, p, 1.0, backend=backend)
    full = torch.empty(11, dtype=dtype)
    full[r.perm] = r.score
    for j in range(3):
        assert torch.unique(full[j::3]).numel() == 1  # bit-identical within each copy group
    ref = topk_pool(x, NO_EDGES, p, 1.0, backend="reference")
    assert r.perm.tolist() == ref.perm.tolist()


@requires_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_triton_saturated_scores_tie_like_the_reference(dtype):
    """d = 1 and p = [1]: the pre-activation is x itself on every backend, so the scores must
    be the reference's bit for bit; near saturation many of them round to exactly 1.0 and tie
    (lowest index first). Triton's own tanh formula differed by an ulp there."""
    on_backend_device("triton")
    x = torch.linspace(3.0, 20.0, 301, dtype=dtype).flip(0).unsqueeze(1)
    p = torch.ones(1, dtype=dtype)
    ref = topk_pool(x, NO_EDGES, p, 1.0, backend="reference")
    got = topk_pool(x, NO_EDGES, p, 1.0, backend="triton")
    assert torch.equal(got.score, ref.score)
    assert torch.equal(got.perm, ref.perm)


# ---------------------------------------------------------------- 7. ‖p‖ under/overflow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [1e-23, 1e19, 3e37])
def test_score_weight_norm_is_scaled(backend, scale):
    on_backend_device(backend)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(9, 5, generator=gen, requires_grad=True)
    p0 = torch.randn(5, generator=gen)
    p = (p0 * scale).requires_grad_()
    r = topk_pool(x, NO_EDGES, p, 4, backend=backend)
    expect = topk_pool(x.detach(), NO_EDGES, p0, 4, backend="reference")
    assert r.perm.tolist() == expect.perm.tolist()
    torch.testing.assert_close(r.score, expect.score, rtol=1e-5, atol=1e-6)
    (r.x.sum() + r.score.sum()).backward()
    assert bool(torch.isfinite(x.grad).all()) and bool(torch.isfinite(p.grad).all())
    # dL/dp scales as 1/scale: compare with the unscaled gradient
    p0 = p0.clone().requires_grad_()
    x0 = x.detach().clone().requires_grad_()
    e = topk_pool(x0, NO_EDGES, p0, 4, backend="reference")
    (e.x.sum() + e.score.sum()).backward()
    torch.testing.assert_close(p.grad * scale, p0.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(x.grad, x0.grad, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- 10. op-level leftovers
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [1e19, 1e-23])
def test_nearest_prototype_extreme_scales(backend, scale):
    on_backend_device(backend)
    z = torch.tensor([[3.0, 3.0]]) * scale
    protos = torch.tensor([[2.5, 3.0], [3.0, 3.1]]) * scale  # distances 0.5 vs 0.1
    assert nearest_prototype(z, protos, backend=backend).tolist() == [1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_unpool_negative_num_nodes(backend):
    on_backend_device(backend)
    with pytest.raises(ValueError, match="num_nodes must be >= 0"):
        topk_unpool(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), -1, backend=backend)
    out = topk_unpool(torch.ones(1, 2), torch.tensor([2]), np.int64(4), backend=backend)
    assert out.shape == (4, 2) and out[2].tolist() == [1.0, 1.0]


def test_num_nodes_accepts_integer_likes_only():
    ei = torch.tensor([[0, 1], [1, 2]])
    assert CSRGraph.from_edge_index(ei, num_nodes=np.int64(6)).num_nodes == 6
    assert CSRGraph.from_edge_index(ei, num_nodes=torch.tensor(5)).num_nodes == 5
    for bad in (True, np.bool_(True), 6.0, np.float64(6), "6"):
        with pytest.raises(TypeError, match="num_nodes must be an int"):
            CSRGraph.from_edge_index(ei, num_nodes=bad)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_gcn_propagate_rejects_non_finite_x(backend, bad):
    on_backend_device(backend)
    g = CSRGraph.from_edge_index(torch.tensor([[0, 1], [1, 0]]), num_nodes=2)
    x = torch.ones(2, 3)
    x[1, 2] = bad
    with pytest.raises(ValueError, match="x contains NaN or Inf"):
        gcn_propagate(x, g, backend=backend)


def test_train_labels_refusals_at_their_edges():
    """train_labels (the models' shared label check): a one-node graph's label is checked
    too; y on another device than the output is named (a meta device stands in); under
    torch.compile a y or train_idx that is not a tensor gets eager's TypeError, not a
    failure inside the fake-tensor trace."""
    from hiertail_fast.nn._train_labels import checked_train_labels, train_labels

    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="the labels go up to 5 but the model's num_classes"):
        train_labels(torch.tensor([5]), torch.tensor([0]), 1, 3, cpu)
    with pytest.raises(ValueError, match="y is on cpu but the output is on meta"):
        train_labels(torch.tensor([0, 1]), torch.tensor([0]), 2, 3, torch.device("meta"))

    def step(y, idx):
        return checked_train_labels(y, idx, 4, 3, cpu)

    for y, idx, name in (([0, 1, 2, 0], torch.tensor([0, 2]), "y"),
                         (torch.tensor([0, 1, 2, 0]), [0, 2], "train_idx")):
        torch._dynamo.reset()
        for fn in (step, torch.compile(step, backend="eager")):
            with pytest.raises(TypeError, match=f"{name} must be a torch.Tensor, got list"):
                fn(y, idx)


def test_hiertail_loss_checks_labels_and_indices():
    torch.manual_seed(0)
    n, c = 12, 3
    model = HierTail(4, c, HierTailConfig.paper(hidden=8))
    ei = torch.randint(0, n, (2, 30))
    out = model(torch.randn(n, 4), prepare_graph(ei, n))
    y = torch.arange(n) % c
    with pytest.raises(ValueError, match="the labels go up to 3 but the model's num_classes is 3"):
        model.loss(out, torch.full((n,), 3), torch.arange(4))
    with pytest.raises(ValueError, match="train_idx refers to node 12"):
        model.loss(out, y, torch.tensor([0, 12]))
    with pytest.raises(ValueError, match="train_idx has negative entries"):
        model.loss(out, y, torch.tensor([0, -1]))
    assert torch.isfinite(model.loss(out, y, torch.arange(0, n, 2)).total)


def test_corrupt_npz_names_file_and_never_suggests_pickle(tmp_path):
    obj = tmp_path / "objects.npz"  # an object array: numpy would hint at allow_pickle=True
    np.savez(obj, edge_index=np.zeros((2, 0), np.int64), y=np.zeros(2, np.int64),
             x=np.array([None, 1], dtype=object))
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"\x80\x04not a zip archive")
    truncated = tmp_path / "truncated.npz"
    np.savez(truncated, edge_index=np.zeros((2, 3), np.int64), y=np.zeros(9, np.int64),
             x=np.zeros((9, 40)))
    truncated.write_bytes(truncated.read_bytes()[:-400])
    for path in (obj, junk, truncated):
        with pytest.raises(ValueError) as info:
            load_npz(path)
        msg = str(info.value)
        assert msg.startswith(str(path)), msg
        assert "allow_pickle" not in msg
        assert info.value.__cause__ is None or "allow_pickle" not in str(info.value.__cause__)


@pytest.mark.parametrize("temperature", [1e-45, 1e-7, 0.0, -1.0, float("nan")])
def test_temperature_below_minimum_rejected(temperature):
    z, y = torch.randn(4, 3), torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError, match="temperature must be a finite number >= 1e-06"):
        balanced_contrastive_loss(z, y, temperature=temperature)
    assert torch.isfinite(balanced_contrastive_loss(z, y, temperature=1e-6, backend="reference"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_tensor_temperature_at_the_minimum_as_its_dtype_holds_it(dtype):
    """torch.tensor(1e-6) in float32 is 9.99999997e-07: the smallest learnable temperature is
    accepted (it was refused as below the minimum), the next value below it refused."""
    z, y = torch.randn(4, 3), torch.tensor([0, 0, 1, 1])
    tau = torch.tensor(1e-6, dtype=dtype)
    assert torch.isfinite(balanced_contrastive_loss(z, y, temperature=tau, backend="reference"))
    below = torch.nextafter(tau, torch.zeros((), dtype=dtype)) if dtype != torch.bfloat16 else (
        tau.float() * 0.99).to(dtype)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 1e-06"):
        balanced_contrastive_loss(z, y, temperature=below)


def test_contrastive_validator_lives_in_validation():
    from hiertail_fast import _validation
    from hiertail_fast.reference import balanced_contrastive_loss as ref

    assert ref.validate_contrastive_inputs is _validation.validate_contrastive_inputs
    assert ref.REDUCTIONS == _validation.REDUCTIONS and ref.VARIANTS == _validation.VARIANTS


# ---------------------------------------------------------------- second derivatives
_SECOND_ORDER = [
    ("loss", "torch", "balanced_contrastive_loss"),
    ("loss", "attention", "balanced_contrastive_loss"),
    pytest.param("loss", "triton", "balanced_contrastive_loss", marks=requires_triton),
    ("hierarchical", "torch", "balanced_contrastive_loss"),
    ("gcn", "torch", "gcn_propagate"),
    pytest.param("gcn", "triton", "gcn_propagate", marks=requires_triton),
    ("weighted gcn", "torch", "gcn_propagate"),
    ("pool", "torch", "topk_pool"),
    pytest.param("pool", "triton", "topk_pool", marks=requires_triton),
]


@pytest.mark.parametrize("op, backend, name", _SECOND_ORDER)
@pytest.mark.usefixtures("exact_rows_rule_off")
def test_second_derivative_raises_instead_of_vanishing(op, backend, name):
    # The fast backends' gradients are hand-written (the loss's often computed in its forward)
    # and carry no graph. A gradient penalty through them, |dL/dz|^2 with create_graph=True,
    # silently added nothing to z.grad before (the loss; gcn_propagate failed inside its
    # backward); now differentiating it raises, naming the op, and the first derivative under
    # create_graph=True is the usual one.
    dev = backend_device(backend)
    gen = torch.Generator().manual_seed(0)
    z0 = torch.randn(30, 5, generator=gen)
    y = torch.randint(0, 3, (30,), generator=gen).to(dev)
    ei = torch.randint(0, 30, (2, 60), generator=gen).to(dev)
    p = torch.randn(5, generator=gen).to(dev)
    w = torch.rand(60, generator=gen).to(dev).requires_grad_()
    run = {
        "loss": lambda z: balanced_contrastive_loss(z, y, backend=backend),
        "hierarchical": lambda z: hierarchical_contrastive_loss(z, [y, y // 2], [None, None],
                                                                backend=backend),
        "gcn": lambda z: gcn_propagate(z, ei, backend=backend).pow(2).sum(),
        "weighted gcn": lambda z: gcn_propagate(z, ei, w, backend=backend).sum(),
        "pool": lambda z: topk_pool(z, ei, p, 0.5, backend=backend).x.pow(2).sum(),
    }[op]
    z = z0.to(dev).requires_grad_()
    (g,) = torch.autograd.grad(run(z), z, create_graph=True)
    (g1,) = torch.autograd.grad(run(z), z)
    torch.testing.assert_close(g, g1)
    with pytest.raises(RuntimeError, match=f"^{name}: .* cannot be differentiated again"):
        (run(z) + g.pow(2).sum()).backward()


def test_second_derivative_where_it_is_exact():
    # no tensor the gradient depends on requires grad: nothing to guard, the gradient is
    # returned as it is (a linear map of a constant seed: its derivative really is 0)
    z = torch.randn(12, 3, requires_grad=True)
    ei = torch.randint(0, 12, (2, 30))
    (g,) = torch.autograd.grad(gcn_propagate(z, ei, backend="torch").sum(), z,
                               create_graph=True)
    assert not g.requires_grad
    torch.testing.assert_close(g, torch.autograd.grad(
        gcn_propagate(z, ei, backend="reference").sum(), z)[0])


def test_graph_anchor_keeps_no_memory_alive():
    # the fused loss saves only its gradient and the anchor: the anchor must reach z's sources
    # through autograd without holding the concatenated z (memory-lean as before the guard)
    import gc
    import weakref

    from hiertail_fast.ops._autograd import graph_anchor

    src = torch.randn(50, 4, requires_grad=True)
    z_all = torch.cat([src, src[:3] * 2])
    alive = weakref.ref(z_all)
    anchor = graph_anchor(z_all)
    del z_all
    gc.collect()
    assert alive() is None
    (g,) = torch.autograd.grad(anchor, src)
    assert g[0, 0] == 1 and g.sum() == 1
    assert graph_anchor(torch.randn(5, 4)) is None
    with torch.no_grad():
        assert graph_anchor(src) is None


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("backend", ["torch", "attention",
                                     pytest.param("triton", marks=requires_triton)])
def test_ops_under_activation_checkpointing(backend, reentrant):
    # torch.utils.checkpoint reruns the forward in the backward; its non-reentrant form lets a
    # backward unpack each saved tensor once, and the backward decorator's own look at them
    # (the torch.func check) made a second unpack: CheckpointError. Gradients equal the
    # unchecked run's, bit for bit
    from torch.utils.checkpoint import checkpoint

    dev = backend_device(backend)
    graph_backend = "torch" if backend == "attention" else backend
    gen = torch.Generator().manual_seed(0)
    z0 = torch.randn(40, 5, generator=gen).to(dev)
    y = torch.randint(0, 4, (40,), generator=gen).to(dev)
    ei = torch.randint(0, 40, (2, 100), generator=gen).to(dev)
    p = torch.randn(5, generator=gen).to(dev)

    def block(z):
        pooled = topk_pool(gcn_propagate(z, ei, backend=graph_backend).relu(), ei, p, 0.5,
                           backend=graph_backend)
        return topk_unpool(pooled.x, pooled.perm, 40, backend=graph_backend)

    def losses(h):
        return (balanced_contrastive_loss(h, y, backend=backend)
                + balanced_contrastive_loss(h, y, variant="official", backend=backend))

    def grads(wrap):
        z = z0.clone().requires_grad_()
        wrap(losses, wrap(block, z)).backward()
        return z.grad

    def checked(f, *args):
        return checkpoint(f, *args, use_reentrant=reentrant)

    got, want = grads(checked), grads(lambda f, *args: f(*args))
    if dev == "cpu":
        assert torch.equal(got, want)
    else:                       # CUDA's index_add_ uses atomics: run to run within rounding
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=requires_triton)])
def test_unpool_differentiates_twice(backend):
    # topk_unpool's gradient is a gather: under create_graph=True it is taken with torch's own
    # (differentiable) gather, so its second derivative equals the reference's
    dev = backend_device(backend)
    perm = torch.tensor([4, 0, 2], device=dev)

    def second(b):
        x = torch.linspace(-1, 1, 6, device=dev).view(3, 2).requires_grad_()
        out = topk_unpool(x, perm, 5, backend=b)
        (g,) = torch.autograd.grad(out.pow(3).sum(), x, create_graph=True)
        (gg,) = torch.autograd.grad(g.sum(), x)
        return gg

    torch.testing.assert_close(second(backend), second("reference"))


# ---------------------------------------------------------------- device guard
def test_ops_run_with_their_inputs_device_current():
    # Triton launches on the CURRENT CUDA device: the public ops make their input's device
    # current (_dispatch.on_input_device / public_op). On CPU tensors the guard is no context.
    import contextlib

    from hiertail_fast.ops._dispatch import on_input_device, public_op

    assert isinstance(on_input_device(torch.zeros(1)), contextlib.nullcontext)
    assert isinstance(on_input_device(None), contextlib.nullcontext)
    # a CUDA tensor's own device, not the current one (a stand-in: no GPU needed to build it)
    guard = on_input_device(types.SimpleNamespace(is_cuda=True, device=torch.device("cuda", 1)))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    seen = []
    op = public_op(lambda x, *, k=1: seen.append(torch.is_autocast_enabled("cpu")) or x * k)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert op(torch.ones(2), k=3).tolist() == [3.0, 3.0]
    assert seen == [False]                  # the body ran with autocast off


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_triton_ops_on_a_second_gpu():
    dev = torch.device("cuda", 1)
    torch.cuda.set_device(0)
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(300, 16, generator=gen)
    y = torch.randint(0, 5, (300,), generator=gen)
    ei = torch.randint(0, 300, (2, 1000), generator=gen)
    p = torch.randn(16, generator=gen)
    want = (balanced_contrastive_loss(z, y, backend="torch"),
            gcn_propagate(z, ei, backend="torch"),
            topk_pool(z, ei, p, 0.5, backend="torch").x,
            nearest_prototype(z, z[:7], backend="torch"))
    got = (balanced_contrastive_loss(z.to(dev), y.to(dev), backend="triton"),
           gcn_propagate(z.to(dev), ei.to(dev), backend="triton"),
           topk_pool(z.to(dev), ei.to(dev), p.to(dev), 0.5, backend="triton").x,
           nearest_prototype(z.to(dev), z[:7].to(dev), backend="triton"))
    for a, b in zip(got, want, strict=True):
        assert a.device == dev
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- deterministic mode
_DET_DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and os.environ.get(
    "CUBLAS_WORKSPACE_CONFIG") else [])     # cuBLAS itself refuses the mode without it


@pytest.mark.parametrize("device", _DET_DEVICES)
def test_every_op_runs_in_deterministic_mode(device):
    # torch.use_deterministic_algorithms(True): no op of ours may call one that PyTorch
    # refuses in that mode (it raises RuntimeError), values and gradients, the model included
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        gen = torch.Generator().manual_seed(0)
        z = torch.randn(300, 8, generator=gen).to(device).requires_grad_()
        y = torch.randint(0, 5, (300,), generator=gen).to(device)
        ei = torch.randint(0, 300, (2, 1200), generator=gen).to(device)
        for variant in ("exact", "official"):
            balanced_contrastive_loss(z, y, variant=variant).backward()
            hierarchical_contrastive_loss(z, [y, y // 2], [None, None], variant=variant).backward()
        gcn_propagate(z, ei).sum().backward()
        topk_pool(z, ei, torch.ones(8, device=device), 0.5).x.sum().backward()
        nearest_prototype(z.detach(), z[:4].detach())
        for config in ("paper", "official"):
            model = HierTail(8, 5, HierTailConfig.named(config, hidden=8)).to(device)
            out = model(z.detach(), prepare_graph(ei.cpu(), 300).to(device))
            model.loss(out, y, torch.arange(200, device=device)).total.backward()
        assert torch.isfinite(z.grad).all()
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("backend", ["torch", "attention"])
@pytest.mark.parametrize("variant", ["official", "exact"])
def test_learnable_temperature_second_derivatives_raise(backend, variant):
    """Learnable tau: its dL/dtau is computed apart from dL/dz (exactly, at the logits' level;
    the official variant's since 2026-11-27, the exact one's since 2026-12-05), and both links
    were missing from autograd's graph, so the mixed second derivatives came back as None / 0
    (the reference: 0.53, 5.2, 1.5). Now they raise."""
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(40, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    protos = torch.randn(4, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 4, (40,), generator=gen)
    tau = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)

    def grads():
        loss = balanced_contrastive_loss(z, y, prototypes=protos, temperature=tau,
                                         variant=variant, backend=backend)
        return torch.autograd.grad(loss, (z, tau), create_graph=True)
    gz, gtau = grads()
    ref = balanced_contrastive_loss(z, y, prototypes=protos, temperature=tau,
                                    variant=variant, backend="reference")
    rz, rtau = torch.autograd.grad(ref, (z, tau))
    torch.testing.assert_close(gz, rz)
    torch.testing.assert_close(gtau, rtau)
    for of, wrt in ((gz.sum(), tau), (gtau, z), (gtau, protos)):
        with pytest.raises(RuntimeError, match="cannot be differentiated again"):
            torch.autograd.grad(of, wrt, retain_graph=True, allow_unused=True)


def test_forward_mode_tangents_are_refused_not_dropped():
    """A forward-mode tangent on a temperature (read as a float) or on edge weights (stored in
    a CSRGraph) was dropped without a word: jvp gave 0 where the finite difference gave 1.4.
    Now a RuntimeError names the op (a dual z / x too: test_func_transforms); the losses'
    reference backend is plain autograd and gives the tangent."""
    import torch.autograd.forward_ad as fwad
    from torch.func import jvp

    gen = torch.Generator().manual_seed(1)
    z = torch.randn(24, 4, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (24,), generator=gen)
    tau, one = torch.tensor(0.3, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    x = torch.randn(20, 4, generator=gen, dtype=torch.float64)
    ei = torch.randint(0, 20, (2, 60), generator=gen)
    w, dw = (torch.rand(60, generator=gen, dtype=torch.float64) + 0.5 for _ in range(2))
    p = torch.randn(4, generator=gen, dtype=torch.float64)
    refused = "forward-mode AD .* not supported"
    for variant in ("exact", "official"):
        with fwad.dual_level():
            dual = fwad.make_dual(tau, one)
            for backend in ("torch", "attention"):
                with pytest.raises(RuntimeError, match=f"^balanced_contrastive_loss: .*{refused}"):
                    balanced_contrastive_loss(z, y, temperature=dual, variant=variant,
                                              backend=backend)
            with pytest.raises(RuntimeError, match=f"^hierarchical_contrastive_loss: .*{refused}"):
                hierarchical_contrastive_loss(z, [y, y % 2], [None, None], temperature=dual,
                                              variant=variant)
            tangent = fwad.unpack_dual(balanced_contrastive_loss(
                z, y, temperature=dual, variant=variant, backend="reference")).tangent
        eps = 1e-6
        fd = (balanced_contrastive_loss(z, y, temperature=tau + eps, variant=variant,
                                        backend="reference")
              - balanced_contrastive_loss(z, y, temperature=tau - eps, variant=variant,
                                          backend="reference")) / (2 * eps)
        torch.testing.assert_close(tangent, fd, rtol=1e-5, atol=1e-7)
    for backend in ("torch", "reference"):
        with pytest.raises(RuntimeError, match=f"CSRGraph .*{refused}"):
            jvp(functools.partial(gcn_propagate, x, ei, backend=backend), (w,), (dw,))
        pooled_weights = functools.partial(topk_pool, x, ei, p, 0.5, backend=backend)
        with pytest.raises(RuntimeError, match=f"CSRGraph .*{refused}"):
            jvp(lambda w, pool=pooled_weights: pool(w).edge_weight, (w,), (dw,))
