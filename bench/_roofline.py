"""Achieved memory bandwidth of the propagation SpMM under a stated byte model, and the ratio to
the card's peak (bench/interleaved.py, bench/gpu_report.py).

Byte model of one propagation Â·X (X: [n, d], Â with nnz stored entries), the minimum traffic
of a CSR row-split SpMM that reads every feature row it needs once per entry (no cache reuse):
    per entry: one column index (4 B, int32) + one feature row (d · elem B)
    per row:   one row pointer (4 B) + one output row write (d · elem B)
Edge values are not counted (our triton path fuses the normalisation and reads none; counting
them would flatter the paths that read them). Forward + backward = twice the forward (the
backward is one more SpMM of the same shape). So the figure is a lower bound on the traffic and
its ratio to the peak says how close a path is to streaming at full speed.
"""
from __future__ import annotations

INDEX_BYTES = 4

# Peak DRAM bandwidth (bytes/s) by a substring of torch.cuda.get_device_name(), first match wins
# (vendor data sheets). Names not listed report 'unknown'.
PEAK_BANDWIDTH = (
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100 NVL", 3.9e12),
    ("H100", 3.35e12),        # SXM5 80 GB (reports as "NVIDIA H100 80GB HBM3")
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12),       # 40 GB parts
    ("L40S", 0.864e12),
)


def spmm_bytes(n: int, nnz: int, d: int, elem_bytes: int = 4, mode: str = "fwd") -> int:
    """Bytes moved by one propagation under the module's byte model."""
    if min(n, nnz, d, elem_bytes) < 0:
        raise ValueError("n, nnz, d and elem_bytes must be non-negative")
    if mode not in ("fwd", "fwd+bwd"):
        raise ValueError(f"mode must be 'fwd' or 'fwd+bwd', got {mode!r}")
    once = nnz * (INDEX_BYTES + d * elem_bytes) + n * (INDEX_BYTES + d * elem_bytes)
    return once * (2 if mode == "fwd+bwd" else 1)


def peak_bandwidth(device_name: str) -> float | None:
    """The card's peak bandwidth in bytes/s, None when unknown."""
    for key, peak in PEAK_BANDWIDTH:
        if key.lower() in device_name.lower():
            return peak
    return None


def bandwidth_figures(n: int, nnz: int, d: int, seconds: float, mode: str,
                      device_name: str | None) -> dict:
    """bytes, achieved GB/s and (CUDA, known card) the fraction of the peak."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    moved = spmm_bytes(n, nnz, d, 4, mode)
    peak = peak_bandwidth(device_name) if device_name else None
    return dict(bytes_model=moved, achieved_GBps=moved / seconds / 1e9,
                peak_GBps=None if peak is None else peak / 1e9,
                peak_fraction=None if peak is None else moved / seconds / peak)
