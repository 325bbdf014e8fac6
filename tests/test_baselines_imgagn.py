"""ImGAGN, multi-class, in linear memory: the generator, the generated nodes' features, labels
and edges (sparse graph against the official dense add_edges), the discriminator / generator
alternation on the harness's epochs with one Adam, the faithful detached generator gradient and
its fix, the best state restoring the generated nodes, bad configurations."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hiertail_fast.baselines import BaselineConfig, MethodContext, build_method
from hiertail_fast.baselines import imgagn as ig
from hiertail_fast.baselines.layers import adjacency_operator
from hiertail_fast.data.synthetic import make_synthetic_graph
from hiertail_fast.nn.hiertail import prepare_graph

pytestmark = pytest.mark.usefixtures("one_thread")
COUNTS = (8, 5, 3, 1, 0)        # training nodes per class; class 4 has none


@pytest.fixture(scope="module")
def tiny():
    g = make_synthetic_graph(90, num_classes=5, avg_degree=5, num_features=6, seed=2)
    return g, prepare_graph(g.edge_index, g.num_nodes)


def _model(g, graph, seed=3, **kw):
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:k] for c, k in enumerate(COUNTS)])
    kw = {"hidden": 8, "dropout": 0.0, "im_class_num": 3, **kw}
    ctx = MethodContext(g.x, g.y, graph, train, 5, torch.Generator().manual_seed(seed))
    return build_method(ctx, BaselineConfig(method="imgagn", **kw)).train()


def _dense_adj(graph, n):
    a = torch.zeros(n, n)
    a[graph.row_index(), graph.indices] = 1.0
    return a.fill_diagonal_(0.0)


def test_generator_outputs_weights_in_the_unit_interval():
    g = ig.Generator(7)
    out = g(torch.randn(11, ig.NOISE_DIM))
    assert out.shape == (11, 7) and ((out > 0) & (out < 1)).all()
    assert [m.out_features for m in (g.fc1, g.fc2, g.fc3)] == [200, 200, 7]


def test_generated_nodes_count_labels_and_features(tiny):
    g, graph = tiny
    m = _model(g, graph, gen_ratio=1.0)
    # tail = classes 4, 3, 2: class 4 has no training node, 3 and 2 get 8 − n_c each
    assert [(c, s) for c, _, s in m.blocks] == [(3, 7), (2, 5)] and m.num_synthetic == 12
    train = m.ctx.train_idx.sort().values
    assert all(torch.equal(nodes, train[g.y[train] == c]) for c, nodes, _ in m.blocks)
    m.generate()
    x_aug, _, labels = m.augmented()
    assert labels.tolist() == [3] * 7 + [2] * 5
    n = g.num_nodes
    for (_, nodes, _), a, lo in zip(m.blocks, m.gen_weights(), (n, n + 7), strict=True):
        torch.testing.assert_close(a.sum(1), torch.ones(a.shape[0]))
        torch.testing.assert_close(x_aug[lo:lo + a.shape[0]], a @ g.x[nodes])
    assert _model(g, graph, gen_ratio=0.5).num_synthetic == (4 - 3) + (4 - 1)   # ⌊0.5·8⌋ − n_c


def test_generated_graph_matches_the_official_dense_build(tiny):
    g, graph = tiny
    m = _model(g, graph)
    m.generate()
    owners = [nodes for _, nodes, _ in m.blocks]
    ws = m.gen_weights()
    ws[1][0] = torch.tensor([0.4, 0.35, 0.25])           # a hand-made row: 2 of 3 above 1/3
    sparse = ig.generated_graph(m.struct, owners, ws)
    dense = ig.generated_graph_dense(_dense_adj(graph, g.num_nodes), owners, ws)
    torch.testing.assert_close(adjacency_operator(sparse, "row").to_dense(), dense)
    n = g.num_nodes
    row = sparse.indices[sparse.indptr[n + 7]:sparse.indptr[n + 8]]
    assert sorted(row.tolist()) == sorted([int(owners[1][0]), int(owners[1][1]), n + 7])
    assert (dense[n:n + 7, :n] == 0).all()           # class 3 has one training node: no edge
    # a class of one training node: the weight is 1 = 1/n_c, never above it: no edge
    lone = ig.generated_graph(m.struct, [owners[0][:1]], [torch.ones(2, 1)])
    assert lone.num_edges == graph.num_edges + 2


def _adam_step(m, opt):
    opt.zero_grad(set_to_none=True)
    m.train_loss().backward()
    opt.step()


def test_alternation_updates_one_side_per_epoch(tiny):
    g, graph = tiny
    m = _model(g, graph, disc_steps=2)
    opt = torch.optim.Adam(m.param_groups(), lr=0.01, weight_decay=5e-4)

    def snap(mod):
        return [p.detach().clone() for p in mod.parameters()]

    def same(a, b):
        return all(torch.equal(u, v) for u, v in zip(a, b, strict=True))

    for epoch in range(7):
        d0, g0, w0 = snap(m.disc), snap(m.generators), [w.clone() for w in m.gen_weights()]
        _adam_step(m, opt)
        d_step = epoch % 3 != 2
        assert same(d0, snap(m.disc)) != d_step
        assert same(g0, snap(m.generators)) == d_step
        new_cycle = epoch % 3 == 0
        assert all(torch.equal(u, v) for u, v in zip(w0, m.gen_weights(), strict=True)) \
            != new_cycle
    assert (m.discriminator_steps, m.generator_steps) == (5, 2)
    info = m.info()
    assert info["generator_steps"] == 2 and "3 harness epochs" in info["schedule"]


def _dense_disc_loss(m, g, graph):
    """The D step's loss computed densely from the model's current generated nodes: class and
    real/fake cross-entropy over the training nodes and the 12 generated ones (7 of class 3,
    5 of class 2 on the ``tiny`` graph)."""
    owners, ws = [nodes for _, nodes, _ in m.blocks], m.gen_weights()
    adj = ig.generated_graph_dense(_dense_adj(graph, g.num_nodes), owners, ws)
    x = torch.cat([g.x] + [a @ g.x[o] for o, a in zip(owners, ws, strict=True)])
    cls, rf = m.disc(x, adj)
    n, t = g.num_nodes, m.ctx.train_idx
    idx = torch.cat([t, n + torch.arange(12)])
    y = torch.cat([g.y[t], torch.tensor([3] * 7 + [2] * 5)])
    fake = torch.cat([torch.zeros(t.numel()), torch.ones(12)]).long()
    return F.cross_entropy(cls[idx], y) + F.cross_entropy(rf[idx], fake)


def test_discriminator_loss_is_the_dense_computation(tiny):
    g, graph = tiny
    m = _model(g, graph)
    loss = m.train_loss()                                   # epoch 0: generate + D step
    torch.testing.assert_close(loss, _dense_disc_loss(m, g, graph))


@pytest.mark.parametrize("adv", [False, True])
def test_generator_gradient_faithful_and_fixed(tiny, adv):
    g, graph = tiny
    m = _model(g, graph, disc_steps=1, gen_adv_grad=adv)
    m.train_loss()                                            # generate + D step
    m.zero_grad(set_to_none=True)
    m.train_loss().backward()                                 # G step on the same z
    assert all(p.grad is None for p in m.disc.parameters())
    got = [p.grad.clone() for p in m.generators.parameters()]
    # the distance term alone
    m.zero_grad(set_to_none=True)
    dist = sum(ig.euclidean_dist(g.x[nodes], F.softmax(gen(z), 1) @ g.x[nodes]).mean()
               for (_, nodes, _), gen, z in zip(m.blocks, m.generators, m._z, strict=True))
    dist.backward()
    only_dist = [p.grad for p in m.generators.parameters()]
    same = all(torch.allclose(a, b, atol=1e-7) for a, b in zip(got, only_dist, strict=True))
    assert same != adv
    # the generated weights of the cycle came from that z
    torch.testing.assert_close(m.gen_weights()[0], F.softmax(m.generators[0](m._z[0]), 1))


def test_euclidean_dist_and_isolated_discriminator():
    x, y = torch.randn(4, 3), torch.randn(5, 3)
    torch.testing.assert_close(ig.euclidean_dist(x, y), torch.cdist(x, y), atol=1e-5, rtol=1e-5)
    d = ig.Discriminator(3, 6, 4, 0.0).eval()
    cls, rf = d.alone(x)
    ref_cls, ref_rf = d(x, torch.eye(4))
    torch.testing.assert_close(cls, ref_cls)
    torch.testing.assert_close(rf, ref_rf)


def test_best_state_restores_the_generated_nodes(tiny):
    g, graph = tiny
    m = _model(g, graph, disc_steps=1).eval()
    plain = m.predict()
    m.train()
    m.train_loss()
    state = {k: v.clone() for k, v in m.state_dict().items()}
    before = m.eval().predict()
    assert not torch.allclose(before, plain)                  # generated nodes change predictions
    m.train()
    for _ in range(2):                                         # G step, then a new cycle
        m.train_loss()
    m.load_state_dict(state)
    torch.testing.assert_close(m.eval().predict(), before)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(method="imgagn", disc_steps=0), ValueError, "disc_steps"),
    (dict(method="imgagn", disc_steps=2.5), TypeError, "disc_steps"),
    (dict(method="imgagn", gen_ratio=0.0), ValueError, "gen_ratio"),
    (dict(method="imgagn", gen_ratio=float("inf")), ValueError, "gen_ratio"),
    (dict(method="imgagn", gen_adv_grad=1), TypeError, "gen_adv_grad"),
    (dict(method="origin", gen_adv_grad=True), ValueError, "gen_adv_grad"),
])
def test_imgagn_bad_configs(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        BaselineConfig(**kwargs)


def test_imgagn_bad_build_and_defaults(tiny):
    g, graph = tiny
    with pytest.raises(ValueError, match="im_class_num"):
        _model(g, graph, im_class_num=6)
    d = BaselineConfig(method="imgagn").to_dict()
    assert (d["hidden"], d["disc_steps"], d["gen_ratio"], d["dropout"]) == (128, 100, 1.0, 0.5)
    assert d["faithful"]["gen_adv_grad"]["is_official"] is True
    # no tail class needs nodes: every epoch is a discriminator step on the original graph
    m = _model(g, graph, gen_ratio=0.1)
    assert m.num_synthetic == 0 and not m.blocks
    m.train_loss().backward()
    assert m.discriminator_steps == 1


def test_imgagn_runs_on_every_device(tiny, device):
    g, graph = tiny
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:k] for c, k in enumerate(COUNTS)])
    ctx = MethodContext(g.x.to(device), g.y.to(device), graph.to(device), train.to(device), 5,
                        torch.Generator().manual_seed(1))
    m = build_method(ctx, BaselineConfig(method="imgagn", hidden=8, disc_steps=1,
                                         gen_adv_grad=True)).to(device)
    for _ in range(3):                                   # D, G, new cycle + D
        m.train_loss().backward()
    assert m.predict().shape == (g.num_nodes, 5) and m.gen_weights()[0].device.type == device


# ---- generator, discriminator and cycle details (a mutation audit, s43)
def _model_counts(g, graph, counts, train_order=None, **kw):
    """`_model` with ``counts`` training nodes per class (optionally permuted ids)."""
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:k] for c, k in enumerate(counts)])
    if train_order is not None:
        train = train[train_order(train.numel())]
    kw = {"hidden": 8, "dropout": 0.0, "im_class_num": 3, **kw}
    ctx = MethodContext(g.x, g.y, graph, train, 5, torch.Generator().manual_seed(3))
    return build_method(ctx, BaselineConfig(method="imgagn", **kw)).train()


def test_generator_is_the_official_mlp_on_100_dim_noise(tiny):
    """G(z) = (tanh(W3 relu(W2 relu(W1 z))) + 1) / 2 with z ∈ ℝ¹⁰⁰ (the official Generator):
    a ReLU dropped, or another noise width, changed every generated node and passed the
    suite (its checks went through G itself)."""
    g, graph = tiny
    gen = ig.Generator(7)
    z = torch.randn(11, 100)
    h = F.relu(F.linear(F.relu(F.linear(z, gen.fc1.weight, gen.fc1.bias)), gen.fc2.weight,
                        gen.fc2.bias))
    want = (torch.tanh(F.linear(h, gen.fc3.weight, gen.fc3.bias)) + 1) / 2
    torch.testing.assert_close(gen(z), want)
    assert gen.fc1.in_features == 100
    m = _model(g, graph)
    m.generate()
    assert [tuple(z.shape) for z in m._z] == [(7, 100), (5, 100)]


def test_discriminator_dropout_one_mask_in_training_none_in_eval(tiny):
    """D: h = dropout(relu(gc1(x))) once, both heads read the same h (official); in eval mode no
    dropout, so the harness's validation and test predictions are deterministic (with
    dropout left on, the default 0.5 made every evaluation a random draw)."""
    g, graph = tiny
    d = ig.Discriminator(6, 8, 5, 0.5).train()
    x = torch.randn(10, 6)
    adj = torch.rand(10, 10)
    adj = adj / adj.sum(1, keepdim=True)
    torch.manual_seed(0)
    cls, rf = d(x, adj)
    torch.manual_seed(0)
    h = F.dropout(F.relu(d.gc1(x, adj)), 0.5, True)
    torch.testing.assert_close(cls, d.gc2(h, adj))
    torch.testing.assert_close(rf, d.gc3(h, adj))
    m = _model(g, graph, dropout=0.5)
    m.train_loss()                                           # a cycle's nodes generated
    m.eval()
    first = m.predict()
    assert torch.equal(first, m.predict())
    x_aug, a_aug, _ = m.augmented()
    h = F.relu(m.disc.gc1(x_aug, a_aug))
    torch.testing.assert_close(first, m.disc.gc2(h, a_aug)[:g.num_nodes])


def test_a_tail_class_already_at_its_target_gets_no_generator(tiny):
    """s_c = ⌊gen_ratio·max n⌋ − n_c = 0: class c gets no block (a block of 0 nodes made the
    generator loss a mean over nothing, NaN: the run diverged at its first G step). Counts
    8, 5, 3, 1, 0 with ratio 3/8: class 2 (3 nodes) needs none, class 3 two."""
    g, graph = tiny
    m = _model(g, graph, gen_ratio=0.375, disc_steps=1)
    assert [(c, s) for c, _, s in m.blocks] == [(3, 2)]
    assert m.info()["generated_per_class"] == {"3": 2}
    # the floor, not the nearest integer: ⌊0.45·8⌋ = 3 (round gave 4 and one node more per
    # class with every test passing; mutation audit, session 69)
    assert _model(g, graph, gen_ratio=0.45).info()["generated_per_class"] == {"3": 2}
    m.train_loss()                                           # generate + D step
    assert torch.isfinite(m.train_loss())                    # the G step


def test_generated_counts_follow_the_largest_training_class_wherever_it_is(tiny):
    """s_c counts up to the largest training class, not class 0's: with training counts
    3, 8, 4, 1, 0 the tail classes 3 and 2 get 8 − 1 and 8 − 4 nodes (class 0's 3 gave 2
    and none)."""
    g, graph = tiny
    m = _model_counts(g, graph, (3, 8, 4, 1, 0))
    assert [(c, s) for c, _, s in m.blocks] == [(3, 7), (2, 4)]


def test_blocks_do_not_depend_on_the_order_of_the_training_ids(tiny):
    """A class's generator weights its training nodes in id order: the same split listed in
    another order (a user's split file) gives the same blocks and the same generated nodes."""
    g, graph = tiny
    counts = (8, 5, 3, 1, 0)
    a = _model_counts(g, graph, counts)
    b = _model_counts(g, graph, counts,
                      train_order=lambda n: torch.randperm(n, generator=torch.Generator()
                                                           .manual_seed(5)))
    assert not torch.equal(a.ctx.train_idx, b.ctx.train_idx)
    assert [(c, nodes.tolist(), s) for c, nodes, s in a.blocks] == \
        [(c, sorted(nodes.tolist()), s) for c, nodes, s in b.blocks] == \
        [(c, nodes.tolist(), s) for c, nodes, s in b.blocks]


def test_each_cycle_trains_the_discriminator_on_its_own_generated_nodes(tiny):
    """A new cycle's D steps see the nodes generated at its start (features a·X_c and their
    edges), not the previous cycle's: the cached augmented graph must be dropped when the
    nodes change. Epoch 2 of disc_steps = 1 (generate + D) against the dense computation."""
    g, graph = tiny
    m = _model(g, graph, disc_steps=1)
    m.train_loss()                                           # cycle 1: generate + D
    first = [w.clone() for w in m.gen_weights()]
    m.train_loss()                                           # G
    loss = m.train_loss()                                    # cycle 2: generate + D
    assert not torch.equal(first[1], m.gen_weights()[1])  # (class 3 has one node: weights 1)
    torch.testing.assert_close(loss, _dense_disc_loss(m, g, graph))


@pytest.mark.parametrize("adv", [False, True])
def test_generator_loss_targets_real_and_the_blocks_class(tiny, adv):
    """L_G = Σ_c CE(real/fake of D(x_gen) → real) + CE(class of D(x_gen) → c) + mean ‖x_i −
    x_gen_j‖₂ (module docstring): each block's class term asks D for the block's own tail
    class, not class 0."""
    g, graph = tiny
    m = _model(g, graph, disc_steps=1, gen_adv_grad=adv)
    m.train_loss()                                            # generate + D step
    got = m.train_loss()                                      # G step on the same z
    want = 0.0
    for (c, nodes, s), gen, z in zip(m.blocks, m.generators, m._z, strict=True):
        x_c = g.x[nodes]
        x_gen = F.softmax(gen(z), 1) @ x_c
        cls, rf = m.disc.alone(x_gen)
        want = want + F.cross_entropy(rf, torch.zeros(s, dtype=torch.long)) \
            + F.cross_entropy(cls, torch.full((s,), c)) \
            + ig.euclidean_dist(x_c, x_gen).mean()
    assert [c for c, _, _ in m.blocks] == [3, 2]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
