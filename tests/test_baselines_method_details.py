"""Details that make a baseline silently another method (a mutation audit, s42: each test's
section comment names the rule, where it is stated, and the mutant it kills): SMOTE's counts and
λ, LTE4G's tail selection, routing and expert epochs, GraphMixup's adjacency, Q-agent, pair
sampling and partition, GraphENS's degree histogram."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hiertail_fast.baselines import BaselineConfig, MethodContext, build_method
from hiertail_fast.baselines import lte4g as lte4g_mod
from hiertail_fast.baselines import lte4g_steps as st
from hiertail_fast.baselines.graphmixup import QLearningScale
from hiertail_fast.baselines.lte4g_steps import GROUPS
from hiertail_fast.baselines.mixup_targets import bfs_partition, raw_adjacency, sample_distinct
from hiertail_fast.baselines.sampling import same_class_nearest_neighbour
from hiertail_fast.data.synthetic import make_synthetic_graph
from hiertail_fast.metrics import macro_f1
from hiertail_fast.nn.hiertail import prepare_graph

# ------------------------------------------------------------
# (s42 audit, mutant D08) each input-space up-sampling method uses ITS up_scale rule.
#
# PROTOCOL_AND_BASELINES.md §2.2 (over-sampling, k = 0: ⌊avg/n_c⌋ copies) and §2.4 (SMOTE, k = 0:
# ⌊avg/n_c⌋ full rounds PLUS a fractional round over the first ⌊(avg/n_c − ⌊avg/n_c⌋)·n_c⌋
# nodes); `sampling.upsample_rounds` ``"src"`` vs ``"smote"``. `upsample_rounds` itself is
# tested, but the suite stayed green when `Smote` used the over-sampling rule (its ``rule =
# "smote"`` line deleted): SMOTE at up_scale 0 then silently made fewer synthetic nodes.
COUNT_TRAIN = (10, 8, 6, 4, 3)   # |train| 31, C = 5, avg 6; tail classes 4, 3, 2: n_c 3, 4, 6


@pytest.fixture(scope="module")
def count_ctx():
    g = make_synthetic_graph(150, num_classes=5, avg_degree=4, num_features=6, seed=0)
    idx = [torch.nonzero(g.y == c).flatten() for c in range(5)]
    assert all(i.numel() >= k for i, k in zip(idx, COUNT_TRAIN, strict=True))
    train = torch.cat([i[:k] for i, k in zip(idx, COUNT_TRAIN, strict=True)])
    return MethodContext(g.x, g.y, prepare_graph(g.edge_index, g.num_nodes), train, 5,
                         torch.Generator().manual_seed(0))


def _expected(n_cs, avg, fractional):
    total = 0
    for n_c in n_cs:
        total += (avg // n_c) * n_c
        if fractional:
            total += int(n_c * (avg / n_c - int(avg / n_c)))
    return total


@pytest.mark.parametrize("method, fractional", [("oversampling", False), ("smote", True)])
def test_up_scale_zero_synthetic_counts_follow_each_methods_rule(count_ctx, method, fractional):
    """n_c 3, 4, 6, avg 6: over-sampling 6 + 4 + 6 = 16 copies; SMOTE adds ⌊(6/4 − 1)·4⌋ = 2
    more for class 3 (18). Both ≠ the other's count, so a swapped rule is seen."""
    m = build_method(count_ctx, BaselineConfig(method=method, hidden=8, up_scale=0.0))
    want = _expected((3, 4, 6), 6, fractional)
    assert want == (18 if fractional else 16)
    assert m.info()["num_synthetic"] == want
    assert m.x_aug.shape[0] == count_ctx.x.shape[0] + want
    assert m.train_aug.numel() == count_ctx.train_idx.numel() + want


# ------------------------------------------------------------
# (s42 audit, mutant D75 / D76) ``smote_lambda`` changes SMOTE's and Embed-SMOTE's
# synthetic nodes.
#
# `BaselineConfig` / config.FAITHFUL: "smote_lambda: class: one λ ~ U(0,1) per tail class per
# round (official, §1.5); node: one λ per synthetic node (SMOTE / GraphSMOTE papers)"; CLI
# ``--smote-lambda``: "smote / embed_smote: one λ per class per round (official, default) or per
# synthetic node". `smote_interpolate(per_node=...)` is tested, but the suite stayed green when
# `Smote` or `EmbedSmote` ignored the option (always one λ per round): ``--smote-lambda node`` then
# ran (and was recorded as) the paper variant while computing the official one.
LAMBDA_TRAIN = (12, 10, 8, 7, 6)     # tail classes 4, 3, 2 (im_class_num 3), several nodes each


