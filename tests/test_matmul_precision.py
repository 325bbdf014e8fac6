"""The ops under a reduced float32 matmul precision (hiertail_fast/ops/_matmul_precision.py).

``torch.set_float32_matmul_precision("medium")`` makes float32 GEMMs round their inputs to
bf16 on CPUs with bf16 units and to TF32 on CUDA. The ops must give what they give at IEEE
precision (bit for bit on CPU; within float32's tolerance on CUDA, whose atomics may round
differently between runs), and leave torch's flags as they found them. The flag bookkeeping is
checked on any machine (the CUDA flags are settable on CPU builds too); the numerical tests
can only fail where the setting, with our override switched off, changes the ops' own numbers
(some shapes on a CPU with bf16 units, a GPU with TF32: ``_medium_moves``), and say so by
skipping elsewhere."""
from __future__ import annotations

import os
import threading
import unittest.mock

import pytest
import torch

from hiertail_fast import (
    balanced_contrastive_loss,
    hierarchical_contrastive_loss,
    nearest_prototype,
)
from hiertail_fast.ops import _matmul_precision as mp
from tests.conftest import DEVICES, backend_device, requires_triton, tol

needs_flags = pytest.mark.skipif(not mp.PER_BACKEND_FLAGS,
                                 reason="torch < 2.9 has no per-backend precision flags")


def _reset() -> None:
    """torch's defaults: legacy "highest", every per-backend flag "none"."""
    torch.set_float32_matmul_precision("highest")
    if mp.PER_BACKEND_FLAGS:
        for backend, op in (("cuda", "matmul"), ("mkldnn", "matmul"), ("cuda", "all"),
                            ("mkldnn", "all"), ("generic", "all")):
            mp._SET(backend, op, "none")


@pytest.fixture(autouse=True)
def _defaults_after():
    _reset()
    yield
    _reset()


def _state() -> tuple:
    """Everything a user can read of the flags (a getter that raises reads as its message)."""
    def read(get):
        try:
            return get()
        except RuntimeError as e:
            return f"raises: {str(e)[:40]}"
    out = [read(torch.get_float32_matmul_precision)]
    if mp.PER_BACKEND_FLAGS:
        out += [mp._GET(b, o) for b in ("cuda", "mkldnn") for o in ("matmul", "all")]
        out.append(mp._GET("generic", "all"))
        out.append(read(lambda: torch.backends.cuda.matmul.allow_tf32))
    return tuple(out)


def _set_generic_tf32():
    torch.backends.fp32_precision = "tf32"      # what transformers' enable_tf32 sets


SETTINGS = {
    "legacy medium": lambda: torch.set_float32_matmul_precision("medium"),
    "legacy high": lambda: torch.set_float32_matmul_precision("high"),
    "oneDNN bf16 only": lambda: setattr(torch.backends.mkldnn.matmul, "fp32_precision", "bf16"),
    "cuBLAS tf32 only": lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", "tf32"),
    "generic tf32": _set_generic_tf32,
    "legacy medium, oneDNN reset": lambda: (
        torch.set_float32_matmul_precision("medium"),
        setattr(torch.backends.mkldnn.matmul, "fp32_precision", "ieee")),
    # legacy value unreadable (torch's own legacy setters leave it so), cuBLAS pair agreeing
    "legacy medium, cuBLAS switch on": lambda: (
        torch.set_float32_matmul_precision("medium"),
        setattr(torch.backends.cuda.matmul, "allow_tf32", True)),
    "legacy high, oneDNN bf16": lambda: (
        torch.set_float32_matmul_precision("high"),
        setattr(torch.backends.mkldnn.matmul, "fp32_precision", "bf16")),
    "legacy medium, oneDNN tf32": lambda: (
        torch.set_float32_matmul_precision("medium"),
        setattr(torch.backends.mkldnn.matmul, "fp32_precision", "tf32")),
    "generic tf32, cuBLAS switch on": lambda: (
        _set_generic_tf32(), setattr(torch.backends.cuda.matmul, "allow_tf32", True)),
    # an explicit IEEE equal to its fallback's: the probe must tell it from "none" (the s72
    # audit, M01: a probe value equal to the value read reported every IEEE as following)
    "generic ieee, oneDNN ieee set": lambda: (
        mp._SET("generic", "all", "ieee"), mp._SET("mkldnn", "all", "ieee"),
        mp._SET("cuda", "matmul", "tf32")),
}


def _assert_ieee_inside() -> None:
    assert not mp.reduced()
    # legacy "highest" where readable: a legacy value left reduced beside an IEEE cuBLAS flag
    # is the mix torch's CUDA GEMMs refuse (the s72 audit, M09)
    assert mp._legacy() in (None, "highest")
    if mp.PER_BACKEND_FLAGS:
        assert mp._GET("mkldnn", "matmul") == "ieee"
        assert mp._GET("cuda", "matmul") == "ieee"


