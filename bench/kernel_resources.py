"""Registers, spills and shared memory of the loss's Triton kernels per tile, without a GPU.

    python bench/kernel_resources.py                          # sm_90, d 64 / 128, 1 / 3 levels
    python bench/kernel_resources.py --arch 80 --dims 64 --out DIR

Triton compiles ahead of time for a target it has no device for (``triton.compile`` of the
kernel's source with a ``GPUTarget``), and ``ptxas -v`` (shipped in Triton's wheel) reports what
each thread of the compiled kernel holds. A kernel that spills registers to local memory inside
its tile loop, or whose registers / shared memory admit one 4-warp block per SM, cannot keep the
tensor cores fed whatever its arithmetic; those are facts of the compiled code, read here on a
CPU machine. They are not timings: the allocation belongs to this machine's Triton (a GPU image's
release may allocate differently), and whether a spill-free tile is faster is for a GPU to say
(bench/loss_profile.py). Each row: registers per thread, spill stores (bytes per thread), shared
memory per block, the warps an SM could hold by those (estimate: 64K registers in 256-register
warp granules, the arch's shared memory per SM less 1 KB per block, 2,048 threads), and the
tensor-core instructions of its PTX (Hopper's wgmma, Blackwell's tcgen05.mma or sm_80's mma.sync,
per thread: a dot that fell back from one to another would show there).

Kernels: the LSE forward (exact: no row max; official: NEED_MAX in the relative mode), the
one-pass LSE backward (exact; "rel": the official variant's relative mode with its arg-max
fold; and both in the
shared-keys mode of several levels), the official positives' sums and gradient passes; every
tile of ``kernels/_utils.TUNE_TILES`` plus the fixed one (marked *: ``pair_blocks`` for the
LSE kernels, ``gpu_tiles`` for the positives). fp32 inputs with 3xTF32 dots (the engine's fp32
mode on a GPU; ``--fp32-dot ieee``: the FMA dots it takes above its logit limit and on cards
without TF32) and, with ``--dtypes bf16``, bf16 inputs. Writes DIR/kernel_resources.{json,md}
atomically.
"""
from __future__ import annotations

import argparse
import inspect
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from hiertail_fast._argparse import positive  # noqa: E402
from hiertail_fast._files import atomic_path, unwritable_dir_reason  # noqa: E402

# shared memory per SM (bytes) and its per-block reservation, by compute capability
SMEM_PER_SM = {75: 65536, 80: 167936, 86: 102400, 89: 102400, 90: 233472, 100: 233472, 120: 102400}
REGS_PER_SM, REG_GRANULE, MAX_THREADS = 65536, 256, 2048
KERNELS = ("lse fwd", "lse fwd+max", "lse bwd", "lse bwd rel", "lse fwd shared",
           "lse bwd shared", "pos sums", "pos dz")
_PTR = {"fp32": "*fp32", "bf16": "*bf16"}


def _signature(kernel: str, dtype: str) -> dict:
    z = _PTR[dtype]
    if kernel.startswith("lse fwd"):
        return dict(Z=z, LOG_W="*fp32", SHIFT="*fp32", LSE="*fp32",
                    ROWMAX="*fp32", ARGMAX="*i64", MRUN="*fp32", N="i32", N_COMMON="i32",
                    D="i32", stride_z="i32", scale="fp32", NUM_SPLITS="i32")
    if kernel.startswith("lse bwd"):
        return dict(Z=z, LOG_W="*fp32", SHIFT="*fp32", REF="*fp32", COEF="*fp32", LSE="*fp32",
                    ROWMAX="*fp32", ARGMAX="*i64", ARGMAX_COEF="*fp32", GRAD="*fp32",
                    PARTIAL="*fp32", DZ="*fp32", N="i32", N_COMMON="i32", D="i32",
                    stride_z="i32", scale="fp32", NUM_SPLITS="i32")
    return dict(Z=z, ORDER="*i64", LO="*i32", HI="*i32", ROWMAX="*fp32", TIE="*fp32",
                UID="*i64", UID_MAX="*i64", COEF="*fp32", T="*fp32", Q="*fp32", DZ="*fp32",
                N="i32", D="i32", stride_z="i32", scale="fp32", eps="fp32")


