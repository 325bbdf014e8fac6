"""Graph inputs: labels, node ids, edge lists and weights, sparse adjacencies, node counts,
and the graph ops' own arguments (pooling, prototypes)."""
from __future__ import annotations

import operator
import os

import numpy as np
import torch

from hiertail_fast._validation.tensors import (
    INT64_MAX,
    all_finite,
    check_dense_tensor,
    check_float_dtype,
    check_float_matrix,
    check_index_dtype,
    check_index_vector,
    is_integer_array,
    non_finite_error,
)

MAX_NODES = 3_037_000_499  # n * n + n must fit in int64 for the (row, col) sort key


def check_labels_below(top: int, num_classes: int, count: str = "num_classes") -> None:
    """ValueError when the largest label ``top`` is not below the class count; ``count`` names
    that count as the caller's user gave it. One message for the splits, the metrics, the
    trainer, the model's loss and the baselines, which had four wordings of it."""
    if top >= num_classes:
        raise ValueError(f"the labels go up to {top} but {count} is {num_classes}: labels "
                         f"must lie in [0, {num_classes})")


def check_node_ids(idx: object, name: str, n: int, device: torch.device, where: str, *,
                   nonempty: bool = False, distinct: bool = False) -> torch.Tensor:
    """``idx`` as node ids: a 1-D integer tensor on ``device`` with entries in [0, n), at
    least one with ``nonempty``, none twice with ``distinct``; ``where`` names what holds the
    n nodes ("the output", "the graph"). A boolean mask (PyG's train_mask) is refused by name:
    indexed with it, the baselines' up-sampling read node ids 0 and 1 (a baselines audit).
    One check for the model's loss and the baselines' context, which wrote it twice in two
    wordings. Reads the smallest and the largest id (host syncs on CUDA), and with
    ``distinct`` a count."""
    if isinstance(idx, torch.Tensor) and idx.dtype == torch.bool:
        raise TypeError(f"{name} must hold node ids (an integer tensor), got a boolean mask: "
                        "pass mask.nonzero().view(-1)")
    idx = check_index_vector(idx, name)
    if idx.device != device:
        raise ValueError(f"{name} is on {idx.device} but {where} is on {device}")
    if nonempty and not idx.numel():
        # (an empty training set gave a NaN loss and trained nothing)
        raise ValueError(f"{name} must be a non-empty 1-D index tensor")
    if idx.numel() and int(idx.max()) >= n:
        raise ValueError(f"{name} refers to node {int(idx.max())} but {where} has {n} nodes")
    if distinct and idx.numel():
        # a node listed twice counts twice (re-weighted CE and SCL; with include_self=False
        # its own copy became its positive; the split helpers refuse it with the same words).
        # One boolean scatter over the n nodes: cheaper than torch.unique's sort (1.4 vs 8 ms
        # at n = 1M), no Python value lifted to a tensor
        seen = torch.zeros(n, dtype=torch.bool, device=idx.device)
        seen.index_fill_(0, idx.long(), True)
        if int(seen.sum()) != idx.numel():
            mask_like = idx.numel() == n and int(idx.max()) <= 1
            raise ValueError(f"{name} has duplicate node ids" + (
                " (it looks like a 0/1 mask: pass mask.nonzero().view(-1))" if mask_like
                else ""))
    return idx


def check_edge_index(edge_index: object, num_nodes: int | None = None) -> torch.Tensor:
    ei = check_dense_tensor(edge_index, "edge_index")
    if ei.dim() != 2 or ei.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {tuple(ei.shape)}")
    check_index_dtype(ei, "edge_index")
    if ei.numel():
        if int(ei.min()) < 0:
            raise ValueError("edge_index has negative node indices")
        if num_nodes is not None and int(ei.max()) >= num_nodes:
            raise ValueError(
                f"edge_index refers to node {int(ei.max())} but num_nodes is {num_nodes}"
            )
    return ei


def check_edge_weight(edge_weight: object, num_edges: int,
                      name: str = "edge_weight", hint: str = "") -> torch.Tensor | None:
    """``name``: what the user gave the weights as (a sparse adjacency's values are named as
    such: "edge_weight must be a floating-point tensor" of a call that passed no edge_weight
    was a fresh-user audit's find); ``hint``: what to do instead of a non-float dtype."""
    if edge_weight is None:
        return None
    w = check_dense_tensor(edge_weight, name)
    if w.dim() != 1:
        raise ValueError(f"{name} must be 1-D [E], got shape {tuple(w.shape)}")
    check_float_dtype(w, name, hint)
    if w.numel() != num_edges:
        raise ValueError(
            f"{name} has {w.numel()} entries but edge_index has {num_edges} edges"
        )
    if not all_finite(w):
        raise ValueError(f"{name} contains NaN or Inf")
    return w


