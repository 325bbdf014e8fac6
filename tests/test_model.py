"""HierTail model: shapes, pool sizes, loss wiring against the references, gradients, BCL labels,
backends, determinism, the official layout against an independent dense re-implementation."""
from __future__ import annotations

import copy
import math

import numpy as np
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
    # the second level keeps ceil(C/2): C = 42 and 7 cannot tell it from round() (3.5 -> 4 under
    # banker's rounding); odd counts such as Wiki's 17 can (a mutation audit)
    for c in (1, 2, 3, 5, 9, 13, 17, 21, 38, 70):
        assert HierTailConfig.paper().pool_sizes(1000, c) == [c, math.ceil(c / 2)], c
    # a later ratio of exactly 1.0 is PyG's count 1 (an int), not the fraction 1.0, which
    # keeps every node (equal as numbers: a mutation audit found the type unchecked)
    sizes = off.replace(pool_ratios=(1.0, 1.0, 0.5)).pool_sizes(100, 10)
    assert sizes == [10, 1, 0.5] and [type(k) for k in sizes] == [int, int, float]


def test_paper_classifier_reads_the_activated_last_conv(tiny):
    """Paper config: logits = Linear(act(last up conv)), and ``hidden`` is that input. Without
    the activation before the classifier every test passed (a mutation audit)."""
    x, graph, _, _ = tiny
    model = _model("paper").eval()
    with torch.no_grad():
        out = model(x, graph)
    assert model.config.activation == "relu" and model.classifier is not None
    assert float(out.hidden.min()) == 0.0 and float(out.hidden.max()) > 0.0   # ReLU'd
    torch.testing.assert_close(out.logits, model.classifier(out.hidden), rtol=0, atol=0)


def test_paper_without_task_grouping_activates_before_the_classifier(tiny):
    """The ablation without task grouping (M1 off) keeps the paper head: logits =
    Linear(act(conv)), ``hidden`` its input (a mutation audit: the activation could go)."""
    x, graph, _, _ = tiny
    model = _model("paper", task_grouping=False, contrastive=False).eval()
    with torch.no_grad():
        out = model(x, graph)
    assert float(out.hidden.min()) == 0.0 and float(out.hidden.max()) > 0.0
    torch.testing.assert_close(out.logits, model.classifier(out.hidden), rtol=0, atol=0)


def test_initialisations_are_the_official_ones():
    """The official head N(0, 0.05²) with zero bias and TopKPool's p ~ U(±1/√d) (PyG's
    `uniform`): other constants passed every test (a mutation audit). A wide model so the
    sample statistics are tight."""
    from hiertail_fast.nn.pool import TopKPool

    torch.manual_seed(0)
    model = HierTail(64, 40, HierTailConfig.paper(hidden=512))
    w = model.classifier.weight
    assert w.numel() >= 20_000 and float(w.std()) == pytest.approx(0.05, rel=0.03)
    assert bool((model.classifier.bias == 0).all())
    pool = TopKPool(4096)
    bound = 1 / math.sqrt(4096)
    assert float(pool.weight.abs().max()) <= bound
    assert float(pool.weight.abs().max()) > 0.99 * bound
    assert float(pool.weight.std()) == pytest.approx(bound / math.sqrt(3), rel=0.05)


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


@pytest.mark.parametrize("name", CONFIGS)
def test_loss_is_the_same_for_train_nodes_in_any_order(tiny, name):
    """The train nodes in shuffled order give the loss of the sorted list (each label stays with
    its node's row); gathering the labels in sorted order while the rows follow the given order
    was caught only by an end-to-end accuracy bound (a mutation audit)."""
    x, g, y, tr = tiny
    model = _model(name).double()
    out = model(x.double(), g)
    shuffled = tr[torch.randperm(tr.numel(), generator=torch.Generator().manual_seed(1))]
    assert not torch.equal(shuffled, tr)
    torch.testing.assert_close(model.loss(out, y, shuffled).total, model.loss(out, y, tr).total,
                               rtol=1e-12, atol=1e-12)


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


# ------------------------------------------------------------- fuzz finds (s21 model_fuzz)
FLAGS = ("share_convs", "linear_classifier", "augment_a2", "improved", "fix_cluster_labels",
         "include_self", "task_grouping", "contrastive")