@needs_flags
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_override_sets_ieee_and_restores_every_flag(setting):
    SETTINGS[setting]()
    before = _state()
    assert mp.reduced()
    with mp.ieee_matmuls():
        _assert_ieee_inside()
        inside = _state()
    assert _state() == before
    if not before[0].startswith("raises"):          # the legacy value was readable:
        assert inside[0] == "highest"               # legacy and cuBLAS flag agree inside
    if not str(before[-1]).startswith("raises"):    # torch's cuBLAS check read before (every
        assert inside[-1] is False                  # CUDA GEMM calls it): it reads inside


def _later_changes():
    """Changes a user may make after a call, each from the state the setting left."""
    return {
        "generic ieee": lambda: setattr(torch.backends, "fp32_precision", "ieee"),
        "generic tf32": _set_generic_tf32,
        "cuda all ieee": lambda: mp._SET("cuda", "all", "ieee"),
        "mkldnn all bf16": lambda: mp._SET("mkldnn", "all", "bf16"),
        "mkldnn matmul ieee": lambda: setattr(torch.backends.mkldnn.matmul, "fp32_precision",
                                              "ieee"),
    }


@needs_flags
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("later", list(_later_changes()))
def test_later_changes_act_as_if_no_call_had_been_made(setting, later):
    """The getters return resolved values; a flag restored as "none" where it had been set
    (or the reverse) moved, or left torch's legacy value and cuBLAS flag disagreeing, at a
    later change of a fallback. The flags are now restored as they were set (a probe)."""
    def run(call):
        _reset()
        SETTINGS[setting]()
        if call:
            with mp.ieee_matmuls():
                pass
        _later_changes()[later]()
        return _state()
    assert run(True) == run(False)


@needs_flags
def test_a_flag_that_followed_its_fallback_follows_it_after():
    """generic tf32: the matmul flags were "none" (resolving to tf32); after the call a change
    of the generic flag reaches them again (they were not pinned to an explicit tf32)."""
    _set_generic_tf32()
    with mp.ieee_matmuls():
        pass
    torch.backends.fp32_precision = "ieee"
    assert mp._GET("mkldnn", "matmul") == "ieee" and mp._GET("cuda", "matmul") == "ieee"


@needs_flags
def test_a_flag_the_legacy_setter_pinned_stays_pinned():
    """set_float32_matmul_precision sets both per-backend flags explicitly; restored as
    "none" (following a generic flag that happened to be equal), a later change of the
    generic flag left torch's legacy value and cuBLAS flag disagreeing: every float32 CUDA
    GEMM would raise (read through torch's own check)."""
    torch.set_float32_matmul_precision("high")
    torch.backends.fp32_precision = "tf32"          # e.g. transformers' enable_tf32
    with mp.ieee_matmuls():
        pass
    torch.backends.fp32_precision = "ieee"
    assert torch.backends.cuda.matmul.allow_tf32 is True
    assert mp._GET("cuda", "matmul") == "tf32"


def test_nothing_is_touched_at_ieee(monkeypatch):
    def refuse(*a):
        raise AssertionError("a flag was set although the precision is IEEE already")
    with monkeypatch.context() as m:
        m.setattr(torch, "set_float32_matmul_precision", refuse)
        m.setattr(mp, "_SET", refuse)
        with mp.ieee_matmuls():
            assert not mp.reduced()


def test_legacy_only_torch_path(monkeypatch):
    """torch < 2.9 (no per-backend flags): "highest" for the call, the old value after."""
    monkeypatch.setattr(mp, "PER_BACKEND_FLAGS", False)
    torch.set_float32_matmul_precision("medium")
    with mp.ieee_matmuls():
        assert torch.get_float32_matmul_precision() == "highest"
    assert torch.get_float32_matmul_precision() == "medium"


def test_nested_and_concurrent_calls_share_one_override():
    """The override holds until the last call leaves, whichever thread entered first."""
    torch.set_float32_matmul_precision("medium")
    before = _state()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with mp.ieee_matmuls():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second():
        first_in.wait(10)
        with mp.ieee_matmuls():
            with mp.ieee_matmuls():                 # nested inside one thread
                second_in.set()
                first_out.wait(10)
                seen["after first left"] = mp.reduced()
            seen["after inner left"] = mp.reduced()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {"after first left": False, "after inner left": False}
    assert _state() == before