def _constexprs(kernel: str, dtype: str, d_pad: int, levels: int, tile,
                fp32_dot: str = "tf32x3") -> dict:
    import torch
    from hiertail_fast.kernels.balanced_contrastive_loss import _precisions
    block_m, block_n = tile[:2]
    # the launchers' dots on a GPU: fp32 inputs in `fp32_dot` (the engine's 3xTF32 mode, or
    # IEEE FMA dots above its logit limit and on cards without TF32)
    s_dot, dot, _ = _precisions(torch.float32 if dtype == "fp32" else torch.bfloat16, True,
                                fp32_dot)
    l_pad = max(2, 1 << (levels - 1).bit_length())
    common = dict(D_PAD=d_pad, BLOCK_M=block_m, BLOCK_N=block_n, UPCAST=False)
    shared = kernel.endswith("shared")
    if kernel.startswith("lse fwd"):
        official = kernel.endswith("max")        # the official loss's relative mode
        return dict(common, NUM_LEVELS=levels, L_PAD=l_pad, NEED_MAX=official,
                    DOT_PRECISION=s_dot, SHARED=shared, RELATIVE=official, SPLIT=False,
                    SPLIT_PAIR=False)
    if kernel.startswith("lse bwd"):
        return dict(common, NUM_LEVELS=levels, L_PAD=l_pad, QUERY_SIDE=True, KEY_SIDE=True,
                    ADD_PARTIAL=False, DOT_PRECISION=s_dot, GRAD_DOT_PRECISION=dot,
                    DOT_RC=True, DOT_CR=False, SHARED=shared,
                    RELATIVE=kernel.endswith("rel"), FOLD_ARGMAX=kernel.endswith("rel"),
                    SPLIT=False)
    return dict(common, NEED_SUMS=kernel == "pos sums", NEED_DZ=kernel == "pos dz",
                INCLUDE_SELF=True, DOT_PRECISION=s_dot,
                GRAD_DOT_PRECISION=fp32_dot if dtype == "fp32" else "ieee")


def _function(kernel: str):
    if kernel.startswith("pos"):
        from hiertail_fast.kernels import balanced_contrastive_loss_positives as k
        return k._positive_pairs_kernel
    from hiertail_fast.kernels import balanced_contrastive_loss as k
    return (k._balanced_contrastive_loss_bwd_kernel if kernel.startswith("lse bwd")
            else k._balanced_contrastive_loss_fwd_kernel)


def _ptxas(arch: int) -> str:
    from triton.backends.nvidia import compiler
    tool = compiler.get_ptxas(arch) if hasattr(compiler, "get_ptxas") else None
    path = getattr(tool, "path", None)
    if path is None:
        path = compiler._path_to_binary("ptxas")[0]
    return path


def ast_source(fn, types: dict, constexprs: dict):
    """What ``triton.compile`` takes for a @triton.jit kernel `fn` with these argument types
    (name -> "*fp32", "i32", ...) and constexpr values (name -> value); every parameter must be
    in one of them (bench/kernel_compile.py builds its launches' sources here too)."""
    from triton.compiler import ASTSource

    params = list(inspect.signature(fn.fn).parameters)
    signature = {name: types.get(name, "constexpr") for name in params}
    return ASTSource(fn, signature,
                     constexprs={(params.index(k),): v for k, v in constexprs.items()})


def compile_one(job: dict) -> dict:
    """Compile one (kernel, dtype, d_pad, levels, tile) for sm_<arch>; its resource row."""
    import triton
    from triton.backends.compiler import GPUTarget

    fn = _function(job["kernel"])
    const = _constexprs(job["kernel"], job["dtype"], job["d_pad"], job["levels"], job["tile"],
                        job.get("fp32_dot", "tf32x3"))
    src = ast_source(fn, _signature(job["kernel"], job["dtype"]), const)
    warps, stages = job["tile"][2], job["tile"][3]
    row = dict(job, tile=list(job["tile"]))
    try:
        out = triton.compile(src, target=GPUTarget("cuda", job["arch"], 32),
                             options=dict(num_warps=warps, num_stages=stages))
        with tempfile.TemporaryDirectory() as tmp:
            ptx = Path(tmp) / "k.ptx"
            ptx.write_text(out.asm["ptx"])
            arch = f"sm_{job['arch']}a" if job["arch"] >= 90 else f"sm_{job['arch']}"
            res = subprocess.run([_ptxas(job["arch"]), f"-arch={arch}", "-v", str(ptx), "-o",
                                  str(Path(tmp) / "k.cubin")], capture_output=True, text=True)
        regs = re.search(r"Used (\d+) registers", res.stderr)
        spill = re.search(r"(\d+) bytes spill stores", res.stderr)
        if regs is None or spill is None:
            raise RuntimeError(res.stderr.strip().splitlines()[-1] if res.stderr else "ptxas")
        row.update(regs=int(regs.group(1)), spill=int(spill.group(1)),
                   smem=int(out.metadata.shared), **mma_counts(out.asm["ptx"]),
                   trap_only=trap_only(out.asm["ptx"]))
        tmem = getattr(out.metadata, "tmem_size", None)     # Blackwell's tensor memory, columns
        if tmem is not None:
            row["tmem"] = int(tmem)
        row["warps_per_sm"] = warps_per_sm(row["regs"], row["smem"], warps, job["arch"])
    except Exception as exc:  # a tile the compiler refuses is a row, not the end of the run
        row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:160]}"
    return row


