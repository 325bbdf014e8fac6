"""``HierTail.loss``'s label checks, and the same checks as a custom op while TorchDynamo traces.

The checks read the labels' values (a label beyond the classes, an index beyond the nodes), so
traced as Python they broke a compiled training step into several graphs and failed
``fullgraph=True``. While traced, ``hiertail_fast::train_labels`` runs them when the compiled
code runs (the same ValueError / TypeError as eager) and returns what the loss needs from them,
so the whole step, forward, losses and backward, compiles into one graph.
"""
from __future__ import annotations

import torch
from torch import Tensor

from hiertail_fast._validation import (
    check_index_vector,
    check_labels_below,
    check_node_ids,
    check_tensor,
)
from hiertail_fast.ops._custom_ops import OP_OPTIONS, READY, unshared


def train_labels(y, train_idx, n: int, num_classes: int, device: torch.device
                 ) -> tuple[Tensor, Tensor]:
    """(y[train_idx], train_idx) as int64 after the checks: y [n] labels in [0, num_classes),
    train_idx a non-empty 1-D index tensor of distinct nodes in [0, n), both on ``device``
    (the model output's). Any integer dtype: cross_entropy needs int64 targets, and a uint8
    index tensor would be read as a boolean mask."""
    y = check_index_vector(y, "y", length=n)
    if y.numel():
        check_labels_below(int(y.max()), num_classes, "the model's num_classes")
    if y.device != device:
        raise ValueError(f"y is on {y.device} but the output is on {device}")
    train_idx = check_node_ids(train_idx, "train_idx", n, device, "the output", nonempty=True,
                               distinct=True).long()
    return y.long()[train_idx], train_idx


@torch.library.custom_op("hiertail_fast::train_labels", **OP_OPTIONS)
def _train_labels_op(y: Tensor, train_idx: Tensor, n: int, num_classes: int,
                     device: torch.device) -> tuple[Tensor, Tensor]:
    # a custom op's outputs may not alias its inputs (long() of an int64 tensor is itself):
    # the one helper the other custom ops use for that
    y_train, idx = unshared(train_labels(y, train_idx, n, num_classes, device), (y, train_idx))
    return y_train, idx


@_train_labels_op.register_fake
def _(y, train_idx, n, num_classes, device):
    k = train_idx.shape[0] if train_idx.dim() == 1 else 0
    return (y.new_empty(k, dtype=torch.int64, device=device),
            train_idx.new_empty(k, dtype=torch.int64, device=device))


def checked_train_labels(y, train_idx, n, num_classes: int, device: torch.device
                         ) -> tuple[Tensor, Tensor]:
    """``train_labels``; one custom op while TorchDynamo traces (its type errors raised while
    tracing, the value checks when the compiled code runs)."""
    if not (torch.compiler.is_compiling() and READY):
        return train_labels(y, train_idx, n, num_classes, device)
    check_tensor(y, "y")
    check_tensor(train_idx, "train_idx")
    return _train_labels_op(y, train_idx, n, num_classes, device)
