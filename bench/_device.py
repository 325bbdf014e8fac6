"""The benchmark tools' device and its name, without pytest (bench/conftest.py re-exports them
for the pytest-benchmark suites; the command-line tools import them from here, so they run
after the main job's plain ``pip install -e .``)."""
from __future__ import annotations

import os

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def asked_device(parser, asked: str | None) -> str:
    """A command-line tool's --device: `asked`, DEVICE where none was given; an argparse
    error (exit 2) where CUDA is asked for on a machine without it."""
    if asked == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    return asked or DEVICE


def device_name(device: str = DEVICE) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, " \
           f"{torch.get_num_threads()} torch threads)"
