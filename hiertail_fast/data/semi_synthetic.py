"""The paper's semi-synthetic long-tail setting (Table 3; PROTOCOL_AND_BASELINES.md §1.2, manual
split, ``--lt_setting 2``), applicable to any graph.

Steps (α = 0.8, 25 validation and 55 test nodes per class by default):

1. classes with at least ``val + test + 1`` nodes are kept (the official code assumes every class
   has one; smaller classes are dropped here and listed in ``info["dropped_classes"]``); sorted
   by size, largest first, each class's candidate training count is n_c − val − test;
2. the first ``int((1−α)·C)`` classes (the head; the official expression, in Python floats:
   1 − 0.8 is 0.19999999999999996, so for C a multiple of 5 it is one class fewer than
   ⌊0.2·C⌋) keep their counts; every tail count becomes t·Σhead / Σtail·(1−α)/α in float32 (the
   official torch expression on int64 counts, step by step) truncated (capped at the
   candidates), so the head holds about α of the training nodes (a tail class can end with 0
   training nodes, as in the code);
3. per class the (train + val + test) nodes of highest degree are kept (degree with the
   self-loop; ties: larger node id first); the classes in ascending ORIGINAL label (the
   official code runs before its relabelling by size; ``data.original_labels`` when the
   loader relabelled), each class's kept ids shuffled by Python's ``random`` seeded with
   ``graph_seed`` (the official fixed base seed) afresh before each class, as the code does;
4. the induced subgraph of the kept nodes, labels relabelled by size; per class the first
   (size − val − test) nodes are train, the next ``val`` validation, the next ``test`` test.

The official alignment bug (§1.2 [BUG], §5.2 item 10): the adjacency follows the shuffled
class-grouped order of step 3 but features and labels are taken in ascending original-id order,
so edges do not line up with X and y, and the split takes the lowest ids of each class, the same
for every run. ``alignment_bug=True`` reproduces that. The default (fixed) puts X and y in the
adjacency's order and shuffles each class's nodes with ``split_seed`` (the run seed) before the
train / val / test assignment.
"""
from __future__ import annotations

import numbers
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hiertail_fast._validation import check_flag, check_seed
from hiertail_fast.data.datasets import undirected_edges
from hiertail_fast.data.io import GraphData, size_order
from hiertail_fast.metrics import long_tailedness_ratio

__all__ = ["SemiSyntheticGraph", "semi_synthetic_long_tail"]


