"""bench/kernel_resources.py: the loss kernels compiled for sm_90 on this (GPU-less) machine."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import kernel_resources  # noqa: E402


def _nvidia_backend() -> bool:
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError:
        return False
    return True


def test_warps_per_sm_estimate():
    # 255 registers -> 8,192 per warp; 4 warps: 2 blocks by registers, 1 by 128 KB of smem
    assert kernel_resources.warps_per_sm(255, 128 * 1024, 4, 90) == 4
    # 93 -> 3,072 registers per warp, 24,576 per 8-warp block: 2 blocks
    assert kernel_resources.warps_per_sm(93, 32 * 1024, 8, 90) == 16
    assert kernel_resources.warps_per_sm(32, 1024, 4, 90) == 64             # thread cap
    assert kernel_resources.warps_per_sm(128, 240 * 1024, 4, 90) == 0       # does not fit


@pytest.mark.skipif(not _nvidia_backend(), reason="triton without its NVIDIA backend")
def test_compiles_and_reports(tmp_path):
    rc = kernel_resources.main(["--dims", "64", "--levels", "1", "--kernels", "lse fwd",
                                "lse bwd", "pos dz", "--fixed-only", "--workers", "1", "--out",
                                str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "kernel_resources.json").read_text())
    assert data["toolchain"]["triton"] and "ptxas sm_90" in data["toolchain"]
    rows = data["rows"]
    assert [r["kernel"] for r in rows] == ["lse fwd", "lse bwd", "pos dz"]
    assert all(r["fixed"] for r in rows)
    for r in rows:
        assert "error" not in r, r
        assert 0 < r["regs"] <= 255 and r["spill"] >= 0 and r["smem"] > 0
        assert r["warps_per_sm"] == kernel_resources.warps_per_sm(r["regs"], r["smem"],
                                                                  r["tile"][2], 90)
    # the LSE kernels' table tile, 8 warps since 2026-12-05 (the default launches compile)
    assert [r["tile"][:3] for r in rows[:2]] == [[128, 64, 8]] * 2
    # on sm_90 every dot is Hopper's wgmma: the forward's scores, the backward's scores and
    # W·Z (3xTF32: three per product), none on sm_80's mma.sync
    assert all(r["wgmma"] > 0 and r["mma_sync"] == 0 for r in rows)
    assert rows[1]["wgmma"] == 2 * rows[0]["wgmma"]
    assert rows[2]["tile"][:3] == [64, 32, 8]          # the positives' own GPU tile
    md = (tmp_path / "kernel_resources.md").read_text()
    assert "| sm_90 | fp32 | 64 | pos dz | 1 | 64x32 w8 s3 * |" in md
    assert md.splitlines()[-1].endswith(f"| wgmma {rows[2]['wgmma']} |")


def test_mma_counts():
    ptx = ("wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {..};\n"
           "wgmma.fence.sync.aligned;\nwgmma.mma_async.sp.x;\n"
           "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {..};\n")
    assert kernel_resources.mma_counts(ptx) == dict(wgmma=2, tcgen05=0, mma_sync=1)
    blackwell = "tcgen05.mma.cta_group::1.kind::tf32 [%r1], %rd2, %rd3, %r4, p;\n"
    assert kernel_resources.mma_counts(blackwell) == dict(wgmma=0, tcgen05=1, mma_sync=0)
    assert kernel_resources._mma_cell(dict(wgmma=2, tcgen05=0, mma_sync=1)) == (
        "wgmma 2, mma.sync 1")
    assert kernel_resources._mma_cell(dict(wgmma=0, tcgen05=0, mma_sync=0)) == "–"


def test_trap_only():
    """A kernel body that is only a trap (triton 3.6, sm_100, a tile over the tensor memory)
    is told from a kernel that merely contains one."""
    empty = ".entry k()\n{\n$L__func_begin0:\n\t.loc 1 326 0\n\ttrap;\n$L__tmp0:\n}\n"
    real = ("ld.global.v4.b32 {%r1, %r2, %r3, %r4}, [%rd1];\n@%p1 bra $L_ok;\n\ttrap;\n"
            "$L_ok:\n")
    assert kernel_resources.trap_only(empty) and not kernel_resources.trap_only(real)
    assert not kernel_resources.trap_only("ld.global.f32 %f1, [%rd1];\n")
    cell = kernel_resources._mma_cell(dict(trap_only=True, tmem=704, wgmma=0))
    assert cell == "TRAP ONLY (tensor memory 704 columns)"


def test_fixed_tile_is_the_launchers_choice_for_each_arch():
    """The row marked fixed is the tile the launcher would take on that arch, dtype and fp32
    dot (3xTF32 on 8.x / 12.x: the Ampere tile; IEEE dots: the lean tile), so an sm_80 table
    reports what an A100 runs."""
    from types import SimpleNamespace

    from hiertail_fast.kernels._utils import AMPERE_FP32_TILES, LEAN_TILES, pair_blocks
    from hiertail_fast.kernels.balanced_contrastive_loss_positives import GPU_TILES

    archs = [75, 80, 86, 90, 100, 120]
    for kernel, table in (("lse bwd", (*pair_blocks(1 << 20, 64, True), 3)),
                          ("pos dz", (*GPU_TILES, 3))):
        for dot in ("tf32x3", "ieee"):
            args = SimpleNamespace(arch=archs, dtypes=["fp32", "bf16"], dims=[64],
                                   kernels=[kernel], levels=[1], fixed_only=True, fp32_dot=dot)
            tiles = {(j["arch"], j["dtype"]): j["tile"] for j in kernel_resources.jobs(args)}
            want = {(a, "bf16"): table for a in archs}
            for a in archs:
                fp32 = ((*LEAN_TILES, 3) if dot == "ieee" else
                        (*AMPERE_FP32_TILES, 3) if a in (80, 86, 120) else table)
                want[a, "fp32"] = fp32
            assert tiles == want, (kernel, dot)


def test_fp32_dot_option_reaches_the_kernels_constants():
    """--fp32-dot ieee compiles the FMA-dot path: every dot of an fp32 row is "ieee" (3xTF32
    by default); bf16 rows are unchanged; the markdown marks the ieee rows."""
    from types import SimpleNamespace

    consts = {}
    for dot in ("tf32x3", "ieee"):
        args = SimpleNamespace(arch=[80], dtypes=["fp32", "bf16"], dims=[64],
                               kernels=["lse bwd", "pos dz"], levels=[1], fixed_only=True,
                               fp32_dot=dot)
        for job in kernel_resources.jobs(args):
            assert job["fp32_dot"] == dot
            const = kernel_resources._constexprs(job["kernel"], job["dtype"], job["d_pad"],
                                                 job["levels"], job["tile"], job["fp32_dot"])
            consts[dot, job["dtype"], job["kernel"]] = const
            if job["dtype"] == "fp32":
                assert {const["DOT_PRECISION"], const["GRAD_DOT_PRECISION"]} == {dot}
    for kernel in ("lse bwd", "pos dz"):
        assert consts["ieee", "bf16", kernel] == consts["tf32x3", "bf16", kernel]
    row = dict(arch=80, dtype="fp32", d_pad=64, kernel="lse bwd", levels=1, tile=[32, 64, 4, 3],
               fixed=True, fp32_dot="ieee", regs=255, spill=0, smem=1024, warps_per_sm=8)
    assert "| sm_80 | fp32 ieee | 64 | lse bwd |" in kernel_resources.markdown([row], {})


def test_tiles_option_replaces_the_tune_tiles(capsys):
    """--tiles compiles the fixed tile and the listed ones (not TUNE_TILES); a listed tile equal
    to the fixed one is not compiled twice; a malformed entry is an argparse error."""
    from types import SimpleNamespace

    from hiertail_fast.kernels._utils import TUNE_TILES

    base = dict(arch=[90], dtypes=["fp32"], dims=[64], kernels=["lse bwd"], levels=[1],
                fixed_only=False, fp32_dot="tf32x3")
    fixed = next(j["tile"] for j in kernel_resources.jobs(SimpleNamespace(**base, tiles=None))
                 if j["fixed"])
    default = [j["tile"] for j in kernel_resources.jobs(SimpleNamespace(**base, tiles=None))]
    assert default == [fixed] + [t for t in TUNE_TILES if t != fixed]
    asked = [kernel_resources.tile_arg(t) for t in ("64x64x8x3", "32x32x2x2")]
    got = [j["tile"] for j in kernel_resources.jobs(SimpleNamespace(**base, tiles=asked + [fixed]))]
    assert got == [fixed, (64, 64, 8, 3), (32, 32, 2, 2)]
    for bad in ("64x64x8", "64x64x8x0", "axbxcxd"):
        with pytest.raises(SystemExit):
            kernel_resources.main(["--tiles", bad])
        assert "BLOCK_MxBLOCK_NxWARPSxSTAGES" in capsys.readouterr().err


def test_warps_per_sm_granule_reservation_thread_cap_and_arch():
    """The occupancy estimate: registers per warp rounded up to 256-register granules, 1 KB of
    shared memory reserved per block, at most 2,048 threads, each arch's shared memory per SM
    (102,400 bytes for an arch it does not know), no register limit when none are reported."""
    # 33 registers: 1,056 per warp, 1,280 allocated; 4-warp blocks: 12 by registers
    assert kernel_resources.warps_per_sm(33, 0, 4, 90) == 48
    # half of sm_90's 228 KB per block: one block fits with the reservation, not two
    assert kernel_resources.warps_per_sm(32, 233472 // 2, 4, 90) == 4
    # 16 registers: 32 blocks by registers, 16 by the 2,048-thread cap
    assert kernel_resources.warps_per_sm(16, 0, 4, 90) == 64
    # 80 KB blocks: two on an A100 (164 KB), one on sm_86 and an unknown arch (100 KB)
    smem = 80 * 1024
    assert [kernel_resources.warps_per_sm(32, smem, 4, a) for a in (80, 86, 87)] == [8, 4, 4]
    assert kernel_resources.warps_per_sm(0, 0, 4, 90) == 64


def test_markdown_rows_put_each_value_in_its_column():
    """A row's cells in the header's order (registers, spill bytes, shared memory in KiB,
    warps/SM, MMAs); an error row has as many cells as the header; only fp32 rows are marked
    with an IEEE dot."""
    ok = dict(arch=90, dtype="bf16", d_pad=128, kernel="lse fwd", levels=3,
              tile=[128, 64, 8, 3], fixed=False, fp32_dot="ieee", regs=168, spill=24,
              smem=98304, warps_per_sm=8, wgmma=4, tcgen05=0, mma_sync=0)
    bad = dict(arch=90, dtype="fp32", d_pad=64, kernel="pos dz", levels=1, tile=[64, 32, 8, 3],
               fixed=True, fp32_dot="tf32x3", error="OutOfResources: shared memory")
    lines = kernel_resources.markdown([ok, bad], {"triton": "3"}).splitlines()
    header = next(ln for ln in lines if ln.startswith("| arch |"))
    assert lines[-2] == ("| sm_90 | bf16 | 128 | lse fwd | 3 | 128x64 w8 s3 | 168 | 24 | 96 | "
                         "8 | wgmma 4 |")
    assert lines[-1].startswith("| sm_90 | fp32 | 64 | pos dz | 1 | 64x32 w8 s3 * | "
                                "OutOfResources: shared memory |")
    assert lines[-1].count("|") == lines[-2].count("|") == header.count("|")


def test_jobs_compile_shared_keys_at_several_levels_and_the_positives_once():
    """The shared-keys kernels are compiled only for more than one level, the other LSE kernels
    for each level asked, the positives' kernels once (they have no levels)."""
    from types import SimpleNamespace

    args = SimpleNamespace(arch=[90], dtypes=["fp32"], dims=[64], levels=[1, 3],
                           kernels=["lse fwd", "lse bwd shared", "pos sums"], fixed_only=True,
                           fp32_dot="tf32x3")
    got = [(j["kernel"], j["levels"]) for j in kernel_resources.jobs(args)]
    assert got == [("lse fwd", 1), ("lse fwd", 3), ("lse bwd shared", 3), ("pos sums", 1)]


