"""python -m hiertail_fast.experiments: every experiment end to end on a small synthetic graph,
resume from the per-run cache, reduced-budget labelling, summaries never clobbered."""
from __future__ import annotations

import json
import re

import pytest

from hiertail_fast.experiments import EXPERIMENTS, runner
from hiertail_fast.experiments.cli import main
from hiertail_fast.experiments.runner import Budget
from tests.conftest import ctrl_c_line

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--synthetic", "--synthetic-nodes", "120", "--seeds", "1", "--epochs", "3",
        "--hidden", "8", "--no-progress", "--device", "cpu"]
TINY_DATA = ["--synthetic", "--synthetic-nodes", "120", "--no-progress"]
# (TINY[3:]: TINY on the datasets, without --synthetic and its --synthetic-nodes, which real
# data refuses)
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
    tiny = TINY_DATA if name == "datasets" else TINY      # (it refuses training options)
    res = main([name, *tiny, *EXTRA.get(name, []), "--out", str(out)])
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


@pytest.mark.parametrize("name, extra, msg", [
    ("ablation", ["--methods", "origin"], "--methods does not apply to ablation (it applies "
     "to main, semi-synthetic)"),
    ("main", ["--config", "official"], "--config does not apply to main"),
    ("main", ["--task-counts", "4:2"], "--task-counts does not apply to main"),
    ("per-class", ["--alpha", "0.5"], "--alpha does not apply to per-class"),
    ("tasks", ["--gammas", "0.1"], "--gammas does not apply to tasks"),
    ("datasets", ["--lr", "5"], "--lr does not apply to datasets: it trains nothing"),
    ("datasets", ["--methods", "foo"], "--methods does not apply to datasets"),
    ("datasets", ["--device", "cuda"], "--device does not apply to datasets: it trains "),
    ("datasets", ["--device", "cpu"], "--device does not apply to datasets"),
    ("datasets", ["--feature-norm", "row"], "--feature-norm does not apply to datasets"),
    ("datasets", ["--threads", "1"], "--threads does not apply to datasets"),
])
def test_options_of_other_experiments_are_refused(tmp_path, capsys, name, extra, msg):
    # they were silently ignored (a CLI audit): `ablation --methods origin` trained every
    # ablation row, `datasets --methods foo --lr 5` exited 0
    with pytest.raises(SystemExit) as exc:
        main([name, *(TINY_DATA if name == "datasets" else TINY), *extra,
              "--out", str(tmp_path)])
    assert exc.value.code == 2 and msg in capsys.readouterr().err
    assert not any(tmp_path.iterdir())                  # refused before anything ran


@pytest.mark.parametrize("base, msg", [("-1", "--seed-base must lie in [0, "),
                                       (str(2**64 - 2), "is out of range [0, "
                                        "18446744073709551615]"),
                                       ("1.5", "--seed-base: '1.5' is not an integer"),
                                       (str(2**64), f"'{2**64}' is too large (at most "
                                        f"{2**64 - 1})")])
def test_seed_base_checked_before_training(tmp_path, monkeypatch, capsys, base, msg):
    # the default seed counts (10, or --quick's 3) from an unchecked --seed-base: a traceback,
    # or runs trained and cached up to the first seed beyond 2**64 - 1 (a CLI audit). A run
    # fails the test at once: with the check gone, the full protocol trained for minutes
    # (an s42 audit's mutant hung here)
    monkeypatch.setattr(runner, "_train", lambda *a, **k: pytest.fail("a run was trained"))
    for budget in ([], ["--quick"]):
        with pytest.raises(SystemExit) as exc:
            main(["main", "--synthetic", "--no-progress", "--seed-base", base, *budget,
                  "--out", str(tmp_path)])
        assert exc.value.code == 2 and msg in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_provenance_names_the_code_of_cached_runs(tmp_path):
    # cached runs are reused across code changes; the summary credited them to this command's
    # commit alone (a CLI audit): it now lists the runs' own commits when any differs
    out = tmp_path / "pc"
    first = main(["per-class", *TINY, "--out", str(out)])
    assert first["provenance"]["runs_code"] == [
        {"git_commit": first["provenance"]["git_commit"],
         "git_dirty": first["provenance"]["git_dirty"], "package_version": None, "runs": 2}]
    run = sorted((out / "runs").rglob("*.json"))[0]
    record = json.loads(run.read_text())
    record["git_commit"], record["git_dirty"] = "0" * 40, False
    run.write_text(json.dumps(record))
    again = main(["per-class", *TINY, "--out", str(out)])
    assert {"git_commit": "0" * 40, "git_dirty": False, "package_version": None, "runs": 1} in (
        again["provenance"]["runs_code"])
    md = (out / "per-class-s1-e3-p1000.md").read_text()
    assert "1 of 2 runs were trained at another code version than this command's" in md
    assert f"`{'0' * 40}` 1" in md


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


def test_the_module_entry_sets_the_wait_policy_then_runs_the_command(monkeypatch):
    """`python -m hiertail_fast.experiments`'s main asks for the passive OpenMP wait policy
    before the command (and torch) runs, passes its argv on, and returns exit status 0."""
    from hiertail_fast.experiments import __main__ as entry
    from hiertail_fast.experiments import cli

    calls = []
    monkeypatch.setattr(entry, "prefer_passive_wait", lambda: calls.append("wait"))
    monkeypatch.setattr(cli, "main", lambda argv: calls.append(("run", argv)))
    assert entry.main(["datasets", "--no-progress"]) == 0
    assert calls == ["wait", ("run", ["datasets", "--no-progress"])]


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


def test_patience_option_replaces_the_budgets():
    """--patience overrides the budget's early-stopping patience, full or --quick."""
    from hiertail_fast.experiments.cli import budget_from_args, build_parser

    for extra in ([], ["--quick"]):
        args = build_parser().parse_args(["main", *extra, "--patience", "7"])
        assert budget_from_args(args).patience == 7


def test_seeds_replace_the_default_count_before_it_is_checked():
    # `--seed-base 2**64-6 --seeds 1` was refused for the default ten seeds' last one, which
    # --seeds replaces (an experiments audit, session 67); the ten are still checked alone
    from hiertail_fast.experiments.cli import budget_from_args, build_parser

    base = str(2**64 - 6)
    for extra in ([], ["--quick"]):
        args = build_parser().parse_args(["main", "--seed-base", base, "--seeds", "1", *extra])
        assert budget_from_args(args).seeds == (2**64 - 6,)
    with pytest.raises(ValueError, match="out of range"):
        budget_from_args(build_parser().parse_args(["main", "--seed-base", base]))
    with pytest.raises(ValueError, match="out of range"):
        budget_from_args(build_parser().parse_args(["main", "--seed-base", base,
                                                    "--seeds", "7"]))


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


def test_report_only_shows_no_progress_bar(tmp_path, capsys):
    """--report-only trains nothing: no bar of runs, even without --no-progress."""
    argv = [a for a in TINY if a != "--no-progress"]
    main(["main", *argv, "--methods", "origin", "--report-only", "--out", str(tmp_path)])
    assert "runs:" not in capsys.readouterr().err


def _summary(out, stem="main-s1-e3-p1000"):
    return (out / f"{stem}.md").read_text(), json.loads((out / f"{stem}.json").read_text())


