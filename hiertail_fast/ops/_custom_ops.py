"""The contrastive losses as ``torch.library`` custom ops: what ``torch.compile`` sees of them.

Eager calls never come here. Under TorchDynamo (``torch.compiler.is_compiling()``) the public
losses call ``torch.ops.hiertail_fast.contrastive_loss`` instead of letting the compiler trace
their Python dispatch, which it could not do well: the engine choice reads the logits' bound
from the device (host reads, data-dependent branches), so ``fullgraph=True`` failed and one
loss step traced into 28 graphs, 5-7 s before the first call and 2-3x slower than eager after
(``bench/compile_time.py``, 2-core CPU, torch 2.13). The op is opaque to the compiler: its
real implementation IS the eager loss, run when the compiled code runs, so the values, the
engine choice, the input checks (ValueError / TypeError at run time) and the ``HIERTAIL_*``
switches (read at run time) are those of an eager call. Its "fake" implementation gives the
output shapes and dtypes to the tracer.

Gradients. For the scalar reductions ("mean", "sum", and the hierarchical loss) the op returns
the loss together with its gradients w.r.t. the inputs that need them (``grads_of``, settled
when the call is traced from ``requires_grad`` and the grad mode), taken in the same call as
the eager loss takes them: the torch and attention engines compute the gradient in the
forward's pass, so the compiled call does the eager call's work. The registered backward scales
them by the incoming scalar (the torch and attention engines do the same eagerly: the same
bits; the reference and Triton engines' eager backward takes the incoming scalar into its
coefficients instead: the same to rounding). For ``reduction="none"`` the gradient depends
on the incoming vector, so the op returns the values only and the backward is a second op,
``contrastive_loss_backward``, which reruns the loss with autograd and takes the
vector-Jacobian product (one forward pass more than eager). Second derivatives: torch.compile's
autograd does not take them (it raises, once the backward holds an input:
``tied_gradients``), as the eager loss does not.

Under ``torch.autocast`` the traced call passes autocast's dtype on (``autocast_dtype``) and the
implementation re-enters autocast with it, so the eager rule (``_amp``: the loss runs on
autocast's dtype) holds although the compiled graph runs the op outside any autocast context.
"""
from __future__ import annotations

import contextlib
import inspect

import torch
from torch import Tensor

from hiertail_fast._validation import (
    check_float_matrix,
    check_loss_options,
    check_prototypes_match,
    check_tensor,
)
from hiertail_fast.ops._amp import autocast_dtype
from hiertail_fast.ops._autograd import first_order_backward
from hiertail_fast.ops._loss_terms import loss_dtype

_OP = "hiertail_fast::contrastive_loss"

# Every op here reads values on the host (the engine choice, the input checks) and allocates
# per call: not capturable in a CUDA graph. The tag makes Inductor keep the op out of the CUDA
# graphs of torch.compile(mode="reduce-overhead") (a graph partition around it, or no CUDA
# graph) instead of capturing a host sync. The tag exists from torch 2.8 on.
TAGS = tuple(t for t in (getattr(torch.Tag, "cudagraph_unsafe", None),) if t is not None)
# custom_op's keyword for them, where this torch has both (``OP_OPTIONS``: every op here)
OP_OPTIONS = {"mutates_args": ()}
if TAGS and "tags" in inspect.signature(torch.library.custom_op).parameters:
    OP_OPTIONS["tags"] = TAGS

# torch.library runs an op's implementation below autograd (torch._C._AutoDispatchBelowAutograd
# excludes the autograd dispatch keys in thread-local state; in compiled code the view
# tracking's too), but this op's implementation IS the eager loss, whose cat / casts /
# learnable temperature's Function and the reference backend need autograd.
# _autograd_dispatch() re-includes those keys for the implementation's own, detached leaves
# (nothing outside the op is recorded). Private torch._C API, present from torch 2.0 to 2.13
# at least: without it the public ops are traced as before (``READY`` False).
_AUTOGRAD_KEYS = ("AutogradFunctionality", "AutogradOther", "AutogradNestedTensor",
                  "ADInplaceOrView")
READY = (hasattr(torch._C, "_PreserveDispatchKeyGuard")
         and hasattr(torch._C, "_dispatch_tls_set_dispatch_key_excluded")
         and all(hasattr(torch._C.DispatchKey, k) for k in _AUTOGRAD_KEYS))


@contextlib.contextmanager
def _autograd_dispatch():
    """Autograd's dispatch keys included again (and grad mode on) until the context exits."""
    with torch._C._PreserveDispatchKeyGuard(), torch.enable_grad():
        for key in _AUTOGRAD_KEYS:
            torch._C._dispatch_tls_set_dispatch_key_excluded(getattr(torch._C.DispatchKey, key),
                                                             False)
        yield


