"""bench/apply_overhead.py: the eager twin's per-call figure (a smoke run, not a timing)."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import apply_overhead  # noqa: E402


def test_runs_and_reports_the_three_calls(capsys):
    assert apply_overhead.main(["--rounds", "1", "--number", "3"]) == 0
    out = capsys.readouterr().out
    assert "Function.apply" in out and "Function.run" in out and "gcn_propagate" in out


def test_each_call_is_reported_per_call_against_the_twin(monkeypatch, capsys):
    """Each variant's line: the median round's time per call in microseconds (one thread),
    and that over the ctx-style twin's median."""
    import torch

    per_call = {"apply": iter([3e-6, 4e-6, 50e-6]), "run": iter([1e-6, 2e-6, 2e-6]),
                "op": iter([10e-6, 9e-6, 30e-6])}
    threads = []

    def timeit(f, number):
        threads.append(torch.get_num_threads())
        return next(per_call[f()]) * number

    monkeypatch.setattr(apply_overhead, "GCNPropagateFunction", SimpleNamespace(
        apply=lambda *a: "apply", run=lambda *a: "run"))
    monkeypatch.setattr(apply_overhead, "gcn_propagate", lambda *a: "op")
    monkeypatch.setattr(apply_overhead, "timeit", SimpleNamespace(timeit=timeit))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert apply_overhead.main(["--rounds", "3", "--number", "5"]) == 0
    finally:
        torch.set_num_threads(before)
    lines = {line.split("  ")[0].strip(): " ".join(line.split()[-5:])
             for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines == {"Function.apply (setup_context style)": "4.0 us (2.00x the twin)",
                     "Function.run (ctx-style twin)": "2.0 us (1.00x the twin)",
                     "gcn_propagate (the public op)": "10.0 us (5.00x the twin)"}
    assert set(threads) == {1} and len(threads) == 9
