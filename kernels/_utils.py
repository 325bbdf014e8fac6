"""Block-size choices and tuning knobs shared by the launchers."""
from __future__ import annotations

import os

import triton

from hiertail_fast.ops._dispatch import triton_interpreting

# fp32 inputs on a GPU: how tl.dot multiplies them. "ieee": FMA units, full fp32 (the launchers'
# default; the loss engine, ops/_triton_loss.py, picks per call from the logits); "tf32x3":
# CUTLASS's 3xTF32 on tensor cores (a = a_big + a_small in TF32, a_big b_big + a_big b_small +
# a_small b_big): each product within ~3 * 2^-22 relative (the dropped a_small b_small and the
# rounding of the small parts; fp32's own product rounding is 2^-24), accumulated in fp32, at a
# third of TF32's tensor-core rate. Plain "tf32" is not offered: its error ~|s| 2^-11 is O(1) at
# the loss's |s| ~ 1000. Under TRITON_INTERPRET=1 every dot is a numpy fp32 product whatever is
# asked, so the CPU tests check the plumbing, not the precision (bench/gpu_report.py and
# bench/attention_guard.py measure it).
FP32_DOTS = ("ieee", "tf32x3")
FP32_DOT_ENV = "HIERTAIL_TRITON_FP32_DOT"
# "1": the loss kernels pick their tiles by triton.autotune on CUDA (TUNE_TILES, timed on the
# first call of each shape); default "0": the fixed tiles of `pair_blocks`.
AUTOTUNE_ENV = "HIERTAIL_TRITON_AUTOTUNE"
_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")
# "1": the LSE kernels' shared-keys mode for several levels (the loss passes n_common, the rows
# visible in every level: one exp per entry for all levels instead of one per level, see the
# kernels' docstring); default "0" until a GPU has timed it (loss_profile's "triton[shared]").
SHARED_LEVELS_ENV = "HIERTAIL_TRITON_SHARED_LEVELS"
# The fixed tiles of the LSE kernels on a GPU: "fixed" (default: `pair_blocks`' table), "warps4"
# (the table's tiles with 4 warps: the launches behind the H200 figures of 2026-11-27 and
# 2026-12-04, see TABLE_WARPS), "lean" (LEAN_TILES) or an explicit "BLOCK_MxBLOCK_NxWARPS" such
# as "128x64x8"; for A/B timing of a tile without autotuning's compile-everything first call.
# Under the interpreter the square tiles stay (DOT_CR needs them).
TILES_ENV = "HIERTAIL_TRITON_TILES"
WARPS4 = "warps4"
# 64 x 32 with 8 warps: the tile the compiled code favours (bench/kernel_resources.py, sm_90,
# triton 3.6 and 3.9): no register spill in any fp32 / bf16 LSE kernel at d = 64 (the table's
# 128 x 64 backward spilled 1,072 bytes per thread in fp32 with 4 warps) and the least of the
# 8-warps-per-SM tiles at d = 128. Not yet timed: a candidate for the next GPU run
# (loss_profile's "triton[lean]" rows); the default of fp32 inputs with IEEE dots
# (`fp32_dot_tiles`).
LEAN_TILES = (64, 32, 8)
# (BLOCK_M, BLOCK_N, num_warps, num_stages) tried by the autotuner: FlashAttention-like tiles
# around `pair_blocks`' choices. Configs that do not fit a GPU's registers / shared memory are
# skipped by triton's autotuner (it times them as infinitely slow).
TUNE_TILES = (
    (32, 64, 4, 3), (64, 32, 4, 3), (64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 4, 3),
    (64, 32, 8, 3), (64, 64, 8, 3), (128, 32, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3),
    (128, 128, 8, 3),
)


