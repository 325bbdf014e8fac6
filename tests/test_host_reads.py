"""``ops/_host_reads.py``: the one switch between the torch engines' CPU shortcuts and their
sync-free CUDA forms, and the context that runs the CUDA code paths on CPU tensors."""
from __future__ import annotations

import os

import torch

import hiertail_fast.ops._host_reads as host_reads


def test_host_reads_are_cheap_on_cpu_only(monkeypatch):
    assert host_reads.host_reads_cheap("cpu") and host_reads.host_reads_cheap(torch.device("cpu"))
    assert not host_reads.host_reads_cheap("cuda") and not host_reads.host_reads_cheap("meta")
    monkeypatch.setattr(host_reads, "FORCE_SYNC_FREE", True)
    assert not host_reads.host_reads_cheap("cpu")


def test_cuda_code_paths_sets_and_restores_every_switch(monkeypatch):
    monkeypatch.setenv("HIERTAIL_POSITIVES", "slices")          # a user's value: kept after
    monkeypatch.delenv("HIERTAIL_NATIVE", raising=False)        # unset: unset after
    monkeypatch.setenv("HIERTAIL_SYMMETRIC", "1")
    with host_reads.cuda_code_paths():
        assert not host_reads.host_reads_cheap("cpu")
        assert {k: os.environ[k] for k in host_reads.CUDA_PATH_ENV} == host_reads.CUDA_PATH_ENV
    assert host_reads.host_reads_cheap("cpu") and not host_reads.FORCE_SYNC_FREE
    assert os.environ["HIERTAIL_POSITIVES"] == "slices" and "HIERTAIL_NATIVE" not in os.environ
    assert os.environ["HIERTAIL_SYMMETRIC"] == "1"
    with host_reads.cuda_code_paths({"HIERTAIL_POSITIVES": "slices", "HIERTAIL_X": "1"}):
        assert os.environ["HIERTAIL_POSITIVES"] == "slices" and os.environ["HIERTAIL_X"] == "1"
        assert os.environ["HIERTAIL_NATIVE"] == "0"             # extra switches on top
    assert "HIERTAIL_X" not in os.environ and os.environ["HIERTAIL_POSITIVES"] == "slices"
    try:                                                        # restored on an error too
        with host_reads.cuda_code_paths():
            raise RuntimeError("inside")
    except RuntimeError:
        pass
    assert not host_reads.FORCE_SYNC_FREE and "HIERTAIL_NATIVE" not in os.environ