def _loss(z, labels, prototypes, temperature, temperature_tensor, hierarchical, include_self,
          reduction, variant, backend, autocast_dtype):
    """The eager loss (the ops module, imported here: it imports this module)."""
    from hiertail_fast.ops import balanced_contrastive_loss as ops

    tau = temperature if temperature_tensor is None else temperature_tensor
    prototypes = [None if p.shape[0] == 0 else p for p in prototypes]
    amp = (torch.autocast(z.device.type, dtype=autocast_dtype) if autocast_dtype is not None
           else contextlib.nullcontext())
    with amp:
        if hierarchical:
            return ops.hierarchical_contrastive_loss_op(z, labels, prototypes, tau, include_self,
                                                        variant, backend)
        return ops.balanced_contrastive_loss_op(z, labels[0], prototypes[0], tau, include_self,
                                                reduction, variant, backend)


def _differentiable(z, prototypes, temperature_tensor):
    """The op's differentiable inputs in ``grads_of`` order: z, each level's prototype tensor
    (``[0, d]`` where the level has none: a list of tensors, not of optional tensors, so that
    torch.library's autograd carries their gradients), the temperature tensor (None for a
    float temperature)."""
    return [z, *prototypes, temperature_tensor]


def unshared(outputs, inputs=()) -> list[Tensor]:
    """The outputs as tensors of their own (a custom op's outputs may not share memory with its
    inputs or with each other): a copy where the memory is shared (cat's backward splits one
    [N + m, d] gradient into pieces of it; a cast to the same dtype returns its input)."""
    def storage(t):
        return t.untyped_storage().data_ptr()

    taken = {storage(t) for t in inputs if isinstance(t, Tensor) and t.numel()}
    out = []
    for t in outputs:
        if t.numel() and storage(t) in taken:
            t = t.clone()
        if t.numel():
            taken.add(storage(t))
        out.append(t)
    return out


def _own_tensors(grads, leaves, others=()) -> list[Tensor]:
    """The gradients w.r.t. the leaves as an op's outputs: zeros where the loss does not reach a
    leaf, none sharing memory (``unshared``)."""
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves, strict=True)]
    return unshared(grads, (*leaves, *others))


@torch.library.custom_op("hiertail_fast::tied_gradients", **OP_OPTIONS)
def tied_gradients(grads: list[Tensor], inputs: list[Tensor], linear: bool) -> list[Tensor]:
    """The gradients as they are (copies: a custom op's outputs may not alias its inputs),
    tied to the op's differentiable inputs. Called in the traced backward of an op whose
    backward saved no input (the losses' fused gradients; topk_unpool's gather): AOTAutograd
    saves tensors detached, so a compiled call's gradient graph reached none of the inputs and
    a gradient penalty through it silently dropped its second-order term (torch.compile's
    double-backward error fires only where the backward holds an input that requires grad; an
    autograd audit). Taking the inputs here keeps them among the backward's arguments:
    differentiating the gradient of a compiled call then raises torch.compile's "does not
    currently support double backward". The price: the traced op saves its inputs, so an
    in-place change of one between the call and its backward raises autograd's in-place error
    there (as for ``z.pow(2)``; the eager ops save none). Where the backward then runs eagerly
    (``torch.export``), the derivative of these gradients is the identity for a ``linear`` op
    (the unpool's gather: exact) and raises otherwise (the losses)."""
    return [g.clone() for g in grads]


@tied_gradients.register_fake
def _(grads, inputs, linear):
    return [torch.empty_like(g) for g in grads]


def no_second_derivative(ctx, *grads):
    """The registered derivative of the ops that compute gradients: it raises."""
    raise RuntimeError("hiertail_fast: a traced (torch.compile / torch.export) call cannot be "
                       "differentiated again; take second derivatives of the eager call")


def _tied_setup(ctx, inputs, output):
    ctx.linear, ctx.n_inputs = inputs[2], len(inputs[1])


def _tied_backward(ctx, grad_outputs):
    if not ctx.linear:
        no_second_derivative(ctx)
    return list(grad_outputs), [None] * ctx.n_inputs, None


tied_gradients.register_autograd(_tied_backward, setup_context=_tied_setup)


def _loss_shape(z, prototypes, hierarchical, reduction):
    if hierarchical or reduction != "none":
        return ()
    return (z.shape[0] + sum(p.shape[0] for p in prototypes),)


def _fused_grads(reduction: str, hierarchical: bool) -> bool:
    """Whether the forward op returns the gradients (a scalar loss) or the backward op
    computes them (``reduction="none"``)."""
    return hierarchical or reduction != "none"


