"""Shared test setup: seeds, devices, tolerances, and Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton is imported anywhere, so it is set here, at
import time of the test session, whenever no CUDA device is present.

Device-awareness of the Triton tests (the suite must pass unchanged on a CUDA machine, where the
kernels are compiled and accept only CUDA tensors):
* every test that runs the ``triton`` backend takes its tensors' device from
  `backend_device(backend)` / the ``triton_device`` fixture: ``TRITON_DEVICE`` = "cuda" when a
  GPU is present, else "cpu" (interpreter);
* a collected test whose parameters pair ``triton`` with ``device="cpu"`` is skipped on CUDA
  machines (`pytest_collection_modifyitems`);
* under the interpreter a guard fails any test that launches a Triton kernel without having
  asked for the Triton device first (`_triton_launch_guard`): such a test would hand CPU tensors
  to a compiled kernel on a GPU machine.
``HIERTAIL_TEST_EMULATE_CUDA=1`` makes the collection behave as on a CUDA machine (devices,
skips) so that tests/test_device_awareness.py can check it without a GPU; only
``--collect-only`` is meaningful in that mode.
Under the interpreter, tests/_interpreter_speed.py spares it re-patching triton.language on
every call of a kernel's helper (~40% of a launch; ``HIERTAIL_TEST_PLAIN_INTERPRETER=1``
runs the interpreter as shipped).
"""
from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from tests import _gc_freeze

CUDA_PRESENT = torch.cuda.is_available()
EMULATE_CUDA = os.environ.get("HIERTAIL_TEST_EMULATE_CUDA", "0") == "1"
if not CUDA_PRESENT:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hiertail_fast.ops._dispatch import triton_interpreting  # noqa: E402  (after the line above)

CUDA_MACHINE = CUDA_PRESENT or EMULATE_CUDA  # collection as on a GPU machine

DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# One tolerance table (STYLE.md): comparison of a backend against the float64 reference.
TOLERANCES = {
    torch.float64: dict(rtol=1e-7, atol=1e-9),
    torch.float32: dict(rtol=1e-4, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=1e-2, atol=1e-2),
}

DEVICES = ["cpu"] + (["cuda"] if CUDA_MACHINE else [])
# where the Triton kernels run: compiled on the GPU, else the interpreter on CPU tensors
TRITON_DEVICE = "cuda" if CUDA_MACHINE else "cpu"
TRITON_CPU_SKIP = ("pairs the triton backend with CPU tensors: on a CUDA machine the kernels "
                   "are compiled and need CUDA tensors (the interpreter runs them only on "
                   "machines without a GPU)")


class _TritonDeviceRequests:
    """Whether the running test asked for the Triton device (reset before every test)."""

    asked = False


def backend_device(backend: str | None) -> str:
    """Device for the tensors a test hands to `backend`: TRITON_DEVICE for "triton", the GPU
    when present for "attention", else CPU."""
    if backend == "triton":
        _TritonDeviceRequests.asked = True
        return TRITON_DEVICE
    if backend == "attention":                      # CUDA: the memory-efficient / flash kernels
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cpu"


def on_backend_device(backend: str | None) -> str:
    """For tests that build their cases on CPU (the fuzz suite, the hardening regressions): the
    triton backend runs there through the interpreter on machines without a GPU and is skipped
    on CUDA machines (the device-aware kernel tests run it compiled); asking `backend_device`
    also satisfies the launch guard."""
    if backend == "triton" and CUDA_MACHINE:
        pytest.skip(TRITON_CPU_SKIP)
    return backend_device(backend)


def tol(dtype: torch.dtype) -> dict:
    return TOLERANCES[dtype]