def test_report_only_over_an_empty_runs_dir_never_replaces_a_filled_summary(tmp_path, capsys):
    base = ["main", *TINY, "--methods", "origin", "--out", str(tmp_path / "V")]
    main(base)
    filled_md, filled = _summary(tmp_path / "V")
    assert filled["runs"] == 1 and "| Origin |" in filled_md
    capsys.readouterr()
    empty = [*base, "--runs-dir", str(tmp_path / "empty"), "--report-only"]
    with pytest.raises(SystemExit) as exc:
        main(empty)
    assert exc.value.code == 2
    said = capsys.readouterr()
    err = said.err
    assert "holds 1 finished run(s), this summary 0: not replaced" in err
    # the table refused is still shown ("the table above was not saved")
    assert "the table above was not saved" in err
    assert said.out.startswith("# Table 2: ") and "REDUCED BUDGET: 1 seed (123)" in said.out
    assert "synthetic / origin: no finished run yet (--report-only)" in said.out
    assert _summary(tmp_path / "V") == (filled_md, filled)          # untouched
    assert not list((tmp_path / "V").glob("*.prev.*"))
    # asked for: replaced, the filled one kept as the .prev generation
    main([*empty, "--replace-summary"])
    md, _ = _summary(tmp_path / "V")
    assert "| Origin |" not in md
    assert (tmp_path / "V" / "main-s1-e3-p1000.prev.md").read_text() == filled_md
    # the same arguments with as many runs replace their summary, the old one kept as .prev
    main(base)
    assert "| Origin |" in _summary(tmp_path / "V")[0]
    assert "| Origin |" not in (tmp_path / "V" / "main-s1-e3-p1000.prev.md").read_text()
    assert "previous summary is kept as main-s1-e3-p1000.prev.md" in capsys.readouterr().err


def _graph_pair(tmp_path):
    """Two data folders with an 'email' graph of the same shape: dA's features, dB's random."""
    import torch

    from hiertail_fast.data.io import GraphData
    from hiertail_fast.data.synthetic import make_synthetic_graph

    g = make_synthetic_graph(120, num_classes=6, avg_degree=6.0, num_features=16, seed=0)
    (tmp_path / "dA").mkdir()
    (tmp_path / "dB").mkdir()
    GraphData(edge_index=g.edge_index, x=g.x, y=g.y, num_classes=g.num_classes).to_npz(
        tmp_path / "dA" / "email.npz")
    other = torch.rand(g.x.shape, generator=torch.Generator().manual_seed(1))
    GraphData(edge_index=g.edge_index, x=other, y=g.y, num_classes=g.num_classes).to_npz(
        tmp_path / "dB" / "email.npz")
    return tmp_path / "dA", tmp_path / "dB"


def test_a_cached_run_on_other_data_of_the_same_shape_is_retrained(tmp_path, monkeypatch,
                                                                    capsys):
    d_a, d_b = _graph_pair(tmp_path)
    runs = tmp_path / "runs"
    base = ["main", *TINY[3:], "--datasets", "email", "--methods", "origin", "--runs-dir",
            str(runs)]
    calls = _count_trainings(monkeypatch)
    a = main([*base, "--data-dir", str(d_a), "--out", str(tmp_path / "A")])
    (path,) = (runs / "email").glob("origin-*.json")
    record_a = json.loads(path.read_text())
    capsys.readouterr()
    b = main([*base, "--data-dir", str(d_b), "--out", str(tmp_path / "B")])
    assert len(calls) == 2                                   # retrained, not reused
    out = capsys.readouterr().out
    assert f"cached run {path} was made from other data of the same shape" in out
    assert ("; retraining it (that run is kept beside it, as <name>.data-<its fingerprint>"
            ".json)") in out                         # where the other data's run went
    fp_a, fp_b = record_a["data_fingerprint"], json.loads(path.read_text())["data_fingerprint"]
    # B's run takes the file name; A's is kept beside it (it was overwritten: a CLI audit)
    kept = path.with_name(f"{path.stem}.data-{fp_a.split(':')[1][:16]}.json")
    assert sorted((runs / "email").glob("origin-*.json")) == sorted([path, kept])
    assert json.loads(kept.read_text()) == record_a
    assert fp_a.startswith("sha256:") and fp_b.startswith("sha256:") and fp_a != fp_b
    assert a["rows"][0]["metrics"] != b["rows"][0]["metrics"]
    main([*base, "--data-dir", str(d_b), "--out", str(tmp_path / "B")])
    assert len(calls) == 2                                   # the same data: cached
    a_again = main([*base, "--data-dir", str(d_a), "--out", str(tmp_path / "A3")])
    assert len(calls) == 2                                   # A's kept run, not retrained
    assert a_again["rows"][0]["metrics"] == a["rows"][0]["metrics"]
    # a legacy record (no fingerprint) is still reused, on its shape alone
    record = json.loads(path.read_text())
    del record["data_fingerprint"]
    path.write_text(json.dumps(record))
    main([*base, "--data-dir", str(d_a), "--out", str(tmp_path / "A2")])
    assert len(calls) == 2


def test_a_cached_semi_synthetic_run_of_another_derived_graph_is_retrained(tmp_path,
                                                                           monkeypatch, capsys):
    """The semi-synthetic graph is made from the loaded one by code: when that code came to
    follow the official arithmetic, the runs of the old graphs were served for the new ones
    (the fingerprint was the loaded graph's). It is the derived graph's now."""
    from dataclasses import replace

    from hiertail_fast.data import semi_synthetic as semi_module

    runs = tmp_path / "runs"
    args = ["semi-synthetic", *TINY, *EXTRA["semi-synthetic"][:8], "--methods", "origin",
            "--runs-dir", str(runs), "--out", str(tmp_path / "out")]
    calls = _count_trainings(monkeypatch)
    main(args)
    main(args)
    assert len(calls) == 1                                   # the same graph: cached
    real = semi_module.semi_synthetic_long_tail

    def other_graph(*a, **kw):          # the same shape, other features (another rule's graph)
        out = real(*a, **kw)
        return replace(out, data=replace(out.data, x=out.data.x.flip(0)))
    monkeypatch.setattr(semi_module, "semi_synthetic_long_tail", other_graph)
    capsys.readouterr()
    main(args)
    assert len(calls) == 2 and "was made from other data of the same shape" in \
        capsys.readouterr().out
    # migrate_fingerprints leaves a legacy semi-synthetic record alone: the loaded graph's
    # fingerprint (what it stamped) never matched the runner's (the review of session 30)
    from hiertail_fast.experiments import migrate_fingerprints

    (path,) = [p for p in (runs / "synthetic").glob("origin-*.json") if ".data-" not in p.name]
    legacy = {k: v for k, v in json.loads(path.read_text()).items() if k != "data_fingerprint"}
    path.write_text(json.dumps(legacy))
    stats = migrate_fingerprints.migrate(runs, tmp_path, log=lambda line: None)
    assert stats["migrated"] == 0 and stats["mismatched"] == [str(path)]
    assert json.loads(path.read_text()) == legacy


