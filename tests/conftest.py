"""Shared test setup: seeds, devices, tolerances, and Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton is imported anywhere, so it is set here, at
import time of the test session, whenever no CUDA device is present.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# One tolerance table (STYLE.md): comparison of a backend against the float64 reference.
TOLERANCES = {
    torch.float64: dict(rtol=1e-7, atol=1e-9),
    torch.float32: dict(rtol=1e-4, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=1e-2, atol=1e-2),
}

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def tol(dtype: torch.dtype) -> dict:
    return TOLERANCES[dtype]


def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


requires_triton = pytest.mark.skipif(not triton_importable(), reason="triton is not installed")


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """Tiny tensors: OpenMP fork/join costs more than the work, and on a shared 2-core machine a
    parallel region can wait ~100 ms for a busy core. Use as
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        pytest.skip(f"shared datasets not found at {DATA_DIR}")
    return DATA_DIR
