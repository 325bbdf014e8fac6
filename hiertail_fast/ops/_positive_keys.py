"""The common keys' order for the official positives (``_positive_blocks``): sorted by label
group ids so that every level's groups are column ranges of a block wherever the levels nest."""
from __future__ import annotations

import torch


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


def _significance(gid: torch.Tensor) -> list[int]:
    """Levels from least to most significant sort key: by their positive pairs sum_c n_c^2
    (all levels' in one host read; rows outside a level weigh 0)."""
    cost = torch.stack([
        (torch.bincount(g.clamp(min=0), weights=(g >= 0).double(), minlength=1) ** 2).sum()
        for g in gid]).tolist()
    return sorted(range(gid.shape[0]), key=lambda lev: cost[lev])


def key_order(gid: torch.Tensor) -> torch.Tensor:
    """Stable lexicographic order of the rows by their group ids, the level with the most
    positive pairs (sum_c n_c^2) most significant: that level's groups are always contiguous,
    and for nested levels (the costliest is then the coarsest) every level's are."""
    order = torch.arange(gid.shape[1], device=gid.device)
    for lev in _significance(gid):
        order = order[torch.argsort(gid[lev, order], stable=True)]
    return order
