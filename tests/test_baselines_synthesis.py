"""How the over-sampling baselines make their synthetic nodes, against independent oracles (a
mutation audit found these steps untested): SMOTE's λ range, float64 neighbours and gradient
through both endpoints; GraphENS's Beta(2, 2) λ, destination and source draws, KL direction and
warmup length; Embed-SMOTE's round count and encoder gradient; GraphMixup's round rule, 'far'
label and Q-agent reward; GraphSMOTE_T's P ≥ 0.5 threshold and pre-training patience."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hiertail_fast.baselines import BaselineConfig, MethodContext, build_method
from hiertail_fast.baselines import graphens as ge
from hiertail_fast.baselines import graphmixup as gm
from hiertail_fast.baselines import graphsmote as gs
from hiertail_fast.baselines import mixup_targets as mt
from hiertail_fast.baselines.layers import adjacency_operator
from hiertail_fast.baselines.sampling import same_class_nearest_neighbour, smote_interpolate
from hiertail_fast.data.synthetic import make_synthetic_graph
from hiertail_fast.graph import CSRGraph
from hiertail_fast.nn.hiertail import prepare_graph
from tests.test_baselines_graphens import _model as _graphens_model
from tests.test_baselines_graphmixup import _ctx as _mixup_ctx

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def small():
    """60 nodes, class sizes 48, 7, 3, 2."""
    g = make_synthetic_graph(60, num_classes=4, avg_degree=4, num_features=6, seed=2)
    return g, prepare_graph(g.edge_index, g.num_nodes)


@pytest.fixture(scope="module")
def ens_graph():
    """tests/test_baselines_graphens.py's graph (80 nodes, 20 features)."""
    g = make_synthetic_graph(80, num_classes=4, avg_degree=6, num_features=20, seed=4)
    return g, prepare_graph(g.edge_index, g.num_nodes)


@pytest.fixture(scope="module")
def mixup_graph():
    """tests/test_baselines_graphmixup.py's graph (80 nodes, mean degree 3)."""
    g = make_synthetic_graph(80, num_classes=4, avg_degree=3, num_features=6, seed=3)
    return g, prepare_graph(g.edge_index, g.num_nodes)


