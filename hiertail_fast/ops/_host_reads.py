"""Where the torch engines may read a tensor's value on the host.

On CPU a data-dependent shortcut costs one scalar read and nothing else: skip a pass when a
mask is empty (``bool(mask.any())``), index only the rows that need the work (``nonzero``).
On CUDA each such read makes the host wait for the device and drains its queue of launched
kernels, so the engines take a sync-free form there instead: the same result from
fixed-shape work over every row (``torch.where`` in place of a subset, a write that is a
no-op where nothing applies).

One predicate decides, so that both forms are one switch apart and the CUDA forms run (and are
tested against the reference) on a machine without a GPU: ``FORCE_SYNC_FREE = True`` makes CPU
tensors take them too, and ``cuda_code_paths()`` adds the other switches that separate the
torch loss engines' CPU and CUDA paths (the tests' ``cuda_forms`` fixture,
``bench/dispatch_count.py --as-cuda``, ``bench/official_fuzz.py --cuda-forms``).
"""
from __future__ import annotations

import contextlib
import os

import torch

FORCE_SYNC_FREE = False

# what CUDA tensors do without these: no C kernels (``_native``), no symmetric engine (CPU
# only), the official positives over whole key bands (``_positive_blocks.band_path``), the
# row-block engine's GEMMs whole on torch.mm (not in oneDNN's CPU pieces, ``_block_gemms``)
CUDA_PATH_ENV = {"HIERTAIL_NATIVE": "0", "HIERTAIL_SYMMETRIC": "0", "HIERTAIL_POSITIVES": "band",
                 "HIERTAIL_CPU_GEMM": "blas"}


def host_reads_cheap(device: torch.device | str) -> bool:
    """True where a data-dependent host read costs no device sync (CPU tensors), so the
    engines may branch on values; False on CUDA (and everywhere while FORCE_SYNC_FREE)."""
    return torch.device(device).type == "cpu" and not FORCE_SYNC_FREE


def device_values(values, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A small 1-d tensor of the host's `values` on `device`, without a host wait.

    ``torch.tensor(values, device=cuda)`` copies with ``cudaMemcpyAsync`` followed by
    ``cudaStreamSynchronize`` (PyTorch's blocking host-to-device copy): the host waits for every
    kernel queued before it, as a scalar read does. Here each value is written by a fill
    kernel instead (one launch per value: meant for a few, such as one per level). Where host
    reads are cheap (CPU) it is ``torch.tensor``."""
    if host_reads_cheap(device):
        return torch.tensor(values, dtype=dtype, device=device)
    out = torch.empty(len(values), dtype=dtype, device=device)
    for i, v in enumerate(values):
        out[i].fill_(v)          # (not out[i] = v: a 0-d CPU tensor copied in, maybe blocking)
    return out


def slot_counts(slot: torch.Tensor, size: int) -> torch.Tensor:
    """How many entries of `slot` (int64, each in [0, size)) hold each value: [size] int64.
    Not ``torch.bincount``: on CUDA it reads its input's min and max on the host to size its
    output (two syncs, where the size is known here), and with weights it has no deterministic
    implementation (under ``torch.use_deterministic_algorithms`` it raises there)."""
    return torch.zeros(size, dtype=torch.long, device=slot.device).index_add_(
        0, slot, torch.ones_like(slot))


@contextlib.contextmanager
def cuda_code_paths(env: dict[str, str] | None = None):
    """While inside: CPU tensors through the torch loss engines' CUDA code paths (CUDA_PATH_ENV
    updated by ``env``, and the sync-free forms); every switch as it was afterwards."""
    global FORCE_SYNC_FREE
    env = {**CUDA_PATH_ENV, **(env or {})}
    saved_env = {k: os.environ.get(k) for k in env}
    saved_force = FORCE_SYNC_FREE
    os.environ.update(env)
    FORCE_SYNC_FREE = True
    try:
        yield
    finally:
        FORCE_SYNC_FREE = saved_force
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
