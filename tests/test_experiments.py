"""python -m hiertail_fast.experiments: every experiment end to end on a small synthetic graph,
resume from the per-run cache, reduced-budget labelling, summaries never clobbered."""
from __future__ import annotations

import json

import pytest

from hiertail_fast.experiments import EXPERIMENTS, runner
from hiertail_fast.experiments.cli import main
from hiertail_fast.experiments.runner import Budget

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--synthetic", "--synthetic-nodes", "120", "--seeds", "1", "--epochs", "3",
        "--hidden", "8", "--no-progress", "--device", "cpu"]
EXTRA = {
    "sensitivity": ["--gammas", "0.01", "--taus", "0.1,1.0", "--activations", "relu,elu",
                    "--hiddens", "8", "--dropouts", "0.0"],
    "semi-synthetic": ["--synthetic-nodes", "300", "--synthetic-classes", "8",
                       "--val-per-class", "1", "--test-per-class", "2",
                       "--methods", "hiertail_paper,origin"],
    "main": ["--methods", "hiertail_paper,hiertail_official,origin,graphsmote_t"],
}
FIGURES = {"sensitivity": ["synthetic-gamma-tau", "synthetic-appendix"],
           "per-class": ["synthetic"]}


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_every_experiment_runs_end_to_end(tmp_path, name, capsys):
    out = tmp_path / name
    res = main([name, *TINY, *EXTRA.get(name, []), "--out", str(out)])
    stem = name if name == "datasets" else f"{name}-s1-e3-p1000"
    md = (out / f"{stem}.md").read_text()
    saved = json.loads((out / f"{stem}.json").read_text())
    assert md.startswith(f"# {res['title']}") and "synthetic" in md
    prov = saved["provenance"]
    for key in ("command", "git_commit", "machine", "torch", "seeds", "epochs", "wall_time_s"):
        assert key in prov
    assert prov["command"].startswith(f"python -m hiertail_fast.experiments {name} ")
    for fig in FIGURES.get(name, []):
        assert (out / f"{stem}-{fig}.png").stat().st_size > 1000
    if name != "datasets":
        assert "REDUCED BUDGET" in md and saved["provenance"]["full_protocol"] is False
        assert saved.get("rows") or saved.get("datasets")


def test_main_picks_up_every_registered_baseline(tmp_path, monkeypatch):
    from hiertail_fast.baselines import METHODS
    from hiertail_fast.experiments import main_table

    rows = main_table.row_labels()
    assert list(rows)[:2] == ["hiertail_paper", "hiertail_official"]
    assert list(rows)[2:] == list(METHODS)
    monkeypatch.setitem(METHODS, "brand_new", METHODS["origin"])   # a method landing later
    assert "brand_new" in main_table.row_labels()


def _count_trainings(monkeypatch) -> list:
    calls = []
    real = runner._train

    def counting(spec, *args, **kwargs):
        calls.append((spec.row, args[3]))
        return real(spec, *args, **kwargs)
    monkeypatch.setattr(runner, "_train", counting)
    return calls


def test_resume_trains_only_what_is_missing_and_gives_the_same_numbers(tmp_path, monkeypatch):
    argv = ["main", *TINY, "--seeds", "2", "--methods", "origin", "--out", str(tmp_path)]
    calls = _count_trainings(monkeypatch)
    first = main(argv)
    assert len(calls) == 2
    assert len(list((tmp_path / "runs" / "synthetic").glob("origin-*.json"))) == 2
    # an interrupted command: the second run is lost
    next((tmp_path / "runs" / "synthetic").glob("origin-*-s124.json")).unlink()
    second = main(argv)
    assert len(calls) == 3 and calls[-1][1] == 124
    # seeded: the same numbers (the wall times differ)
    assert [r["metrics"] for r in second["rows"]] == [r["metrics"] for r in first["rows"]]
    main(argv)
    assert len(calls) == 3                   # everything cached


def test_budget_header_and_tag():
    full = Budget()
    assert full.is_full and full.tag() == "" and "full protocol" in full.header()
    quick = Budget((123, 124, 125), 300, 100)
    assert not quick.is_full and quick.tag() == "-s3-e300-p100"
    assert quick.header().startswith("**REDUCED BUDGET: 3 seeds")
    assert not Budget(epochs=9_999).is_full and "REDUCED" in Budget(epochs=9_999).header()
    with pytest.raises(ValueError, match="distinct"):
        Budget((1, 1))
    with pytest.raises(ValueError, match="epochs"):
        Budget(epochs=0)


def test_quick_flag_sets_the_reduced_budget(tmp_path):
    from hiertail_fast.experiments.cli import budget_from_args, build_parser

    args = build_parser().parse_args(["main", "--quick"])
    b = budget_from_args(args)
    assert (len(b.seeds), b.epochs, b.patience) == (3, 300, 100)
    args = build_parser().parse_args(["main", "--quick", "--epochs", "50"])
    assert budget_from_args(args).epochs == 50
    assert budget_from_args(build_parser().parse_args(["main"])).is_full


def test_a_summary_from_other_arguments_is_kept(tmp_path, capsys):
    base = ["main", *TINY, "--out", str(tmp_path)]
    main([*base, "--methods", "origin"])
    kept = (tmp_path / "main-s1-e3-p1000.md").read_text()
    main([*base, "--methods", "reweight"])
    assert (tmp_path / "main-s1-e3-p1000.md").read_text() == kept
    others = [p for p in tmp_path.glob("main-s1-e3-p1000-*.md")]
    assert len(others) == 1 and "Re-weight" in others[0].read_text()
    assert "comes from other arguments; kept" in capsys.readouterr().err


@pytest.mark.parametrize("bad, message", [
    (["--datasets", "cora_full"], "not in"),
    (["--methods", "nope"], "unknown nope"),
    (["--device", "tpu"], "not a device"),
])
def test_bad_arguments_exit_with_a_message(tmp_path, capsys, bad, message):
    argv = ["main", "--seeds", "1", "--epochs", "2", "--out", str(tmp_path), *bad]
    if "--datasets" not in bad:
        argv.append("--synthetic")
    else:       # an existing (empty) data folder: the name check, not a missing folder, speaks
        (tmp_path / "data").mkdir()
        argv += ["--data-dir", str(tmp_path / "data")]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_report_only_trains_nothing_and_names_what_is_missing(tmp_path, monkeypatch):
    base = ["main", *TINY, "--out", str(tmp_path)]
    main([*base, "--methods", "origin"])
    calls = _count_trainings(monkeypatch)
    res = main([*base, "--methods", "origin,reweight", "--report-only"])
    assert calls == []
    assert [r["row"] for r in res["rows"]] == ["origin"]
    assert any("synthetic / reweight: no finished run yet" in n for n in res["notes"])
