"""End-to-end benchmark: one HierTail training epoch (forward + backward + Adam step).

The same epoch as ``bench/scale.py`` (synthetic long-tail graph, 70 classes, 128 features,
hidden 128, ``paper`` configuration), per backend available on this machine:

    torch      the fast torch path (blocked contrastive loss, CSR propagation)
    reference  the dense reference ops (N x N losses), where it fits in memory
    triton     the Triton kernels (CUDA only)

on CUDA when a GPU is present, else on CPU.
The backend is forced with ``HIERTAIL_BACKEND`` (``ops/_dispatch.py``). Sizes: 500 nodes by
default (the CI smoke run, ``pytest bench/ --benchmark-disable``); 10,000 and 100,000 nodes with
``HIERTAIL_BENCH_FULL=1``. Recorded per run in ``extra_info``: backend (also as ``provider``),
dtype, nodes, edges, device name, torch version and threads, peak memory of the benchmarked
epochs, the warm-up round included (bench/conftest.py ``PeakMemory``: CUDA
max_memory_allocated growth / polled RSS growth on CPU) and its method.

    HIERTAIL_BENCH_FULL=1 pytest bench/test_epoch.py --benchmark-autosave
    HIERTAIL_BENCH_FULL=1 pytest bench/test_epoch.py --benchmark-compare \\
        --benchmark-compare-fail=median:10%
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import psutil
import pytest
import torch

FULL = os.environ.get("HIERTAIL_BENCH_FULL", "0") == "1"
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
SIZES = [500] + ([10_000, 100_000] if FULL else [])
BACKENDS = ["torch", "reference"] + (["triton"] if CUDA else [])
ROUNDS = {500: 5, 10_000: 3, 100_000: 1}


def _load_scale():
    """bench/scale.py as a module (bench/ is not a package): its epoch set-up is reused."""
    name = "hiertail_bench_scale"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("scale.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


scale = _load_scale()


def _spec(nodes: int, backend: str) -> dict:
    return dict(method="hiertail-reference" if backend == "reference" else "hiertail",
                nodes=nodes, classes=70, avg_degree=10.0, features=128, hidden=128,
                config="paper", device=DEVICE, seed=0)


@pytest.mark.parametrize("nodes", SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_hiertail_epoch(benchmark, backend, nodes, monkeypatch, peak_memory, device_label):
    spec = _spec(nodes, backend)
    if backend == "reference":
        need = scale.predict_memory("hiertail-reference", nodes, classes=70, features=128,
                                    hidden=128, avg_degree=10.0)
        free = torch.cuda.mem_get_info()[0] if CUDA else psutil.virtual_memory().available
        if need > 0.5 * free:
            pytest.skip(f"the dense reference would need ~{need / 1e9:.0f} GB at {nodes} nodes")
    monkeypatch.setenv("HIERTAIL_BACKEND", backend)
    benchmark.group = f"hiertail epoch, {nodes} nodes"
    epoch, edges, losses, _once = scale._setup(spec, nodes)   # HierTail: no after-loop stage
    rounds = ROUNDS[nodes]
    with peak_memory(spec["device"]) as pm:
        benchmark.pedantic(epoch, rounds=rounds, iterations=1,
                           warmup_rounds=0 if nodes >= 100_000 else 1)
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    benchmark.extra_info.update(
        backend=backend, provider=backend, dtype="float32",   # provider, dtype: as every suite
        nodes=nodes, edges=edges, config="paper", hidden=128, classes=70,
        device=device_label,
        torch=torch.__version__, torch_threads=torch.get_num_threads(),
        peak_bytes=int(pm.peak_bytes), peak_memory_method=pm.method)
