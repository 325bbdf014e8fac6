"""bench/heap_ab.py (glibc's heap padding, keep vs auto, each in a fresh process, alternated):
the children run under the setting named, the rounds alternate, the medians and the ratio
follow from the rows, and argparse's errors."""
from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import heap_ab  # noqa: E402

ROW = re.compile(r"^round (\d) (keep|auto) call (\d)\s+([\d.]+) s\s+([\d,]+) minor faults\s+"
                 r"peak RSS ([\d,]+) MB$", re.M)


def test_alternated_children_and_medians_that_follow_from_their_rows(capsys):
    assert heap_ab.main(["--workload", "loss", "--nodes", "600", "--rounds", "2",
                         "--calls", "2"]) == 0
    out = capsys.readouterr().out
    rows = ROW.findall(out)
    assert [(r, s, c) for r, s, c, *_ in rows] == [
        ("0", "keep", "0"), ("0", "keep", "1"), ("0", "auto", "0"), ("0", "auto", "1"),
        ("1", "auto", "0"), ("1", "auto", "1"), ("1", "keep", "0"), ("1", "keep", "1")]
    for setting in ("keep", "auto"):
        kept = [float(t) for r, s, c, t, *_ in rows if s == setting and c != "0"]
        med = re.search(rf"^{setting} median ([\d.]+) s", out, re.M)
        assert float(med.group(1)) == pytest.approx(statistics.median(kept), abs=6e-4)
    ratio = float(re.search(r"^auto/keep ([\d.]+)$", out, re.M).group(1))
    meds = [float(m) for m in re.findall(r"^(?:keep|auto) median ([\d.]+) s", out, re.M)]
    (keep, auto), h = meds, 5e-4           # printed to 3 decimals: the ratio within their rounding
    assert (auto - h) / (keep + h) - h <= ratio <= (auto + h) / (keep - h) + h
    assert out.count("load average") == 2


def test_a_child_reports_the_setting_it_ran_under(monkeypatch, capsys):
    monkeypatch.setenv(heap_ab._roomy_heap.ENV_VAR, "keep")
    assert heap_ab.main(["--child", "--nodes", "600", "--calls", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all('"heap": "keep"' in line for line in lines)


def test_the_epoch_workload_runs_a_hiertail_epoch_per_call(monkeypatch, capsys):
    monkeypatch.setenv(heap_ab._roomy_heap.ENV_VAR, "auto")
    assert heap_ab.main(["--child", "--workload", "epoch", "--nodes", "300",
                         "--calls", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all('"heap": "auto"' in line for line in lines)
    assert all(float(re.search(r'"seconds": ([\d.e-]+)', line).group(1)) > 0 for line in lines)


@pytest.mark.parametrize("argv,message", [
    (["--calls", "1"], "--calls must be at least 2"),
    (["--workload", "epoch", "--nodes", "100"], "at least 280 nodes"),
    (["--rounds", "0"], "--rounds"),
])
def test_argument_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as err:
        heap_ab.main(argv)
    assert err.value.code == 2 and message in capsys.readouterr().err