def duplicate_sum_overflow(dtype: torch.dtype) -> ValueError:
    """The ValueError for duplicate edges whose weights, each finite, summed past ``dtype``'s
    range when they were merged into one entry (a CSRGraph's dedupe / symmetrize, a sparse
    adjacency's coalesce). Before, the merged graph held inf weights and the op using it later
    blamed an in-place edit that never happened."""
    return ValueError(
        f"the weights of duplicate edges sum past {dtype}'s range (largest finite "
        f"{torch.finfo(dtype).max:.6g}) where they merge into one entry; scale the weights "
        f"down, pass them in a wider dtype, or keep duplicates apart "
        f"(CSRGraph.from_edge_index(..., dedupe=False))")


def check_weights_fit(weight: torch.Tensor | None, dtype: torch.dtype) -> None:
    """ValueError when edge weights stored in a wider dtype than the propagation's (the
    features') do not fit it: float64 weights of 1e39 with float32 features became inf in the
    cast, dinv 0, and 0·inf NaN rows on every backend; nonzero ones below its normal range
    (1e-40, 1e-50) were flushed to a few bits or to 0, silently: 1.4 % off, or every row 0
    (two extremes audits). Checked once per weights' version and dtype where the degrees are
    cached."""
    if weight is None or torch.finfo(weight.dtype).max <= torch.finfo(dtype).max:
        return
    w = weight.detach()
    cast = w.to(dtype)
    if not all_finite(cast):
        raise ValueError(f"edge_weight ({weight.dtype}) has values beyond {dtype}'s range, "
                         f"the dtype the propagation runs in (that of the features, float32 "
                         f"for 16-bit ones): rescale the weights (GCN normalisation does not "
                         f"change when all are scaled together) or pass {weight.dtype} features")
    tiny = torch.finfo(dtype).tiny
    if bool(((cast.abs() < tiny) & (w != 0)).any()):
        raise ValueError(f"edge_weight ({weight.dtype}) has nonzero values below {dtype}'s "
                         f"normal range (smallest normal {tiny:.6g}), the dtype the propagation "
                         f"runs in (that of the features, float32 for 16-bit ones): they would "
                         f"round to 0 or lose their precision; rescale the weights (GCN "
                         f"normalisation does not change when all are scaled together), set "
                         f"negligible ones to 0, or pass {weight.dtype} features")


def check_no_edge_weight(edge_weight: object) -> None:
    """A graph that carries its weights (a CSRGraph, a sparse adjacency) takes no separate
    ``edge_weight``: ValueError rather than silently ignoring one of the two."""
    if edge_weight is not None:
        raise ValueError("edge_weight must be None when a CSRGraph or a sparse adjacency is "
                         "given (its weights are stored in it)")


def check_gcn_degrees(deg: torch.Tensor) -> None:
    """GCN degrees ``deg_i = Σ_{e -> i} w_e + loop_i`` must be >= 0 and finite: deg^-1/2 of a
    negative degree is not a real number (PyG silently returns NaN rows; a NaN there also broke
    the CPU operator build). ValueError naming the first offending node and its degree. NaN
    degrees (a sum of finite weights that overflowed to +inf and -inf) and +inf ones (weights
    summing beyond the range of the dtype the degrees are summed in, float64: deg^-1/2 would
    be 0, a zero row) are rejected too."""
    deg = deg.detach()  # a check only: nothing returned, no autograd
    bad = ~((deg >= 0) & (deg < float("inf")))
    if deg.numel() and bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        d = float(deg[i])
        why = (f"the edge weights into it sum beyond {deg.dtype}'s range" if d == float("inf")
               else "deg^-1/2 needs degrees >= 0, so the edge weights into a node must not sum "
                    "to a negative value")
        raise ValueError(
            f"node {i} has GCN degree {d:g} (weighted in-degree plus added self-loop): {why}"
        )


def check_classes(y: object) -> None:
    """ValueError unless the labels ``y`` hold at least 2 distinct classes (a one-class graph
    would train nothing and report a perfect bAcc)."""
    present = torch.unique(torch.as_tensor(y))
    if present.numel() < 2:
        only = f" (label {int(present[0])})" if present.numel() else ""
        raise ValueError(f"the graph's nodes all have one class{only}: node classification "
                         "needs at least 2 classes")


