"""The contrastive losses' inputs: embeddings, labels per level, prototypes, temperature,
and the range of the logits they make."""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
import torch

from hiertail_fast._validation.options import check_flag
from hiertail_fast._validation.tensors import (
    FLOAT_DTYPES,
    all_finite,
    check_dense_tensor,
    check_float_matrix,
    check_index_vector,
    non_finite_error,
)

REDUCTIONS = ("mean", "sum", "none")


VARIANTS = ("exact", "official")


# Smallest accepted contrastive temperature. Every backend multiplies by 1/τ in float32: below
# ~2.9e-39 that factor overflows (1e-45 passed the old "> 0" check, then failed inside the
# kernels), and already at τ < 1e-6 a similarity z·z/τ of ordinary embeddings (|z·z| >= 3.4e32·τ)
# overflows float32. The paper uses τ in [0.01, 1].
MIN_TEMPERATURE = 1e-6
# MIN_TEMPERATURE as each floating dtype holds it (made once here: a tensor made per call is a
# host copy on the loss's path, which the sync-free checks forbid)
_MIN_TEMPERATURE_AS = {dt: float(torch.tensor(MIN_TEMPERATURE, dtype=dt))
                       for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}


_FP32_MAX = float(torch.finfo(torch.float32).max)


class LossInputValues(NamedTuple):
    """What the contrastive losses' checks read, for the loss to use rather than read again
    (each read of a CUDA tensor is a host sync): the temperature's value, and the largest row
    norm of z and every prototype tensor, max_i ‖z_i‖ in the logits' dtype (its square over τ
    bounds every logit: ``_attention_lse.LogitBound``; None where the rows the loss runs on
    are not those checked: autocast's 16-bit copies)."""
    tau: float
    max_row_norm: float | None


def validate_contrastive_inputs(
    z: torch.Tensor,
    labels: torch.Tensor,
    prototypes: torch.Tensor | None,
    temperature: float,
    reduction: str,
    variant: str,
    *,
    include_self: bool = True,
) -> LossInputValues:
    """Input checks of the balanced contrastive losses, shared by the reference and the fast
    backends (ValueError/TypeError naming the argument). ``temperature`` must be a finite real
    >= MIN_TEMPERATURE, or a 0-d floating tensor of such a value (learnable); ``include_self``
    a bool. Returns the values the checks read (``LossInputValues``)."""
    return validate_contrastive_levels(z, [labels], [prototypes], temperature, reduction,
                                       variant, include_self=include_self)


def validate_contrastive_levels(
    z: torch.Tensor,
    level_labels: list,
    level_prototypes: list,
    temperature: float,
    reduction: str,
    variant: str,
    *,
    include_self: bool = True,
) -> LossInputValues:
    """``validate_contrastive_inputs`` for every level of a hierarchical loss over one z;
    returns the values it read (``LossInputValues``).

    The checks that read no values run first (shapes, dtypes, devices, options); those that
    read values, one ``tolist`` of a small vector for all of them (on CUDA each read is a host
    sync that drains the device's queue: z's and every prototype tensor's finiteness, every
    level's labels >= 0 and the logit range were 5 reads per level):
    [max_i ‖z_i‖, max_t ‖p_t‖ of each level, min labels of each level, and a tensor
    temperature's value where it is on z's device (a learnable one: read here, and not again
    by the loss, ``_temperature_link``; it was two more syncs a call)]. A NaN or Inf entry
    makes its row norm, and so the max, NaN or Inf, so a finite max proves the tensor finite;
    only a non-finite one (a bad entry, or a norm that overflows) pays for the exact check,
    which tells the two apart. The errors are those of the per-tensor checks; every level's
    checks that read nothing come before any that reads values, and those keep their order
    (z, then each level's labels and prototypes, then the logit range)."""
    check_float_matrix(z, "z", finite=False)
    if z.shape[0] == 0 or z.shape[1] == 0:
        raise ValueError(f"z is empty (shape {tuple(z.shape)}); need at least one row and column")
    for labels, prototypes in zip(level_labels, level_prototypes, strict=True):
        if isinstance(labels, torch.Tensor) and labels.device != z.device:  # before reading
            raise ValueError(f"labels are on {labels.device} but z is on {z.device}")
        check_index_vector(labels, "labels", length=z.shape[0], values=False)
        if prototypes is not None:
            check_float_matrix(prototypes, "prototypes", finite=False)
            check_prototypes_match(prototypes, z)
    check_loss_options(temperature, reduction, variant, include_self)
    # a tensor temperature elsewhere (a CPU scalar beside CUDA rows) is read on its own: moved
    # to z's device, its copy would wait for the device's queue as a read does
    tau_read = isinstance(temperature, torch.Tensor) and temperature.device == z.device
    cdt = _logit_dtype(z)
    protos = [p if p is not None and p.numel() else None for p in level_prototypes]
    rows = [z, *(p for p in protos if p is not None)]       # the tensors whose norms are read
    reads = [_max_row_norm(t, cdt) for t in rows] + [lab.min() for lab in level_labels]
    if tau_read:
        reads.append(temperature.detach())
    values = torch.stack([r.to(torch.float64) for r in reads]).tolist()
    tau = check_temperature_value(temperature, values.pop() if tau_read else None)
    norms, label_min = iter(values[:len(rows)]), values[len(rows):]
    z_norm = next(norms)
    if not math.isfinite(z_norm) and not all_finite(z):
        raise non_finite_error("z contains NaN or Inf")
    largest = z_norm
    for lowest, prototypes in zip(label_min, protos, strict=True):
        if lowest < 0:
            raise ValueError("labels has negative entries")
        if prototypes is not None:
            p_norm = next(norms)
            if not math.isfinite(p_norm) and not all_finite(prototypes):
                raise non_finite_error("prototypes contains NaN or Inf")
            largest = max(largest, p_norm)      # (an overflowed norm: inf)
    check_logit_range(largest, z, rows, tau)
    return LossInputValues(tau, largest)