@dataclass
class SemiSyntheticGraph:
    """The down-sampled graph, its split (int64 index tensors) and what was done."""

    data: GraphData
    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def split(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.train, self.val, self.test


def _train_counts(sizes: np.ndarray, alpha: float, held_out: int) -> np.ndarray:
    """Step 2 for classes sorted largest first: the per-class training counts."""
    cand = sizes - held_out
    c = sizes.shape[0]
    # the official int((1 - alpha) * num_classes) (a floor with 1e-9 slack took one head class
    # more for C a multiple of 5; a fidelity audit)
    n_head = int((1 - alpha) * c)
    if n_head < 1 or n_head >= c:
        raise ValueError(f"alpha={alpha} with {c} eligible classes gives int((1 - alpha) * {c}) "
                         f"= {n_head} head classes (the official rule; 1 - 0.8 is "
                         f"{1 - 0.8!r} in floats); need at least one head and one tail class")
    counts = torch.from_numpy(cand.astype(np.int64))
    head_sum, tail_sum = counts[:n_head].sum(), counts[n_head:].sum()
    # the official tensor expression, each step in its dtype (int64 product, float32 quotient
    # and scalings): a float64 factor truncated counts that are whole in this arithmetic one
    # lower (29 for 30)
    scaled = counts[n_head:] * head_sum / tail_sum * (1 - alpha) / alpha
    tail = np.minimum(cand[n_head:], scaled.to(torch.int64).numpy())
    return np.concatenate([cand[:n_head], tail])


def semi_synthetic_long_tail(data: GraphData, *, alpha: float = 0.8, val_per_class: int = 25,
                             test_per_class: int = 55, graph_seed: int = 123,
                             split_seed: int = 0, alignment_bug: bool = False
                             ) -> SemiSyntheticGraph:
    """Down-sample ``data`` to the paper's manual long-tail setting (module docstring).

    Raises ValueError when α is not in (0, 1), the per-class counts are not positive integers,
    ``split_seed`` is negative, fewer than two classes are large enough, or α leaves no head
    or no tail class among them (the official int((1 - α) C) head classes); TypeError when a
    seed is not an int (None would be unreproducible), ``alignment_bug`` not a bool, or α a
    float32 (inexact: 0.8 becomes 0.800000011920929)."""
    if not isinstance(data, GraphData):
        raise TypeError(f"data must be a GraphData, got {type(data).__name__}")
    if isinstance(alpha, np.floating) and not isinstance(alpha, float):
        # float32(0.8) is 0.800000011920929: ⌊(1−α)·C⌋ would silently lose a head class
        raise TypeError(f"alpha must be a Python float (or float64), got {type(alpha).__name__}"
                        f" {alpha!r}, whose value is {float(alpha)!r}")
    if not (isinstance(alpha, float | int) and not isinstance(alpha, bool)
            and 0.0 < alpha < 1.0):
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    for name, v in (("val_per_class", val_per_class), ("test_per_class", test_per_class)):
        # numpy integers are integers (np.int64(25) was refused as "not an integer >= 1")
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    val_per_class, test_per_class = int(val_per_class), int(test_per_class)
    # seeds: None drew an unreproducible graph / split; a numpy int failed inside random
    if isinstance(graph_seed, (bool, np.bool_)) or not isinstance(graph_seed, numbers.Integral):
        raise TypeError(f"graph_seed must be an int, got {type(graph_seed).__name__} "
                        f"{graph_seed!r}")
    split_seed = check_seed(split_seed, "split_seed", bounded=False)   # numpy's generator
    graph_seed = int(graph_seed)
    # a str such as "no" was truthy and silently selected the buggy alignment
    alignment_bug = check_flag(alignment_bug, "alignment_bug")
    held_out = val_per_class + test_per_class
    y = data.y.numpy().astype(np.int64)
    n = y.shape[0]
    sizes = np.bincount(y, minlength=int(data.num_classes))
    order = np.argsort(-sizes, kind="stable")             # classes, largest first
    eligible = order[sizes[order] > held_out]
    dropped = sorted(int(c) for c in order if sizes[c] <= held_out)
    if eligible.shape[0] < 2:
        raise ValueError(f"only {eligible.shape[0]} class(es) have more than {held_out} nodes "
                         f"(val {val_per_class} + test {test_per_class}); need at least 2")
    train_counts = _train_counts(sizes[eligible], float(alpha), held_out)

    ei = data.edge_index.numpy()
    # with the self-loop, on the official graph (undirected, one loop per node): counted on the
    # edge list as given, one stored direction per edge or a stored loop kept other nodes (a
    # data audit); the same degrees on load_dataset's graphs, which are that graph already
    official = undirected_edges(data.edge_index, n).numpy()
    degree = np.bincount(official[0], minlength=n) + 1
    kept = dict(zip(eligible.tolist(), (train_counts + held_out).tolist(), strict=True))
    original = (np.asarray(data.original_labels) if data.original_labels is not None
                else np.arange(sizes.shape[0]))
    kept_per_class = []
    # the official order (a fidelity audit: size order and one random stream scrambled another
    # graph under alignment_bug, 502 of 18,628 edges in common with the official one on Wiki)
    for c in sorted(kept, key=lambda c: int(original[c])):
        nodes = np.flatnonzero(y == c)
        top = nodes[np.lexsort((-nodes, -degree[nodes]))][:kept[c]]   # degree desc, larger id
        ids = top.tolist()
        random.Random(graph_seed).shuffle(ids)    # = random.seed(seed); random.shuffle(ids)
        kept_per_class.append(ids)
    adj_order = np.array([i for ids in kept_per_class for i in ids], dtype=np.int64)
    new_id = np.full(n, -1, dtype=np.int64)
    new_id[adj_order] = np.arange(adj_order.shape[0])
    src, dst = new_id[ei[0]], new_id[ei[1]]
    keep = (src >= 0) & (dst >= 0)
    edge_index = np.stack([src[keep], dst[keep]])
    perm = np.lexsort((edge_index[1], edge_index[0]))
    edge_index = edge_index[:, perm]
    # a weighted graph's weights follow their edges (they were dropped: a data audit)
    weight = (None if data.edge_weight is None
              else data.edge_weight[torch.from_numpy(np.flatnonzero(keep)[perm])])
    # X and y: the adjacency's order (fixed) or ascending original ids (the official bug)
    feat_order = np.sort(adj_order) if alignment_bug else adj_order
    y_new, _ = size_order(y[feat_order])
    x_new = data.x[torch.from_numpy(feat_order)]

    split_rng = np.random.default_rng(split_seed)
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
    for c in range(int(y_new.max()) + 1):
        nodes = np.flatnonzero(y_new == c)
        if not alignment_bug:
            nodes = split_rng.permutation(nodes)
        n_train = nodes.shape[0] - held_out
        parts["train"].append(nodes[:n_train])
        parts["val"].append(nodes[n_train:n_train + val_per_class])
        parts["test"].append(nodes[n_train + val_per_class:])
    idx = {k: torch.from_numpy(np.concatenate(v).astype(np.int64)) for k, v in parts.items()}
    train_sizes = np.bincount(y_new[idx["train"].numpy()], minlength=int(y_new.max()) + 1)
    info = {
        "alpha": float(alpha), "val_per_class": val_per_class, "test_per_class": test_per_class,
        "graph_seed": graph_seed, "split_seed": split_seed, "alignment_bug": alignment_bug,
        "kept_classes": int(eligible.shape[0]), "dropped_classes": dropped,
        "num_nodes": int(adj_order.shape[0]), "num_edges": int(edge_index.shape[1]),
        "train_per_class": train_sizes.tolist(),
        "train_ratio_lt_0.8": long_tailedness_ratio(class_sizes=train_sizes[train_sizes > 0]),
    }
    out = GraphData(edge_index=torch.from_numpy(edge_index), x=x_new,
                    y=torch.from_numpy(y_new), num_classes=int(y_new.max()) + 1,
                    name=f"{data.name}_semi_lt", edge_weight=weight)
    return SemiSyntheticGraph(out, idx["train"], idx["val"], idx["test"], info)
