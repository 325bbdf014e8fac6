"""Nearest-prototype assignment: blocked argmin of euclidean distance, O(N·m) time, O(block) memory.

    a_i = argmin_t ‖z_i − p_t‖²        ties -> lowest t (as sklearn ``pairwise_distances_argmin``)

Both backends (torch: blocked matmuls; triton: ``kernels/nearest_prototype.py``) rank the
prototypes of a row by the expanded form d̃_it = ‖p_t‖² − 2 z_i·p_t (‖z_i‖² is constant per row
and dropped), which costs one GEMM per block but rounds differently from the direct
‖z_i − p_t‖²: two prototypes whose distances differ by less than the rounding error could swap.
Near-ties are therefore re-checked: with u the unit roundoff of the accumulation dtype
(float32 for 32- and 16-bit inputs, float64 for float64) the expanded value of any prototype is
within γ·(‖z_i‖ + max_t ‖p_t‖)², γ = (d + 2)·u, of its exact value (the standard worst-case
dot-product bound), so whenever the gap between the best and second-best expanded values is at
most twice that, the row's candidates (prototypes within that bound of its minimum) are
recomputed with direct differences in float64 from the input values (as the reference does:
for 16/32-bit inputs that is the exact distance up to a relative ~d·2⁻⁵³) and the lowest index
among exact minima wins. Outside such rows the expanded argmin is the exact one. The result is
therefore deterministic and equal to the reference argmin of directly computed float64
distances. (Direct distances in float32 were not enough: a row far from a tight cluster of
prototypes has distances that differ below float32's resolution, and it "tied" with the
cluster's lowest index whatever its direction.)

Not differentiable: an assignment (the official code detaches it too).
"""
from __future__ import annotations

import torch

from hiertail_fast._validation import check_prototype_args
from hiertail_fast.ops import _custom_graph_ops, _nearest_rows
from hiertail_fast.ops._dispatch import choose_backend, public_op
from hiertail_fast.ops._functorch import outside_transforms, plain
from hiertail_fast.reference.nearest_prototype import (
    EXACT_DTYPE,
    nearest_prototype_ref,
    pow2_rescale,
)

__all__ = ["nearest_prototype"]

_BLOCK_ELEMENTS = 1 << 22  # rows·prototypes of one [rows, M_TILE] distance block (16 MB fp32)
_M_TILE = 8192


@public_op
def nearest_prototype(
    z: torch.Tensor, prototypes: torch.Tensor, *, backend: str | None = None
) -> torch.Tensor:
    """Index of the nearest prototype (euclidean) for every row of ``z``.

    Args:
        z: [N, d] floating point, finite.
        prototypes: [m, d], same dtype/device, m >= 1.
        backend: "reference" | "torch" | "triton" | None (``choose_backend`` decides).
    Returns:
        int64 [N] in [0, m), lowest index on ties; no gradient.
    """
    if torch.compiler.is_compiling() and _custom_graph_ops.READY:     # one custom op
        return _custom_graph_ops.traced_nearest_prototype(z, prototypes, backend)
    z, prototypes = check_prototype_args(z, prototypes)
    choice = choose_backend(z, backend, op="nearest_prototype")
    if choice == "reference":
        return nearest_prototype_ref(z, prototypes)
    if z.shape[1] == 0:     # d = 0: every distance is 0, a tie of all m (the tie refinement's
        return torch.zeros(z.shape[0], dtype=torch.long, device=z.device)  # unique needs d > 0)
    # not differentiable: inside a torch.func transform, on plain tensors outside it (the C
    # kernel of the torch backend reads memory, which functorch's wrappers have none of)
    with torch.no_grad(), outside_transforms():
        z, prototypes = plain(z, "nearest_prototype"), plain(prototypes, "nearest_prototype")
        # exact power-of-two rescale when ‖z‖² / ‖p‖² could over- or underflow (the expanded
        # form needs them; float32 entries ~1e19 gave inf − inf = NaN and a wrong argmin)
        acc_dtype = torch.float64 if z.dtype == torch.float64 else torch.float32
        # the re-decision's direct float64 distances read the inputs as given (as the
        # reference does): the rescale may flush an entry the float64 distance still sees;
        # float64 inputs, rescaled as in the reference, excepted
        # (one detach: pow2_rescale returns inputs in range as they are, and the re-decision
        # tells "nothing rescaled" by identity)
        exact_z, exact_p = z.detach(), prototypes.detach()
        z, prototypes = pow2_rescale(exact_z, exact_p, acc_dtype)
        if acc_dtype == EXACT_DTYPE:
            exact_z, exact_p = z, prototypes
        if choice == "triton":
            from hiertail_fast.kernels.nearest_prototype import nearest_prototype_fwd

            zc, pc = z.contiguous(), prototypes.contiguous()
            pnorm = pc.to(acc_dtype).pow(2).sum(dim=1)
            idx, best, second = nearest_prototype_fwd(zc, pc, pnorm)
        else:
            idx, best, second = _argmin_torch(z, prototypes.to(acc_dtype))
        # 16-bit rows are widened a block (or the suspect rows) at a time, never whole: two
        # float32 copies of z were the op's peak (a memory audit)
        return _refine_near_ties(z, prototypes.to(acc_dtype), idx, best, second,
                                 exact_z, exact_p)


