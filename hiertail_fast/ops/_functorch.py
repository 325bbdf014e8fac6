"""``torch.func`` over the ops' hand-written backward passes: the one module that touches
functorch's private tensor wrappers.

``torch.func.grad`` / ``vjp`` / ``grad_and_value`` run an autograd Function's forward on the
plain tensors (one transform level down) but its backward at the transform's level, on
"grad-tracking" wrapper tensors. The wrappers dispatch torch operators, but they have no
storage of their own: our backward passes hand them to C and Triton kernels (``data_ptr``),
which cannot read them, and inside the transform every tensor an operator makes is wrapped
too. ``plain`` strips the wrappers and ``outside_transforms`` steps outside the transforms:
``_autograd.first_order_backward`` runs the hand-written backward that way on plain tensors,
and the gradient it returns is lifted back to the
transform's level by functorch as a constant, which is exact for the first derivative. A
second derivative (``grad(grad(f))``, ``hessian``) reaches ``_autograd``'s guard and raises,
as with ``create_graph=True``.

Batching wrappers (``vmap``, and ``jacrev`` / ``jacfwd`` / ``hessian``, which vmap the
gradient over a basis) cannot be stripped without changing the math: ``plain`` raises a
RuntimeError naming the op instead. The losses' ``backend="reference"`` is plain autograd:
jacrev and hessian work there (vmap still meets the input checks, which read values).

Private ``torch._C._functorch`` functions (and ``temporarily_clear_interpreter_stack``), checked
with ``hasattr`` and tested on torch 2.11 and 2.13. Without them (``READY`` False) nothing is
stripped: a backward pass of dense torch operators (the loss's fused CPU gradient) still works
under ``torch.func.grad``; the others raise PyTorch's own error (a wrapper's storage, the
sparse CSR product), never a wrong number (``tests/test_func_transforms.py``).
"""
from __future__ import annotations

import contextlib

import torch
import torch.autograd.forward_ad as _fwad

_F = getattr(torch._C, "_functorch", None)
try:
    from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters as _levels
    from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack as _clear
except ImportError:                                           # pragma: no cover - old torch
    _clear = _levels = None
READY = _clear is not None and _F is not None and all(
    hasattr(_F, name) for name in ("is_functorch_wrapped_tensor", "is_gradtrackingtensor",
                                   "get_unwrapped", "peek_interpreter_stack", "TransformType"))


def active() -> bool:
    """Whether a torch.func transform is running (False without the private API, and while
    TorchDynamo traces: it handles torch.func itself, and the traced ops are custom ops)."""
    return READY and not torch.compiler.is_compiling() and _F.peek_interpreter_stack() is not None


def may_be_active() -> bool:
    """``active()``, or True where the private API to tell is missing (callers then take the
    path that works under a transform too)."""
    return not READY or active()


def outside_transforms():
    """A context in which torch operators run as outside any torch.func transform: on plain
    tensors they make plain tensors (inside a ``grad`` level every result is wrapped, kernels
    included). What functorch itself does around an autograd Function's forward. Nothing to do
    (a null context) when no transform runs."""
    return _clear() if active() else contextlib.nullcontext()


def wrapped(t) -> bool:
    """Whether ``t`` is a functorch wrapper tensor (False without the private API, and while
    TorchDynamo traces, as for ``active``)."""
    return (READY and isinstance(t, torch.Tensor) and not torch.compiler.is_compiling()
            and _F.is_functorch_wrapped_tensor(t))


def _unsupported(op: str) -> RuntimeError:
    return RuntimeError(
        f"{op}: torch.func.vmap, jvp and the transforms built on them (jacrev, jacfwd, hessian) "
        f"and forward-mode AD (torch.autograd.forward_ad) are not supported: the op reads its "
        f"inputs' values and runs hand-written kernels and gradients. torch.func.grad, "
        f"grad_and_value and vjp are (first derivatives); the losses' backend='reference' is "
        f"plain autograd (jacrev and hessian work there)")


def check_no_tangent(op: str, *values) -> None:
    """RuntimeError naming op where a tensor among ``values`` (or None) carries a forward-mode
    tangent: a dual tensor of ``torch.autograd.forward_ad`` or of ``torch.func.jvp`` / jacfwd
    (jvp is forward AD inside). Such a tangent was dropped without a word where a value
    leaves autograd (a temperature read as a float, edge weights stored in a CSRGraph): a
    tangent of 0 where the finite difference said 1.4. Nothing to do (one attribute read)
    when no forward-mode level is open."""
    if getattr(_fwad, "_current_level", 0) < 0 or torch.compiler.is_compiling():
        return
    for t in values:
        if isinstance(t, torch.Tensor) and _fwad.unpack_dual(t).tangent is not None:
            raise _unsupported(op)


def plain(t, op: str):
    """``t`` without its grad-tracking wrappers (any number of nested levels); anything not a
    wrapped tensor as it is. A batching (``vmap``) or other wrapper: RuntimeError naming op
    (an op's name, or what holds the tensor)."""
    while wrapped(t):
        if not _F.is_gradtrackingtensor(t):
            raise _unsupported(op)
        t = _F.get_unwrapped(t)
    return t


def check_transforms(op: str, *values, grad_only: bool = False,
                     jvp_ok: bool = False) -> None:
    """At an op's entry, under torch.func transforms: RuntimeError naming op where a tensor
    among ``values`` (tensors, or lists / tuples of them) is batched (vmap), before an input
    check that reads values meets vmap's own, less telling error; with ``grad_only`` also
    where any vmap or jvp level runs (hessian's jacfwd batches only the tangents; jacrev's
    vmap runs later, over the backward: ``plain`` catches it there); with ``jvp_ok`` a jvp
    level passes too (the caller then refuses only inputs that carry a tangent: an op applied
    to constants inside a jvp has the tangent 0). Under ``torch.jit.trace``:
    RuntimeError naming op (the tracer records torch's calls, not our kernels': a traced
    ``nearest_prototype`` replayed its uninitialised output buffer, the other ops failed
    inside the tracer). Two C calls when no transform runs."""
    if torch.jit.is_tracing():
        raise RuntimeError(
            f"{op}: torch.jit.trace cannot record it (its kernels run outside the tracer, "
            f"which would replay their empty output buffers); use torch.compile or "
            f"torch.export (one custom op each)")
    if not active():
        return
    for v in values:
        for t in (v if isinstance(v, (list, tuple)) else (v,)):
            plain(t, op)
    if not grad_only:
        return
    levels = list(_levels())
    grads = [lv.level() for lv in levels if lv.key() == _F.TransformType.Grad]
    for lv in levels:
        if lv.key() == _F.TransformType.Grad:
            continue
        # a jvp level passes only without a grad level inside it: jvp(grad(f)) (a Hessian-
        # vector product) hides the tangent under the grad wrapper, where check_no_tangent
        # cannot see it (torch's own NotImplementedError came instead of ours)
        if not (jvp_ok and lv.key() == _F.TransformType.Jvp
                and not any(g > lv.level() for g in grads)):
            raise _unsupported(op)
