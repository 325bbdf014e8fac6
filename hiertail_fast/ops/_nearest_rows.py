"""Best and second-best entry of each row of ``nearest_prototype``'s distance blocks, in one C
kernel (``_nearest_rows.c``) on the CPU.

For a block d [rows, m] of expanded distances: best (the row min), arg (its first index) and
second (the min over the other entries; equal to best when the minimum occurs twice, +inf when
m = 1). ``reference_step`` is the eager path (``topk(2)``), kept as the fallback where no C
compiler is found and as the oracle of the tests. The two differ only in which of several
equal minima ``topk`` reports; a zero gap sends the row to the near-tie refinement, which
re-decides it with the lowest-index rule, so ``nearest_prototype``'s answer is the same.
"""
from __future__ import annotations

import torch

from hiertail_fast.ops import _native

_DTYPES = {torch.float32: "hiertail_best_two_f32", torch.float64: "hiertail_best_two_f64"}


def kernel(dtype: torch.dtype):
    """The C kernel for ``dtype`` (float32 / float64) as a ctypes function, or None (another
    dtype, native kernels off, or not buildable here)."""
    name = _DTYPES.get(dtype)
    if name is None:
        return None
    i64, ptr = _native.I64, _native.PTR
    return _native.threaded_function("_nearest_rows", name,
                                     [i64, i64, i64, ptr, i64, ptr, ptr, ptr])


def reference_step(d: torch.Tensor):
    """The eager path: (best [rows], arg [rows], second [rows]) of a [rows, m] block."""
    if d.shape[1] >= 2:
        vals, args = d.topk(2, dim=1, largest=False, sorted=True)
        return vals[:, 0], args[:, 0], vals[:, 1]
    best, arg = d.min(dim=1)
    return best, arg, torch.full_like(best, float("inf"))


def native_step(fn, d: torch.Tensor):
    """The same through the C kernel ``fn`` (from ``kernel(d.dtype)``); arg is the first index
    of the minimum. d: CPU, float32 / float64, finite, unit column stride, at least one column."""
    rows, m = d.shape
    # (the column stride matters for one row too: the kernel reads a row as contiguous; a
    # [1, m] expanded row read past its 1-element storage, a step-2 one the wrong entries)
    if m == 0 or d.device.type != "cpu" or (m > 1 and d.stride(1) != 1) or \
            d.dtype not in _DTYPES:
        raise ValueError(f"the best-two kernel needs a CPU float32/float64 block with unit "
                         f"column stride and columns (got {tuple(d.shape)}, {d.dtype}, "
                         f"strides {d.stride()}, {d.device})")
    best = torch.empty(rows, dtype=d.dtype)
    second = torch.empty(rows, dtype=d.dtype)
    arg = torch.empty(rows, dtype=torch.long)
    if rows:
        fn(torch.get_num_threads(), rows, m, d.data_ptr(), d.stride(0), best.data_ptr(),
           second.data_ptr(), arg.data_ptr())
    return best, arg, second