def _ctx_counts(g, graph, counts, seed=0):
    """Training nodes: the first counts[c] nodes of class c."""
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:k] for c, k in enumerate(counts)])
    return MethodContext(g.x, g.y, graph, train, g.num_classes,
                         torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- SMOTE (sampling.py)

def test_smote_lambda_is_uniform_on_the_unit_interval():
    """λ ~ U(0, 1), one per round (the official SMOTE): over 4,000 rounds on a 1-D pair 0 ↔ 1
    (so the synthetic value IS λ) the mean is 1/2, the variance 1/12, a quarter of the draws
    lie above 3/4 and the largest is near 1. A mutation audit found λ ~ U(0, 0.5) passing every
    test (the existing ones only check 0 ≤ λ ≤ 1). Bands: >= 5 standard errors."""
    gen = torch.Generator().manual_seed(0)
    x = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    nb = torch.tensor([1, 0])
    m = 4000
    lam = torch.cat([smote_interpolate(x, nb, gen)[0] for _ in range(m)])
    assert abs(float(lam.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / m)            # ±0.023
    assert abs(float(lam.var()) - 1 / 12) < 5 * math.sqrt(1 / 180 / m)         # ±0.006
    assert abs(float((lam > 0.75).double().mean()) - 0.25) < 5 * math.sqrt(0.1875 / m)
    assert float(lam.max()) > 0.99                         # P(all < 0.99) = 0.99⁴⁰⁰⁰ ≈ 1e-18
    per_node = smote_interpolate(torch.tensor([[0.0], [1.0]] * 2000, dtype=torch.float64),
                                 torch.arange(4000) ^ 1, torch.Generator().manual_seed(1),
                                 per_node=True)[0::2, 0]
    assert abs(float(per_node.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / 2000)
    assert float(per_node.max()) > 0.99


def test_nearest_neighbour_is_exact_for_float32_features_with_a_large_offset():
    """Float32 embeddings far from the origin (a common offset 1000): the neighbour must be
    the one of the official float64 pdist recipe. cdist's |x|² + |y|² − 2x·y path (used past
    25 rows) in float32 loses the O(1e-3) differences under |x|² ~ 1e6; a mutation audit found
    the float32 computation (no float64 cast) passing every test. The points' gaps grow along
    the line (no ties): each point's nearest is the one before it, point 0's is point 1."""
    m = 40
    gaps = 0.01 * (1.0 + 0.1 * torch.arange(m - 1, dtype=torch.float64))
    pos = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(gaps, 0)])
    perm = torch.randperm(m, generator=torch.Generator().manual_seed(0))
    x = torch.zeros(m, 2)
    x[:, 0] = 1000.0
    x[:, 1] = pos[perm].float()
    from scipy.spatial.distance import pdist, squareform
    d = squareform(pdist(x.double().numpy()))
    np.fill_diagonal(d, d.max() + 100)                    # the official recipe
    oracle = d.argmin(axis=-1)
    by_hand = [1] + list(range(m - 1))                    # in line order
    inv = torch.argsort(perm)                             # line position -> row
    assert oracle.tolist() == [int(inv[by_hand[int(perm[i])]]) for i in range(m)]
    assert same_class_nearest_neighbour(x).tolist() == oracle.tolist()


@pytest.mark.parametrize("per_node", [False, True])
def test_smote_gradient_flows_through_both_endpoints(per_node):
    """x_v + λ(x_nn − x_v) is differentiable in BOTH endpoints (the documented contract and
    the official, undetached interpolation): with weights w on the output,
    ∂L/∂x_i = w_i(1 − λ_i) + Σ_{v: nn(v) = i} λ_v w_v. A mutation audit found a detached
    neighbour endpoint passing every test (they only check the gradient is nonzero)."""
    x = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    nb = torch.tensor([1, 0, 1, 1, 6, 4, 4])               # rows 1 and 4 are neighbours often
    w = torch.randn(7, 3, dtype=torch.float64)
    out = smote_interpolate(x, nb, torch.Generator().manual_seed(5), per_node)
    (out * w).sum().backward()
    lam = torch.rand(7 if per_node else 1, 1, generator=torch.Generator().manual_seed(5),
                     dtype=torch.float64).expand(7, 1)
    expect = w * (1 - lam)
    for v in range(7):
        expect[nb[v]] += lam[v] * w[v]
    torch.testing.assert_close(out, (x + lam * (x[nb] - x)).detach())
    torch.testing.assert_close(x.grad, expect)


# ---------------------------------------------------------------- GraphENS

@pytest.fixture(scope="module")
def ens_draws(ens_graph):
    """1,000 steps of GraphENS's pair sampling (training counts 9, 5, 2, 1: 4 + 7 + 8 = 19
    synthetic nodes a step)."""
    g, graph = ens_graph
    m = _graphens_model(g, graph, seed=11)
    src, dst, lam = zip(*(m.sample_pairs() for _ in range(1000)), strict=True)
    return m, torch.cat(src), torch.cat(dst), torch.cat(lam).double()


def test_graphens_lambda_is_beta_2_2(ens_draws):
    """λ ~ Beta(2, 2) (the official ``np.random.beta(2, 2)``): mean 1/2, variance 1/20,
    CDF(1/4) = 3/16 − 2/64 = 0.15625. 19,000 draws; standard errors: mean 0.0016, variance
    √((μ₄ − σ⁴)/N) = 3.9e-4 (μ₄ = 3/560), CDF 0.0026; the bands are 5, 13 and 7.6 of them. A
    mutation audit found the mean of three uniforms (variance 1/36 = 0.028, CDF(1/4) = 0.07)
    passing every test (they only check 0 < λ < 1)."""
    *_, lam = ens_draws
    n = lam.numel()
    assert n == 19_000
    assert abs(float(lam.mean()) - 0.5) < 5 * math.sqrt(0.05 / n)
    assert abs(float(lam.var()) - 0.05) < 0.005
    assert abs(float((lam < 0.25).double().mean()) - 0.15625) < 0.02


def test_graphens_destinations_follow_log_n_over_n(ens_draws):
    """A destination is a training node drawn with probability ∝ log(n_c)/n_c, so class c
    takes the share log n_c / Σ log n_c' (9, 5, 2, 1 nodes: 0.488, 0.358, 0.154, 0) and its
    nodes equal parts of it. A mutation audit found ∝ log n_c per NODE (shares 0.68, 0.28,
    0.05) passing every test. Bands: 5 binomial standard errors."""
    m, _, dst, _ = ens_draws
    y = m.ctx.y
    counts = (9, 5, 2, 1)
    mass = torch.tensor([math.log(k) for k in counts], dtype=torch.float64)
    share = mass / mass.sum()
    n = dst.numel()
    got = torch.bincount(y[dst], minlength=4).double() / n
    assert (got - share).abs().max() < 5 * math.sqrt(0.25 / n)            # 0.018
    assert int((y[dst] == 3).sum()) == 0                                   # log 1 = 0
    freq = torch.bincount(dst, minlength=y.numel()).double() / n
    for node in m.ctx.train_idx.tolist():
        c = int(y[node])
        p = float(share[c]) / counts[c]
        assert abs(float(freq[node]) - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-12, node


def test_graphens_sources_are_uniform_over_every_training_node_of_the_class(ens_draws):
    """Each class draws (max − n_c) sources uniformly WITH replacement from ALL its training
    nodes (official ``idx_info`` sampling): over 1,000 steps every node of classes 1 and 2 is
    drawn about draws_c / n_c times (5 binomial standard errors), the largest class never. A
    mutation audit found the class's last training node never drawn passing every test."""
    m, src, _, _ = ens_draws
    y, train = m.ctx.y, m.ctx.train_idx
    drawn = torch.bincount(src, minlength=y.numel())
    assert int(drawn[train[y[train] == 0]].sum()) == 0
    for c, n_c in ((1, 5), (2, 2), (3, 1)):
        total = 1000 * (9 - n_c)
        nodes = train[y[train] == c]
        assert nodes.numel() == n_c and int(drawn[nodes].sum()) == total
        p = 1 / n_c
        band = 5 * math.sqrt(total * p * (1 - p))
        assert (drawn[nodes].double() - total * p).abs().max() <= band, (c, drawn[nodes])


def test_graphens_neighbour_mixing_weight_is_sigmoid_of_kl_src_dst(ens_graph, monkeypatch):
    """After warmup, [w_src, w_dst] = softmax([0, −KL]) = [σ(KL), 1 − σ(KL)] with
    KL = KL(p_src ‖ p_dst) = Σ p_src (log p_src − log p_dst), p = softmax(mean_{self+nbrs}
    (previous logits) / τ). Trained 20 steps first, so the KLs are far from 0 (the existing
    dense recomputation runs right after the warmup step, where KL ≈ 0 and w ≈ 1/2 either way:
    a mutation audit found KL(p_dst ‖ p_src) passing it)."""
    g, graph = ens_graph
    m = _graphens_model(g, graph, seed=1)
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    for _ in range(20):
        opt.zero_grad()
        m.train_loss().backward()
        opt.step()
    seen = {}
    real = ge.sample_neighbours

    def spy(nbrs, src, dst, w_src, w_dst, degree, seed):
        seen.update(src=src, dst=dst, w_src=w_src, w_dst=w_dst)
        return real(nbrs, src, dst, w_src, w_dst, degree, seed)

    monkeypatch.setattr(ge, "sample_neighbours", spy)
    prev = m._prev_logits.double()
    m.train_loss()
    a = torch.zeros(g.num_nodes, g.num_nodes, dtype=torch.float64)
    a[graph.row_index(), graph.indices] = 1.0              # A+I, mean aggregation
    p = F.softmax((a / a.sum(1, keepdim=True)) @ prev / m.cfg.pred_temp, dim=1)
    src, dst = seen["src"], seen["dst"]
    kl = (p[src] * (p[src].log() - p[dst].log())).sum(1).clamp_min(0)
    reverse = (p[dst] * (p[dst].log() - p[src].log())).sum(1).clamp_min(0)
    # the check tells the directions apart: they differ by 1,000x the tolerance (0.19 here)
    assert float((torch.sigmoid(kl) - torch.sigmoid(reverse)).abs().max()) > 0.01
    torch.testing.assert_close(seen["w_src"].double(), torch.sigmoid(kl), rtol=0, atol=1e-5)
    torch.testing.assert_close(seen["w_dst"].double(), 1 - torch.sigmoid(kl), rtol=0, atol=1e-5)


@pytest.mark.parametrize("warmup", [2, 3])
def test_graphens_warmup_lasts_warmup_epochs_steps(ens_graph, monkeypatch, warmup):
    """Steps 1..warmup_epochs are warmup (the source's neighbours, plain mixup); neighbour
    sampling starts at step warmup_epochs + 1 (official: ``epoch > warmup``, epochs from 1).
    A mutation audit found a warmup one step shorter passing every test (the default
    warmup_epochs = 1 cannot show it: step 1 has no previous logits)."""
    g, graph = ens_graph
    m = _graphens_model(g, graph, warmup_epochs=warmup)
    calls = []
    real = ge.sample_neighbours
    monkeypatch.setattr(ge, "sample_neighbours",
                        lambda *a: calls.append(m.steps) or real(*a))
    for _ in range(warmup + 2):
        m.train_loss().backward()
    assert calls == [warmup + 1, warmup + 2]


# ---------------------------------------------------------------- Embed-SMOTE / GraphSMOTE

@pytest.mark.parametrize("method", ["embed_smote", "graphsmote_t", "graphsmote_o"])
@pytest.mark.parametrize("up_scale, rounds", [
    (2.0, [(3, 2), (2, 3)]), (2.5, [(3, 2), (2, 3)]), (1.0, [(3, 2), (2, 3)]),
    (0.5, [(3, 1), (2, 1)]),                       # ⌊0.5·2⌋, ⌊0.5·3⌋
    (0.0, [(3, 2), (3, 2), (2, 3)]),               # avg ⌊16/4⌋ = 4: ⌊4/2⌋ = 2, ⌊4/3⌋ = 1 rounds
])
def test_recon_rule_makes_one_round_per_tail_class(small, method, up_scale, rounds):
    """Embed-SMOTE and GraphSMOTE use the official ``recon_upsample`` rule: for up_scale k > 0
    ONE round per tail class over its first min(⌊k·n_c⌋, n_c) training nodes, whatever k
    (training counts 6, 5, 3, 2; tail classes 3, 2 with 2, 3 nodes: k = 2 and 2.5 give 2 + 3
    synthetic nodes, where over-sampling's ``src`` rule gives 10 and 12). A mutation audit
    found Embed-SMOTE on the ``src`` rule passing every test (they only use k ≤ 1)."""
    g, graph = small
    ctx = _ctx_counts(g, graph, (6, 5, 3, 2))
    m = build_method(ctx, BaselineConfig(method=method, hidden=8, im_class_num=2,
                                         up_scale=up_scale))
    t = {c: ctx.train_idx[g.y[ctx.train_idx] == c] for c in (3, 2)}
    assert [(c, r.tolist()) for c, r in m.rounds] == [(c, t[c][:k].tolist()) for c, k in rounds]
    s = sum(k for _, k in rounds)
    assert m.num_synthetic == s
    if method == "embed_smote":                 # the loss classifies train + synthetic rows
        rows = []
        m.classifier.register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[0]))
        m.train_loss()
        assert rows == [ctx.train_idx.numel() + s]


