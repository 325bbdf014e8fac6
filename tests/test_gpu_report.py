"""bench/gpu_report.py: the one-line exit without CUDA, the CPU-testable pieces (PASS/FAIL logic,
tables, atomic JSON writing, backend discovery) and a tiny end-to-end run with --device cpu."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

import hiertail_fast.ops._dispatch as dispatch
from tests._preloaded_cli import run_script
from tests.conftest import BENCH, load_bench, run_at_once

SCRIPT = BENCH / "gpu_report.py"
no_cuda_only = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


@pytest.fixture(scope="module")
def gc():
    return load_bench("bench_gpu_checks", "_gpu_checks.py")


def _run(*args: str) -> subprocess.CompletedProcess:
    return run_script(SCRIPT, args, timeout=600)


@no_cuda_only
def test_without_cuda_one_line_and_exit_2(tmp_path):
    res = _run("--out", str(tmp_path))
    assert res.returncode == 2, res.stderr
    assert len(res.stdout.strip().splitlines()) == 1 and "no CUDA" in res.stdout
    assert not any(tmp_path.iterdir())  # nothing written


def test_bad_arguments():
    for budget in ("0", "nan", "-inf", "inf"):   # nan switched the time budget off
        res = _run(f"--budget={budget}")
        assert res.returncode == 2 and "--budget must be a positive number" in res.stderr


@no_cuda_only
@pytest.mark.parametrize("layout", ["out-is-file", "report-is-dir"])
def test_unwritable_out_fails_before_any_section(tmp_path, layout):
    """--out checked before the first section (a fuzzing find: the traceback came after the
    correctness section, which on a GPU machine is device time spent for nothing)."""
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" if layout == "out-is-file" else tmp_path / "res"
    if layout == "report-is-dir":
        (out / "gpu_report.json").mkdir(parents=True)
    res = _run("--device", "cpu", "--out", str(out))
    assert res.returncode == 2 and "cannot be written" in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "correctness" not in res.stdout


def test_rel_error_and_verdict(gc):
    want = torch.tensor([1.0, -4.0, 2.0])
    assert gc.rel_error(torch.tensor([1.0, -4.0, 2.5]), want) == pytest.approx(0.5 / 4)
    assert gc.rel_error(torch.tensor([0.5, 0.0]), torch.zeros(2)) == 0.5  # absolute at zero
    assert gc.rel_error(torch.tensor([float("nan"), 0.0, 0.0]), want) == math.inf
    assert gc.rel_error(torch.empty(0), torch.empty(0)) == 0.0
    with pytest.raises(ValueError, match="shape"):
        gc.rel_error(torch.zeros(2), torch.zeros(3))
    assert gc.verdict(1e-5, 1e-4) == "PASS" and gc.verdict(1e-3, 1e-4) == "FAIL"
    assert gc.verdict(float("nan"), 1e-4) == "FAIL" and gc.verdict(math.inf, 1e-4) == "FAIL"
    with pytest.raises(ValueError, match="tol"):
        gc.verdict(0.0, 0.0)


def test_markdown_table_and_fmt(gc):
    text = gc.markdown_table(["a", "b"], [[1, "x|y"], ["–", 2.5]])
    assert text.splitlines() == ["| a | b |", "|---|---|", "| 1 | x\\|y |", "| – | 2.5 |"]
    with pytest.raises(ValueError, match="one cell per column"):
        gc.markdown_table(["a", "b"], [[1]])
    assert gc.fmt(0.0123, "s") == "12.30 ms" and gc.fmt(4.4, "s") == "4.400 s"
    assert gc.fmt(2.5e8, "MB") == "250 MB" and gc.fmt(None) == "–" and gc.fmt(1e-7) == "1.00e-07"


def test_atomic_write_replaces_or_keeps_the_old_file(gc, tmp_path):
    path = tmp_path / "sub" / "r.json"
    gc.write_json(path, dict(a=1, err=math.inf))
    assert json.loads(path.read_text()) == dict(a=1, err=math.inf)
    gc.write_json(path, dict(a=2))
    assert json.loads(path.read_text()) == dict(a=2)
    with pytest.raises(TypeError):
        gc.atomic_write_text(path, 123)  # fails while writing the temporary file
    assert json.loads(path.read_text()) == dict(a=2)  # the old report is intact
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temporary left behind


def test_time_call_and_guarded(gc):
    calls = []
    res = gc.time_call(lambda: calls.append(1), "cpu", reps=3, warmup=2)
    assert len(calls) == 5 and res["reps"] == 3 and res["median_s"] >= 0
    with pytest.raises(ValueError, match="reps"):
        gc.time_call(lambda: None, "cpu", reps=0)
    out = gc.guarded(lambda: 1 / 0)
    assert out["error"].startswith("ZeroDivisionError")
    assert gc.guarded(lambda: dict(ok=1)) == dict(ok=1)


def test_new_backend_names_are_picked_up_and_a_raising_backend_is_a_fail(gc, monkeypatch):
    with monkeypatch.context() as m:  # a backend registered later in _dispatch.BACKENDS
        m.setattr(dispatch, "BACKENDS", dispatch.BACKENDS + ("newengine",))
        fresh = load_bench("bench_gpu_checks_fresh", "_gpu_checks.py")
    assert "newengine" in fresh.FAST_BACKENDS and "reference" not in fresh.FAST_BACKENDS
    # the loss's own engines (the attention kernels) are validated for the loss only
    assert "attention" in fresh.LOSS_FAST_BACKENDS and "attention" not in fresh.FAST_BACKENDS
    # with the registration undone, choose_backend rejects "newengine": every check of it
    # raises -> FAIL rows carrying the error, while the other rows still run and pass
    monkeypatch.setattr(fresh, "FAST_BACKENDS", ("torch", "newengine"))
    monkeypatch.setattr(fresh, "LOSS_FAST_BACKENDS", ("torch", "attention", "newengine"))
    rows = fresh.correctness("cpu", n_graph=60, n_loss=40)
    bad = [r for r in rows if r["backend"] == "newengine"]
    assert len(bad) == 5 and all(r["result"] == "FAIL" and "newengine" in r["note"] for r in bad)
    good = [r for r in rows if r["backend"] == "torch"]
    # per backend: 3 gcn + 5 pooling + 1 prototype rows, and 4 per loss variant (value, grad z,
    # grad prototypes, grad of a learnable temperature)
    assert len(good) == 17 and all(r["result"] == "PASS" for r in good)
    attention = [r for r in rows if r["backend"] == "attention"]
    assert len(attention) == 8 and all(r["result"] == "PASS" for r in attention)



def test_triton_modes_set_and_restore_their_environment(gc, monkeypatch):
    """Each opt-in Triton mode names the triton backend and sets only the knobs of
    kernels/_utils.py, restoring them afterwards (also after an error); the modes are
    validated and timed on CUDA only."""
    from hiertail_fast.kernels import _utils as knobs

    monkeypatch.delenv(knobs.AUTOTUNE_ENV, raising=False)
    monkeypatch.setenv(knobs.FP32_DOT_ENV, "ieee")
    monkeypatch.delenv(knobs.TILES_ENV, raising=False)
    monkeypatch.delenv(knobs.SHARED_LEVELS_ENV, raising=False)
    monkeypatch.delenv(knobs.KEY_SPLITS_ENV, raising=False)
    knob_names = {knobs.FP32_DOT_ENV, knobs.AUTOTUNE_ENV, knobs.TILES_ENV,
                  knobs.SHARED_LEVELS_ENV, knobs.KEY_SPLITS_ENV}
    assert gc.TRITON_MODES and all(set(env) <= knob_names for env in gc.TRITON_MODES.values())
    for label, env in gc.TRITON_MODES.items():
        with gc.backend_mode(label) as backend:
            assert backend == "triton"
            assert all(os.environ[k] == v for k, v in env.items())
            assert knobs.fp32_dot() in knobs.FP32_DOTS  # values the launchers accept
            knobs.autotune_requested()
            knobs.tile_override()
            knobs.shared_levels_requested()
            knobs.key_splits(300, 64, 64, torch.zeros(1))
        assert os.environ[knobs.FP32_DOT_ENV] == "ieee" and knobs.AUTOTUNE_ENV not in os.environ
        assert knobs.TILES_ENV not in os.environ and knobs.SHARED_LEVELS_ENV not in os.environ
        assert knobs.KEY_SPLITS_ENV not in os.environ
    with pytest.raises(RuntimeError), gc.backend_mode("triton[tf32x3+autotune]"):
        raise RuntimeError("a failing check")
    assert os.environ[knobs.FP32_DOT_ENV] == "ieee" and knobs.AUTOTUNE_ENV not in os.environ
    with gc.backend_mode("torch") as backend:
        assert backend == "torch"
    assert gc.loss_labels("cpu") == gc.backends_for("cpu", loss=True)
    assert set(gc.loss_labels("cuda")) == set(gc.LOSS_FAST_BACKENDS) | set(gc.TRITON_MODES)
    assert gc.loss_check_labels("cpu") == gc.loss_labels("cpu")
    assert "triton[tf32x3]" in gc.loss_check_labels("cuda")
    assert not [m for m in gc.loss_check_labels("cuda") if "autotune" in m]
    # the A/B-only modes (earlier defaults' launches, validated where they were timed) neither
    assert gc.AB_ONLY_MODES <= set(gc.loss_labels("cuda"))
    assert not gc.AB_ONLY_MODES & set(gc.loss_check_labels("cuda"))
    assert "triton[shared]" in gc.loss_check_labels("cuda")
    assert [m for m in gc.TRITON_MODES if gc.autotuned(m)] == ["triton[autotune]",
                                                              "triton[tf32x3+autotune]"]
    assert not gc.autotuned(None) and not gc.autotuned("triton")


def test_anchor_ratios_use_the_rows_input_dtype():
    report = load_bench("bench_gpu_report", "gpu_report.py")
    rows = [dict(n=10, d=4, variant="–", what="SDPA fp32 fwd+bwd", median_s=2.0),
            dict(n=10, d=4, variant="–", what="SDPA bf16 fwd+bwd", median_s=0.5),
            dict(n=10, d=4, variant="–", what=report.FLOOR, median_s=4.0),
            dict(n=10, d=4, variant="exact", dtype="fp32", what="ours", median_s=1.0),
            dict(n=10, d=4, variant="exact", dtype="bf16", what="ours", median_s=1.0),
            dict(n=10, d=4, variant="official", what="ours", error="skipped: time budget"),
            dict(n=20, d=4, variant="exact", dtype="fp32", what="ours", median_s=1.0)]
    ratios = report.anchor_ratios(rows)
    assert ratios[3] == {"sdpa": 0.5, "floor": 0.25}
    assert ratios[4] == {"sdpa": 2.0, "floor": 0.25}
    assert 5 not in ratios and ratios[6] == {}            # no time; no anchors at N = 20
    assert not set(ratios) & {0, 1, 2}                    # anchors get no ratio of their own
    # a report saved part-way (after the checks, before the loss) renders, marked PARTIAL
    partial = dict(device="dev", when="now", torch="t", triton="tr", mode="cpu", wall_s=3.0,
                   complete=False, correctness=[])
    md = report.render(partial)
    assert "(PARTIAL: stopped or still running)" in md and "## Loss" in md
    assert "PARTIAL" not in report.render(dict(partial, complete=True))
    ys, ps = report.gc.nested_levels(torch.arange(40), torch.zeros(40, 3), 3)
    assert [int(y.max()) for y in ys] == [39, 19, 9] and [p.shape[0] for p in ps] == [40, 20, 10]

@pytest.mark.slow
@no_cuda_only
def test_end_to_end_on_cpu(tmp_path, gc):
    res = _run("--device", "cpu", "--out", str(tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_report.json").read_text())
    assert len(report["load_average_start"]) == len(report["load_average_end"]) == 3
    md = (tmp_path / "gpu_report.md").read_text()
    assert md in res.stdout and "## Correctness" in md and "| PASS |" in md
    assert report["complete"] is True and "PARTIAL" not in md
    assert report["backends"] == list(gc.FAST_BACKENDS)
    checks = report["correctness"]
    assert {r["op"].split(" (")[0] for r in checks} == set(dispatch.OPS)
    assert all(r["result"] == "PASS" for r in checks), [r for r in checks if r["result"] != "PASS"]
    what = {r["what"] for r in report["loss"]}
    assert {"SDPA fp32 fwd+bwd", "SDPA bf16 fwd+bwd", "cuBLAS fp32 3 x z@z.T (floor)"} <= what
    assert {f"ours ({b})" for b in gc.FAST_BACKENDS} | {"ours (reference)"} <= what
    engines = {(r["what"], r["levels"]) for r in report["loss"] if r["variant"] == "official"}
    assert {(f"ours ({b})", lv) for b in ("torch", "attention") for lv in (1, 3)} <= engines
    # the automatic engine: both variants x 1 / 3 levels x fp32 / bf16 inputs, with ratios
    auto = [r for r in report["loss"] if r["what"].startswith("ours (auto: ")]
    assert {(r["variant"], r["levels"], r["dtype"]) for r in auto} == {
        (v, lv, dt) for v in ("exact", "official") for lv in (1, 3) for dt in ("fp32", "bf16")}
    assert all("median_s" in r for r in auto), [r for r in auto if "median_s" not in r]
    assert "÷ SDPA" in md and "| 3 | bf16 | ours (auto: " in md
    assert {r["variant"] for r in report["loss"]} == {"–", "exact", "official"}
    timed = [r for r in report["loss"] + report["graph"] if "median_s" in r]
    assert timed and all(r["median_s"] > 0 for r in timed)
    assert all(r["timing"] == "round-robin" for r in timed)   # rows compared share the drift
    # one real torch.profiler step of each automatic row of the first size (no CUDA: no
    # device time), its counts in the report's section on where the time goes
    prof = [r for r in report["loss"] if r.get("profile")]
    assert len(prof) == 8 and all(r["seconds"] > 0 and r["ops"] > 0 for r in prof), prof
    assert "## Where the first size's time goes" in md
    prop = [r for r in report["graph"] if r["op"] == "gcn_propagate" and "median_s" in r]
    assert {r["provider"] for r in prop} >= {"torch", "peer_sparse_mm"}
    assert all(r["achieved_GBps"] > 0 for r in prop)
    assert report["scale"]["rows"] and "bench/scale.py --device cpu" in report["scale"]["command"]


@no_cuda_only
def test_gpu_session_script_logs_each_step_under_out(tmp_path):
    """bench/gpu_session.sh, the one prepared device call: on this CPU machine its report step
    runs gpu_report (exit 2, no CUDA) under the limit, logs it under $OUT and records the exit
    status; an unknown step is refused."""
    env = {"PATH": "/usr/bin:/bin", "REPORT_S": "120", "PYTHON": sys.executable}
    script = str(BENCH / "gpu_session.sh")
    # the five calls at once, each with its own $OUT (each spends most of its time importing
    # torch on one core: 15 s of this suite one after the other)
    calls = {"report": dict(STEPS="report"), "bad": dict(STEPS="report bogus"),
             "scale": dict(STEPS="scale", SCALE_S="60"),
             "resources": dict(STEPS="resources", RESOURCES_S="1"),
             "kernels": dict(STEPS="kernels", KERNELS_S="60")}
    runs = dict(zip(calls, run_at_once(
        [dict(args=["bash", script], cwd=BENCH.parent,
              env=dict(env, OUT=str(tmp_path / name), **extra))
         for name, extra in calls.items()]), strict=True))

    res, out = runs["report"], tmp_path / "report"
    assert res.returncode == 0, res.stderr
    summary = (out / "summary.txt").read_text().splitlines()
    assert len(summary) == 1 and summary[0].startswith("gpu_report rc 2 in ")
    assert "no CUDA" in (out / "gpu_report.log").read_text()
    assert (out / "machine.txt").exists()
    # every step name checked before the first step runs ("report bogus" ran the report, then
    # stopped before the archive: a docs audit), and nothing written
    bad = runs["bad"]
    assert bad.returncode == 2 and "unknown step bogus" in bad.stderr
    assert not (tmp_path / "bad").exists()
    # the optional scale step: one run per loss dtype, each logged with its exit status (here
    # scale.py refuses --device cuda: no CUDA on this machine)
    scale, out = runs["scale"], tmp_path / "scale"
    assert scale.returncode == 0, scale.stderr
    lines = (out / "summary.txt").read_text().splitlines()
    assert [ln.split(" rc ")[0] for ln in lines] == ["scale_float32", "scale_bfloat16"]
    assert all(" rc 2 in " in ln and "(limit 60 s)" in ln for ln in lines)
    for dt in ("float32", "bfloat16"):
        log = (out / f"scale_{dt}.log").read_text()
        assert "--device cuda was asked for but torch sees no CUDA device" in log
    # the resources step (bench/kernel_resources.py, compile only): wired, logged, limited
    # (a 1 s limit stops it: its own run is tests/test_bench_kernel_resources.py)
    res, out = runs["resources"], tmp_path / "resources"
    assert res.returncode == 0, res.stderr
    lines = (out / "summary.txt").read_text().splitlines()
    assert lines == [ln for ln in lines if ln.startswith("kernel_resources rc 124 in ")] != []
    assert (out / "kernel_resources.log").exists()
    # the kernels step (bench/attention_kernels.py): wired, logged, its exit status recorded
    # (2 here: no CUDA; its own run is tests/test_bench_attention_kernels.py)
    res, out = runs["kernels"], tmp_path / "kernels"
    assert res.returncode == 0, res.stderr
    lines = (out / "summary.txt").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attention_kernels rc 2 in "), lines
    assert "(limit 60 s)" in lines[0]
    assert "no CUDA" in (out / "attention_kernels.log").read_text()


def test_loss_rows_are_checkpointed_one_by_one():
    """loss_section fills the caller's list and calls the checkpoint after every row (the report
    is saved then: a run stopped by a device call's time limit keeps what it measured)."""
    report = load_bench("bench_gpu_report_ckpt", "gpu_report.py")
    rows, seen = [], []
    sizes = dict(report.SIZES["cpu"], loss_n=[150], loss_d=[8])
    out = report.loss_section("cpu", sizes, report.Budget(120, reps=1), rows=rows,
                              checkpoint=lambda: seen.append(len(rows)))
    assert out is rows and seen == list(range(1, len(rows) + 1))
    assert any(r["what"] == "ours (torch)" and r["levels"] == 3 for r in rows)


