"""Bad input refused with a clear error naming it, not a silently wrong number or an error from
deep inside torch, and valid input at the edge of a documented range accepted: corners the
mutation audits of 2026-12-03 found unchecked (each test failed on the mutant it names, passes
on main).

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
- the losses: z with rows but no columns (torch's "max() arg is an empty sequence" otherwise);
  [0, d] prototypes are no prototypes (torch's "Expected reduction dim" otherwise).
- training: data.num_classes equal to the largest label (the baselines failed inside
  cross_entropy: "Target 2 is out of bounds"); a bool device.
- topk_unpool: repeated perm ids that are not adjacent (a neighbours-only check let [1, 0, 1]
  unpool silently, one row lost), and perm of every accepted index dtype.
- the bounds themselves: HIERTAIL_CPU_BLOCK_BYTES=1 and --threads equal to the CPUs.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss, topk_unpool
from hiertail_fast._validation import MAX_NODES, available_cpus, check_device, check_num_nodes
from hiertail_fast.graph import CSRGraph
from hiertail_fast.metrics import loss_range, per_class_accuracy
from hiertail_fast.ops.gcn_propagate import gcn_propagate
from tests.conftest import tol


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_subnormal_weights_in_the_features_dtype_are_taken(dtype):
    """The range check is for weights WIDER than the features (cast, they lose bits); weights
    already in the features' dtype hold exactly what they propagate with, subnormals included
    (refused once the check also ran on same-dtype weights: a mutation pass, session 73)."""
    tiny = torch.finfo(dtype).tiny / 1024                       # a subnormal of the dtype
    ei = torch.tensor([[1, 2], [0, 0]])
    w = torch.tensor([tiny, 1.0], dtype=dtype)
    x = torch.ones(3, 2, dtype=dtype)
    got = gcn_propagate(x, ei, w, backend="torch")
    want = gcn_propagate(x.double(), ei, w.double(), backend="reference")
    torch.testing.assert_close(got.double(), want, **tol(dtype))


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


LABELS4 = torch.tensor([0, 0, 1, 1])


@pytest.mark.parametrize("backend", ["reference", "torch", None])
def test_zero_width_z_is_named(backend):
    with pytest.raises(ValueError, match=r"\bz\b.*empty"):
        balanced_contrastive_loss(torch.zeros(4, 0), LABELS4, backend=backend)
    with pytest.raises(ValueError, match=r"\bz\b.*empty"):
        hierarchical_contrastive_loss(torch.zeros(4, 0), [LABELS4], [torch.zeros(2, 0)],
                                      backend=backend)


def _loss_data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 3, generator=g, dtype=torch.float64), torch.arange(8) % 3


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_empty_prototypes_are_no_prototypes(backend):
    z, y = _loss_data()
    got = balanced_contrastive_loss(z, y, prototypes=z.new_zeros(0, 3), backend=backend)
    torch.testing.assert_close(got, balanced_contrastive_loss(z, y, backend=backend))
    p = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = hierarchical_contrastive_loss(z, [y, y], [z.new_zeros(0, 3), p], backend=backend)
    want = (balanced_contrastive_loss(z, y, backend="reference")
            + balanced_contrastive_loss(z, y, prototypes=p, backend="reference"))
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("trainer", ["hiertail", "baseline"])
def test_num_classes_equal_to_the_largest_label_is_refused(trainer):
    from dataclasses import replace

    from hiertail_fast.baselines.harness import train_baseline
    from hiertail_fast.data.synthetic import make_synthetic_graph
    from hiertail_fast.nn.hiertail import HierTailConfig
    from hiertail_fast.train import train_hiertail

    small = make_synthetic_graph(60, num_classes=3, avg_degree=4, num_features=4, seed=1)
    top = int(small.y.max())
    assert top == small.num_classes - 1
    bad = replace(small, num_classes=top)
    with pytest.raises(ValueError,
                       match=f"the labels go up to {top} but data.num_classes is {top}"):
        if trainer == "hiertail":
            train_hiertail(bad, None, HierTailConfig.paper(hidden=4), epochs=1, seed=0,
                           progress=False)
        else:
            train_baseline(bad, None, epochs=1, patience=0, seed=0, progress=False)


@pytest.mark.parametrize("device", [True, False])
def test_bool_device_is_refused_by_name(device):
    with pytest.raises(TypeError, match="device must be a str or a torch.device, got bool"):
        check_device(device)


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("perm", [[1, 0, 1], [2, 0, 1, 0], [3, 1, 2, 3]])
def test_repeated_perm_ids_apart_are_refused(backend, perm):
    x = torch.randn(len(perm), 2)
    with pytest.raises(ValueError, match="perm has repeated node indices"):
        topk_unpool(x, torch.tensor(perm), 5, backend=backend)


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.int8, torch.uint8])
def test_unpool_takes_every_index_dtype(backend, dtype):
    x = torch.randn(3, 2, requires_grad=True)
    perm = torch.tensor([4, 0, 2])
    want = topk_unpool(x, perm, 5, backend=backend)
    got = topk_unpool(x, perm.to(dtype), 5, backend=backend)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    got.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x))


@pytest.mark.parametrize("variant", ["exact", "official"])
def test_block_bytes_of_one_is_accepted(monkeypatch, variant):
    z, y = _loss_data()
    monkeypatch.delenv("HIERTAIL_CPU_BLOCK_BYTES", raising=False)
    want = balanced_contrastive_loss(z, y, backend="torch", variant=variant)
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", "1")
    got = balanced_contrastive_loss(z, y, backend="torch", variant=variant)
    torch.testing.assert_close(got, want)


def test_every_cpu_may_be_used():
    import argparse

    from hiertail_fast._train_cli import threads_arg
    from hiertail_fast._validation import check_threads

    cpus = available_cpus()
    assert check_threads(cpus) == cpus
    assert threads_arg(str(cpus)) == cpus and threads_arg("1") == 1
    with pytest.raises(argparse.ArgumentTypeError, match=rf"must lie in \[1, {cpus}\]"):
        threads_arg(str(cpus + 1))
