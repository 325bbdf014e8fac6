"""GraphMixup (§2.8) in linear memory against the official dense construction: the local-path
pairs (same seed -> same pairs and labels as the n×n shortest-path matrix), the global-path
targets, one whole epoch's loss and gradients (pre-train and fine-tune) against a dense
re-implementation, and its characteristic steps (mixup rounds and interpolation, the Q-learning
update of the scale, the phases), bad configurations and the CLI flags."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hiertail_fast.baselines import BaselineConfig, MethodContext, build_method
from hiertail_fast.baselines import graphmixup as gm
from hiertail_fast.baselines import mixup_targets as mt
from hiertail_fast.baselines.graphsmote import recon_loss_dense
from hiertail_fast.baselines.layers import adjacency_operator
from hiertail_fast.baselines.sampling import same_class_nearest_neighbour
from hiertail_fast.data.synthetic import make_synthetic_graph
from hiertail_fast.nn.hiertail import prepare_graph

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    g = make_synthetic_graph(80, num_classes=4, avg_degree=3, num_features=6, seed=3)
    return g, prepare_graph(g.edge_index, g.num_nodes)


def _dense(graph):
    return adjacency_operator(graph, "none").to_dense()


def _ctx(g, graph, seed=0, per_class=(8, 6, 2, 1)):
    """Imbalanced training nodes (class c: the first per_class[c]), 2 validation nodes each."""
    idx = [torch.nonzero(g.y == c).flatten() for c in range(g.num_classes)]
    train = torch.cat([i[:k] for i, k in zip(idx, per_class, strict=True)])
    val = torch.cat([i[k:k + 2] for i, k in zip(idx, per_class, strict=True)])
    return MethodContext(g.x, g.y, graph, train, g.num_classes,
                         torch.Generator().manual_seed(seed), val_idx=val, epochs=20, patience=5)


@pytest.mark.parametrize("dis_nclass, k_num", [(3, 7), (6, 40), (6, 400)])
def test_local_path_pairs_match_dense_matrix(tiny, monkeypatch, dis_nclass, k_num):
    _, graph = tiny
    a = mt.raw_adjacency(graph, False)
    monkeypatch.setattr(mt, "_BLOCK_ELEMS", 80 * 7)     # 7-source BFS blocks, ragged last one
    sparse = mt.local_path_pairs(a, dis_nclass, k_num, torch.Generator().manual_seed(1))
    dense = mt.local_path_pairs_dense(a, dis_nclass, k_num, torch.Generator().manual_seed(1))
    for s, d in zip(sparse, dense, strict=True):
        assert torch.equal(s, d)
    u, v, lab = sparse
    assert bool((u < v).all()) and int(lab.max()) == dis_nclass - 1   # this graph has 'far'
    counts = torch.bincount(lab)
    assert int(counts.max()) == k_num or k_num > 300          # k_num caps the larger classes
    other = mt.local_path_pairs(a, dis_nclass, k_num, torch.Generator().manual_seed(2))
    assert not torch.equal(other[0], u) or k_num > 300


def test_local_path_labels_by_hand():
    # path 0-1-2-3 and an isolated node 4; cutoff 2 (dis_nclass 3): hops 1, 2, far
    from hiertail_fast.graph import CSRGraph
    ei = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    g = CSRGraph.from_edge_index(ei, num_nodes=5)
    u, v, lab = mt.local_path_pairs(g, 3, 100, torch.Generator().manual_seed(0))
    got = {(int(a), int(b)): int(c) for a, b, c in zip(u, v, lab, strict=True)}
    assert got == {(0, 1): 0, (1, 2): 0, (2, 3): 0, (0, 2): 1, (1, 3): 1,
                   (0, 3): 2, (0, 4): 2, (1, 4): 2, (2, 4): 2, (3, 4): 2}


def test_sample_distinct():
    for total, k in [(10, 3), (10, 20), (10**12, 50), (0, 5)]:
        a = mt.sample_distinct(total, k, torch.Generator().manual_seed(4))
        b = mt.sample_distinct(total, k, torch.Generator().manual_seed(4))
        assert torch.equal(a, b) and a.numel() == min(total, k)
        assert a.unique().numel() == a.numel() and (a.numel() == 0 or 0 <= a.min() <= a.max()
                                                     < total)
    # the documented stream, so a seed names its pairs: a permutation while total <= 4k (the
    # dense oracle calls the same function, so a changed threshold passed every test: a
    # mutation pass, session 73)
    for total, k in [(10, 4), (12, 3)]:
        perm = torch.randperm(total, generator=torch.Generator().manual_seed(0))[:k]
        assert torch.equal(mt.sample_distinct(total, k, torch.Generator().manual_seed(0)), perm)


def test_global_path_targets_match_official_bfs(tiny):
    _, graph = tiny
    a = mt.raw_adjacency(graph, False)
    part, how = mt.partition(a, 6)
    assert part.shape == (80,) and how in ("metis", "bfs (pymetis not installed)")
    ids, centres = mt.cluster_centres(a, part)
    assert np.array_equal(ids, np.unique(part))
    t = mt.global_path_targets(a, ids, centres, 7)              # one absent part: zero column
    torch.testing.assert_close(t, mt.global_path_targets_dense(a, ids, centres, 7))
    assert float(t[:, 6].abs().sum()) == 0 and float(t[centres, ids].abs().sum()) == 0
    hops = 1 / t[t > 0]                                         # 1 / hop: hops are integers
    torch.testing.assert_close(hops, hops.round())


def test_cluster_centre_is_highest_within_part_degree():
    from hiertail_fast.graph import CSRGraph
    # part 0 = {0, 1, 2, 3}: a star on 1; part 1 = {4, 5}; the edge 3-4 crosses
    ei = torch.tensor([[1, 0, 1, 2, 1, 3, 4, 5, 3, 4], [0, 1, 2, 1, 3, 1, 5, 4, 4, 3]])
    g = CSRGraph.from_edge_index(ei, num_nodes=6)
    ids, centres = mt.cluster_centres(g, np.array([0, 0, 0, 0, 1, 1]))
    assert ids.tolist() == [0, 1] and centres.tolist() == [1, 5]      # tie 4/5 -> larger id


def test_mixup_rounds_by_hand():
    y = torch.tensor([0] * 8 + [1] * 6 + [2] * 2 + [3])
    train = torch.arange(17)                                  # avg = ⌊17 / 4⌋ = 4
    sizes = lambda r: [(c, x.tolist()) for c, x in r]         # noqa: E731
    assert sizes(gm.mixup_rounds(y, train, 4, 2, 0.0, 0.0)) == [
        (3, [16]), (3, [16]), (3, [16]), (2, [14, 15])]       # r = 4/1 − 1 = 3; 4/2 − 1 = 1
    assert sizes(gm.mixup_rounds(y, train, 4, 2, 0.0, 0.5)) == [
        (3, [16]), (3, [16]), (3, [16]), (2, [14, 15]), (2, [14])]   # rest 0.5: ⌊1·0.5⌋ = 0
    # k = −1: class 3: ⌊4 − 1⌋ − 1 = 2 rounds; class 2: ⌊2 − 1⌋ − 1 = 0, rest 0; classes 1, 0:
    # ⌊4/6 − 1⌋ − 1 < 0 and ⌊4/8 − 1⌋ − 1 < 0: nothing
    assert sizes(gm.mixup_rounds(y, train, 4, 4, 0.0, -1.0)) == [(3, [16]), (3, [16])]
    assert sizes(gm.mixup_rounds(y, train, 4, 2, 1.5, 0.0)) == [
        (3, [16]), (2, [14, 15]), (2, [14])]
    with pytest.raises(ValueError, match="up_scale"):
        gm.mixup_rounds(y, train, 4, 2, -1.0, 0.0)


def test_default_pretraining_is_the_floor_of_half_an_odd_run():
    """Without ``pretrain_epochs`` the pre-training is min(2010, ⌊epochs / 2⌋), for an odd
    number of epochs too."""
    cfg = BaselineConfig(method="graphmixup")
    assert gm.pretrain_length(cfg, 21) == 10
    assert gm.pretrain_length(cfg, 3) == 1
    assert gm.pretrain_length(cfg, 4021) == gm.OFFICIAL_PRETRAIN_EPOCHS


@pytest.mark.parametrize("neighbour", ["global", "local"])
def test_mixup_interpolation(neighbour):
    h = torch.randn(12, 3, requires_grad=True)
    rounds = [(3, torch.tensor([9, 10, 11])), (2, torch.tensor([5, 7]))]
    gen = torch.Generator().manual_seed(7)
    new, lab, src, nbr = gm.mixup_embeddings(h, rounds, gen, neighbour)
    gen = torch.Generator().manual_seed(7)
    lams = [torch.rand(1, generator=gen, dtype=torch.float64).item() for _ in rounds]
    pos = 0
    for (c, r), lam in zip(rounds, lams, strict=True):
        local = same_class_nearest_neighbour(h[r])
        nb = r[local] if neighbour == "global" else local      # the official bug: local id
        torch.testing.assert_close(new[pos:pos + r.numel()], h[r] + lam * (h[nb] - h[r]))
        assert torch.equal(nbr[pos:pos + r.numel()], nb) and bool((lab[pos:pos + r.numel()]
                                                                   == c).all())
        pos += r.numel()
    assert torch.equal(src, torch.tensor([9, 10, 11, 5, 7]))
    new.sum().backward()                                        # both endpoints get gradient
    assert float(h.grad[src].abs().sum()) > 0 and float(h.grad[nbr].abs().sum()) > 0
    with pytest.raises(ValueError, match="neighbour"):
        gm.mixup_embeddings(h, rounds, gen, "nearest")


def test_q_learning_update_of_the_scale():
    agent = gm.QLearningScale(torch.Generator().manual_seed(0), greedy=1.0)
    agent.learn(0.0, 1, 1.0)
    assert agent.q["0.0"] == [0.0, 0.1]                         # Q += 0.1·(reward − Q)
    agent.learn(0.0, 1, -1.0)
    assert agent.q["0.0"][1] == pytest.approx(0.1 + 0.1 * (-1.0 - 0.1))
    assert agent.move(0.98, 0) == 1.0 and agent.move(-0.97, 1) == -1.0
    assert agent.move(0.0, 0) == 0.05 and agent.move(0.1, 1) == pytest.approx(0.05)

    a = gm.QLearningScale(torch.Generator().manual_seed(3), greedy=1.0)
    k1 = a.update(0.5, 0.4)                  # no previous action: act only (ties at random)
    first = a.action
    assert a.q == {"0.0": [0.0, 0.0]}
    assert k1 == (0.05 if first == 0 else -0.05)
    a.update(0.7, 0.5)                       # F1 rose after the move: +1 for (0.0, first)
    assert a.q["0.0"][first] == pytest.approx(0.1) and a.q["0.0"][1 - first] == 0.0
    assert a.choose(0.0) == first            # greedy now prefers it
    a.last_k, a.action = 0.0, first
    a.update(0.3, 0.7)                       # F1 fell: −1
    assert a.q["0.0"][first] == pytest.approx(0.1 + 0.1 * (-1 - 0.1))
    assert a.updates == 3

    traj = []
    for _ in range(2):                       # same generator seed -> same trajectory
        b = gm.QLearningScale(torch.Generator().manual_seed(9))
        traj.append([b.update(float(i % 3), float((i + 1) % 3)) for i in range(30)])
    assert traj[0] == traj[1]


def test_q_agent_stopping_rule():
    a = gm.QLearningScale(torch.Generator())
    a.record = [0.0] * 149
    assert not a.stopped(0.05)
    a.record.append(0.0)
    assert a.stopped(0.05)
    a.record[-20:] = [0.0, 0.1] * 10
    assert not a.stopped(0.05) and a.stopped(0.1)


def test_q_agent_stopping_window_is_the_last_20_values():
    """The stopping rule looks at the last ``window`` values of k only: an earlier outlier
    does not keep the agent going."""
    a = gm.QLearningScale(torch.Generator())
    a.record = [0.0] * 149 + [0.5] + [0.0] * 20
    assert a.stopped(0.05)
    a.record[-20] = 0.5
    assert not a.stopped(0.05)


def _norm(a, norm):
    return a / a.sum(1, keepdim=True).clamp_min(1e-30) if norm == "row" else a


def _dense_epoch_loss(m, g, pretrain: bool):
    """The official dense pipeline for one epoch (dropout 0): encoder on dense A, mixup, dense
    P, the (n+s)² mask M with the original block := A, the classifier on B = P ⊙ M, and
    L_rec / L_dis / L_clu from the dense oracles."""
    c, cfg = m.ctx, m.cfg
    a = _dense(m.graph_mx)
    n = a.shape[0]
    enc, cls = m.encoder.conv, m.classifier
    h = F.relu(_norm(a, cfg.adj_norm) @ (c.x @ enc.weight) + enc.bias)
    rounds = gm.mixup_rounds(c.y, c.train_idx, c.num_classes, cfg.im_class_num, cfg.up_scale,
                             m.agent.k)
    new, rows, labels = [], [], []
    for cl, r in rounds:
        local = same_class_nearest_neighbour(h[r])
        nb = r[local] if cfg.mixup_neighbour == "global" else local
        lam = torch.rand(1, generator=c.generator, dtype=torch.float64).item()
        new.append(h[r] + (h[nb] - h[r]) * lam)
        rows.append((a[r] + a[nb]).clamp(0, 1))
        labels.append(torch.full((r.numel(),), cl))
    h_all = torch.cat([h, *new])
    s = h_all.shape[0] - n
    w = m.decoder.weight if pretrain else m.decoder.weight.detach()
    z = h_all @ w.T
    p = torch.sigmoid(z @ z.T)
    a_new = torch.cat(rows) if rows else a.new_zeros(0, n)
    mask = torch.cat([torch.cat([a, a_new.T], 1), torch.cat([a_new, a.new_zeros(s, s)], 1)])
    if cfg.edge_mode == "discrete":
        p = (p >= 0.5).float().detach()
    b = p * mask
    b = torch.cat([torch.cat([a, b[:n, n:]], 1), b[n:]])
    b = _norm(b, cfg.adj_norm)
    out = cls.linear(F.relu(b @ (h_all @ cls.conv.weight) + cls.conv.bias))
    train = torch.cat([c.train_idx, n + torch.arange(s)])
    ce = F.cross_entropy(out[train], torch.cat([c.y, *labels])[train])
    if not pretrain:
        return ce
    a0 = mt.raw_adjacency(c.graph, False)
    u, v, lab = mt.local_path_pairs_dense(a0, cfg.dis_nclass, cfg.k_num,
                                          torch.Generator().manual_seed(0))
    l_dis = F.nll_loss(F.log_softmax(m.pairdis((h[u] - h[v]).abs()), 1), lab)
    ids, centres = mt.cluster_centres(a0, mt.partition(a0, cfg.clu_nclass)[0])
    t = mt.global_path_targets_dense(a0, ids, centres, cfg.clu_nclass)
    l_clu = F.mse_loss(m.clusterdis(h), t)
    return recon_loss_dense(z[:n], a) / n + l_dis + l_clu + 0 * ce


@pytest.mark.parametrize("neighbour, edge_mode, up_scale, self_loops, norm", [
    ("local", "continuous", 0.0, False, "none"), ("global", "continuous", 1.5, True, "none"),
    ("global", "discrete", 0.0, False, "none"), ("local", "continuous", 0.0, False, "row")])
@pytest.mark.parametrize("pretrain", [True, False])
def test_epoch_loss_and_gradients_match_dense(tiny, neighbour, edge_mode, up_scale,
                                              self_loops, norm, pretrain):
    g, graph = tiny
    cfg = BaselineConfig(method="graphmixup", hidden=8, dropout=0.0, im_class_num=2,
                         k_num=30, clu_nclass=5, mixup_neighbour=neighbour, adj_norm=norm,
                         edge_mode=edge_mode, up_scale=up_scale, self_loops=self_loops)
    m = build_method(_ctx(g, graph), cfg).train()
    if not pretrain:
        m.epoch = m.pretrain_epochs
    m.agent.k = 0.5                           # the RL scale enters the round count
    state = m.ctx.generator.get_state()
    loss = m.train_loss()
    loss.backward()
    grads = {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}
    m.zero_grad(set_to_none=True)
    m.ctx.generator.set_state(state)
    ref = _dense_epoch_loss(m, g, pretrain)
    ref.backward()
    assert m.num_synthetic > 0
    torch.testing.assert_close(loss, ref, rtol=1e-4, atol=1e-5)
    for k, p in m.named_parameters():
        if k in grads:
            torch.testing.assert_close(grads[k], p.grad, rtol=1e-3, atol=1e-5, msg=k)
        else:
            assert p.grad is None or float(p.grad.abs().sum()) == 0, k
    decoder_steps = pretrain                  # fine-tune: the decoder does not step
    assert ("decoder.weight" in grads) == decoder_steps
    assert ("pairdis.weight" in grads) == pretrain
    if not pretrain and edge_mode == "continuous":     # P's gradient reaches the encoder
        assert float(grads["encoder.conv.weight"].abs().sum()) > 0


def test_same_seed_same_pairs_and_schedule(tiny):
    g, graph = tiny
    cfg = BaselineConfig(method="graphmixup", hidden=8, im_class_num=2, k_num=25)
    a, b = (build_method(_ctx(g, graph, seed=5), cfg) for _ in range(2))
    c = build_method(_ctx(g, graph, seed=6), cfg)
    assert torch.equal(a.pair_u, b.pair_u) and torch.equal(a.pair_v, b.pair_v)
    assert not (torch.equal(a.pair_u, c.pair_u) and torch.equal(a.pair_v, c.pair_v))
    assert a.pretrain_epochs == 10            # min(2010, 20 // 2)
    assert a.selection_start() == a.pretrain_epochs
    assert gm.pretrain_length(cfg, 10_000) == gm.OFFICIAL_PRETRAIN_EPOCHS
    assert gm.pretrain_length(cfg, 1_000) == 500
    assert gm.pretrain_length(cfg, None) == gm.OFFICIAL_PRETRAIN_EPOCHS
    assert gm.pretrain_length(cfg.replace(pretrain_epochs=3), 10) == 3


def test_phases_and_q_agent_run_on_the_harness_epochs(tiny):
    g, graph = tiny
    cfg = BaselineConfig(method="graphmixup", hidden=8, im_class_num=2, k_num=25,
                         pretrain_epochs=3, q_start_epoch=2)
    m = build_method(_ctx(g, graph), cfg)
    opt = torch.optim.Adam(m.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    w_dec = []
    for _ in range(8):
        opt.zero_grad(set_to_none=True)
        m.train_loss().backward()
        opt.step()
        w_dec.append(m.decoder.weight.detach().clone())
    torch.testing.assert_close(w_dec[3], w_dec[-1], rtol=0, atol=0)   # fine-tune: frozen
    assert not torch.equal(w_dec[0], w_dec[2])                         # pre-train: steps
    info = m.info()
    assert info["schedule"]["pretrain_epochs"] == 3
    assert info["schedule"]["q_learning_from_epoch"] == 5
    assert info["q_updates"] == 3 and info["epochs_trained"] == 8     # epochs 5, 6, 7
    assert len(m.agent.record) == 1 + 5                    # k per fine-tune epoch, as official
    assert round(abs(info["scale_k"]) / 0.05) in (1, 3)     # three moves of ±0.05 from 0


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(dis_nclass=1), ValueError, "dis_nclass"),
    (dict(k_num=2.5), TypeError, "k_num"),
    (dict(clu_nclass=0), ValueError, "clu_nclass"),
    (dict(delta_k=-0.1), ValueError, "delta_k"),
    (dict(dis_weight="1"), TypeError, "dis_weight"),
    (dict(edge_mode="soft"), ValueError, "edge_mode"),
    (dict(mixup_neighbour="nearest"), ValueError, "mixup_neighbour"),
    (dict(pretrain_epochs=-1), ValueError, "pretrain_epochs"),
    (dict(pretrain_epochs=2.0), TypeError, "pretrain_epochs"),
    (dict(self_loops=1), TypeError, "self_loops"),
    (dict(classifier="mlp"), ValueError, "GNN classifier"),
])
def test_bad_configs(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        BaselineConfig(method="graphmixup", **kwargs)


def test_official_defaults_and_bad_builds(tiny):
    cfg = BaselineConfig(method="graphmixup")
    assert (cfg.hidden, cfg.dropout, cfg.lr, cfg.up_scale, cfg.self_loops) == \
        (128, 0.1, 1e-3, 0.0, False)
    assert (cfg.dis_nclass, cfg.clu_nclass, cfg.k_num, cfg.delta_k) == (6, 15, 5000, 0.05)
    assert BaselineConfig(method="origin").hidden == 64      # other methods keep theirs
    d = cfg.to_dict()
    assert d["faithful"]["mixup_neighbour"]["is_official"] and "k_num" in d
    g, graph = tiny
    ctx = _ctx(g, graph)
    bare = build_method(MethodContext(ctx.x, ctx.y, graph, ctx.train_idx, 4,
                                      torch.Generator()), cfg.replace(hidden=8, k_num=5))
    assert bare.pretrain_epochs == gm.OFFICIAL_PRETRAIN_EPOCHS       # no harness epochs given
    assert bare.info()["q_reward_nodes"].startswith("train")         # no validation nodes
    with pytest.raises(ValueError, match="no fine-tuning"):
        build_method(ctx, cfg.replace(pretrain_epochs=20))


def test_cli_flags():
    import argparse

    from hiertail_fast.baselines.cli import add_method_arguments, method_config_from_args
    p = argparse.ArgumentParser()
    for flag in ("--hidden", "--dropout", "--lr", "--weight-decay"):
        p.add_argument(flag, type=float, default=None)
    for flag in ("--gamma", "--tau", "--augment-a2", "--loss-backend"):
        p.add_argument(flag, default=None)
    add_method_arguments(p)
    cfg = method_config_from_args(p.parse_args(
        "--method graphmixup --k-num 100 --edge-mode discrete --pretrain-epochs 7 "
        "--mixup-neighbour global --self-loops".split()))
    assert (cfg.k_num, cfg.edge_mode, cfg.pretrain_epochs, cfg.mixup_neighbour,
            cfg.self_loops, cfg.hidden) == (100, "discrete", 7, "global", True, 128)
    with pytest.raises(ValueError, match="--k-num"):
        method_config_from_args(p.parse_args("--method hiertail --k-num 3".split()))


def test_harness_selects_and_counts_patience_over_fine_tune_epochs_only():
    """train_baseline: the selected epoch is a fine-tune one, and a patience shorter than the
    pre-train does not end the run inside it (the harness before 2026-11-26 validated from
    epoch 0 and capped P at the patience). The run's config records the rule."""
    from hiertail_fast.baselines.harness import train_baseline
    from hiertail_fast.data.splits import natural_split

    g = make_synthetic_graph(300, num_classes=4, avg_degree=3, num_features=6, seed=4)
    cfg = BaselineConfig(method="graphmixup", hidden=8, im_class_num=2, k_num=25)
    res = train_baseline(g, natural_split(g.y, 0), cfg, epochs=30, patience=3, seed=0,
                         progress=False)
    p = res["schedule"]["pretrain_epochs"]
    assert p == 15                                       # min(2010, 30 // 2), not the patience
    assert res["best_epoch"] >= p and res["epochs_run"] > p
    assert cfg.to_dict()["model_selection"] == "fine-tune epochs only"