@pytest.fixture(scope="module")
def lambda_ctx():
    g = make_synthetic_graph(150, num_classes=5, avg_degree=4, num_features=6, seed=0)
    idx = [torch.nonzero(g.y == c).flatten() for c in range(5)]
    train = torch.cat([i[:k] for i, k in zip(idx, LAMBDA_TRAIN, strict=True)])
    return g, prepare_graph(g.edge_index, g.num_nodes), train


def _implied_lambdas(src, nb, new):
    """λ of each row of new = src + λ(nb − src), float64 least squares; rows must lie on it."""
    d = (nb - src).double()
    lam = ((new - src).double() * d).sum(1) / (d * d).sum(1)
    torch.testing.assert_close(src.double() + lam[:, None] * d, new.double(), rtol=1e-4,
                               atol=1e-5)
    return lam


def _spread(lams):
    return max(float(v.max() - v.min()) for v in lams)


@pytest.mark.parametrize("choice", ["class", "node"])
def test_smote_synthetic_features_use_one_lambda_per_round_or_per_node(lambda_ctx, choice):
    g, graph, train = lambda_ctx
    m = build_method(MethodContext(g.x, g.y, graph, train, 5, torch.Generator().manual_seed(0)),
                     BaselineConfig(method="smote", hidden=8, smote_lambda=choice))
    n, pos, lams = g.num_nodes, 0, []
    for c in (4, 3, 2):                                    # up_scale 1: one full round each
        r = train[g.y[train] == c]
        nb = r[same_class_nearest_neighbour(g.x[r])]
        new = m.x_aug[n + pos:n + pos + r.numel()]
        pos += r.numel()
        lams.append(_implied_lambdas(g.x[r], g.x[nb], new))
    assert pos == m.num_synthetic
    assert all(float(v.min()) >= -1e-6 and float(v.max()) <= 1 + 1e-6 for v in lams)
    assert (_spread(lams) > 1e-3) == (choice == "node")


@pytest.mark.parametrize("choice", ["class", "node"])
def test_embed_smote_synthetic_embeddings_use_one_lambda_per_round_or_per_node(lambda_ctx, choice):
    g, graph, train = lambda_ctx
    m = build_method(MethodContext(g.x, g.y, graph, train, 5, torch.Generator().manual_seed(0)),
                     BaselineConfig(method="embed_smote", hidden=8, dropout=0.0,
                                    smote_lambda=choice))
    seen = []
    m.classifier.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].detach()))
    m.train_loss()
    with torch.no_grad():
        h = m.encoder(g.x, m.adj)
    rows, pos, lams = seen[0], train.numel(), []
    for _, r in m.rounds:
        nb = r[same_class_nearest_neighbour(h[r])]
        lams.append(_implied_lambdas(h[r], h[nb], rows[pos:pos + r.numel()]))
        pos += r.numel()
    assert pos == rows.shape[0] and len(lams) == 3
    assert (_spread(lams) > 1e-3) == (choice == "node")


# ------------------------------------------------------------
# (s42 audit, mutant D45) LTE4G's tail experts and tail student are selected on the
# validation Macro-F1 of THEIR class block.
#
# PROTOCOL_AND_BASELINES.md §2.11 step 3: tail experts have C − sep_point outputs, "labels shifted
# by −sep_point", and are selected on "val macro-F1 on that subset"; lte4g.py's docstring: "selected
# on the val nodes of their subset (true labels)". Comparing the tail experts' predictions (block
# indices 0..C−sep_point−1) with UNshifted labels (sep_point..C−1) scores every epoch 0, so the
# tail experts / student silently keep an arbitrary epoch; the suite stayed green.
TRAIN = (10, 7, 5, 4, 3)     # as tests/test_baselines_selection_and_weights.py: sep_point 3
VAL = (6, 4, 3, 3, 3)
SEP_POINT = 3


@pytest.fixture(scope="module")
def graph_data():
    g = make_synthetic_graph(150, num_classes=5, avg_degree=6, num_features=8,
                             head_fraction=0.4, head_mass=0.6, seed=0)
    split = []
    for c, (t, v) in enumerate(zip(TRAIN, VAL, strict=True)):
        nodes = torch.nonzero(g.y == c).flatten()
        split.append((nodes[:t], nodes[t:t + v]))
    train, val = (torch.cat(p) for p in zip(*split, strict=True))
    return g, prepare_graph(g.edge_index, g.num_nodes), train, val


