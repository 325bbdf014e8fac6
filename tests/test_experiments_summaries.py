"""A summary's provenance, its files and targets (a mutation audit, s42: each rule below could be
broken without a test noticing; the section comments name the rule, where it is stated, and the
mutants it kills): the budget and the exact command recorded, figures rotated with their
summary one generation and another summary's files left alone, --out / --runs-dir checked before
any training, and the command's --adj-norm reaching the baselines."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import time
from pathlib import Path

import pytest

from hiertail_fast.experiments import report, runner
from hiertail_fast.experiments.cli import main
from hiertail_fast.experiments.runner import Budget


# ------------------------------------------------------------
# (s42 audit, mutant F04) a summary's provenance records the budget it ran
# (report.provenance docstring: "the budget (seeds, epochs, patience, whether it is the full
# protocol)"; README: each summary starts with "seeds and budget"). The end-to-end test only checks
# that the keys exist, so a patience recorded as the epochs went unnoticed.
def test_provenance_records_the_budget_it_ran():
    budget = Budget((3, 4), 17, 5)
    p = report.provenance(["main", "--seeds", "3,4"], budget, time.time(), "cpu")
    assert (p["seeds"], p["epochs"], p["patience"]) == ([3, 4], 17, 5)
    assert p["full_protocol"] is False
    md = report.provenance_markdown(p)
    assert "- seeds [3, 4], epochs ≤ 17, patience 5" in md


def test_provenance_records_the_python_and_torch_versions():
    """provenance records the Python and torch versions (its docstring) as their release
    numbers, and the summary's text names them."""
    import platform

    import torch

    p = report.provenance(["main"], Budget((1,), 3, 2), time.time(), "cpu")
    assert (p["python"], p["torch"]) == (platform.python_version(), torch.__version__)
    assert f"- python {platform.python_version()}, torch {torch.__version__}" in \
        report.provenance_markdown(p)


# ------------------------------------------------------------
# (s42 audit, mutants F33 / F23) of a summary's provenance text.
#
# F33: the summary "starts with the exact command" (README, experiments): the recorded command,
# split as a shell splits it, gives back the argv it ran with -- a path holding a space or a
# quote too (an unquoted join gave a command that runs something else).
# F23: a table that trains nothing (``datasets``; provenance_markdown(trains=False), as cli's
# budget header) has no training budget line: it states no seeds / epochs it never ran.
PREFIX = ["python", "-m", "hiertail_fast.experiments"]


def test_the_recorded_command_is_the_exact_argv():
    argv = ["main", "--out", "my results/run 1", "--data-dir", "it's here", "--datasets",
            "email"]
    p = report.provenance(argv, Budget((1,), 3, 2), time.time(), "cpu")
    assert shlex.split(p["command"]) == PREFIX + argv
    assert f"- command: `{p['command']}`" in report.provenance_markdown(p)


def test_a_table_that_trains_nothing_states_no_budget():
    p = report.provenance(["datasets"], Budget((1,), 3, 2), time.time(), "cpu")
    assert "epochs" not in report.provenance_markdown(p, trains=False)
    assert "- seeds [1], epochs ≤ 3, patience 2" in report.provenance_markdown(p, trains=True)


# ------------------------------------------------------------
# (s42 audit, mutants F05 / F06 / F07 / F09) write_outputs replaces a summary's
# whole set -- ``<stem>.md``, ``<stem>.json`` and its ``<stem>-<figure>.png`` -- keeping the set it
# replaces as ``<stem>.prev.*`` / ``<stem>.prev-<figure>.png``, one generation (report.write_outputs
# docstring: "the old set kept as <stem>.prev.* (one generation)"; README: "Each command writes a
# markdown + JSON summary", figures beside it). The existing tests write figures once only, so the
# rotation of figures was never exercised: an old figure left in place under the new summary, or a
# two-generations-old .prev figure mixed into the previous set, went unnoticed.
class _Figure:
    def __init__(self, tag: str):
        self.tag = tag

    def savefig(self, path, **kwargs):
        Path(path).write_text(self.tag)


def _write(out: Path, gen: int, figures: dict) -> None:
    payload = {"args": {"name": "main"}, "runs": 1, "provenance": {"runs_code": []},
               "rows": [{"gen": gen}]}
    report.write_outputs(out, "main", f"gen {gen}\n", payload, figures, log=lambda line: None)