def test_discrete_edges_keep_a_candidate_at_p_one_half(tiny, monkeypatch):
    # edge_mode="discrete" keeps the candidate edges with 1[P >= 0.5]: with the decoder zeroed
    # every P is sigmoid(0) = 0.5 and every candidate stays (> 0.5 dropped them all and passed
    # every test; mutation audit, session 69)
    g, graph = tiny
    cfg = BaselineConfig(method="graphmixup", hidden=8, dropout=0.0, im_class_num=2, k_num=30,
                         clu_nclass=5, edge_mode="discrete", up_scale=1.0,
                         mixup_neighbour="global")
    m = build_method(_ctx(g, graph), cfg).train()
    m.epoch = m.pretrain_epochs                     # fine-tune: CE on the augmented graph
    with torch.no_grad():
        m.decoder.weight.zero_()
    seen = {}
    candidates, augmented = gm.candidate_edges, gm.AugmentedAdjacency

    def count_candidates(*args):
        ck, cj = candidates(*args)
        seen["candidates"] = ck.numel()
        return ck, cj

    def count_kept(graph_mx, num_synthetic, ck, cj, p, adj_norm):
        seen["kept"] = ck.numel()
        return augmented(graph_mx, num_synthetic, ck, cj, p, adj_norm)

    monkeypatch.setattr(gm, "candidate_edges", count_candidates)
    monkeypatch.setattr(gm, "AugmentedAdjacency", count_kept)
    m.train_loss()
    assert seen["candidates"] > 0 and seen["kept"] == seen["candidates"]