def test_tail_expert_and_student_selection_scores_their_shifted_labels(graph_data, monkeypatch):
    """Every selection callable (4 experts, 2 students) is captured; after `after_fit` each is
    called once more (the modules hold their best states) and must equal the Macro-F1 of the
    module's argmax on its val nodes against y − shift, shift = sep_point for the T block. At
    least one tail score is > 0 (otherwise the check could not tell)."""
    g, graph, train, val = graph_data
    seen = []
    real = lte4g_mod.LTE4G._selection

    def selection(self, module, embed, val_nodes, shift):
        f = real(self, module, embed, val_nodes, shift)
        seen.append((module, embed, val_nodes, f))
        return f
    monkeypatch.setattr(lte4g_mod.LTE4G, "_selection", selection)
    ctx = MethodContext(g.x, g.y, graph, train, g.num_classes,
                        torch.Generator().manual_seed(0), val_idx=val)
    m = build_method(ctx, BaselineConfig(method="lte4g", hidden=8, dropout=0.0,
                                         expert_patience=5, curriculum_ep=5))
    m.after_fit(val, epochs=10)
    assert m.sep_point == SEP_POINT
    tail_modules = {id(m.experts["TH"]), id(m.experts["TT"]), id(m.students["T"])}
    tail_scores = []
    for module, embed, val_nodes, f in seen:
        shift = SEP_POINT if id(module) in tail_modules else 0
        if val_nodes.numel() == 0:
            continue
        module.eval()
        with torch.no_grad():
            pred = module(embed, m.adj)[val_nodes].argmax(1).cpu()
        want = macro_f1((g.y[val_nodes] - shift).cpu(), pred)
        assert f() == pytest.approx(want, abs=1e-12)
        if shift:
            tail_scores.append(want)
    assert tail_scores and max(tail_scores) > 0


# ------------------------------------------------------------
# (s42 audit, mutant D71) LTE4G routes by COSINE similarity to the class centroids.
#
# PROTOCOL_AND_BASELINES.md §2.11 step 2: "A test or val node is routed to the tail student if the
# argmax over i of cos(embedding, centroid_i) is ≥ sep_point"; `lte4g_steps.route_to_tail`:
# "top-1 cosine similarity to the centroids". The suite's routing test uses unit-norm centroids,
# so a dot product with un-normalised centroids (centroids are means of embeddings: their norms
# differ by class) passed it.
def test_routing_ignores_the_centroids_norms():
    """Node 0 points along the head centroid's direction (cos 1 vs 0.6) but the tail centroid is
    10x longer: cosine routes it to the head; a dot product would send it to the tail. Scaling
    every centroid or embedding by a positive factor changes nothing."""
    centroids = torch.tensor([[1.0, 0.0], [6.0, 8.0]])          # head (label 0), tail (label 1)
    embed = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, -1.0], [1.0, 0.3]])
    want = [False, True, False, False]            # cos: (1, .6) (.6, 1) (0, -.8) ...
    assert st.route_to_tail(embed, centroids, 1).tolist() == want
    scaled = centroids * torch.tensor([[0.1], [7.0]])
    assert st.route_to_tail(3.0 * embed, scaled, 1).tolist() == want
    cos = torch.nn.functional.cosine_similarity(embed[:, None, :], centroids[None], dim=2)
    assert (cos.argmax(1) >= 1).tolist() == want                  # the rule, written out


# ------------------------------------------------------------
# (s42 audit, mutant D73) LTE4G's experts run at most min(expert_ep, the loop's epochs).
#
# `BaselineConfig` docstring: "expert_ep (1000; also capped at the loop's epochs, as the official
# ``epoch + 1 == args.ep`` test does)"; lte4g.py: "up to min(expert_ep, loop epochs) epochs (the
# official loop also stops at ``ep``)". With the cap dropped a 3-epoch run trained each expert up
# to expert_ep epochs; the suite stayed green.
@pytest.mark.parametrize("loop_epochs, expert_ep, cap", [(3, 1000, 3), (12, 5, 5)])
def test_experts_stop_at_the_smaller_of_expert_ep_and_the_loop_epochs(graph_data, loop_epochs,
                                                                      expert_ep, cap):
    """A patience longer than either bound: every trained expert runs exactly ``cap`` epochs."""
    g, graph, train, val = graph_data
    ctx = MethodContext(g.x, g.y, graph, train, g.num_classes,
                        torch.Generator().manual_seed(0), val_idx=val)
    m = build_method(ctx, BaselineConfig(method="lte4g", hidden=8, expert_ep=expert_ep,
                                         expert_patience=10_000, curriculum_ep=2))
    m.after_fit(val, epochs=loop_epochs)
    log = m.stage_log["experts"]
    trained = [k for k in GROUPS if log[k]["train_nodes"]]
    assert len(trained) >= 3
    assert all(log[k]["epochs_run"] == cap for k in trained), log