@torch.library.custom_op(_OP, **OP_OPTIONS)
def contrastive_loss(
    z: Tensor, labels: list[Tensor], prototypes: list[Tensor], temperature: float,
    temperature_tensor: Tensor | None, hierarchical: bool, include_self: bool, reduction: str,
    variant: str, backend: str | None, autocast_dtype: torch.dtype | None, grads_of: list[bool],
) -> tuple[Tensor, list[Tensor]]:
    """(loss, gradients of the loss w.r.t. the inputs ``grads_of`` marks) of one eager loss
    call; no gradients for ``reduction="none"`` (the backward op takes them)."""
    inputs = _differentiable(z, prototypes, temperature_tensor)
    fused = _fused_grads(reduction, hierarchical) and any(grads_of)
    leaves = [None if t is None else t.detach().requires_grad_(fused and w)
              for t, w in zip(inputs, grads_of, strict=True)]
    with _autograd_dispatch() if fused else torch.no_grad():
        loss = _loss(leaves[0], labels, leaves[1:-1], temperature, leaves[-1], hierarchical,
                     include_self, reduction, variant, backend, autocast_dtype)
        grads: list[Tensor] = []
        if fused:
            wanted = [t for t, w in zip(leaves, grads_of, strict=True) if w]
            grads = _own_tensors(torch.autograd.grad(loss, wanted, allow_unused=True), wanted)
    # the fake's dtype: every backend's (float32 for 16-bit inputs)
    return loss.detach().to(loss_dtype(z.dtype)), grads


@contrastive_loss.register_fake
def _(z, labels, prototypes, temperature, temperature_tensor, hierarchical, include_self,
      reduction, variant, backend, autocast_dtype, grads_of):
    loss = z.new_empty(_loss_shape(z, prototypes, hierarchical, reduction),
                       dtype=loss_dtype(z.dtype))
    if not (_fused_grads(reduction, hierarchical) and any(grads_of)):
        return loss, []
    inputs = _differentiable(z, prototypes, temperature_tensor)
    return loss, [torch.empty_like(t) for t, w in zip(inputs, grads_of, strict=True) if w]


@torch.library.custom_op("hiertail_fast::contrastive_loss_backward", **OP_OPTIONS)
def contrastive_loss_backward(
    grad: Tensor, z: Tensor, labels: list[Tensor], prototypes: list[Tensor],
    temperature: float, temperature_tensor: Tensor | None, include_self: bool, variant: str,
    backend: str | None, autocast_dtype: torch.dtype | None, grads_of: list[bool],
) -> list[Tensor]:
    """The vector-Jacobian product of ``reduction="none"``'s loss with ``grad``, for the inputs
    ``grads_of`` marks: the eager loss rerun with autograd."""
    inputs = _differentiable(z, prototypes, temperature_tensor)
    leaves = [None if t is None else t.detach().requires_grad_(w)
              for t, w in zip(inputs, grads_of, strict=True)]
    with _autograd_dispatch():
        loss = _loss(leaves[0], labels, leaves[1:-1], temperature, leaves[-1], False,
                     include_self, "none", variant, backend, autocast_dtype)
        wanted = [t for t, w in zip(leaves, grads_of, strict=True) if w]
        grads = torch.autograd.grad(loss, wanted, grad.to(loss.dtype), allow_unused=True)
    return _own_tensors(grads, wanted, others=(grad,))


@contrastive_loss_backward.register_fake
def _(grad, z, labels, prototypes, temperature, temperature_tensor, include_self, variant,
      backend, autocast_dtype, grads_of):
    inputs = _differentiable(z, prototypes, temperature_tensor)
    return [torch.empty_like(t) for t, w in zip(inputs, grads_of, strict=True) if w]


def _setup_context(ctx, inputs, output):
    (z, labels, prototypes, temperature, temperature_tensor, hierarchical, include_self,
     reduction, variant, backend, autocast_dtype, grads_of) = inputs
    ctx.grads_of, ctx.n_labels = list(grads_of), len(labels)
    ctx.fused = _fused_grads(reduction, hierarchical)
    if ctx.fused:   # the gradients, and the inputs that get one (tied_gradients)
        inputs = _differentiable(z, prototypes, temperature_tensor)
        ctx.n_grads = len(output[1])
        ctx.save_for_backward(*output[1], *(t for t, w in zip(inputs, grads_of, strict=True)
                                            if w))
    else:   # "none": the backward op reruns the loss on the inputs
        ctx.labels, ctx.temperature, ctx.include_self = labels, temperature, include_self
        ctx.variant, ctx.backend, ctx.autocast_dtype = variant, backend, autocast_dtype
        ctx.save_for_backward(z, temperature_tensor, *prototypes)


