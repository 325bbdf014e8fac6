"""tests/_interpreter_speed.py: the suite's shortcut through Triton's CPU interpreter (no
re-patch of triton.language on every call of a kernel's helper) changes no result and no
state. Every Triton op run with and without it gives the same bits; launches leave
triton.language in the state the shipped interpreter leaves; the skip is engaged (a patch per
launch, not per helper call); its rule on a stand-in module: only a helper inside a launch,
only for language modules already patched in it, the shipped patch's errors as shipped.
"""
from __future__ import annotations

import functools
import inspect
import os
import types

import pytest
import torch

from hiertail_fast.ops._dispatch import triton_interpreting
from tests import _interpreter_speed as speed
from tests.conftest import CUDA_PRESENT, requires_triton

interpreted = pytest.mark.skipif(CUDA_PRESENT or not triton_interpreting(),
                                 reason="the kernels are compiled (a GPU, or TRITON_INTERPRET "
                                 "off): no interpreter to shortcut")


def _interpreter():
    import triton.runtime.interpreter as module
    return module


@pytest.fixture
def interpreter():
    """The interpreter module with the shortcut installed; afterwards as it was (installed by
    conftest, or not under HIERTAIL_TEST_PLAIN_INTERPRETER=1). Skips where it declines."""
    import triton

    module = _interpreter()
    was = speed.installed(module)
    if not speed.install(module):
        pytest.skip(f"triton {triton.__version__}'s interpreter has another layout: the "
                    "shortcut declines and the suite runs the interpreter as shipped")
    yield module
    if not was:
        speed.uninstall(module)


def _all_ops(device: str) -> list[torch.Tensor]:
    """One call of every Triton op (forward and backward) on small ragged shapes."""
    from hiertail_fast import (
        CSRGraph,
        balanced_contrastive_loss,
        gcn_propagate,
        hierarchical_contrastive_loss,
        nearest_prototype,
        topk_pool,
    )

    gen = torch.Generator().manual_seed(5)
    n, d = 70, 12
    z = (torch.randn(n, d, generator=gen) * 3).to(device).requires_grad_()
    y = torch.randint(0, 5, (n,), generator=gen).to(device)
    protos = torch.randn(5, d, generator=gen).to(device).requires_grad_()
    out = []
    exact = hierarchical_contrastive_loss(z, [y, y % 2], [None, None], temperature=0.1,
                                          backend="triton")
    official = balanced_contrastive_loss(z, y, prototypes=protos, temperature=0.5,
                                         variant="official", backend="triton")
    (exact + official).backward()
    out += [exact.detach(), official.detach(), z.grad, protos.grad]
    src = torch.randint(0, n, (300,), generator=gen)
    dst = torch.randint(0, n, (300,), generator=gen)
    graph = CSRGraph.from_edge_index(torch.stack([src, dst]).to(device), num_nodes=n)
    x = torch.randn(n, d, generator=gen).to(device).requires_grad_()
    h = gcn_propagate(x, graph, backend="triton")
    pooled = topk_pool(h, graph, torch.randn(d, generator=gen).to(device), 0.5,
                       backend="triton")
    (h.square().sum() + pooled.x.sum()).backward()
    out += [h.detach(), pooled.x.detach(), pooled.perm, pooled.score.detach(), x.grad]
    out.append(nearest_prototype(z.detach(), protos.detach(), backend="triton"))
    return out


@requires_triton
@interpreted
def test_every_op_gives_the_same_bits_with_and_without_the_shortcut(triton_device,
                                                                    interpreter):
    try:
        fast = _all_ops(triton_device)
        speed.uninstall(interpreter)
        assert not speed.installed(interpreter)
        plain = _all_ops(triton_device)
    finally:
        speed.install(interpreter)
    for i, (a, b) in enumerate(zip(fast, plain, strict=True)):
        assert a.dtype == b.dtype and torch.equal(a, b), f"result {i} differs"


