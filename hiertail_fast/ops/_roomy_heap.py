"""glibc's heap kept roomy while the CPU loss engine runs on oneDNN: the one adapter for
``mallopt``.

Why. oneDNN's GEMM (``_onednn_gemm``) returns every logits tile as a fresh tensor (torch's op
has no ``out=``): a 100k-row exact loss allocates and frees ~9,800 tiles of 4 MiB. glibc
serves a block that size from the top of its heap, and when a freed block leaves more than
the trim threshold free at the top it hands the pages back to the kernel (``brk``). The next
tile then touches fresh pages, one minor page fault per 4 KiB. Whether that happens depends on
the process's history (what its heap held before), not on our code: 4.0-4.3M faults per 100k
loss in some processes, 0.23M in others (``bench/cpu_gemm.py --loss``; torch.mm writes into
one reused buffer and is not concerned). On the project's 2-core AMD EPYC VM (2026-12-07, fresh
processes alternated, ``bench/heap_ab.py``) a 100k exact loss, forward + backward, took 28.5 s
with glibc as it was (4.3M faults) and 22.1 s padded (0.24M; 0.775x, peak RSS the same); a
HierTail epoch at 100k nodes, whose process had only 0.48M faults, 23.0 -> 21.2 s (0.92x).

What. While the engine runs with oneDNN tiles, ``roomy_heap()`` sets

* ``M_MMAP_THRESHOLD`` = 32 MiB: blocks below it come from the heap, not a fresh ``mmap``
  each (32 MiB is glibc's own ceiling for the threshold it raises by itself on 64-bit);
* ``M_TOP_PAD`` = 32 MiB: a trim keeps 32 MiB of touched pages at the top, and each growth
  of the heap asks for 32 MiB more, so the next tiles reuse pages already faulted in.

On leaving it puts ``M_TOP_PAD`` back to glibc's default (128 KiB), so the heap gives memory
back as before. Two effects outlast the call, both documented in docs/LOSS.md: the mmap
threshold stays 32 MiB, and glibc's dynamic threshold adjustment stays off (any ``mallopt``
turns it off; glibc offers no call to turn it on again). A process whose peak is at issue
can keep glibc as it was with ``HIERTAIL_CPU_HEAP=keep``.

Left alone: non-glibc C libraries (musl, macOS, Windows), and processes whose user set these
settings already (``MALLOC_TOP_PAD_``, ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``,
``MALLOC_MMAP_MAX_`` or their ``glibc.malloc.`` tunables in the environment).
glibc cannot be asked for its current settings, so a program that calls ``mallopt`` itself
(through ctypes, say) cannot be seen: it should set ``HIERTAIL_CPU_HEAP=keep``, or its own
``M_TOP_PAD`` would be put back to 128 KiB after each loss.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import threading

from hiertail_fast._threads import in_forked_child
from hiertail_fast._validation import env_choice

ENV_VAR = "HIERTAIL_CPU_HEAP"
CHOICES = ("auto", "keep")
MIB = 1 << 20
# mallopt's parameter numbers (glibc's malloc.h)
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * MIB
TOP_PAD = 32 * MIB
GLIBC_TOP_PAD = 128 * 1024          # glibc's default M_TOP_PAD, put back on leaving
# the environment through which a user sets what the scope would change (read by glibc at
# start-up): the thresholds and the pad, as variables or as glibc tunables. Arena settings
# (MALLOC_ARENA_MAX, set by many container images to bound memory) are not among them.
USER_MALLOC_VARS = ("MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                    "MALLOC_MMAP_MAX_")
USER_TUNABLES = ("glibc.malloc.top_pad", "glibc.malloc.mmap_threshold",
                 "glibc.malloc.trim_threshold", "glibc.malloc.mmap_max")

_lock = threading.Lock()
_depth = 0                          # roomy_heap() scopes open now, over all threads


@in_forked_child
def _after_fork_in_child() -> None:
    """In a forked child: a new lock, and glibc's top pad back. The scopes the parent's
    threads had open at the fork do not run in the child, so none would ever close it."""
    global _lock, _depth
    _lock = threading.Lock()
    if _depth:
        _depth = 0
        _mallopt()(M_TOP_PAD, GLIBC_TOP_PAD)


def choice() -> str:
    """HIERTAIL_CPU_HEAP's value (unset or empty: auto); anything else a ValueError."""
    return env_choice(ENV_VAR, CHOICES)


@functools.lru_cache(maxsize=None)
def _mallopt():
    """glibc's ``mallopt`` (Linux with glibc), else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


def _user_tuned() -> str | None:
    """The environment variable through which the user set glibc's thresholds or pad, if
    any."""
    for name in USER_MALLOC_VARS:
        if name in os.environ:
            return name
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if any(t in tunables for t in USER_TUNABLES):
        return "GLIBC_TUNABLES"
    return None


def why_not() -> str | None:
    """Why ``roomy_heap()`` leaves the heap alone here, or None when it tunes it."""
    if choice() == "keep":
        return f"{ENV_VAR}=keep"
    if _mallopt() is None:
        return "the C library is not glibc"
    tuned = _user_tuned()
    if tuned is not None:
        return f"the user tuned malloc ({tuned} is set)"
    return None


@contextlib.contextmanager
def roomy_heap():
    """glibc's heap padded for the scope (see the module's text); a no-op where ``why_not()``
    names a reason. Nested and concurrent scopes: the first in sets, the last out restores."""
    global _depth
    if why_not() is not None:
        yield
        return
    with _lock:
        if _depth == 0:
            _mallopt()(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            _mallopt()(M_TOP_PAD, TOP_PAD)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _mallopt()(M_TOP_PAD, GLIBC_TOP_PAD)
