"""bench/kernel_compile.py: the Triton kernels' launches captured under the interpreter and
compiled for a GPU target on this GPU-less machine (a pre-flight for a GPU run)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import kernel_compile  # noqa: E402

from hiertail_fast.ops._dispatch import triton_interpreting  # noqa: E402
from tests.conftest import requires_triton  # noqa: E402

pytestmark = [requires_triton, pytest.mark.skipif(
    not triton_interpreting(),
    reason="the capture runs the kernels under the interpreter (CPU runs)")]


def _nvidia_backend() -> bool:
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError:
        return False
    return True


def _kernel(a_ptr, idx_ptr, n, big, scale, flag, BLOCK: tl.constexpr,  # noqa: F821
            MODE: tl.constexpr = "fast"):  # noqa: F821
    """(a stand-in with a kernel's parameter list; never run)"""


def test_a_launch_is_recorded_with_triton_types_and_constexprs():
    record = kernel_compile.launch_record(
        _kernel, (torch.ones(2), torch.ones(2, dtype=torch.int64), 7, 2 ** 40, 0.5, True),
        {"BLOCK": 16, "num_warps": 8})
    assert record == {
        "module": __name__, "kernel": "_kernel",
        "types": {"a_ptr": "*fp32", "idx_ptr": "*i64", "n": "i32", "big": "i64",
                  "scale": "fp32", "flag": "i1"},
        "constexprs": {"BLOCK": 16, "MODE": "fast"}, "options": {"num_warps": 8}}
    with pytest.raises(ValueError, match="_kernel: missing a required argument"):
        kernel_compile.launch_record(_kernel, (torch.ones(2),), {"BLOCK": 16})


def _unpool(device="cpu"):
    import hiertail_fast as hf
    hf.topk_unpool(torch.randn(3, 4, device=device), torch.tensor([0, 2, 4], device=device), 6,
                   backend="triton")


def test_capture_records_each_distinct_launch_once_and_lists_refused_calls(triton_device):
    assert triton_device == "cpu"       # (the module runs under the interpreter only)
    def refused():
        raise ValueError("not for this dtype\nsecond line")

    def crashed():
        raise RuntimeError("the interpreter fell over")

    def workload():
        yield "unpool", _unpool
        yield "unpool again", _unpool                   # the same launch: recorded once
        yield "refused", refused
        yield "crashed", crashed

    launches, refusals, failures = kernel_compile.capture(workload)
    assert [r["kernel"] for r in launches] == ["_topk_unpool_scatter_kernel"]
    assert launches[0]["module"] == "hiertail_fast.kernels.topk_pool"
    assert launches[0]["types"]["xp_ptr"] == "*fp32"
    assert refusals == ["refused: ValueError: not for this dtype"]
    assert failures == ["crashed: RuntimeError: the interpreter fell over"]


@pytest.mark.skipif(not _nvidia_backend(), reason="triton without its NVIDIA backend")
def test_compiles_for_sm_90_and_reports_a_launch_that_does_not(tmp_path, monkeypatch,
                                                               triton_device):
    """main: the captured launch compiles for sm_90 (ok, its shared memory), and the same
    launch with a block size tl.arange refuses (not a power of two) is a failed row, named in
    the markdown, and exit code 1: the check can fail."""
    real_capture = kernel_compile.capture

    def capture(workload):
        launches, refused, failed = real_capture(lambda: iter([("unpool", _unpool)]))
        broken = json.loads(json.dumps(launches[0]))
        block = next(k for k in broken["constexprs"] if k.startswith("BLOCK"))
        broken["constexprs"][block] = 3
        return [launches[0], broken], refused, failed

    monkeypatch.setattr(kernel_compile, "capture", capture)
    rc = kernel_compile.main(["--arch", "90", "--jobs", "1", "--out", str(tmp_path)])
    assert rc == 1
    report = json.loads((tmp_path / "kernel_compile.json").read_text())
    good, bad = report["rows"]
    assert good["ok"] and good["arch"] == 90 and good["cubin_bytes"] > 0, good
    assert not bad["ok"] and bad["error"], bad
    block = next(k for k, v in bad["constexprs"].items() if v == 3)
    md = (tmp_path / "kernel_compile.md").read_text()
    assert "**1 compiled, 1 failed**" in md
    assert "| `_topk_unpool_scatter_kernel` | 1 | 1 |" in md
    assert f"- sm_90 `_topk_unpool_scatter_kernel` ({block}=3" in md


def test_an_unwritable_out_is_refused_before_any_work(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    assert kernel_compile.main(["--out", str(target)]) == 2


def test_markdown_names_launches_over_the_cards_shared_memory():
    """A compiled launch whose shared memory exceeds the arch's per-block limit (it would fail
    at launch on the card) is listed; one within it is not."""
    def row(arch, shared):
        return {"kernel": "_k", "arch": arch, "ok": True, "shared_bytes": shared,
                "constexprs": {"BLOCK": 64}, "types": {"x": "*fp32"}, "options": {}}

    report = {"triton": "3.x", "machine": "m", "arch": [80, 90], "launches": 1,
              "seconds": 1.0, "refused": [], "interpreter_failures": [],
              "rows": [row(80, 200_000), row(90, 200_000)]}
    md = kernel_compile.markdown(report)
    assert "- sm_80 `_k` 200,000 > 166,912 bytes (BLOCK=64 | *fp32)" in md
    assert "sm_90 `_k`" not in md
    report["rows"] = [row(90, 200_000)]
    assert "Over the card's shared memory" not in kernel_compile.markdown(report)


@pytest.mark.skipif(not _nvidia_backend(), reason="triton without its NVIDIA backend")
def test_every_kernel_compiles_for_sm_90(tmp_path, triton_device):
    """The quick workload reaches all twelve Triton kernels of the package, and every launch
    compiles for sm_90 (the H100 / H200): the compiled-mode check of each kernel on a machine
    without a GPU (the interpreter, which runs every other CPU test of them, never compiles).
    About 20 s on two cores with an empty Triton cache."""
    assert triton_device == "cpu"
    rc = kernel_compile.main(["--quick", "--arch", "90", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "kernel_compile.json").read_text())
    failed = [(r["kernel"], r["error"]) for r in report["rows"] if not r["ok"]]
    assert rc == 0 and not failed and not report["interpreter_failures"], failed
    kernels = {r["kernel"] for r in report["rows"]}
    import importlib
    modules = [importlib.import_module(f"hiertail_fast.kernels.{name}") for name in (
        "balanced_contrastive_loss", "balanced_contrastive_loss_positives", "gcn_propagate",
        "nearest_prototype", "topk_pool")]
    declared = {name for module in modules for name, value in vars(module).items()
                if name.endswith("_kernel") and hasattr(value, "fn")}
    assert len(declared) == 12 and kernels == declared, declared ^ kernels
    # the key splits' launches (a split axis, partial planes) compile too: plain, relative and
    # shared-keys forwards and the one-pass backward
    split = [r for r in report["rows"] if r["constexprs"].get("SPLIT")]
    assert {(r["kernel"].split("_")[-2], bool(r["constexprs"].get("RELATIVE")),
             bool(r["constexprs"].get("SHARED"))) for r in split} >= {
        ("fwd", False, False), ("fwd", True, False), ("fwd", False, True),
        ("bwd", False, False), ("bwd", True, False), ("bwd", False, True)}
    # kernels/_utils.fp_fusion: the launches that need one rounded score compile without FMA
    # contraction: only .rn multiplies / adds / subtracts, which ptxas may not contract either
    unfused = [r for r in report["rows"] if r["options"].get("enable_fp_fusion") is False]
    assert {r["kernel"] for r in unfused} == {
        "_balanced_contrastive_loss_fwd_kernel", "_balanced_contrastive_loss_bwd_kernel",
        "_positive_pairs_kernel"}
    assert all(r["constexprs"].get("RELATIVE") or r["constexprs"].get("SHARED")
               for r in unfused if r["kernel"] != "_positive_pairs_kernel")
    for r in unfused:
        ops = r["ptx_float_ops"]
        assert ops["mul.f32"] == ops["add.f32"] == ops["sub.f32"] == 0, (r["kernel"], ops)


@pytest.mark.skipif(not _nvidia_backend(), reason="triton without its NVIDIA backend")
def test_relative_mode_would_be_contracted_with_triton_default(triton_device):
    """Why the relative mode launches with enable_fp_fusion=False: compiled for sm_90 with
    Triton's default, its forward contracts s = dot * scale into the subtractions that follow
    (FMAs replace them; on an H200 this put half an ulp of |s| into δ, 2026-12-04); with the
    launch's own options every subtraction stays a separately rounded sub.rn."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from hiertail_fast.kernels import balanced_contrastive_loss as k
    assert triton_device == "cpu"

    def work():
        gen = torch.Generator().manual_seed(0)
        z, log_w = torch.randn(40, 16, generator=gen), -torch.rand(1, 40, generator=gen)
        k.lse_forward(z, log_w, 0.5, True, relative=True)
    launches, _, failed = kernel_compile.capture(lambda: [("relative forward", work)])
    assert not failed and len(launches) == 1 and launches[0]["constexprs"]["RELATIVE"]
    own = dict(launches[0], arch=90)
    default = dict(own, options={o: v for o, v in own["options"].items()
                                 if o != "enable_fp_fusion"})
    assert own["options"]["enable_fp_fusion"] is False
    with ProcessPoolExecutor(2, initializer=kernel_compile._compile_mode,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        rows = list(pool.map(kernel_compile.compile_one, [own, default]))
    assert all(r["ok"] for r in rows), rows
    ops_own, ops_default = (r["ptx_float_ops"] for r in rows)
    subs = [ops["sub.f32"] + ops["sub.rn.f32"] for ops in (ops_own, ops_default)]
    assert ops_own["mul.f32"] == ops_own["sub.f32"] == 0 and ops_own["mul.rn.f32"] > 0
    assert subs[1] < subs[0] and ops_default["fma.rn.f32"] > ops_own["fma.rn.f32"], (
        ops_own, ops_default)
