"""GraphMixup's self-supervised targets (PROTOCOL_AND_BASELINES.md §2.8) without an n×n matrix.

Local-path (official ``NodeDistance`` + ``PairwiseDistance.sample``): the official code fills an
n×n int matrix D with the hop distance of every pair up to ``cutoff = dis_nclass − 1`` (networkx
all-pairs BFS), sets the rest to ``max + 1`` (max = the largest hop found), keeps the upper
triangle and subtracts 1; hop class i ∈ {1, …, max + 1} (i = max + 1: 'far') holds the pairs
u < v with D[u, v] = i in row-major order (``np.where``), and ``k_num`` of them are drawn
without replacement. Label = i − 1. Here (`local_path_pairs`):

1. one pass of truncated BFS from every source in blocks of B sources (scipy's C Dijkstra with
   ``unweighted=True, limit=cutoff``: a [B, n] block at a time, O(B·n) memory) keeps only the
   per-source counts c[u, i] = #{v > u : class i} — O(n·dis_nclass) memory;
2. ranks are drawn per class in [0, Σ_u c[u, i]) (`sample_distinct`, O(k) memory);
3. a rank r is the pair in row-major position r: its source u is found by a search in the
   cumulated counts, its v by a second BFS from the drawn sources only (the r'-th v > u of the
   class in increasing v).
Same ranks -> the same pairs as the dense construction (`local_path_pairs_dense`, the test
oracle). COST: the counts need every source's ball, so step 1 is all-pairs in TIME —
O(n · |ball_cutoff|) ≤ O(n·|E|) — though linear in memory; on graphs whose 5-hop balls cover a
large part of the graph (most graphs with mean degree ≥ 10 past ~10⁵ nodes) it is O(n²) work.

Global-path (official ``ClusteringMachine``): METIS parts (pymetis when installed, else
`bfs_partition`), the centre of each part = its node of highest within-part degree, and the
target T[v, c] = 1 / hop(v, centre_c) (0 when unreachable or v is the centre) — [n, clu_nclass],
from one BFS per centre (`global_path_targets`). Already linear in the official code but for its
dense networkx graph; no all-pairs step.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import breadth_first_order, connected_components, dijkstra

from hiertail_fast.graph import CSRGraph

_BLOCK_ELEMS = 1 << 20          # sources × n of one BFS block (8 MB of float64 distances)


def raw_adjacency(graph: CSRGraph, self_loops: bool) -> CSRGraph:
    """The binarised adjacency GraphMixup uses: A (official: no self-loops) or A+I."""
    g = graph.remove_self_loops()
    if self_loops:
        g = g.with_self_loops(1.0, remaining=False)
    return CSRGraph(g.indptr, g.indices, None, g.num_nodes)


def _scipy(graph: CSRGraph) -> sp.csr_matrix:
    n = graph.num_nodes
    data = np.ones(graph.num_edges, dtype=np.float64)
    return sp.csr_matrix((data, graph.indices.cpu().numpy(), graph.indptr.cpu().numpy()),
                         shape=(n, n))


def _block(n: int) -> int:
    return max(1, _BLOCK_ELEMS // max(n, 1))


def _class_codes(a: sp.csr_matrix, sources: np.ndarray, cutoff: int, far: int) -> np.ndarray:
    """int32 [len(sources), n]: the hop class of (u, v) for v > u — hop d ∈ [1, cutoff], or
    ``far`` beyond the cutoff / unreachable — and 0 for v ≤ u (lower triangle and diagonal)."""
    d = dijkstra(a, directed=False, indices=sources, unweighted=True, limit=cutoff)
    code = np.where(np.isfinite(d), d, far).astype(np.int32)
    code[np.arange(a.shape[0])[None, :] <= sources[:, None]] = 0
    return code


def sample_distinct(total: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """min(k, total) distinct ints in [0, total), uniform, in O(k) memory (``total`` may be
    ~n²/2): a random permutation when total ≤ 4k, else repeated draws keeping the first
    occurrence of each value until there are k. Deterministic given ``generator``."""
    if total <= 0:
        return torch.zeros(0, dtype=torch.long)
    if total <= 4 * k:
        return torch.randperm(total, generator=generator)[:k]
    got = torch.zeros(0, dtype=torch.long)
    while got.numel() < k:
        draw = torch.randint(0, total, (2 * (k - got.numel()),), generator=generator)
        cat = torch.cat([got, draw])
        uniq, inv = torch.unique(cat, return_inverse=True)
        first = torch.full((uniq.numel(),), cat.numel(), dtype=torch.long)
        first.scatter_reduce_(0, inv, torch.arange(cat.numel()), "amin")
        got = cat[first.sort().values]                     # first occurrences, in draw order
    return got[:k]


def _hop_class_counts(a: sp.csr_matrix, cutoff: int) -> np.ndarray:
    """int64 [n, cutoff + 2]: column i = #{v > u : hop(u, v) = i} (i ≤ cutoff), column
    cutoff + 1 = the rest (far). Column 0 unused. Blocked over sources: O(B·n) memory."""
    n = a.shape[0]
    counts = np.zeros((n, cutoff + 2), dtype=np.int64)
    for lo in range(0, n, _block(n)):
        src = np.arange(lo, min(lo + _block(n), n))
        code = _class_codes(a, src, cutoff, cutoff + 1)
        for i in range(1, cutoff + 2):
            counts[src, i] = (code == i).sum(1)
    return counts


def local_path_pairs(graph: CSRGraph, dis_nclass: int, k_num: int,
                     generator: torch.Generator):
    """(u, v, label): int64 [P] each, the official local-path training pairs (module docstring),
    classes in order 1, …, far; min(k_num, class size) pairs per class (the official
    ``np.random.choice(replace=False)`` raises when a class has fewer than k_num pairs).
    ``graph``: the binarised adjacency (`raw_adjacency`). Memory O(n·dis_nclass + B·n + P)."""
    cutoff = dis_nclass - 1
    a = _scipy(graph)
    n = a.shape[0]
    counts = _hop_class_counts(a, cutoff)
    hop_found = [i for i in range(1, cutoff + 1) if counts[:, i].sum() > 0]
    max_hop = max(hop_found, default=0)              # the official distance.max() (0: no edge)
    classes = list(range(1, max_hop + 1)) + ([cutoff + 1] if counts[:, -1].sum() > 0 else [])
    us, ranks, cls = [], [], []
    for i in classes:
        cum = np.cumsum(counts[:, i])
        r = sample_distinct(int(cum[-1]), k_num, generator).numpy()
        u = np.searchsorted(cum, r, side="right")            # the row holding rank r
        us.append(u)
        ranks.append(r - (cum[u] - counts[u, i]))            # rank inside row u
        cls.append(np.full(r.size, i))
    u, r_in, c = (np.concatenate(t) if t else np.zeros(0, np.int64) for t in (us, ranks, cls))
    v = np.empty_like(u)
    src_all = np.unique(u)
    for lo in range(0, src_all.size, _block(n)):       # BFS again from the drawn sources only
        src = src_all[lo:lo + _block(n)]
        code = _class_codes(a, src, cutoff, cutoff + 1)
        sel = np.nonzero((u >= src[0]) & (u <= src[-1]))[0]
        row = np.searchsorted(src, u[sel])
        for i in np.unique(c[sel]):
            s_i = sel[c[sel] == i]
            rr, vv = np.nonzero(code == i)                   # row-major, like np.where
            start = np.searchsorted(rr, np.arange(src.size))
            v[s_i] = vv[start[row[c[sel] == i]] + r_in[s_i]]
    label = np.where(c == cutoff + 1, max_hop, c - 1)    # far -> (max + 1) − 1
    return tuple(torch.as_tensor(t, dtype=torch.long) for t in (u, v, label))


def local_path_pairs_dense(graph: CSRGraph, dis_nclass: int, k_num: int,
                           generator: torch.Generator):
    """The official construction (test oracle; O(n²) memory): networkx all-pairs BFS with the
    cutoff into an n×n matrix, far := max + 1, upper triangle, −1; per class the same ranks
    (`sample_distinct`) into its row-major ``np.where`` list."""
    import networkx as nx
    n = graph.num_nodes
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(graph.edge_index().t().tolist())
    dist = -np.ones((n, n), dtype=np.int64)
    for s, p in nx.all_pairs_shortest_path_length(g, cutoff=dis_nclass - 1):
        for t, d in p.items():
            dist[s, t] = d
    dist[dist == -1] = dist.max() + 1
    labels = np.triu(dist) - 1
    out = []
    for i in range(1, int(labels.max()) + 2):
        pairs = np.array(np.where(labels + 1 == i)).T
        idx = sample_distinct(len(pairs), k_num, generator).numpy()
        out.append(pairs[idx])
    pairs = np.concatenate(out) if out else np.zeros((0, 2), np.int64)
    return (torch.as_tensor(pairs[:, 0]), torch.as_tensor(pairs[:, 1]),
            torch.as_tensor(labels[pairs[:, 0], pairs[:, 1]]))


def bfs_partition(graph: CSRGraph, parts: int) -> np.ndarray:
    """Part id [n] when pymetis is missing: the nodes in BFS order (component by component,
    each from its lowest id) cut into ``parts`` consecutive runs of ⌈n/parts⌉ — connected-ish
    balanced parts in O(n + |E|); not METIS's min-cut partition."""
    a = _scipy(graph)
    n = a.shape[0]
    _, comp = connected_components(a, directed=False)
    order, seen = [], np.zeros(n, dtype=bool)
    for start in np.unique(comp, return_index=True)[1]:
        if not seen[start]:
            o = breadth_first_order(a, start, directed=False, return_predecessors=False)
            seen[o] = True
            order.append(o)
    order = np.concatenate(order)
    part = np.empty(n, dtype=np.int64)
    part[order] = np.arange(n) // max(1, -(-n // parts))
    return part


