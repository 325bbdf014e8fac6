"""bench/engine_ab.py (in-process A/B of the torch engine's alternative paths): every switch
runs end to end on a tiny case, really swaps the path while timing, and restores the library's
own path afterwards."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import hiertail_fast.ops._lse_torch as lse_mod
import hiertail_fast.ops._positive_blocks as blocks_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import engine_ab  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("switch, levels", [("fold", 1), ("weights", 3), ("rest", 3)])
def test_each_switch_runs_swaps_and_restores(switch, levels, capsys, monkeypatch):
    real = (lse_mod.level_weights, blocks_mod._constant_per_group,
            blocks_mod.BlockPositives._rest_columns)
    seen = []
    spy = {"weights": (lse_mod, "level_weights"),
           "fold": (blocks_mod, "_constant_per_group"),
           "rest": (blocks_mod.BlockPositives, "_rest_columns")}[switch]
    original = getattr(*spy)

    def watch(*a, **k):
        seen.append(getattr(*spy) is watch)
        return original(*a, **k)

    monkeypatch.setattr(*spy, watch)
    assert engine_ab.main(["--switch", switch, "--levels", str(levels), "--n", "150",
                           "--d", "8", "--rounds", "2", "--regimes", "relu"]) == 0
    out = capsys.readouterr().out
    assert "new/old" in out and "relu" in out
    # one block per call at this size: the new path's 2 calls (rounds) reach the spy, the old
    # path's 2 calls do not (4 would mean the switch never swapped); restored after
    assert len(seen) == 2 and all(seen) and getattr(*spy) is watch
    monkeypatch.undo()
    assert (lse_mod.level_weights, blocks_mod._constant_per_group,
            blocks_mod.BlockPositives._rest_columns) == real


def test_switch_all_runs_and_restores(capsys):
    real = (lse_mod.level_weights, blocks_mod._constant_per_group,
            blocks_mod.BlockPositives._rest_columns)
    assert engine_ab.main(["--switch", "all", "--levels", "1", "--n", "150", "--d", "8",
                           "--rounds", "2", "--regimes", "relu"]) == 0
    assert "new/old" in capsys.readouterr().out
    assert (lse_mod.level_weights, blocks_mod._constant_per_group,
            blocks_mod.BlockPositives._rest_columns) == real


def test_bad_arguments_exit_with_a_message():
    with pytest.raises(SystemExit):
        engine_ab.main(["--switch", "fold", "--rounds", "1"])
