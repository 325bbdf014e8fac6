"""Train/validation/test splits: HierTail's natural per-class split and user-given splits.

``natural_split`` implements the rule of the official ``split_natural`` (PROTOCOL_AND_BASELINES.md
§1.2) per class c with n_c nodes, after shuffling the class's nodes:

=============  ==================  ==================  =====================================
n_c            train               val                 test
=============  ==================  ==================  =====================================
1              node 0              node 0 (same)       node 0 (same)
2              node 0              node 0 (same)       node 1
3 .. 9         ⌈0.1 n_c⌉           ⌈0.1 n_c⌉            the rest, n_c − 2⌈0.1 n_c⌉
≥ 10           ⌊0.1 n_c⌋           ⌊0.1 n_c⌋            ⌊0.8 n_c⌋ (≤ 2 leftover nodes unused)
=============  ==================  ==================  =====================================

The training list is shuffled at the end; validation and test lists are grouped by class
(class 0 first) in random order within a class. Randomness comes from
``numpy.random.default_rng(seed)``: splits are deterministic per seed, but they do NOT
reproduce the exact shuffles of the official code, which uses Python's ``random`` module.
The split sizes per class are those of the official code (same float arithmetic ``int(0.1 n)``).
One deliberate difference: the official code shuffles only classes of 3 or more nodes (a class
of 1 or 2 takes its nodes in ascending id: the lower id trains and validates in every run);
here every class is shuffled, so which node of a 2-node class trains varies with the seed,
as it does for every other class (a fidelity audit found the difference undocumented).

Cost: O(n log n) time (one stable sort), O(n) memory; no Python loop over classes or nodes.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from hiertail_fast._validation import (
    check_dense_tensor,
    check_label_array,
    check_num_classes,
    check_seed,
)

__all__ = ["natural_split", "natural_split_sizes", "user_split", "class_counts", "split_counts"]


def _to_numpy(a: Any, name: str) -> np.ndarray:
    """A tensor (dense, with data: a meta or sparse one failed deep in ``.numpy()``) or an
    array-like as a numpy array."""
    if isinstance(a, torch.Tensor):
        return check_dense_tensor(a, name).detach().cpu().numpy()
    return np.asarray(a)


def _labels(y: Any) -> np.ndarray:
    arr = _to_numpy(y, "y")
    if arr.size == 0:       # (before the dtype: np.asarray([]) is float64; a review)
        raise ValueError("y is empty: there are no nodes to split")
    # (a ValueError for float labels, as the splits have always raised: callers catch it)
    return check_label_array(arr, not_integer=ValueError).astype(np.int64, copy=False)


def _num_classes(num_classes: Any, lab: np.ndarray) -> int:
    """C: ``num_classes`` (an int; a float such as 2.7 or a str was silently truncated or
    parsed) or, when None, max label + 1; ValueError when a label is >= C."""
    if num_classes is None:
        return int(lab.max()) + 1
    return check_num_classes(num_classes, int(lab.max()))


def natural_split_sizes(class_sizes: Any) -> np.ndarray:
    """Per-class layout of the natural split: int64 [C, 6].

    Columns: (train_start, train_len, val_start, val_len, test_start, test_len), positions in
    the shuffled node list of the class; ranges may overlap for n_c <= 2 (see the module table).
    """
    n = _to_numpy(class_sizes, "class_sizes")
    if n.ndim != 1:
        raise ValueError(f"class_sizes must be a 1-D vector, got shape {n.shape}")
    if n.size and (n.dtype == bool or not np.issubdtype(n.dtype, np.number)
                   or np.issubdtype(n.dtype, np.complexfloating)):
        raise ValueError(f"class_sizes must be numeric, got dtype {n.dtype}")
    if n.size and not (np.all(np.isfinite(n)) and np.all(n >= 0) and np.all(n == np.round(n))):
        raise ValueError("class_sizes must be whole numbers >= 0")
    n = n.astype(np.int64)
    out = np.zeros((n.shape[0], 6), dtype=np.int64)
    # n_c >= 10: floors, in the official float arithmetic int(0.1 * n), int(0.8 * n)
    a_big = np.floor(n * 0.1).astype(np.int64)
    te_big = np.floor(n * 0.8).astype(np.int64)
    a_mid = np.ceil(n * 0.1).astype(np.int64)  # 3 <= n_c < 10
    big, mid = n >= 10, (n >= 3) & (n < 10)
    a = np.where(big, a_big, a_mid)
    for m, te_len in ((big, te_big), (mid, n - 2 * a_mid)):
        out[m] = np.stack([0 * a, a, a, a, 2 * a, te_len], axis=1)[m]
    out[n == 1] = (0, 1, 0, 1, 0, 1)
    out[n == 2] = (0, 1, 0, 1, 1, 1)
    return out


def natural_split(
    y: Any, seed: int = 0, *, num_classes: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """HierTail's natural per-class 10/10/80 split with its small-class rules.

    Args:
        y: labels [n] (numpy array, torch tensor or sequence of non-negative ints).
        seed: seed of ``numpy.random.default_rng``, an int >= 0 (numpy ints too; the protocol
            redraws the split per run seed). None, bool, float: TypeError; negative: ValueError.
        num_classes: C (default: max label + 1); empty classes get no nodes.
    Returns:
        (train_idx, val_idx, test_idx): int64 torch tensors of node ids. train is shuffled;
        val/test are grouped by class. For n_c <= 2 a node can be in several sets (module doc).
    """
    lab = _labels(y)
    n = lab.shape[0]
    _num_classes(num_classes, lab)  # checked only: empty classes get no nodes
    rng = np.random.default_rng(check_seed(seed, bounded=False))
    # group nodes by class with a random order inside each class: random permutation, then a
    # stable sort by label keeps the permutation's order within a class.
    perm = rng.permutation(n)
    nodes = perm[np.argsort(lab[perm], kind="stable")]
    cls = lab[nodes]  # sorted
    # the non-empty classes only (O(n), not O(max label): a label 10**12 tried to allocate
    # 7 TiB): start of each class's run in ``nodes`` and its size
    first = np.flatnonzero(np.concatenate([[True], cls[1:] != cls[:-1]]))
    run = np.cumsum(np.concatenate([[True], cls[1:] != cls[:-1]])) - 1  # node -> its run
    sizes = np.diff(np.append(first, n))
    rank = np.arange(n) - first[run]  # position of each node inside its class's list
    lay = natural_split_sizes(sizes)[run]  # [n, 6] layout of the node's class

    def take(j: int) -> np.ndarray:
        lo, ln = lay[:, 2 * j], lay[:, 2 * j + 1]
        return nodes[(rank >= lo) & (rank < lo + ln)]

    train = take(0)
    train = train[rng.permutation(train.shape[0])]
    return torch.from_numpy(train), torch.from_numpy(take(1)), torch.from_numpy(take(2))


def _index_set(idx: Any, num_nodes: int, name: str) -> np.ndarray:
    """Index array or boolean mask -> int64 node ids, validated."""
    if idx is None:
        return np.zeros(0, dtype=np.int64)
    arr = _to_numpy(idx, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (indices or a boolean mask), got shape {arr.shape}")
    if arr.dtype == bool:
        if arr.shape[0] != num_nodes:
            raise ValueError(
                f"{name} mask has {arr.shape[0]} entries but there are {num_nodes} nodes"
            )
        return np.flatnonzero(arr).astype(np.int64)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integer node ids or booleans, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.min() < 0 or arr.max() >= num_nodes:
        raise ValueError(f"{name} has node ids outside [0, {num_nodes})")
    if np.unique(arr).shape[0] != arr.shape[0]:
        looks_like_mask = arr.shape[0] == num_nodes and arr.max() <= 1
        raise ValueError(f"{name} has duplicate node ids" + (
            " (it looks like a 0/1 mask: pass masks as booleans, e.g. mask.astype(bool))"
            if looks_like_mask else ""))
    return arr


def user_split(
    num_nodes: int, train: Any, val: Any = None, test: Any = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A split given by the user as index arrays or boolean masks of length ``num_nodes``.

    Overlap between the sets is allowed (the natural split overlaps for tiny classes); the
    caller's arrays are copied, never modified.
    Returns:
        (train_idx, val_idx, test_idx) as int64 torch tensors; val/test are empty when None.
    Raises:
        ValueError for ids out of range, duplicates within a set, a mask of the wrong length,
        non-integer ids, or an empty training set.
    """
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, (int, np.integer)):
        raise TypeError(f"num_nodes must be an int, got {type(num_nodes).__name__}")
    if num_nodes <= 0:
        raise ValueError(f"num_nodes must be positive, got {num_nodes}")
    tr = _index_set(train, int(num_nodes), "train")
    if tr.size == 0:
        raise ValueError("the training set is empty")
    va = _index_set(val, int(num_nodes), "val")
    te = _index_set(test, int(num_nodes), "test")
    return tuple(torch.from_numpy(a.copy()) for a in (tr, va, te))  # type: ignore[return-value]