# Key splits of the loss's LSE kernels (flash-decoding's split-K over the keys). A launch has
# one program per block of BLOCK_M rows, each looping over ALL key tiles, and on sm_90 the fixed
# tiles' programs take 128-202 KB of shared memory: ONE program per SM (bench/kernel_resources.py,
# "warps/SM" 4 for every fixed LSE tile, fp32, d 64 / 128). At N = 20k the H200's 128-row tile
# gives 157 programs for 132 SMs: two waves, the second 19 % full, so the launch lasts two
# programs' time for 1.19 programs of work per SM (59 % of the SMs' time used); at 100k, 782
# programs fill 5.9 of 6 waves. Measured: the exact single level took 10.2-11.6 ms at 20k
# against 121-123 ms at 100k, 2.2x over the N^2 scaling of the 100k figure
# (bench/loss_profile.py, 2026-11-27 and 2026-12-04). Splitting the keys into S ranges gives S
# shorter programs per row block, each writing partial sums (forward: per row and level its
# reference point and log-sum; backward: an fp32 [N, d] partial of dz) that the launcher
# merges. "auto" (default) takes the smallest S whose programs fill their waves to
# KEY_SPLIT_MIN_FILL (one program per SM assumed), each split keeping at least
# KEY_SPLIT_MIN_TILES key tiles, at most KEY_SPLIT_MAX splits (else the fullest of those):
# 4 at 20k x 64 on 132 SMs (628 programs, 95 %), 1 at 50k and 100k (99 %), 2 at 75k (5 waves,
# the last 44 % full -> 9, 99 %); never from 9 programs per SM (~150k rows with 128-row
# tiles: any count of programs P >= 9 SMs fills P / (P + SMs) >= 90 %). CPU (the interpreter): 1
# unless asked. An integer asks for that many (1: off). Untimed on a GPU.
KEY_SPLITS_ENV = "HIERTAIL_TRITON_KEY_SPLITS"
KEY_SPLIT_MIN_FILL = 0.9
KEY_SPLIT_MIN_TILES = 16
KEY_SPLIT_MAX = 16


def _sm_count(device) -> int:
    import torch
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def wave_fill(programs: int, sms: int) -> float:
    """The share of `sms` x waves program slots that `programs` one-per-SM programs use."""
    return programs / (triton.cdiv(programs, sms) * sms)


def split_request(requested: int | str | None = None) -> int | str:
    """A key-split request checked: `requested` (an int >= 1 or "auto"), else
    $HIERTAIL_TRITON_KEY_SPLITS, else "auto"; an int or "auto". A bad value is a TypeError /
    ValueError naming where it came from."""
    where = "key_splits"
    if requested is None:
        requested = os.environ.get(KEY_SPLITS_ENV, "").strip().lower() or "auto"
        where = KEY_SPLITS_ENV
    if isinstance(requested, str):
        if requested.strip().lower() == "auto":
            return "auto"
        try:
            requested = int(requested)
        except ValueError:
            raise ValueError(f"{where}={requested!r} is not 'auto' or a positive int") from None
    if isinstance(requested, bool) or not isinstance(requested, int):
        raise TypeError(f"{where} must be 'auto' or a positive int, got {requested!r}")
    if requested < 1:
        raise ValueError(f"{where}={requested!r} is not 'auto' or a positive int")
    return requested


