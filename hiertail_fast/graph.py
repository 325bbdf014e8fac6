"""`CSRGraph`: an immutable compressed-sparse-row graph container.

Orientation (PyG's default flow ``source_to_target``): an edge ``j -> i`` (``edge_index[0] = j``,
``edge_index[1] = i``) is stored in ROW ``i`` (the target) with COLUMN ``j`` (the source), so the
stored matrix M has ``M[i, j] = w_{j->i}`` and ``M @ X`` aggregates messages into their targets.
Rows are sorted, and columns are sorted inside each row, so the entry order is (target, source).

Duplicate edges (``dedupe=True``, the default) follow PyG's ``coalesce``: in an UNWEIGHTED graph an
edge is in the set or not (duplicates collapse to one unit edge); in a WEIGHTED graph the weights of
duplicates are SUMMED. With ``dedupe=False`` duplicates stay as separate entries (they still sum in
any propagation, as in PyG's message passing).

Nothing here mutates a caller's tensor; every derived quantity (row index of every entry, GCN
degrees, transposed CSR, symmetry flag) is computed once per graph and cached on the object, so an
epoch loop on a fixed graph pays for it once. Caches are keyed by their options (and dtype/device);
the ones that depend on the edge weights (degrees, normalised values, transpose, symmetry, A²,
the propagation operator) also by the weights' version counter, so an in-place update of
learnable weights (an optimizer step on an ``nn.Parameter``) is seen even under ``no_grad``.
How the caches stay valid (versions, stamps, locks, pickling, the registry of live graphs) is
`hiertail_fast._graph_cache`, the base class `GraphCaches`; this module is the graph itself.
Edge weights that require grad keep their autograd history through construction, `subgraph`,
the self-loop methods (gathers / sums are differentiable) and `augment_a2` (its result's
weights). Input checks, the COO -> CSR build and deg^-1/2 are module-level helpers in
`hiertail_fast._csr`.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from hiertail_fast._csr import (  # noqa: F401  (is_sparse_adjacency: re-exported)
    check_csr,
    coo_to_csr,
    csr_square,
    deg_inv_sqrt,
    is_sparse_adjacency,
    sparse_to_coo,
    square_values,
)
from hiertail_fast._graph_cache import (  # noqa: F401  (outside_inference_mode: re-exported)
    SNAPSHOT,
    STALE,
    GraphCaches,
    Versioned,
    outside_inference_mode,
    synchronized,
)
from hiertail_fast._validation import (
    all_finite,
    check_dense_tensor,
    check_edge_index,
    check_edge_weight,
    check_finite_number,
    check_flag,
    check_index_dtype,
    check_node_arrays_fit,
    check_num_nodes,
    check_weights_fit,
    duplicate_sum_overflow,
)
from hiertail_fast.ops._amp import autocast_off
from hiertail_fast.ops._functorch import check_no_tangent, outside_transforms, plain, wrapped

_ASSUMED = "assumed_symmetric"   # True: declared (assume_symmetric); Versioned: inherited


class CSRGraph(GraphCaches):
    """Immutable CSR graph; see the module docstring for the orientation and duplicate rules.

    Attributes (read-only):
        indptr:    int64 [n + 1], row (target) pointers.
        indices:   int64 [nnz], column (source) of every entry, sorted inside each row.
        weight:    float [nnz] or None (all edges have unit weight).
        num_nodes: n.
    """

    __slots__ = ()     # the arrays and caches: `GraphCaches`

    def __init__(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        weight: torch.Tensor | None = None,
        num_nodes: int | None = None,
        *,
        validate: bool = True,
    ) -> None:
        if validate:
            indptr, indices, weight, num_nodes = check_csr(indptr, indices, weight, num_nodes)
        check_no_tangent("CSRGraph (its edge weights)", weight)   # jvp: was a silent 0
        # built inside a torch.func transform (its tensors wrapped, _functorch): the arrays
        # and constant weights as plain tensors, so the graph and its caches outlive it
        indptr, indices = plain(indptr, "CSRGraph"), plain(indices, "CSRGraph")
        if weight is not None and not weight.requires_grad:
            weight = plain(weight, "CSRGraph")
        if not torch.compiler.is_compiling() and (indptr.is_inference() or indices.is_inference()):
            # inference tensors have no version counter, so an in-place edit of them could not
            # be refused (`_check_arrays`: the graph served the operator of their old contents;
            # a mutation audit): the graph keeps its own copy of such arrays
            with torch.inference_mode(False):
                indptr, indices = indptr.clone(), indices.clone()
        super().__init__(indptr, indices, weight,
                         num_nodes if num_nodes is not None else indptr.numel() - 1)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_edge_index(
        cls,
        edge_index: torch.Tensor,
        edge_weight: torch.Tensor | None = None,
        num_nodes: int | None = None,
        *,
        symmetrize: bool = False,
        dedupe: bool = True,
        remove_self_loops: bool = False,
    ) -> CSRGraph:
        """Build from ``edge_index`` [2, E] (row 0 = source, row 1 = target, as PyG).

        ``symmetrize`` adds every reversed edge (A + Aᵀ before deduplication; weighted graphs thus
        get ``w_ij + w_ji`` on each pair, like PyG's ``to_undirected(reduce="add")``).
        ``dedupe`` merges duplicate edges (weights summed; unweighted: kept once).
        ``remove_self_loops`` drops every ``i -> i`` edge. O(E log E) (one sort).
        """
        symmetrize = check_flag(symmetrize, "symmetrize")
        dedupe = check_flag(dedupe, "dedupe")
        remove_self_loops = check_flag(remove_self_loops, "remove_self_loops")
        if num_nodes is not None:
            num_nodes = check_num_nodes(num_nodes)
        ei = check_edge_index(edge_index, num_nodes)
        w = check_edge_weight(edge_weight, ei.shape[1])
        inferred = num_nodes is None
        if inferred:
            num_nodes = int(ei.max()) + 1 if ei.numel() else 0
            check_num_nodes(num_nodes)
        check_node_arrays_fit(num_nodes, ei.device, inferred)
        src, dst = ei[0].long(), ei[1].long()
        if remove_self_loops:
            keep = src != dst
            src, dst = src[keep], dst[keep]
            w = None if w is None else w[keep]
        if symmetrize:
            src, dst = torch.cat([src, dst]), torch.cat([dst, src])
            w = None if w is None else torch.cat([w, w])
        out = cls._from_coo(dst, src, w, num_nodes, dedupe=dedupe)
        if symmetrize and not torch.compiler.is_compiling():
            # symmetric by construction for the weights as they are: recorded for their
            # version, as an inherited symmetry (an in-place update that breaks it is seen;
            # declared, it held forever and the backward applied Â for Âᵀ; a cache audit)
            out._cache[_ASSUMED] = Versioned(out._weight_version(), True)
        elif symmetrize:
            out.assume_symmetric()               # traced: no counters to key on
        return out

    @classmethod
    def from_sparse(cls, adj: Any) -> CSRGraph:
        """Build from a sparse adjacency in PyG's ``adj_t`` orientation: row = target, column =
        source (``adj[i, j]`` is the weight of the edge ``j -> i``, this class's own
        orientation). ``adj``: a torch sparse tensor [n, n] (COO, CSR or CSC; its values are the
        edge weights, kept with their autograd history; duplicate entries summed, as
        ``coalesce`` sums them) or a ``torch_sparse.SparseTensor`` (without values: unweighted;
        a duplicate entry stays a separate unit entry, so it counts twice in every propagation,
        as torch_sparse's own product and PyG count it). O(nnz log nnz) (one sort)."""
        row, col, w, n = sparse_to_coo(adj)
        check_node_arrays_fit(n, row.device, inferred=False)
        # without values there is no weight to sum duplicates into: unweighted deduplication
        # would keep one of them (PyG's GCNConv on the same adj_t counts both)
        return cls._from_coo(row, col, w, n, dedupe=w is not None)

    @classmethod
    def _from_coo(cls, row: torch.Tensor, col: torch.Tensor, w: torch.Tensor | None, n: int,
                  *, dedupe: bool) -> CSRGraph:
        """CSR from unsorted (row = target, col = source) entries; inputs are not modified.
        Finite weights of duplicate entries summing past their dtype's range (3e38 twice in
        float32, 4e4 twice in float16): ValueError (``duplicate_sum_overflow``)."""
        indptr, indices, weight = coo_to_csr(row, col, w, n, dedupe=dedupe)
        if (weight is not None and weight.numel() < w.numel()       # duplicates were summed
                and not torch.compiler.is_compiling()):
            with outside_transforms():
                if not all_finite(plain(weight.detach(), "CSRGraph")):
                    raise duplicate_sum_overflow(weight.dtype)
        return cls(indptr, indices, weight, n, validate=False)

    # ------------------------------------------------------------------ basic views
    @property
    def indptr(self) -> torch.Tensor:
        return self._indptr

    @property
    def indices(self) -> torch.Tensor:
        return self._indices

    @property
    def weight(self) -> torch.Tensor | None:
        return self._weight

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @property
    def num_edges(self) -> int:
        return self._indices.numel()

    @property
    def device(self) -> torch.device:
        return self._indptr.device

    @synchronized
    def clear_cache(self) -> CSRGraph:
        """Drop every cached quantity (row index, degrees, normalised values, operators, the
        transpose, A², the symmetry check); each is rebuilt on demand. The caches of a used
        graph can be many times its own size (A² alone ~100x on a real graph): free them when
        a graph is kept but no longer propagated over. A declared symmetry
        (``assume_symmetric``) is kept, and an inherited one when it still holds, with the
        copy of learnable weights that guards it (a symmetry kept without that copy was
        trusted after a fused optimizer step had broken it: Â applied for Âᵀ; a review).
        Returns self."""
        declared = self._cache.get(_ASSUMED)
        keep = {}
        if declared is True:
            keep[_ASSUMED] = True
        elif declared is not None and self._declared_symmetric():
            keep = {key: self._cache[key] for key in (_ASSUMED, SNAPSHOT) if key in self._cache}
        self._cache.clear()
        self._stamps.clear()
        self._cache.update(keep)
        return self

    def row_index(self) -> torch.Tensor:
        """Target (row) of every CSR entry, int64 [nnz] (cached)."""
        return self._cached("row", lambda: torch.repeat_interleave(   # nnz: no host read
            torch.arange(self._num_nodes, device=self.device), self._indptr.diff(),
            output_size=self._indices.numel()))

    def edge_index(self) -> torch.Tensor:
        """[2, nnz] edge_index (row 0 = source, row 1 = target), in CSR (target, source) order."""
        return torch.stack([self._indices, self.row_index()])

    def edge_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """The stored weights (None for an unweighted graph), optionally cast."""
        if self._weight is None or dtype is None:
            return self._weight
        return self._weight.to(dtype)

    def weight_or_ones(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The entries' weights in ``dtype`` (CSR order), ones for an unweighted graph."""
        if self._weight is not None:
            return self._weight.to(dtype)
        return torch.ones(self.num_edges, dtype=dtype, device=self.device)

    def degree(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Weighted in-degree (row sums of M, i.e. summed over the TARGET index), [n], in
        ``dtype``: summed in float64 (`_wide_degree`), rounded once. ``dtype`` a torch.dtype
        (TypeError otherwise: "float32" failed inside torch.promote_types)."""
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype (e.g. torch.float32), got {dtype!r}")
        return self._wide_degree(dtype).to(dtype)

    def _wide_degree(self, dtype: torch.dtype) -> torch.Tensor:
        """The degree before its rounding to ``dtype``, in float64 (or ``dtype`` if wider): the
        row lengths of an unweighted graph, else the weights (as ``dtype`` holds them) summed in
        float64. A float32 running sum stops growing at 2^24: a node of in-degree 20,971,520
        got 16,777,216 (its deg^-1/2 12 % high, its GCN row 15 %)."""
        wide = torch.promote_types(dtype, torch.float64)
        if self._weight is None:
            return self._indptr.diff().to(wide)
        return torch.zeros(self._num_nodes, dtype=wide, device=self.device).index_add(
            0, self.row_index(), self._weight.to(dtype).to(wide))

    def has_self_loop(self) -> torch.Tensor:
        """bool [n]: whether node i has at least one stored ``i -> i`` entry (cached)."""
        def compute() -> torch.Tensor:
            mask = torch.zeros(self._num_nodes, dtype=torch.bool, device=self.device)
            loops = self._indices == self.row_index()
            # (index_fill_: no Python value made into a tensor, which CUDA may copy blocking)
            mask.index_fill_(0, self._indices[loops], True)
            return mask
        return self._cached("has_loop", compute)

    def __repr__(self) -> str:
        kind = "unweighted" if self._weight is None else f"weighted {self._weight.dtype}"
        return (f"CSRGraph(num_nodes={self._num_nodes}, num_edges={self.num_edges}, {kind}, "
                f"device={self.device})")

    def to(self, device: torch.device | str) -> CSRGraph:
        """The graph on `device`: itself when already there (immutable, so its caches are kept),
        else a copy (caches rebuilt on demand; a known symmetry flag is kept). A device only:
        ``to(torch.float64)`` is a TypeError saying so (it was torch.device()'s own)."""
        if isinstance(device, torch.dtype):
            raise TypeError(f"CSRGraph.to takes a device, got the dtype {device}: a graph moves "
                            f"between devices only (the ops compute in the features' dtype)")
        if not isinstance(device, (str, torch.device, int)) or isinstance(device, bool):
            raise TypeError(f"CSRGraph.to takes a device (a str, torch.device or CUDA index), "
                            f"got {type(device).__name__}")
        if torch.device(device) == self.device:
            return self
        w = None if self._weight is None else self._weight.to(device)
        return self._copy_of(CSRGraph(self._indptr.to(device), self._indices.to(device), w,
                                      self._num_nodes, validate=False))

    def __deepcopy__(self, memo: dict) -> CSRGraph:
        """A copy of the arrays with the caches left behind (rebuilt on demand; torch cannot
        deep-copy the cached sparse CSR operators, which made ``copy.deepcopy`` of a used
        graph fail); a known symmetry flag is kept, as ``to`` keeps it."""
        arrays = (copy.deepcopy(t, memo) for t in (self._indptr, self._indices, self._weight))
        out = self._copy_of(CSRGraph(*arrays, self._num_nodes, validate=False))
        memo[id(self)] = out
        return out

    def _copy_of(self, copy_: CSRGraph) -> CSRGraph:
        """``copy_`` (``to``, ``deepcopy``) as a copy of this graph: its symmetry, or, when
        this graph's arrays were edited in place since it was built, refused at every use as
        this graph is (as a pickled copy is: it carried the old symmetry flag and served the
        edited arrays with it, a backward applying Â for Âᵀ; a cache audit)."""
        if self._stale_arrays():
            copy_._arrays_version = STALE
            return copy_
        return self._copy_symmetry(copy_)

    # ------------------------------------------------------------------ self-loops
    def remove_self_loops(self) -> CSRGraph:
        """A new graph without the self-loop entries (every stored copy); weights and an
        inherited symmetry kept."""
        keep = self._indices != self.row_index()
        row = self.row_index()[keep]
        indptr = torch.zeros(self._num_nodes + 1, dtype=torch.long, device=self.device)
        torch.cumsum(torch.bincount(row, minlength=self._num_nodes), 0, out=indptr[1:])
        w = None if self._weight is None else self._weight[keep]
        return self._inherit_symmetry(
            CSRGraph(indptr, self._indices[keep], w, self._num_nodes, validate=False))

    def with_self_loops(self, fill: float = 1.0, *, remaining: bool = True) -> CSRGraph:
        """Add self-loops of weight `fill`.

        ``remaining=True`` (PyG ``add_remaining_self_loops``): only nodes WITHOUT a self-loop get
        one; existing self-loops keep their weight. ``remaining=False`` (PyG ``add_self_loops``):
        every node gets an extra loop entry (kept as a separate entry next to an existing one).
        """
        remaining = check_flag(remaining, "remaining")
        fill = check_finite_number(fill, "fill")
        n = self._num_nodes
        nodes = torch.arange(n, device=self.device)
        if remaining:
            nodes = nodes[~self.has_self_loop()]
        if self._weight is None and float(fill) == 1.0:
            w = None
        else:
            dtype = self._weight.dtype if self._weight is not None else torch.get_default_dtype()
            loop_w = torch.full((nodes.numel(),), float(fill), dtype=dtype, device=self.device)
            w = torch.cat([self.weight_or_ones(dtype), loop_w])
        row = torch.cat([self.row_index(), nodes])
        col = torch.cat([self._indices, nodes])
        return self._inherit_symmetry(CSRGraph._from_coo(row, col, w, n, dedupe=False))

    # ------------------------------------------------------------------ GCN normalisation
    def gcn_deg_inv_sqrt(self, improved: bool = True, add_self_loops: bool = True,
                         dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """``(dinv, loop)``, both [n]: ``loop_i`` = fill (2 if improved else 1) for nodes without
        a stored self-loop when `add_self_loops`, else 0; ``deg_i = Σ_row w + loop_i`` and
        ``dinv = deg^-1/2`` with 0 where deg = 0 (as PyG's gcn_norm).

        Cached (detached) per (improved, add_self_loops, dtype) when the weights do not require
        grad; otherwise recomputed so gradients flow to the weights through the degrees.
        """
        improved = check_flag(improved, "improved")
        add_self_loops = check_flag(add_self_loops, "add_self_loops")

        def compute() -> tuple[torch.Tensor, torch.Tensor]:
            check_weights_fit(self._weight, dtype)
            fill = 2.0 if improved else 1.0
            if add_self_loops:
                loop = (~self.has_self_loop()).to(dtype) * fill
            else:
                loop = torch.zeros(self._num_nodes, dtype=dtype, device=self.device)
            # the loop added before the one rounding to dtype (deg + 2 in float32 rounds again
            # past 2^24)
            return deg_inv_sqrt(self._wide_degree(dtype) + loop, dtype), loop
        if self._weight is not None and self._weight.requires_grad and torch.is_grad_enabled():
            self._check_arrays()
            self._check_weights()
            return compute()
        return self._cached_w(("dinv", bool(improved), bool(add_self_loops), dtype), compute)

    def gcn_norm_values(self, improved: bool = True, add_self_loops: bool = True,
                        dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values [nnz], diag [n])`` of Â = D^-1/2 (A + loop·I) D^-1/2 on this CSR pattern:
        ``values_e = dinv_i w_e dinv_j`` for entry (i, j) and ``diag_i = loop_i dinv_i²`` (the
        added self-loop, kept apart so A + I is never built). Cached like `gcn_deg_inv_sqrt`."""
        def compute() -> tuple[torch.Tensor, torch.Tensor]:
            dinv, loop = self.gcn_deg_inv_sqrt(improved, add_self_loops, dtype)
            values = dinv[self.row_index()] * self.weight_or_ones(dtype) * dinv[self._indices]
            return values, loop * dinv * dinv
        if self._weight is not None and self._weight.requires_grad and torch.is_grad_enabled():
            self._check_arrays()
            self._check_weights()
            return compute()
        return self._cached_w(("norm", bool(improved), bool(add_self_loops), dtype), compute)

    # ------------------------------------------------------------------ transpose / symmetry
    def transpose_perm(self) -> torch.Tensor:
        """Permutation p of the entries such that entry p[k] of self is entry k of the transpose
        (cached). Stable sort by column: the transposed rows come out sorted."""
        return self._cached("tperm", lambda: torch.sort(self._indices, stable=True)[1])

    def column_counts(self) -> torch.Tensor:
        """[n] int64 number of entries in each column (the transpose's row lengths), cached."""
        return self._cached("col_counts",
                            lambda: torch.bincount(self._indices, minlength=self._num_nodes))

    def transpose(self) -> CSRGraph:
        """The reversed graph (every ``j -> i`` becomes ``i -> j``); cached for the current
        version of the weights (it holds a gathered copy of them)."""
        def compute() -> CSRGraph:
            perm = self.transpose_perm()
            n = self._num_nodes
            indptr = torch.zeros(n + 1, dtype=torch.long, device=self.device)
            torch.cumsum(self.column_counts(), 0, out=indptr[1:])
            w = None if self._weight is None else self._weight[perm]
            return CSRGraph(indptr, self.row_index()[perm], w, n, validate=False)
        if self.known_symmetric:
            return self
        return self._cached_w("transpose", compute)

    @property
    @synchronized
    def known_symmetric(self) -> bool | None:
        """True/False when symmetry is already known (checked for the current weights, or
        declared: inherited from a symmetric parent by subgraph / self-loop methods / A² /
        symmetrize), None when not yet checked. ValueError on arrays edited in place since the
        graph was built (it answered for their old contents, and ``transpose`` returned the
        graph itself)."""
        self._check_arrays()
        if self._declared_symmetric():
            return True
        if torch.compiler.is_compiling():   # (no counters while tracing: see above)
            return None
        hit = self._cache.get("symmetric")
        if hit is not None and self._weights_current(hit.version):
            return hit.value
        return None

    @synchronized
    def _declared_symmetric(self) -> bool:
        """Symmetry declared (``assume_symmetric``), or inherited from a symmetric parent for
        the weights as they are (None: unweighted; -1: inference tensors, no counter)."""
        declared = self._cache.get(_ASSUMED)
        if declared is True or not declared:
            return bool(declared)
        if declared.version is None:        # unweighted: the structure's, checked by _check_arrays
            return True
        if declared.version == -1:
            # inference-mode weights have no counter: an in-place edit of them (in inference
            # mode) could not be seen, so the inheritance is not trusted (the ops check the
            # live weights; it held forever, and transpose() returned the graph itself)
            return False
        if torch.compiler.is_compiling():
            # traced: no counters to compare (as in ``_versions``), and an in-place update
            # between calls of the compiled code would not re-trace it. Not declared, so the
            # ops check the live weights when they run (taking it as declared here let a
            # compiled pooling mark its pooled graph symmetric after the parent's weights
            # lost their symmetry: gcn's backward then applied Â for Âᵀ, grad off by 0.7)
            return False
        return self._weights_current(declared.version)

    @synchronized
    def assume_symmetric(self) -> CSRGraph:
        """Declare M == Mᵀ without checking (e.g. an induced subgraph of a symmetric graph, built
        elsewhere) so backward passes reuse this CSR; returns self. Wrong use gives wrong
        gradients: only call it when symmetry holds by construction (also after any in-place
        update of the weights: the declaration is not re-checked)."""
        self._cache[_ASSUMED] = True
        self._cache.pop("transpose", None)
        return self

    def _copy_symmetry(self, copy_: CSRGraph) -> CSRGraph:
        """A copy of this graph (``to``, ``deepcopy``) keeps a declared symmetry declared (it
        became an inherited one, lost at the copy's first in-place update) and inherits any
        other known symmetry."""
        if self._cache.get(_ASSUMED) is True:
            return copy_.assume_symmetric()
        return self._inherit_symmetry(copy_)

    def _inherit_symmetry(self, child: CSRGraph) -> CSRGraph:
        """``child`` (a subgraph, A², the graph with self-loops changed, ...) is symmetric when
        this graph is: recorded for the child's weights as they are now, so an in-place update
        of them that breaks the symmetry is seen (the backward passes then check again)."""
        if not self.known_symmetric:
            return child
        if torch.compiler.is_compiling():               # traced: no counters to key on
            return child.assume_symmetric()
        child._cache[_ASSUMED] = Versioned(child._weight_version(), True)
        child._cache.pop("transpose", None)
        return child

    @synchronized
    def is_symmetric(self) -> bool:
        """Whether M == Mᵀ, weights included (cached for the current weight version).
        Duplicate entries with different weights can make the check False for a symmetric
        multigraph (then the transposed path is used)."""
        known = self.known_symmetric
        if known is not None:
            return known

        def compute() -> bool:
            t = self.transpose()
            if not torch.equal(t.indptr, self._indptr) or not torch.equal(t.indices, self._indices):
                return False
            if self._weight is None:
                return True
            return bool(torch.equal(t.weight.detach(), self._weight.detach()))
        result = self._cached_w("symmetric", compute)
        if result:  # the transpose is the graph itself: free the copy
            self._cache.pop("transpose", None)
        return result

    # ------------------------------------------------------------------ subgraph / A²
    def subgraph(self, nodes: torch.Tensor, *, return_entry_index: bool = False):
        """Induced subgraph on `nodes` (distinct ids), relabelled in the ORDER of `nodes`: node
        ``nodes[t]`` becomes t. Touches only the kept ROWS: a segment gather of rows
        nodes[0], nodes[1], ... gives the candidate entries already grouped by new row
        (O(n + Σ deg(nodes)), not O(nnz): for HierTail's k = n/#classes that is ~#classes
        times less work than filtering every entry); a relabel lookup drops entries whose
        source was not kept; one sort of (row, col) keys restores sorted columns in a row
        (not stable: duplicate entries come in an unspecified, reproducible order). With
        `return_entry_index`, also returns the int64 index of every kept entry into this
        graph's entries (to carry edge data)."""
        return_entry_index = check_flag(return_entry_index, "return_entry_index")
        self._check_arrays()      # (it reads indptr / indices directly)
        nodes = check_dense_tensor(nodes, "nodes")
        if nodes.dim() != 1:
            raise ValueError(f"nodes must be 1-D, got shape {tuple(nodes.shape)}")
        check_index_dtype(nodes, "nodes")
        n, k = self._num_nodes, nodes.numel()
        dev = self.device
        nodes = nodes.long().to(dev)
        # two host reads in all (on CUDA each is a sync): the ids' range before they index,
        # then how many are distinct together with the subgraph's entry count
        lo, hi = torch.stack(torch.aminmax(nodes)).tolist() if k else (0, -1)
        if lo < 0 or hi >= n:
            raise ValueError(f"nodes must lie in [0, {n})")
        relabel = torch.full((n,), -1, dtype=torch.long, device=dev)
        relabel[nodes] = torch.arange(k, device=dev)
        starts = self._indptr[nodes]
        counts = self._indptr[nodes + 1] - starts
        cum = torch.cumsum(counts, 0)
        distinct, total = (torch.stack([(relabel >= 0).sum(), cum[-1]]).tolist() if k
                           else (0, 0))
        if distinct != k:
            raise ValueError("nodes contains duplicate ids")
        # entry ids of rows nodes[0], nodes[1], ...: row start + position inside the segment
        entry = torch.repeat_interleave(starts - (cum - counts), counts, output_size=total)
        entry += torch.arange(total, device=dev)
        new_col = relabel[self._indices[entry]]
        new_row = torch.repeat_interleave(torch.arange(k, device=dev), counts, output_size=total)
        keep = new_col >= 0
        out, entry = self._induced_from_entries(entry[keep], new_row[keep], new_col[keep], k)
        return (out, entry) if return_entry_index else out

    def _induced_from_entries(self, entry: torch.Tensor, new_row: torch.Tensor,
                              new_col: torch.Tensor, k: int) -> tuple[CSRGraph, torch.Tensor]:
        """Assemble the k-node induced graph from its kept entries (ids into this graph, with
        their relabelled row/col) in any order: one sort of (row, col) keys gives CSR order
        (not stable: duplicate entries come in an unspecified, reproducible order — a stable
        int64 sort is ~10x slower on CPU). Returns the graph and the entry ids in its order."""
        self._check_arrays()      # edited arrays: refused, not pooled with the old symmetry
        self._check_weights()             # NaN / Inf weights stop here, not in the pooled graph
        order = torch.sort(new_row * max(k, 1) + new_col).indices
        entry, new_col = entry[order], new_col[order]
        indptr = torch.zeros(k + 1, dtype=torch.long, device=self.device)
        torch.cumsum(torch.bincount(new_row, minlength=k), 0, out=indptr[1:])
        w = None if self._weight is None else self._weight[entry]
        # an induced submatrix of a symmetric matrix is symmetric
        return self._inherit_symmetry(CSRGraph(indptr, new_col, w, k, validate=False)), entry

    def augment_a2(self) -> CSRGraph:
        """The official HierTail ``augment_adj``: drop self-loops, add unit self-loops, square
        (weighted sparse·sparse product), drop self-loops again. Off-diagonal weights become
        ``2 w_uv + Σ_k w_uk w_kv`` (weighted 2-hop walks). Weights that need gradients (a
        learnable graph, under autograd or torch.func) get them through the result's weights
        (``_csr.square_values``; before, A² was formed from detached weights and their gradient
        silently lacked every path through it); such a result is made anew per call (its
        autograd graph is one step's). Cost O(Σ_v deg_v²): can be nearly dense around hubs.
        Otherwise cached on the graph for the current weight version (a training loop that
        augments the same input graph every epoch pays once). While TorchDynamo traces: one
        custom op (``ops/_custom_graph_ops.traced_augment_a2``), or, for weights that need
        gradients, the eager method (a graph break)."""
        learnable = self._weight is not None and torch.is_grad_enabled() and (
            self._weight.requires_grad or wrapped(self._weight))
        if torch.compiler.is_compiling():
            if learnable:
                return _eager_augment_a2(self)
            from hiertail_fast.ops import _custom_graph_ops

            if _custom_graph_ops.READY:
                return _custom_graph_ops.traced_augment_a2(self)
        if learnable:
            self._check_arrays()
            self._check_weights()
            return self._augment_a2()
        return self._cached_w("a2", self._augment_a2)

    def _augment_a2(self) -> CSRGraph:
        g = self.remove_self_loops().with_self_loops(1.0)
        n = g.num_nodes
        if n == 0:
            return CSRGraph(g.indptr, g.indices, torch.zeros(0, device=g.device), 0,
                            validate=False)
        dtype = g.weight.dtype if g.weight is not None else torch.get_default_dtype()
        vals = g.weight_or_ones(dtype)
        if vals.requires_grad or wrapped(vals):
            # weights that need gradients: the product's entries from the structure alone (an
            # entry whose weights sum to exactly 0 stays, for its gradient: a weight at 0 got
            # none), one product per graph structure (cached), the values differentiably
            row, col = self._cached("a2 pattern", lambda: _off_diagonal(*csr_square(
                g.indptr, g.indices, torch.ones(g.num_edges, device=g.device), n))[:2])
            val = square_values(g.indptr, g.indices, vals, n, row, col)
        else:
            # from plain values (scipy cannot read functorch's wrappers: "no storage")
            known = plain(vals.detach(), "CSRGraph.augment_a2")
            with outside_transforms(), autocast_off(known):   # the weights' dtype
                row, col, val = _off_diagonal(*csr_square(g.indptr, g.indices, known, n))
        # (M²)ᵀ = (Mᵀ)²: the square of a symmetric graph is symmetric
        return self._inherit_symmetry(CSRGraph._from_coo(row, col, val, n, dedupe=True))


def _off_diagonal(row: torch.Tensor, col: torch.Tensor, val: torch.Tensor):
    """The entries of a COO matrix off its diagonal (A²'s loops are dropped)."""
    keep = row != col
    return row[keep], col[keep], val[keep]


def _eager_augment_a2(graph: CSRGraph) -> CSRGraph:
    """``CSRGraph.augment_a2`` of weights that need gradients while TorchDynamo traces: run
    eagerly (a graph break; the traced custom op has no gradient for the weights). Wrapped
    here, not by a decorator: ``torch.compiler.disable`` imports TorchDynamo (and with it
    triton), which ``import hiertail_fast`` must not (tests/test_package.py)."""
    return torch.compiler.disable(CSRGraph.augment_a2)(graph)
