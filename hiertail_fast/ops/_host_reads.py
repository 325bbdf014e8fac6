"""Where the torch engines may read a tensor's value on the host.

On CPU a data-dependent shortcut costs one scalar read and nothing else: skip a pass when a
mask is empty (``bool(mask.any())``), index only the rows that need the work (``nonzero``).
On CUDA each such read makes the host wait for the device and drains its queue of launched
kernels, so the engines take a sync-free form there instead: the same result from
fixed-shape work over every row (``torch.where`` in place of a subset, a write that is a
no-op where nothing applies).

One predicate decides, so that both forms are one switch apart and the CUDA forms run (and are
tested against the reference) on a machine without a GPU: ``FORCE_SYNC_FREE = True`` (the test
fixture ``cuda_forms``, ``bench/dispatch_count.py --as-cuda``) makes CPU tensors take them too.
"""
from __future__ import annotations

import torch

FORCE_SYNC_FREE = False


def host_reads_cheap(device: torch.device | str) -> bool:
    """True where a data-dependent host read costs no device sync (CPU tensors), so the
    engines may branch on values; False on CUDA (and everywhere while FORCE_SYNC_FREE)."""
    return torch.device(device).type == "cpu" and not FORCE_SYNC_FREE
