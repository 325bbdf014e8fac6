"""The C kernels of the CPU engine (``ops/_native.py`` + ``ops/_positive_blocks.c``): the build
(cache, switches, no compiler, failing compiler), the kernel's own log against float64, and the
fused positives kernel against a plain numpy loop on ragged, nested, overlapping key ranges."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hiertail_fast.ops._native as native_mod
import hiertail_fast.ops._positive_blocks as blocks_mod
from hiertail_fast import hierarchical_contrastive_loss
from hiertail_fast.ops._contrastive_pairs import OFFICIAL_EPS
from hiertail_fast.reference import balanced_contrastive_loss_ref as ref
from tests.conftest import built_kernel


def _lib():
    return built_kernel(native_mod.load("_positive_blocks"))


def test_build_is_cached_and_reused(fresh_native, monkeypatch):
    lib = _lib()
    built = list(fresh_native.glob("_positive_blocks-*.so"))
    assert len(built) == 1 and not list(fresh_native.glob("*.tmp"))
    assert native_mod.load("_positive_blocks") is lib              # once per process
    monkeypatch.setattr(native_mod, "_LOADED", {})

    def no_compiler(*a, **k):
        raise AssertionError("compiled again although the cache holds the library")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    assert native_mod.load("_positive_blocks") is not None         # a new process: the cache


def _cache_unwritable(monkeypatch, tmp_path):
    """The build cache made unwritable (a file where its folder would be) and the temp
    directory moved under tmp_path: builds fall back to the temp directory, returned."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("HIERTAIL_NATIVE_CACHE", str(blocker / "cache"))
    monkeypatch.setattr(native_mod.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    return tmp_path / "tmp"


def test_unwritable_cache_falls_back_to_the_temp_dir(fresh_native, monkeypatch, tmp_path):
    temp = _cache_unwritable(monkeypatch, tmp_path)
    temp.mkdir()                                 # (a temp directory exists)
    assert _lib() is not None
    (fallback,) = temp.glob("hiertail_fast-native-*")
    assert len(list(fallback.glob("_positive_blocks-*.so"))) == 1
    if hasattr(os, "getuid"):       # made ours alone: others may not even list it (s72)
        assert fallback.stat().st_mode & 0o077 == 0


def test_switched_off_and_no_compiler(fresh_native, monkeypatch):
    monkeypatch.setenv("HIERTAIL_NATIVE", "0")
    assert native_mod.load("_positive_blocks") is None
    assert blocks_mod.native_kernel(torch.float32) is None
    monkeypatch.delenv("HIERTAIL_NATIVE")
    monkeypatch.setattr(native_mod, "_LOADED", {})
    monkeypatch.setattr(native_mod, "compiler", lambda: None)
    assert native_mod.load("_positive_blocks") is None
    assert not fresh_native.exists() or not list(fresh_native.iterdir())      # nothing built


def test_failing_compiler_warns_once_and_leaves_nothing(fresh_native, monkeypatch, tmp_path):
    fake = tmp_path / "badcc"
    fake.write_text("#!/bin/sh\necho 'badcc: cannot compile' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with pytest.warns(RuntimeWarning, match="badcc: cannot compile"):
        assert native_mod.load("_positive_blocks") is None
    assert native_mod.load("_positive_blocks") is None              # no second try, no warning
    assert not list(fresh_native.iterdir())                                # no half-written file
    # another kernel failing to build: no second warning either (one per process, as the docs
    # say; each of the four kernels warned before: a docs audit)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native_mod.load("_symmetric_lse") is None


def test_any_build_failure_falls_back_to_the_torch_path(fresh_native, monkeypatch):
    # the kernels are an optional accelerator: any exception of the build (not only OSError /
    # RuntimeError / SubprocessError) is a warning and the torch path, and the loss's value
    # is the reference's (an old fix without a test, 74dd999, found in session 70)
    def broken(*args, **kwargs):
        raise ValueError("simulated unexpected build failure")

    monkeypatch.setattr(native_mod, "_build", broken)
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(40, 8, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (40,), generator=gen)
    with pytest.warns(RuntimeWarning, match="simulated unexpected build failure"):
        got = hierarchical_contrastive_loss(z, [y], [None], temperature=0.5,
                                            variant="official", backend="torch")
    torch.testing.assert_close(got, ref(z, y, temperature=0.5, variant="official"))


def test_the_build_needs_no_getuid(fresh_native, monkeypatch):
    # os.getuid does not exist on Windows: the temp-dir fallback's name takes the user name
    # there, and the kernel still builds (an old fix without a test, 74dd999)
    import os

    built_kernel(native_mod.compiler(), "a C compiler")
    monkeypatch.delattr(os, "getuid")
    monkeypatch.setenv("USERNAME", "someone")
    assert native_mod.load("_block_exp") is not None


def test_kernel_log_within_two_ulp():
    """The vectorisable log of the float32 kernel on its whole domain x + eps, x in [0, 1]
    (and well beyond), against float64 log: within 2 ulp of the correctly rounded result."""
    lib = _lib()
    fn = lib.hiertail_log_f32
    fn.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    rng = np.random.default_rng(0)
    a = np.concatenate([np.geomspace(1e-30, 10.0, 400_000), 1.0 + rng.uniform(-1e-3, 1e-3, 50_000),
                        rng.uniform(OFFICIAL_EPS, 1.0, 50_000), [OFFICIAL_EPS, 1.0, 1.0 + 1e-7]])
    a = a.astype(np.float32)
    out = np.empty_like(a)
    fn(a.size, a.ctypes.data, out.ctypes.data)
    exact = np.log(a.astype(np.float64))
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    err = np.abs(out.astype(np.float64) - exact) / ulp
    assert float(err.max()) <= 2.0, float(err.max())


def _numpy_positives(x, target, lo, hi, self_col, coef, fac, cut, eps):
    """The kernel's contract, element by element in float64."""
    rows = x.shape[0]
    levels = lo.shape[0]
    t = np.zeros((levels, rows))
    q = np.zeros((levels, rows))
    tgt = None if target is None else target.astype(np.float64)
    for i in range(rows):
        for j in range(x.shape[1]):
            if self_col is not None and j == self_col[i]:
                continue
            members = [k for k in range(levels) if lo[k, i] <= j < hi[k, i]]
            xv = float(x[i, j])                      # read before any write (aliasing)
            for k in members:
                v = xv * (1.0 if fac is None else float(fac[k, i]))
                v = v if v > cut else 0.0
                qq = v / (v + eps)
                t[k, i] += np.log(v + eps)
                q[k, i] += qq
                if tgt is not None:
                    tgt[i, j] += float(coef[k, i]) * qq
    return t, q, tgt


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", ["nested", "overlapping", "factor", "aliased",
                                  "level_factors", "aliased_level_factors"])
