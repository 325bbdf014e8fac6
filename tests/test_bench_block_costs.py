"""bench/block_costs.py (one engine block's pieces, timed round-robin): runs end to end on a
small case, records every piece with consistent statistics, and rejects bad arguments."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests._preloaded_cli import run_script
from tests.conftest import FakeClock, load_bench

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "block_costs.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return run_script(SCRIPT, args, timeout=300)


def test_every_piece_is_timed(tmp_path):
    out = tmp_path / "bc.json"
    res = _run("--sizes", "300", "--dims", "8", "--rounds", "2", "--reps", "2", "--tile", "128",
               "--out", str(out))
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    pieces = {r["piece"] for r in data["rows"]}
    assert {"logits GEMM", "logits GEMM, 128-column tiles", "query-side GEMM", "key-side GEMM",
            "exact loss / block", "attention loss / block", "3-GEMM floor / block",
            "symmetric floor / block"} <= pieces
    for r in data["rows"]:
        assert 0 < r["best_ms"] <= r["median_ms"] and (r["n"], r["d"]) == (300, 8)
        if r["piece"].startswith(("logits", "query-side", "key-side")):  # 2 B rows d flop
            flop = 2 * 256 * (300 + 40) * 8
            assert abs(r["gflops_best"] - flop / (r["best_ms"] * 1e6)) < 1e-6 * r["gflops_best"]
        else:
            assert r["gflops_median"] is None
    assert data["meta"]["rounds"] == 2 and data["meta"]["load_before"] is not None
    assert out.with_suffix(".md").read_text() in res.stdout


def test_bad_arguments(tmp_path):
    res = _run("--sizes", "100", "--out", str(tmp_path / "x.json"))
    assert res.returncode == 2 and "--sizes must be >= 256" in res.stderr
    assert not (tmp_path / "x.json").exists()


def test_symmetric_scheme_matches_the_engine():
    """The symmetric scheme timed as a candidate (upper-triangle blocks, row and column
    statistics) computes the engine's log-sum-exp and gradient: ragged last block, float64."""
    import importlib.util

    import torch

    from hiertail_fast.ops import _lse_torch

    spec = importlib.util.spec_from_file_location("bench_block_costs", SCRIPT)
    bc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bc)
    gen = torch.Generator().manual_seed(0)
    n, d, scale = 3 * bc.BLOCK + 37, 12, 4.0
    z = torch.randn(n, d, generator=gen, dtype=torch.float64)
    w = torch.rand(n, generator=gen, dtype=torch.float64) + 0.1
    g = torch.randn(n, generator=gen, dtype=torch.float64)
    lse, dz = bc.symmetric_lse_grad(z, w, scale, g, cutoff=200.0)
    ref_lse, _, _, ref_dz = _lse_torch.lse_fused(z, w.log()[None], scale, False,
                                                 lambda rows, lse_b, max_b: g[None, rows])
    torch.testing.assert_close(lse, ref_lse[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dz, ref_dz, rtol=1e-10, atol=1e-10 * ref_dz.abs().max().item())


def _block_costs():
    return load_bench("bench_block_costs", "block_costs.py")


def _piece(clock: FakeClock, durations):
    """A fake piece: each call takes the next of its given durations (seconds) on `clock`, and
    a piece called more often than given fails."""
    todo = iter(durations)

    def call():
        clock.spend(next(todo))
    return call


def test_measure_reports_per_block_medians_and_bests_in_ms(monkeypatch):
    """A piece's row: per round the median of its calls, each divided by the blocks it covers;
    then the median and the best round, in milliseconds, and GFLOP/s from each."""
    bc = _block_costs()
    clock = FakeClock()
    ms = 1e-3
    gemm = [0.5 * ms] + [t * ms for t in (1, 2, 2, 9, 3, 3, 3, 30, 10, 10, 10, 10)]
    loss = [t * ms for t in (5, 8, 12, 40)]             # 4 blocks a call: 2, 3, 10 ms a block
    monkeypatch.setattr(bc, "time", clock)
    monkeypatch.setattr(bc, "_pieces", lambda n, d, tile: {
        "gemm": (_piece(clock, gemm), 0.006, 1), "loss": (_piece(clock, loss), None, 4)})
    rows = bc.measure(300, 8, rounds=3, reps=4, tile=128)
    assert [r["piece"] for r in rows] == ["gemm", "loss"]
    assert rows[0] == dict(n=300, d=8, piece="gemm", median_ms=pytest.approx(3.0),
                           best_ms=pytest.approx(2.0), gflops_median=pytest.approx(2.0),
                           gflops_best=pytest.approx(3.0))
    assert rows[1] == dict(n=300, d=8, piece="loss", median_ms=pytest.approx(3.0),
                           best_ms=pytest.approx(2.0), gflops_median=None, gflops_best=None)


class _MatmulWork(TorchDispatchMode):
    """Counts the multiply-adds of the matrix products run under it (mm, addmm, addmm_)."""

    def __init__(self):
        super().__init__()
        self.madds = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "addmm_"):
            a, b = args[:2] if name == "mm" else args[1:3]
            self.madds += a.shape[0] * a.shape[1] * b.shape[1]
        return func(*args, **(kwargs or {}))


