"""Duplicate key rows and the official variant's arg-max tie rule.

The official loss subtracts each row's max M_i = max_k s_ik; its gradient goes to the key that
holds it. Where several keys hold it, torch.max (the dense reference) takes the FIRST index, in
the key order cat(z, prototypes). Exact ties come from duplicate rows (nodes with identical
embeddings: common in graphs), and the engines do not see the keys in that order or with the
same rounding: the row-block engine visits the keys of the official variant sorted by label (a
duplicate with a smaller label comes first), and the symmetric engine computes s_ia and s_ib of
two equal rows a, b in different tiles, whose rounding can differ by an ulp of |s|. Either way
another of the equal rows took the max's gradient: a valid subgradient (the loss is not
differentiable at a tie, and its value does not change: the positives' tie rule gives every
duplicate of the arg-max row s - M = 0), but not the reference's, and not the same across
engines (a fuzzing find: gradients of duplicate rows 1.9 apart where the reference's were 1.4).

``first_tied_key`` moves each arg-max to the smallest key id, visible at its level, whose row
equals the arg-max row bit for bit: the reference's choice wherever the tie is between
duplicate rows. Exact ties between rows that differ (s_ia == s_ib with z_a != z_b, e.g.
integer-valued embeddings) are the engines' own: each takes the smallest key id among the
equal maxima it computed (the row-block engine's block step reads the keys' ids for that,
``_block_exp``), which is the reference's choice wherever those logits round alike.
O(N d) hashing, an O(N log N) sort, no host sync on CUDA.
"""
from __future__ import annotations

import torch

from hiertail_fast.ops._host_reads import host_reads_cheap

_MULTIPLIERS: dict[tuple[int, str], torch.Tensor] = {}
_HASH_ROWS = 1 << 14            # rows hashed at a time: the int64 temporaries stay ~16 MB at d 128


def row_ids(z: torch.Tensor) -> torch.Tensor:
    """[N] int64, equal for rows with equal values (-0.0 counts as 0.0): a fixed linear hash
    of the rows' fp32 bit patterns (multipliers < 2^22 and d <= 256 keep the sum < 2^63).
    Unequal rows collide only by accident (callers that act on a match compare the rows)."""
    n, d = z.shape
    key = (d, str(z.device))
    if key not in _MULTIPLIERS:
        gen = torch.Generator().manual_seed(0x5EED)
        mult = torch.randint(1 << 21, 1 << 22, (d,), generator=gen, dtype=torch.int64) | 1
        _MULTIPLIERS[key] = mult.to(z.device)
    mult = _MULTIPLIERS[key]
    out = torch.empty(n, dtype=torch.int64, device=z.device)
    for r0 in range(0, n, _HASH_ROWS):
        rows = z[r0:r0 + _HASH_ROWS]
        bits = (rows.float() + 0.0).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        torch.sum(bits * mult, dim=1, out=out[r0:r0 + _HASH_ROWS])
    return out


def _hash_groups(z: torch.Tensor):
    """(group [N]: the hash group of every row id; every row distinct by hash, a bool)."""
    n = z.shape[0]
    h_sorted, perm = torch.sort(row_ids(z))
    starts = torch.ones(n, dtype=torch.bool, device=z.device)
    starts[1:] = h_sorted[1:] != h_sorted[:-1]
    distinct = host_reads_cheap(z.device) and bool(starts.all())    # (no sync on CUDA)
    group = torch.empty(n, dtype=torch.long, device=z.device)
    group[perm] = torch.cumsum(starts, 0) - 1
    return group, distinct


def first_equal_rows(z: torch.Tensor) -> torch.Tensor:
    """[N] int64: for each row of z, the smallest index of a row equal to it bit for bit
    (-0.0 equal to 0.0; the row itself if none is smaller), so that two rows are equal exactly
    where their entries here are. Fixed-shape work, no host sync on CUDA: the hash groups'
    first members, each row compared with its group's first (a chunk of rows at a time). A
    hash collision (two different rows in a group, ~N²/2⁶⁵ by chance) leaves a row that
    differs from its group's first with its own index: two rows equal to each other but not to
    that first would then look different (the callers' tie rule then keeps the recomputed
    logit, within its rounding bound, as for any other near-tie)."""
    n = z.shape[0]
    ids = torch.arange(n, device=z.device)
    if n < 2:
        return ids
    group, _ = _hash_groups(z)
    first = torch.full((n,), n, dtype=torch.long, device=z.device)
    first.scatter_reduce_(0, group, ids, reduce="amin")
    first = first[group]
    for r0 in range(0, n, _HASH_ROWS):
        c = first[r0:r0 + _HASH_ROWS]
        differs = (z[c] != z[r0:r0 + _HASH_ROWS]).any(dim=1)
        c.copy_(torch.where(differs, ids[r0:r0 + _HASH_ROWS], c))
    return first


def common_twins(z: torch.Tensor, common: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[len(ids)]: for each key id in ``ids``, the smallest id k with ``common[k]`` whose row
    z[k] equals z[id] bit for bit (id itself if it is such a key), -1 where there is none.

    The row-block engine takes a level-specific key's logits from another GEMM than the common
    keys'; a prototype that copies a node row rounds there 1-4 ulp apart from the node's
    column, so the official max, its arg-max and the positives' tie rule left the reference,
    whose one GEMM rounds equal rows alike (``_lse_torch._engine`` copies the twin's dots)."""
    n = z.shape[0]
    none = torch.full(ids.shape, -1, dtype=torch.long, device=z.device)
    if ids.numel() == 0:
        return none
    group, distinct = _hash_groups(z)
    if distinct:
        return torch.where(common[ids], ids, none)
    key_ids = torch.arange(n, device=z.device)
    first = torch.full((n,), n, dtype=torch.long, device=z.device)
    first.scatter_reduce_(0, group, torch.where(common, key_ids, n), reduce="amin")
    c = first[group[ids]]
    found = c < n
    c = c.clamp_(max=n - 1)
    found &= (z[c] == z[ids]).all(dim=1)            # a hash match is checked on the rows
    return torch.where(found, c, torch.where(common[ids], ids, none))


def first_tied_key(z: torch.Tensor, arg_max: torch.Tensor,
                   visible: torch.Tensor | None = None) -> torch.Tensor:
    """arg_max [L, N] (key ids of the rows of z [N, d]) moved to the smallest id among the keys
    visible at that level (``visible`` [L, N] bool; None: every key) whose row equals the
    arg-max row exactly. A new tensor; arg_max is not modified."""
    n = z.shape[0]
    out = arg_max.clone()
    if n < 2 or arg_max.numel() == 0:
        return out
    group, distinct = _hash_groups(z)
    if distinct:
        return out                                  # no two rows alike
    cheap = host_reads_cheap(z.device)
    ids = torch.arange(n, device=z.device)
    for lev in range(arg_max.shape[0]):
        cand = ids if visible is None else torch.where(visible[lev], ids, n)
        first = torch.full((n,), n, dtype=torch.long, device=z.device)
        first.scatter_reduce_(0, group, cand, reduce="amin")
        a = arg_max[lev]
        c = first[group[a]].clamp_(max=n - 1)       # n: no visible key (a row outside the level)
        same = c < a
        if cheap:                                   # compare only the candidates' rows
            idx = same.nonzero().squeeze(1)
            same[idx] = (z[c[idx]] == z[a[idx]]).all(dim=1)
        else:                                       # (no host sync on CUDA)
            same &= (z[c] == z[a]).all(dim=1)       # a hash match is checked on the rows
        out[lev] = torch.where(same, c, a)
    return out
