"""Reference top-k pooling (PyG ``TopKPooling`` + ``filter_adj``) and unpooling.

Semantics (PyG ``TopKPooling(in_channels, ratio)`` with its defaults: nonlinearity tanh,
multiplier 1, min_score None, one graph per call):

    score   = tanh(X·p̂),  p̂ = p/‖p‖                            [n]
    perm    = indices of the k largest scores, by descending score   [k]
    X'      = X[perm] ⊙ score[perm][:, None]                    [k, d]
    A'      = A[perm, perm]: edges (j -> i) with both ends kept, relabelled to positions in
              perm, in the order they appear in edge_index; edge weights kept (None stays None)

Returned like PyG's ``TopKPooling.forward``: ``(x_pooled, edge_index, edge_weight, perm,
score[perm])`` (PyG also returns the batch vector, absent here: one graph per call).

Pool size k (``pool_size``):
- ``ratio`` an ``int`` (not bool) >= 1: k = min(ratio, n).
- ``ratio`` a ``float`` in (0, 1): k = ceil(ratio·n) evaluated, exactly as PyG's ``topk``, in
  the floating dtype of the scores (float32 for 16-bit inputs). This is a PyG quirk worth
  knowing: ratio 0.3 and n = 100 give k = 31 in float32 (0.3f·100 rounds up to 30.000002)
  but k = 30 in float64.
- ``ratio == 1.0``: k = n (every node kept, re-ordered and gated). PyG reads any float >= 1 as
  a count (1.0 -> k = 1); this library does not: a float is a ratio in (0, 1], a count must
  be an ``int``. Floats <= 0 or > 1, ints < 1, bools, NaN -> ValueError/TypeError.
  ``pyg_pool_size`` implements PyG's full rule (floats >= 1 as counts) to compute such an int.

Ties: ``perm`` comes from a stable descending sort, so equal scores keep ascending node index
(lower index first). Scores are computed so that identical rows get bit-identical scores on
every backend (a per-row dot product whose rounding does not depend on the row's position,
then ``torch.tanh``), so the rule applies to duplicate rows too. ‖p‖ is computed scaled by
max|p| (``score_direction``): entries of 1e-23 or 1e19 in float32 neither under- nor overflow.
A row dot that overflows on the way (entries near the dtype's largest value, mixed signs) is
summed again scaled by a power of two (``rescale_overflowed_dots``).
16-bit X: p̂, the row dots and tanh in float32, the score and X' each rounded once to X's
dtype (within an ulp of the exact values; PyG's all-16-bit arithmetic cancels where
Σ|x_j p̂_j| >> |x·p̂|).
PyG's unstable ``torch.sort`` leaves tie order unspecified; without ties
the two agree exactly.
"""
from __future__ import annotations

import math
import numbers

import torch

from hiertail_fast._validation import (
    all_finite,
    check_edge_index,
    check_edge_weight,
    check_float_matrix,
    check_score_weight,
    check_unpool_args,
)

__all__ = ["pool_size", "pyg_pool_size", "rescale_overflowed_dots", "score_direction",
           "topk_pool_ref", "topk_unpool_ref"]


def pool_size(num_nodes: int, ratio: float | int, dtype: torch.dtype = torch.float32) -> int:
    """Number of nodes kept from a graph of ``num_nodes`` nodes (rules in the module docstring).

    ``dtype`` is the floating dtype of the scores: PyG rounds ceil(ratio·n) in that dtype.
    """
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real):
        raise TypeError(f"ratio must be a float in (0, 1] or an int >= 1, got {ratio!r}")
    if isinstance(ratio, numbers.Integral):
        if int(ratio) < 1:
            raise ValueError(f"an integer ratio is a node count and must be >= 1, got {ratio}")
        return min(int(ratio), int(num_nodes))
    ratio = float(ratio)
    if math.isnan(ratio) or not 0.0 < ratio <= 1.0:
        raise ValueError(
            f"a float ratio must lie in (0, 1], got {ratio}; pass an int to keep a fixed number "
            "of nodes"
        )
    if ratio == 1.0:
        return int(num_nodes)
    if dtype == torch.float64:
        product = float(num_nodes) * ratio
    else:   # float32 (16-bit types would overflow / round n itself): PyG's float32 product
        product = _round_to_float32(_round_to_float32(float(num_nodes))
                                    * _round_to_float32(ratio))
    return min(math.ceil(product), int(num_nodes))


