"""Triton kernels for the quadratic core of the class-balanced contrastive loss (DESIGN.md §3).

For embeddings Z [N, d], a scale (1/τ) and L key-weight vectors log_w [L, N] (−inf hides a key
from a level), the only all-pairs quantity of the loss is, per level l and query row i,

    lse[l, i] = log Σ_{k: log_w[l,k] > −inf} exp(scale·z_i·z_k + log_w[l, k])

i.e. attention's log-normaliser with Q = K = Z and a per-key bias, without the V product.

Forward (`lse_forward`): FlashAttention-style online max/sum over key tiles of Z·Zᵀ (`tl.dot`,
fp32 accumulation), saving only lse (L·N floats); optionally the UNWEIGHTED row max over
visible keys, scale·z_i·z_k, and its first arg-max (the official variant's M_i).
Multi-level fusion (shipped default, `fuse_levels=True`): one program computes each Z·Zᵀ tile
once and updates L running (max, sum) pairs held in [BLOCK_M, L_PAD] registers, so the GEMM
work does not grow with L; `fuse_levels=False` is the simple version (a grid axis over levels
that recomputes the tile), kept to cross-check the fused one and for A/B timing on a GPU.

Relative mode (``relative=True`` with need_max; the official loss's, 2026-11-27): the online
sums are kept against the unweighted running max r instead of the weighted one, and the
forward stores δ = lse − r (returned as float64 r + δ); the backward, given the rowmax, forms
p = e^{(s − r) + (log w − δ)}. The arg-max's own term is then exactly w_a e^{−δ}, as in a dense
computation that subtracts the max first: the official gradient cancels it against 1, and one
fp32 lse of |s|'s size left ~|s| 2⁻²⁵ of it standing (28x the tests' rule at 31 rows, B =
1,024; ``bench/official_small_n.py``). The log-weights are shifted by each level's largest
(SHIFT) so every term is <= 1; δ is then formed against the arg-max's own term (exactly
log w_a where no other key adds to the row's sum; c + log l was ~2 ulp off it, alike for
every row on one key, which the official gradient sums over a hub's rows), and handed out
apart from the float64 rowmax + δ (``return_delta``: that sum keeps δ's fp32 bits only
while |rowmax| <= 2^29). "Exactly" needs s - r formed from the ROUNDED s: this mode (and
the shared-keys mode below) launches without FMA contraction (``_utils.fp_fusion``; compiled
with Triton's default, s - r became fma(dot, scale, -r) on an H200, 2026-12-04).

Shared-keys mode (``n_common``, opt-in, untimed on a GPU: $HIERTAIL_TRITON_SHARED_LEVELS=1 in
the loss): the fused loop above still pays one exp per entry PER LEVEL. When the first
n_common keys are visible in every level (the multi-level loss's embedding rows; only the
prototypes are level-specific), their full tiles take ONE exp per entry for all levels:
Σ_k w_lk e^{s_ik} = e^{m_i + c_l} Σ_k e^{s_ik - m_i} w'_lk (m_i the running max over those keys,
c_l the level's largest finite log-weight, w' = e^{log w - c} <= 1, summed by L multiply-adds);
the remaining keys run the per-level loop in the relative mode's form (against their unweighted
running max r). The forward stores lse per level as the pair (R, δ = lse - R), R = max(m, r),
returned as float64 R + δ, because one fp32 lse rounds to ~0.008 at |s| ~ 1e5 and the backward
must see the forward's numbers. The backward factors the same way, two exps per entry
(query side, key side) whatever L: W_rc = e^{s_rc - R_r} Σ_l a_lr w'_lc + e^{s_cr - R_c} Σ_l
w'_lr a_lc with a = g e^{R + c - lse} computed by the launcher in float64 and R an fp32
reference per row (min over levels of lse - c); no overflow since s_rc - R_r is at most the log
of the weights' spread. Exps per entry at L levels: L + 2L -> 1 + 2. The other keys' p is
formed as the relative mode's, e^{(s - r) + (log w - δ)} with r = fp32(lse - c) per level.

Backward (`lse_backward`) of Σ_{l,i} g[l,i]·lse[l,i], with p_lik = exp(scale·s_ik + log_w[l,k]
− lse[l,i]) recomputed from the saved lse (FlashAttention-2 style, O(N·d) memory):
    query side  dz_i += scale·Σ_l g_li Σ_k p_lik z_k,
    key side    dz_k += scale·Σ_l Σ_i g_li p_lik z_i.
Because Q = K = Z, s is symmetric and BOTH sides of row i are sums over the same tile row:
    dz_i = scale·Σ_j W_ij z_j,   W_ij = Σ_l g_li p_lij + Σ_l g_lj p_lji,
so the shipped default (`two_pass=False`) is ONE kernel over row blocks that computes each
Z·Zᵀ tile once and does one W·Z product: half the GEMM work of the FlashAttention-2 pair of
passes, the same exp count (under the interpreter the key side re-dots the transposed
tile, see DOT_CR), no atomics, deterministic run to run (each dz row is written by exactly
one program, with a fixed loop order). `two_pass=True` runs the classic pair (query
pass → fp32 partial, then key pass that adds it), the same kernel with QUERY_SIDE/KEY_SIDE
flags, kept for cross-checks and GPU A/B timing.

Numerics: |scale·s| reaches the thousands (τ = 0.01, norms ~30), so the max is always
subtracted online. Everything stays in natural-log units with tl.exp, not the tutorial's
exp2 with log2 e folded into the scale: at |t| ~ 1e5 an fp32 ulp is ~0.01, and rounding t
and lse in log2 units before the subtraction made p 8x less accurate than torch's fp32
softmax (measured); tl.exp subtracts first, then scales the small difference. The backward's
key side must see the same s_cr the forward used for lse[c] (see DOT_CR). fp32 inputs use
IEEE fp32 dots by default (TF32 would give errors ~|s|·2⁻¹¹, i.e. O(1) at |s| ~ 1000), or
3xTF32 tensor-core dots with ``fp32_dot="tf32x3"`` / $HIERTAIL_TRITON_FP32_DOT (products
within ~3·2⁻²² relative instead of 2⁻²⁴, fp32 accumulation; ``_utils.FP32_DOTS``): the
one-pass backward's transposed tile should stay consistent with the forward's (the same
products in the same order, and big + small is commutative; the CUDA tests check it);
bf16/fp16 inputs use native dots (exact products, fp32 accumulation) for Z·Zᵀ and a TF32 dot
for W·Z with W kept in fp32 (bf16/fp16 → fp32 is exact; casting W itself to fp16 would
underflow for g ~ 1/N). Under TRITON_INTERPRET=1 every dot is a numpy fp32 matmul, so the
GPU precision modes are not exercised by the CPU tests (their plumbing is).

Key splits (``key_splits`` / $HIERTAIL_TRITON_KEY_SPLITS, automatic on CUDA where the row
blocks cannot fill the GPU: ``_utils.key_splits``): flash-decoding's split-K over the keys. The
forward's grid gains an axis of S splits, each summing its own whole key tiles; per row and
level a split stores its reference point (the relative mode's unweighted max r_s, the plain
mode's running max m_s) and its log-sum δ_s against it, exact to fp32 precision of their own
sizes, and `_merge_splits` forms lse = B + log Σ_s e^{δ_s + ref_s − B} in float64 (B = max_s
(δ_s + ref_s)): the relative mode's rowmax + δ and the plain mode's lse as precise as unsplit;
the row max and first arg-max are the first split's attaining the largest max (splits in key
order), bit for bit the unsplit ones. The one-pass backward's splits write fp32 [N, d]
partials of dz, summed in split order (deterministic). One split compiles the unsplit code
(SPLIT off). The shared-keys mode splits too (each split takes its share of the common tiles,
then of the rest; its pair (m_s, δ_s) merges like the others). Not with the two-pass backward.

Tiles: fixed per head dimension (``_utils.pair_blocks``; 8 warps since 2026-12-05, 4 in the H200
figures below: the same tiles spill far less, see ``_utils.TABLE_WARPS``), or timed by
``triton.autotune`` over ``_utils.TUNE_TILES`` with ``autotune=True`` /
$HIERTAIL_TRITON_AUTOTUNE=1 (CUDA only; never
under the interpreter, where the tiles must be square for DOT_CR). The launchers' defaults are
"ieee" and fixed tiles; the loss engine (``ops/_triton_loss.py``) asks for "tf32x3" where the
logits allow it (measured precision there).

Conventions: a row with no visible key has lse = −inf, rowmax = −inf and argmax = 0 (a safe
index; rowmax = −inf marks it), and contributes nothing to dz (no NaN). Program offsets are
int64 (N·d may exceed 2³¹).

Measured on an NVIDIA H200 (torch 2.11, triton 3.6, 2026-11-27, bench/loss_profile.py, fwd+bwd
of the whole loss, d = 64, 3xTF32 dots, the fixed tiles with 4 warps): exact 1 level 10.2 /
32.4 / 121 ms at N = 20k / 50k / 100k (0.66 / 0.50 / 0.47x SDPA fp32 fwd+bwd; 1.01x the cuBLAS
3-GEMM floor at 100k), 3 levels 22.6 / 67.9 / 238 ms; with "ieee" dots 258 ms at 20k
(unsplit: the key splits came after, 2026-12-05, untimed; they are for the 20k row's
half-empty second wave). Not measured
yet: d = 128, the autotuned tiles, ``fuse_levels=False`` / ``two_pass=True`` against the
defaults, the shared-keys mode, the "lean" tiles ($HIERTAIL_TRITON_TILES, ``_utils.LEAN_TILES``),
the table's 8 warps.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from hiertail_fast.ops._finite import finite

from ._utils import (
    autotune_requested,
    cuda_arch,
    feature_block,
    fp_fusion,
    interpreting,
    launch_fitting,
    pair_blocks,
    prune_trapping,
    split_request,
    tune_configs,
)
from ._utils import fp32_dot as fp32_dot_precision
from ._utils import key_splits as split_count

_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _key_tile(Z, offs_n, n_valid, offs_d, d_valid, stride_z, UPCAST: tl.constexpr):
    """Rows offs_n of Z as a [BLOCK_N, D_PAD] tile (zeros outside n_valid / d_valid), in fp32
    under UPCAST (see _precisions)."""
    k = tl.load(Z + offs_n.to(tl.int64)[:, None] * stride_z + offs_d[None, :],
                mask=n_valid[:, None] & d_valid[None, :], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
    return k


@triton.jit
def _visible_max(s, lw, offs_n, N):
    """Per row of the score tile s: the unweighted max over the visible keys (log-weight
    > −inf) and its lowest index among ties (N if none is visible)."""
    sv = tl.where((lw > float("-inf"))[None, :], s, float("-inf"))
    tile_max = tl.max(sv, 1)
    return tile_max, tl.min(tl.where(sv == tile_max[:, None], offs_n[None, :], N), 1)


@triton.jit
def _key_range(split, N, NUM_SPLITS, BLOCK_N: tl.constexpr):
    """[key_lo, key_hi) of key split `split` of NUM_SPLITS: whole key tiles, cdiv(tiles,
    NUM_SPLITS) of them each, so a split's tiles are the unsplit loop's own and every score is
    the same dot (the one-pass backward recomputes the forward's); the last splits are empty
    (key_lo >= key_hi) when there are fewer tiles than splits. key_lo is a multiple of BLOCK_N
    (said to the compiler, as the unsplit loop's start 0 was: aligned loads of the key
    weights); both int32 like N, computed in int64 and kept <= the tiles' end."""
    tiles = tl.cdiv(N, BLOCK_N).to(tl.int64)
    per = tl.cdiv(tiles, NUM_SPLITS) * BLOCK_N
    lo = tl.minimum(split.to(tl.int64) * per, tiles * BLOCK_N)
    hi = tl.minimum(lo + per, N)
    return tl.multiple_of(lo.to(tl.int32), BLOCK_N), hi.to(tl.int32)


@triton.jit
def _common_tiles(tail, split_lo, split_hi, SPLIT: tl.constexpr):
    """The shared-keys mode's common key tiles [0, tail) one program loops over: all of them,
    or under SPLIT those in its split [split_lo, split_hi) (`_key_range`; whole tiles)."""
    lo, hi = 0, tail
    if SPLIT:
        lo, hi = split_lo, tl.minimum(tail, split_hi)
    return lo, hi


@triton.jit
def _other_tiles(tail, N, split_lo, split_hi, SPLIT: tl.constexpr, SHARED: tl.constexpr):
    """The key tiles [tail, N) after the common ones (tail = 0 without SHARED) one program loops
    over: all of them, or under SPLIT those in its split [split_lo, split_hi)."""
    lo, hi = tail, N
    if SPLIT:
        lo, hi = split_lo, split_hi
        if SHARED:
            lo = tl.maximum(tail, split_lo)
    return lo, hi


@triton.jit
def _balanced_contrastive_loss_fwd_kernel(
    Z, LOG_W, SHIFT, LSE, ROWMAX, ARGMAX, MRUN,
    N, N_COMMON, D, stride_z, scale, NUM_SPLITS,
    NUM_LEVELS: tl.constexpr, L_PAD: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NEED_MAX: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    SHARED: tl.constexpr, RELATIVE: tl.constexpr, SPLIT: tl.constexpr,
    SPLIT_PAIR: tl.constexpr,
):
    # grid = (cdiv(N, BLOCK_M), L // NUM_LEVELS, NUM_SPLITS): this program owns rows offs_m for
    # levels level0 .. level0 + NUM_LEVELS - 1 (NUM_LEVELS = L when fused, 1 when not) over the
    # keys of split program_id(2) under SPLIT (`_key_range`; else every key: the code of an
    # unsplit launch is the one it was before splits existed). Its outputs go to plane
    # program_id(2) of [NUM_SPLITS, L, N] buffers, merged by the launcher (`_merge_splits`);
    # SPLIT_PAIR (the plain mode, split): it stores its running max to MRUN and log l to LSE,
    # the pair the merge needs, instead of lse = m + log l. SHARED stores its pair (R, δ) there
    # too, split or not (see the end of the kernel).
    # RELATIVE (with NEED_MAX, not SHARED): the running sum is kept against the UNWEIGHTED
    # running max r (the official variant's M_i) and the kernel stores δ = lse - r, not lse:
    # l = Σ_k e^{(s_ik - r) + (log w_k - c_l)}, δ = c_l + log l (c_l = SHIFT[l], the level's
    # largest finite log-weight, so every term is <= 1). The arg-max's own term is then exactly
    # e^{log w_a - c_l} (s - r = 0 on the same fp32 score), and δ has the size of log N, not of
    # |s|: one fp32 lse rounds to ~|s| 2^-24, which the official gradient's cancellation of
    # the arg-max term against p_ia ~ 1 exposed at small N (bench/official_small_n.py).
    level0 = tl.program_id(1).to(tl.int64) * NUM_LEVELS
    offs_m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_valid = offs_m < N
    offs_d = tl.arange(0, D_PAD)
    d_valid = offs_d < D
    q = tl.load(Z + offs_m[:, None] * stride_z + offs_d[None, :],
                mask=m_valid[:, None] & d_valid[None, :], other=0.0)
    if UPCAST:  # see _precisions: exact, bf16 products are exact in fp32
        q = q.to(tl.float32)
    cols = tl.arange(0, L_PAD)
    # One column per level: running max m_run and running sum l_run of exp(t - m_run).
    m_run = tl.full([BLOCK_M, L_PAD], float("-inf"), tl.float32)
    l_run = tl.zeros([BLOCK_M, L_PAD], tl.float32)
    rmax = tl.full([BLOCK_M, L_PAD], float("-inf"), tl.float32)
    ridx = tl.zeros([BLOCK_M, L_PAD], tl.int32)
    split_lo, split_hi = 0, N          # this program's keys: all, unless SPLIT
    if SPLIT:
        split_lo, split_hi = _key_range(tl.program_id(2), N, NUM_SPLITS, BLOCK_N)
    tail = 0
    if SHARED:
        # Keys [0, N_COMMON) are visible in every level (see `lse_forward`'s n_common): ONE exp
        # per entry serves all levels, Σ_k w_lk e^{s_ik} = e^{m_i + c_l} Σ_k e^{s_ik - m_i} w'_lk
        # with m_i the running max over these keys and w' = e^{log w - c_l} <= 1 (c_l = SHIFT:
        # the level's largest finite log-weight). Full tiles only; the rest runs the loop below.
        tail = (N_COMMON // BLOCK_N) * BLOCK_N
        c_sh = tl.load(SHIFT + level0 + cols, mask=cols < NUM_LEVELS, other=0.0)
        m_c = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_c = tl.zeros([BLOCK_M, L_PAD], tl.float32)
        common_lo, common_hi = _common_tiles(tail, split_lo, split_hi, SPLIT)
        for start_n in range(common_lo, common_hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = _key_tile(Z, offs_n, offs_n < N_COMMON, offs_d, d_valid, stride_z, UPCAST)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
            tile_max = tl.max(s, 1)
            m_new = tl.maximum(m_c, tile_max)
            e = tl.exp(s - m_new[:, None])
            l_c = l_c * tl.exp(m_c - m_new)[:, None]
            for j in tl.static_range(NUM_LEVELS):
                c_j = tl.sum(tl.where(cols == j, c_sh, 0.0), 0)
                w_j = tl.exp(tl.load(LOG_W + (level0 + j) * N + offs_n) - c_j)
                l_c += tl.where((cols == j)[None, :], tl.sum(e * w_j[None, :], 1)[:, None], 0.0)
            if NEED_MAX:  # the unweighted max over common keys is m itself; first arg-max
                tile_arg = tl.min(tl.where(s == tile_max[:, None], offs_n[None, :], N), 1)
                better = (tile_max > m_c)[:, None]
                rmax = tl.where(better, tile_max[:, None], rmax)
                ridx = tl.where(better, tile_arg[:, None], ridx)
            m_c = m_new
    key_lo, key_hi = _other_tiles(tail, N, split_lo, split_hi, SPLIT, SHARED)
    for start_n in range(key_lo, key_hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_valid = offs_n < N
        k = _key_tile(Z, offs_n, n_valid, offs_d, d_valid, stride_z, UPCAST)
        # the tile of Z·Zᵀ, computed once for all the levels this program carries
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
        for j in tl.static_range(NUM_LEVELS):
            lw = tl.load(LOG_W + (level0 + j) * N + offs_n, mask=n_valid, other=float("-inf"))
            sel = (cols == j)[None, :]
            if RELATIVE or SHARED:     # (SHARED: the keys after the common tiles, see below)
                c_j = tl.load(SHIFT + level0 + j)
                tile_max, tile_arg = _visible_max(s, lw, offs_n, N)
                r_old = tl.max(tl.where(sel, rmax, float("-inf")), 1)
                l_old = tl.sum(tl.where(sel, l_run, 0.0), 1)
                r_new = tl.maximum(r_old, tile_max)
                # reference point: 0 while the row has seen no visible key (l_old = 0 then)
                r_ref = tl.where(r_new == float("-inf"), 0.0, r_new)
                e = tl.exp((s - r_ref[:, None]) + (lw - c_j)[None, :])
                l_new = l_old * tl.exp(r_old - r_ref) + tl.sum(e, 1)
                l_run = tl.where(sel, l_new[:, None], l_run)
                better = sel & (tile_max > r_old)[:, None]          # ties -> lowest index
                rmax = tl.where(better, tile_max[:, None], rmax)
                ridx = tl.where(better, tile_arg[:, None], ridx)
            else:
                t = s + lw[None, :]
                m_old = tl.max(tl.where(sel, m_run, float("-inf")), 1)
                l_old = tl.sum(tl.where(sel, l_run, 0.0), 1)
                m_new = tl.maximum(m_old, tl.max(t, 1))
                # reference point: 0 while the row has seen no visible key (avoids −inf − −inf)
                m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
                l_new = l_old * tl.exp(m_old - m_ref) + tl.sum(tl.exp(t - m_ref[:, None]), 1)
                m_run = tl.where(sel, m_new[:, None], m_run)
                l_run = tl.where(sel, l_new[:, None], l_run)
                if NEED_MAX:       # ties -> lowest index (strict > across tiles)
                    tile_max, tile_arg = _visible_max(s, lw, offs_n, N)
                    r_old = tl.max(tl.where(sel, rmax, float("-inf")), 1)
                    better = sel & (tile_max > r_old)[:, None]
                    rmax = tl.where(better, tile_max[:, None], rmax)
                    ridx = tl.where(better, tile_arg[:, None], ridx)
    # l_run = 0 exactly when the row saw no visible key (m_run = −inf)
    if RELATIVE or SHARED:      # δ = lse - rowmax (see the top of the kernel)
        c_all = tl.load(SHIFT + level0 + cols, mask=cols < NUM_LEVELS, other=0.0)
        lse = tl.where(l_run > 0, c_all[None, :] + tl.log(tl.where(l_run > 0, l_run, 1.0)),
                       float("-inf"))
        if RELATIVE:
            # δ taken against the arg-max's own term t_a = e^{log w_a - c} (the loop added
            # exactly that: s_a - r = 0): δ = log w_a + log1p((l - t_a) / t_a), exactly log w_a
            # where no other key adds to l. c + log l rounds twice off it (~2 ulp), the same
            # way for every row whose softmax sits on one key, and the official gradient
            # sums g (p_ia - 1) over the rows sharing an arg-max key (hubs), so that rounding
            # added up: 1.5x the tests' rule at 150 rows, d = 1 (bench/official_fuzz.py).
            # Rows whose t_a is not a normal float (log-weights spread past ~87 in a level)
            # keep c + log l.
            lvl_rows = (level0 + cols)[None, :] * N + ridx
            live = m_valid[:, None] & (cols < NUM_LEVELS)[None, :] & (l_run > 0)
            lw_a = tl.load(LOG_W + lvl_rows, mask=live, other=0.0)
            t_a = tl.exp(lw_a - c_all[None, :])
            use_a = live & (t_a >= 1.1754943508222875e-38)
            t_ok = tl.where(use_a, t_a, 1.0)
            x = (l_run - t_ok) / t_ok          # >= 0: rounded sums of terms >= 0 never drop
            u = 1.0 + x
            # log1p(x) to log's precision (Kahan's form; Triton has no log1p): x where u = 1
            lp = tl.where(u == 1.0, x, tl.log(tl.where(u > 0, u, 1.0)) * (x / tl.where(
                u == 1.0, 1.0, u - 1.0)))
            lse = tl.where(use_a, lw_a + lp, lse)
    elif SPLIT_PAIR:  # this split's (m, log l); the launcher merges the splits' pairs
        lse = tl.where(l_run > 0, tl.log(tl.where(l_run > 0, l_run, 1.0)), float("-inf"))
    else:
        lse = tl.where(l_run > 0, m_run + tl.log(tl.where(l_run > 0, l_run, 1.0)),
                       float("-inf"))
    if SHARED:
        # lse = R + δ stored as the pair (MRUN = R, LSE = δ) per level, R = max(m_c, r): δ
        # has the size of log N and the log-weights, not of |s|, so the backward recomputes p
        # to fp32 precision at |s| ~ 1e5 (a single fp32 lse there is rounded to ~0.008).
        # Common part: c + log l_c against m_c; the other keys (the relative loop above):
        # δ_t = c + log l_run against r = rmax. Both references are fp32 scores, so where
        # either part matters (R - m_c or R - r within the log-weights' spread) their
        # difference is exact (Sterbenz); log-added. (A fuzzing find, 2026-12-05: the other
        # keys' lse was an fp32 m_run + log l_run of |s|'s size and merged against m_c, so a
        # row whose largest term is one of those keys (its own, a prototype) had lse off by
        # up to an ulp of |s| and p = e^0 of that key off by as much: up to 4.8x the tests'
        # rule at logit bounds 3.8e3-2.5e4.) (rmax / ridx: common first, the rest only if
        # strictly greater.)
        rel_c = tl.where(l_c > 0, c_sh[None, :] + tl.log(tl.where(l_c > 0, l_c, 1.0)),
                         float("-inf"))
        ref = tl.maximum(m_c[:, None], rmax)
        ref = tl.where(ref == float("-inf"), 0.0, ref)   # 0 for a row with no visible key
        part_c = tl.where(rel_c == float("-inf"), float("-inf"), (m_c[:, None] - ref) + rel_c)
        part_t = tl.where(lse == float("-inf"), float("-inf"), (rmax - ref) + lse)
        top = tl.maximum(part_c, part_t)
        top_ref = tl.where(top == float("-inf"), 0.0, top)
        both = tl.exp(part_c - top_ref) + tl.exp(part_t - top_ref)
        lse = tl.where(top == float("-inf"), float("-inf"),
                       top_ref + tl.log(tl.where(top == float("-inf"), 1.0, both)))
    out = (level0 + cols)[None, :] * N + offs_m[:, None]
    if SPLIT:  # plane program_id(2) of [NUM_SPLITS, L, N] (L: level programs x NUM_LEVELS)
        out += tl.program_id(2).to(tl.int64) * tl.num_programs(1) * NUM_LEVELS * N
    out_mask = m_valid[:, None] & (cols < NUM_LEVELS)[None, :]
    tl.store(LSE + out, lse, mask=out_mask)
    if SPLIT_PAIR:
        tl.store(MRUN + out, m_run, mask=out_mask)
    if SHARED:
        tl.store(MRUN + out, ref, mask=out_mask)
    if NEED_MAX:
        tl.store(ROWMAX + out, rmax, mask=out_mask)
        tl.store(ARGMAX + out, ridx.to(tl.int64), mask=out_mask)


@triton.jit
def _balanced_contrastive_loss_bwd_kernel(
    Z, LOG_W, SHIFT, REF, COEF, LSE, ROWMAX, ARGMAX, ARGMAX_COEF, GRAD, PARTIAL, DZ,
    N, N_COMMON, D, stride_z, scale, NUM_SPLITS,
    NUM_LEVELS: tl.constexpr, L_PAD: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    QUERY_SIDE: tl.constexpr, KEY_SIDE: tl.constexpr, ADD_PARTIAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, GRAD_DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    DOT_RC: tl.constexpr, DOT_CR: tl.constexpr, SHARED: tl.constexpr, RELATIVE: tl.constexpr,
    FOLD_ARGMAX: tl.constexpr, SPLIT: tl.constexpr,
):
    # One program per block of rows r; it loops over all column tiles c and accumulates
    #   dz_r = scale · Σ_c W_rc z_c,
    #   W_rc = [QUERY_SIDE] Σ_l g_lr p_lrc  +  [KEY_SIDE] Σ_l g_lc p_lcr     (s_rc = s_cr).
    # QUERY_SIDE only = FlashAttention-2's dq pass, KEY_SIDE only = its dk pass; both = the
    # one-pass symmetric backward. ADD_PARTIAL adds an fp32 [N, d] buffer (the dq pass).
    # DOT_RC: compute s_rc = z_r·z_c (query side; key side too unless DOT_CR). DOT_CR: the key
    # side recomputes s_cr = (Z_c·Z_rᵀ)ᵀ in the orientation the forward used for rows c, so
    # p_lcr is consistent with lse[l, c] even where a dot is not bitwise symmetric (numpy
    # under the interpreter: measured 6x larger dz error at |s| ~ 1e5 without it).
    # RELATIVE: LSE holds the forward's δ = lse - r and ROWMAX its r (0 on dead rows), and
    # p = e^{(s - r) + (log w - δ)}: the arg-max's p is e^{log w_a - δ} to fp32 precision
    # (the same fp32 score as the forward's r), not rounded through an fp32 lse of |s|'s size.
    # SHARED uses the same form outside its common tiles, with r = fp32(lse - c) per level
    # (the launcher's; s - r is exact where p matters, δ ~ c has the log-weights' size).
    # FOLD_ARGMAX (with RELATIVE, key side): the key side of W takes g_li (p_lia - 1) + h_li
    # at a = ARGMAX[l, i] (h = ARGMAX_COEF: the rest of the official gradient on the row max,
    # its positives' share): the row max's share (-g_li on s_ia) on its key cancelled per
    # entry, as a dense computation does, not after both were summed over the rows sharing
    # that key (~N ulp of the terms). Its query side, on row i alone, is the caller's.
    # SPLIT (NUM_SPLITS on grid axis 1; not with ADD_PARTIAL): this program sums over
    # the column tiles of key split program_id(1) only and writes plane program_id(1) of an
    # fp32 [NUM_SPLITS, N, d] DZ, which the launcher sums (each pair (r, c) is in one split).
    offs_m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_valid = offs_m < N
    offs_d = tl.arange(0, D_PAD)
    d_valid = offs_d < D
    tile_mask = m_valid[:, None] & d_valid[None, :]
    q = tl.load(Z + offs_m[:, None] * stride_z + offs_d[None, :], mask=tile_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    cols = tl.arange(0, L_PAD)
    lvl = cols[None, :].to(tl.int64) * N + offs_m[:, None]
    lvl_mask = m_valid[:, None] & (cols < NUM_LEVELS)[None, :]
    n_keys = tl.cast(N, tl.int64)   # level j's keys start at j·N, in int64 (int32 wrapped)
    # This block's rows, per level. Dead rows (padding, no visible key) get lse = +inf and
    # g = 0, so every p involving them is exp(-inf) = 0: no NaN.
    lse_r = tl.load(LSE + lvl, mask=lvl_mask, other=float("-inf"))
    g_r = tl.load(GRAD + lvl, mask=lvl_mask, other=0.0)
    g_r = tl.where(lse_r > float("-inf"), g_r, 0.0)
    lse_r = tl.where(lse_r > float("-inf"), lse_r, float("inf"))
    lw_r = tl.load(LOG_W + lvl, mask=lvl_mask, other=float("-inf"))
    if RELATIVE or SHARED:
        ref_rows = tl.load(ROWMAX + lvl, mask=lvl_mask, other=0.0)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    split_lo, split_hi = 0, N          # this program's keys: all, unless SPLIT
    if SPLIT:
        split_lo, split_hi = _key_range(tl.program_id(1), N, NUM_SPLITS, BLOCK_N)
    tail = 0
    if SHARED:
        # A row block of common keys against full tiles of common keys (see the forward):
        # p_lrc = e^{s_rc - R_r} · w'_lc · e^{R_r + c_l - lse_lr} (R: an fp32 reference per row,
        # REF, ~min_l (lse_lr - c_l)), so one exp per entry and side serves every level:
        #   W_rc = e^{s_rc - R_r} Σ_l a_lr w'_lc + e^{s_cr - R_c} Σ_l w'_lr a_lc,
        # a = g e^{R + c - lse} (COEF, from the launcher in float64 from the forward's
        # float64 lse: precise where s - R and R + c - lse are each rounded to |s|'s ulp), w' =
        # e^{log w - c} <= 1. No overflow: s_rc + log w_lc <= lse_lr at every level gives
        # s_rc - R_r <= max_l (c_l - log w_lc) + rounding: the log of the weights' spread.
        common_rows = (tl.program_id(0) + 1) * BLOCK_M <= N_COMMON
        tail = tl.where(common_rows, (N_COMMON // BLOCK_N) * BLOCK_N, 0)
        c_sh = tl.load(SHIFT + cols, mask=cols < NUM_LEVELS, other=0.0)
        ref_r = tl.load(REF + offs_m, mask=m_valid, other=0.0)
        a_r = tl.load(COEF + lvl, mask=lvl_mask, other=0.0)
        wk_r = tl.exp(lw_r - c_sh[None, :])                       # rows as keys: w'_lr
        common_lo, common_hi = _common_tiles(tail, split_lo, split_hi, SPLIT)
        for start_n in range(common_lo, common_hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = _key_tile(Z, offs_n, offs_n < N_COMMON, offs_d, d_valid, stride_z, UPCAST)
            s_rc = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
            if DOT_CR:
                s_cr = tl.trans(tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)) * scale
            else:
                s_cr = s_rc
            ref_c = tl.load(REF + offs_n)
            qa = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            kb = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for j in tl.static_range(NUM_LEVELS):
                sel = (cols == j)[None, :]
                c_j = tl.sum(tl.where(cols == j, c_sh, 0.0), 0)
                col = j * n_keys + offs_n
                if QUERY_SIDE:
                    wk_c = tl.exp(tl.load(LOG_W + col) - c_j)
                    qa += tl.sum(tl.where(sel, a_r, 0.0), 1)[:, None] * wk_c[None, :]
                if KEY_SIDE:
                    a_c = tl.load(COEF + col)
                    kb += tl.sum(tl.where(sel, wk_r, 0.0), 1)[:, None] * a_c[None, :]
            w = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            if QUERY_SIDE:
                w += tl.exp(s_rc - ref_r[:, None]) * qa
            if KEY_SIDE:
                w += tl.exp(s_cr - ref_c[None, :]) * kb
            acc = tl.dot(w, k.to(tl.float32), acc, input_precision=GRAD_DOT_PRECISION)
    key_lo, key_hi = _other_tiles(tail, N, split_lo, split_hi, SPLIT, SHARED)
    for start_n in range(key_lo, key_hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_valid = offs_n < N
        k = _key_tile(Z, offs_n, n_valid, offs_d, d_valid, stride_z, UPCAST)
        if DOT_RC:
            s_rc = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
        if DOT_CR:
            s_cr = tl.trans(tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)) * scale
        else:
            s_cr = s_rc
        w = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for j in tl.static_range(NUM_LEVELS):
            sel = (cols == j)[None, :]
            col = j * n_keys + offs_n
            if QUERY_SIDE:  # rows as queries, tile columns as keys
                lw_c = tl.load(LOG_W + col, mask=n_valid, other=float("-inf"))
                lse_j = tl.max(tl.where(sel, lse_r, float("-inf")), 1)
                g_j = tl.sum(tl.where(sel, g_r, 0.0), 1)
                if RELATIVE or SHARED:
                    r_j = tl.sum(tl.where(sel, ref_rows, 0.0), 1)
                    w += g_j[:, None] * tl.exp((s_rc - r_j[:, None])
                                               + (lw_c[None, :] - lse_j[:, None]))
                else:
                    w += g_j[:, None] * tl.exp(s_rc + lw_c[None, :] - lse_j[:, None])
            if KEY_SIDE:  # tile columns as queries, rows as keys
                lse_c = tl.load(LSE + col, mask=n_valid, other=float("-inf"))
                g_c = tl.load(GRAD + col, mask=n_valid, other=0.0)
                g_c = tl.where(lse_c > float("-inf"), g_c, 0.0)
                lse_c = tl.where(lse_c > float("-inf"), lse_c, float("inf"))
                lw_j = tl.max(tl.where(sel, lw_r, float("-inf")), 1)
                if RELATIVE or SHARED:
                    r_c = tl.load(ROWMAX + col, mask=n_valid, other=0.0)
                    p = tl.exp((s_cr - r_c[None, :]) + (lw_j[:, None] - lse_c[None, :]))
                    if FOLD_ARGMAX:   # rows as keys: g (p - 1) + h where the row is query
                        a_c = tl.load(ARGMAX + col, mask=n_valid, other=-1)   # c's arg-max
                        at = offs_m[:, None] == a_c[None, :]
                        h_c = tl.load(ARGMAX_COEF + col, mask=n_valid, other=0.0)
                        w += g_c[None, :] * (p - tl.where(at, 1.0, 0.0))
                        w += tl.where(at, h_c[None, :], 0.0)
                    else:
                        w += g_c[None, :] * p
                else:
                    w += g_c[None, :] * tl.exp(s_cr + lw_j[:, None] - lse_c[None, :])
        # W stays fp32 (it can be ~1e-10 when g ~ 1/N: an fp16 cast would flush it to zero)
        acc = tl.dot(w, k.to(tl.float32), acc, input_precision=GRAD_DOT_PRECISION)
    acc = acc * scale
    out = offs_m[:, None] * D + offs_d[None, :]
    if SPLIT:
        out += tl.program_id(1).to(tl.int64) * N * D
    if ADD_PARTIAL:
        acc += tl.load(PARTIAL + out, mask=tile_mask, other=0.0)
    tl.store(DZ + out, acc.to(DZ.dtype.element_ty), mask=tile_mask)


def _check(z: torch.Tensor, log_w: torch.Tensor) -> tuple[int, int, int]:
    if z.dim() != 2 or z.dtype not in _SUPPORTED:
        raise TypeError(f"z must be a 2-D float32/float16/bfloat16 tensor, got {z.dtype} "
                        f"with shape {tuple(z.shape)}")
    if z.shape[1] > 256:
        raise ValueError(f"the triton kernels support d <= 256, got d = {z.shape[1]}")
    if log_w.dim() != 2 or log_w.shape[1] != z.shape[0] or log_w.shape[0] < 1:
        raise ValueError(f"log_w must have shape [L >= 1, N = {z.shape[0]}], "
                         f"got {tuple(log_w.shape)}")
    if log_w.device != z.device:
        raise ValueError(f"log_w is on {log_w.device}, z on {z.device}")
    return log_w.shape[0], z.shape[0], z.shape[1]


def _precisions(dtype: torch.dtype, on_cuda: bool, fp32_dot: str = "ieee"
                ) -> tuple[str, str, bool]:
    """(Z·Zᵀ dot precision, W·Z dot precision, UPCAST) for inputs of `dtype`, see the module
    docstring; `fp32_dot` (``_utils.FP32_DOTS``) is the precision of fp32 inputs' dots.

    UPCAST: the CPU interpreter multiplies bf16 tiles as raw integers, so there the tiles are
    converted to fp32 first (the same numbers: bf16 products are exact in fp32).
    """
    if dtype == torch.float32:
        return fp32_dot, fp32_dot, False
    if dtype == torch.bfloat16 and not on_cuda:
        return "ieee", "ieee", True
    return "tf32", "tf32", False


# The autotuned kernels (triton.autotune over _utils.TUNE_TILES), built on first use: only CUDA
# launches use them, so the interpreter never constructs an autotuner. Tuned per shape and per
# compile-time mode (the keys); the chosen config is reused by every later call with that key.
_TUNED: dict[str, object] = {}
_TUNE_KEYS = {
    "fwd": ["N", "D", "NUM_LEVELS", "NEED_MAX", "DOT_PRECISION", "SHARED", "RELATIVE",
            "NUM_SPLITS"],
    "bwd": ["N", "D", "NUM_LEVELS", "QUERY_SIDE", "KEY_SIDE", "DOT_PRECISION", "SHARED",
            "RELATIVE", "FOLD_ARGMAX", "NUM_SPLITS"],
}


_KERNELS = {"fwd": _balanced_contrastive_loss_fwd_kernel,
            "bwd": _balanced_contrastive_loss_bwd_kernel}


def _tuned(which: str):
    if which not in _TUNED:
        _TUNED[which] = triton.autotune(
            configs=tune_configs(), key=_TUNE_KEYS[which],
            prune_configs_by={"early_config_prune": prune_trapping})(_KERNELS[which])
    return _TUNED[which]


def _launch(which: str, n: int, axis1: int, tiles, tune: bool, args: tuple, meta: dict,
            axis2: int = 1) -> None:
    """One launch over cdiv(n, BLOCK_M) row blocks (x axis1 x axis2): fixed `tiles` (BLOCK_M,
    BLOCK_N, num_warps), or a smaller tile where the GPU cannot hold them
    (``_utils.launch_fitting``), or, with `tune`, the autotuned kernel, whose config supplies
    them (triton's autotuner skips the configs a GPU cannot hold)."""
    fusion = fp_fusion(bool(meta.get("RELATIVE") or meta.get("SHARED")))
    if tune:
        _tuned(which)[lambda cfg: (triton.cdiv(n, cfg["BLOCK_M"]), axis1, axis2)](
            *args, **meta, **fusion)
        return
    def run(tile):
        block_m, block_n, warps = tile
        _KERNELS[which][(triton.cdiv(n, block_m), axis1, axis2)](
            *args, **meta, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, **fusion)

    launch_fitting(run, tiles, f"the loss's Triton {which} kernel", args[0], meta)


def _use_autotune(z: torch.Tensor, autotune: bool | None) -> bool:
    """Autotune when asked (argument, else $HIERTAIL_TRITON_AUTOTUNE) and on CUDA; the
    interpreter keeps the fixed square tiles its DOT_CR recomputation needs."""
    return autotune_requested(autotune) and z.is_cuda and not interpreting()


def _shared_shift(log_w: torch.Tensor, n_common: int) -> torch.Tensor | None:
    """[L] fp32 c_l = the level's largest finite log-weight (``_level_shift``: the common
    keys' w' = e^{log w - c} and the other keys' relative terms are then <= 1) for the
    shared-keys mode (None when off), after checking its precondition: every one of the first
    n_common keys visible in every level (one host sync; a key hidden everywhere would be
    unbounded against the backward's reference)."""
    n = log_w.shape[1]
    if not isinstance(n_common, int) or isinstance(n_common, bool) or not 0 <= n_common <= n:
        raise ValueError(f"n_common must be an int in [0, N = {n}], got {n_common!r}")
    if n_common == 0:
        return None
    head = log_w[:, :n_common].to(torch.float32)
    if not bool(finite(head).all()):
        raise ValueError(f"n_common = {n_common}: the first n_common keys must be visible "
                         "(finite log_w) in every level")
    return _level_shift(log_w)


def _level_shift(log_w: torch.Tensor) -> torch.Tensor:
    """[L] fp32 c_l = the largest finite log-weight of level l (0 for a level with none), the
    relative mode's shift: its terms e^{(s - r) + (log w - c)} are then <= 1 (no host sync)."""
    visible = finite(log_w)
    top = torch.where(visible, log_w, torch.full_like(log_w, -math.inf)).amax(dim=1)
    return torch.where(finite(top), top, torch.zeros_like(top)).contiguous()


def _relative_pair(lse: torch.Tensor, rowmax: torch.Tensor, delta: torch.Tensor | None = None):
    """(δ = lse - rowmax [L, N] fp32, −inf on dead rows; reference r = rowmax, 0 on dead rows)
    of the backward's relative mode: the forward's δ where given (``return_delta``), else
    formed in float64 from its lse = rowmax + δ, which holds δ to fp32 precision only while
    |rowmax| <= 2^29 (float64 rounds the sum to |rowmax| 2^-53: 1.5e-5 at 1e11, 128 ulp of a δ
    ~ log 31, and the official gradient's cancellation at the arg-max exposed it: 2.7x the
    tests' rule at B = 1.1e11, 31 rows; bench/official_fuzz.py)."""
    r64 = rowmax.double()
    rel = lse.double() - r64 if delta is None else delta.double()
    live = finite(rel) & finite(r64)
    rel = torch.where(live, rel, torch.full_like(rel, -math.inf))
    ref = torch.where(live, r64, torch.zeros_like(r64))
    return rel.float().contiguous(), ref.float().contiguous()


def _shared_coefficients(lse: torch.Tensor, grad_lse: torch.Tensor, shift: torch.Tensor):
    """(R [N] fp32, a [L, N] fp32, r [L, N] fp32) of the backward's shared-keys mode, computed
    in float64 from the forward's float64 lse. Its common tiles: R_r = min over the row's live
    levels of lse - c (an fp32 reference, 0 for a dead row), a = g e^{R + c - lse} (0 where
    lse = -inf). The other keys: r = lse - c per level, rounded to fp32 (+inf where lse =
    -inf), the reference of their relative form (``_relative_pair``)."""
    lse64 = lse.double()
    live = finite(lse64)
    rel = torch.where(live, lse64 - shift.double()[:, None], torch.full_like(lse64, math.inf))
    ref = rel.min(dim=0).values
    ref = torch.where(finite(ref), ref, torch.zeros_like(ref)).float()
    arg = torch.where(live, ref.double()[None, :] + shift.double()[:, None] - lse64,
                      torch.zeros_like(lse64))
    coef = torch.where(live, grad_lse.double() * torch.exp(arg), torch.zeros_like(lse64))
    return ref.contiguous(), coef.float().contiguous(), rel.float()


def _split_forward(z, log_w, scale, need_max, relative, splits, tiles, tune, meta, axis1,
                   shift, n_common, return_delta=False):
    """The forward over `splits` key ranges: each writes its plane of [splits, L, N] partial
    buffers (relative: δ_s and r_s, the unweighted max of its keys; shared keys: δ_s and R_s,
    per level the larger of its common keys' max and its other keys' unweighted max; plain:
    log l_s and m_s, its running max), merged
    by `_merge_splits`. `shift`: the mode's log-weight shift (relative, shared keys) or None.
    Returns what `lse_forward` returns. Relative: δ merged once, against the whole rowmax
    (exact in float64, where a merged lse would round δ to |rowmax| 2^-53), and lse = rowmax
    + δ as unsplit."""
    num_levels, n = log_w.shape
    part = lambda dtype=torch.float32: torch.empty(splits, num_levels, n, dtype=dtype,  # noqa: E731
                                                   device=z.device)
    delta = part()
    mrun = part() if not relative else delta     # the plain mode's m_s, shared keys' R_s (MRUN)
    rowmax = part() if need_max else None
    argmax = part(torch.int64) if need_max else None
    args = (z, log_w, delta if shift is None else shift, delta,
            rowmax if need_max else delta, argmax if need_max else delta, mrun, n, n_common,
            z.shape[1], z.stride(0), float(scale), splits)
    _launch("fwd", n, axis1, tiles, tune, args, meta, axis2=splits)
    rmax = rowmax.amax(0) if need_max else None
    if relative:
        # each split's r_s - rmax is exact in float64 where its term can matter (both fp32
        # scores); −inf where no split saw a key
        rel = _merge_splits(delta, rowmax.double() - torch.where(
            finite(rmax), rmax, torch.zeros_like(rmax)).double())
        lse = rmax.double() + rel
    else:
        lse = _merge_splits(delta, mrun)
        if not n_common:                # (the shared-keys mode returns lse in float64)
            lse = lse.float()
    if not need_max:
        return lse, None, None
    first = (rowmax == rmax).to(torch.int32).argmax(0, keepdim=True)    # first split at the max
    out = lse, rmax, argmax.gather(0, first).squeeze(0)
    return (*out, rel) if return_delta else out


def _merge_splits(delta: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Merge key splits' partial sums, in float64: delta [S, L, N] = log Σ_{k in split s}
    e^{t_k - ref_s} (−inf for a split without a visible key), ref [S, L, N] = the split's
    reference point (−inf likewise). Returns lse = B + log Σ_s e^{delta_s + ref_s - B} [L, N]
    float64 with B = max_s (delta_s + ref_s), −inf where no split saw a key. Each partial is
    exact to fp32 precision of its own size (δ ~ log N plus the log-weights' shift, ref an
    exact fp32 score), so the merged lse is as precise as the unsplit kernel's (the relative
    mode's rowmax + δ, the plain mode's one rounding to fp32); the shift B keeps every
    exponent <= 0 whatever the log-weights (δ carries them: +800 would overflow float64
    against the largest reference point alone)."""
    part = delta.double() + ref.double()          # −inf for a split without a visible key
    top = part.amax(0)
    live = finite(top)
    base = torch.where(live, top, torch.zeros_like(top))
    total = torch.exp(part - base).sum(0)          # >= 1 where live: the top split's own e^0
    return torch.where(live, base + torch.log(torch.where(live, total, 1.0)),
                       torch.full_like(base, -math.inf))


def lse_forward(
    z: torch.Tensor, log_w: torch.Tensor, scale: float, need_max: bool, *,
    fuse_levels: bool = True, fp32_dot: str | None = None, autotune: bool | None = None,
    n_common: int = 0, relative: bool = False, key_splits: int | str | None = None,
    return_delta: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Weighted log-sum-exp of scale·Z·Zᵀ for every level, without storing N×N.

    Args:
        z: [N, d] float32/float16/bfloat16, d <= 256 (made contiguous if needed).
        log_w: [L, N] log key weights per level; −inf hides key k from level l.
        scale: multiplier of z_i·z_k (1/τ).
        need_max: also return the unweighted row max over visible keys and its first arg-max.
        fuse_levels: one pass over the Z·Zᵀ tiles for all L levels (default) instead of a
            grid axis over levels that recomputes the tiles.
        fp32_dot: "ieee" or "tf32x3", the dots of fp32 inputs (default
            $HIERTAIL_TRITON_FP32_DOT, else "ieee"; see the module docstring).
        autotune: time ``_utils.TUNE_TILES`` on CUDA instead of the fixed tiles (default
            $HIERTAIL_TRITON_AUTOTUNE, else off).
        n_common: the first n_common keys are visible in every level (checked): their tiles
            take ONE exp per entry for all levels instead of one per level (the shared-keys
            mode, see the kernel; the multi-level loss's embedding rows come first). 0: off.
        relative: (needs need_max, not n_common) sum against the unweighted row max and
            return lse as float64 rowmax + δ, δ = lse - rowmax to fp32 precision of δ (the
            size of log N) instead of an fp32 lse (rounded to ~|s| 2^-24): the official
            variant's precision (its gradient cancels p at the arg-max against 1). Pass lse
            and rowmax to `lse_backward`. float64 holds rowmax + δ to fp32 precision of δ
            only while |rowmax| <= 2^29: past it, ask for δ (`return_delta`).
        return_delta: (relative only) also return δ = lse - rowmax [L, N] float64 as the
            kernel summed it (−inf on dead rows), for `lse_backward`'s ``delta``.
        key_splits: split the keys into this many ranges, one program each per row block, and
            merge their partial sums (more programs where the row blocks cannot fill the
            GPU; ``_utils.KEY_SPLITS_ENV``): an int >= 1 or "auto" (default
            $HIERTAIL_TRITON_KEY_SPLITS, else "auto").
    Returns:
        lse [L, N] fp32 (float64 with n_common: R + δ per level to fp32 precision of δ; with
        relative: rowmax + δ; pass it as
        is to `lse_backward`) (−inf for a row with no visible key), rowmax [L, N] fp32 =
        max_{k visible} scale·z_i·z_k (−inf if none) and argmax [L, N] int64 (lowest index
        among ties, 0 if none) when need_max, else None, None; with return_delta, δ fourth.
    """
    num_levels, n, d = _check(z, log_w)
    if relative and (not need_max or n_common):
        raise ValueError("relative=True needs need_max=True and n_common=0")
    if return_delta and not relative:
        raise ValueError("return_delta=True needs relative=True")
    request = split_request(key_splits)      # checked whatever runs (also at N = 0)
    s_prec, _, upcast = _precisions(z.dtype, z.is_cuda, fp32_dot_precision(fp32_dot))
    tune = _use_autotune(z, autotune)
    z = z.contiguous()
    log_w = log_w.to(torch.float32).contiguous()
    lse = torch.empty(num_levels, n, dtype=torch.float32, device=z.device)
    rowmax = torch.empty_like(lse) if need_max else None
    argmax = torch.empty(num_levels, n, dtype=torch.int64, device=z.device) if need_max else None
    if n == 0:
        return (lse, rowmax, argmax, lse.double()) if return_delta else (lse, rowmax, argmax)
    d_pad = feature_block(d)
    per_program = num_levels if fuse_levels else 1
    shift = _shared_shift(log_w, n_common)
    if relative:
        shift = _level_shift(log_w)
    tiles = pair_blocks(n, d_pad, z.is_cuda, arch=cuda_arch(z),
                        fp32_dot=s_prec if z.dtype == torch.float32 else None)
    splits = split_count(n, tiles[0], tiles[1], z, request)
    meta = dict(NUM_LEVELS=per_program, L_PAD=max(2, triton.next_power_of_2(per_program)),
                D_PAD=d_pad, NEED_MAX=bool(need_max), DOT_PRECISION=s_prec, UPCAST=upcast,
                SHARED=bool(n_common), RELATIVE=bool(relative), SPLIT=splits > 1,
                SPLIT_PAIR=splits > 1 and not (relative or n_common))
    if splits > 1:
        return _split_forward(z, log_w, scale, need_max, relative, splits, tiles, tune, meta,
                              num_levels // per_program, shift, n_common, return_delta)
    ref = torch.empty_like(lse) if n_common else lse
    args = (z, log_w, lse if shift is None else shift, lse, rowmax if need_max else lse,
            argmax if need_max else lse, ref, n, n_common, d, z.stride(0), float(scale), 1)
    _launch("fwd", n, num_levels // per_program, tiles, tune, args, meta)
    if n_common:                    # the kernel wrote (R, δ): lse = R + δ, kept in float64
        lse = ref.double() + lse.double()
    elif relative:                  # the kernel wrote δ = lse - rowmax
        delta, lse = lse, rowmax.double() + lse.double()
        if return_delta:            # (the kernel leaves −inf on rows with no visible key)
            return lse, rowmax, argmax, delta.double()
    return lse, rowmax, argmax


def lse_backward(
    z: torch.Tensor, log_w: torch.Tensor, lse: torch.Tensor, grad_lse: torch.Tensor,
    scale: float, *, two_pass: bool = False, out_dtype: torch.dtype | None = None,
    fp32_dot: str | None = None, autotune: bool | None = None, n_common: int = 0,
    rowmax: torch.Tensor | None = None, argmax: torch.Tensor | None = None,
    argmax_coef: torch.Tensor | None = None, key_splits: int | str | None = None,
    delta: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gradient of Σ_{l,i} grad_lse[l,i]·lse[l,i] with respect to z (both sides of s = Z·Zᵀ).

    Args:
        z, log_w, scale: as given to `lse_forward`; lse: its [L, N] output as returned
            (fp32; float64 in the relative and shared-keys modes).
        grad_lse: [L, N] upstream gradient (rows with grad 0 or lse −inf contribute nothing).
        two_pass: FlashAttention-2 query pass + key pass instead of the one-pass symmetric
            kernel (same result up to fp32 rounding; twice the GEMM work).
        out_dtype: dtype of dz (default z's). The loss asks for float32, so the LSE part of a
            16-bit input's gradient is not rounded to 16 bits before the other parts (which it
            can cancel) are added.
        fp32_dot, autotune, n_common: as in `lse_forward` (use the forward's fp32_dot: the
            one-pass backward relies on recomputing the forward's scores exactly).
        rowmax: the forward's rowmax with ``relative=True`` (and its float64 lse): p is formed
            as e^{(s - rowmax) + (log w - δ)}, δ = lse - rowmax, to fp32 precision of δ
            (not with n_common).
        delta: (with rowmax) the forward's δ (``return_delta``) in place of lse - rowmax,
            which loses δ's low bits where |rowmax| > 2^29 (lse is then read for its shape).
        argmax: (with rowmax) the forward's argmax [L, N] int64: the gradient then also has
            the KEY side of (argmax_coef - grad_lse)[l, i] on s_{i, argmax[l, i]} (the official
            row max's share, and the rest of the gradient on it), cancelled against p per
            entry inside the kernel; its query side, on row i, is left to the caller.
        argmax_coef: (with argmax) [L, N], the coefficient added at the arg-max (None: 0).
        key_splits: as in `lse_forward` (the one-pass kernel only): each
            split sums its keys' share of dz into an fp32 [N, d] partial, and the partials are
            summed in split order (deterministic).
    Returns:
        dz [N, d] in out_dtype (fp32 accumulation), deterministic run to run.
    """
    num_levels, n, d = _check(z, log_w)
    request = split_request(key_splits)      # checked whatever runs (also at N = 0)
    if two_pass and key_splits is not None and request not in (1, "auto"):
        raise ValueError("key_splits > 1 needs the one-pass backward (two_pass=False)")
    named = [("lse", lse), ("grad_lse", grad_lse)]
    if argmax is not None:
        if rowmax is None or argmax.dtype != torch.int64:
            raise ValueError("argmax (int64) needs rowmax (the relative mode)")
        named.append(("argmax", argmax))
        if argmax_coef is not None:
            named.append(("argmax_coef", argmax_coef))
    elif argmax_coef is not None:
        raise ValueError("argmax_coef needs argmax")
    if delta is not None:
        if rowmax is None:
            raise ValueError("delta needs rowmax (the relative mode)")
        named.append(("delta", delta))
    if rowmax is not None:
        if n_common:
            raise ValueError("rowmax (the relative mode) cannot be combined with n_common")
        named.append(("rowmax", rowmax))
    for name, t in named:
        if t.shape != log_w.shape:
            raise ValueError(f"{name} must have shape {tuple(log_w.shape)}, got {tuple(t.shape)}")
    s_prec, w_prec, upcast = _precisions(z.dtype, z.is_cuda, fp32_dot_precision(fp32_dot))
    tune = _use_autotune(z, autotune)
    z = z.contiguous()
    log_w = log_w.to(torch.float32).contiguous()
    dz = torch.empty(n, d, dtype=out_dtype or z.dtype, device=z.device)
    if n == 0:
        return dz
    shift = _shared_shift(log_w, n_common)
    ref, coef, level_ref = (_shared_coefficients(lse, grad_lse, shift) if shift is not None
                            else (dz, dz, None))
    if rowmax is not None:
        lse, rmax_ref = _relative_pair(lse, rowmax, delta)
    elif level_ref is not None:
        # the shared-keys mode's other keys (and the rows of a block past the common tiles):
        # p in the relative form against r = fp32(lse - c) per level (rounded BEFORE δ =
        # lse - r is formed, so r + δ is the forward's lse to fp32 precision of δ ~ c)
        lse, rmax_ref = _relative_pair(lse, level_ref)
    else:
        lse, rmax_ref = lse.to(torch.float32).contiguous(), dz
    grad_lse = grad_lse.to(torch.float32).contiguous()
    d_pad = feature_block(d)
    tiles = pair_blocks(n, d_pad, z.is_cuda, arch=cuda_arch(z),
                        fp32_dot=s_prec if z.dtype == torch.float32 else None)
    common = dict(
        NUM_LEVELS=num_levels, L_PAD=max(2, triton.next_power_of_2(num_levels)), D_PAD=d_pad,
        DOT_PRECISION=s_prec, GRAD_DOT_PRECISION=w_prec, UPCAST=upcast,
        SHARED=shift is not None, RELATIVE=rowmax is not None, FOLD_ARGMAX=argmax is not None,
    )
    # see DOT_CR in the kernel: the interpreter's numpy dot is not bitwise symmetric; on a
    # GPU each element of tl.dot accumulates the same products over k in the same order, so
    # s_rc == s_cr and one dot serves both sides (the CUDA run of the tests checks accuracy).
    redot = not z.is_cuda
    if redot and tiles[0] != tiles[1]:
        raise AssertionError("DOT_CR needs square tiles to reproduce the forward's dots")
    amax = dz if argmax is None else argmax.contiguous()
    if argmax is None:
        h = dz
    elif argmax_coef is None:
        h = torch.zeros(num_levels, n, dtype=torch.float32, device=z.device)
    else:
        h = argmax_coef.to(torch.float32).contiguous()
    args = (z, log_w, lse if shift is None else shift, ref, coef, lse, rmax_ref, amax, h,
            grad_lse)
    tail = (n, n_common, d, z.stride(0), float(scale))
    splits = 1 if two_pass else split_count(n, tiles[0], tiles[1], z, request)
    if not two_pass:
        out = dz if splits == 1 else torch.empty(splits, n, d, dtype=torch.float32,
                                                  device=z.device)
        _launch("bwd", n, splits, tiles, tune, (*args, out, out, *tail, splits), dict(
            QUERY_SIDE=True, KEY_SIDE=True, ADD_PARTIAL=False, DOT_RC=True, DOT_CR=redot,
            SPLIT=splits > 1, **common))
        if splits > 1:
            dz.copy_(out.sum(0))
        return dz
    partial = torch.empty(n, d, dtype=torch.float32, device=z.device)
    _launch("bwd", n, 1, tiles, tune, (*args, partial, partial, *tail, 1), dict(  # dq -> partial
        QUERY_SIDE=True, KEY_SIDE=False, ADD_PARTIAL=False, DOT_RC=True, DOT_CR=False,
        SPLIT=False, **common))
    _launch("bwd", n, 1, tiles, tune, (*args, partial, dz, *tail, 1), dict(  # dk, adds partial
        QUERY_SIDE=False, KEY_SIDE=True, ADD_PARTIAL=True, DOT_RC=not redot, DOT_CR=redot,
        SPLIT=False, **common))
    return dz