def test_pieces_do_the_work_their_labels_and_flop_counts_say(monkeypatch):
    """Each GEMM piece does 2 B rows d flop (its GFLOP figure), the whole-loss and floor pieces
    count ceil(rows / B) blocks (nodes and prototypes), the loss pieces are the exact loss on the
    torch engine and on the attention kernel, and each floor runs its own scheme."""
    bc = _block_costs()
    n, d, tile = 300, 8, 128
    rows = n + 40                                             # nodes and prototypes
    seen = []
    monkeypatch.setattr(bc, "loss_step", lambda backend, z, ys, ps, tau, variant: (
        backend, z.shape[0], variant))
    monkeypatch.setattr(bc, "three_gemm_floor", lambda z, buf: seen.append("three"))
    monkeypatch.setattr(bc, "symmetric_floor", lambda z, buf: seen.append("symmetric"))
    pieces = bc._pieces(n, d, tile)
    gemms = ["logits GEMM", f"logits GEMM, {tile}-column tiles", "query-side GEMM",
             "key-side GEMM"]
    for name in gemms:
        f, gflop, per = pieces[name]
        with _MatmulWork() as work:
            f()
        assert (work.madds, per) == (bc.BLOCK * rows * d, 1), name
        assert gflop == pytest.approx(2 * work.madds / 1e9), name
    assert pieces["exact loss / block"][::2] == (("torch", n, "exact"), 2)
    assert pieces["attention loss / block"][::2] == (("attention", n, "exact"), 2)
    pieces["3-GEMM floor / block"][0]()
    pieces["symmetric floor / block"][0]()
    assert seen == ["three", "symmetric"]
    assert pieces["3-GEMM floor / block"][2] == pieces["symmetric floor / block"][2] == 2


def test_the_floors_do_their_schemes_gemms():
    """three_gemm_floor: 3 N^2 d multiply-adds (logits, query side, key side of every block);
    symmetric_floor: the upper-triangle blocks (B rows against the keys from B's first row on)
    twice for the logits and once for each gradient product."""
    bc = _block_costs()
    n, d = 2 * bc.BLOCK + 37, 4
    z = torch.randn(n, d, generator=torch.Generator().manual_seed(0))
    buf = torch.empty(bc.BLOCK, n)
    with _MatmulWork() as three:
        bc.three_gemm_floor(z, buf)
    with _MatmulWork() as symmetric:
        bc.symmetric_floor(z, buf)
    upper = sum(min(bc.BLOCK, n - r0) * (n - r0) * d for r0 in range(0, n, bc.BLOCK))
    assert three.madds == 3 * n * n * d
    assert symmetric.madds == 4 * upper < three.madds


