"""torch's CPU thread count: the default a run trains with, and keeping the caller's count.

One place for a policy three callers share (``train``'s CLI, the experiments' CLI, and the
experiment runner), so none of them imports it from another's module. The count matters for
results, not only speed: the loss's float sums are split by thread, so its last bits depend on
it (docs/GUARANTEES.md, determinism)."""
from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator

import torch

# Graphs below this many nodes train on one thread by default (--threads): an epoch on Email
# (1,005 nodes) is ~25 ms of work, and a second OpenMP thread waiting for a busy core made it
# 1,146 ms on a loaded 2-core machine (47 ms with passive waiting, 25 ms on one thread).
SMALL_GRAPH_NODES = 5_000


def default_threads(num_nodes: int, requested: int | None, start: int) -> int:
    """The thread count a run on a graph of ``num_nodes`` trains with: ``requested`` if given,
    else 1 below ``SMALL_GRAPH_NODES`` nodes and ``start`` (the count the command began with)
    on larger graphs."""
    if requested is not None:
        return requested
    return 1 if num_nodes < SMALL_GRAPH_NODES else start


@contextlib.contextmanager
def thread_count_kept() -> Iterator[None]:
    """torch's thread count comes back as it was when the block ends, returns or raises."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def keeps_thread_count(main):
    """Decorator of a CLI's ``main``: torch's thread count comes back as it was when main
    returns or raises. main sets ``--threads`` (or 1 thread on small graphs); called inside a
    Python process, it left every later computation there on that count."""
    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        with thread_count_kept():
            return main(*args, **kwargs)
    return wrapper


def in_forked_child(reset: Callable[[], None]) -> Callable[[], None]:
    """Registers ``reset`` to run in every forked child (a DataLoader worker, multiprocessing's
    "fork"), where a lock another thread of the parent held at the fork stays held by a thread
    the child does not have: each module that keeps a lock makes it new there. Returns it (a
    decorator); nothing is registered where ``os.fork`` does not exist."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=reset)
    return reset
