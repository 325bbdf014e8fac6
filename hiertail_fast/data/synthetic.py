"""Synthetic long-tail graphs: Zipf class sizes, degree-corrected SBM, Gaussian features.

Model (all vectorised numpy; O(n + E) memory, no n x n or C x n array):

1. Class sizes. Zipf weights w_c ∝ (c + 1)^(-a), c = 0..C-1, with the exponent a found by
   bisection so that the head H = max(1, round(head_fraction·C)) classes hold ``head_mass`` of
   the nodes (Pareto 80/20 by default). Every class first gets ``min_size`` = 2 nodes (1 when
   n < 2C), the rest is split ∝ w by largest remainders; sizes are sorted so class 0 is the
   largest. Node ids are a random permutation (labels are not contiguous).
2. Degree propensities θ_i ~ Pareto(degree_exponent) (P(θ > t) = t^(1-γ), t >= 1), capped at
   sqrt(n / avg_degree) (structural cut-off, keeps hubs below ~sqrt(n·d) neighbours); all 1 when
   ``degree_exponent`` is None (plain SBM).
3. Edges (undirected, M = round(n·d/2)): M_in = round(homophily·M) within classes and
   M_out = M - M_in between classes, then deduplicated.
   - within: class c gets m_c = min(λ·Θ_c, cap_c) edges (Θ_c = Σ_{i∈c} θ_i, cap_c = half of its
     s_c(s_c-1)/2 node pairs, λ by water-filling so Σ m_c = M_in); both endpoints of an edge of
     class c are drawn ∝ θ inside c. So node i expects ~2λθ_i within-class neighbours, the
     DC-SBM degree correction.
   - between: both endpoints drawn ∝ θ over all nodes; same-class pairs are rejected.
   "Drawn ∝ θ" is done in bulk with stubs (exact multinomial counts per node for each side,
   one side randomly permuted = a uniform random pairing, O(n + E) and cache friendly), and for
   the small top-up rounds by inverse-CDF ``searchsorted`` on the cumulative θ. Self-loops are
   dropped; duplicates are removed by sorting packed int64 keys min(u,v)·n + max(u,v); lost
   edges are redrawn (per-class deficits) for up to 6 rounds. When classes are too small to
   hold the requested within-class edges (tiny n, very high homophily) the achieved homophily
   and degree fall short; ``stats`` reports them.
4. Features x_i = μ_{y_i} + feature_noise·ε_i with class means μ_c ~ N(0, class_sep²/F · I_F)
   (so ‖μ_c − μ_d‖ ≈ class_sep·√2 whatever F) and ε_i ~ N(0, I_F); float32, built in chunks.
   At n = 20,000, C = 70 (the other parameters at their defaults) features alone are weak
   (nearest class mean: ~11 % accuracy, ~28 % balanced accuracy) while one-hop neighbour
   averaging reaches ~71 % / ~87 %: the graph carries most of the signal.

Determinism: one ``numpy.random.SeedSequence(seed)`` spawns independent streams for sizes/ids,
degrees, edges and features, so e.g. changing ``num_features`` does not change the graph.
"""
from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from hiertail_fast._validation import check_seed
from hiertail_fast.data.io import GraphData

__all__ = ["SyntheticGraph", "make_synthetic_graph", "zipf_class_sizes"]


@dataclass
class SyntheticGraph(GraphData):
    """A :class:`GraphData` (edge_index int64 [2, E] both directions, sorted by (src, dst), no
    self-loops or duplicates; x float32 [n, F]; y int64 [n], class 0 largest) plus
    ``class_sizes_target`` (int64 [C]), the generator ``params`` and achieved ``stats``
    (homophily = fraction of undirected edges inside a class, avg_degree = E / n).
    ``to_npz(path)`` writes the uniform format."""

    class_sizes_target: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    params: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)


