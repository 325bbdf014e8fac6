"""Input checks shared by every public op: clear ValueError/TypeError naming the problem."""
from __future__ import annotations

import contextlib
import math
import numbers
import operator
import os
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

REDUCTIONS = ("mean", "sum", "none")
VARIANTS = ("exact", "official")
# Smallest accepted contrastive temperature. Every backend multiplies by 1/τ in float32: below
# ~2.9e-39 that factor overflows (1e-45 passed the old "> 0" check, then failed inside the
# kernels), and already at τ < 1e-6 a similarity z·z/τ of ordinary embeddings (|z·z| >= 3.4e32·τ)
# overflows float32. The paper uses τ in [0.01, 1].
MIN_TEMPERATURE = 1e-6
_FP32_MAX = float(torch.finfo(torch.float32).max)
# Node-feature normalisations a dataset can be loaded with: none (the official harness's
# default, is_normalize=False) or row (x_i / Σ_j x_ij, the official --is_normalize).
FEATURE_NORMS = ("none", "row")
MAX_NODES = 3_037_000_499  # n * n + n must fit in int64 for the (row, col) sort key
# torch.manual_seed takes [-2**63, 2**64); the natural split's numpy generator only >= 0
SEED_MAX = 2**64 - 1
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


def check_dense_tensor(t: object, name: str) -> torch.Tensor:
    """``check_tensor`` for arrays whose values are read: a strided (dense) tensor with data
    (a sparse one failed deep inside with a RuntimeError on memory formats; one on the meta
    device with 'Tensor.item() cannot be called on meta tensors')."""
    t = check_tensor(t, name)
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if t.device.type == "meta":
        raise ValueError(f"{name} is on the meta device: it has no values to read")
    return t


def check_path(value: object, name: str) -> Path:
    """A file-system path given as a str or an os.PathLike (pathlib.Path), as a Path; anything
    else (None, an int, an open file, bytes) is a TypeError naming ``name`` (pathlib's own
    said "expected str, bytes or os.PathLike object, not int", naming no argument)."""
    text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got "
                        f"{type(value).__name__}")
    return Path(text)


def check_flag(value: object, name: str) -> bool:
    """A boolean switch as a Python bool: bool or numpy bool; anything else (a string such as
    "no", an int, None) is a TypeError, never read by its truthiness (``"no"`` is truthy)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_finite_number(value: object, name: str) -> float:
    """A finite real number as a float: int, float, numpy numbers, a one-element real tensor;
    bool and strings are a TypeError (never converted: ``float("2")`` would pass), NaN / ±inf
    a ValueError."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not (
            value.is_complex() or value.dtype == torch.bool):
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


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


def check_labels_below(top: int, num_classes: int, count: str = "num_classes") -> None:
    """ValueError when the largest label ``top`` is not below the class count; ``count`` names
    that count as the caller's user gave it. One message for the splits, the metrics, the
    trainer, the model's loss and the baselines, which had four wordings of it."""
    if top >= num_classes:
        raise ValueError(f"the labels go up to {top} but {count} is {num_classes}: labels "
                         f"must lie in [0, {num_classes})")


def check_node_ids(idx: object, name: str, n: int, device: torch.device,
                   where: str) -> torch.Tensor:
    """``idx`` as node ids: a 1-D integer tensor on ``device`` with entries in [0, n);
    ``where`` names what holds the n nodes ("the output", "the graph"). A boolean mask (PyG's
    train_mask) is refused by name: indexed with it, the baselines' up-sampling read node ids
    0 and 1 (a baselines audit). One check for the model's loss and the baselines' context,
    which wrote it twice in two wordings. Reads the largest id (a host sync on CUDA)."""
    if isinstance(idx, torch.Tensor) and idx.dtype == torch.bool:
        raise TypeError(f"{name} must hold node ids (an integer tensor), got a boolean mask: "
                        "pass mask.nonzero().view(-1)")
    idx = check_index_vector(idx, name)
    if idx.device != device:
        raise ValueError(f"{name} is on {idx.device} but {where} is on {device}")
    if idx.numel() and int(idx.max()) >= n:
        raise ValueError(f"{name} refers to node {int(idx.max())} but {where} has {n} nodes")
    return idx


