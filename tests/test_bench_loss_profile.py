"""bench/loss_profile.py on CPU (its test mode): rows, the profile breakdown, the files."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import loss_profile  # noqa: E402


def test_rows_profile_and_files(tmp_path):
    rc = loss_profile.main(["--device", "cpu", "--sizes", "120:8", "--engines", "auto", "torch",
                            "torch+slices", "--budget", "60", "--reps", "1", "--out",
                            str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "loss_profile.json").read_text())
    rows = data["rows"]
    anchors = [r for r in rows if r["variant"] == "–"]
    assert {r["what"] for r in anchors} >= {"SDPA fp32 fwd+bwd", "SDPA bf16 fwd+bwd"}
    timed = [r for r in rows if r["variant"] != "–" and not r["what"].startswith("profile")]
    # fp32: 2 variants x 2 level counts x (auto, torch) + official x 2 levels x slices; bf16:
    # 2 x 2 x (auto, torch)
    assert len(timed) == 8 + 2 + 8
    assert all(r["median_s"] > 0 for r in timed), timed
    assert {r["engine"] for r in timed if r["what"] == "auto"} <= {"torch", "attention"}
    assert not [r for r in timed if r["what"] == "torch+slices" and r["variant"] == "exact"]
    prof = [r for r in rows if r["what"].startswith("profile")]
    assert len(prof) == 2 * 2 * 2 and all(r["top_host"] and r["ops"] > 0 for r in prof), prof
    # the machine's load at the start and end (whether the figures came from an idle machine)
    assert len(data["load_average_start"]) == len(data["load_average_end"]) == 3
    md = (tmp_path / "loss_profile.md").read_text()
    assert "load average" in md.splitlines()[0]
    assert "| 120 | 8 | official | 3 | bf16 | torch |" in md and "## Profile:" in md


def test_sizes_are_checked_and_cuda_is_required(capsys):
    with pytest.raises(SystemExit):
        loss_profile.main(["--device", "cpu", "--sizes", "20000x64"])
    if not torch.cuda.is_available():
        assert loss_profile.main([]) == 2
        assert "no CUDA" in capsys.readouterr().out


def test_autotuned_tiles_are_recorded_and_shown(monkeypatch):
    """An autotuned row keeps the tiles triton.autotune picked (its tuners' caches), so a GPU
    run says which tile won, and the markdown lists them."""
    import types

    import _gpu_checks as gc

    fake = types.SimpleNamespace(_TUNED={
        "fwd": types.SimpleNamespace(cache={(20000, 64, 1): "BLOCK_M: 64, num_warps: 8"}),
        "bwd": types.SimpleNamespace(cache={})})
    monkeypatch.setitem(sys.modules, "hiertail_fast.kernels.balanced_contrastive_loss", fake)
    tiles = gc.tuned_tiles()
    assert tiles == {"fwd": ["(20000, 64, 1) -> BLOCK_M: 64, num_warps: 8"], "bwd": []}
    monkeypatch.delitem(sys.modules, "hiertail_fast.kernels.balanced_contrastive_loss")
    assert gc.tuned_tiles() == {}
    report = dict(device="x", when="now", torch="t", load_average_start=None,
                  load_average_end=None, rows=[
                      dict(n=20000, d=64, variant="exact", levels=1, dtype="fp32",
                           what="triton[tf32x3+autotune]", median_s=0.01, tiles=tiles)])
    md = loss_profile.render(report)
    assert "Tiles autotuned by the triton[tf32x3+autotune] row (1 level(s)" in md
    assert "- fwd: `(20000, 64, 1) -> BLOCK_M: 64, num_warps: 8`" in md


def test_the_prepared_gpu_run_times_no_row_twice():
    """The shared-keys modes serve several levels of the exact variant only: on one level or
    the official variant they run plain "triton" / "triton[lean]", so timing them there re-timed
    those rows (16 of the prepared run's 144, its costliest: official, 3 levels)."""
    engines = ["auto", "triton", "triton[lean]", "triton[shared]", "triton[shared+lean]",
               "torch+triton", "attention+triton", "triton[tf32x3+autotune]"]
    cases = loss_profile.timed_cases(engines, "cuda")
    shared = [c for c in cases if c[3] in ("triton[shared]", "triton[shared+lean]")]
    assert shared and all(v == "exact" and lv == 3 for v, lv, _, _ in shared)
    assert len(shared) == 2 * 2                               # 2 modes x (fp32, bf16)
    assert len(set(cases)) == len(cases)
    assert not [c for c in cases if c[3] == "triton[tf32x3+autotune]"]   # tuned_rows' own
    assert not [c for c in cases if c[3].endswith("+triton") and c[0] == "exact"]
    # no Triton engine without CUDA (the CPU test mode)
    assert not [c for c in loss_profile.timed_cases(engines, "cpu") if c[3].startswith("triton")]


def test_the_cudnn_kernel_is_timed_where_it_runs():
    """attention[cudnn] ($HIERTAIL_ATTENTION_BF16=cudnn) changes the exact variant's bf16 rows
    only: fp32 runs the memory-efficient kernel, the official bf16 rows never run the bf16
    kernels; elsewhere it would re-time the attention rows. Its environment is set while its
    step runs and put back after."""
    import os

    import torch

    cases = loss_profile.timed_cases(["auto", "attention[cudnn]"], "cuda")
    cudnn = [c for c in cases if c[3] == "attention[cudnn]"]
    assert sorted(cudnn) == [("exact", 1, torch.bfloat16, "attention[cudnn]"),
                             ("exact", 3, torch.bfloat16, "attention[cudnn]")]
    assert os.environ.get("HIERTAIL_ATTENTION_BF16") is None
    with loss_profile.engine_mode("attention[cudnn]") as backend:
        assert backend == "attention" and os.environ["HIERTAIL_ATTENTION_BF16"] == "cudnn"
    assert os.environ.get("HIERTAIL_ATTENTION_BF16") is None


def test_a_refused_cudnn_call_is_an_error_not_a_time(monkeypatch):
    """The library falls back to its own engine when cuDNN refuses (unsaid, by design); timed
    as attention[cudnn], that fallback's time would have judged cuDNN (a review's find). In
    the profile a refusal ends the step with an error, so the row records it; outside the
    mode the fallback is as before."""
    import torch

    import hiertail_fast.ops._attention_lse as al
    from hiertail_fast import balanced_contrastive_loss

    def refusing(*args, **kwargs):
        raise RuntimeError("cuDNN Frontend error: no engine for this graph")
    real_op = al._op
    monkeypatch.setattr(al, "_kernel_kind", lambda device: "cuda")
    monkeypatch.setattr(al, "_op", lambda name, args: refusing if name == al._CUDNN_OP
                        else real_op(name, args))
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(40, 8, generator=gen).relu().bfloat16()
    y = torch.randint(0, 3, (40,), generator=gen)
    real_call = al._call_folded
    with loss_profile.engine_mode("attention[cudnn]") as backend:
        with pytest.raises(RuntimeError, match="the opt-in kernel refused the call: cuDNN "
                                               "Frontend error"):
            balanced_contrastive_loss(z, y, temperature=0.5, backend=backend)
    assert al._call_folded is real_call                           # put back after the mode
    monkeypatch.setenv("HIERTAIL_ATTENTION_BF16", "cudnn")        # the library alone: falls
    loss = balanced_contrastive_loss(z, y, temperature=0.5, backend="attention")   # back
    assert torch.isfinite(loss)


def test_time_is_kept_back_for_the_autotuned_rows():
    import gpu_report
    assert loss_profile.tuned_reserve(["auto", "triton[tf32x3+autotune]"], "cuda") == \
        gpu_report.AUTOTUNE_NEED_S / 2
    assert loss_profile.tuned_reserve(["auto", "triton"], "cuda") == 0
    assert loss_profile.tuned_reserve(["triton[tf32x3+autotune]"], "cpu") == 0


def test_every_opt_in_triton_mode_is_a_loss_profile_engine():
    # README says gpu_report.py and loss_profile.py time the opt-in Triton modes as extra
    # engines; loss_profile lacked triton[autotune] (exit 2, "invalid choice": a docs audit)
    assert set(loss_profile.gc.TRITON_MODES) <= set(loss_profile.ENGINES)
    assert "triton[autotune]" not in [c[3] for c in loss_profile.timed_cases(
        ["triton", "triton[autotune]"], "cuda")]                   # tuned_rows' own, as above


def _stub_sections(monkeypatch, calls: list, stop_after_first_row: bool = False):
    """main's sections stubbed: (section, n, d, ...) of each call go to `calls`."""
    def time_rows(dev, n, d, engines, reps, deadline, add):
        calls.append(("time", n, d, reps, deadline))
        add(dict(n=n, d=d, variant="exact", levels=1, dtype="fp32", what="torch", median_s=1e-3))
        if stop_after_first_row:
            raise KeyboardInterrupt
    monkeypatch.setattr(loss_profile, "time_rows", time_rows)
    monkeypatch.setattr(loss_profile, "tuned_rows", lambda dev, n, d, engines, reps, deadline,
                        add: calls.append(("tuned", n, d, reps, deadline)))
    monkeypatch.setattr(loss_profile, "profile_rows",
                        lambda dev, n, d, add: calls.append(("profile", n, d)))


def test_main_runs_the_sections_its_flags_ask_for_at_the_first_size(monkeypatch, tmp_path):
    """Every size's rows with --reps (3 unless given: the GPU session passes none), then the
    autotuned rows and the profile at the FIRST size; --profile-only and --no-profile each
    drop their sections; the JSON records the argv it was given."""
    calls: list = []
    _stub_sections(monkeypatch, calls)
    base = ["--device", "cpu", "--sizes", "30:4", "20:8", "--out", str(tmp_path)]
    assert loss_profile.main(base) == 0
    assert [c[:4] for c in calls[:2]] == [("time", 30, 4, 3), ("time", 20, 8, 3)]
    assert [c[:4] for c in calls[2:]] == [("tuned", 30, 4, 3), ("profile", 30, 4)]
    calls.clear()
    assert loss_profile.main(base + ["--reps", "5", "--no-profile"]) == 0
    assert [c[:4] for c in calls] == [("time", 30, 4, 5), ("time", 20, 8, 5), ("tuned", 30, 4, 5)]
    calls.clear()
    assert loss_profile.main(base + ["--profile-only"]) == 0
    assert calls == [("profile", 30, 4)]
    data = json.loads((tmp_path / "loss_profile.json").read_text())
    assert data["argv"] == base + ["--profile-only"]


def test_main_keeps_the_autotune_reserve_out_of_the_timed_rows(monkeypatch, tmp_path):
    """On CUDA (faked) with an autotuned engine, the timed rows' deadline is the run's minus
    tuned_reserve (AUTOTUNE_NEED_S / 2); the autotuned rows get the whole budget."""
    calls: list = []
    _stub_sections(monkeypatch, calls)
    monkeypatch.setattr(loss_profile.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(loss_profile.torch.cuda, "get_device_name", lambda *a: "fake GPU")
    assert loss_profile.main(["--sizes", "30:4", "--engines", "auto", "triton[autotune]",
                              "--no-profile", "--out", str(tmp_path)]) == 0
    (_, _, _, _, rows_deadline), (_, _, _, _, deadline) = calls
    assert deadline - rows_deadline == pytest.approx(
        loss_profile.gpu_report.AUTOTUNE_NEED_S / 2)


def test_each_row_is_on_disk_as_it_ends_and_a_bad_out_is_refused_first(monkeypatch, tmp_path,
                                                                        capsys):
    """A run stopped by a device call's limit keeps the rows it got (JSON and markdown written
    after every row); an --out that cannot be written is exit 2 naming --out before any row."""
    calls: list = []
    _stub_sections(monkeypatch, calls, stop_after_first_row=True)
    with pytest.raises(KeyboardInterrupt):
        loss_profile.main(["--device", "cpu", "--sizes", "30:4", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "loss_profile.json").read_text())["rows"]
    assert [(r["n"], r["what"]) for r in rows] == [(30, "torch")]
    assert "| 30 | 4 | exact | 1 | fp32 | torch | 1.00 |" in (
        tmp_path / "loss_profile.md").read_text()
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    calls.clear()
    with pytest.raises(SystemExit) as exc:
        loss_profile.main(["--device", "cpu", "--sizes", "30:4", "--out", str(blocker)])
    assert exc.value.code == 2 and not calls and "--out" in capsys.readouterr().err
    assert blocker.read_text() == "x"