def ulp(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of `dtype` at |v| (its smallest normal's spacing below that)."""
    e = torch.floor(torch.log2(v.abs().clamp_min(torch.finfo(dtype).tiny)))
    return torch.exp2(e) * torch.finfo(dtype).eps


BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str, file: str):
    """A fresh module `name` from bench/`file` (the bench scripts are not a package; those that
    import their siblings put bench/ on sys.path themselves)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, BENCH / file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FakeClock:
    """A perf_counter that moves only when a step says how long it took."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


requires_triton = pytest.mark.skipif(not triton_importable(), reason="triton is not installed")


def torch_sparse_or_none():
    """The optional torch_sparse module where the library can use it, else None: not
    installed, or built against another torch release (its ops fail to load with an OSError,
    which ``pytest.importorskip`` does not catch; the library counts it as not installed)."""
    from hiertail_fast.ops.gcn_propagate import torch_sparse_available

    if not torch_sparse_available():
        return None
    import torch_sparse

    return torch_sparse


def torch_sparse_or_skip():
    """torch_sparse, or skip the test where ``torch_sparse_or_none`` finds none."""
    module = torch_sparse_or_none()
    if module is None:
        pytest.skip("torch_sparse is not installed or cannot be loaded with this torch")
    return module


def _run_interpreter_probe() -> int:
    """A three-line kernel with a loop over a runtime bound, under the interpreter: 2."""
    import triton
    import triton.language as tl

    @triton.jit
    def probe(out, n, BLOCK: tl.constexpr):
        acc = 0
        for _ in range(0, n, BLOCK):
            acc += 1
        tl.store(out, acc)
    out = torch.zeros(1, dtype=torch.int32)
    probe[(1,)](out, 4, BLOCK=2)
    return int(out.item())


def interpreter_problem(run_probe=_run_interpreter_probe) -> str | None:
    """Why triton's CPU interpreter cannot run our kernels in this environment, or None (also
    None where it is not in use: a GPU, no triton, TRITON_INTERPRET=0). Seen: the interpreter
    of triton 3.6 (the GPU image's release) turns a kernel's runtime scalar into an index with
    int() of a one-element NumPy array, an error since NumPy 2.4 ("only 0-dimensional arrays
    can be converted to Python scalars"), so every kernel looping over a runtime bound fails
    (255 tests with triton 3.6 and NumPy 2.4.6; triton 3.8 and 3.9 run with it)."""
    if CUDA_PRESENT or not triton_interpreting() or not triton_importable():
        return None
    import triton
    try:
        got = run_probe()
    except Exception as exc:                        # noqa: BLE001 - reported, not swallowed
        cause = f"{exc!r}"
        if "only 0-dimensional arrays" in cause or "only length-1 arrays" in cause:
            return (f"triton {triton.__version__}'s CPU interpreter cannot run kernels with "
                    f"NumPy {np.__version__} ({cause}); install 'numpy<2.4' or triton >= 3.8 "
                    "to run the Triton tests on CPU (a GPU runs them compiled)")
        return f"triton {triton.__version__}'s CPU interpreter failed a three-line kernel: {cause}"
    if got != 2:
        return (f"triton {triton.__version__}'s CPU interpreter computed {got} for a loop of 2 "
                "steps")
    return None


def pytest_configure(config):
    """Stop at once, with the reason and the fix, where the Triton interpreter cannot run
    here: otherwise every Triton test fails on its own with the interpreter's error."""
    problem = interpreter_problem()
    if problem is not None:
        raise pytest.UsageError(problem)
    if (not CUDA_PRESENT and triton_interpreting() and triton_importable()
            and os.environ.get("HIERTAIL_TEST_PLAIN_INTERPRETER", "0") != "1"):
        from tests._interpreter_speed import install  # kernels' helpers: no re-patch per call
        install()


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """Tiny tensors: OpenMP fork/join costs more than the work, and on a shared 2-core machine a
    parallel region can wait ~100 ms for a busy core. Use as
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture
def triton_device() -> str:
    """The device the Triton kernels run on (CUDA, or CPU under the interpreter)."""
    return backend_device("triton")


def _parameter_names(item) -> set[str]:
    """The string and device values among a collected test's parameters (none if it has no
    parameters)."""
    values = getattr(getattr(item, "callspec", None), "params", {}).values()
    return {str(v) for v in values if isinstance(v, (str, torch.device))}


def pairs_triton_with_cpu(item) -> bool:
    """Whether a collected test's parameters pair the triton backend with a CPU device."""
    return {"triton", "cpu"} <= _parameter_names(item)


# ``HIERTAIL_TEST_ORDER=device-first``: the tests that run the device's kernels are collected
# first, the rest after, each in its own order (bench/gpu_acceptance.sh: a device call stops
# the suite at its limit, 84 % of it on 2026-12-04's cold Triton cache; xdist hands tests
# out in collection order, the same on every worker, so a stopped run misses the files
# collected last, alphabetically, the Triton ones among them)
TEST_ORDER_ENV = "HIERTAIL_TEST_ORDER"
_DEVICE_FILES = ("triton", "attention", "cuda", "gpu", "kernel", "device")


