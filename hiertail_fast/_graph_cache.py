"""The caches of `hiertail_fast.graph.CSRGraph`, and what keeps them honest.

A graph caches everything derived from its arrays (row index, degrees, normalised values, the
transpose, A², the propagation operators, the symmetry check), so an epoch loop on a fixed graph
pays for each once. `GraphCaches`, the base class of `CSRGraph`, holds the arrays and those
caches, and owns the rules that keep a cached entry from ever serving stale numbers:

- STRUCTURAL entries (``_cached``: indptr / indices only) are valid while the arrays are as the
  graph was built with them. The graph keeps the arrays it is given (no copy), so their in-place
  version counters are recorded at construction and an edit since is refused (``_check_arrays``).
- WEIGHT entries (``_cached_w``) are `Versioned`: valid for the weights' version counter they
  were made from. Learnable weights are also compared with a copy (``SNAPSHOT``), since fused
  optimizers step a parameter without bumping its counter (``_weights_current``).
- Every entry is handed out as it is, so each is STAMPED with its own tensors' counters when
  made (``_stamp``): an entry a caller edited in place is rebuilt, not served.
- The weights are checked finite once per version (``_check_weights``).
- Each graph has its own re-entrant lock (``synchronized``), made at first use and renewed in a
  forked child; pickling keeps the entries valid at the time (``__getstate__``); and a registry
  of live graphs by their arrays (``_live``) lets the compiled graph ops, which receive tensors,
  find a graph's caches again.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from typing import Any, NamedTuple

import torch

from hiertail_fast._threads import in_forked_child
from hiertail_fast._validation import all_finite
from hiertail_fast.ops._functorch import outside_transforms, plain, wrapped

# Live graphs by their arrays (weak references). Under torch.compile the graph ops are custom
# ops that receive a graph's tensors, not the object (ops/_custom_graph_ops.py); they find the
# object again here to reuse its caches. A miss (the arrays were copied) builds a new object.
_LIVE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


FINITE_WEIGHTS = "weights checked finite"     # cache key: the weights' version last checked
# cache key: (version, copy) of learnable weights when their entries were made (`_weights_current`)
SNAPSHOT = "learnable weights when cached"
STALE = ("arrays modified in place before the graph was copied",)   # never a version tuple


def synchronized(method):
    """Run ``method`` under the graph's own lock. The caches are read, checked and dropped
    in several steps (`_weights_current` drops every weight entry when a fused optimizer
    stepped the weights without bumping their counter); two threads using one graph (a
    training thread and an evaluation thread, a DataLoader's workers in threads) interleaved
    those steps: one dropped the "weights checked finite" marker while the other set it
    again, which then served the operator of the OLD weights (a thread audit), or a dict
    changed size under a comprehension. Re-entrant (a computation caches its parts); not
    while TorchDynamo traces (a single thread, and no lock in the graph)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            return method(self, *args, **kwargs)
        lock = self._lock
        if lock is None:      # made at first eager use: a graph built while TorchDynamo traces
            with _NEW_LOCK:   # cannot make one (it does not trace threading.RLock())
                if self._lock is None:
                    self._lock = threading.RLock()
                    _WITH_LOCK.add(self)
                lock = self._lock
        with lock:
            return method(self, *args, **kwargs)
    return run


_NEW_LOCK = threading.Lock()
_WITH_LOCK: weakref.WeakSet = weakref.WeakSet()      # the graphs that made their lock


@in_forked_child
def _fresh_locks_after_fork() -> None:
    """In a forked child (a DataLoader worker, multiprocessing's "fork"): the graphs' locks as
    new. A lock another thread of the parent held at the fork stays held in the child, where
    that thread does not exist: the child's first use of the graph hung."""
    global _NEW_LOCK
    _NEW_LOCK = threading.Lock()
    for graph in list(_WITH_LOCK):
        graph._lock = None
    _WITH_LOCK.clear()


class Versioned(NamedTuple):
    """A cache entry valid only for one version of the edge weights."""
    version: int | None
    value: Any


def _carries_grad(value) -> bool:
    """Whether a cache entry holds a tensor with autograd history (the transpose of learnable
    weights gathers them differentiably): a copy would hold a leaf cut off from the copy's
    weights, and gradients through it would stop there."""
    if isinstance(value, torch.Tensor):
        return value.requires_grad
    if isinstance(value, GraphCaches):
        return value._weight is not None and value._weight.requires_grad
    if isinstance(value, (tuple, list)):
        return any(_carries_grad(v) for v in value)
    return False


# in a pickled graph's cache: "the weights' version when it was pickled" (a string: it is
# compared by value after the round trip)
_CURRENT = "weights' version when pickled"


def _stamp(value) -> tuple | None:
    """The in-place version counters of every tensor in a cache entry (a tensor, a CSRGraph's
    arrays, tuples of them): the entries are handed out as they are (``row_index()``,
    ``transpose()``, ...), and a caller's in-place edit of one (``row = g.row_index(); row +=
    offset``) corrupted every later call on the graph (found by a mutation audit): an entry
    whose stamp changed is rebuilt. None while TorchDynamo traces (no counters)."""
    if torch.compiler.is_compiling():
        return None
    if isinstance(value, torch.Tensor):
        return _versions(value)
    if isinstance(value, GraphCaches):
        return _stamp((value._indptr, value._indices, value._weight))
    if isinstance(value, (tuple, list)):
        return tuple(_stamp(v) for v in value)
    return ()


def _versions(*arrays: torch.Tensor) -> tuple | None:
    """In-place version counters of the arrays (None for inference tensors: they have none);
    None while TorchDynamo traces (a graph built there is never checked)."""
    if torch.compiler.is_compiling():
        return None
    return tuple(None if t.is_inference() else t._version for t in arrays)


def _arrays_key(indptr: torch.Tensor, indices: torch.Tensor, weight: torch.Tensor | None,
                num_nodes: int) -> tuple:
    # strides too: base[:n] and base[::2] start at the same address with the same shape (the
    # compiled op was served the other graph's operator; a mutation audit)
    return tuple((t.data_ptr(), t.shape, t.stride(), t.dtype, t.device) if t is not None
                 else None for t in (indptr, indices, weight)) + (int(num_nodes),)


@contextlib.contextmanager
def outside_inference_mode():
    """Inference mode switched off (and autograd with it) while a cache is filled: tensors
    made under ``torch.inference_mode()`` cannot be saved for backward, so a cache filled
    while a model was scored there made every later training step on the graph fail."""
    if torch.compiler.is_compiling() or not torch.is_inference_mode_enabled():
        yield           # (TorchDynamo cannot trace the mode query; compiled code has no
        return          # inference tensors to keep)
    with torch.inference_mode(False), torch.no_grad():
        yield


class GraphCaches:
    """The arrays of a CSR graph and every quantity cached from them (module docstring).
    `CSRGraph` adds the graph itself; this class holds no graph logic."""

    __slots__ = ("_indptr", "_indices", "_weight", "_num_nodes", "_cache", "_stamps",
                 "_arrays_version", "_lock", "__weakref__")

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, weight: torch.Tensor | None,
                 num_nodes: int) -> None:
        """Hold the (checked) arrays, with empty caches, and register the graph as live."""
        self._indptr = indptr
        self._indices = indices
        self._weight = weight
        self._num_nodes = int(num_nodes)
        self._cache: dict[Any, Any] = {}
        self._stamps: dict[Any, Any] = {}    # key -> `_stamp` of its entry when it was made
        self._lock: Any = None      # guards _cache / _stamps; made at first use (`synchronized`)
        self._arrays_version = _versions(indptr, indices)
        self._register()

    def _register(self) -> None:
        """Enter this graph in the registry of live graphs (``_live``), unless a live graph on
        the same arrays is there already: the first one keeps the entry (a graph the compiled
        op builds on them must not displace it). Not while traced (no memory to key on), nor
        for learnable weights inside a torch.func transform (a wrapper: no memory either)."""
        if not (torch.compiler.is_compiling() or wrapped(self._weight)):
            key = _arrays_key(self._indptr, self._indices, self._weight, self._num_nodes)
            first = _LIVE.get(key)
            if first is None or first._stale_arrays():
                # (a graph whose arrays were edited since it was built gives way: the compiled
                # op found it for a new graph built on the edited arrays and raised)
                _LIVE[key] = self

    @synchronized
    def __getstate__(self):
        """Pickled (``torch.save``, ``copy.copy``, a multiprocessing worker): the arrays and
        the caches that are valid now. A loaded tensor's version counter starts afresh, so an
        entry is kept only if it matches the weights' current version (marked "current", and
        given the loaded weights' version on load); stale entries are dropped, and arrays
        modified in place since construction stay refused in the copy too."""
        stale = self._arrays_version is not None and self._arrays_version != _versions(
            self._indptr, self._indices)
        ver = self._weight_version()
        cache = {}
        if not stale:
            # weights stepped without a counter bump (a fused optimizer): their entries are
            # dropped here, before the copy (`_weights_current`; it purges, so before the loop)
            if ver is not None and ver != -1:
                self._weights_current(ver)
            for key, value in list(self._cache.items()):
                entry = value.value if isinstance(value, Versioned) else value
                if not self._unedited(key, entry):
                    continue        # a caller edited it: the copy would take it as made
                if _carries_grad(value) or key == SNAPSHOT:
                    continue        # its autograd link to the weights would not survive (the
                    # snapshot: entries of learnable weights are remade after a load)
                if key == FINITE_WEIGHTS or isinstance(value, Versioned):
                    version = value if key == FINITE_WEIGHTS else value.version
                    if version != ver or ver == -1:
                        continue                               # stale (or untracked): dropped
                    # a plain tuple, not Versioned: torch.load(weights_only=True) with
                    # CSRGraph allowed must not need `Versioned`, a class of ours
                    value = _CURRENT if key == FINITE_WEIGHTS else (_CURRENT, value.value)
                cache[key] = value
        slots = {name: getattr(self, name) for name in GraphCaches.__slots__
                 if name not in ("__weakref__", "_cache", "_stamps", "_arrays_version", "_lock")}
        return None, {**slots, "_cache": cache, "_arrays_version": STALE if stale else None}

    def __setstate__(self, state) -> None:
        """Unpickled: the slots and the valid caches restored (``__getstate__``), the entries
        marked "current" keyed by the loaded weights' version, then registered as ``__init__``
        registers, so compiled ops find the graph and its caches."""
        _, slots = state
        for name, value in slots.items():
            object.__setattr__(self, name, value)
        self._stamps = {}     # (the loaded entries are stamped at their first use)
        self._lock = None     # (its own, made at first use)
        ver = self._weight_version()
        for key, value in list(self._cache.items()):
            if key == FINITE_WEIGHTS and value == _CURRENT:
                self._cache[key] = ver
            elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) \
                    and value[0] == _CURRENT:
                self._cache[key] = Versioned(ver, value[1])
        if self._arrays_version != STALE:
            self._arrays_version = _versions(self._indptr, self._indices)  # new counters
        self._register()

    @staticmethod
    def _live(indptr: torch.Tensor, indices: torch.Tensor, weight: torch.Tensor | None,
              num_nodes: int) -> GraphCaches | None:
        """A live graph holding exactly these arrays (same memory, shape, dtype, device),
        with its caches: the first one built on them that is still alive; None when there is
        none."""
        # (a graph whose arrays were edited since is returned too: its check then raises, as
        # eagerly; a graph built on the edited arrays replaces it in `_register`)
        return _LIVE.get(_arrays_key(indptr, indices, weight, num_nodes))

    def _check_arrays(self) -> None:
        """ValueError when indptr / indices were modified in place since the graph was built:
        it keeps the arrays it was given (no copy), and every cache and check was made from
        their old contents (a reused buffer served the old operator, or failed deep inside)."""
        if self._stale_arrays():
            raise ValueError(
                "CSRGraph: its indptr / indices were modified in place after it was built (the "
                "graph keeps the arrays it is given, without a copy, and its caches and checks "
                "were made from their old contents); build a new CSRGraph from the new arrays")

    def _stale_arrays(self) -> bool:
        """Whether indptr / indices were modified in place since the graph was built."""
        return (self._arrays_version is not None and not torch.compiler.is_compiling()
                and self._arrays_version != _versions(self._indptr, self._indices))

    @synchronized
    def _check_weights(self) -> bool:
        """ValueError when the stored weights hold NaN or Inf. Checked at construction and
        again, once per version, after any in-place update (a diverged optimizer step on
        learnable weights), so the fast backends raise what the reference raises instead of
        returning NaN rows. One read pass per weights' version (none for unweighted graphs).
        Returns True when the entries of the weights' current version are known valid now
        (`_weights_current` just said so, or they were dropped): `_cached_w` then needs no
        second comparison of learnable weights with their copy."""
        if self._weight is None or torch.compiler.is_compiling():
            return False
        ver = self._weight_version()
        if FINITE_WEIGHTS in self._cache and self._weights_current(self._cache[FINITE_WEIGHTS]):
            return True
        with outside_transforms():
            ok = all_finite(plain(self._weight.detach(), "CSRGraph"))
        if not ok:
            raise ValueError("the CSRGraph's edge weights contain NaN or Inf (modified in place "
                             "after the graph was built?)")
        if ver == -1:
            return False
        self._remember_weights(ver)
        self._cache[FINITE_WEIGHTS] = ver
        return True

    @synchronized
    def _cached(self, key: Any, fn):
        """Cache of a STRUCTURAL quantity (depends on indptr/indices only). Computed outside
        any torch.func transform (a plain tensor, as the arrays are: ``__init__``) and outside
        inference mode (``outside_inference_mode``)."""
        self._check_arrays()
        if key not in self._cache or not self._unedited(key, self._cache[key]):
            with outside_transforms(), outside_inference_mode():
                self._cache[key] = fn()
            self._stamp_entry(key, self._cache[key])
        return self._cache[key]

    def _stamp_entry(self, key: Any, value: Any) -> None:
        """Record the stamp of a new entry; an entry made while TorchDynamo traces (no
        counters) is stamped at its first eager use instead (storing None trusted it forever,
        edits included; the review of session 30)."""
        stamp = _stamp(value)
        if stamp is None:
            self._stamps.pop(key, None)
        else:
            self._stamps[key] = stamp

    def _unedited(self, key: Any, value: Any) -> bool:
        """Whether the entry at ``key`` is as it was made (`_stamp`); an entry loaded with the
        graph (pickle) is stamped at its first use."""
        stamp = _stamp(value)
        made = self._stamps.setdefault(key, stamp)
        return stamp is None or made is None or made == stamp

    def _weight_version(self) -> int | None:
        """Version of the stored weights: None when unweighted, else the tensor's in-place
        version counter (bumped by every in-place update, e.g. an optimizer step on an
        ``nn.Parameter``). -1 for inference tensors (no counter: never cached, see below)."""
        if self._weight is None:
            return None
        if self._weight.is_inference():
            return -1
        return self._weight._version

    @synchronized
    def _cached_w(self, key: Any, fn):
        """Cache of a quantity that depends on the edge WEIGHTS: an entry is valid only for the
        weights' version it was computed from (the weight tensor itself is fixed per graph, so
        identity cannot change), so an in-place update of learnable weights invalidates it
        instead of serving the old operator; updates that bypass the counter are seen for
        learnable weights (`_weights_current`)."""
        self._check_arrays()
        current = self._check_weights()
        ver = self._weight_version()
        hit = self._cache.get(key)
        if hit is not None and (hit.version == ver if current
                                else self._weights_current(hit.version)) and \
                self._unedited(key, hit.value):
            return hit.value
        if wrapped(self._weight):     # learnable weights inside a torch.func transform:
            return fn()               # differentiable there, and not to be kept past it
        with outside_transforms(), outside_inference_mode():
            value = fn()
        if ver != -1:
            self._remember_weights(ver)
        self._cache[key] = Versioned(ver, value)
        self._stamp_entry(key, value)
        return value

    @synchronized
    def _weights_current(self, version: Any) -> bool:
        """Whether an entry made for the weights' ``version`` is valid now. The version counter
        misses updates that bypass it — torch's fused optimizers (``Adam(..., fused=True)``)
        step a parameter without bumping it, and the graph served the old operator and the old
        symmetry (a backward applied Â for Âᵀ; a mutation audit) — so for learnable weights
        (`_learnable_leaf`: the ones optimizers update), and for any weights that have such a
        copy, the copy taken when the entries were made (`_remember_weights`) is compared too:
        O(nnz) per cache hit, and a mismatch drops every entry that depends on the weights.
        Updates through ``.data`` or a shared numpy array of weights that never required grad
        are not seen (as everywhere in autograd)."""
        ver = self._weight_version()
        if version != ver or ver == -1:
            return False
        if ver is None or torch.compiler.is_compiling() or wrapped(self._weight):
            return True
        snap = self._cache.get(SNAPSHOT)
        if snap is None and not self._learnable_leaf():
            return True
        # (a copy is compared whenever there is one: weights stepped by a fused optimizer and
        # then frozen with requires_grad_(False) kept their old entries; the review)
        if snap is not None and snap[0] == ver and torch.equal(snap[1], self._weight.detach()):
            return True
        for key in [k for k, v in self._cache.items()
                    if k in (FINITE_WEIGHTS, SNAPSHOT) or isinstance(v, Versioned)]:
            self._cache.pop(key, None)
        return False

    def _learnable_leaf(self) -> bool:
        """Weights an optimizer may step (a leaf that requires grad, or a view of one; not while
        traced, nor functorch's wrappers): the ones `_weights_current` compares with their copy.
        Weights computed from them (a subgraph's gather) change only through autograd-visible
        ops."""
        w = self._weight
        if w is None or not w.requires_grad or torch.compiler.is_compiling() or wrapped(w):
            return False
        # a view of one too (p[:, 0], packed[:nnz]): it shares the leaf's memory and counter,
        # which a fused step does not bump either (the review of session 30)
        return w.is_leaf or (w._base is not None and w._base.is_leaf)

    @synchronized
    def _remember_weights(self, ver: int | None) -> None:
        """Keep a copy of learnable weights as they are when an entry is made for version
        ``ver`` (one copy per version: `_weights_current`)."""
        if not (self._learnable_leaf() or SNAPSHOT in self._cache) or ver is None \
                or torch.compiler.is_compiling() or wrapped(self._weight):
            return
        snap = self._cache.get(SNAPSHOT)
        if snap is None or snap[0] != ver:
            with outside_transforms(), outside_inference_mode():
                self._cache[SNAPSHOT] = (ver, self._weight.detach().clone())
