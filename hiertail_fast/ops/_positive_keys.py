"""The common keys' order for the official positives (``_positive_blocks``): sorted by label
group ids so that every level's groups are column ranges of a block wherever the levels nest."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from hiertail_fast.ops._host_reads import slot_counts


def constant_per_group(values: torch.Tensor, g: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Whether every group (0 <= g < n_groups) has one value, rows outside every group (g < 0)
    ignored, as a 0-dim bool device tensor that the caller reads with its other flags (no host
    read here: rows outside every group go to a spare slot)."""
    if not n_groups:
        return torch.ones((), dtype=torch.bool, device=values.device)
    inside = g >= 0
    slot = torch.where(inside, g, n_groups)
    first = torch.zeros(n_groups + 1, dtype=values.dtype, device=values.device)
    first[slot] = values                   # one member's value per group (any member)
    return ((first[slot] == values) | ~inside).all()


def _constant_per_group(values: torch.Tensor, g: torch.Tensor) -> bool:
    """``constant_per_group`` read on the host, its groups counted from g (the slice plan)."""
    n_groups = int(g.max()) + 1 if g.numel() else 0
    return bool(constant_per_group(values, g, max(n_groups, 0)))


def _significance(gid: torch.Tensor, n_groups: Sequence[int] | None = None) -> list[int]:
    """Levels from least to most significant sort key: by their positive pairs sum_c n_c^2
    (all levels' in one host read; rows outside a level weigh 0). ``n_groups``: each level's
    group count (None: read from gid, one more host read per level)."""
    if n_groups is None:
        n_groups = [int(g.max()) + 1 if g.numel() else 0 for g in gid]
    cost = []
    for g, n_g in zip(gid, n_groups, strict=True):
        n_g = max(int(n_g), 0)
        # rows outside the level count in a spare last slot, sliced off
        counts = slot_counts(torch.where(g >= 0, g, n_g), n_g + 1)[:n_g]
        cost.append((counts.double() ** 2).sum())
    cost = torch.stack(cost).tolist() if cost else []
    return sorted(range(gid.shape[0]), key=lambda lev: cost[lev])


def key_order(gid: torch.Tensor, n_groups: Sequence[int] | None = None) -> torch.Tensor:
    """Stable lexicographic order of the rows by their group ids, the level with the most
    positive pairs (sum_c n_c^2) most significant: that level's groups are always contiguous,
    and for nested levels (the costliest is then the coarsest) every level's are.
    ``n_groups`` as in ``_significance``."""
    order = torch.arange(gid.shape[1], device=gid.device)
    for lev in _significance(gid, n_groups):
        order = order[torch.argsort(gid[lev, order], stable=True)]
    return order
