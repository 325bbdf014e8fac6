"""The C kernels' per-thread buffers and chunked searches, where a mutation audit (s43) found
behaviour no test pinned down: the symmetric engine's per-thread positive sums T, Q of pass 2
merged from EVERY thread (a row's positive range spanning chunks of both threads), the block
step's first arg-max when the max first sits on the last column of a 64-wide search chunk and
again later, and the positives kernel at its most levels (16) with an own key to skip (the
per-row edge list at its largest). Each against a dense float64 / numpy computation."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import hiertail_fast.ops._block_exp as block_mod
import hiertail_fast.ops._lse_symmetric as sym
import hiertail_fast.ops._native as native_mod
import hiertail_fast.ops._positive_blocks as blocks_mod
from hiertail_fast.ops._contrastive_pairs import OFFICIAL_EPS
from tests import test_lse_symmetric
from tests.test_block_exp import _kernel as _block_kernel
from tests.test_native import _lib as _positives_lib
from tests.test_native import _numpy_positives

forced = test_lse_symmetric.forced


def _dense_positive_sums(z: torch.Tensor, y: torch.Tensor, scale: float):
    """T_i = sum_{j in P(i)} log(x_ij + eps), Q_i = sum q_ij, x = exp(s_ij - M_i), float64."""
    s = (z.double() @ z.double().t()) * scale
    x = torch.exp(s - s.max(dim=1, keepdim=True).values)
    same = y[:, None] == y[None, :]
    big_t = torch.where(same, torch.log(x + OFFICIAL_EPS), torch.zeros_like(x)).sum(1)
    big_q = torch.where(same, x / (x + OFFICIAL_EPS), torch.zeros_like(x)).sum(1)
    return big_t, big_q


@pytest.mark.usefixtures("two_threads")
def test_symmetric_positive_sums_of_every_thread_are_merged(forced, monkeypatch):
    """Row blocks of 64 over 700 rows: the first block's wide tile (64 x 636, three 256-column
    chunks) runs on two threads, and one dominant class makes each row's positive range span
    the chunks of BOTH threads. Pass 2 keeps T, Q per thread and merges them at the end; a
    merge of thread 0's slot alone (the others' sums dropped) passed every test, whose classes
    (< 256 rows) kept a row's positives inside thread 0's chunks (a mutation audit)."""
    monkeypatch.setattr(sym, "MAX_BLOCK_ROWS", 64)
    n = 700
    gen = torch.Generator().manual_seed(4)
    z = torch.randn(n, 8, generator=gen) * 0.3
    y = (torch.rand(n, generator=gen) < 0.1).long()          # ~630 rows of class 0
    log_w = -torch.log(torch.bincount(y)[y].float())[None]
    pos = sym.Positives(y, True, torch.full((n,), -0.01))
    coef = lambda rows, lse, rmax: torch.full_like(lse, 0.01)       # noqa: E731
    sym.lse_fused(z, log_w, 0.5, True, coef, positives=pos)
    assert pos.handled == [True]
    want_t, want_q = _dense_positive_sums(z, y, 0.5)
    torch.testing.assert_close(pos.T[0], want_t, rtol=2e-6, atol=1e-4)
    torch.testing.assert_close(pos.Q[0], want_q, rtol=2e-6, atol=1e-4)


@pytest.mark.usefixtures("two_threads")
def test_symmetric_wide_tiles_run_on_torchs_threads(forced, monkeypatch):
    """Both passes split a wide tile's chunks over torch's threads (the kernels report how
    many ran): a wrapper that passed one thread (every result the same, the engine serial)
    passed every test (a mutation audit). Narrow tiles (<= one chunk) run on one thread."""
    if not native_mod.load("_symmetric_lse", openmp=True).threaded:
        pytest.skip("the serial build of the kernel serves here (no OpenMP runtime)")
    monkeypatch.setattr(sym, "MAX_BLOCK_ROWS", 64)
    real = sym._kernels
    ran = {"stats": [], "grad": []}

    def spy():
        stats, grad = real()

        def stats_spy(*args):
            ran["stats"].append((args[2], stats(*args)))
            return ran["stats"][-1][1]

        def grad_spy(*args):
            ran["grad"].append((args[2], grad(*args)))
            return ran["grad"][-1][1]

        return stats_spy, grad_spy

    monkeypatch.setattr(sym, "_kernels", spy)
    gen = torch.Generator().manual_seed(6)
    z = torch.randn(700, 8, generator=gen)
    y = torch.randint(0, 3, (700,), generator=gen)
    test_lse_symmetric._loss_and_grads(z, y, None, variant="official", tau=0.5)
    for name in ("stats", "grad"):
        wide = {used for cols, used in ran[name] if cols >= 512}     # >= 2 chunks
        narrow = {used for cols, used in ran[name] if cols <= 256}   # one chunk
        assert wide == {2} and narrow == {1}, (name, ran[name])


@pytest.mark.parametrize("threads", [1, 2])
def test_symmetric_loss_with_a_dominant_class_on_one_and_two_threads(forced, monkeypatch,
                                                                     threads):
    """The official loss and gradient through the symmetric engine with a class wider than
    the tiles' column chunks, on 1 and 2 threads, against the float64 reference (the suite's
    rule): the positives' sums of the later chunks (thread 1's) enter the loss."""
    monkeypatch.setattr(sym, "MAX_BLOCK_ROWS", 64)
    gen = torch.Generator().manual_seed(8)
    z = torch.randn(700, 8, generator=gen)
    y = (torch.rand(700, generator=gen) < 0.1).long()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fast = test_lse_symmetric._loss_and_grads(z, y, None, variant="official", tau=0.5)
    finally:
        torch.set_num_threads(before)
    assert forced["fused"] == 1
    test_lse_symmetric._assert_like_reference(fast, z, y, None, variant="official", tau=0.5)


@pytest.mark.parametrize("cols,at", [(64, 63), (65, 63), (128, 63), (128, 127), (200, 63),
                                     (200, 127)])
def test_block_step_first_argmax_on_a_search_chunks_last_column(cols, at):
    """The block step finds the first arg-max by scanning 64-wide chunks for a hit, then the
    hit chunk entry by entry. The max first at a chunk's LAST column (63, 127) and again later:
    a search that left that column out of its chunk returned the later copy, and no test had a
    first max there (a mutation audit). Against torch.max's first index."""
    fn = _block_kernel()
    gen = torch.Generator().manual_seed(cols + at)
    s = torch.rand(6, cols, generator=gen) - 2.0
    s[:, at] = 1.0                                        # the first max ...
    s[0, at + 1:] = 1.0                                   # ... and every column after it
    s[1, -1] = 1.0                                        # ... and the last one
    s[2, min(at + 1, cols - 1)] = 1.0                     # ... and the next one
    w = torch.rand(1, cols, generator=gen) + 0.1
    e = s.clone()
    m, arg, _ = block_mod.native_step(fn, e, w, True)
    assert torch.equal(m, s.max(dim=1).values)
    assert torch.equal(arg, torch.full((6,), at, dtype=torch.long))
    e_ref = s.clone()
    _, arg_ref, _ = block_mod.reference_step(e_ref, w, True)
    assert torch.equal(arg, arg_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_positives_kernel_at_its_most_levels_with_an_own_key(dtype):
    """NATIVE_MAX_LEVELS (16) levels, every row's range non-empty at every level and an own
    key inside them: the row's edge list holds 2 x 16 range ends + the own key's two, its
    largest. The kernel against the numpy loop (tests/test_native.py's), on 1 and 2 threads."""
    _positives_lib()
    assert blocks_mod.NATIVE_MAX_LEVELS == 16
    kernel = blocks_mod.native_kernel(dtype)
    levels, rows, cols = 16, 9, 80
    gen = torch.Generator().manual_seed(16)
    x = torch.rand(rows, cols, generator=gen, dtype=dtype) ** 3
    lo = torch.randint(0, cols // 2, (levels, rows), generator=gen)
    hi = lo + 1 + torch.randint(0, cols // 2, (levels, rows), generator=gen)
    self_col = lo[3] + (hi[3] - lo[3]) // 2                  # inside a range
    coef = torch.randn(levels, rows, generator=gen, dtype=dtype)
    want_t, want_q, want_tg = _numpy_positives(
        x.numpy(), x.numpy().copy(), lo.numpy(), hi.numpy(), self_col.numpy(), coef.numpy(),
        None, 0.0, OFFICIAL_EPS)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-6, atol=2e-6)
    threaded = native_mod.load("_positive_blocks", openmp=True).threaded
    for threads in (1, 2):
        target = x.clone()
        t_out = torch.zeros(levels, rows, dtype=dtype)
        q_out = torch.zeros_like(t_out)
        ran = kernel(threads, 0, rows, levels, x.data_ptr(), cols, target.data_ptr(), cols,
                     lo.data_ptr(), hi.data_ptr(), rows, self_col.data_ptr(), coef.data_ptr(),
                     rows, OFFICIAL_EPS, None, rows, 0.0, t_out.data_ptr(), q_out.data_ptr(),
                     rows)
        assert ran == (threads if threaded else 1)
        np.testing.assert_allclose(t_out.double().numpy(), want_t, **tol)
        np.testing.assert_allclose(q_out.double().numpy(), want_q, **tol)
        np.testing.assert_allclose(target.double().numpy(), want_tg, **tol)