def test_an_exception_inside_restores_the_flags():
    torch.set_float32_matmul_precision("medium")
    before = _state()
    with pytest.raises(ValueError, match="inside"), mp.ieee_matmuls():
        raise ValueError("raised inside")
    assert _state() == before


# ------------------------------------------------------------------ the ops' numbers
def _first_difference(got: dict, expected: dict, dev: str) -> str | None:
    """The name of the first tensor two runs disagree on, or None: bitwise on CPU, beyond
    float32's tolerance on CUDA (whose atomics may round differently between runs)."""
    assert got.keys() == expected.keys()
    for key, b in expected.items():
        a = got[key]
        if torch.device(dev).type == "cpu" or not b.is_floating_point():
            if not torch.equal(a, b):
                return key
        elif not torch.allclose(a, b, **tol(b.dtype)):
            return key
    return None


def _medium_moves(run, dev: str) -> bool:
    """Whether "medium" changes what ``run()`` returns (name -> tensor) once our override is
    switched off. A plain matmul cannot tell: torch and oneDNN pick bf16 for a float32 GEMM by
    hardware AND shape — on an AVX512-BF16 CPU without AMX (Zen 5, torch 2.11 and 2.13) a
    product with k = 256 or 700 came back rounded, ones with k = 32 or 64 did not, and the
    exact loss's gradient did not move at 700 or 3,000 rows and d 32 to 256 (an AMX Xeon moved
    it by 2.4e-3). Where nothing moves, the tests below cannot fail and skip; where something
    does, this run is the proof that they can."""
    expected = run()
    torch.set_float32_matmul_precision("medium")
    try:
        with unittest.mock.patch.object(mp, "reduced", lambda: False):
            moved = run()
    finally:
        _reset()
    return _first_difference(moved, expected, dev) is not None


def _problem(dev: str, n: int = 700):
    g = torch.Generator().manual_seed(3)
    z = torch.nn.functional.normalize(torch.randn(n, 32, generator=g), dim=1) * 3
    y = torch.randint(0, 12, (n,), generator=g)
    protos = torch.randn(12, 32, generator=g)
    return z.to(dev), y.to(dev), protos.to(dev)


def _ops(backend: str, dev: str) -> dict[str, torch.Tensor]:
    """Values and gradients of the losses (exact, official with reduction="none", three
    levels) and the nearest prototypes, |s| up to 180 (fewer rows for the Triton interpreter)."""
    z, y, protos = _problem(dev, 160 if backend == "triton" and dev == "cpu" else 700)
    out = {}
    for name, kw in (("exact", {}), ("official", dict(prototypes=protos, variant="official",
                                                     reduction="none"))):
        zz = z.clone().requires_grad_()
        loss = balanced_contrastive_loss(zz, y, temperature=0.05, backend=backend, **kw)
        loss.sum().backward()
        out[f"{name} value"], out[f"{name} grad"] = loss.detach(), zz.grad
    zz = z.clone().requires_grad_()
    loss = hierarchical_contrastive_loss(zz, [y, y % 4], [protos, protos[:4]],
                                         temperature=0.05, backend=backend)
    loss.backward()
    out["3 levels value"], out["3 levels grad"] = loss.detach(), zz.grad
    nearest_backend = backend if backend in ("torch", "triton") else None
    out["nearest"] = nearest_prototype(z * 0.37, protos, backend=nearest_backend)
    return out


_TRITON = pytest.param("triton", backend_device("triton"), marks=requires_triton, id="triton")
BACKENDS = [(b, d) for b in ("torch", "attention") for d in DEVICES] + [_TRITON]


@pytest.mark.parametrize(("backend", "dev"), BACKENDS)
def test_ops_give_their_ieee_numbers_under_medium_precision(backend, dev):
    if backend == "triton":     # the Triton launch guard: its device asked for (torch and
        assert backend_device(backend) == dev   # attention run on every device of DEVICES)

    def run():
        return _ops(backend, dev)
    if not _medium_moves(run, dev):
        pytest.skip(f"'medium' does not change these ops' float32 GEMMs on this {dev} even "
                    "without the override: nothing to tell apart here")
    expected = run()
    torch.set_float32_matmul_precision("medium")
    before = _state()
    got = run()
    assert _state() == before
    assert _first_difference(got, expected, dev) is None


