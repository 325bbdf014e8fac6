"""The evaluation protocol's training loop, shared by HierTail and every baseline: one optimiser
step and one validation pass per epoch, patience from the first epoch at the max, the model of the
last epoch at the max kept, divergence an error (`TrainingDivergedError`), never a result."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hiertail_fast._validation import all_finite, is_non_finite_error, non_finite_error
from hiertail_fast.metrics import per_class_accuracy

__all__ = ["TrainingDivergedError", "FitResult", "fit_early_stopping", "fit_record",
           "per_class_recall", "predicted_classes"]


class TrainingDivergedError(FloatingPointError):
    """Training diverged: the loss or a value the model computes from its parameters became NaN
    or Inf (or overflows) after optimiser steps, typically a too-high learning rate. Raised by
    `fit_early_stopping`, so by HierTail and every baseline alike; the message names the run,
    the epoch and the lr."""

    __module__ = "hiertail_fast.train"     # its public home (tracebacks, pickles), not _fit


@dataclass
class FitResult:
    best_state: dict
    best_epoch: int
    max_idx: int
    epochs_run: int
    stopped_early: bool
    train_time: float
    eval_time: float
    last_loss: Any


def fit_early_stopping(model: torch.nn.Module, opt: torch.optim.Optimizer,
                       step: Callable[[], tuple[Any, torch.Tensor]],
                       val_f1: Callable[[], float], *, epochs: int, patience: int,
                       progress: bool, desc: str, device: torch.device,
                       select_from: int = 0) -> FitResult:
    """The protocol's loop (HierTail and every baseline): per epoch one optimiser step on
    ``step()`` -> (loss record, scalar to back-propagate), then the eval-mode validation
    Macro-F1 ``val_f1()``. Patience counts from the FIRST epoch at the max; the model kept is the
    LAST epoch at the max (the official code's ``>=``). Epochs before ``select_from`` (a
    method's pre-training, whose classifier does not learn) are trained only: not validated,
    never selected, and the patience counts from ``select_from`` at the earliest.

    Divergence is an error, never a result: a non-finite loss, an op's refusal of NaN/Inf or
    overflowing values (`non_finite_error`) raised after an optimiser step, or a kept state
    with NaN/Inf weights raises `TrainingDivergedError` naming ``desc``, the epoch and the lr."""
    if not 0 <= select_from < epochs:
        raise ValueError(f"select_from={select_from} must be in [0, epochs={epochs})")

    def diverged(epoch: int, what: str) -> TrainingDivergedError:
        lrs = sorted({g["lr"] for g in opt.param_groups})
        lr = ", ".join(f"{v:g}" for v in lrs)
        err = TrainingDivergedError(
            f"{desc}: training diverged at epoch {epoch}: {what}; lower the learning rate "
            f"(lr={lr})")
        err.epoch = epoch
        return err

    best_val, max_val = -1.0, -1.0
    best_state, best_epoch, max_idx, stopped_early = None, 0, 0, False
    train_time = eval_time = 0.0
    # the training device's queue (torch.cuda.synchronize() alone waits on the CURRENT
    # device: with cuda:1 trained and cuda:0 current, steps were timed before they ended)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    bar = _progress(range(epochs), progress, desc=desc)
    epoch, loss = -1, None
    for epoch in bar:
        t0 = time.perf_counter()
        model.train()
        opt.zero_grad(set_to_none=True)
        try:
            loss, scalar = step()
        except ValueError as exc:
            if epoch == 0 or not is_non_finite_error(exc):   # before any step: the data's
                raise
            raise diverged(epoch, f"the forward pass failed ({exc})") from exc
        if not bool(torch.isfinite(scalar.detach())):
            raise diverged(epoch, f"the training loss is {float(scalar.detach())}")
        scalar.backward()
        opt.step()
        sync()
        t1 = time.perf_counter()
        if epoch < select_from:
            train_time += t1 - t0
            continue
        try:
            f1 = val_f1()                # .cpu() inside synchronises
        except ValueError as exc:        # after this epoch's step
            if not is_non_finite_error(exc):
                raise
            raise diverged(epoch, f"the validation forward pass failed ({exc})") from exc
        t2 = time.perf_counter()
        train_time += t1 - t0
        eval_time += t2 - t1
        if f1 > max_val:                 # first epoch reaching the max: the patience anchor
            max_val, max_idx = f1, epoch
        if f1 >= best_val:               # ties update: the last epoch at the max is the model
            best_val, best_epoch = f1, epoch
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if progress:
            bar.set_postfix(loss=f"{float(scalar.detach()):.3f}", val_f1=f"{f1:.3f}",
                            best=f"{max_val:.3f}@{max_idx}")
        if epoch - max_idx > patience:
            stopped_early = True
            break
    if best_state is not None and not all(
            bool(torch.isfinite(v).all()) for v in best_state.values() if v.is_floating_point()):
        raise diverged(best_epoch, "the selected model's weights are NaN or Inf")
    return FitResult(best_state, best_epoch, max_idx, epoch + 1, stopped_early, train_time,
                     eval_time, loss)


def per_class_recall(y_true: torch.Tensor, y_pred: torch.Tensor, num_classes: int) -> list:
    """Per-class test recall (the per-class bAcc of the paper's figure) as a JSON-able list;
    None for a class without test nodes."""
    return [None if np.isnan(v) else float(v)
            for v in per_class_accuracy(y_true, y_pred, num_classes)]


def fit_record(fit: FitResult) -> dict:
    """The per-run fields every method reports from its fit: best / first-max epoch, epochs run,
    early stop, seconds per epoch (train step + eval), per train step and per eval."""
    n = fit.epochs_run
    return {
        "best_epoch": fit.best_epoch,
        "max_idx": fit.max_idx,
        "epochs_run": n,
        "stopped_early": fit.stopped_early,
        "time_per_epoch_s": (fit.train_time + fit.eval_time) / n,
        "train_step_s": fit.train_time / n,
        "eval_s": fit.eval_time / n,
    }


def predicted_classes(logits: torch.Tensor) -> torch.Tensor:
    """The class of each row, argmax over ``logits``; a NaN or Inf logit raises the
    non-finite ValueError (``non_finite_error``) that ``fit_early_stopping`` reports as
    divergence. An optimiser step can leave finite weights whose logits overflow (lr 1e8:
    the last layer's products): argmax of those gave the metrics of a broken model when that
    step was the run's last."""
    if not all_finite(logits.detach()):
        raise non_finite_error("the model's logits contain NaN or Inf")
    return logits.argmax(dim=1)


def _progress(it, enabled: bool, desc: str):
    if not enabled:
        return it
    from tqdm.auto import tqdm
    return tqdm(it, desc=desc, leave=False, dynamic_ncols=True)