def test_each_kernel_name_compiles_its_own_mode():
    """The kernel names of the table compile their modes: the official forward with the row
    max in the relative mode, the "rel" backward with its arg-max fold, "shared" in the
    shared-keys mode, the positives' sums and gradient passes apart."""
    modes = {}
    for kernel in kernel_resources.KERNELS:
        c = kernel_resources._constexprs(kernel, "fp32", 64, 3, (64, 64, 4, 3))
        modes[kernel] = {k for k in ("NEED_MAX", "RELATIVE", "FOLD_ARGMAX", "SHARED",
                                     "NEED_SUMS", "NEED_DZ") if c.get(k)}
    assert modes == {"lse fwd": set(), "lse fwd+max": {"NEED_MAX", "RELATIVE"},
                     "lse bwd": set(), "lse bwd rel": {"RELATIVE", "FOLD_ARGMAX"},
                     "lse fwd shared": {"SHARED"}, "lse bwd shared": {"SHARED"},
                     "pos sums": {"NEED_SUMS"}, "pos dz": {"NEED_DZ"}}


def test_tile_arg_takes_an_upper_case_separator():
    """--tiles 64X64X8X3 is the tile 64x64x8x3."""
    assert kernel_resources.tile_arg("64X64X8X3") == (64, 64, 8, 3)