MMA_KINDS = (("wgmma", "wgmma", r"\bwgmma\.mma_async\b"),      # Hopper, warpgroup-wide
             ("tcgen05", "tcgen05.mma", r"\btcgen05\.mma\b"),   # datacenter Blackwell
             ("mma_sync", "mma.sync", r"\bmma\.sync\b"))         # sm_80's warp-level MMA


def mma_counts(ptx: str) -> dict:
    """Tensor-core instructions in a kernel's PTX by kind (MMA_KINDS: Hopper's asynchronous
    warpgroup MMAs, datacenter Blackwell's tcgen05 ones, sm_80's warp-level mma.sync), as
    written per thread (a loop body counts once)."""
    return {key: len(re.findall(pattern, ptx)) for key, _, pattern in MMA_KINDS}


def trap_only(ptx: str) -> bool:
    """Whether a kernel compiled to nothing but a trap: no global load, a `trap;` instruction.
    Triton 3.6 does that, without an error, for tiles whose accumulators overflow datacenter
    Blackwell's tensor memory (512 columns): on a card the launch would abort the process's
    CUDA context instead of raising OutOfResources."""
    return bool(re.search(r"^\s*trap;", ptx, re.M)) and not re.search(r"\bld\.global\b", ptx)


def _mma_cell(r: dict) -> str:
    if r.get("trap_only"):
        return "TRAP ONLY" + (f" (tensor memory {r['tmem']} columns)" if "tmem" in r else "")
    kinds = [f"{name} {r[key]}" for key, name, _ in MMA_KINDS if r.get(key)]
    return ", ".join(kinds) or ("–" if "wgmma" in r else "")


def _compile_mode() -> None:
    os.environ["TRITON_INTERPRET"] = "0"