def check_label_array(y: np.ndarray, name: str = "y", *,
                      not_integer: type[Exception] = TypeError) -> np.ndarray:
    """``y``, a numpy array, as class labels: integer (not bool), 1-D, in [0, int64's
    largest] (a uint64 label >= 2**63 wraps negative in the int64 cast); returned as it is.
    ``name`` opens each message (a file's arrays name the file as well). ``not_integer``: the
    error for a non-integer dtype, part of each caller's contract (a TypeError for an
    argument, a ValueError for a file's array and for the splits' documented ValueError).
    One check for the loaders, relabel_by_size and the splits, which wrote it three times."""
    if not is_integer_array(y):
        raise not_integer(f"{name} must be an integer array of labels, got {y.dtype}")
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D [n], got shape {y.shape}")
    if y.size and int(y.min()) < 0:
        raise ValueError(f"{name} has negative labels (min {int(y.min())})")
    if y.size and int(y.max()) > INT64_MAX:
        raise ValueError(f"{name} has labels above int64's range (max {int(y.max())})")
    return y


def check_num_classes(num_classes: object, top: int, name: str = "num_classes") -> int:
    """A class count ``num_classes`` (named ``name`` in messages) as an int >= 1 above the
    largest label ``top``: an int as ``check_positive_int`` takes one (numpy's, a one-element
    integer tensor; a float or a str was converted by int(): 5.7 trained a 5-class model).
    One check for GraphData.num_classes, the splits and relabel_by_size (which ignored a count
    below its labels, and took 2.5, -1 and True)."""
    from hiertail_fast._validation.options import check_positive_int

    count = check_positive_int(num_classes, name)
    check_labels_below(top, count, name)
    return count


