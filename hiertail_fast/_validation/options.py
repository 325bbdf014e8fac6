"""Scalar options: paths, flags, numbers, seeds, thread counts, environment switches, devices."""
from __future__ import annotations

import math
import numbers
import os
from pathlib import Path

import numpy as np
import torch

from hiertail_fast._validation.graphs import check_num_nodes

# Node-feature normalisations a dataset can be loaded with: none (the official harness's
# default, is_normalize=False) or row (x_i / Σ_j x_ij, the official --is_normalize).
FEATURE_NORMS = ("none", "row")


# torch.manual_seed takes [-2**63, 2**64); the natural split's numpy generator only >= 0
SEED_MAX = 2**64 - 1


def check_path(value: object, name: str) -> Path:
    """A file-system path given as a str or an os.PathLike (pathlib.Path), as a Path; anything
    else (None, an int, an open file, bytes) is a TypeError naming ``name`` (pathlib's own
    said "expected str, bytes or os.PathLike object, not int", naming no argument)."""
    text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got "
                        f"{type(value).__name__}")
    return Path(text)


def check_flag(value: object, name: str) -> bool:
    """A boolean switch as a Python bool: bool or numpy bool; anything else (a string such as
    "no", an int, None) is a TypeError, never read by its truthiness (``"no"`` is truthy)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_finite_number(value: object, name: str) -> float:
    """A finite real number as a float: int, float, numpy numbers, a one-element real tensor;
    bool and strings are a TypeError (never converted: ``float("2")`` would pass), NaN / ±inf
    a ValueError."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not (
            value.is_complex() or value.dtype == torch.bool):
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def check_feature_norm(value: object, name: str = "feature_norm") -> str:
    """``value`` if it is one of FEATURE_NORMS, else a TypeError / ValueError naming them."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {FEATURE_NORMS}; got "
                        f"{type(value).__name__}")
    if value not in FEATURE_NORMS:
        raise ValueError(f"{name}={value!r} is not one of {FEATURE_NORMS}")
    return value


def check_epochs_patience(epochs: object, patience: object) -> tuple[int, int]:
    """A training loop's length (`train_hiertail`, `train_baseline`): ``epochs`` >= 1 and
    ``patience`` >= 0 as ints; numpy integers pass, bool / float / NaN are a TypeError (2.5
    epochs, or a NaN patience that silently disabled early stopping)."""
    for name, v in (("epochs", epochs), ("patience", patience)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if epochs < 1 or patience < 0:
        raise ValueError(f"need epochs >= 1 and patience >= 0, got {epochs}, {patience}")
    return int(epochs), int(patience)


def check_seed(seed: object, name: str = "seed", *, bounded: bool = True) -> int:
    """A seed as an int >= 0: numpy integers pass; bool, float, str and None are a TypeError
    (1.5 and -1 failed inside numpy naming no seed; None drew an unreproducible result).
    ``bounded``: at most SEED_MAX, what a run's ``torch.manual_seed`` takes ([-2**63, 2**64));
    unbounded for seeds that only reach numpy's generator (any size)."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(seed).__name__} {seed!r}")
    if bounded and not 0 <= int(seed) <= SEED_MAX:
        raise ValueError(f"{name} must lie in [0, 2**64 - 1], got {int(seed)}")
    if int(seed) < 0:
        raise ValueError(f"{name} must be >= 0, got {int(seed)}")
    return int(seed)


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_threads(threads: int, name: str = "--threads") -> int:
    """A torch thread count no larger than the CPUs available: more only slows torch's OpenMP
    loops down (1,024 threads on 2 CPUs: an epoch 300x slower) and thousands crash it (2,048:
    a segfault inside torch.unique; 20,000: libgomp cannot create them)."""
    cpus = available_cpus()
    if not 1 <= threads <= cpus:
        raise ValueError(f"{name} must lie in [1, {cpus}] (the CPUs available to this "
                         f"process), got {threads}")
    return threads


