"""GraphENS in linear memory: the hashed Gumbel noise, the sparse mixed neighbour distributions
and neighbour sampling against the official dense n×n construction (same seed -> same nodes),
Gumbel-top-k's draw frequencies, the saliency mask, the pair sampling, the warmup switch and a
whole post-warmup training loss against a dense recomputation."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hiertail_fast.baselines import BaselineConfig, MethodContext, build_method
from hiertail_fast.baselines import graphens as ge
from hiertail_fast.baselines.sampling import _gather_rows
from hiertail_fast.data.synthetic import make_synthetic_graph
from hiertail_fast.nn.hiertail import prepare_graph

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    g = make_synthetic_graph(80, num_classes=4, avg_degree=6, num_features=20, seed=4)
    return g, prepare_graph(g.edge_index, g.num_nodes)


def _model(g, graph, seed=7, **kw):
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:k] for c, k in enumerate((9, 5, 2, 1))])
    cfg = BaselineConfig(method="graphens", hidden=8, dropout=0.0, **kw)
    ctx = MethodContext(g.x, g.y, graph, train, 4, torch.Generator().manual_seed(seed))
    return build_method(ctx, cfg).train()


def test_hashed_gumbel_is_a_function_of_the_pair():
    a, b = torch.arange(300)[:, None], torch.arange(200)[None, :]
    full = ge.hashed_gumbel(5, a, b)
    sub = ge.hashed_gumbel(5, torch.tensor([7, 250, 7]), torch.tensor([3, 199, 3]))
    torch.testing.assert_close(sub, full[[7, 250, 7], [3, 199, 3]], rtol=0, atol=0)
    assert not torch.equal(full, ge.hashed_gumbel(6, a, b))
    # Gumbel(0, 1): mean = Euler's γ, variance = π²/6 (60,000 draws: ±0.02 is > 3 sigma)
    assert abs(full.mean().item() - 0.5772) < 0.02
    assert abs(full.var().item() - torch.pi ** 2 / 6) < 0.05


def test_hashed_gumbel_equals_an_independent_python_lowbias32():
    # the documented draw, recomputed in plain Python integers: h = lowbias32 over (seed, a, b),
    # u = (h + 0.5) / 2^32 in (0, 1), g = -log(-log u). Without the + 0.5 every value moved by
    # ~1e-9 and h = 0 gave -inf, with every test passing (mutation audit, session 69)
    import math

    def mix(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    pairs = [(0, 0), (1, 2), (7, 3), (2**32 - 1, 12345)]
    got = ge.hashed_gumbel(5, torch.tensor([a for a, _ in pairs]),
                           torch.tensor([b for _, b in pairs])).tolist()
    for (a, b), g in zip(pairs, got, strict=True):
        h = mix(mix(mix(5) ^ a) ^ b)
        assert g == -math.log(-math.log((h + 0.5) / 2.0**32)), (a, b)


def test_grouped_topk_hand_computed():
    group = torch.tensor([1, 0, 1, 1, 0, 2])
    keys = torch.tensor([0.5, 2.0, 3.0, -1.0, 1.0, 0.0], dtype=torch.float64)
    sel = ge.grouped_topk(group, keys, torch.tensor([1, 2, 0]))
    assert sel.tolist() == [1, 2, 0]          # group 0: its best; group 1: its two best; 2: none


def _pairs(graph, s=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(graph.num_nodes, (s,), generator=gen)
    dst = torch.randint(graph.num_nodes, (s,), generator=gen)
    w = torch.rand(s, generator=gen)
    return src, dst, w, 1.0 - w


def test_mixed_distribution_matches_the_dense_rows(tiny):
    _, graph = tiny
    nbrs = graph.remove_self_loops()
    src, dst, ws, wd = _pairs(graph)
    i, j, p = ge.mixed_neighbour_distribution(nbrs, src, dst, ws, wd)
    dist = ge.neighbour_distribution_dense(nbrs)
    dense = ws[:, None] * dist[src] + wd[:, None] * dist[dst]
    sparse = torch.zeros_like(dense)
    sparse[i, j] = p
    torch.testing.assert_close(sparse, dense, rtol=0, atol=0)
    assert torch.equal((dense > 0).sum(), torch.tensor(p.numel()))        # exactly the support
    torch.testing.assert_close(dense.sum(1), torch.ones(src.numel()))


def test_sampled_neighbours_are_the_dense_references(tiny):
    _, graph = tiny
    nbrs = graph.remove_self_loops()
    deg = nbrs.indptr[1:] - nbrs.indptr[:-1]
    src, dst, ws, wd = _pairs(graph, s=60, seed=1)
    d = torch.minimum(torch.randint(0, int(deg.max()) + 1, (60,)), deg[src])
    dist = ge.neighbour_distribution_dense(nbrs)
    for seed in (0, 11):
        i, j = ge.sample_neighbours(nbrs, src, dst, ws, wd, d, seed)
        ri, rj = ge.sample_neighbours_dense(dist, src, dst, ws, wd, d, seed)
        assert torch.equal(i, ri) and torch.equal(j, rj)          # same nodes, same draw order
    assert torch.equal(torch.bincount(i, minlength=60), d)
    support = (dist[src] + dist[dst]) > 0
    assert support[i, j].all()
    pairs = set(zip(i.tolist(), j.tolist(), strict=True))
    assert len(pairs) == i.numel()                                 # without replacement
    other = ge.sample_neighbours(nbrs, src, dst, ws, wd, d, 12)[1]
    assert not torch.equal(j, other)


def test_gumbel_top_k_draws_in_proportion(tiny):
    # one synthetic node's distribution repeated 6,000 times: the first draw's frequencies
    # are the mixture's probabilities, the second draw is never the first
    _, graph = tiny
    nbrs = graph.remove_self_loops()
    deg = nbrs.indptr[1:] - nbrs.indptr[:-1]
    a, b = int(torch.nonzero(deg == 3)[0]), int(torch.nonzero(deg >= 4)[0])
    m = 6000
    src, dst = torch.full((m,), a), torch.full((m,), b)
    ws, wd = torch.full((m,), 0.7), torch.full((m,), 0.3)
    i, j = ge.sample_neighbours(nbrs, src, dst, ws, wd, torch.full((m,), 2), seed=3)
    first, second = j[0::2], j[1::2]
    assert (first != second).all()
    ref = ge.neighbour_distribution_dense(nbrs)
    p = 0.7 * ref[a] + 0.3 * ref[b]
    freq = torch.bincount(first, minlength=graph.num_nodes).double() / m
    assert (freq - p.double()).abs().max() < 4 * (0.25 / m) ** 0.5      # 4 sigma


def test_saliency_mask_takes_the_salient_features_from_the_source():
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    src, dst = torch.tensor([0, 1]), torch.tensor([2, 3])
    lam = torch.tensor([0.25, 0.5])
    plain = ge.saliency_mixup(x, src, dst, lam)
    torch.testing.assert_close(plain, lam[:, None] * x[src] + (1 - lam[:, None]) * x[dst])
    sal = torch.zeros(4, 6)
    sal[2, 4] = sal[3, 1] = 1.0                 # each destination has one salient feature
    out = ge.saliency_mixup(x, src, dst, lam, sal, keep_prob=1 / 6, seed=2)     # K = 1
    expect = plain.clone()
    expect[0, 4], expect[1, 1] = x[0, 4], x[1, 1]
    torch.testing.assert_close(out, expect)
    assert torch.equal(ge.saliency_mixup(x, src, dst, lam, sal, keep_prob=0.1), plain)   # K = 0


def test_kl_keeps_the_first_sigmoid_share_of_the_draws():
    x, src, dst = torch.randn(5, 40), torch.tensor([0, 1, 2]), torch.tensor([3, 4, 3])
    sal, lam = torch.rand(5, 40), torch.full((3,), 0.5)
    kl = torch.tensor([0.0, 3.0, 100.0])                  # σ(KL/3)·8 -> 4, 5, 8 features
    out = ge.saliency_mixup(x, src, dst, lam, sal, kl, keep_prob=0.2, seed=9)
    g = sal[dst] + 1e-10
    keys = torch.log((g / g.sum(1, keepdim=True)).double()) + ge.hashed_gumbel(
        9, torch.arange(3)[:, None], torch.arange(40)[None, :])
    order = keys.topk(8, dim=1).indices
    for r, keep in enumerate((4, 5, 8)):
        from_src = torch.isclose(out[r], x[src[r]]) & ~torch.isclose(x[src[r]], x[dst[r]])
        assert set(torch.nonzero(from_src).flatten().tolist()) == set(order[r, :keep].tolist())


def test_pairs_balance_every_class_to_the_largest(tiny):
    g, graph = tiny
    m = _model(g, graph)
    assert m.num_synthetic == (9 - 5) + (9 - 2) + (9 - 1)
    src, dst, lam = m.sample_pairs()
    assert torch.equal(src, src.sort().values)
    assert torch.bincount(g.y[src], minlength=4).tolist() == [0, 4, 7, 8]
    train = set(m.ctx.train_idx.tolist())
    assert set(src.tolist()) <= train and set(dst.tolist()) <= train
    assert (g.y[dst] != 3).all()                           # log(1)/1 = 0: never a destination
    assert ((lam > 0) & (lam < 1)).all()
    again = _model(g, graph).sample_pairs()
    assert all(torch.equal(u, v) for u, v in zip((src, dst, lam), again, strict=True))   # same seed


def test_training_loss_after_warmup_matches_a_dense_recomputation(tiny):
    g, graph = tiny
    m = _model(g, graph, keep_prob=0.1)                         # K = 2 of 20 features
    m.train_loss().backward()                                   # warmup step
    assert m._saliency is not None and m._saliency.shape == g.x.shape
    state = m.ctx.generator.get_state()
    prev, sal = m._prev_logits.clone(), m._saliency.clone()
    loss = m.train_loss()
    # the same step, densely: the same draws from the same generator state
    m.ctx.generator.set_state(state)
    src, dst, lam = m.sample_pairs()
    seed_nb, seed_sal = torch.randint(0, 2**31 - 1, (2,), generator=m.ctx.generator).tolist()
    n, s = g.num_nodes, m.num_synthetic
    a = torch.zeros(n, n)
    a[graph.row_index(), graph.indices] = 1.0
    mean = a / a.sum(1, keepdim=True)
    p = F.softmax(mean @ prev / 2.0, dim=1)
    kl = (p[src] * (p[src].log() - p[dst].log())).sum(1).clamp_min(0)
    w_src = 1.0 / (1.0 + torch.exp(-kl))
    d = torch.multinomial(m.degree_hist, s, replacement=True, generator=m.ctx.generator)
    d = torch.minimum(d, m.deg[src])
    dist = ge.neighbour_distribution_dense(graph.remove_self_loops())
    i, j = ge.sample_neighbours_dense(dist, src, dst, w_src, 1 - w_src, d, seed_nb)
    assert i.numel() > 0 and not torch.equal(d, m.deg[src])     # sampled, capped degrees
    big = torch.zeros(n + s, n + s)
    big[:n, :n] = a
    big[n + i, j] = 1.0
    big[n + torch.arange(s), n + torch.arange(s)] = 1.0
    x_all = torch.cat([g.x, ge.saliency_mixup(g.x, src, dst, lam, sal, kl, 0.1, seed_sal)])
    out = m(x_all, big / big.sum(1, keepdim=True))
    idx = torch.cat([m.ctx.train_idx, n + torch.arange(s)])
    expect = F.cross_entropy(out[idx], torch.cat([g.y, g.y[src]])[idx])
    torch.testing.assert_close(loss, expect, rtol=1e-5, atol=1e-6)
    assert m.steps == 2


def test_warmup_copies_the_sources_neighbours_and_saliency_is_the_input_gradient(tiny):
    g, graph = tiny
    m = _model(g, graph, warmup_epochs=3)
    state = m.ctx.generator.get_state()
    loss = m.train_loss()
    m.ctx.generator.set_state(state)
    src, dst, lam = m.sample_pairs()
    n = g.num_nodes
    k, col, _ = _gather_rows(graph.remove_self_loops(), src)
    x_all = torch.cat([g.x, lam[:, None] * g.x[src] + (1 - lam[:, None]) * g.x[dst]])
    x_all.requires_grad_(True)
    a = torch.zeros(n + src.numel(), n + src.numel())
    a[graph.row_index(), graph.indices] = 1.0
    a[n + k, col] = 1.0
    a[n + torch.arange(src.numel()), n + torch.arange(src.numel())] = 1.0
    out = m(x_all, a / a.sum(1, keepdim=True))
    idx = torch.cat([m.ctx.train_idx, n + torch.arange(src.numel())])
    expect = F.cross_entropy(out[idx], torch.cat([g.y, g.y[src]])[idx])
    torch.testing.assert_close(loss, expect, rtol=1e-5, atol=1e-6)
    loss.backward()
    (grad,) = torch.autograd.grad(expect, x_all)
    torch.testing.assert_close(m._saliency, grad[:n])


def test_predict_ignores_synthetic_nodes_and_weight_decay_groups(tiny):
    g, graph = tiny
    m = _model(g, graph).eval()
    a = torch.zeros(g.num_nodes, g.num_nodes)
    a[graph.row_index(), graph.indices] = 1.0
    with torch.no_grad():
        torch.testing.assert_close(m.predict(), m(g.x, a / a.sum(1, keepdim=True)))
    conv, lin = m.param_groups()
    assert "weight_decay" not in conv and lin["weight_decay"] == 0.0
    assert len(conv["params"]) == 4 and len(lin["params"]) == 2
    info = m.info()
    assert info["num_synthetic_per_epoch"] == 19 and "warmup" in info["schedule"]


def test_pairs_do_not_depend_on_the_order_of_the_training_ids(tiny):
    """Each class's sources are its training nodes by ascending id (official idx_info), so a
    shuffled train_idx draws the same pairs; info reports the saliency mask's ⌊F·keep_prob⌋."""
    g, graph = tiny
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:k] for c, k in enumerate((9, 5, 2, 1))])
    cfg = BaselineConfig(method="graphens", hidden=8, dropout=0.0, keep_prob=0.17)
    pairs = []
    for ids in (train, train.flip(0), train[torch.randperm(train.numel(),
                                                            generator=torch.Generator().manual_seed(2))]):
        ctx = MethodContext(g.x, g.y, graph, ids, 4, torch.Generator().manual_seed(7))
        m = build_method(ctx, cfg)
        pairs.append(m.sample_pairs())
    for other in pairs[1:]:
        assert all(torch.equal(u, v) for u, v in zip(pairs[0], other, strict=True))
    assert m.info()["saliency_features_kept"] == 3                 # ⌊20 · 0.17⌋


