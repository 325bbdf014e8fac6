"""The engine's per-block softmax step in C (``ops/_block_exp.c``): its exp against float64,
the kernel against the torch path it replaces (``reference_step``) on ragged shapes, ties,
duplicates and wide logits, thread splits bit for bit, the OpenMP build's fallbacks, and the
whole loss through both paths against the float64 reference."""
from __future__ import annotations

import ctypes
import math
import os

import numpy as np
import pytest
import torch

import hiertail_fast.ops._block_exp as block_mod
import hiertail_fast.ops._native as native_mod
from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss
from hiertail_fast.ops._lse_torch import exp_cutoff
from hiertail_fast.reference import balanced_contrastive_loss_ref as ref
from tests.conftest import built_kernel


def _kernel():
    return built_kernel(block_mod.kernel(), "the block kernel")


def test_exp_within_one_and_a_half_ulp():
    """The kernel's vectorisable exp on its domain [-C, 0] (and down to -87) against float64."""
    _kernel()
    lib = native_mod.load("_block_exp", openmp=True)
    fn = lib.hiertail_exp_f32
    fn.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = None
    rng = np.random.default_rng(0)
    a = np.concatenate([np.linspace(-87.0, 0.0, 1_000_001), rng.uniform(-1e-3, 0.0, 100_000),
                        rng.uniform(-exp_cutoff(torch.float32), 0.0, 200_000), [0.0, -0.0]])
    a = a.astype(np.float32)
    out = np.empty_like(a)
    fn(a.size, a.ctypes.data, out.ctypes.data)
    exact = np.exp(a.astype(np.float64))
    ulp = np.spacing(exact.astype(np.float32)).astype(np.float64)
    err = np.abs(out.astype(np.float64) - exact) / ulp
    assert float(err.max()) <= 1.5, float(err.max())
    assert out[-1] == 1.0 and out[-2] == 1.0                  # exp(0) exactly 1 (the row max)


def _block(kind: str, rows: int, cols: int, gen) -> torch.Tensor:
    s = torch.randn(rows, cols, generator=gen)
    if kind == "wide":                      # |s| to ~1e4: most entries below the cut-off
        s = s * 3000.0
    elif kind == "ties":                    # the max repeated, at the end too, whole equal rows
        s = torch.randint(-3, 2, (rows, cols), generator=gen).float()
        s[0] = 1.0
        if rows > 1:
            s[1, -1] = 7.0
        if rows > 2 and cols > 1:
            s[2, :] = -5.0
            s[2, cols // 2] = 2.0
            s[2, -1] = 2.0
    elif kind == "dups":                    # duplicated columns
        s = torch.cat([s, s], dim=1)[:, :cols]
    elif kind == "cutoff":                  # entries right at the cut-off boundary
        c = exp_cutoff(torch.float32)
        # (-c + 5e-5: inside the 1e-4 margin of the zeros' threshold e^-c * 1.0001)
        s = torch.tensor([0.0, -c, -c + 1e-3, -c - 1e-3, -c * 1.5, -1e-30, -c + 5e-5])
        s = s[None].repeat(rows, 1)
        s = s[:, :cols] if cols <= s.shape[1] else torch.cat(
            [s, torch.zeros(rows, cols - s.shape[1])], 1)
    return s


@pytest.mark.parametrize("kind", ["randn", "wide", "ties", "dups", "cutoff"])
@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 2), (7, 63), (5, 64), (9, 65), (40, 1000),
                                       (33, 6001)])
