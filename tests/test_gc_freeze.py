"""tests/_gc_freeze.py: each test module's first test collects the garbage and freezes the
survivors; objects made after the freeze (a test's own) are collected as before."""
from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import pytest

from tests import _gc_freeze


class _Node:
    """A reference cycle's member (reference counting alone never frees it)."""

    def __init__(self):
        self.me = self


def _cycle():
    node = _Node()
    return weakref.ref(node)


@pytest.fixture
def fresh_state(monkeypatch):
    monkeypatch.setattr(_gc_freeze, "_last_module", [None])
    monkeypatch.delenv(_gc_freeze.ENV, raising=False)


def test_a_new_modules_first_test_collects_then_freezes(fresh_state):
    dead = _cycle()                       # garbage before the freeze: collected, not frozen
    alive = _Node()
    assert dead() is not None
    assert _gc_freeze.at_test_setup(SimpleNamespace(nodeid="tests/test_a.py::test_one"))
    assert dead() is None and gc.get_freeze_count() > 0
    frozen = gc.get_freeze_count()
    # the same module's next test: nothing; another module's: the next freeze
    assert not _gc_freeze.at_test_setup(SimpleNamespace(nodeid="tests/test_a.py::test_two"))
    assert gc.get_freeze_count() == frozen
    assert _gc_freeze.at_test_setup(SimpleNamespace(nodeid="tests/test_b.py::test_one[x]"))
    assert gc.get_freeze_count() >= frozen and alive.me is alive


def test_objects_made_after_the_freeze_are_collected(fresh_state):
    assert _gc_freeze.at_test_setup(SimpleNamespace(nodeid="tests/test_c.py::test_one"))
    later = _cycle()
    assert later() is not None
    gc.collect()
    assert later() is None


def test_off_by_the_environment(fresh_state, monkeypatch):
    monkeypatch.setenv(_gc_freeze.ENV, "0")
    dead = _cycle()
    gc.disable()                          # (no automatic collection between the two checks)
    try:
        assert not _gc_freeze.at_test_setup(SimpleNamespace(nodeid="tests/test_d.py::t"))
        assert dead() is not None         # nothing collected
    finally:
        gc.enable()


def test_conftest_froze_at_this_modules_first_test():
    # this run's own hook (tests/conftest.py): the module's first test (this file's first
    # above, or this one alone) froze what was alive, unless turned off
    if not _gc_freeze.enabled():
        pytest.skip(f"{_gc_freeze.ENV}=0")
    assert gc.get_freeze_count() > 0


def test_unfreeze_hands_the_frozen_objects_back(fresh_state):
    assert _gc_freeze.at_test_setup(SimpleNamespace(nodeid="tests/test_e.py::test_one"))
    assert gc.get_freeze_count() > 0
    _gc_freeze.unfreeze()                 # (the next module's first test freezes again)
    assert gc.get_freeze_count() == 0
