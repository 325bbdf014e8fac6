"""bench/attention_kernels.py on CPU (its test mode): the float64 oracle against the CPU flash
kernel, both bias forms, a refused kernel as a row, the files and the no-CUDA exit."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import attention_kernels as ak  # noqa: E402


def test_cpu_rows_meet_float64_and_files(tmp_path):
    assert ak.main(["--device", "cpu", "--sizes", "200:16", "90:5", "--reps", "1",
                    "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "attention_kernels.json").read_text())
    rows = {(r["n"], r["what"]): r for r in data["rows"]}
    for n, d in ((200, 16), (90, 5)):
        for label in ak.CASES["cpu"]:
            row = rows[n, label]
            # the CPU flash kernel computes in fp32: its LSE and O meet the float64 oracle to
            # fp32 rounding, with the bias as its argument and folded into key columns alike.
            # A wrong oracle (scale, bias sign, rows) would be off by O(1).
            assert row["lse_abs_error"] < 1e-5 and row["out_rel_error"] < 1e-5, row
            assert row["median_s"] > 0 and row["over_sdpa_bf16_fwd"] > 0
        # the fold adds 3 columns, padded to a multiple of 8
        assert rows[n, "cpu flash fp32, folded bias"]["head_dim"] == -(-(d + 3) // 8) * 8
        assert rows[n, "cpu flash fp32 + bias"]["head_dim"] == -(-d // 8) * 8
        assert rows[n, "SDPA bf16 fwd"]["over_sdpa_bf16_fwd"] == pytest.approx(1.0)
    assert len(data["load_average_start"]) == 3
    md = (tmp_path / "attention_kernels.md").read_text()
    assert "| 200 | 16 | cpu flash fp32, folded bias | 24 |" in md
    # a second run keeps the first one's files as .prev (once: not its own first size's)
    assert ak.main(["--device", "cpu", "--sizes", "40:4", "50:4", "--reps", "1",
                    "--out", str(tmp_path)]) == 0
    prev = json.loads((tmp_path / "attention_kernels.prev.json").read_text())
    assert prev["rows"] == data["rows"]
    assert "| 200 | 16 |" in (tmp_path / "attention_kernels.prev.md").read_text()
    now = json.loads((tmp_path / "attention_kernels.json").read_text())
    assert {r["n"] for r in now["rows"]} == {40, 50}


def test_each_size_is_written_as_it_ends(monkeypatch, tmp_path):
    """A device call's limit can stop the run: the sizes measured by then are on disk."""
    real = ak.rows_at

    def stop_at_the_second(n, *args):
        if n == 50:
            raise KeyboardInterrupt
        return real(n, *args)
    monkeypatch.setattr(ak, "rows_at", stop_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        ak.main(["--device", "cpu", "--sizes", "40:4", "50:4", "--reps", "1",
                 "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "attention_kernels.json").read_text())["rows"]
    assert rows and {r["n"] for r in rows} == {40}


def test_the_oracle_sees_the_bias_and_the_scale():
    """The errors are measured against the right quantity: a call that drops the bias or takes
    another scale is off by O(1), not within fp32 rounding."""
    z, b = ak.inputs(120, 8)
    rows = torch.arange(0, 120, 7)
    want = ak.oracle(z, b, torch.float32, 10.0, rows)
    q, k, v, bias, _ = ak.operands(z, b, torch.float32, "arg", 10.0)
    right = ak.errors(lambda: ak._cpu_flash(q, k, v, bias, 10.0), 120, 8, want, rows)
    no_bias = ak.errors(lambda: ak._cpu_flash(q, k, v, None, 10.0), 120, 8, want, rows)
    other_scale = ak.errors(lambda: ak._cpu_flash(q, k, v, bias, 5.0), 120, 8, want, rows)
    assert right["lse_abs_error"] < 1e-5
    assert no_bias["lse_abs_error"] > 0.1 and other_scale["lse_abs_error"] > 0.1


def test_a_refused_kernel_is_a_row(monkeypatch, tmp_path):
    def refused(*args):
        raise RuntimeError("no kernel for these inputs")
    monkeypatch.setitem(ak.CASES["cpu"], "refused", (refused, torch.float32, "arg"))
    assert ak.main(["--device", "cpu", "--sizes", "64:8", "--reps", "1",
                    "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "attention_kernels.json").read_text())["rows"]
    bad = [r for r in rows if r["what"] == "refused"]
    assert len(bad) == 1 and "no kernel for these inputs" in bad[0]["error"]
    assert "median_s" not in bad[0]
    assert all("median_s" in r for r in rows if r["what"] != "refused")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_without_cuda_one_line_and_status_2(capsys, tmp_path):
    assert ak.main(["--out", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA" in out
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv", [["--sizes", "20000"], ["--sizes", "0:64"], ["--reps", "0"],
                                  ["--tau", "0"]])
def test_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as exc:
        ak.main(["--device", "cpu", *argv])
    assert exc.value.code == 2


def test_inputs_bias_is_minus_log_of_the_class_size():
    """inputs(): the class-balanced bias b_k = -log |class of k| (every b <= 0, the largest
    class the most negative), on gpu_report's rows."""
    z, b = ak.inputs(120, 8)
    z0, y, _ = ak.gc.loss_inputs(120, 8, seed=0)
    torch.testing.assert_close(z, z0)
    torch.testing.assert_close(b, -torch.log(torch.bincount(y)[y].float()))
    assert (b <= 0).all() and b.min() < 0


def test_the_oracle_rounds_z_to_the_kernels_dtype_and_errors_are_worst_row_relative():
    """oracle(): float64 on z as the kernel sees it (rounded to bf16 for a bf16 call), the bias
    exact; errors(): the LARGEST |lse - lse64| over the rows and the largest row's RELATIVE
    |O - O64| / |O64|, the head dim's padding columns left out."""
    z, b = ak.inputs(60, 8)
    rows = torch.arange(0, 60, 5)
    lse, o = ak.oracle(z, b, torch.bfloat16, 10.0, rows)
    zr = z.bfloat16().double()
    s = zr[rows] @ zr.t() * 10.0 + b.double()
    torch.testing.assert_close(lse, torch.logsumexp(s, dim=1))
    torch.testing.assert_close(o, torch.softmax(s, dim=1) @ zr)
    assert (lse - ak.oracle(z, b, torch.float32, 10.0, rows)[0]).abs().max() > 1e-4

    n, d = 4, 2
    want = (torch.zeros(n, dtype=torch.float64), torch.full((n, d), 1000.0, dtype=torch.float64))
    lse_got = torch.zeros(1, 1, n)
    lse_got[0, 0, 1] = 0.5                      # one row's LSE off by 0.5
    out = torch.full((1, 1, n, d + 6), 1000.0)
    out[..., d:] = 7.0                          # padding columns: not O's
    out[0, 0, 2] = 1500.0                       # one row's O off by 50 %
    got = ak.errors(lambda: (out, lse_got), n, d, want, torch.arange(n))
    assert got == {"lse_abs_error": 0.5, "out_rel_error": pytest.approx(0.5)}


def test_rows_call_at_one_over_tau_with_reps_and_ratios_over_the_bf16_anchors(monkeypatch):
    """rows_at: each kernel called at scale 1 / tau, timed with --reps; its time over SDPA
    bf16 fwd and over SDPA bf16 fwd+bwd (not fp32), kernel over anchor; the errors over
    every row when N <= ORACLE_ROWS (a wrong row is found)."""
    seen = {"scale": set()}

    def spy(q, k, v, bias, scale):
        seen["scale"].add(scale)
        return ak._cpu_flash(q, k, v, bias, scale)

    def one_bad_row(q, k, v, bias, scale):
        out, lse = ak._cpu_flash(q, k, v, bias, scale)
        lse = lse.clone()
        lse.view(-1)[3] += 1.0
        return out, lse

    monkeypatch.setitem(ak.CASES, "cpu", {"spy": (spy, torch.float32, "arg"),
                                          "bad": (one_bad_row, torch.float32, "arg")})
    times = {"SDPA bf16 fwd": 2e-3, "SDPA bf16 fwd+bwd": 4e-3, "SDPA fp32 fwd+bwd": 8e-3,
             "spy": 1e-3, "bad": 1e-3}

    def fake_round_robin(steps, dev, reps=3, *args, **kwargs):
        seen["reps"] = reps
        return {k: {"median_s": times[k]} for k in steps}

    monkeypatch.setattr(ak.gc, "time_round_robin", fake_round_robin)
    rows = {r["what"]: r for r in ak.rows_at(40, 4, "cpu", 7, 0.25)}
    assert seen == {"scale": {4.0}, "reps": 7}
    assert rows["spy"]["over_sdpa_bf16_fwd"] == pytest.approx(0.5)
    assert rows["spy"]["over_sdpa_bf16_fwd_bwd"] == pytest.approx(0.25)
    assert rows["SDPA fp32 fwd+bwd"]["over_sdpa_bf16_fwd_bwd"] == pytest.approx(2.0)
    assert rows["spy"]["lse_abs_error"] < 1e-5
    assert rows["bad"]["lse_abs_error"] == pytest.approx(1.0, abs=1e-4)


def test_the_anchors_run_in_the_dtype_they_are_named_after(monkeypatch):
    """SDPA bf16 fwd / bf16 fwd+bwd on bf16 operands, SDPA fp32 fwd+bwd on fp32 ones."""
    real = ak.F.scaled_dot_product_attention
    seen = []
    monkeypatch.setattr(ak.F, "scaled_dot_product_attention",
                        lambda q, k, v: seen.append(q.dtype) or real(q, k, v))
    steps = ak.anchors(torch.rand(16, 8), "cpu")
    assert set(steps) == {"SDPA bf16 fwd", "SDPA bf16 fwd+bwd", "SDPA fp32 fwd+bwd"}
    for name, step in steps.items():
        seen.clear()
        step()
        assert seen == [torch.bfloat16 if "bf16" in name else torch.float32], name


def test_an_unwritable_out_is_refused_before_any_row_and_tau_is_recorded(monkeypatch, tmp_path,
                                                                        capsys):
    """--out whose JSON target is a directory: exit 2 naming --out, before any kernel runs (not
    a traceback after the run); the run's --tau is in the JSON and the markdown's title."""
    ran = []
    monkeypatch.setattr(ak, "rows_at", lambda *a: ran.append(a) or [])
    (tmp_path / "attention_kernels.json").mkdir()
    with pytest.raises(SystemExit) as exc:
        ak.main(["--device", "cpu", "--sizes", "40:4", "--reps", "1", "--out", str(tmp_path)])
    assert exc.value.code == 2 and not ran
    assert "--out" in capsys.readouterr().err
    out = tmp_path / "ok"
    assert ak.main(["--device", "cpu", "--sizes", "40:4", "--reps", "1", "--tau", "0.5",
                    "--out", str(out)]) == 0
    assert ran[-1][-1] == 0.5
    assert json.loads((out / "attention_kernels.json").read_text())["tau"] == 0.5
    assert "tau 0.5;" in (out / "attention_kernels.md").read_text().splitlines()[0]