def check_num_nodes(num_nodes: object, name: str = "num_nodes", least: int = 0) -> int:
    """``num_nodes`` as an int: any integer that ``operator.index`` accepts (int, numpy
    integers, a one-element integer tensor); bool (including numpy's) and floats are rejected
    with TypeError, values below ``least`` or too large with ValueError."""
    if isinstance(num_nodes, torch.Tensor):
        ok = num_nodes.numel() == 1 and not (num_nodes.is_floating_point()
                                             or num_nodes.is_complex()
                                             or num_nodes.dtype == torch.bool)
        if not ok:
            raise TypeError(f"{name} must be an int, got a tensor of shape "
                            f"{tuple(num_nodes.shape)} and dtype {num_nodes.dtype}")
        num_nodes = int(num_nodes)
    if isinstance(num_nodes, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got bool")
    # asked, not tried: torch 2.11's Dynamo turns the TypeError of operator.index(12.0) inside a
    # compiled graph into an InternalTorchDynamoError that no except clause here catches
    if not hasattr(num_nodes, "__index__"):
        raise TypeError(f"{name} must be an int, got {type(num_nodes).__name__}")
    num_nodes = operator.index(num_nodes)
    if num_nodes < least:   # (a class count of -1 was told ">= 0", 0 being no count either)
        raise ValueError(f"{name} must be a positive int, got {num_nodes}" if least == 1
                         else f"{name} must be >= {least}, got {num_nodes}")
    if num_nodes > MAX_NODES:
        raise ValueError(f"{name}={num_nodes} is too large (max {MAX_NODES})")
    return int(num_nodes)


def check_sparse_parts(pointers: torch.Tensor | None, indices: torch.Tensor, n: int,
                       name: str) -> None:
    """ValueError unless a sparse adjacency's compressed ``pointers`` (CSR crow / CSC ccol /
    SparseTensor rowptr; None for COO) start at 0, do not decrease and end at the entries, and
    its ``indices`` (the other dimension's; COO: both rows of [2, nnz]) lie in [0, n). torch
    builds sparse tensors without checking them (unless its invariant checks are on): an
    index outside the graph was folded into another edge, malformed pointers read memory out
    of bounds or crashed in to_sparse_coo (a data audit, a review). One read to the host for
    all of it (a sync on CUDA)."""
    nnz = indices.shape[-1]
    parts = []
    if pointers is not None:
        if pointers.dim() != 1 or pointers.numel() != n + 1:
            raise ValueError(f"a sparse adjacency's {name} must hold {n + 1} entries, got "
                             f"{tuple(pointers.shape)}")
        parts += [pointers[0], pointers[-1],
                  pointers.diff().min() if n else pointers[0]]
    if nnz:
        parts += [indices.min(), indices.max()]
    if not parts:
        return
    values = torch.stack([t.long() for t in parts]).tolist()
    if pointers is not None:
        first, last, low = values[:3]
        values = values[3:]
        if first != 0 or low < 0 or last != nnz:
            raise ValueError(f"a sparse adjacency's {name} must start at 0, not decrease and "
                             f"end at its {nnz} entries; torch does not check them unless "
                             f"torch.sparse.check_sparse_tensor_invariants is on")
    if nnz and (values[0] < 0 or values[1] >= n):
        bad = values[0] if values[0] < 0 else values[1]
        raise ValueError(f"a sparse adjacency's indices must lie in [0, {n}), got {bad}; "
                         f"torch does not check them unless "
                         f"torch.sparse.check_sparse_tensor_invariants is on")


def physical_memory() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


# bytes per node of a graph's node-indexed arrays at build time (row pointers, a count, a
# degree: int64 / float64 each); their sum past the machine's memory cannot be built
NODE_ARRAY_BYTES = 24


def check_node_arrays_fit(n: int, device: torch.device, inferred: bool) -> None:
    """ValueError when a CPU graph of ``n`` nodes needs more memory for its node-indexed arrays
    alone than the machine has: one edge to a raw id of 3,000,000,000 made n the id + 1 and a
    ~24 GB allocation, the process killed by the OS (a data audit). ``inferred``: n was taken
    from the largest id (no num_nodes given)."""
    need = NODE_ARRAY_BYTES * (n + 1)
    # (below 1 GB, or while TorchDynamo traces, the OS is not asked: os.sysconf broke the
    # traced graph of a compiled topk_pool on an edge_index; a review)
    if need < 1 << 30 or device.type != "cpu" or torch.compiler.is_compiling():
        return
    total = physical_memory()
    if total is None or need <= total:
        return
    what = "num_nodes was taken as the largest node id + 1" if inferred else "num_nodes"
    raise ValueError(f"{what} = {n:,}: the graph's node arrays alone would need "
                     f"~{need / 1e9:.3g} GB, more than this machine's {total / 1e9:.3g} GB; "
                     + ("pass num_nodes, or number the nodes 0..n-1 (torch.unique(edge_index, "
                        "return_inverse=True))" if inferred else "number the nodes 0..n-1"))


def check_unpool_args(perm: object, num_nodes: object, k: int) -> torch.Tensor:
    """Validate ``perm`` [k] (distinct, in range) and ``num_nodes`` for unpooling."""
    num_nodes = check_num_nodes(num_nodes)  # int-like (numpy ints too), >= 0
    perm = check_index_vector(perm, "perm", length=k)
    if perm.numel():
        if int(perm.max()) >= int(num_nodes):
            raise ValueError(f"perm refers to node {int(perm.max())} but num_nodes is {num_nodes}")
        if torch.unique(perm).numel() != perm.numel():
            raise ValueError("perm has repeated node indices")
    return perm


def check_score_weight(score_weight: object, d: int, dtype: torch.dtype) -> torch.Tensor:
    """p as a [d] vector of x's dtype; rejects wrong shape, non-float, NaN/Inf and ‖p‖ = 0."""
    p = check_dense_tensor(score_weight, "score_weight")
    if p.dim() == 2 and p.shape[0] == 1:
        p = p.view(-1)  # PyG stores the projection as [1, d]
    if p.dim() != 1 or p.shape[0] != d:
        raise ValueError(f"score_weight must have shape [{d}] (or [1, {d}]), got "
                         f"{tuple(score_weight.shape)}")
    check_float_dtype(p, "score_weight")
    if p.dtype != dtype:
        raise TypeError(f"score_weight has dtype {p.dtype} but x has {dtype}")
    if not all_finite(p):
        raise non_finite_error("score_weight contains NaN or Inf")
    if not bool((p != 0).any()):
        raise ValueError("score_weight is all zeros: the score x·p/‖p‖ is undefined")
    return p


def check_prototype_args(z: object, prototypes: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Shared validation: both 2-D float, finite, same d/dtype/device, at least one prototype."""
    z = check_float_matrix(z, "z")
    prototypes = check_float_matrix(prototypes, "prototypes")
    if prototypes.shape[0] < 1:
        raise ValueError("prototypes must have at least one row")
    if z.shape[1] != prototypes.shape[1]:
        raise ValueError(f"z has {z.shape[1]} features but prototypes have {prototypes.shape[1]}")
    if z.dtype != prototypes.dtype:
        raise TypeError(f"z has dtype {z.dtype} but prototypes have {prototypes.dtype}")
    if z.device != prototypes.device:
        raise ValueError(f"z is on {z.device} but prototypes are on {prototypes.device}")
    return z, prototypes
