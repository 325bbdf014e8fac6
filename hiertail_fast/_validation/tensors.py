"""Tensor checks: type, layout, dtype, finiteness, index vectors; and the non-finite error
that the training loop reads as divergence."""
from __future__ import annotations

import contextlib
import math

import numpy as np
import torch

INT64_MAX = 2**63 - 1  # beyond it uint64 ids / labels wrap negative in an int64 cast


def non_finite_error(message: str) -> ValueError:
    """The ValueError for a value that must be finite and is NaN / Inf or would overflow (the
    logits), marked ``non_finite = True`` (the exact type stays ValueError): the training loop
    (`hiertail_fast.train.fit_early_stopping`) reports one raised after an optimiser step as
    divergence."""
    exc = ValueError(message)
    exc.non_finite = True
    return exc


def is_non_finite_error(exc: BaseException) -> bool:
    """Whether ``exc`` came from `non_finite_error`."""
    return isinstance(exc, ValueError) and getattr(exc, "non_finite", False) is True


@contextlib.contextmanager
def blame_inner_non_finite(x: torch.Tensor, message):
    """Re-raise an inner op's non-finite check ("x contains NaN or Inf" of ITS input) as
    ``message(exc)`` when the user's ``x`` is finite: the NaN / Inf is the module's own (an
    overflow, or NaN parameters), and the inner check blamed the user's x for it (an overflow
    and an nn-module audit). Other errors, and those of a non-finite x, pass unchanged."""
    try:
        yield
    except ValueError as exc:
        if not is_non_finite_error(exc) or not all_finite(x.detach()):
            raise
        raise non_finite_error(message(exc)) from exc


def check_tensor(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_nested:     # (torch.nested.nested_tensor's default layout is torch.strided: every
        # later check and op failed with "NestedTensorImpl doesn't support sizes")
        raise TypeError(f"{name} must be a plain tensor, got a nested tensor ({t.layout}): "
                        "pass each graph or batch on its own, or torch.cat them")
    if isinstance(t, torch.masked.MaskedTensor):   # (its dispatch refused the ops' first
        # reduction with a TypeError naming an aten op, not the argument)
        raise TypeError(f"{name} must be a plain tensor, got a MaskedTensor: pass the "
                        "entries that are present as a plain tensor")
    return t


# The dtypes the ops read. Other floating dtypes (float8) and the wider unsigned integers
# (uint16/32/64) pass ``is_floating_point()`` / the integer test but have almost no CPU
# kernels (``t.sum()``, ``t.min()`` raise NotImplementedError naming neither argument nor
# problem), so they are refused up front by name.
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def check_float_dtype(t: torch.Tensor, name: str, hint: str = "") -> torch.Tensor:
    """``hint``: what to do instead, appended to the message."""
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor (float32, float64, float16 or "
                        f"bfloat16), got {t.dtype}{hint}")
    return t


def check_index_dtype(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be an integer tensor (int64, int32, int16, int8 or "
                        f"uint8), got {t.dtype}")
    return t


def check_has_values(t: torch.Tensor, name: str) -> torch.Tensor:
    """``t`` unless it is on the meta device, which holds shapes but no values (reading them
    failed deep inside torch: 'Tensor.item() cannot be called on meta tensors', or a
    NotImplementedError from .cpu())."""
    if t.device.type == "meta":
        raise ValueError(f"{name} is on the meta device: it has no values to read")
    return t


def check_dense_tensor(t: object, name: str) -> torch.Tensor:
    """``check_tensor`` for arrays whose values are read: a strided (dense) tensor with data
    (a sparse one failed deep inside with a RuntimeError on memory formats; a meta one:
    ``check_has_values``)."""
    t = check_tensor(t, name)
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    return check_has_values(t, name)


def all_finite(t: torch.Tensor) -> bool:
    """True iff no entry of the floating tensor t is NaN or ±inf.

    One read pass: a NaN or inf anywhere makes the sum NaN or inf (nothing cancels them), so a
    finite sum proves every entry finite. Only a non-finite sum (a bad entry, or finite values
    whose sum overflows) pays for the exact element-wise check. ``torch.isfinite(t).all()``
    alone costs several passes and a bool temporary (CPU: abs, two compares, a product: ~200 ms
    for a 1M×64 fp32 matrix on the 2-core CPU, which was 15 % of a top-k pooling step). The
    sum is read as a Python float and tested there: ``torch.isfinite`` of the 0-d sum would be
    four more kernel launches on CUDA (abs, two compares, a product) before the same one read."""
    if not t.numel():
        return True
    if math.isfinite(float(t.detach().sum())):     # (a read, not part of any graph)
        return True
    return bool(torch.isfinite(t).all())


def check_float_matrix(t: object, name: str, *, finite: bool = True) -> torch.Tensor:
    t = check_dense_tensor(t, name)
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D [n, d], got shape {tuple(t.shape)}")
    check_float_dtype(t, name)
    if finite and not all_finite(t):
        raise non_finite_error(f"{name} contains NaN or Inf")
    return t


def check_index_vector(t: object, name: str, *, length: int | None = None,
                       values: bool = True) -> torch.Tensor:
    """A 1-D integer tensor (of `length` entries), no entry negative; ``values=False`` leaves
    the one check that reads the entries (a host sync on CUDA) to the caller."""
    t = check_dense_tensor(t, name)
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    check_index_dtype(t, name)
    if length is not None and t.numel() != length:
        raise ValueError(f"{name} has {t.numel()} entries, expected {length}")
    if values and t.numel() and int(t.min()) < 0:
        raise ValueError(f"{name} has negative entries")
    return t


def is_integer_array(a: np.ndarray) -> bool:
    """An integer numpy dtype, bool not counted."""
    return np.issubdtype(a.dtype, np.integer) and a.dtype != bool