# ------------------------------------------------------------
# (s42 audit, mutant D55) GraphMixup's ``self_loops`` option changes its adjacency.
#
# `BaselineConfig` / config.FAITHFUL: "self_loops: GraphMixup: False: raw A without self-loops
# (official); True: A+I as the other baselines"; graphmixup.py: "A the raw binarised adjacency
# without self-loops as the official code (``self_loops=True``: A+I)". The suite's dense
# reference reads the model's own graph, so with ``self_loops=True`` silently ignored (raw A
# either way) it stayed green.
@pytest.fixture(scope="module")
def tiny():
    g = make_synthetic_graph(80, num_classes=4, avg_degree=3, num_features=6, seed=3)
    return g, prepare_graph(g.edge_index, g.num_nodes)


@pytest.mark.parametrize("self_loops", [False, True])
def test_graphmixup_adjacency_is_raw_a_or_a_plus_i(tiny, self_loops):
    """adj_norm none: the operator is exactly the binarised A off the diagonal, and its diagonal
    is all 1 (A+I) or all 0 (raw A), whatever the prepared graph's own self-loops."""
    g, graph = tiny
    n = g.num_nodes
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:k] for c, k in enumerate((8, 6, 2, 1))])
    ctx = MethodContext(g.x, g.y, graph, train, g.num_classes, torch.Generator().manual_seed(0),
                        epochs=20, patience=5)
    m = build_method(ctx, BaselineConfig(method="graphmixup", hidden=8, im_class_num=2, k_num=20,
                                         clu_nclass=4, adj_norm="none", self_loops=self_loops))
    dense = m.adj.to_dense()
    a = torch.zeros(n, n)
    a[g.edge_index[0], g.edge_index[1]] = 1.0
    a = ((a + a.T) > 0).float()
    a.fill_diagonal_(0.0)
    off = ~torch.eye(n, dtype=torch.bool)
    assert torch.equal(dense[off], a[off])
    assert torch.equal(dense.diagonal(), torch.full((n,), 1.0 if self_loops else 0.0))


# ------------------------------------------------------------
# (s42 audit, mutant D79) GraphMixup's Q-agent is ε-greedy with P(greedy) = 0.9.
#
# PROTOCOL_AND_BASELINES.md §2.8 Q-learning: "greedy with probability 0.9, otherwise a random
# action"; `QLearningScale`: "ε-greedy with P(greedy) = 0.9 (ties broken at random)". The suite
# checks the update rule, but an agent greedy only 10 % of the time passed it.
def test_choose_takes_the_better_action_95_percent_of_the_time():
    """Q = [1, 0] at state 0.0: P(action 0) = 0.9 + 0.1·½ = 0.95; 4,000 draws (standard error
    0.0034) must land within ±0.02 (5.8 of them); greedy 10 % would give 0.55. With Q tied,
    both actions are taken about half the time."""
    agent = QLearningScale(torch.Generator().manual_seed(0))
    agent.q[str(0.0)] = [1.0, 0.0]
    picks = [agent.choose(0.0) for _ in range(4000)]
    share = picks.count(0) / len(picks)
    assert abs(share - 0.95) < 0.02
    agent.q[str(0.5)] = [0.0, 0.0]
    tied = [agent.choose(0.5) for _ in range(4000)]
    assert abs(tied.count(0) / 4000 - 0.5) < 0.04


# ------------------------------------------------------------
# (s42 audit, mutant D86) `mixup_targets.sample_distinct` is uniform over [0, total)
# on its repeated-draw path (total > 4k), as on its permutation path.
#
# Docstring: "min(k, total) distinct ints in [0, total), uniform, in O(k) memory ... else repeated
# draws keeping the first occurrence of each value until there are k". GraphMixup draws its
# local-path pairs with it (module docstring step 2), and the dense test oracle uses the same
# function, so keeping the k SMALLEST distinct draws (sorted ``unique``) instead of the first k —
# pairs biased to the lowest-numbered sources — passed the suite.
@pytest.mark.parametrize("total, k", [(10**6, 400), (5_000, 1_000), (1_001, 250)])
def test_repeated_draw_path_is_distinct_and_uniform(total, k):
    """k distinct values in range; their mean within ±5 standard errors of (total − 1)/2 and
    both the lowest and the highest tenth of the range hit (a biased draw keeps the values
    of the lowest half only)."""
    assert total > 4 * k                                  # the repeated-draw path
    out = sample_distinct(total, k, torch.Generator().manual_seed(0))
    assert out.dtype == torch.long and out.numel() == k
    assert out.unique().numel() == k
    assert int(out.min()) >= 0 and int(out.max()) < total
    se = total / math.sqrt(12 * k)
    assert abs(float(out.double().mean()) - (total - 1) / 2) < 5 * se
    assert int(out.max()) >= 0.9 * total and int(out.min()) < 0.1 * total