def partition(graph: CSRGraph, parts: int) -> tuple[np.ndarray, str]:
    """(part id [n], which partitioner): METIS through pymetis as the official code, else
    `bfs_partition`."""
    try:
        import pymetis
    except ImportError:
        return bfs_partition(graph, parts), "bfs (pymetis not installed)"
    g = graph.remove_self_loops()
    _, member = pymetis.part_graph(parts, xadj=g.indptr.cpu().numpy(),
                                   adjncy=g.indices.cpu().numpy())
    return np.asarray(member, dtype=np.int64), "metis"


def cluster_centres(graph: CSRGraph, part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(part ids present, ascending; their centres): the node of highest within-part degree
    (ties: the largest node id; a part without internal edges: its largest node id)."""
    row = graph.row_index().cpu().numpy()
    col = graph.indices.cpu().numpy()
    inside = part[row] == part[col]
    deg = np.bincount(row[inside], minlength=part.size)
    order = np.lexsort((np.arange(part.size), deg, part))   # by part, then degree, then id
    last = np.r_[part[order][1:] != part[order][:-1], True]
    return part[order][last], order[last]


def global_path_targets(graph: CSRGraph, part_ids: np.ndarray, centres: np.ndarray,
                        num_parts: int) -> torch.Tensor:
    """float32 [n, num_parts]: column part_ids[j] = 1 / hop(v, centres[j]), 0 if unreachable
    or v is the centre; columns of absent parts 0. One BFS per centre: O(n·num_parts)."""
    d = dijkstra(_scipy(graph), directed=False, indices=centres, unweighted=True)
    t = np.zeros((graph.num_nodes, num_parts))
    with np.errstate(divide="ignore"):
        t[:, part_ids] = np.where(np.isfinite(d) & (d > 0), 1.0 / d, 0.0).T
    return torch.as_tensor(t, dtype=torch.float32)


def global_path_targets_dense(graph: CSRGraph, part_ids: np.ndarray, centres: np.ndarray,
                              num_parts: int) -> torch.Tensor:
    """The official ``shortest_path_to_clusters`` (test oracle): a deque BFS from each centre's
    neighbours at depth 1, the centre itself left at 0."""
    import collections
    n = graph.num_nodes
    nbrs = [graph.indices[graph.indptr[i]:graph.indptr[i + 1]].tolist() for i in range(n)]
    t = np.zeros((n, num_parts))
    for c, centre in zip(part_ids, centres, strict=True):
        visited, q = {int(centre)}, collections.deque((x, 1) for x in nbrs[centre])
        while q:
            node, depth = q.popleft()
            if node in visited:
                continue
            visited.add(node)
            t[node, c] = 1 / depth
            q.extend((x, depth + 1) for x in nbrs[node])
    return torch.as_tensor(t, dtype=torch.float32)
