"""Symmetric CPU engine of the single-level weighted log-sum-exp and its gradient.

Same contract as ``_lse_torch.lse_fused`` / ``lse_forward`` for ONE level whose keys are all
visible (log_w finite: the plain and the official loss on cat(z, prototypes)). The logits are
symmetric, s_ij = scale z_i.z_j = s_ji, and the row-block engine (like every attention kernel)
computes each pair twice: once as (query i, key j), once as (query j, key i). Here each
unordered pair is computed once, in the upper triangle:

* rows are visited in blocks B; block B's tiles are B x B ("diagonal", read row-wise) and
  B x (all keys after B) (one GEMM, read row-wise AND column-wise);
* pass 1 (``hiertail_sym_stats_f32``) keeps running (max, sum of w exp(s - max), arg-max) of
  every row over the keys seen so far: a tile's entry s_ij updates row i (key j) and row j
  (key i) -> LSE_i, M_i (official row max) and its arg-max for all rows;
* with the per-row gradient coefficients g_i known (``coef_fn``), pass 2 recomputes each tile
  and replaces it by W_ij = g_i p_ij + g_j p_ji (p_ij = w_j exp(s_ij - LSE_i)): the gradient of
  sum_i g_i LSE_i is scale * (A + A^T) Z with A_ij = g_i p_ij, and W is A + A^T on the tile,
  so dz_B += W Z_after and dz_after += W^T z_B (diagonal: W = A, both products with Z_B).

GEMM work: pass 1 N^2 d / 2, pass 2 N^2 d / 2 + 2 x N^2 d / 2 = 2 N^2 d multiply-adds, where
the row-block engine (forward + fused gradient) needs 3 N^2 d and PyTorch's attention kernel
(two forward calls) 4 N^2 d; the price is a second exp per entry in each pass (both in one C
loop, ``_symmetric_lse.c``). bench/block_costs.py measured the GEMMs of this scheme at
0.61-0.77 x the engine's (2-core EPYC, N 6k/20k, d 64/128); its math in plain torch
(``symmetric_lse_grad`` there) matches the row-block engine to 1e-12.

The official variant's positive pairs ride on pass 2: rows are processed sorted by label, so
row i's positives are one column range; for each positive entry the kernel adds
log(exp(s_ij - M_i) + eps) and q_ij to T_i, Q_i (and the mirrored ones to T_j, Q_j) and the
coefficient c_i q_ij (+ c_j q_ji) to W. The arg-max ties go to the smallest ORIGINAL index
(torch.max's first index), whatever the visiting order.

float32 on CPU with the C kernel only (``applicable``); float64, several levels, hidden keys,
no compiler: the row-block engine.

The GEMMs run on torch.mm or, where MKL runs slow code (AMD CPUs), on oneDNN
(``_onednn_gemm``: 1.49x per 4 MiB tile there). oneDNN keeps a kernel per GEMM shape, so for it the
pieces after a row block are a power of two times the block wide (``_next_piece``) and at most
4 MiB, and the ragged last piece (< one block) goes to torch.mm. oneDNN returns each tile as a
fresh tensor, so while it serves, glibc's heap is padded (``_roomy_heap``).
"""
from __future__ import annotations

import contextlib
import math

import torch

from hiertail_fast._validation import env_switch
from hiertail_fast.ops import _block_gemms, _native, _onednn_gemm, _roomy_heap
from hiertail_fast.ops._contrastive_pairs import OFFICIAL_EPS
from hiertail_fast.ops._finite import finite
from hiertail_fast.ops._lse_torch import MAX_BLOCK_ROWS, block_bytes, exp_cutoff
from hiertail_fast.ops._max_fold import TileFold
from hiertail_fast.ops._tied_keys import first_tied_key

ENV_VAR = "HIERTAIL_SYMMETRIC"
# below this many rows the row-block engine (one or two blocks of MAX_BLOCK_ROWS) is as good
# (and has fewer calls)
MIN_ROWS = 2 * MAX_BLOCK_ROWS


