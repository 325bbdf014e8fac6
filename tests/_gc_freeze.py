"""The suite's long-lived objects kept out of Python's full garbage collections.

Late in a run the pytest process holds ~1M objects that the cyclic collector tracks (torch's,
triton's, hypothesis', the test modules', the caches the tests fill). Every full
(generation-2) collection walks all of them, the automatic ones and the explicit
``gc.collect()`` calls of the code under test (the scale worker's memory baseline): 86 full
collections took 78 s of a 1,170-s suite run on the 2-core VM (timed with ``gc.callbacks``,
session 80).

At the first test of each test module, `at_test_setup` collects (the previous module's
garbage goes; its module fixtures are torn down by then) and moves every surviving object to
the permanent generation (``gc.freeze``), so later collections walk only what was made since.
Reference counting frees frozen objects as before; only a reference cycle alive at a module's
start that dies later stays until the run ends. A test's own objects are made after its
module's freeze and are collected as usual. At the session's end `unfreeze` hands everything
back to the collector (frozen, triton's nanobind objects outlived the interpreter's last
collection and nanobind listed them as leaks on stderr). ``HIERTAIL_TEST_GC_FREEZE=0`` turns it
off.
"""
from __future__ import annotations

import gc
import os

ENV = "HIERTAIL_TEST_GC_FREEZE"
_last_module: list = [None]


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def at_test_setup(item) -> bool:
    """Before ``item``'s fixtures: at the first test of a module other than the last one
    seen, collect and freeze; True when it did."""
    module = item.nodeid.split("::", 1)[0]
    if module == _last_module[0] or not enabled():
        return False
    _last_module[0] = module
    gc.collect()
    gc.freeze()
    return True


def unfreeze() -> None:
    """The frozen objects back in the oldest generation (the session's end)."""
    gc.unfreeze()
