"""The suite is device-aware (tests/conftest.py): on a CUDA machine no test hands CPU tensors to
a compiled Triton kernel. Checked here without a GPU in two ways:
* the launch guard: under the interpreter, a Triton kernel launched by a test that did not ask
  for the Triton device fails that test (so a new test that builds its tensors on CPU and runs
  the triton backend fails on CPU CI already, not first on a GPU machine);
* emulated collection: with HIERTAIL_TEST_EMULATE_CUDA=1 the suite is collected as on a CUDA
  machine, and every test whose parameters pair triton with a CPU device must be skipped.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from tests import conftest
from tests.conftest import (
    CUDA_PRESENT,
    TRITON_CPU_SKIP,
    backend_device,
    requires_triton,
    run_at_once,
)

ROOT = Path(__file__).resolve().parents[1]
interpreter_only = pytest.mark.skipif(CUDA_PRESENT, reason="the guard exists only under the "
                                      "interpreter (no GPU); on CUDA the kernels are compiled")

# Collects the suite in a fresh interpreter and prints one JSON line per test item: node id,
# whether its parameters pair triton with a CPU device, and its skip reasons. --assert=plain:
# nothing runs, so the ~200 modules need no assertion rewriting (half of a collection's time
# where bytecode is not cached, e.g. under PYTHONDONTWRITEBYTECODE). no:unraisableexception:
# that plugin's clean-up runs gc.collect five times at the end (2.5 s), for tests that run.
_COLLECT = """
import json, sys
import pytest

class Dump:
    def pytest_collection_finish(self, session):
        from tests.conftest import pairs_triton_with_cpu
        for item in session.items:
            reasons = [m.kwargs.get("reason", "") for m in item.iter_markers("skip")]
            print("ITEM " + json.dumps(dict(id=item.nodeid, pairs=pairs_triton_with_cpu(item),
                                            skip=reasons)))

sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--assert=plain",
                      "-p", "no:unraisableexception", "tests"],
                     plugins=[Dump()]))
"""


def _collection(emulate: bool) -> dict:
    """The collection's command (``run_at_once``'s keyword arguments)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("HIERTAIL_TEST_EMULATE_CUDA", None)
    if emulate:
        env["HIERTAIL_TEST_EMULATE_CUDA"] = "1"
    return dict(args=[sys.executable, "-c", _COLLECT], cwd=ROOT, env=env)


def _collect(*emulate: bool) -> list[list[dict]]:
    """The suite's items collected with each emulation setting, the collections run at once
    (one core each on a 2-core machine: two in turn took 33 s of this suite)."""
    collected = []
    for res in run_at_once([_collection(e) for e in emulate]):
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        items = [json.loads(line[5:]) for line in res.stdout.splitlines()
                 if line.startswith("ITEM ")]
        assert len(items) > 100, "the suite should collect hundreds of tests"
        collected.append(items)
    return collected


@pytest.mark.slow
def test_emulated_cuda_collection_never_pairs_triton_with_cpu():
    cuda, *plain = _collect(True) if CUDA_PRESENT else _collect(True, False)
    assert any("cuda" in it["id"] for it in cuda), "emulation should add the cuda device"
    pairing = [it for it in cuda if it["pairs"]]
    unskipped = [it["id"] for it in pairing if TRITON_CPU_SKIP not in it["skip"]]
    assert not unskipped, f"tests pairing triton with CPU tensors run on CUDA: {unskipped}"
    # the triton tests themselves are still collected and not skipped by this rule
    triton_tests = [it for it in cuda if "triton" in it["id"] and not it["pairs"]]
    assert triton_tests and all(TRITON_CPU_SKIP not in it["skip"] for it in triton_tests)
    if not CUDA_PRESENT:  # on a CPU machine nothing is skipped for this reason
        (cpu,) = plain
        assert not any(TRITON_CPU_SKIP in it["skip"] for it in cpu)
        assert {it["id"] for it in cpu} <= {it["id"] for it in cuda}


def test_pairing_rule_on_synthetic_items():
    class Spec:
        def __init__(self, **params):
            self.params = params

    class Item:
        def __init__(self, **params):
            self.callspec = Spec(**params)

    assert conftest.pairs_triton_with_cpu(Item(backend="triton", device="cpu"))
    assert conftest.pairs_triton_with_cpu(Item(provider="triton", dev=torch.device("cpu")))
    assert not conftest.pairs_triton_with_cpu(Item(backend="triton", device="cuda"))
    assert not conftest.pairs_triton_with_cpu(Item(backend="torch", device="cpu"))
    assert not conftest.pairs_triton_with_cpu(object())  # not parametrised