def test_migrate_fingerprints_adds_the_runners_fingerprint_to_legacy_records(tmp_path):
    from hiertail_fast.experiments import migrate_fingerprints

    d_a, _ = _graph_pair(tmp_path)
    runs = tmp_path / "runs"
    base = ["main", *TINY[3:], "--datasets", "email", "--methods", "origin", "--runs-dir",
            str(runs), "--data-dir", str(d_a)]
    main([*base, "--out", str(tmp_path / "A")])
    main([*base, "--feature-norm", "row", "--out", str(tmp_path / "R")])
    main(["main", *TINY, "--methods", "origin", "--runs-dir", str(runs), "--out",
          str(tmp_path / "S")])
    paths = sorted(runs.glob("*/*.json"))
    assert len(paths) == 3
    written = {p: json.loads(p.read_text()) for p in paths}
    for p, record in written.items():                        # made legacy
        p.write_text(json.dumps({k: v for k, v in record.items() if k != "data_fingerprint"},
                                indent=1) + "\n")
    odd = runs / "email" / "origin-000000000000-s1.json"      # made from another graph
    odd_record = json.loads(paths[0].read_text())
    odd_record["identity"]["data"]["nodes"] = 999
    odd.write_text(json.dumps(odd_record))
    # a malformed identity (a synthetic key without "nodes") crashed the command with a KeyError
    # after rewriting the records before it (a CLI audit): it is left alone, as unreadable
    synthetic = next(p for p in paths if p.parent.name == "synthetic")
    bad_record = json.loads(synthetic.read_text())
    del bad_record["identity"]["data"]["nodes"]
    bad = runs / "synthetic" / "a-malformed.json"
    bad.write_text(json.dumps(bad_record))
    assert migrate_fingerprints.main([str(runs), "--data-dir", str(d_a)]) == 1
    assert json.loads(bad.read_text()) == bad_record
    bad.unlink()
    for p, record in written.items():
        migrated = json.loads(p.read_text())
        assert migrated["data_fingerprint"] == record["data_fingerprint"]   # the runner's
        assert {k: v for k, v in migrated.items()
                if not k.startswith("data_fingerprint")} == {
            k: v for k, v in record.items() if k != "data_fingerprint"}
    assert "data_fingerprint" not in json.loads(odd.read_text())
    odd.unlink()
    assert migrate_fingerprints.main([str(runs), "--data-dir", str(d_a)]) == 0


@pytest.mark.parametrize("target", ["a_file", "proc", "dangling", "runs_file"])
def test_unwritable_out_or_runs_dir_is_refused_before_any_training(tmp_path, monkeypatch,
                                                                  capsys, target):
    calls = _count_trainings(monkeypatch)
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    out = {"a_file": tmp_path / "a_file", "proc": "/proc/hiertail-out",
           "dangling": tmp_path / "dangling", "runs_file": tmp_path / "out"}[target]
    argv = ["main", *TINY, "--methods", "origin", "--out", str(out)]
    if target == "runs_file":
        argv += ["--runs-dir", str(tmp_path / "a_file")]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and calls == []
    assert ("--runs-dir" if target == "runs_file" else "--out") in err.splitlines()[-1]
    assert "cannot be" in err and "Traceback" not in err


