"""Corners of the layer through which compiled and transformed code reaches the ops
(``ops/_custom_ops.py``, ``ops/_custom_graph_ops.py``, ``ops/_amp.py``, ``ops/_host_reads.py``)
that a mutation audit found untested: each test below fails on one small plausible bug there
that every other test let pass. Tiny inputs, ``aot_eager``: the whole file runs in seconds."""
from __future__ import annotations

import pytest
import torch

import hiertail_fast.ops._host_reads as host_reads
from hiertail_fast import balanced_contrastive_loss, gcn_propagate, topk_unpool
from hiertail_fast.graph import CSRGraph
from hiertail_fast.reference.gcn_propagate import gcn_propagate_ref
from tests.test_compile import _compiled, _fresh_dynamo  # noqa: F401  (autouse fixture)


def _unit_rows(n, d, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    z = torch.nn.functional.normalize(torch.randn(n, d, generator=gen, dtype=torch.float64), dim=1)
    y = torch.randint(0, 3, (n,), generator=gen)
    return z.to(dtype), y


def test_exported_loss_with_a_frozen_temperature_tensor_says_why():
    """A loss exported with a temperature TENSOR that did not require grad computes no
    gradient for it; called later with one that does, backward() must raise naming the
    temperature, not leave ``tau.grad`` None silently (z's case is tested in test_compile;
    a mutation audit read the float temperature's flag instead and nothing failed)."""
    z, y = _unit_rows(30, 6)

    class Loss(torch.nn.Module):
        def forward(self, z, tau):
            return balanced_contrastive_loss(z, y, temperature=tau)

    prog = torch.export.export(Loss(), (z.clone().requires_grad_(), torch.tensor(0.5)))
    tau = torch.tensor(0.5, requires_grad=True)
    with pytest.raises(RuntimeError, match="traced .* with temperature not requiring grad"):
        prog.module()(z.clone().requires_grad_(), tau).backward()


def test_compiled_gcn_propagate_on_a_graph_built_inside_keeps_its_direction():
    """A directed CSRGraph built inside the compiled code (no live graph holds its arrays
    when the op runs, so the op rebuilds it from the traced declaration): the gradient
    w.r.t. x is Âᵀ·g of the float64 reference, not Â·g (a mutation audit declared every
    traced CSRGraph symmetric and nothing failed)."""
    n = 7
    ei = torch.tensor([[0, 0, 1, 2, 3, 4, 5, 5, 6], [1, 2, 3, 3, 4, 0, 1, 4, 2]])  # A != Aᵀ
    g = CSRGraph.from_edge_index(ei, None, n)
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(n, 3, generator=gen)
    cot = torch.randn(n, 3, generator=gen)

    def f(x, indptr, indices):
        return gcn_propagate(x, CSRGraph(indptr, indices, None, n, validate=False))

    x = x0.clone().requires_grad_()
    out = _compiled(f)(x, g.indptr.clone(), g.indices.clone())    # copies: no live graph
    (got,) = torch.autograd.grad(out, x, cot)
    x64 = x0.double().requires_grad_()
    (want,) = torch.autograd.grad(gcn_propagate_ref(x64, ei, num_nodes=n), x64, cot.double())
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-6)


def test_a_16bit_input_under_autocast_of_the_other_16bit_dtype_is_not_recast():
    """``_amp``'s rule: only float32 inputs take autocast's dtype; a float16 z under CPU
    bfloat16 autocast is the float16 call outside autocast, bit for bit, not a bfloat16
    one (a mutation audit cast every non-float64 input and nothing failed)."""
    z, y = _unit_rows(64, 16, dtype=torch.float16)
    want = balanced_contrastive_loss(z, y)
    recast = balanced_contrastive_loss(z.to(torch.bfloat16), y)
    assert not torch.equal(recast, want)        # the two casts are distinguishable here
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = balanced_contrastive_loss(z, y)
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_nested_cuda_code_paths_keep_the_outer_switch():
    """``cuda_code_paths`` restores the sync-free switch as it was, not to False: inside an
    outer context, an inner one's exit leaves CPU tensors on the CUDA forms (a mutation
    audit reset it to False and nothing failed)."""
    assert host_reads.host_reads_cheap("cpu")
    with host_reads.cuda_code_paths():
        with host_reads.cuda_code_paths({"HIERTAIL_POSITIVES": "band"}):
            assert not host_reads.host_reads_cheap("cpu")
        assert not host_reads.host_reads_cheap("cpu")
    assert host_reads.host_reads_cheap("cpu")


def test_compiled_graph_ops_check_num_nodes_as_eager():
    """The traced calls' own checks raise the eager errors: a num_nodes that disagrees with
    the CSRGraph (ValueError, not a silent propagation over the graph's own size), a bool
    num_nodes for topk_unpool (TypeError, not read as 1). A mutation audit removed each
    check and nothing failed."""
    x = torch.randn(4, 3)
    g = CSRGraph.from_edge_index(torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]), None, 4)
    with pytest.raises(ValueError, match="num_nodes=7 but the graph has 4 nodes"):
        gcn_propagate(x, g, num_nodes=7)                                  # eager
    with pytest.raises(ValueError, match="num_nodes=7 but the graph has 4 nodes"):
        torch.compile(lambda x: gcn_propagate(x, g, num_nodes=7), backend="aot_eager")(x)
    torch._dynamo.reset()
    perm = torch.tensor([0])
    with pytest.raises(TypeError, match="num_nodes"):
        topk_unpool(x[:1], perm, True)                                    # eager
    with pytest.raises(TypeError, match="num_nodes"):
        torch.compile(lambda x: topk_unpool(x[:1], perm, True), backend="aot_eager")(x)


def test_compiled_loss_gradient_scales_with_the_incoming_gradient():
    """The compiled loss's fused backward multiplies its saved gradients by the incoming
    scalar: (2.5 · loss).backward() gives 2.5× eager's gradient of the loss, for z and the
    prototypes (a mutation audit: dropping grad_loss passed every test seeding 1.0 and was
    caught only by a whole compiled training step)."""
    z0, y = _unit_rows(30, 6, seed=3)
    p0 = torch.nn.functional.normalize(torch.randn(3, 6, generator=torch.Generator()
                                                   .manual_seed(4)), dim=1)

    def f(z, p):
        return balanced_contrastive_loss(z, y, prototypes=p, temperature=0.5)

    z, p = z0.clone().requires_grad_(), p0.clone().requires_grad_()
    got = torch.autograd.grad(2.5 * _compiled(f)(z, p), (z, p))
    z, p = z0.clone().requires_grad_(), p0.clone().requires_grad_()
    want = torch.autograd.grad(f(z, p), (z, p))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, 2.5 * w, rtol=1e-5, atol=1e-7)
