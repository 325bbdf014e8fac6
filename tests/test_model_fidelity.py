"""HierTail model behaviours a mutation audit found untested: dropout placement and eval mode,
the paper forward against an independent dense rewrite, the gradients of the composed loss, the
presets' documented values, prepare_graph on weighted graphs, the activations, loss_dtype and the
config's checks."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from hiertail_fast.nn.hiertail import HierTail, HierTailConfig, prepare_graph
from hiertail_fast.reference.balanced_contrastive_loss import balanced_contrastive_loss_ref
from hiertail_fast.reference.nearest_prototype import nearest_prototype_ref
from hiertail_fast.reference.topk_pool import topk_pool_ref
from tests import test_model
from tests.test_model import CONFIGS, C, N, _gcn_dense, _model, _tiny_graph

pytestmark = pytest.mark.usefixtures("one_thread")
tiny = test_model.tiny            # the fixture: (x, graph, y, train_idx) of _tiny_graph


# ------------------------------------------------------------------ dropout and eval mode
def test_eval_mode_applies_no_dropout(tiny):
    """model.eval() turns dropout off: two eval forwards of a dropout=0.5 model agree and equal
    the same weights with dropout=0 (a mutation audit: dropout left on in eval mode, so
    predictions and model selection were random, passed every test)."""
    x, g, _, _ = tiny
    model = _model("paper", dropout=0.5).eval()
    plain = copy.deepcopy(model)
    plain.config = model.config.replace(dropout=0.0)
    with torch.no_grad():
        a, b, want = model(x, g).logits, model(x, g).logits, plain(x, g).logits
    assert torch.equal(a, b) and torch.equal(a, want)
    with torch.no_grad():       # train mode does drop (so the check above can fail)
        assert not torch.equal(model.train()(x, g).logits, want)


def test_dropout_follows_the_activation(tiny):
    """_act is dropout(act(conv)): in train mode every entry of x⁰ is 0 or tanh(conv)/(1-p)
    (a mutation audit: act(dropout(conv)) passed every test; for relu the two are equal, for
    tanh they are not)."""
    x, g, _, _ = tiny
    p = 0.5
    model = _model("paper", dropout=p, activation="tanh").train()
    torch.manual_seed(1)
    with torch.no_grad():
        emb = model(x, g).embedding
        want = torch.tanh(model.embed(x, g)) / (1 - p)
    kept = emb != 0
    assert 0.3 < float(kept.float().mean()) < 0.7
    torch.testing.assert_close(emb[kept], want[kept], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ the paper forward
def _paper_dense_forward(model: HierTail, x, ei, n):
    """Independent dense rewrite of the paper model (module docstring, DESIGN.md §6): separate
    convs per level, no A² augmentation, T = (C, ceil(C/2)) tasks, sum-skip unpooling with
    the activation after every up conv, then the Linear classifier."""
    adj = torch.zeros(n, n)
    adj[ei[1], ei[0]] = 1.0
    adj = ((adj + adj.t()) > 0).float()
    adj.fill_diagonal_(1.0)                                         # unit self-loops

    def conv(m, h, a):
        return _gcn_dense(h, a, m.weight, m.bias)

    h = F.relu(conv(model.embed, x, adj))
    xs, adjs, perms = [h], [adj], []
    for level, k in enumerate((C, math.ceil(C / 2))):
        a = adjs[-1]
        dst, src = a.nonzero(as_tuple=True)
        pooled, pei, pw, perm, _ = topk_pool_ref(h, torch.stack([src, dst]),
                                                 model.pools[level].weight, k, a[dst, src])
        pa = torch.zeros(k, k)
        pa[pei[1], pei[0]] = pw
        h = F.relu(conv(model.down[level], pooled, pa))
        xs.append(h)
        adjs.append(pa)
        perms.append(perm)
    u = xs[-1]
    for step, j in enumerate((1, 0)):                # up[0] at the deepest skip
        up = torch.zeros_like(xs[j])
        up[perms[j]] = u
        u = F.relu(conv(model.up[step], xs[j] + up, adjs[j]))
    return model.classifier(u), u, xs, perms


def test_paper_forward_matches_a_dense_graph_unet():
    """The paper forward against an independent dense rewrite: perms, pooled blocks, hidden
    and logits (only the official layout had one; a mutation audit: the paper's up convs run
    in the reverse level order passed every test)."""
    x, ei, _ = _tiny_graph(seed=1)
    model = _model("paper", seed=1)
    out = model(x, prepare_graph(ei, N))
    logits, hidden, xs, perms = _paper_dense_forward(model, x, ei, N)
    for p, q in zip(out.perms, perms, strict=True):
        assert torch.equal(p, q)
    for a, b in zip(out.pooled, xs[1:], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.hidden, hidden, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.logits, logits, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ loss gradients
def _reference_total(model: HierTail, out, y, tr):
    """CE + γ(SCL + Σ BCL) with the dense references; gradients reach both the node block and
    the prototypes of every BCL (only the nearest-prototype assignment is detached)."""
    cfg = model.config
    kw = dict(temperature=cfg.tau, include_self=cfg.include_self, variant=cfg.loss_variant)
    ce = F.cross_entropy(out.logits[tr], y[tr])
    scl_in = out.logits if cfg.scl_on == "logits" else out.hidden
    scl = balanced_contrastive_loss_ref(scl_in[tr], y[tr], **kw)
    if cfg.bcl_mode == "official":
        pairs = [(out.embedding, p, perm) for p, perm in zip(out.pooled[:-1], out.perms[:-1],
                                                              strict=True)]
    else:
        blocks = [out.embedding, *out.pooled]
        pairs = [(blocks[i], blocks[i + 1], None) for i in range(len(out.pooled))]
    bcl = 0
    for z, p, perm in pairs:
        idx = nearest_prototype_ref(z.detach(), p.detach())
        labels = idx if perm is None else perm[idx]
        bcl = bcl + balanced_contrastive_loss_ref(z, labels, prototypes=p, **kw)
    return ce + cfg.gamma * (scl + bcl)


@pytest.mark.parametrize("name", CONFIGS)
def test_loss_gradients_reach_nodes_and_prototypes_as_the_reference(tiny, name):
    """d total / d (logits, hidden, x⁰, every pooled block) equals the dense reference's: the
    loss values matched, but a detached prototype block or node block in the BCL (no gradient
    into the task prototypes / x⁰ from that term) passed every test (a mutation audit)."""
    x, g, y, tr = tiny
    model = _model(name, gamma=1.0)          # γ = 1: the contrastive gradients are not tiny
    out = model(x, g)
    leaves = [out.logits, out.hidden, out.embedding, *out.pooled]
    got = torch.autograd.grad(model.loss(out, y, tr).total, leaves, allow_unused=True,
                              retain_graph=True)
    want = torch.autograd.grad(_reference_total(model, out, y, tr), leaves, allow_unused=True)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if b is None:
            assert a is None or not a.any(), i
            continue
        assert a is not None, i
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=f"tensor {i}")


# ------------------------------------------------------------------ the presets
_PAPER = dict(pool_ratios=(1.0, 0.5), pool_mode="classes", share_convs=False,
              linear_classifier=True, augment_a2=False, scl_on="hidden", bcl_mode="paper",
              loss_variant="exact", include_self=False, gamma=0.01, tau=0.1, hidden=128,
              lr=0.01, weight_decay=5e-4, dropout=0.0, improved=True, activation="relu")
_OFFICIAL = dict(pool_ratios=(1.0, 0.5, 0.5), pool_mode="official", pool_rescale_power=1,
                 share_convs=True, linear_classifier=False, augment_a2=True, scl_on="logits",
                 bcl_mode="official", fix_cluster_labels=False, loss_variant="official",
                 include_self=True, gamma=0.01, tau=1.0, hidden=128, lr=0.001,
                 weight_decay=5e-4, dropout=0.0, improved=True, activation="relu")


@pytest.mark.parametrize("name, table", [("paper", _PAPER), ("official", _OFFICIAL)])
def test_presets_hold_the_documented_values(name, table):
    """Every field of the two presets against the table of hiertail.py's docstring and
    PROTOCOL_AND_BASELINES.md §3.1 (a mutation audit: official τ 0.1, include_self False,
    the exact loss variant or lr 0.01, and the paper's τ, γ or include_self changed, passed
    every test: the loss tests read the config they check against)."""
    cfg = HierTailConfig.named(name)
    assert cfg.name == name and cfg.num_levels == len(table["pool_ratios"])
    assert {k: getattr(cfg, k) for k in table} == table
    assert HierTailConfig() == HierTailConfig.paper()


def test_reset_parameters_draws_in_the_official_order():
    """reset_parameters resets in the official GraphUNet's order (embedding conv, down convs,
    pools, up convs; a shared conv once per use), so a seed draws the official stream; a
    mutation audit: pools before the down convs passed every test. The order redone by hand."""
    for name in CONFIGS:
        model = _model(name)
        torch.manual_seed(7)
        model.reset_parameters()
        want = copy.deepcopy(model)
        torch.manual_seed(7)
        for module in (want.embed, *want.down, *want.pools, *want.up):
            module.reset_parameters()
        if want.classifier is not None:
            torch.nn.init.normal_(want.classifier.weight, std=0.05)
            torch.nn.init.zeros_(want.classifier.bias)
        for (key, a), b in zip(model.state_dict().items(), want.state_dict().values(),
                               strict=True):
            assert torch.equal(a, b), (name, key)


# ------------------------------------------------------------------ prepare_graph
def test_prepare_graph_replaces_weighted_self_loops_by_one_unit_loop():
    """prepare_graph's rule: symmetrise (A + Aᵀ for a directed weighted graph), drop every old
    self-loop, add exactly one unit loop per node. A weighted self-loop of 5 was kept and
    doubled to 10 by the symmetrisation when the removal was skipped (a mutation audit: only
    unweighted graphs were tested, where the new loop overwrote the old)."""
    ei = torch.tensor([[0, 0, 1, 3], [0, 1, 2, 3]])
    w = torch.tensor([5.0, 2.0, 3.0, 7.0])
    g = prepare_graph(ei, 4, w)
    dense = torch.zeros(4, 4)
    dense.index_put_((g.row_index(), g.indices), g.weight, accumulate=True)
    a = torch.zeros(4, 4)
    a[ei[0], ei[1]] = w
    want = a + a.t()
    want.fill_diagonal_(1.0)
    torch.testing.assert_close(dense, want, rtol=0, atol=0)


# ------------------------------------------------------------------ config checks
def test_pool_counts_cap_at_the_previous_levels_kept_count():
    """pool_counts: a level keeps at most the previous level's nodes, so (9, 20) on 120 nodes
    is [9, 9] (a mutation audit: capping at n gave [9, 20] and passed every test)."""
    assert HierTailConfig.paper(pool_counts=(9, 20)).pool_sizes(120, 5) == [9, 9]
    assert HierTailConfig.paper(pool_counts=(200, 50, 80)).pool_sizes(120, 5) == [120, 50, 50]


def test_gamma_zero_is_accepted_and_the_loss_is_cross_entropy(tiny):
    """γ = 0 lies in the documented range [0, float32 max]: accepted, total = CE (a mutation
    audit: refusing it, 0 < γ, passed every test)."""
    x, g, y, tr = tiny
    model = _model("paper", gamma=0)
    out = model(x, g)
    loss = model.loss(out, y, tr)
    torch.testing.assert_close(loss.total, F.cross_entropy(out.logits[tr], y[tr]))
    assert float(loss.scl.detach()) > 0      # the contrastive terms are still computed


def test_scl_on_hidden_needs_the_linear_classifier():
    """scl_on='hidden' names the input of the Linear classifier; without one it is refused
    (a mutation audit: the check deleted, official(scl_on='hidden') built and trained)."""
    with pytest.raises(ValueError, match="scl_on='hidden' needs linear_classifier=True"):
        HierTailConfig.official(scl_on="hidden")


def test_topk_pool_module_forwards_its_backend():
    """TopKPool.forward(backend=...) reaches topk_pool: an unknown name is refused, a named
    one gives the reference's result (a mutation audit: the argument dropped passed)."""
    from hiertail_fast.nn.pool import TopKPool

    torch.manual_seed(0)
    pool = TopKPool(4)
    x = torch.randn(5, 4)
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    with pytest.raises(ValueError, match="backend='bogus'"):
        pool(x, ei, backend="bogus", ratio=3)
    got = pool(x, ei, backend="reference", ratio=3)
    want = topk_pool_ref(x, ei, pool.weight, 3)
    assert torch.equal(got.perm, want[3])
    torch.testing.assert_close(got.x, want[0])


