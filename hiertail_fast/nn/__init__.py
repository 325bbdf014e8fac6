"""Modules: GCNConv, TopKPool and the HierTail model."""
from __future__ import annotations

from typing import TYPE_CHECKING

from hiertail_fast._lazy import lazy_getattr

_EXPORTS = {
    "GCNConv": "hiertail_fast.nn.conv",
    "TopKPool": "hiertail_fast.nn.pool",
    "HierTail": "hiertail_fast.nn.hiertail",
    "HierTailConfig": "hiertail_fast.nn.hiertail",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    # what type checkers and IDEs see (``X as X``: an explicit re-export; __all__ is
    # computed, which they do not read): the names __getattr__ resolves lazily
    from hiertail_fast.nn.conv import GCNConv as GCNConv
    from hiertail_fast.nn.hiertail import HierTail as HierTail
    from hiertail_fast.nn.hiertail import HierTailConfig as HierTailConfig
    from hiertail_fast.nn.pool import TopKPool as TopKPool


__getattr__ = lazy_getattr(__name__, _EXPORTS)
