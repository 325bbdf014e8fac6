"""bench/cpu_gemm.py (the symmetric engine's GEMM forms on torch.mm vs oneDNN, round-robin):
each form on each provider, rows and ratios that follow from the timings, the per-shape
memory line, and argparse's errors."""
from __future__ import annotations

import os
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

from hiertail_fast.ops import _onednn_gemm as og

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import cpu_gemm  # noqa: E402

needs_onednn = pytest.mark.skipif(og._unavailable() is not None, reason=str(og._unavailable()))


@needs_onednn
def test_each_form_on_each_provider_and_the_tile_row(capsys, monkeypatch):
    calls = []
    for name in ("mm_nt", "add_mm_", "add_mm_t_"):
        real = getattr(og, name)

        def spy(*a, _real=real, _name=name, **k):
            calls.append((_name, k["use"]))
            return _real(*a, **k)

        monkeypatch.setattr(og, name, spy)
    assert cpu_gemm.main(["--widths", "256", "512", "--d", "8", "--rounds", "2",
                          "--repeat", "1", "--shapes", "3"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\s*(\d+)\s+(logits|rows|keys|tile)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$",
                      out, re.M)
    assert [(w, f) for w, f, *_ in rows] == [
        (w, f) for w in ("256", "512") for f in ("logits", "rows", "keys", "tile")]
    for w in ("256", "512"):
        got = {f: (float(b), float(o)) for ww, f, b, o, _ in rows if ww == w}
        for u in (0, 1):            # the tile = 2 x logits + rows + keys, per provider
            want = 2 * got["logits"][u] + got["rows"][u] + got["keys"][u]
            assert got["tile"][u] == pytest.approx(want, abs=0.026)   # 2-decimal roundings
    # 2 widths x 2 rounds x 3 forms x 2 providers, then the shapes' 3 x (mm_nt + add_mm_)
    assert len(calls) == 2 * 2 * 3 * 2 + 6
    assert {u for _, u in calls[:24]} == {"blas", "onednn"}
    # per width and round: logits on each provider, rows on each, and the keys as the engine
    # runs them (torch.mm: add_mm_ on the tile read transposed; oneDNN: into the transposed
    # accumulator, add_mm_t_)
    assert Counter(calls[:24]) == {("mm_nt", "blas"): 4, ("mm_nt", "onednn"): 4,
                                   ("add_mm_", "blas"): 8, ("add_mm_", "onednn"): 4,
                                   ("add_mm_t_", "onednn"): 4}
    assert re.search(r"RSS growth per distinct oneDNN shape: -?[\d.]+ MB \(3 shapes\)", out)
    assert out.count("load average") == 2


@needs_onednn
def test_loss_rows_per_tile_budget_and_the_environment_restored(capsys, monkeypatch):
    import hiertail_fast.ops._lse_symmetric as sym

    if not sym.available():
        pytest.skip("no symmetric engine here")
    monkeypatch.setattr(sym, "MIN_ROWS", 1)
    monkeypatch.setattr(sym, "MAX_BLOCK_ROWS", 16)
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", "123456")
    monkeypatch.delenv(og.ENV_VAR, raising=False)
    budgets = []
    real = sym._piece_width

    def spy(use="blas"):
        budgets.append((use, os.environ["HIERTAIL_CPU_BLOCK_BYTES"]))
        return real(use)

    monkeypatch.setattr(sym, "_piece_width", spy)
    assert cpu_gemm.main(["--widths", "16", "--d", "8", "--rounds", "2", "--repeat", "1",
                          "--loss", "300", "--tile-mib", "2", "1", "--loss-rounds", "2"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^loss N 300 round (\d) tiles\s+(\d+) MiB\s+[\d.]+ s\s+\d+ minor faults$",
                      out, re.M)
    assert rows == [("0", "2"), ("0", "1"), ("1", "2"), ("1", "1")]
    assert budgets == [("onednn", str(2 << 20)), ("onednn", str(1 << 20))] * 2
    assert os.environ["HIERTAIL_CPU_BLOCK_BYTES"] == "123456"
    assert og.ENV_VAR not in os.environ


@pytest.mark.parametrize("args, message", [
    (["--rounds", "1"], "--rounds must be at least 2"),
    (["--widths", "0"], "--widths: must be an integer > 0, got 0"),
    (["--shapes", "-1"], "--shapes must be >= 0"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, args, message):
    with pytest.raises(SystemExit) as err:
        cpu_gemm.main(args)
    assert err.value.code == 2
    assert message in capsys.readouterr().err


def test_refuses_where_onednn_cannot_serve(capsys, monkeypatch):
    monkeypatch.setattr(og, "_unavailable", lambda: "no oneDNN in this build")
    with pytest.raises(SystemExit) as err:
        cpu_gemm.main(["--widths", "256"])
    assert err.value.code == 2
    assert "oneDNN cannot serve the GEMMs here: no oneDNN in this build" in capsys.readouterr().err