@pytest.mark.parametrize("levels", [1, 3])
@pytest.mark.parametrize("need_arg", [True, False])
@pytest.mark.parametrize("scale", [1.0, 0.1, 37.5])
def test_kernel_matches_the_torch_path(kind, rows, cols, levels, need_arg, scale):
    """Logits scale * e (fp32 products, as torch's), their row max exactly, the FIRST arg-max
    exactly (torch.max's rule, also where the scale's rounding makes two values tie), exp
    within 2 ulp with the same exact zeros below the cut-off, and the level sums within float32
    accumulation of the float64 sums of the torch path's exps."""
    fn = _kernel()
    gen = torch.Generator().manual_seed(rows * 7919 + cols)
    s = _block(kind, rows, cols, gen)
    w = torch.rand(levels, cols, generator=gen) + 0.01
    e_ref, e_nat = s.clone(), s.clone()
    m_ref, a_ref, _ = block_mod.reference_step(e_ref, w, need_arg, scale=scale)
    m_nat, a_nat, sums = block_mod.native_step(fn, e_nat, w, need_arg, scale=scale)
    scaled = s * scale
    assert torch.equal(m_nat, m_ref)
    assert torch.equal(m_nat, scaled.max(dim=1).values)
    if need_arg:
        assert torch.equal(a_nat, a_ref)
        assert torch.equal(a_nat, scaled.max(dim=1).indices)
    else:
        assert a_nat is None
    assert torch.equal(e_nat == 0, e_ref == 0)
    torch.testing.assert_close(e_nat, e_ref, rtol=2.5e-7, atol=0.0)
    want = (w.double() @ e_ref.double().t())
    assert sums.dtype == torch.float64 and sums.shape == (levels, rows)
    torch.testing.assert_close(sums, want, rtol=5e-7, atol=0.0)


@pytest.mark.parametrize("levels", [1, 2])
def test_level_sums_of_a_wide_row_are_summed_in_float64(levels):
    """The level sums are float64 accumulations: rows of 2^20 keys whose exps are all 1 with
    weights 1/3 against the float64 sum of the weights. A float accumulator is 3.9e-4 off there
    but passed every test, whose rows were at most 6,001 keys wide (a mutation audit)."""
    fn = _kernel()
    n = 1 << 20
    w = torch.full((levels, n), 1.0 / 3.0)
    _, _, sums = block_mod.native_step(fn, torch.zeros(2, n), w, False)
    want = w.double().sum(1, keepdim=True).expand(levels, 2)
    torch.testing.assert_close(sums, want, rtol=1e-9, atol=0.0)


def test_strided_rows_and_the_rest_of_the_buffer():
    """A block that is the first rows of a bigger buffer with a row stride beyond its width:
    only the block's columns are read and written."""
    fn = _kernel()
    gen = torch.Generator().manual_seed(3)
    buf = torch.randn(20, 50, generator=gen)
    keep = buf.clone()
    e = buf[:12, :31]
    w = torch.rand(2, 31, generator=gen)
    want = e.clone()
    m_ref, a_ref, s_ref = block_mod.reference_step(want, w, True)
    m, a, sums = block_mod.native_step(fn, e, w, True)
    assert torch.equal(m, m_ref) and torch.equal(a, a_ref)
    torch.testing.assert_close(e, want, rtol=2.5e-7, atol=0.0)
    assert torch.equal(buf[:12, 31:], keep[:12, 31:]) and torch.equal(buf[12:], keep[12:])
    torch.testing.assert_close(sums.float(), s_ref, rtol=1e-5, atol=0.0)
    wt = torch.rand(31, 2, generator=gen).t()                   # weights with column stride 2
    _, _, sums_t = block_mod.native_step(fn, buf[:12, :31].clone(), wt, False)
    _, _, ref_t = block_mod.reference_step(buf[:12, :31].clone(), wt, False)
    torch.testing.assert_close(sums_t.float(), ref_t, rtol=1e-5, atol=0.0)


def test_a_nan_row_gets_an_arg_max_in_range():
    """NaN rows (the public losses refuse NaN inputs; the kernels' own contract): with key ids
    the documented fallback ids[0] on both paths, without them a column of the row. A second
    mutation audit returned INT64_MAX, int32's max or N, ids no key has."""
    fn = _kernel()
    e = torch.full((1, 3), float("nan"))
    w, ids = torch.ones(1, 3), torch.tensor([4, 9, 6])
    assert block_mod.native_step(fn, e.clone(), w, True, ids)[1].tolist() == [4]
    assert block_mod.reference_step(e.clone(), w, True, ids)[1].tolist() == [4]
    for step in (lambda x: block_mod.native_step(fn, x, w, True),
                 lambda x: block_mod.reference_step(x, w, True)):
        assert 0 <= step(e.clone())[1].item() < 3


