"""Test-suite speed: spare Triton's CPU interpreter a repeated re-patch of triton.language.

Under TRITON_INTERPRET=1 a kernel launch (triton.runtime.interpreter.GridExecutor.__call__)
calls ``_patch_lang(fn)``: it wraps for the interpreter every builtin of the language modules
fn's module sees (tl and/or tl.core; an ``inspect.getmembers`` walk over each, its tensor
class and tl.math), runs the whole grid, and then restores them. Every call of a
``@triton.jit`` function from inside the kernel (InterpretedFunction.__call__: our helpers,
and triton's own tl.max / tl.sum / tl.zeros, whose module sees tl.core) calls ``_patch_lang``
again, ~2.5 ms each, and never restores. Within a launch a repeated patch of a module changes
nothing: the builtins it finds are already wrapped (a wrapper is no longer a builtin, so none
is wrapped twice), and the few attributes it sets anew (``range``, ``tensor.__bool__``...)
get stateless closures equal to the ones in place. These re-patches were ~40% of our loss
kernels' interpreted time.

``install()`` swaps the module's ``_patch_lang`` for one that does the same, except that a
call made inside a launch on the same thread, for language modules already patched in that
launch (by the launch, or by an earlier helper call), returns an empty scope instead of
patching again. Everything else runs as shipped: the launch's own patch and restore, and a
helper's first patch of a module the launch did not patch (which, as in triton, is not
restored). tests/test_interpreter_speed.py holds every op run with and without it to the same
bits and the same state of triton.language. Installed by tests/conftest.py only where the
interpreter runs the kernels and the module has the layout this was written against
(triton 3.9; checked at install); elsewhere ``install()`` returns False and the interpreter
runs unchanged.
"""
from __future__ import annotations

import inspect
import threading

# per thread: the language modules patched in the running launch (None outside a launch).
# One slot, not a stack: a kernel cannot launch a kernel; were one launch run inside another,
# the inner one's restore would empty the slot and the outer's helpers patch as shipped.
_launch = threading.local()


def _language_modules(module, fn) -> set:
    """The language modules ``_patch_lang(fn)`` patches: those among tl and tl.core that fn's
    module sees (its own test of them, repeated here)."""
    tl = module.tl
    return {id(value) for value in fn.__globals__.values()
            if inspect.ismodule(value) and value in (tl, tl.core)}


def _held() -> set | None:
    return getattr(_launch, "modules", None)


def fits(module) -> bool:
    """Whether the interpreter module has the layout this was written against."""
    needed = [getattr(module, name, None) for name in
              ("_patch_lang", "_LangPatchScope", "tl", "GridExecutor", "InterpretedFunction")]
    _, scope_class, _, launch_class, _ = needed
    return (all(part is not None for part in needed)
            and callable(getattr(scope_class, "restore", None))
            and inspect.isfunction(getattr(launch_class, "__dict__", {}).get("__call__")))


def install(module=None) -> bool:
    """Install the skip in triton.runtime.interpreter (or the module given); True if it did
    (or had). Idempotent."""
    if module is None:
        try:
            import triton.runtime.interpreter as module
        except ImportError:
            return False
    original = getattr(module, "_patch_lang", None)
    if getattr(original, "_skips_nested_patches", False):
        return True
    if not fits(module):
        return False
    scope_class = module._LangPatchScope

    class _LaunchScope:
        """The launch's scope: restoring it also empties the thread's slot."""

        def __init__(self, scope):
            self._scope = scope

        def restore(self) -> None:
            _launch.modules = None
            self._scope.restore()

    seen: dict = {}      # fn -> (size of its module's globals, its language modules)

    def _patch_lang(fn):
        size = len(fn.__globals__)
        known = seen.get(fn)
        if known is None or known[0] != size:       # a global added since: look again
            known = seen[fn] = (size, _language_modules(module, fn))
        langs = known[1]
        held = _held()
        if not _called_by_a_launch(module):
            if held is not None and langs and langs <= held:
                return scope_class()                 # a helper inside the launch: patched
            scope = original(fn)                     # outside a launch, or new modules:
            if held is not None:                     # patched as the interpreter does, and
                held |= langs                        # (never restored) held from now on
            return scope
        scope = original(fn)                         # (its errors, e.g. no tl in sight,
        _launch.modules = set(langs)                 # as shipped: nothing held then)
        return _LaunchScope(scope)

    _patch_lang._skips_nested_patches = True
    _patch_lang._original = original
    module._patch_lang = _patch_lang
    return True


def installed(module) -> bool:
    return getattr(getattr(module, "_patch_lang", None), "_skips_nested_patches", False)


def uninstall(module=None) -> None:
    """Put the interpreter's own ``_patch_lang`` back (for the test that compares the two)."""
    if module is None:
        import triton.runtime.interpreter as module
    current = getattr(module, "_patch_lang", None)
    if getattr(current, "_skips_nested_patches", False):
        module._patch_lang = current._original


def _called_by_a_launch(module) -> bool:
    """Whether the caller of ``_patch_lang`` is the launch (GridExecutor.__call__), the one
    call that restores its patch; a helper's call comes from InterpretedFunction.__call__."""
    frame = inspect.currentframe()
    try:
        caller = frame.f_back.f_back
        return caller is not None and caller.f_code is module.GridExecutor.__call__.__code__
    finally:
        del frame
