"""Benchmarks: GCN propagation Â·X (improved=True), forward and forward+backward.

Providers
    reference      plain-PyTorch oracle (index_add over edges; up to 100k nodes)
    torch          our CPU path: torch.sparse CSR matmul with cached normalised values,
                   hand-written backward (forward CSR reused: the graphs are symmetric)
    triton         our Triton row-split SpMM (CUDA only)
    torch_sparse   our op on torch_sparse.SparseTensor (when the optional package is installed)
    peer_sparse_mm torch.sparse.mm on the UN-normalised CSR, PyTorch's own sparse backward
    peer_torch_sparse  torch_sparse.SparseTensor matmul on the UN-normalised CSR (when installed)
    peer_pyg       PyG ``GCNConv(improved=True)``'s own propagation (message passing over
                   edge_index, the usual input) with its ``gcn_norm`` weights computed once, as
                   ``cached=True`` does: the same Â·X as ours (when torch_geometric is installed)
The peers do less math (no normalisation, no self-loops): matching them means the fused
normalisation costs nothing. Graphs: ``make_synthetic_graph`` (long-tail DC-SBM, average degree
10, symmetric), 10k nodes; 100k and 1M with ``HIERTAIL_BENCH_FULL=1``. d = 64 and 128, float32.
The graph container is built once outside the timing, as in a training loop.

    pytest bench/test_propagation.py --benchmark-disable                  # CI smoke run
    HIERTAIL_BENCH_FULL=1 pytest bench/test_propagation.py --benchmark-autosave

``extra_info``: shapes, nnz, device name, dtype, provider, mode and peak memory (CUDA: max
allocated during the timed calls; CPU: growth of the process's peak RSS, 0 when the calls fit
under an earlier peak).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import warnings

import pytest
import torch

from hiertail_fast.graph import CSRGraph
from hiertail_fast.ops.gcn_propagate import gcn_propagate, torch_sparse_available
from hiertail_fast.reference.gcn_propagate import gcn_propagate_ref

FULL = os.environ.get("HIERTAIL_BENCH_FULL", "0") == "1"
SIZES = [10_000] + ([100_000, 1_000_000] if FULL else [])
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROVIDERS = (["reference", "torch", "peer_sparse_mm"]
             + (["triton"] if DEVICE == "cuda" else [])
             + (["torch_sparse", "peer_torch_sparse"] if torch_sparse_available() else [])
             + (["peer_pyg"] if importlib.util.find_spec("torch_geometric") else []))


@functools.lru_cache(maxsize=1)
def _graph(n: int) -> tuple[torch.Tensor, CSRGraph]:
    try:
        from hiertail_fast.data.synthetic import make_synthetic_graph

        ei = make_synthetic_graph(n, 70, num_features=1, seed=0).edge_index
    except ImportError:  # generator not available: random symmetric graph, mean degree 10
        gen = torch.Generator().manual_seed(0)
        ei = torch.randint(0, n, (2, 5 * n), generator=gen)
        ei = torch.cat([ei, ei.flip(0)], 1)
    ei = ei.to(DEVICE)
    return ei, CSRGraph.from_edge_index(ei, num_nodes=n)


def _propagator(provider: str, ei: torch.Tensor, graph: CSRGraph):
    n = graph.num_nodes
    if provider == "reference":
        return lambda x: gcn_propagate_ref(x, ei)
    if provider in ("torch", "triton", "torch_sparse"):
        return lambda x: gcn_propagate(x, graph, backend=provider)
    ones = torch.ones(graph.num_edges, device=graph.device)
    if provider == "peer_sparse_mm":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            adj = torch.sparse_csr_tensor(graph.indptr, graph.indices, ones, (n, n))
        return lambda x: torch.sparse.mm(adj, x)
    if provider == "peer_pyg":  # PyG GCNConv's own propagation, its gcn_norm computed once
        from torch_geometric.nn import GCNConv
        from torch_geometric.nn.conv.gcn_conv import gcn_norm

        conv = GCNConv(1, 1, improved=True).to(graph.device)
        # explicit unit weights: with edge_weight=None PyG 2.8's gcn_norm adds self-loops of
        # weight 1, ignoring improved=True (tests/test_gcn_propagate.py)
        unit = torch.ones(ei.shape[1], device=ei.device)
        ei_norm, w_norm = gcn_norm(ei, unit, n, improved=True, add_self_loops=True)
        return lambda x: conv.propagate(ei_norm, x=x, edge_weight=w_norm)
    if provider == "peer_torch_sparse":
        import torch_sparse

        adj = torch_sparse.SparseTensor(rowptr=graph.indptr, col=graph.indices, value=ones,
                                        sparse_sizes=(n, n), is_sorted=True)
        return lambda x: adj.matmul(x)
    raise ValueError(provider)


def make_propagation_step(provider: str, n: int, d: int, mode: str):
    """(step, nnz): one propagation of random [n, d] features on the synthetic n-node graph by
    ``provider``, forward only ("fwd", under no_grad) or forward + backward ("fwd+bwd")."""
    ei, graph = _graph(n)
    fn = _propagator(provider, ei, graph)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, d, generator=gen).to(DEVICE).requires_grad_(mode == "fwd+bwd")
    grad_out = torch.randn(n, d, generator=gen).to(DEVICE)

    def step():
        if mode == "fwd":
            with torch.no_grad():
                fn(x)
        else:
            x.grad = None
            fn(x).backward(grad_out)
        if DEVICE == "cuda":
            torch.cuda.synchronize()

    return step, graph.num_edges


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_gcn_propagate(benchmark, peak_memory, device_label, provider, mode, d, n):
    if provider == "reference" and n > 100_000:
        pytest.skip("the reference is benchmarked up to 100k nodes")
    benchmark.group = f"gcn_propagate {mode} n={n} d={d}"
    step, nnz = make_propagation_step(provider, n, d, mode)
    if not benchmark.disabled:  # (the CI smoke run calls step once, below)
        step()  # warm-up: Triton compilation, the graph's caches (degrees, normalised CSR)
    with peak_memory() as pm:
        benchmark.pedantic(step, rounds=3 if n >= 1_000_000 else 7, iterations=1,
                           warmup_rounds=1)
    benchmark.extra_info.update(
        n=n, d=d, nnz=nnz, dtype="float32", provider=provider, mode=mode,
        device=device_label, threads=torch.get_num_threads(), peak_bytes=pm.peak_bytes,
        peak_memory_method=pm.method)
