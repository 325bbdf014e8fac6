"""bench/_results.py, the result-file helper of loss_grid, attention_guard, loss_accuracy,
block_costs, vm_noise and interleaved, tested directly (the suite reached it only through a
loss-grid subprocess): a second run keeps the first result as NAME.prev.EXT and says so, and an
unwritable target is refused with one line before any work (s43 mutation audit).
"""
from __future__ import annotations

import argparse

import pytest

from tests.conftest import load_bench


@pytest.fixture(scope="module")
def results():
    return load_bench("bench_results_helper", "_results.py")


def test_write_result_keeps_the_previous_file_and_says_so(results, tmp_path, capsys):
    """A user re-running a benchmark would lose the earlier numbers silently if the old file
    were overwritten, or not know where they went if the message were dropped."""
    out = tmp_path / "grid.json"
    results.write_result(out, "first")
    assert out.read_text() == "first" and capsys.readouterr().out == ""
    results.write_result(out, "second")
    assert out.read_text() == "second"
    assert (tmp_path / "grid.prev.json").read_text() == "first"
    assert capsys.readouterr().out == (
        f"the previous grid.json is kept as {tmp_path / 'grid.prev.json'}\n")
    results.write_result(out, "third")          # one generation: the oldest goes
    assert (tmp_path / "grid.prev.json").read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.json", "grid.prev.json"]


def test_check_targets_refuses_any_unwritable_path_or_prev(results, tmp_path, capsys):
    """An hour-long benchmark whose --out (or its .prev, or a second output such as the .md
    beside the .json) cannot be written must stop before the run with exit 2 and one line, not
    after it with a traceback and the results lost."""
    parser = argparse.ArgumentParser(prog="bench")
    good, md = tmp_path / "g.json", tmp_path / "g.md"
    results.check_targets(parser, "--out", good, md)           # nothing to complain about
    md.write_text("old report")
    (tmp_path / "g.prev.md").mkdir()                            # its .prev cannot be replaced
    with pytest.raises(SystemExit) as exc:
        results.check_targets(parser, "--out", good, md)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--out {good} cannot be written: " in err and "g.prev.md" in err
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(SystemExit):
        results.check_targets(parser, "--out", tmp_path / "dir.json")
    assert f"--out {tmp_path / 'dir.json'} cannot be written" in capsys.readouterr().err