def _round_to_float32(v: float) -> float:
    """v rounded to the nearest float32 (ties to even), in Python floats: the product of two
    such values is exact in a double (24 + 24 significant bits), so rounding it again gives
    float32's own product. Plain Python instead of a torch tensor so that the pool size is a
    constant while torch.compile traces (a tensor op there broke fullgraph with dynamic
    shapes); checked against torch's float32 product on 400,000 cases (tests/test_topk_pool)."""
    if v == 0.0 or not math.isfinite(v):
        return v
    mantissa, exponent = math.frexp(v)              # v = mantissa * 2**exponent, |m| in [.5, 1)
    if exponent - 1 < -126:                         # float32 subnormals: a grid of 2**-149
        return round(v * 2.0 ** 149) * 2.0 ** -149
    return math.ldexp(round(math.ldexp(mantissa, 24)), exponent - 24)


def pyg_pool_size(num_nodes: int, ratio: float | int,
                  dtype: torch.dtype = torch.float32) -> int:
    """PyG's own rule, floats >= 1 included: k = min(int(ratio), n) when ratio >= 1 (so 1.0
    keeps ONE node and 23.9 keeps 23), else ceil(ratio·n) in ``dtype``. Use it to turn the
    official HierTail ratios (first one rescaled by n/#classes) into the int count that
    ``topk_pool`` takes: ``topk_pool(..., ratio=pyg_pool_size(n, r))``."""
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or math.isnan(ratio):
        raise TypeError(f"ratio must be a real number, got {ratio!r}")
    if math.isinf(ratio):       # (int(inf) raised an OverflowError)
        raise ValueError(f"ratio must be finite, got {ratio}")
    if ratio >= 1:
        return min(int(ratio), int(num_nodes))
    if ratio <= 0:
        raise ValueError(f"ratio must be > 0, got {ratio}")
    return pool_size(num_nodes, float(ratio), dtype)