def check_level_sequences(level_labels: object, level_prototypes: object) -> tuple[list, list]:
    """The hierarchical loss's per-level arguments as lists: each a sequence (list, tuple, any
    iterable but a tensor or a string). A tensor (iterable by rows: each row taken for a
    level) or None / a number (Python's "'NoneType' object is not iterable") is a TypeError
    naming the argument. Their entries are checked level by level later."""
    out = []
    for name, value in (("level_labels", level_labels), ("level_prototypes", level_prototypes)):
        if isinstance(value, (torch.Tensor, str, bytes)) or not isinstance(value, Iterable):
            raise TypeError(f"level_labels and level_prototypes must be sequences of tensors "
                            f"(one per level); {name} is {type(value).__name__}")
        out.append(list(value))
    return out[0], out[1]


def check_prototypes_match(prototypes: torch.Tensor, z: torch.Tensor) -> None:
    """Prototypes [m, d] against z [N, d] (both 2-D float tensors): the same width, dtype and
    device. Reads no values (also checked while a compiled call is traced, ``_custom_ops``:
    an empty prototypes tensor there skipped the eager checks)."""
    if prototypes.shape[1] != z.shape[1]:
        raise ValueError(
            f"prototypes have width {prototypes.shape[1]} but z has width {z.shape[1]}"
        )
    if prototypes.dtype != z.dtype:
        raise TypeError(f"prototypes are {prototypes.dtype} but z is {z.dtype}")
    if prototypes.device != z.device:
        raise ValueError(f"prototypes are on {prototypes.device} but z is on {z.device}")


def check_temperature_value(temperature: float | torch.Tensor,
                            value: float | None = None) -> float:
    """The temperature's value as a float: finite, >= MIN_TEMPERATURE, and for a tensor within
    float32's range (its computations run in float32 or float64: 1e300 as a float64 tensor
    became inf, and the loss NaN). ``value``: a tensor temperature's value already read by the
    caller (None: read it here)."""
    try:
        tau = value if value is not None else float(
            temperature.detach() if isinstance(temperature, torch.Tensor) else temperature)
    except OverflowError:                           # an int beyond float's range (10**400)
        raise ValueError(f"temperature must be a finite number >= {MIN_TEMPERATURE:g}, got "
                         f"an int beyond float's range") from None
    # a tensor's minimum as its dtype holds it: float32(1e-6) is 9.99999997e-07, and the
    # smallest learnable temperature was refused as below the minimum (an audit, 2026-12-06)
    floor = (_MIN_TEMPERATURE_AS[temperature.dtype]
             if isinstance(temperature, torch.Tensor) and temperature.dtype in _MIN_TEMPERATURE_AS
             else MIN_TEMPERATURE)
    if not math.isfinite(tau) or not tau >= floor:
        raise ValueError(f"temperature must be a finite number >= {MIN_TEMPERATURE:g}, got "
                         f"{tau}")
    if isinstance(temperature, torch.Tensor) and tau > _FP32_MAX:
        raise ValueError(f"a tensor temperature must be <= {_FP32_MAX:.4g} (float32's range), "
                         f"got {tau:g}")
    return tau


def _logit_dtype(z: torch.Tensor) -> torch.dtype:
    """The dtype the loss computes its logits in: float64 for float64 inputs, else float32."""
    return torch.float64 if z.dtype == torch.float64 else torch.float32


