"""Lean HierTail training loop with the official protocol (PROTOCOL_AND_BASELINES.md §1.2-1.4).

Per epoch: one full-graph train step (Adam, weight decay), then an eval-mode forward under
``torch.no_grad()`` and the validation Macro-F1. Model selection as the official harness:

- ``max_idx`` = the FIRST epoch reaching the maximum val-F1 (the patience counter starts there);
  early stop when ``epoch - max_idx > patience``;
- the best model = the LAST epoch reaching the maximum (ties update), whose eval-mode forward on
  the test nodes gives the reported acc / bAcc / Macro-F1 / G-Means.

Several seeds: each seeds Python/NumPy/torch, redoes the natural split with that seed (unless a
fixed user split is given) and builds a fresh model; the summary is mean ± population std
(``numpy.std``). Results always carry the config name and every hyper-parameter.

CLI (options and `main` in hiertail_fast/_train_cli.py, which drives this module; the process
entry is hiertail_fast/__main__.py)::

    python -m hiertail_fast.train --data ../shared/data/email.npz --config paper --seeds 3
    python -m hiertail_fast.train --synthetic --nodes 2000 --classes 20 --epochs 200 --json out.json
"""
from __future__ import annotations

if __name__ == "__main__":
    # `python -m hiertail_fast.train`: hand over to the CLI entry BEFORE torch is imported below
    # (it sets the OpenMP wait policy, which OpenMP reads when torch loads it).
    import sys

    from hiertail_fast.__main__ import main as _entry

    sys.exit(_entry(prog="python -m hiertail_fast.train"))

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from hiertail_fast._fit import (  # noqa: F401  (re-exported: the public names live on here)
    FitResult,
    TrainingDivergedError,
    _progress,
    fit_early_stopping,
    fit_record,
    per_class_recall,
    predicted_classes,
)
from hiertail_fast._protocol import (  # noqa: F401  (METRICS, METRIC_NAMES: this module's names)
    EPOCHS,
    METRIC_NAMES,
    METRICS,
    OFFICIAL_SEEDS,
    PAPER_HIDDEN,
    PATIENCE,
)
from hiertail_fast._validation import (
    check_classes,
    check_device,
    check_epochs_patience,
    check_finite_number,
    check_flag,
    check_num_classes,
    check_seed,
)
from hiertail_fast.data.io import GraphData, check_graph_arrays, open_npz
from hiertail_fast.data.pyg import as_graph_data
from hiertail_fast.data.splits import (
    SPLIT_PARTS,
    natural_split,
    split_part_names,
    user_split,
)
from hiertail_fast.graph import CSRGraph
from hiertail_fast.metrics import evaluate, macro_f1
from hiertail_fast.nn.hiertail import HierTail, HierTailConfig, prepare_graph

__all__ = ["train_hiertail", "run_seeds", "seed_everything", "DEFAULT_SEEDS",
           "TrainingDivergedError"]