def test_config_switches_are_bools_and_numbers_refuse_bools():
    """share_convs="no" built shared convs (read by truthiness), gamma=True / lr=True passed as
    numbers. docs/GUARANTEES.md: a switch is a bool or numpy bool."""
    for name in FLAGS:
        for bad in ("no", 1, None):
            with pytest.raises(TypeError, match=f"{name} must be a bool"):
                HierTailConfig.paper(**{name: bad})
    cfg = HierTailConfig.paper(hidden=8, share_convs=np.True_, augment_a2=np.False_)
    assert cfg.share_convs is True and cfg.augment_a2 is False       # stored as bool
    model = HierTail(FEAT, C, cfg)
    assert model.down[0] is model.down[1]              # np.True_ shares, as True does
    separate = HierTail(FEAT, C, cfg.replace(share_convs=np.False_))
    assert separate.down[0] is not separate.down[1]
    for name, bad in (("gamma", True), ("lr", True), ("tau", np.True_), ("dropout", False),
                      ("weight_decay", "0"), ("pool_ratios", (True,)),
                      ("pool_rescale_power", True), ("hidden", np.True_)):
        with pytest.raises(TypeError, match=name):
            HierTailConfig.paper(**{name: bad})


@pytest.mark.parametrize("change, exc, field", [
    (dict(pool_rescale_power=1.5), TypeError, "pool_rescale_power"),
    (dict(pool_rescale_power=float("nan")), TypeError, "pool_rescale_power"),
    (dict(pool_ratios=(1e308,)), ValueError, "pool_ratios"),
    (dict(pool_ratios=(1.0, float("inf"))), ValueError, "pool_ratios"),
    (dict(pool_ratios=0.5), TypeError, "pool_ratios"),
    # unordered: a set's own order reordered the levels, a dict gave its keys (an nn audit)
    (dict(pool_ratios={1.0, 0.5}), TypeError, "pool_ratios"),
    (dict(pool_ratios={1.0: 0, 0.5: 1}), TypeError, "pool_ratios"),
    (dict(gamma=1e308), ValueError, "gamma"),
    (dict(gamma=float("nan")), ValueError, "gamma"),
    # accepted silently when their check was deleted (a mutation audit): an all-zero hidden
    # layer, nothing learned, a first level of 1 node, the official rescale skipped
    (dict(dropout=1.0), ValueError, "dropout"),
    (dict(lr=0.0), ValueError, "lr"),
    (dict(pool_ratios=(0.0, 0.5)), ValueError, "pool_ratios"),
    (dict(pool_rescale_power=0), ValueError, "pool_rescale_power"),
])
def test_config_refuses_what_failed_later(change, exc, field):
    """official(pool_rescale_power=1.5) failed in forward (TypeError on range()), pool_ratios
    (1e308,) with an OverflowError in ceil, gamma=1e308 made the loss inf: refused at
    construction, naming the field. gamma's bound is float32's range (the loss's dtype)."""
    for preset in ("paper", "official"):
        with pytest.raises(exc, match=field) as info:
            HierTailConfig.named(preset, **change)
        assert type(info.value) is exc
    assert HierTailConfig.paper(gamma=3e38).gamma == 3e38           # within float32's range


def test_pool_ratios_take_ordered_iterables():
    """Only the unordered are refused (a set or a dict's keys: the levels reordered); a range
    or a generator gives its levels in order, as before (a review of the change)."""
    assert HierTailConfig.paper(pool_ratios=range(1, 2)).pool_ratios == (1,)
    assert HierTailConfig.paper(pool_ratios=(r for r in (1.0, 0.5))).pool_ratios == (1.0, 0.5)
    assert HierTailConfig.paper(pool_ratios={"a": 1.0, "b": 0.5}.values()).pool_ratios == \
        (1.0, 0.5)
    with pytest.raises(TypeError, match="pool_ratios"):
        HierTailConfig.paper(pool_ratios={1.0: 0, 0.5: 1}.keys())