def test_dropout_only_in_training_mode(tiny):
    """The dropout before the Linear layer is off in eval mode: predict() is deterministic and
    equals the dropout-free forward."""
    g, graph = tiny
    m = _model(g, graph).eval()
    m.cfg = m.cfg.replace(dropout=0.9)
    a = torch.zeros(g.num_nodes, g.num_nodes)
    a[graph.row_index(), graph.indices] = 1.0
    x = g.x
    with torch.no_grad():
        for conv in m.convs:
            x = F.relu(conv(x, a / a.sum(1, keepdim=True)))
        torch.testing.assert_close(m.predict(), m.linear(x))
        m.train()
        assert not torch.allclose(m.predict(), m.linear(x))


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(keep_prob=0.0), ValueError, "keep_prob"),
    (dict(keep_prob=1.5), ValueError, "keep_prob"),
    (dict(pred_temp=0.0), ValueError, "pred_temp"),
    (dict(warmup_epochs=0), ValueError, "warmup_epochs"),
    (dict(warmup_epochs=1.0), TypeError, "warmup_epochs"),
    (dict(keep_prob="0.1"), TypeError, "keep_prob"),
])
def test_graphens_bad_configs(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        BaselineConfig(method="graphens", **kwargs)


def test_graphens_defaults_are_the_official_ones():
    d = BaselineConfig(method="graphens").to_dict()
    assert (d["hidden"], d["keep_prob"], d["pred_temp"], d["warmup_epochs"]) == (256, 0.01, 2.0, 1)
    assert (d["lr"], d["weight_decay"], d["dropout"]) == (0.01, 5e-4, 0.5)
    assert "adj_norm" not in d and BaselineConfig().hidden == 64


def test_graphens_runs_on_every_device(tiny, device):
    g, graph = tiny
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:k] for c, k in enumerate((9, 5, 2, 1))])
    ctx = MethodContext(g.x.to(device), g.y.to(device), graph.to(device), train.to(device), 4,
                        torch.Generator().manual_seed(1))
    m = build_method(ctx, BaselineConfig(method="graphens", hidden=8, keep_prob=0.1)).to(device)
    for _ in range(3):                                   # warmup, then sampling + saliency
        m.train_loss().backward()
    assert m.predict().shape == (g.num_nodes, 4) and m._saliency.device.type == device