DEFAULT_SEEDS = OFFICIAL_SEEDS       # the official 123..132 (the public name)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation failure, which the command lines report in one line (a
    run's outcome, not a bug): numpy's MemoryError ("Unable to allocate 146. TiB" for
    --features 10**12), torch's OutOfMemoryError (CUDA) or its CPU allocator's RuntimeError
    ("can't allocate memory"). Any other RuntimeError is not."""
    return (isinstance(exc, MemoryError)
            or isinstance(exc, torch.cuda.OutOfMemoryError)     # (torch.OutOfMemoryError)
            or (isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)))


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's (``seed mod 2^32``) and torch's global generators (all
    devices) with ``seed``, an int in [0, 2**64 - 1] (``check_seed``: TypeError / ValueError
    before any generator is touched; "3", 1.5, None and 2**64 failed inside one of them after
    Python's was reseeded: an API audit)."""
    seed = check_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _split_parts(split: Any, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train, val, test) int64 index tensors from a tuple, a dict or an object with fields
    (``train`` / ``train_idx`` / ``train_mask``, ...): index arrays or boolean masks, checked
    by `user_split` (ids in range, none repeated within a set: a repeated test node counted
    twice in the metrics), none empty."""
    if isinstance(split, (tuple, list)):
        parts = list(split)
    else:
        # a dict or an object with fields, named as in a split file (split_part_names)
        get = split.get if isinstance(split, dict) else lambda key: getattr(split, key, None)
        parts = [None if name is None else get(name)
                 for name in split_part_names(lambda key: get(key) is not None)]
    if len(parts) != 3 or any(p is None for p in parts):
        raise ValueError("split must provide train, val and test index arrays")
    try:
        out = user_split(num_nodes, *parts)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"split: {exc}") from None
    for name, t in zip(("train", "val", "test"), out, strict=True):
        if not t.numel():               # an all-False mask
            raise ValueError(f"split[{name!r}] is empty")
    return out


def load_split(path: str | Path) -> dict[str, np.ndarray]:
    """A user split file: ``.npz`` with arrays ``train``, ``val``, ``test`` (or
    ``train_idx``, ... or PyG's ``train_mask``, ...): node ids, or boolean masks over the
    nodes (`user_split` checks them). One name per part: a file holding two (``train`` and
    ``train_mask``) is refused, as which one is meant is unknown."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"split file not found: {p}")
    with open_npz(p, "a split .npz file") as z:
        out = {}
        for k, key in zip(SPLIT_PARTS, split_part_names(z.files.__contains__, str(p)),
                          strict=True):
            if key is None:
                raise ValueError(f"{p}: missing array {k!r} (or {k}_idx, {k}_mask); has "
                                 f"{sorted(z.files)}")
            try:
                out[k] = np.asarray(z[key])
            except Exception as exc:      # an object array (never unpickled), a corrupt member
                raise ValueError(f"{p}: cannot decode array {key!r} (a corrupt member, or an "
                                 "object array, which would need unsafe unpickling and is never "
                                 f"loaded; {type(exc).__name__})") from None
    return out


def train_hiertail(
    data: GraphData,
    split: Any = None,
    config: HierTailConfig | None = None,
    *,
    epochs: int = EPOCHS,
    patience: int = PATIENCE,
    seed: int | None = None,
    device: str | torch.device = "cpu",
    graph=None,
    progress: bool = True,
    lr: float | None = None,
    weight_decay: float | None = None,
) -> dict:
    """Train one HierTail model; return the best-epoch metrics (fractions, not ×100).

    Args:
        data: graph with ``edge_index`` [2, E], ``x`` [n, F], ``y`` [n], ``num_classes``, or a
            PyG ``Data`` (x, edge_index, y, optional edge_weight and masks). Training runs in
            float32 whatever x's dtype (``prepare_run`` casts the features, as the official
            harness trains).
        split: (train, val, test) indices (tuple, dict or object with those fields); None: the
            ``Data``'s train/val/test masks, else the natural split drawn with ``seed``.
        config: model/loss config (default ``HierTailConfig.paper()``); lr / weight_decay come
            from it unless given here.
        epochs, patience: at most ``epochs`` epochs; stop when epoch − max_idx > patience.
        seed: seeds Python/NumPy/torch before the model is built (None: leave the RNG as is).
        graph: a prepared ``CSRGraph`` of ``data`` (``prepare_graph``) to skip re-preparing it.
    Returns:
        dict with ``test`` / ``val`` metric dicts, ``best_epoch`` (last epoch at the max val-F1),
        ``max_idx`` (first such epoch), ``epochs_run``, ``stopped_early``, timings (seconds),
        ``pool_sizes`` and ``final_loss`` parts.
    """
    cfg = _check_config(config)
    epochs, patience = check_epochs_patience(epochs, patience)   # as train_baseline
    check_flag(progress, "progress")
    # as floats (a NumPy scalar or 0-d tensor went into the result as given: not JSON)
    lr = cfg.lr if lr is None else check_finite_number(lr, "lr")
    weight_decay = (cfg.weight_decay if weight_decay is None
                    else check_finite_number(weight_decay, "weight_decay"))
    if not lr > 0:
        raise ValueError(f"lr must be finite and > 0, got {lr}")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be finite and >= 0, got {weight_decay}")
    run = prepare_run(data, split, seed, device, graph)
    data, x, y, graph = run.data, run.x, run.y, run.graph
    train_idx, val_idx, test_idx, device = run.train_idx, run.val_idx, run.test_idx, run.device
    n = int(data.y.shape[0])

    # in the features' dtype (float32: prepare_run casts them), not torch's default one
    # (set_default_dtype(float64): the model came out float64 against float32 features, a
    # TypeError at the first layer)
    model = HierTail(x.shape[1], int(data.num_classes), cfg).to(device=device, dtype=x.dtype)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    y_val, y_test = y[val_idx].cpu(), y[test_idx].cpu()

    def step():
        loss = model.loss(model(x, graph), y, train_idx)
        return loss, loss.total

    fit = fit_early_stopping(model, opt, step, lambda: _eval_val(model, x, graph, val_idx, y_val),
                             epochs=epochs, patience=patience, progress=progress,
                             desc=f"{cfg.name} seed={seed}", device=device)
    model.load_state_dict(fit.best_state)
    model.eval()
    with torch.no_grad():       # (the state the validation pass found finite)
        pred = predicted_classes(model(x, graph).logits).cpu()
    test_idx_c, val_idx_c = test_idx.cpu(), val_idx.cpu()
    return {
        "seed": seed,
        "config_name": cfg.name,
        "test": evaluate(y_test, pred[test_idx_c]),
        "val": evaluate(y_val, pred[val_idx_c]),
        "test_per_class": per_class_recall(y_test, pred[test_idx_c], int(data.num_classes)),
        **fit_record(fit),
        "pool_sizes": cfg.pool_sizes(n, int(data.num_classes)),
        "final_loss": fit.last_loss.as_floats(),
        "lr": lr,
        "weight_decay": weight_decay,
    }


def _check_config(config: Any) -> HierTailConfig:
    """``config`` or the paper preset; a TypeError unless it is a HierTailConfig (a dict or a
    preset's name failed later with an AttributeError)."""
    cfg = config if config is not None else HierTailConfig.paper()
    if not isinstance(cfg, HierTailConfig):
        hint = (f" (use HierTailConfig.named({cfg!r}))" if isinstance(cfg, str)
                else " (use HierTailConfig(**d))" if isinstance(cfg, dict) else "")
        raise TypeError(f"config must be a HierTailConfig, got {type(cfg).__name__}{hint}")
    return cfg


@dataclass
class RunInputs:
    """One training run's inputs on its device (`prepare_run`)."""

    data: GraphData
    x: torch.Tensor
    y: torch.Tensor
    graph: Any
    train_idx: torch.Tensor
    val_idx: torch.Tensor
    test_idx: torch.Tensor
    device: torch.device


def prepare_run(data: Any, split: Any, seed: int | None, device: str | torch.device,
                graph=None) -> RunInputs:
    """The protocol's set-up, shared by HierTail and the baselines: seed everything, the split
    (given, the ``Data``'s masks, or the natural split drawn with ``seed``; indices checked),
    features / labels / the prepared graph on ``device``."""
    seed = None if seed is None else check_seed(seed)
    device = check_device(device)
    data, split = as_graph_data(data, split)
    check_graph_arrays(data.edge_index, data.x, data.y, "data")   # a hand-built GraphData too
    check_num_classes(data.num_classes, int(torch.as_tensor(data.y).max()), "data.num_classes")
    check_classes(data.y)
    if seed is not None:
        seed_everything(seed)
    if split is None:
        split = natural_split(data.y, 0 if seed is None else seed)
    n = int(data.y.shape[0])
    train_idx, val_idx, test_idx = (t.to(device) for t in _split_parts(split, n))
    # detached: training optimises the model only; a data.x or edge_weight that requires grad
    # got .grad written by every step (x), or failed the second backward through the graph
    # built once from it (weights; an nn / PyG audit)
    x = torch.as_tensor(data.x, dtype=torch.float32).detach().to(device)
    y = torch.as_tensor(data.y).long().to(device)
    if graph is None:
        graph = _graph_of(data, n)
    if graph.device != device:
        graph = graph.to(device)   # a copy: caches (A², GCN degrees) are rebuilt once there
    return RunInputs(data, x, y, graph, train_idx, val_idx, test_idx, device)


def _graph_of(data: Any, n: int) -> CSRGraph:
    """The graph of ``data`` for training, its edge weights detached: training optimises the
    model only (weights that require grad got .grad written, and the second step's backward
    through the graph built once from them failed: `run_seeds` did, found by a mutation
    audit)."""
    weight = getattr(data, "edge_weight", None)
    return prepare_graph(torch.as_tensor(data.edge_index), n,
                         None if weight is None else torch.as_tensor(weight).detach())


def run_each_seed(data: Any, split: Any, seeds: Sequence[int],
                  train_one: Callable[[int, int, GraphData, Any, Any], dict], log=None,
                  label: str = "") -> dict:
    """The seed loop of `run_seeds` and the baselines' `run_baseline_seeds`: the graph prepared
    once, ``train_one(seed_index, seed, data, split, graph)`` per seed after `seed_everything`
    (``data`` converted once from a PyG ``Data``), with
    the split precedence of `run_seeds`; returns seeds, the split's kind, the runs and the
    summary (mean ± population std of each metric, mean seconds per epoch)."""
    data, split_given = as_graph_data(data, split)
    split_kind = "natural" if split_given is None else "user" if split is not None else "masks"
    seeds = check_seeds(seeds)
    n = int(data.y.shape[0])
    graph = _graph_of(data, n)   # once for all seeds
    runs = []
    for s_idx, seed in enumerate(seeds):
        seed_everything(seed)
        run_split = split_given if split_given is not None else natural_split(data.y, seed)
        runs.append(train_one(s_idx, seed, data, run_split, graph))
        if log is not None:
            r = runs[-1]
            log(f"{label}seed {seed}: " + " ".join(f"{METRIC_NAMES[m]} {100 * r['test'][m]:.2f}"
                                                   for m in METRICS)
                + f" | best epoch {r['best_epoch']}, {r['epochs_run']} epochs, "
                f"{r['time_per_epoch_s'] * 1e3:.1f} ms/epoch")
    summary = {}
    for m in METRICS:
        vals = np.array([r["test"][m] for r in runs], dtype=np.float64)
        summary[m] = {"mean": float(vals.mean()), "std": float(vals.std())}
    summary["time_per_epoch_s"] = float(np.mean([r["time_per_epoch_s"] for r in runs]))
    return {"seeds": seeds, "split": split_kind, "runs": runs, "summary": summary}


def check_seeds(seeds: Any) -> list[int]:
    """The seed list of `run_seeds` / `run_baseline_seeds` as ints: each a `check_seed` int
    (1.7 became seed 1, "3" seed 3), none twice (the same run would count twice in the mean ±
    std; the CLI's --seeds refuses it too), at least one."""
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Iterable):
        raise TypeError(f"seeds must be a sequence of ints, got {type(seeds).__name__}")
    seeds = [check_seed(s, f"seeds[{i}]") for i, s in enumerate(seeds)]
    if not seeds:
        raise ValueError("seeds is empty")
    if len(set(seeds)) < len(seeds):
        repeated = sorted({s for s in seeds if seeds.count(s) > 1})
        raise ValueError(f"seeds lists {', '.join(map(str, repeated))} more than once (each "
                         "seed is one run of the mean ± std)")
    return seeds


