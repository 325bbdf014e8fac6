"""Benchmarks: class-balanced contrastive loss, forward + backward, speed and peak memory.

Providers
    reference   dense N x N oracle (``balanced_contrastive_loss_ref``; up to N = 20,000)
    torch       our CPU path: row blocks, exp once per element, gradient during forward
    triton      our Triton kernels (CUDA only)
plus the GEMM floor (Z.Z^T three times: ``torch.matmul`` of the full matrix, and the same
product in row blocks into one reused buffer, which also runs where N x N does not fit) and
the multi-level fusion (two BCL levels in one pass vs two single-level calls).

Data: ReLU features (non-negative, unnormalised, like HierTail's first GCN layer), Zipf
long-tailed labels over 40 classes, 40 prototype rows, tau = 0.1, float32. CI runs N = 1000
once as a smoke test; N = 5,000 / 20,000 (all providers) and 100,000 (torch) need
``HIERTAIL_BENCH_FULL=1``::

    pytest bench/test_contrastive.py --benchmark-disable                   # CI smoke run
    HIERTAIL_BENCH_FULL=1 pytest bench/test_contrastive.py --benchmark-autosave

``extra_info``: shapes, variant, provider, device name, peak memory (see bench/conftest.py:
CUDA max allocated, CPU psutil RSS polled every 2 ms) and its method.
"""
from __future__ import annotations

import os

import pytest
import torch

from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss

FULL = os.environ.get("HIERTAIL_BENCH_FULL", "0") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

SIZES = [1000] + ([5000, 20_000, 100_000] if FULL else [])
DIMS = [64, 128]
PROVIDERS = ["reference", "torch"] + (["triton"] if DEVICE == "cuda" else [])
REFERENCE_MAX_N = 20_000
TORCH_MAX_N_128 = 20_000          # d = 128 at 100k only for the kernels
N_CLASSES = 40


