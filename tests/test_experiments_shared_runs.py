"""Commands sharing a runs folder share its runs: a run another process is training is claimed
(an flock on a claim file beside the run's file), left for the end of this command's list,
waited for and read from the cache, or trained here when the other process stopped without
finishing it. The claim itself: exclusive, non-blocking or waiting, removed when released,
stale files (a killed process) claimable."""
from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

from hiertail_fast._files import claim
from hiertail_fast.experiments import run_cache, runner
from hiertail_fast.experiments.cli import main

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(sys.platform == "win32", reason="no flock on Windows")]

TINY = ["main", "--synthetic", "--synthetic-nodes", "120", "--seeds", "2", "--epochs", "3",
        "--hidden", "8", "--no-progress", "--device", "cpu", "--methods", "origin"]


def test_claim_is_exclusive_waits_and_leaves_no_file(tmp_path):
    path = tmp_path / ".run.training"
    with claim(path, wait=False) as held:
        assert held is True and path.exists()
        with claim(path, wait=False) as other:          # another open file: refused at once
            assert other is False
    assert not path.exists()

    path.touch()                                        # left by a killed process: no lock
    with claim(path, wait=False) as held:
        assert held is True
    assert not path.exists()

    order, holding, release = [], threading.Event(), threading.Event()

    def holder():
        with claim(path, wait=False) as held:
            order.append(("holder", held))
            holding.set()
            release.wait(10)
            order.append("holder released")

    t = threading.Thread(target=holder)
    t.start()
    holding.wait(10)
    threading.Timer(0.3, release.set).start()
    with claim(path, wait=True) as held:                # blocks until the holder is done
        order.append(("waiter", held))
    t.join(10)
    assert order == [("holder", True), "holder released", ("waiter", True)]
    assert not path.exists()


def test_a_released_claim_leaves_a_newer_claimants_file(tmp_path):
    # A holds; its file is removed (a cleanup); B claims anew, on a new file; A's release must
    # not remove B's file, or a third process could claim the run B trains (removing it
    # whatever file it was passed every test; mutation audit, session 69)
    path = tmp_path / ".run.training"
    a = claim(path, wait=False)
    assert a.__enter__() is True
    os.unlink(path)
    with claim(path, wait=False) as b_holds:
        assert b_holds is True
        a.__exit__(None, None, None)
        assert path.exists()
        with claim(path, wait=False) as third:
            assert third is False
    assert not path.exists()


def test_claim_where_no_file_can_be_made_is_best_effort(tmp_path):
    """(a folder that does not exist: the claim file cannot be created, as in a read-only
    folder, for root too)"""
    with claim(tmp_path / "missing" / ".run.training", wait=False) as held:
        assert held is True
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("other_finishes", [True, False])
def test_a_run_another_command_trains_is_waited_for_not_trained_twice(
        tmp_path, monkeypatch, capsys, other_finishes):
    """Seed 123 is being trained by "another command" (a thread holding its claim): this
    command trains seed 124 first, then waits; when the other finishes (its run file
    appears) this one reads it instead of training it; when the other stops without a run
    (killed), this one trains it. Either way the table holds both seeds, in seed order."""
    out = tmp_path / "out"
    before = main([*TINY, "--out", str(out)])        # the runs, to know their file names
    runs = out / "runs" / "synthetic"
    first = next(runs.glob("origin-*-s123.json"))
    saved = tmp_path / "s123.json"
    shutil.copy(first, saved)
    first.unlink()
    next(runs.glob("origin-*-s124.json")).unlink()
    claim_path = first.with_name(f".{first.stem}.training")

    trained, waiting = [], threading.Event()
    real_train, real_claim = runner._train, run_cache.claim

    def counting(spec, *args, **kwargs):
        trained.append(args[3])
        return real_train(spec, *args, **kwargs)

    def spying(path, *, wait):
        if wait:
            waiting.set()
        return real_claim(path, wait=wait)
    monkeypatch.setattr(runner, "_train", counting)
    monkeypatch.setattr(run_cache, "claim", spying)      # (RunCache.claim's)

    holding = threading.Event()

    def other_command():
        with real_claim(claim_path, wait=False) as held:
            assert held
            holding.set()
            waiting.wait(60)
            if other_finishes:
                shutil.copy(saved, Path(str(first) + ".tmp"))
                os.replace(Path(str(first) + ".tmp"), first)

    t = threading.Thread(target=other_command)
    t.start()
    assert holding.wait(60)
    res = main([*TINY, "--out", str(out)])
    t.join(60)
    stdout = capsys.readouterr().out
    assert "synthetic origin seed 123: another command is training it" in stdout, stdout
    assert "waiting for another command to finish synthetic origin seed 123" in stdout
    assert trained == ([124] if other_finishes else [124, 123])
    assert res["runs"] == 2 and res["rows"][0]["seeds"] == [123, 124]
    assert res["rows"][0]["metrics"] == before["rows"][0]["metrics"]
    assert sorted(p.name for p in runs.iterdir() if p.name.startswith(".")) == []