@pytest.mark.parametrize("name, bad, message", [
    ("main", ["--methods", "origin,origin"], "--methods: origin is given twice"),
    ("main", ["--datasets", "email,email"], "--datasets: email is given twice"),
    ("sensitivity", ["--parts", "grid", "--gammas", "0.1,0.1", "--taus", "1"],
     "--gammas: 0.1 is given twice"),
    ("sensitivity", ["--parts", "hidden", "--hiddens", "8,08"], "--hiddens: 8 is given twice"),
    # values that share their row label, and a sweep's options without its part (unchecked
    # values into the summary's args; an experiments audit, session 67)
    ("sensitivity", ["--parts", "dropout", "--dropouts", "0.1,0.1000001"],
     "--dropouts: 0.1 and 0.1000001 share the row label 0.1 (6 significant digits)"),
    ("sensitivity", ["--parts", "grid", "--hiddens", "abc"],
     "--hiddens applies to the hidden sweep, which --parts 'grid' leaves out"),
    ("sensitivity", ["--parts", "hidden,dropout", "--activations", "nope"],
     "--activations applies to the activation sweep, which --parts 'hidden,dropout' leaves"),
    ("tasks", ["--task-counts", "3:3,3:3"], "--task-counts: 3:3 is given twice"),
    ("semi-synthetic", ["--alpha", "2"], "must lie in (0, 1)"),
    ("semi-synthetic", ["--alpha", "nan"], "must lie in (0, 1)"),
    ("semi-synthetic", ["--val-per-class", "-1"], "--val-per-class"),
    ("semi-synthetic", ["--val-per-class", "1000"], "no dataset can take this split"),
    # no head class: more eligible classes help too (the advice named --alpha alone; a docs
    # audit, session 68)
    ("semi-synthetic", ["--val-per-class", "1", "--test-per-class", "1", "--alpha", "0.95"],
     "head classes (the official rule; 1 - 0.8 is 0.19999999999999996 in floats); need at "
     "least one head and one tail class); try another --alpha, or smaller --val-per-class / "
     "--test-per-class"),
    ("sensitivity", ["--parts", "hidden", "--hiddens", "16.7"], "'16.7' is not an integer"),
    ("sensitivity", ["--parts", "hidden", "--hiddens", "inf"], "'inf' is not an integer"),
    ("sensitivity", ["--parts", ""], "--parts '' gives no value"),
    ("sensitivity", ["--parts", "grid", "--gammas", "nan", "--taus", "1"], "not a finite"),
    ("tasks", ["--task-counts", "1000:1"], "need 1 <= B <= A <= 120"),
    # the synthetic graph's own limits, named by the options (a traceback from inside the
    # runs before, after other runs had trained: a CLI audit)
    ("main", ["--synthetic-classes", "1"], "--synthetic-classes >= 2, got 120 and 1"),
    ("main", ["--synthetic-nodes", "5"], "--synthetic-nodes >= 8 (its average degree is 6)"),
    ("main", ["--runs-dir", ""], "argument --runs-dir: an empty path"),
    # the synthetic graph's options on the datasets were silently ignored (a fresh-user audit,
    # session 66)
    ("main", ["--datasets", "email", "--synthetic-classes", "4"],
     "--synthetic-classes only applies to --synthetic"),
    ("main", ["--datasets", "email", "--synthetic-nodes", "300"],
     "--synthetic-nodes only applies to --synthetic"),
    # the baselines' adjacency where no baseline runs: it named a second summary as a variant
    # of identical rows (an experiments audit)
    ("tasks", ["--adj-norm", "row"], "--adj-norm does not apply to tasks: it runs no baseline"),
    ("tasks", ["--adj-norm", "none"], "--adj-norm does not apply to tasks: it runs no baseline"),
    ("sensitivity", ["--parts", "hidden", "--hiddens", "8", "--adj-norm", "row"],
     "--adj-norm does not apply to sensitivity"),
    ("tasks", ["--task-counts", "2:5"], "has B > A"),
    # refused by the options themselves, naming them (a mutation audit, session 69: --alpha 1
    # went on to a data-layer message about --val-per-class, --hiddens 0 to the config's)
    ("semi-synthetic", ["--alpha", "1"], "argument --alpha: must lie in (0, 1), got 1"),
    ("sensitivity", ["--parts", "hidden", "--hiddens", "0,16"], "--hiddens: '0' must be >= 1"),
    ("main", ["--methods", ","], "names no method"),
    # an empty value (an unset shell variable) is refused, not read as "every row"
    ("main", ["--methods", ""], "--methods '' names no method"),
    ("tasks", ["--task-counts", ""], "--task-counts '' gives no A:B pair"),
])
def test_bad_experiment_arguments_are_refused_before_training(tmp_path, monkeypatch, capsys,
                                                              name, bad, message):
    calls = _count_trainings(monkeypatch)
    argv = [name, *TINY, "--out", str(tmp_path / "out"), *bad]
    if "--datasets" in bad:
        d_a, _ = _graph_pair(tmp_path)
        argv = [name, *TINY[3:], "--out", str(tmp_path / "out"), *bad, "--data-dir", str(d_a)]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and calls == []
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_a_driver_that_plans_a_row_twice_is_refused_before_training(tmp_path, monkeypatch,
                                                                   capsys):
    """The command checks the rows a driver plans, not only the --methods it was given: a
    driver bug that plans one table row twice (it would train the same runs twice and report a
    std over copies) is a clear error naming the row, before any training or output."""
    from hiertail_fast.experiments import main_table

    planned = main_table.specs
    monkeypatch.setattr(main_table, "specs", lambda ctx: planned(ctx) * 2)
    calls = _count_trainings(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        main(["main", *TINY, "--methods", "origin", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and calls == [] and not (tmp_path / "out").exists()
    assert "table rows: synthetic / " in err and "is given twice" in err


def test_a_corrupt_cached_run_is_retrained_and_rewritten(tmp_path, monkeypatch, capsys):
    argv = ["main", *TINY, "--methods", "origin", "--out", str(tmp_path)]
    first = main(argv)
    (path,) = (tmp_path / "runs" / "synthetic").glob("origin-*.json")
    good = path.read_text()
    path.write_text(good[: len(good) // 2])                   # truncated
    calls = _count_trainings(monkeypatch)
    capsys.readouterr()
    second = main(argv)
    assert len(calls) == 1
    out = capsys.readouterr().out
    assert f"warning: cached run {path} cannot be read" in out
    assert "kept beside it" not in out      # (said so before; only another data's run is kept)
    assert json.loads(path.read_text())["result"]["test"] == json.loads(good)["result"]["test"]
    assert second["rows"][0]["metrics"] == first["rows"][0]["metrics"]
    assert not list(path.parent.glob(".*tmp"))
    # valid JSON, an incomplete result: used, it crashed the summary with a KeyError after all
    # training (an experiments audit); now a miss like a corrupt file
    for broken in ({"result": {}}, {"result": {"test": {"bacc": 0.5}}}, {"wall_s": None}):
        path.write_text(json.dumps({**json.loads(good), **broken}))
        calls.clear()
        third = main(argv)
        assert len(calls) == 1, broken
        assert f"warning: cached run {path} is not a complete run record" in \
            capsys.readouterr().out
        assert third["rows"][0]["metrics"] == first["rows"][0]["metrics"]


def test_a_diverging_run_is_recorded_not_retried_and_noted(tmp_path, monkeypatch):
    """A run that diverges (TrainingDivergedError from the shared loop) stopped the whole
    command, and a resumed command trained it again and stopped again, forever. It is now an
    outcome: cached with its message and no result, left out of its row (one seed fewer), said
    in the summary's notes, and not trained again."""
    from hiertail_fast.train import TrainingDivergedError

    real = runner._train
    calls = []

    def diverging(spec, *args, **kwargs):
        calls.append(args[3])
        if args[3] == 124:
            raise TrainingDivergedError("origin seed=124: training diverged at epoch 3: the "
                                        "training loss is nan; lower the learning rate")
        return real(spec, *args, **kwargs)
    monkeypatch.setattr(runner, "_train", diverging)
    argv = ["main", *TINY, "--seeds", "2", "--methods", "origin", "--out", str(tmp_path)]
    first = main(argv)
    assert calls == [123, 124]
    (path,) = (tmp_path / "runs" / "synthetic").glob("origin-*-s124.json")
    saved = json.loads(path.read_text())
    assert saved["result"] is None and "diverged at epoch 3" in saved["diverged"]
    assert first["rows"][0]["seeds"] == [123]
    assert any("seed 124 diverged" in note for note in first["notes"])
    second = main(argv)                                   # resumed: nothing trained again
    assert calls == [123, 124]
    assert second["rows"][0]["seeds"] == [123]
    assert any("seed 124 diverged" in note for note in second["notes"])


def test_a_bad_dataset_of_the_data_folder_is_refused_before_any_run(tmp_path, monkeypatch,
                                                                    capsys):
    """Without --datasets every .npz of the data folder runs: a bad one (NaN features, one
    class) raised a traceback from inside the runs, exit 1, after others had trained (a CLI
    audit). Every dataset is loaded and checked first now, exit 2 naming it."""
    import numpy as np

    d_a, _ = _graph_pair(tmp_path)
    good = np.load(d_a / "email.npz")
    arrays = {k: good[k] for k in good.files}
    for name, bad, message in [("wiki", {"x": np.full_like(arrays["x"], np.nan)},
                                "dataset wiki: "),
                               ("blogcatalog", {"y": np.zeros_like(arrays["y"])},
                                "dataset blogcatalog: the graph's nodes all have one class")]:
        np.savez(d_a / f"{name}.npz", **{**arrays, **bad})
        calls = _count_trainings(monkeypatch)
        with pytest.raises(SystemExit) as exc:
            main(["main", *TINY[3:], "--methods", "origin",
                  "--data-dir", str(d_a), "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and message in err and calls == [], err
        assert "Traceback" not in err and not (tmp_path / "out").exists()
        (d_a / f"{name}.npz").unlink()


def test_ctrl_c_is_one_line_and_the_next_run_resumes(tmp_path, monkeypatch, capsys):
    """Ctrl-C printed a 24-frame traceback ending in KeyboardInterrupt (a CLI audit); the
    training command's one line and exit 130 now, the summary not written."""
    argv = ["main", *TINY, "--seeds", "2", "--methods", "origin", "--out", str(tmp_path)]
    real = runner._train
    trained = []

    def interrupted_at_the_second(spec, *args, **kwargs):
        if trained:
            raise KeyboardInterrupt
        trained.append(args[3])
        return real(spec, *args, **kwargs)
    monkeypatch.setattr(runner, "_train", interrupted_at_the_second)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 130 and "Traceback" not in err
    assert (f"interrupted; the runs finished before are kept in {tmp_path / 'runs'} and the "
            f"same command resumes from them") in err, err
    assert not list(tmp_path.glob("main*.md"))
    monkeypatch.setattr(runner, "_train", real)
    calls = _count_trainings(monkeypatch)
    main(argv)
    assert [seed for _, seed in calls] == [124]        # seed 123 came from the cache


def test_ctrl_c_before_and_after_the_runs_is_one_line_too(tmp_path, monkeypatch, capsys):
    """Ctrl-C while the datasets load, or while the summary is made (tables, plots, the
    files): one line and exit 130, as during training, not a traceback; after the runs it says
    they are all kept and the same command makes the summary from them without training."""
    import hiertail_fast.experiments.cli as cli_mod
    import hiertail_fast.experiments.report as report_mod

    argv = ["main", *TINY, "--methods", "origin", "--out", str(tmp_path)]
    err = ctrl_c_line(monkeypatch, capsys, cli_mod, "_select_datasets", lambda: main(argv))
    assert "interrupted before any run; nothing was written" in err, err
    assert not list(tmp_path.iterdir())
    err = ctrl_c_line(monkeypatch, capsys, report_mod, "write_outputs", lambda: main(argv))
    assert (f"every run is kept in {tmp_path / 'runs'} and the same command makes the summary "
            f"({tmp_path / 'main-s1-e3-p1000'}.md / .json) from them without training") in err
    assert not list(tmp_path.glob("main*"))
    calls = _count_trainings(monkeypatch)
    main(argv)
    assert calls == [] and list(tmp_path.glob("main*.md"))


def test_ctrl_c_held_by_the_summary_renames_says_it_was_written(tmp_path, monkeypatch, capsys):
    """A Ctrl-C during the summary's renames waits until they are done and comes as a
    DeferredInterrupt: the line then says the summary was written, not that it is still to
    be made (the stand-in writes it, then raises what the rotation raises)."""
    import hiertail_fast.experiments.report as report_mod

    err = ctrl_c_line(monkeypatch, capsys, report_mod, "write_outputs", lambda: main(
        ["main", *TINY, "--methods", "origin", "--out", str(tmp_path)]), held=True)
    assert err.strip().splitlines()[-1].endswith(
        f"interrupted after the summary ({tmp_path / 'main-s1-e3-p1000'}.md / .json) was written")
    assert list(tmp_path.glob("main*.md"))


def test_data_dir_that_is_a_file_is_named_as_such(tmp_path, capsys):
    (tmp_path / "good.npz").write_text("x")
    with pytest.raises(SystemExit) as exc:
        main(["main", "--data-dir", str(tmp_path / "good.npz"), "--out", str(tmp_path / "o")])
    assert exc.value.code == 2 and "is a file, not a folder" in capsys.readouterr().err


def test_report_only_over_the_same_runs_leaves_the_summaries_alone(tmp_path, capsys):
    # it rewrote the summary and pushed the previous one out of .prev.* for a copy of the
    # same results (a CLI audit)
    out = tmp_path / "pc"
    main(["per-class", *TINY, "--out", str(out)])
    (out / "per-class-s1-e3-p1000.prev.md").write_text("an older summary")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    main(["per-class", *TINY, "--out", str(out), "--report-only"])
    assert "already holds these results; left as it is" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_tail_baselines_on_too_few_classes_are_refused_before_any_run(tmp_path, monkeypatch,
                                                                      capsys):
    # on two classes each tail baseline raised "im_class_num must lie in [1, 2]" from inside
    # its runs, a traceback after HierTail and Origin had trained (an experiments audit,
    # session 67)
    monkeypatch.setattr(runner, "_train", lambda *a, **k: pytest.fail("a run was trained"))
    with pytest.raises(SystemExit) as exc:
        main(["main", "--synthetic", "--synthetic-classes", "2", "--seeds", "1", "--epochs",
              "2", "--no-progress", "--methods", "origin,smote,imgagn,lte4g",
              "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert ("dataset synthetic has 2 classes, and smote, imgagn take its last 3 labels as the "
            "tail classes") in err
    assert not (tmp_path / "o").exists()
    # semi-synthetic: the graph it trains on keeps the classes large enough for its split
    # (2 of 8 here; the source graph's 8 passed the check, and reweight raised from inside its
    # runs after origin had trained; a review, session 67), built once for the check of every
    # tail method (it was built again for each: aae8159, unguarded until session 68)
    builds = []
    real_semi = runner.DataSource._semi
    monkeypatch.setattr(runner.DataSource, "_semi",
                        lambda self, *a, **k: builds.append(a) or real_semi(self, *a, **k))
    with pytest.raises(SystemExit) as exc:
        main(["semi-synthetic", "--synthetic", "--synthetic-nodes", "300",
              "--synthetic-classes", "8", "--alpha", "0.5", "--val-per-class", "10",
              "--test-per-class", "15", "--seeds", "1", "--epochs", "2", "--no-progress",
              "--methods", "origin,reweight,smote,imgagn", "--out", str(tmp_path / "s")])
    assert exc.value.code == 2
    assert ("the semi-synthetic graph of synthetic has 2 classes, and reweight, smote, imgagn "
            "take its last 3 labels") in capsys.readouterr().err
    assert len(builds) == 1
    assert not (tmp_path / "s").exists()


def test_checks_before_the_runs_accept_what_can_run(tmp_path, capsys):
    """The tail check refuses only a graph with fewer classes than the tail (3 of 3 runs), and
    --adj-norm is accepted where at least one selected row has the option."""
    res = main(["main", "--synthetic", "--synthetic-nodes", "120", "--synthetic-classes", "3",
                "--seeds", "1", "--epochs", "2", "--no-progress", "--device", "cpu",
                "--methods", "smote", "--report-only", "--out", str(tmp_path / "t")])
    assert res["runs"] == 0 and res["args"]["synthetic_classes"] == 3
    res = main(["main", *TINY, "--methods", "hiertail_paper,origin", "--adj-norm", "row",
                "--report-only", "--out", str(tmp_path / "a")])
    assert res["runs"] == 0 and res["args"]["adj_norm"] == "row"


def test_adj_norm_on_rows_without_the_option_is_refused(tmp_path, monkeypatch, capsys):
    # main --methods hiertail_paper,graphens --adj-norm row reused the runs made without it
    # and recorded adj_norm: row in the summary's args (an experiments audit, session 67)
    monkeypatch.setattr(runner, "_train", lambda *a, **k: pytest.fail("a run was trained"))
    with pytest.raises(SystemExit) as exc:
        main(["main", *TINY, "--methods", "hiertail_paper,graphens,imgagn",
              "--adj-norm", "row", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    assert ("--adj-norm does not apply to the rows selected (graphens, hiertail, imgagn)"
            in capsys.readouterr().err)
    assert not (tmp_path / "o").exists()


def test_per_class_rows_without_values_are_null_and_a_dash(tmp_path, capsys):
    # rows without runs wrote bare NaN into the .json (strict JSON readers refuse it) and
    # "nan" cells with a RuntimeWarning (an experiments audit, session 67)
    import warnings

    out = tmp_path / "pc"
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        main(["per-class", *TINY, "--out", str(out), "--report-only"])
    text = (out / "per-class-s1-e3-p1000.json").read_text()

    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    payload = json.loads(text, parse_constant=refuse)
    methods = payload["datasets"][0]["methods"]
    assert methods and all(v["seeds"] == 0 and set(v["mean"]) == {None}
                           for v in methods.values())
    md = (out / "per-class-s1-e3-p1000.md").read_text()
    assert not re.search(r"\bnan\b", md, re.IGNORECASE) and "| 0 | — | — | — |" in md


def test_a_summary_from_before_an_option_existed_has_the_same_arguments(tmp_path, capsys):
    # a summary recorded before --feature-norm existed has no entry for it: every rerun of its
    # own command called it "other arguments" and wrote a hashed name beside it (session 67)
    out = tmp_path / "pc"
    main(["per-class", *TINY, "--out", str(out)])
    path = out / "per-class-s1-e3-p1000.json"
    old = json.loads(path.read_text())
    del old["args"]["feature_norm"]
    del old["args"]["seed_base"]            # an option whose default is filled in after parsing
    path.write_text(json.dumps(old))
    capsys.readouterr()
    main(["per-class", *TINY, "--out", str(out), "--report-only"])
    err = capsys.readouterr().err
    assert "comes from other arguments" not in err
    assert not list(out.glob("per-class-s1-e3-p1000-*.md"))                # no hashed name
    assert json.loads(path.read_text())["args"]["feature_norm"] == "none"     # rewritten whole
    assert json.loads(path.read_text())["args"]["seed_base"] == runner.FULL_SEEDS[0]
    # an option the old summary lacks, given at another value: other arguments
    path.write_text(json.dumps(old))
    main(["per-class", *TINY, "--out", str(out), "--report-only", "--feature-norm", "row"])
    assert "comes from other arguments; kept" in capsys.readouterr().err


def test_a_summary_file_gone_is_written_again(tmp_path, capsys):
    # with the same results in the .json, a deleted .md (or figure) was never written again,
    # and every rerun logged "already holds these results" (an experiments audit, session 67)
    out = tmp_path / "pc"
    main(["per-class", *TINY, "--out", str(out)])
    stem = "per-class-s1-e3-p1000"
    pngs = sorted(p.name for p in out.glob(f"{stem}-*.png"))
    assert pngs
    (out / f"{stem}.md").unlink()
    (out / pngs[0]).unlink()
    capsys.readouterr()
    main(["per-class", *TINY, "--out", str(out), "--report-only"])
    assert "already holds" not in capsys.readouterr().err
    assert (out / f"{stem}.md").is_file() and (out / pngs[0]).is_file()
    capsys.readouterr()
    main(["per-class", *TINY, "--out", str(out), "--report-only"])     # now whole: left alone
    assert "already holds these results; left as it is" in capsys.readouterr().err


def test_an_unreadable_summary_is_named_and_kept(tmp_path, capsys):
    # a truncated .json was read as {} ("comes from other arguments; kept"), and every later
    # run of the same command wrote to a hashed name beside the stale .md (an experiments
    # audit, session 67). Each call closes the figures it made, on the refusal too (pyplot
    # kept every call's open: a fix-test check, session 68, found it unguarded)
    import matplotlib.pyplot as plt

    plt.close("all")
    out = tmp_path / "pc"
    main(["per-class", *TINY, "--out", str(out)])
    assert plt.get_fignums() == []
    stem = "per-class-s1-e3-p1000"
    broken = (out / f"{stem}.json").read_bytes()[:200]
    (out / f"{stem}.json").write_bytes(broken)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["per-class", *TINY, "--out", str(out), "--report-only"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert f"{stem}.json cannot be read as a summary" in err and "--replace-summary" in err
    assert (out / f"{stem}.json").read_bytes() == broken
    assert plt.get_fignums() == []                             # the summary-kept path's too
    assert not list(out.glob(f"{stem}-*.md"))                   # no hashed name either
    main(["per-class", *TINY, "--out", str(out), "--report-only", "--replace-summary"])
    assert json.loads((out / f"{stem}.json").read_text())["args"]
    assert (out / f"{stem}.prev.json").read_bytes() == broken   # kept, one generation


def test_an_unreadable_summary_of_another_command_does_not_block_this_one(tmp_path, capsys):
    # an unreadable plain-named summary refused a command whose own summary sits at a hashed
    # name, and --replace-summary then wrote into the other command's slot (a review,
    # session 67): the command finds its own further on and keeps the unreadable one
    out = tmp_path / "pc"
    main(["per-class", *TINY, "--out", str(out)])
    main(["per-class", *TINY, "--lr", "0.02", "--out", str(out)])
    stem = "per-class-s1-e3-p1000"
    (hashed,) = [p.name for p in out.glob(f"{stem}-*.json")]
    (out / f"{stem}.json").write_text("{broken")
    capsys.readouterr()
    main(["per-class", *TINY, "--lr", "0.02", "--out", str(out), "--report-only"])
    err = capsys.readouterr().err
    assert f"{stem}.json cannot be read as a summary" in err and "; kept" in err
    assert f"{hashed[:-5]}.md already holds these results" in err
    assert (out / f"{stem}.json").read_text() == "{broken"
    with pytest.raises(SystemExit) as exc:          # the first command's own: it may be it
        main(["per-class", *TINY, "--out", str(out), "--report-only"])
    assert exc.value.code == 2 and "and it may be this command's" in capsys.readouterr().err


def test_thread_count_follows_each_dataset_not_the_command(tmp_path, monkeypatch):
    """Without --threads a run on a graph below 5,000 nodes trains on 1 thread and a larger
    one on torch's count, per dataset: the count was once set for the whole command (1 only
    when every dataset named was small), so Email's runs came out at 1 or 2 threads (other
    numbers, the same cache file) depending on the datasets named with it. The summary names
    the runs' thread counts by dataset."""
    import torch

    from hiertail_fast.data.io import GraphData
    from hiertail_fast.data.synthetic import make_synthetic_graph

    data = tmp_path / "data"
    data.mkdir()
    for name, nodes in (("email", 120), ("wiki", 5000)):
        g = make_synthetic_graph(nodes, num_classes=6, avg_degree=4.0, num_features=8, seed=0)
        GraphData(edge_index=g.edge_index, x=g.x, y=g.y, num_classes=g.num_classes).to_npz(
            data / f"{name}.npz")
    seen: dict[str, set] = {}
    real = runner._train

    def spy(spec, *args, **kwargs):
        seen.setdefault(spec.dataset, set()).add(torch.get_num_threads())
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(runner, "_train", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        res = main(["main", *TINY[3:], "--datasets", "email,wiki", "--methods", "origin",
                    "--data-dir", str(data), "--out", str(tmp_path / "out")])
    finally:
        torch.set_num_threads(before)
    assert seen == {"email": {1}, "wiki": {2}}
    assert res["provenance"]["runs_threads"] == {"email": [1], "wiki": [2]}
    md = next((tmp_path / "out").glob("main*.md")).read_text()
    assert "torch threads of the runs: email 1, wiki 2" in md


def test_cached_runs_of_another_thread_count_are_reused_with_a_notice(tmp_path, capsys):
    """The thread count is not part of a run's identity, so a --threads 2 command over runs
    trained on 1 thread reused them without a word, while a fresh run differs in the last
    bits (a determinism audit). It says so now, once per dataset."""
    out = tmp_path / "pc"
    main(["per-class", *TINY, "--out", str(out), "--threads", "1"])
    capsys.readouterr()
    main(["per-class", *TINY, "--out", str(out), "--threads", "2"])
    said = capsys.readouterr()
    assert said.out.count("reusing cached runs trained on 1 torch threads (this command would "
                          "train on 2") == 1
    # the thread count is not one of the summary's arguments: the same summary, replaced
    assert "comes from other arguments" not in said.err
    assert not list(out.glob("per-class-s1-e3-p1000-*.md"))
    assert "threads" not in json.loads((out / "per-class-s1-e3-p1000.json").read_text())["args"]
    main(["per-class", *TINY, "--out", str(out), "--threads", "1"])
    assert "reusing cached runs" not in capsys.readouterr().out


def test_run_specs_gives_torchs_thread_count_back(monkeypatch):
    """run_specs sets each dataset's thread count to train; called from Python (not the
    command line, whose main restores it) it left torch on the last run's count (an audit)."""
    import torch

    def trains_on_one_thread(*args, **kwargs):
        torch.set_num_threads(1)
        raise RuntimeError("stopped")

    monkeypatch.setattr(runner, "_run_specs", trains_on_one_thread)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="stopped"):
            runner.run_specs([], Budget(epochs=1, patience=1), None, None, threads=lambda d: 1)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------ run identity (a mutation audit)
def test_runs_of_two_patiences_get_their_own_cache_files(tmp_path):
    """A run's identity holds its budget's patience (module doc: a run is one ... under one
    budget (epochs, patience)): runs that differ only in patience must not share a cache file,
    or a patience-100 run is served for a patience-200 request. A mutation audit found the
    patience could be dropped from the identity unnoticed."""
    from hiertail_fast.nn.hiertail import HierTailConfig

    spec = runner.RunSpec("email", "hiertail_paper", "hiertail", HierTailConfig.paper())
    cache = runner.RunCache(tmp_path)
    ids = [spec.identity(123, Budget(epochs=300, patience=p), "cpu", {"nodes": 1})
           for p in (100, 200)]
    assert cache.path(spec, ids[0]) != cache.path(spec, ids[1])


def test_a_reduced_patience_is_not_the_full_protocol():
    """Budget.is_full needs the full seeds, epochs AND patience: the full seeds and epochs with
    patience 100 are a reduced budget (header says so, files get a tag). A mutation audit found
    is_full could ignore the patience unnoticed (the existing checks vary seeds and epochs)."""
    b = Budget(runner.FULL_SEEDS, runner.FULL_EPOCHS, 100)
    assert (b.is_full, b.tag()) == (False, "-s10-e10000-p100")


def test_data_fingerprint_covers_the_labels():
    """data_fingerprint hashes x, edge_index AND y: a relabelled graph (same x and edges) must
    not reuse the cached runs of the original. A mutation audit found y could be left out of
    the hash unnoticed (the cache tests change only the features)."""
    import torch

    from hiertail_fast.data.io import GraphData

    g = GraphData(torch.tensor([[0, 1], [1, 0]]), torch.ones(2, 1), torch.tensor([0, 1]), 2)
    swapped = GraphData(g.edge_index, g.x, torch.tensor([1, 0]), 2)
    assert runner.data_fingerprint(g) != runner.data_fingerprint(swapped)


def test_each_seed_runs_on_its_own_natural_split():
    """A natural-split run of seed s trains and evaluates on ``natural_split(y, s)``: a runner
    that drew seed 0's split for every seed passed every test (a mutation audit)."""
    import torch

    from hiertail_fast.data.splits import natural_split
    from hiertail_fast.nn.hiertail import HierTailConfig

    src = runner.DataSource(None, synthetic={"nodes": 300, "classes": 6, "features": 16})
    spec = runner.RunSpec("synthetic", "hiertail_paper", "hiertail", HierTailConfig.paper())
    y = src.load("synthetic").y
    for seed in (1, 2):
        _, split, _ = src.run_inputs(spec, seed)
        for got, want in zip(split, natural_split(y, seed), strict=True):
            assert torch.equal(torch.as_tensor(got), torch.as_tensor(want))
    assert not torch.equal(torch.as_tensor(src.run_inputs(spec, 1)[1][2]),
                           torch.as_tensor(src.run_inputs(spec, 2)[1][2]))


def test_an_explicit_default_of_another_experiments_option_is_refused(tmp_path, capsys):
    """`main --config paper` and `datasets --seed-base 123` (their defaults) ran, ignoring the
    option, while any other value was refused (a docs audit); unset, they still default."""
    from hiertail_fast.experiments.cli import build_parser, given_defaults

    for argv, msg in ((["main", "--config", "paper"], "--config does not apply to main"),
                      (["datasets", "--seed-base", "123"],
                       "--seed-base does not apply to datasets: it trains nothing")):
        with pytest.raises(SystemExit) as exc:
            main(argv + ["--out", str(tmp_path)])
        assert exc.value.code == 2 and msg in capsys.readouterr().err
    args = build_parser().parse_args(["ablation"])
    given_defaults(args)
    assert (args.config, args.seed_base) == ("paper", runner.FULL_SEEDS[0])


def test_device_defaults_to_cuda_when_present(monkeypatch):
    """No --device: cuda when torch sees one, else cpu; a given device is kept."""
    import torch

    from hiertail_fast.experiments.cli import _device, build_parser

    args = build_parser().parse_args(["main"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _device(args) == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _device(args) == "cpu"
    assert _device(build_parser().parse_args(["main", "--device", "cpu"])) == "cpu"


def test_the_datasets_table_synthetic_sizes_one_class_and_no_budget(tmp_path):
    """--synthetic without sizes is the 240-node, 6-class graph, and 8 nodes (its average
    degree + 2) is accepted; the datasets table, which trains nothing, states no budget and
    describes a graph of one class (only training needs two)."""
    import torch

    from hiertail_fast.data.io import GraphData
    from hiertail_fast.data.synthetic import make_synthetic_graph

    res = main(["datasets", "--synthetic", "--no-progress", "--out", str(tmp_path / "s")])
    ours = res["rows"][0]["ours"]
    assert (ours["nodes"], ours["classes"]) == (240, 6)
    md = (tmp_path / "s" / "datasets.md").read_text()     # it trains nothing: no budget line
    assert "Budget" not in md and "BUDGET" not in md and res["budget_header"] is None
    with pytest.warns(UserWarning, match="too few"):      # the smallest the generator takes
        res = main(["datasets", "--synthetic", "--synthetic-nodes", "8", "--no-progress",
                    "--out", str(tmp_path / "s8")])
    assert res["rows"][0]["ours"]["nodes"] == 8
    g = make_synthetic_graph(120, num_classes=6, avg_degree=6.0, num_features=16, seed=0)
    (tmp_path / "d").mkdir()
    GraphData(edge_index=g.edge_index, x=g.x, y=torch.zeros_like(g.y),
              num_classes=1).to_npz(tmp_path / "d" / "email.npz")
    res = main(["datasets", "--data-dir", str(tmp_path / "d"), "--no-progress",
                "--out", str(tmp_path / "o")])
    assert [(r["dataset"], r["ours"]["classes"]) for r in res["rows"]] == [("email", 1)]


def test_the_data_folder_defaults_to_hiertail_data(tmp_path, monkeypatch):
    """Without --data-dir the datasets are read from $HIERTAIL_DATA."""
    d_a, _ = _graph_pair(tmp_path)
    monkeypatch.setenv("HIERTAIL_DATA", str(d_a))
    monkeypatch.chdir(tmp_path)
    res = main(["datasets", "--no-progress", "--out", str(tmp_path / "o")])
    assert [(r["dataset"], r["ours"]["nodes"]) for r in res["rows"]] == [("email", 120)]


def test_the_datasets_table_of_other_data_is_kept(tmp_path, capsys):
    """The datasets table trains nothing (no specs), so its summary recorded no fingerprint
    and the same command on another --data-dir replaced it in place (the review of session 36);
    it records the fingerprints of the datasets it covers."""
    import numpy as np

    from hiertail_fast.data.io import load_npz, save_npz
    from hiertail_fast.data.synthetic import make_synthetic_graph

    g = make_synthetic_graph(300, num_classes=5, avg_degree=6, seed=0)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    save_npz(a / "email.npz", g.edge_index, g.x, g.y)
    x = g.x.numpy().copy()
    x[:, 0] += 1.0                                                # other data, same shape
    save_npz(b / "email.npz", g.edge_index, x, g.y)
    assert not np.array_equal(load_npz(a / "email.npz").x, load_npz(b / "email.npz").x)
    out = tmp_path / "out"
    for data_dir in (a, b):
        main(["datasets", "--datasets", "email", "--data-dir", str(data_dir), "--out", str(out),
              "--no-progress"])
    first = json.loads((out / "datasets.json").read_text())
    assert str(a) in first["provenance"]["command"]
    assert len(list(out.glob("datasets-*.json"))) == 1
    assert "comes from other data; kept" in capsys.readouterr().err


# ---- dataset selection and Ctrl-C (a mutation audit, s43)
def _datasets_table(argv, data_dir, out):
    return main(["datasets", *argv, "--data-dir", str(data_dir), "--out", str(out),
                 "--no-progress"])


def test_datasets_are_named_by_their_registry_names(tmp_path, capsys):
    """--datasets takes any case and spacing (" EMAIL "): the rows, the cache folders and the
    paper's numbers are keyed by the registry name; without the mapping the table said
    'EMAIL' (no paper column) and `email,Email` ran one graph twice."""
    d_a, _ = _graph_pair(tmp_path)
    res = _datasets_table(["--datasets", " EMAIL "], d_a, tmp_path / "out")
    assert [r["dataset"] for r in res["rows"]] == ["email"]
    assert list(res["data_fingerprints"]) == ["email"] and res["rows"][0]["paper"] is not None
    with pytest.raises(SystemExit) as exc:
        _datasets_table(["--datasets", "email,Email"], d_a, tmp_path / "out2")
    assert exc.value.code == 2
    assert "--datasets: email is given twice" in capsys.readouterr().err


@pytest.mark.parametrize("argv, folder, message", [
    (["--datasets", "email,wiki"], "dA", "--datasets wiki: not in {d} (present: email)"),
    (["--datasets", "email"], "empty", "--datasets email: not in {d} (present: none)"),
    (["--datasets", " , "], "dA", "--datasets ' , ' names no dataset"),
    (["--datasets", ""], "dA", "--datasets '' names no dataset"),
    ([], "empty", "no dataset found in {d}"),
], ids=["second-missing", "none-present", "empty-list", "empty-value", "empty-folder"])
def test_every_dataset_asked_for_must_be_in_the_data_folder(tmp_path, capsys, argv, folder,
                                                           message):
    """Each name of --datasets is checked against the data folder (not only the first: the
    second's FileNotFoundError came out as a bare path, without what is present); a list of
    nothing, or a data folder holding no paper dataset, is refused instead of writing an
    empty table; an empty value (an unset shell variable) is refused too, where it once ran
    every dataset of the folder."""
    _graph_pair(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exc:
        _datasets_table(argv, tmp_path / folder, tmp_path / "out")
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message.format(d=tmp_path / folder) in err, err
    assert not (tmp_path / "out").exists()


def test_synthetic_runs_only_the_graph_named_synthetic(tmp_path, monkeypatch, capsys):
    """--synthetic with a paper dataset named: refused; without the check it trained Email
    from the data folder under --synthetic's summary."""
    d_a, _ = _graph_pair(tmp_path)
    calls = _count_trainings(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        main(["main", *TINY, "--methods", "origin", "--datasets", "email", "--data-dir",
              str(d_a), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--synthetic runs the one graph named 'synthetic'" in err
    assert calls == [] and not (tmp_path / "out").exists()


def test_out_of_memory_in_a_run_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    """sensitivity --hiddens 30000000 passes the option checks and the model then asks torch
    for 3.6 PB: a traceback before. Now one line with the allocator's message, where the
    finished runs are and that no summary was written; exit 1 (a run's outcome). Any other
    RuntimeError keeps its traceback (mutant: every RuntimeError caught)."""
    out = tmp_path / "out"
    argv = ["main", *TINY, "--methods", "origin", "--out", str(out)]

    def oom(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                           "can't allocate memory: you tried to allocate 3600000000000000 bytes.")

    monkeypatch.setattr(runner, "_train", oom)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 1 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("python -m hiertail_fast.experiments: error: out of memory in a run "
                           "([enforce fail at alloc_cpu.cpp:127]"), line
    assert line.endswith(f"the runs finished before are kept in {out / 'runs'} and the same "
                         f"command resumes from them; the summary "
                         f"({out / 'main-s1-e3-p1000'}.md / .json) was not written"), line
    assert not list(out.glob("main*"))
    # Python's own MemoryError has no message: named by its type, as the trainer names it
    # (it printed "out of memory in a run ();": a fix-test check, session 68)

    def bare(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(runner, "_train", bare)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 1
    assert "out of memory in a run (MemoryError); " in capsys.readouterr().err

    def bug(*args, **kwargs):
        raise RuntimeError("shape mismatch in some op")

    monkeypatch.setattr(runner, "_train", bug)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        main(argv)


def test_ctrl_c_names_the_runs_dir_given_and_the_summary_not_written(tmp_path, monkeypatch,
                                                                     capsys):
    """The Ctrl-C line tells where the finished runs are (--runs-dir when given, not OUT/runs,
    where a user would look for them in vain) and which summary was not written."""
    runs, out = tmp_path / "shared-runs", tmp_path / "out"
    argv = ["main", *TINY, "--methods", "origin", "--runs-dir", str(runs), "--out", str(out)]
    err = ctrl_c_line(monkeypatch, capsys, runner, "_train", lambda: main(argv))
    assert f"kept in {runs} and the same command resumes" in err, err
    assert f"the summary ({out / 'main-s1-e3-p1000'}.md / .json) was not written" in err, err
    assert not list(out.glob("main*"))


def test_a_run_shared_by_two_experiments_is_trained_once(tmp_path, monkeypatch):
    """--runs-dir shared between experiments: a run is the same run whatever row names it
    (main's hiertail_paper and origin are ablation's m1_m2_ce and origin), so ablation
    trains only its two other rows (a run file named by the row retrained both)."""
    runs = tmp_path / "runs"
    main(["main", *TINY, "--methods", "hiertail_paper,origin", "--runs-dir", str(runs),
          "--out", str(tmp_path / "main")])
    calls = _count_trainings(monkeypatch)
    res = main(["ablation", *TINY, "--runs-dir", str(runs), "--out", str(tmp_path / "abl")])
    assert sorted(row for row, _ in calls) == ["ce", "m1_ce"]
    assert len(res["rows"]) == 4