def test_embed_smote_loss_and_gradients_match_dense_reference(small):
    """Embed-SMOTE's epoch (dropout 0) against a dense re-computation with the same
    parameters and λ draws: H = ReLU(Â X W + b); per round h_new = H_v + λ(H_nn − H_v), the
    neighbour from the detached H, the interpolation differentiable; CE of the Linear head
    over [H_train; h_new]. Loss and the gradient of every parameter — the synthetic
    embeddings pass gradient to the encoder (§2.5). A mutation audit found detached synthetic
    embeddings passing every test (same loss value, smaller encoder gradient)."""
    g, graph = small
    ctx = _ctx_counts(g, graph, (6, 5, 3, 2), seed=4)
    m = build_method(ctx, BaselineConfig(method="embed_smote", hidden=8, dropout=0.0,
                                         im_class_num=2, up_scale=1.0)).train()
    state = ctx.generator.get_state()
    loss = m.train_loss()
    loss.backward()
    grads = {k: p.grad.clone() for k, p in m.named_parameters()}
    m.zero_grad(set_to_none=True)
    ctx.generator.set_state(state)
    a = adjacency_operator(graph, "none").to_dense()
    h = F.relu(a @ (g.x @ m.encoder.conv.weight) + m.encoder.conv.bias)
    parts, labels = [h[ctx.train_idx]], [g.y[ctx.train_idx]]
    for c in (3, 2):
        r = ctx.train_idx[g.y[ctx.train_idx] == c]
        nb = same_class_nearest_neighbour(h[r].detach())
        lam = torch.rand(1, 1, generator=ctx.generator, dtype=torch.float64).item()
        parts.append(h[r] + lam * (h[r][nb] - h[r]))
        labels.append(torch.full((r.numel(),), c))
    ref = F.cross_entropy(m.classifier.linear(torch.cat(parts)), torch.cat(labels))
    ref.backward(retain_graph=True)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    for k, p in m.named_parameters():
        torch.testing.assert_close(grads[k], p.grad, rtol=1e-4, atol=1e-7, msg=k)
    # the synthetic rows' share of the encoder gradient is large: a detached h_new shows
    (g_enc,) = torch.autograd.grad(F.cross_entropy(m.classifier.linear(torch.cat(parts[1:])),
                                                   torch.cat(labels[1:])),
                                   m.encoder.conv.weight)
    assert float(g_enc.abs().sum()) > 0.05 * float(grads["encoder.conv.weight"].abs().sum())


