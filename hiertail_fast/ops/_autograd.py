"""One rule for the ops' hand-written backward passes: first derivatives only, never a silent 0.

The autograd Functions of the fast backends compute their gradients by hand (the loss often in
its forward pass) under ``torch.no_grad``: the gradient they return has no graph of its own. With
``create_graph=True`` (a gradient penalty, MAML, a Hessian-vector product) autograd would then
treat that gradient as a constant, and every second derivative through the op would silently be
0. ``torch.autograd.function.once_differentiable`` does not prevent it: it marks the gradients
only when the incoming gradient itself requires grad, which a scalar loss's seed (1.0) does not.

``first_order_backward(op)`` decorates such a ``backward``: it runs it under ``no_grad`` and, when
autograd records the backward (create_graph=True) and the Function's saved tensors or incoming
gradients require grad, passes each returned gradient through ``_NoSecondDerivative``, whose own
backward raises a RuntimeError naming the op. So the first derivative is unchanged and
differentiating it raises. The references (``backend="reference"``) are plain autograd and have
every derivative. A Function that saves nothing of its input (the fused loss keeps only its
gradient) saves a ``graph_anchor`` of it instead: one element whose graph leads to the input's
sources, without keeping the input's memory alive.

Under ``torch.func`` transforms the backward runs on functorch's wrapper tensors; the decorator
hands the hand-written pass plain ones (``_functorch``), so ``torch.func.grad`` / ``vjp`` work on
every backend and a second derivative raises as above. The Functions are written in the
``setup_context`` style, which those transforms require.
"""
from __future__ import annotations

import contextlib
import functools

import torch

from hiertail_fast.ops._amp import autocast_off
from hiertail_fast.ops._functorch import (
    check_no_tangent,
    check_transforms,
    may_be_active,
    outside_transforms,
    plain,
    wrapped,
)
from hiertail_fast.ops._matmul_precision import ieee_matmuls


def eager_twin(cls):
    """Class decorator of the ops' ``setup_context``-style autograd Functions: adds
    ``cls.run(*args)``, which is ``cls.apply`` under torch.func transforms (they need that style;
    also where ``_functorch`` cannot tell) and otherwise the ``apply`` of an equivalent twin in
    the ``ctx``-in-forward style (the same forward, setup_context and backward functions).
    torch's ``apply`` binds the arguments with ``inspect.signature`` on every call of a
    setup_context-style Function; the twin's apply does not: 42.5 against 17.4 us per call of
    ``GCNPropagateFunction`` on a 50-node graph, where the whole public ``gcn_propagate`` takes
    55.6 us (``python bench/apply_overhead.py --rounds 9 --number 5000``, 2-core AMD EPYC VM,
    torch 2.13, 1 thread, idle window, load 0.42 -> 0.46). Positional arguments only, all given
    (no defaults to bind).

    A Function with an ``op`` attribute (its public op's name) has no forward-mode derivative
    and no vmap rule: ``run`` raises a RuntimeError naming that op under a vmap level (vmap,
    jacfwd, hessian) and for an argument carrying a tangent (torch.func.jvp, forward-AD dual
    tensors), where torch's own error would name the Function instead (NotImplementedError /
    "no vmap support"); constants inside a jvp keep working (their tangent is 0). The losses
    check at their public entry, before any work."""
    def forward(ctx, *args):
        out = cls.forward(*args)
        cls.setup_context(ctx, args, out)
        return out

    twin = type(cls.__name__, (torch.autograd.Function,), {
        "forward": staticmethod(forward), "backward": staticmethod(cls.backward),
        "__doc__": f"{cls.__name__} in the ctx-in-forward style (see ``eager_twin``)."})

    op = getattr(cls, "op", None)

    def run(*args):
        active = may_be_active()
        if op is not None:
            if active:
                check_transforms(op, grad_only=True, jvp_ok=True)     # vmap: raises
            check_no_tangent(op, *args)                 # forward AD (one attribute read)
        return (cls.apply if active else twin.apply)(*args)

    cls.run = staticmethod(run)
    return cls


