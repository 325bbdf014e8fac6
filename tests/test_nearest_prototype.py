"""Nearest-prototype assignment: reference vs sklearn, every backend vs the reference."""
from __future__ import annotations

import pytest
import torch

from hiertail_fast.ops.nearest_prototype import nearest_prototype
from hiertail_fast.reference.nearest_prototype import nearest_prototype_ref
from tests.conftest import backend_device, built_kernel, requires_triton, triton_importable

try:
    from sklearn.metrics import pairwise_distances_argmin
except ImportError:  # pragma: no cover - scikit-learn is in the [test] extra
    pairwise_distances_argmin = None

requires_sklearn = pytest.mark.skipif(pairwise_distances_argmin is None,
                                      reason="scikit-learn not installed")


def test_reference_hand_computed_and_ties():
    z = torch.tensor([[0.0, 0.0], [2.0, 0.0], [1.0, 0.0], [5.0, 5.0]])
    p = torch.tensor([[0.0, 1.0], [0.0, -1.0], [2.0, 0.0]])
    # row 0: equidistant to p0, p1 -> lowest index 0; row 2: ‖·‖² = 2, 2, 1 -> 2
    assert nearest_prototype_ref(z, p).tolist() == [0, 2, 2, 2]
    assert nearest_prototype_ref(z, p[:1]).tolist() == [0, 0, 0, 0]
    assert nearest_prototype_ref(z[:0], p).shape == (0,)


@requires_sklearn
@pytest.mark.parametrize("n,m,d,dtype", [(200, 17, 8, torch.float32), (57, 3, 33, torch.float64),
                                         (300, 120, 64, torch.float32)])
def test_reference_equals_sklearn(n, m, d, dtype):
    z = torch.randn(n, d, dtype=dtype)
    p = torch.randn(m, d, dtype=dtype)
    expected = pairwise_distances_argmin(z.numpy(), p.numpy())
    assert nearest_prototype_ref(z, p).tolist() == expected.tolist()


@pytest.mark.parametrize("bad", ["dim", "d", "dtype", "nan", "empty", "int"])
def test_reference_bad_inputs(bad):
    z, p = torch.randn(5, 3), torch.randn(2, 3)
    if bad == "dim":
        z = z.view(-1)
    elif bad == "d":
        p = torch.randn(2, 4)
    elif bad == "dtype":
        p = p.double()
    elif bad == "nan":
        z[1, 1] = float("nan")
    elif bad == "empty":
        p = p[:0]
    elif bad == "int":
        z = z.long()
    with pytest.raises((ValueError, TypeError)):
        nearest_prototype_ref(z, p)


# ---------------------------------------------------------------- backends
BACKENDS = ["torch", pytest.param("triton", marks=requires_triton)]


def _run(z, p, backend):
    """nearest_prototype on the backend's device (CUDA for triton on a GPU machine), on CPU."""
    dev = backend_device(backend)
    return nearest_prototype(z.to(dev), p.to(dev), backend=backend).cpu()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n,m,d,dtype", [(1, 1, 3, torch.float32), (77, 5, 19, torch.float32),
                                         (130, 70, 33, torch.float64),
                                         (200, 65, 64, torch.float32)])
def test_backend_equals_reference(backend, n, m, d, dtype):
    z = torch.randn(n, d, dtype=dtype) * 3 + 1
    p = torch.randn(m, d, dtype=dtype) * 3
    z0, p0 = z.clone(), p.clone()
    out = _run(z, p, backend)
    assert out.dtype == torch.long
    assert torch.equal(out, nearest_prototype_ref(z, p))
    assert torch.equal(z, z0) and torch.equal(p, p0)