def test_official_bcl_counts_the_levels_pool_counts_sets():
    """bcl_mode='official' needs two levels; with pool_counts (which sets the levels) the
    check counted pool_ratios and refused a valid two-level config (an nn-module audit)."""
    cfg = HierTailConfig(bcl_mode="official", pool_ratios=(1.0,), pool_counts=(5, 3))
    assert cfg.num_levels == 2
    with pytest.raises(ValueError, match="needs at least two pooling levels"):
        HierTailConfig(bcl_mode="official", pool_ratios=(1.0, 0.5), pool_counts=(5,))
    with pytest.raises(ValueError, match="needs at least two pooling levels"):
        HierTailConfig(bcl_mode="official", pool_ratios=(1.0,))


def test_config_numpy_numbers_build_and_run(tiny):
    """hidden=np.int64(8) passed the config and GCNConv, then TopKPool refused it."""
    from hiertail_fast.nn.pool import TopKPool

    x, g, y, tr = tiny
    cfg = HierTailConfig.paper(hidden=np.int64(8), gamma=np.float32(0.5),
                               pool_ratios=np.array([1.0, 0.5]))
    assert type(cfg.hidden) is int and type(cfg.gamma) is float
    assert cfg.pool_ratios == (1.0, 0.5) and all(type(r) is float for r in cfg.pool_ratios)
    torch.manual_seed(0)
    out = HierTail(FEAT, C, cfg)(x, g)
    assert out.logits.shape == (N, C)
    assert TopKPool(np.int32(4)).weight.shape == (4,)
    for bad, exc, msg in ((True, TypeError, "must be an int, got bool"),
                          (2.0, TypeError, "must be an int, got float"),
                          ("3", TypeError, "must be an int, got str"),
                          (0, ValueError, "must be a positive int, got 0")):
        with pytest.raises(exc, match=f"channels {msg}"):
            TopKPool(bad)
    with pytest.raises(ValueError, match=r"x has 5 features, TopKPool\(4\) expects 4"):
        TopKPool(4)(torch.randn(6, 5), torch.tensor([[0, 1], [1, 0]]))


def test_config_dict_round_trip_is_exact():
    """HierTailConfig(**cfg.to_dict()) kept pool_ratios a list: unequal and unhashable."""
    import json

    for cfg in (HierTailConfig.paper(), HierTailConfig.official(),
                HierTailConfig.paper(pool_counts=(5, 2), loss_dtype=torch.bfloat16)):
        d = cfg.to_dict()
        assert isinstance(d["pool_ratios"], list)                    # JSON-able
        back = HierTailConfig(**json.loads(json.dumps(d)))
        assert back == cfg and hash(back) == hash(cfg)
        assert isinstance(back.pool_ratios, tuple)
    assert HierTailConfig.paper(pool_ratios=[1.0, 0.5]) == HierTailConfig.paper()


@pytest.mark.parametrize("args, exc, name", [
    ((4, 3.5), TypeError, "num_classes"), ((4, True), TypeError, "num_classes"),
    (("4", 3), TypeError, "in_channels"), ((4.0, 3), TypeError, "in_channels"),
    ((0, 3), ValueError, "in_channels"), ((4, -1), ValueError, "num_classes"),
])
def test_hiertail_checks_in_channels_and_num_classes(args, exc, name):
    """3.5 / True / "4" failed deep inside torch (torch.empty) or in a raw comparison."""
    with pytest.raises(exc, match=name) as info:
        HierTail(*args, HierTailConfig.paper(hidden=8))
    assert type(info.value) is exc
    model = HierTail(np.int64(4), np.int32(3), HierTailConfig.paper(hidden=8))
    assert type(model.in_channels) is int and type(model.num_classes) is int