def test_graphsmote_t_keeps_candidates_at_exactly_one_half():
    """GraphSMOTE_T keeps a candidate edge iff P = σ(z_new · z_j) ≥ 0.5 (the official
    ``adj_new >= 0.5``): a dot product of exactly 0 (e.g. a synthetic node whose decoder
    embedding is all zero, as ReLU makes it) gives P = 0.5, kept. Path 0-1-2 (A+I), one
    synthetic node from source 1 and neighbour 0 (candidates 0, 1, 2). A mutation audit found
    P > 0.5 passing every test (random embeddings never hit 0.5)."""
    graph = prepare_graph(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 3)
    ck, cj = gs.candidate_edges(graph, torch.tensor([1]), torch.tensor([0]))
    assert cj.tolist() == [0, 1, 2]
    a = torch.tensor([[1.0, 1, 0], [1, 1, 1], [0, 1, 1]])
    base = torch.zeros(4, 4)
    base[:3, :3] = a
    cases = [(torch.tensor([[1.0, 0], [0, 1], [-1, 0], [1, 0]]), [1, 1, 0]),   # dots 1, 0, −1
             (torch.tensor([[1.0, 0], [0.5, 0.5], [0, 1], [0, 0]]), [1, 1, 1])]  # z_new = 0
    for z, keep in cases:
        expect = base.clone()
        expect[3, :3] = expect[:3, 3] = torch.tensor(keep, dtype=torch.float32)
        b = gs.augmented_adjacency(graph, z, ck, cj, "t") @ torch.eye(4)
        torch.testing.assert_close(b, expect, rtol=0, atol=0)
        dense = gs.augmented_graph_dense(adjacency_operator(graph).to_dense(), z,
                                         torch.tensor([1]), torch.tensor([0]), "t")
        torch.testing.assert_close(dense, expect, rtol=0, atol=0)