def _eval_val(model: HierTail, x, graph, val_idx, y_val) -> float:
    """Eval-mode forward without autograd; validation Macro-F1."""
    model.eval()
    with torch.no_grad():
        pred = predicted_classes(model(x, graph).logits)
    return macro_f1(y_val, pred[val_idx].cpu())


def run_seeds(
    data: GraphData,
    config: HierTailConfig | None = None,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    *,
    split: Any = None,
    compound_pool_bug: bool = False,
    log=None,
    **train_kwargs,
) -> dict:
    """Train once per seed; per-seed results plus the mean ± population std of each metric.

    ``data`` may be a PyG ``Data``. Split precedence: ``split`` (e.g. a ``--split`` file) > the
    ``Data``'s train/val/test masks > the natural per-class split, redone with every seed; a
    given split or the masks are the same for all seeds. ``compound_pool_bug`` (official
    config): seed index s uses the first pool ratio rescaled (s+1) times, as the released code
    does. ``log``: called with one line
    per finished seed (e.g. ``print``).
    """
    cfg = _check_config(config)
    check_flag(compound_pool_bug, "compound_pool_bug")

    def train_one(s_idx, seed, graph_data, run_split, graph):
        run_cfg = cfg.replace(pool_rescale_power=s_idx + 1) if compound_pool_bug else cfg
        return train_hiertail(graph_data, run_split, run_cfg, seed=seed, graph=graph,
                              **train_kwargs)

    each = run_each_seed(data, split, seeds, train_one, log)
    return {
        "config_name": cfg.name,
        "config": cfg.to_dict(),
        "compound_pool_bug": compound_pool_bug,
        **each,                          # seeds, split, runs, summary
    }


def format_table(result: dict) -> str:
    """The paper's table row: metrics ×100, mean ± std."""
    head = ("HierTail config=" + result["config_name"] if result.get("method", "hiertail")
            == "hiertail" else "method=" + result["method"])
    cfg = result.get("config") or {}
    # the size-setting hyper-parameters: a preset can depend on the dataset's name (the paper
    # config's hidden 64 on email / wiki / blogcatalog, 128 elsewhere), so the table says them
    knobs = " ".join(f"{k}={cfg[k]}" for k in ("hidden", "lr", "dropout") if k in cfg)
    lines = [f"{head} seeds={len(result['seeds'])}" + (f" {knobs}" if knobs else ""),
             f"{'metric':<10}{'mean ± std (×100)':>20}"]
    for m in METRICS:
        s = result["summary"][m]
        lines.append(f"{METRIC_NAMES[m]:<10}{100 * s['mean']:>11.2f} ± {100 * s['std']:<6.2f}")
    lines.append(f"time/epoch {result['summary']['time_per_epoch_s'] * 1e3:.1f} ms")
    return "\n".join(lines)