def _max_row_norm(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0-dim max_i ‖t_i‖ in `dtype` (t non-empty), left on t's device."""
    return torch.linalg.vector_norm(t.detach(), dim=1, dtype=dtype).max()


def check_logit_range(largest: float, z: torch.Tensor, rows: list, tau: float) -> None:
    """The largest logit |s_ik| = |z_i·z_k|/τ is max_i ‖z_i‖²/τ (Cauchy-Schwarz, attained by
    s_ii): it must stay finite, with room, in the dtype the logits are computed in (float32
    for 16-bit inputs). Finite embeddings ~2e19 gave inf logits and a NaN loss, silently, on
    every backend. So must the dot products themselves, max_i ‖z_i‖², which every backend
    forms before it divides by τ: with τ > 1 the logits' bound alone let rows of norm ~1.85e19
    through (float32), whose dots overflow, and the loss was NaN, silently, on every backend.
    `largest`: the max row norm of `rows` (z and the prototypes) in that dtype, read by the
    caller with its other checks."""
    cdt = _logit_dtype(z)
    limit = torch.finfo(cdt).max / 16
    dots = largest * largest        # (a float product overflows to inf; ** raised OverflowError)
    if dots <= limit and dots / tau <= limit:           # (inf and NaN norms fail too)
        return
    if not math.isfinite(largest):        # the norm itself overflowed: its true size
        largest = max(_robust_max_row_norm(t) for t in rows if t.numel())
    if not largest * largest <= limit:
        raise non_finite_error(
            f"the logits overflow {cdt}, their dot products z_i·z_k already, before the "
            f"division by the temperature: max ‖z_i‖² = {_square_text(largest)} > "
            f"{limit:.3g}; scale the embeddings down (e.g. normalise them)")
    raise non_finite_error(
        f"the logits overflow {cdt}: max ‖z_i‖²/τ = {_square_text(largest, tau)} > "
        f"{limit:.3g}; scale the embeddings down (e.g. normalise them) or raise the temperature")


# The official variant on the fast engines (every backend but the dense reference): its
# denominator's LSE_i - M_i is the difference of two float64 numbers of the logits' size, an
# absolute error of ~2^-54 max|s| in the loss (measured 2^-54.8 to 2^-54.1; on 4 rows, two
# classes of 2, tau 1, docs/LOSS.md: 6.5e-8 relative at max|s| = 1e10, 1.9e-7 at 1e11, 4.3e-6
# at 1e12, 7.7e-4 at 1e14, 9.4 % from 1e16 on), where the reference, which subtracts M_i from
# every logit first, carries only the logits' own rounding. Up to 2^37 (1.4e11) that error
# stays under 2^-17 = 7.6e-6 absolute, inside the tests' float32 tolerance (1e-5 absolute);
# past it the fast engines refuse the call rather than answer further off, silently.
OFFICIAL_ENGINE_MAX_LOGIT = float(2 ** 37)


def check_official_engine_range(max_logit: float) -> None:
    """The official variant's fast engines' range (``OFFICIAL_ENGINE_MAX_LOGIT``): a
    ValueError naming the bound and the ways out past it, marked as the overflow checks' are
    (``non_finite_error``: a training run whose embeddings grow past it is reported as
    diverged, not crashed). ``max_logit``: scale · max‖z_i‖²."""
    if max_logit > OFFICIAL_ENGINE_MAX_LOGIT:
        raise non_finite_error(
            f"variant='official' on the fast engines: the logits reach max ‖z_i‖²/τ = "
            f"{max_logit:.3g} > 2^37 = {OFFICIAL_ENGINE_MAX_LOGIT:.3g}, where its denominator "
            f"(the log-sum-exp less the row max, both of that size) carries an absolute error "
            f"of ~2^-54 of it (on a 4-row case 0.08 % of the loss at 1e14, 9 % from 1e16); "
            f"scale the embeddings down (e.g. normalise them), raise the temperature, or use "
            f"the dense reference (backend='reference', HIERTAIL_BACKEND=reference, or "
            f"HierTailConfig(loss_backend='reference'): N x N memory)")


def _robust_max_row_norm(t: torch.Tensor) -> float:
    """max_i ‖t_i‖ in float64 without overflow in the squares: each row scaled by its largest
    entry first (an error path only)."""
    t = t.detach().double()
    peak = t.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(torch.float64).tiny)
    return float((torch.linalg.vector_norm(t / peak, dim=1) * peak[:, 0]).max())


def _square_text(norm: float, tau: float = 1.0) -> str:
    """norm² / tau in %.3g, or as a power of ten where it is past float64's range."""
    value = norm * norm / tau
    if math.isfinite(value):
        return f"{value:.3g}"
    return f"~1e{2 * math.log10(norm) - math.log10(tau):.0f}"


def check_loss_options(temperature: object, reduction: str, variant: str,
                       include_self: object) -> None:
    """The loss arguments' checks that read no tensor data (so also made while a compiled
    call is traced, ``ops/_custom_ops``): temperature's type (a real, or a 0-d floating
    tensor: learnable), the reduction and variant names, include_self a bool."""
    if isinstance(temperature, torch.Tensor):   # a learnable temperature: a 0-d float tensor
        check_dense_tensor(temperature, "temperature")      # sparse / meta: nothing to read
        if temperature.dim() != 0 or temperature.dtype not in FLOAT_DTYPES:
            raise TypeError(f"a tensor temperature must be a 0-d floating-point tensor, got "
                            f"shape {tuple(temperature.shape)} {temperature.dtype}")
    elif isinstance(temperature, (bool, np.bool_)) or not isinstance(
            temperature, (int, float, np.integer, np.floating)):
        # (other numbers.Real, e.g. Fraction, do not mix with tensors: a deep TypeError)
        raise TypeError(f"temperature must be a float (or a 0-d float tensor), got "
                        f"{type(temperature).__name__}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is not one of {REDUCTIONS}")
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is not one of {VARIANTS}")
    check_flag(include_self, "include_self")
