"""bench/scale.py's ``--cpu-memory tracked`` figure, bench/test_epoch.py with its
bench/conftest.py ``PeakMemory``, and ImGAGN's noise: corners a mutation audit (2026-12-03,
session 44) found unpinned. Each test failed on the mutant its docstring names and passes on main.
All in-process, with stand-in profilers, set-ups, benchmarks and ``torch.cuda`` functions where
the real ones would only add time.
"""
from __future__ import annotations

import json
import math
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from hiertail_fast.baselines import BaselineConfig, MethodContext, build_method
from hiertail_fast.data.synthetic import make_synthetic_graph
from hiertail_fast.nn.hiertail import prepare_graph
from tests.conftest import load_bench, recorded_method_seeds
from tests.test_scale import scale

worker = sys.modules["_scale_worker"]
MB = 1_000_000


# ----------------------------------------------------------------------------- tracked peak
def _alloc(t: int, nbytes: int, device: str = "cpu"):
    from torch._C._profiler import _EventType
    return SimpleNamespace(tag=_EventType.Allocation, start_time_ns=t, children=[],
                           extra_fields=SimpleNamespace(device=torch.device(device),
                                                        alloc_size=nbytes))


def _op(t: int, *children):
    from torch._C._profiler import _EventType
    return SimpleNamespace(tag=_EventType.TorchOp, start_time_ns=t, children=list(children),
                           extra_fields=None)


def test_tracked_peak_sums_nested_cpu_events_in_time_order(monkeypatch):
    """``_tracked_peak`` reads the profiler's event TREE: allocations sit under the ops that
    made them (nested ops too), listed op by op, not in time order, and a GPU's allocations
    appear beside the CPU's. The figure is the peak of the CPU bytes live in time order (150
    here): counting the CUDA block (1,150), skipping frees (180), leaving out nested events
    (0) or summing in the tree's order each reports another number, and the one real-profiler
    test (flat allocations, CPU only) could not tell."""
    tree = [_op(0, _alloc(1, 100), _alloc(4, -100)),
            _op(2, _alloc(3, 50), _alloc(6, -50), _op(5, _alloc(5, 30), _alloc(7, -30))),
            _alloc(2, 1000, "cuda"), _alloc(8, -1000, "cuda")]
    asked = {}

    class FakeProfile:
        def __init__(self, **kwargs):
            asked.update(kwargs)
            self.profiler = SimpleNamespace(kineto_results=SimpleNamespace(
                experimental_event_tree=lambda: list(tree)))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    ran = []
    assert worker._tracked_peak(lambda: ran.append(1)) == 150
    assert ran == [1] and asked["profile_memory"] is True


def _fake_setup(epoch_bytes: int, once_bytes: int | None, calls: list):
    """A worker set-up whose epoch and once-stage 'allocate' the given bytes (read by the fake
    _tracked_peak below); records the graph size of every set-up."""
    def setup(spec, nodes):
        calls.append(nodes)
        losses: list[float] = []

        def epoch():
            losses.append(1.0)
        epoch.nbytes = epoch_bytes
        once = None
        if once_bytes is not None:
            def once():
                pass
            once.nbytes = once_bytes
        return epoch, 10, losses, once
    return setup


SPEC = dict(method="lte4g", nodes=1000, classes=4, avg_degree=4.0, features=8, hidden=8,
            config="paper", epochs=1, warmup=0, device="cpu", seed=0, cpu_memory="tracked",
            threads=None, loss_dtype=None)


