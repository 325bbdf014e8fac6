"""bench/compile_time.py on a tiny problem: the modes run, the custom-op mode traces one graph
(fullgraph), the results are written as JSON, an earlier file kept as .prev."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from bench import compile_time


def test_compile_time_smoke(tmp_path, capsys):
    out = tmp_path / "compile_time.json"
    rc = compile_time.main(["--n", "60", "--d", "4", "--steps", "1", "--repeats", "1",
                            "--modes", "eager:-,custom-op:aot_eager", "--json", str(out)])
    assert rc == 0
    rows = {r["mode"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["eager"]["graphs"] == 0
    assert rows["custom-op"]["graphs"] == 1 and rows["custom-op"]["compiler"] == "aot_eager"
    assert all(r["first_call_s"] > 0 and r["steady_s"] > 0 for r in rows.values())
    assert "| custom-op | aot_eager |" in capsys.readouterr().out
    # a second run keeps the first's file as .prev (it was replaced without a word before)
    first = out.read_text()
    assert compile_time.main(["--n", "40", "--d", "4", "--steps", "1", "--repeats", "1",
                              "--modes", "eager:-", "--json", str(out)]) == 0
    assert (tmp_path / "compile_time.prev.json").read_text() == first
    assert "kept as" in capsys.readouterr().out
    assert json.loads(out.read_text())["n"] == 40


def test_compile_time_round_robin_medians_and_ratio_to_eager(monkeypatch, capsys, tmp_path):
    """main (the fresh processes stubbed): every repeat runs each mode once, in turn, with
    --steps; a row's first-call and steady figures are the MEDIANS over the repeats, and
    "vs eager" is the mode's steady time over eager's."""
    runs = {"eager": iter([(1.0, 0.010), (9.0, 0.012), (2.0, 0.038)]),
            "custom-op": iter([(5.0, 0.040), (3.0, 0.005), (4.0, 0.060)])}
    calls = []

    def fake_run(cmd, **kwargs):
        mode, compiler = cmd[cmd.index("--worker") + 1:cmd.index("--worker") + 3]
        calls.append((mode, compiler, cmd[cmd.index("--steps") + 1]))
        first, steady = next(runs[mode])
        return SimpleNamespace(stdout=json.dumps(
            {"mode": mode, "compiler": None if compiler == "-" else compiler,
             "first_call_s": first, "steady_s": steady, "graphs": 1}) + "\n")

    monkeypatch.setattr(compile_time.subprocess, "run", fake_run)
    out = tmp_path / "c.json"
    assert compile_time.main(["--repeats", "3", "--steps", "7", "--modes",
                              "eager:-,custom-op:aot_eager", "--json", str(out)]) == 0
    assert calls == [("eager", "-", "7"), ("custom-op", "aot_eager", "7")] * 3
    rows = {r["mode"]: r for r in json.loads(out.read_text())["rows"]}
    assert (rows["eager"]["first_call_s"], rows["eager"]["steady_s"]) == (2.0, 0.012)
    assert (rows["custom-op"]["first_call_s"], rows["custom-op"]["steady_s"]) == (4.0, 0.040)
    assert "| custom-op | aot_eager | 4.00 | 1 | 40.0 | 3.33x |" in capsys.readouterr().out


def test_compile_time_worker_custom_op_is_fullgraph_and_traced_is_not(monkeypatch):
    """worker: the custom-op mode compiles with the loss's custom op on and fullgraph=True,
    the traced mode with the custom op off (the loss's Python dispatch traced) and without
    fullgraph."""
    import torch

    from hiertail_fast.ops import _custom_ops

    if not _custom_ops.READY:
        pytest.skip("no custom op in this torch")
    monkeypatch.setattr(_custom_ops, "READY", True)
    seen = []

    def fake_compile(fn, backend, fullgraph):
        seen.append((_custom_ops.READY, fullgraph))
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch._dynamo, "lookup_backend", lambda name: name)
    for mode in ("custom-op", "traced"):
        row = compile_time.worker(mode, "aot_eager", 20, 4, "official", 1)
        assert row["mode"] == mode and row["steady_s"] > 0
    assert seen == [(True, True), (False, False)]