def test_loss_dtype_float16_overflow_names_loss_dtype_and_is_no_divergence(tiny):
    """Embeddings beyond float16's range became inf in the cast: 'z contains NaN or Inf',
    marked non-finite (the loop's divergence). Now a plain ValueError naming loss_dtype;
    bfloat16 (float32's range) and None still compute the loss."""
    from hiertail_fast._validation import is_non_finite_error

    x, g, y, tr = tiny
    totals = {}
    for dtype in (None, "bfloat16", "float16"):
        model = _model("paper", loss_dtype=dtype)
        out = model(x * 1e5, g)
        assert float(out.hidden.detach().abs().max()) > 65504
        if dtype != "float16":
            totals[dtype] = model.loss(out, y, tr).total
            continue
        with pytest.raises(ValueError, match=r"loss_dtype='float16' .* beyond float16's "
                           r"range \(\|v\| <= 65504\)") as info:
            model.loss(out, y, tr)
        assert not is_non_finite_error(info.value)
        # below float16's most negative value too (the check read only the largest value:
        # a mutation audit); the embedding shifted down, still finite in float32
        out = model(x, g)
        out.embedding = out.embedding.detach() - 1e5
        with pytest.raises(ValueError, match=r"loss_dtype='float16'"):
            model.loss(out, y, tr)
        # float16's largest value itself is held: taken (refused at ">=": a mutation pass,
        # session 73)
        out = model(x, g)
        edge = out.embedding.detach().clone()
        edge[0, 0] = 65504.0
        out.embedding = edge
        totals["float16 at its largest"] = model.loss(out, y, tr).total
    assert all(torch.isfinite(t) for t in totals.values())


def test_official_hidden_is_the_last_up_convs_input_after_the_skip():
    """HierTailOutput.hidden (official configuration): what the last up conv takes, the skip
    sum x0 + unpool(u), not x0, the embedding (a mutation pass, session 73)."""
    torch.manual_seed(0)
    n = 40
    graph = prepare_graph(torch.randint(0, n, (2, 120), generator=torch.Generator()
                                        .manual_seed(1)), n)
    model = HierTail(5, 4, HierTailConfig.official(hidden=8)).eval()
    seen = []
    handle = model.up[-1].register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    try:
        out = model(torch.randn(n, 5), graph)
    finally:
        handle.remove()
    assert torch.equal(out.hidden, seen[-1])
    assert not torch.equal(out.hidden, out.embedding)


def test_hiertail_loss_refuses_duplicate_train_nodes(tiny):
    """A node listed twice re-weighted CE and SCL silently (with include_self=False its copy
    became its own positive); the split helpers refuse duplicates with the same words."""
    x, g, y, tr = tiny
    for include_self in (False, True):
        model = _model("paper", include_self=include_self)
        out = model(x, g)
        with pytest.raises(ValueError, match="train_idx has duplicate node ids"):
            model.loss(out, y, torch.tensor([0, 0, 0, 1, 2, 3]))
        with pytest.raises(ValueError, match="train_idx has duplicate node ids"):
            model.loss(out, y, torch.cat([tr, tr[-1:]]).to(torch.int32))
        assert torch.isfinite(model.loss(out, y, tr).total)


@pytest.mark.parametrize("name", CONFIGS)
def test_empty_graph_forward_both_configs(name):
    """The official config failed on n = 0 about a pool ratio the user never set (the first
    ratio rescaled by n/C = 0); the paper config returns [0, C] logits: both do now."""
    e0 = torch.zeros(2, 0, dtype=torch.long)
    model = _model(name)
    out = model(torch.zeros(0, FEAT), prepare_graph(e0, 0))
    assert out.logits.shape == (0, C) and all(p.shape == (0, HID) for p in out.pooled)
    assert HierTailConfig.official().pool_sizes(0, C) == [1, 0.5, 0.5]   # keeps min(1, 0)
    # a first ratio rescaled below any 1/n (many seeds of the compounding bug, n < C) is the
    # count 1 as well, not a float32 product of 0 nodes
    assert HierTailConfig.official(pool_rescale_power=10**4).pool_sizes(3, C)[0] == 1


def test_a_state_dict_of_unshared_convs_is_refused_by_a_shared_model():
    """share_convs=True registers one conv under several keys: a state_dict of a model with
    separate convs loaded "All keys matched" and kept only the last level's weights."""
    torch.manual_seed(0)
    separate = HierTail(12, 4, HierTailConfig.paper(hidden=8))
    shared = HierTail(12, 4, HierTailConfig.paper(hidden=8, share_convs=True))
    with pytest.raises(RuntimeError, match=r"down\.0\.weight and down\.1\.weight hold different"):
        shared.load_state_dict(separate.state_dict())
    twin = HierTail(12, 4, HierTailConfig.paper(hidden=8, share_convs=True))
    twin.load_state_dict(shared.state_dict())              # its own kind loads, still shared
    assert twin.down[0] is twin.down[1]
    assert all(torch.equal(a, b) for a, b in zip(twin.state_dict().values(),
                                                 shared.state_dict().values(), strict=True))