def _largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Non-negative integers ∝ weights summing exactly to ``total``."""
    if total <= 0 or weights.sum() <= 0:
        return np.zeros(weights.shape[0], dtype=np.int64)
    exact = weights / weights.sum() * total
    base = np.floor(exact).astype(np.int64)
    short = int(total - base.sum())
    if short > 0:
        base[np.argsort(-(exact - base), kind="stable")[:short]] += 1
    return base


def _int_arg(name: str, val: object) -> int:
    """An int argument (numpy integers too); bool, float (silently truncated: 50.7 nodes gave
    50) and str are a TypeError naming it."""
    if isinstance(val, (bool, np.bool_)) or not isinstance(val, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(val).__name__}")
    return int(val)


def _real_arg(name: str, val: object) -> float:
    """A real-number argument (int, float, numpy numbers), returned unchanged (so the
    generator's arithmetic and ``params`` stay as they were). A str, None or bool was compared
    with a number deep inside ('<=' not supported ...) or taken as 0 / 1."""
    if isinstance(val, (bool, np.bool_)) or not isinstance(val, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(val).__name__} {val!r}")
    return val


def _head_share(a: float, h: int, c: int) -> float:
    w = np.arange(1, c + 1, dtype=np.float64) ** -a
    return float(w[:h].sum() / w.sum())


def _head_classes(head_fraction: float, c: int) -> int:
    """How many of the C classes (the largest) are the head: round(head_fraction·C), at least
    one, and at least one tail class left."""
    return min(max(1, round(head_fraction * c)), c - 1)


def zipf_class_sizes(
    num_nodes: int, num_classes: int, head_fraction: float = 0.2, head_mass: float = 0.8
) -> np.ndarray:
    """Class sizes int64 [C], non-increasing, sum n, head round(head_fraction·C) ≈ head_mass·n
    (every class keeps at least 1-2 nodes: with few nodes per class the head holds less, and
    `make_synthetic_graph` warns)."""
    n, c = _int_arg("num_nodes", num_nodes), _int_arg("num_classes", num_classes)
    head_fraction = _real_arg("head_fraction", head_fraction)
    head_mass = _real_arg("head_mass", head_mass)
    if c < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if n < c:
        raise ValueError(f"num_nodes ({n}) must be >= num_classes ({c}): every class non-empty")
    if not 0.0 < head_fraction < 1.0:
        raise ValueError(f"head_fraction must be in (0, 1), got {head_fraction}")
    if not 0.0 < head_mass < 1.0:
        raise ValueError(f"head_mass must be in (0, 1), got {head_mass}")
    h = _head_classes(head_fraction, c)
    if head_mass < h / c - 1e-12:
        raise ValueError(
            f"head_mass {head_mass} is below the head's share {h}/{c} of balanced classes; "
            "sizes would have to grow along the tail"
        )
    m = 2 if n >= 2 * c else 1
    rest = n - m * c
    # share of the head within the proportional part, so the head holds head_mass of all n
    target = (head_mass * n - h * m) / rest if rest > 0 else h / c
    target = min(max(target, h / c), 1.0 - 1e-9)
    lo, hi = 0.0, 1.0
    while _head_share(hi, h, c) < target and hi < 1e3:
        hi *= 2.0
    for _ in range(100):  # head share is increasing in the exponent a
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _head_share(mid, h, c) < target else (lo, mid)
    w = np.arange(1, c + 1, dtype=np.float64) ** -(0.5 * (lo + hi))
    sizes = m + _largest_remainder(w, rest)
    return np.sort(sizes)[::-1].copy()


def _water_fill(theta_c: np.ndarray, cap: np.ndarray, total: float) -> np.ndarray:
    """e_c = min(λ·Θ_c, cap_c) with Σ e_c = total (all caps when they cannot hold total)."""
    if cap.sum() <= total:
        return cap.astype(np.float64)
    lo, hi = 0.0, total / max(theta_c[cap > 0].min(), 1e-300)
    for _ in range(200):
        lam = 0.5 * (lo + hi)
        lo, hi = (lam, hi) if np.minimum(lam * theta_c, cap).sum() < total else (lo, lam)
    return np.minimum(hi * theta_c, cap)


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    """Sorted unique int64 keys (sort + neighbour mask: much faster than np.unique for int64
    keys under numpy 2.x)."""
    keys = np.sort(keys)
    if keys.size:
        keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
    return keys


def _stub_pairs(rng, theta: np.ndarray, lo: int, hi: int, m: int):
    """m pairs (a, b) of positions in [lo, hi), each endpoint ∝ θ.

    Exact multinomial stub counts per node for each side; side a stays in position order and
    side b is randomly permuted, which pairs the stubs uniformly at random. O(hi - lo + m).
    """
    w = theta[lo:hi] / theta[lo:hi].sum()
    idx = np.arange(lo, hi, dtype=np.int64)
    a = np.repeat(idx, rng.multinomial(m, w))
    b = rng.permutation(np.repeat(idx, rng.multinomial(m, w)))
    return a, b


def _inverse_cdf_pick(cum, cum_start, theta_c, start, sizes, cls, r) -> np.ndarray:
    """Positions drawn ∝ θ inside class cls[k], one per uniform r[k] in [0, 1): the inverse
    CDF on the cumulative θ. The clip keeps a draw in its class where rounding carries u
    past the class's last cumulative θ (cum_start + r·Θ_c and cum are summed in different
    orders; for r within ~2,000 ulps of 1 at 10k-1M nodes, ~1e-13 of the draws)."""
    u = cum_start[cls] + r * theta_c[cls]
    j = np.searchsorted(cum, u, side="right")
    return np.clip(j, start[cls], start[cls] + sizes[cls] - 1)


def _merge_unique(existing: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Sorted unique union of sorted-unique ``existing`` and arbitrary ``new`` keys."""
    new = _sorted_unique(new)
    if existing.size and new.size:
        pos = np.minimum(np.searchsorted(existing, new), existing.size - 1)
        new = new[existing[pos] != new]
    out = np.concatenate([existing, new])
    out.sort(kind="stable")  # two sorted runs: timsort merges them in linear time
    return out


