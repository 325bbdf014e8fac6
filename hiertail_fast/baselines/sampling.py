"""The SMOTE family's characteristic steps (PROTOCOL_AND_BASELINES.md §1.5, §2.2, §2.4, §2.5).

- `tail_classes`: the last ``im_class_num`` labels, in the official order C-1, C-2, ...
- `upsample_rounds`: which training nodes each round of synthetic nodes comes from, under the
  official ``up_scale`` rules: ``rule="src"`` (over-sampling, ``src_upsample``), ``"smote"``
  (``src_smote``) and ``"recon"`` (Embed-SMOTE / GraphSMOTE, ``recon_upsample``).
- `same_class_nearest_neighbour`: the nearest other point by Euclidean distance (float64, first
  index on ties, a single point is its own neighbour), in row blocks: O(block·m) memory.
- `smote_interpolate`: x_v + λ(x_nn(v) − x_v), one λ per round (official) or per node.
- `augment_adjacency`: the over-sampling / SMOTE graph [n+s, n+s] built sparsely in
  O(|E| + s·deg) memory — same entries as the official dense construction, which
  `augment_adjacency_dense` reproduces (the test oracle; O((n+s)²)).

Classes without training nodes get no synthetic nodes (the official code divides by zero there).
"""
from __future__ import annotations

import torch

from hiertail_fast._validation import MAX_NODES
from hiertail_fast.graph import CSRGraph

RULES = ("src", "smote", "recon")
_NN_BLOCK = 1024


def tail_classes(num_classes: int, im_class_num: int) -> list[int]:
    """The official tail classes: ``c_largest - i`` for i < im_class_num (labels sorted by
    descending class size, so these are the smallest classes), in that order."""
    if im_class_num < 1 or im_class_num > num_classes:
        raise ValueError(f"im_class_num must lie in [1, num_classes={num_classes}], "
                         f"got {im_class_num}")
    return [num_classes - 1 - i for i in range(im_class_num)]


# The most synthetic nodes a method adds, per node of the graph: the up-sampled graph is at
# most 101x the original (up_scale 1e9 on Email hung for minutes, then ran out of memory in the
# per-round lists, before any check; the official runs use up_scale <= 1).
MAX_SYNTHETIC_PER_NODE = 100


def check_synthetic_count(count: int, num_nodes: int, what: str) -> None:
    """ValueError naming ``what`` when ``count`` synthetic nodes on a graph of ``num_nodes``
    nodes exceed ``MAX_SYNTHETIC_PER_NODE`` per node, or `MAX_NODES`, the most a graph can
    index (an enormous ``up_scale`` / ``gen_ratio`` failed deep inside a list or tensor
    allocation, e.g. OverflowError "cannot fit 'int' into an index-sized integer", or hung
    building them until memory ran out)."""
    if num_nodes + count > MAX_NODES:
        raise ValueError(f"{what} asks for {count} synthetic nodes; with the graph's "
                         f"{num_nodes} that exceeds the {MAX_NODES} nodes a graph can hold")
    if count > MAX_SYNTHETIC_PER_NODE * max(num_nodes, 1):
        raise ValueError(f"{what} asks for {count} synthetic nodes, more than "
                         f"{MAX_SYNTHETIC_PER_NODE}x the graph's {num_nodes} nodes (the most "
                         "this harness builds)")


