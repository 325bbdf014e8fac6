"""Table writing shared by the experiments: the comparison with the paper (our mean ± std, the
paper's, the difference in units of the paper's std, a verdict), provenance (command, commit,
machine, torch, budget, wall time) and the atomic writing of markdown / JSON / PNG results.

Verdict per metric: ``reproduced`` when |ours − paper| ≤ one paper std, else ``below`` /
``above``; where the paper gives no std (Table 5) or a std of 0, within 0.5 points counts as
reproduced. A row is ``reproduced`` when all its metrics are, ``below`` / ``above`` when every
metric off by more than that lies on the same side, else ``mixed``.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from hiertail_fast._files import folder_lock, replace_file_set
from hiertail_fast.experiments.paper_numbers import METRICS, Cell
from hiertail_fast.experiments.runner import code_key, code_text, code_version, fmt, summarize

__all__ = ["compare", "row_verdict", "comparison_rows", "markdown_table", "provenance",
           "write_outputs", "summary_runs", "SummaryKept"]

METRIC_NAMES = {"bacc": "bAcc", "macro_f1": "Macro-F1", "g_means": "G-Means", "acc": "Acc"}
NO_STD_TOLERANCE = 0.5
_BOUNDARY_SLACK = 1e-9      # far below the tables' 0.1-point resolution


def compare(ours: float, paper: Cell | None) -> dict | None:
    """{"diff", "diff_in_std" (None without a paper std), "verdict"}; None without a paper
    cell."""
    if paper is None:
        return None
    diff = ours - paper.mean
    # the boundary with a binary float's slack: 53.4 against 52.8 ± 0.6 is one std exactly,
    # but 53.4 - 52.8 is 0.6000000000000014 in floats ("above" before; an experiments audit)
    if paper.std:
        z = diff / paper.std
        ok = abs(z) <= 1.0 + _BOUNDARY_SLACK
    else:
        z, ok = None, abs(diff) <= NO_STD_TOLERANCE + _BOUNDARY_SLACK
    verdict = "reproduced" if ok else ("below" if diff < 0 else "above")
    return {"diff": diff, "diff_in_std": z, "verdict": verdict}


def row_verdict(comparisons: list[dict | None]) -> str:
    """One verdict for a table row from its metrics' comparisons with the paper (None: no
    paper value): "reproduced" when every one is, the one other verdict they share, else
    "mixed"; "no paper value" when none has one."""
    cs = [c for c in comparisons if c is not None]
    if not cs:
        return "no paper value"
    off = {c["verdict"] for c in cs} - {"reproduced"}
    if not off:
        return "reproduced"
    return off.pop() if len(off) == 1 else "mixed"


def comparison_rows(summary: dict, rows: list[tuple[str, str, str]], paper_lookup
                    ) -> list[dict]:
    """One JSON-able row per (dataset, row key, label) present in ``summary`` (runner.summarize);
    ``paper_lookup(dataset, row_key, metric)`` -> Cell | None."""
    out = []
    for dataset, row, label in rows:
        s = summary.get((dataset, row))
        if s is None:
            continue
        entry: dict[str, Any] = {"dataset": dataset, "row": row, "label": label, "n": s["n"],
                                 "seeds": s["seeds"], "metrics": {}}
        comps = []
        for m in METRICS:
            paper = paper_lookup(dataset, row, m)
            c = compare(s[m]["mean"], paper)
            comps.append(c)
            entry["metrics"][m] = {"ours": s[m], "paper": None if paper is None
                                   else {"mean": paper.mean, "std": paper.std},
                                   "comparison": c}
        entry["verdict"] = row_verdict(comps)
        entry["epochs_run"] = s["epochs_run"]
        entry["train_wall_s"] = s["wall_s"]
        out.append(entry)
    return out


def _diff_cell(c: dict | None) -> str:
    if c is None:
        return "–"
    if c["diff_in_std"] is None:
        return f"{c['diff']:+.1f} pt"
    return f"{c['diff_in_std']:+.1f}σ"


def comparison_report(records: list[dict], rows: list[tuple[str, str, str]], paper_lookup,
                      intro: str, expected_seeds: int):
    """(markdown body, JSON part, figures) of a table command: ``intro``, then the comparison
    table of ``rows`` (``comparison_rows``) against the paper's cells."""
    table = comparison_rows(summarize(records), rows, paper_lookup)
    return "\n".join([intro, "", markdown_table(table, expected_seeds)]), {"rows": table}, {}