def test_render_puts_each_figure_in_its_column():
    bc = _block_costs()
    meta = dict(device="cpu-x", torch="2.x", threads=2, load_before=[1.5], load_after=[2.5],
                rounds=3)
    rows = [dict(n=300, d=8, piece="logits GEMM", median_ms=3.0, best_ms=2.0,
                 gflops_median=40.0, gflops_best=60.0),
            dict(n=300, d=8, piece="exact loss / block", median_ms=1.25, best_ms=1.0,
                 gflops_median=None, gflops_best=None)]
    text = bc.render(meta, rows)
    assert text.startswith("Block costs on cpu-x, torch 2.x, 2 threads, B = 256 rows, load "
                           "average [1.5] -> [2.5], medians (best) of 3 rounds\n")
    assert "| 300 | 8 | logits GEMM | 3.000 (2.000) | 40 (60) |\n" in text
    assert "| 300 | 8 | exact loss / block | 1.250 (1.000) | – |\n" in text


def _fake_measure(seen):
    def measure(n, d, rounds, reps, tile):
        seen.append((n, d, rounds, reps, tile))
        return [dict(n=n, d=d, piece="p", median_ms=1.0, best_ms=0.5, gflops_median=None,
                     gflops_best=None)]
    return measure


def test_main_measures_with_its_options_records_them_and_keeps_the_previous(
        tmp_path, monkeypatch, capsys):
    """Every size x dim is measured with --rounds, --reps and --tile as given, the JSON's meta
    records them (and the argv passed in), and a second run keeps the first's files as
    .prev."""
    bc = _block_costs()
    seen = []
    monkeypatch.setattr(bc, "measure", _fake_measure(seen))
    out = tmp_path / "bc.json"
    first = ["--sizes", "300", "400", "--dims", "8", "--rounds", "3", "--reps", "5", "--tile",
             "64", "--out", str(out)]
    assert bc.main(first) == 0
    assert seen == [(300, 8, 3, 5, 64), (400, 8, 3, 5, 64)]
    meta = json.loads(out.read_text())["meta"]
    assert (meta["rounds"], meta["reps"], meta["tile"], meta["argv"]) == (3, 5, 64, first)
    first_md = out.with_suffix(".md").read_text()
    second = first[:5] + ["--rounds", "2"] + first[7:]
    assert bc.main(second) == 0
    assert "the previous bc.json is kept as" in capsys.readouterr().out
    assert json.loads((tmp_path / "bc.prev.json").read_text())["meta"]["argv"] == first
    assert (tmp_path / "bc.prev.md").read_text() == first_md
    assert json.loads(out.read_text())["meta"]["rounds"] == 2


@pytest.mark.parametrize("args", [["--sizes", "300", "100"], ["--dims", "0"], ["--rounds", "0"],
                                  ["--reps", "0"], ["--tile", "0"]])
def test_bad_values_are_refused_before_any_measurement(args, tmp_path, monkeypatch, capsys):
    bc = _block_costs()
    seen = []
    monkeypatch.setattr(bc, "measure", _fake_measure(seen))
    with pytest.raises(SystemExit) as exit_:
        bc.main(args + ["--out", str(tmp_path / "x.json")])
    assert exit_.value.code == 2 and seen == [] and not (tmp_path / "x.json").exists()
    assert ("--sizes must be >= 256; --dims, --rounds, --reps, --tile positive"
            in capsys.readouterr().err)


@pytest.mark.parametrize("blocked", ["bc.json", "bc.md"])
def test_unwritable_outputs_are_refused_before_any_measurement(blocked, tmp_path, monkeypatch,
                                                               capsys):
    """--out and the markdown beside it are checked before the run, not found unwritable
    after it."""
    bc = _block_costs()
    seen = []
    monkeypatch.setattr(bc, "measure", _fake_measure(seen))
    (tmp_path / blocked).mkdir()
    with pytest.raises(SystemExit) as exit_:
        bc.main(["--sizes", "300", "--out", str(tmp_path / "bc.json")])
    assert exit_.value.code == 2 and seen == []
    assert f"--out {tmp_path / 'bc.json'} cannot be written: " in capsys.readouterr().err