# largest class_sep / sqrt(F) and feature_noise: the features stay far inside float32's range
_FEATURE_SCALE_MAX = float(np.finfo(np.float32).max) / 64


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


# how far the realised graph may miss the request before make_synthetic_graph says so
DEGREE_SHORTFALL = 0.05          # relative, of avg_degree
HOMOPHILY_MISS = 0.05            # absolute
HEAD_MASS_MISS = 0.05            # absolute, of the share of the nodes in the head classes


def _warn_if_not_long_tailed(realised: float, head_mass: float, n: int, c: int) -> None:
    """A UserWarning when the head classes hold another share of the nodes than asked: every
    class keeps at least one or two nodes, so few nodes per class leave the Zipf law no room
    (100 nodes, 50 classes: all classes equal, the head 0.20 of the nodes, not 0.8; 300 nodes,
    70 classes: one class of 161 and the rest 2-3; a data audit). The realised share is in
    ``stats["head_mass"]``."""
    if abs(realised - head_mass) > HEAD_MASS_MISS:
        warnings.warn(
            f"make_synthetic_graph: the head classes hold {realised:.3g} of the nodes, asked "
            f"for head_mass {head_mass:g}: {n} nodes are too few for {c} long-tailed classes "
            "(each keeps at least 1-2 nodes; more nodes or fewer classes get closer); the "
            "realised share is in .stats['head_mass']", UserWarning, stacklevel=3)


def _warn_if_short(stats: dict, avg_degree: float, homophily: float) -> None:
    """A UserWarning when the graph misses the requested density or homophily: within-class
    draws are capped at half of a class's pairs and between-class ones are limited by the
    pairs there are, so small graphs with many classes or a high degree get fewer edges than
    asked (200 nodes, 70 classes, avg_degree 50, homophily 0.9 -> 14.7 and 0.66). The
    realised values are always in ``stats``; here the caller is told they differ."""
    short = stats["avg_degree"] < (1.0 - DEGREE_SHORTFALL) * avg_degree
    missed = (stats["num_undirected_edges"] > 0
              and abs(stats["homophily"] - homophily) > HOMOPHILY_MISS)
    if short or missed:
        warnings.warn(
            f"make_synthetic_graph: the graph has avg_degree {stats['avg_degree']:.3g} and "
            f"homophily {stats['homophily']:.3g}, asked for {avg_degree:g} and {homophily:g}: "
            "too few node pairs within or between the classes at this size (fewer classes, "
            "more nodes or a lower degree get closer); the realised values are in .stats",
            UserWarning, stacklevel=3)


