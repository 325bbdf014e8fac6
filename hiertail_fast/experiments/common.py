"""What every experiment module receives (`Context`) and the configurations it builds: HierTail's
``paper`` / ``official`` presets with the paper's hidden size per dataset, and every baseline of
the harness's registry (``hiertail_fast.baselines.METHODS``, read at call time, so methods added
to the registry later are picked up without a change here)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from hiertail_fast.experiments.runner import SMALL_HIDDEN, Budget, DataSource, RunCache

__all__ = ["Context", "hiertail_config", "baseline_names", "baseline_config", "HIERTAIL_ROWS",
           "check_distinct"]

# row key -> HierTail preset; the row keys of Tables 2 / 3 for our two configurations
HIERTAIL_ROWS = {"hiertail_paper": "paper", "hiertail_official": "official"}


@dataclass
class Context:
    args: argparse.Namespace
    budget: Budget
    source: DataSource
    cache: RunCache
    datasets: list[str]
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)   # lines for the markdown (skipped rows, ...)

    def paper_lookup(self, lookup):
        """``lookup(dataset, row, metric)`` (-> the paper's Cell or None) with no paper cell for
        a dataset that is not the paper's graph: a user's own graph saved under a paper name
        (a 266-node, 3-class ``email.npz``) was compared with the paper's row, "+3.0σ above"
        (an experiments audit). Each such dataset gets a note."""
        foreign = {}
        for d in self.datasets:
            why = _not_the_papers_graph(self.source.load(d), d)
            if why:
                foreign[d] = why
                self.notes.append(f"- {d}: not the paper's graph ({why}): not compared with "
                                  f"the paper")
        return lambda d, r, m: None if d in foreign else lookup(d, r, m)


def _not_the_papers_graph(data, dataset: str) -> str | None:
    """How a dataset's graph differs from the paper's Table 1 in nodes, features or classes
    (None: it does not, or the paper has no such dataset)."""
    from hiertail_fast.experiments.paper_numbers import TABLE1_DATASETS

    paper = TABLE1_DATASETS.get(dataset)
    if paper is None:
        return None
    ours = {"nodes": int(data.x.shape[0]), "features": int(data.x.shape[1]),
            "classes": int(data.num_classes)}
    diffs = [f"{k} {v:,} vs {int(paper[k]):,}" for k, v in ours.items() if v != paper[k]]
    return ", ".join(diffs) or None


def check_distinct(option: str, values: list) -> None:
    """ValueError naming the first value given twice: a repeated entry would train / count the
    same runs twice (duplicate rows, a std over copies)."""
    seen = set()
    for v in values:
        if v in seen:
            raise ValueError(f"{option}: {v} is given twice (each value must appear once)")
        seen.add(v)


def _hidden(args, dataset: str, default: int | None) -> int | None:
    if getattr(args, "hidden", None) is not None:
        return args.hidden
    return default


def hiertail_config(preset: str, dataset: str, args, **overrides):
    """``HierTailConfig.named(preset)`` with the paper's hidden size (64 on Email / Wiki /
    BlogCatalog, else the preset's 128; the official preset keeps the code's 128) and the
    command's --hidden / --lr overrides."""
    from hiertail_fast.nn.hiertail_config import HierTailConfig

    over = dict(overrides)
    hidden = _hidden(args, dataset, SMALL_HIDDEN.get(dataset) if preset == "paper" else None)
    if hidden is not None and "hidden" not in over:
        over["hidden"] = hidden
    if getattr(args, "lr", None) is not None and "lr" not in over:
        over["lr"] = args.lr
    return HierTailConfig.named(preset, **over)


def baseline_names() -> list[str]:
    """Every method of the baselines' registry, in registry order."""
    from hiertail_fast.baselines import METHODS
    return list(METHODS)


# A method's official per-dataset settings beyond the hidden size: LTE4G's Cora-Full script
# runs classifier_og as a Linear layer (PROTOCOL_AND_BASELINES.md §2.11, "Defaults (Cora-Full
# script): cls_og MLP"); every other (method, dataset) keeps the method's defaults.
DATASET_SETTINGS = {("lte4g", "cora_full"): {"classifier": "mlp"}}


def baseline_config(method: str, dataset: str, args):
    """The baseline's default config with the paper's hidden size (64 on Email / Wiki /
    BlogCatalog, 128 elsewhere), its official per-dataset settings (``DATASET_SETTINGS``) and
    the command's --hidden / --lr / --adj-norm overrides."""
    from hiertail_fast.baselines import BaselineConfig
    from hiertail_fast.baselines.config import METHOD_FIELDS

    over = {"hidden": _hidden(args, dataset, SMALL_HIDDEN.get(dataset, 128)),
            **DATASET_SETTINGS.get((method, dataset), {})}
    if getattr(args, "lr", None) is not None:
        over["lr"] = args.lr
    if getattr(args, "adj_norm", None) is not None and "adj_norm" in METHOD_FIELDS[method]:
        over["adj_norm"] = args.adj_norm     # (graphens, imgagn: their own aggregation)
    return BaselineConfig(method=method, **over)