def upsample_rounds(y: torch.Tensor, train_idx: torch.Tensor, num_classes: int,
                    im_class_num: int, up_scale: float, rule: str
                    ) -> list[tuple[int, torch.Tensor]]:
    """[(class c, source node ids of one round)] in the official order.

    With T_c the class's training nodes in ``train_idx`` order, n_c = |T_c|, k = up_scale and
    avg = ⌊|train| / C⌋:
    - ``src``  (over-sampling): k > 0: ⌊k⌋ rounds over T_c + one over its first ⌊(k−⌊k⌋)·n_c⌋;
      k = 0: ⌊avg/n_c⌋ rounds over T_c.
    - ``smote``: as ``src``, and for k = 0 also a last round over the first
      ⌊(avg/n_c − ⌊avg/n_c⌋)·n_c⌋ nodes.
    - ``recon`` (Embed-SMOTE): k > 0: ONE round over the first min(⌊k·n_c⌋, n_c);
      k = 0: ⌊avg/n_c⌋ rounds over T_c.
    Empty rounds are dropped.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")

    def parts(n_c: int, avg: int) -> list[int]:
        if rule == "recon":
            if up_scale == 0:
                return [n_c] * int(avg / n_c)
            return [min(int(n_c * up_scale), n_c)]
        if up_scale == 0:
            out = [n_c] * int(avg / n_c)
            if rule == "smote":
                out.append(int(n_c * (avg / n_c - int(avg / n_c))))
            return out
        check_synthetic_count(int(up_scale) * n_c, y.shape[0], f"up_scale={up_scale}")
        return [n_c] * int(up_scale) + [int(n_c * (up_scale - int(up_scale)))]

    return tail_rounds(y, train_idx, num_classes, im_class_num, up_scale, parts)


def tail_rounds(y: torch.Tensor, train_idx: torch.Tensor, num_classes: int, im_class_num: int,
                up_scale: float, parts) -> list[tuple[int, torch.Tensor]]:
    """The official up-sampling loop shared by every rule: per tail class c (``tail_classes``
    order) with T_c its training nodes in ``train_idx`` order, n_c = |T_c| > 0 and
    avg = ⌊|train| / C⌋, the rounds (c, T_c[:m]) for m in ``parts(n_c, avg)``, empty ones
    dropped (classes without training nodes are skipped)."""
    if up_scale < 0:
        raise ValueError(f"up_scale must be >= 0, got {up_scale}")
    train_idx = train_idx.long()
    y_train = y[train_idx]
    avg = int(train_idx.numel() / num_classes)
    plan = []
    for c in tail_classes(num_classes, im_class_num):
        t_c = train_idx[y_train == c]
        if t_c.numel():
            plan.append((c, t_c, [m for m in parts(t_c.numel(), avg) if m > 0]))
    # the cap is the graph's: `parts` keeps each class within it, and three tail classes made
    # 3x it (a baselines audit)
    check_synthetic_count(sum(sum(sizes) for _, _, sizes in plan), y.shape[0],
                          f"up_scale={up_scale}")
    return [(c, t_c[:m]) for c, t_c, sizes in plan for m in sizes]


def same_class_nearest_neighbour(feats: torch.Tensor) -> torch.Tensor:
    """Local index of each row's nearest OTHER row (Euclidean, float64, lowest index on ties);
    a single row is its own neighbour. feats [m, d] -> int64 [m]. The official code uses
    scipy's pdist with the diagonal set to max + 100 — the same argmin for m >= 2."""
    if feats.dim() != 2:
        raise ValueError(f"feats must be 2-D [m, d], got shape {tuple(feats.shape)}")
    m = feats.shape[0]
    f = feats.detach().to(torch.float64)
    out = torch.zeros(m, dtype=torch.long, device=feats.device)
    if m <= 1:
        return out
    for lo in range(0, m, _NN_BLOCK):
        hi = min(lo + _NN_BLOCK, m)
        d = torch.cdist(f[lo:hi], f)
        rows = torch.arange(hi - lo, device=feats.device)
        d[rows, rows + lo] = float("inf")
        out[lo:hi] = d.argmin(dim=1)
    return out