SPLIT_PARTS = ("train", "val", "test")


def split_part_names(has: Callable[[str], bool], where: str = "split") -> list[str | None]:
    """For each part of a split (train, val, test), the one name it is stored under: the part's
    own name, ``<part>_idx`` or PyG's ``<part>_mask`` (``has(name)`` says which exist), None
    when none is. The one spelling rule of split files, dicts and objects; two names for one
    part are a ValueError naming them (one was taken unsaid: which one is meant is unknown)."""
    out: list[str | None] = []
    for part in SPLIT_PARTS:
        found = [name for name in (part, f"{part}_idx", f"{part}_mask") if has(name)]
        if len(found) > 1:
            raise ValueError(f"{where} holds {' and '.join(map(repr, found))}: one array per "
                             "part, please (which one is meant is unknown)")
        out.append(found[0] if found else None)
    return out


def class_counts(y: Any, idx: Any = None, num_classes: int | None = None) -> torch.Tensor:
    """int64 [C] number of nodes of each class among ``idx`` (all nodes when None).

    With ``idx = train_idx`` this is the official ``samples_per_label`` (column 0 of
    ``class_num_mat``).
    """
    lab = _labels(y)
    c = _num_classes(num_classes, lab)
    sel = lab if idx is None else lab[_index_set(idx, lab.shape[0], "idx")]
    return torch.from_numpy(np.bincount(sel, minlength=c).astype(np.int64))


def split_counts(
    y: Any, train: Any, val: Any, test: Any, num_classes: int | None = None
) -> torch.Tensor:
    """int64 [C, 3] per-class (train, val, test) counts: the official ``class_num_mat``."""
    return torch.stack([class_counts(y, s, num_classes) for s in (train, val, test)], dim=1)