def _data(n: int, d: int, m: int = N_CLASSES, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    probs = 1.0 / torch.arange(1, N_CLASSES + 1, dtype=torch.float64)
    y = torch.multinomial(probs, n, replacement=True, generator=g)
    z = torch.relu(torch.randn(n, d, generator=g)) / d ** 0.5
    p = torch.relu(torch.randn(m, d, generator=g)) / d ** 0.5
    return z.to(DEVICE), y.to(DEVICE), p.to(DEVICE)


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _run(benchmark, peak_memory, device_label, step, n, info):
    rounds = 1 if n >= 20_000 else 3
    with peak_memory() as pm:
        benchmark.pedantic(step, rounds=rounds, iterations=1, warmup_rounds=0 if n >= 20_000
                           else 1)
    benchmark.extra_info.update(info, device=device_label, peak_bytes=pm.peak_bytes,
                                peak_memory_method=pm.method)


@pytest.mark.benchmark(group="contrastive-fwd-bwd")
@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_contrastive_fwd_bwd(benchmark, peak_memory, device_label, provider, n, d, variant):
    if provider == "reference" and n > REFERENCE_MAX_N:
        pytest.skip(f"the dense reference needs O(N^2) memory; skipped above N={REFERENCE_MAX_N}")
    if provider == "torch" and d == 128 and n > TORCH_MAX_N_128:
        pytest.skip("100k at d=128 on CPU: skipped to keep the full run short")
    z, y, p = _data(n, d)

    def step():
        zz = z.detach().requires_grad_()
        pp = p.detach().requires_grad_()
        loss = balanced_contrastive_loss(zz, y, prototypes=pp, temperature=0.1,
                                         variant=variant, backend=provider)
        loss.backward()
        _sync()

    info = dict(n=n, d=d, rows=n + p.shape[0], variant=variant, provider=provider,
                dtype="float32")
    _run(benchmark, peak_memory, device_label, step, n, info)


@pytest.mark.benchmark(group="contrastive-gemm-floor")
@pytest.mark.parametrize("kind", ["matmul", "blocked"])
@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("n", SIZES)
def test_gemm_floor(benchmark, peak_memory, device_label, n, d, kind):
    """The GEMM floor: Z.Z^T three times (forward, query-side and key-side gradient GEMMs)."""
    if kind == "matmul" and n > REFERENCE_MAX_N:
        pytest.skip("a full N x N float32 matrix does not fit")
    if d == 128 and n > TORCH_MAX_N_128:
        pytest.skip("100k at d=128 on CPU: skipped to keep the full run short")
    z, _, p = _data(n, d)
    z = torch.cat([z, p])
    rows = z.shape[0]
    b = max(8, min(rows, (48 << 20) // (4 * rows)))
    buf = torch.empty(b, rows, device=z.device)

    def step():
        for _ in range(3):
            if kind == "matmul":
                torch.matmul(z, z.t())
            else:
                for r0 in range(0, rows, b):
                    r1 = min(rows, r0 + b)
                    torch.mm(z[r0:r1], z.t(), out=buf[: r1 - r0])
        _sync()

    _run(benchmark, peak_memory, device_label, step, n, dict(n=n, d=d, rows=rows, kind=kind))


@pytest.mark.benchmark(group="contrastive-multilevel")
@pytest.mark.parametrize("mode", ["fused", "separate"])
@pytest.mark.parametrize("n", [1000] + ([20_000] if FULL else []))
def test_hierarchical_fused_vs_separate(benchmark, peak_memory, device_label, n, mode):
    """Two BCL levels (k1 = n/40, k2 = n/80 prototypes, nearest-prototype-like labels)."""
    d = 64
    z, _, _ = _data(n, d)
    g = torch.Generator().manual_seed(1)
    k = [max(2, n // 40), max(2, n // 80)]
    protos = [torch.relu(torch.randn(m, d, generator=g)).to(DEVICE) / d ** 0.5 for m in k]
    labels = [torch.randint(0, m, (n,), generator=g).to(DEVICE) for m in k]

    def step():
        zz = z.detach().requires_grad_()
        ps = [q.detach().requires_grad_() for q in protos]
        if mode == "fused":
            loss = hierarchical_contrastive_loss(zz, labels, ps, temperature=0.1)
        else:
            loss = sum(balanced_contrastive_loss(zz, lab, prototypes=q, temperature=0.1)
                       for lab, q in zip(labels, ps, strict=True))
        loss.backward()
        _sync()

    info = dict(n=n, d=d, levels=2, prototypes=k, mode=mode)
    _run(benchmark, peak_memory, device_label, step, n, info)


def _hiertail_like_embeddings(n: int, hidden: int = 128, seed: int = 0):
    """First-layer ReLU GCN outputs relu(A_hat X W) of a synthetic long-tail graph (Glorot W)."""
    from hiertail_fast.data.synthetic import make_synthetic_graph
    from hiertail_fast.ops.gcn_propagate import gcn_propagate

    graph = make_synthetic_graph(n, 40, num_features=64, seed=seed)
    g = torch.Generator().manual_seed(seed)
    w = (torch.rand(64, hidden, generator=g) * 2 - 1) * (6.0 / (64 + hidden)) ** 0.5
    with torch.no_grad():
        h = torch.relu(gcn_propagate(graph.x @ w, graph.edge_index, num_nodes=n))
    return h, graph.y


@pytest.mark.benchmark(group="contrastive-variants")
@pytest.mark.parametrize("tau", [1.0, 0.1])
def test_exact_vs_official_on_hiertail_like_embeddings(benchmark, tau):
    """Records both variants' values (SCL on class labels, BCL with nearest-prototype labels)."""
    n = 4000 if FULL else 1000
    h, y = _hiertail_like_embeddings(n)
    k = n // 40
    protos = h[torch.randperm(n, generator=torch.Generator().manual_seed(2))[:k]]
    nearest = torch.cdist(h, protos).argmin(1)
    values = {}
    for name, labels, p in (("scl", y, None), ("bcl", nearest, protos)):
        for variant in ("exact", "official"):
            values[f"{name}_{variant}"] = balanced_contrastive_loss(
                h, labels, prototypes=p, temperature=tau, variant=variant).item()
    benchmark.pedantic(lambda: balanced_contrastive_loss(h, nearest, prototypes=protos,
                                                         temperature=tau, variant="official"),
                       rounds=1, iterations=1)
    benchmark.extra_info.update(values, n=n, tau=tau, mean_norm=h.norm(dim=1).mean().item())
    for name in ("scl", "bcl"):
        assert values[f"{name}_exact"] >= values[f"{name}_official"] - 1e-3