def test_a_tensor_temperature_of_the_loss_module_is_a_buffer():
    """BalancedContrastiveLoss(temperature=<tensor>) kept a plain attribute: a checkpoint
    did not carry it and .to() did not move it. Now a buffer, the same tensor (its gradient
    still reaches it); an nn.Parameter is a parameter."""
    from hiertail_fast import BalancedContrastiveLoss

    z, y = torch.randn(40, 6), torch.arange(40) % 4
    tau = torch.tensor(0.3, requires_grad=True)
    module = BalancedContrastiveLoss(tau)
    assert module.temperature is tau and list(module.state_dict()) == ["temperature"]
    module(z, y).backward()
    assert tau.grad is not None and tau.grad != 0
    other = BalancedContrastiveLoss(torch.tensor(0.9))
    other.load_state_dict(module.state_dict())
    assert torch.equal(other(z, y), module(z, y).detach())
    with pytest.raises(RuntimeError, match="Unexpected key"):   # a float tau has no buffer
        BalancedContrastiveLoss(0.9).load_state_dict(module.state_dict())
    assert module.double().temperature.dtype == torch.float64
    learnable = BalancedContrastiveLoss(torch.nn.Parameter(torch.tensor(0.5)))
    assert [n for n, _ in learnable.named_parameters()] == ["temperature"]


def test_a_shared_model_loads_its_own_checkpoint_with_nan_weights():
    """A diverged run's checkpoint holds NaN in a shared conv: the alias check compared the
    one tensor with itself through torch.equal (NaN != NaN) and refused it."""
    model = HierTail(12, 4, HierTailConfig.paper(hidden=8, share_convs=True))
    with torch.no_grad():
        model.down[0].weight.view(-1)[0] = float("nan")
    twin = HierTail(12, 4, HierTailConfig.paper(hidden=8, share_convs=True))
    twin.load_state_dict(model.state_dict())
    assert bool(twin.down[1].weight.isnan().any())
    # a checkpoint whose tensors were cloned one by one (fit_early_stopping's best state): the
    # aliases are no longer one storage, so their values are compared, NaN equal to NaN (a
    # plain == refused it as "not shared"; mutation audit, session 69)
    other = HierTail(12, 4, HierTailConfig.paper(hidden=8, share_convs=True))
    other.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
    assert bool(other.down[1].weight.isnan().any())


@pytest.mark.parametrize("name", CONFIGS)
def test_the_pool_submodules_are_called(tiny, name):
    """HierTail called topk_pool on its pools' weights: hooks on model.pools[i] never fired
    and a replaced pool was ignored (an nn-module audit). It calls the modules, each with its
    level's size."""
    x, g, _, _ = tiny
    model = _model(name)
    want = model(x, g)
    seen = []
    for level, pool in enumerate(model.pools):
        pool.register_forward_hook(lambda m, args, kwargs, out, level=level:
                                   seen.append((level, kwargs["ratio"], out.perm.numel())),
                                   with_kwargs=True)
    got = model(x, g)
    assert [s[0] for s in seen] == list(range(len(model.pools)))
    assert [s[2] for s in seen] == [p.numel() for p in want.perms]
    assert all(torch.equal(a, b) for a, b in zip(got.perms, want.perms, strict=True))
    assert torch.equal(got.logits, want.logits)