def test_device_first_order_puts_the_device_tests_first(monkeypatch):
    """HIERTAIL_TEST_ORDER=device-first (bench/gpu_acceptance.sh's suite step, which a device
    call may stop at its limit): the tests that run the device's kernels first, each group in
    its collected order; unset, the order is pytest's; any other value is a usage error."""
    class Spec:
        def __init__(self, **params):
            self.params = params

    class Item:
        def __init__(self, name, path="tests/test_data_io.py", fixtures=(), **params):
            self.name, self.path, self.fixturenames = name, Path(path), list(fixtures)
            if params:
                self.callspec = Spec(**params)

        def add_marker(self, marker):
            pass

    items = [Item("plain"), Item("cuda_param", dev=torch.device("cuda")),
             Item("plain_again", backend="torch", device="cpu"),
             Item("triton_param", backend="triton"),
             Item("cpu_half", fixtures=["device"], device="cpu"),
             Item("device_fixture", fixtures=["device", "triton_device"]),
             Item("attention_param", provider="attention"),
             Item("kernel_file", path="tests/test_triton_key_splits.py"),
             Item("last", fixtures=["tmp_path"])]
    run = [it.name for it in items]
    monkeypatch.delenv(conftest.TEST_ORDER_ENV, raising=False)
    conftest.pytest_collection_modifyitems(None, items)
    assert [it.name for it in items] == run
    monkeypatch.setenv(conftest.TEST_ORDER_ENV, "device-first")
    conftest.pytest_collection_modifyitems(None, items)
    assert [it.name for it in items] == ["cuda_param", "triton_param", "device_fixture",
                                         "attention_param", "kernel_file", "plain",
                                         "plain_again", "cpu_half", "last"]
    monkeypatch.setenv(conftest.TEST_ORDER_ENV, "random")
    with pytest.raises(pytest.UsageError, match="device-first"):
        conftest.pytest_collection_modifyitems(None, items)


@interpreter_only
@requires_triton
def test_guard_fails_a_triton_launch_without_the_triton_device():
    from hiertail_fast.ops.nearest_prototype import nearest_prototype

    z, p = torch.randn(9, 4), torch.randn(3, 4)
    with pytest.raises(pytest.fail.Exception, match="did not take its device"):
        nearest_prototype(z, p, backend="triton")
    dev = backend_device("triton")  # asking for the Triton device lifts the guard
    assert dev == "cpu"
    got = nearest_prototype(z.to(dev), p.to(dev), backend="triton")
    assert torch.equal(got, torch.cdist(z, p).argmin(dim=1))


def test_backend_device():
    assert backend_device("torch") == "cpu" and backend_device("reference") == "cpu"
    assert backend_device("triton") == ("cuda" if CUDA_PRESENT else "cpu")


# ------------------------------------------------- an interpreter that cannot run here
def _in_use(monkeypatch):
    """The interpreter as conftest sees it on a machine without a GPU."""
    monkeypatch.setattr(conftest, "CUDA_PRESENT", False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _raise(exc):
    def probe():
        raise exc
    return probe


@requires_triton
def test_interpreter_problem_names_the_numpy_clash_and_its_fix(monkeypatch):
    """triton 3.6's interpreter with NumPy 2.4 (seen in a venv of the GPU image's releases):
    one error naming both versions and the fix, instead of every Triton test failing."""
    import numpy as np
    import triton
    from triton.runtime.errors import InterpreterError

    _in_use(monkeypatch)
    clash = InterpreterError(repr(TypeError(
        "only 0-dimensional arrays can be converted to Python scalars")))
    msg = conftest.interpreter_problem(_raise(clash))
    assert f"triton {triton.__version__}" in msg and f"NumPy {np.__version__}" in msg
    assert "numpy<2.4" in msg and "only 0-dimensional arrays" in msg
    other = conftest.interpreter_problem(_raise(RuntimeError("something else")))
    assert "failed a three-line kernel" in other and "something else" in other
    assert "computed 3" in conftest.interpreter_problem(lambda: 3)
    assert conftest.interpreter_problem(lambda: 2) is None
    monkeypatch.setenv("TRITON_INTERPRET", "0")       # compiled kernels: not its business
    assert conftest.interpreter_problem(_raise(clash)) is None


@interpreter_only
@requires_triton
def test_interpreter_probe_counts_its_loop():
    backend_device("triton")                           # the launch guard: device asked for
    assert conftest._run_interpreter_probe() == 2
