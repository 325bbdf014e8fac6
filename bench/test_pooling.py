"""Benchmarks: top-k pooling (forward + backward) and the nearest-prototype argmin.

Providers: reference (plain PyTorch oracle), torch (our CPU path), triton (CUDA only), pyg
(torch_geometric TopKPooling + filter_adj on the same weights, when installed).
Graphs from ``make_synthetic_graph`` (long-tail DC-SBM, average degree 10) at 10k nodes;
100k and 1M nodes with ``HIERTAIL_BENCH_FULL=1``. d = 64 and 128; ratio 0.5.
nearest_prototype: N = 2k rows (100k, 1M with the env var), m = 282 (Cora-Full's k₁) and 4096
prototypes, d = 128; peers: the dense reference and sklearn ``pairwise_distances_argmin``.

    pytest bench/test_pooling.py --benchmark-disable            # CI smoke run (10k only)
    HIERTAIL_BENCH_FULL=1 pytest bench/test_pooling.py --benchmark-autosave

``extra_info`` records the shapes, device (name), dtype and peak memory: CUDA max allocated
during the call, or on CPU the growth of the process's peak RSS (ru_maxrss; 0 when the call
fits under an earlier peak).
"""
from __future__ import annotations

import functools
import os

import pytest
import torch

from hiertail_fast.graph import CSRGraph
from hiertail_fast.ops.nearest_prototype import nearest_prototype
from hiertail_fast.ops.topk_pool import topk_pool, topk_unpool
from hiertail_fast.reference.nearest_prototype import nearest_prototype_ref
from hiertail_fast.reference.topk_pool import topk_pool_ref

FULL = os.environ.get("HIERTAIL_BENCH_FULL", "0") == "1"
SIZES = [10_000] + ([100_000, 1_000_000] if FULL else [])
NP_SIZES = [2_000] + ([100_000, 1_000_000] if FULL else [])  # nearest_prototype rows
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROVIDERS = ["reference", "torch", "pyg"] + (["triton"] if DEVICE == "cuda" else [])


@functools.lru_cache(maxsize=2)
def _edge_index(n: int) -> torch.Tensor:
    try:
        from hiertail_fast.data.synthetic import make_synthetic_graph

        return make_synthetic_graph(n, 70, num_features=1, seed=0).edge_index
    except ImportError:  # generator not available: random graph with the same mean degree
        g = torch.Generator().manual_seed(0)
        return torch.randint(0, n, (2, 10 * n), generator=g)


def make_pool_step(provider: str, n: int, d: int):
    """(step, number of edges): one top-k pooling forward + backward (ratio 0.5) of the
    synthetic n-node graph with d features, by ``provider``. The graph container (ours) and
    the module (PyG) are built once, outside the step, as in a training loop."""
    ei = _edge_index(n).to(DEVICE)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, d, generator=gen).to(DEVICE).requires_grad_(True)
    p = torch.randn(d, generator=gen).to(DEVICE).requires_grad_(True)
    graph = CSRGraph.from_edge_index(ei, num_nodes=n, dedupe=False)
    graph.row_index()
    if provider == "pyg":
        from torch_geometric.nn import TopKPooling

        pool = TopKPooling(d, ratio=0.5).to(DEVICE)
        pool.select.weight.data.copy_(p.detach().view(1, -1))

    def step():
        x.grad = p.grad = None
        if provider == "reference":
            xp, *_ = topk_pool_ref(x, ei, p, 0.5)
        elif provider == "pyg":
            xp = pool(x, ei)[0]
        else:
            xp = topk_pool(x, graph, p, 0.5, backend=provider).x
        xp.sum().backward()
        if DEVICE == "cuda":
            torch.cuda.synchronize()

    return step, int(ei.shape[1])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_topk_pool_fwd_bwd(benchmark, peak_memory, device_label, provider, n, d):
    if provider == "reference" and n > 100_000:
        pytest.skip("the reference is benchmarked up to 100k nodes")
    if provider == "pyg":
        pytest.importorskip("torch_geometric")
    benchmark.group = f"topk_pool n={n} d={d}"
    step, num_edges = make_pool_step(provider, n, d)
    step()  # warm-up (Triton compilation, allocator)
    with peak_memory() as pm:
        benchmark.pedantic(step, rounds=3 if n >= 1_000_000 else 5, iterations=1,
                           warmup_rounds=0)
    benchmark.extra_info.update(
        n=n, d=d, num_edges=num_edges, k=(n + 1) // 2, dtype="float32",
        device=device_label, provider=provider, peak_bytes=pm.peak_bytes,
        peak_memory_method=pm.method)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("provider", ["torch"] + (["triton"] if DEVICE == "cuda" else []))