def markdown_table(rows: list[dict], expected_seeds: int) -> str:
    """Per dataset a table: Method | seeds | per metric ours, paper, Δ (paper σ) | verdict."""
    head = ["Method", "seeds"]
    for m in METRICS:
        name = METRIC_NAMES[m]
        head += [f"{name} ours", f"{name} paper", f"{name} Δ"]
    head.append("verdict")
    out = []
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        out += [f"### {dataset}", "", "| " + " | ".join(head) + " |",
                "|" + "---|" * len(head)]
        for r in (r for r in rows if r["dataset"] == dataset):
            seeds = str(r["n"]) + ("" if r["n"] >= expected_seeds else f" of {expected_seeds}")
            cells = [r["label"], seeds]
            for m in METRICS:
                v = r["metrics"][m]
                p = v["paper"]
                cells += [fmt(v["ours"]["mean"], v["ours"]["std"]),
                          "–" if p is None else fmt(p["mean"], p["std"]),
                          _diff_cell(v["comparison"])]
            cells.append(r["verdict"])
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def runs_code(records: list[dict]) -> list[dict]:
    """The code versions the reported runs were trained at (cached runs are reused across code
    changes): [{"git_commit", "git_dirty", "package_version", "runs"}], most runs first (the
    package version only where a run has no commit: an installed copy)."""
    counts: dict[tuple, int] = {}
    for r in records:
        key = code_key(r)
        counts[key] = counts.get(key, 0) + 1
    return [{"git_commit": c, "git_dirty": d, "package_version": v, "runs": n}
            for (c, d, v), n in sorted(counts.items(), key=lambda kv: -kv[1])]


def runs_threads(records: list[dict]) -> dict[str, list]:
    """dataset -> the torch thread counts its reported runs trained with, sorted (None: a run
    recorded before its count was)."""
    out: dict[str, set] = {}
    for r in records:
        out.setdefault(r["spec"].dataset, set()).add(r.get("threads"))
    return {d: sorted(v, key=lambda t: (t is None, t or 0)) for d, v in sorted(out.items())}


