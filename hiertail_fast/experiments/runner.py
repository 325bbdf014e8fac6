"""The shared runner of the experiments: budgets, run specs and the loop that trains whatever the
per-run cache (``run_cache``, resume) does not hold yet, on the graphs of a ``data_source``.

A run is one (dataset, split, method, configuration, seed) under one budget (epochs, patience)
on one device type. Its result is written, atomically, to its own file under the runs folder as
soon as it finishes (``<runs>/<dataset>/<method>-<hash>-s<seed>.json``). A run whose file
exists is never recomputed (the same run in two rows or two experiments is trained once), so an
interrupted command resumes where it stopped, two commands can share a runs folder, and nothing
a previous command computed is lost (the misses below keep or report what they replace).
Stopping the process (SIGSTOP / SIGCONT, or killing it) loses at most the run in progress. While
a run trains, its command holds a claim on it (an flock on ``.<run file stem>.training`` beside
the file, removed when done): another command sharing the runs folder leaves that run for the
end of its own list, then waits for it and reads it from the cache (or trains it, if the
claimant stopped without finishing it), so commands whose seeds overlap split the runs instead
of training them twice; running the same command twice uses two cores. A command killed
outright (SIGKILL, SIGTERM) leaves its claim file behind, unlocked: harmless, the next command
to train that run takes it over and removes it.

The identity that names a run's file holds the data's shape (nodes, edges, features, classes and
a non-default --feature-norm), not its content: two graphs of the same shape share file names.
Each record therefore also carries ``data_fingerprint`` (function `data_fingerprint`: sha256 of
x, edge_index and y as the run sees them, after loading and feature normalisation, and for the
semi-synthetic split of the graph made from them: `DataSource.run_fingerprint`), and a cached
record whose fingerprint differs from this command's data is a miss: the run is retrained and
stdout says so; the old record is moved beside the new one as ``<name>.data-<its fingerprint>
.json`` (`RunCache.put`) and served again when that data comes back. A cached file that cannot
be read (truncated, corrupt) is a miss too, with a warning naming it, and the only file a new
run replaces. Records written before the fingerprint existed have none and are still reused on
their shape alone; ``python -m hiertail_fast.experiments.migrate_fingerprints RUNS`` adds the
fingerprint of the data they were run on (hiertail_fast/experiments/migrate_fingerprints.py),
as was done for the committed reproduction cache (docs/results/experiments/runs).
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hiertail_fast._protocol import EPOCHS, METRICS, OFFICIAL_SEEDS, PAPER_HIDDEN, PATIENCE
from hiertail_fast.experiments.data_source import SYNTHETIC_DEGREE, DataSource  # noqa: F401
from hiertail_fast.experiments.run_cache import (  # noqa: F401  (this module's names too)
    OTHER_DATA,
    RunCache,
    _is_run_record,
    _json_default,
    code_key,
    code_text,
    code_version,
    data_fingerprint,
    git,
)

__all__ = ["Budget", "RunSpec", "DataSource", "RunCache", "run_specs", "summarize",
           "data_fingerprint", "FULL_SEEDS", "FULL_EPOCHS", "FULL_PATIENCE", "QUICK"]

FULL_SEEDS = OFFICIAL_SEEDS     # the official 123..132
FULL_EPOCHS, FULL_PATIENCE = EPOCHS, PATIENCE
QUICK = {"seeds": 3, "epochs": 300, "patience": 100}
SMALL_HIDDEN = PAPER_HIDDEN     # 64 on Email, Wiki, BlogCatalog; 128 on the other paper datasets


@dataclass(frozen=True)
class Budget:
    """Seeds, the epoch limit and the early-stopping patience of every run of a command."""

    seeds: tuple[int, ...] = FULL_SEEDS
    epochs: int = FULL_EPOCHS
    patience: int = FULL_PATIENCE

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ValueError("a budget needs at least one seed")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct, got {list(self.seeds)}")
        if self.epochs < 1 or self.patience < 0:
            raise ValueError(f"need epochs >= 1 and patience >= 0, got {self.epochs}, "
                             f"{self.patience}")

    @property
    def is_full(self) -> bool:
        return (self.seeds == FULL_SEEDS and self.epochs == FULL_EPOCHS
                and self.patience == FULL_PATIENCE)

    def describe(self) -> str:
        return (f"{self.seed_text()} × ≤ {self.epochs:,} epochs, patience {self.patience:,}")

    def seed_text(self) -> str:
        """'10 seeds (123..132)' for a run of consecutive seeds, '1 seed (127)', else the
        list ('3 seeds (1, 2, 5)'; "1..5" read as five seeds), the first 8 of a long one."""
        s, n = self.seeds, len(self.seeds)
        if n == 1:
            return f"1 seed ({s[0]})"
        if list(s) == list(range(s[0], s[0] + n)):
            return f"{n} seeds ({s[0]}..{s[-1]})"
        listed = ", ".join(map(str, s[:8])) + (", …" if n > 8 else "")
        return f"{n} seeds ({listed})"

    def header(self) -> str:
        """The budget line every table starts with; a reduced budget says so."""
        if self.is_full:
            return f"Budget: the full protocol, {self.describe()}."
        return (f"**REDUCED BUDGET: {self.describe()}** (the paper: 10 seeds × ≤ 10,000 epochs, "
                "patience 1,000). These numbers are not the protocol's; compare with care.")

    def tag(self) -> str:
        """'' for the full protocol, else a file-name suffix naming the budget."""
        if self.is_full:
            return ""
        return f"-s{len(self.seeds)}-e{self.epochs}-p{self.patience}"


@dataclass(frozen=True)
class RunSpec:
    """One row of a table on one dataset: a method and its configuration (seeds come from the
    budget). ``split``: ("natural",) or ("semi_lt", alpha, val, test, alignment_bug)."""

    dataset: str
    row: str
    method: str                      # "hiertail" or a baseline name
    config: Any                      # HierTailConfig | BaselineConfig
    split: tuple = ("natural",)
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def identity(self, seed: int, budget: Budget, device_type: str, data_key: dict) -> dict:
        return {"dataset": self.dataset, "data": data_key, "split": list(self.split),
                "method": self.method, "config": self.config.to_dict(), "seed": int(seed),
                "epochs": budget.epochs, "patience": budget.patience, "device": device_type}


def _train(spec: RunSpec, data, split, graph, seed: int, budget: Budget, device: str) -> dict:
    kw = dict(epochs=budget.epochs, patience=budget.patience, seed=seed, device=device,
              graph=graph, progress=False)
    if spec.method == "hiertail":
        from hiertail_fast.train import train_hiertail
        return train_hiertail(data, split, spec.config, **kw)
    from hiertail_fast.baselines.harness import train_baseline
    return train_baseline(data, split, spec.config, **kw)


def run_specs(specs: list[RunSpec], budget: Budget, source: DataSource, cache: RunCache, *,
              device: str = "cpu", progress: bool = True, log=None,
              train: bool = True, notice=None, notes: list | None = None,
              threads=None) -> list[dict]:
    """Every (spec, seed) of the budget: the cached record, or train, record and cache it
    (``train=False``: only the cached records; the missing ones are counted in the log).
    A run that diverges (``TrainingDivergedError``: a non-finite loss, typically a too-high lr)
    is an outcome, cached as a record with ``diverged`` (its message) and no result, so a
    resumed command does not train it again (it stopped every command at that run, forever);
    it is left out of the returned records (the row counts one seed fewer) and said in the log
    and in ``notes`` (the summary's notes).
    A cached file that is unreadable or holds a run on other data (``RunCache.lookup``) is a
    miss, said by ``notice`` (default: stdout). ``threads(dataset)``: the torch thread count
    a run on that dataset trains with (None: as it is), so a run's numbers depend on its own
    dataset alone (the thread count changes the float sums), not on which other datasets the
    command names; torch's own count is as it was when this returns. A cached run trained at
    another count than ``threads`` gives is reused, said once per dataset by ``notice`` (the
    count is not part of a run's identity: its numbers differ in the last bits). Returns the
    records in spec order, seeds in budget order."""
    from hiertail_fast._threads import thread_count_kept

    with thread_count_kept():       # (it stayed at the last run's count; an audit)
        return _run_specs(specs, budget, source, cache, device=device, progress=progress,
                          log=log, train=train, notice=notice, notes=notes, threads=threads)


def _run_specs(specs, budget, source, cache, *, device, progress, log, train, notice, notes,
               threads) -> list[dict]:
    import torch

    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    notice = notice or (lambda line: print(line, flush=True))
    code_version()                   # the commit at the start, not after later edits
    device_type = torch.device(device).type
    todo = [(s, seed) for s in specs for seed in budget.seeds]
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(todo), desc="runs", dynamic_ncols=True)
    done: dict[int, dict] = {}
    missing, deferred = [], []
    told_threads: set[str] = set()

    def cached(spec, identity, fingerprint) -> dict | None:
        record, problem = cache.lookup(spec, identity, fingerprint)
        if problem:
            # (the other data's run is kept beside it only for a fingerprint mismatch; an
            # unreadable or incomplete file is simply replaced)
            kept = (" (that run is kept beside it, as <name>.data-<its fingerprint>.json)"
                    if OTHER_DATA in problem else "")
            notice(problem + (f"; retraining it{kept}" if train
                              else " (--report-only: not reported)"))
        return record

    def trained(i, spec, seed, identity, fingerprint) -> dict:
        from hiertail_fast.train import TrainingDivergedError

        data, split, graph = source.run_inputs(spec, seed)
        count = threads(spec.dataset) if threads is not None else None
        if count is not None:
            torch.set_num_threads(count)
        t0 = time.perf_counter()
        try:
            result, diverged = _train(spec, data, split, graph, seed, budget, device), None
        except TrainingDivergedError as exc:
            result, diverged = None, str(exc)
        record = {"identity": identity, "data_fingerprint": fingerprint, "row": spec.row,
                  "result": result, **({"diverged": diverged} if diverged else {}),
                  "wall_s": time.perf_counter() - t0,
                  "threads": torch.get_num_threads(), **code_version(),
                  "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        cache.put(spec, identity, record)
        if result is not None:
            t = result["test"]
            log(f"[{i + 1}/{len(todo)}] {spec.dataset} {spec.row} seed {seed}: bAcc "
                f"{100 * t['bacc']:.1f} Macro-F1 {100 * t['macro_f1']:.1f} | "
                f"{result['epochs_run']} epochs, {record['wall_s']:.0f} s")
        return record

    def finish(i, spec, seed, record) -> None:
        if record.get("diverged"):
            line = f"{spec.dataset} / {spec.row} seed {seed} diverged: {record['diverged']}"
            log(f"[{i + 1}/{len(todo)}] {line}")
            if notes is not None:
                notes.append(f"- {line} (left out of the row)")
        else:
            done[i] = dict(record, spec=spec)
        if bar is not None:
            bar.update(1)

    def attempt(i, spec, seed, wait: bool) -> None:
        identity = spec.identity(seed, budget, device_type, source.data_key(spec.dataset))
        fingerprint = source.run_fingerprint(spec)
        record = cached(spec, identity, fingerprint)
        if record is None and not train:
            missing.append(f"{spec.dataset} {spec.row} seed {seed}")
            return
        if record is not None and threads is not None and spec.dataset not in told_threads:
            asked, ran = threads(spec.dataset), record.get("threads")
            if isinstance(ran, int) and ran != asked:
                told_threads.add(spec.dataset)
                notice(f"{spec.dataset}: reusing cached runs trained on {ran} torch threads "
                       f"(this command would train on {asked}; the thread count changes the "
                       f"last bits of the float sums, and is not part of a run's identity: "
                       f"move or delete the runs to retrain them)")
        if record is None:
            # A run another command (sharing --runs-dir) is training now is left for the end
            # of this command's list, then waited for and read from the cache: commands whose
            # seeds overlap share the runs instead of training them twice side by side.
            if wait:
                notice(f"waiting for another command to finish {spec.dataset} {spec.row} "
                       f"seed {seed} (it trains it in {cache.path(spec, identity).parent})")
            with cache.claim(spec, identity, wait=wait) as held:
                if not held:
                    notice(f"{spec.dataset} {spec.row} seed {seed}: another command is "
                           "training it; coming back to it after this command's other runs")
                    deferred.append((i, spec, seed))
                    return
                # (read again under the claim: another command may have finished it since)
                record = cache.lookup(spec, identity, fingerprint)[0]
                if record is None:
                    record = trained(i, spec, seed, identity, fingerprint)
        finish(i, spec, seed, record)

    for i, (spec, seed) in enumerate(todo):
        attempt(i, spec, seed, wait=False)
    for i, spec, seed in list(deferred):
        attempt(i, spec, seed, wait=True)
    if bar is not None:
        bar.close()
    if missing:
        log(f"{len(missing)} of {len(todo)} runs are not cached and were not trained "
            f"(--report-only): {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
    return [done[i] for i in sorted(done)]


def summarize(records: list[dict]) -> dict[tuple[str, str], dict]:
    """(dataset, row) -> {"n", "seeds", metric: {"mean", "std"} ×100, "epochs_run",
    "wall_s"}; population std over seeds, as the paper."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["spec"].dataset, r["spec"].row), []).append(r)
    out = {}
    for key, rs in groups.items():
        s: dict[str, Any] = {"n": len(rs), "seeds": [r["identity"]["seed"] for r in rs]}
        for m in METRICS:
            v = np.array([100 * r["result"]["test"][m] for r in rs])
            s[m] = {"mean": float(v.mean()), "std": float(v.std())}
        s["epochs_run"] = [r["result"]["epochs_run"] for r in rs]
        s["wall_s"] = float(sum(r["wall_s"] for r in rs))
        out[key] = s
    return out


def fmt(mean: float, std: float | None) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    return f"{mean:.1f}" if std is None else f"{mean:.1f} ± {std:.1f}"
