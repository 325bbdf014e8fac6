"""The common keys' order for the official positives (``_positive_blocks``): sorted by label
group ids so that every level's groups are column ranges of a block wherever the levels nest."""
from __future__ import annotations

import torch


def _constant_per_group(values: torch.Tensor, g: torch.Tensor) -> bool:
    """Whether every group (g >= 0) has one value (rows outside every group: ignored)."""
    inside = g >= 0
    if not bool(inside.any()):
        return True
    v, gi = values[inside], g[inside]
    first = torch.zeros(int(gi.max()) + 1, dtype=v.dtype, device=v.device)
    first[gi] = v                          # one member's value per group (any member)
    return bool((first[gi] == v).all())


def _significance(gid: torch.Tensor) -> list[int]:
    """Levels from least to most significant sort key: by their positive pairs sum_c n_c^2."""
    cost = [float((torch.bincount(g[g >= 0]).double() ** 2).sum()) if bool((g >= 0).any())
            else 0.0 for g in gid]
    return sorted(range(gid.shape[0]), key=lambda lev: cost[lev])


def key_order(gid: torch.Tensor) -> torch.Tensor:
    """Stable lexicographic order of the rows by their group ids, the level with the most
    positive pairs (sum_c n_c^2) most significant: that level's groups are always contiguous,
    and for nested levels (the costliest is then the coarsest) every level's are."""
    order = torch.arange(gid.shape[1], device=gid.device)
    for lev in _significance(gid):
        order = order[torch.argsort(gid[lev, order], stable=True)]
    return order