_SWITCH_ON, _SWITCH_OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_switch(name: str, default: bool) -> bool:
    """An on/off environment variable (1/0, true/false, yes/no, on/off, any case, spaces around
    it ignored; unset or blank: ``default``); anything else a ValueError naming it
    (HIERTAIL_NATIVE=OFF and HIERTAIL_SYMMETRIC=nope were read as "on" without a word)."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _SWITCH_ON:
        return True
    if raw in _SWITCH_OFF:
        return False
    raise ValueError(f"{name}={raw!r} is not one of 1/0 (true/false, yes/no, on/off)")


def env_choice(name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` from the environment (any case, spaces around it ignored; unset or
    blank: the first), anything else a ValueError naming the variable and its choices
    (HIERTAIL_CPU_GEMM, HIERTAIL_CPU_HEAP)."""
    value = os.environ.get(name, "").strip().lower() or choices[0]
    if value not in choices:
        raise ValueError(f"{name}={os.environ[name]!r} is not one of {', '.join(choices)}")
    return value


def env_int(name: str, default: int, least: int = 1) -> int:
    """An integer >= ``least`` from the environment (unset or empty: ``default``); anything
    else a ValueError naming the variable (the block sizes were read with a bare int(): it
    raised "invalid literal for int()" from deep inside the loss, naming nothing, and 0 or -5
    were clamped silently)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number") from None
    if value < least:
        raise ValueError(f"{name} must be >= {least}, got {value}")
    return value


def check_openmp_team(threads: int | None = None) -> None:
    """ValueError where OpenMP may start fewer threads than torch plans a loop for
    (``OMP_THREAD_LIMIT`` below torch's thread count, or ``OMP_DYNAMIC`` on): torch's CPU
    product of a sparse CSR matrix with a dense one then skips rows without an error (torch
    2.13, 800 nodes: off by 8.8 where the result is ~9), so the GCN propagation and the
    baselines' sparse layers would return wrong numbers. Checked where such a product is made
    (``ops/_csr_product.sparse_csr`` / ``csr_matmul``)."""
    threads = torch.get_num_threads() if threads is None else threads
    if threads <= 1:
        return
    limit = os.environ.get("OMP_THREAD_LIMIT", "").strip()
    if limit.isdigit() and int(limit) < threads:
        raise ValueError(
            f"OMP_THREAD_LIMIT={limit} is below torch's {threads} threads: OpenMP then runs "
            "fewer threads than torch plans for, and torch's CPU product of a sparse CSR "
            "matrix with a dense one skips rows (wrong results, no error); unset it or use "
            f"torch.set_num_threads({limit}) (the command lines: --threads {limit})")
    if os.environ.get("OMP_DYNAMIC", "").strip().lower() in _SWITCH_ON:
        raise ValueError(
            "OMP_DYNAMIC is on: OpenMP may then run fewer threads than torch plans for, and "
            "torch's CPU product of a sparse CSR matrix with a dense one skips rows (wrong "
            "results, no error); unset it or use torch.set_num_threads(1) (the command "
            "lines: --threads 1)")


def check_device(device: object, name: str = "device") -> torch.device:
    """``device`` as a torch.device (a str, a torch.device or a CUDA index), ValueError when it
    is no device or a CUDA device this build / machine does not have (torch raised an
    AssertionError 'Torch not compiled with CUDA enabled' at the first tensor moved there).
    A command-line option's ``name`` ("--device") is named as the user typed it, ``--device
    cuda:3``; an argument's as ``device='cuda:3'``."""
    if not isinstance(device, (str, torch.device, int)) or isinstance(device, bool):
        raise TypeError(f"{name} must be a str or a torch.device, got {type(device).__name__}")
    option = name.startswith("--")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        given = f"{name} {device!r}" if option else f"{name}={device!r}"
        raise ValueError(f"{given} is not a device (use cpu, cuda or cuda:N)") from None
    given = f"{name} {device}" if option else f"{name}={str(device)!r}"
    if dev.type not in ("cpu", "cuda"):   # meta / mps / xpu / hpu failed inside torch
        raise ValueError(f"{given}: only cpu and cuda devices can train")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{given}: CUDA is not available (torch {torch.__version__}, "
                             "cuda.is_available() is False)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{given}: only {torch.cuda.device_count()} CUDA device(s)")
    return dev


def check_positive_int(value: object, name: str) -> int:
    """A size such as a layer's channel count: an int as ``check_num_nodes`` takes one
    (TypeError for bool, floats, strings), >= 1 (ValueError)."""
    return check_num_nodes(value, name, least=1)
