"""bench/next_defaults.py: the automatic loss choice derived from a GPU run's tables."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import next_defaults  # noqa: E402

from hiertail_fast.ops import _dispatch  # noqa: E402

H200 = (Path(__file__).resolve().parent.parent / "docs" / "results" / "gpu_h200_2026-11-27"
        / "loss_profile_s15_call2.json")


def _derived(*paths):
    cells, picked = next_defaults.load(list(paths))
    return next_defaults.report(cells, picked)


def test_the_shipped_thresholds_follow_the_h200_tables():
    # the constants of refine_loss_backend, derived again from the table they cite
    text, got = _derived(H200)
    assert got["TRITON_MAX_DIM"] == _dispatch.TRITON_MAX_DIM
    assert got["TRITON_MIN_ROWS['exact']"] == _dispatch.TRITON_MIN_ROWS["exact"]
    assert got["ATTENTION_OFFICIAL_MIN_ROWS"] == _dispatch.ATTENTION_OFFICIAL_MIN_ROWS
    assert got["TRITON_MIN_ROWS_BF16['official']"] == _dispatch.TRITON_MIN_ROWS_BF16["official"]
    # official fp32: torch at 20k, attention at 50k, Triton from 100k (measured); the shipped
    # 75k sits between the last N it loses and the first it wins
    assert got["TRITON_MIN_ROWS['official']"] == 100_000
    assert 50_000 < _dispatch.TRITON_MIN_ROWS["official"] <= 100_000
    assert "| fp32 | exact | 1 | 64 | 100,000 | triton | 121.0 |" in text
    # bf16 official: the attention kernels are barred (imprecise), whatever their time
    assert "| bf16 | official | 1 | 64 | 100,000 | torch |" in text


def _rows(cells):
    """loss_profile JSON rows of {(dtype, variant, levels, d, n): {engine: seconds}}; an
    "auto" row names the engine it picked ("torch")."""
    return [{"n": n, "d": d, "variant": v, "levels": lv, "dtype": dt, "what": e,
             "median_s": t, "reps": 3, **({"engine": "torch"} if e == "auto" else {})}
            for (dt, v, lv, d, n), times in cells.items() for e, t in times.items()]


def test_switch_verdicts(tmp_path):
    cells = {}
    for n in (20_000, 100_000):
        for levels in (1, 3):
            cells["fp32", "exact", levels, 64, n] = {
                "torch": 2.0, "triton": 1.0, "triton[lean]": 0.8,
                # shared keys help several levels only; at one level they are not timed
                **({"triton[shared]": 0.9} if levels > 1 else {})}
        # official several levels: the shared-keys mode does not apply (the relative mode
        # runs), so a [shared] cell there, however timed, gives no verdict
        cells["fp32", "official", 3, 64, n] = {"triton": 1.0, "triton[shared]": 1.5}
        cells["fp32", "official", 1, 64, n] = {
            "torch": 1.0, "triton": 0.9 if n > 50_000 else 1.5,
            "torch+triton": 0.5 if n > 50_000 else 1.2}
        cells["fp32", "exact", 1, 128, n] = {"attention": 1.0, "triton": 1.3}
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"rows": _rows(cells)}))
    _, got = _derived(path)
    assert got["triton[lean]"] == "make it the default"
    assert got["triton[shared]"] == "make it the default"    # 2 of 2 exact cells, levels 3
    assert got["torch+triton"] == "mixed: keep it off, or choose by size"
    assert got["attention+triton"] == "not measured"
    assert got["TRITON_MAX_DIM"] == 64                        # d 128: attention wins
    assert got["TRITON_MIN_ROWS['exact']"] == 20_000
    # official: torch+triton (not a Triton engine) wins at 100k
    assert got["TRITON_MIN_ROWS['official']"] is None


@pytest.mark.parametrize("cudnn, want", [
    (0.8, "run the bf16 branch on cuDNN (_attention_lse.bf16_kernel's default)"),
    (1.2, "keep flash"),
])
def test_the_cudnn_verdict(tmp_path, cudnn, want):
    """attention[cudnn] is judged against the attention engine (flash) on the exact bf16
    cells, and is never named the fastest engine: the automatic choice names engines, and
    this is a switch of one (its cells' fastest stays "attention" or another engine)."""
    cells = {}
    for n in (20_000, 100_000):
        for levels in (1, 3):
            cells["bf16", "exact", levels, 64, n] = {"attention": 1.0, "torch": 3.0,
                                                     "attention[cudnn]": cudnn}
        # an fp32 cell with a (meaningless) cudnn row: not part of the verdict
        cells["fp32", "exact", 1, 64, n] = {"attention": 1.0, "attention[cudnn]": 5.0}
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"rows": _rows(cells)}))
    text, got = _derived(path)
    assert got["attention[cudnn]"] == want
    assert "| `attention[cudnn]` | `attention` | " + ("4 of 4" if cudnn < 1 else "0 of 4") in text
    assert "| bf16 | exact | 1 | 64 | 20,000 | attention | 1000.0 |" in text