def smote_interpolate(feats: torch.Tensor, neighbour: torch.Tensor, generator: torch.Generator,
                      per_node: bool = False) -> torch.Tensor:
    """x_v + λ(x_nn(v) − x_v) for every row v of ``feats`` [m, d]; λ ~ U(0, 1) drawn from
    ``generator`` (on the CPU): once for the round (official) or once per row (``per_node``).
    Differentiable in ``feats`` through both endpoints."""
    lam = torch.rand(feats.shape[0] if per_node else 1, 1, generator=generator,
                     dtype=torch.float64).to(device=feats.device, dtype=feats.dtype)
    # index_select: neighbours repeat, and its CPU backward adds them in a fixed order
    # (advanced indexing's runs in parallel: not reproducible run to run)
    return feats + (feats.index_select(0, neighbour) - feats) * lam


def _gather_rows(graph: CSRGraph, nodes: torch.Tensor):
    """(k, col, w) for every entry of the rows ``nodes[k]``; O(Σ deg) memory."""
    indptr = graph.indptr
    start, cnt = indptr[nodes], indptr[nodes + 1] - indptr[nodes]
    k = torch.repeat_interleave(torch.arange(nodes.numel(), device=nodes.device), cnt)
    offset = torch.arange(k.numel(), device=nodes.device) - (torch.cumsum(cnt, 0) - cnt)[k]
    entry = start[k] + offset
    return k, graph.indices[entry], graph.weight_or_ones(torch.float32)[entry]


def augment_adjacency(graph: CSRGraph, sources: torch.Tensor) -> CSRGraph:
    """The official over-sampling graph, sparse: node n+k is a copy of ``sources[k]`` with
    A'[n+k, :n] = A[S_k, :], A'[:n, n+k] = A[:, S_k], A'[n+k, n+l] = A[S_k, S_l] and the
    original block unchanged (weights copied, nothing re-normalised). With the self-loops of
    A+I, a copy links to its source and itself, and copies of adjacent sources (or of the same
    source) link to each other. Memory O(|E| + s·deg(S)); no (n+s)² matrix."""
    n, s = graph.num_nodes, int(sources.numel())
    sources = sources.long().to(graph.device)
    if s and (int(sources.min()) < 0 or int(sources.max()) >= n):
        raise ValueError(f"sources must lie in [0, {n})")
    w0 = graph.weight_or_ones(torch.float32)
    rows, cols, ws = [graph.row_index()], [graph.indices], [w0]
    k, col, w = _gather_rows(graph, sources)                  # A[S_k, :] -> row n+k
    rows.append(n + k)
    cols.append(col)
    ws.append(w)
    kt, colt, wt = _gather_rows(graph.transpose(), sources)   # A[:, S_k] -> column n+k
    rows.append(colt)
    cols.append(n + kt)
    ws.append(wt)
    # A[S_k, S_l]: every entry (S_k, j) of the copied rows, once per copy l of j.
    order = torch.argsort(sources, stable=True)
    s_sorted = sources[order]
    lo = torch.searchsorted(s_sorted, col, right=False)
    cnt = torch.searchsorted(s_sorted, col, right=True) - lo
    e = torch.repeat_interleave(torch.arange(col.numel(), device=col.device), cnt)
    pos = lo[e] + torch.arange(e.numel(), device=col.device) - (torch.cumsum(cnt, 0) - cnt)[e]
    rows.append(n + k[e])
    cols.append(n + order[pos])
    ws.append(w[e])
    return CSRGraph._from_coo(torch.cat(rows), torch.cat(cols), torch.cat(ws), n + s,
                              dedupe=False)


def augment_adjacency_dense(adj: torch.Tensor, sources: torch.Tensor) -> torch.Tensor:
    """The official dense construction (``src_upsample``/``src_smote``): O((n+s)²) memory.
    Test oracle for `augment_adjacency`."""
    n, s = adj.shape[0], sources.numel()
    out = adj.new_zeros(n + s, n + s)
    out[:n, :n] = adj
    out[n:, :n] = adj[sources, :]
    out[:n, n:] = adj[:, sources]
    out[n:, n:] = adj[sources, :][:, sources]
    return out