def test_sample_distinct_same_generator_same_draws():
    """Deterministic given the generator (docstring), different for another seed."""
    a = sample_distinct(10**6, 300, torch.Generator().manual_seed(7))
    b = sample_distinct(10**6, 300, torch.Generator().manual_seed(7))
    c = sample_distinct(10**6, 300, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


# ------------------------------------------------------------
# (s42 audit, mutant D101) without pymetis, GraphMixup's global-path parts are
# consecutive runs of the BFS order.
#
# `mixup_targets.bfs_partition`: "the nodes in BFS order (component by component, each from its
# lowest id) cut into ``parts`` consecutive runs of ⌈n/parts⌉ — connected-ish balanced parts".
# The suite's global-path tests take the partition as given, so a round-robin assignment (node
# i -> i mod parts: every part scattered over the whole graph, its 'centre' meaningless) passed.
def _graph(edges, n):
    e = torch.tensor(edges, dtype=torch.long).t()
    return raw_adjacency(prepare_graph(torch.cat([e, e.flip(0)], 1), n), False)


def test_path_graph_is_cut_into_consecutive_runs():
    """A path 0-1-…-11: BFS order from 0 is 0..11, so 3 parts are {0..3}, {4..7}, {8..11}; 5
    parts of ⌈12/5⌉ = 3 give 0 0 0 1 1 1 2 2 2 3 3 3 (part 4 empty)."""
    g = _graph([(i, i + 1) for i in range(11)], 12)
    assert bfs_partition(g, 3).tolist() == (np.arange(12) // 4).tolist()
    assert bfs_partition(g, 5).tolist() == (np.arange(12) // 3).tolist()


def test_components_in_order_of_their_lowest_id_and_each_part_connected():
    """Two paths, 0-2-4-6-8 and 1-3-5-7-9 (ids interleaved): BFS order 0 2 4 6 8 | 1 3 5 7 9,
    2 parts = the two components."""
    g = _graph([(0, 2), (2, 4), (4, 6), (6, 8), (1, 3), (3, 5), (5, 7), (7, 9)], 10)
    part = bfs_partition(g, 2)
    assert part[[0, 2, 4, 6, 8]].tolist() == [0] * 5
    assert part[[1, 3, 5, 7, 9]].tolist() == [1] * 5


# ------------------------------------------------------------
# (s42 audit, mutant D65) GraphENS's degree histogram is over the neighbours WITHOUT the
# harness's self-loops.
#
# graphens.py docstring: "d_i drawn from the degree histogram"; Deviations: "a self-loop of the
# harness's A+I is not a neighbour in N or the degree (the official data has none; the conv adds
# its own)"; PROTOCOL §2.10 [RECOMMEND] "Remove the harness's self-loops before computing
# neighbour distributions and degrees". Counting the self-loop (every degree + 1) shifts the
# sampled ego-network sizes up by one; the suite stayed green.
def test_degree_histogram_counts_neighbours_without_self_loops():
    g = make_synthetic_graph(80, num_classes=4, avg_degree=6, num_features=20, seed=4)
    graph = prepare_graph(g.edge_index, g.num_nodes)
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:k] for c, k in enumerate((9, 5, 2, 1))])
    ctx = MethodContext(g.x, g.y, graph, train, 4, torch.Generator().manual_seed(1))
    m = build_method(ctx, BaselineConfig(method="graphens", hidden=8))
    n = g.num_nodes
    a = torch.zeros(n, n, dtype=torch.bool)
    a[g.edge_index[0], g.edge_index[1]] = True
    a = (a | a.T) & ~torch.eye(n, dtype=torch.bool)
    deg = a.sum(1)
    assert torch.equal(m.deg.cpu(), deg)
    assert torch.equal(m.degree_hist, torch.bincount(deg).double())
    assert float(m.degree_hist[0]) == float((deg == 0).sum())      # isolated nodes: degree 0