def test_loss_dtype_rounds_the_scl_and_bcl_inputs(tiny):
    """loss_dtype='bfloat16' casts every contrastive input: the SCL and each BCL level equal
    the float64 reference on the bf16-rounded rows, not on the float32 ones (a mutation audit:
    the SCL input left uncast passed every test)."""
    x, g, y, tr = tiny
    model = _model("paper", loss_dtype="bfloat16")
    out = model(x, g)
    loss = model.loss(out, y, tr)
    kw = dict(temperature=0.1, include_self=False, variant="exact")

    def bf16(t):
        return t.detach().bfloat16().double()

    want = balanced_contrastive_loss_ref(bf16(out.hidden[tr]), y[tr], **kw)
    plain = balanced_contrastive_loss_ref(out.hidden[tr].detach().double(), y[tr], **kw)
    assert abs(float(want) - float(plain)) > 1e-3      # the rounding is visible here
    torch.testing.assert_close(loss.scl.double(), want, rtol=1e-5, atol=1e-6)
    blocks = [out.embedding, *out.pooled]
    for i, got in enumerate(loss.bcl_levels):
        labels = nearest_prototype_ref(blocks[i].detach(), blocks[i + 1].detach())
        want = balanced_contrastive_loss_ref(bf16(blocks[i]), labels,
                                             prototypes=bf16(blocks[i + 1]), **kw)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act, formula", [
    ("relu", lambda t: torch.where(t > 0, t, torch.zeros_like(t))),
    ("leaky_relu", lambda t: torch.where(t > 0, t, 0.01 * t)),     # PyTorch's slope 0.01
    ("elu", lambda t: torch.where(t > 0, t, t.exp() - 1)),         # alpha 1
    ("tanh", lambda t: (t.exp() - (-t).exp()) / (t.exp() + (-t).exp())),
], ids=["relu", "leaky_relu", "elu", "tanh"])
def test_each_activation_is_its_formula(tiny, act, formula):
    """x⁰ = act(embedding conv) with each activation's own formula (a mutation audit: elu
    computing selu, or leaky_relu with slope 0.2, passed: the test only checked that the
    forward differs from relu's)."""
    x, g, _, _ = tiny
    model = _model("paper", activation=act).eval()
    with torch.no_grad():
        pre = model.embed(x, g).double()
        torch.testing.assert_close(model(x, g).embedding.double(), formula(pre), rtol=1e-5,
                                   atol=1e-6)