def key_splits(n: int, block_m: int, block_n: int, z, requested: int | str | None = None
               ) -> int:
    """The number of key splits for a launch over `n` rows and keys with tiles of `block_m` x
    `block_n` on `z`'s device, for `split_request(requested)` (see KEY_SPLITS_ENV). Never more
    than the key tiles (an empty split is only wasted launches); "auto" is 1 off CUDA and
    under the interpreter."""
    requested = split_request(requested)
    tiles = max(1, triton.cdiv(int(n), block_n))
    if requested != "auto":
        return min(requested, tiles)
    if not getattr(z, "is_cuda", False) or interpreting():
        return 1
    row_blocks, sms = triton.cdiv(int(n), block_m), _sm_count(z.device)
    cap = max(1, min(KEY_SPLIT_MAX, tiles // KEY_SPLIT_MIN_TILES))
    fills = [wave_fill(row_blocks * s, sms) for s in range(1, cap + 1)]
    enough = [s for s, fill in enumerate(fills, 1) if fill >= KEY_SPLIT_MIN_FILL]
    return enough[0] if enough else 1 + fills.index(max(fills))


def fp32_dot(value: str | None = None) -> str:
    """The fp32 dot precision: `value`, else $HIERTAIL_TRITON_FP32_DOT, else "ieee"."""
    if value is None:
        value = os.environ.get(FP32_DOT_ENV, "").strip().lower() or "ieee"
        where = f"{FP32_DOT_ENV}={value!r}"
    else:
        where = f"fp32_dot={value!r}"
    if value not in FP32_DOTS:
        raise ValueError(f"{where} is not one of {FP32_DOTS}")
    return value


def autotune_requested(value: bool | None = None) -> bool:
    """Whether tiles are autotuned: `value`, else $HIERTAIL_TRITON_AUTOTUNE ("1"/"0")."""
    if value is not None:
        if not isinstance(value, bool):
            raise TypeError(f"autotune must be True, False or None, got {value!r}")
        return value
    return _env_flag(AUTOTUNE_ENV)


def _env_flag(name: str) -> bool:
    """An on/off environment variable ("1"/"0", true/false, yes/no, on/off; unset: off)."""
    raw = os.environ.get(name, "").strip().lower()
    if raw in _ON:
        return True
    if raw in _OFF:
        return False
    raise ValueError(f"{name}={raw!r} is not one of 1/0 (true/false, yes/no, on/off)")


def shared_levels_requested() -> bool:
    """Whether the loss runs several levels in the shared-keys mode ($HIERTAIL_TRITON_SHARED_LEVELS,
    "1"/"0", default "0")."""
    return _env_flag(SHARED_LEVELS_ENV)


def interpreting() -> bool:
    """$TRITON_INTERPRET as Triton reads it (``_dispatch.triton_interpreting``)."""
    return triton_interpreting()


# Tiles that compile to a kernel doing nothing but trap, without any compile-time error, on
# datacenter Blackwell (compute capability 10.x) with fp32 inputs' tensor-core dots (3xTF32):
# compiled for sm_100 by triton 3.6 (bench/kernel_resources.py, 2026-12-05, "TRAP ONLY": e.g.
# the LSE backward at 128 x 64 x 4, d 128, asks for 704 columns of tensor memory, the SM has
# 512), the LSE backward and the positives' gradient pass with BLOCK_M or BLOCK_N of 128 at
# d_pad 128 (32 x 64, 64 x 32, 64 x 64 compile), and 128 x 128 at d_pad 64; bf16 and the IEEE
# (FMA) dots compile every tile. A launch would abort the process's CUDA context, so the fixed
# tiles keep out of them (the table's do), $HIERTAIL_TRITON_TILES asking for one is a
# ValueError there, and the autotuner prunes them (`prune_trapping`). The forwards compile,
# but one tile serves both kernels, so the rule covers them too.
def tile_traps(block_m: int, block_n: int, d_pad: int, arch: tuple[int, int] | None,
               fp32_dot: str | None) -> bool:
    """Whether a (BLOCK_M, BLOCK_N) tile compiles to a trap-only kernel on a card of compute
    capability `arch` for dots `fp32_dot` (None: 16-bit inputs); see above."""
    if arch is None or arch[0] != 10 or fp32_dot != "tf32x3":
        return False
    if d_pad > 64:
        return block_m > 64 or block_n > 64
    return block_m * block_n >= 128 * 128


def prune_trapping(configs: list, named_args: dict, **kwargs) -> list:
    """triton.autotune's early_config_prune: drops the configs `tile_traps` names for this call
    (its Z's card and dtype, its D_PAD and DOT_PRECISION constants). TUNE_TILES keeps 32 x 64,
    64 x 32 and 64 x 64, which never trap, so some config always remains."""
    import torch
    z = named_args.get("Z")
    arch = cuda_arch(z)
    dot = kwargs.get("DOT_PRECISION") if getattr(z, "dtype", None) == torch.float32 else None
    return [c for c in configs
            if not tile_traps(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], kwargs.get("D_PAD", 0),
                              arch, dot)]


def tune_configs() -> list[triton.Config]:
    """TUNE_TILES as triton configs (BLOCK_M / BLOCK_N meta-parameters)."""
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
            for m, n, w, s in TUNE_TILES]


