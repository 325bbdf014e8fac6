"""Modules: GCNConv, TopKPool and the HierTail model."""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "GCNConv": "hiertail_fast.nn.conv",
    "TopKPool": "hiertail_fast.nn.pool",
    "HierTail": "hiertail_fast.nn.hiertail",
    "HierTailConfig": "hiertail_fast.nn.hiertail",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hiertail_fast.nn' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