@pytest.mark.parametrize("ep_pre, expect", [(2000, 9 + 501 + 1), (300, 300)])
def test_graphsmote_pretraining_stops_500_epochs_after_its_best(small, monkeypatch, ep_pre,
                                                               expect):
    """The edge generator's pre-training (``ep_pre``) stops once 500 epochs passed the lowest
    L_rec (official: ``epoch - best > 500``): with L_rec falling for 10 epochs (best: epoch 9)
    and rising after, the loop records epochs 0..510 (510 − 9 = 501 > 500) — 511 epochs —,
    or all ``ep_pre`` when fewer. L_rec is stubbed (a differentiable constant). A mutation
    audit found a patience of 5 passing every test (they run ep_pre ≤ 3)."""
    g, graph = small
    ctx = _ctx_counts(g, graph, (6, 5, 3, 2))
    m = build_method(ctx, BaselineConfig(method="graphsmote_t", hidden=8, im_class_num=2,
                                         ep_pre=ep_pre))
    epochs = []

    def fake_forward(pretrain):
        assert pretrain
        e = len(epochs)
        epochs.append(e)
        return m.decoder.weight.sum() * 0 + float((e - 9) ** 2 + 1)

    monkeypatch.setattr(m, "_forward", fake_forward)
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    assert m.pretrain(opt) == expect == len(epochs)