def runs_the_device_kernels(item) -> bool:
    """Whether a collected test runs (or may run) kernels on the accelerator: a parameter
    naming cuda, triton or attention (the ``device`` fixture's cuda half among them), the
    ``triton_device`` fixture, or a file about them (its name)."""
    if _parameter_names(item) & {"cuda", "triton", "attention"}:
        return True
    if "triton_device" in getattr(item, "fixturenames", ()):
        return True
    path = getattr(item, "path", None) or Path(str(getattr(item, "fspath", "")))
    return any(part in Path(path).stem for part in _DEVICE_FILES)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Each module's first test: the objects alive then frozen out of the full garbage
    collections (tests/_gc_freeze.py)."""
    _gc_freeze.at_test_setup(item)


def pytest_sessionfinish(session, exitstatus):
    _gc_freeze.unfreeze()


def pytest_collection_modifyitems(config, items):
    order = os.environ.get(TEST_ORDER_ENV, "").strip()
    if order not in ("", "device-first"):
        raise pytest.UsageError(f"{TEST_ORDER_ENV}={order!r}: the one order is device-first")
    if order:
        items[:] = sorted(items, key=lambda item: not runs_the_device_kernels(item))  # stable
    if not CUDA_MACHINE:
        return
    for item in items:
        if pairs_triton_with_cpu(item):
            item.add_marker(pytest.mark.skip(reason=TRITON_CPU_SKIP))


def _interpreted_function_class():
    if not triton_interpreting() or CUDA_PRESENT:
        return None
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # triton missing (its tests are skipped) or a layout we do not know
        return None
    return InterpretedFunction if hasattr(InterpretedFunction, "run") else None


@pytest.fixture(autouse=True)
def _triton_launch_guard(monkeypatch):
    """Under the interpreter, fail a test that launches a Triton kernel without asking for the
    Triton device: on a GPU machine it would hand CPU tensors to a compiled kernel."""
    _TritonDeviceRequests.asked = False
    cls = _interpreted_function_class()
    if cls is not None:
        run = cls.run

        def guarded_run(self, *args, **kwargs):
            if not _TritonDeviceRequests.asked:
                pytest.fail(f"Triton kernel {self.__name__} launched by a test that did not take "
                            "its device from backend_device('triton') or the triton_device "
                            "fixture (tests/conftest.py): it would fail on a CUDA machine",
                            pytrace=False)
            return run(self, *args, **kwargs)

        monkeypatch.setattr(cls, "run", guarded_run)
    yield


@pytest.fixture
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        pytest.skip(f"shared datasets not found at {DATA_DIR}")
    return DATA_DIR


@pytest.fixture
def two_threads():
    """torch on 2 threads for the test (the OpenMP team checks need more than one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def fresh_native(monkeypatch, tmp_path):
    """The C kernels' builder with a private build cache and no library loaded yet in this
    process (``hiertail_fast.ops._native``)."""
    import hiertail_fast.ops._native as native_mod

    monkeypatch.setattr(native_mod, "_LOADED", {})
    monkeypatch.setattr(native_mod, "_WARNED", [])
    monkeypatch.setenv("HIERTAIL_NATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HIERTAIL_NATIVE", raising=False)
    return tmp_path / "cache"


@pytest.fixture
def cuda_forms():
    """The torch loss engines configured on CPU tensors as they run for CUDA tensors, so the
    CUDA-only code paths are checked against the reference on a machine without a GPU: no C
    kernels (the torch block step, the positives' torch passes), no symmetric engine, the
    whole-band positives, and the sync-free forms of every data-dependent shortcut
    (``hiertail_fast.ops._host_reads.cuda_code_paths``)."""
    from hiertail_fast.ops._host_reads import cuda_code_paths

    with cuda_code_paths():
        yield


@pytest.fixture
def exact_rows_rule_off(monkeypatch):
    """The attention engine's exact-variant rows rule off for the test
    (``_attention_lse.EXACT_LOGIT_PER_ROW``: since 2026-12-05 a problem of N < 1,024 rows runs
    the kernels only while its logit bound is <= max(64, N), our engine above): the tests that
    check the kernels' math, or plumbing around them (autocast, torch.func, second
    derivatives), on small problems with larger logits keep running the kernels, as problems of
    1,024 rows and more with those logits do. MAX_LOGIT stays. The rule itself:
    tests/test_attention_lse.py."""
    import hiertail_fast.ops._attention_lse as attn

    monkeypatch.setattr(attn, "EXACT_LOGIT_PER_ROW", float("inf"))


def with_cuda_forms(request, backend: str) -> str:
    """A test's backend (or device) value, where "torch/cuda-forms" ("cuda-forms" for a
    device) means CPU tensors through the torch engine's CUDA code paths: applies the
    ``cuda_forms`` fixture for it and returns "torch" ("cpu"); other values as they are."""
    if backend in ("torch/cuda-forms", "cuda-forms"):
        request.getfixturevalue("cuda_forms")
        return "torch" if backend == "torch/cuda-forms" else "cpu"
    return backend


def fork_while_held(hold, target, args=(), wait_s: float = 30.0) -> tuple[bool, int | None]:
    """Fork a child running ``target(*args)`` while another thread of this process is inside
    ``hold()`` (a context manager: a lock, an override), as a DataLoader worker may be forked
    while another thread is inside our code. -> (the child hung, its exit code). The child
    inherits whatever the holding thread held, without that thread."""
    import multiprocessing
    import threading

    inside, leave = threading.Event(), threading.Event()

    def run():
        with hold():
            inside.set()
            leave.wait(60)

    t = threading.Thread(target=run)
    t.start()
    try:
        assert inside.wait(10)
        child = multiprocessing.get_context("fork").Process(target=target, args=args)
        child.start()
        child.join(wait_s)
        hung = child.is_alive()
        if hung:
            child.kill()
            child.join()
        return hung, child.exitcode
    finally:
        leave.set()
        t.join(10)


def ctrl_c_line(monkeypatch, capsys, target, name: str, run, *, held: bool = False) -> str:
    """Ctrl-C inside ``target.name`` (patched to raise KeyboardInterrupt) while ``run()`` runs
    a command: it must exit 130 without a traceback. ``held``: the Ctrl-C a result writer's
    rotation held comes once the real ``target.name`` has written its files, as the
    ``DeferredInterrupt`` the rotation raises. Returns what the command wrote to stderr. An
    escaping KeyboardInterrupt fails the test (escaping, it would stop the whole pytest run)."""
    from hiertail_fast._files import DeferredInterrupt

    real = getattr(target, name)

    def interrupt(*args, **kwargs):
        if held:
            real(*args, **kwargs)
            raise DeferredInterrupt
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(target, name, interrupt)
        try:
            with pytest.raises(SystemExit) as exc:
                run()
        except KeyboardInterrupt:
            pytest.fail("Ctrl-C escaped as a KeyboardInterrupt")
    err = capsys.readouterr().err
    assert exc.value.code == 130 and "Traceback" not in err, err
    return err


def recorded_plot_lines(monkeypatch) -> list:
    """Every ``Axes.plot`` call drawn from here on (matplotlib on the Agg backend), recorded as
    (xs, ys, label) and drawn as usual: what a figure shows, without reading its image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.axes

    drawn = []
    real = matplotlib.axes.Axes.plot

    def record(self, xs, ys, *args, **kwargs):
        drawn.append((list(xs), list(ys), kwargs.get("label")))
        return real(self, xs, ys, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", record)
    return drawn


def recorded_method_seeds(monkeypatch, module) -> list:
    """The initial seed of every MethodContext generator that ``module.build_method`` (as
    ``module`` imported it) is handed from here on, each method built as usual: where a
    baseline's random draws (SMOTE, GraphENS, ImGAGN) start."""
    seeds = []
    real = module.build_method

    def build(ctx, cfg):
        seeds.append(ctx.generator.initial_seed())
        return real(ctx, cfg)

    monkeypatch.setattr(module, "build_method", build)
    return seeds


def recorded_first_arg_shapes(monkeypatch, owner, name: str) -> list:
    """The shape of the first argument of every call of ``owner.name`` from here on, each call
    run as usual (which attention kernels a loss reached, and on what padded operands)."""
    shapes = []
    real = getattr(owner, name)

    def spy(*args, **kwargs):
        shapes.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return shapes


def run_at_once(calls: list[dict], timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """Each of ``calls`` (``subprocess.Popen`` keyword arguments: ``args``, ``env``, ``cwd``)
    started at once, stdout and stderr captured as text; their completed processes, in order.
    Each is waited for up to ``timeout`` s; any still running when one fails or times out is
    killed. (For tests whose command lines spend their time importing torch on one core.)"""
    procs = [subprocess.Popen(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **call)
             for call in calls]
    try:
        done = []
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        return done
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def built_kernel(kernel, what: str = "the native kernels"):
    """``kernel`` (a C kernel or library from the native loaders) where it built. Where it did
    not: the test skips without a C compiler, but fails on CI, where the kernels must build."""
    if kernel is None:
        if os.environ.get("CI"):
            pytest.fail(f"{what} did not build on the CI machine")
        pytest.skip("no C compiler here")
    return kernel


class LargestTensor(torch.utils._python_dispatch.TorchDispatchMode):
    """A memory probe for the linear-memory tests: records the most elements of any strided
    tensor an op returns (forward and backward: the CPU backward runs on the calling thread,
    under the mode)."""

    def __init__(self):
        super().__init__()
        self.largest, self.op = 0, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if (isinstance(t, torch.Tensor) and t.layout == torch.strided
                    and t.numel() > self.largest):
                self.largest, self.op = t.numel(), str(func)
        return out
