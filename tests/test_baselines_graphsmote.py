"""GraphSMOTE_T / _O in linear memory against the official dense construction: the
reconstruction loss (values and gradients), the candidate mask and the augmented graph, and the
whole training loss of one epoch on a small graph (same seed -> same synthetic nodes)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hiertail_fast.baselines import BaselineConfig, MethodContext, build_method, train_baseline
from hiertail_fast.baselines import graphsmote as gs
from hiertail_fast.baselines.layers import adjacency_operator
from hiertail_fast.baselines.sampling import same_class_nearest_neighbour, smote_interpolate
from hiertail_fast.data.synthetic import make_synthetic_graph
from hiertail_fast.graph import CSRGraph
from hiertail_fast.nn.hiertail import prepare_graph
from tests.conftest import LargestTensor

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    g = make_synthetic_graph(70, num_classes=4, avg_degree=5, num_features=6, seed=3)
    return g, prepare_graph(g.edge_index, g.num_nodes)


def _dense(graph):
    return adjacency_operator(graph, "none").to_dense()


def _row(a):
    s = a.sum(1, keepdim=True)
    return torch.where(s > 0, a / s.clamp_min(1e-30), torch.zeros_like(a))


def test_recon_loss_matches_dense(tiny, monkeypatch):
    _, graph = tiny
    monkeypatch.setattr(gs, "_BLOCK_ELEMS", 70 * 9)          # 9-row blocks, ragged last one
    z1 = (0.3 * torch.randn(70, 5, dtype=torch.float64)).requires_grad_()
    z2 = z1.detach().clone().requires_grad_()
    a = gs.recon_loss(z1, graph)
    b = gs.recon_loss_dense(z2, _dense(graph).double())
    (2 * a).backward()
    (2 * b).backward()
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(z1.grad, z2.grad)
    with pytest.raises(ValueError, match="rows"):
        gs.recon_loss(z1[:5], graph)
    # binarised: an entry stored twice (a CSRGraph built directly) counts once, as in the
    # official dense loss on (A != 0)
    dup = CSRGraph(torch.tensor([0, 3, 4, 5, 6]), torch.tensor([1, 1, 2, 0, 0, 1]), None, 4)
    once = torch.zeros(4, 4, dtype=torch.float64)
    once[dup.row_index(), dup.indices] = 1.0
    z = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(gs.recon_loss(z, dup), gs.recon_loss_dense(z, once))


@pytest.mark.parametrize("variant", ["t", "o"])
def test_augmented_graph_matches_dense(tiny, variant):
    _, graph = tiny
    n = graph.num_nodes
    src = torch.tensor([4, 9, 4, 30])
    nbr = torch.tensor([9, 4, 30, 4])
    z = torch.randn(n + 4, 3)
    ck, cj = gs.candidate_edges(graph, src, nbr)
    eye = torch.eye(n + 4)
    b = gs.augmented_adjacency(graph, z, ck, cj, variant) @ eye
    dense = gs.augmented_graph_dense(_dense(graph), z, src, nbr, variant)
    torch.testing.assert_close(b, dense)
    torch.testing.assert_close(gs.augmented_adjacency(graph, z, ck, cj, variant, norm="row")
                               @ eye, _row(dense))
    assert (b[n:, n:] == 0).all()                           # no synthetic self-loop
    with pytest.raises(ValueError, match="variant"):
        gs.augmented_adjacency(graph, z, ck, cj, "x")
    with pytest.raises(ValueError, match="norm"):
        gs.augmented_adjacency(graph, z, ck, cj, variant, norm="sym")


@pytest.mark.parametrize("method", ["graphsmote_t", "graphsmote_o"])
@pytest.mark.parametrize("norm", ["none", "row"])
def test_training_loss_matches_dense_reference(tiny, method, norm):
    g, graph = tiny
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:4] for c in range(4)])
    cfg = BaselineConfig(method=method, hidden=8, dropout=0.0, adj_norm=norm, im_class_num=2,
                         rec_weight=0.01)
    ctx = MethodContext(g.x, g.y, graph, train, 4, torch.Generator().manual_seed(7))
    model = build_method(ctx, cfg).train()
    loss = model.train_loss()
    # the official dense computation with the same parameters and the same λ draws
    expect = _dense_smote_loss(model, g, norm, 0.01)
    torch.testing.assert_close(loss, expect, rtol=1e-4, atol=1e-5)
    assert model.num_synthetic == sum(min(4, int((g.y == c).sum())) for c in (3, 2))


@pytest.mark.parametrize("edge_grad", [False, True])
def test_edge_grad_reaches_the_decoder_only_when_asked(tiny, edge_grad):
    g, graph = tiny
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:4] for c in range(4)])
    cfg = BaselineConfig(method="graphsmote_o", hidden=8, dropout=0.0, im_class_num=2,
                         rec_weight=0.0, edge_grad=edge_grad)
    ctx = MethodContext(g.x, g.y, graph, train, 4, torch.Generator().manual_seed(7))
    model = build_method(ctx, cfg).train()
    model.train_loss().backward()
    grad = model.decoder.weight.grad
    assert (grad is not None and grad.abs().sum() > 0) == edge_grad
    # the sparse differentiable weights against the dense construction, gradients included
    n = g.num_nodes
    src, nbr = torch.tensor([4, 9]), torch.tensor([9, 4])
    z1 = torch.randn(n + 2, 3, requires_grad=True)
    z2 = z1.detach().clone().requires_grad_()
    x = torch.randn(n + 2, 2, requires_grad=True)
    ck, cj = gs.candidate_edges(graph, src, nbr)
    b = gs.augmented_adjacency(graph, z1, ck, cj, "o", edge_grad, "row")
    (b @ x).pow(2).sum().backward()
    dense = gs.augmented_graph_dense(_dense(graph), z2, src, nbr, "o", edge_grad)
    (_row(dense) @ x).pow(2).sum().backward()
    if edge_grad:
        torch.testing.assert_close(z1.grad, z2.grad)
    else:
        assert z1.grad is None and z2.grad is None


def test_graphsmote_bad_configs():
    with pytest.raises(ValueError, match="GNN classifier"):
        BaselineConfig(method="graphsmote_t", classifier="mlp")
    with pytest.raises(ValueError, match="rec_weight"):
        BaselineConfig(method="graphsmote_o", rec_weight=-1.0)
    with pytest.raises(ValueError, match="edge_grad"):
        BaselineConfig(method="graphsmote_t", edge_grad=True)
    with pytest.raises(TypeError, match="edge_grad"):
        BaselineConfig(method="graphsmote_o", edge_grad=1)
    with pytest.raises(ValueError, match="variant"):
        gs.augmented_adjacency(prepare_graph(torch.tensor([[0], [1]]), 2), torch.randn(3, 2),
                               torch.tensor([0]), torch.tensor([1]), "t", edge_grad=True)
    d = BaselineConfig(method="graphsmote_o").to_dict()
    assert d["faithful"]["edge_grad"]["is_official"] is True
    assert d["rec_weight"] == 1e-6 and d["classifier"] == "gnn"


def test_ep_pre_pretrains_encoder_and_decoder_on_recon_loss_only(tiny):
    g, graph = tiny
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:4] for c in range(4)])

    def built(ep_pre):
        torch.manual_seed(0)
        cfg = BaselineConfig(method="graphsmote_t", hidden=8, dropout=0.0, im_class_num=2,
                             ep_pre=ep_pre)
        ctx = MethodContext(g.x, g.y, graph, train, 4, torch.Generator().manual_seed(7))
        m = build_method(ctx, cfg)
        return m, torch.optim.Adam(m.parameters(), lr=0.01)

    m, opt = built(3)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    first = gs.recon_loss(m.decoder.embed(m.encoder(g.x, m.adj)), graph)
    assert m.pretrain(opt) == 3
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]) == k.startswith("classifier."), k
    assert gs.recon_loss(m.decoder.embed(m.encoder(g.x, m.adj)), graph) < first
    assert all(p not in opt.state for p in m.classifier.parameters())   # Adam skipped them
    # λ stream: one draw per round and pre-training epoch, as the official recon_upsample
    ref = torch.Generator().manual_seed(7)
    for _ in range(3 * len(m.rounds)):
        torch.rand(1, 1, generator=ref, dtype=torch.float64)
    assert torch.equal(m.ctx.generator.get_state(), ref.get_state())
    m0, opt0 = built(0)
    assert m0.pretrain(opt0) == 0
    res = train_baseline(g, None, BaselineConfig(method="graphsmote_o", hidden=8, ep_pre=2),
                         epochs=2, seed=0, progress=False)
    assert res["pretrain_epochs"] == 2
    assert "pretrain_epochs" not in train_baseline(g, None, BaselineConfig(
        method="graphsmote_o", hidden=8), epochs=1, seed=0, progress=False)
    assert BaselineConfig(method="graphsmote_t").to_dict()["ep_pre"] == 0
    with pytest.raises(ValueError, match="ep_pre"):
        BaselineConfig(method="graphsmote_t", ep_pre=-1)
    with pytest.raises(TypeError, match="ep_pre"):
        BaselineConfig(method="graphsmote_t", ep_pre=2.0)


def _dense_smote_loss(model, g, norm, rec_weight):
    """The official dense epoch loss of ``model`` (dropout 0) with its parameters: B the dense
    (n+s)² construction, row-normalised, its weights differentiable iff ``edge_grad``."""
    gen = torch.Generator().manual_seed(7)
    a = _dense(model.ctx.graph)
    n = a.shape[0]
    h = model.encoder(g.x, _row(a) if norm == "row" else a)
    new, labels, srcs, nbrs = [], [], [], []
    for cls, r in model.rounds:
        nb = same_class_nearest_neighbour(h[r])
        new.append(smote_interpolate(h[r], nb, gen))
        labels += [cls] * r.numel()
        srcs.append(r)
        nbrs.append(r[nb])
    h_all = torch.cat([h, *new])
    z = model.decoder.embed(h_all)
    b = gs.augmented_graph_dense(a, z, torch.cat(srcs), torch.cat(nbrs), model.variant,
                                 model.cfg.edge_grad)
    logits = model.classifier(h_all, _row(b))
    idx = torch.cat([model.ctx.train_idx, torch.arange(n, h_all.shape[0])])
    y_all = torch.cat([g.y, torch.tensor(labels)])
    return F.cross_entropy(logits[idx], y_all[idx]) + rec_weight * gs.recon_loss_dense(z[:n], a)


@pytest.mark.parametrize("method, edge_grad", [("graphsmote_o", True), ("graphsmote_o", False),
                                               ("graphsmote_t", False)])
@pytest.mark.parametrize("norm", ["none", "row"])
def test_epoch_loss_and_gradients_match_dense(tiny, method, edge_grad, norm):
    """Loss and the gradient of every parameter of one training epoch against the official
    dense pipeline (same parameters, same λ draws); with ``edge_grad`` the decoder gets the
    node loss's gradient through the continuous edge weights and the degrees."""
    g, graph = tiny
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:4] for c in range(4)])
    cfg = BaselineConfig(method=method, hidden=8, dropout=0.0, adj_norm=norm, im_class_num=2,
                         rec_weight=0.01, edge_grad=edge_grad)
    ctx = MethodContext(g.x, g.y, graph, train, 4, torch.Generator().manual_seed(7))
    model = build_method(ctx, cfg).train()
    loss = model.train_loss()
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    ref = _dense_smote_loss(model, g, norm, 0.01)
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-4, atol=1e-5)
    for k, p in model.named_parameters():
        torch.testing.assert_close(grads[k], p.grad, rtol=1e-3, atol=1e-6, msg=k)
    # rw·L_rec alone (1e-2 · O(1)) against the node loss's share through the edge weights
    rec = torch.autograd.grad(0.01 * gs.recon_loss(model.decoder.embed(
        model.encoder(g.x, model.adj)), graph), model.decoder.weight)[0]
    assert torch.allclose(grads["decoder.weight"], rec, atol=1e-7) != edge_grad