def test_topk_unpool_fwd_bwd(benchmark, peak_memory, device_label, provider, n):
    d = 128
    benchmark.group = f"topk_unpool n={n} d={d}"
    k = n // 2
    xp = torch.randn(k, d, device=DEVICE, requires_grad=True)
    perm = torch.randperm(n, device=DEVICE)[:k]

    def step():
        xp.grad = None
        topk_unpool(xp, perm, n, backend=provider).sum().backward()
        if DEVICE == "cuda":
            torch.cuda.synchronize()

    step()
    with peak_memory() as pm:
        benchmark.pedantic(step, rounds=5, iterations=1)
    benchmark.extra_info.update(n=n, k=k, d=d, device=device_label, provider=provider,
                                peak_bytes=pm.peak_bytes, peak_memory_method=pm.method)


def make_prototype_step(provider: str, n: int, m: int, d: int = 128):
    """One nearest-prototype assignment of n random rows to m random prototypes (d features)
    by ``provider`` ("reference", "torch", "torch_topk", "triton" or "sklearn" on numpy
    copies)."""
    gen = torch.Generator().manual_seed(2)
    z = torch.randn(n, d, generator=gen).to(DEVICE)
    protos = torch.randn(m, d, generator=gen).to(DEVICE)
    if provider == "sklearn":
        from sklearn.metrics import pairwise_distances_argmin

        zn, pn = z.cpu().numpy(), protos.cpu().numpy()
        fn = lambda: pairwise_distances_argmin(zn, pn)  # noqa: E731
    elif provider == "reference":
        fn = lambda: nearest_prototype_ref(z, protos)  # noqa: E731
    elif provider == "torch_topk":
        # the torch backend with its C best-two kernel switched off (the eager topk(2) step it
        # replaced, kept as the fallback): the A/B of hiertail_fast/ops/_nearest_rows.py
        import hiertail_fast.ops._nearest_rows as rows_mod

        def fn():
            real = rows_mod.kernel
            rows_mod.kernel = lambda dtype: None
            try:
                return nearest_prototype(z, protos, backend="torch")
            finally:
                rows_mod.kernel = real
    else:
        fn = lambda: nearest_prototype(z, protos, backend=provider)  # noqa: E731

    def step():
        out = fn()
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        return out

    return step


@pytest.mark.parametrize("n", NP_SIZES)
@pytest.mark.parametrize("m", [282, 4096])
@pytest.mark.parametrize("provider", ["reference", "torch", "sklearn"]
                         + (["triton"] if DEVICE == "cuda" else []))
def test_nearest_prototype(benchmark, peak_memory, device_label, provider, n, m):
    d = 128
    if provider == "reference" and n * m > 2_000 * 282:
        pytest.skip("the dense reference only up to 2k x 282")
    if provider == "sklearn" and n * m > 100_000 * 282:
        pytest.skip("sklearn only up to 100k x 282")
    if provider == "sklearn":
        pytest.importorskip("sklearn.metrics")
    benchmark.group = f"nearest_prototype n={n} m={m} d={d}"
    step = make_prototype_step(provider, n, m, d)
    step()
    with peak_memory() as pm:
        benchmark.pedantic(step, rounds=3, iterations=1)
    benchmark.extra_info.update(n=n, m=m, d=d, device=device_label, provider=provider,
                                peak_bytes=pm.peak_bytes, peak_memory_method=pm.method)