@pytest.mark.parametrize("backend", ["reference"] + BACKENDS)
@pytest.mark.parametrize("n,m", [(6, 2), (0, 3), (4, 1)])
def test_zero_features_every_row_takes_prototype_0(backend, n, m):
    # d = 0: every distance is 0, an m-way tie -> index 0 (the fast backends' tie refinement
    # called torch.unique(dim=0) on [k, 0] rows and raised, found by an API audit)
    out = _run(torch.zeros(n, 0), torch.zeros(m, 0), backend)
    assert out.dtype == torch.long and out.tolist() == [0] * n


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_backend_ties_and_near_ties(backend, dtype):
    # exact ties (integer coordinates: every formula exact) -> lowest index, also across tiles
    g = torch.Generator().manual_seed(3)
    p = torch.randint(-3, 4, (90, 6), generator=g).to(dtype)
    p = torch.cat([p, p[:20]])  # duplicates at indices >= 90 must never win
    z = torch.randint(-3, 4, (150, 6), generator=g).to(dtype)
    out = _run(z, p, backend)
    assert torch.equal(out, nearest_prototype_ref(z, p))
    assert int(out.max()) < 90
    # near-ties far below the expanded formula's rounding, at a large offset (cancellation)
    base = torch.randn(40, 16, dtype=dtype) + 1000.0
    eps = torch.finfo(dtype).eps
    q = torch.stack([base[0] + 1.0, base[0] - 1.0 + 4 * eps * 1000, base[0] + 3.0])
    zz = base[:1].repeat(5, 1)
    assert torch.equal(_run(zz, q, backend), nearest_prototype_ref(zz, q))


@pytest.mark.parametrize("backend", ["reference"] + BACKENDS)
def test_column_major_inputs_tie_as_row_major(backend):
    # rows equal to duplicated prototypes (exact ties in exact arithmetic, random values that
    # round), given column-major (transposed views): the lowest-index rule must not depend on
    # the layout (a fuzzing find: the reference's broadcast difference kept the column-major
    # layout, its sums ran across rows and rounded by position, breaking ties by position)
    dev = backend_device(backend)
    for seed in range(30):
        g = torch.Generator().manual_seed(seed)
        p = torch.randn(4, 5, generator=g)[torch.randint(0, 4, (9,), generator=g)]
        z = torch.randn(37, 5, generator=g)
        z[::3] = p[torch.randint(0, 9, (13,), generator=g)]
        want = nearest_prototype_ref(z, p)
        zc, pc = (t.to(dev).t().contiguous().t() for t in (z, p))
        assert not zc.is_contiguous()
        assert torch.equal(nearest_prototype(zc, pc, backend=backend).cpu(), want)


@requires_sklearn
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_equals_sklearn(backend):
    z, p = torch.randn(250, 24), torch.randn(40, 24)
    expected = pairwise_distances_argmin(z.numpy(), p.numpy())
    assert _run(z, p, backend).tolist() == expected.tolist()


def test_default_dispatch_no_grad_and_16bit():
    z = torch.randn(50, 8, requires_grad=True)
    p = torch.randn(7, 8, requires_grad=True)
    out = nearest_prototype(z, p)
    assert not out.requires_grad and torch.equal(out, nearest_prototype_ref(z, p))
    zh, ph = z.detach().bfloat16(), p.detach().bfloat16()
    assert torch.equal(nearest_prototype(zh, ph, backend="torch"), nearest_prototype_ref(zh, ph))
    with pytest.raises(ValueError):
        nearest_prototype(z, p, backend="nope")


@pytest.mark.parametrize("m_tile", [1, 7, 109])
def test_torch_tiles_and_row_blocks(monkeypatch, m_tile):
    """Small prototype tiles and row blocks (109 of 110 prototypes leaves a last tile of width
    1), with exact ties across tile borders: the merge of per-tile best/second-best must give
    the reference argmin, lowest index first."""
    import hiertail_fast.ops.nearest_prototype as npmod

    monkeypatch.setattr(npmod, "_M_TILE", m_tile)
    monkeypatch.setattr(npmod, "_BLOCK_ELEMENTS", 64 * m_tile)  # 64-row blocks
    g = torch.Generator().manual_seed(5)
    p = torch.randint(-3, 4, (90, 6), generator=g).float()
    p = torch.cat([p, p[:20]])  # 110 prototypes, the duplicates (>= 90) must never win
    z = torch.randint(-3, 4, (150, 6), generator=g).float()
    out = nearest_prototype(z, p, backend="torch")
    assert torch.equal(out, nearest_prototype_ref(z, p))
    assert int(out.max()) < 90
    z = torch.randn(150, 6, generator=g)
    assert torch.equal(nearest_prototype(z, p, backend="torch"), nearest_prototype_ref(z, p))


