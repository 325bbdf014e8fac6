"""Shared benchmark helpers: the FULL switch, peak-memory measurement, device name.

Peak memory of a call (``PeakMemory``):
* CUDA: ``torch.cuda.max_memory_allocated`` growth over the allocation at entry.
* CPU: tracemalloc does not see torch's allocations, and ``ru_maxrss`` only grows over the
  process lifetime (0 for anything under an earlier peak), so a background thread polls the
  process RSS with psutil every ``interval`` seconds (torch ops release the GIL) and reports the
  highest RSS seen minus the RSS at entry. Allocations shorter than the interval can be missed;
  large tensors are mmap'd and returned to the OS on free, so RSS follows them closely.
"""
from __future__ import annotations

import os
import threading

import pytest
import torch
from _device import DEVICE, device_name  # noqa: F401  (re-exported for the suites)

FULL = os.environ.get("HIERTAIL_BENCH_FULL", "0") == "1"


class PeakMemory:
    """``with PeakMemory() as pm: ...`` then ``pm.peak_bytes`` (growth over the entry level)."""

    method = "cuda max_memory_allocated" if DEVICE == "cuda" else "psutil RSS polled every 2 ms"

    def __init__(self, device: str = DEVICE, interval: float = 0.002) -> None:
        self.device, self.interval, self.peak_bytes = device, interval, 0

    def __enter__(self) -> PeakMemory:
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._start = torch.cuda.memory_allocated()
            return self
        import psutil

        self._proc = psutil.Process()
        self._start = self._peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, self._proc.memory_info().rss)
            self._stop.wait(self.interval)

    def __exit__(self, *exc) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated() - self._start
            return
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, self._proc.memory_info().rss)
        self.peak_bytes = self._peak - self._start


@pytest.fixture
def device_label() -> str:
    return device_name()


@pytest.fixture
def peak_memory():
    """Factory: ``with peak_memory() as pm: ...``."""
    return PeakMemory


def pytest_benchmark_update_machine_info(config, machine_info: dict) -> None:
    """Record what decides the numbers in every saved run (--benchmark-autosave / -json)."""
    machine_info["torch"] = torch.__version__
    machine_info["torch_threads"] = torch.get_num_threads()
    machine_info["device"] = device_name()
    machine_info["hiertail_backend"] = os.environ.get("HIERTAIL_BACKEND", "auto")
    machine_info["hiertail_bench_full"] = FULL