def enabled() -> bool:
    """False when switched off with ``HIERTAIL_SYMMETRIC=0`` (A/B runs, debugging)."""
    return env_switch(ENV_VAR, True)


def _kernels():
    i64, ptr, f32 = _native.I64, _native.PTR, _native.F32
    stats = _native.threaded_function(
        "_symmetric_lse", "hiertail_sym_stats_f32",
        [i64, i64, i64, ptr, i64, i64, f32, ptr, ptr, ptr, ptr, f32, f32, ptr, ptr, ptr, ptr,
         ptr, ptr])
    if stats is None:
        return None
    grad = _native.threaded_function(
        "_symmetric_lse", "hiertail_sym_grad_f32",
        [i64, i64, i64, ptr, i64, i64, f32, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, f32, f32,
         ptr, ptr, i64, i64, ptr, ptr, ptr, ptr, ptr, f32, ptr, ptr, ptr, ptr])
    return stats, grad


def available() -> bool:
    """Whether the C kernel is built (or can be built) here."""
    return _kernels() is not None


def serves_kind(device: torch.device, dtype: torch.dtype, n_levels: int) -> bool:
    """Whether this engine takes problems of this kind at its sizes: CPU float32, one level,
    not switched off, and the C kernel built here (also behind the automatic backend choice,
    ``_dispatch``, which then keeps the torch backend at every size)."""
    return (enabled() and device.type == "cpu" and dtype == torch.float32 and n_levels == 1
            and available())


def serves(device: torch.device, dtype: torch.dtype, n_rows: int, n_levels: int) -> bool:
    """``serves_kind``, and at least MIN_ROWS rows (below, the row-block engine's one block)."""
    return serves_kind(device, dtype, n_levels) and n_rows >= MIN_ROWS


def applicable(z: torch.Tensor, log_w: torch.Tensor) -> bool:
    """Whether this engine takes the call: ``serves`` its kind, and every key is visible."""
    return (serves(z.device, z.dtype, z.shape[0], log_w.shape[0])
            and bool(finite(log_w).all()))


class Positives:
    """The official positive pairs of one level: labels (group ids, all rows), whether a row
    is its own positive, the coefficient c_i of each row's positive terms (None: forward only).
    After ``lse_fused``: ``T``, ``Q`` [1, N] (float64) and ``handled == [True]``, as
    ``_positive_blocks.BlockPositives`` has them."""

    def __init__(self, gid: torch.Tensor, include_self: bool, coef: torch.Tensor | None):
        self.gid, self.include_self, self.coef = gid, include_self, coef
        self.handled = [False]
        self.T = self.Q = None


def _ptr(t: torch.Tensor | None, rows: slice):
    """Address of t[rows] for the C kernels (None: an absent optional array)."""
    return None if t is None else t[rows].data_ptr()


def _tiles(n: int, use: str = "blas") -> tuple[list[tuple[int, int, int, int]], int]:
    """Every upper-triangle tile (r0, r1, c0, c1) in visiting order, and the flat buffer size
    the torch.mm tiles need. Row blocks of MAX_BLOCK_ROWS (the row-block engine's measured
    best); per block its diagonal tile (c0 = r0) and the keys after it, cut into pieces of at
    most ``HIERTAIL_CPU_BLOCK_BYTES`` (48 MB, as the row-block engine's buffer) so the buffer
    stays bounded at any N (one piece up to ~49k keys at 256 rows). For oneDNN (``use``) the
    pieces have few shapes (``_next_piece``)."""
    b, width = MAX_BLOCK_ROWS, _piece_width(use)
    tiles = []
    for r0 in range(0, n, b):
        r1 = min(n, r0 + b)
        tiles.append((r0, r1, r0, r1))
        c0 = r1
        while c0 < n:
            c1 = c0 + _next_piece(n - c0, width, use)
            tiles.append((r0, r1, c0, c1))
            c0 = c1
    size = b * b if use == "onednn" else b * min(n, max(b, width))
    return tiles, size