def _fingerprint(value):
    """What an attribute of triton.language does: a function by its code and defaults (the
    interpreter's wrappers are fresh closures of one code, their builtin in a default)."""
    if isinstance(value, property):
        value = value.fget
    if isinstance(value, functools.partial):
        return ("partial", _fingerprint(value.func), value.args,
                tuple(sorted(value.keywords.items())))
    code = getattr(value, "__code__", None)
    if code is not None:
        return ("function", code, value.__defaults__)
    return ("object", id(value))


def _language_state(module) -> dict:
    tl = module.tl
    owners = {"tl": tl, "tl.core": tl.core, "tl.tensor": tl.tensor, "tl.math": tl.math,
              "tl.dtype": tl.dtype, "tl.condition": tl.condition}
    return {(name, attr): _fingerprint(value) for name, owner in owners.items()
            for attr, value in vars(owner).items()}


def _one_loss(device):
    from hiertail_fast import hierarchical_contrastive_loss

    z = torch.randn(150, 8).to(device).requires_grad_()     # 3 x 3 tiles of 64
    y = torch.arange(150).remainder(3).to(device)
    hierarchical_contrastive_loss(z, [y], [None], temperature=0.2, backend="triton").backward()


@requires_triton
@interpreted
def test_launches_patch_once_and_leave_the_language_as_the_interpreter_does(
        triton_device, interpreter, monkeypatch):
    """With the shortcut, _patch_lang runs for each launch and at most once more in it (the
    first call of a triton.language function whose module sees tl.core), not for the many
    helper calls; afterwards triton.language is in the state the shipped interpreter leaves."""
    module = interpreter
    speed.uninstall(module)
    real = module._patch_lang
    patched, helper_calls = [], []

    def counted(fn):
        patched.append(fn.__name__)
        return real(fn)

    helper_call = module.InterpretedFunction.__call__

    def counted_helper_call(self, *args, **kwargs):
        helper_calls.append(self.__name__)
        return helper_call(self, *args, **kwargs)

    try:
        _one_loss(triton_device)                    # the state a plain launch leaves
        plain = _language_state(module)
        monkeypatch.setattr(module, "_patch_lang", counted)
        monkeypatch.setattr(module.InterpretedFunction, "__call__", counted_helper_call)
        assert speed.install(module)
        _one_loss(triton_device)
        fast = _language_state(module)
    finally:
        monkeypatch.undo()
        speed.install(module)
    launches = sum(name.endswith("_kernel") for name in patched)
    assert launches >= 2 and len(patched) <= 2 * launches, patched
    assert len(helper_calls) > 10 * len(patched), (len(helper_calls), len(patched))
    assert fast.keys() == plain.keys()
    changed = [key for key in plain if fast[key] != plain[key]]
    assert not changed, changed


@requires_triton
@interpreted
def test_conftest_installs_the_shortcut_where_it_fits():
    module = _interpreter()
    if os.environ.get("HIERTAIL_TEST_PLAIN_INTERPRETER") == "1":
        assert not speed.installed(module)
    elif not speed.fits(module):
        pytest.skip("this triton's interpreter has another layout: the shortcut declines")
    else:
        assert speed.installed(module)


# ---- the rule, on a stand-in for triton.runtime.interpreter (no triton needed) -------------

def _stand_in():
    """A module with the interpreter's layout: _patch_lang records what it patched; a launch
    (GridExecutor.__call__) patches, runs the body, restores; a helper call
    (InterpretedFunction.__call__) patches and never restores, as in triton."""
    tl = types.ModuleType("tl")
    tl.core = types.ModuleType("tl.core")
    module = types.ModuleType("interpreter")
    module.tl = tl
    module.patched = []
    module.restored = []

    class _LangPatchScope:
        def __init__(self, fn=None):
            self.fn = fn

        def restore(self):
            if self.fn is not None:
                module.restored.append(self.fn.__name__)

    def _patch_lang(fn):
        module.patched.append(fn.__name__)
        return _LangPatchScope(fn)

    class GridExecutor:
        def __init__(self, fn, body):
            self.fn, self.body = fn, body

        def __call__(self):
            scope = module._patch_lang(self.fn)
            try:
                self.body()
            finally:
                scope.restore()

    class InterpretedFunction:
        def __init__(self, fn):
            self.fn = fn

        def __call__(self):
            module._patch_lang(self.fn)
            return self.fn()

    module._LangPatchScope = _LangPatchScope
    module._patch_lang = _patch_lang
    module.GridExecutor = GridExecutor
    module.InterpretedFunction = InterpretedFunction
    return module