def provenance(argv: list[str], budget, started: float, device: str,
               records: list[dict] = ()) -> dict:
    """What a summary records of how it was made: the command, the code version (and that
    of the cached runs behind it), machine, Python / torch versions, threads, device, the
    budget (seeds, epochs, patience, whether it is the full protocol), wall time and date."""
    import torch

    gpu = (torch.cuda.get_device_name(torch.device(device))
           if device.startswith("cuda") and torch.cuda.is_available() else None)
    return {
        "command": "python -m hiertail_fast.experiments " + shlex.join(argv),
        **code_version(),
        "runs_code": runs_code(list(records)),
        "runs_threads": runs_threads(list(records)),
        "machine": {"host": platform.node(), "platform": platform.platform(),
                    "processor": platform.processor() or platform.machine(),
                    "cpu_count": os.cpu_count(), "gpu": gpu},
        "python": sys.version.split()[0], "torch": torch.__version__,
        "threads": torch.get_num_threads(), "device": device,
        "seeds": list(budget.seeds), "epochs": budget.epochs, "patience": budget.patience,
        "full_protocol": budget.is_full,
        "wall_time_s": round(time.time() - started, 1),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def provenance_markdown(p: dict, trains: bool = True) -> str:
    m = p["machine"]
    budget = [f"- seeds {p['seeds']}, epochs ≤ {p['epochs']:,}, patience {p['patience']:,}"]
    return "\n".join([
        "Provenance:",
        f"- command: `{p['command']}`",
        f"- git commit: {code_text(code_key(p))}",
        *_runs_code_lines(p),
        f"- machine: {m['host']}, {m['platform']}, {m['cpu_count']} CPUs"
        + (f", GPU {m['gpu']}" if m["gpu"] else "") + f"; device {p['device']}"
        + _threads_text(p),
        f"- python {p['python']}, torch {p['torch']}",
        *(budget if trains else []),
        f"- wall time of this command: {p['wall_time_s']:.0f} s (cached runs are not retrained)",
        f"- date: {p['date']}",
    ])


def _threads_text(p: dict) -> str:
    """The runs' torch thread counts by dataset (the thread count changes the float sums, so
    the numbers); a dataset whose runs differ is marked. Summaries written before
    ``runs_threads`` existed give the command's count; one without a reported run says so
    (it gave the command's count, 2 for runs that all diverged at 1; an experiments audit)."""
    by_data = p.get("runs_threads")
    if by_data is None:
        return f", {p['threads']} torch thread(s)"
    if not by_data:
        return "; no run reported, so no runs' torch threads to name"
    parts = []
    for dataset, counts in by_data.items():
        text = " and ".join("?" if t is None else str(t) for t in counts)
        parts.append(f"{dataset} {text}" + (" (**mixed**: its runs' numbers depend on it)"
                                            if len(counts) > 1 else ""))
    return "; torch threads of the runs: " + ", ".join(parts)


def _runs_code_lines(p: dict) -> list[str]:
    """The runs' code versions, when any differs from this command's (summaries written
    before ``runs_code`` existed have none)."""
    versions = p.get("runs_code") or []
    here = code_key(p)
    if all(code_key(v) == here for v in versions):
        return []
    other = sum(v["runs"] for v in versions if code_key(v) != here)
    parts = [f"{code_text(code_key(v))} {v['runs']}" for v in versions]
    return [f"- **{other} of {sum(v['runs'] for v in versions)} runs were trained at another "
            "code version than this command's** (cached runs are reused across code changes; "
            "delete them to retrain): runs by commit: " + ", ".join(parts)]


class SummaryKept(Exception):
    """A summary was not replaced by one that holds fewer runs (``write_outputs``)."""


def summary_runs(payload: dict) -> int:
    """How many finished runs a summary holds: its ``runs`` entry, else (summaries written
    before it existed) the seeds of its rows."""
    if isinstance(payload.get("runs"), int):
        return payload["runs"]
    n = 0
    for r in payload.get("rows") or []:
        if isinstance(r, dict) and isinstance(r.get("n"), int):
            n += r["n"]
    for d in payload.get("datasets") or []:          # per-class
        for m in (d.get("methods") or {}).values() if isinstance(d, dict) else []:
            if isinstance(m, dict) and isinstance(m.get("seeds"), int):
                n += m["seeds"]
    return n


def _summary_files(out: Path, stem: str, payload: dict | None) -> dict[str, Path]:
    """suffix (".md", ".json", "-<figure>.png") -> path of a summary set written before."""
    files = {".md": out / f"{stem}.md", ".json": out / f"{stem}.json"}
    for name in (payload or {}).get("figures") or []:
        if isinstance(name, str) and name.startswith(f"{stem}-") and name.endswith(".png"):
            files[name[len(stem):]] = out / name
    return files


def _results_of(payload: dict) -> str:
    """A summary's content apart from when and where it was made: everything but the
    provenance (whose runs' code versions do count) and the figure names."""
    content = {k: v for k, v in payload.items() if k not in ("provenance", "figures")}
    content["runs_code"] = (payload.get("provenance") or {}).get("runs_code")
    return json.dumps(content, sort_keys=True, default=str)


def write_outputs(out: Path, stem: str, markdown: str, payload: dict,
                  figures: dict[str, Any] | None = None, log=print,
                  replace_fewer: bool = False, arg_defaults: dict | None = None) -> list[Path]:
    """Write ``<stem>.md``, ``<stem>.json`` and ``<stem>-<figure>.png`` under ``out``, atomically.

    A summary made by a command with other arguments (``payload["args"]``) is never replaced:
    this one then goes to ``<stem>-<hash of the args>.*`` and the log says so; nor one of the
    same arguments on other data (``payload["data_fingerprints"]``: another --data-dir, an
    edited file), then ``<stem>-<hash of the args and the data>.*``. The same arguments (and
    data) replace their own summary (more runs may be finished), the old set kept as
    ``<stem>.prev.*`` (one generation, the log says so); but never by a summary that holds
    fewer runs (``summary_runs``: e.g. --report-only over an empty or other --runs-dir):
    SummaryKept is raised and nothing is written, unless ``replace_fewer``. Every new file is
    complete (temporary files) before the old set is moved aside; a failure leaves it in place.
    ``arg_defaults``: each argument's value when not given; a summary recorded before an
    option existed (no entry for it) has the same arguments as a command that leaves it there.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # the name chosen and the set replaced as one step among processes (_files.folder_lock)
    with folder_lock(out):
        return _write_outputs(out, stem, markdown, payload, figures, log, replace_fewer,
                              arg_defaults or {})


def _same_args(old: object, new: object, defaults: dict) -> bool:
    """Whether a summary's recorded arguments ``old`` are those of ``new`` (JSON values), an
    argument ``old`` lacks counting as its default: an option added since (--feature-norm)
    made every older summary "other arguments", and a rerun of its recorded command wrote a
    hashed name beside it (seen rebuilding a committed summary, session 67)."""
    if old == new:
        return True
    if not isinstance(old, dict) or not isinstance(new, dict) or set(old) - set(new):
        return False
    plain = json.loads(json.dumps(defaults, default=str))
    return all(old[k] == v if k in old else (k in plain and plain[k] == v)
               for k, v in new.items())


def _write_outputs(out: Path, stem: str, markdown: str, payload: dict, figures, log,
                   replace_fewer: bool, arg_defaults: dict) -> list[Path]:
    new_args = json.loads(json.dumps(payload.get("args"), default=str))
    args_key = json.dumps(payload.get("args"), sort_keys=True, default=str)
    data = payload.get("data_fingerprints")
    data_key = json.dumps(data, sort_keys=True)
    # candidates in turn: the plain stem, the stem hashed by the arguments (a summary of other
    # arguments is there), by the arguments and the data (a summary of the same arguments on
    # other data — another --data-dir, a replaced file — is there: it was replaced; a README
    # audit); the first that is free or holds this command's arguments and data is taken
    candidates = [stem, f"{stem}-{hashlib.sha256(args_key.encode()).hexdigest()[:8]}",
                  f"{stem}-{hashlib.sha256((args_key + data_key).encode()).hexdigest()[:8]}"]
    old: dict | None = None
    unreadable = None       # (stem, path, error) of the first summary .json that cannot be read
    for i, cand in enumerate(candidates):
        existing = out / f"{cand}.json"
        if not existing.is_file():
            old = None
        else:
            try:
                old = json.loads(existing.read_text())
                if not isinstance(old, dict):
                    raise ValueError(f"a JSON {type(old).__name__}, not an object")
            except (OSError, ValueError) as exc:
                # whose it is cannot be known: this command's own summary may be further on
                # (it was read as {}, "other arguments", and when it was this command's, every
                # later run wrote to a hashed name beside the stale .md; an experiments audit)
                unreadable = unreadable or (cand, existing, exc)
                old = None
                if i + 1 < len(candidates):
                    continue
                stem = cand
                break
            same_args = _same_args(old.get("args"), new_args, arg_defaults)
            old_data = old.get("data_fingerprints")
            same_data = old_data is None or data is None or old_data == data
            if (not same_args or not same_data) and i + 1 < len(candidates):
                what = "other arguments" if not same_args else "other data"
                log(f"{existing} comes from {what}; kept. This command writes "
                    f"{candidates[i + 1]}.*")
                continue
        stem = cand
        break
    if unreadable is not None:
        cand, existing, exc = unreadable
        if old is not None:         # this command's own summary, found further on
            log(f"{existing} cannot be read as a summary ({exc}); kept")
        elif not replace_fewer:     # none found further on: the unreadable one may be it
            raise SummaryKept(
                f"{existing} cannot be read as a summary ({exc}), and it may be this "
                f"command's; it is kept: move it and its .md / .png away, or pass "
                f"--replace-summary to replace it (it is then kept as {cand}.prev.*)") from exc
        else:
            stem, old = cand, {}
    if old is not None and not replace_fewer:
        had, has = summary_runs(old), summary_runs(payload)
        if has < had:
            raise SummaryKept(
                f"{out / stem}.md holds {had} finished run(s), this summary {has}: not replaced "
                "(pass --replace-summary to replace it; the old one is then kept as "
                f"{stem}.prev.*)")
    payload.setdefault("runs", summary_runs(payload))
    writers = {f"{stem}-{name}.png": (lambda p, fig=fig: fig.savefig(
        p, format="png", dpi=110, bbox_inches="tight")) for name, fig in (figures or {}).items()}
    missing = [name for name in (f"{stem}.md", *writers) if not (out / name).is_file()]
    if old is not None and _results_of(payload) == _results_of(old) and not missing:
        # the same results (e.g. --report-only over the same runs): rewriting would only move
        # the previous summary out of .prev.* for a copy of this one. (Not when a file of the
        # set is gone: a deleted .md or figure was never written again, and the log said it
        # was there; an experiments audit)
        log(f"{out / stem}.md already holds these results; left as it is")
        return []
    payload.setdefault("figures", []).extend(writers)
    writers[f"{stem}.md"] = lambda p: p.write_text(markdown)
    writers[f"{stem}.json"] = lambda p: p.write_text(
        json.dumps(payload, indent=1, default=str) + "\n")
    before = [p.name for p in _summary_files(out, stem, old).values()]
    older = [p.name for p in (*out.glob(f"{glob.escape(stem)}.prev.*"),
                              *out.glob(f"{glob.escape(stem)}.prev-*.png"))]
    written, kept = replace_file_set(
        out, writers, before, lambda name: f"{stem}.prev{name[len(stem):]}", older=older)
    if kept:
        log(f"the previous summary is kept as {', '.join(p.name for p in kept)}")
    return written