def feature_block(d: int, max_block: int = 256) -> int:
    """Smallest power of two >= d (>= 16 so tl.dot accepts it), capped at max_block."""
    return min(max(16, triton.next_power_of_2(int(d))), max_block)


def tile_override() -> tuple[int, int, int] | None:
    """The tile $HIERTAIL_TRITON_TILES asks for, None for the fixed table (also "warps4": the
    table with 4 warps, `table_warps`)."""
    raw = os.environ.get(TILES_ENV, "").strip().lower()
    if raw in ("", "fixed", WARPS4):
        return None
    if raw == "lean":
        return LEAN_TILES
    parts = raw.split("x")
    try:
        block_m, block_n, warps = (int(v) for v in parts)
    except ValueError:
        block_m = block_n = warps = 0
    pow2 = lambda v: v > 0 and v & (v - 1) == 0  # noqa: E731
    if not (16 <= block_m <= 256 and 16 <= block_n <= 256 and pow2(block_m) and pow2(block_n)
            and warps in (1, 2, 4, 8, 16)):
        raise ValueError(f"{TILES_ENV}={raw!r} is not 'fixed', 'warps4', 'lean' or "
                         "BLOCK_MxBLOCK_NxWARPS (powers of two in 16..256, warps in 1, 2, 4, 8, "
                         "16; e.g. 128x64x8)")
    return block_m, block_n, warps


# Tiles a launch falls back on, larger first, when the GPU cannot hold the tile it asked for:
# Triton compiles the kernel, compares its shared memory (and threads) with the device's and
# raises OutOfResources BEFORE the kernel runs (nothing is written, so retrying is safe). Found
# on cards of compute capability 8.6 / 8.9 (RTX 30xx / 40xx, A10, A40, L4, L40), which give a
# block at most 99 KB: with fp32 inputs at d_pad 128 the H200's 64 x 64 tile compiles for sm_86
# to 128 KB (forward) and up to 106 KB (backward) (bench/kernel_resources.py, triton 3.6).
# Those now take AMPERE_FP32_TILES (<= 96 KB); the fallback stays for what no table here was
# compiled for: Turing (7.5: T4, 64 KB), tiles asked by $HIERTAIL_TRITON_TILES, future cards.
SMALLER_TILES = ((64, 64, 4), (64, 32, 8), (32, 32, 4))
# (kernel, device, dtype, constants, asked tile) -> the tile that launched there: one
# OutOfResources per kernel specialisation and process, not one per call
_FITTED: dict = {}


# Floating-point contraction (FMA fusion) off where a kernel relies on a score s = dot * scale
# being ONE rounded number (Triton fuses by default: LLVM's NVPTX backend contracts fmul + fsub
# aggressively, even when the product has other uses). The official variant's relative mode
# takes the row max r from the rounded s and then forms s - r: contracted to fma(dot, scale, -r),
# the arg-max's own term is e^{(exact product - rounded product)}, not e^0, and δ = lse - r
# carried that rounding, half an ulp of |s| (seen on an NVIDIA H200, triton 3.6, 2026-12-04:
# 1.22e-4 = 2^-13 at |s| < 4,096 and 3.9e-3 = 2^-8 at |s| ~ 9e4, against 0 in float64;
# the official loss 4e-4 relative off at |s| ~ 1e6 with 16-bit rows and 3.5e-2 absolute with a
# prototype tying a node row at |s| ~ 1e7). The Triton interpreter never contracts, so the
# CPU tests could not see it. The same holds for the shared-keys mode (its running max is taken
# from s, its terms are e^{s - m}) and for the positives kernel (its pairs are compared with and
# subtracted from the forward's row max). The exact variant's plain mode keeps fusion: its max
# and its terms use the same t = s + log w, fused or not, so nothing cancels.
def fp_fusion(rounded_scores: bool) -> dict:
    """Launch options for a kernel launch: ``enable_fp_fusion=False`` when it needs its scores
    rounded once (`rounded_scores`: the loss's relative and shared-keys modes, the positives
    kernel), else none (Triton's default)."""
    return {"enable_fp_fusion": False} if rounded_scores else {}


