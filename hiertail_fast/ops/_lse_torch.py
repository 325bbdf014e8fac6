"""Blocked CPU (any-device torch) backend of the multi-level weighted log-sum-exp.

The quadratic core of the balanced contrastive loss (DESIGN.md §3). For levels l = 0..L-1 and
every row i of z [N, d]::

    lse[l, i]    = log sum_{k visible in l} exp(scale * z_i.z_k + log_w[l, k])
    rowmax[l, i] = max_{k visible in l} scale * z_i.z_k          (unweighted; official variant)

``log_w[l, k] = -inf`` hides key k from level l. Same contract as the Triton launchers in
``kernels/balanced_contrastive_loss.py`` (``lse_forward`` / ``lse_backward``), plus ``lse_fused``:
when the upstream gradient coefficient of every row is known once its LSE is known (scalar
reductions), the gradient is produced during the forward pass (Liger's fused-linear-CE trick).

Memory/time tricks:
* Row blocks of B full rows (B <= MAX_BLOCK_ROWS, B x N_c <= ``HIERTAIL_CPU_BLOCK_BYTES``): a
  full row of keys is in the block, so its LSE is exact at once, no online rescaling, O(B*N)
  extra memory.
* Keys are split into "common" columns (visible in every level: all nodes) and the few "rest"
  columns (level-specific prototypes). exp() runs ONCE per common element with the shared
  unweighted row max as shift; the L weighted sums are one [B, N_c] @ [N_c, L] product. Because
  the shift is a max over keys every level sees, each level's sum is >= min_k w_k: no underflow.
  The rest columns are a small dense [L, B, N_r] computation merged in log space.
* In-place exp_/sub_/mul_ on the one block buffer; the weights are folded into the GEMM operands
  (w * Z on the query side, w scaling of the key-side accumulator) for L = 1, so the gradient is
  exactly two more GEMMs per block: forward + gradient = 3 GEMMs = the GEMM floor. The official
  variant's positives keep the fold (their keys share the row's weight; see ``_engine``).
* Several levels: the gradient block is E * sum_l a_l w_l^T, built by ``level_weights`` in L
  element-wise passes (a K = L GEMM costs CPU BLAS half a block GEMM).
"""
from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable

import torch

from hiertail_fast._validation import env_int
from hiertail_fast.ops import (
    _block_exp,  # (it imports this module too)
    _block_gemms,
    _onednn_gemm,
    _roomy_heap,
)
from hiertail_fast.ops._finite import finite
from hiertail_fast.ops._host_reads import host_reads_cheap
from hiertail_fast.ops._max_fold import (
    ArgmaxShare,
    MaxFold,
    column_of,
    fold_levels,
    positive_q,
    set_at,
)
from hiertail_fast.ops._tied_keys import common_twins

