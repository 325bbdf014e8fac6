"""Reference nearest-prototype assignment (sklearn ``pairwise_distances_argmin``, euclidean).

    a_i = argmin_t ‖z_i − p_t‖²        (ties -> lowest t, as numpy/sklearn argmin)

The squared distances are formed directly from the differences (no ‖z‖² − 2z·p + ‖p‖²
expansion, so no cancellation), in float64 for every input dtype: for 16- and 32-bit inputs a
difference of two entries is then exact unless their exponents lie more than 29 binary orders
apart (53 − 24 bits), and the squares and their sum round with a relative error below
(d + 1)·2⁻⁵³, so the argmin is that of the exact distances unless two of them agree to ~15
digits. (In float32 a row ~57 away from prototypes spread over 1e-3 already took a wrong
prototype in 3 of 2,000 rows, and at 1e-6 in 1,662: the distances' differences fell below
float32's resolution and every row "tied" with prototype 0.) float64 inputs are rescaled by a
common power of two (``pow2_rescale``) when the entries are so large or small that the squares
would over- or underflow; 16/32-bit entries never are in float64. Dense [N, m, d] in row
chunks: the oracle, never fast.
"""
from __future__ import annotations

import math

import torch

from hiertail_fast._validation import check_prototype_args

__all__ = ["nearest_prototype_ref", "check_prototype_args", "pow2_rescale", "EXACT_DTYPE"]

EXACT_DTYPE = torch.float64  # the dtype of every direct distance (here and in the fast path's
#                              re-decision of near-ties)
_CHUNK_ELEMENTS = 1 << 23  # bound on the [rows, m, d] float64 difference tensor of one chunk


def nearest_prototype_ref(z: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """Index of the nearest prototype (euclidean) for every row of ``z``.

    Args:
        z: [N, d] floating point, finite.
        prototypes: [m, d], same dtype and device, m >= 1, finite.
    Returns:
        int64 [N] with values in [0, m); ties go to the lowest prototype index.
        Not differentiable (an assignment); computed under ``torch.no_grad``.
    """
    z, prototypes = check_prototype_args(z, prototypes)
    # distances in float64 (exact widening); row-major rows: on a column-major input the
    # broadcast difference keeps that layout and its sum runs across rows, rounding by the
    # row's position (exact ties then broke by position, not by the lowest-index rule)
    z, prototypes = (t.detach().to(EXACT_DTYPE).contiguous() for t in (z, prototypes))
    z, prototypes = pow2_rescale(z, prototypes)  # float64 inputs only can need it
    n, d = z.shape
    m = prototypes.shape[0]
    out = torch.empty(n, dtype=torch.long, device=z.device)
    rows = max(1, _CHUNK_ELEMENTS // max(1, m * d))
    with torch.no_grad():
        for start in range(0, n, rows):
            diff = z[start:start + rows, None, :] - prototypes[None, :, :]
            dist = (diff * diff).sum(dim=-1)  # [rows, m]
            out[start:start + rows] = torch.argmin(dist, dim=1)  # first minimum on ties
    return out


def pow2_rescale(z: torch.Tensor, prototypes: torch.Tensor, dtype: torch.dtype | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s·z, s·prototypes)`` with s = 2^-e bringing max|entry| into [1/2, 1) when it lies
    outside [2^-E, 2^E], E = (max exponent of ``dtype``, the distances' dtype: default the
    inputs') / 4 (32 for float32): the argmin is invariant under a common scaling, a power of
    two scales exactly, and afterwards neither ‖z‖², ‖p‖² (up to 4·d·max²) overflow nor the
    squared differences of ordinary data underflow (float32 entries ~1e19 made ‖z‖² inf; ~1e-23
    made every squared distance 0). Inputs in range are returned as they are (no copy); rescaled
    ones come back in ``dtype`` (16-bit inputs rescaled in 16 bits lost their small entries to
    subnormals: another argmin than the reference's; an extremes audit)."""
    dtype = z.dtype if dtype is None else dtype
    if not z.numel():
        return z, prototypes
    # max|entry| from one aminmax pass each (z.abs().max() allocates an N×d temporary: ~45 ms
    # at 100k×128 on the 2-core CPU, against ~2 ms)
    # (and one host read for both tensors: on CUDA each read is a sync)
    ends = [end.to(torch.float64).abs() for t in (z, prototypes) for end in torch.aminmax(t)]
    big = float(torch.stack(ends).max())
    if big == 0.0:
        return z, prototypes
    e = math.frexp(big)[1]  # big = f·2^e, f in [1/2, 1)
    if abs(e) <= math.frexp(torch.finfo(dtype).max)[1] // 4:
        return z, prototypes
    # s in two exact halves: for subnormal inputs 2^-e itself lies beyond the dtype's range
    # (float32 entries of 1e-40: s = 2^133 became inf, every distance NaN; float64 ones of
    # 1e-310: 2^1030 overflowed the Python float)
    s1, s2 = math.ldexp(1.0, -e // 2), math.ldexp(1.0, -e - (-e // 2))
    return z.to(dtype) * s1 * s2, prototypes.to(dtype) * s1 * s2