def test_fine_tune_step_is_linear_in_memory(monkeypatch):
    """One fine-tuning step (CE on the augmented graph, continuous edges: B's learnable
    weights) forward + backward on n = 3,000 (+ s synthetic) nodes: B is applied as an
    operator, so no tensor comes near (n+s)² elements (a sparse B with learnable values has
    torch's dense grad·(XW)ᵀ in its backward: an old fix without a GraphMixup test, b7c31ef)."""
    import hiertail_fast.baselines.graphsmote as gs
    from tests.conftest import LargestTensor

    n = 3000
    monkeypatch.setattr(gs, "_BLOCK_ELEMS", 20 * n)
    g = make_synthetic_graph(n, num_classes=6, avg_degree=6, num_features=16, seed=5)
    graph = prepare_graph(g.edge_index, g.num_nodes)
    idx = [torch.nonzero(g.y == c).flatten() for c in range(6)]
    train = torch.cat([i[:k] for i, k in zip(idx, (40, 40, 40, 10, 5, 3), strict=True)])
    val = torch.cat([i[50:55] for i in idx])
    for norm in ("none", "row"):
        ctx = MethodContext(g.x, g.y, graph, train, 6, torch.Generator().manual_seed(7),
                            val_idx=val, epochs=20, patience=5)
        cfg = BaselineConfig(method="graphmixup", hidden=16, k_num=30, clu_nclass=5,
                             mixup_neighbour="global", adj_norm=norm)
        model = build_method(ctx, cfg).train()
        model.epoch = model.pretrain_epochs                 # the fine-tuning phase
        rec = LargestTensor()
        with rec:
            model.train_loss().backward()
        m = n + model.num_synthetic
        assert model.num_synthetic > 0 and cfg.edge_mode == "continuous"
        assert rec.largest < 1_000_000 < m * m // 9, (norm, rec.largest, rec.op, m * m)


def test_pretrain_loss_weighs_each_self_supervised_term_by_its_own_weight(tiny):
    """Pre-training: L = L_rec / n + dis_weight·L_dis + clu_weight·L_clu (+ 0·CE), each term
    with its own weight, and a zero weight drops its term."""
    g, graph = tiny
    for dis_w, clu_w in ((2.0, 0.5), (0.0, 3.0), (0.25, 0.0)):
        cfg = BaselineConfig(method="graphmixup", hidden=8, dropout=0.0, im_class_num=2,
                             k_num=30, clu_nclass=5, dis_weight=dis_w, clu_weight=clu_w)
        m = build_method(_ctx(g, graph), cfg).train()
        assert m.epoch < m.pretrain_epochs
        loss = m.train_loss()
        with torch.no_grad():
            h = m.encoder(g.x, m.adj)
            l_dis, l_clu = m.self_supervised_losses(h)
            rec = gm.recon_loss(h @ m.decoder.weight.T, m.graph_mx) / g.num_nodes
        assert float(l_dis) > 0 and float(l_clu) > 0
        torch.testing.assert_close(loss.detach(), rec + dis_w * l_dis + clu_w * l_clu)