# ------------------------------------------------------------------ the CPU best-two kernel
def _best_two_kernel(dtype):
    import hiertail_fast.ops._nearest_rows as rows_mod

    return rows_mod, built_kernel(rows_mod.kernel(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_best_two_kernel_equals_topk(dtype, threads):
    """The C kernel against the eager topk(2) step: best and second-best values bit for bit,
    arg the FIRST index of the minimum (torch.argmin's rule), on random rows, rows with exact
    duplicates of their minimum (second == best), widths 1, 2, 3, 63-65 (the 64-wide search
    chunks) and a strided block (a column slice of a wider one), on 1 and 2 threads."""
    rows_mod, fn = _best_two_kernel(dtype)
    g = torch.Generator().manual_seed(11)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for m in (1, 2, 3, 63, 64, 65, 282, 700):
            d = torch.randn(300, m, generator=g, dtype=dtype) * 100
            d[::4] = torch.randint(-2, 3, (75, m), generator=g).to(dtype)   # exact ties
            d[1::7, -1] = d[1::7].min(dim=1).values                          # min again, last
            for block in (d, torch.randn(300, m + 9, generator=g, dtype=dtype)[:, 4:4 + m]):
                best, arg, second = rows_mod.native_step(fn, block)
                want_best, _, want_second = rows_mod.reference_step(block)
                assert torch.equal(best, want_best) and torch.equal(second, want_second)
                assert torch.equal(arg, block.argmin(dim=1))
                assert torch.equal(block.gather(1, arg[:, None])[:, 0], best)
    finally:
        torch.set_num_threads(old)


def test_best_two_kernel_rejects_what_it_cannot_read():
    rows_mod, fn = _best_two_kernel(torch.float32)
    # (one strided row too: an expanded [1, 64] row was read past its storage, ASan's find in
    # a sanitizer audit, and a step-2 row gave the wrong minimum)
    for bad in (torch.zeros(4, 0), torch.zeros(5, 4).t(), torch.zeros(4, 5, dtype=torch.int32),
                torch.tensor([2.0]).expand(1, 64), torch.arange(8.0)[None, ::2],
                torch.arange(4.0)[None, ::2]):          # two strided columns too
        with pytest.raises(ValueError, match="best-two kernel"):
            rows_mod.native_step(fn, bad)
    assert rows_mod.kernel(torch.float16) is None
    best, arg, second = rows_mod.native_step(fn, torch.zeros(0, 3))
    assert best.numel() == arg.numel() == second.numel() == 0


@pytest.mark.parametrize("path", ["native", "eager"])
def test_torch_backend_with_and_without_the_kernel(monkeypatch, path):
    """The op's torch backend on the C kernel and on its eager fallback (no compiler, or
    HIERTAIL_NATIVE=0): exact ties across tiles and near-ties give the reference argmin."""
    import hiertail_fast.ops._nearest_rows as rows_mod
    import hiertail_fast.ops.nearest_prototype as npmod

    if path == "eager":
        monkeypatch.setattr(rows_mod, "kernel", lambda dtype: None)
    else:
        _best_two_kernel(torch.float32)
    monkeypatch.setattr(npmod, "_M_TILE", 37)
    g = torch.Generator().manual_seed(9)
    for dtype in (torch.float32, torch.float64):
        p = torch.randint(-3, 4, (90, 6), generator=g).to(dtype)
        p = torch.cat([p, p[:20]])  # duplicates (>= 90) must never win
        z = torch.randint(-3, 4, (400, 6), generator=g).to(dtype)
        out = nearest_prototype(z, p, backend="torch")
        assert torch.equal(out, nearest_prototype_ref(z, p)) and int(out.max()) < 90
        z = torch.randn(400, 6, generator=g, dtype=dtype)
        assert torch.equal(nearest_prototype(z, p, backend="torch"), nearest_prototype_ref(z, p))


def _reflection_case(gen, d, m, first, second):
    """One row z (|z| ~ 1e3) and m float32 prototypes: ``first`` = z + δ and ``second`` =
    z − δ (|δ| ~ 1: the same distance to z up to rounding, far below the rounding of the
    expanded form ‖p‖² − 2z·p), the others far away (1e5 ± 1e4)."""
    z = torch.randn(1, d, generator=gen) * 1000
    delta = torch.randn(d, generator=gen)
    p = torch.randn(m, d, generator=gen) * 1e4 + 1e5
    p[first], p[second] = z[0] + delta, z[0] - delta
    return z, p


@pytest.mark.parametrize("backend", BACKENDS)
def test_reflection_pairs_in_different_prototype_tiles(monkeypatch, backend):
    """The two near-equal candidates in different prototype tiles (torch: tiles of 8, the
    pair in the first and the ninth; Triton: its 32/64-wide tiles, the pair at 0 and 64): the
    merge of a later tile must keep the earlier tile's best as the second-best, else the gap
    looks wide, the near-tie re-decision is skipped and the expanded form's argmin stands (a
    mutation audit: no test had a near-tie across tiles)."""
    import hiertail_fast.ops.nearest_prototype as npmod

    monkeypatch.setattr(npmod, "_M_TILE", 8)
    gen = torch.Generator().manual_seed(21)
    for _ in range(40):
        z, p = _reflection_case(gen, 4, 65, 0, 64)
        assert _run(z, p, backend).tolist() == nearest_prototype_ref(z, p).tolist()


@pytest.mark.parametrize("d", [2, 3])
def test_reflection_pairs_at_the_near_tie_bound(d):
    """Many reflection pairs alone: the gap of their expanded values is rounding only, and
    about 1 % of them land between an eighth of the rounding bound (``_tie_bound``) and the
    bound itself, so a bound taken too small keeps a wrong winner (a mutation audit: an 8x
    smaller bound passed every test). The re-decision is the same code for every backend."""
    gen = torch.Generator().manual_seed(d)
    for _ in range(2500):
        z, p = _reflection_case(gen, d, 2, 0, 1)
        assert nearest_prototype(z, p, backend="torch").tolist() == \
            nearest_prototype_ref(z, p).tolist()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("budget", [None, 64])
def test_degenerate_inputs_every_pair_a_near_tie(monkeypatch, backend, budget):
    """All-zero rows and prototypes (dead ReLUs), groups of equal prototypes, prototypes far
    below the rows' scale (every pair within the rounding bound) and equal rows: the near-tie
    refinement, on distinct rows only and in bounded chunks (``budget``: 64-element blocks, so
    many row and pair chunks), gives the reference argmin, lowest index first."""
    import hiertail_fast.ops.nearest_prototype as npmod

    if budget is not None:
        monkeypatch.setattr(npmod, "_BLOCK_ELEMENTS", budget)
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(13)
    zeros = torch.zeros(500, 16), torch.zeros(40, 16)
    groups = torch.randn(5, 16, generator=g)[torch.randint(0, 5, (60,), generator=g)]
    rows = torch.randn(30, 16, generator=g)[torch.randint(0, 30, (400,), generator=g)]
    tiny = torch.randn(50, 16, generator=g) * 1e-12
    near = torch.rand(300, 16, generator=g) * 1e-2
    for z, p in (zeros, (rows, groups), (groups[:45], groups), (near, tiny),
                 (torch.cat([near, near]), torch.cat([tiny, tiny]))):
        want = nearest_prototype_ref(z, p)
        got = nearest_prototype(z.to(dev), p.to(dev), backend=backend).cpu()
        assert torch.equal(got, want)
    assert int(nearest_prototype(zeros[0].to(dev), zeros[1].to(dev), backend=backend).max()) == 0


@requires_triton
@pytest.mark.parametrize("dtype, block_m", [(torch.float32, 64), (torch.float64, 32)])
def test_triton_kernel_keeps_the_lower_index_on_a_tie_across_tiles(dtype, block_m):
    """The kernel itself (not the public op, whose near-tie refinement re-decides exact ties and
    hid it: a mutation audit) keeps the LOWEST index when an equal prototype sits in a later
    tile of ``block_m`` prototypes (the launcher's tile for the dtype), and shows the tie as
    best == second."""
    from hiertail_fast.kernels.nearest_prototype import nearest_prototype_fwd

    dev, gen = backend_device("triton"), torch.Generator().manual_seed(0)
    p = torch.randn(2 * block_m + 5, 8, generator=gen, dtype=dtype) * 5 + 20   # all far from z
    z = torch.randn(3, 8, generator=gen, dtype=dtype)
    p[3] = z[0] * 0.5
    p[block_m + 3] = p[3]                                  # the same point, in the next tile
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    idx, best, second = nearest_prototype_fwd(z.to(dev), p.to(dev), (p.to(acc) ** 2).sum(1).to(dev))
    assert int(idx[0]) == 3 and float(best[0]) == float(second[0])


def test_first_of_equal_rows():
    from hiertail_fast.ops.nearest_prototype import _first_of_equal_rows

    p = torch.tensor([[1.0, 2.0], [0.0, -0.0], [1.0, 2.0], [-0.0, 0.0], [3.0, 1.0], [1.0, 2.0]])
    assert _first_of_equal_rows(p).tolist() == [0, 1, 4]
    assert _first_of_equal_rows(torch.eye(3)) is None


@pytest.mark.parametrize("backend", ["reference"] + BACKENDS)
@pytest.mark.parametrize("dtype,tiny", [(torch.float32, 1e-40), (torch.float64, 1e-310)])
def test_subnormal_inputs_rescale_within_range(backend, dtype, tiny):
    """pow2_rescale's scale 2^-e lies beyond the dtype's range for subnormal inputs: float32
    entries of 1e-40 became inf / NaN (every backend answered [0, 0]); float64 ones of 1e-310
    overflowed the Python float (an extremes audit). The scale is applied in two halves."""
    dev = backend_device(backend)
    z = torch.tensor([[tiny, 0.0], [0.0, tiny], [tiny, tiny / 2]], dtype=dtype, device=dev)
    p = torch.tensor([[0.0, tiny], [tiny, 0.0]], dtype=dtype, device=dev)
    scale = 2.0 ** (500 if dtype == torch.float64 else 60)     # (exact, twice: squares of
    zs, ps = (t.double() * scale * scale for t in (z, p))     # 1e-310 underflow in float64)
    oracle = ((zs[:, None] - ps[None]) ** 2).sum(-1).argmin(1)
    assert oracle.tolist() == [1, 0, 1]
    assert torch.equal(nearest_prototype(z, p, backend=backend), oracle)


@pytest.mark.parametrize("backend", ["reference"] + BACKENDS)
@pytest.mark.parametrize("dtype,exponent", [(torch.float32, 64), (torch.float64, 512)])
def test_large_inputs_at_the_edge_of_the_rescale(backend, dtype, exponent):
    """Entries with max|entry| in [2^(E-1), 2^E), E half the dtype's largest exponent: their
    squares fit, but ‖z‖² + ‖p‖² - 2z·p of d = 4 such entries does not, so they must be
    rescaled (pow2_rescale leaves alone only max|entry| <= 2^(E/2)); a threshold of 2^E passed
    every test and gave wrong and out-of-range indices (a mutation audit)."""
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(exponent)
    top = 0.95 * 2.0 ** exponent
    z = ((torch.rand(6, 4, generator=g, dtype=torch.float64) * 2 - 1) * top).to(dtype)
    p = ((torch.rand(5, 4, generator=g, dtype=torch.float64) * 2 - 1) * top).to(dtype)
    zs, ps = (t.double() * 2.0 ** -(exponent - 8) for t in (z, p))  # exact, no overflow
    oracle = ((zs[:, None] - ps[None]) ** 2).sum(-1).argmin(1)
    got = nearest_prototype(z.to(dev), p.to(dev), backend=backend).cpu()
    assert torch.equal(got, oracle)
    # direct differences of 2·top: their squares overflow unless rescaled (the reference's
    # form); prototype 1 is the nearer one
    z = torch.tensor([[top, 0.0, 0.0, 0.0]], dtype=dtype, device=dev)
    p = torch.tensor([[-top, top / 4, 0.0, 0.0], [-top, 0.0, 0.0, 0.0]], dtype=dtype, device=dev)
    assert nearest_prototype(z, p, backend=backend).tolist() == [1]


@pytest.mark.parametrize("backend", ["reference"] + BACKENDS)
def test_16bit_inputs_are_rescaled_in_float32(backend):
    """The fast backends rescaled float16 inputs in float16 (its range gave a rescale from
    max|entry| 16 on) before their float32 distances: 0.0025 became a subnormal and the
    nearest prototype flipped (the reference casts first; an extremes audit)."""
    dev = backend_device(backend)
    z = torch.tensor([[30000.0, 0.0025]], dtype=torch.float16, device=dev)
    p = torch.tensor([[30000.0, 0.0], [30000.0, 0.0043]], dtype=torch.float16, device=dev)
    oracle = ((z.double()[:, None] - p.double()[None]) ** 2).sum(-1).argmin(1)
    assert oracle.tolist() == [1]
    assert torch.equal(nearest_prototype(z, p, backend=backend), oracle)


def _exact_distances(z, p):
    """[N][m] exact squared distances (rational arithmetic on the inputs' values): an oracle
    independent of any floating-point summation."""
    from fractions import Fraction

    zf, pf = ([[Fraction(v) for v in row] for row in t.double().tolist()] for t in (z, p))
    return [[sum((a - b) ** 2 for a, b in zip(row, proto, strict=True)) for proto in pf]
            for row in zf]


def _exact_argmin(z, p):
    """The argmin of the exact squared distances, lowest index on ties."""
    return [dist.index(min(dist)) for dist in _exact_distances(z, p)]


@pytest.mark.parametrize("backend", ["reference"] + BACKENDS)
@pytest.mark.parametrize("dtype,row_scale,spread", [(torch.float32, 30.0, 1e-6),
                                                    (torch.bfloat16, 30.0, 1e-6),
                                                    (torch.float16, 3000.0, 1e-4)])
def test_rows_far_from_a_tight_cluster_get_the_exact_nearest(backend, dtype, row_scale, spread):
    """Rows far from a tight cluster of prototypes: their distances differ below float32's
    resolution, and float32 direct distances (the reference and the re-decision before
    2026-12-03) "tied" them all and answered the cluster's lowest index whatever the row's
    direction. Float64 direct distances give the exact argmin (checked in rational
    arithmetic)."""
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(7)
    z = (torch.randn(40, 6, generator=g) * row_scale).to(dtype)
    p = (torch.randn(12, 6, generator=g) * spread).to(dtype)
    exact = _exact_argmin(z, p)
    # the case is a hard one: float32 direct distances get rows wrong
    zf, pf = z.float(), p.float()
    in_float32 = ((zf[:, None] - pf[None]) ** 2).sum(-1).argmin(1).tolist()
    assert sum(a != b for a, b in zip(in_float32, exact, strict=True)) >= 10
    assert nearest_prototype(z.to(dev), p.to(dev), backend=backend).cpu().tolist() == exact


@pytest.mark.parametrize("backend", ["reference"] + BACKENDS)
def test_an_entry_the_rescale_flushes_still_decides(backend):
    """float32 entries of 1e30 make the fast path rescale by 2^-100 for its expanded form, which
    flushes an entry of 1e-30 to zero; the re-decision reads the inputs as given, so that entry
    still separates the two prototypes (exact squared distances 1e-60 and 0)."""
    dev = backend_device(backend)
    z = torch.tensor([[1e30, 1e-30], [1e30, 0.0]], device=dev)
    p = torch.tensor([[1e30, 0.0], [1e30, 1e-30]], device=dev)
    assert _exact_argmin(z.cpu(), p.cpu()) == [1, 0]
    assert nearest_prototype(z, p, backend=backend).cpu().tolist() == [1, 0]


def _hard_case(kind, gen, n, m, d):
    """Small inputs of the kinds where the float32 formulas lose the ranking: rows far from a
    tight cluster, a large common offset, duplicated prototypes (exact ties), integer grids
    (exact ties), per-column scales from 1e-20 to 1e20, and tiny magnitudes."""
    def scale(lo, hi):
        return 10.0 ** (torch.rand((), generator=gen).item() * (hi - lo) + lo)
    if kind == "far":
        return torch.randn(n, d, generator=gen) * scale(0, 6), \
            torch.randn(m, d, generator=gen) * scale(-6, 0)
    if kind == "offset":
        c = torch.randn(1, d, generator=gen) * scale(0, 6)
        return c + torch.randn(n, d, generator=gen), \
            c + torch.randn(m, d, generator=gen) * scale(-3, 0)
    if kind == "duplicates":
        p = torch.randn(max(1, m // 2), d, generator=gen)
        p = p[torch.randint(0, p.shape[0], (m,), generator=gen)]
        return torch.cat([p, torch.randn(n, d, generator=gen)])[:n], p
    if kind == "grid":
        return (torch.randint(-3, 4, (k, d), generator=gen).float() for k in (n, m))
    if kind == "columns":
        cols = torch.tensor([scale(-20, 20) for _ in range(d)])
        return torch.randn(n, d, generator=gen) * cols, torch.randn(m, d, generator=gen) * cols
    return torch.randn(n, d, generator=gen) * 1e-30, torch.randn(m, d, generator=gen) * 1e-30


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_hard_cases_against_rational_arithmetic(dtype):
    """Every backend gives the reference's answer, and that answer's exact distance (rational
    arithmetic) is the exact minimum, or within 1e-12 of it relative (where float64 direct
    distances cannot tell two apart: per-column scales 1e±20); exact ties go to the lowest
    index. A fuzz of 27,968 such cases (2026-12-03) found no other difference."""
    from fractions import Fraction

    backends = ["torch"] + (["triton"] if triton_importable() else [])
    gen = torch.Generator().manual_seed(int(torch.finfo(dtype).bits))
    kinds = ["far", "offset", "duplicates", "grid", "columns", "tiny"]
    checked = 0
    for case in range(60):
        n, m, d = (int(torch.randint(1, hi, (), generator=gen)) for hi in (10, 8, 6))
        z, p = (t.to(dtype) for t in _hard_case(kinds[case % 6], gen, n, m, d))
        if not (torch.isfinite(z).all() and torch.isfinite(p).all()):
            continue
        want = nearest_prototype_ref(z, p)
        for backend in backends:
            assert torch.equal(_run(z, p, backend), want), (case, backend)
        for i, dist in enumerate(_exact_distances(z, p)):
            best, got = min(dist), dist[int(want[i])]
            if got == best:
                assert int(want[i]) == dist.index(best)      # the lowest index among ties
            else:
                assert (got - best) / best < Fraction(1, 10**12), (case, i)
            checked += 1
    assert checked > 100


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_a_tie_among_rescaled_tiny_rows_takes_the_exact_answer(backend):
    # entries ~1e-30 are rescaled up by a power of two before the near-tie re-decision; its
    # candidates must come from the rescaled rows: from the rows as given every expanded value
    # is ~|p|^2 and the only candidate was p0, the smallest-norm prototype, far from the row
    # (4ad0a84's candidate part, unguarded: a fix-test check, session 68). The exact answer
    # (rational arithmetic): p1, the lower index of the exact tie p1 / p2
    from fractions import Fraction

    z = torch.tensor([[1e-30, 0.0]], dtype=torch.float32)
    p = torch.tensor([[-5e-31, 0.0], [1e-30, 1e-30], [1e-30, -1e-30]], dtype=torch.float32)
    row = [Fraction(v) for v in z[0].double().tolist()]
    dist = [sum((a - Fraction(b)) ** 2 for a, b in zip(row, q, strict=True))
            for q in p.double().tolist()]
    assert dist.index(min(dist)) == 1
    assert nearest_prototype(z, p, backend=backend).tolist() == [1]


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_float16_rows_are_rescaled_in_float32(backend):
    # a large entry elsewhere in z triggers the power-of-two rescale; done in float16 the small
    # entries (~1e-6 -> ~1e-8) became subnormal or zero and row 2's answer flipped, silently
    # (3d46ec1's rescale dtype, unguarded: a fix-test check, session 68; two cases of its fuzz)
    cases = [
        ([[-162.125, 5.0067901611328125e-06], [-5.9604644775390625e-06, -1.3113021850585938e-06],
          [5.066394805908203e-06, -1.1920928955078125e-07]],
         [[3.874301910400391e-06, 1.806020736694336e-05],
          [1.8358230590820312e-05, -9.298324584960938e-06]]),
        ([[0.07830810546875, 0.03369140625], [0.0026988983154296875, 13784.0],
          [-0.11474609375, -0.04705810546875]],
         [[-0.11627197265625, -0.048095703125], [-0.11553955078125, -0.0484619140625]]),
        # squared norms past float16's largest value (65504): the near tie is re-decided in
        # float32, not in float16, where every candidate was inf and the row got index m
        # (the s72 mutation audit, w24)
        ([[256.0]], [[255.625], [256.25]]),
        ([[300.0, 1.0], [-290.0, 2.0]], [[299.5, 1.25], [300.25, 0.75], [-290.5, 2.0]]),
    ]
    for rows, prototypes in cases:
        z = torch.tensor(rows, dtype=torch.float16)
        p = torch.tensor(prototypes, dtype=torch.float16)
        want = ((z.double()[:, None] - p.double()[None]) ** 2).sum(-1).argmin(1)
        assert torch.equal(nearest_prototype(z, p, backend=backend), want)


@pytest.mark.parametrize("backend", ["reference"] + BACKENDS)
def test_rows_near_a_tight_cluster_in_128_dims_are_re_decided(backend):
    """The near-tie bound grows with d: γ = (d + 2)·u. Rows near a tight cluster of
    prototypes in 128 dimensions: the expanded form's rounding exceeds the gaps between the
    distances, and a bound of 2·u left 26 of the 300 rows with a wrong prototype (mutation
    audit, session 69). Float64 direct distances (gaps ~1e-4 on ~128) are the truth here."""
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(1)
    c = torch.randn(128, generator=g) * 30
    p = c + torch.randn(32, 128, generator=g) * 1e-4
    z = c + torch.randn(300, 128, generator=g)
    truth = ((z.double()[:, None] - p.double()[None]) ** 2).sum(-1).argmin(1)
    expanded = ((p * p).sum(1)[None] - 2 * z @ p.T).argmin(1)      # the case is a hard one
    assert int((expanded != truth).sum()) >= 10
    assert torch.equal(nearest_prototype(z.to(dev), p.to(dev), backend=backend).cpu(), truth)


@pytest.mark.parametrize("backend", ["reference"] + BACKENDS)
def test_float64_at_the_ends_of_the_range_is_rescaled_from_both_inputs(backend):
    """float64 rows and prototypes whose squared distances under- or overflow float64: the
    rescale must look at both tensors (prototypes of 1e200 with rows of 1: every distance inf,
    prototype 0 for all) and the near-tie re-decision must read the rescaled values (at 1e-170
    the squares are 0: every candidate tied, prototype 0). Prototype 1 is the nearer in both
    (mutation audit, session 69)."""
    dev = backend_device(backend)
    f64 = dict(dtype=torch.float64, device=dev)
    z = torch.tensor([[1.0, 0.0]], **f64)
    p = torch.tensor([[3e200, 0.0], [-1e200, 0.0]], **f64)
    assert nearest_prototype(z, p, backend=backend).cpu().tolist() == [1]
    z = torch.zeros(1, 2, **f64)
    p = torch.tensor([[1.0 + 4e-16, 0.0], [-1.0, 0.0]], **f64) * 1e-170
    assert nearest_prototype(z, p, backend=backend).cpu().tolist() == [1]