@pytest.mark.parametrize("kind", ["buffer", "parameter"])
def test_16bit_conversion_keeps_a_tensor_temperature(kind):
    """model.half() rounded a tensor temperature to 16 bits: τ 0.1 became 0.0999755859375 and
    the loss of float32 embeddings moved by 1.6e-2 (the losses compute 16-bit rows in float32
    anyway; an nn-module audit). The conversion keeps τ's dtype; others apply as usual."""
    from hiertail_fast.losses import BalancedContrastiveLoss

    tau = torch.tensor(0.1)
    if kind == "parameter":
        tau = torch.nn.Parameter(tau)
    loss = BalancedContrastiveLoss(temperature=tau)
    z = torch.randn(40, 8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(40) % 5
    want = loss(z, y)
    for convert in (torch.nn.Module.half, torch.nn.Module.bfloat16):
        assert convert(loss) is loss and loss.temperature.dtype == torch.float32
        assert float(loss.temperature.detach()) == float(torch.tensor(0.1)) and loss(z, y) == want
    assert loss.state_dict()["temperature"].dtype == torch.float32
    if kind == "parameter":
        assert loss.temperature is tau                # an optimizer holding it keeps it
        loss(z, y).backward()
        torch.optim.SGD([tau], lr=0.01).step()
        assert tau.dtype == torch.float32 and float(tau.detach()) != float(torch.tensor(0.1))
    loss.double()
    assert loss.temperature.dtype == torch.float64   # widening conversions apply
    if kind == "parameter":   # its .grad too, as nn.Module's own conversion (a mutation audit)
        assert loss.temperature.grad.dtype == torch.float64
    # a 16-bit τ keeps its own format too: not rounded to the other 16-bit one (s72)
    for dtype, convert in ((torch.float16, torch.nn.Module.bfloat16),
                           (torch.bfloat16, torch.nn.Module.half)):
        tau16 = torch.tensor(0.1, dtype=dtype)
        if kind == "parameter":
            tau16 = torch.nn.Parameter(tau16)
        loss16 = convert(BalancedContrastiveLoss(temperature=tau16))
        assert loss16.temperature.dtype == dtype
        assert float(loss16.temperature.detach()) == float(torch.tensor(0.1, dtype=dtype))


@pytest.mark.parametrize("kind", ["buffer", "parameter"])
def test_share_memory_shares_a_tensor_temperature(kind):
    """BalancedContrastiveLoss.share_memory() left a tensor temperature out of shared memory
    (its conversion ran fn on an empty stand-in and kept only the dtype and device): with
    Hogwild-style training, one process's temperature updates were lost to the others."""
    from hiertail_fast.losses import BalancedContrastiveLoss

    tau = torch.tensor(0.1)
    if kind == "parameter":
        tau = torch.nn.Parameter(tau)
    loss = BalancedContrastiveLoss(temperature=tau).share_memory()
    assert loss.temperature.is_shared()
    if kind == "parameter":
        assert loss.temperature is tau


def test_official_model_edge_weight_gradient_includes_the_a2_graphs():
    """The official preset squares each pooled graph (augment_a2), which used detached
    weights: the gradient w.r.t. learnable edge weights lacked every path through A²
    (gradcheck failed, 2e-4 off of 1.2e-2; an nn-module audit). Now gradcheck passes, and
    torch.func.grad over the weights gives the eager gradient."""
    from torch.func import grad

    torch.manual_seed(0)
    n = 12
    ei, x = torch.randint(0, n, (2, 30)), torch.randn(n, 4, dtype=torch.float64)
    y, train = torch.randint(0, 3, (n,)), torch.arange(0, n, 2)
    w = (torch.rand(30, dtype=torch.float64) + 0.5).requires_grad_()
    model = HierTail(4, 3, HierTailConfig.official(hidden=5, activation="tanh",
                                                   loss_backend="reference")).double()
    assert model.config.augment_a2

    def loss(w):
        return model.loss(model(x, prepare_graph(ei, n, w)), y, train).total

    assert torch.autograd.gradcheck(loss, (w,), eps=1e-6, atol=1e-6, rtol=1e-4)
    loss(w).backward()
    torch.testing.assert_close(grad(loss)(w.detach()), w.grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["embed.weight", "up.0.bias"])
def test_nan_parameters_are_named_not_blamed_on_x(tiny, name):
    """A NaN parameter made an inner op's check of its own input say 'x contains NaN or Inf'
    of the user's finite x (an nn-module audit); the model's message names the parameter
    (still the non-finite ValueError the training loop reports as divergence)."""
    from hiertail_fast._validation import is_non_finite_error

    x, g, _, _ = tiny
    model = _model("paper")
    with torch.no_grad():
        dict(model.named_parameters())[name].view(-1)[0] = float("nan")
    with pytest.raises(ValueError, match=f"although x is finite \\(parameters holding NaN / "
                                         f"Inf: {name}\\)") as info:
        model(x, g)
    assert is_non_finite_error(info.value)
    with pytest.raises(ValueError, match="x contains NaN or Inf"):     # the user's x: as before
        _model("paper")(torch.full_like(x, float("nan")), g)


def test_loss_refuses_another_models_output(tiny):
    x, g, y, idx = tiny
    other = HierTail(x.shape[1], C + 2, HierTailConfig.paper(hidden=8))
    with pytest.raises(ValueError, match=f"this model has {C} classes"):
        _model("paper").loss(other(x, g), y, idx)


@pytest.mark.parametrize("tau", [1e-7, 5e-7, 1e-300])
def test_config_refuses_a_tau_below_min_temperature(tau):
    """At construction, naming tau (README: temperatures >= MIN_TEMPERATURE = 1e-6), not at
    the first loss call of training (s42 audit, mutant N07)."""
    from hiertail_fast.nn.hiertail_config import HierTailConfig

    for preset in ("paper", "official"):
        with pytest.raises(ValueError, match="tau"):
            HierTailConfig.named(preset, tau=tau)
    assert HierTailConfig.paper(tau=1e-6).tau == 1e-6        # the bound itself is allowed


def test_topkpool_names_its_own_weight():
    """The op's checks of its score_weight are of the module's weight: "score_weight is all
    zeros" after nn.init.zeros_ named an argument the user never passed (an nn-module audit,
    session 67). The error's type and its non-finite mark are kept."""
    from hiertail_fast._validation import is_non_finite_error
    from hiertail_fast.nn.pool import TopKPool

    pool = TopKPool(4, ratio=0.5)
    x, ei = torch.randn(5, 4), torch.tensor([[0, 1], [1, 0]])
    torch.nn.init.zeros_(pool.weight)
    with pytest.raises(ValueError, match=r"^TopKPool.weight is all zeros"):
        pool(x, ei)
    with torch.no_grad():
        pool.weight[0] = float("nan")
    with pytest.raises(ValueError, match=r"^TopKPool.weight contains NaN or Inf") as caught:
        pool(x, ei)
    assert is_non_finite_error(caught.value)
    with pytest.raises(TypeError, match=r"^TopKPool.weight has dtype torch.float64 but x has"):
        TopKPool(4, ratio=0.5).double()(x, ei)


def test_topkpool_builds_its_weight_in_the_dtype_asked_for():
    # the factory kwargs reach the weight (dropped, TopKPool(dtype=float64) built float32 and
    # then refused float64 features; a mutation pass, session 73)
    from hiertail_fast.nn.pool import TopKPool

    pool = TopKPool(4, ratio=0.5, dtype=torch.float64)
    assert pool.weight.dtype == torch.float64
    x, ei = torch.randn(6, 4, dtype=torch.float64), torch.tensor([[0, 1, 2], [1, 2, 3]])
    assert pool(x, ei)[0].dtype == torch.float64


def test_a_dtype_mismatch_names_the_conversion_that_works():
    # integer or boolean features: the advice module.to(x.dtype) is refused by torch ("only
    # accepts floating point or complex dtypes"), so the features are named (an API audit,
    # session 68); float features keep the module advice, which works
    from hiertail_fast.nn import GCNConv

    conv, ei = GCNConv(3, 2), torch.tensor([[0, 1], [1, 0]])
    for x in (torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool)):
        with pytest.raises(TypeError, match=r"convert one of them \(e\.g\. "
                           r"x\.to\(torch\.float32\)\)"):
            conv(x, ei)
        conv(x.to(torch.float32), ei)                               # the advice works
    x64 = torch.ones(2, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"e\.g\. module\.to\(x\.dtype\)"):
        conv(x64, ei)
    assert conv.to(x64.dtype)(x64, ei).dtype == torch.float64


def test_gcnconv_keeps_the_inputs_message_for_a_non_finite_x():
    # GCNConv names its own product x·Wᵀ only when x is finite; a NaN / Inf x keeps "x
    # contains NaN or Inf" (895836b's cases had a finite x: a fix-test check, session 68)
    from hiertail_fast.nn import GCNConv

    ei = torch.tensor([[0, 1], [1, 2]])
    for bad in (float("nan"), float("inf")):
        x = torch.ones(3, 4)
        x[1, 2] = bad
        with pytest.raises(ValueError, match="x contains NaN or Inf") as exc:
            GCNConv(4, 2)(x, ei)
        assert "although x is finite" not in str(exc.value)