@pytest.mark.parametrize("nosplit_20k, want", [
    (1.3, "keep the key splits"),
    (0.8, "turn the key splits off (HIERTAIL_TRITON_KEY_SPLITS' default to 1)"),
])
def test_the_key_splits_verdict(tmp_path, nosplit_20k, want):
    """triton[nosplit] is the inverse switch, judged only where the triton row split its keys
    (key_splits > 1 in its row): at 100k it ran the same launches, and a faster 100k cell
    there says nothing."""
    cells = {}
    for levels in (1, 3):
        cells["fp32", "exact", levels, 64, 20_000] = {"triton": 1.0,
                                                      "triton[nosplit]": nosplit_20k}
        cells["fp32", "exact", levels, 64, 100_000] = {"triton": 1.0, "triton[nosplit]": 0.5}

    def write():
        rows = _rows(cells)
        for r in rows:
            if r["what"] == "triton":
                r["key_splits"] = 4 if r["n"] == 20_000 else 1
        path.write_text(json.dumps({"rows": rows}))

    path = tmp_path / "p.json"
    write()
    cells_read, picked = next_defaults.load([path])
    splits = next_defaults.split_counts([path])
    assert splits["fp32", "exact", 1, 64, 20_000] == 4
    text, got = next_defaults.report(cells_read, picked, splits=splits)
    assert got["triton[nosplit]"] == want
    assert f"| `triton[nosplit]` | `triton` | {2 if nosplit_20k < 1 else 0} of 2 |" in text
    cells["fp32", "exact", 3, 64, 20_000]["triton[nosplit]"] = 2.0 - nosplit_20k
    write()
    got = next_defaults.report(*next_defaults.load([path]),
                               splits=next_defaults.split_counts([path]))[1]
    assert got["triton[nosplit]"] == "mixed: revisit KEY_SPLIT_MIN_FILL"
    # without recorded splits (files before 2026-12-05) nothing is judged
    assert next_defaults.report(*next_defaults.load([path]))[1]["triton[nosplit]"] == (
        "not measured")


@pytest.mark.parametrize("warps4, want", [
    (1.2, "keep 8 warps"),
    (0.9, "go back to 4 warps (kernels/_utils.TABLE_WARPS = 4)"),
])
def test_the_warps_verdict(tmp_path, warps4, want):
    """triton[warps4] is the 8-warp table's inverse switch, judged only in the cells whose
    triton row took the table's tile (warps_decide in its row): elsewhere (here d 256) it ran
    the same launches, and a faster cell there says nothing."""
    cells = {}
    for dt in ("fp32", "bf16"):
        cells[dt, "exact", 1, 64, 20_000] = {"triton": 1.0, "triton[warps4]": warps4}
        cells[dt, "exact", 1, 256, 20_000] = {"triton": 1.0, "triton[warps4]": 0.5}
    rows = _rows(cells)
    for r in rows:
        if r["what"] == "triton":
            r["warps_decide"] = r["d"] <= 128
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"rows": rows}))
    table = next_defaults.table_cells([path])
    assert table == {("fp32", "exact", 1, 64, 20_000), ("bf16", "exact", 1, 64, 20_000)}
    text, got = next_defaults.report(*next_defaults.load([path]), table=table)
    assert got["triton[warps4]"] == want
    assert f"| `triton[warps4]` | `triton` | {2 if warps4 < 1 else 0} of 2 |" in text
    cells["bf16", "exact", 1, 64, 20_000]["triton[warps4]"] = 2.0 - warps4
    path.write_text(json.dumps({"rows": [
        dict(r, warps_decide=r["d"] <= 128) if r["what"] == "triton" else r
        for r in _rows(cells)]}))
    got = next_defaults.report(*next_defaults.load([path]),
                               table=next_defaults.table_cells([path]))[1]
    assert got["triton[warps4]"] == "mixed: choose the table's warps by dtype / size"
    # without the recorded field (files before 2026-12-05) nothing is judged
    assert next_defaults.report(*next_defaults.load([path]))[1]["triton[warps4]"] == (
        "not measured")