@pytest.mark.parametrize("threads", [1, 2])
def test_positives_kernel_against_numpy(dtype, case, threads):
    """Ragged per-row ranges (empty ones included), nested levels (shared entries), ranges that
    overlap without nesting, own keys inside and outside the ranges, a per-row factor with the
    cut-off, the target aliasing x (the folded gradient block), and per-level factors on nested
    levels (1 at some levels, one value shared by two, another at the third: entries read once
    per distinct factor; aliased: once for all, before the write); on one thread and with the
    rows split over two (min_entries 0)."""
    _lib()
    kernel = blocks_mod.native_kernel(dtype)
    gen = torch.Generator().manual_seed(11)
    rows, cols, levels = 37, 90, (1 if case in ("factor", "aliased") else 3)
    x = torch.rand(rows, cols, generator=gen, dtype=dtype) ** 4
    x[:, ::7] = 0.0                                   # exact zeros (cut-off entries)
    lo = torch.randint(0, cols, (levels, rows), generator=gen)
    width = torch.randint(0, 40, (levels, rows), generator=gen)
    if case in ("nested", "level_factors", "aliased_level_factors"):   # each inside the last
        for k in range(1, levels):
            lo[k] = torch.minimum(lo[k - 1] + width[k] // 4, torch.full_like(lo[k], cols))
            width[k] = torch.clamp(width[k - 1] - width[k] // 4 - 2, min=0)
    hi = torch.clamp(lo + width, max=cols)
    hi[:, :3] = lo[:, :3]                             # rows without positives
    self_col = torch.randint(-1, cols, (rows,), generator=gen)
    self_col[5:15] = lo[0, 5:15]                      # own key at a range's first column
    coef = torch.randn(levels, rows, generator=gen, dtype=dtype)
    fac, cut = None, 0.0
    if case == "factor":
        fac, cut = torch.rand(1, rows, generator=gen, dtype=dtype) * 1e-10, 1e-15
    elif case in ("level_factors", "aliased_level_factors"):
        fac = torch.ones(levels, rows, dtype=dtype)
        odd = torch.rand(rows, generator=gen, dtype=dtype) * 0.9
        fac[1, 10:25] = odd[10:25]                     # levels 1 and 2 share a factor < 1
        fac[2, 10:25] = odd[10:25]
        fac[0, 20:30] = odd[20:30] * 1e-3              # a third one (rows 20..24: all differ)
        fac[2, 30:] = odd[30:] * 1e-7
        cut = 1e-9
    target = x if case.startswith("aliased") else x.clone()   # aliased: written in place
    x_np = x.numpy().copy()
    want_t, want_q, want_tg = _numpy_positives(
        x_np, target.numpy().copy(), lo.numpy(), hi.numpy(), self_col.numpy(), coef.numpy(),
        None if fac is None else fac.numpy(), cut, OFFICIAL_EPS)
    t_out = torch.zeros(levels, rows, dtype=dtype)
    q_out = torch.zeros_like(t_out)
    ran = kernel(threads, 0, rows, levels, x.data_ptr(), cols, target.data_ptr(), cols,
                 lo.data_ptr(), hi.data_ptr(), rows, self_col.data_ptr(), coef.data_ptr(), rows,
                 OFFICIAL_EPS, None if fac is None else fac.data_ptr(), rows, cut,
                 t_out.data_ptr(), q_out.data_ptr(), rows)
    assert ran == (threads if native_mod.load("_positive_blocks", openmp=True).threaded else 1)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(t_out.double().numpy(), want_t, **tol)
    np.testing.assert_allclose(q_out.double().numpy(), want_q, **tol)
    np.testing.assert_allclose(target.double().numpy(), want_tg, **tol)
    assert int((t_out != 0).sum()) > rows // 2                      # the ranges were not empty


def test_float32_positives_kernel_sums_a_long_range_in_double():
    """The C kernel accumulates each (row, level) sum in double whatever the entries' dtype
    (its header's promise): one row of 200,000 positives (a dominant class) gives T and Q
    within one float32 ulp of the float64 sums. Summed in float, Q was ~10 ulps off (0.16 at
    2e5); the ragged test above uses ranges of under 40 entries, where both agree."""
    _lib()
    kernel = blocks_mod.native_kernel(torch.float32)
    cols = 200_000
    x = torch.rand(1, cols, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    lo = torch.zeros(1, 1, dtype=torch.long)
    hi = torch.full((1, 1), cols, dtype=torch.long)
    t_out, q_out = torch.zeros(1, 1), torch.zeros(1, 1)
    kernel(1, 0, 1, 1, x.data_ptr(), cols, None, 0, lo.data_ptr(), hi.data_ptr(), 1, None,
           None, 1, OFFICIAL_EPS, None, 1, 0.0, t_out.data_ptr(), q_out.data_ptr(), 1)
    x64 = x.double().numpy()[0]
    want_t = np.log(x64 + OFFICIAL_EPS).sum()
    want_q = (x64 / (x64 + OFFICIAL_EPS)).sum()
    for got, want in ((float(t_out), want_t), (float(q_out), want_q)):
        ulp = float(np.spacing(np.float32(abs(want))))
        assert abs(got - want) <= ulp, f"{got} vs {want}: {abs(got - want) / ulp:.1f} ulps"


def test_more_levels_than_the_kernel_takes_use_the_torch_path():
    """The kernel keeps per-row state for at most NATIVE_MAX_LEVELS levels; more levels take
    the torch path (and still match the reference)."""
    _lib()
    levels = blocks_mod.NATIVE_MAX_LEVELS + 1
    gen = torch.Generator().manual_seed(12)
    y = torch.randint(0, 4, (60,), generator=gen)
    gid = torch.stack([y] * levels)
    z = torch.randn(60, 4, generator=gen)
    common = torch.ones(60, dtype=torch.bool)
    many = blocks_mod.BlockPositives(z, gid, [4] * levels, True, None, 1.0, common)
    few = blocks_mod.BlockPositives(z, gid[:-1], [4] * (levels - 1), True, None, 1.0, common)
    assert many.native is None and few.native is not None
    labels = [y] * levels
    got = hierarchical_contrastive_loss(z.double(), labels, [None] * levels, temperature=0.5,
                                        variant="official", backend="torch")
    want = sum(ref(z.double(), lab, temperature=0.5, variant="official") for lab in labels)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(rows=st.integers(1, 9), cols=st.integers(1, 70), levels=st.integers(1, 4),
       seed=st.integers(0, 2**31 - 1), with_target=st.sampled_from([None, "copy", "alias"]),
       with_self=st.booleans(),
       with_fac=st.booleans(), f64=st.booleans())
def test_positives_kernel_fuzz(rows, cols, levels, seed, with_target, with_self, with_fac, f64):
    """Random shapes, ranges (empty, full, partial, overlapping), own keys, per-level factors
    and dtypes, the forward-only call (no target) and a target aliasing x included: the kernel
    against the numpy loop."""
    _lib()
    dtype = torch.float64 if f64 else torch.float32
    kernel = blocks_mod.native_kernel(dtype)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(rows, cols, generator=gen, dtype=dtype) ** 3
    lo = torch.randint(0, cols + 1, (levels, rows), generator=gen)
    hi = torch.minimum(lo + torch.randint(0, cols + 1, (levels, rows), generator=gen),
                       torch.full_like(lo, cols))
    self_col = torch.randint(-1, cols, (rows,), generator=gen) if with_self else None
    coef = torch.randn(levels, rows, generator=gen, dtype=dtype)
    fac = torch.rand(levels, rows, generator=gen, dtype=dtype) if with_fac else None
    if fac is not None:
        fac[:, ::2] = 1.0                              # f = 1 at some (level, row) pairs
    cut = 1e-3 if fac is not None else 0.0
    target = {None: None, "copy": x.clone() * 2, "alias": x}[with_target]
    want_t, want_q, want_tg = _numpy_positives(
        x.numpy(), None if target is None else target.numpy().copy(), lo.numpy(), hi.numpy(),
        None if self_col is None else self_col.numpy(), coef.numpy(),
        None if fac is None else fac.numpy(), cut, OFFICIAL_EPS)
    t_out = torch.zeros(levels, rows, dtype=dtype)
    q_out = torch.zeros_like(t_out)
    kernel(1 + seed % 2, 0, rows, levels, x.data_ptr(), cols,
           None if target is None else target.data_ptr(),
           cols if target is not None else 0, lo.data_ptr(), hi.data_ptr(), rows,
           None if self_col is None else self_col.data_ptr(),
           coef.data_ptr() if target is not None else None, rows, OFFICIAL_EPS,
           None if fac is None else fac.data_ptr(), rows, cut, t_out.data_ptr(),
           q_out.data_ptr(), rows)
    tol = dict(rtol=1e-12, atol=1e-12) if f64 else dict(rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(t_out.double().numpy(), want_t, **tol)
    np.testing.assert_allclose(q_out.double().numpy(), want_q, **tol)
    if target is not None:
        np.testing.assert_allclose(target.double().numpy(), want_tg, **tol)


@pytest.mark.parametrize("threads", [2, 3])
def test_big_blocks_split_over_threads_bit_for_bit(monkeypatch, threads):
    """Blocks with enough entries run their rows on torch's OpenMP threads: the same loss and
    gradients bit for bit as one thread per block (rows are independent), on the fused pass
    with level-specific prototypes (rows with a factor below 1 at some levels too)."""
    _lib()
    threaded = native_mod.load("_positive_blocks", openmp=True).threaded
    if os.environ.get("CI"):
        assert threaded, "the OpenMP build of the kernels did not load on the CI machine"
    gen = torch.Generator().manual_seed(13)
    y = torch.randint(0, 6, (300,), generator=gen)
    labels = [y, y // 2, y // 3]
    z = torch.randn(300, 8, generator=gen)
    protos = [torch.randn(int(lab.max()) + 1, 8, generator=gen) * 3 for lab in labels]
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    ran = []
    real_kernel = blocks_mod.BlockPositives._kernel

    def spy(self, *args, **kw):
        ran.append(real_kernel(self, *args, **kw))
        return ran[-1]

    def run(min_entries):
        monkeypatch.setattr(blocks_mod, "PARALLEL_MIN_ENTRIES", min_entries)
        ran.clear()
        zz = z.clone().requires_grad_()
        loss = hierarchical_contrastive_loss(zz, labels, protos, temperature=0.3,
                                             variant="official", include_self=False,
                                             backend="torch")
        loss.backward()
        return loss.detach(), zz.grad

    try:
        monkeypatch.setattr(blocks_mod.BlockPositives, "_kernel", spy)
        one = run(1 << 60)
        assert ran and set(ran) == {1}
        split = run(0)
        assert ran and set(ran) == ({threads} if threaded else {1})
    finally:
        torch.set_num_threads(old_threads)
    assert torch.equal(one[0], split[0]) and torch.equal(one[1], split[1])


def _native_child(cache, code: str) -> subprocess.CompletedProcess:
    """``code`` run after ``import hiertail_fast.ops._native as n`` in a child process whose
    build cache is ``cache``."""
    env = {**os.environ, "HIERTAIL_NATIVE_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-c", "import hiertail_fast.ops._native as n\n"
                           + code], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory):
    """A build cache holding both C libraries, built in a child process (built once for the
    module's damage cases: each takes a copy)."""
    built_kernel(native_mod.compiler())
    cache = tmp_path_factory.mktemp("built") / "cache"
    built = _native_child(cache, "assert n.load('_positive_blocks') is not None\n"
                                 "assert n.load('_block_exp') is not None\n")
    assert built.returncode == 0, built.stderr
    return cache


@pytest.mark.parametrize("damage", ["truncated", "another kernel"])
def test_a_damaged_cached_library_is_built_again(fresh_native, built_cache, damage):
    """A cached .so that is not the file its build wrote (a copied or synced cache, a disk
    fault) was loaded as it was: a truncated one killed the process with SIGBUS on every run,
    another kernel's library failed at its first symbol. Its recorded sha256 no longer
    matches: it is built again. Every build and load runs in a child process: a library this
    process had mapped must not be truncated under it (that is the SIGBUS)."""
    shutil.copytree(built_cache, fresh_native)              # a copied cache, as a user's
    (lib,) = fresh_native.glob("_positive_blocks-*.so")
    data = lib.read_bytes()
    if damage == "truncated":
        lib.write_bytes(data[: len(data) // 3])
    else:
        (other,) = fresh_native.glob("_block_exp-*.so")
        lib.write_bytes(other.read_bytes())
    proc = _native_child(fresh_native, "lib = n.load('_positive_blocks')\n"
                         "assert lib is not None and hasattr(lib, 'hiertail_positives_f32')\n"
                         "print('loaded')\n")
    assert proc.returncode == 0 and "loaded" in proc.stdout, (proc.returncode, proc.stderr)
    assert lib.read_bytes() == data                       # rebuilt in place, the same bytes


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o707], ids=["777", "770", "707"])
def test_a_temp_fallback_others_may_write_to_is_not_used(fresh_native, monkeypatch, tmp_path,
                                                         mode):
    """The fallback's name is predictable, in a world-writable directory: a folder others
    may write to (a library planted there would be loaded) is refused."""
    fallback = _cache_unwritable(monkeypatch, tmp_path) / f"hiertail_fast-native-{os.getuid()}"
    fallback.mkdir(parents=True)
    fallback.chmod(mode)      # (group-writable was let through with every test passing; s69)
    with pytest.raises(OSError, match="only this user may write to"):
        native_mod._build(native_mod._HERE / "_positive_blocks.c", native_mod.compiler())


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX owners and modes")
@pytest.mark.parametrize("foreign", ["others may write to it", "another user owns it"])
def test_a_library_planted_in_a_foreign_temp_fallback_is_not_loaded(fresh_native, monkeypatch,
                                                                    tmp_path, foreign):
    """The refusal above with a library in the folder: an intact build (its sha256 beside it)
    planted there was returned before the folder's owner and mode were looked at (a mutation
    audit's find, s72; the test above only met an empty folder)."""
    source, cc = native_mod._HERE / "_positive_blocks.c", built_kernel(native_mod.compiler())
    monkeypatch.setenv("HIERTAIL_NATIVE_CACHE", str(tmp_path / "genuine"))
    genuine = native_mod._build(source, cc)
    temp = _cache_unwritable(monkeypatch, tmp_path)
    uid = os.getuid()
    if foreign == "another user owns it":       # this process now runs as another user
        uid += 1
        monkeypatch.setattr(os, "getuid", lambda: uid)
    fallback = temp / f"hiertail_fast-native-{uid}"
    fallback.mkdir(parents=True)
    fallback.chmod(0o777 if foreign == "others may write to it" else 0o700)
    for planted in (genuine, native_mod._digest_path(genuine)):
        (fallback / planted.name).write_bytes(planted.read_bytes())
    assert native_mod._intact(fallback / genuine.name)
    with pytest.raises(OSError, match="only this user may write to"):
        native_mod._build(source, cc)


def test_a_compiler_with_flags_is_found_by_its_first_word(monkeypatch):
    """``CC`` often carries flags (``gcc -m64``): it is looked up on PATH by its first word and
    used whole; one whose first word is not on PATH falls through to ``cc``/``gcc``/``clang``."""
    import shutil

    first = built_kernel(next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None),
                         "a C compiler")
    monkeypatch.setenv("CC", f"{first} -m64")
    assert native_mod.compiler() == f"{first} -m64"
    monkeypatch.setenv("CC", "no-such-compiler-here -m64")
    assert native_mod.compiler() == first


def test_the_serial_and_the_openmp_build_are_loaded_apart(fresh_native):
    """load() remembers each kernel per (name, openmp): the serial library loaded first must not
    be handed out for a later ``openmp=True`` load (that kernel's threads would be lost)."""
    serial = _lib()
    threaded = native_mod.load("_positive_blocks", openmp=True)
    assert threaded is not None and threaded is not serial
    assert not serial.threaded
    if native_mod.openmp_runtime() is None:       # nothing to run its threads on: serial
        assert not threaded.threaded
    assert native_mod.load("_positive_blocks") is serial


def _load_in_a_worker():
    torch.set_num_threads(1)
    native_mod.load("_block_exp")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork (not on Windows)")
def test_a_fork_while_another_thread_builds_a_kernel_does_not_hang_the_child():
    """load() holds its lock for a kernel's whole first compile; a DataLoader worker forked
    meanwhile inherited it held by a thread it does not have and hung at its first native
    call (a mutation audit's find). Forked children get the lock new."""
    from tests.conftest import fork_while_held

    hung, code = fork_while_held(lambda: native_mod._LOCK, _load_in_a_worker)
    assert not hung and code == 0


def test_the_build_key_follows_the_cpu_model_and_flags(fresh_native, monkeypatch):
    # a -march=native build is cached per CPU: model AND feature flags (the same model with
    # AVX-512 hidden by a VM must not share a build: SIGILL from a shared cache). Dropping the
    # signature from the key, or the flags from the signature, passed every test (mutation
    # audit, session 69)
    import io

    def cpuinfo(model, flags):
        text = f"processor\t: 0\nmodel name\t: {model}\nflags\t\t: {flags}\n"
        monkeypatch.setattr(native_mod, "open", lambda path, *a, **k: io.StringIO(text),
                            raising=False)
        return native_mod._cpu_signature()

    signatures = {cpuinfo("Xeon X", "sse2 avx2"), cpuinfo("Xeon X", "sse2 avx2 avx512f"),
                  cpuinfo("EPYC Y", "sse2 avx2")}
    assert len(signatures) == 3
    monkeypatch.delattr(native_mod, "open")
    cc = built_kernel(native_mod.compiler(), "a C compiler")
    source = native_mod._HERE / "_block_exp.c"
    names = set()
    for signature in ("model name: A\nflags: avx2\n", "model name: A\nflags: avx512f\n"):
        monkeypatch.setattr(native_mod, "_cpu_signature", lambda s=signature: s)
        names.add(native_mod._build(source, cc).name)
    assert len(names) == 2


def test_the_cache_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.delenv("HIERTAIL_NATIVE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert native_mod.cache_dir() == tmp_path / "hiertail_fast" / "native"
    monkeypatch.setenv("HIERTAIL_NATIVE_CACHE", str(tmp_path / "mine"))
    assert native_mod.cache_dir() == tmp_path / "mine"


def test_the_build_key_follows_the_headers(fresh_native, tmp_path):
    # a kernel's headers (_native_math.h, _native_omp.h) are part of its build: a changed
    # header must give a new build, not the cached library of the old one (dropping them
    # from the key passed every test: mutation audit, session 70)
    import ctypes

    cc = built_kernel(native_mod.compiler(), "a C compiler")
    src, header = tmp_path / "k.c", tmp_path / "k.h"
    src.write_text('#include "k.h"\nint value(void) { return VALUE; }\n')
    values = []
    for v in (1, 2):
        header.write_text(f"#define VALUE {v}\n")
        values.append(ctypes.CDLL(str(native_mod._build(src, cc))).value())
    assert values == [1, 2]