def check_feature_norm(value: object, name: str = "feature_norm") -> str:
    """``value`` if it is one of FEATURE_NORMS, else a TypeError / ValueError naming them."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {FEATURE_NORMS}; got "
                        f"{type(value).__name__}")
    if value not in FEATURE_NORMS:
        raise ValueError(f"{name}={value!r} is not one of {FEATURE_NORMS}")
    return value


def check_edge_index(edge_index: object, num_nodes: int | None = None) -> torch.Tensor:
    ei = check_dense_tensor(edge_index, "edge_index")
    if ei.dim() != 2 or ei.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {tuple(ei.shape)}")
    check_index_dtype(ei, "edge_index")
    if ei.numel():
        if int(ei.min()) < 0:
            raise ValueError("edge_index has negative node indices")
        if num_nodes is not None and int(ei.max()) >= num_nodes:
            raise ValueError(
                f"edge_index refers to node {int(ei.max())} but num_nodes is {num_nodes}"
            )
    return ei


def check_edge_weight(edge_weight: object, num_edges: int,
                      name: str = "edge_weight", hint: str = "") -> torch.Tensor | None:
    """``name``: what the user gave the weights as (a sparse adjacency's values are named as
    such: "edge_weight must be a floating-point tensor" of a call that passed no edge_weight
    was a fresh-user audit's find); ``hint``: what to do instead of a non-float dtype."""
    if edge_weight is None:
        return None
    w = check_dense_tensor(edge_weight, name)
    if w.dim() != 1:
        raise ValueError(f"{name} must be 1-D [E], got shape {tuple(w.shape)}")
    check_float_dtype(w, name, hint)
    if w.numel() != num_edges:
        raise ValueError(
            f"{name} has {w.numel()} entries but edge_index has {num_edges} edges"
        )
    if not all_finite(w):
        raise ValueError(f"{name} contains NaN or Inf")
    return w


def duplicate_sum_overflow(dtype: torch.dtype) -> ValueError:
    """The ValueError for duplicate edges whose weights, each finite, summed past ``dtype``'s
    range when they were merged into one entry (a CSRGraph's dedupe / symmetrize, a sparse
    adjacency's coalesce). Before, the merged graph held inf weights and the op using it later
    blamed an in-place edit that never happened."""
    return ValueError(
        f"the weights of duplicate edges sum past {dtype}'s range (largest finite "
        f"{torch.finfo(dtype).max:.6g}) where they merge into one entry; scale the weights "
        f"down, pass them in a wider dtype, or keep duplicates apart "
        f"(CSRGraph.from_edge_index(..., dedupe=False))")


def check_weights_fit(weight: torch.Tensor | None, dtype: torch.dtype) -> None:
    """ValueError when edge weights stored in a wider dtype than the propagation's (the
    features') do not fit it: float64 weights of 1e39 with float32 features became inf in the
    cast, dinv 0, and 0·inf NaN rows on every backend; nonzero ones below its normal range
    (1e-40, 1e-50) were flushed to a few bits or to 0, silently: 1.4 % off, or every row 0
    (two extremes audits). Checked once per weights' version and dtype where the degrees are
    cached."""
    if weight is None or torch.finfo(weight.dtype).max <= torch.finfo(dtype).max:
        return
    w = weight.detach()
    cast = w.to(dtype)
    if not all_finite(cast):
        raise ValueError(f"edge_weight ({weight.dtype}) has values beyond {dtype}'s range, "
                         f"the dtype the propagation runs in (that of the features, float32 "
                         f"for 16-bit ones): rescale the weights (GCN normalisation does not "
                         f"change when all are scaled together) or pass {weight.dtype} features")
    tiny = torch.finfo(dtype).tiny
    if bool(((cast.abs() < tiny) & (w != 0)).any()):
        raise ValueError(f"edge_weight ({weight.dtype}) has nonzero values below {dtype}'s "
                         f"normal range (smallest normal {tiny:.6g}), the dtype the propagation "
                         f"runs in (that of the features, float32 for 16-bit ones): they would "
                         f"round to 0 or lose their precision; rescale the weights (GCN "
                         f"normalisation does not change when all are scaled together), set "
                         f"negligible ones to 0, or pass {weight.dtype} features")


def check_no_edge_weight(edge_weight: object) -> None:
    """A graph that carries its weights (a CSRGraph, a sparse adjacency) takes no separate
    ``edge_weight``: ValueError rather than silently ignoring one of the two."""
    if edge_weight is not None:
        raise ValueError("edge_weight must be None when a CSRGraph or a sparse adjacency is "
                         "given (its weights are stored in it)")


def check_gcn_degrees(deg: torch.Tensor) -> None:
    """GCN degrees ``deg_i = Σ_{e -> i} w_e + loop_i`` must be >= 0 and finite: deg^-1/2 of a
    negative degree is not a real number (PyG silently returns NaN rows; a NaN there also broke
    the CPU operator build). ValueError naming the first offending node and its degree. NaN
    degrees (a sum of finite weights that overflowed to +inf and -inf) and +inf ones (weights
    summing beyond the range of the dtype the degrees are summed in, float64: deg^-1/2 would
    be 0, a zero row) are rejected too."""
    deg = deg.detach()  # a check only: nothing returned, no autograd
    bad = ~((deg >= 0) & (deg < float("inf")))
    if deg.numel() and bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        d = float(deg[i])
        why = (f"the edge weights into it sum beyond {deg.dtype}'s range" if d == float("inf")
               else "deg^-1/2 needs degrees >= 0, so the edge weights into a node must not sum "
                    "to a negative value")
        raise ValueError(
            f"node {i} has GCN degree {d:g} (weighted in-degree plus added self-loop): {why}"
        )


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
    if not math.isfinite(tau) or not tau >= MIN_TEMPERATURE:
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


def check_classes(y: object) -> None:
    """ValueError unless the labels ``y`` hold at least 2 distinct classes (a one-class graph
    would train nothing and report a perfect bAcc)."""
    present = torch.unique(torch.as_tensor(y))
    if present.numel() < 2:
        only = f" (label {int(present[0])})" if present.numel() else ""
        raise ValueError(f"the graph's nodes all have one class{only}: node classification "
                         "needs at least 2 classes")


def is_integer_array(a: np.ndarray) -> bool:
    """An integer numpy dtype, bool not counted."""
    return np.issubdtype(a.dtype, np.integer) and a.dtype != bool


def check_label_array(y: np.ndarray, name: str = "y", *,
                      not_integer: type[Exception] = TypeError) -> np.ndarray:
    """``y``, a numpy array, as class labels: integer (not bool), 1-D, in [0, int64's
    largest] (a uint64 label >= 2**63 wraps negative in the int64 cast); returned as it is.
    ``name`` opens each message (a file's arrays name the file as well). ``not_integer``: the
    error for a non-integer dtype, part of each caller's contract (a TypeError for an
    argument, a ValueError for a file's array and for the splits' documented ValueError).
    One check for the loaders, relabel_by_size and the splits, which wrote it three times."""
    if not is_integer_array(y):
        raise not_integer(f"{name} must be an integer array of labels, got {y.dtype}")
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D [n], got shape {y.shape}")
    if y.size and int(y.min()) < 0:
        raise ValueError(f"{name} has negative labels (min {int(y.min())})")
    if y.size and int(y.max()) > INT64_MAX:
        raise ValueError(f"{name} has labels above int64's range (max {int(y.max())})")
    return y


def check_epochs_patience(epochs: object, patience: object) -> tuple[int, int]:
    """A training loop's length (`train_hiertail`, `train_baseline`): ``epochs`` >= 1 and
    ``patience`` >= 0 as ints; numpy integers pass, bool / float / NaN are a TypeError (2.5
    epochs, or a NaN patience that silently disabled early stopping)."""
    for name, v in (("epochs", epochs), ("patience", patience)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if epochs < 1 or patience < 0:
        raise ValueError(f"need epochs >= 1 and patience >= 0, got {epochs}, {patience}")
    return int(epochs), int(patience)


def check_seed(seed: object, name: str = "seed", *, bounded: bool = True) -> int:
    """A seed as an int >= 0: numpy integers pass; bool, float, str and None are a TypeError
    (1.5 and -1 failed inside numpy naming no seed; None drew an unreproducible result).
    ``bounded``: at most SEED_MAX, what a run's ``torch.manual_seed`` takes ([-2**63, 2**64));
    unbounded for seeds that only reach numpy's generator (any size)."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(seed).__name__} {seed!r}")
    if bounded and not 0 <= int(seed) <= SEED_MAX:
        raise ValueError(f"{name} must lie in [0, 2**64 - 1], got {int(seed)}")
    if int(seed) < 0:
        raise ValueError(f"{name} must be >= 0, got {int(seed)}")
    return int(seed)


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_threads(threads: int, name: str = "--threads") -> int:
    """A torch thread count no larger than the CPUs available: more only slows torch's OpenMP
    loops down (1,024 threads on 2 CPUs: an epoch 300x slower) and thousands crash it (2,048:
    a segfault inside torch.unique; 20,000: libgomp cannot create them)."""
    cpus = available_cpus()
    if not 1 <= threads <= cpus:
        raise ValueError(f"{name} must lie in [1, {cpus}] (the CPUs available to this "
                         f"process), got {threads}")
    return threads


_SWITCH_ON, _SWITCH_OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_switch(name: str, default: bool) -> bool:
    """An on/off environment variable (1/0, true/false, yes/no, on/off, any case; unset or
    empty: ``default``); anything else a ValueError naming it (HIERTAIL_NATIVE=OFF and
    HIERTAIL_SYMMETRIC=nope were read as "on" without a word)."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _SWITCH_ON:
        return True
    if raw in _SWITCH_OFF:
        return False
    raise ValueError(f"{name}={raw!r} is not one of 1/0 (true/false, yes/no, on/off)")


def env_int(name: str, default: int, least: int = 1) -> int:
    """An integer >= ``least`` from the environment (unset or empty: ``default``); anything
    else a ValueError naming the variable (the block sizes were read with a bare int(): it
    raised "invalid literal for int()" from deep inside the loss, naming nothing, and 0 or -5
    were clamped silently)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number") from None
    if value < least:
        raise ValueError(f"{name} must be >= {least}, got {value}")
    return value


def check_openmp_team(threads: int | None = None) -> None:
    """ValueError where OpenMP may start fewer threads than torch plans a loop for
    (``OMP_THREAD_LIMIT`` below torch's thread count, or ``OMP_DYNAMIC`` on): torch's CPU
    product of a sparse CSR matrix with a dense one then skips rows without an error (torch
    2.13, 800 nodes: off by 8.8 where the result is ~9), so the GCN propagation and the
    baselines' sparse layers would return wrong numbers. Checked where such a product is made
    (``ops/_csr_product.sparse_csr`` / ``csr_matmul``)."""
    threads = torch.get_num_threads() if threads is None else threads
    if threads <= 1:
        return
    limit = os.environ.get("OMP_THREAD_LIMIT", "").strip()
    if limit.isdigit() and int(limit) < threads:
        raise ValueError(
            f"OMP_THREAD_LIMIT={limit} is below torch's {threads} threads: OpenMP then runs "
            "fewer threads than torch plans for, and torch's CPU product of a sparse CSR "
            "matrix with a dense one skips rows (wrong results, no error); unset it or use "
            f"torch.set_num_threads({limit}) (the command lines: --threads {limit})")
    if os.environ.get("OMP_DYNAMIC", "").strip().lower() in _SWITCH_ON:
        raise ValueError(
            "OMP_DYNAMIC is on: OpenMP may then run fewer threads than torch plans for, and "
            "torch's CPU product of a sparse CSR matrix with a dense one skips rows (wrong "
            "results, no error); unset it or use torch.set_num_threads(1) (the command "
            "lines: --threads 1)")


def check_device(device: object, name: str = "device") -> torch.device:
    """``device`` as a torch.device (a str, a torch.device or a CUDA index), ValueError when it
    is no device or a CUDA device this build / machine does not have (torch raised an
    AssertionError 'Torch not compiled with CUDA enabled' at the first tensor moved there)."""
    if not isinstance(device, (str, torch.device, int)) or isinstance(device, bool):
        raise TypeError(f"{name} must be a str or a torch.device, got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"{name}={device!r} is not a device (use cpu, cuda or cuda:N)") from None
    if dev.type not in ("cpu", "cuda"):   # meta / mps / xpu / hpu failed inside torch
        raise ValueError(f"{name}={str(device)!r}: only cpu and cuda devices can train")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}={str(device)!r}: CUDA is not available (torch "
                             f"{torch.__version__}, cuda.is_available() is False)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{name}={str(device)!r}: only {torch.cuda.device_count()} CUDA "
                             "device(s)")
    return dev


def check_num_classes(num_classes: object, y: torch.Tensor) -> int:
    """A graph's ``num_classes``: an int above every label ``y`` (a float or a str was
    converted by int(): 5.7 trained a 5-class model)."""
    if isinstance(num_classes, (bool, np.bool_)) or not isinstance(num_classes,
                                                                    (int, np.integer)):
        raise TypeError(f"data.num_classes must be an int, got {type(num_classes).__name__} "
                        f"{num_classes!r}")
    check_labels_below(int(torch.as_tensor(y).max()), num_classes, "data.num_classes")
    return int(num_classes)


def check_positive_int(value: object, name: str) -> int:
    """A size such as a layer's channel count: an int as ``check_num_nodes`` takes one
    (TypeError for bool, floats, strings), >= 1 (ValueError)."""
    value = check_num_nodes(value, name)
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return value


def check_num_nodes(num_nodes: object, name: str = "num_nodes") -> int:
    """``num_nodes`` as an int: any integer that ``operator.index`` accepts (int, numpy
    integers, a one-element integer tensor); bool (including numpy's) and floats are rejected
    with TypeError, negative or too large values with ValueError."""
    if isinstance(num_nodes, torch.Tensor):
        ok = num_nodes.numel() == 1 and not (num_nodes.is_floating_point()
                                             or num_nodes.is_complex()
                                             or num_nodes.dtype == torch.bool)
        if not ok:
            raise TypeError(f"{name} must be an int, got a tensor of shape "
                            f"{tuple(num_nodes.shape)} and dtype {num_nodes.dtype}")
        num_nodes = int(num_nodes)
    if isinstance(num_nodes, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got bool")
    # asked, not tried: torch 2.11's Dynamo turns the TypeError of operator.index(12.0) inside a
    # compiled graph into an InternalTorchDynamoError that no except clause here catches
    if not hasattr(num_nodes, "__index__"):
        raise TypeError(f"{name} must be an int, got {type(num_nodes).__name__}")
    num_nodes = operator.index(num_nodes)
    if num_nodes < 0:
        raise ValueError(f"{name} must be >= 0, got {num_nodes}")
    if num_nodes > MAX_NODES:
        raise ValueError(f"{name}={num_nodes} is too large (max {MAX_NODES})")
    return int(num_nodes)


def check_sparse_parts(pointers: torch.Tensor | None, indices: torch.Tensor, n: int,
                       name: str) -> None:
    """ValueError unless a sparse adjacency's compressed ``pointers`` (CSR crow / CSC ccol /
    SparseTensor rowptr; None for COO) start at 0, do not decrease and end at the entries, and
    its ``indices`` (the other dimension's; COO: both rows of [2, nnz]) lie in [0, n). torch
    builds sparse tensors without checking them (unless its invariant checks are on): an
    index outside the graph was folded into another edge, malformed pointers read memory out
    of bounds or crashed in to_sparse_coo (a data audit, a review). One read to the host for
    all of it (a sync on CUDA)."""
    nnz = indices.shape[-1]
    parts = []
    if pointers is not None:
        if pointers.dim() != 1 or pointers.numel() != n + 1:
            raise ValueError(f"a sparse adjacency's {name} must hold {n + 1} entries, got "
                             f"{tuple(pointers.shape)}")
        parts += [pointers[0], pointers[-1],
                  pointers.diff().min() if n else pointers[0]]
    if nnz:
        parts += [indices.min(), indices.max()]
    if not parts:
        return
    values = torch.stack([t.long() for t in parts]).tolist()
    if pointers is not None:
        first, last, low = values[:3]
        values = values[3:]
        if first != 0 or low < 0 or last != nnz:
            raise ValueError(f"a sparse adjacency's {name} must start at 0, not decrease and "
                             f"end at its {nnz} entries; torch does not check them unless "
                             f"torch.sparse.check_sparse_tensor_invariants is on")
    if nnz and (values[0] < 0 or values[1] >= n):
        bad = values[0] if values[0] < 0 else values[1]
        raise ValueError(f"a sparse adjacency's indices must lie in [0, {n}), got {bad}; "
                         f"torch does not check them unless "
                         f"torch.sparse.check_sparse_tensor_invariants is on")


def physical_memory() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


# bytes per node of a graph's node-indexed arrays at build time (row pointers, a count, a
# degree: int64 / float64 each); their sum past the machine's memory cannot be built
NODE_ARRAY_BYTES = 24


def check_node_arrays_fit(n: int, device: torch.device, inferred: bool) -> None:
    """ValueError when a CPU graph of ``n`` nodes needs more memory for its node-indexed arrays
    alone than the machine has: one edge to a raw id of 3,000,000,000 made n the id + 1 and a
    ~24 GB allocation, the process killed by the OS (a data audit). ``inferred``: n was taken
    from the largest id (no num_nodes given)."""
    need = NODE_ARRAY_BYTES * (n + 1)
    # (below 1 GB, or while TorchDynamo traces, the OS is not asked: os.sysconf broke the
    # traced graph of a compiled topk_pool on an edge_index; a review)
    if need < 1 << 30 or device.type != "cpu" or torch.compiler.is_compiling():
        return
    total = physical_memory()
    if total is None or need <= total:
        return
    what = "num_nodes was taken as the largest node id + 1" if inferred else "num_nodes"
    raise ValueError(f"{what} = {n:,}: the graph's node arrays alone would need "
                     f"~{need / 1e9:.3g} GB, more than this machine's {total / 1e9:.3g} GB; "
                     + ("pass num_nodes, or number the nodes 0..n-1 (torch.unique(edge_index, "
                        "return_inverse=True))" if inferred else "number the nodes 0..n-1"))


def check_unpool_args(perm: object, num_nodes: object, k: int) -> torch.Tensor:
    """Validate ``perm`` [k] (distinct, in range) and ``num_nodes`` for unpooling."""
    num_nodes = check_num_nodes(num_nodes)  # int-like (numpy ints too), >= 0
    perm = check_index_vector(perm, "perm", length=k)
    if perm.numel():
        if int(perm.max()) >= int(num_nodes):
            raise ValueError(f"perm refers to node {int(perm.max())} but num_nodes is {num_nodes}")
        if torch.unique(perm).numel() != perm.numel():
            raise ValueError("perm has repeated node indices")
    return perm


def check_score_weight(score_weight: object, d: int, dtype: torch.dtype) -> torch.Tensor:
    """p as a [d] vector of x's dtype; rejects wrong shape, non-float, NaN/Inf and ‖p‖ = 0."""
    p = check_dense_tensor(score_weight, "score_weight")
    if p.dim() == 2 and p.shape[0] == 1:
        p = p.view(-1)  # PyG stores the projection as [1, d]
    if p.dim() != 1 or p.shape[0] != d:
        raise ValueError(f"score_weight must have shape [{d}] (or [1, {d}]), got "
                         f"{tuple(score_weight.shape)}")
    check_float_dtype(p, "score_weight")
    if p.dtype != dtype:
        raise TypeError(f"score_weight has dtype {p.dtype} but x has {dtype}")
    if not all_finite(p):
        raise non_finite_error("score_weight contains NaN or Inf")
    if not bool((p != 0).any()):
        raise ValueError("score_weight is all zeros: the score x·p/‖p‖ is undefined")
    return p


def check_prototype_args(z: object, prototypes: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Shared validation: both 2-D float, finite, same d/dtype/device, at least one prototype."""
    z = check_float_matrix(z, "z")
    prototypes = check_float_matrix(prototypes, "prototypes")
    if prototypes.shape[0] < 1:
        raise ValueError("prototypes must have at least one row")
    if z.shape[1] != prototypes.shape[1]:
        raise ValueError(f"z has {z.shape[1]} features but prototypes have {prototypes.shape[1]}")
    if z.dtype != prototypes.dtype:
        raise TypeError(f"z has dtype {z.dtype} but prototypes have {prototypes.dtype}")
    if z.device != prototypes.device:
        raise ValueError(f"z is on {z.device} but prototypes are on {prototypes.device}")
    return z, prototypes
