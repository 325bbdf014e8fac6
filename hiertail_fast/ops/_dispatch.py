"""Backend selection, decided in exactly one place.

Rules, in order:
1. `HIERTAIL_BACKEND=reference|torch|triton` (environment) forces a backend.
2. CUDA tensors use the Triton kernels.
3. Everything else uses the fast torch path (blocked CPU computation / torch.sparse).

`triton` on CPU tensors only works under `TRITON_INTERPRET=1` (that is how the kernels are
tested without a GPU); asking for it otherwise is a clear error, not a crash in a kernel.
"""
from __future__ import annotations

import os

import torch

BACKENDS = ("reference", "torch", "triton")
ENV_VAR = "HIERTAIL_BACKEND"


def requested_backend() -> str | None:
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if not value:
        return None
    if value not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={value!r} is not one of {BACKENDS}")
    return value


def triton_available(device: torch.device) -> bool:
    """Whether Triton kernels can run on tensors of `device`."""
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return False
        return True
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def choose_backend(x: torch.Tensor, backend: str | None = None) -> str:
    """Backend for an op whose main input is `x`; `backend` (argument) overrides the env."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    choice = backend or requested_backend()
    if choice is None:
        choice = "triton" if x.is_cuda and triton_available(x.device) else "torch"
    if choice == "triton" and not triton_available(x.device):
        raise ValueError(
            "the triton backend needs CUDA tensors (or TRITON_INTERPRET=1 set before triton is "
            f"imported, for testing on CPU); got a tensor on {x.device}"
        )
    return choice
