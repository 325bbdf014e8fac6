"""The benchmarks' CUDA branches on a CPU machine, through stand-in ``torch.cuda`` functions
(a mutation audit, s42: no test reached them before):

* ``bench/_gpu_checks.time_call``: the peak extra memory is that of one timed call (the
  warm-up, which compiles and tunes, is not counted) above what was live before, and each
  time is read from events that have completed (CUDA's raise otherwise);
* ``bench/_scale_worker.py``: the peak is ``max_memory_allocated`` over the training epochs
  (scale.py's docstring) of the TRAINING device, every sync waits on that device (the
  worker's comment: cuda:1 trained while cuda:0 is current), and --cpu-memory does not apply
  to a CUDA run."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import load_bench

MB = 1_000_000
TRAIN, CURRENT = "cuda:1", "cuda:0"


class FakeTimingCuda:
    def __init__(self):
        self.live, self.peak, self.pending = 10 * MB, 10 * MB, []

    def alloc(self, nbytes):
        self.peak = max(self.peak, self.live + nbytes)

    def synchronize(self, device=None):
        for ev in self.pending:
            ev.done = True
        self.pending.clear()

    def reset_peak_memory_stats(self, device=None):
        self.peak = self.live

    def memory_allocated(self, device=None):
        return self.live

    def max_memory_allocated(self, device=None):
        return self.peak

    def event(self, enable_timing=False):
        fake = self

        class Event:
            def __init__(self):
                self.done, self.t = False, None

            def record(self):
                self.t = len(fake.pending) + 1.0
                fake.pending.append(self)

            def synchronize(self):
                fake.synchronize()

            def elapsed_time(self, end):
                if not (self.done and end.done):        # as CUDA: the events must be complete
                    raise RuntimeError("event not completed")
                return 2.0
        return Event()


def _timing_on_fake_cuda(monkeypatch, module_name: str):
    """bench/_gpu_checks.py loaded as `module_name`, with torch.cuda's timing and memory calls
    replaced by a FakeTimingCuda (returned too)."""
    gc = load_bench(module_name, "_gpu_checks.py")
    fake = FakeTimingCuda()
    for name in ("synchronize", "reset_peak_memory_stats", "memory_allocated",
                 "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(torch.cuda, "Event", fake.event)
    return gc, fake


def test_cuda_timing_and_peak_of_one_call(monkeypatch):
    gc, fake = _timing_on_fake_cuda(monkeypatch, "bench_gpu_checks_cuda")
    calls = []

    def step():
        calls.append(1)
        fake.alloc(500 * MB if len(calls) == 1 else 30 * MB)   # the warm-up tunes: 500 MB

    res = gc.time_call(step, "cuda", reps=3, warmup=1)
    assert res == dict(median_s=2.0 / 1e3, reps=3, peak_extra_bytes=30 * MB)
    assert len(calls) == 4


def test_cuda_round_robin_peak_is_the_largest_timed_call(monkeypatch):
    """time_round_robin on CUDA: event times of completed events, and each step's peak extra
    memory is the largest of its own timed calls (reset before each call, so a neighbour's
    allocation in the same round is not counted; the warm-up, which compiles, neither)."""
    gc, fake = _timing_on_fake_cuda(monkeypatch, "bench_gpu_checks_cuda_rr")
    sizes = {"big": iter([900, 40, 60, 50]), "small": iter([700, 5, 7, 6])}

    def make(key):
        return lambda: fake.alloc(next(sizes[key]) * MB)

    res = gc.time_round_robin({k: make(k) for k in sizes}, "cuda", reps=3)
    assert res["big"] == dict(median_s=2.0 / 1e3, reps=3, peak_extra_bytes=60 * MB,
                              timing="round-robin")
    assert res["small"]["peak_extra_bytes"] == 7 * MB


class FakeDevicesCuda:
    """Per-device allocator peaks and a log of the calls, as torch.cuda would see them."""

    def __init__(self):
        self.peak = {TRAIN: 0, CURRENT: 0}
        self.log = []

    @staticmethod
    def _dev(device):
        return CURRENT if device is None else str(torch.device(device))

    def alloc(self, nbytes, device=TRAIN):
        self.peak[device] = max(self.peak[device], nbytes)

    def synchronize(self, device=None):
        self.log.append(("sync", self._dev(device)))

    def reset_peak_memory_stats(self, device=None):
        self.peak[self._dev(device)] = 0

    def max_memory_allocated(self, device=None):
        return self.peak[self._dev(device)]

    def get_device_name(self, device=None):
        return f"card of {self._dev(device)}"


@pytest.fixture
def worker_and_cuda(monkeypatch):
    worker = load_bench("bench_scale_worker_cuda", "_scale_worker.py")
    fake = FakeDevicesCuda()
    for name in ("synchronize", "reset_peak_memory_stats", "max_memory_allocated",
                 "get_device_name"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))

    def setup(spec, nodes):
        fake.alloc(900 * MB)                  # the generator's transients, before the epochs
        fake.alloc(50 * MB, CURRENT)          # something else on the current device

        def epoch():
            fake.log.append(("epoch", None))
            fake.alloc(120 * MB)
            losses.append(1.0)

        def once():
            fake.log.append(("once", None))
            fake.alloc(200 * MB)
        losses = []
        return epoch, 10, losses, once

    monkeypatch.setattr(worker, "_setup", setup)
    return worker, fake


@pytest.mark.parametrize("cpu_memory", ["rss", "tracked"])
def test_cuda_peak_is_the_training_devices_over_the_epochs(worker_and_cuda, cpu_memory):
    worker, fake = worker_and_cuda
    spec = dict(method="lte4g", nodes=100, classes=4, avg_degree=4.0, features=8, hidden=8,
                config="paper", epochs=2, warmup=1, device=TRAIN, seed=0,
                cpu_memory=cpu_memory, threads=None, loss_dtype=None)
    res = worker.run_worker(spec)
    # the epochs' and the after-loop stage's peak on cuda:1; not the setup's 900 MB, not cuda:0
    assert res["peak_memory_bytes"] == 200 * MB, res
    assert res["device"] == f"cuda (card of {TRAIN})"
    assert (res["warmup_epochs"], res["timed_epochs"]) == (1, 2)
    syncs = {dev for what, dev in fake.log if what == "sync"}
    assert syncs == {TRAIN}, fake.log
    # every timed piece of work (epochs, the once-stages) is followed by a sync before its time
    # is read
    steps = [i for i, (what, _) in enumerate(fake.log) if what in ("epoch", "once")]
    assert all(fake.log[i + 1][0] == "sync" for i in steps), fake.log