@pytest.mark.parametrize("dev", DEVICES)
def test_compiled_ops_give_their_ieee_numbers_under_medium_precision(dev):
    """torch.compile (fullgraph, AOTAutograd): the traced custom ops run the eager bodies,
    which take the override when the compiled code runs."""
    z, y, protos = _problem(dev, 300)

    def step(zz):
        loss = balanced_contrastive_loss(zz, y, prototypes=protos, temperature=0.05,
                                         variant="official")
        return loss, nearest_prototype(zz.detach() * 0.37, protos)

    def run(fn):
        zz = z.clone().requires_grad_()
        loss, near = fn(zz)
        loss.backward()
        return {"loss": loss.detach(), "grad": zz.grad, "nearest": near}
    if not _medium_moves(lambda: run(step), dev):
        pytest.skip(f"'medium' does not change these ops' float32 GEMMs on this {dev} even "
                    "without the override: nothing to tell apart here")
    expected = run(step)
    torch._dynamo.reset()
    torch.set_float32_matmul_precision("medium")
    try:
        got = run(torch.compile(step, backend="aot_eager", fullgraph=True))
    finally:
        torch._dynamo.reset()
    assert _first_difference(got, expected, dev) is None


@needs_flags
@pytest.mark.parametrize("change", ["legacy medium again", "oneDNN bf16"])
def test_a_setting_made_while_an_override_runs_is_taken_in(change):
    """Only the first call looked at the flags: with another call inside the override, a
    setting made meanwhile reached every call entering after it (bf16 GEMMs, a gradient 0.13
    off). Now each call checks on entry; the user's latest setting is what comes back."""
    torch.set_float32_matmul_precision("medium")
    inside, leave = threading.Event(), threading.Event()

    def running_call():
        with mp.ieee_matmuls():
            inside.set()
            leave.wait(10)
    other = threading.Thread(target=running_call)
    other.start()
    try:
        inside.wait(10)
        if change == "legacy medium again":
            torch.set_float32_matmul_precision("medium")
        else:
            torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        assert mp.reduced()
        with mp.ieee_matmuls():
            _assert_ieee_inside()
    finally:
        leave.set()
        other.join(10)
    assert (torch.get_float32_matmul_precision(), mp._GET("mkldnn", "matmul"),
            mp._GET("cuda", "matmul")) == ("medium", "bf16", "tf32")


@needs_flags
def test_a_flag_the_user_reduces_inside_a_call_is_what_comes_back():
    """oneDNN's flag IEEE on entry (CUDA's reduced: the first call overrides), set to bf16 by
    the user while that call runs; a second call entering then takes the new setting in, and
    the user's bf16 is what both calls leave (not the IEEE saved on the first entry)."""
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.mkldnn.matmul.fp32_precision = "ieee"
    with mp.ieee_matmuls():
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"     # the user, meanwhile
        with mp.ieee_matmuls():
            _assert_ieee_inside()
    assert (mp._GET("mkldnn", "matmul"), mp._GET("cuda", "matmul")) == ("bf16", "tf32")


@needs_flags
def test_onednn_tf32_alone_is_overridden_and_restored():
    """oneDNN's TF32 fp-math mode set on its own (``torch.backends.mkldnn.matmul.fp32_precision
    = "tf32"``) is a reduced precision like oneDNN bf16: overridden inside ``ieee_matmuls()``
    and restored after. The other tests set it together with the legacy "medium" (which trips
    the cuBLAS flag too), so a check of the oneDNN flag that forgot "tf32" went unnoticed (a
    mutation audit, 2026-12-03)."""
    torch.backends.mkldnn.matmul.fp32_precision = "tf32"
    assert mp._GET("cuda", "matmul") != "tf32"          # the cuBLAS flag is not what trips it
    assert mp.reduced()
    with mp.ieee_matmuls():
        assert not mp.reduced()
        assert mp._GET("mkldnn", "matmul") == "ieee"
    assert torch.backends.mkldnn.matmul.fp32_precision == "tf32"


def _state_in_a_worker(expected):
    """A forked worker: the user's flags as they were before the parent's call entered the
    override, and an op's override that enters and leaves (a held lock hung here)."""
    import sys

    if _state() != expected:
        sys.exit(3)
    with mp.ieee_matmuls():
        if mp.reduced():
            sys.exit(4)
    sys.exit(0 if _state() == expected and mp._depth == 0 else 5)


@needs_flags
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork (not on Windows)")
def test_a_worker_forked_during_a_call_gets_the_users_flags_and_a_free_lock():
    """A DataLoader worker forked while another thread's op is inside the override: that call
    never leaves in the child, which kept the override (IEEE for good, the user's setting
    lost) or, forked while the lock was held, hung at its first op."""
    from tests.conftest import fork_while_held

    torch.set_float32_matmul_precision("medium")
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    expected = _state()
    assert mp.reduced()
    hung, code = fork_while_held(mp.ieee_matmuls, _state_in_a_worker, (expected,))
    assert not hung and code == 0
    assert _state() == expected                     # and the parent's call restored them
    hung, code = fork_while_held(lambda: mp._lock, _state_in_a_worker, (expected,))
    assert not hung and code == 0
