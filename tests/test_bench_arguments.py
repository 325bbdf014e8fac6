"""The benchmark tools refuse bad values with argparse's one-line error and exit 2 before any
work (a docs / bench audit found each of these a traceback, exit 1, or — kernel_resources,
compile_time — a run that exited 0 with rows of errors or a mislabelled mode)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests._preloaded_cli import run_script

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("script, args, message", [
    ("interleaved.py", ["propagation", "--nodes", "50"], "--nodes must be >= 70"),
    ("interleaved.py", ["propagation", "--rounds", "0"], "--rounds: must be an integer > 0, got 0"),
    ("a2_product.py", ["--sizes", "0"], "--sizes: must be an integer > 0, got 0"),
    ("a2_product.py", ["--rounds", "0"], "--rounds: must be an integer > 0, got 0"),
    ("nearest_degenerate.py", ["--rows", "0"], "--rows: must be an integer > 0, got 0"),
    ("tied_weights.py", ["--sizes", "1e2", "0"], "--sizes: must be a finite number > 0, got 0"),
    ("nearest_degenerate.py", ["--prototypes", "0"], "--prototypes: must be an integer > 0, got 0"),
    ("apply_overhead.py", ["--rounds", "0"], "--rounds: must be an integer > 0, got 0"),
    ("dispatch_count.py", ["--n", "0"], "--n: must be an integer > 0, got 0"),
    ("engine_ab.py", ["--tau", "-1"], "--tau: must be a finite number >= 1e-06, got -1"),
    ("kernel_resources.py", ["--dims", "0"], "--dims: must be an integer > 0, got 0"),
    ("kernel_compile.py", ["--jobs", "0"], "--jobs: must be an integer > 0, got 0"),
    ("kernel_compile.py", ["--arch", "0"], "--arch: invalid choice: 0"),
    ("compile_time.py", ["--n", "0"], "--n: must be an integer > 0, got 0"),
    ("compile_time.py", ["--modes", "bogus:aot_eager"], "--modes: bogus:aot_eager not among"),
    ("compile_time.py", ["--modes", "eager"], "--modes: eager not among"),
    # (each of these was a traceback, or for --seeds 0 a report of "worst error 0" from no run)
    ("interleaved.py", ["prototype", "--prototypes", "0"],
     "--prototypes: must be an integer > 0, got 0"),
    ("loss_accuracy.py", ["--taus", "0"], "--taus: must be a finite number >= 1e-06, got 0"),
    ("official_prototype_copy.py", ["--seeds", "0"], "--seeds: must be an integer > 0, got 0"),
    ("official_small_n.py", ["--n", "0"], "--n: must be an integer > 0, got 0"),
    ("official_small_n.py", ["--dims", "3", "0"], "--dims: must be an integer > 0, got 0"),
    ("official_small_n.py", ["--bounds", "0"], "--bounds: must be a finite number > 0, got 0"),
    ("official_prototype_copy.py", ["--norm", "0"], "--norm: must be a finite number > 0, got 0"),
    ("exact_small_n.py", ["--n", "1"], "--n >= 2"),
    ("exact_small_n.py", ["--seeds", "0"], "--seeds: must be an integer > 0, got 0"),
    ("dispatch_count.py", ["--d", "0"], "--d: must be an integer > 0, got 0"),
    # an audit of the tools (session 66): each was a traceback, or an option silently ignored
    ("dispatch_count.py", ["--backend", "bogus"], "--backend: invalid choice: 'bogus'"),
    ("dispatch_count.py", ["--epoch", "10"], "--epoch needs at least 70 nodes"),
    ("dispatch_count.py", ["--positives", "slices"], "--positives needs --as-cuda"),
    ("dispatch_count.py", ["--positives", "band"], "--positives needs --as-cuda"),
    ("hub_rows.py", ["--rev", "HEAD", "--hubs", "0"], "--nodes >= --hubs >= 1"),
    ("loss_golden.py", ["compare", "no-such.pt", "x.pt"],
     "compare: no-such.pt and x.pt must be records of this script (FileNotFoundError"),
    ("a2_product.py", ["--sizes", "10"], "--sizes must be >= 12"),
    ("epoch_ab.py", ["--rev", "HEAD", "--nodes", "300", "--rounds", "2", "--avg-degree", "500"],
     "--avg-degree must be below the smallest size - 1, got 500 for 300 nodes"),
    ("interleaved.py", ["propagation", "--out", ""], "--out: an empty path (a file name is"),
    # every size is checked, not only the first or the largest; an option the tool cannot
    # honour is refused, not run under a wrong label
    ("interleaved.py", ["propagation", "--nodes", "1000", "50"],
     "--nodes must be >= 70 for propagation (its benchmark graphs have 70 classes), got 50"),
    ("interleaved.py", ["pooling", "--modes", "fwd"], "pooling is timed in modes ['fwd+bwd']"),
    ("version_ab.py", ["--rev", "HEAD", "--n", "50", "--rounds", "1"], "--rounds at least 2"),
    ("epoch_ab.py", ["--rev", "HEAD", "--nodes", "300", "--rounds", "1"],
     "--rounds must be at least 2"),
    ("epoch_ab.py", ["--rev", "HEAD", "--nodes", "300", "10", "--classes", "5", "--rounds", "2"],
     "every size at least 4 x --classes"),
    ("epoch_ab.py", ["--rev", "HEAD", "--nodes", "300", "3000", "--rounds", "2",
                     "--avg-degree", "500"], "got 500 for 300 nodes"),
])
def test_bad_values_are_one_line_and_exit_2(script, args, message, tmp_path):
    res = run_script(BENCH / script, args, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr


def test_compile_time_checks_its_json_before_the_runs(tmp_path):
    res = run_script(BENCH / "compile_time.py", ["--modes", "eager:-", "--json", tmp_path])
    assert res.returncode == 2 and f"--json {tmp_path} cannot be written" in res.stderr
    assert "repeat 1/" not in res.stderr                       # no fresh process was started


@pytest.mark.parametrize("script, option", [
    ("loss_grid.py", "--taus"), ("loss_accuracy.py", "--taus"), ("dispatch_count.py", "--tau"),
    ("engine_ab.py", "--tau"), ("version_ab.py", "--tau"), ("attention_kernels.py", "--tau"),
    ("exact_small_n.py", "--tau"), ("official_small_n.py", "--tau"),
    ("official_prototype_copy.py", "--taus")])
@pytest.mark.parametrize("value", ["1e-7", "inf", "nan"])
def test_a_temperature_the_loss_refuses_is_refused_by_the_tool(script, option, value):
    """The tools checked tau > 0 (or only positive and finite): 1e-7 passed, and the loss
    raised its ValueError from inside the run, a traceback (an audit of the tools). They take
    the loss's own bound now (temperature_arg, MIN_TEMPERATURE = 1e-6)."""
    res = run_script(BENCH / script, [option, value, "--rev", "HEAD"]
                     if script == "version_ab.py" else [option, value])
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert f"argument {option}: must be a finite number >= 1e-06, got {value}" in res.stderr
