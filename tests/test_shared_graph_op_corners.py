"""Pooling, nearest prototype and propagation where the reference and the backends share code
(so the backend-vs-reference tests cannot see a fault there) or where one path of several was
never reached: corners the mutation audit of 2026-12-03 found unchecked (each test failed on
the mutant it describes, passes on main).

- topk_pool's k = ceil(ratio·n) in the scores' dtype (30 in float64, 31 in float32 at ratio
  0.3, n = 100), eager and compiled alike.
- score = tanh(x·p/‖p‖) for a score weight with no positive entry (``score_direction`` scales
  p by max|p|: by max(p) the scores flip sign or turn 0/0).
- ``pow2_rescale`` brings max |entry| into range, negative entries included (else all
  distances inf and prototype 0 for every row).
- all-zero rows and prototypes (dead ReLUs): prototype 0 on every path, the native kernels off
  too (a zero gap goes to the near-tie refinement).
- the 16-bit reference propagates in float32 and rounds once; the torch backend within one
  rounding of the exact value.
- an inference-mode score weight with learnable features: ``_autograd.saveable`` copies it
  (autograd refuses to save inference tensors).
"""
from __future__ import annotations

import pytest
import torch

from hiertail_fast import topk_pool
from hiertail_fast.graph import CSRGraph
from hiertail_fast.ops.gcn_propagate import gcn_propagate
from hiertail_fast.ops.nearest_prototype import nearest_prototype
from hiertail_fast.reference.gcn_propagate import gcn_propagate_ref
from hiertail_fast.reference.nearest_prototype import nearest_prototype_ref
from hiertail_fast.reference.topk_pool import pool_size, topk_pool_ref

NO_EDGES = torch.zeros(2, 0, dtype=torch.long)


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("dtype,k", [(torch.float64, 30), (torch.float32, 31)])
def test_pool_size_follows_the_feature_dtype(backend, dtype, k):
    x = torch.randn(100, 3, dtype=dtype)
    p = torch.randn(3, dtype=dtype)
    assert pool_size(100, 0.3, dtype) == k
    r = topk_pool(x, NO_EDGES, p, 0.3, backend=backend)
    assert r.perm.numel() == k and r.x.shape == (k, 3) and r.score.shape == (k,)
    assert torch.equal(r.perm, topk_pool_ref(x, NO_EDGES, p, 0.3)[3])


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("dtype,k", [(torch.float64, 30), (torch.float32, 31)])
def test_compiled_pooling_keeps_the_eager_pool_size(dtype, k):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(100, 4, generator=gen, dtype=dtype)
    p = torch.randn(4, generator=gen, dtype=dtype)
    g = CSRGraph.from_edge_index(torch.randint(0, 100, (2, 300), generator=gen), num_nodes=100)

    def pool(x, p):
        r = topk_pool(x, g, p, 0.3)
        return r.x, r.perm

    eager = pool(x, p)
    compiled = torch.compile(pool, backend="aot_eager", fullgraph=True)(x, p)
    assert eager[1].numel() == k
    assert torch.equal(compiled[1], eager[1]) and torch.equal(compiled[0], eager[0])


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("p", [[-1.0, -2.0, -0.5], [-3.0, 0.0, -1.0], [0.0, -1.0, 0.0]])
def test_scores_for_score_weights_without_a_positive_entry(backend, p):
    x = torch.randn(20, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p = torch.tensor(p, dtype=torch.float64)
    want = torch.tanh(x @ p / p.norm())
    r = topk_pool(x, NO_EDGES, p, 0.5, backend=backend)
    torch.testing.assert_close(r.score, want[r.perm], rtol=1e-12, atol=1e-12)
    assert torch.equal(r.perm, torch.sort(want, descending=True, stable=True).indices[:10])
    torch.testing.assert_close(topk_pool_ref(x, NO_EDGES, p, 0.5)[4], r.score)


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_large_negative_entries_are_rescaled(backend):
    z = torch.tensor([[-1.0e20, 1.0], [1.0, 2.0]])
    protos = torch.tensor([[-1.5e20, 1.0], [-1.2e20, 1.0], [1.0, 2.5]])
    # float64 truth: row 0 is 2e19 from prototype 1 (5e19 from 0), row 1 next to prototype 2
    assert torch.cdist(z.double(), protos.double()).argmin(1).tolist() == [1, 2]
    assert nearest_prototype(z, protos, backend=backend).tolist() == [1, 2]
    assert nearest_prototype_ref(z, protos).tolist() == [1, 2]


@pytest.mark.parametrize("native", ["0", "1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_all_zero_inputs_pick_prototype_0_on_every_path(monkeypatch, native, dtype):
    monkeypatch.setenv("HIERTAIL_NATIVE", native)
    z, p = torch.zeros(7, 16, dtype=dtype), torch.zeros(40, 16, dtype=dtype)
    assert nearest_prototype(z, p, backend="torch").tolist() == [0] * 7


def _weighted_graph(n: int, e: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, e), generator=g), torch.rand(e, generator=g) + 0.1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reference_16bit_is_float32_rounded_once(dtype):
    ei, w = _weighted_graph(60, 400, seed=0)
    x = torch.randn(60, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    got = gcn_propagate_ref(x, ei, w.to(dtype))
    assert got.dtype == dtype
    assert torch.equal(got, gcn_propagate_ref(x.float(), ei, w.to(dtype).float()).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_torch_backend_16bit_within_one_rounding_of_the_exact_value(dtype):
    ei, w = _weighted_graph(60, 400, seed=3)
    x = torch.randn(60, 16, generator=torch.Generator().manual_seed(4)).to(dtype)
    ref = gcn_propagate_ref(x, ei, w.to(dtype))
    exact = gcn_propagate_ref(x.double(), ei, w.to(dtype).double())
    ours = gcn_propagate(x, ei, w.to(dtype), backend="torch")
    # both rounded once from (nearly) the exact value: each within one ulp of it
    ulp = torch.finfo(dtype).eps * exact.abs().clamp_min(torch.finfo(dtype).tiny)
    assert ((ref.double() - exact).abs() <= ulp).all()
    assert ((ours.double() - exact).abs() <= ulp).all()


def test_topk_pool_trains_with_a_score_weight_made_in_inference_mode():
    # (x itself made in inference mode with a learnable score weight: the reference cannot run
    # either, autograd refuses to save x there, so that case has nothing to compare with)
    gen = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 10, (2, 30), generator=gen)
    with torch.inference_mode():
        x_inf, w_inf = torch.randn(10, 4, generator=gen), torch.randn(4, generator=gen)
    learn = x_inf.clone()
    grads = []
    for backend in ("torch", "reference"):
        leaf = learn.detach().clone().requires_grad_(True)
        topk_pool(leaf, ei, w_inf, 0.5, backend=backend).x.pow(2).sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[0], grads[1])
