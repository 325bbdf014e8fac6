"""CSRGraph's lock under threads and forks (docs/GUARANTEES.md: "One graph may be used from several
threads (its caches are checked and filled under a lock of its own ...)"; a forked child gets
the locks new). Each interleaving is forced (a barrier, or a thread paused at most 1 s inside a
cache step), so a missing lock shows every time, not by chance. From a mutation audit (s42): the
lock made twice at a graph's first use, a fork while that lock is being made, a loaded graph's
lock, and ``clear_cache`` / ``_cached`` / ``_check_weights`` outside the lock all passed."""
from __future__ import annotations

import os
import pickle
import threading

import pytest
import torch

from hiertail_fast import CSRGraph, gcn_propagate
from hiertail_fast import _graph_cache as graph_cache
from tests.conftest import fork_while_held
from tests.test_graph_state import _propagate_in_a_worker

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork (not on Windows)")


def _graph(n=40, seed=0, learnable=False):
    gen = torch.Generator().manual_seed(seed)
    s = CSRGraph.from_edge_index(torch.randint(0, n, (2, 6 * n), generator=gen), num_nodes=n)
    w = torch.rand(s.num_edges, generator=gen) + 0.5
    return CSRGraph(s.indptr, s.indices, torch.nn.Parameter(w) if learnable else w, n)


def test_threads_at_a_graphs_first_use_share_one_lock(monkeypatch):
    """Both threads read "no lock yet", then make it one after the other under _NEW_LOCK (a
    barrier before it forces that); the first one inside a cache method then pauses there:
    the other must not enter one meanwhile (the lock is made once, checked again under
    _NEW_LOCK)."""
    g = _graph()
    barrier = threading.Barrier(2, timeout=10)
    real = graph_cache._NEW_LOCK

    class Racing:
        def __enter__(self):
            if threading.current_thread().name in ("A", "B"):
                barrier.wait()
            real.acquire()

        def __exit__(self, *exc):
            real.release()

    monkeypatch.setattr(graph_cache, "_NEW_LOCK", Racing())
    inside, overlap, entered = [], [], []
    second = threading.Event()

    class Watching(dict):
        def __contains__(self, key):
            name = threading.current_thread().name
            if inside:
                overlap.append((inside[-1], name))
            inside.append(name)
            entered.append(name)
            if len(set(entered)) == 2:
                second.set()
            elif entered.count(name) == 1:
                second.wait(1.0)            # the other thread, were it let in, comes meanwhile
            out = super().__contains__(key)
            inside.remove(name)
            return out

    g._cache = Watching(g._cache)
    threads = [threading.Thread(target=g.row_index, name=name) for name in ("A", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not overlap, overlap
    assert isinstance(g._lock, type(threading.RLock()))


def _race(g, pause_on, use):
    """Thread A runs use(g) and pauses after the cache step pause_on(what, key) (at most 1 s);
    thread B clears the caches meanwhile. -> A's result (A must not fail)."""
    a_paused, b_done = threading.Event(), threading.Event()

    class Pausing(dict):
        def _pause(self, what, key):
            if pause_on(what, key) and threading.current_thread().name == "A" \
                    and not a_paused.is_set():
                a_paused.set()
                b_done.wait(1.0)

        def __setitem__(self, key, value):
            super().__setitem__(key, value)
            self._pause("set", key)

        def __contains__(self, key):
            out = super().__contains__(key)
            self._pause("contains", key)
            return out

    g._cache = Pausing(g._cache)
    result, errors = {}, []

    def run_a():
        try:
            result["a"] = use(g)
        except Exception as exc:          # noqa: BLE001  (the failure under test)
            errors.append(exc)

    a = threading.Thread(target=run_a, name="A")
    a.start()
    assert a_paused.wait(10)
    b = threading.Thread(target=lambda: (g.clear_cache(), b_done.set()), name="B")
    b.start()
    b.join(10)
    a.join(10)
    assert not errors, errors
    return result["a"]


def test_clear_cache_while_another_thread_fills_a_structural_cache():
    g = _graph()
    expected = _graph().row_index().clone()
    row = _race(g, lambda what, key: what == "set" and key == "row", lambda g: g.row_index())
    assert torch.equal(row, expected)
    assert torch.equal(g.row_index(), expected)


def test_clear_cache_while_another_thread_checks_learnable_weights():
    g = _graph(learnable=True)
    g.gcn_norm_values()                        # the weights are checked once (the marker is set)
    values = _race(g, lambda what, key: what == "contains" and key == graph_cache.FINITE_WEIGHTS,
                   lambda g: g.gcn_norm_values()[0])
    torch.testing.assert_close(values, _graph().gcn_norm_values()[0])


@needs_fork
def test_a_fork_while_another_thread_makes_a_graphs_lock_does_not_hang_the_child():
    g = _graph()                                  # never used: its lock is made in the child
    x = torch.randn(g.num_nodes, 3)
    hung, code = fork_while_held(lambda: graph_cache._NEW_LOCK, _propagate_in_a_worker, (x, g))
    assert not hung and code == 0


@needs_fork
def test_a_loaded_graph_forked_while_its_lock_is_held_does_not_hang_the_child():
    g = pickle.loads(pickle.dumps(_graph()))
    x = torch.randn(g.num_nodes, 3)
    gcn_propagate(x, g)                           # its lock exists now
    hung, code = fork_while_held(lambda: g._lock, _propagate_in_a_worker, (x, g))
    assert not hung and code == 0
