"""LTE4G's characteristic steps (PROTOCOL_AND_BASELINES.md §2.11), in O(n·d + |E|) memory.

- `head_tail_split`: ``sep_class="pareto_XY"`` -> sep_point, the number of head classes (labels
  0..sep_point-1; labels are sorted by size, so the head is the large classes).
- `node_degrees`: the column sums of the binarised A+I (self-loop counted), from the CSR entries;
  the official code sums a dense n×n copy.
- `group_train_nodes` / `group_eval_nodes`: the four class × degree subsets HH, HT, TH, TT
  (degree ≥ sep_degree+1 is high; the official "closest of sep_degree+1 and sep_degree" rule,
  which never ties on integer degrees).
- `similar_nodes`: for the given centre nodes, the union of the ranks 2..11 of each centre's row of
  cos(X, X) − Ā (Ā the binarised adjacency), as the official ``topk(10+1)[1][:, 1:]``. The official
  code forms the n×n cosine matrix (once per class) and a dense adjacency copy; here only the
  centres' rows are formed, ``block`` of them at a time: O(block·n) memory.
- `class_prototypes`: each class's centroid from its training nodes, topped up (classes under the
  ``criterion`` count) with the 1-hop neighbours and then the similar nodes most likely of that
  class under the pre-trained classifier.
- `route_to_tail`: top-1 cosine similarity to the centroids ≥ sep_point -> the tail student.
- `focal_loss`, `distillation_loss`, `curriculum_alpha`: the losses of the three stages.

The dense ``*_dense`` functions are the official computations, the test oracles (O(n²)).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from hiertail_fast.baselines.sampling import _gather_rows
from hiertail_fast.graph import CSRGraph

GROUPS = ("HH", "HT", "TH", "TT")   # {head, tail class} × {high, low degree}
_BLOCK_ELEMS = 1 << 22              # centre rows × n of one block of cosines (16 MB in fp32)
_TOPK = 10                          # official: each centre's 10 most similar nodes


def head_tail_split(train_counts, sep_class: str = "pareto_73",
                    generator: torch.Generator | None = None) -> int:
    """LTE4G's ``separator_ht``: the number of head classes. With X/Y from "pareto_XY", C classes
    and d the per-class training counts (in label order), the cut candidate is d[⌊C·X/10⌋]:
    either the classes with d ≥ it or those with d > it are counted as head, whichever count
    ratio #head/#tail is closer to X/Y (an exact tie: a coin from ``generator``); ⌊C·X/10⌋ = 0
    gives one head class. The head is then the FIRST that many labels. A split with no head
    class (all counts equal) would leave the head experts without outputs and the official code
    crash; it is raised to 1 (what it evidently means)."""
    d = np.asarray(train_counts, dtype=np.int64)
    c = d.size
    if c < 2:
        raise ValueError(f"LTE4G needs at least 2 classes, got {c}")
    head, tail = int(sep_class[-2]), int(sep_class[-1])
    head_idx = int(c * (head / 10))
    if head_idx == 0:
        return 1
    cut = d[head_idx]

    def gap(n_head: int) -> float:
        n_tail = c - n_head
        return abs(n_head / n_tail - head / tail) if n_tail else math.inf

    ge, gt = int((d >= cut).sum()), int((d > cut).sum())
    if gap(ge) < gap(gt):
        sep = ge
    elif gap(ge) > gap(gt):
        sep = gt
    else:
        sep = ge if torch.randint(2, (1,), generator=generator).item() == 0 else gt
    return max(sep, 1)


def node_degrees(graph: CSRGraph) -> torch.Tensor:
    """int64 [n]: the number of nonzero entries in each column of A (self-loop included)."""
    n = graph.num_nodes
    nz = graph.weight_or_ones(torch.float32) != 0
    key = torch.unique(graph.row_index()[nz] * n + graph.indices[nz])   # binarised: once each
    return torch.bincount(key % n, minlength=n)


def node_degrees_dense(adj: torch.Tensor) -> torch.Tensor:
    """Official: column sums of the binarised dense adjacency (test oracle)."""
    return (adj != 0).long().sum(0)


def _split_by_degree(nodes: torch.Tensor, degrees: torch.Tensor, sep_degree: int):
    high = degrees[nodes] >= sep_degree + 1
    return nodes[high], nodes[~high]


def group_train_nodes(train_idx: torch.Tensor, y: torch.Tensor, sep_point: int,
                      degrees: torch.Tensor, sep_degree: int,
                      generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """The training nodes of HH, HT, TH, TT (head class = label < sep_point; high degree =
    degree ≥ sep_degree+1), each in ``train_idx`` order. A class group with a single training
    node puts it in one of its two subsets by a coin from ``generator`` (official). The official
    code shuffles each subset; every loss over it is a mean, so the order does not matter."""
    out: dict[str, torch.Tensor] = {}
    is_tail = y[train_idx] >= sep_point
    for g, mask in (("H", ~is_tail), ("T", is_tail)):
        nodes = train_idx[mask]
        if nodes.numel() == 1:
            coin = torch.randint(2, (1,), generator=generator).item()
            empty = nodes[:0]
            out[g + "H"], out[g + "T"] = (nodes, empty) if coin == 0 else (empty, nodes)
        else:
            out[g + "H"], out[g + "T"] = _split_by_degree(nodes, degrees, sep_degree)
    return out


def group_eval_nodes(idx: torch.Tensor, y: torch.Tensor, sep_point: int, degrees: torch.Tensor,
                     sep_degree: int) -> dict[str, torch.Tensor]:
    """Validation / test nodes by their TRUE class group and degree (official
    ``separate_eval``); used to select the experts and students."""
    out: dict[str, torch.Tensor] = {}
    is_tail = y[idx] >= sep_point
    for g, mask in (("H", ~is_tail), ("T", is_tail)):
        out[g + "H"], out[g + "T"] = _split_by_degree(idx[mask], degrees, sep_degree)
    return out


def similar_nodes(x: torch.Tensor, graph: CSRGraph, centres: torch.Tensor,
                  block_elems: int = _BLOCK_ELEMS) -> torch.Tensor:
    """Sorted unique ids: per centre c, the nodes at ranks 2..11 (ties: torch.topk's order) of
    cos(x_c, x_j) − 1[A_cj ≠ 0] over all j; O(block·n) memory, ``block`` = block_elems / n rows.
    The official rank-1 drop assumes it is the centre itself, whose score is 0 (1 − its
    self-loop); it is whatever node scores highest, as here."""
    n = x.shape[0]
    if centres.numel() == 0:
        return centres
    xn = F.normalize(x.float(), dim=1)
    k = min(_TOPK + 1, n)
    block = max(1, block_elems // max(n, 1))
    picked = []
    for lo in range(0, centres.numel(), block):
        rows = centres[lo:lo + block]
        score = xn[rows] @ xn.T                                        # [b, n]
        r, col, w = _gather_rows(graph, rows)
        nz = w != 0
        score[r[nz], col[nz]] -= 1.0       # duplicate entries write the same value: once each
        picked.append(score.topk(k, dim=1).indices[:, 1:].reshape(-1))
    return torch.unique(torch.cat(picked))


def similar_nodes_dense(x: torch.Tensor, adj: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """Official: the full n×n cosine matrix minus the dense binarised adjacency, the centres'
    rows, ``topk(11)[1][:, 1:]`` (test oracle; O(n²))."""
    xn = F.normalize(x.float(), dim=1)
    sim = (xn @ xn.T)[centres] - (adj[centres] != 0).float()
    return torch.unique(sim.topk(min(_TOPK + 1, x.shape[0]), dim=1).indices[:, 1:].reshape(-1))


def _most_likely(nodes: torch.Tensor, prob_c: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` of ``nodes`` with the highest probability (descending; ties: lower id)."""
    order = torch.sort(prob_c[nodes], descending=True, stable=True).indices
    return nodes[order[:max(k, 0)]]


def fill_target(train_counts: torch.Tensor, criterion: str) -> int:
    """The resource count classes are topped up to: ⌊mean⌋, ⌊median⌋ (numpy's) or max."""
    counts = train_counts.cpu().numpy()
    if criterion == "mean":
        return int(counts.sum() / counts.size)
    if criterion == "median":
        return int(np.median(counts))
    if criterion == "max":
        return int(counts.max())
    raise ValueError(f"criterion must be 'mean', 'median' or 'max', got {criterion!r}")


def class_resources(c: int, centres: torch.Tensor, target: int, prob: torch.Tensor,
                    x: torch.Tensor, graph: CSRGraph, fill: str = "official") -> torch.Tensor:
    """The nodes whose embeddings average to class c's centroid: its training nodes
    (``centres``), and when they are fewer than ``target`` (gap = target − |centres|):
    (a) the gap most-likely-c of their 1-hop neighbours that are not centres; (b) then, while
    short, the most-likely-c similar nodes (`similar_nodes`, which may repeat earlier ones). The
    official (b) fills ``gap − len(resources)`` nodes only when ``len(resources) < gap`` — with
    ``resources`` counting the centres too (``fill="official"``); ``fill="gap"`` fills what (a)
    left: gap − |picks of (a)|."""
    gap = target - centres.numel()
    if gap <= 0:
        return centres
    _, col, w = _gather_rows(graph, centres)
    nbrs = torch.unique(col[w != 0])
    nbrs = nbrs[~torch.isin(nbrs, centres)]
    picks = _most_likely(nbrs, prob[:, c], gap)
    have = centres.numel() + picks.numel() if fill == "official" else picks.numel()
    parts = [centres, picks]
    if have < gap:
        sim = similar_nodes(x, graph, centres)
        parts.append(_most_likely(sim, prob[:, c], gap - have))
    return torch.cat(parts)


def class_prototypes(embed: torch.Tensor, prob: torch.Tensor, x: torch.Tensor,
                     graph: CSRGraph, y: torch.Tensor, train_idx: torch.Tensor,
                     num_classes: int, criterion: str = "mean",
                     fill: str = "official") -> torch.Tensor:
    """[C, h] centroids: the mean embedding of each class's `class_resources`; a class with no
    resource at all (no training node: the official code takes the mean of nothing, NaN) gets
    the zero vector, which routes no node to it (cosine 0)."""
    y_train = y[train_idx]
    counts = torch.bincount(y_train, minlength=num_classes)
    target = fill_target(counts, criterion)
    out = embed.new_zeros(num_classes, embed.shape[1])
    for c in range(num_classes):
        res = class_resources(c, train_idx[y_train == c], target, prob, x, graph, fill)
        if res.numel():
            out[c] = embed[res].mean(0)
    return out


def route_to_tail(embed: torch.Tensor, centroids: torch.Tensor, sep_point: int) -> torch.Tensor:
    """bool [n]: the most cosine-similar centroid is a tail class's (index ≥ sep_point)."""
    sim = F.normalize(embed, dim=1) @ F.normalize(centroids, dim=1).T     # [n, C]: O(n·C)
    return sim.argmax(dim=1) >= sep_point


def focal_loss(logits: torch.Tensor, y: torch.Tensor, class_weight: torch.Tensor | None,
               gamma: float, alpha: float, focal: str = "batch") -> torch.Tensor:
    """LTE4G's encoder loss. ``"batch"`` (official): p_t = exp(−mean CE) is ONE scalar for the
    batch (not detached), L = (1 − p_t)^γ · CE_w with CE_w the class-weighted mean CE
    (``class_weight`` w_c = 1/n_c), or α(1 − p_t)^γ · CE without weights. ``"sample"`` (the
    paper's focal loss): p_i = exp(−CE_i), L = Σ w_{y_i}(1 − p_i)^γ CE_i / Σ w_{y_i}, or
    α · mean((1 − p_i)^γ CE_i)."""
    if focal == "batch":
        pt = torch.exp(-F.cross_entropy(logits, y))
        if class_weight is not None:
            return (1 - pt) ** gamma * F.cross_entropy(logits, y, weight=class_weight)
        return (1 - pt) ** gamma * alpha * F.cross_entropy(logits, y)
    if focal != "sample":
        raise ValueError(f"focal must be 'batch' or 'sample', got {focal!r}")
    ce = F.cross_entropy(logits, y, reduction="none")
    term = (1 - torch.exp(-ce)) ** gamma * ce
    if class_weight is not None:
        w = class_weight[y]
        return (w * term).sum() / w.sum()
    return alpha * term.mean()


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float,
                      reduction: str = "mean") -> torch.Tensor:
    """T²·KL(softmax(t/T) ‖ softmax(s/T)); ``"mean"`` (official) averages over all m·k elements,
    ``"batchmean"`` over the m nodes. Over no node it is 0 (the official code gets NaN)."""
    if reduction not in ("mean", "batchmean"):
        raise ValueError(f"reduction must be 'mean' or 'batchmean', got {reduction!r}")
    if student.shape != teacher.shape:
        raise ValueError(f"student {tuple(student.shape)} and teacher {tuple(teacher.shape)} "
                         "logits differ in shape")
    if student.shape[0] == 0:
        return student.sum() * 0.0
    t = temperature
    # F.kl_div's element-wise terms p_t·(log p_t − log p_s) (0 where p_t = 0), written out: torch
    # warns that its reduction="mean" will become "batchmean", and "mean" is the official one.
    log_p = F.log_softmax(teacher / t, dim=1)
    kl = torch.exp(log_p) * (log_p - F.log_softmax(student / t, dim=1))
    total = kl.sum() / (kl.numel() if reduction == "mean" else kl.shape[0])
    return total * t * t


def curriculum_alpha(epoch: int, curriculum_ep: int) -> float:
    """α(e) = cos(e·π / (2·curriculum_ep)): the head-degree teacher's weight, 1 -> ~0."""
    return math.cos(epoch * math.pi / (2 * curriculum_ep))