@pytest.mark.slow
@no_cuda_only
def test_sections_run_only_what_is_asked(tmp_path):
    """... and keep the report already there as gpu_report.prev.* (a later run of some
    sections replaced a full report, a fuzzing find)."""
    for name in ("gpu_report.md", "gpu_report.json"):
        (tmp_path / name).write_text(f"old {name}")
    res = _run("--device", "cpu", "--sections", "loss", "--out", str(tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert (tmp_path / "gpu_report.prev.md").read_text() == "old gpu_report.md"
    assert (tmp_path / "gpu_report.prev.json").read_text() == "old gpu_report.json"
    assert "previous report is kept as" in res.stdout
    report = json.loads((tmp_path / "gpu_report.json").read_text())
    assert report["sections"] == ["loss"] and report["complete"] is True
    assert report["correctness"] == [] and "graph" not in report
    assert any("median_s" in r for r in report["loss"])
    assert report["scale"] == {"error": "not run (--sections)"}
    assert ", sections: loss" in (tmp_path / "gpu_report.md").read_text()
    bad = _run("--device", "cpu", "--sections", "nope", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_auto_engine_labels_what_the_call_runs(gc, monkeypatch):
    """_gpu_checks.auto_engine: the library's own choice for the rows, the precision guard
    included (a CPU problem with our C kernels switched off: the attention kernels, or our
    engine for large logits); with them on, our engine."""
    z, y, protos = gc.loss_inputs(100, 8)
    from hiertail_fast.ops import _lse_symmetric

    if _lse_symmetric.available():
        assert gc.auto_engine(z, protos, "exact", 1, torch.float32) == "torch"
    monkeypatch.setenv(_lse_symmetric.ENV_VAR, "0")
    assert gc.auto_engine(z, protos, "exact", 1, torch.float32) == "attention"
    assert gc.auto_engine(z * 100, protos, "exact", 1, torch.float32) == "torch"   # guard
    assert gc.auto_engine(z, protos, "official", 1, torch.float32) == "torch"


def test_the_prepared_device_call_parses_and_names_known_engines():
    """bench/gpu_next.sh (the next device call, run blind on a borrowed GPU): valid bash, and
    every engine it asks loss_profile.py for is one loss_profile knows (a typo there would cost
    a device call)."""
    import re
    import shlex

    script = BENCH / "gpu_next.sh"
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    text = script.read_text().replace("\\\n", " ")
    args = re.search(r'PROFILE_ARGS="([^"]*)"', text).group(1)
    words = shlex.split(args)
    engines = words[words.index("--engines") + 1:]
    engines = engines[:next((i for i, w in enumerate(engines) if w.startswith("--")),
                            len(engines))]
    sys.path.insert(0, str(BENCH))
    import loss_profile
    assert engines and set(engines) <= set(loss_profile.ENGINES), engines
    for path in re.findall(r"tests/\S+\.py", text):
        assert (BENCH.parent / path).exists(), path


FAKE_PYTHON = """#!/bin/bash
echo "ARGS: $*"
echo "OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}"
echo "HIERTAIL_TEST_ORDER=${HIERTAIL_TEST_ORDER:-unset}"
prev=""; for a in "$@"; do [ "$prev" = "--out" ] && o=$a; prev=$a; done
case "$*" in *loss_profile.py*) mkdir -p "$o"; echo '{"rows": []}' > "$o/loss_profile.json"
  echo "# md" > "$o/loss_profile.md";; esac
"""


def _run_blind(script: str, tmp_path):
    """bench/`script` run with FAKE_PYTHON as the interpreter: (the completed process, its
    $OUT, its $TMPDIR)."""
    fake = tmp_path / "fakepy"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    tmp.mkdir()
    env = dict(os.environ, PYTHON=str(fake), TMPDIR=str(tmp), OUT=str(out))
    res = subprocess.run(["bash", f"bench/{script}"], cwd=BENCH.parent, env=env,
                         capture_output=True, text=True, timeout=300)
    return res, out, tmp


def test_the_prepared_device_call_brings_its_files_back(tmp_path):
    """bench/gpu_next.sh run blind with a stand-in interpreter: every step runs under its
    limit, the limits fit the device call's 560 s, and what it leaves under $OUT fits what a
    device call brings back (at most 8 files, at most 2 folders down): the earlier steps' logs
    in next.tgz (rewritten after each step), the profile's files straight under $OUT/profile."""
    import re
    import tarfile

    res, out, tmp = _run_blind("gpu_next.sh", tmp_path)
    assert res.returncode == 0, res.stderr
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert len(files) <= 8 and all(f.count("/") <= 2 for f in files), files
    assert {"next.tgz", "profile/loss_profile.json", "profile/loss_profile.md",
            "profile/summary.txt"} <= set(files), files
    with tarfile.open(out / "next.tgz") as tar:
        names = set(tar.getnames())
    assert {"./install/install.log", "./tests/pytest.log",
            "./resources/kernel_resources.log", "./kernels/attention_kernels.log"} <= names, names
    tests_log = (tmp / "gpu_next" / "tests" / "pytest.log").read_text()
    assert "OMP_NUM_THREADS=1" in tests_log and "-n 16" in tests_log
    limits = dict(re.findall(r"^(\w+) rc \d+ in \d+ s \(limit (\d+) s\)", res.stdout, re.M))
    assert set(limits) == {"install", "pytest", "kernel_resources", "attention_kernels",
                           "loss_profile"}, res.stdout
    assert sum(int(v) for v in limits.values()) <= 560 - 20, limits


def test_the_acceptance_call_brings_its_files_back(tmp_path):
    """bench/gpu_acceptance.sh (issue 9's acceptance call, run blind on a borrowed GPU) with a
    stand-in interpreter: valid bash, every step under its limit, the limits fit the device call's
    590 s, the whole suite goes to 16 workers, the device's tests first, and what it leaves
    under $OUT fits what a device call brings back (at most 8 files, at most 2 folders down)."""
    import re
    import tarfile

    script = BENCH / "gpu_acceptance.sh"
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    res, out, tmp = _run_blind(script.name, tmp_path)
    assert res.returncode == 0, res.stderr
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert len(files) <= 8 and all(f.count("/") <= 2 for f in files), files
    assert {"acceptance.tgz", "summary.txt"} <= set(files), files
    with tarfile.open(out / "acceptance.tgz") as tar:
        names = set(tar.getnames())
    assert {"./install/install.log", "./recheck/pytest.log", "./report/gpu_report.log",
            "./tests/pytest.log", "./scale/scale.log"} <= names, names
    tests_log = (tmp / "gpu_acceptance" / "tests" / "pytest.log").read_text()
    assert "OMP_NUM_THREADS=1" in tests_log and "-n 16 --durations=30 tests" in tests_log
    # the device's tests first (a stopped step has run those), and where the time went
    assert "HIERTAIL_TEST_ORDER=device-first" in tests_log and "--durations=" in tests_log
    report_log = (tmp / "gpu_acceptance" / "report" / "gpu_report.log").read_text()
    assert "--sections correctness loss scale" in report_log    # the graph ops: 2026-12-04's
    recheck = (tmp / "gpu_acceptance" / "recheck" / "pytest.log").read_text()
    for path in re.findall(r"tests/\S+\.py(?:::\w+)?", recheck):    # every node id exists
        file, _, test = path.partition("::")
        assert (BENCH.parent / file).exists(), path
        assert not test or f"def {test}(" in (BENCH.parent / file).read_text(), path
    # the summary is printed once per step as it runs, then once more from $A/summary.txt
    steps = re.findall(r"^(\w+) rc \d+ in \d+ s \(limit (\d+) s\)", res.stdout, re.M)
    steps = steps[:len(steps) // 2]
    assert [s for s, _ in steps] == ["install", "pytest", "gpu_report", "pytest",
                                     "scale_1M_fp32"], res.stdout
    assert sum(int(v) for _, v in steps) <= 590 - 20, steps