def test_tracked_peak_is_the_larger_of_an_epoch_and_the_after_loop_stage(monkeypatch):
    """'tracked' mode reports max(epoch peak, after-loop stage peak) (the docstring: the
    stages' memory counts in the peak). The suite only had a stage larger than the epoch, so
    taking the stage's peak alone, or adding the two, passed: an LTE4G run whose epoch (20 MB)
    outweighs its stages (8 MB) read 8 or 28 MB."""
    calls: list[int] = []
    monkeypatch.setattr(worker, "_setup", _fake_setup(20 * MB, 8 * MB, calls))
    monkeypatch.setattr(worker, "_tracked_peak", lambda step: step.nbytes)
    assert worker.run_worker(dict(SPEC))["peak_memory_bytes"] == 20 * MB
    monkeypatch.setattr(worker, "_setup", _fake_setup(3 * MB, None, calls))
    assert worker.run_worker(dict(SPEC, method="gcn"))["peak_memory_bytes"] == 3 * MB
    assert calls == [1000, 1000]          # tracked: no RSS baseline, so no priming run


def _sweep_specs(monkeypatch, tmp_path, argv):
    specs: list[dict] = []

    def fake_run(spec, timeout):
        specs.append(spec)
        return {"edges": 10, "epoch_seconds": 0.1, "peak_memory_bytes": 1e6, "device": "cpu",
                "status": "ok", "warmup_epochs": 1, "timed_epochs": 3}

    monkeypatch.setattr(scale, "run_one", fake_run)
    code = scale.main(["--sizes", "100", "200", "--methods", "gcn", "--out", str(tmp_path),
                       "--no-plot", "--memory-budget", "100", *argv])
    assert code == 0
    return specs, json.loads((tmp_path / "scale.json").read_text())


@pytest.mark.parametrize("mode", ["tracked", "rss"])
def test_cpu_memory_mode_reaches_every_worker_and_scale_json(monkeypatch, tmp_path, mode):
    """--cpu-memory picks what every run's peak_memory_bytes means (peak RSS above a primed
    baseline, or torch's allocator peak of one step): the sweep must hand the asked mode to
    every worker, and scale.json, the only record of it beside the CSV, must say which one
    was measured. Only the default mode's 'RSS' label was tested: dropping the mode from the
    spec for 'rss', recording it in no field or labelling tracked figures as RSS passed."""
    specs, info = _sweep_specs(monkeypatch, tmp_path, ["--device", "cpu", "--cpu-memory", mode])
    assert [s["cpu_memory"] for s in specs] == [mode, mode]
    assert info["args"]["cpu_memory"] == mode
    if mode == "tracked":
        assert "allocator" in info["memory_measure"] and "RSS" not in info["memory_measure"]
    else:
        assert "RSS" in info["memory_measure"] and "allocator" not in info["memory_measure"]