def launch_fitting(launch, tiles: tuple[int, int, int], what: str, z,
                   meta: dict) -> tuple[int, int, int]:
    """``launch(tile)`` with `tiles` (BLOCK_M, BLOCK_N, num_warps), or with the first of the
    smaller SMALLER_TILES the device can hold when Triton raises OutOfResources, remembered per
    specialisation: the kernel `what` names, the device and dtype of its input `z`, its
    compile-time constants `meta`. Returns the tile that launched. When none fits, a
    RuntimeError naming `what`, the tiles tried and the device's limit (other errors pass
    through unchanged)."""
    from triton.runtime.errors import OutOfResources

    memo = (what, z.device, z.dtype, tuple(sorted(meta.items())), tuple(tiles))
    start = _FITTED.get(memo, tuple(tiles))
    area = start[0] * start[1]
    tried, last = [], None
    for tile in (start, *(t for t in SMALLER_TILES if t[0] * t[1] < area)):
        try:
            launch(tile)
        except OutOfResources as err:
            tried.append("x".join(map(str, tile)))
            last = err
            continue
        _FITTED[memo] = tile
        return tile
    raise RuntimeError(f"{what}: no tile fits this GPU (tried {', '.join(tried)}: {last}); "
                       "backend='torch' runs without Triton") from last


# fp32 inputs with 3xTF32 dots on Ampere / Ada (compute capability 8.x: A100, A10, A40, RTX
# 30xx / 40xx, L4, L40), d_pad <= 128. Compiled for sm_80 and sm_86 (bench/kernel_resources.py,
# the GPU image's triton 3.6, docs/results/kernel_resources_2026-11-28/), the table below gives
# the fp32 backward 19-30 KB of spill per thread on sm_80 (at 32 registers: ptxas apparently
# put the tile's arrays in local memory), on sm_86 3.6 / 23-25 KB at d 64 (1 / 3 levels) and up
# to 18 KB at d 128, and the d-128 forward 128 KB of shared memory (over 8.6 / 8.9's 99 KB).
# 32 x 64 with 4 warps has the least spill of TUNE_TILES in every fp32 LSE kernel there (one
# level): forward 0-8 bytes, backward 16-72 (d 64) and 768-924 (d 128), 34-96 KB of shared
# memory. Chosen from the compiled code; no Ampere card has timed it. sm_90 keeps the table
# (its 4-warp tiles were timed on an H200), bf16 / fp16 inputs too (their fixed tiles spill at most
# 2.3 KB on sm_80 / sm_86). Consumer Blackwell (12.x: RTX 50xx, RTX PRO 6000) compiles like
# sm_86 (sm_120, triton 3.6: the table's fp32 backward 20 KB of spill at d 64, the d-128
# forward 128 KB of its 99 KB) and takes this tile too; datacenter Blackwell (10.x: B200,
# 0.4-2 KB, like sm_90) keeps the table.
AMPERE_FP32_TILES = (32, 64, 4)
# fp32 inputs with IEEE (FMA) dots, any card, d_pad <= 128: the path above the 3xTF32 logit
# limit and on cards without TF32. Compiled for sm_90 and sm_80 (triton 3.6), every tile of
# TUNE_TILES but one spills in the backward, the table's 21-38 KB per thread at 32 registers
# (sm_90; sm_80's 32 x 64 x 4 up to 16 KB at d 128); LEAN_TILES (64 x 32, 8 warps) spills 0 at
# d 64 and 0 / 1.1 KB at d 128 (sm_80 / sm_90), and 0 in the forward. Untimed.


def fp32_dot_tiles(d_pad: int, arch: tuple[int, int] | None,
                   fp32_dot: str | None) -> tuple[int, int, int] | None:
    """The tile of fp32 inputs whose dots run `fp32_dot` ("ieee" / "tf32x3"; None: 16-bit
    inputs) on a card of compute capability `arch`, where the compiled code asks for one other
    than the table's: LEAN_TILES for IEEE dots, AMPERE_FP32_TILES for 3xTF32 on 8.x / 12.x
    (d_pad <= 128); None where the table stands. Shared by `pair_blocks` (the LSE kernels)
    and the positives kernel's `gpu_tiles`."""
    if fp32_dot is None or d_pad > 128:
        return None
    if fp32_dot == "ieee":
        return LEAN_TILES
    if arch is not None and arch[0] in (8, 12):
        return AMPERE_FP32_TILES
    return None