def _argmin_torch(z: torch.Tensor, p: torch.Tensor):
    """Blocked best / second-best of d̃ = ‖p‖² − 2 z·p; peak extra memory ~ _BLOCK_ELEMENTS.
    p in the accumulation dtype; z's blocks are brought to it one at a time."""
    n, m = z.shape[0], p.shape[0]
    pnorm = p.pow(2).sum(dim=1)
    m_tile = min(m, _M_TILE)
    rows = max(1, _BLOCK_ELEMENTS // m_tile)
    acc = p.dtype
    best_two = _nearest_rows.kernel(acc) if z.device.type == "cpu" else None
    idx = torch.empty(n, dtype=torch.long, device=z.device)
    best = torch.empty(n, dtype=acc, device=z.device)
    second = torch.empty(n, dtype=acc, device=z.device)
    for r0 in range(0, n, rows):
        zb = z[r0:r0 + rows].to(acc)
        b_val = torch.full((zb.shape[0],), float("inf"), dtype=acc, device=z.device)
        s_val = b_val.clone()
        b_idx = torch.zeros(zb.shape[0], dtype=torch.long, device=z.device)
        for m0 in range(0, m, m_tile):
            # d̃ block [rows, tile] = ‖p‖² − 2 z·pᵀ, one GEMM (addmm: no separate temporary)
            dist = torch.addmm(pnorm[m0:m0 + m_tile], zb, p[m0:m0 + m_tile].t(), alpha=-2.0)
            # best and second-best of each row: on the CPU one C pass over the block
            # (_nearest_rows), else topk(2) (1.6x faster than min, scatter inf, min). Which of
            # several EQUAL minima is reported does not matter: an exact tie leaves a zero
            # best/second gap, and every such row is re-decided by _refine_near_ties with the
            # lowest-index rule, so the final answer does not depend on that order.
            if best_two is not None:
                t_val, t_arg, t_sec = _nearest_rows.native_step(best_two, dist)
            else:
                t_val, t_arg, t_sec = _nearest_rows.reference_step(dist)
            better = t_val < b_val  # strict: equal later values keep the lower index
            s_val = torch.where(better, torch.minimum(b_val, t_sec), torch.minimum(s_val, t_val))
            b_idx = torch.where(better, t_arg + m0, b_idx)
            b_val = torch.where(better, t_val, b_val)
        idx[r0:r0 + rows], best[r0:r0 + rows], second[r0:r0 + rows] = b_idx, b_val, s_val
    return idx, best, second


def _refine_near_ties(z, p, idx, best, second, exact_z, exact_p):
    """Re-decide rows whose best/second gap is within the rounding bound, with exact distances.

    For such a row every prototype whose expanded value (from ``z`` and ``p``, rescaled, p in
    the accumulation dtype) is within the bound of the row's minimum is a candidate (any other
    one is provably farther than the expanded winner); the candidates' distances are recomputed
    directly in float64 from ``exact_z`` / ``exact_p`` (the inputs as the reference reads
    them), ‖z − p‖², and the smallest wins, lowest index on ties.

    Memory stays O(block) on degenerate inputs too: equal rows give equal direct distances, so
    the work runs on distinct rows only — of a group of equal prototypes only the lowest index
    can win, and equal suspect rows get one answer — and the candidates go in bounded chunks.
    (All-zero embeddings and prototypes, e.g. dead ReLUs, made every one of N·m pairs a
    candidate: 10k × 400 zeros took 6 GB and 15 s.) The worst case left — every pair a near-tie
    among distinct rows — costs O(N·m·d) time, the order of the op's own product.
    """
    n, d = z.shape
    m = p.shape[0]
    if n == 0 or m == 1:
        return idx
    pmax = p.norm(dim=1).max()
    # (z in its own dtype: its row norms and the suspect rows taken in p's, the accumulation
    # dtype, a block at a time)
    rows_at_once = max(1, _BLOCK_ELEMENTS // max(1, d))
    znorm = torch.cat([z[r0:r0 + rows_at_once].to(p.dtype).norm(dim=1)
                       for r0 in range(0, n, rows_at_once)])
    suspect = torch.nonzero((second - best) <= _tie_bound(znorm, d, pmax)).view(-1)
    if suspect.numel() == 0:
        return idx
    # distinct suspect rows as the exact distances see them (16-bit widened to float32:
    # exact, and one of torch.unique's dtypes), and for the expanded form the rescaled rows
    # (the same ones when nothing was rescaled: the first occurrence's otherwise)
    zu, inverse = torch.unique(exact_z[suspect].to(p.dtype), dim=0, return_inverse=True)
    if exact_z is z:
        za = zu
    else:
        first = torch.full((zu.shape[0],), suspect.numel(), dtype=torch.long, device=p.device) \
            .scatter_reduce(0, inverse, torch.arange(suspect.numel(), device=p.device), "amin")
        za = z[suspect[first]].to(p.dtype)
        del first
    tol = _tie_bound(za.norm(dim=1), d, pmax)
    pnorm = p.pow(2).sum(dim=1)
    p_exact = exact_p.to(EXACT_DTYPE)     # m × d: widened once (z's rows a chunk at a time)
    winners = torch.empty(zu.shape[0], dtype=torch.long, device=p.device)
    pair_chunk = max(1, _BLOCK_ELEMENTS // 2 // max(1, d))  # candidate pairs per difference
    rows_per = max(1, _BLOCK_ELEMENTS // 8 // m)              # ≤ ~20 bytes per pair held
    for r0 in range(0, zu.shape[0], rows_per):
        zc = za[r0:r0 + rows_per]
        expanded = torch.addmm(pnorm, zc, p.t(), alpha=-2.0)   # [rows, m]
        cand = expanded <= expanded.min(dim=1, keepdim=True).values + tol[r0:r0 + rows_per, None]
        del expanded
        rows, cols = torch.nonzero(cand, as_tuple=True)
        rows, cols = _drop_equal_later_prototypes(p_exact, rows, cols)
        exact = torch.empty(rows.numel(), dtype=EXACT_DTYPE, device=p.device)
        for c0 in range(0, rows.numel(), pair_chunk):
            diff = zu.index_select(0, r0 + rows[c0:c0 + pair_chunk]).to(EXACT_DTYPE)
            diff -= p_exact.index_select(0, cols[c0:c0 + pair_chunk])
            exact[c0:c0 + pair_chunk] = diff.square_().sum(dim=1)   # (as the reference sums)
        rc = zc.shape[0]
        emin = torch.full((rc,), float("inf"), dtype=EXACT_DTYPE, device=p.device)
        emin = emin.scatter_reduce(0, rows, exact, "amin")
        cols = torch.where(exact == emin[rows], cols, torch.full_like(cols, m))
        winners[r0:r0 + rc] = torch.full((rc,), m, dtype=torch.long, device=p.device) \
            .scatter_reduce(0, rows, cols, "amin")         # lowest index among exact minima
    idx = idx.clone()
    idx[suspect] = winners[inverse]
    return idx


def _drop_equal_later_prototypes(p, rows, cols):
    """The candidate pairs without those of a prototype equal to a lower-indexed candidate:
    equal prototypes have equal direct distances, so the lowest index of a group is the only
    one that can win (and it is a candidate whenever another member is: same exact value).
    Only the candidates' columns are compared (not all m prototypes: an O(m log m · d) sort
    per call, 0.3 s at m = 50k, for the few rows that are near-ties)."""
    ccols, cinv = torch.unique(cols, return_inverse=True)      # ascending prototype ids
    firsts = _first_of_equal_rows(p[ccols])
    if firsts is None:
        return rows, cols
    keep = torch.zeros(ccols.numel(), dtype=torch.bool, device=cols.device)
    keep.index_fill_(0, firsts, True)          # (no Python value lifted to a tensor)
    keep = keep[cinv]
    return rows[keep], cols[keep]


def _tie_bound(znorm, d, pmax):
    """Per row, twice the worst-case error of an expanded value: 2·γ·(‖z_i‖ + max_t ‖p_t‖)²,
    γ = (d + 2)·u (the standard dot-product bound, +2 operations), u of the accumulation
    dtype (the row norms' ``znorm``)."""
    gamma = (d + 2) * (torch.finfo(znorm.dtype).eps / 2)
    return 2.0 * gamma * (znorm + pmax) ** 2


def _first_of_equal_rows(p):
    """Ascending indices of the first row of each group of equal rows of p, or None when all
    rows differ. (±0 count as equal: their squared differences are the same.)"""
    uniq, inverse = torch.unique(p, dim=0, return_inverse=True)
    if uniq.shape[0] == p.shape[0]:
        return None
    first = torch.full((uniq.shape[0],), p.shape[0], dtype=torch.long, device=p.device)
    first = first.scatter_reduce(0, inverse, torch.arange(p.shape[0], device=p.device), "amin")
    return first.sort().values