def test_bad_arguments_are_refused():
    fn = _kernel()
    with pytest.raises(TypeError, match="float32"):
        block_mod.native_step(fn, torch.zeros(2, 3, dtype=torch.float64), torch.ones(1, 3), True)
    with pytest.raises(ValueError, match="do not match"):
        block_mod.native_step(fn, torch.zeros(2, 3), torch.ones(1, 4), True)
    with pytest.raises(ValueError, match="unit column stride"):
        block_mod.native_step(fn, torch.zeros(3, 2).t(), torch.ones(1, 3), True)
    with pytest.raises(ValueError, match="at least one column"):
        block_mod.native_step(fn, torch.zeros(2, 0), torch.ones(1, 0), True)


@pytest.mark.parametrize("threads", [2, 3])
def test_rows_split_over_threads_bit_for_bit(threads):
    """A block big enough to run on torch's OpenMP threads gives the same bits as one thread."""
    fn = _kernel()
    threaded = native_mod.load("_block_exp", openmp=True).threaded
    if os.environ.get("CI"):
        assert threaded, "the OpenMP build of the block kernel did not load on the CI machine"
    gen = torch.Generator().manual_seed(5)
    s = torch.randn(256, 700, generator=gen) * 20
    w = torch.rand(3, 700, generator=gen)
    old = torch.get_num_threads()
    outs = {}
    try:
        for t in (1, threads):
            torch.set_num_threads(t)
            e = s.clone()
            m = torch.empty(256)
            a = torch.empty(256, dtype=torch.long)
            sums = torch.empty(3, 256, dtype=torch.float64)
            c = exp_cutoff(torch.float32)
            ran = fn(t, 256, 700, e.data_ptr(), 700, 0.5, c, math.exp(-c) * 1.0001, 3, w.data_ptr(),
                     700, m.data_ptr(), a.data_ptr(), None, sums.data_ptr(), 256)
            assert ran == (t if threaded else 1)
            outs[t] = (e, m, a, sums)
    finally:
        torch.set_num_threads(old)
    for x, y in zip(outs[1], outs[threads], strict=True):
        assert torch.equal(x, y)


def test_no_openmp_runtime_means_the_serial_build(fresh_native, monkeypatch):
    """Without an OpenMP runtime in the process (or when the -fopenmp build fails to build or
    load) the serial build of the same file serves, without a warning, with the same results."""
    _kernel()
    monkeypatch.setattr(native_mod, "_LOADED", {})
    monkeypatch.setenv("HIERTAIL_NATIVE_CACHE", str(fresh_native / "other"))
    monkeypatch.setattr(native_mod, "openmp_runtime", lambda: None)
    lib = native_mod.load("_block_exp", openmp=True)
    assert lib is not None and lib.threaded is False
    assert [p.name for p in (fresh_native / "other").iterdir() if "-omp-" in p.name] == []
    monkeypatch.setattr(native_mod, "_LOADED", {})
    monkeypatch.setattr(native_mod, "openmp_runtime", lambda: "/nonexistent/libgomp.so.1")
    real_build = native_mod._build

    def failing_build(source, cc, openmp=False):
        if openmp:
            raise RuntimeError("no -fopenmp here")
        return real_build(source, cc, openmp)

    monkeypatch.setattr(native_mod, "_build", failing_build)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lib = native_mod.load("_block_exp", openmp=True)
    assert lib is not None and lib.threaded is False
    fn = block_mod.kernel()
    s = torch.randn(300, 200, generator=torch.Generator().manual_seed(9))
    w = torch.rand(1, 200)
    e1, e2 = s.clone(), s.clone()
    one = block_mod.native_step(fn, e1, w, True)
    two = block_mod.reference_step(e2, w, True)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    torch.testing.assert_close(e1, e2, rtol=2.5e-7, atol=0.0)


