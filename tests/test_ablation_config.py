"""HierTailConfig's experiment fields: pool_counts (Table 5's task counts), task_grouping (M1),
contrastive (M2) and activation — validation, pool sizes, the model's layout and loss."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hiertail_fast.data.synthetic import make_synthetic_graph
from hiertail_fast.nn.hiertail import HierTail, HierTailConfig, prepare_graph

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def g():
    return make_synthetic_graph(120, num_classes=5, avg_degree=6, num_features=8, seed=1)


def _out_and_loss(g, cfg):
    model = HierTail(g.num_features, g.num_classes, cfg)
    graph = prepare_graph(g.edge_index, g.num_nodes)
    out = model(g.x, graph)
    return model, out, model.loss(out, g.y, torch.arange(40))


def test_pool_counts_set_the_task_counts_and_cap_at_the_previous_level(g):
    cfg = HierTailConfig.paper(hidden=8, pool_counts=(198, 7))
    assert cfg.num_levels == 2 and cfg.pool_sizes(120, 5) == [120, 7]
    assert HierTailConfig.paper(pool_counts=(2, 1)).pool_sizes(120, 5) == [2, 1]
    _, out, _ = _out_and_loss(g, HierTailConfig.paper(hidden=8, pool_counts=(9, 4, 2)))
    assert [p.shape[0] for p in out.pooled] == [9, 4, 2]
    assert HierTailConfig.paper(pool_counts=(9, 4)).to_dict()["pool_counts"] == [9, 4]


@pytest.mark.parametrize("bad", [(), (0, 1), (-3,)])
def test_pool_counts_refuse_non_positive_integers(bad):
    with pytest.raises(ValueError, match="pool_counts"):
        HierTailConfig.paper(pool_counts=bad)


@pytest.mark.parametrize("bad", [5, "52", {4, 2}, (2.5,), (2.0,), (True, 1), (np.bool_(True),)])
def test_pool_counts_of_the_wrong_type_are_a_type_error(bad):
    # an int raised "'int' object is not iterable", naming no field; non-integer elements
    # were a ValueError where hidden=8.0 is a TypeError (a config audit)
    with pytest.raises(TypeError, match="pool_counts must"):
        HierTailConfig.paper(pool_counts=bad)
    assert HierTailConfig.paper(pool_counts=np.array([9, 4])).pool_counts == (9, 4)


def test_official_bcl_needs_two_counted_levels():
    with pytest.raises(ValueError, match="two pooling levels"):
        HierTailConfig.official(pool_counts=(5,))


def test_without_contrastive_the_loss_is_cross_entropy(g):
    _, out, loss = _out_and_loss(g, HierTailConfig.paper(hidden=8, contrastive=False))
    ce = torch.nn.functional.cross_entropy(out.logits[:40], g.y[:40])
    torch.testing.assert_close(loss.total, ce)
    assert float(loss.scl) == 0.0 and float(loss.bcl) == 0.0 and loss.bcl_levels == []
    assert len(out.pooled) == 2             # M1 still on


@pytest.mark.parametrize("preset", ["paper", "official"])
def test_without_task_grouping_the_model_is_a_two_layer_gcn(g, preset):
    cfg = HierTailConfig.named(preset, hidden=8, task_grouping=False, contrastive=False)
    model, out, loss = _out_and_loss(g, cfg)
    assert cfg.num_levels == 0 and cfg.pool_sizes(120, 5) == []
    assert out.pooled == [] and out.perms == [] and out.logits.shape == (120, 5)
    assert len(model.pools) == 0 and len(model.down) == 0 and len(model.up) == 1
    assert (model.classifier is not None) == (preset == "paper")
    loss.total.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_contrastive_needs_task_grouping():
    with pytest.raises(ValueError, match="needs task_grouping"):
        HierTailConfig.paper(task_grouping=False)
    with pytest.raises(TypeError, match="contrastive must be a bool"):
        HierTailConfig.paper(contrastive=1)


@pytest.mark.parametrize("act", ["leaky_relu", "elu", "tanh"])
def test_activation_changes_the_forward(g, act):
    torch.manual_seed(0)
    _, relu_out, _ = _out_and_loss(g, HierTailConfig.paper(hidden=8))
    torch.manual_seed(0)
    _, out, _ = _out_and_loss(g, HierTailConfig.paper(hidden=8, activation=act))
    assert not torch.allclose(out.logits, relu_out.logits)
    with pytest.raises(ValueError, match="activation"):
        HierTailConfig.paper(activation="gelu")


def test_defaults_are_unchanged():
    d = HierTailConfig.paper().to_dict()
    assert d["task_grouping"] and d["contrastive"] and d["activation"] == "relu"
    assert "pool_counts" in d and d["pool_counts"] is None


def test_pool_sizes_checks_its_counts():
    # -5 nodes gave counts of -5, 0 classes a ZeroDivisionError (official config), 100.5 nodes
    # half-node counts (an API audit, session 68)
    for cfg in (HierTailConfig.paper(), HierTailConfig.official(),
                HierTailConfig.paper(pool_counts=(10, 5))):
        for args, exc, message in (((-5, 3), ValueError, "num_nodes must be >= 0"),
                                   ((100.5, 3), TypeError, "num_nodes must be an int"),
                                   ((100, 0), ValueError, "num_classes must be a positive int"),
                                   ((100, "3"), TypeError, "num_classes")):
            with pytest.raises(exc, match=message):
                cfg.pool_sizes(*args)
        assert cfg.pool_sizes(np.int64(100), np.int64(3)) == cfg.pool_sizes(100, 3)
