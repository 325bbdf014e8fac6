"""The baselines' training loop: HierTail's protocol (`hiertail_fast.train`) for any method.

Same split (natural per-class split redone per seed, or a given one / the Data's masks), seeding
(`seed_everything`, then a fresh model), Adam with weight decay, eval-mode validation Macro-F1
under ``torch.no_grad()`` after every step, model selection (patience counted from the FIRST
epoch at the max, the LAST epoch at the max is the model) and reported metrics (best model's
eval-mode test metrics; mean ± population std over seeds) as `train_hiertail` / `run_seeds`.

A method's extra stages hang on the one loop: ``pretrain(opt)`` runs before it (GraphSMOTE's
``ep_pre``), ``after_fit`` after its best state is loaded (LTE4G's experts and students); the
loop's epochs, patience and model selection are the method's main training stage.
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence

import torch

from hiertail_fast._protocol import EPOCHS, PATIENCE
from hiertail_fast._validation import check_epochs_patience, check_flag
from hiertail_fast.baselines.config import BaselineConfig
from hiertail_fast.baselines.methods import METHODS, MethodContext, build_method
from hiertail_fast.metrics import evaluate, macro_f1
from hiertail_fast.train import (
    DEFAULT_SEEDS,
    fit_early_stopping,
    fit_record,
    per_class_recall,
    predicted_classes,
    prepare_run,
    run_each_seed,
)

__all__ = ["train_baseline", "run_baseline_seeds"]


def _warn_unsorted_tail(cfg: BaselineConfig, y: torch.Tensor, num_classes: int) -> None:
    """The tail is the last ``im_class_num`` labels, and LTE4G's head the first ``sep_point``
    ones (the official rules, for labels sorted by descending class size, as
    ``load_npz(..., relabel_by_size=True)``, load_dataset and the CLI give them). A graph whose
    labels are not: its "tail" may be large or empty classes, and an up-sampling method then
    silently does little or nothing; LTE4G's head experts get small classes (two baselines
    audits): warn, naming the fix."""
    method = METHODS[cfg.method]
    if getattr(method, "uses_tail", False):
        rule = f"takes the last im_class_num={cfg.im_class_num} labels as the tail classes"
    elif getattr(method, "head_first", False):
        rule = f"takes the first labels as its head classes (sep_class={cfg.sep_class!r})"
    else:
        return
    sizes = torch.bincount(y.cpu(), minlength=num_classes)
    if bool((sizes[:-1] < sizes[1:]).any()):
        warnings.warn(f"method {cfg.method!r} {rule}, but this graph's labels are not sorted by "
                      f"descending class "
                      f"size (sizes {sizes.tolist()[:12]}{' ...' if num_classes > 12 else ''}): "
                      "relabel them first (hiertail_fast.data.io.relabel_by_size, or "
                      "load_npz(..., relabel_by_size=True))", stacklevel=3)


def train_baseline(
    data: Any,
    split: Any = None,
    config: BaselineConfig | None = None,
    *,
    epochs: int = EPOCHS,
    patience: int = PATIENCE,
    seed: int | None = None,
    device: str | torch.device = "cpu",
    graph=None,
    progress: bool = True,
) -> dict:
    """Train one baseline; return the best-epoch metrics (fractions), as `train_hiertail`.

    ``config`` (default ``BaselineConfig()``, Origin) picks the method; the rest of the
    arguments mean what they mean for `train_hiertail`. ``graph``: a `prepare_graph` of ``data``.
    """
    cfg = _check_config(config)
    epochs, patience = check_epochs_patience(epochs, patience)
    check_flag(progress, "progress")         # as train_hiertail: "no" is truthy
    run = prepare_run(data, split, seed, device, graph)
    data, x, y, graph = run.data, run.x, run.y, run.graph
    train_idx, val_idx, test_idx, device = run.train_idx, run.val_idx, run.test_idx, run.device
    _warn_unsorted_tail(cfg, y, int(data.num_classes))
    gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
    ctx = MethodContext(x, y, graph, train_idx, int(data.num_classes), gen, val_idx=val_idx,
                        epochs=epochs, patience=patience)
    model = build_method(ctx, cfg).to(device=device, dtype=x.dtype)   # not the default dtype
    opt = torch.optim.Adam(model.param_groups(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    y_val, y_test = y[val_idx].cpu(), y[test_idx].cpu()

    def step():
        loss = model.train_loss()
        return loss, loss

    def val_f1() -> float:
        model.eval()
        with torch.no_grad():
            return macro_f1(y_val, predicted_classes(model.predict())[val_idx].cpu())

    pretrain_epochs = model.pretrain(opt)
    fit = fit_early_stopping(model, opt, step, val_f1, epochs=epochs, patience=patience,
                             progress=progress, desc=f"{cfg.name} seed={seed}", device=device,
                             select_from=model.selection_start())
    model.load_state_dict(fit.best_state)
    model.after_fit(val_idx, epochs=epochs, progress=progress)
    model.eval()
    with torch.no_grad():
        pred = predicted_classes(model.predict()).cpu()
    return {
        "seed": seed,
        "method": cfg.method,
        "config_name": cfg.name,
        "test": evaluate(y_test, pred[test_idx.cpu()]),
        "val": evaluate(y_val, pred[val_idx.cpu()]),
        "test_per_class": per_class_recall(y_test, pred[test_idx.cpu()], int(data.num_classes)),
        **fit_record(fit),
        "final_loss": float(fit.last_loss.detach()),
        "lr": cfg.lr,
        "weight_decay": cfg.weight_decay,
        **({"pretrain_epochs": pretrain_epochs} if pretrain_epochs else {}),
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
    cfg = _check_config(config)      # before cfg.method is read (a dict: AttributeError)
    if check_flag(compound_pool_bug, "compound_pool_bug"):
        raise ValueError("compound_pool_bug only applies to HierTail's official config")
    each = run_each_seed(
        data, split, seeds,
        lambda s_idx, seed, graph_data, run_split, graph: train_baseline(
            graph_data, run_split, cfg, seed=seed, graph=graph, **train_kwargs),
        log, label=f"{cfg.method} ")
    return {
        "method": cfg.method,
        "config_name": cfg.name,
        "config": cfg.to_dict(),
        **each,                          # seeds, split, runs, summary
    }


def _check_config(config: Any) -> BaselineConfig:
    """``config`` or Origin's default; a TypeError unless it is a BaselineConfig (a dict or a
    method's name failed later with an AttributeError in `run_baseline_seeds`)."""
    cfg = config if config is not None else BaselineConfig()
    if not isinstance(cfg, BaselineConfig):
        hint = (f" (use BaselineConfig(method={cfg!r}))" if isinstance(cfg, str)
                else " (use BaselineConfig(**d))" if isinstance(cfg, dict) else "")
        raise TypeError(f"config must be a BaselineConfig, got {type(cfg).__name__}{hint}")
    return cfg