# oneDNN returns each tile as a fresh tensor (``_gemm``), which glibc's allocator may map and
# fault in anew, page by page, depending on what the process allocated and freed before: a
# 48 MB tile at every GEMM (its logits 17.3 ms at 49,152 keys where 3 x 16,384 took 3 x 3.2 ms,
# bench/cpu_gemm.py). At 16, 8 and 4 MiB the process's history decided it, not the size (one
# 100k loss: 226k to 5.0M minor faults, 18-31 s; docs/LOSS.md); 4 MiB: 1.49x torch.mm per tile,
# and the epoch measured no different from 16 MiB.
ONEDNN_TILE_BYTES = _block_gemms.PIECE_BYTES      # 4 MiB, the row-block engine's pieces too


def _piece_width(use: str = "blas") -> int:
    """Columns per off-diagonal piece of ``_tiles`` (``use``: the GEMM provider). For oneDNN
    a power of two times the row block, at most ONEDNN_TILE_BYTES."""
    budget = block_bytes()
    if use != "onednn":
        return max(MAX_BLOCK_ROWS, budget // (4 * MAX_BLOCK_ROWS))
    return _block_gemms.widest(min(budget, ONEDNN_TILE_BYTES), MAX_BLOCK_ROWS, MAX_BLOCK_ROWS)


def _next_piece(rest: int, width: int, use: str) -> int:
    """Width of the next piece when ``rest`` keys are left. oneDNN builds (and keeps, ~0.5 MB
    each, never given back) a kernel for every distinct GEMM shape: ragged pieces, one width
    per row block, grew a 100k-node epoch's memory from 0.8 to 1.4 GB. So its pieces are
    ``width`` or the largest power of two times the row block that fits (a binary cut of the
    rest: a few shapes in all), and the last < one row block of keys is a ragged piece that
    torch.mm serves (``_gemm_use``)."""
    if use != "onednn" or rest >= width:
        return min(rest, width)
    if rest < MAX_BLOCK_ROWS:
        return rest
    return _block_gemms.cut(rest, width, MAX_BLOCK_ROWS)


def _gemm_use(use: str, rows: int, cols: int) -> str:
    """The provider of one tile's products: oneDNN only for its few shapes (full row block,
    a power of two times it in columns), torch.mm for the ragged rest."""
    b = MAX_BLOCK_ROWS
    if use == "onednn" and rows == b and cols % b == 0 and (cols // b).bit_count() == 1:
        return "onednn"
    return "blas"


def _gemm(buf: torch.Tensor, a: torch.Tensor, bt: torch.Tensor, use: str) -> torch.Tensor:
    """a @ bt.T: into a contiguous view of the flat buffer (row stride = its width) with
    torch.mm; a fresh contiguous tile from oneDNN (``use``: ``_gemm_use``), which writes no
    ``out=`` (the caller drops each tile before the next: one alive at a time)."""
    if use == "onednn":
        return _onednn_gemm.mm_nt(a, bt, use=use)
    out = buf[: a.shape[0] * bt.shape[0]].view(a.shape[0], bt.shape[0])
    return _onednn_gemm.mm_nt(a, bt, out=out, use=use)


def lse_fused(z: torch.Tensor, log_w: torch.Tensor, scale: float, need_max: bool,
              coef_fn=None, positives: Positives | None = None, fold_argmax=None):
    """-> (lse [1, N] float64, rowmax [1, N] or None, argmax [1, N] or None, dz or None).

    ``coef_fn(rows, lse [1, N], rowmax [1, N] or None) -> g [1, N]`` (rows = slice(0, N)); None:
    forward only (pass 1). ``positives``: the official positive pairs (their T, Q are filled
    and their gradient is added to dz). ``fold_argmax`` (an ``_max_fold.ArgmaxShare``; with
    need_max and coef_fn): the entries (i, a_i) are left out of dz (a_i: the first key equal
    to the returned arg-max's row) and their LSE part and positive term handed back in it
    (``_max_fold.TileFold``)."""
    use = _onednn_gemm.provider()       # MKL or oneDNN, read once per call
    _roomy_heap.choice()                # a bad HIERTAIL_CPU_HEAP is an error on every path
    # oneDNN's logits tiles are fresh tensors: keep glibc from handing their pages back to the
    # kernel between two tiles (a page fault per 4 KiB of the next one; ``_roomy_heap``)
    heap = _roomy_heap.roomy_heap() if use == "onednn" else contextlib.nullcontext()
    with heap:
        return _lse_fused(z, log_w, scale, need_max, coef_fn, positives, fold_argmax, use)


def _lse_fused(z, log_w, scale, need_max, coef_fn, positives, fold_argmax, use: str):
    """``lse_fused``'s work with the GEMM provider ``use``."""
    stats_fn, grad_fn = _kernels()
    n, _ = z.shape
    threads = torch.get_num_threads()
    cutoff = exp_cutoff(torch.float32)
    thr = math.exp(-cutoff) * 1.0001
    with_pos = positives is not None and coef_fn is not None
    lo = hi = None                  # each row's positive keys [lo, hi) in the sorted order
    if with_pos:        # sorted by label: a row's positives are one range of columns
        gid = positives.gid
        order = torch.sort(gid, stable=True).indices
        gs = gid[order]
        counts = torch.bincount(gs)
        start = torch.cumsum(counts, 0) - counts
        lo, hi = start[gs], start[gs] + counts[gs]
    else:
        order = torch.arange(n)
    zs = z[order].contiguous()
    lw = log_w[0][order].to(torch.float32).contiguous()
    w = lw.exp()
    ids = order.contiguous() if need_max else None  # original ids (arg-max ties)
    row_m = torch.full((n,), float("-inf"), dtype=torch.float32)
    row_s = torch.zeros(n, dtype=torch.float64)
    row_a = torch.full((n,), -1, dtype=torch.long)
    tiles, size = _tiles(n, use)
    buf = torch.empty(size, dtype=torch.float32)

    def tiles_of_the_triangle():
        """(rows, cols, diag, logits tile, its GEMMs' provider) of every upper-triangle tile,
        in order. The caller drops its tile before asking for the next (``del s``)."""
        for r0, r1, c0, c1 in tiles:
            cols, u = slice(c0, c1), _gemm_use(use, r1 - r0, c1 - c0)
            yield slice(r0, r1), cols, c0 == r0, _gemm(buf, zs[r0:r1], zs[cols], u), u

    p = _ptr
    # ---- pass 1: running row statistics, each pair once
    for rs, cols, diag, s, _ in tiles_of_the_triangle():
        used = stats_fn(threads, s.shape[0], s.shape[1], s.data_ptr(), s.stride(0), int(diag),
                        scale, p(w, rs), p(w, cols), p(ids, rs), p(ids, cols), cutoff, thr,
                        p(row_m, rs), p(row_s, rs), p(row_a, rs), p(row_m, cols),
                        p(row_s, cols), p(row_a, cols))
        if used < 0:
            raise MemoryError("the symmetric loss kernel could not allocate its row stats")
        del s
    lse_s = row_m.double() + torch.log(row_s)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(n)
    lse = lse_s[inv][None]
    m_by_id = row_m[inv][None]
    rowmax = m_by_id if need_max else None
    argmax = row_a[inv][None] if need_max else None
    if coef_fn is None:
        return lse, rowmax, argmax, None
    # ---- pass 2: W = A + A^T tile by tile, dz = scale * W Z
    g = coef_fn(slice(0, n), lse, m_by_id)[0].to(torch.float64)[order]
    c = positives.coef[order].to(torch.float64) if with_pos else None
    # g, c (~1/N) divided by their max and given back as one scalar: W's entries stay O(1)
    # and W Z never turns denormal
    g_max = float(g.abs().max())
    if c is not None:
        g_max = max(g_max, float(c.abs().max()))
    g_max = g_max or 1.0
    g32 = (g / g_max).float()
    c32 = (c / g_max).float() if c is not None else None
    # lse - M = log s, taken as it is: (M + log s) - M in float64 loses 2^-53 |M|, which at
    # |M| ~ 1e14 is 1 % of the O(1) difference (the gradient was that far off; an audit)
    rel = torch.log(row_s).float()
    # the official positives' arrays (all None without positives)
    g_erel = (g32 * torch.exp(-rel)).contiguous() if with_pos else None   # g e^-rel
    big_t = torch.zeros(n, dtype=torch.float64) if with_pos else None
    big_q = torch.zeros(n, dtype=torch.float64) if with_pos else None
    w_pos = w if with_pos else None
    fold = None
    if fold_argmax is not None and need_max:
        fold_argmax.amax = first_tied_key(z, argmax)                      # original ids
        target = inv[fold_argmax.amax[0][order]]                          # sorted positions
        fold = TileFold(tiles, MAX_BLOCK_ROWS, target, inv[row_a], g32 != 0)
        fold.rows(dict(m=row_m, rel=rel, g=g32, lw=lw, row_s=row_s, cutoff=cutoff,
                       c=c32, gid=positives.gid[order] if with_pos else None,
                       include_self=positives.include_self if with_pos else True))
    dz = torch.zeros_like(zs)
    # the keys' products of oneDNN's tiles, transposed [d, N]: oneDNN returns them as [d, keys]
    # and they add in row by row (into dz's rows it was a strided add, ``add_mm_t_``)
    dz_keys_t = torch.zeros(zs.shape[1], n, dtype=zs.dtype) if use == "onednn" else None
    for t_id, (rs, cols, diag, s, u) in enumerate(tiles_of_the_triangle()):
        logits = fold.read(t_id, s, scale) if fold is not None else None   # (rarely needed)
        used = grad_fn(threads, s.shape[0], s.shape[1], s.data_ptr(), s.stride(0), int(diag),
                       scale, p(row_m, rs), p(rel, rs), p(g32, rs), p(lw, rs),
                       p(row_m, cols), p(rel, cols), p(g32, cols), p(lw, cols),
                       cutoff, thr, p(lo, rs), p(hi, rs), cols.start,
                       int(positives.include_self) if with_pos else 1,
                       p(c32, rs), p(c32, cols), p(w_pos, rs), p(w_pos, cols),
                       p(g_erel, cols), OFFICIAL_EPS, p(big_t, rs),
                       p(big_q, rs), p(big_t, cols), p(big_q, cols))
        if used < 0:
            raise MemoryError("the symmetric loss kernel could not allocate its row sums")
        if fold is not None:
            fold.write(t_id, s, logits)
        _onednn_gemm.add_mm_(dz[rs], s, zs[cols], use=u)
        if u == "onednn":
            _onednn_gemm.add_mm_t_(dz_keys_t[:, cols], s.t(), zs[rs], use=u)
        else:
            _onednn_gemm.add_mm_(dz[cols], s.t(), zs[rs], use=u)
        del s, logits
    if dz_keys_t is not None:
        dz.add_(dz_keys_t.t())
        del dz_keys_t
    dz.mul_(scale * g_max)
    out = torch.empty_like(dz)
    out[order] = dz
    if fold is not None:                        # by original row id, units of g
        fold_argmax.u[0, order] = fold.u * g_max
        fold_argmax.q_out[0, order] = fold.q_out
    if with_pos:
        positives.T, positives.Q = big_t[inv][None], big_q[inv][None]
        positives.handled = [True]
    return lse, rowmax, argmax, out