def cuda_arch(t) -> tuple[int, int] | None:
    """The compute capability of a CUDA tensor's device, None for other tensors."""
    if not getattr(t, "is_cuda", False):
        return None
    import torch
    return tuple(torch.cuda.get_device_capability(t.device))


def pair_blocks(n: int, d_pad: int, on_gpu: bool, *, arch: tuple[int, int] | None = None,
                fp32_dot: str | None = None) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for kernels that stream tiles of Z·Zᵀ (contrastive LSE).

    GPU: FlashAttention-like tiles, smaller when the [BLOCK_M, d_pad] fp32 accumulator of the
    backward grows (the fixed default; $HIERTAIL_TRITON_TILES picks another, see TILES_ENV;
    $HIERTAIL_TRITON_AUTOTUNE=1 times TUNE_TILES instead); for fp32 inputs (`fp32_dot` their
    dots, None for 16-bit inputs) on a card of compute capability `arch`, `fp32_dot_tiles`.
    Interpreter (CPU tests): one tile as large as the problem allows up to 64, since every
    program costs Python overhead there (autotuning is never used under the interpreter).
    """
    override = tile_override()   # read on CPU too: a bad value fails there, not first on a GPU
    if not on_gpu:
        block = min(64, max(16, triton.next_power_of_2(int(n))))
        return block, block, 4
    if override is not None:
        if tile_traps(override[0], override[1], d_pad, arch, fp32_dot):
            raise ValueError(
                f"{TILES_ENV}: the {override[0]}x{override[1]} tile compiles to a kernel that "
                f"only traps on compute capability {arch[0]}.{arch[1]} with fp32 tensor-core "
                f"dots at d_pad {d_pad} (its accumulators exceed the tensor memory; "
                "kernels/_utils.tile_traps): ask for 64x64x8 or smaller, or 'fixed'")
        return override
    special = fp32_dot_tiles(d_pad, arch, fp32_dot)
    if special is not None:
        return special
    return table_tiles(d_pad, table_warps())


# The table's warps per program at d_pad <= 128 (8 from 2026-12-05; 4 before, the launches the
# H200 timed: $HIERTAIL_TRITON_TILES=warps4 brings them back). The same tiles with 8 warps hold
# the same shared memory, so the same programs per SM, wave counts and key splits, and spill far
# less: compiled for sm_90 by the GPU image's triton 3.6 (bench/kernel_resources.py,
# docs/results/kernel_resources_2026-12-05/), the fp32 (3xTF32) backward at d 64 spills
# 1,072-2,100 bytes per thread with 4 warps and 16-32 with 8 (shared keys 6,408 -> 436), bf16
# 224-5,744 -> 0-184, fp32 at d 128 1,024-1,320 -> 460-744; sm_80 (bf16) and sm_100 alike, and
# triton 3.9 at d 64; sm_90's forwards spill at most 148 bytes either way. With 128-202 KB of
# shared memory per fp32 program an SM holds ONE program, i.e. 4 warps with the old table: one
# warpgroup to issue the dots, the exps and the loads; 8 warps give two. Chosen from the
# compiled code, untimed: the next gpu_report times "ours (triton, 4 warps)" beside every
# automatic Triton row whose tile is the table's.
TABLE_WARPS = 8


def table_warps() -> int:
    """The table's warps: 4 where $HIERTAIL_TRITON_TILES is "warps4", else TABLE_WARPS."""
    return 4 if os.environ.get(TILES_ENV, "").strip().lower() == WARPS4 else TABLE_WARPS


def table_tiles(d_pad: int, warps: int) -> tuple[int, int, int]:
    """`pair_blocks`' GPU table: (BLOCK_M, BLOCK_N) by head dimension, `warps` at d_pad <= 128
    (wider: 64 x 32 with 8 warps, as it always was)."""
    if d_pad <= 64:
        return 128, 64, warps
    if d_pad <= 128:
        return 64, 64, warps
    return 64, 32, 8