@pytest.mark.parametrize("loss, expect", [(lambda e: 1.0, 502),           # flat: best epoch 0
                                          (lambda e: float(e), 502),      # rising from the start
                                          (lambda e: max(10 - e, 0), 512)],   # falls, then flat
                         ids=["flat", "rising", "falls-then-flat"])
def test_graphsmote_pretraining_counts_from_the_first_lowest_loss(small, monkeypatch, loss,
                                                                  expect):
    """The official rule is ``epoch - losses.index(min(losses)) > 500``: the FIRST epoch that
    reached the lowest L_rec. A loss that stops falling (a plateau at its minimum, common once
    the decoder saturates) stops 501 epochs after it first got there; counting from the last
    equal loss never stopped (all ``ep_pre`` epochs), and skipping epoch 0 ran one more. A
    mutation audit (s43): both passed the suite, whose stubbed loss has one strict minimum."""
    g, graph = small
    m = build_method(_ctx_counts(g, graph, (6, 5, 3, 2)),
                     BaselineConfig(method="graphsmote_t", hidden=8, im_class_num=2,
                                    ep_pre=2000))
    epochs = []

    def fake_forward(pretrain):
        epochs.append(len(epochs))
        return m.decoder.weight.sum() * 0 + loss(epochs[-1])

    monkeypatch.setattr(m, "_forward", fake_forward)
    assert m.pretrain(torch.optim.Adam(m.parameters(), lr=0.01)) == expect == len(epochs)


def test_graphsmote_pretraining_steps_as_the_official_loop(small):
    """Each pre-training epoch is the official one: train mode (dropout on, whatever mode the
    model was left in), gradients zeroed, L_rec backward, one step. Three epochs against that
    loop written out, bit for bit (dropout 0.5: the same global draws). A mutation audit (s43):
    gradients accumulated across epochs, or the epochs run in eval mode, passed the suite."""
    g, graph = small

    def built():
        torch.manual_seed(0)
        m = build_method(_ctx_counts(g, graph, (6, 5, 3, 2)),
                         BaselineConfig(method="graphsmote_o", hidden=8, dropout=0.5,
                                        im_class_num=2, ep_pre=3))
        return m, torch.optim.Adam(m.parameters(), lr=0.01, weight_decay=5e-4)

    m, opt = built()
    m.eval()
    assert m.pretrain(opt) == 3
    ref, ref_opt = built()
    for _ in range(3):
        ref.train()
        ref_opt.zero_grad(set_to_none=True)
        ref._forward(pretrain=True).backward()
        ref_opt.step()
    for (k, v), w in zip(m.state_dict().items(), ref.state_dict().values(), strict=True):
        assert torch.equal(v, w), k


