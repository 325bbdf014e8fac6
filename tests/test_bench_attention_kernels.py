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