def make_synthetic_graph(
    num_nodes: int,
    num_classes: int = 70,
    *,
    avg_degree: float = 10.0,
    homophily: float = 0.8,
    num_features: int = 128,
    head_fraction: float = 0.2,
    head_mass: float = 0.8,
    degree_exponent: float | None = 2.5,
    class_sep: float = 1.0,
    feature_noise: float = 1.0,
    seed: int = 0,
) -> SyntheticGraph:
    """Generate a long-tail node-classification graph (see the module docstring for the model).

    Args:
        num_nodes: n >= num_classes. num_classes: C >= 2.
        avg_degree: requested mean degree d = E / n (E counts both directions), 0 <= d < n - 1.
        homophily: requested fraction of undirected edges joining same-class nodes, in [0, 1].
        num_features: F >= 1. head_fraction, head_mass: Zipf law of the class sizes.
        degree_exponent: γ > 1 of the Pareto degree propensities (None: all equal).
        class_sep: spread of the class means; feature_noise: std of the per-node noise.
        seed: integer seed; the same arguments give bit-identical graphs.
    Returns:
        a :class:`SyntheticGraph` with CPU torch tensors.
    """
    for name, val in (("num_nodes", num_nodes), ("num_classes", num_classes),
                      ("num_features", num_features), ("seed", seed)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(val).__name__}")
    n, c, f = int(num_nodes), int(num_classes), int(num_features)
    avg_degree, homophily = _real_arg("avg_degree", avg_degree), _real_arg("homophily", homophily)
    class_sep = _real_arg("class_sep", class_sep)
    feature_noise = _real_arg("feature_noise", feature_noise)
    if degree_exponent is not None:
        degree_exponent = _real_arg("degree_exponent", degree_exponent)
    sizes = zipf_class_sizes(n, c, head_fraction, head_mass)  # checks n >= C >= 2 first
    _check(f >= 1, f"num_features must be >= 1, got {f}")
    seed = check_seed(seed, bounded=False)      # numpy's SeedSequence: any int >= 0
    _check(0.0 <= homophily <= 1.0, f"homophily must be in [0, 1], got {homophily}")
    _check(math.isfinite(avg_degree) and 0.0 <= avg_degree < max(n - 1, 1),
           f"avg_degree must be in [0, num_nodes - 1), got {avg_degree}")
    _check(degree_exponent is None or degree_exponent > 1.0,
           f"degree_exponent must be > 1 or None, got {degree_exponent}")
    _check(class_sep >= 0.0 and feature_noise >= 0.0, "class_sep and feature_noise must be >= 0")
    # x = μ + noise·ε in float32 (|ε| < ~6.5 at float32's standard normal): inf, or values whose
    # float32 product overflows (class_sep 1e300, feature_noise 1e39), gave NaN/Inf features
    _check(class_sep / math.sqrt(f) <= _FEATURE_SCALE_MAX and feature_noise <= _FEATURE_SCALE_MAX,
           f"class_sep / sqrt(num_features) and feature_noise must be <= "
           f"{_FEATURE_SCALE_MAX:.3g} (float32 features), got {class_sep} and {feature_noise}")
    _check(n * n < 2**63, "num_nodes too large for int64 edge keys")

    rng_ids, rng_deg, rng_edge, rng_feat = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
    )
    # "positions" 0..n-1 are nodes grouped by class; node id of position j is ids[j]
    ids = rng_ids.permutation(n)
    cls_pos = np.repeat(np.arange(c), sizes)
    y = np.empty(n, dtype=np.int64)
    y[ids] = cls_pos
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]])

    if degree_exponent is None:
        theta = np.ones(n)
    else:  # inverse-CDF Pareto, x_min = 1, capped at the structural cut-off
        with np.errstate(over="ignore"):  # γ near 1: huge θ, capped just below
            theta = (1.0 - rng_deg.random(n)) ** (-1.0 / (degree_exponent - 1.0))
        np.minimum(theta, max(math.sqrt(n / max(avg_degree, 1e-12)), 1.0), out=theta)
    cum = np.cumsum(theta)  # cumulative θ over positions (float64)
    theta_c = np.add.reduceat(theta, start)
    cum_start = cum[start] - theta[start]

    m_total = int(round(n * avg_degree / 2))
    m_in = int(round(homophily * m_total))
    m_out = m_total - m_in
    cap = 0.5 * sizes * (sizes - 1) / 2.0  # keep within-class draws at most half-saturated
    want_c = _largest_remainder(_water_fill(theta_c, cap, m_in), min(m_in, int(cap.sum())))

    def pick(cls: np.ndarray) -> np.ndarray:
        return _inverse_cdf_pick(cum, cum_start, theta_c, start, sizes, cls,
                                 rng_edge.random(cls.shape[0]))

    def pack(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.minimum(a, b) * n + np.maximum(a, b)  # undirected key in position space

    # round 0, the bulk: exact stub counts + random pairing (sequential memory access)
    p_same = float(((theta_c / cum[-1]) ** 2).sum())  # rejection rate of between-class draws
    pairs = [_stub_pairs(rng_edge, theta, start[k], start[k] + sizes[k], int(want_c[k]))
             for k in np.flatnonzero(want_c)]
    keys_in = np.zeros(0, dtype=np.int64)
    if pairs:
        a, b = (np.concatenate(t) for t in zip(*pairs, strict=True))
        keys_in = _sorted_unique(pack(a[a != b], b[a != b]))  # drop self-loops
    keys_out = np.zeros(0, dtype=np.int64)
    if m_out > 0:
        a, b = _stub_pairs(rng_edge, theta, 0, n, int(m_out / max(1.0 - p_same, 1e-3)))
        ok = cls_pos[a] != cls_pos[b]
        new = pack(a[ok], b[ok])
        if new.size > m_out:  # a random subset (a is in position order: never truncate)
            new = new[rng_edge.choice(new.size, m_out, replace=False)]
        keys_out = _sorted_unique(new)
    # top-up rounds for the few edges lost to self-loops, duplicates and rejections
    for _ in range(6):
        need_c = np.maximum(want_c - np.bincount(cls_pos[keys_in // n], minlength=c), 0)
        need_out = m_out - keys_out.size
        if need_c.sum() == 0 and need_out <= 0:
            break
        if need_c.sum():
            ec = np.repeat(np.arange(c), need_c)
            a, b = pick(ec), pick(ec)
            keys_in = _merge_unique(keys_in, pack(a[a != b], b[a != b]))
        if need_out > 0:
            draw = int(need_out / max(1.0 - p_same, 1e-3) * 1.05) + 16
            u = np.searchsorted(cum, rng_edge.random((2, draw)) * cum[-1], side="right")
            np.minimum(u, n - 1, out=u)
            ok = np.flatnonzero(cls_pos[u[0]] != cls_pos[u[1]])[:need_out]
            keys_out = _merge_unique(keys_out, pack(u[0][ok], u[1][ok]))

    # positions -> node ids; both directions; sorted by (src, dst)
    lo_, hi_ = np.divmod(np.concatenate([keys_in, keys_out]), n)
    lo_, hi_ = ids[lo_], ids[hi_]
    directed = np.concatenate([lo_ * n + hi_, hi_ * n + lo_])
    del lo_, hi_
    directed.sort()
    edge_index = np.empty((2, directed.shape[0]), dtype=np.int64)
    np.divmod(directed, n, out=(edge_index[0], edge_index[1]))
    del directed

    scale = np.float32(class_sep / math.sqrt(f))
    means = rng_feat.standard_normal((c, f)).astype(np.float32) * scale
    x = np.empty((n, f), dtype=np.float32)
    chunk = max(1, (1 << 22) // f)  # ~16 MB of noise at a time
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        x[s:e] = rng_feat.standard_normal((e - s, f), dtype=np.float32)
        x[s:e] *= np.float32(feature_noise)
        x[s:e] += means[y[s:e]]

    num_und = keys_in.shape[0] + keys_out.shape[0]
    params = dict(num_nodes=n, num_classes=c, avg_degree=avg_degree, homophily=homophily,
                  num_features=f, head_fraction=head_fraction, head_mass=head_mass,
                  degree_exponent=degree_exponent, class_sep=class_sep,
                  feature_noise=feature_noise, seed=seed)
    h = _head_classes(head_fraction, c)
    stats = dict(homophily=keys_in.shape[0] / num_und if num_und else float("nan"),
                 avg_degree=2.0 * num_und / n, num_undirected_edges=num_und,
                 head_mass=float(sizes[:h].sum() / n))
    _warn_if_short(stats, avg_degree, homophily)
    _warn_if_not_long_tailed(stats["head_mass"], head_mass, n, c)
    return SyntheticGraph(
        edge_index=torch.from_numpy(edge_index),
        x=torch.from_numpy(x),
        y=torch.from_numpy(y),
        num_classes=c,
        name=f"synthetic_n{n}_c{c}_s{seed}",
        class_sizes_target=sizes,
        params=params,
        stats=stats,
    )