def topk_pool_ref(
    x: torch.Tensor,
    edge_index: torch.Tensor,
    score_weight: torch.Tensor,
    ratio: float | int,
    edge_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Top-k pooling of one graph, plain PyTorch.

    Args:
        x: node features [n, d], floating point, finite.
        edge_index: [2, E] integer, row 0 = source j, row 1 = target i, values in [0, n).
        score_weight: projection vector p, [d] (or [1, d] as PyG stores it), nonzero norm.
        ratio: float in (0, 1] (fraction, rounded up) or int >= 1 (count); see ``pool_size``.
        edge_weight: optional [E] weights, kept for the surviving edges.

    Returns:
        ``(x_pooled [k, d], edge_index [2, E'] int64, edge_weight [E'] or None, perm [k] int64,
        score [k])`` with ``score = tanh(x·p/‖p‖)[perm]``. Differentiable w.r.t. ``x``,
        ``score_weight`` and ``edge_weight``.
    """
    x = check_float_matrix(x, "x")
    n, d = x.shape
    p = check_score_weight(score_weight, d, x.dtype)
    edge_index = check_edge_index(edge_index, n)
    edge_weight = check_edge_weight(edge_weight, edge_index.shape[1])
    k = pool_size(n, ratio, x.dtype)

    # x·p/‖p‖ as x·p̂ (p̂ from `score_direction`: no under/overflow of ‖p‖, and no overflow of
    # x·p); a row-wise (x * p̂).sum(1), whose rounding does not depend on the row's position
    # (torch.mv's blocking rounds the trailing n mod 4 rows differently), so identical rows
    # get bit-identical scores and the lowest-index tie rule holds; on row-major rows (a
    # column-major x would make the sum run across rows, rounding by the row's position)
    # 16-bit x: p̂, the row dots and tanh in float32, the score rounded once to x's dtype (a
    # 16-bit p̂ made x·p̂ cancel its rounding: scores 6 ulps off in fp16 where Σ|x_j p̂_j| is
    # 10× |x·p̂|, found by random fuzzing against float64); the pooled rows x·s from the
    # float32 score, rounded once too. Rows whose sum overflowed on the way (entries near the
    # dtype's largest value, mixed signs: +inf, -inf or NaN where the true x·p̂ is finite or of
    # the other sign) are summed again in an extended exponent range (`rescale_overflowed_dots`)
    phat, _, _ = score_direction(p)
    t = (x.contiguous() * phat).sum(dim=-1)
    score_acc = torch.tanh(rescale_overflowed_dots(x, phat, t))
    score = score_acc.to(x.dtype)
    perm = torch.sort(score, descending=True, stable=True).indices[:k]
    x_pooled = (x[perm] * score_acc[perm].unsqueeze(-1)).to(x.dtype)

    # filter_adj: old id -> position in perm (or -1), keep edges whose both ends survive.
    new_id = torch.full((n,), -1, dtype=torch.long, device=x.device)
    new_id[perm] = torch.arange(k, device=x.device)
    row, col = new_id[edge_index[0].long()], new_id[edge_index[1].long()]
    keep = (row >= 0) & (col >= 0)
    pooled_edge_index = torch.stack([row[keep], col[keep]], dim=0)
    pooled_weight = None if edge_weight is None else edge_weight[keep]
    return x_pooled, pooled_edge_index, pooled_weight, perm, score[perm]


def topk_unpool_ref(x_pooled: torch.Tensor, perm: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Unpooling: ``out = zeros(num_nodes, d); out[perm] = x_pooled`` (differentiable).

    Args:
        x_pooled: [k, d] floating point.
        perm: [k] distinct node indices in [0, num_nodes).
        num_nodes: n, rows of the output.
    Returns:
        [num_nodes, d], same dtype/device as ``x_pooled``.
    """
    x_pooled = check_float_matrix(x_pooled, "x_pooled", finite=False)
    perm = check_unpool_args(perm, num_nodes, x_pooled.shape[0])
    out = x_pooled.new_zeros(num_nodes, x_pooled.shape[1])
    return out.index_copy_(0, perm.long(), x_pooled)    # in place: no second n × d buffer


# a rescued row's largest entry is scaled to [2**63, 2**64): a sum of d terms stays finite for
# any d below 2**60, and terms down to 2**-60 of the largest keep their precision
_RESCUE_EXPONENT = 64


def rescale_overflowed_dots(x: torch.Tensor, phat: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``t`` (the row dots x_i·p̂ of a finite x [n, d], in the accumulation dtype) with every
    entry that is not finite summed again: the float sum of finite terms overflowed on the way
    (|x_ij| near the dtype's largest value with mixed signs give +inf, -inf or NaN where the
    true x_i·p̂ is finite, or of the other sign). Such a row is summed as
    2^(e_i − 64) · Σ_j (x_ij·2^(64 − e_i)) p̂_j with 2^(e_i − 1) <= max_j |x_ij| < 2^e_i: a scaling
    by a power of two, exact (terms below 2^-60 of the largest aside, far under the sum's
    rounding), so the row rounds as the plain sum would with an unbounded exponent; a true
    |x_i·p̂| beyond the dtype's range is ±inf, whose tanh is ±1 (the right sign). Returns ``t``
    itself when every entry is finite (`all_finite`: one O(n) sum; a host sync on CUDA), else a
    copy."""
    if all_finite(t):
        return t
    bad = torch.nonzero(~torch.isfinite(t)).view(-1)
    rows = x.index_select(0, bad).to(t.dtype)
    _, e = torch.frexp(rows.abs().amax(dim=1))      # max |x_ij| = f·2^e, f in [0.5, 1)
    two = torch.tensor(2.0, dtype=t.dtype, device=t.device)
    up = torch.pow(two, (_RESCUE_EXPONENT - e).to(t.dtype)).unsqueeze(1)
    down = torch.pow(two, (e - _RESCUE_EXPONENT).to(t.dtype))
    out = t.clone()
    out[bad] = ((rows * up).contiguous() * phat).sum(dim=-1) * down
    return out


def score_direction(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(p̂, ‖q‖, m)`` for a nonzero p [d]: p̂ = p/‖p‖, computed as q/‖q‖ with q = p/m and
    m = max|p| (detached), so ‖p‖ = m·‖q‖ never under- or overflows (1 <= ‖q‖ <= √d; the
    plain Σp² underflows to 0 for |p| ~ 1e-23 and overflows for |p| ~ 1e19 in float32). All
    three in the accumulation dtype (float32, float64 for float64: a 16-bit p gets a float32
    p̂, not one rounded to 16 bits), ‖q‖ and m for backward's 1/‖p‖ = 1/(m‖q‖).
    Differentiable: m is detached, and since ‖·‖ is 1-homogeneous the gradient through
    q/‖q‖ is exactly (I − p̂p̂ᵀ)/‖p‖."""
    acc = torch.float64 if p.dtype == torch.float64 else torch.float32
    m = p.detach().abs().max().to(acc)
    q = p.to(acc) / m
    qn = torch.linalg.vector_norm(q)
    return q / qn, qn.detach(), m
