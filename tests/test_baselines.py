"""Baselines' characteristic steps (PROTOCOL_AND_BASELINES.md §1.5, §2): tail classes, the
up_scale rules' synthetic-node counts, SMOTE's same-class nearest neighbour and interpolation,
re-weighting's class weights, the sparse over-sampling graph against the official dense build,
every method's sparse forward against the same model on dense matrices, bad configurations."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hiertail_fast.baselines import METHODS, BaselineConfig, MethodContext, build_method, sampling
from hiertail_fast.baselines.config import METHOD_FIELDS
from hiertail_fast.baselines.layers import adjacency_operator
from hiertail_fast.baselines.methods import OwnArchitectureMethod, reweight_class_weights
from hiertail_fast.baselines.sampling import (
    augment_adjacency,
    augment_adjacency_dense,
    same_class_nearest_neighbour,
    smote_interpolate,
    tail_classes,
    upsample_rounds,
)
from hiertail_fast.data.synthetic import make_synthetic_graph
from hiertail_fast.nn.hiertail import prepare_graph

pytestmark = pytest.mark.usefixtures("one_thread")


def _labels(train_counts):
    """y and a train_idx holding train_counts[c] nodes of class c (interleaved order)."""
    y = torch.cat([torch.full((k + 2,), c) for c, k in enumerate(train_counts)])
    train = torch.cat([torch.nonzero(y == c).flatten()[:k] for c, k in enumerate(train_counts)])
    return y, train[torch.randperm(train.numel())]


def test_tail_classes_are_the_last_labels_in_official_order():
    assert tail_classes(10, 3) == [9, 8, 7]
    assert tail_classes(3, 3) == [2, 1, 0]
    for bad in (0, 4):
        with pytest.raises(ValueError, match="im_class_num"):
            tail_classes(3, bad)


# train counts 10, 8, 6, 4, 3 (31 nodes, C = 5, avg = 6): tail classes 4, 3, 2 with 3, 4, 6.
@pytest.mark.parametrize("rule, k, sizes", [
    ("src", 1.0, [[3], [4], [6]]),
    ("src", 1.5, [[3, 1], [4, 2], [6, 3]]),
    ("src", 2.0, [[3, 3], [4, 4], [6, 6]]),
    ("src", 0.0, [[3, 3], [4], [6]]),             # ⌊avg/n_c⌋ = 2, 1, 1 copies
    ("smote", 1.0, [[3], [4], [6]]),
    ("smote", 0.0, [[3, 3], [4, 2], [6]]),        # + ⌊(avg/n_c − ⌊avg/n_c⌋)·n_c⌋ = 0, 2, 0
    ("recon", 1.0, [[3], [4], [6]]),
    ("recon", 0.5, [[1], [2], [3]]),
    ("recon", 2.0, [[3], [4], [6]]),              # one round whatever k > 0
    ("recon", 0.0, [[3, 3], [4], [6]]),
])
def test_upsample_rounds_counts(rule, k, sizes):
    y, train = _labels([10, 8, 6, 4, 3])
    rounds = upsample_rounds(y, train, 5, 3, k, rule)
    expect = [(c, m) for c, ms in zip((4, 3, 2), sizes, strict=True) for m in ms]
    assert [(c, r.numel()) for c, r in rounds] == expect
    for c, r in rounds:                            # the FIRST nodes of T_c, in train order
        t_c = train[y[train] == c]
        assert torch.equal(r, t_c[: r.numel()])


def test_upsample_average_is_floored():
    """avg = ⌊|train| / C⌋ (the official int()): 33 training nodes of 5 classes give 6, not
    round(6.6) = 7; the suite's 31 nodes (6.2) could not tell them apart (a mutation audit).
    SMOTE's up_scale 0 adds int(n_c·(avg/n_c − ⌊avg/n_c⌋)) nodes to classes 4, 3, 2 (n_c 5,
    4, 6): 0 (5·0.19999999999999996, the official float arithmetic), 2 and 0; avg 7 would give
    1, 3 and 1."""
    y, train = _labels([10, 8, 6, 4, 5])
    rounds = upsample_rounds(y, train, 5, 3, 0.0, "smote")
    assert [(c, r.numel()) for c, r in rounds] == [(4, 5), (3, 4), (3, 2), (2, 6)]


def test_upsample_rounds_skip_empty_classes_and_bad_rule():
    y, train = _labels([5, 4, 0])
    assert [c for c, _ in upsample_rounds(y, train, 3, 2, 1.0, "src")] == [1]
    with pytest.raises(ValueError, match="rule"):
        upsample_rounds(y, train, 3, 2, 1.0, "adasyn")
    with pytest.raises(ValueError, match="up_scale"):
        upsample_rounds(y, train, 3, 2, -1.0, "src")


def test_nearest_neighbour_hand_computed():
    x = torch.tensor([[0.0], [1.0], [3.0], [10.0]])
    assert same_class_nearest_neighbour(x).tolist() == [1, 0, 1, 2]
    ties = torch.tensor([[0.0, 0.0], [1.0, 0.0], [-1.0, 0.0]])
    assert same_class_nearest_neighbour(ties)[0] == 1          # lowest index on ties
    assert same_class_nearest_neighbour(torch.ones(1, 3)).tolist() == [0]   # itself
    dup = torch.tensor([[2.0], [2.0], [5.0]])
    assert same_class_nearest_neighbour(dup).tolist() == [1, 0, 0]   # never itself


def test_nearest_neighbour_matches_scipy_pdist_blocked(monkeypatch):
    from scipy.spatial.distance import pdist, squareform
    x = torch.randn(23, 5)
    d = squareform(pdist(x.numpy()))
    np.fill_diagonal(d, d.max() + 100)                          # the official recipe
    monkeypatch.setattr(sampling, "_NN_BLOCK", 4)               # several row blocks
    assert same_class_nearest_neighbour(x).tolist() == d.argmin(axis=-1).tolist()


@pytest.mark.parametrize("per_node", [False, True])
def test_smote_interpolate_lambda_and_gradients(per_node):
    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    nn_idx = same_class_nearest_neighbour(x)
    new = smote_interpolate(x, nn_idx, torch.Generator().manual_seed(3), per_node)
    again = smote_interpolate(x, nn_idx, torch.Generator().manual_seed(3), per_node)
    torch.testing.assert_close(new, again)                      # same seed, same nodes
    lam = ((new - x) / (x[nn_idx] - x)).detach()
    assert ((lam >= 0) & (lam <= 1)).all()
    per_row = lam[:, 0]
    torch.testing.assert_close(lam, per_row[:, None].expand_as(lam))
    assert (float(per_row.max() - per_row.min()) > 1e-6) == per_node   # official: one λ/round
    new.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_reweight_class_weights_and_loss():
    w = reweight_class_weights(6, 2, 1.0)
    assert w.tolist() == [1, 1, 1, 1, 2, 2]
    assert reweight_class_weights(4, 1, 0.5).tolist() == [1, 1, 1, 1.5]
    logits, y = torch.randn(8, 6), torch.tensor([0, 5, 4, 1, 5, 2, 3, 4])
    ce = F.cross_entropy(logits, y, reduction="none")
    expect = (w[y] * ce).sum() / w[y].sum()
    torch.testing.assert_close(F.cross_entropy(logits, y, weight=w), expect)


@pytest.fixture(scope="module")
def tiny():
    g = make_synthetic_graph(60, num_classes=4, avg_degree=5, num_features=6, seed=2)
    return g, prepare_graph(g.edge_index, g.num_nodes)


def _dense(graph, norm="none"):
    return adjacency_operator(graph, norm).to_dense()


@pytest.mark.parametrize("weighted", [False, True])
def test_augment_adjacency_matches_official_dense(tiny, weighted):
    _, graph = tiny
    if weighted:                       # generic weights, not symmetric: rows vs columns matter
        from hiertail_fast.graph import CSRGraph
        w = torch.rand(graph.num_edges) + 0.5
        graph = CSRGraph(graph.indptr, graph.indices, w, graph.num_nodes)
    sources = torch.tensor([3, 5, 3, 7, 5, 0, int(graph.indices[graph.indptr[3]])])
    sparse = _dense(augment_adjacency(graph, sources))
    dense = augment_adjacency_dense(_dense(graph), sources)
    torch.testing.assert_close(sparse, dense, rtol=0, atol=0)
    assert sparse[60, 3] == dense[3, 3] and sparse[60, 62] != 0   # copy–source, copy–copy
    empty = augment_adjacency(graph, torch.zeros(0, dtype=torch.long))
    torch.testing.assert_close(_dense(empty), _dense(graph))
    with pytest.raises(ValueError, match="sources"):
        augment_adjacency(graph, torch.tensor([60]))


def test_row_normalisation():
    from hiertail_fast.graph import CSRGraph
    g = CSRGraph.from_edge_index(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 2]]), num_nodes=4)
    a = _dense(g)
    torch.testing.assert_close(_dense(g, "row"), a / a.sum(1, keepdim=True).clamp_min(1))
    with pytest.raises(ValueError, match="norm"):
        adjacency_operator(g, "sym")
    # the graph's float32 weights as they are, both norms (through float16 they were 0.12347:
    # a mutation pass, session 73)
    w = CSRGraph(torch.tensor([0, 2, 4]), torch.tensor([0, 1, 0, 1]),
                 torch.tensor([1.0, 0.1234567, 0.1234567, 1.0]), 2)
    assert _dense(w)[0, 1].item() == torch.tensor(0.1234567).item()
    assert _dense(w, "row")[0, 1].item() == pytest.approx(0.1234567 / 1.1234567, rel=1e-6)


def _ctx(g, graph, seed=0):
    """Training nodes: the first 4 of every class (tail classes with several nodes);
    validation nodes: the next 2."""
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:4] for c in range(g.num_classes)])
    val = torch.cat([torch.nonzero(g.y == c).flatten()[4:6] for c in range(g.num_classes)])
    return MethodContext(g.x, g.y, graph, train, g.num_classes,
                         torch.Generator().manual_seed(seed), val_idx=val)


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("norm", ["none", "row"])
def test_sparse_forward_matches_dense_reference(tiny, method, norm):
    if issubclass(METHODS[method], OwnArchitectureMethod):   # no encoder / classifier on Â
        pytest.skip("own aggregation and dense reference: tests/test_baselines_<method>.py")
    g, graph = tiny
    tail = {"im_class_num": 2} if "im_class_num" in METHOD_FIELDS[method] else {}
    cfg = BaselineConfig(method=method, hidden=8, adj_norm=norm, **tail)
    model = build_method(_ctx(g, graph), cfg).eval()
    a = _dense(getattr(model, "graph_mx", graph))    # GraphMixup: raw A, no self-loops
    x = g.x
    if hasattr(model, "sources"):          # over-sampling / SMOTE: the official dense build
        a = augment_adjacency_dense(a, model.sources)
        x = model.x_aug
    if norm == "row":                   # an isolated node's zero row stays 0
        a = a / a.sum(1, keepdim=True).clamp_min(1e-30)
    with torch.no_grad():
        expect = model(x, a)[: g.num_nodes]
        torch.testing.assert_close(model.predict(), expect, rtol=1e-4, atol=1e-4)
    loss = model.train().train_loss()
    loss.backward()
    # every parameter of the loop's stage (LTE4G's experts and students train after it)
    loop = [p for k, p in model.named_parameters() if not k.startswith(("experts.", "students."))]
    assert torch.isfinite(loss) and all(p.grad is not None for p in loop)


def test_smote_synthetic_nodes_same_seed_same_nodes(tiny):
    g, graph = tiny
    cfg = BaselineConfig(method="smote", hidden=8, im_class_num=2, up_scale=1.5)
    a, b = (build_method(_ctx(g, graph, seed=5), cfg) for _ in range(2))
    c = build_method(_ctx(g, graph, seed=6), cfg)
    assert a.num_synthetic == b.num_synthetic > 0
    torch.testing.assert_close(a.x_aug, b.x_aug, rtol=0, atol=0)
    assert not torch.equal(a.x_aug, c.x_aug)
    n, src = g.num_nodes, a.sources
    assert torch.equal(a.y_aug[n:], g.y[src])
    assert a.graph_aug.num_nodes == n + src.numel()
    # each synthetic node lies between its source and the source's nearest same-class
    # training node (within the round: the full class, then the first half for k = 1.5)
    pos = 0
    for _cls, r in upsample_rounds(g.y, a.ctx.train_idx, g.num_classes, 2, 1.5, "smote"):
        nb = r[same_class_nearest_neighbour(g.x[r])]
        new = a.x_aug[n + pos: n + pos + r.numel()]
        pos += r.numel()
        if r.numel() == 1:                     # a lone node interpolates with itself
            torch.testing.assert_close(new, g.x[r])
            continue
        lam = (new - g.x[r]) / (g.x[nb] - g.x[r])
        torch.testing.assert_close(lam, lam[:1, :1].expand_as(lam))
    assert pos == a.num_synthetic


def test_oversampling_copies_features_and_training_nodes(tiny):
    g, graph = tiny
    cfg = BaselineConfig(method="oversampling", hidden=8, im_class_num=2, up_scale=2.0)
    m = build_method(_ctx(g, graph), cfg)
    n, s = g.num_nodes, m.num_synthetic
    assert s == 2 * sum(int((g.y[m.ctx.train_idx] == c).sum()) for c in (2, 3))
    torch.testing.assert_close(m.x_aug[n:], g.x[m.sources])
    assert m.train_aug.numel() == m.ctx.train_idx.numel() + s


def test_embed_smote_synthetic_count_and_linear_head(tiny):
    g, graph = tiny
    m = build_method(_ctx(g, graph), BaselineConfig(method="embed_smote", hidden=8,
                                                    im_class_num=2, up_scale=0.5))
    t = m.ctx.y[m.ctx.train_idx]
    assert m.num_synthetic == sum(int(int((t == c).sum()) * 0.5) for c in (3, 2))
    assert m.classifier.conv is None


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(method="no_such_method"), ValueError, "unknown baseline"),
    (dict(hidden=True), TypeError, "hidden"),
    (dict(hidden=0), ValueError, "hidden"),
    (dict(im_class_num=2.0), TypeError, "im_class_num"),
    (dict(dropout=1.0), ValueError, "dropout"),
    (dict(lr=0.0), ValueError, "lr"),
    (dict(up_scale=-1.0), ValueError, "up_scale"),
    (dict(up_scale="1"), TypeError, "up_scale"),
    (dict(adj_norm="sym"), ValueError, "adj_norm"),
    (dict(smote_lambda="sample"), ValueError, "smote_lambda"),
    (dict(method="embed_smote", classifier="gnn"), ValueError, "Linear"),
    # a non-str method failed with "unhashable type: 'list'", naming no field
    (dict(method=["origin"]), TypeError, "method must be a str"),
    # τ below MIN_TEMPERATURE: GraphENS's logits / τ overflowed to inf, the softmax to NaN, and
    # neighbours and saliency masks were drawn from NaN without an error
    (dict(method="graphens", pred_temp=1e-300), ValueError, "pred_temp"),
    (dict(method="graphens", pred_temp=1e-30), ValueError, "pred_temp"),
    (dict(method="lte4g", kd_temperature=1e-300), ValueError, "kd_temperature"),
    (dict(method="lte4g", kd_temperature=1e7), ValueError, "kd_temperature"),
    # beyond float32: torch's "value cannot be converted to type float without overflow" at
    # the first optimiser step / class-weight tensor
    (dict(lr=1e300), ValueError, "lr=.*float32"),
    (dict(weight_decay=1e300), ValueError, "weight_decay=.*float32"),
    (dict(method="reweight", up_scale=1e300), ValueError, "up_scale=.*float32"),
    (dict(method="imgagn", gen_ratio=1e300), ValueError, "gen_ratio=.*float32"),
    (dict(method="graphsmote_t", rec_weight=1e300), ValueError, "rec_weight=.*float32"),
    (dict(method="graphmixup", dis_weight=1e300), ValueError, "dis_weight=.*float32"),
])
def test_bad_configs(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        BaselineConfig(**kwargs)


def test_config_takes_numpy_scalars_as_python_values():
    """numpy scalars (what an array of a grid holds) pass as the rest of the API lets them
    (check_seed, check_epochs_patience, check_flag) and are stored as Python values, so the
    record stays JSON-able; before, np.bool_ was refused as "must be a bool, got bool"."""
    import json
    cfg = BaselineConfig(method="graphsmote_o", hidden=np.int64(8), dropout=np.float32(0.25),
                         up_scale=np.float64(1.5), im_class_num=np.int32(2),
                         edge_grad=np.bool_(True))
    assert (type(cfg.hidden), type(cfg.dropout), type(cfg.edge_grad)) == (int, float, bool)
    assert cfg == BaselineConfig(method="graphsmote_o", hidden=8, dropout=0.25, up_scale=1.5,
                                 im_class_num=2, edge_grad=True)
    json.dumps(cfg.to_dict())
    with pytest.raises(TypeError, match="hidden"):
        BaselineConfig(hidden=np.bool_(True))          # a bool is still no count
    with pytest.raises(ValueError, match="dropout"):
        BaselineConfig(dropout=np.float32("nan"))


def test_enormous_up_sampling_is_a_clear_error(tiny):
    """An up_scale / gen_ratio asking for more synthetic nodes than a graph can hold failed
    deep inside a list or tensor allocation (OverflowError "cannot fit 'int' into an
    index-sized integer", TypeError from torch.zeros)."""
    from hiertail_fast.baselines.graphmixup import mixup_rounds
    g, graph = tiny
    y, train = _labels([10, 8, 6, 4, 3])
    for rule in ("src", "smote"):
        with pytest.raises(ValueError, match="up_scale=.*synthetic nodes"):
            upsample_rounds(y, train, 5, 3, 3e38, rule)
    assert len(upsample_rounds(y, train, 5, 3, 3e38, "recon")) == 3   # one round whatever k
    # the cap counts the whole graph's synthetic nodes: each of three tail classes within
    # it made 3x it (a baselines audit, session 67)
    y3, train3 = torch.arange(90) % 3, torch.arange(30)     # 10 training nodes per class
    with pytest.raises(ValueError, match=r"up_scale=900.0 asks for 27000 synthetic nodes, "
                       r"more than 100x the graph's 90 nodes"):
        upsample_rounds(y3, train3, 3, 3, 900.0, "src")
    assert sum(r.numel() for _, r in upsample_rounds(y3, train3, 3, 3, 300.0, "src")) == 9000
    with pytest.raises(ValueError, match="up_scale=.*synthetic nodes"):
        mixup_rounds(y, train, 5, 3, 3e38, 0.0)
    for method, kw in (("smote", dict(up_scale=3e38)), ("oversampling", dict(up_scale=3e38)),
                       ("imgagn", dict(gen_ratio=3e38))):
        cfg = BaselineConfig(method=method, hidden=8, im_class_num=2, **kw)
        with pytest.raises(ValueError, match="synthetic nodes"):
            build_method(_ctx(g, graph), cfg)


def test_synthetic_count_is_refused_when_the_graph_would_exceed_max_nodes():
    """check_synthetic_count: the graph's nodes plus the synthetic ones must fit MAX_NODES,
    even when the synthetic count alone does and stays under 100x the graph."""
    from hiertail_fast._validation import MAX_NODES

    with pytest.raises(ValueError, match=r"up_scale=2 asks for 20 synthetic nodes; with the "
                       r"graph's \d+ that exceeds the \d+ nodes a graph can hold"):
        sampling.check_synthetic_count(20, MAX_NODES - 10, "up_scale=2")
    sampling.check_synthetic_count(10, MAX_NODES - 10, "up_scale=2")


def test_bad_build(tiny):
    g, graph = tiny
    # every method with tail classes checks their number when it is built (a mutation pass,
    # session 73: GraphMixup, which does not check it again later, was built for 5 of 4)
    for method in [m for m, fields in METHOD_FIELDS.items() if "im_class_num" in fields]:
        with pytest.raises(ValueError, match=r"im_class_num must lie in \[1, num_classes=4\], "
                           "got 5"):
            build_method(_ctx(g, graph), BaselineConfig(method=method, im_class_num=5))
    with pytest.raises(TypeError, match="BaselineConfig"):
        build_method(_ctx(g, graph), {"method": "origin"})
    with pytest.raises(ValueError, match="disagree"):
        MethodContext(g.x[:-1], g.y, graph, torch.arange(3), 4, torch.Generator())
    # a graph of another size than x and y (the same mutation pass: it was taken)
    other = prepare_graph(g.edge_index, g.num_nodes + 2)
    with pytest.raises(ValueError, match=r"and the graph \(62 nodes\) disagree"):
        MethodContext(g.x, g.y, other, torch.arange(3), 4, torch.Generator())


def test_method_context_names_bad_indices_and_labels(tiny):
    # a PyG-style boolean mask was read as node ids 0 and 1 by the up-sampling methods (no
    # synthetic nodes, a loss on two nodes), and labels past num_classes or node ids past n
    # failed deep inside torch (a baselines audit, session 67)
    g, graph = tiny
    n, gen = g.num_nodes, torch.Generator()
    mask = torch.arange(n) % 2 == 0
    with pytest.raises(TypeError, match=r"train_idx must hold node ids .* boolean mask: pass "
                       r"mask.nonzero\(\).view\(-1\)"):
        MethodContext(g.x, g.y, graph, mask, 4, gen)
    with pytest.raises(TypeError, match="val_idx must hold node ids"):
        MethodContext(g.x, g.y, graph, torch.arange(3), 4, gen, val_idx=mask)
    with pytest.raises(ValueError,
                       match=f"train_idx refers to node {n} but the graph has {n} nodes"):
        MethodContext(g.x, g.y, graph, torch.tensor([0, n]), 4, gen)
    with pytest.raises(ValueError, match="train_idx has negative entries"):
        MethodContext(g.x, g.y, graph, torch.tensor([0, -1]), 4, gen)
    with pytest.raises(TypeError, match="train_idx must be an integer tensor"):
        MethodContext(g.x, g.y, graph, torch.zeros(2), 4, gen)
    with pytest.raises(ValueError, match=r"the labels go up to 3 but num_classes is 3: "
                       r"labels must lie in \[0, 3\)"):
        MethodContext(g.x, g.y, graph, torch.arange(3), 3, gen)
    MethodContext(g.x, g.y, graph, mask.nonzero().view(-1), 4, gen)    # the fix it names


def test_method_context_refuses_what_gave_nan_or_failed_deep_inside(tiny):
    # an API audit (session 68): an empty train_idx gave a NaN loss and a NaN x NaN logits,
    # silently; a repeated node counted twice; an int / 1-D x, an edge_index for the graph and
    # a str num_classes failed inside torch (HierTail's loss refused the first three already)
    g, graph = tiny
    gen = torch.Generator()
    ok = torch.arange(0, g.num_nodes, 4)
    for kwargs, exc, message in (
            (dict(train_idx=torch.tensor([], dtype=torch.long)), ValueError,
             "train_idx must be a non-empty 1-D index tensor"),
            (dict(train_idx=torch.tensor([1, 1, 2])), ValueError,
             "train_idx has duplicate node ids"),
            (dict(val_idx=torch.tensor([3, 3])), ValueError, "val_idx has duplicate node ids"),
            (dict(x=torch.full_like(g.x, float("nan"))), ValueError, "x contains NaN or Inf"),
            (dict(x=g.x.long()), TypeError, "x must be a floating-point tensor"),
            (dict(x=g.x[:, 0]), ValueError, r"x must be 2-D \[n, d\]"),
            (dict(x=g.x.to("meta")), ValueError, "x is on the meta device"),
            (dict(x=g.x.tolist()), TypeError, "x must be a torch.Tensor"),
            (dict(y=g.y.tolist()), TypeError, "y must be a torch.Tensor"),
            (dict(graph=g.edge_index), TypeError, "graph must be a CSRGraph"),
            (dict(graph=graph.to("meta")), ValueError, "the graph is on meta but x is on cpu"),
            (dict(num_classes="4"), TypeError, "num_classes must be an int")):
        args = dict(x=g.x, y=g.y, graph=graph, train_idx=ok, num_classes=4, generator=gen)
        args.update(kwargs)
        with pytest.raises(exc, match=message):
            MethodContext(**args)
    ctx = MethodContext(g.x, g.y, graph, ok, np.int64(4), gen, val_idx=torch.tensor([1, 2]))
    assert ctx.num_classes == 4 and type(ctx.num_classes) is int


def test_config_replace_with_another_method_takes_its_defaults():
    # replace(method=...) kept the old method's resolved hidden / dropout / lr / up_scale /
    # self_loops (GraphMixup ran with origin's 64 / 0.5 / 0.01 / 1 / True; a baselines audit)
    import pickle
    for method in ("graphmixup", "graphens", "imgagn", "origin"):
        assert BaselineConfig().replace(method=method) == BaselineConfig(method=method)
        assert (BaselineConfig(method="graphmixup").replace(method=method)
                == BaselineConfig(method=method))
    # values the user gave stay, under another method and through a pickle
    mine = pickle.loads(pickle.dumps(BaselineConfig(hidden=64, lr=0.05)))
    moved = mine.replace(method="graphmixup")
    assert (moved.hidden, moved.lr, moved.dropout) == (64, 0.05, 0.1)
    assert moved.replace(method="graphmixup", hidden=32).hidden == 32
    # the same method: nothing resolved again
    assert BaselineConfig(method="graphmixup").replace(dropout=0.2).hidden == 128
    # through a chain of replace calls (a review, session 67): the first one's copy forgot
    # which fields were left to the method
    chained = BaselineConfig().replace(weight_decay=1e-4).replace(method="graphmixup")
    assert chained == BaselineConfig(method="graphmixup", weight_decay=1e-4)
    back = BaselineConfig(method="graphmixup").replace(lr=0.002).replace(method="origin")
    assert back == BaselineConfig(method="origin", lr=0.002)
    assert BaselineConfig().replace(hidden=32).replace(method="graphmixup").hidden == 32
    assert BaselineConfig().replace(lr=None).replace(method="graphmixup").lr == 1e-3


def test_config_refuses_another_methods_options():
    # accepted and ignored before, and left out of to_dict's record: imgagn ran row-normalised
    # under adj_norm="none", origin ran without the tail options it was given (a baselines
    # audit, session 67); the CLI refused the same combinations
    import dataclasses
    for kw, text in ((dict(method="imgagn", adj_norm="none"), "adj_norm='none'"),
                     (dict(method="graphens", classifier="mlp"), "classifier='mlp'"),
                     (dict(method="origin", im_class_num=2, up_scale=3),
                      "im_class_num=2, up_scale=3"),
                     (dict(method="origin", k_num=5), "k_num=5"),
                     (dict(method="lte4g", smote_lambda="node"), "smote_lambda='node'"),
                     (dict(method="smote", self_loops=False), "self_loops=False")):
        with pytest.raises(ValueError, match=rf"^{re.escape(text)}: not an option of method "
                           rf"'{kw['method']}' \(used by "):
            BaselineConfig(**kw)
    # a value's own check comes first; a default given back (dataclasses.replace) is no option
    with pytest.raises(TypeError, match="k_num must be an int"):
        BaselineConfig(method="origin", k_num=5.5)
    for method in ("origin", "graphmixup", "imgagn"):
        cfg = BaselineConfig(method=method)
        assert dataclasses.replace(cfg, weight_decay=0.0).hidden == cfg.hidden
        assert BaselineConfig(method=method, up_scale=cfg.up_scale,
                              self_loops=cfg.self_loops) == cfg


def test_config_records_faithful_choices():
    d = BaselineConfig(method="smote", adj_norm="row").to_dict()
    assert d["method"] == "smote" and d["classifier"] == "gnn"
    assert d["faithful"]["adj_norm"]["is_official"] is False
    assert d["faithful"]["smote_lambda"]["is_official"] is True
    o = BaselineConfig(method="origin").to_dict()
    assert "smote_lambda" not in o and "up_scale" not in o
    assert BaselineConfig(method="embed_smote").to_dict()["classifier"] == "mlp"


def test_config_bounds_of_rates_and_weights():
    """lr_expert must be > 0 and focal_alpha >= 0 (ValueError naming the field, as lr and
    focal_gamma); the documented closed ends of the ranges are accepted: keep_prob 1,
    disc_steps 1, dropout 0, lr_expert / focal_alpha tiny or 0."""
    for kw, text in ((dict(lr_expert=0.0), "lr_expert must be > 0"),
                     (dict(lr_expert=-0.01), "lr_expert must be > 0"),
                     (dict(focal_alpha=-0.5), "focal_alpha must be >= 0")):
        with pytest.raises(ValueError, match=text):
            BaselineConfig(method="lte4g", **kw)
    assert BaselineConfig(method="lte4g", lr_expert=1e-6, focal_alpha=0.0).focal_alpha == 0.0
    assert BaselineConfig(method="graphens", keep_prob=1.0).keep_prob == 1.0
    assert BaselineConfig(method="imgagn", disc_steps=1, dropout=0.0).disc_steps == 1