def test_figures_rotate_with_their_summary_one_generation(tmp_path):
    _write(tmp_path, 1, {"a": _Figure("a1"), "b": _Figure("b1")})
    assert json.loads((tmp_path / "main.json").read_text())["figures"] == ["main-a.png",
                                                                           "main-b.png"]
    _write(tmp_path, 2, {"a": _Figure("a2")})
    # the new set in place, the whole old set (its figures too) as the .prev generation
    assert (tmp_path / "main.md").read_text() == "gen 2\n"
    assert (tmp_path / "main-a.png").read_text() == "a2"
    assert not (tmp_path / "main-b.png").exists()          # not the old set's, left in place
    assert (tmp_path / "main.prev.md").read_text() == "gen 1\n"
    assert (tmp_path / "main.prev-a.png").read_text() == "a1"
    assert (tmp_path / "main.prev-b.png").read_text() == "b1"
    _write(tmp_path, 3, {})
    # generation 1 is gone whole: .prev holds generation 2 only
    assert (tmp_path / "main.prev.md").read_text() == "gen 2\n"
    assert (tmp_path / "main.prev-a.png").read_text() == "a2"
    assert not (tmp_path / "main.prev-b.png").exists()
    assert not (tmp_path / "main-a.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "main.json", "main.md", "main.prev-a.png", "main.prev.json", "main.prev.md"]


# ------------------------------------------------------------
# (s42 audit, mutant F08) the set write_outputs replaces is the summary's own
# files, ``<stem>.md``, ``<stem>.json`` and ``<stem>-<figure>.png`` (report._summary_files: "path
# of a summary set written before"); a name in the old JSON's "figures" that is not one of them
# (an edited or foreign JSON, another summary's figure in the same --out) is never moved or
# deleted. Loosened to "any .png", another summary's figure was moved to a mangled .prev name.
def test_a_figure_of_another_summary_listed_in_the_json_is_left_alone(tmp_path):
    payload = {"args": {"name": "main"}, "runs": 1, "provenance": {"runs_code": []}}
    report.write_outputs(tmp_path, "main", "gen 1\n", {**payload, "rows": [1]},
                         log=lambda line: None)
    (tmp_path / "other-fig.png").write_text("another summary's figure")
    old = json.loads((tmp_path / "main.json").read_text())
    old["figures"] = ["other-fig.png", "../escape.png"]
    (tmp_path / "main.json").write_text(json.dumps(old))
    report.write_outputs(tmp_path, "main", "gen 2\n", {**payload, "rows": [2]},
                         log=lambda line: None)
    assert (tmp_path / "other-fig.png").read_text() == "another summary's figure"
    assert (tmp_path / "main.md").read_text() == "gen 2\n"
    assert (tmp_path / "main.prev.md").read_text() == "gen 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "main.json", "main.md", "main.prev.json", "main.prev.md", "other-fig.png"]


# ------------------------------------------------------------
# (s42 audit, mutants F10-F14) cli._check_targets refuses, before any run
# ("training can take hours"), an --out whose summary files cannot be written -- the .md and the
# .json, and the .prev slot an existing summary is kept in (write_outputs keeps it as
# <stem>.prev.*) -- and a --runs-dir that cannot be used. Without the check the command trains
# every run and fails when it writes (or, for --report-only, reads nothing).
TINY = ["--synthetic", "--synthetic-nodes", "120", "--seeds", "1", "--epochs", "3",
        "--hidden", "8", "--no-progress", "--device", "cpu", "--methods", "origin"]
STEM = "main-s1-e3-p1000"


def _no_training(monkeypatch) -> list:
    calls = []
    monkeypatch.setattr(runner, "_train", lambda spec, *a, **k: calls.append(spec.row) or 1 / 0)
    return calls


@pytest.mark.parametrize("blocked", ["prev_md", "prev_json", "json"])
def test_a_summary_target_that_cannot_be_written_is_refused_before_training(
        tmp_path, monkeypatch, capsys, blocked):
    calls = _no_training(monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    for s in (".md", ".json"):
        (out / f"{STEM}{s}").write_text("{}")            # a summary of these arguments
    target = {"prev_md": f"{STEM}.prev.md", "prev_json": f"{STEM}.prev.json",
              "json": f"{STEM}.json"}[blocked]
    (out / target).unlink(missing_ok=True)
    (out / target).mkdir()                               # a directory where a file goes
    with pytest.raises(SystemExit) as exc:
        main(["main", *TINY, "--out", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and calls == []
    assert "--out" in err.splitlines()[-1] and "cannot be written" in err


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_report_only_reads_a_runs_dir_it_cannot_write(tmp_path, monkeypatch):
    """--report-only only reads the runs folder (_check_targets docstring: "the runs folder too
    when runs are trained (--report-only only reads it)"): one where no file can be created (an
    archive, another user's runs; /proc here, as root ignores permissions) is not refused."""
    calls = _no_training(monkeypatch)
    res = main(["main", *TINY, "--report-only", "--runs-dir", "/proc/hiertail-runs",
                "--out", str(tmp_path / "out")])
    assert res["runs"] == 0 and calls == []
    assert (tmp_path / "out" / f"{STEM}.md").is_file()


def test_report_only_refuses_a_runs_dir_that_is_a_file(tmp_path, monkeypatch, capsys):
    calls = _no_training(monkeypatch)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(SystemExit) as exc:
        main(["main", *TINY, "--report-only", "--runs-dir", str(tmp_path / "a_file"),
              "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and calls == []
    assert "--runs-dir" in err.splitlines()[-1] and "not a directory" in err


# ------------------------------------------------------------
# (s42 audit, mutant E59) common.baseline_config applies the command's
# --adj-norm (its docstring: "the command's --hidden / --lr / --adj-norm overrides"). Without it,
# `main --adj-norm row` runs every baseline at its default aggregation while the summary's args
# say row: a table of a variant that did not run.
@pytest.mark.parametrize("norm", ["row", "none"])
def test_baseline_config_takes_the_commands_adj_norm(norm):
    from hiertail_fast.experiments.common import baseline_config

    a = argparse.Namespace(hidden=None, lr=None, adj_norm=norm)
    for method in ("origin", "lte4g"):
        assert baseline_config(method, "email", a).adj_norm == norm
    # graphens and imgagn aggregate with their own official D^-1(A+I): the option is not
    # theirs, and BaselineConfig refuses another method's option (session 67)
    for method in ("graphens", "imgagn"):
        assert baseline_config(method, "email", a).adj_norm is None