def test_graphsmote_training_continues_the_pretraining_adam_state(small, monkeypatch):
    """The loop's Adam carries on from pre-training (the official optimisers are the same
    objects): when the loop starts, the encoder's and decoder's moments hold ``ep_pre`` steps
    and the classifier has none. A fresh or reset optimiser for the loop passed the suite (a
    mutation audit, s43)."""
    from hiertail_fast.baselines import harness

    g, _ = small
    real, seen = harness.fit_early_stopping, {}

    def spy(model, opt, *args, **kwargs):
        seen["steps"] = {name: int(opt.state[p]["step"]) if p in opt.state else 0
                         for name, p in model.named_parameters()}
        return real(model, opt, *args, **kwargs)
    monkeypatch.setattr(harness, "fit_early_stopping", spy)
    res = harness.train_baseline(g, None, BaselineConfig(method="graphsmote_t", hidden=8,
                                                         im_class_num=2, ep_pre=3),
                                 epochs=1, seed=0, progress=False)
    assert res["pretrain_epochs"] == 3
    trained = {k: v for k, v in seen["steps"].items() if not k.startswith("classifier.")}
    assert len(trained) == 3 and set(trained.values()) == {3}, seen   # encoder W, b; decoder W
    assert all(v == 0 for k, v in seen["steps"].items() if k.startswith("classifier."))


# ---------------------------------------------------------------- GraphMixup

def _official_mixup_sizes(n_c: int, avg: int, k: float) -> list[int]:
    """The official ``utils.mixup`` round sizes for up_scale 0 (Python's int() truncation):
    r = int(avg/n_c + k) − 1 full rounds and one over int(n_c·(avg/n_c + k − 1 − r)) nodes;
    nothing when r < 0; empty rounds dropped."""
    r = int(avg / n_c + k) - 1
    if r < 0:
        return []
    sizes = [n_c] * r + [int(n_c * (avg / n_c + k - 1 - r))]
    return [s for s in sizes if s > 0]


def test_mixup_rounds_fractional_round_without_full_rounds():
    """A tail class with avg/n_c + k − 1 < 1 gets no full round but still its fractional
    round: 7 + 3 training nodes, avg = 5, class 1: 5/3 − 1 = 0.67 -> one round over
    ⌊3·0.67⌋ = 2 nodes. A mutation audit found the fractional round skipped when there is no
    full round passing every test. Also a grid of counts and Q-scales against the official
    rule written out above."""
    y = torch.tensor([0] * 7 + [1] * 3)
    got = gm.mixup_rounds(y, torch.arange(10), 2, 1, 0.0, 0.0)
    assert [(c, r.tolist()) for c, r in got] == [(1, [7, 8])]
    for counts in ((7, 3), (9, 4, 3), (8, 6, 5), (10, 7, 2)):
        y = torch.cat([torch.full((k,), c) for c, k in enumerate(counts)])
        train = torch.arange(y.numel())
        avg = y.numel() // len(counts)
        for k in (-0.5, -0.2, 0.0, 0.3, 0.55):
            rounds = gm.mixup_rounds(y, train, len(counts), len(counts) - 1, 0.0, k)
            expect = [(c, s) for c in range(len(counts) - 1, 0, -1)
                      for s in _official_mixup_sizes(counts[c], avg, k)]
            assert [(c, r.numel()) for c, r in rounds] == expect, (counts, k)


