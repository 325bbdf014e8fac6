"""The baselines' training loop: HierTail's protocol (`hiertail_fast.train`) for any method.

Same split (natural per-class split redone per seed, or a given one / the Data's masks), seeding
(`seed_everything`, then a fresh model), Adam with weight decay, eval-mode validation Macro-F1
under ``torch.no_grad()`` after every step, model selection (patience counted from the FIRST
epoch at the max, the LAST epoch at the max is the model) and reported metrics (best model's
eval-mode test metrics; mean ± population std over seeds) as `train_hiertail` / `run_seeds`.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch

from hiertail_fast.baselines.config import BaselineConfig
from hiertail_fast.baselines.methods import MethodContext, build_method
from hiertail_fast.data.pyg import as_graph_data
from hiertail_fast.data.splits import natural_split
from hiertail_fast.metrics import evaluate, macro_f1
from hiertail_fast.nn.hiertail import prepare_graph
from hiertail_fast.train import (
    DEFAULT_SEEDS,
    METRIC_NAMES,
    METRICS,
    _progress,
    _split_parts,
    seed_everything,
)

__all__ = ["train_baseline", "run_baseline_seeds"]


def train_baseline(
    data: Any,
    split: Any = None,
    config: BaselineConfig | None = None,
    *,
    epochs: int = 10_000,
    patience: int = 1_000,
    seed: int | None = None,
    device: str | torch.device = "cpu",
    graph=None,
    progress: bool = True,
) -> dict:
    """Train one baseline; return the best-epoch metrics (fractions), as `train_hiertail`.

    ``config`` (default ``BaselineConfig()``, Origin) picks the method; the rest of the
    arguments mean what they mean for `train_hiertail`. ``graph``: a `prepare_graph` of ``data``.
    """
    cfg = config if config is not None else BaselineConfig()
    if not isinstance(cfg, BaselineConfig):
        raise TypeError(f"config must be a BaselineConfig, got {type(cfg).__name__}")
    for name, v in (("epochs", epochs), ("patience", patience)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if epochs < 1 or patience < 0:
        raise ValueError(f"need epochs >= 1 and patience >= 0, got {epochs}, {patience}")
    data, split = as_graph_data(data, split)
    if seed is not None:
        seed_everything(seed)
    if split is None:
        split = natural_split(data.y, 0 if seed is None else seed)
    device = torch.device(device)
    n = int(data.y.shape[0])
    train_idx, val_idx, test_idx = (t.to(device) for t in _split_parts(split))
    for name, t in (("train", train_idx), ("val", val_idx), ("test", test_idx)):
        if int(t.min()) < 0 or int(t.max()) >= n:
            raise ValueError(f"split[{name!r}] has indices outside [0, {n})")
    x = torch.as_tensor(data.x, dtype=torch.float32).to(device)
    y = torch.as_tensor(data.y).long().to(device)
    if graph is None:
        graph = prepare_graph(torch.as_tensor(data.edge_index), n,
                              getattr(data, "edge_weight", None))
    if graph.device != device:
        graph = graph.to(device)
    gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
    ctx = MethodContext(x, y, graph, train_idx, int(data.num_classes), gen)
    model = build_method(ctx, cfg).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    y_val, y_test = y[val_idx].cpu(), y[test_idx].cpu()

    best_val, max_val = -1.0, -1.0
    best_state, best_epoch, max_idx, stopped_early = None, 0, 0, False
    train_time = eval_time = 0.0
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    bar = _progress(range(epochs), progress, desc=f"{cfg.name} seed={seed}")
    epoch, loss = -1, torch.zeros(())
    for epoch in bar:
        t0 = time.perf_counter()
        model.train()
        opt.zero_grad(set_to_none=True)
        loss = model.train_loss()
        loss.backward()
        opt.step()
        sync()
        t1 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            val_f1 = macro_f1(y_val, model.predict().argmax(dim=1)[val_idx].cpu())
        t2 = time.perf_counter()
        train_time += t1 - t0
        eval_time += t2 - t1
        if val_f1 > max_val:            # first epoch reaching the max: the patience anchor
            max_val, max_idx = val_f1, epoch
        if val_f1 >= best_val:          # ties update: the last epoch at the max is the model
            best_val, best_epoch = val_f1, epoch
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if progress:
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", val_f1=f"{val_f1:.3f}",
                            best=f"{max_val:.3f}@{max_idx}")
        if epoch - max_idx > patience:
            stopped_early = True
            break
    epochs_run = epoch + 1
    model.load_state_dict(best_state)
    model.eval()
    with torch.no_grad():
        pred = model.predict().argmax(dim=1).cpu()
    return {
        "seed": seed,
        "method": cfg.method,
        "config_name": cfg.name,
        "test": evaluate(y_test, pred[test_idx.cpu()]),
        "val": evaluate(y_val, pred[val_idx.cpu()]),
        "best_epoch": best_epoch,
        "max_idx": max_idx,
        "epochs_run": epochs_run,
        "stopped_early": stopped_early,
        "time_per_epoch_s": (train_time + eval_time) / epochs_run,
        "train_step_s": train_time / epochs_run,
        "eval_s": eval_time / epochs_run,
        "final_loss": float(loss.detach()),
        "lr": cfg.lr,
        "weight_decay": cfg.weight_decay,
        **model.info(),
    }


def run_baseline_seeds(
    data: Any,
    config: BaselineConfig | None = None,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    *,
    split: Any = None,
    compound_pool_bug: bool = False,
    log=None,
    **train_kwargs,
) -> dict:
    """`run_seeds` for a baseline: one run per seed, the same split rules, the same summary."""
    cfg = config if config is not None else BaselineConfig()
    if compound_pool_bug:
        raise ValueError("compound_pool_bug only applies to HierTail's official config")
    data, split_given = as_graph_data(data, split)
    split_kind = "natural" if split_given is None else "user" if split is not None else "masks"
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds is empty")
    n = int(data.y.shape[0])
    graph = prepare_graph(torch.as_tensor(data.edge_index), n,
                          getattr(data, "edge_weight", None))
    runs = []
    for seed in seeds:
        seed_everything(seed)
        run_split = split_given if split_given is not None else natural_split(data.y, seed)
        runs.append(train_baseline(data, run_split, cfg, seed=seed, graph=graph,
                                   **train_kwargs))
        if log is not None:
            r = runs[-1]
            log(f"{cfg.method} seed {seed}: "
                + " ".join(f"{METRIC_NAMES[m]} {100 * r['test'][m]:.2f}" for m in METRICS)
                + f" | best epoch {r['best_epoch']}, {r['epochs_run']} epochs, "
                f"{r['time_per_epoch_s'] * 1e3:.1f} ms/epoch")
    summary = {}
    for m in METRICS:
        vals = np.array([r["test"][m] for r in runs], dtype=np.float64)
        summary[m] = {"mean": float(vals.mean()), "std": float(vals.std())}
    summary["time_per_epoch_s"] = float(np.mean([r["time_per_epoch_s"] for r in runs]))
    return {
        "method": cfg.method,
        "config_name": cfg.name,
        "config": cfg.to_dict(),
        "seeds": seeds,
        "split": split_kind,
        "runs": runs,
        "summary": summary,
    }