CoefFn = Callable[[slice | torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def exp_cutoff(dtype: torch.dtype) -> float:
    """C such that terms below e^-C of a row's largest term are dropped (exactly 0).

    Why: exp(x) for x near the bottom of the range, and products of such values with z inside
    the gradient GEMMs, are denormal numbers, which x86 cores can multiply 20-30x slower
    (seen on this project's CPU VMs: a 20x slower loss on wide-logit data). Dropping them
    first means no denormal ever reaches a GEMM. Error: a row's sum is >= w_argmax * e^M >=
    e^M / N and at most sum_k w_k <= N dropped terms are each < e^(M - C), so the relative
    change is < N^2 e^-C: 2e-10 at N = 1e6 for fp32 (C = 50, below fp32's 6e-8 resolution and
    far above its denormal range: e^-50 = 2e-22); float64 keeps C = 200 (< 1e-74 relative).
    """
    return 200.0 if dtype == torch.float64 else 50.0


def exp_shifted_(x: torch.Tensor) -> torch.Tensor:
    """In place: x <- exp(x) (x <= 0: shifted by a max), exactly 0 where x < -exp_cutoff.

    clamp + exp + threshold: exp of a clamped value stays in exp's fast path (exp of -inf or of
    values below -87 takes a slow path on CPU), and the threshold zeroes the clamped entries
    (and the few genuine ones within 0.01 % of the cut-off)."""
    c = exp_cutoff(x.dtype)
    x.clamp_(min=-c).exp_()
    return torch.nn.functional.threshold_(x, math.exp(-c) * 1.0001, 0.0)


ARGMAX_CHUNK = 64


def row_max_first_argmax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of ``x.max(dim=1)`` for a 2-D block: the max and its FIRST index.

    ``Tensor.max(dim)`` with indices is not vectorised on CPU (~15x slower than ``amax`` on a
    [256, 6,000] block). Two levels instead: the max of every chunk of ARGMAX_CHUNK columns
    (vectorised ``amax``), the first chunk holding the row max (a small [B, N/64] max), then the
    first equal entry inside that chunk. Same values and the same first-index tie rule."""
    rows, n = x.shape
    c = ARGMAX_CHUNK
    n_full = n // c
    if n_full < 2:
        return x.max(dim=1)
    # the full chunks as a strided VIEW [rows, n_full, c]: ``x[:, :n_full * c].reshape`` copies
    # the whole block whenever c does not divide n (a non-contiguous slice), an extra pass
    s0, s1 = x.stride()
    chunk_max = x.as_strided((rows, n_full, c), (s0, c * s1, s1)).amax(dim=2)
    if n > n_full * c:
        chunk_max = torch.cat([chunk_max, x[:, n_full * c:].amax(dim=1, keepdim=True)], 1)
    values, chunk = chunk_max.max(dim=1)
    idx = (chunk * c)[:, None] + torch.arange(c, device=x.device)
    idx.clamp_(max=n - 1)                    # the last, partial chunk
    first = (x.gather(1, idx) == values[:, None]).to(torch.uint8).argmax(dim=1)
    return values, idx.gather(1, first[:, None]).squeeze(1)


def level_weights(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[i, k] = sum_l a[l, i] * w[l, k] for a few levels L: one broadcast product and L - 1
    in-place addcmuls (L passes over out). As ``torch.mm(a.t(), w)`` this is a K = L GEMM,
    which CPU BLAS runs at ~half the cost of a full d = 64 block GEMM (measured, 2-core EPYC,
    [256, 3] x [3, 6,040]: 0.78 ms vs 0.3 ms for three passes)."""
    torch.mul(a[0][:, None], w[0][None, :], out=out)
    for lev in range(1, a.shape[0]):
        out.addcmul_(a[lev][:, None], w[lev][None, :])
    return out


# Rows per block: at most MAX_BLOCK_ROWS (measured, idle 2-core EPYC, N = 6,000, d = 64: 128-512
# rows 0.123-0.128 s per loss, 1,024 rows 0.148 s, 2,048 rows 0.166 s: tall blocks stream the
# [B, N] buffer through memory between the GEMMs and the exp), and at most
# HIERTAIL_CPU_BLOCK_BYTES of buffer (48 MB) for very wide problems.
MAX_BLOCK_ROWS = 256


# On CUDA a block is one launch of each of the engine's ~15 kernels: 256-row blocks leave the
# GPU waiting on launches (the H200 ran this engine at 20k x 64, exact, in 36.7 ms against
# 12.2 ms for the attention kernels: bench/gpu_report.py, 2026-11-27). There the budget alone
# bounds the block (HIERTAIL_CUDA_BLOCK_BYTES, 128 MB: 1,600 rows at N = 20k, 320 at 100k).
CUDA_BLOCK_BYTES = 128 << 20

# ... but at a million keys that budget is 33 rows a block: ~30,000 blocks of ~100 launches each
# per loss, and the host's launches outlast the kernels (the H200 measured ~0.35 ms of overhead
# per block: 256-row blocks at 20k took 36.7 ms, 1,600-row blocks 13.3 ms; the 1M-node epoch
# with this engine took 56.7 s, 2026-12-04). Unless the user sets the budget, a CUDA block
# keeps at least MIN_CUDA_BLOCK_ROWS rows where a quarter of the device's free memory holds
# the block-sized buffers the pass keeps (the engine ~4 of its dtype's: a sixteenth per
# buffer of either dtype; fp64 buffers took an eighth before 2026-12-05, sized as fp32 ones);
# "free" is the driver's free memory
# plus what PyTorch's caching allocator holds unused (in a training loop the allocator keeps
# most of a card). Memory stays linear in N (O(MIN_CUDA_BLOCK_ROWS * N)). Unmeasured on a
# card: the row count is from the overhead above, not from a sweep.
MIN_CUDA_BLOCK_ROWS = 512


def block_bytes(device: torch.device | str | None = None) -> int:
    """A block buffer's budget in bytes: $HIERTAIL_CPU_BLOCK_BYTES (default 48 MB) for the CPU
    engines, $HIERTAIL_CUDA_BLOCK_BYTES (default 128 MB) for tensors on CUDA."""
    if device is not None and torch.device(device).type == "cuda":
        return env_int("HIERTAIL_CUDA_BLOCK_BYTES", CUDA_BLOCK_BYTES)
    return env_int("HIERTAIL_CPU_BLOCK_BYTES", 48 << 20)


def _block_rows(n_rows: int, n_cols: int, device: torch.device | None = None,
                element_size: int = 4) -> int:
    """Rows per block: the byte budget of `device`, and at most MAX_BLOCK_ROWS on CPU (on CUDA
    at least ``cuda_rows_floor`` for ~4 buffers of `element_size`-byte entries)."""
    rows = block_bytes(device) // (4 * max(n_cols, 1))
    if device is not None and device.type == "cuda":
        return max(8, min(n_rows, cuda_rows_floor(rows, n_cols, device, 4 * element_size)))
    return max(8, min(n_rows, MAX_BLOCK_ROWS, rows))


def cuda_rows_floor(rows: int, n_cols: int, device: torch.device,
                    bytes_per_entry: int = 16) -> int:
    """`rows` (a CUDA block's rows from the byte budget) raised to MIN_CUDA_BLOCK_ROWS where a
    quarter of the device's free memory holds that many rows of `n_cols` entries, each
    `bytes_per_entry` bytes over the pass's live block buffers (16: four fp32 ones); free
    memory counts what PyTorch's caching allocator holds unused. As given where the user set
    $HIERTAIL_CUDA_BLOCK_BYTES (their budget is the budget)."""
    if rows >= MIN_CUDA_BLOCK_ROWS or os.environ.get("HIERTAIL_CUDA_BLOCK_BYTES", "").strip():
        return rows
    free = (torch.cuda.mem_get_info(device)[0]         # (driver and allocator queries, no sync)
            + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    return max(rows, min(MIN_CUDA_BLOCK_ROWS, free // (4 * bytes_per_entry * max(n_cols, 1))))


def _engine(z: torch.Tensor, log_w: torch.Tensor, scale: float, need_max: bool, **kw):
    """``_blocks`` with its GEMMs' provider: oneDNN for CPU float32 where
    ``_onednn_gemm.provider()`` says so (``_block_gemms``), inside glibc's padded heap for its
    fresh tiles (``_roomy_heap``); torch.mm otherwise."""
    use = "blas"
    if z.device.type == "cpu" and z.dtype == torch.float32:
        _roomy_heap.choice()            # a bad HIERTAIL_CPU_HEAP is an error on every path
        use = _onednn_gemm.provider()
        if z.shape[0] < _block_gemms.PIECE_UNIT:     # no oneDNN piece: no heap padding
            use = "blas"
    heap = _roomy_heap.roomy_heap() if use == "onednn" else contextlib.nullcontext()
    with heap:
        return _blocks(z, log_w, scale, need_max, use=use, **kw)


def _blocks(
    z: torch.Tensor,
    log_w: torch.Tensor,
    scale: float,
    need_max: bool,
    coef_fn: CoefFn | None = None,
    lse_in: torch.Tensor | None = None,
    grad_lse: torch.Tensor | None = None,
    positives=None,
    fold_argmax: ArgmaxShare | None = None,
    all_visible: bool | None = None,
    use: str = "blas",
):
    n, d = z.shape
    n_levels = log_w.shape[0]
    log_w = log_w.to(z.dtype)
    visible = finite(log_w)                                       # [L, N]
    common = visible.all(dim=0)
    # every key visible in every level: the caller's fact (the levels' ``full``), else read
    # (a host sync on CUDA)
    all_common = bool(common.all()) if all_visible is None else all_visible
    order = None
    if positives is not None:
        # official positives read from the blocks (``_positive_blocks``): common keys sorted by
        # label, rows visited in the same order (a group's rows share a block)
        order, cidx = positives.order, positives.cidx
    else:
        cidx = None if all_common else common.nonzero().squeeze(1)
    zc = z if cidx is None else z[cidx]
    if all_common:
        ridx = torch.empty(0, dtype=torch.long, device=z.device)
    else:
        ridx = ((~common) & visible.any(dim=0)).nonzero().squeeze(1)      # drop all-hidden keys
    n_c, n_r = zc.shape[0], ridx.numel()
    wc = (log_w if cidx is None else log_w[:, cidx]).exp()                # [L, N_c]
    zr, lwr = z[ridx], log_w[:, ridx]                                     # [N_r, d], [L, N_r]
    lwr64 = lwr.double() if n_r else None           # (v_r below is float64: once per call)
    vis_r = visible[:, ridx]

    grad = coef_fn is not None or grad_lse is not None
    lse = torch.empty(n_levels, n, dtype=torch.float64, device=z.device)
    rowmax = torch.empty(n_levels, n, dtype=z.dtype, device=z.device) if need_max else None
    argmax = torch.empty(n_levels, n, dtype=torch.long, device=z.device) if need_max else None
    if grad:
        dz = torch.zeros(n, d, dtype=z.dtype, device=z.device)
        key_c = torch.zeros(n_c, d, dtype=z.dtype, device=z.device)      # key-side accumulators
        key_r = torch.zeros(n_r, d, dtype=z.dtype, device=z.device)
        # w folded into the GEMM operands for one level. The official positives' coefficients
        # are not w-weighted, but with one level and every key common a row's positives are
        # its own class, whose keys share the row's weight w_i: their coefficient c_i q_ij
        # goes into the block as c_i q_ij / (a_i w_i), and the fold holds (see below)
        folded = n_levels == 1 and (positives is None or (n_r == 0 and positives.foldable))
        zwc = zc * wc[0][:, None] if folded else None
        wrow = log_w[0].exp() if folded and positives is not None else None   # w_i by row id
    # the official variant's arg-max entries (i, a_li) taken out of the GEMMs, their LSE part
    # and positive term handed back in fold_argmax (``_max_fold``)
    max_fold = (MaxFold(z, visible, cidx, ridx, positives)
                if fold_argmax is not None and need_max and coef_fn is not None else None)
    # official max: a level-specific key that equals a common key bit for bit (a prototype
    # copying a node row) takes its dots from the common GEMM, as the reference's one GEMM
    # rounds equal rows alike (``_tied_keys.common_twins``): (has_twin [N_r], the twin's
    # common column [N_r], 0 where none), or None where no rest key has one
    rest_twins = None
    if need_max and n_c and n_r:
        twin = common_twins(z, common, ridx)
        has_twin = twin >= 0
        if not host_reads_cheap(z.device) or bool(has_twin.any()):
            rest_twins = (has_twin, column_of(cidx, n)[twin.clamp(min=0)].clamp_(min=0))
    b = _block_gemms.rows(_block_rows(n, n_c, z.device, z.element_size()), use, n_c)
    gemms = _block_gemms.BlockGemms(zc, b, use, grad)
    buf = torch.empty(b, n_c, dtype=z.dtype, device=z.device)
    block_fn = (_block_exp.kernel() if z.dtype == torch.float32 and z.device.type == "cpu"
                else None)
    tbuf = torch.empty(b, n_c, dtype=z.dtype, device=z.device) if grad and not folded else None
    # (a fill, not torch.tensor(..., device=): that is a blocking host-to-device copy on CUDA)
    neg_inf = torch.full((), float("-inf"), dtype=z.dtype, device=z.device)
    for r0 in range(0, n, b):
        r1 = min(n, r0 + b)
        blk = slice(r0, r1)                                 # the block, in visiting order
        rows = blk if order is None else order[r0:r1]       # its rows (original ids)
        zb = z[rows]
        e = buf[: r1 - r0]
        # ---- common columns: one GEMM, one max, one exp for all levels
        if n_c:
            gemms.logits(e, zb, zc)                   # z_i . z_k; the step scales it: s_ik
            if max_fold is not None and max_fold.duplicates is not None:   # equal keys, equal
                dup, twin = max_fold.duplicates                            # dot products
                e[:, dup] = e[:, twin]
            if rest_twins is not None:                  # (before the step scales e in place)
                twin_dots = e[:, rest_twins[1]]
            # m_c = the row max (+ first arg-max), e <- exp(s - m_c) <= 1, exactly 0 below
            # e^-C (no denormal reaches the GEMMs below), and sum_k w_lk e_ik for every level:
            # one C pass per row where it is built (float64 sums), else six torch passes
            # The arg-max as the reference takes it: the FIRST key (smallest id) among a row's
            # maxima; the common columns are not in key order when cidx is given (the official
            # positives sort them by label), so the step takes the smallest cidx among them
            # (the column order's first gave another key where distinct rows tie exactly)
            if block_fn is not None:
                m_c, i_c, sums = _block_exp.native_step(block_fn, e, wc, need_max, cidx,
                                                        scale)
            else:
                m_c, i_c, sums = _block_exp.reference_step(e, wc, need_max, cidx, scale)
            shift = m_c[None].expand(n_levels, -1)                        # [L, b]
            shift64 = shift.double()
            rel = torch.log(sums)                                         # lse - shift
        else:
            m_c = neg_inf.expand(r1 - r0)
            i_c = torch.zeros(r1 - r0, dtype=torch.long, device=z.device)
        # ---- rest columns (level-specific keys): small dense [L, b, N_r]
        if n_r:
            s_r = zb @ zr.t()                               # [b, N_r], dot first as above
            if rest_twins is not None:
                s_r = torch.where(rest_twins[0], twin_dots, s_r)
            s_r.mul_(scale)
            if not n_c:                 # the shift: each level's unweighted row max
                shift = s_r[None].masked_fill(~vis_r[:, None, :], float("-inf")).amax(dim=2)
                shift = torch.where(finite(shift), shift, torch.zeros_like(shift))
                shift64 = shift.double()
                rel = neg_inf.expand(n_levels, r1 - r0)
            # (s - shift) + log w, -inf where hidden; not (s + log w) - shift: at |s| ~ 1e6
            # that sum rounds log w to an ulp of s (0.06), a 6% error in a rest key's p that
            # ties the max (a prototype copying the arg-max row: a mutation audit's find).
            # In float64 (small: [L, b, N_r]): where rest keys lead the common ones by D (a
            # level's prototypes far above every node row: shift is the common max), v_r and
            # rel are ~D, in fp32 each an ulp of D off (2.4e-4 at D ~ 5,500), and so were
            # p_r = exp(v_r - rel) and the arg-max fold's rest - v_t: a gradient 75 % off
            # (official_fuzz --level-labels modulo --levels 3 --seed 63, case 16656: 1.7x
            # the rule where every rounding of the fp32 reference is within it)
            v_r = (s_r.double()[None] - shift64[:, :, None]) + lwr64[:, None, :]
            lse_r = torch.logsumexp(v_r, dim=2)
            rel = torch.logaddexp(rel.double(), lse_r)
        # lse kept in float64: shift (|s| up to thousands) + rel (small) without losing the
        # digits of rel to the rounding of a large fp32 number (the official variant needs
        # lse - rowmax to full precision)
        rel64 = rel.double()
        lse_b = shift64 + rel64
        lse[:, rows] = lse_b
        rel = rel.to(z.dtype)
        max_b = None
        if need_max:
            max_b = m_c[None].expand(n_levels, -1).clone()
            arg_b = i_c[None].expand(n_levels, -1).clone()
            if n_r:
                m_r, j_r = s_r[None].masked_fill(~vis_r[:, None, :], float("-inf")).max(dim=2)
                j_r = ridx[j_r]
                # larger value wins; on a tie the smaller original index (first arg-max)
                take = (m_r > max_b) | ((m_r == max_b) & (j_r < arg_b))
                max_b = torch.where(take, m_r, max_b)
                arg_b = torch.where(take, j_r, arg_b)
            rowmax[:, rows] = max_b
            argmax[:, rows] = arg_b
        pos_r = None
        if positives is not None:
            if n_c and not grad:               # with the gradient: below, in the same pass
                positives.common_block(blk, rows, e, m_c, max_b, arg_b)
            pos_r = positives.rest_block(blk, rows, ridx, s_r if n_r else None, max_b, arg_b,
                                         grad)
        if not grad:
            continue
        # ---- gradient of sum_l g_l * lse_l, p_lik = w_lk exp(s_ik - lse_li)
        g = grad_lse[:, rows] if grad_lse is not None else coef_fn(rows, lse_b, max_b)
        if lse_in is not None:
            rel64 = lse_in[:, rows].double() - shift64
            rel = rel64.to(z.dtype)
        g = g.to(z.dtype)
        nz = g != 0
        if max_fold is not None:        # the entries (i, a_li); their shares after the loop
            entries = max_fold.entries(arg_b, e if n_c else None, v_r if n_r else None,
                                       lse_r if n_r else None)
            max_fold.record(blk, g, entries, sums if n_c else None)
            tgt, col, rcol, x = entries[:4]
        if n_c:
            a = torch.where(nz, g * torch.exp(-rel), torch.zeros_like(g))
            # a (~ g / N) goes into the GEMM operands divided by its block max and comes back
            # as the scalar alpha: operands stay O(1), so e * a * z never turns denormal
            a_max = block_norm(a, None if positives is None or folded
                               else positives.coef_max(blk), host_reads_cheap(z.device))
            a = a / a_max
            if folded:
                # t_ik = a_max a_i w_k e'_ik with e' = e, plus on the row's positives (keys of
                # its class, w_k = w_i): c_i q_ik / (a_max a_i w_i), added into e in place
                # (its forward values are spent); rows with a_i = 0 have c_i = 0, and a_i < 0
                # (the backward of reduction "none" with a negative grad_out) divides as any a_i
                if positives is not None:
                    # a divisor, not its inverse: 1 / den overflows for a row whose upstream
                    # gradient is tiny (~1e-39 in fp32), while c_i / den stays O(1)
                    # (``scaled_coefficients``, in float64)
                    den = a[0].double() * (a_max * wrow[rows].double())
                    positives.common_block(blk, rows, e, m_c, max_b, arg_b, e, den)
                if max_fold is not None:    # the entry (i, a) out (LSE part and positive)
                    set_at(e, col[0], None, 0.0)      # (after the positives wrote into e)
                dz[rows] += gemms.products(e, zwc, key_c, zb * a[0][:, None], a_max).mul_(
                    a[0][:, None] * (scale * a_max))
            else:
                t = level_weights(a, wc, tbuf[: r1 - r0])                 # sum_l a_li w_lk
                t.mul_(e)                    # t = the gradient block; e keeps the forward values
                if max_fold is not None:    # (the block adds the positive term there)
                    pos_c = max_fold.common_positive(rows, tgt, col)
                    q_c = torch.where(pos_c, positive_q(x), 0.0)
                    fold_levels(t, col, pos_c, q_c, None if positives is None
                                else positives.coef_s[:, blk], a, wc, x, a_max)
                if positives is not None:    # their sums, and + c_i q_ij / a_max into t
                    positives.common_block(blk, rows, e, m_c, max_b, arg_b, t, a_max)
                dz[rows] += gemms.products(t, zc, key_c, zb, a_max).mul_(scale * a_max)
        if n_r:
            p_r = exp_shifted_((v_r - rel64[:, :, None]).to(z.dtype))     # v_r - rel <= 0
            p_r = torch.where(nz[:, :, None], g[:, :, None] * p_r, torch.zeros_like(p_r))
            if max_fold is not None:    # the LSE part of levels whose arg-max is a rest key
                own = torch.zeros(p_r.shape, dtype=torch.bool, device=p_r.device)
                own.scatter_(2, rcol.clamp(min=0)[:, :, None], (rcol >= 0)[:, :, None])
                p_r = p_r.masked_fill(own, 0.0)
            p_r = p_r.sum(0)
            if pos_r is not None:
                p_r += pos_r
            dz[rows] += torch.mm(p_r, zr).mul_(scale)
            key_r.addmm_(p_r.t(), zb)
    rest_pairs = None
    drop = None
    if max_fold is not None:            # the arg-max keys the entries were taken out at
        drop = fold_argmax.amax = max_fold.hand_back(fold_argmax, wc, argmax, order)
    if positives is not None:
        rest_pairs = positives.finish(rowmax, argmax, grad, drop)
        if drop is not None and positives.dropped is not None:   # out of the gradient terms
            lev, r, q = positives.dropped
            fold_argmax.q_out[lev, r] = q.double()
    if not grad:
        return lse, rowmax, argmax, None
    if rest_pairs is not None:          # the official positives with a level-specific key
        i, j, c = rest_pairs            # (one per row and level): c_i q_ij on s_ij
        c = c.to(z.dtype)[:, None]
        dz.index_add_(0, i, c * z[j], alpha=scale)
        dz.index_add_(0, j, c * z[i], alpha=scale)
    gemms.finish_keys(key_c)
    if folded:
        key_c.mul_(wc[0][:, None])
    if cidx is None:
        dz.add_(key_c, alpha=scale)
    else:
        dz.index_add_(0, cidx, key_c, alpha=scale)
    if n_r:
        dz.index_add_(0, ridx, key_r, alpha=scale)
    return lse, rowmax, argmax, dz


def block_norm(a: torch.Tensor, coef_max: torch.Tensor | None, host: bool):
    """max(|a|, coef_max), or 1 where that is 0: the backward block's normaliser. A Python
    float where host reads are cheap (CPU); else a 0-dim tensor on a's device, never read on the
    host: a read per block made the host wait for the GPU's queue to drain once per block, and
    the GPU wait for the host's next launches (``_host_reads``)."""
    m = a.abs().amax()
    if coef_max is not None:
        m = torch.maximum(m, coef_max.to(m.dtype))
    if host:
        return float(m) or 1.0
    return torch.where(m > 0, m, torch.ones_like(m))


def _compute_dtype(z: torch.Tensor) -> torch.dtype:
    return torch.float64 if z.dtype == torch.float64 else torch.float32


def lse_forward(z: torch.Tensor, log_w: torch.Tensor, scale: float, need_max: bool,
                positives=None, all_visible: bool | None = None):
    """-> (lse [L, N] float64, rowmax [L, N] or None, argmax [L, N] int64 or None).

    lse is float64 here (a superset of the contract's fp32): see the comment in ``_engine``.
    ``positives``: a ``_positive_blocks.BlockPositives`` that collects the official positive
    pairs' sums from the blocks. ``all_visible``: whether every log_w is finite (every key in
    every level), if the caller knows it (None: read from log_w, a host sync on CUDA).
    """
    zc = z.to(_compute_dtype(z))
    lse, rowmax, argmax, _ = _engine(zc, log_w, float(scale), need_max, positives=positives,
                                     all_visible=all_visible)
    return lse, rowmax, argmax


def lse_backward(
    z: torch.Tensor, log_w: torch.Tensor, lse: torch.Tensor, grad_lse: torch.Tensor, scale: float
) -> torch.Tensor:
    """dz [N, d] = d/dz sum_{l,i} grad_lse[l,i] * lse[l,i] (query and key side), recomputed."""
    zc = z.to(_compute_dtype(z))
    dt = zc.dtype
    _, _, _, dz = _engine(
        zc, log_w, float(scale), False, lse_in=lse, grad_lse=grad_lse.to(dt)
    )
    return dz


def lse_fused(z: torch.Tensor, log_w: torch.Tensor, scale: float, need_max: bool,
              coef_fn: CoefFn, positives=None, fold_argmax: ArgmaxShare | None = None,
              all_visible: bool | None = None):
    """Forward and gradient in one pass: coef_fn(rows, lse_b [L,b], rowmax_b) -> g [L,b]
    (rows: the block's rows, a slice or an index tensor).

    Returns (lse, rowmax, argmax, dz) with dz = d/dz sum g * lse (+ the positive pairs' part
    when ``positives``, a ``_positive_blocks.BlockPositives``, is given). With
    ``fold_argmax`` (an ``_max_fold.ArgmaxShare``) and need_max, the entries (i, a_li) are
    left out of dz (a_li: the first key, among those whose row equals the returned arg-max's,
    visible at level l) and their LSE part and positive term handed back in it.
    ``all_visible`` as in ``lse_forward``.
    """
    zc = z.to(_compute_dtype(z))
    return _engine(zc, log_w, float(scale), need_max, coef_fn=coef_fn, positives=positives,
                   fold_argmax=fold_argmax, all_visible=all_visible)