def _main_without_compiling(monkeypatch, rows):
    """kernel_resources.main with the compiles replaced by `rows` (in process, no spawn)."""
    class Pool:
        def __init__(self, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def map(self, fn, jobs):
            return [dict(job, tile=list(job["tile"]), **rows) for job in jobs]

    monkeypatch.setattr(kernel_resources, "ProcessPoolExecutor", Pool)
    monkeypatch.setattr(kernel_resources, "toolchain", lambda archs: {"triton": "test"})


def test_an_unwritable_out_is_refused_before_compiling(tmp_path, monkeypatch, capsys):
    """--out that is a file: argparse's one-line error, exit 2, and nothing compiled."""
    _main_without_compiling(monkeypatch, {})
    monkeypatch.setattr(kernel_resources, "jobs",
                        lambda args: pytest.fail("compiled for an unwritable --out"))
    target = tmp_path / "a-file"
    target.write_text("x")
    with pytest.raises(SystemExit) as info:
        kernel_resources.main(["--out", str(target)])
    assert info.value.code == 2 and "--out:" in capsys.readouterr().err
    assert target.read_text() == "x"


def test_a_failed_write_keeps_the_previous_results(tmp_path, monkeypatch):
    """The results are written atomically: a write that fails half-way (a full disk) leaves the
    previous kernel_resources.json as it was."""
    _main_without_compiling(monkeypatch, dict(regs=64, spill=0, smem=2048, warps_per_sm=16))
    previous = tmp_path / "kernel_resources.json"
    previous.write_text('{"rows": ["previous"]}')
    real = Path.write_text

    def half_then_full(self, text, *args, **kwargs):
        real(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        kernel_resources.main(["--dims", "64", "--levels", "1", "--kernels", "pos dz",
                               "--fixed-only", "--out", str(tmp_path)])
    monkeypatch.undo()
    assert json.loads(previous.read_text()) == {"rows": ["previous"]}
