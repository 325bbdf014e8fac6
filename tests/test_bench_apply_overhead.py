"""bench/apply_overhead.py: the eager twin's per-call figure (a smoke run, not a timing)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import apply_overhead  # noqa: E402


def test_runs_and_reports_the_three_calls(capsys):
    assert apply_overhead.main(["--rounds", "1", "--number", "3"]) == 0
    out = capsys.readouterr().out
    assert "Function.apply" in out and "Function.run" in out and "gcn_propagate" in out