def _check_traced_gradients(ctx) -> None:
    """RuntimeError where autograd asks for a gradient the trace left out: ``grads_of`` was
    fixed from the example inputs' requires_grad when the call was traced, which a
    ``torch.export``-ed program keeps (Dynamo re-traces instead); a later call on inputs that
    require grad then got None for them, silently (z.grad None after backward())."""
    needs = ctx.needs_input_grad   # (z, [labels], [prototypes], tau, tau tensor, ...)
    asked = [needs[0], *needs[2], needs[4]]
    names = ["z", *(f"prototypes[{i}]" for i in range(len(needs[2]))), "temperature"]
    missing = [n for n, a, w in zip(names, asked, ctx.grads_of, strict=True) if a and not w]
    if missing:
        raise RuntimeError(
            f"balanced_contrastive_loss / hierarchical_contrastive_loss: this call was traced "
            f"(torch.export) with {', '.join(missing)} not requiring grad, so the traced "
            f"program computes no gradient for {'it' if len(missing) == 1 else 'them'}; trace "
            f"it with example inputs that require grad (in grad mode)")


@first_order_backward("balanced_contrastive_loss / hierarchical_contrastive_loss (traced)")
def _backward(ctx, grad_loss, _grad_of_grads):
    # first_order_backward: with create_graph=True the gradients pass through
    # _NoSecondDerivative (their second derivative raises). Without it a gradient penalty
    # through an exported loss reached the op's fused-gradient outputs (_grad_of_grads,
    # ignored here) and came back as a silent 0.
    _check_traced_gradients(ctx)
    if ctx.fused:
        saved = ctx.saved_tensors
        grads = [(g * grad_loss.to(g.dtype)) for g in saved[:ctx.n_grads]]
        grads = tied_gradients(grads, list(saved[ctx.n_grads:]), False)
    else:
        z, tau_t, *prototypes = ctx.saved_tensors
        grads = contrastive_loss_backward(grad_loss, z, ctx.labels, prototypes, ctx.temperature,
                                          tau_t, ctx.include_self, ctx.variant, ctx.backend,
                                          ctx.autocast_dtype, ctx.grads_of)
    it = iter(grads)
    per_input = [next(it) if w else None for w in ctx.grads_of]
    # one entry per op input, a list for each list of tensors (torch.library's rule): z,
    # labels, prototypes, temperature, the temperature tensor, the seven other arguments
    return (per_input[0], [None] * ctx.n_labels, per_input[1:-1], None, per_input[-1],
            *(None,) * 7)


torch.library.register_autograd(_OP, _backward, setup_context=_setup_context)
contrastive_loss_backward.register_autograd(no_second_derivative)


def _static_checks(z, level_labels, level_prototypes, include_self, reduction, variant,
                   temperature):
    """The checks that need no tensor data, made while tracing (the eager loss repeats them
    with the data checks when the op runs): a bad flag or name fails the trace with the eager
    call's TypeError / ValueError instead of the op schema's error."""
    for name, t in [("z", z), *(("labels", t) for t in level_labels)]:
        check_tensor(t, name)
    for p in level_prototypes:
        if p is not None and not isinstance(p, Tensor):
            raise TypeError(f"prototypes must be a torch.Tensor or None, got {type(p).__name__}")
        if p is not None and z.dim() == 2:      # (the op below sees an empty p as "none")
            check_prototypes_match(check_float_matrix(p, "prototypes", finite=False), z)
    check_loss_options(temperature, reduction, variant, include_self)


def traced_loss(z, level_labels, level_prototypes, temperature, include_self, reduction,
                variant, backend, hierarchical: bool) -> Tensor:
    """The public losses' call while TorchDynamo traces them: one custom op."""
    _static_checks(z, level_labels, level_prototypes, include_self, reduction, variant,
                   temperature)
    tensor_tau = isinstance(temperature, Tensor)
    no_rows = z.new_empty(0, z.shape[-1] if z.dim() else 0)    # a level without prototypes
    level_prototypes = [no_rows if p is None else p for p in level_prototypes]
    inputs = _differentiable(z, level_prototypes, temperature if tensor_tau else None)
    grads_of = [isinstance(t, Tensor) and torch.is_grad_enabled() and t.requires_grad
                for t in inputs]
    loss, _ = contrastive_loss(
        z, list(level_labels), list(level_prototypes), 0.0 if tensor_tau else float(temperature),
        temperature if tensor_tau else None, hierarchical, bool(include_self), reduction,
        variant, backend, autocast_dtype(z), grads_of)
    return loss