@eager_twin
class _NoSecondDerivative(torch.autograd.Function):
    """Identity on a gradient tensor, tied to the tensors it depends on; its backward raises.
    (``setup_context`` style, as every Function of the ops: what torch.func transforms need.)"""

    @staticmethod
    def forward(op: str, grad: torch.Tensor, *depends_on: torch.Tensor):
        return grad.clone()  # a new tensor: the Function's output must not alias its input

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.op = inputs[0]

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(
            f"{ctx.op}: its gradient is computed by hand and has no derivative of its own, so "
            f"it cannot be differentiated again (create_graph=True / double backward, "
            f"torch.func.hessian or grad of grad); backend='reference' is plain autograd and "
            f"supports it")


class _Unpacked:
    """A backward's ``ctx`` whose ``saved_tensors`` were unpacked once already (non-reentrant
    activation checkpointing allows one unpack per saved tensor; the wrapper needs them too);
    every other attribute is the ctx's own."""

    def __init__(self, ctx, saved: tuple):
        self._ctx, self.saved_tensors = ctx, saved

    def __getattr__(self, name):
        return getattr(self._ctx, name)


def graph_anchor(t: torch.Tensor) -> torch.Tensor | None:
    """For a Function whose backward keeps none of its input ``t`` [N, d]: one element computed
    from t (``t[:1, :1].sum()``), whose graph reaches every tensor t depends on while holding
    none of t's memory (slice and sum save only sizes). Saved with ``save_for_backward`` it
    lets ``first_order_backward`` tie the gradient to t's sources. None when autograd does not
    track t."""
    if not (torch.is_grad_enabled() and t.requires_grad):
        return None
    return t[:1, :1].sum()


def first_order_backward(op: str):
    """Decorator of an autograd Function's ``backward`` (see the module docstring)."""
    def wrap(backward):
        @functools.wraps(backward)
        def wrapper(ctx, *grad_outputs):
            # no graph of the hand-written gradient; autocast off and IEEE float32 GEMMs as in
            # the op's forward (_amp, _matmul_precision)
            first = next((t for t in grad_outputs if isinstance(t, torch.Tensor)), None)
            saved = ctx.saved_tensors                     # unpacked once: see _Unpacked
            inner_saved, inner_outputs = saved, grad_outputs
            outside = contextlib.nullcontext()
            if any(wrapped(t) for t in (*grad_outputs, *saved)):
                # under torch.func (_functorch): the hand-written pass on plain tensors,
                # outside the transforms
                inner_saved = tuple(plain(t, op) for t in saved)
                inner_outputs = tuple(plain(t, op) for t in grad_outputs)
                outside = outside_transforms()
            with outside, torch.no_grad(), autocast_off(first), ieee_matmuls():
                grads = backward(_Unpacked(ctx, inner_saved), *inner_outputs)
            if not torch.is_grad_enabled():          # the usual case: create_graph=False
                return grads
            anchors = [t for t in (*saved, *grad_outputs)
                       if isinstance(t, torch.Tensor) and t.requires_grad]
            if not anchors:      # nothing the gradient depends on is differentiated: exact
                return grads
            single = not isinstance(grads, tuple)
            grads = (grads,) if single else grads

            def guard(g):        # (a list: a torch.library op's gradients of a tensor list)
                if isinstance(g, list):
                    return [guard(t) for t in g]
                return _NoSecondDerivative.run(op, g, *anchors) if isinstance(
                    g, torch.Tensor) else g
            out = tuple(guard(g) for g in grads)
            return out[0] if single else out
        return wrapper
    return wrap


def saveable(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` as a Function's ``setup_context`` may save it: a copy of an inference tensor (a
    graph's edge weights or a pool's score weight made under ``torch.inference_mode()``, used
    for training after it), which autograd refuses to save ("Inference tensors cannot be saved
    for backward"; the reference, plain autograd on derived tensors, ran). O(size) for such
    tensors only."""
    if t is not None and t.is_inference() and not torch.is_inference_mode_enabled():
        return t.clone()
    return t
