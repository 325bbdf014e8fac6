"""Reproduce the paper: one command per table and figure.

``python -m hiertail_fast.experiments NAME [options]`` with NAME one of

=================  ===========================================================================
datasets           Table 1, dataset statistics beside the paper's
main               Table 2, HierTail (paper / official configs) and every registered baseline
ablation           Table 4, M1 + M2 + L_CE, M1 + L_CE, L_CE only
tasks              Table 5, the number of tasks in the second (and third) layer
sensitivity        the hyper-parameter figures: γ × τ heatmap; activation, hidden, dropout lines
per-class          the per-class bAcc figure, GCN (Origin) vs HierTail, classes by frequency
semi-synthetic     Table 3's protocol (manual long-tail split, α = 0.8, 25 / 55 per class)
=================  ===========================================================================

Each writes ``<out>/<name>[-budget].md`` and ``.json`` (+ ``.png`` for figures; ``--out``,
default ``results/<name>/``) with the command, git commit, machine, torch, seeds, epochs and
wall time. The full protocol (10 seeds × ≤ 10,000 epochs, patience 1,000) is the default;
``--quick`` and ``--seeds / --epochs / --patience`` reduce it and the table says so. Finished
runs are cached one file each under ``--runs-dir`` (default ``<out>/runs``) and never recomputed
(unless the file is unreadable or the run was made from other data of the same shape: runner).
A summary is replaced only by one from the same arguments holding at least as many runs, the old
one kept as ``<name>[-budget].prev.*`` (``--replace-summary`` overrides; report.write_outputs).
``python -m hiertail_fast.experiments.migrate_fingerprints RUNS`` (maintenance) adds the data
fingerprint to runs cached before it existed.
The modules: ``runner`` (budgets, cache, loop), ``report`` (tables, verdicts, provenance),
``paper_numbers`` (the paper's values, transcribed once), one module per experiment, ``cli``.
"""
from __future__ import annotations

# experiment name -> module (imported by the CLI when that experiment runs)
EXPERIMENTS = {
    "datasets": "hiertail_fast.experiments.datasets_table",
    "main": "hiertail_fast.experiments.main_table",
    "ablation": "hiertail_fast.experiments.ablation",
    "tasks": "hiertail_fast.experiments.tasks",
    "sensitivity": "hiertail_fast.experiments.sensitivity",
    "per-class": "hiertail_fast.experiments.per_class",
    "semi-synthetic": "hiertail_fast.experiments.semi_synthetic",
}

__all__ = ["EXPERIMENTS"]
