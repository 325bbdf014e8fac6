"""HierTail model: shapes, pool sizes, loss wiring against the references, gradients, BCL labels,
backends, determinism, the official layout against an independent dense re-implementation."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from hiertail_fast.nn.hiertail import (
    HierTail,
    HierTailConfig,
    HierTailOutput,
    prepare_graph,
)
from hiertail_fast.reference.balanced_contrastive_loss import balanced_contrastive_loss_ref
from hiertail_fast.reference.nearest_prototype import nearest_prototype_ref
from hiertail_fast.reference.topk_pool import topk_pool_ref

N, C, FEAT, HID = 61, 7, 12, 16   # ragged sizes: n/C = 8.71 -> k1 = 8, k2 = 4, k3 = 2
CONFIGS = ("paper", "official")


def _tiny_graph(n: int = N, c: int = C, seed: int = 0):
    """Random graph with some class structure: every class non-empty, a few isolated nodes."""
    g = torch.Generator().manual_seed(seed)
    y = torch.cat([torch.arange(c), torch.randint(0, c, (n - c,), generator=g)])
    src = torch.randint(0, n - 3, (4 * n,), generator=g)
    dst = torch.randint(0, n - 3, (4 * n,), generator=g)        # nodes n-3.. stay isolated
    x = torch.randn(n, FEAT, generator=g) + F.one_hot(y, FEAT)[:, :FEAT].float() * 2
    return x, torch.stack([src, dst]), y


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    x, ei, y = _tiny_graph()
    return x, prepare_graph(ei, N), y, torch.arange(0, N, 3)


def _model(name: str, seed: int = 0, **over) -> HierTail:
    torch.manual_seed(seed)
    return HierTail(FEAT, C, HierTailConfig.named(name, hidden=HID, **over))


@pytest.mark.parametrize("name", CONFIGS)
def test_forward_shapes_and_pool_sizes(tiny, name):
    x, g, _, _ = tiny
    out = _model(name)(x, g)
    assert out.logits.shape == (N, C)
    assert out.embedding.shape == (N, HID) and out.hidden.shape == (N, HID)
    if name == "official":
        k1 = math.floor(N / C)
        sizes = [k1, math.ceil(k1 / 2), math.ceil(math.ceil(k1 / 2) / 2)]
    else:
        sizes = [C, math.ceil(C / 2)]
    assert [p.shape for p in out.pooled] == [(k, HID) for k in sizes]
    prev = [N] + sizes
    for perm, k, n_prev in zip(out.perms, sizes, prev, strict=False):
        assert perm.shape == (k,) and perm.dtype == torch.long
        assert int(perm.min()) >= 0 and int(perm.max()) < n_prev
        assert torch.unique(perm).numel() == k


def test_pool_sizes_rules():
    off = HierTailConfig.official()
    assert off.pool_sizes(19793, 70) == [282, 0.5, 0.5]          # Cora-Full, PROTOCOL §3.2
    assert off.pool_sizes(1005, 42) == [23, 0.5, 0.5]            # Email
    # compounding bug (PROTOCOL §3.2): seed s uses (n/C)^s; k1 = n once that exceeds n
    assert off.replace(pool_rescale_power=2).pool_sizes(1005, 42)[0] == 572      # 23.93²
    assert off.replace(pool_rescale_power=3).pool_sizes(1005, 42)[0] == 1005     # Email, seed 3
    assert off.replace(pool_rescale_power=2).pool_sizes(19793, 70)[0] == 19793   # Cora, seed 2
    assert HierTailConfig.paper().pool_sizes(1005, 42) == [42, 21]
    assert HierTailConfig.paper().pool_sizes(100, 7) == [7, 4]


@pytest.mark.parametrize("name", CONFIGS)
def test_loss_finite_and_backward_reaches_every_parameter(tiny, name):
    x, g, y, tr = tiny
    model = _model(name)
    model.train()
    loss = model.loss(model(x, g), y, tr)
    assert torch.isfinite(loss.total)
    loss.total.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", CONFIGS)
def test_loss_matches_reference_composition(tiny, name):
    """total = CE + γ(SCL + Σ BCL) with the dense references on the documented tensors."""
    x, g, y, tr = tiny
    model = _model(name)
    out = model(x, g)
    cfg = model.config
    kw = dict(temperature=cfg.tau, include_self=cfg.include_self, variant=cfg.loss_variant)
    ce = F.cross_entropy(out.logits[tr], y[tr])
    scl_in = out.logits if name == "official" else out.hidden
    scl = balanced_contrastive_loss_ref(scl_in[tr], y[tr], **kw)
    bcl = 0
    if name == "official":
        for i in range(2):   # depth - 1 levels, all-node embeddings vs level i+1, perm labels
            idx = nearest_prototype_ref(out.embedding.detach(), out.pooled[i].detach())
            bcl = bcl + balanced_contrastive_loss_ref(
                out.embedding, out.perms[i][idx], prototypes=out.pooled[i], **kw)
    else:
        blocks = [out.embedding, *out.pooled]
        for i in range(2):
            idx = nearest_prototype_ref(blocks[i].detach(), blocks[i + 1].detach())
            bcl = bcl + balanced_contrastive_loss_ref(blocks[i], idx, prototypes=blocks[i + 1],
                                                      **kw)
    expected = ce + cfg.gamma * (scl + bcl)
    got = model.loss(out, y, tr)
    torch.testing.assert_close(got.total, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.scl, scl, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.bcl, bcl, rtol=1e-4, atol=1e-5)


def _hand_output(n_levels: int) -> HierTailOutput:
    """x⁰ rows near known prototypes; perms chosen so that perm[nearest] != nearest."""
    z = torch.tensor([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 4.9], [-5.0, 5.0], [0.0, 0.2]])
    p1 = torch.tensor([[5.0, 5.0], [0.0, 0.0], [-5.0, 5.0]])     # level-1 prototypes (3 rows)
    p2 = torch.tensor([[-4.0, 4.0], [3.0, 3.0]])                  # level-2 prototypes (2 rows)
    p3 = torch.tensor([[4.0, 4.0]])
    perms = [torch.tensor([2, 0, 4]), torch.tensor([2, 0]), torch.tensor([1])]
    pooled = [p1, p2, p3][:n_levels]
    return HierTailOutput(logits=torch.zeros(6, 3), embedding=z, pooled=pooled,
                          perms=perms[:n_levels], hidden=z)


def test_official_bcl_labels_are_perm_of_argmin_and_fix_changes_them():
    out = _hand_output(3)
    nearest0 = torch.tensor([1, 1, 0, 0, 2, 1])      # argmin over p1 for each row of z
    nearest1 = torch.tensor([1, 1, 1, 1, 0, 1])      # argmin over p2 (x⁰ again, not level 1)
    model = HierTail(2, 3, HierTailConfig.official(hidden=2))
    labels = model.cluster_labels(out)
    assert len(labels) == 2
    assert torch.equal(labels[0], out.perms[0][nearest0])    # = [0, 0, 2, 2, 4, 0]
    assert torch.equal(labels[1], out.perms[1][nearest1])    # = [0, 0, 0, 0, 2, 0]
    fixed = HierTail(2, 3, HierTailConfig.official(hidden=2, fix_cluster_labels=True))
    fixed_labels = fixed.cluster_labels(out)
    assert torch.equal(fixed_labels[0], nearest0) and torch.equal(fixed_labels[1], nearest1)
    assert not torch.equal(fixed_labels[0], labels[0])


def test_paper_bcl_labels_are_nearest_prototype_of_the_next_level():
    out = _hand_output(2)
    labels = HierTail(2, 3, HierTailConfig.paper(hidden=2)).cluster_labels(out)
    assert torch.equal(labels[0], torch.tensor([1, 1, 0, 0, 2, 1]))   # x⁰ vs level 1
    assert torch.equal(labels[1], torch.tensor([1, 1, 0]))            # level 1 vs level 2


def test_fix_cluster_labels_changes_the_official_loss(tiny):
    x, g, y, tr = tiny
    model = _model("official")
    out = model(x, g)
    fixed = copy.deepcopy(model)
    fixed.config = model.config.replace(fix_cluster_labels=True)
    assert not torch.allclose(model.loss(out, y, tr).bcl, fixed.loss(out, y, tr).bcl)


@pytest.mark.parametrize("name", CONFIGS)
def test_reference_backend_matches_default(tiny, name):
    x, g, y, tr = tiny
    fast = _model(name)
    ref = copy.deepcopy(fast)
    ref.config = fast.config.replace(loss_backend="reference")
    losses = []
    for model in (fast, ref):
        loss = model.loss(model(x, g), y, tr)
        loss.total.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0].total, losses[1].total, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses[0].bcl, losses[1].bcl, rtol=1e-5, atol=1e-6)
    for (pname, pf), (_, pr) in zip(fast.named_parameters(), ref.named_parameters(),
                                    strict=True):
        torch.testing.assert_close(pf.grad, pr.grad, rtol=1e-4, atol=1e-6, msg=pname)


@pytest.mark.parametrize("name", CONFIGS)
def test_deterministic_given_seed_and_edge_index_input(tiny, name):
    x, g, y, tr = tiny
    a, b = _model(name, seed=3), _model(name, seed=3)
    out_a, out_b = a(x, g), b(x, g)
    assert torch.equal(out_a.logits, out_b.logits)
    assert all(torch.equal(p, q) for p, q in zip(out_a.perms, out_b.perms, strict=True))
    assert torch.equal(a.loss(out_a, y, tr).total, b.loss(out_b, y, tr).total)
    _, ei, _ = _tiny_graph()
    torch.testing.assert_close(a(x, ei).logits, out_a.logits)   # edge_index input prepared
    assert not torch.equal(_model(name, seed=4)(x, g).logits, out_a.logits)


def test_official_layout_shares_modules_and_counts_parameters():
    off, pap = _model("official"), _model("paper")
    assert len({id(m) for m in off.down}) == 1 and len(off.down) == 3
    assert len({id(m) for m in off.up}) == 2 and off.up[-1].out_channels == C
    assert off.classifier is None
    assert len(list(off.parameters())) == 4 * 2 + 3      # 4 convs (W, b) + 3 projections
    assert len({id(m) for m in pap.down}) == 2 and pap.classifier is not None


def _gcn_dense(x, adj, lin, bias):
    """PyG GCNConv(improved=True) on a dense weighted adjacency: add 2-loops where missing."""
    a = adj.clone()
    missing = a.diagonal() == 0
    a[missing, missing] = 2.0
    dinv = a.sum(1).pow(-0.5)
    dinv[torch.isinf(dinv)] = 0
    return (dinv[:, None] * a * dinv[None, :]) @ (x @ lin.t()) + bias


def _official_dense_forward(model: HierTail, x, ei, n):
    """Independent dense rewrite of the official layers.GraphUNet forward (PROTOCOL §3.3)."""
    adj = torch.zeros(n, n)
    adj[ei[1], ei[0]] = 1.0
    adj = ((adj + adj.t()) > 0).float()
    adj.fill_diagonal_(1.0)                                         # add_sl: unit self-loops

    def conv(m, h, a):
        return _gcn_dense(h, a, m.weight, m.bias)

    h = F.relu(conv(model.embed, x, adj))
    xs, adjs, perms = [h], [adj], []
    sizes = model.config.pool_sizes(n, model.num_classes)
    for i in range(3):
        a = adjs[-1].clone()
        a.fill_diagonal_(0)
        a = a + torch.eye(a.shape[0])
        a = a @ a                                                   # (A + I)²
        a.fill_diagonal_(0)
        src, dst = a.t().nonzero(as_tuple=True)
        pooled, pei, pw, perm, _ = topk_pool_ref(h, torch.stack([src, dst]), model.pools[i].weight,
                                                 sizes[i], a.t()[src, dst])
        k = perm.numel()
        pa = torch.zeros(k, k)
        pa[pei[1], pei[0]] = pw
        h = F.relu(conv(model.down[i], pooled, pa))
        xs.append(h)
        adjs.append(pa)
        perms.append(perm)
    u = xs[-1]
    for step, j in enumerate((2, 1, 0)):
        up = torch.zeros_like(xs[j])
        up[perms[j]] = u
        u = conv(model.up[step], xs[j] + up, adjs[j])
        u = F.relu(u) if j > 0 else u
    return u, xs, perms


def test_official_forward_matches_dense_graph_unet():
    x, ei, _ = _tiny_graph(seed=1)
    model = _model("official", seed=1)
    out = model(x, ei)
    logits, xs, perms = _official_dense_forward(model, x, ei, N)
    for p, q in zip(out.perms, perms, strict=True):
        assert torch.equal(p, q)
    torch.testing.assert_close(out.logits, logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.pooled[0], xs[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_loss_takes_labels_and_indices_of_any_integer_dtype(tiny, dtype):
    # int32 / int16 labels crashed in cross_entropy (int64 targets only), int16 indices in
    # torch's indexing, and uint8 indices were read as a boolean mask; the losses take any
    # integer dtype, so the model does: the same loss as with int64
    x, g, y, tr = tiny
    model = _model("paper")
    out = model(x, g)
    want = model.loss(out, y, tr).total
    assert torch.equal(model.loss(out, y.to(dtype), tr).total, want)
    assert torch.equal(model.loss(out, y, tr.to(dtype)).total, want)


def test_bad_inputs(tiny):
    x, g, y, tr = tiny
    model = _model("paper")
    with pytest.raises(ValueError, match="features"):
        model(x[:, :-1], g)
    with pytest.raises(ValueError, match="nodes"):
        model(x[:-1], g)
    with pytest.raises(TypeError):
        model(x, "graph")
    with pytest.raises(ValueError, match="train_idx"):
        model.loss(model(x, g), y, torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match="tau"):
        HierTailConfig.paper(tau=0.0)
    with pytest.raises(ValueError, match="pool_mode"):
        HierTailConfig.paper(pool_mode="nodes")
    with pytest.raises(ValueError, match="unknown HierTail config"):
        HierTailConfig.named("fast")
    with pytest.raises(TypeError):
        HierTail(FEAT, C, config={"hidden": 8})