@pytest.mark.parametrize("edges, n, expect", [
    # two triangles, no path between them: max hop 1, 'far' = (1 + 1) − 1 = 1
    ([(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5)], 6,
     {**{p: 0 for p in [(0, 1), (0, 2), (1, 2), (3, 4), (3, 5), (4, 5)]},
      **{(u, v): 1 for u in range(3) for v in range(3, 6)}}),
    # path 0-1-2 and an isolated node 3: max hop 2, 'far' = 2
    ([(0, 1), (1, 2)], 4, {(0, 1): 0, (1, 2): 0, (0, 2): 1, (0, 3): 2, (1, 3): 2, (2, 3): 2}),
])
def test_local_path_far_label_is_the_max_hop(edges, n, expect):
    """Local-path labels when the largest hop found is below the cutoff (dis_nclass 6, cutoff
    5): the official code sets unreachable pairs to max + 1 and subtracts 1, so 'far' is
    labelled max_hop, not the cutoff. By hand and against the official dense construction.
    A mutation audit found 'far' = cutoff passing every test (its graph's max hop = cutoff)."""
    ei = torch.tensor(edges + [(b, a) for a, b in edges]).t()
    g = CSRGraph.from_edge_index(ei, num_nodes=n)
    sparse = mt.local_path_pairs(g, 6, 100, torch.Generator().manual_seed(0))
    dense = mt.local_path_pairs_dense(g, 6, 100, torch.Generator().manual_seed(0))
    u, v, lab = sparse
    assert {(int(a), int(b)): int(c) for a, b, c in zip(u, v, lab, strict=True)} == expect
    for s, d in zip(sparse, dense, strict=True):
        assert torch.equal(s, d)


def _mixup(mixup_graph, **kw):
    g, graph = mixup_graph
    cfg = BaselineConfig(method="graphmixup", hidden=8, im_class_num=2, k_num=25,
                         clu_nclass=5, pretrain_epochs=2, q_start_epoch=1, **kw)
    return build_method(_mixup_ctx(g, graph), cfg)


def test_graphmixup_q_reward_is_the_sign_of_the_f1_change(mixup_graph, monkeypatch):
    """The Q-agent learns reward sign(F1_now − F1_before) for its last action, F1 the
    validation Macro-F1 of the latest training forward and of the one before (official
    ``Run_QL(f1_now, f1_last)``). The F1s are scripted through ``macro_f1``; Q-updates run
    from epoch 3 (pretrain 2 + q_start 1), the first one only acts. A mutation audit found the
    reward's sign reversed passing every test."""
    script = [0.30, 0.10, 0.40, 0.40, 0.20, 0.60, 0.50, 0.50, 0.90, 0.20, 0.30, 0.10]
    calls = []
    monkeypatch.setattr(gm, "macro_f1", lambda y, p: calls.append(1) or script[len(calls) - 1])
    m = _mixup(mixup_graph)
    rewards = []
    real = m.agent.learn
    m.agent.learn = lambda k, a, r: rewards.append(r) or real(k, a, r)
    for _ in range(len(script)):
        m.train_loss()
    sign = lambda d: float((d > 0) - (d < 0))          # noqa: E731
    expect = [sign(script[t - 1] - script[t - 2]) for t in range(4, len(script))]
    assert {-1.0, 0.0, 1.0} <= set(expect)
    assert rewards == expect and m.agent.updates == len(script) - 3


def test_graphmixup_q_reward_uses_the_validation_nodes(mixup_graph, monkeypatch):
    """The reward's F1 is computed on the VALIDATION nodes (8 here; 17 training nodes), as
    ``info()["q_reward_nodes"] == "val"`` says. A mutation audit found the reward on the
    training nodes (while info still said "val") passing every test."""
    seen = []
    real = gm.macro_f1
    monkeypatch.setattr(gm, "macro_f1", lambda y, p: seen.append((y, p)) or real(y, p))
    m = _mixup(mixup_graph)
    for _ in range(4):
        m.train_loss()
    val = m.ctx.y[m.ctx.val_idx]
    assert m.info()["q_reward_nodes"] == "val" and m.ctx.train_idx.numel() != val.numel()
    assert len(seen) == 4
    for y_true, y_pred in seen:
        assert torch.equal(y_true, val) and y_pred.shape == val.shape
