"""CSR arrays, degrees, A² and segment sums at their edges (``graph``, ``_csr``,
``ops/gcn_propagate``): corners the mutation audit of 2026-12-03 found unchecked (each test
failed on the mutant it describes, passes on main).

- CSRGraph stores int64 index arrays whatever index dtype it was given (documented; a graph
  kept in int32 crashed deep in gcn_propagate's ``_merge_diagonal``).
- a weighted degree past float32's range (finite float32 weights) keeps deg^-1/2 ~1e-19, not 0
  (a zero row).
- ``augment_a2`` leaves out A² entries whose terms cancel to exactly 0 on every product path
  (scipy drops them itself; torch's CSR product, the path without scipy, keeps them).
- the edge-weight gradient's row / column sums are float64 segment sums rounded once (a
  running float32 sum over a hub's 1M entries was 3.1e-3 off).
"""
from __future__ import annotations

import math
import os

import pytest
import torch

from hiertail_fast import _csr, gcn_propagate
from hiertail_fast.graph import CSRGraph
from hiertail_fast.ops.gcn_propagate import _col_sums, _row_sums


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_narrow_index_arrays_are_stored_as_int64(dtype):
    indptr = torch.tensor([0, 1, 3, 3], dtype=dtype)
    indices = torch.tensor([1, 0, 2], dtype=dtype)
    g = CSRGraph(indptr, indices, num_nodes=3)
    assert g.indptr.dtype == torch.int64 and g.indices.dtype == torch.int64
    assert g.indptr.tolist() == [0, 1, 3, 3] and g.indices.tolist() == [1, 0, 2]
    assert g.transpose().indices.dtype == torch.int64


def test_graph_built_from_int32_arrays_propagates_as_the_int64_one():
    gen = torch.Generator().manual_seed(0)
    n = 50
    g64 = CSRGraph.from_edge_index(torch.randint(0, n, (2, 300), generator=gen), num_nodes=n)
    g32 = CSRGraph(g64.indptr.int(), g64.indices.int(), num_nodes=n)
    x = torch.randn(n, 8, generator=gen)
    torch.testing.assert_close(gcn_propagate(x, g32), gcn_propagate(x, g64))


def test_float32_degree_overflow_keeps_a_nonzero_row():
    ei = torch.tensor([[1, 2], [0, 0]])                     # 1 -> 0 and 2 -> 0
    w = torch.tensor([3.0e38, 3.0e38], dtype=torch.float32)
    g = CSRGraph.from_edge_index(ei, w, num_nodes=3)
    dinv, _ = g.gcn_deg_inv_sqrt(improved=False, add_self_loops=False, dtype=torch.float32)
    want = (float(w[0]) + float(w[1])) ** -0.5
    assert math.isclose(float(dinv[0]), want, rel_tol=1e-6)
    values, _ = g.gcn_norm_values(improved=False, add_self_loops=False, dtype=torch.float32)
    assert bool(torch.isfinite(values).all())


@pytest.mark.parametrize("scipy_present", [True, False])
def test_cancelling_two_hop_entry_is_not_an_edge(monkeypatch, scipy_present):
    if not scipy_present:
        monkeypatch.setattr(_csr, "_scipy_sparse", lambda: None)
    # M[0, 2] = -0.5 (edge 2 -> 0), M[0, 1] = 1 (1 -> 0), M[1, 2] = 1 (2 -> 1):
    # (M + I)^2 [0, 2] = 2 * (-0.5) + M[0, 1] M[1, 2] = 0
    ei = torch.tensor([[2, 1, 2], [0, 0, 1]])
    w = torch.tensor([-0.5, 1.0, 1.0], dtype=torch.float64)
    a2 = CSRGraph.from_edge_index(ei, w, num_nodes=3).augment_a2()
    pairs = {(int(s), int(t)): float(v)
             for (s, t), v in zip(a2.edge_index().T, a2.weight, strict=True)}
    assert (2, 0) not in pairs, pairs
    assert pairs == {(1, 0): 2.0, (2, 1): 2.0}


def test_hub_row_and_column_sums_are_float32_roundings_of_the_exact_sum():
    n_leaves = 1 << 20
    hub = torch.zeros(n_leaves, dtype=torch.long)
    leaves = torch.arange(1, n_leaves + 1)
    v = (torch.rand(n_leaves, generator=torch.Generator().manual_seed(0)) + 0.5).float()
    exact = v.double().sum()
    into_hub = CSRGraph.from_edge_index(torch.stack([leaves, hub]), num_nodes=n_leaves + 1,
                                        dedupe=False)      # one row (the hub's) of 1M entries
    got = _row_sums(into_hub, v)
    assert got.dtype == torch.float32
    assert got[0].item() == exact.float().item()
    out_of_hub = CSRGraph.from_edge_index(torch.stack([hub, leaves]), num_nodes=n_leaves + 1,
                                          dedupe=False)    # one column of 1M entries
    assert _col_sums(out_of_hub, v)[0].item() == exact.float().item()


def _notices_in_a_worker():
    torch.set_num_threads(1)            # (torch's OpenMP team does not survive a fork)
    _csr._notices_seen = False
    _csr.sparse_notices_seen()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork (not on Windows)")
def test_a_fork_while_another_thread_draws_the_sparse_notices_does_not_hang_the_child():
    from tests.conftest import fork_while_held

    hung, code = fork_while_held(lambda: _csr._NOTICES, _notices_in_a_worker)
    assert not hung and code == 0
