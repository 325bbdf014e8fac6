"""Bad input refused with a clear error, not a silently wrong number: corners the mutation
audits of 2026-12-03 found unchecked (each test failed on the mutant it names, passes on main).

- metrics: a NaN per-node loss in ``loss_range`` (it silently dropped the node's class: 1.0
  where the range is undefined); a label equal to ``num_classes`` in ``per_class_accuracy``
  (K + 1 entries where the docstring promises [K]).
- data.pyg: a Data with two of the three split masks (the module docstring: "a partial set ...
  an error"; only a single mask was tested).
- node counts above MAX_NODES (n * n + n must fit the int64 (row, col) sort key of
  ``_csr.coo_to_csr``, which wraps silently beyond it).
- float64 edge weights that do not fit float32 features, also when they require grad (then
  gcn_propagate takes the degrees in float64 and must check the cast itself: all-inf output).
- an OpenMP team smaller than torch plans, checked on every product, also on a CACHED operator
  (torch's CPU CSR product silently skips rows then: "off by 8.8 where the result is ~9").
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hiertail_fast._validation import MAX_NODES, check_num_nodes
from hiertail_fast.graph import CSRGraph
from hiertail_fast.metrics import loss_range, per_class_accuracy
from hiertail_fast.ops.gcn_propagate import gcn_propagate


def test_nan_per_node_loss_is_refused_not_dropped():
    with pytest.raises(ValueError, match="NaN"):
        loss_range([np.nan, 1.0, 2.0], y=[0, 1, 2])
    with pytest.raises(ValueError, match="NaN"):
        loss_range([5.0, np.nan, 1.0, 2.0], y=[0, 0, 1, 2])
    assert loss_range([5.0, 1.0, 2.0], y=[0, 1, 2]) == pytest.approx(4.0)


@pytest.mark.parametrize("t,p", [([0, 3], [0, 1]), ([0, 1], [0, 3])])
def test_label_equal_to_num_classes_is_refused(t, p):
    with pytest.raises(ValueError, match="num_classes"):
        per_class_accuracy(t, p, num_classes=3)
    assert per_class_accuracy(t, p, num_classes=4).shape == (4,)


@pytest.mark.parametrize("missing", ["train_mask", "val_mask", "test_mask"])
def test_two_of_three_split_masks_are_refused(missing):
    from hiertail_fast.data.pyg import split_from_masks

    data_cls = pytest.importorskip("torch_geometric.data").Data
    masks = {"train_mask": torch.tensor([1, 1, 0, 0, 0, 0], dtype=torch.bool),
             "val_mask": torch.tensor([0, 0, 1, 1, 0, 0], dtype=torch.bool),
             "test_mask": torch.tensor([0, 0, 0, 0, 1, 1], dtype=torch.bool)}
    del masks[missing]
    with pytest.raises(ValueError, match=f"but not {missing}"):
        split_from_masks(data_cls(x=torch.zeros(6, 2), **masks))


@pytest.mark.parametrize("n", [MAX_NODES + 1, 2 * MAX_NODES])
def test_num_nodes_beyond_the_sort_key_range_is_refused(n):
    with pytest.raises(ValueError, match="too large"):
        check_num_nodes(n)
    with pytest.raises(ValueError, match="too large"):       # before anything is allocated
        CSRGraph(torch.tensor([0, 0]), torch.zeros(0, dtype=torch.long), num_nodes=n)
    assert check_num_nodes(MAX_NODES) == MAX_NODES


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("value", [1e39, 1e-50])
def test_float64_weights_beyond_float32_raise_for_float32_features(requires_grad, value):
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    w = torch.full((3,), value, dtype=torch.float64, requires_grad=requires_grad)
    graph = CSRGraph.from_edge_index(ei, w, num_nodes=3, dedupe=False)
    with pytest.raises(ValueError, match="edge_weight"):
        gcn_propagate(torch.randn(3, 2), graph, backend="torch")


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("two_threads")
@pytest.mark.parametrize("env", [("OMP_DYNAMIC", "true"), ("OMP_THREAD_LIMIT", "1")])
def test_second_call_on_a_cached_operator_checks_the_openmp_team(monkeypatch, env):
    ei = torch.randint(0, 30, (2, 90), generator=torch.Generator().manual_seed(0))
    graph = CSRGraph.from_edge_index(ei, num_nodes=30)
    x = torch.randn(30, 4)
    gcn_propagate(x, graph, backend="torch")          # builds and caches the operator
    monkeypatch.setenv(*env)
    with pytest.raises(ValueError, match=env[0]):
        gcn_propagate(x, graph, backend="torch")