def test_openmp_runtime_is_torchs():
    """Where torch runs on OpenMP, the runtime the kernels bind to is the one it loaded."""
    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("this torch does not use OpenMP")
    path = native_mod.openmp_runtime()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("no OpenMP runtime found in a torch process on the CI machine")
        pytest.skip("no /proc/self/maps here")
    assert os.path.basename(path).startswith(native_mod._RUNTIME_NAMES)


@pytest.fixture(params=["native", "torch"])
def engine_path(request, monkeypatch):
    """"native": the C kernels (must build in CI); "torch": switched off (HIERTAIL_NATIVE=0)."""
    monkeypatch.setattr(native_mod, "_LOADED", {})
    if request.param == "torch":
        monkeypatch.setenv("HIERTAIL_NATIVE", "0")
    else:
        monkeypatch.delenv("HIERTAIL_NATIVE", raising=False)
        _kernel()
    return request.param


@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("regime", ["relu", "wide"])
@pytest.mark.parametrize("levels", [1, 3])
def test_loss_through_both_paths_matches_the_reference(engine_path, variant, regime, levels):
    """The fp32 loss and gradient through the engine (blocks of 8 rows: many blocks, ragged
    last one) on either path against the float64 reference, 1 and 3 levels, wide logits
    (|s| to ~1e3) included."""
    gen = torch.Generator().manual_seed(21)
    n, d = 203, 16
    z = torch.randn(n, d, generator=gen)
    z = torch.relu(z) / d ** 0.5 if regime == "relu" else z * 2.5
    y = torch.randint(0, 9, (n,), generator=gen)
    labels = [y, y // 2, y // 3][:levels]
    protos = [torch.randn(int(lab.max()) + 1, d, generator=gen) for lab in labels]
    tau = 0.1
    os.environ["HIERTAIL_CPU_BLOCK_BYTES"] = str(8 * 4 * (n + 20))
    try:
        zz = z.clone().requires_grad_()
        if levels == 1:
            got = balanced_contrastive_loss(zz, y, prototypes=protos[0], temperature=tau,
                                            variant=variant, backend="torch")
        else:
            got = hierarchical_contrastive_loss(zz, labels, protos, temperature=tau,
                                                variant=variant, backend="torch")
        got.backward()
    finally:
        del os.environ["HIERTAIL_CPU_BLOCK_BYTES"]
    z64 = z.double().requires_grad_()
    want = sum(ref(z64, lab, prototypes=p.double(), temperature=tau, variant=variant)
               for lab, p in zip(labels, protos, strict=True))
    want.backward()
    torch.testing.assert_close(got.double(), want.detach(), rtol=2e-5, atol=1e-5)
    torch.testing.assert_close(zz.grad.double(), z64.grad, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("cols", [1, 5, 64, 65, 1000])
def test_arg_max_with_key_ids_is_the_smallest_id_among_the_maxima(cols):
    """Columns not in key order (the official positives sort them by label): with ``ids`` the
    step returns the smallest key id among a row's maxima (the reference's first index in key
    order), in the C kernel and the torch path; the column order's first was another key."""
    fn = _kernel()
    gen = torch.Generator().manual_seed(cols)
    s = torch.randint(-3, 2, (37, cols), generator=gen).float()   # many exact ties
    ids = torch.randperm(cols, generator=gen)
    w = torch.rand(2, cols, generator=gen) + 0.01
    e_ref, e_nat = s.clone(), s.clone()
    m_ref, a_ref, _ = block_mod.reference_step(e_ref, w, True, ids)
    m_nat, a_nat, _ = block_mod.native_step(fn, e_nat, w, True, ids)
    want = torch.where(s == s.max(dim=1, keepdim=True).values, ids, cols).min(dim=1).values
    assert torch.equal(m_nat, m_ref) and torch.equal(a_ref, want) and torch.equal(a_nat, want)
    assert torch.equal(e_nat == 0, e_ref == 0)
    with pytest.raises(ValueError, match="ids must be int64"):
        block_mod.native_step(fn, s.clone(), w, True, ids.int())