def test_edge_grad_backward_is_linear_in_memory(monkeypatch):
    """One edge_grad training step (forward + backward) on n = 3,000 (+ s synthetic) nodes:
    no tensor anywhere near (n+s)² elements (torch's backward of a sparse product w.r.t. its
    values forms the dense grad·(XW)ᵀ); L_rec's blocks cut to 20 rows (60k elements)."""
    n = 3000
    g = make_synthetic_graph(n, num_classes=6, avg_degree=6, num_features=16, seed=5)
    graph = prepare_graph(g.edge_index, g.num_nodes)
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:40] for c in range(6)])
    monkeypatch.setattr(gs, "_BLOCK_ELEMS", 20 * n)
    for norm in ("none", "row"):
        cfg = BaselineConfig(method="graphsmote_o", hidden=16, adj_norm=norm, im_class_num=3,
                             edge_grad=True)
        ctx = MethodContext(g.x, g.y, graph, train, 6, torch.Generator().manual_seed(7))
        model = build_method(ctx, cfg).train()
        rec = LargestTensor()
        with rec:
            model.train_loss().backward()
        m = n + model.num_synthetic
        assert model.num_synthetic > 0 and model.decoder.weight.grad.abs().sum() > 0
        # the largest is L_rec's |E|·h gather (335,936 here); the dense grad: (n+s)² = 9.6M
        assert rec.largest < 1_000_000 < m * m // 9, (norm, rec.largest, rec.op, m * m)


@pytest.mark.parametrize("choice", ["class", "node"])
def test_synthetic_embeddings_follow_smote_lambda(tiny, choice):
    """``smote_lambda`` reaches GraphSMOTE (CLI: "graphsmote_t / _o: one λ per class per round
    (official, default) or per synthetic node"): the classifier sees [H; h_new] with h_new =
    h_v + λ(h_nn − h_v), λ drawn once per round or once per synthetic node."""
    g, graph = tiny
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:4] for c in range(4)])
    cfg = BaselineConfig(method="graphsmote_t", hidden=8, dropout=0.0, im_class_num=2,
                         smote_lambda=choice)
    ctx = MethodContext(g.x, g.y, graph, train, 4, torch.Generator().manual_seed(7))
    model = build_method(ctx, cfg).train()
    seen = []
    model.classifier.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].detach()))
    model.train_loss()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        h = model.encoder(g.x, model.adj)
        want = [h]
        for _, r in model.rounds:
            nb = same_class_nearest_neighbour(h[r])
            want.append(smote_interpolate(h[r], nb, gen, per_node=choice == "node"))
    assert len(seen) == 1 and seen[0].shape[0] == g.num_nodes + model.num_synthetic
    torch.testing.assert_close(seen[0], torch.cat(want))