def test_an_auto_row_times_the_engine_it_picked(tmp_path):
    # the prepared GPU run times only "auto" and the Triton modes: at d 128 the automatic
    # choice runs torch; its time must count as torch's, or Triton, alone in the cell, "wins"
    # at 4x the time (an audit of bench/gpu_next.sh)
    cells = {("fp32", "exact", 1, 128, n): {"auto": 1.0, "triton": 4.0, "triton[lean]": 4.2}
             for n in (20_000, 100_000)}
    cells["fp32", "exact", 1, 64, 100_000] = {"auto": 1.0, "triton": 0.5}
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"rows": _rows(cells)}))
    text, got = _derived(path)
    assert got["TRITON_MAX_DIM"] == 64                 # d 128: torch (through auto) wins
    assert "| fp32 | exact | 1 | 128 | 100,000 | torch | 1000.0 |" in text
    # a file's own torch row is kept over its auto row, and a later file's auto row replaces
    # an earlier file's torch row for that cell (the newer code's time)
    cells2 = {("fp32", "exact", 1, 128, 100_000): {"auto": 3.0, "torch": 2.0, "triton": 4.0}}
    path2 = tmp_path / "p2.json"
    path2.write_text(json.dumps({"rows": _rows(cells2)}))
    loaded, _ = next_defaults.load([path2])
    assert loaded["fp32", "exact", 1, 128, 100_000]["torch"] == 2.0
    loaded, _ = next_defaults.load([path2, path])
    assert loaded["fp32", "exact", 1, 128, 100_000]["torch"] == 1.0


def test_cli_writes_markdown_and_rejects_other_json(tmp_path, capsys):
    out = tmp_path / "r.md"
    assert next_defaults.main([str(H200), "--md", str(out)]) == 0
    assert out.read_text() == capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not": "rows"}))
    assert next_defaults.main([str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("next_defaults.py: ") and "\n" not in err



def test_md_never_replaces_an_input_and_is_checked_before_reading(tmp_path, capsys):
    """``--md`` naming one of the profiles would have replaced the measured JSON by its report;
    it exits 2 and leaves the file as it was. A folder as --md is refused the same way."""
    profile = tmp_path / "p.json"
    profile.write_bytes(H200.read_bytes())
    with pytest.raises(SystemExit) as exc:
        next_defaults.main([str(profile), "--md", str(profile)])
    assert exc.value.code == 2
    assert "is the input" in capsys.readouterr().err
    assert profile.read_bytes() == H200.read_bytes()
    with pytest.raises(SystemExit) as exc:
        next_defaults.main([str(profile), "--md", str(tmp_path)])
    assert exc.value.code == 2 and "is a directory" in capsys.readouterr().err


@pytest.mark.parametrize("mutate", [
    lambda rows: rows.__setitem__(5, None),
    lambda rows: rows[5].__setitem__("what", None),
    lambda rows: rows[5].__setitem__("variant", 5),
])
def test_a_malformed_row_is_one_line_and_exit_2(mutate, tmp_path, capsys):
    """The docstring's promise for a file that is not loss_profile JSON: a null row, or a
    row whose what / variant is no string, were tracebacks (an audit of the tools)."""
    data = json.loads(H200.read_text())
    mutate(data["rows"])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert next_defaults.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert f"next_defaults.py: {path} is not loss_profile.py JSON" in err


def test_files_without_loss_rows_exit_2_in_one_line(tmp_path, capsys):
    """loss_profile JSON that holds no loss rows (only profiled or untimed rows) is one line on
    stderr and exit 2, not an empty report."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"rows": [
        {"n": 100, "d": 8, "variant": "exact", "levels": 1, "dtype": "fp32", "what": "torch",
         "median_s": None}]}))
    out = tmp_path / "r.md"
    assert next_defaults.main([str(path), "--md", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == "next_defaults.py: no loss rows in these files"
    assert captured.out == "" and not out.exists()


def test_a_later_files_triton_row_decides_its_splits_and_tile(tmp_path):
    """split_counts / table_cells: as for the times, a later file's "triton" row replaces an
    earlier file's for the same cell, so a cell re-measured without key splits (or off the
    table's tile) is no longer judged for triton[nosplit] (triton[warps4])."""
    key = ("fp32", "exact", 1, 64, 20_000)
    paths = []
    for i, (splits, decide) in enumerate(((4, True), (1, False))):
        rows = _rows({key: {"triton": 1.0, "triton[nosplit]": 0.5, "triton[warps4]": 0.5}})
        for r in rows:
            if r["what"] == "triton":
                r.update(key_splits=splits, warps_decide=decide)
        paths.append(tmp_path / f"p{i}.json")
        paths[-1].write_text(json.dumps({"rows": rows}))
    assert next_defaults.split_counts(paths) == {key: 1}
    assert next_defaults.table_cells(paths) == set()
    got = next_defaults.report(*next_defaults.load(paths), splits=next_defaults.split_counts(
        paths), table=next_defaults.table_cells(paths))[1]
    assert got["triton[nosplit]"] == got["triton[warps4]"] == "not measured"
    assert next_defaults.split_counts(paths[::-1]) == {key: 4}
    assert next_defaults.table_cells(paths[::-1]) == {key}
