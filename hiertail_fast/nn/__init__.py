"""Modules: GCNConv, TopKPool and the HierTail model."""
from __future__ import annotations

from hiertail_fast._lazy import lazy_getattr

_EXPORTS = {
    "GCNConv": "hiertail_fast.nn.conv",
    "TopKPool": "hiertail_fast.nn.pool",
    "HierTail": "hiertail_fast.nn.hiertail",
    "HierTailConfig": "hiertail_fast.nn.hiertail",
}
__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS)