def test_a_cuda_sweep_is_labelled_cuda_whatever_cpu_memory_says(monkeypatch, tmp_path):
    """--cpu-memory does not apply to a CUDA run (the worker reads max_memory_allocated):
    scale.json must name the CUDA figure even when --cpu-memory tracked was passed too."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    _, info = _sweep_specs(monkeypatch, tmp_path, ["--device", "cuda", "--cpu-memory", "tracked"])
    assert info["memory_measure"] == "torch.cuda.max_memory_allocated"


def test_a_misspelt_cpu_memory_mode_is_refused(capsys):
    """A typo (--cpu-memory trakced) must stop the sweep before any run: accepted, every
    worker fell through to the RSS figure and the hour-long sweep reported the wrong measure
    under the asked name in scale.json."""
    with pytest.raises(SystemExit) as exc:
        scale.parse_args(["--cpu-memory", "trakced", "--device", "cpu"])
    assert exc.value.code == 2
    assert "invalid choice: 'trakced'" in capsys.readouterr().err


def test_scale_workers_seed_the_baselines_generator_from_the_run_seed(monkeypatch):
    """A harness baseline's random draws (ImGAGN's noise, GraphSMOTE's pairs, ...) come from
    the MethodContext generator, which the worker must seed with --seed as the training CLI
    does: seeded with a constant, every --seed timed the same draws."""
    import hiertail_fast.baselines as baselines

    seen = recorded_method_seeds(monkeypatch, baselines)
    spec = dict(method="imgagn", classes=4, avg_degree=4.0, features=8, hidden=8,
                config="paper", device="cpu", seed=7, loss_dtype=None)
    worker._setup(spec, 120)
    assert seen == [7]


# ----------------------------------------------------------------------------- bench/test_epoch.py
@pytest.fixture
def bench_epoch():
    """bench/test_epoch.py and bench/conftest.py as modules (bench/ is on sys.path through
    tests.test_scale)."""
    return (load_bench("hiertail_bench_test_epoch", "test_epoch.py"),
            load_bench("hiertail_bench_conftest", "conftest.py"))


class _Benchmark:
    def __init__(self):
        self.extra_info, self.group, self.calls = {}, None, []

    def pedantic(self, target, rounds, iterations, warmup_rounds):
        self.calls.append(dict(rounds=rounds, iterations=iterations, warmup_rounds=warmup_rounds))
        target()


class _Peak:
    method, peak_bytes = "stand-in", 0
    devices: list = []

    def __init__(self, device):
        _Peak.devices.append(device)
        self._start = 999

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.peak_bytes = 12_345


def _run_epoch_test(mod, monkeypatch, backend, nodes, loss=1.0):
    seen = {}

    def setup(spec, n):
        import os
        seen.update(spec=spec, nodes=n)
        losses: list[float] = []

        def epoch():
            seen["env"] = os.environ.get("HIERTAIL_BACKEND")
            losses.append(loss)
        return epoch, 4321, losses, None

    monkeypatch.setattr(mod.scale, "_setup", setup)
    _Peak.devices = []
    bench = _Benchmark()
    mod.test_hiertail_epoch(bench, backend, nodes, monkeypatch, _Peak, "the device")
    return bench, seen


@pytest.mark.parametrize("backend", ["torch", "reference", "triton"])
def test_epoch_benchmark_times_its_backends_model_and_records_what_it_ran(
        bench_epoch, monkeypatch, backend):
    """Each benchmark row is compared across commits by its backend and size
    (--benchmark-compare): the epoch must run the model of its backend (the dense reference
    for 'reference' only: a Triton row timing the reference compared nonsense), with
    HIERTAIL_BACKEND forcing the engine during the epoch, on a graph of the nodes it records,
    and extra_info must carry what was run (backend, nodes, the set-up's edges, the PeakMemory
    growth on the run's device). The CI smoke run (500 nodes, both CPU backends; a warm-up
    round before the timed ones) only checked the loss was finite."""
    mod, _ = bench_epoch
    monkeypatch.setattr(mod, "DEVICE", "cuda")       # the spec's device reaches PeakMemory
    bench, seen = _run_epoch_test(mod, monkeypatch, backend, 500)
    want = "hiertail-reference" if backend == "reference" else "hiertail"
    assert seen["spec"]["method"] == want and seen["nodes"] == 500
    assert seen["env"] == backend
    assert _Peak.devices == ["cuda"]
    info = bench.extra_info
    assert (info["backend"], info["nodes"], info["edges"]) == (backend, 500, 4321)
    assert (info["provider"], info["dtype"]) == (backend, "float32")   # README: every suite's
    assert info["device"] == "the device"
    assert (info["peak_bytes"], info["peak_memory_method"]) == (12_345, "stand-in")
    assert bench.calls == [dict(rounds=mod.ROUNDS[500], iterations=1, warmup_rounds=1)]
    assert 500 in mod.SIZES and {"torch", "reference"} <= set(mod.BACKENDS)


def test_epoch_benchmark_fails_on_a_non_finite_loss(bench_epoch, monkeypatch):
    """A benchmark whose training loss went NaN times a broken epoch: the CI smoke run must
    fail, not record the time."""
    mod, _ = bench_epoch
    with pytest.raises(AssertionError):
        _run_epoch_test(mod, monkeypatch, "torch", 500, loss=math.nan)


def test_epoch_benchmark_skips_the_dense_reference_where_it_cannot_fit(bench_epoch, monkeypatch):
    """HIERTAIL_BENCH_FULL=1 adds 100,000 nodes, where the dense reference needs ~210 GB: it
    must be skipped (not started: an out-of-memory kill ends the whole benchmark session), yet
    run at 10,000 nodes (~2.5 GB) on a 64 GB machine."""
    mod, _ = bench_epoch
    monkeypatch.setattr(mod, "CUDA", False)
    monkeypatch.setattr(mod.psutil, "virtual_memory", lambda: SimpleNamespace(available=64e9))
    with pytest.raises(pytest.skip.Exception, match="would need ~2"):
        _run_epoch_test(mod, monkeypatch, "reference", 100_000)
    bench, seen = _run_epoch_test(mod, monkeypatch, "reference", 10_000)
    assert seen["nodes"] == 10_000 and bench.calls


class _FakeRss:
    """psutil.Process stand-in for PeakMemory: the RSS is ``now``; every value PeakMemory's
    poller (a thread other than the test's) reads is kept in ``polled``, and every timeout an
    Event is waited on with (the poller's interval) in ``waits``. Real RSS cannot serve here:
    in a long pytest process a fresh 100 MB buffer may reuse pages already resident (CI once
    saw 4 KB of growth)."""

    def __init__(self, monkeypatch, conftest, rss: int):
        import psutil

        self.now, self.polled, self.waits = rss, [], []
        monkeypatch.setattr(psutil, "Process", lambda: self)
        fake = self

        class Event(threading.Event):
            def wait(self, timeout=None):
                if timeout is not None:       # (Thread.start waits on an Event with none)
                    fake.waits.append(timeout)
                return super().wait(timeout)
        monkeypatch.setattr(conftest.threading, "Event", Event)

    def memory_info(self):
        if threading.current_thread() is not threading.main_thread():
            self.polled.append(self.now)
        return SimpleNamespace(rss=self.now)

    def until_polled(self, rss: int, *, since: int | None = None) -> None:
        """Wait (up to 30 s) for the poller to read ``rss`` as its read number ``since`` or a
        later one (default: a read after this call)."""
        seen = len(self.polled) if since is None else since
        deadline = time.monotonic() + 30
        while rss not in self.polled[seen:]:
            assert time.monotonic() < deadline, "PeakMemory's poller stopped reading the RSS"
            time.sleep(0.001)


def test_peak_memory_cpu_is_the_peak_above_entry_even_when_freed_before_exit(bench_epoch,
                                                                             monkeypatch):
    """bench/conftest.py's CPU PeakMemory: the highest RSS polled during the block minus the
    RSS at entry, polled every `interval`. 100 MB held while the poller reads it and freed
    before the block ends must show as 100 MB (the epoch's temporaries are gone by its end);
    an empty block shows ~0 (not the process's whole RSS). Keeping the last sample, the RSS
    at exit, the whole RSS, or polling once a second (not every 2 ms) each fail here."""
    _, conftest = bench_epoch
    with conftest.PeakMemory("cpu") as idle:                     # the real RSS
        pass
    assert idle.peak_bytes < 20 * MB, idle.peak_bytes
    rss = _FakeRss(monkeypatch, conftest, 300 * MB)
    with conftest.PeakMemory("cpu") as pm:
        rss.now = 400 * MB                    # a 100 MB temporary ...
        rss.until_polled(400 * MB)
        rss.now = 300 * MB                    # ... freed before the block ends
        rss.until_polled(300 * MB)
    assert pm.peak_bytes == 100 * MB
    assert rss.waits and set(rss.waits) == {0.002}


def test_peak_memory_cpu_samples_once_more_at_exit(bench_epoch, monkeypatch):
    """Memory still held when the block ends counts even if no poll saw it (interval longer
    than the block): the exit sample. Without it a benchmark shorter than the poll interval
    reported ~0."""
    _, conftest = bench_epoch
    rss = _FakeRss(monkeypatch, conftest, 300 * MB)
    with conftest.PeakMemory("cpu", interval=60.0) as pm:
        rss.until_polled(300 * MB, since=0)   # the poller's first read, at entry
        rss.now = 400 * MB                    # 100 MB, held through the exit, never polled
    assert rss.polled == [300 * MB]
    assert pm.peak_bytes == 100 * MB


def test_peak_memory_cuda_is_the_growth_over_entry_since_a_reset(bench_epoch, monkeypatch):
    """CUDA PeakMemory: max_memory_allocated after a reset at entry, minus what was allocated
    at entry. With 100 MB live at entry, an earlier 900 MB peak and a 50 MB block, the figure
    is 50 MB (not the 150 MB peak, nor the earlier 800 MB growth)."""
    _, conftest = bench_epoch
    fake = SimpleNamespace(live=100 * MB, peak=900 * MB)

    def reset(device=None):
        fake.peak = fake.live

    for name, fn in (("synchronize", lambda device=None: None),
                     ("reset_peak_memory_stats", reset),
                     ("memory_allocated", lambda device=None: fake.live),
                     ("max_memory_allocated", lambda device=None: fake.peak)):
        monkeypatch.setattr(torch.cuda, name, fn)
    with conftest.PeakMemory("cuda") as pm:
        fake.peak = max(fake.peak, fake.live + 50 * MB)
    assert pm.peak_bytes == 50 * MB


# ----------------------------------------------------------------------------- ImGAGN noise
@pytest.fixture(scope="module")
def tiny():
    g = make_synthetic_graph(90, num_classes=5, avg_degree=5, num_features=6, seed=2)
    return g, prepare_graph(g.edge_index, g.num_nodes)


def _imgagn(tiny, seed, **kw):
    g, graph = tiny
    counts = (8, 5, 3, 1, 0)
    train = torch.cat([torch.nonzero(g.y == c).flatten()[:k] for c, k in enumerate(counts)])
    ctx = MethodContext(g.x, g.y, graph, train, 5, torch.Generator().manual_seed(seed))
    cfg = BaselineConfig(method="imgagn", hidden=8, dropout=0.0, im_class_num=3, **kw)
    with torch.random.fork_rng():
        torch.manual_seed(0)                 # the same initial G and D for every seed
        return build_method(ctx, cfg).train()


def test_imgagn_noise_is_the_runs_generators_normal_draws_one_per_block(tiny):
    """Each cycle's z is a fresh N(0, I) draw per block from the run's generator (seeded from
    the run seed): the next draws of that generator, block after block. Drawing from torch's
    global RNG, from a generator seeded by the step count, one draw shared (sliced) by the
    blocks, or uniform noise all passed the suite, which only used z through the model's own
    ``_z``."""
    m = _imgagn(tiny, seed=3)
    ref = torch.Generator()
    ref.set_state(m.ctx.generator.get_state())
    for _ in range(2):                                          # two cycles: new draws
        m.generate()
        want = [torch.randn(s, 100, generator=ref, dtype=m.ctx.x.dtype) for _, _, s in m.blocks]
        assert all(torch.equal(z, w) for z, w in zip(m._z, want, strict=True))


def test_imgagn_is_reproducible_from_its_seed_and_leaves_the_global_rng_alone(tiny):
    """A run's generated nodes depend on its seed only: the same seed gives the same noise
    whatever torch's global RNG holds, another seed other noise, and a cycle (generate, D
    step, G step) consumes no global draw, so it neither perturbs nor is perturbed by other
    code seeding or drawing from torch's RNG."""
    zs = []
    for seed, global_seed in ((3, 0), (3, 1), (4, 0)):
        m = _imgagn(tiny, seed, disc_steps=1)
        with torch.random.fork_rng():
            torch.manual_seed(global_seed)
            state = torch.get_rng_state()
            m.train_loss().backward()                           # generate + D step
            m.train_loss().backward()                           # G step on the same z
            assert torch.equal(torch.get_rng_state(), state)
        zs.append([z.clone() for z in m._z])
    assert all(torch.equal(a, b) for a, b in zip(zs[0], zs[1], strict=True))
    assert not torch.equal(zs[0][0], zs[2][0])