def _function(name: str, sees: dict):
    """A function whose module globals are `sees` (what _patch_lang inspects)."""
    namespace = dict(sees)
    exec(f"def {name}():\n    return 1\n", namespace)
    return namespace[name]


def test_rule_helpers_inside_a_launch_are_not_patched_again():
    module = _stand_in()
    assert speed.install(module) and speed.install(module)   # idempotent
    tl = module.tl
    helper = module.InterpretedFunction(_function("helper", {"tl": tl}))
    kernel = _function("kernel", {"tl": tl})
    module.GridExecutor(kernel, lambda: [helper() for _ in range(3)])()
    assert module.patched == ["kernel"] and module.restored == ["kernel"]
    # outside a launch a helper call patches as before, and the hold ended with the launch
    helper()
    assert module.patched == ["kernel", "helper"]
    assert speed._held() is None


def test_rule_a_helper_seeing_another_language_module_is_patched():
    module = _stand_in()
    speed.install(module)
    tl = module.tl
    wider = module.InterpretedFunction(_function("wider", {"tl": tl, "core": tl.core}))
    same = module.InterpretedFunction(_function("same", {"tl": tl}))
    kernel = _function("kernel", {"tl": tl})
    module.GridExecutor(kernel, lambda: (wider(), same()))()
    assert module.patched == ["kernel", "wider"]


def test_rule_a_failing_launch_releases_its_hold():
    module = _stand_in()
    speed.install(module)
    tl = module.tl
    helper = module.InterpretedFunction(_function("helper", {"tl": tl}))
    kernel = _function("kernel", {"tl": tl})

    def fails():
        helper()
        raise RuntimeError("in the kernel")

    with pytest.raises(RuntimeError, match="in the kernel"):
        module.GridExecutor(kernel, fails)()
    assert speed._held() is None and module.restored == ["kernel"]
    helper()                                          # no launch holds: patched
    assert module.patched == ["kernel", "helper"]


def test_rule_errors_of_the_shipped_patch_pass_through_and_hold_nothing():
    """A function that sees no language module: the interpreter's own assertion, inside a
    launch as outside it; a launch whose patch fails leaves no hold behind."""
    module = _stand_in()
    real = module._patch_lang

    def strict(fn):
        assert any(v is module.tl or v is module.tl.core for v in fn.__globals__.values()), \
            "triton.language must be visible from within jit'd function"
        return real(fn)

    module._patch_lang = strict
    speed.install(module)
    blind = module.InterpretedFunction(_function("blind", {}))
    kernel = _function("kernel", {"tl": module.tl})
    with pytest.raises(AssertionError, match="must be visible"):
        module.GridExecutor(kernel, blind)()
    assert speed._held() is None and module.restored == ["kernel"]
    with pytest.raises(AssertionError, match="must be visible"):
        module.GridExecutor(_function("blind_kernel", {}), lambda: None)()
    assert speed._held() is None


def test_rule_install_declines_a_layout_it_does_not_know():
    for missing in ("_patch_lang", "_LangPatchScope", "GridExecutor", "tl"):
        module = _stand_in()
        delattr(module, missing)
        before = getattr(module, "_patch_lang", None)
        assert speed.install(module) is False, missing
        assert getattr(module, "_patch_lang", None) is before
    module = _stand_in()
    module.GridExecutor = type("GridExecutor", (), {})   # a launch we could not recognise
    assert speed.install(module) is False and not speed.installed(module)
    speed.uninstall(_stand_in())                      # nothing installed: a no-op


def test_rule_uninstall_restores_the_original():
    module = _stand_in()
    original = module._patch_lang
    speed.install(module)
    assert module._patch_lang is not original
    speed.uninstall(module)
    assert module._patch_lang is original
    assert inspect.isfunction(original)