def warps_per_sm(regs: int, smem: int, warps: int, arch: int) -> int:
    """Warps an SM could hold with blocks of `warps` warps at these registers per thread and
    shared memory per block (an estimate: the hardware also caps blocks per SM)."""
    per_warp = -(-regs * 32 // REG_GRANULE) * REG_GRANULE
    by_regs = REGS_PER_SM // (per_warp * warps) if regs else 32
    by_smem = SMEM_PER_SM.get(arch, 102400) // (smem + 1024)
    by_threads = MAX_THREADS // (32 * warps)
    return min(by_regs, by_smem, by_threads) * warps


def tile_arg(text: str) -> tuple[int, int, int, int]:
    """A --tiles entry, BLOCK_MxBLOCK_NxWARPSxSTAGES (e.g. 64x64x8x3)."""
    try:
        tile = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        tile = ()
    if len(tile) != 4 or min(tile) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not BLOCK_MxBLOCK_NxWARPSxSTAGES (positive integers, e.g. 64x64x8x3)")
    return tile


def jobs(args) -> list[dict]:
    from hiertail_fast.kernels._utils import TUNE_TILES, pair_blocks
    from hiertail_fast.kernels.balanced_contrastive_loss_positives import gpu_tiles
    out = []
    for arch in args.arch:
        for dtype in args.dtypes:
            for d_pad in args.dims:
                for kernel in args.kernels:
                    lse = kernel.startswith("lse")
                    cc = divmod(arch, 10)                              # the launchers' choice
                    dot = args.fp32_dot if dtype == "fp32" else None
                    fixed = (*(pair_blocks(1 << 20, d_pad, True, arch=cc, fp32_dot=dot) if lse
                               else gpu_tiles(d_pad, cc, dot)), 3)
                    extra = TUNE_TILES if getattr(args, "tiles", None) is None else args.tiles
                    tiles = [fixed] + [t for t in extra if t != fixed and not args.fixed_only]
                    levels_of = [lv for lv in args.levels if lv > 1 or "shared" not in kernel]
                    for levels in (levels_of if lse else [1]):
                        out += [dict(arch=arch, dtype=dtype, d_pad=d_pad, kernel=kernel,
                                     levels=levels, tile=t, fixed=t == fixed,
                                     fp32_dot=args.fp32_dot) for t in tiles]
    return out


def toolchain(archs: list[int]) -> dict:
    """The compiler versions behind the rows (Triton, and each arch's ptxas)."""
    import platform

    import triton
    out = {"triton": triton.__version__, "machine": platform.node() or "?"}
    for arch in archs:
        try:
            res = subprocess.run([_ptxas(arch), "--version"], capture_output=True, text=True)
            out[f"ptxas sm_{arch}"] = res.stdout.strip().splitlines()[-1]
        except (OSError, IndexError) as exc:
            out[f"ptxas sm_{arch}"] = f"unknown ({exc})"
    return out


def markdown(rows: list[dict], tools: dict) -> str:
    lines = ["# Triton loss kernels: registers, spills, shared memory (compiled, no GPU)", "",
             "Toolchain: " + "; ".join(f"{k} {v}" for k, v in tools.items()) + ".", "",
             "From `python bench/kernel_resources.py`: triton.compile for the target, ptxas -v; "
             "MMAs: the tensor-core instructions of the PTX, per thread (a loop body once). "
             "Tile = BLOCK_M x BLOCK_N, warps, stages; * = the fixed tile (`pair_blocks`, the "
             "positives' `gpu_tiles`). "
             "Facts of the compiled code, not timings.", "",
             "| arch | dtype | d | kernel | levels | tile | regs | spill B | smem KB | "
             "warps/SM | MMAs (PTX) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bm, bn, w, s = r["tile"]
        tile = f"{bm}x{bn} w{w} s{s}" + (" *" if r["fixed"] else "")
        dtype = r["dtype"] + (" ieee" if r["dtype"] == "fp32" and r.get("fp32_dot") == "ieee"
                              else "")
        head = (f"| sm_{r['arch']} | {dtype} | {r['d_pad']} | {r['kernel']} | "
                f"{r['levels']} | {tile} |")
        if "error" in r:
            lines.append(f"{head} {r['error']} | | | | |")
        else:
            lines.append(f"{head} {r['regs']} | {r['spill']} | {r['smem'] / 1024:.0f} | "
                         f"{r['warps_per_sm']} | {_mma_cell(r)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--arch", type=int, nargs="+", default=[90])
    ap.add_argument("--dims", type=positive(int), nargs="+", default=[64, 128],
                    help="padded head dims")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--dtypes", nargs="+", default=["fp32"], choices=sorted(_PTR))
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    ap.add_argument("--fixed-only", action="store_true", help="only the fixed tiles")
    ap.add_argument("--tiles", type=tile_arg, nargs="+", default=None,
                    help="the tiles beside the fixed one, BLOCK_MxBLOCK_NxWARPSxSTAGES "
                         "(default: kernels/_utils.TUNE_TILES)")
    ap.add_argument("--fp32-dot", default="tf32x3", choices=("tf32x3", "ieee"),
                    help="fp32 inputs' dots (ieee: the FMA path, marked 'fp32 ieee')")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    try:
        import triton  # noqa: F401
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError as exc:
        print(f"kernel_resources: needs triton with its NVIDIA backend ({exc})")
        return 1
    reason = unwritable_dir_reason(args.out)
    if reason:
        ap.error(f"--out: {reason}")
    todo = jobs(args)
    print(f"compiling {len(todo)} kernels for sm_{'/'.join(map(str, args.arch))} "
          f"({args.workers} workers)", flush=True)
    rows = []
    # fresh interpreters with the interpreter mode off: under TRITON_INTERPRET=1 (the test
    # suite) @triton.jit makes interpreted functions, which cannot be compiled for a GPU
    with ProcessPoolExecutor(max_workers=max(1, args.workers), initializer=_compile_mode,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        for i, row in enumerate(pool.map(compile_one, todo), 1):
            rows.append(row)
            if i % 10 == 0 or i == len(todo):
                print(f"  {i}/{len(todo)}", flush=True)
    tools = toolchain(args.arch)
    args.out.mkdir(parents=True, exist_ok=True)
    with atomic_path(args.out / "kernel_resources.json") as tmp:
        tmp.write_text(json.dumps({"toolchain": tools, "rows": rows}, indent=1))
    text = markdown(rows, tools)
    with atomic_path(args.out / "kernel_resources.md") as tmp:
        tmp.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
