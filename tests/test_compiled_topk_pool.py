"""``topk_pool``'s compiled backward op (``_custom_graph_ops.topk_pool_backward``), where a
mutation audit (s43) found no test pinned down: the gradient that reaches the score weight
through the returned SCORE on the reference backend (the op reruns the reference and reads
its score), and a compiled call where only the score weight requires grad (the op's
``grads_of`` then asks for p's gradient alone). Eager's values, bit for bit on CPU."""
from __future__ import annotations

import pytest
import torch

from hiertail_fast import topk_pool
from hiertail_fast.graph import CSRGraph
from tests.conftest import DEVICES
from tests.test_compile import _compiled, _fresh_dynamo, _same  # noqa: F401  (autouse fixture)


def _pool_data(dev, n=40, d=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    p = torch.randn(d, generator=gen, dtype=torch.float64)
    g = CSRGraph.from_edge_index(torch.randint(0, n, (2, 4 * n), generator=gen), num_nodes=n)
    w_x = torch.randn(n // 2, d, generator=gen, dtype=torch.float64)
    w_s = torch.randn(n // 2, generator=gen, dtype=torch.float64)
    return x.to(dev), p.to(dev), g.to(dev), w_x.to(dev), w_s.to(dev)


def _grads(f, x, p, wanted):
    """The gradients of f(x, p) w.r.t. the tensors of ``wanted`` (names: "x", "p")."""
    xx = x.clone().requires_grad_("x" in wanted)
    pp = p.clone().requires_grad_("p" in wanted)
    out = f(xx, pp)
    leaves = [t for name, t in (("x", xx), ("p", pp)) if name in wanted]
    return out.detach(), torch.autograd.grad(out, leaves)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("backend", ["torch", "reference"])
@pytest.mark.parametrize("wanted", [("x", "p"), ("p",), ("x",)])
def test_compiled_pool_gradients_through_the_score(dev, backend, wanted):
    """A loss of the pooled rows AND the returned score (as PyG's users weight by it),
    compiled whole: the gradients w.r.t. x and/or the score weight are eager's. On the
    reference backend a backward op reading another output than the score, or (only p
    requiring grad) a ``grads_of`` taken from x's flag, gave wrong or missing gradients
    and passed every test (their losses used the pooled rows alone, x always requiring
    grad)."""
    x, p, g, w_x, w_s = _pool_data(dev)

    def f(x, p):
        r = topk_pool(x, g, p, 0.5, backend=backend)
        return (r.x * w_x).sum() + (r.score * w_s).sum()

    got_v, got_g = _grads(_compiled(f), x, p, wanted)
    want_v, want_g = _grads(f, x, p, wanted)
    _same(got_v, want_v, dev)
    assert len(got_g) == len(want_g) == len(wanted)
    for a, b in zip(got_g, want_g, strict=True):
        assert a is not None and bool(b.abs().sum() > 0)
        _same(a, b, dev)


def test_compiled_pool_only_the_score_weight_learns():
    """x as data (no grad), p a parameter: the compiled backward op computes p's gradient
    (not x's) and it equals eager's; x gets none."""
    x, p, g, _, w_s = _pool_data("cpu", seed=1)
    pp = p.clone().requires_grad_()

    def f(x, p):
        return (topk_pool(x, g, p, 0.5).score * w_s).sum()

    loss = _compiled(f)(x, pp)
    (got,) = torch.autograd.grad(loss, pp)
    (want,) = torch.autograd.grad(f(x, pp), pp)
    assert not x.requires_grad and bool(want.abs().sum() > 0)
    _same(got, want, "cpu")


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_compiled_pool_of_an_empty_graph_is_eagers(backend):
    """No nodes and a float ratio: eager keeps k = 0 nodes (empty results, zero gradient for
    the score weight). Compiled, the op handed k = 0 to the eager op as an integer ratio, a
    node count that must be >= 1: a ValueError from a valid input."""
    x = torch.zeros(0, 3, dtype=torch.float64, requires_grad=True)
    p = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    g = CSRGraph.from_edge_index(torch.zeros(2, 0, dtype=torch.long), num_nodes=0)

    def f(x, p):
        r = topk_pool(x, g, p, 0.5, backend=backend)
        return r.x.sum() + r.score.sum(), r.perm

    (got, perm_c), (want, perm_e) = _compiled(f)(x, p), f(x, p)
    assert perm_c.shape == perm_e.shape == (0,)
    _same(got, want, "cpu")
    for a, b in zip(torch.autograd.grad(got, (x, p)), torch.autograd.grad(want, (x, p)),
                    strict=True):
        _same(a, b, "cpu")
